#!/usr/bin/env bash
# libmlxcel as a user gets it: `cmake --install` into a temporary prefix,
# then, from that prefix only:
#   - the files an install must hold, the SONAME, and `nm -D` of the shared
#     library listing exactly the functions mlxcel.h declares (nothing else);
#   - mlxcel.h compiling alone as C99 (-pedantic -Werror) and as C++;
#   - examples/generate.c compiled with `pkg-config --cflags --libs mlxcel`
#     (and once against libmlxcel.a with `pkg-config --static`, once through
#     find_package(mlxcel) in CMake) printing PyTorch's greedy ids;
#   - examples/generate.py (ctypes) printing the same ids.
# The reference ids: models/kjv-moe/eval/reference_greedy.json (in the tree),
# and, with MLXCEL_FIXTURES, qwen2_moe_tiny_chat's reference.safetensors
# (prompt_ids, greedy_ids; its prompt is a chat prompt, which the C example
# gets as rendered text and the Python one through --chat).
set -u
SRC=$(cd "${MLXCEL_SRC:-.}" && pwd)
BUILD=${MLXCEL_BUILD:-build}
CC=${MLXCEL_CC:-cc}
for tool in cmake pkg-config nm readelf jq "$CC"; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed" >&2; exit 77; }
done
[ -f "$BUILD/CMakeCache.txt" ] || { echo "FAIL: $BUILD is not a build directory (set MLXCEL_BUILD)" >&2; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
# A sanitizer build's library needs the sanitizer runtime in the program
# that loads it: the examples get the same flags, Python gets it preloaded.
SAN=()
PRELOAD=
case "${MLXCEL_SANITIZE:-OFF}" in
  ON|1|TRUE|true)
    SAN=(-fsanitize=address,undefined)
    if "$CC" --version | grep -q clang; then
      PRELOAD=$("$CC" -print-file-name=libclang_rt.asan-x86_64.so)
    else
      PRELOAD="$("$CC" -print-file-name=libasan.so) $("$CC" -print-file-name=libubsan.so)"
    fi ;;
esac
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

P=$T/prefix
if cmake --install "$BUILD" --prefix "$P" > "$T/install.log" 2>&1; then
  ok "cmake --install into a temporary prefix"
else
  bad "cmake --install: $(tail -3 "$T/install.log")"
  echo "$pass passed, $fail failed"
  exit 1
fi
V=$(sed -n 's/^#define MLXCEL_VERSION_STRING "\(.*\)"$/\1/p' "$SRC/include/mlxcel.h")
MAJOR=${V%%.*}
LIBDIR=$(dirname "$(find "$P" -name "libmlxcel.so.$V" | head -1)")
missing=
for f in bin/mlxcel include/mlxcel.h; do [ -e "$P/$f" ] || missing+=" $f"; done
for f in "libmlxcel.so.$V" "libmlxcel.so.$MAJOR" libmlxcel.so libmlxcel.a pkgconfig/mlxcel.pc \
         cmake/mlxcel/mlxcelConfig.cmake cmake/mlxcel/mlxcelConfigVersion.cmake; do
  [ -e "$LIBDIR/$f" ] || missing+=" lib/$f"
done
[ -z "$missing" ] && ok "the prefix holds bin/mlxcel, the libraries, the header, mlxcel.pc and the CMake package" ||
  bad "missing from the install:$missing"
SO=$LIBDIR/libmlxcel.so.$V
soname=$(readelf -d "$SO" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libmlxcel.so.$MAJOR" ] && ok "SONAME $soname" || bad "SONAME is '$soname', not libmlxcel.so.$MAJOR"

# exported symbols == the functions mlxcel.h declares
nm -D --defined-only "$SO" | awk '{print $NF}' | sort > "$T/exported"
grep '^MLXCEL_API ' "$P/include/mlxcel.h" | sed 's/(.*//; s/.*[ *]//' | sort > "$T/declared"
if [ -s "$T/declared" ] && cmp -s "$T/exported" "$T/declared"; then
  ok "nm -D lists exactly the $(wc -l < "$T/declared") functions of mlxcel.h"
else
  bad "nm -D differs from mlxcel.h's functions: $(diff "$T/declared" "$T/exported" | grep '^[<>]' | head -5 | tr '\n' ' ')"
fi

# the header alone: C99 and C++, pedantic, no warnings
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
printf '#include <mlxcel.h>\nint main(void) { return mlxcel_version_number() == MLXCEL_VERSION_NUMBER ? 0 : 1; }\n' > "$T/h.c"
# shellcheck disable=SC2046
if "$CC" -std=c99 -pedantic -Wall -Wextra -Werror $(pkg-config --cflags mlxcel) -c "$T/h.c" -o "$T/h.o" 2> "$T/h.err"; then
  ok "mlxcel.h compiles as C99 with -pedantic -Wall -Wextra -Werror"
else
  bad "mlxcel.h as C99: $(head -3 "$T/h.err")"
fi
if command -v c++ >/dev/null; then
  cp "$T/h.c" "$T/h.cpp"
  # shellcheck disable=SC2046
  if c++ -std=c++11 -pedantic -Wall -Wextra -Werror $(pkg-config --cflags mlxcel) -c "$T/h.cpp" -o "$T/hpp.o" 2> "$T/h.err"; then
    ok "mlxcel.h compiles as C++11 with -pedantic -Wall -Wextra -Werror"
  else
    bad "mlxcel.h as C++: $(head -3 "$T/h.err")"
  fi
fi
if grep '^#include' "$P/include/mlxcel.h" | grep -qv '<std\(def\|int\)\.h>'; then
  bad "mlxcel.h includes more than stddef.h/stdint.h: $(grep '^#include' "$P/include/mlxcel.h" | tr '\n' ' ')"
else
  ok "mlxcel.h includes only stddef.h and stdint.h"
fi

# docs/library.md shows the examples verbatim (so what it shows is what runs)
for ex in c:generate.c python:generate.py; do
  awk -v fence="\`\`\`${ex%%:*}" '$0 == fence && !done { on = 1; next } on && $0 == "```" { on = 0; done = 1 } on' \
    "$SRC/docs/library.md" > "$T/doc_${ex#*:}"
  cmp -s "$T/doc_${ex#*:}" "$SRC/examples/${ex#*:}" &&
    ok "docs/library.md shows examples/${ex#*:} as it is" ||
    bad "docs/library.md's first \`\`\`${ex%%:*} block differs from examples/${ex#*:}"
done

# the C example, built the three ways a user would
# shellcheck disable=SC2046
"$CC" "$SRC/examples/generate.c" "${SAN[@]}" $(pkg-config --cflags --libs mlxcel) -o "$T/gen" 2> "$T/cc.err" &&
  ok "examples/generate.c builds with pkg-config --cflags --libs mlxcel" ||
  bad "examples/generate.c with pkg-config: $(head -3 "$T/cc.err")"
# shellcheck disable=SC2046
"$CC" "$SRC/examples/generate.c" "${SAN[@]}" $(pkg-config --cflags mlxcel) \
  $(pkg-config --static --libs mlxcel | sed 's/-lmlxcel\b/-l:libmlxcel.a/') -o "$T/gen_static" 2> "$T/cc.err" &&
  ok "examples/generate.c links libmlxcel.a with pkg-config --static --libs mlxcel" ||
  bad "examples/generate.c against libmlxcel.a: $(head -3 "$T/cc.err")"
mkdir -p "$T/cm"
cat > "$T/cm/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.18)
project(gen C)
find_package(mlxcel $V REQUIRED)
add_executable(gen_cmake "$SRC/examples/generate.c")
target_link_libraries(gen_cmake PRIVATE mlxcel::mlxcel)
CM
if cmake -S "$T/cm" -B "$T/cm/b" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_C_COMPILER="$CC" \
     -DCMAKE_C_FLAGS="${SAN[*]}" > "$T/cm.log" 2>&1 && cmake --build "$T/cm/b" >> "$T/cm.log" 2>&1; then
  ok "examples/generate.c builds through find_package(mlxcel) and mlxcel::mlxcel"
else
  bad "the CMake package: $(tail -5 "$T/cm.log")"
fi

# generate.c's three builds and generate.py must print the reference ids
run_all() {   # name, model dir, C prompt (text), python args..., expected ids (last)
  local name=$1 dir=$2 prompt=$3; shift 3
  local want=${*: -1} pyargs=("${@:1:$#-1}") n got exe
  n=$(wc -w <<< "$want")
  for exe in gen gen_static cm/b/gen_cmake; do
    [ -x "$T/$exe" ] || continue
    got=$(LD_LIBRARY_PATH=$LIBDIR "$T/$exe" "$dir" "$prompt" "$n" --ids 2> "$T/run.err" | tr '\n' ' ')
    [ "${got% }" = "$want" ] && ok "$name: $exe prints the $n reference greedy ids" ||
      bad "$name: $exe printed '${got% }', reference '$want' $(tail -2 "$T/run.err")"
  done
  if ! command -v python3 >/dev/null; then
    echo "skip: python3 is not installed: examples/generate.py not run" >&2
    return
  fi
  got=$(LD_LIBRARY_PATH=$LIBDIR LD_PRELOAD=$PRELOAD ASAN_OPTIONS=detect_leaks=0 \
        python3 "$SRC/examples/generate.py" "$dir" "${pyargs[@]}" "$n" --ids 2> "$T/py.err" | tr '\n' ' ')
  [ "${got% }" = "$want" ] && ok "$name: generate.py (ctypes) prints the $n reference greedy ids" ||
    bad "$name: generate.py printed '${got% }', reference '$want' $(tail -2 "$T/py.err")"
}

KJV=$SRC/models/kjv-moe
if [ -f "$KJV/eval/reference_greedy.json" ]; then
  ref=$KJV/eval/reference_greedy.json
  run_all "kjv-moe" "$KJV" "$(jq -r .prompt "$ref")" "$(jq -r .prompt "$ref")" \
    "$(jq -r '.greedy_ids | map(tostring) | join(" ")' "$ref")"
else
  echo "skip: $KJV/eval/reference_greedy.json is not there" >&2
fi

F=${MLXCEL_FIXTURES:-}/qwen2_moe_tiny_chat
if [ -z "${MLXCEL_FIXTURES:-}" ]; then
  echo "skip: MLXCEL_FIXTURES is not set: the qwen2_moe_tiny_chat part is skipped" >&2
elif ! command -v python3 >/dev/null; then
  echo "skip: python3 is needed to read reference.safetensors" >&2
else
  # prompt_ids and greedy_ids (I32 tensors) from the reference, stdlib only
  python3 - "$F/reference.safetensors" > "$T/ref.txt" <<'PY' || bad "cannot read $F/reference.safetensors"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for k in ("prompt_ids", "greedy_ids"):
    lo, hi = h[k]["data_offsets"]
    assert h[k]["dtype"] == "I32", h[k]["dtype"]
    print(" ".join(str(v) for v in struct.unpack("<%di" % ((hi - lo) // 4), b[8 + n + lo:8 + n + hi])))
PY
  prompt_ids=$(sed -n 1p "$T/ref.txt")
  want=$(sed -n 2p "$T/ref.txt")
  # the prompt as text (its trailing newline kept): decoded with the special
  # tokens, it must encode back to prompt_ids
  prompt=$("$P/bin/mlxcel" detokenize -m "$F" --ids "$prompt_ids" 2> "$T/d.err"; echo .)
  prompt=${prompt%.}
  again=$("$P/bin/mlxcel" tokenize -m "$F" -p "$prompt" 2>&1)
  if [ "$again" != "$prompt_ids" ]; then
    bad "qwen2_moe_tiny_chat: the decoded prompt does not encode back to prompt_ids ($again $(cat "$T/d.err"))"
  else
    user=$(printf '%s' "$prompt" | sed -n '/^<|im_start|>user$/,/<|im_end|>$/p' | sed '1d; s/<|im_end|>$//')
    run_all "qwen2_moe_tiny_chat" "$F" "$prompt" --chat "$user" "$want"
  fi
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
