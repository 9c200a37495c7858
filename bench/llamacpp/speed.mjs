#!/usr/bin/env node
// Speed of llama.cpp (node-llama-cpp's CPU prebuilt) next to `q3 bench`, on the same GGUFs, run
// back to back in one process, with the protocol q3 bench uses (tools/bench.c):
//   prefill: a 128-token prompt (one --chunk) from position 0 into an empty cache, logits of the last
//            row only; one warm-up run, then --repeats timed runs; p50 (and min/max)
//   decode:  after that prompt, one warm-up step, then --gen timed steps of one token each, the
//            greedy (argmax) token fed back; p50 (and p99)
//
//   node speed.mjs [--gguf A.gguf,B.gguf] [--threads 2[,1]] [--chunk 128] [--gen 64] [--repeats 5]
//                  [--kv f16] [--flash] [--rounds 1] [--q3 ../../build/q3] [--no-q3] [--json OUT.json]
// Default GGUFs: work/synth-0.6b-{bf16,f16,q8_0,q4_0}.gguf (made by suite.mjs). With --rounds 2 the
// second round runs q3 first, so that neither engine always gets the warmer machine. --threads 2,1
// runs everything at 2 threads, then at 1 (the same count for both engines).
import {execFileSync} from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {fileURLToPath} from "node:url";
import {loadModel, createContext, randomTokens, parseArgs} from "./llama.mjs";
import {DEFAULT_Q3} from "./compare.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const a = parseArgs(process.argv.slice(2), ["flash", "no-q3"]);
const threadList = String(a.threads ?? 2).split(",").map(Number), chunk = Number(a.chunk ?? 128), gen = Number(a.gen ?? 64);
const repeats = Number(a.repeats ?? 5), kv = a.kv ?? "f16", rounds = Number(a.rounds ?? 1);
const q3 = path.resolve(a.q3 ?? DEFAULT_Q3);
const ggufs = a.gguf ? a.gguf.split(",")
    : ["bf16", "f16", "q8_0", "q4_0"].map((t) => path.join(here, `work/synth-0.6b-${t}.gguf`)).filter((f) => fs.existsSync(f));

function stats(xs) {
    const s = [...xs].sort((x, y) => x - y);
    const q = (p) => s[Math.min(s.length - 1, Math.ceil(p * s.length) - 1)];
    return {p50: q(0.5), p99: q(0.99), min: s[0], max: s[s.length - 1], mean: s.reduce((x, y) => x + y, 0) / s.length, n: s.length};
}

async function llamaBench(gguf, threads) {
    const model = await loadModel(gguf, {threads: Math.max(...threadList)});
    const ctx = await createContext(model, {ctx: chunk + gen + 64, batch: chunk, threads, kv, flash: !!a.flash});
    const seq = ctx.getSequence();
    const nTok = model.fileInfo?.metadata?.tokenizer?.ggml?.tokens?.length ?? 151643;
    const prompt = randomTokens(chunk, Math.min(nTok, 151643), 3); // below Qwen3's special tokens
    const prefill = [];
    for (let i = -1; i < repeats; i++) {
        await seq.clearHistory();
        const t0 = performance.now();
        await seq.evaluateWithoutGeneratingNewTokens(prompt);
        const ms = performance.now() - t0;
        if (i >= 0) prefill.push(ms);
    }
    // the cache now holds the prompt; decode greedily: the first (warm-up) step feeds the prompt's
    // last id once more, every later one the argmax of the step before
    const decode = [];
    let tok = prompt[chunk - 1];
    for (let i = -1; i < gen; i++) {
        const t0 = performance.now();
        const out = await seq.controlledEvaluate([[tok, {generateNext: {token: true}}]]);
        const ms = performance.now() - t0;
        tok = out[0]?.next?.token ?? 0;
        if (i >= 0) decode.push(ms);
    }
    await ctx.dispose();
    await model.dispose();
    return {prefill_ms: stats(prefill), decode_ms: stats(decode)};
}

function q3Bench(gguf, threads) {
    const out = execFileSync(q3, ["bench", "-m", gguf, "--chunk", String(chunk), "--gen", String(gen),
        "--repeats", String(repeats), "--kv", kv, "--json", "--no-limits"],
    {env: {...process.env, Q3_THREADS: String(threads)}, stdio: ["ignore", "pipe", "pipe"], maxBuffer: 64 << 20}).toString();
    const j = JSON.parse(out);
    const r = j.runs[0];
    return {unit: `${r.prefill_unit}/${r.decode_unit}`, prefill_ms: r.prefill_ms, decode_ms: r.decode_ms};
}

const results = [];
const load = () => os.loadavg().map((x) => x.toFixed(2)).join(" ");
for (const threads of threadList)
    for (let round = 0; round < rounds; round++)
        for (const g of ggufs) {
            const name = path.basename(g);
            const order = round % 2 === 0 ? ["llama", "q3"] : ["q3", "llama"];
            const r = {gguf: name, threads, round, loadBefore: load()};
            for (const e of order) {
                if (e === "q3" && a["no-q3"]) continue;
                process.stderr.write(`${name}, ${threads} threads: ${e} ...\n`);
                r[e] = e === "q3" ? q3Bench(g, threads) : await llamaBench(g, threads);
            }
            r.loadAfter = load();
            results.push(r);
        }

const f = (x) => x.toFixed(1);
console.log(`${new Date().toISOString()}, ${os.cpus().length} CPUs (${os.cpus()[0]?.model}), the same thread count in both, ` +
    `KV ${kv}, flash attention ${a.flash ? "on" : "off"} in llama.cpp, chunk ${chunk}, ${repeats} prefill repeats, ${gen} decode steps`);
console.log("| GGUF | threads | round | llama.cpp prefill ms/chunk p50 (min–max) | q3 prefill ms/chunk p50 (min–max) | q3 / llama.cpp | " +
    "llama.cpp decode ms/tok p50 (p99) | q3 decode ms/tok p50 (p99) | q3 / llama.cpp | load avg before → after |");
console.log("|---|---|---|---|---|---|---|---|---|---|");
for (const r of results) {
    const L = r.llama, Q = r.q3;
    const pf = (s) => `${f(s.p50)} (${f(s.min)}–${f(s.max)})`, dc = (s) => `${f(s.p50)} (${f(s.p99)})`;
    console.log(`| ${r.gguf} | ${r.threads} | ${r.round + 1} | ${pf(L.prefill_ms)} | ${Q ? pf(Q.prefill_ms) : "—"} | ` +
        `${Q ? (Q.prefill_ms.p50 / L.prefill_ms.p50).toFixed(2) : "—"} | ${dc(L.decode_ms)} | ${Q ? dc(Q.decode_ms) : "—"} | ` +
        `${Q ? (Q.decode_ms.p50 / L.decode_ms.p50).toFixed(2) : "—"} | ${r.loadBefore} → ${r.loadAfter} |`);
}
if (a.json) fs.writeFileSync(a.json, JSON.stringify({threads: threadList, chunk, gen, repeats, kv, results}, null, 1));
