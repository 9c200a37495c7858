// Shared helpers: open llama.cpp (the CPU prebuilt shipped by node-llama-cpp) and run token ids
// through it. Nothing is downloaded and nothing is built: build "never", prebuilt binaries only.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

let llamaPromise = null;

// One llama.cpp instance per process (CPU only).
export function openLlama({threads = 2, verbose = false} = {}) {
    if (!llamaPromise)
        llamaPromise = getLlama({
            gpu: false,
            build: "never",
            usePrebuiltBinaries: true,
            skipDownload: true,
            progressLogs: false,
            maxThreads: threads,
            logLevel: verbose ? LlamaLogLevel.info : LlamaLogLevel.error
        });
    return llamaPromise;
}

// GGML type names node-llama-cpp accepts for the KV cache, by q3's --kv spelling.
const KV_TYPES = {f32: "F32", f16: "F16", bf16: "BF16", q8_0: "Q8_0"};

export async function loadModel(gguf, {threads = 2, verbose = false} = {}) {
    const llama = await openLlama({threads, verbose});
    return llama.loadModel({modelPath: gguf, gpuLayers: 0, useMmap: true});
}

// A context for one sequence: `batch` tokens per llama_decode call, flash attention off (as the
// golden references were made; `flash` turns it on), KV cache in `kv` (f32|f16|bf16|q8_0).
export async function createContext(model, {ctx = 512, batch = 512, threads = 2, kv = "f16", flash = false} = {}) {
    const t = KV_TYPES[kv];
    if (!t) throw new Error(`unknown --kv '${kv}' (f32|f16|bf16|q8_0)`);
    return model.createContext({
        contextSize: ctx,
        batchSize: batch,
        sequences: 1,
        threads,
        flashAttention: flash,
        experimentalKvCacheKeyType: t,
        experimentalKvCacheValueType: t,
        ignoreMemorySafetyChecks: true
    });
}

// Logits after every position of `tokens` (no BOS is added: the ids go in as given).
// decodeFrom = K: the first K tokens in one batch, then one token per llama_decode call
// (like `q3 logits --decode-from K`); null: the whole sequence in one batch.
// Returns {vocab, rows: Float32Array[tokens.length * vocab]} laid out as q3 logits writes it.
export async function llamaLogits(model, tokens, {decodeFrom = null, threads = 2, kv = "f16"} = {}) {
    const n = tokens.length;
    const first = decodeFrom ?? n;
    const context = await createContext(model, {
        ctx: Math.max(256, Math.ceil((n + 1) / 256) * 256),
        batch: Math.max(1, first),
        threads,
        kv
    });
    try {
        const seq = context.getSequence();
        const rowsOut = [];
        const want = (t) => [t, {generateNext: {logits: true}}];
        const push = (res, count) => {
            for (let i = 0; i < count; i++) {
                const m = res[i]?.next?.logits;
                if (!m) throw new Error(`llama.cpp returned no logits for position ${rowsOut.length}`);
                rowsOut.push(m);
            }
        };
        push(await seq.controlledEvaluate(tokens.slice(0, first).map(want)), first);
        for (let i = first; i < n; i++)
            push(await seq.controlledEvaluate([want(tokens[i])]), 1);
        const vocab = rowsOut[0].size;
        const rows = new Float32Array(n * vocab);
        rowsOut.forEach((m, r) => {
            if (m.size !== vocab) throw new Error(`row ${r}: ${m.size} logits, expected ${vocab}`);
            for (const [tok, v] of m) rows[r * vocab + tok] = v;
        });
        return {vocab, rows};
    } finally {
        await context.dispose();
    }
}

// Deterministic pseudo-random token ids in [0, vocab) (xorshift32), for reproducible inputs.
export function randomTokens(count, vocab, seed = 1) {
    let x = (seed >>> 0) || 1;
    const out = [];
    for (let i = 0; i < count; i++) {
        x ^= x << 13; x >>>= 0;
        x ^= x >>> 17;
        x ^= x << 5; x >>>= 0;
        out.push(x % vocab);
    }
    return out;
}

// Minimal "--key value" / "--flag" argument parser.
export function parseArgs(argv, flags = []) {
    const out = {_: []};
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i];
        if (!a.startsWith("--")) { out._.push(a); continue; }
        const k = a.slice(2);
        if (flags.includes(k)) out[k] = true;
        else {
            if (i + 1 >= argv.length) throw new Error(`option ${a} needs a value`);
            out[k] = argv[++i];
        }
    }
    return out;
}
