#!/usr/bin/env node
// q3 next to a llama.cpp built natively on this machine, with llama.cpp's own benchmark tool.
//
//   node peer.mjs --build [--jobs 2]                 builds work/llama.cpp-build/bin/llama-bench
//   node peer.mjs --gguf A.gguf,B.gguf [--threads 2] [--rounds 2] [--repeats 3] [--gen 16]
//                 [--depths 128,4096] [--prompt 128] [--kv f16] [--fa 0|1|0,1] [--q3 ../../build/q3]
//                 [--json OUT.json]
//
// --build: the llama.cpp source is the one node-llama-cpp@3.22.1 carries (node_modules/node-llama-cpp/
// llama/gitRelease.bundle, a git bundle of the llama.cpp release its prebuilts come from; the tag is in
// llama/llama.cpp.info.json). It is cloned to work/llama.cpp-src and built with CMake, Release,
// -DGGML_NATIVE=ON (the compiler's -march=native: every ISA extension of this CPU), static, no CURL,
// only the llama-bench target, into work/llama.cpp-build (work/ is ignored by git). Nothing is
// downloaded; nothing here runs in `make test` or .ci/run.
//
// The table: for each GGUF, --rounds rounds; each round runs llama.cpp then q3 (reversed in every
// second round, so neither engine always gets the warmer machine), both with the same thread count
// and KV cache type; llama.cpp with flash attention off by default (--fa 0), or on, or both (--fa 0,1:
// each test's llama.cpp figure is then its better setting, which the table names):
//   prefill: a --prompt-token prompt into an empty cache (llama-bench -p N; q3 bench's one chunk of N)
//   decode:  --gen tokens one at a time after d tokens are cached, for each d in --depths
//            (llama-bench -n G -d d; q3 bench --gen G --depth d)
// Figures are tokens per second (llama-bench's avg_ts over --repeats repetitions; q3 bench's
// prompt_tok_s and decode_tok_s, over --repeats prefills and --gen decode steps), the best round of
// each engine; the ratio column is q3 ÷ llama.cpp (above 1: q3 faster).
import {execFileSync, spawnSync} from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const work = path.join(here, "work");
const src = path.join(work, "llama.cpp-src"), build = path.join(work, "llama.cpp-build");
const llamaBench = path.join(build, "bin", "llama-bench");
const pkgLlama = path.join(here, "node_modules", "node-llama-cpp", "llama");

function parseArgs(argv, flags) {
    const o = {};
    for (let i = 0; i < argv.length; i++) {
        const k = argv[i].replace(/^--/, "");
        if (flags.includes(k)) o[k] = true;
        else if (i + 1 < argv.length) o[k] = argv[++i];
        else throw new Error(`missing value for ${argv[i]}`);
    }
    return o;
}

const a = parseArgs(process.argv.slice(2), ["build"]);

function run(cmd, args, opts = {}) {
    const r = spawnSync(cmd, args, {encoding: "utf8", maxBuffer: 1 << 28, ...opts});
    if (r.status !== 0) {
        process.stderr.write(r.stdout ?? "");
        process.stderr.write(r.stderr ?? "");
        throw new Error(`${cmd} ${args.join(" ")}: exit ${r.status}`);
    }
    return r.stdout;
}

function doBuild() {
    const bundle = path.join(pkgLlama, "gitRelease.bundle");
    if (!fs.existsSync(bundle))
        throw new Error(`${bundle} is missing: run NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install here first`);
    const info = JSON.parse(fs.readFileSync(path.join(pkgLlama, "llama.cpp.info.json"), "utf8"));
    fs.mkdirSync(work, {recursive: true});
    if (!fs.existsSync(path.join(src, "CMakeLists.txt"))) {
        console.error(`cloning llama.cpp ${info.tag} from ${path.relative(here, bundle)} into work/llama.cpp-src`);
        run("git", ["clone", "--quiet", bundle, src], {stdio: ["ignore", "inherit", "inherit"]});
    }
    const jobs = String(a.jobs ?? Math.max(1, Math.min(os.availableParallelism?.() ?? 2, 8)));
    console.error(`configuring (Release, GGML_NATIVE=ON) and building llama-bench with ${jobs} jobs ...`);
    run("cmake", ["-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
        ], {stdio: ["ignore", "ignore", "inherit"]});
    run("cmake", ["--build", build, "--target", "llama-bench", "-j", jobs], {stdio: ["ignore", "ignore", "inherit"]});
    console.log(`built ${path.relative(process.cwd(), llamaBench)} (llama.cpp ${info.tag} from node-llama-cpp)`);
}

// ---- the two engines ----------------------------------------------------------------------------

const threads = Number(a.threads ?? 2), rounds = Number(a.rounds ?? 2), repeats = Number(a.repeats ?? 3);
const gen = Number(a.gen ?? 16), prompt = Number(a.prompt ?? 128), kv = a.kv ?? "f16";
const depths = String(a.depths ?? "128,4096").split(",").map(Number);
const faList = String(a.fa ?? "0").split(",").map(Number);
if (faList.some((f) => f !== 0 && f !== 1)) throw new Error("--fa takes 0, 1 or 0,1");
const q3 = path.resolve(a.q3 ?? path.join(here, "../../build/q3"));

// {prefill: tok/s, decode: {depth: tok/s}} from llama-bench's JSON
function llamaRun(gguf, fa) {
    const common = ["-m", gguf, "-t", String(threads), "-r", String(repeats), "-ctk", kv, "-ctv", kv, "-fa", String(fa),
        "-o", "json"];
    const out = {fa, decode: {}};
    const pp = JSON.parse(run(llamaBench, [...common, "-p", String(prompt), "-n", "0"]));
    out.prefill = pp.find((x) => x.n_prompt === prompt && x.n_gen === 0).avg_ts;
    const tg = JSON.parse(run(llamaBench, [...common, "-p", "0", "-n", String(gen), "-d", depths.join(",")]));
    for (const d of depths) out.decode[d] = tg.find((x) => x.n_gen === gen && x.n_depth === d).avg_ts;
    return out;
}

function q3Run(gguf) {
    const env = {...process.env, Q3_THREADS: String(threads)};
    const out = {decode: {}};
    for (const d of depths) {
        const j = JSON.parse(run(q3, ["bench", "-m", gguf, "--json", "--no-limits", "--compute-units", "cpu", "--chunk",
            String(prompt), "--gen", String(gen), "--repeats", String(repeats), "--depth", String(d), "--kv", kv], {env}));
        const r = j.runs[0];
        out.decode[d] = r.decode_tok_s;
        out.prefill = Math.max(out.prefill ?? 0, r.prompt_tok_s); // measured in every run: keep the best
    }
    return out;
}

function best(xs, get) { return Math.max(...xs.map(get)); }
// llama.cpp's best figure and, when both flash-attention settings ran, the one that gave it
function bestLlama(xs, get) {
    const b = xs.reduce((m, x) => (get(x) > get(m) ? x : m));
    return {v: get(b), label: faList.length > 1 ? ` (fa ${b.fa})` : ""};
}

function doTable() {
    if (!a.gguf) throw new Error("--gguf A.gguf[,B.gguf] is required (or --build)");
    if (!fs.existsSync(llamaBench)) throw new Error(`${llamaBench} is missing: node peer.mjs --build first`);
    const ggufs = a.gguf.split(",");
    const results = [];
    for (const g of ggufs) {
        const L = [], Q = [];
        for (let r = 0; r < rounds; r++) {
            const order = r % 2 ? ["q3", "llama"] : ["llama", "q3"];
            for (const who of order) {
                console.error(`${path.basename(g)}: round ${r + 1}, ${who === "q3" ? "q3" : "llama.cpp"} ...`);
                if (who === "q3") Q.push(q3Run(g));
                else for (const fa of faList) L.push(llamaRun(g, fa));
            }
        }
        results.push({gguf: g, llama: L, q3: Q});
    }
    const rows = [["GGUF", "test", "llama.cpp tok/s", "q3 tok/s", "q3 ÷ llama.cpp"]];
    for (const res of results) {
        const name = path.basename(res.gguf);
        const pl = bestLlama(res.llama, (x) => x.prefill), pq = best(res.q3, (x) => x.prefill);
        rows.push([name, `prefill ${prompt}`, pl.v.toFixed(1) + pl.label, pq.toFixed(1), (pq / pl.v).toFixed(2)]);
        for (const d of depths) {
            const dl = bestLlama(res.llama, (x) => x.decode[d]), dq = best(res.q3, (x) => x.decode[d]);
            rows.push([name, `decode @ ${d}`, dl.v.toFixed(2) + dl.label, dq.toFixed(2), (dq / dl.v).toFixed(2)]);
        }
    }
    console.log(`\n${threads} threads, KV ${kv}, ${gen} decode tokens, best of ${rounds} rounds (${repeats} repetitions each)` +
        `, llama.cpp flash attention ${faList.join(" and ")}`);
    console.log(`| ${rows[0].join(" | ")} |\n|${rows[0].map(() => "---").join("|")}|`);
    for (const r of rows.slice(1)) console.log(`| ${r.join(" | ")} |`);
    if (a.json) fs.writeFileSync(a.json, JSON.stringify({threads, kv, gen, prompt, depths, fa: faList, rounds, repeats, results}, null, 1));
}

try {
    if (a.build) doBuild();
    else doTable();
} catch (e) {
    console.error(`peer.mjs: ${e.message}`);
    process.exit(1);
}
