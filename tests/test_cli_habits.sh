#!/usr/bin/env bash
# The command line's habits: --version, `help CMD`, prompts from a file or
# stdin, -n -1, a warning for -c above the model's maximum, --system with a
# first chat message.  (Mistyped commands and options: test_cli_badinput.sh.)
set -u
BIN=${MLXCEL_BIN:-build/mlxcel}
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { if [ "$2" = "$3" ]; then ok "$1"; else bad "$1: got '$2', want '$3'"; fi; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# --version / -v: version and commit, build, the kernel variant in use
out=$("$BIN" --version); rc=$?
if [ $rc -eq 0 ] && printf '%s\n' "$out" | head -1 | grep -Eq '^mlxcel [0-9]+\.[0-9]+\.[0-9]+ \(commit [^)]+\)$' &&
   printf '%s\n' "$out" | grep -Eq '^build: (Release|Debug|RelWithDebInfo|MinSizeRel), (gcc|clang) ' &&
   printf '%s\n' "$out" | grep -Eq '^kernel: (scalar|avx2|avx512|avx512vnni|neon) \(this CPU runs: scalar'; then
  ok "--version"
else
  bad "--version (exit $rc): $out"
fi
check "-v is --version" "$("$BIN" -v)" "$out"
kern=$(printf '%s\n' "$out" | sed -n 's/^kernel: \([a-z0-9]*\) .*/\1/p')
check "--version names a forced kernel" \
  "$(MLXCEL_KERNEL=scalar "$BIN" --version | sed -n 's/^kernel: \([a-z0-9]*\) .*/\1/p')" scalar
[ -n "$kern" ] && ok "kernel in use: $kern" || bad "no kernel line"

# help CMD is CMD --help, for every command the top-level help lists
cmds=$("$BIN" --help | sed -n '/^commands:/,/^$/p' | awk 'NF > 1 && $1 != "commands:" {print $1}')
[ "$(printf '%s\n' "$cmds" | grep -c .)" -ge 8 ] && ok "top-level help lists the commands" ||
  bad "top-level help lists: $cmds"
for c in $cmds; do
  a=$("$BIN" help "$c"); ra=$?
  b=$("$BIN" "$c" --help); rb=$?
  if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ "$a" = "$b" ] && printf '%s' "$a" | grep -q "usage: mlxcel $c"; then
    ok "help $c = $c --help"
  else
    bad "help $c (exit $ra/$rb)"
  fi
done
check "help alone is --help" "$("$BIN" help)" "$("$BIN" --help)"

if [ -z "${MLXCEL_FIXTURES:-}" ]; then
  echo "SKIP (the rest): MLXCEL_FIXTURES is not set; prompt tests need the fixture checkpoints" >&2
  echo "$pass passed, $fail failed"
  [ $fail -eq 0 ]; exit $?
fi
CHAT=$MLXCEL_FIXTURES/qwen2_moe_tiny_chat
Q=$MLXCEL_FIXTURES/qwen3_moe_tiny
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# the prompt from the command line, stdin (-p -) and a file (-f): same ids
gen() { "$BIN" generate -m "$CHAT" --temp 0 -n 4 --ids-only "$@" 2>"$T/err"; }
want=$(gen -p "The sea at night")
[ -n "$want" ] && ok "-p TEXT generates ($want)" || bad "-p TEXT: $(cat "$T/err")"
check "-p - reads stdin" "$(printf 'The sea at night\n' | gen -p -)" "$want"
printf 'The sea at night\n' > "$T/p.txt"
check "-f FILE reads the file (one trailing newline dropped)" "$(gen -f "$T/p.txt" </dev/null)" "$want"
check "--file is -f" "$(gen --file "$T/p.txt" </dev/null)" "$want"
printf 'The sea at night' > "$T/p2.txt"
check "-f FILE without a trailing newline" "$(gen -f "$T/p2.txt")" "$want"
printf 'The sea at night\n\n' > "$T/p3.txt"
[ "$(gen -f "$T/p3.txt")" != "$want" ] && ok "only one trailing newline is dropped" ||
  bad "two trailing newlines gave the same ids as none"
chat_want=$(gen --chat "Name a color." --system "Be brief.")
check "--chat - reads stdin" "$(printf 'Name a color.\n' | gen --chat - --system "Be brief.")" "$chat_want"
[ "$(gen --chat "Name a color.")" != "$chat_want" ] && ok "--system changes the chat prompt" ||
  bad "--system made no difference"
check "tokenize -f" "$("$BIN" tokenize -m "$CHAT" -f "$T/p.txt")" "$("$BIN" tokenize -m "$CHAT" -p "The sea at night")"
check "tokenize -p -" "$(printf 'The sea at night\n' | "$BIN" tokenize -m "$CHAT" -p -)" \
  "$("$BIN" tokenize -m "$CHAT" -p "The sea at night")"

# -n -1: until end of sequence; a model that never stops (--ignore-eos)
# fills the context: n_ctx - n_prompt tokens
n=$("$BIN" generate -m "$Q" --prompt-ids 1,2,3 -c 40 -n -1 --ignore-eos --temp 0 --ids-only | wc -w)
check "-n -1 generates until the context is full" "$n" 37
n=$("$BIN" generate -m "$Q" --prompt-ids 1,2,3 -c 40 -n 5 --ignore-eos --temp 0 --ids-only | wc -w)
check "-n 5 generates 5" "$n" 5

# -c above max_position_embeddings: a warning, and it still runs
max=$(sed -n 's/.*"max_position_embeddings": *\([0-9]*\).*/\1/p' "$Q/config.json")
big=$((max * 2))
out=$("$BIN" generate -m "$Q" --prompt-ids 1,2,3 -c $big -n 2 --temp 0 --ids-only 2>"$T/err"); rc=$?
if [ $rc -eq 0 ] && [ "$(echo $out | wc -w)" -eq 2 ] && grep -q "warning: --ctx-size $big is above the model's maximum of $max" "$T/err"; then
  ok "-c $big > $max warns and runs"
else
  bad "-c $big (exit $rc): $(cat "$T/err")"
fi
"$BIN" generate -m "$Q" --prompt-ids 1,2,3 -c $max -n 2 --temp 0 --ids-only >/dev/null 2>"$T/err"
grep -q warning "$T/err" && bad "-c $max warned: $(cat "$T/err")" || ok "-c at the maximum does not warn"

# chat -p: the first message is answered (with --system honoured) before
# reading input; the prompt it renders is the one generate --chat renders
stat_tokens() { sed -n 's/^\[\([0-9]*\) prompt tokens.*/\1/p' "$1" | head -1; }
gen_tokens() { sed -n 's/^prompt tokens: \([0-9]*\).*/\1/p' "$1"; }
"$BIN" chat -m "$CHAT" --temp 0 -n 3 --stats -p "Name a color." --system "Be brief." </dev/null >"$T/out" 2>"$T/err"; rc=$?
"$BIN" generate -m "$CHAT" --temp 0 -n 3 --stats --chat "Name a color." --system "Be brief." >/dev/null 2>"$T/gerr"
if [ $rc -eq 0 ] && [ -n "$(stat_tokens "$T/err")" ] && [ "$(stat_tokens "$T/err")" = "$(gen_tokens "$T/gerr")" ]; then
  ok "chat -p --system renders the generate --chat prompt ($(stat_tokens "$T/err") tokens)"
else
  bad "chat -p --system (exit $rc): $(cat "$T/err") / $(cat "$T/gerr")"
fi
check "chat -p prints the reply on stdout" "$(grep -c . "$T/out")" 1
printf 'Name a color.' > "$T/m.txt"
"$BIN" chat -m "$CHAT" --temp 0 -n 3 -f "$T/m.txt" </dev/null >"$T/out2" 2>/dev/null
check "chat -f answers the same" "$(cat "$T/out2")" "$("$BIN" chat -m "$CHAT" --temp 0 -n 3 -p "Name a color." </dev/null 2>/dev/null)"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
