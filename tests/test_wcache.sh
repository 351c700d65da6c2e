#!/usr/bin/env bash
# The weight cache (src/wcache, docs/cache.md) on copies of the demo model
# models/kjv-moe (stacked experts) and of a synth checkpoint (per-expert
# layout): greedy ids with the cache (built, then reused, and the
# mem mode) equal the ids without it; a checkpoint file touched, a cache
# file truncated or damaged (header or data) is rebuilt with a warning; a
# folder that cannot be written gives a warning and the right output;
# --repack off never writes a file; two processes building at once both
# give the right output and leave one valid file; the checkpoint folders
# stay byte-identical.  With MLXCEL_FIXTURES, the fixture test runs with
# the cache built and then reused (logits within its tolerance).
set -u
BIN=${MLXCEL_BIN:-build/mlxcel}
SRC=${MLXCEL_SRC:-.}
BUILD=${MLXCEL_BUILD:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export MLXCEL_CACHE_DIR=$T/cache   # never the user's ~/.cache
unset MLXCEL_REPACK
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

if [ ! -f "$SRC/models/kjv-moe/model.safetensors" ]; then
  echo "SKIP: $SRC/models/kjv-moe is not in this tree" >&2
  exit 77
fi
cp -r "$SRC/models/kjv-moe" "$T/kjv"
"$BIN" synth --preset tiny --out "$T/syn" --layout per-expert --seed 5 --quiet &&
  "$BIN" synth --preset tiny --out "$T/syn3" --bits 3 --seed 5 --quiet ||
  { echo "FAIL: synth" >&2; exit 1; }
sums() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
sums "$T/kjv" > "$T/kjv.sum"
sums "$T/syn" > "$T/syn.sum"

gen() {   # gen MODEL OUT [options...]: greedy ids on stdout into OUT, stderr into OUT.err
  local m=$1 out=$2
  shift 2
  "$BIN" generate -m "$m" --prompt-ids 1,2,3,4,5,6,7,8 -n 12 --temp 0 --ids-only --stats "$@" \
    > "$out" 2> "$out.err"
}
cfile() { ls "$MLXCEL_CACHE_DIR"/"$1"-*.mlxw 2>/dev/null | head -1; }

for M in kjv syn; do
  gen "$T/$M" "$T/$M.ref" --repack off || bad "$M: reference run: $(tail -1 "$T/$M.ref.err")"
  check "$M: --repack off writes no cache file" '[ ! -e "$MLXCEL_CACHE_DIR" ] || [ -z "$(cfile $M)" ]'
  check "$M: --stats says the cache is off" 'grep -q "^weight cache: off" "$T/$M.ref.err"'

  gen "$T/$M" "$T/$M.a1" --repack auto || bad "$M: first auto run: $(tail -1 "$T/$M.a1.err")"
  f=$(cfile $M)
  check "$M: the first auto run builds the cache file" '[ -n "$f" ] && grep -q "weight cache: built" "$T/$M.a1.err"'
  check "$M: ids with the cache just built = ids without" 'cmp -s "$T/$M.ref" "$T/$M.a1"'
  check "$M: no temporary file is left" '[ -z "$(ls "$MLXCEL_CACHE_DIR" | grep "\.tmp\.")" ]'
  [ -n "$f" ] || continue
  before=$(stat -c %Y.%i "$f")
  sleep 1
  MLXCEL_REPACK=auto gen "$T/$M" "$T/$M.a2" || bad "$M: second auto run"
  check "$M: the second run reuses it (MLXCEL_REPACK=auto)" \
    'grep -q "^weight cache: used $f" "$T/$M.a2.err" && ! grep -q "built\|warning" "$T/$M.a2.err" && [ "$(stat -c %Y.%i "$f")" = "$before" ]'
  check "$M: ids with the cache reused = ids without" 'cmp -s "$T/$M.ref" "$T/$M.a2"'
  check "$M: inspect names the valid cache" '"$BIN" inspect -m "$T/$M" | grep -q "^weight cache: $f"'

  gen "$T/$M" "$T/$M.mem" --repack mem || bad "$M: mem run"
  check "$M: ids repacked in memory = ids without" 'cmp -s "$T/$M.ref" "$T/$M.mem" && grep -q "repacked in memory" "$T/$M.mem.err"'

  # a checkpoint file touched: stale, rebuilt with one warning
  w=$(ls "$T/$M"/*.safetensors | head -1)
  cp -p "$w" "$T/w.bak"
  touch -d '2001-01-01' "$w"
  gen "$T/$M" "$T/$M.t" --repack auto || bad "$M: run after touch"
  check "$M: a touched checkpoint file makes the cache stale and rebuilt" \
    'grep -q "warning: weight cache .* is stale (checkpoint file .* changed" "$T/$M.t.err" && grep -q "weight cache: built" "$T/$M.t.err"'
  check "$M: ids after the rebuild = ids without" 'cmp -s "$T/$M.ref" "$T/$M.t"'
  touch -r "$T/w.bak" "$w"
  gen "$T/$M" "$T/$M.t2" --repack auto > /dev/null   # back to the original mtime: rebuilt again
  # the file replaced by a copy with the same size and time: another inode
  cp -p "$w" "$w.new" && mv "$w.new" "$w"
  gen "$T/$M" "$T/$M.i" --repack auto || bad "$M: run after a replaced file"
  check "$M: a checkpoint file replaced (same size and time, another inode) makes it stale" \
    'grep -q "is stale (checkpoint file .* changed (inode)" "$T/$M.i.err" && cmp -s "$T/$M.ref" "$T/$M.i"'

  # damaged cache files
  size=$(stat -c %s "$f")
  truncate -s $((size - 4096)) "$f"
  gen "$T/$M" "$T/$M.tr" --repack auto || bad "$M: run after truncation"
  check "$M: a truncated cache file is detected and rebuilt" \
    'grep -q "stale (.*truncated" "$T/$M.tr.err" && grep -q "built" "$T/$M.tr.err" && [ "$(stat -c %s "$f")" = "$size" ]'
  check "$M: ids after that = ids without" 'cmp -s "$T/$M.ref" "$T/$M.tr"'
  printf '\x55' | dd of="$f" bs=1 seek=100 conv=notrunc status=none
  gen "$T/$M" "$T/$M.h" --repack auto || bad "$M: run after a damaged header"
  check "$M: a damaged header is detected and rebuilt" 'grep -q "stale (.*damaged" "$T/$M.h.err" && grep -q "built" "$T/$M.h.err"'
  hb=$(od -A n -t u8 -j 16 -N 8 "$f" | tr -d ' ')   # the payload's first byte
  printf '\xa5\x5a\xa5\x5a' | dd of="$f" bs=1 seek="$hb" conv=notrunc status=none
  gen "$T/$M" "$T/$M.d" --repack auto || bad "$M: run after damaged data"
  check "$M: damaged matrix data is detected and rebuilt" 'grep -q "stale (the data of matrix 0 is damaged" "$T/$M.d.err"'
  check "$M: ids after that = ids without" 'cmp -s "$T/$M.ref" "$T/$M.d"'
  printf 'junk' > "$f"
  gen "$T/$M" "$T/$M.j" --repack auto || bad "$M: run over a junk file"
  check "$M: a file that is no cache is replaced" 'grep -q "stale (.*truncated\|stale (not a weight cache" "$T/$M.j.err" && cmp -s "$T/$M.ref" "$T/$M.j"'

  # rebuild: always builds; the same bytes whatever the window the file is
  # written in (the windowed writer, with matrices across windows' edges)
  gen "$T/$M" "$T/$M.rb" --repack rebuild || bad "$M: rebuild run"
  check "$M: --repack rebuild builds a valid cache again" 'grep -q "weight cache: built" "$T/$M.rb.err" && ! grep -q warning "$T/$M.rb.err" && cmp -s "$T/$M.ref" "$T/$M.rb"'
  cp "$f" "$T/$M.whole"
  MLXCEL_CACHE_WINDOW=12288 gen "$T/$M" "$T/$M.win" --repack rebuild || bad "$M: rebuild in 12 KiB windows"
  check "$M: written in 12 KiB windows: the same file, the same ids" 'cmp -s "$f" "$T/$M.whole" && cmp -s "$T/$M.ref" "$T/$M.win"'
done

# a model with no matrix in a repacked format (3-bit): no file, and --stats says why
gen "$T/syn3" "$T/s3.ref" --repack off
gen "$T/syn3" "$T/s3" --repack auto
check "3-bit: no cache file, the reason in --stats, the same ids" \
  '[ -z "$(cfile syn3)" ] && grep -q "^weight cache: off: no matrix of this model has a repacked form" "$T/s3.err" && cmp -s "$T/s3.ref" "$T/s3"'

# a stale temporary file of a build that died is removed by the next build
f=$(cfile kjv)
: > "$f.tmp.dead01"
gen "$T/kjv" "$T/k.rb2" --repack rebuild > /dev/null
check "a dead build's temporary file is removed" '[ ! -e "$f.tmp.dead01" ]'

# a cache folder that cannot be created (its parent is a file; root ignores modes)
: > "$T/afile"
MLXCEL_CACHE_DIR=$T/afile/cache gen "$T/kjv" "$T/k.nw" --repack auto
rc=$?
check "an unusable cache folder: the run succeeds" '[ $rc = 0 ]'
check "... with one warning naming the folder and the error" \
  '[ "$(grep -c warning "$T/k.nw.err")" = 1 ] && grep -q "warning: weight cache: cannot create the cache folder $T/afile/cache: Not a directory; running without it" "$T/k.nw.err"'
check "... and the right ids" 'cmp -s "$T/kjv.ref" "$T/k.nw"'
check "... and --stats says it was not used" 'grep -q "^weight cache: not used" "$T/k.nw.err"'

# a file system without room for the cache (a 2 MiB tmpfs in a mount
# namespace of its own, where this user may make one)
mkdir -p "$T/small"
if unshare -m true 2> /dev/null; then
  unshare -m bash -c 'mount -t tmpfs -o size=2M tmpfs "$1" && MLXCEL_CACHE_DIR=$1/c "$2" generate -m "$3" \
    --prompt-ids 1,2,3,4,5,6,7,8 -n 12 --temp 0 --ids-only --repack auto' _ "$T/small" "$BIN" "$T/kjv" \
    > "$T/k.full" 2> "$T/k.full.err"
  rc=$?
  check "no room for the cache: one warning naming the folder, the run goes on with the right ids" \
    '[ $rc = 0 ] && [ "$(grep -c warning "$T/k.full.err")" = 1 ] && grep -q "warning: weight cache: not enough room in $T/small/c for the cache file" "$T/k.full.err" && cmp -s "$T/kjv.ref" "$T/k.full"'
else
  echo "note: no mount namespace here: the full-disk case is not checked"
fi

# a cache folder inside the checkpoint: refused (the checkpoint is never written)
MLXCEL_CACHE_DIR=$T/kjv/cache gen "$T/kjv" "$T/k.in" --repack auto
check "a cache folder inside the checkpoint is refused, the run goes on" \
  'grep -q "inside the checkpoint" "$T/k.in.err" && [ ! -e "$T/kjv/cache" ] && cmp -s "$T/kjv.ref" "$T/k.in"'

# two processes building the same cache at once
rm -f "$(cfile kjv)"
gen "$T/kjv" "$T/k.c1" --repack auto & p1=$!
gen "$T/kjv" "$T/k.c2" --repack auto & p2=$!
wait $p1; r1=$?
wait $p2; r2=$?
check "two concurrent builders: both succeed with the right ids" \
  '[ $r1 = 0 ] && [ $r2 = 0 ] && cmp -s "$T/kjv.ref" "$T/k.c1" && cmp -s "$T/kjv.ref" "$T/k.c2"'
gen "$T/kjv" "$T/k.c3" --repack auto
check "... and leave one valid file" 'grep -q "^weight cache: used" "$T/k.c3.err" && [ "$(ls "$MLXCEL_CACHE_DIR" | grep -c "^kjv-.*\.mlxw$")" = 1 ]'

# bad values
"$BIN" generate -m "$T/kjv" --prompt-ids 1 -n 1 --repack sometimes > /dev/null 2> "$T/bad.err"
rc=$?
check "--repack with an unknown mode is a usage error" '[ $rc != 0 ] && grep -q "not a repack mode" "$T/bad.err"'
MLXCEL_REPACK=bogus gen "$T/kjv" "$T/k.bog"
check "MLXCEL_REPACK with an unknown mode: a warning, off" 'grep -q "MLXCEL_REPACK=.bogus. is not a mode" "$T/k.bog.err" && cmp -s "$T/kjv.ref" "$T/k.bog"'

check "the demo model's folder is byte-identical after all that" 'sums "$T/kjv" | cmp -s - "$T/kjv.sum"'
check "the synth model's folder is byte-identical after all that" 'sums "$T/syn" | cmp -s - "$T/syn.sum"'

# the fixture models (references from the reference system), logits within
# the fixture test's own tolerance, with the cache built and then reused
if [ -n "${MLXCEL_FIXTURES:-}" ] && [ -x "$BUILD/test_model_fixtures" ]; then
  for run in build reuse; do
    if MLXCEL_REPACK=auto MLXCEL_CACHE_DIR=$T/fcache "$BUILD/test_model_fixtures" > "$T/fx.out" 2>&1; then
      ok "fixture logits with the cache ($run)"
      # small caches build without progress lines: look at the files
      [ $run = build ] && check "the fixture run built caches" 'ls "$T"/fcache/*.mlxw > /dev/null 2>&1' &&
        ls -l --time-style=full-iso "$T"/fcache/*.mlxw > "$T/fcache.built"
    else
      bad "fixture logits with the cache ($run): $(grep -m3 FAIL "$T/fx.out")"
    fi
  done
  check "the fixture run reused its caches" \
    'ls -l --time-style=full-iso "$T"/fcache/*.mlxw | cmp -s - "$T/fcache.built"'
else
  echo "note: MLXCEL_FIXTURES unset: the fixture logits with the cache are not checked"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
