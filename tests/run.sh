#!/bin/sh
# Runs every test program in $BUILD/tests and adds up their counts.
# A program that crashes or prints no count line counts as one failure.
BUILD=${BUILD:-build}
passed=0; failed=0
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  out=$("$t" 2>"$BUILD/tests/$name.stderr"); rc=$?
  line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
  if [ -z "$line" ]; then
    echo "$name: no result line (exit $rc)"; sed 's/^/  /' "$BUILD/tests/$name.stderr" | tail -20
    failed=$((failed + 1)); continue
  fi
  p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$f" -ne 0 ] || [ "$rc" -ne 0 ]; then
    echo "$name: $line (exit $rc)"; sed 's/^/  /' "$BUILD/tests/$name.stderr" | tail -40
    [ "$f" -eq 0 ] && failed=$((failed + 1))
  else
    echo "$name: $line"
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
