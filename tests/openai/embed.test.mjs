// q3 serve's /v1/embeddings through the official OpenAI Node client (node --test).
// Q3_BASE_URL points at a running `q3 serve --embeddings` (tests/test_serve_embed.c starts one);
// Q3_HIDDEN is the model's hidden size.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.Q3_BASE_URL, apiKey: process.env.Q3_API_KEY, maxRetries: 0 });
const model = 'e2e';
const hidden = Number(process.env.Q3_HIDDEN);
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const decode = (b64) => Array.from(new Float32Array(Uint8Array.from(Buffer.from(b64, 'base64')).buffer)); // little-endian float32

test('embeddings.create: one string, float, normalized, usage', async () => {
  const r = await client.embeddings.create({ model, input: 'The capital of China is Beijing.', encoding_format: 'float' });
  assert.equal(r.object, 'list');
  assert.equal(r.model, model);
  assert.equal(r.data.length, 1);
  assert.equal(r.data[0].object, 'embedding');
  assert.equal(r.data[0].index, 0);
  assert.equal(r.data[0].embedding.length, hidden);
  assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-5);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
});

test('base64 decodes to the float answer, bit for bit', async () => {
  const input = ['alpha beta', 'gamma'];
  const f = await client.embeddings.create({ model, input, encoding_format: 'float' });
  const b = await client.embeddings.create({ model, input, encoding_format: 'base64' });
  for (let i = 0; i < input.length; i++) {
    assert.equal(typeof b.data[i].embedding, 'string');
    const v = decode(b.data[i].embedding);
    assert.deepEqual(v, f.data[i].embedding.map((x) => Math.fround(x)));
  }
  // the client's default (no encoding_format) asks for base64 and decodes it itself
  const d = await client.embeddings.create({ model, input });
  for (let i = 0; i < input.length; i++) assert.deepEqual(d.data[i].embedding, f.data[i].embedding.map((x) => Math.fround(x)));
});

test('dimensions: the first d values, renormalized', async () => {
  const full = await client.embeddings.create({ model, input: 'matryoshka', encoding_format: 'float' });
  const cut = await client.embeddings.create({ model, input: 'matryoshka', encoding_format: 'float', dimensions: 32 });
  const v = cut.data[0].embedding, w = full.data[0].embedding.slice(0, 32), n = norm(w);
  assert.equal(v.length, 32);
  for (let k = 0; k < 32; k++) assert.ok(Math.abs(v[k] - w[k] / n) < 1e-6);
});

test('a batch: one embedding per input, in order, each as it is alone', async () => {
  const input = ['one', 'two two', 'three three three', 'one'];
  const batch = await client.embeddings.create({ model, input, encoding_format: 'float' });
  assert.deepEqual(batch.data.map((d) => d.index), [0, 1, 2, 3]);
  for (let i = 0; i < input.length; i++) {
    const alone = await client.embeddings.create({ model, input: input[i], encoding_format: 'float' });
    assert.deepEqual(batch.data[i].embedding, alone.data[0].embedding);
  }
  assert.deepEqual(batch.data[0].embedding, batch.data[3].embedding);
});

test('concurrent requests, one of them bad: the good ones answer as alone', async () => {
  const alone = await client.embeddings.create({ model, input: 'steady', encoding_format: 'float' });
  const good = Array.from({ length: 6 }, () => client.embeddings.create({ model, input: ['steady', 'x'], encoding_format: 'float' }));
  const badOne = client.embeddings.create({ model, input: [''] }).then(() => 'no error', (e) => e.status);
  const [bad, ...rs] = await Promise.all([badOne, ...good]);
  assert.equal(bad, 400);
  for (const r of rs) assert.deepEqual(r.data[0].embedding, alone.data[0].embedding);
});

test('bad input: 400 through the client', async () => {
  for (const body of [{ input: [] }, { input: '' }, { input: [3.5] }, { input: [{}] }, { input: 'x', dimensions: hidden + 1 }]) {
    await assert.rejects(client.embeddings.create({ model, ...body }), (e) => e.status === 400);
  }
});
