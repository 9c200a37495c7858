#!/bin/sh
# Installs q3 into a scratch prefix, builds the examples against the installed
# tree with pkg-config (shared and static linking), runs them on the golden e2e
# model and checks their text against `q3 run` with the same settings
# (greedy, no thinking). Prints `N passed, N failed`; exits non-zero on any
# failure. Used by CI (.ci/run) after the test suite.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
# install what is built, with the flags it was built with: objects depend on their flags, so a plain
# `make install` after `make WERROR=1 test` (as CI runs them) would rebuild everything without -Werror
grep -q -- '-Werror' "$BUILD/flags.stamp" 2>/dev/null && export WERROR=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0; failed=0
ok()   { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }

prefix="$tmp/prefix"
if make -s install PREFIX="$prefix" BUILD="$BUILD" >"$tmp/install.log" 2>&1; then ok; else fail "make install"; cat "$tmp/install.log"; fi
for f in bin/q3 include/q3.h lib/libq3.a lib/libq3.so lib/pkgconfig/q3.pc share/q3/qwen3-tokenizer/tokenizer.json; do
  [ -e "$prefix/$f" ] && ok || fail "installed $f missing"
done
soname=$(readelf -d "$prefix/lib/libq3.so" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libq3.so.0" ] && ok || fail "soname is '$soname'"
# only q3_ symbols leave the shared library
others=$(nm -D --defined-only "$prefix/lib/libq3.so" | awk '{print $3}' | grep -v '^q3_' | wc -l)
[ "$others" -eq 0 ] && ok || fail "$others exported symbols without the q3_ prefix"

# the installed binary finds the installed built-in tokenizer (PREFIX/share/q3), from any folder
toks=$(cd "$tmp" && env -u Q3_MODELS -u Q3_CACHE_DIR -u XDG_CACHE_HOME HOME="$tmp" Q3_TOKENIZER= "$prefix/bin/q3" tokenize hello 2>"$tmp/err")
[ "$toks" = "[14990]" ] && ok || { fail "installed q3 tokenize hello printed '$toks'"; cat "$tmp/err"; }

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cflags=$(pkg-config --cflags q3) && libs=$(pkg-config --libs q3) && private=$(pkg-config --static --libs q3) && ok || fail "pkg-config q3"
model=tests/data/golden/e2e
prompt="What is the capital of France?"
want=$("$prefix/bin/q3" run -m "$model" -p "$prompt" --temp 0 --no-think -n 16 2>/dev/null)
[ -n "$want" ] && ok || fail "q3 run printed nothing"
for ex in simple batch; do
  # shared: -lq3 found through pkg-config, run with the installed library
  if cc -std=c17 -Wall -Werror examples/$ex.c $cflags $libs -o "$tmp/$ex-shared" 2>"$tmp/cc.log"; then ok; else fail "build $ex (shared)"; cat "$tmp/cc.log"; fi
  # static: libq3.a with the private link flags
  if cc -std=c17 -Wall -Werror examples/$ex.c $cflags -L"$prefix/lib" -Wl,-Bstatic -lq3 -Wl,-Bdynamic \
       $(echo "$private" | sed 's/-lq3//') -o "$tmp/$ex-static" 2>"$tmp/cc.log"; then ok; else fail "build $ex (static)"; cat "$tmp/cc.log"; fi
  ldd "$tmp/$ex-static" 2>/dev/null | grep -q libq3 && fail "$ex-static links libq3.so" || ok
done
for kind in shared static; do
  got=$(LD_LIBRARY_PATH="$prefix/lib" "$tmp/simple-$kind" "$model" "$prompt" 16 2>"$tmp/err" | sed '$d')
  [ "$got" = "$want" ] && ok || { fail "simple ($kind) differs from q3 run"; printf 'want: %s\ngot:  %s\n' "$want" "$got"; cat "$tmp/err"; }
  # batch: three prompts at once, the first equals the one run alone
  out=$(LD_LIBRARY_PATH="$prefix/lib" "$tmp/batch-$kind" "$model" "$prompt" "Name a colour." "Count to three." 2>"$tmp/err")
  [ "$(printf '%s\n' "$out" | grep -c '^\[[0-9]*\] ')" -eq 3 ] && ok || { fail "batch ($kind): three answers"; cat "$tmp/err"; }
  want64=$("$prefix/bin/q3" run -m "$model" -p "Name a colour." --temp 0 --no-think -n 64 2>/dev/null)
  got1=$(printf '%s\n' "$out" | awk '/^\[1\] /{sub(/^\[1\] /,""); p=1} /^\[[0-9]+ tokens/{if(p){exit}} p{print}')
  [ "$got1" = "$want64" ] && ok || { fail "batch ($kind): answer 1 differs from q3 run alone"; printf 'want: %s\ngot:  %s\n' "$want64" "$got1"; }
done
# a second install to another prefix from the same tree: its q3.pc names that prefix, not the first
prefix2="$tmp/prefix2"
if make -s install PREFIX="$prefix2" BUILD="$BUILD" >"$tmp/install2.log" 2>&1; then ok; else fail "make install (second prefix)"; cat "$tmp/install2.log"; fi
[ "$(PKG_CONFIG_PATH="$prefix2/lib/pkgconfig" pkg-config --variable=prefix q3)" = "$prefix2" ] && ok ||
  fail "the second prefix's q3.pc says prefix=$(PKG_CONFIG_PATH="$prefix2/lib/pkgconfig" pkg-config --variable=prefix q3)"
# built against the second prefix, a program links the second prefix's library, and still runs once
# the first prefix is gone (the bug was: B's q3.pc said prefix=A)
c2=$(PKG_CONFIG_PATH="$prefix2/lib/pkgconfig" pkg-config --cflags --libs q3)
if cc -std=c17 -Wall -Werror examples/simple.c $c2 -Wl,-rpath,"$prefix2/lib" -o "$tmp/simple-b" 2>"$tmp/cc.log"; then ok; else fail "build simple against the second prefix"; cat "$tmp/cc.log"; fi
ldd "$tmp/simple-b" 2>/dev/null | grep -q "$prefix2/lib/libq3.so" && ok || fail "simple-b does not link $prefix2/lib/libq3.so"
make -s uninstall PREFIX="$prefix" BUILD="$BUILD" >/dev/null 2>&1
got=$("$tmp/simple-b" "$model" "$prompt" 16 2>"$tmp/err" | sed '$d')
[ "$got" = "$want" ] && ok || { fail "simple-b after the first prefix's uninstall"; cat "$tmp/err"; }
make -s uninstall PREFIX="$prefix2" BUILD="$BUILD" >/dev/null 2>&1
left=$(find "$prefix" "$prefix2" -type f | wc -l)
[ "$left" -eq 0 ] && ok || fail "uninstall left $left files"
# and no empty folders: only the prefixes themselves remain
dirs=$(find "$prefix" "$prefix2" -mindepth 1 -type d | wc -l)
[ "$dirs" -eq 0 ] && ok || { fail "uninstall left $dirs folders"; find "$prefix" "$prefix2" -mindepth 1 -type d; }
# The README's library and serving examples, run exactly as written (from the source tree, as the
# README says). The library one in a scratch $HOME, so $HOME/.local is a scratch prefix too.
readme_block() { # the first ```sh block after the heading $1
  awk -v h="$1" '$0 == h {f=1; next} f && /^```sh$/ {b=1; next} b && /^```$/ {exit} b {print}' README.md
}
readme_block "## Use it as a library" > "$tmp/readme-lib.sh"
grep -q 'pkg-config' "$tmp/readme-lib.sh" && ok || fail "README: no library example found"
mkdir -p "$tmp/home"
out=$(env -u PKG_CONFIG_PATH -u LD_LIBRARY_PATH HOME="$tmp/home" BUILD="$BUILD" timeout 600 sh -e "$tmp/readme-lib.sh" 2>"$tmp/readme-lib.err")
rc=$?
rm -f simple
[ $rc -eq 0 ] && printf '%s\n' "$out" | grep -qF "$want" && ok ||
  { fail "the README's library example (exit $rc)"; printf '%s\n' "$out" | tail -5; tail -5 "$tmp/readme-lib.err"; }
make -s uninstall PREFIX="$tmp/home/.local" BUILD="$BUILD" >/dev/null 2>&1
readme_block "## Serving" > "$tmp/readme-serve.sh"
grep -q 'q3 serve' "$tmp/readme-serve.sh" && ok || fail "README: no serving example found"
out=$(PORT=$((20000 + $$ % 20000)) timeout 120 sh -e "$tmp/readme-serve.sh" 2>"$tmp/readme-serve.err")
rc=$?
[ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q '^data: \[DONE\]' && printf '%s\n' "$out" | grep -q '"usage"' && ok ||
  { fail "the README's serving example (exit $rc)"; printf '%s\n' "$out" | tail -5; tail -5 "$tmp/readme-serve.err"; }
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
