#!/usr/bin/env bash
# Installs the Debian packages mlxcel builds against (only what is missing).
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang libomp-14-dev libclang-rt-14-dev
      libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libedit-dev libxxhash-dev curl jq tmux python3
      openmpi-bin libopenmpi-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "deps: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
