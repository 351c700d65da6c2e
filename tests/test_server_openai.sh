#!/usr/bin/env bash
# test_server_openai.sh - the official OpenAI Node SDK (npm `openai`) against
# `mlxcel serve` on the qwen2_moe_tiny_chat fixture (random weights, the real
# Qwen tokenizer).  That checkpoint's ChatML template has no tool section, so
# the server runs with Qwen3's template (the fixtures' tokenizers/qwen3,
# through --chat-template-file), which has one.  tests/openai/check.mjs holds
# the checks: forced tool calls that parse and follow their schema (plain and
# streamed), json_schema output that validates, logprobs shapes, the CORS
# preflight, /metrics as Prometheus text.
#
# The SDK, ajv and ajv-formats (the JSON Schema validator the checks use) are installed
# with npm, at the versions tests/openai/package.json pins, into
# tests/openai/node_modules (ignored by git; reused when already there).
# Skips (77) with a message without MLXCEL_FIXTURES, node (>= 18) or npm, or
# when the npm registry cannot be reached.
set -u
export LC_ALL=C.UTF-8
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
[ -n "${MLXCEL_FIXTURES:-}" ] || { echo "SKIP: MLXCEL_FIXTURES is not set"; exit 77; }
BIN=${MLXCEL_BIN:?MLXCEL_BIN must point at the mlxcel binary}
SRC=${MLXCEL_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
F=$MLXCEL_FIXTURES/qwen2_moe_tiny_chat
Q3=$MLXCEL_FIXTURES/tokenizers/qwen3/tokenizer_config.json
for f in "$F" "$Q3"; do [ -e "$f" ] || { echo "FAIL: $f is missing"; exit 1; }; done
for t in node npm curl; do
  command -v $t >/dev/null || { echo "SKIP: $t is not installed (the OpenAI Node SDK test needs node and npm)"; exit 77; }
done
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null)
[ "${major:-0}" -ge 18 ] 2>/dev/null || { echo "SKIP: node $(node --version 2>/dev/null) is older than 18"; exit 77; }

# ---- the SDK ----
D=$SRC/tests/openai
want() { node -p "require('$D/package.json').dependencies['$1']"; }
have() { node -p "require('$D/node_modules/$1/package.json').version" 2>/dev/null; }
installed() {
  for p in openai ajv ajv-formats; do [ "$(have $p)" = "$(want $p)" ] || return 1; done
}
if ! installed; then
  # one install at a time (the Release and sanitizer test runs may overlap)
  exec 9>"$D/.install.lock"
  flock 9
  if ! installed; then
    echo "installing openai@$(want openai), ajv@$(want ajv), ajv-formats@$(want ajv-formats) into $D/node_modules" >&2
    if ! (cd "$D" && timeout 300 npm install --no-audit --no-fund --no-package-lock --ignore-scripts \
          --loglevel=error >"$D/.install.log" 2>&1); then
      if ! timeout 60 npm ping >/dev/null 2>&1; then
        echo "SKIP: the npm registry cannot be reached (npm install failed: $(tail -3 "$D/.install.log" | tr '\n' ' '))"
        exit 77
      fi
      echo "FAIL: npm install failed with the registry reachable:" >&2
      cat "$D/.install.log" >&2
      exit 1
    fi
    installed || { echo "FAIL: npm install did not install the pinned versions" >&2; exit 1; }
  fi
  exec 9>&-
fi

# ---- the server ----
T=$(mktemp -d)
SPID=
cleanup() {
  [ -n "$SPID" ] && kill "$SPID" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
node -e "process.stdout.write(require('$Q3').chat_template)" >"$T/qwen3.jinja"
KEY=sdk-test-key
"$BIN" serve -m "$F" --port 0 --ctx-size 2048 --parallel 2 --chat-template-file "$T/qwen3.jinja" \
  --cors-origin '*' --metrics --api-key "$KEY" 2>"$T/server.log" &
SPID=$!
PORT=
for _ in $(seq 1 300); do
  PORT=$(sed -n 's/^serve: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$T/server.log" | head -1)
  [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 "$SPID" 2>/dev/null || break
  PORT=
  sleep 0.1
done
[ -n "$PORT" ] || { echo "FAIL: the server did not come up:" >&2; cat "$T/server.log" >&2; exit 1; }

node "$D/check.mjs" "http://127.0.0.1:$PORT" "$KEY"
rc=$?
[ $rc = 0 ] || { echo "server log:" >&2; tail -20 "$T/server.log" >&2; }
exit $rc
