#!/usr/bin/env bash
# test_webui.sh - the chat page of `mlxcel serve` (webui/, src/server/webui.c)
# on the qwen2_moe_tiny_chat fixture, with an API key.
#
#  - over HTTP (curl): GET / and every /webui/ file are the bytes of webui/,
#    with their Content-Type and the Content-Security-Policy, without the API
#    key (the API still needs it); HEAD /; POST / is 405; /props has the MoE
#    dispatch counts; with --no-webui the page is 404 and the API works
#  - in Debian's Chromium, driven by tests/webui/check.mjs (playwright-core,
#    pinned in tests/webui/package.json, installed with npm into
#    tests/webui/node_modules, never a downloaded browser): the key dialog,
#    a message sent with Enter and streamed (greedy, equal to the API's
#    answer), the statistics, a second turn, regenerate, stop mid-stream,
#    new chat, Markdown on hostile text, a phone-sized screen, no request
#    leaving the server, no CSP violation.  Screenshots go to the build
#    folder: webui.png (the one in docs/) and webui-phone.png.
#
# Skips (77) with a message without MLXCEL_FIXTURES, curl or jq, and (after
# the HTTP checks) without Chromium, node >= 18, npm or the npm registry.
set -u
export LC_ALL=C.UTF-8
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
[ -n "${MLXCEL_FIXTURES:-}" ] || { echo "SKIP: MLXCEL_FIXTURES is not set"; exit 77; }
BIN=${MLXCEL_BIN:?MLXCEL_BIN must point at the mlxcel binary}
SRC=${MLXCEL_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
OUT=$(cd "$(dirname "$BIN")" && pwd)
F=$MLXCEL_FIXTURES/qwen2_moe_tiny_chat
[ -d "$F" ] || { echo "FAIL: $F is missing"; exit 1; }
for t in curl jq; do
  command -v $t >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done

T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT

fail=0
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { local what=$1; shift; "$@" || bad "$what"; }

# Starts a server on a free port (read from its first log line); sets URL.
start_server() {
  local log=$1; shift
  "$BIN" serve -m "$F" --port 0 "$@" 2>"$log" &
  PIDS+=($!)
  local port=
  for _ in $(seq 1 300); do
    port=$(sed -n 's/^serve: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 "${PIDS[-1]}" 2>/dev/null || break
    port=
    sleep 0.1
  done
  [ -n "$port" ] || { echo "FAIL: the server did not come up:" >&2; cat "$log" >&2; exit 1; }
  URL=http://127.0.0.1:$port
}

# ---- over HTTP ----

KEY=webui-test-key
start_server "$T/server.log" --ctx-size 4096 --parallel 2 --api-key "$KEY"
echo "server at $URL"

# status, Content-Type and body of GET $1 (no key) into $T/h and $T/b
get() { curl -s -D "$T/h" -o "$T/b" -w '%{http_code}' "$URL$1"; }
header() { tr -d '\r' <"$T/h" | sed -n "s/^$1: //Ip" | head -1; }

for f in index.html app.js app.css markdown.js icon.svg; do
  path=/webui/$f
  [ $f = index.html ] && path=/
  case $f in
    *.html) type="text/html; charset=utf-8" ;;
    *.js) type="text/javascript; charset=utf-8" ;;
    *.css) type="text/css; charset=utf-8" ;;
    *.svg) type="image/svg+xml" ;;
  esac
  check "GET $path without the key: 200" [ "$(get $path)" = 200 ]
  check "GET $path is webui/$f" cmp -s "$T/b" "$SRC/webui/$f"
  check "GET $path: Content-Type $type (got $(header Content-Type))" [ "$(header Content-Type)" = "$type" ]
  csp=$(header Content-Security-Policy)
  check "GET $path: a CSP that allows only the server itself ($csp)" \
    bash -c '[[ "$1" == *"default-src '"'none'"'"* && "$1" == *"connect-src '"'self'"'"* &&
               "$1" == *"script-src '"'self'"'"* && "$1" != *unsafe* && "$1" != *http* ]]' _ "$csp"
  check "GET $path: nosniff" [ "$(header X-Content-Type-Options)" = nosniff ]
done
# HEAD over a raw socket (curl -I would not show a body sent anyway)
exec 3<>"/dev/tcp/127.0.0.1/${URL##*:}"
printf 'HEAD / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' >&3
cat <&3 >"$T/head"
exec 3<&-
check "HEAD /: 200" grep -q '^HTTP/1.1 200 ' "$T/head"
check "HEAD /: the page's Content-Length" grep -qi "^Content-Length: $(wc -c <"$SRC/webui/index.html")"$'\r'"$" "$T/head"
check "HEAD /: nothing after the headers" [ "$(sed -n '/^\r$/,$p' "$T/head" | wc -c)" = 2 ]
check "POST /: 405" [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST -d x "$URL/")" = 405 ]
check "an unknown /webui/ file: 404" [ "$(get /webui/nope.js)" = 404 ]
check "/index.html is not a second copy: 404" [ "$(get /index.html)" = 404 ]
check "the API still needs the key: 401" [ "$(get /v1/models)" = 401 ]
curl -s -H "Authorization: Bearer $KEY" "$URL/props" >"$T/props"
check "/props: moe_dispatch fused and gather counts" \
  jq -e '.moe_dispatch | (.fused | type == "number") and (.gather | type == "number") and (.fused_enabled | type == "boolean")' "$T/props" >/dev/null

MAIN=$URL
start_server "$T/off.log" --no-webui
check "--no-webui: GET / is 404" [ "$(get /)" = 404 ]
check "--no-webui: GET /webui/app.js is 404" [ "$(get /webui/app.js)" = 404 ]
check "--no-webui: the API works" [ "$(get /v1/models)" = 200 ]
kill "${PIDS[-1]}"
wait "${PIDS[-1]}" 2>/dev/null
URL=$MAIN
[ $fail = 0 ] || { echo "$fail HTTP check(s) failed" >&2; exit 1; }
echo "HTTP checks passed"

# ---- in Chromium ----

CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser)}
[ -n "$CHROMIUM" ] || { echo "SKIP: Chromium is not installed (Debian: apt-get install chromium); the HTTP checks passed"; exit 77; }
for t in node npm; do
  command -v $t >/dev/null || { echo "SKIP: $t is not installed; the HTTP checks passed"; exit 77; }
done
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null)
[ "${major:-0}" -ge 18 ] 2>/dev/null ||
  { echo "SKIP: node $(node --version 2>/dev/null) is older than 18 (playwright-core needs 18); the HTTP checks passed"; exit 77; }

D=$SRC/tests/webui
want=$(node -p "require('$D/package.json').dependencies['playwright-core']")
installed() { [ "$(node -p "require('$D/node_modules/playwright-core/package.json').version" 2>/dev/null)" = "$want" ]; }
if ! installed; then
  # one install at a time (the Release and sanitizer test runs may overlap)
  exec 9>"$D/.install.lock"
  flock 9
  if ! installed; then
    echo "installing playwright-core@$want into $D/node_modules" >&2
    if ! (cd "$D" && timeout 300 npm install --no-audit --no-fund --no-package-lock --ignore-scripts \
          --loglevel=error >"$D/.install.log" 2>&1); then
      if ! timeout 60 npm ping >/dev/null 2>&1; then
        echo "SKIP: the npm registry cannot be reached (npm install failed: $(tail -3 "$D/.install.log" | tr '\n' ' ')); the HTTP checks passed"
        exit 77
      fi
      echo "FAIL: npm install failed with the registry reachable:" >&2
      cat "$D/.install.log" >&2
      exit 1
    fi
    installed || { echo "FAIL: npm install did not install playwright-core@$want" >&2; exit 1; }
  fi
  exec 9>&-
fi

node "$D/check.mjs" "$URL" "$KEY" "$OUT" "$CHROMIUM"
rc=$?
# the stopped reply was cut short on the server too: its log line
stopped=$(grep -E 'POST /v1/chat/completions 200 .*\[(disconnected|cancelled)\]' "$T/server.log" | tail -1)
n=$(sed -n 's/.* out=\([0-9]*\) .*/\1/p' <<<"$stopped")
if [ -z "$stopped" ] || [ "${n:-3000}" -ge 3000 ]; then
  echo "FAIL: the server did not log the stopped reply as cut short: '$stopped'" >&2
  rc=1
fi
if [ $rc = 0 ]; then
  echo "screenshots: $OUT/webui.png $OUT/webui-phone.png"
else
  echo "server log:" >&2
  tail -20 "$T/server.log" >&2
fi
exit $rc
