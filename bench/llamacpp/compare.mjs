#!/usr/bin/env node
// Logits of llama.cpp (node-llama-cpp's CPU prebuilt) for given token ids, and, unless --no-q3,
// the same ids through `q3 logits` with the difference between the two.
//
//   node compare.mjs --gguf FILE (--tokens 1,2,3 | --random N [--seed S])
//                    [--decode-from K] [--kv f32|f16|bf16] [--threads 2] [--top 5]
//                    [--q3 ../../build/q3] [--q3-model MODEL] [--no-q3] [-o LLAMA.f32] [--json]
//
// --gguf        the model llama.cpp loads (q3 loads the same file unless --q3-model says otherwise,
//               e.g. the Hugging Face folder the GGUF was converted from)
// --tokens      comma-separated ids, fed as given (no BOS is added by either engine)
// --random N    N pseudo-random ids below the vocabulary size (xorshift32, --seed, default 1)
// --decode-from the first K tokens in one batch, every later one alone (as q3 logits --decode-from)
// --kv          KV-cache type for both engines (default f16, both engines' default)
// -o FILE       write llama.cpp's logits as float32 [n][vocab], the layout q3 logits writes
// Prints the top --top ids and logits of the last position; with q3: max |diff| and top-1
// agreement over every position.
import {execFileSync} from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {fileURLToPath} from "node:url";
import {loadModel, llamaLogits, randomTokens, parseArgs} from "./llama.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
export const DEFAULT_Q3 = path.resolve(here, "../../build/q3");

// Runs `q3 logits` and returns Float32Array[n * vocab].
export function q3Logits({q3 = DEFAULT_Q3, model, tokens, decodeFrom = null, kv = "f16", threads = 2, extra = []}) {
    const tmp = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "q3-llamacpp-")), "q3.f32");
    try {
        const args = ["logits", "-m", model, "--tokens", tokens.join(","), "--kv", kv, "-o", tmp, ...extra];
        if (decodeFrom != null) args.push("--decode-from", String(decodeFrom));
        execFileSync(q3, args, {stdio: ["ignore", "ignore", "pipe"], env: {...process.env, Q3_THREADS: String(threads)}});
        const b = fs.readFileSync(tmp);
        return new Float32Array(b.buffer, b.byteOffset, b.length / 4);
    } finally {
        fs.rmSync(path.dirname(tmp), {recursive: true, force: true});
    }
}

function argmaxTop2(a, off, vocab) {
    let b1 = -Infinity, b2 = -Infinity, i1 = -1;
    for (let v = 0; v < vocab; v++) {
        const x = a[off + v];
        if (x > b1) { b2 = b1; b1 = x; i1 = v; } else if (x > b2) b2 = x;
    }
    return {id: i1, gap: b1 - b2};
}

// Differences between two [n][vocab] logit arrays (ref = llama.cpp, got = q3).
export function diffLogits(ref, got, n, vocab) {
    if (got.length !== n * vocab) throw new Error(`q3 wrote ${got.length} floats, expected ${n}x${vocab}`);
    let maxAbs = 0, sumAbs = 0, maxRef = 0, agree = 0, nearTies = 0, maxAt = -1;
    for (let r = 0; r < n; r++) {
        const off = r * vocab;
        for (let v = 0; v < vocab; v++) {
            const d = Math.abs(ref[off + v] - got[off + v]);
            if (!(d <= maxAbs)) { maxAbs = d; maxAt = r; } // NaN also lands here
            sumAbs += d;
            maxRef = Math.max(maxRef, Math.abs(ref[off + v]));
        }
    }
    // a disagreement is a near-tie when llama.cpp's own top-2 gap is below the largest difference
    for (let r = 0; r < n; r++) {
        const a = argmaxTop2(ref, r * vocab, vocab), b = argmaxTop2(got, r * vocab, vocab);
        if (a.id === b.id) agree++;
        else if (a.gap <= maxAbs) nearTies++;
    }
    return {rows: n, vocab, maxAbs, meanAbs: sumAbs / (n * vocab), maxAbsRow: maxAt, maxAbsLogit: maxRef,
        top1Agree: agree, top1AgreePct: 100 * agree / n, disagreeNearTies: nearTies};
}

// One full comparison: llama.cpp on `gguf`, q3 on `q3Model` (default: the same GGUF).
export async function compareOne({gguf, q3Model = gguf, tokens, decodeFrom = null, kv = "f16", threads = 2,
    q3 = DEFAULT_Q3, q3Extra = [], model = null}) {
    const own = !model;
    const m = model ?? await loadModel(gguf, {threads});
    try {
        const t0 = performance.now();
        const ll = await llamaLogits(m, tokens, {decodeFrom, threads, kv});
        const t1 = performance.now();
        const q = q3Logits({q3, model: q3Model, tokens, decodeFrom, kv, threads, extra: q3Extra});
        const t2 = performance.now();
        return {...diffLogits(ll.rows, q, tokens.length, ll.vocab), llamaMs: t1 - t0, q3Ms: t2 - t1, llama: ll.rows, q3: q};
    } finally {
        if (own) await m.dispose();
    }
}

async function main() {
    const a = parseArgs(process.argv.slice(2).map((x) => (x === "-o" ? "--o" : x)), ["no-q3", "json", "help", "verbose"]);
    if (a.help || !a.gguf || (!a.tokens && !a.random)) {
        console.log(fs.readFileSync(fileURLToPath(import.meta.url), "utf8").split("\n").slice(1, 19)
            .map((l) => l.replace(/^\/\/ ?/, "")).join("\n"));
        process.exit(a.help ? 0 : 2);
    }
    const threads = Number(a.threads ?? 2), kv = a.kv ?? "f16", top = Number(a.top ?? 5);
    const decodeFrom = a["decode-from"] != null ? Number(a["decode-from"]) : null;
    const model = await loadModel(a.gguf, {threads, verbose: !!a.verbose});
    let tokens;
    if (a.tokens) tokens = a.tokens.split(",").map((s) => Number(s.trim()));
    else {
        // the vocabulary size is what llama.cpp reports for the model's output
        const probe = await llamaLogits(model, [0], {threads, kv});
        tokens = randomTokens(Number(a.random), probe.vocab, Number(a.seed ?? 1));
    }
    const ll = await llamaLogits(model, tokens, {decodeFrom, threads, kv});
    const n = tokens.length, V = ll.vocab;
    if (a.o) fs.writeFileSync(a.o, Buffer.from(ll.rows.buffer, ll.rows.byteOffset, ll.rows.byteLength));
    const last = Array.from(ll.rows.subarray((n - 1) * V, n * V)).map((v, id) => [id, v])
        .sort((x, y) => y[1] - x[1]).slice(0, top);
    const out = {gguf: a.gguf, tokens: n, vocab: V, kv, decodeFrom, llamaLastTop: last};
    if (!a["no-q3"]) {
        const q = q3Logits({q3: a.q3 ?? DEFAULT_Q3, model: a["q3-model"] ?? a.gguf, tokens, decodeFrom, kv, threads});
        out.vsQ3 = diffLogits(ll.rows, q, n, V);
        out.q3LastTop = last.map(([id]) => [id, q[(n - 1) * V + id]]);
    }
    if (a.json) console.log(JSON.stringify(out, null, 1));
    else {
        console.log(`llama.cpp: ${a.gguf}, ${n} tokens, vocab ${V}, KV ${kv}${decodeFrom != null ? `, decode from ${decodeFrom}` : ""}`);
        console.log(`last position, top ${top} (id: llama.cpp${out.vsQ3 ? " | q3" : ""}):`);
        for (let i = 0; i < last.length; i++)
            console.log(`  ${last[i][0]}: ${last[i][1].toFixed(6)}${out.vsQ3 ? ` | ${out.q3LastTop[i][1].toFixed(6)}` : ""}`);
        if (out.vsQ3) {
            const d = out.vsQ3;
            console.log(`q3 vs llama.cpp over ${d.rows} positions: max |diff| ${d.maxAbs.toExponential(3)} (row ${d.maxAbsRow}), ` +
                `mean |diff| ${d.meanAbs.toExponential(3)}, max |logit| ${d.maxAbsLogit.toFixed(3)}, ` +
                `top-1 agree ${d.top1Agree}/${d.rows} (${d.top1AgreePct.toFixed(1)}%; disagreements at near-ties: ${d.disagreeNearTies})`);
        }
    }
    await model.dispose();
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url))
    main().catch((e) => { console.error(`compare.mjs: ${e.stack ?? e}`); process.exit(1); });
