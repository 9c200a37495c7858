// The reference tokenizer (Hugging Face `tokenizers`, Rust, through the Node binding
// @anush008/tokenizers) timed on the same text as bench/bench_tokenizer.c, which runs
// this script and prints both side by side.
//
//   node bench/tokenizer/bench.js TOKENIZER_JSON TEXT_FILE [REPEATS]
//
// Prints "key value" lines: load_ms, encode_ms_best, encode_ms_median, encode_ms_cold
// (the first call), bytes, n_ids,
// ids_hash (FNV-1a over the ids as little-endian uint32, to check both give the same ids).
'use strict';
const fs = require('fs');
const { Tokenizer } = require('@anush008/tokenizers');

function ms(t0) {
  return Number(process.hrtime.bigint() - t0) / 1e6;
}

function fnv1a(ids) {
  let h = 0x811c9dc5;
  for (const id of ids) {
    for (let k = 0; k < 4; k++) {
      h ^= (id >>> (8 * k)) & 0xff;
      h = Math.imul(h, 0x01000193) >>> 0;
    }
  }
  return h >>> 0;
}

async function main() {
  const [tokPath, textPath, repeatsArg] = process.argv.slice(2);
  if (!tokPath || !textPath) {
    console.error('usage: node bench.js TOKENIZER_JSON TEXT_FILE [REPEATS]');
    process.exit(2);
  }
  const repeats = Number(repeatsArg || 5);
  const text = fs.readFileSync(textPath, 'utf8');

  let t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(tokPath);
  const loadMs = ms(t0);

  const opts = { addSpecialTokens: false };
  t0 = process.hrtime.bigint();
  let enc = await tok.encode(text, null, opts); // the first call: an empty BPE cache
  const coldMs = ms(t0);
  const times = [];
  for (let r = 0; r < repeats; r++) {
    t0 = process.hrtime.bigint();
    enc = await tok.encode(text, null, opts);
    times.push(ms(t0));
  }
  times.sort((a, b) => a - b);
  const ids = enc.getIds();
  console.log(`load_ms ${loadMs.toFixed(2)}`);
  console.log(`encode_ms_best ${times[0].toFixed(3)}`);
  console.log(`encode_ms_median ${times[Math.floor(times.length / 2)].toFixed(3)}`);
  console.log(`encode_ms_cold ${coldMs.toFixed(3)}`);
  console.log(`bytes ${Buffer.byteLength(text, 'utf8')}`);
  console.log(`n_ids ${ids.length}`);
  console.log(`ids_hash ${fnv1a(ids)}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
