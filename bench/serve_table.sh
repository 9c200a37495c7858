#!/bin/sh
# The serving table of bench/README.md ("Serving scheduler"): q3 serve at
# several --step-tokens budgets, then llama-server, each with N streaming
# chat clients (bench_serve). Never run by make test or .ci/run.
#
#   sh bench/serve_table.sh [GGUF] [PROMPT_WORDS] [BUDGETS] [CLIENTS]
#
# GGUF defaults to bench/llamacpp/work/synth-0.6b-q8_0.gguf, PROMPT_WORDS to
# 30 (about 100 prompt tokens with the chat template), BUDGETS to
# "256 128 64 32", CLIENTS to "8 16". llama-server is the native build of
# bench/llamacpp (peer.mjs --build, then the llama-server target); its run is
# left out when it is absent. Run from the repository root after make.
set -e
G=${1:-bench/llamacpp/work/synth-0.6b-q8_0.gguf}
W=${2:-30}
BUDGETS=${3:-256 128 64 32}
CLIENTS=${4:-8 16}
LS=bench/llamacpp/work/llama.cpp-build/bin/llama-server
common="--requests 3 --gen 64 --prompt-words $W --stagger-ms 250"
list=$(echo $CLIENTS | tr ' ' ',')
echo "== $(date -u) $(git log --oneline -1 2>/dev/null) load: $(cat /proc/loadavg)"
for st in $BUDGETS; do
    echo "== q3 serve --step-tokens $st"
    build/bench/bench_serve -m "$G" --clients "$list" -t 2 --step-tokens "$st" $common 2>&1 | tail -n +2
done
if [ -x "$LS" ]; then
    for n in $CLIENTS; do
        echo "== llama-server --parallel $n -c $((n * 1024)) --cont-batching"
        "$LS" -m "$G" --host 127.0.0.1 --port 18457 -t 2 --parallel "$n" -c $((n * 1024)) --cont-batching \
            > /tmp/serve_table-llama-server.log 2>&1 &
        pid=$!
        i=0
        until curl -sf http://127.0.0.1:18457/health > /dev/null; do
            i=$((i + 1))
            [ $i -lt 120 ] || { kill $pid; echo "llama-server did not start: /tmp/serve_table-llama-server.log"; exit 1; }
            sleep 0.5
        done
        build/bench/bench_serve --port 18457 --clients "$n" $common 2>&1 | tail -n +2
        kill $pid
        wait $pid 2>/dev/null || true
    done
else
    echo "($LS absent: llama-server left out)"
fi
echo "== done $(date -u) load: $(cat /proc/loadavg)"
