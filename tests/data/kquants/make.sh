#!/bin/sh
# Remakes this folder's data from llama.cpp's llama-quantize (see README.md).
#   sh tests/data/kquants/make.sh LLAMA_QUANTIZE     (from the repository root, after make)
set -eu
[ $# -eq 1 ] || { echo "usage: $0 LLAMA_QUANTIZE" >&2; exit 2; }
llq=$1
here=tests/data/kquants
q3=build/q3
t=build/tests/test_convert_kquants
work=$(mktemp -d /tmp/q3-kquants-XXXXXX)
trap 'rm -rf "$work"' EXIT

# 1. blocks: the edge rows in blk.0.attn_q.weight, quantized by each type's file
"$t" --edge-input "$work/edge.gguf"
for ty in Q4_K_M:q4_k Q5_K_M:q5_k Q6_K:q6_k; do
    "$llq" "$work/edge.gguf" "$work/edge-${ty%%:*}.gguf" "${ty%%:*}" 1 >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
    "$t" --take 8 "$work/edge-${ty%%:*}.gguf" blk.0.attn_q.weight "$here/edge-${ty#*:}.bin"
done

# 2. whole files: the golden small model (F32), every 2-D tensor's type and hash
"$q3" convert tests/data/golden/small -o "$work/small.gguf" --type f32 --no-tokenizer -q
: >"$here/small-hashes.txt"
for ty in Q4_K_M Q5_K_M Q6_K; do
    "$llq" "$work/small.gguf" "$work/small-$ty.gguf" "$ty" 1 >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
    "$t" --hashes "$ty" "$work/small-$ty.gguf" >>"$here/small-hashes.txt"
done

# 3. the mixes: llama-quantize --dry-run's type for every tensor of configs of 1 to 64 layers
mix() { # LAYERS DIM FFN HEADS KV HEAD_DIM TIED
    cat >"$work/config.json" <<JSON
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": $1, "hidden_size": $2,
 "intermediate_size": $3, "num_attention_heads": $4, "num_key_value_heads": $5, "head_dim": $6,
 "tie_word_embeddings": $7, "vocab_size": 256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
 "rope_theta": 1000000.0, "torch_dtype": "bfloat16"}
JSON
    rm -rf "$work/m"
    "$q3" synth --config "$work/config.json" -o "$work/m" --no-tokenizer >/dev/null
    "$q3" convert "$work/m" -o "$work/m.gguf" --type bf16 --no-tokenizer -q >/dev/null
    printf 'config layers=%s dim=%s ffn=%s heads=%s kv=%s head_dim=%s vocab=256 tied=%s\n' \
        "$1" "$2" "$3" "$4" "$5" "$6" "$([ "$7" = true ] && echo 1 || echo 0)"
    for ty in Q4_K_M Q4_K_S Q5_K_M Q5_K_S Q6_K; do
        "$llq" --dry-run "$work/m.gguf" "$ty" 1 >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
        printf '%s' "$ty"
        # "[ i/ n] NAME - [dims], type = T, size = ... (NEW)": NEW, or T when kept
        awk -v L="$1" '
            /^\[ *[0-9]+\/ *[0-9]+\]/ {
                line = $0; sub(/^\[[^]]*\] */, "", line); split(line, f, " "); name = f[1]
                ty = $0; sub(/.*type = */, "", ty); sub(/,.*/, "", ty)
                if (match($0, /\([a-z0-9_A-Z]+\)$/)) ty = substr($0, RSTART + 1, RLENGTH - 2)
                c = ty == "q4_K" ? "4" : ty == "q5_K" ? "5" : ty == "q6_K" ? "6" : ty == "q8_0" ? "8" : \
                    ty == "q5_0" ? "a" : ty == "q5_1" ? "b" : ty == "f16" ? "h" : ty == "f32" ? "f" : "?"
                if (name ~ /^blk\./) {
                    split(name, p, "."); kind = p[3]; if (kind ~ /norm/) next
                    codes[kind] = codes[kind] c
                } else if (name == "token_embd.weight" || name == "output.weight") {
                    sub(/\.weight$/, "", name); top[name] = c
                }
            }
            END {
                printf " token_embd=%s output=%s", top["token_embd"], ("output" in top) ? top["output"] : "-"
                n = split("attn_q attn_k attn_v attn_output ffn_gate ffn_up ffn_down", ks, " ")
                for (i = 1; i <= n; i++) {
                    s = codes[ks[i]]; all = substr(s, 1, 1)
                    same = 1; for (j = 2; j <= length(s); j++) if (substr(s, j, 1) != all) same = 0
                    printf " %s=%s", ks[i], same ? all : s
                }
                printf "\n"
            }' "$work/log"
    done
}
{
    echo "# llama-quantize --dry-run (no imatrix) on synthetic Qwen3 GGUFs (BF16): the type of every 2-D tensor."
    echo "# A config line, then one line per type for it. Codes: 4 q4_K, 5 q5_K, 6 q6_K, 8 q8_0, a q5_0, b q5_1, h f16;"
    echo "# one code: every layer, else one per layer."
    for l in 1 2 3 4 7 8 9 12 16 17 24 28 36 40 48 64; do mix "$l" 256 256 2 1 128 true; done
    for l in 28 36 64; do mix "$l" 256 256 2 1 128 false; done
    mix 9 256 384 2 1 128 true    # ffn_down rows of 384: Q5_0 / Q5_1 / Q8_0 fallbacks
    mix 9 320 512 2 1 128 false   # hidden 320: every matrix reading the hidden state falls back
    mix 9 256 256 2 1 80 true     # attn_output rows of 160
    mix 9 264 256 2 1 128 false   # hidden 264: not even whole 32-value blocks, F16
} >"$here/mix.txt"
ls -l "$here"
