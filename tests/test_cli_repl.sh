#!/usr/bin/env bash
# The chat REPL as a person uses it, driven through a terminal by tmux: arrow
# keys and emacs keys edit the line, Up recalls history, Ctrl-C during a reply
# returns to the prompt with the conversation kept, /help and unknown
# /commands are answered locally, /save writes what the model saw, Ctrl-D
# quits with a newline.  Then the same commands from a pipe (no terminal).
#
# Replies are made endless (--ignore-eos -n -1 with a large context) so that
# Ctrl-C always lands during one; every wait has a deadline but nothing is
# timed.
set -u
BIN=${MLXCEL_BIN:-build/mlxcel}
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
if [ -z "${MLXCEL_FIXTURES:-}" ]; then
  echo "SKIP: MLXCEL_FIXTURES is not set; the REPL test chats with the fixture checkpoint" >&2
  exit 77
fi
CHAT=$MLXCEL_FIXTURES/qwen2_moe_tiny_chat
T=$(mktemp -d)
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# ---- from a pipe: commands answered locally, never sent to the model ----
printf 'Hello\n/help\n/bogus\n//slash\n/system Be brief.\n/save %s\n/reset\n/save %s\n' "$T/pipe.json" "$T/empty.json" |
  "$BIN" chat -m "$CHAT" --temp 0 -n 3 >"$T/pipe.out" 2>"$T/pipe.err"; rc=$?
roles=$(jq -r '[.[].role] | join(",")' "$T/pipe.json" 2>/dev/null)
[ $rc -eq 0 ] && [ "$roles" = "system,user,assistant,user,assistant" ] &&
  [ "$(jq -r '.[3].content' "$T/pipe.json")" = "/slash" ] && ok "pipe: /help, /bogus and /system stay local; //slash is sent as /slash" ||
  bad "pipe (exit $rc): roles '$roles': $(cat "$T/pipe.err")"
grep -q "/save FILE" "$T/pipe.err" && grep -q "unknown command '/bogus'" "$T/pipe.err" &&
  ok "pipe: /help and the unknown command answer on stderr" || bad "pipe: $(cat "$T/pipe.err")"
[ "$(jq length "$T/empty.json" 2>/dev/null)" = 1 ] && ok "pipe: /reset keeps only the system message" ||
  bad "pipe: after /reset: $(cat "$T/empty.json")"
[ "$(grep -c . "$T/pipe.out")" -le 2 ] && ! grep -q "save\|bogus" "$T/pipe.out" &&
  ok "pipe: stdout has only the replies" || bad "pipe: stdout: $(cat "$T/pipe.out")"

# ---- on a terminal ----
if ! command -v tmux >/dev/null; then
  echo "SKIP (terminal part): tmux is not installed (scripts/deps.sh installs it)" >&2
  rm -rf "$T"
  echo "$pass passed, $fail failed"
  [ $fail -eq 0 ]; exit $?
fi
# a private server whose socket lives (and goes) with the temporary folder
TM() { tmux -S "$T/tmux.sock" -f /dev/null "$@"; }
trap 'TM kill-server 2>/dev/null; rm -rf "$T"' EXIT

screen() { TM capture-pane -p -J -S - -t repl 2>/dev/null | sed "s/[[:space:]]*$//"; }
# waits (deadline: 120 s) until the screen matches the extended regex $1
wait_for() {
  local i
  for i in $(seq 1 1200); do
    screen | grep -Eq -- "$1" && return 0
    sleep 0.1
  done
  echo "  timed out waiting for /$1/; the screen:" >&2
  screen | sed "/^$/d" | tail -15 >&2
  return 1
}
# waits until the last non-empty line is an empty prompt
wait_prompt() {
  local i
  for i in $(seq 1 1200); do
    [ "$(screen | sed '/^[[:space:]]*$/d' | tail -1)" = ">" ] && return 0
    sleep 0.1
  done
  echo "  timed out waiting for the prompt; the screen:" >&2
  screen | sed "/^$/d" | tail -15 >&2
  return 1
}
# waits until a reply has begun after the line "> $1"
wait_reply() {
  local i
  for i in $(seq 1 1200); do
    screen | awk -v l="> $1" 'seen && NF { found = 1 } $0 == l { seen = 1 } END { exit !found }' && return 0
    sleep 0.1
  done
  echo "  timed out waiting for a reply to '$1'" >&2
  return 1
}
count() { screen | grep -Ec -- "$1"; }

TM new-session -d -s repl -x 200 -y 50 \
  "cd '$T' && HOME='$T' MLXCEL_HISTORY='$T/history' '$BIN' chat -m '$CHAT' --temp 0 -n -1 --ignore-eos -c 65536 --stats; echo \"EXIT=\$?\"; sleep 600"
wait_for "Ctrl-D quits" && wait_prompt && ok "the prompt appears" || bad "no prompt"

# /help is answered by the REPL
TM send-keys -t repl "/help" Enter
wait_for "/save FILE +write the conversation" && wait_prompt && ok "/help answers locally" || bad "/help"

# arrow and emacs keys edit the line: "wrld" -> "hello world"
TM send-keys -t repl "wrld" C-a "hello " C-e Left Left Left "o"
wait_for "^> hello world$" && ok "arrow keys and C-a/C-e edit the line" || bad "line editing: $(screen | tail -1)"
TM send-keys -t repl Enter
wait_reply "hello world" && ok "the reply streams" || bad "no reply"
TM send-keys -t repl C-c
wait_for "stopped: the reply so far stays" && wait_prompt && ok "Ctrl-C stops the reply and returns to the prompt" ||
  bad "Ctrl-C during the reply"

# Ctrl-C at the prompt drops the typed line, the REPL stays
TM send-keys -t repl "never sent" C-c
wait_for "^> (never sent)?\^C$" && wait_prompt && ok "Ctrl-C at the prompt gives a new prompt" || bad "Ctrl-C at the prompt"

# Up recalls the last message; edit it into "hello there"
TM send-keys -t repl Up
wait_for "^> hello world$" && ok "Up recalls the history" || bad "Up: $(screen | tail -1)"
TM send-keys -t repl BSpace BSpace BSpace BSpace BSpace "there" Enter
wait_reply "hello there" && ok "the second reply streams" || bad "no second reply"
TM send-keys -t repl C-c
wait_for "\[[0-9]+ prompt tokens \([1-9][0-9]* cached\), [0-9]+ generated, .*cancelled\]" && wait_prompt &&
  ok "the second turn reuses the cached conversation" || bad "second turn stats"

# unknown commands get a message, with the likely one
TM send-keys -t repl "/sav x" Enter
wait_for "unknown command '/sav' \(did you mean /save\?\)" && wait_prompt && ok "a mistyped command is answered locally" ||
  bad "unknown command"
TM send-keys -t repl "/save $T/conv.json" Enter
wait_for "\(4 messages saved" && wait_prompt && ok "/save" || bad "/save"

# the conversation the model saw: both turns, the edited lines, the partial replies
roles=$(jq -r '[.[].role] | join(",")' "$T/conv.json" 2>/dev/null)
[ "$roles" = "user,assistant,user,assistant" ] && ok "the conversation is kept across Ctrl-C ($roles)" ||
  bad "saved roles: '$roles'"
[ "$(jq -r '.[0].content' "$T/conv.json")" = "hello world" ] && [ "$(jq -r '.[2].content' "$T/conv.json")" = "hello there" ] &&
  ok "the edited lines were sent" || bad "saved user messages: $(jq -c '[.[0].content, .[2].content]' "$T/conv.json")"
[ -n "$(jq -r '.[1].content' "$T/conv.json")" ] && [ -n "$(jq -r '.[3].content' "$T/conv.json")" ] &&
  ok "the stopped replies are kept" || bad "empty replies saved"
# what /save writes, mlxcel template reads
"$BIN" template -m "$CHAT" --messages "$T/conv.json" >/dev/null 2>"$T/terr" && ok "template --messages reads /save's file" ||
  bad "template on the saved conversation: $(cat "$T/terr")"

# Ctrl-D: a newline, then the process ends normally
TM send-keys -t repl C-d
wait_for "^EXIT=0$" && ok "Ctrl-D quits with a newline and exit status 0" || bad "Ctrl-D: $(screen | tail -3)"
grep -qx "hello\\\\040there" "$T/history" && ok "the history is saved" || bad "history file: $(cat "$T/history" 2>&1)"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
