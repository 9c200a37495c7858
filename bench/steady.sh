#!/bin/sh
# Decode steadiness, side by side (issue 25): interleaved rounds of `q3 bench`
# over several variants (a q3 binary and a model each), quiet and, with
# --busy, with one competing busy-loop process started here for the whole
# run. Prints, per variant, the median over rounds of decode mean / p50 / p99 /
# max / min ms/token and of p99/p50 (min: the fastest token, what the kernels
# reach when the neighbours leave the cores alone).
#
#   bench/steady.sh [--rounds N] [--gen N] [-t N] [--busy] [--depth N] LABEL=Q3:MODEL ...
#
# e.g. bench/steady.sh --rounds 5 -t 2 \
#        st=build/q3:$HOME/.cache/q3/synth-qwen3-0.6b gguf=build/q3:/tmp/synth-bf16.gguf
#
# Variants run in turn within each round (A B A B ...), so a neighbour's load
# falls on all of them alike; on a shared machine compare only numbers from
# one run.
set -eu
rounds=5 gen=64 threads=2 busy=0 depth=0
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --depth) depth=$2; shift 2 ;;
    --busy) busy=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "steady.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "steady.sh: give at least one LABEL=Q3:MODEL" >&2; exit 2; }
for v in "$@"; do
    case $v in *=*:*) ;; *) echo "steady.sh: '$v' is not LABEL=Q3:MODEL" >&2; exit 2 ;; esac
done

tmp=$(mktemp -d)
bpid=
cleanup() { [ -n "$bpid" ] && kill "$bpid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
if [ "$busy" = 1 ]; then
    sh -c 'while :; do :; done' &
    bpid=$!
fi

# decode_ms's field $2 of the run's JSON
field() {
    tr -d ' \t\n' <"$1" | sed -n 's/.*"decode_ms":{\([^}]*\)}.*/\1/p' | tr ',' '\n' | sed -n "s/^\"$2\"://p"
}

r=1
while [ "$r" -le "$rounds" ]; do
    for v in "$@"; do
        label=${v%%=*} rest=${v#*=}
        q3=${rest%%:*} model=${rest#*:}
        out=$tmp/run.json
        "$q3" bench -m "$model" --no-limits --gen "$gen" --repeats 1 --chunk 16 --depth "$depth" -t "$threads" --json \
            >"$out" 2>/dev/null || { echo "steady.sh: $label: q3 bench failed" >&2; exit 1; }
        printf '%s %s %s %s %s\n' "$(field "$out" mean)" "$(field "$out" p50)" "$(field "$out" p99)" "$(field "$out" max)" "$(field "$out" min)" \
            >>"$tmp/$label"
    done
    r=$((r + 1))
done

echo "decode ms/token, $rounds interleaved rounds of $gen tokens, -t $threads, depth $depth$([ "$busy" = 1 ] && echo ', one busy loop running')"
printf '%-12s %9s %9s %9s %9s %9s %8s\n' variant mean p50 p99 max min p99/p50
for v in "$@"; do
    label=${v%%=*}
    # the median over rounds of each column, and of p99/p50 per round
    awk '{ m[NR] = $1; p[NR] = $2; q[NR] = $3; x[NR] = $4; n[NR] = $5; rt[NR] = $3 / $2 }
         function med(a, n,   i, j, t) {
             for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
             return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
         }
         END { printf "%-12s %9.2f %9.2f %9.2f %9.2f %9.2f %8.2f\n", L, med(m, NR), med(p, NR), med(q, NR), med(x, NR), med(n, NR), med(rt, NR) }' \
        L="$label" "$tmp/$label"
done
