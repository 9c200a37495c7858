#!/bin/sh
# Builds the libFuzzer targets (make fuzz-build: clang, ASan + UBSan) and runs
# each for SECONDS (default 60), one fuzzer process at a time.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 1800 gguf
#
# Targets: safetensors config shard_index gguf chat_template tokenizer_json tokenize
# srv_chat srv_completion srv_tokenize (fuzz/fuzz_<target>.c). Each run first replays fuzz/regressions/<target>/,
# then fuzzes with fuzz/corpus/<target>/ as seeds (read only) and
# build-fuzz/corpus/<target>/ as the growing working corpus, kept between runs.
# A crash, leak, timeout or broken invariant is saved under
# build-fuzz/artifacts/<target>/ and makes the script exit 1; turn it into a
# regression (fuzz/regressions/<target>/ and tests/test_fuzz_regressions.c).
# Per target it prints executions, coverage (cov: edges, ft: features) and corpus size.
set -u
cd "$(dirname "$0")/.."
secs=${1:-60}
[ $# -gt 0 ] && shift
targets="$*"
[ -n "$targets" ] || targets="safetensors config shard_index gguf chat_template tokenizer_json tokenize srv_chat srv_completion srv_tokenize"

make -s fuzz-build || exit 1

fail=0
for t in $targets; do
    bin=build-fuzz/fuzz_$t
    if [ ! -x "$bin" ]; then
        echo "fuzz: no target $t ($bin)"
        fail=1
        continue
    fi
    work=build-fuzz/corpus/$t
    art=build-fuzz/artifacts/$t
    log=build-fuzz/logs/$t.log
    mkdir -p "$work" "$art" build-fuzz/logs
    # max_len: inputs a little larger than the largest seed; malloc_limit: an
    # allocation this large from a small file is a finding (the tokenizer
    # targets hold the real 151k vocabulary, so they get more).
    case $t in
    tokenize) opts="-max_len=2048 -malloc_limit_mb=2048" ;;
    srv_chat|srv_completion|srv_tokenize) opts="-max_len=8192 -malloc_limit_mb=2048" ;;
    tokenizer_json) opts="-max_len=65536 -malloc_limit_mb=1024" ;;
    *) opts="-max_len=8192 -malloc_limit_mb=512" ;;
    esac
    [ -f "fuzz/dict/$t.dict" ] && opts="$opts -dict=fuzz/dict/$t.dict"

    regs=fuzz/regressions/$t
    if [ -d "$regs" ] && [ -n "$(ls "$regs" 2>/dev/null)" ]; then
        if ! "$bin" $opts "$regs"/* >"$log.regressions" 2>&1; then
            echo "fuzz $t: a regression input fails again (see $log.regressions)"
            tail -30 "$log.regressions"
            fail=1
            continue
        fi
    fi

    "$bin" $opts -max_total_time="$secs" -timeout=10 -rss_limit_mb=2560 -use_value_profile=1 \
        -print_final_stats=1 -artifact_prefix="$art/" "$work" "fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(printf '%s\n' "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(printf '%s\n' "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
    corp=$(printf '%s\n' "$last" | sed -n 's/.*corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p')
    speed=$(printf '%s\n' "$last" | sed -n 's/.*exec\/s: \([0-9]*\).*/\1/p')
    printf 'fuzz %-15s %6ss  execs %-10s cov %-6s ft %-7s corpus %-12s exec/s %s\n' \
        "$t" "$secs" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "${speed:-?}"
    if [ $rc -ne 0 ]; then
        echo "fuzz $t: FAILED (exit $rc), input saved under $art/; log $log:"
        grep -E 'ERROR|INVARIANT|SUMMARY|Test unit written' "$log" | head -20
        fail=1
    fi
done
exit $fail
