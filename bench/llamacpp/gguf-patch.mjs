#!/usr/bin/env node
// Copies a GGUF (v2/v3) with its metadata changed, tensor infos and data untouched. A diagnostic
// tool: it shows which metadata makes llama.cpp refuse a file, and lets q3-written GGUFs made with
// --no-tokenizer (the golden test models have no tokenizer.json) borrow a vocabulary.
//   node gguf-patch.mjs IN.gguf OUT.gguf [--set-u32 KEY VALUE]... [--tokenizer-from DONOR.gguf]
// --set-u32 KEY VALUE      add (or replace) a uint32 key, e.g. qwen3.vocab_size 1024
// --tokenizer-from DONOR   drop IN's tokenizer.* keys and copy DONOR's (same vocabulary size)
import fs from "node:fs";

const SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8};

// Parses the header: [{key, type, bytes (the whole raw key-value record)}], tensor-info bytes,
// the data section's start and the alignment.
export function readHeader(buf) {
    let p = 0;
    const u32 = () => { const v = buf.readUInt32LE(p); p += 4; return v; };
    const u64 = () => { const v = buf.readBigUInt64LE(p); p += 8; return Number(v); };
    const str = () => { const n = u64(); const s = buf.toString("utf8", p, p + n); p += n; return s; };
    const skip = (type) => {
        if (type === 8) { str(); return; }
        if (type === 9) {
            const et = u32(), n = u64();
            if (et === 8 || et === 9) for (let i = 0; i < n; i++) skip(et);
            else p += SIZE[et] * n;
            return;
        }
        if (!(type in SIZE)) throw new Error(`unknown GGUF value type ${type} at byte ${p}`);
        p += SIZE[type];
    };
    if (buf.toString("latin1", 0, 4) !== "GGUF") throw new Error("not a GGUF file");
    p = 4;
    const version = u32(), nTensors = u64(), nKv = u64();
    const kvs = [];
    let alignment = 32;
    for (let i = 0; i < nKv; i++) {
        const start = p, key = str(), type = u32();
        if (key === "general.alignment" && type === 4) alignment = buf.readUInt32LE(p);
        skip(type);
        kvs.push({key, type, bytes: buf.subarray(start, p)});
    }
    const infoStart = p;
    for (let i = 0; i < nTensors; i++) { str(); const nd = u32(); p += 8 * nd + 4 + 8; }
    return {version, nTensors, kvs, info: buf.subarray(infoStart, p),
        dataStart: Math.ceil(p / alignment) * alignment, alignment};
}

function u32Record(key, value) {
    const k = Buffer.from(key, "utf8"), b = Buffer.alloc(16 + k.length);
    b.writeBigUInt64LE(BigInt(k.length), 0);
    k.copy(b, 8);
    b.writeUInt32LE(4, 8 + k.length);
    b.writeUInt32LE(Number(value) >>> 0, 12 + k.length);
    return {key, type: 4, bytes: b};
}

function main() {
    const args = process.argv.slice(2);
    const [inPath, outPath] = args;
    if (!inPath || !outPath || inPath.startsWith("--") || outPath.startsWith("--")) {
        console.error("usage: node gguf-patch.mjs IN.gguf OUT.gguf [--set-u32 KEY VALUE]... [--tokenizer-from DONOR.gguf]");
        process.exit(2);
    }
    const buf = fs.readFileSync(inPath);
    const h = readHeader(buf);
    let kvs = h.kvs;
    const changes = [];
    for (let i = 2; i < args.length; i++) {
        if (args[i] === "--set-u32") {
            const [key, value] = [args[++i], args[++i]];
            kvs = kvs.filter((r) => r.key !== key).concat([u32Record(key, value)]);
            changes.push(`${key} = ${value}`);
        } else if (args[i] === "--tokenizer-from") {
            const donor = readHeader(fs.readFileSync(args[++i]));
            const tok = donor.kvs.filter((r) => r.key.startsWith("tokenizer."));
            kvs = kvs.filter((r) => !r.key.startsWith("tokenizer.")).concat(tok);
            changes.push(`${tok.length} tokenizer.* keys from ${args[i]}`);
        } else throw new Error(`unknown option ${args[i]}`);
    }
    const head = Buffer.alloc(24);
    head.write("GGUF", 0, "latin1");
    head.writeUInt32LE(h.version, 4);
    head.writeBigUInt64LE(BigInt(h.nTensors), 8);
    head.writeBigUInt64LE(BigInt(kvs.length), 16);
    const meta = Buffer.concat([head, ...kvs.map((r) => r.bytes), h.info]);
    const pad = Buffer.alloc((h.alignment - (meta.length % h.alignment)) % h.alignment);
    fs.writeFileSync(outPath, Buffer.concat([meta, pad, buf.subarray(h.dataStart)]));
    console.log(`${outPath}: ${inPath} with ${changes.join(", ") || "no change"}`);
}

if (import.meta.url === `file://${process.argv[1]}`) main();
