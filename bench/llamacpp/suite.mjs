#!/usr/bin/env node
// The whole logits cross-check: makes the GGUFs (with q3 convert / q3 synth, under work/), checks
// that llama.cpp loads each one (in a child process: llama.cpp aborts the process on some bad
// files), and compares llama.cpp's logits with `q3 logits` on the same file, for one batch of the
// whole sequence and for prefill-then-decode. Prints a markdown table.
//
//   node suite.mjs [--q3 ../../build/q3] [--threads 2] [--kv f32] [--len 64] [--len-big 32]
//                  [--only REGEX] [--no-big] [--json OUT.json] [--q3-label TEXT]
import {execFileSync, spawnSync} from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";
import {loadModel, randomTokens, parseArgs} from "./llama.mjs";
import {compareOne, DEFAULT_Q3} from "./compare.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../..");
const golden = path.join(root, "tests/data/golden");
const work = path.join(here, "work");
const a = parseArgs(process.argv.slice(2), ["no-big"]);
const q3 = path.resolve(a.q3 ?? DEFAULT_Q3);
const threads = Number(a.threads ?? 2), kv = a.kv ?? "f32";
const len = Number(a.len ?? 64), lenBig = Number(a["len-big"] ?? 32);
const only = a.only ? new RegExp(a.only) : null;
fs.mkdirSync(work, {recursive: true});

const run = (cmd, args) => execFileSync(cmd, args, {stdio: ["ignore", "pipe", "pipe"], cwd: root}).toString();
const tokenizerDir = path.join(root, "models/qwen3-tokenizer");

// [name, gguf path, who wrote it, vocab, tokens length, function that makes the file if missing]
const cases = [];
const add = (name, file, writer, vocab, n, make) => cases.push({name, file, writer, vocab, n, make});

add("tiny f32", path.join(golden, "tiny/model-f32.gguf"), "reference", 1024, len, null);
add("small-bf16 bf16", path.join(golden, "small-bf16/model-bf16.gguf"), "reference", 4096, len, null);
add("small-q8_0 q8_0", path.join(golden, "small-q8_0/model-q8_0.gguf"), "reference", 4096, len, null);
add("small-q4_0 q4_0", path.join(golden, "small-q4_0/model-q4_0.gguf"), "reference", 4096, len, null);
// q3-written from the Hugging Face folders. These folders have no tokenizer.json, so q3 writes
// tokenizer.ggml.model "none" (--no-tokenizer); llama.cpp cannot use such a file (see README), so
// the vocabulary is borrowed from the reference GGUF of the same size with gguf-patch.mjs.
const donors = {tiny: path.join(golden, "tiny/model-f32.gguf"), small: path.join(golden, "small-bf16/model-bf16.gguf")};
for (const m of ["tiny", "small"])
    for (const t of ["f32", "f16", "bf16", "q8_0", "q4_0"]) {
        const raw = path.join(work, `${m}-${t}-notok.gguf`), file = path.join(work, `${m}-${t}.gguf`);
        add(`${m} ${t}`, file, "q3 convert (HF, tokenizer patched in)", m === "tiny" ? 1024 : 4096, len, () => {
            run(q3, ["convert", path.join(golden, m), "-o", raw, "--type", t, "--no-tokenizer", "--quiet"]);
            run("node", [path.join(here, "gguf-patch.mjs"), raw, file, "--tokenizer-from", donors[m]]);
        });
    }
if (!a["no-big"]) {
    const synth = path.join(work, "synth-0.6b");
    for (const t of ["f16", "bf16", "q8_0", "q4_0"]) {
        const file = path.join(work, `synth-0.6b-${t}.gguf`);
        add(`synth-0.6b ${t}`, file, "q3 convert (HF synth, real tokenizer)", 151936, lenBig, () => {
            if (!fs.existsSync(path.join(synth, "model.safetensors")))
                run(q3, ["synth", "-o", synth, "--seed", "0"]);
            run(q3, ["convert", synth, "-o", file, "--type", t, "--tokenizer", tokenizerDir, "--quiet"]);
        });
    }
}

// Whether llama.cpp loads the file, asked in a child process; returns null or the reason.
function llamaRefusal(file) {
    const r = spawnSync("node", [path.join(here, "gguf-info.mjs"), file], {encoding: "utf8"});
    if (r.status === 0) return null;
    const lines = (r.stdout + r.stderr).split("\n").filter((l) => /REFUSED|GGML_ASSERT|error|abort/i.test(l));
    return (lines.join(" | ") || `exit ${r.status} signal ${r.signal}`).replace(/\/home\/runner\/\S*\/llama\.cpp\//g, "");
}

const rows = [], findings = [];
// the writer's plain --no-tokenizer output, loaded as is: a compatibility finding, not a comparison
{
    const raw = path.join(work, "tiny-f32-notok.gguf");
    if (!fs.existsSync(raw)) run(q3, ["convert", path.join(golden, "tiny"), "-o", raw, "--type", "f32", "--no-tokenizer", "--quiet"]);
    findings.push({file: path.relative(root, raw), refusal: llamaRefusal(raw)});
}
for (const c of cases) {
    if (only && !only.test(c.name)) continue;
    if (!fs.existsSync(c.file)) {
        process.stderr.write(`making ${path.relative(root, c.file)} ...\n`);
        c.make();
    }
    const refusal = llamaRefusal(c.file);
    if (refusal) { rows.push({...c, refusal}); findings.push({file: path.relative(root, c.file), refusal}); continue; }
    const model = await loadModel(c.file, {threads});
    const tokens = randomTokens(c.n, c.vocab, 7);
    for (const decodeFrom of [null, c.n / 2]) {
        const r = await compareOne({gguf: c.file, tokens, decodeFrom, kv, threads, q3, model});
        delete r.llama; delete r.q3;
        const mode = decodeFrom == null ? `prefill ${c.n}` : `prefill ${decodeFrom} + decode ${c.n - decodeFrom}`;
        rows.push({name: c.name, writer: c.writer, mode, ...r});
        process.stderr.write(`${c.name} ${mode}: max|diff| ${r.maxAbs.toExponential(2)} top-1 ${r.top1Agree}/${r.rows}\n`);
    }
    await model.dispose();
}

const q3rev = (() => { try { return run("git", ["rev-parse", "--short", "HEAD"]).trim(); } catch { return "?"; } })();
console.log(`q3 ${q3} (${a["q3-label"] ?? `repo HEAD ${q3rev}`}), llama.cpp from node-llama-cpp ` +
    `${JSON.parse(fs.readFileSync(path.join(here, "node_modules/node-llama-cpp/package.json"))).version}, ` +
    `${threads} threads, KV cache ${kv} in both, token ids xorshift32 seed 7, no BOS\n`);
console.log("| model | GGUF written by | mode | max \\|Δlogit\\| | mean \\|Δlogit\\| | max \\|logit\\| | top-1 agree | flips at near-ties |");
console.log("|---|---|---|---|---|---|---|---|");
for (const r of rows) {
    if (r.refusal) { console.log(`| ${r.name} | ${r.writer} | — | llama.cpp refused: ${r.refusal} | | | | |`); continue; }
    console.log(`| ${r.name} | ${r.writer} | ${r.mode} | ${r.maxAbs.toExponential(2)} | ${r.meanAbs.toExponential(2)} | ` +
        `${r.maxAbsLogit.toFixed(2)} | ${r.top1Agree}/${r.rows} (${r.top1AgreePct.toFixed(1)}%) | ${r.disagreeNearTies} |`);
}
console.log("\nllama.cpp on q3-written GGUFs as written:");
for (const f of findings) console.log(`- ${f.file}: ${f.refusal ? `REFUSED: ${f.refusal}` : "loads"}`);
if (a.json) fs.writeFileSync(a.json, JSON.stringify({kv, threads, q3, rows, findings}, null, 1));
