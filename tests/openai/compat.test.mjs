// What clients people already have send to q3 serve (node --test): the official
// OpenAI client with the fields its SDKs add, the same client pointed at the
// routes without /v1 (as llama-server serves them), and the llama.cpp body
// fields it passes through. Q3_BASE_URL ends in /v1 (tests/test_serve_openai.c
// starts a server with --ctx 512).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const base = process.env.Q3_BASE_URL;
const client = new OpenAI({ baseURL: base, apiKey: process.env.Q3_API_KEY, maxRetries: 0 });
const bare = new OpenAI({ baseURL: base.replace(/\/v1$/, ''), apiKey: process.env.Q3_API_KEY, maxRetries: 0 });
const model = 'e2e';
const msgs = [{ role: 'user', content: 'Tell me a story.' }];
const greedy = { model, messages: msgs, max_tokens: 6, temperature: 0 };

test('models.retrieve: GET /v1/models/{id}, and 404 for another id', async () => {
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  assert.equal(m.object, 'model');
  await assert.rejects(client.models.retrieve('gpt-4o'), (e) => e instanceof OpenAI.NotFoundError);
});

test('the fields the SDKs add are accepted and do not change the answer', async () => {
  const plain = await client.chat.completions.create(greedy);
  const extra = await client.chat.completions.create({
    ...greedy, metadata: { user_id: 'u1' }, store: false, service_tier: 'auto', reasoning_effort: 'low',
    modalities: ['text'], prediction: { type: 'content', content: 'Once' }, parallel_tool_calls: true, user: 'u1',
  });
  assert.equal(extra.choices[0].message.content, plain.choices[0].message.content);
  assert.equal(extra.usage.completion_tokens, 6);
});

test('an audio modality is refused (it would change the answer)', async () => {
  await assert.rejects(client.chat.completions.create({ ...greedy, modalities: ['text', 'audio'] }),
    (e) => e instanceof OpenAI.BadRequestError && /modality/.test(e.message));
});

test('the routes without /v1 answer the same client', async () => {
  const a = await client.chat.completions.create(greedy);
  const b = await bare.chat.completions.create(greedy);
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
  const page = await bare.models.list();
  assert.deepEqual(page.data.map((m) => m.id), [model]);
  const c = await bare.completions.create({ model, prompt: 'Once upon a time', max_tokens: 3, temperature: 0 });
  assert.equal(c.usage.completion_tokens, 3);
});

test('llama.cpp fields passed through the client: n_predict, cache_prompt, ignore_eos, logit_bias pairs', async () => {
  const r = await client.chat.completions.create({ model, messages: msgs, n_predict: 3, cache_prompt: true, temperature: 0 });
  assert.equal(r.usage.completion_tokens, 3);
  // <|im_end|> forced by a bias would end the turn at once; ignore_eos runs to the limit instead
  const forced = await client.chat.completions.create({ ...greedy, logit_bias: [[151645, 100]], ignore_eos: true });
  assert.equal(forced.usage.completion_tokens, 6);
  assert.equal(forced.choices[0].finish_reason, 'length');
});

test('max_tokens past the context is capped to what fits (finish_reason length)', async () => {
  // a prompt of about 490 tokens leaves a short answer before the 512-token context ends
  const r = await client.completions.create({ model, prompt: 'the '.repeat(490), max_tokens: 100000, temperature: 0, ignore_eos: true });
  assert.ok(r.usage.prompt_tokens > 400 && r.usage.prompt_tokens < 512, `prompt ${r.usage.prompt_tokens} tokens`);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.prompt_tokens + r.usage.completion_tokens, 512);
});
