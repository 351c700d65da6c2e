#!/usr/bin/env bash
# `mlxcel generate --lookup N` on the demo model models/kjv-moe (in the
# tree, no fixtures needed): the text is the same as without lookup, greedy
# and sampled with a seed, drafting at every match (MLXCEL_LOOKUP_ADAPT=0)
# and by the cost model; --stats reports what was drafted and accepted; bad
# values are usage errors.  With MLXCEL_FIXTURES: a recurrent model says
# lookup is off and prints the same ids.
set -u
BIN=${MLXCEL_BIN:-build/mlxcel}
SRC=${MLXCEL_SRC:-.}
M=$SRC/models/kjv-moe
if [ ! -f "$M/config.json" ]; then
  echo "SKIP: $M is not in this tree" >&2
  exit 77
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# greedy: the demo model falls into loops, which lookup drafts
P="And God said"
"$BIN" generate -m "$M" -p "$P" -n 120 --temp 0 > "$T/plain.txt" 2> "$T/plain.err" || bad "plain run: $(tail -2 "$T/plain.err")"
MLXCEL_LOOKUP_ADAPT=0 "$BIN" generate -m "$M" -p "$P" -n 120 --temp 0 --lookup 15 --stats > "$T/always.txt" 2> "$T/always.err"
"$BIN" generate -m "$M" -p "$P" -n 120 --temp 0 --lookup 8 --stats > "$T/adapt.txt" 2> "$T/adapt.err"
if [ -s "$T/plain.txt" ] && cmp -s "$T/plain.txt" "$T/always.txt" && cmp -s "$T/plain.txt" "$T/adapt.txt"; then
  ok "greedy: the same text with --lookup 15 (every match) and --lookup 8 (cost model)"
else
  bad "greedy text differs with --lookup: $(diff "$T/plain.txt" "$T/always.txt" | head -3)"
fi
line=$(grep '^lookup:' "$T/always.err")
drafted=$(echo "$line" | awk '{print $2}')
accepted=$(echo "$line" | awk '{print $4}')
if [ -n "$drafted" ] && [ "$drafted" -gt 0 ] && [ "$accepted" -gt 0 ] && [ "$accepted" -le "$drafted" ]; then
  ok "--stats: $line"
else
  bad "--stats has no sensible lookup line: '$line'"
fi
if grep -q '^lookup:' "$T/plain.err"; then
  bad "--stats without --lookup prints a lookup line"
else
  ok "no lookup line without --lookup"
fi

# sampled with a seed: the same draws
for L in 0 6; do
  MLXCEL_LOOKUP_ADAPT=0 "$BIN" generate -m "$M" -p "$P" -n 80 --temp 0.7 --seed 3 --lookup $L --ids-only > "$T/s$L.txt" 2>/dev/null
done
if [ -s "$T/s0.txt" ] && cmp -s "$T/s0.txt" "$T/s6.txt"; then
  ok "sampled with --seed: the same ids with --lookup 6"
else
  bad "sampled ids differ with --lookup 6"
fi

# serve --lookup: a request decoding alone gets drafts; the text is the
# plain greedy text, whole and streamed, and so are two requests at once
# (whose steps are batched instead)
if command -v curl > /dev/null && command -v jq > /dev/null; then
  MLXCEL_LOOKUP_ADAPT=0 "$BIN" serve -m "$M" --port 0 --lookup 15 --parallel 2 2> "$T/serve.log" &
  SPID=$!
  PORT=
  for _ in $(seq 1 300); do
    PORT=$(sed -n 's/^serve: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$T/serve.log" | head -1)
    [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 "$SPID" 2> /dev/null || break
    sleep 0.1
  done
  U=http://127.0.0.1:$PORT/v1/completions
  body='{"prompt": "And God said", "max_tokens": 120, "temperature": 0}'
  curl -s "$U" -H 'Content-Type: application/json' -d "$body" > "$T/srv.json"
  jq -j '.choices[0].text' "$T/srv.json" > "$T/srv.txt"
  if [ -s "$T/srv.txt" ] && cmp -s "$T/plain.txt" "$T/srv.txt"; then
    ok "serve --lookup 15: the plain greedy text"
  else
    bad "serve --lookup 15 text differs: $(head -c 120 "$T/srv.txt")"
  fi
  if jq -e '.timings.draft_n > 0 and .timings.draft_n_accepted > 0 and
            .timings.draft_n_accepted <= .timings.draft_n' "$T/srv.json" > /dev/null; then
    ok "serve --lookup 15: timings $(jq -c '.timings | {draft_n, draft_n_accepted}' "$T/srv.json")"
  else
    bad "serve --lookup 15: no sensible draft counts in $(jq -c .timings "$T/srv.json")"
  fi
  sbody='{"prompt": "And God said", "max_tokens": 120, "temperature": 0, "stream": true}'
  curl -sN "$U" -H 'Content-Type: application/json' -d "$sbody" | sed -n 's/^data: //p' | grep -v '^\[DONE\]' |
    jq -j '.choices[0].text // empty' > "$T/srv_stream.txt"
  if cmp -s "$T/plain.txt" "$T/srv_stream.txt"; then
    ok "serve --lookup 15, streamed: the plain greedy text"
  else
    bad "serve --lookup 15 streamed text differs: $(head -c 120 "$T/srv_stream.txt")"
  fi
  curl -s "$U" -H 'Content-Type: application/json' -d "$body" | jq -j '.choices[0].text' > "$T/c1.txt" &
  curl -s "$U" -H 'Content-Type: application/json' -d "$body" | jq -j '.choices[0].text' > "$T/c2.txt"
  wait %2 2> /dev/null
  if cmp -s "$T/plain.txt" "$T/c1.txt" && cmp -s "$T/plain.txt" "$T/c2.txt"; then
    ok "serve --lookup 15, two requests at once: the plain greedy text"
  else
    bad "serve --lookup 15, two requests at once: text differs"
  fi
  kill "$SPID" 2> /dev/null
  wait "$SPID" 2> /dev/null
else
  echo "skip: curl or jq missing: no serve --lookup check" >&2
fi

# usage errors
for v in 16 -1 x; do
  "$BIN" generate -m "$M" -p "$P" -n 1 --lookup "$v" > /dev/null 2> "$T/u.err"
  rc=$?
  if [ $rc -eq 2 ] && grep -q -- '--lookup' "$T/u.err"; then
    ok "--lookup $v: usage error naming the option"
  else
    bad "--lookup $v: exit $rc, $(head -1 "$T/u.err")"
  fi
done

# a recurrent model: lookup off with a note, the same ids
F=${MLXCEL_FIXTURES:-}/qwen3_next_tiny
if [ -n "${MLXCEL_FIXTURES:-}" ] && [ -f "$F/config.json" ]; then
  "$BIN" generate -m "$F" --prompt-ids 1,2,3,1,2,3,1,2 -n 12 --temp 0 --ids-only --ignore-eos > "$T/r0.txt" 2>/dev/null
  "$BIN" generate -m "$F" --prompt-ids 1,2,3,1,2,3,1,2 -n 12 --temp 0 --ids-only --ignore-eos --lookup 4 > "$T/r1.txt" 2> "$T/r1.err"
  if [ -s "$T/r0.txt" ] && cmp -s "$T/r0.txt" "$T/r1.txt" && grep -q 'lookup is off' "$T/r1.err"; then
    ok "recurrent model: '$(grep 'lookup is off' "$T/r1.err")', the same ids"
  else
    bad "recurrent model with --lookup: $(cat "$T/r1.err" | head -2)"
  fi
else
  echo "skip: MLXCEL_FIXTURES unset: no recurrent model check" >&2
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
