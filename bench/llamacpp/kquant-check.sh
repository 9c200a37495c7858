#!/bin/sh
# Checks q3 convert's K-quant files against llama-quantize's, tensor by tensor:
# for each type, llama-quantize IN.gguf (no importance matrix) and q3 convert IN.gguf,
# then build/bench/gguf_diff on the two outputs (type, shape and bytes of every tensor).
#
#   sh bench/llamacpp/kquant-check.sh LLAMA_QUANTIZE IN.gguf WORKDIR [TYPE...]
#
# IN.gguf: an F32, F16 or BF16 GGUF (e.g. q3 convert of `q3 synth` with --type bf16 --no-tokenizer);
# both quantizers read its values converted to F32 exactly. TYPEs default to
# Q4_K_M Q4_K_S Q5_K_M Q5_K_S Q6_K. Exits 1 if any tensor differs.
set -eu
[ $# -ge 3 ] || { echo "usage: $0 LLAMA_QUANTIZE IN.gguf WORKDIR [TYPE...]" >&2; exit 2; }
llq=$1 in=$2 work=$3
shift 3
[ $# -gt 0 ] || set -- Q4_K_M Q4_K_S Q5_K_M Q5_K_S Q6_K
here=$(cd "$(dirname "$0")/../.." && pwd)
threads=${THREADS:-2}
mkdir -p "$work"
fail=0
for t in "$@"; do
    lt=$(echo "$t" | tr 'a-z' 'A-Z') qt=$(echo "$t" | tr 'A-Z' 'a-z')
    "$llq" "$in" "$work/llama-$qt.gguf" "$lt" "$threads" >"$work/llama-$qt.log" 2>&1 ||
        { echo "$lt: llama-quantize failed (see $work/llama-$qt.log)"; fail=1; continue; }
    "$here/build/q3" convert "$in" -o "$work/q3-$qt.gguf" --type "$qt" --no-tokenizer -q >/dev/null ||
        { echo "$lt: q3 convert failed"; fail=1; continue; }
    echo "== $lt"
    "$here/build/bench/gguf_diff" "$work/llama-$qt.gguf" "$work/q3-$qt.gguf" -v || fail=1
    rm -f "$work/llama-$qt.gguf" "$work/q3-$qt.gguf"
done
exit $fail
