#!/bin/sh
# Runs every test program in $BUILD/tests (or only those named in $TESTS, e.g.
# TESTS="test_serve test_batch") and adds up their counts. A program that
# crashes or prints no count line counts as one failure. A program's skips
# (its `N skipped: reasons` line) are added up and listed, one line per program,
# before the total; the last line is always `N passed, N failed`.
#
# Every test writes its files under one per-run folder (mkdtemp under
# $TMPDIR, passed down as TMPDIR, removed at the end; tests/temps.h); a test
# that leaves anything there counts as one failure.
BUILD=${BUILD:-build}
passed=0; failed=0; skipped=0; skips=
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/q3-tests.XXXXXX") || exit 1
trap 'rm -rf "$run_tmp"' EXIT
trap 'exit 130' INT TERM
if [ -n "${TESTS:-}" ]; then
  list=; for n in $TESTS; do list="$list $BUILD/tests/$n"; done
else
  list="$BUILD/tests/test_*"
fi
for t in $list; do
  case $t in *.d|*.stderr|*.log) continue ;; esac
  if [ ! -x "$t" ]; then
    [ -n "${TESTS:-}" ] && { echo "$(basename "$t"): not built"; failed=$((failed + 1)); }
    continue
  fi
  name=$(basename "$t")
  out=$(TMPDIR="$run_tmp" "$t" 2>"$BUILD/tests/$name.stderr"); rc=$?
  left=$(ls -A "$run_tmp")
  if [ -n "$left" ]; then
    echo "$name: left files in the run's temporary folder: $(echo $left)"
    rm -rf "$run_tmp"/* "$run_tmp"/.[!.]* 2>/dev/null
    failed=$((failed + 1))
  fi
  line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
  if [ -z "$line" ]; then
    echo "$name: no result line (exit $rc)"; sed 's/^/  /' "$BUILD/tests/$name.stderr" | tail -20
    failed=$((failed + 1)); continue
  fi
  p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
  passed=$((passed + p)); failed=$((failed + f))
  sline=$(printf '%s\n' "$out" | grep -E '^[0-9]+ skipped: ' | tail -1)
  note=
  if [ -n "$sline" ]; then
    s=${sline%% skipped:*}; skipped=$((skipped + s))
    skips="$skips
  $name: ${sline#* skipped: }"
    note=", $s skipped"
  fi
  if [ "$f" -ne 0 ] || [ "$rc" -ne 0 ]; then
    echo "$name: $line$note (exit $rc)"; sed 's/^/  /' "$BUILD/tests/$name.stderr" | tail -40
    [ "$f" -eq 0 ] && failed=$((failed + 1))
  else
    echo "$name: $line$note"
  fi
done
[ "$skipped" -gt 0 ] && printf '%s skipped:%s\n' "$skipped" "$skips"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
