#!/usr/bin/env node
// Prints a GGUF's header as node-llama-cpp's own GGUF reader sees it (metadata keys with short
// values, tensor names/types/shapes/offsets), and whether llama.cpp loads it.
//   node gguf-info.mjs FILE.gguf [--tensors] [--no-load] [--verbose]
import {readGgufFileInfo} from "node-llama-cpp";
import {loadModel, parseArgs} from "./llama.mjs";

const a = parseArgs(process.argv.slice(2), ["tensors", "no-load", "verbose"]);
const file = a._[0];
if (!file) { console.error("usage: node gguf-info.mjs FILE.gguf [--tensors] [--no-load] [--verbose]"); process.exit(2); }

const short = (v) => {
    if (Array.isArray(v)) return `[${v.length}] ${JSON.stringify(v.slice(0, 4)).slice(0, 80)}${v.length > 4 ? " ..." : ""}`;
    const s = typeof v === "bigint" ? v.toString() : JSON.stringify(v);
    return s.length > 100 ? s.slice(0, 100) + "..." : s;
};
const flat = (o, pre = "", out = []) => {
    for (const [k, v] of Object.entries(o ?? {})) {
        if (v && typeof v === "object" && !Array.isArray(v)) flat(v, pre + k + ".", out);
        else out.push([pre + k, v]);
    }
    return out;
};

const info = await readGgufFileInfo(file, {readTensorInfo: true, ignoreKeys: []});
console.log(`${file}: GGUF v${info.version}, ${info.tensorInfo?.length ?? "?"} tensors, ${Object.keys(flat(info.metadata)).length} metadata keys`);
for (const [k, v] of flat(info.metadata)) console.log(`  ${k} = ${short(v)}`);
if (a.tensors)
    for (const t of info.tensorInfo ?? [])
        console.log(`  tensor ${t.name} type ${t.ggmlType} dims [${t.dimensions.join(", ")}] offset ${t.offset}`);
if (!a["no-load"]) {
    try {
        const m = await loadModel(file, {verbose: !!a.verbose});
        console.log(`llama.cpp: loaded (${m.typeDescription}, vocab type ${m.vocabularyType}, train ctx ${m.trainContextSize})`);
        await m.dispose();
    } catch (e) {
        console.log(`llama.cpp: REFUSED: ${e.message}`);
        process.exitCode = 1;
    }
}
