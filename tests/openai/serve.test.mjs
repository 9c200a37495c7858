// q3 serve through the official OpenAI Node client (node --test).
// Q3_BASE_URL points at a running `q3 serve` (tests/test_serve_openai.c starts one).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.Q3_BASE_URL, apiKey: process.env.Q3_API_KEY, maxRetries: 0 });
const model = 'e2e';
const msgs = [{ role: 'user', content: 'Hello, who are you?' }];

test('models.list names the served model', async () => {
  const page = await client.models.list();
  assert.deepEqual(page.data.map((m) => m.id), [model]);
});

test('chat.completions.create: message, finish_reason, usage', async () => {
  const r = await client.chat.completions.create({ model, messages: msgs, max_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 6);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 6);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('streaming: role first, deltas equal the whole answer, usage chunk', async () => {
  const whole = await client.chat.completions.create({ model, messages: msgs, max_completion_tokens: 8, temperature: 0 });
  const stream = await client.chat.completions.create({
    model, messages: msgs, max_completion_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '', first = null, finish = null, usage = null, n = 0;
  for await (const chunk of stream) {
    n++;
    if (!first) first = chunk;
    if (chunk.usage) { usage = chunk.usage; assert.equal(chunk.choices.length, 0); continue; }
    text += chunk.choices[0].delta.content ?? '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(first.choices[0].delta.role, 'assistant');
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 8);
  assert.ok(n >= 3);
});

test('the same seed samples the same answer', async () => {
  const req = { model, messages: msgs, max_tokens: 8, temperature: 1, top_p: 1, seed: 7 };
  const [a, b] = await Promise.all([client.chat.completions.create(req), client.chat.completions.create(req)]);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

test('tools are accepted; the answer is a message or tool calls', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Weather in Paris?' }], max_tokens: 8, temperature: 0,
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }],
    tool_choice: 'auto',
  });
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  if (r.choices[0].finish_reason === 'tool_calls') assert.ok(r.choices[0].message.tool_calls.length > 0);
});

test('a conversation with an earlier tool call and its result', async () => {
  const r = await client.chat.completions.create({
    model, max_tokens: 4, temperature: 0,
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
    ],
  });
  assert.equal(r.choices[0].message.role, 'assistant');
});

test('logprobs with top_logprobs', async () => {
  const r = await client.chat.completions.create({ model, messages: msgs, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
  const c = r.choices[0].logprobs.content;
  assert.equal(c.length, 4);
  for (const e of c) {
    assert.equal(e.top_logprobs.length, 2);
    assert.equal(e.token, e.top_logprobs[0].token);
    assert.ok(e.logprob <= 0);
  }
});

test('completions.create with a string prompt', async () => {
  const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.usage.completion_tokens, 5);
});

test('errors arrive as the client\'s error classes', async () => {
  await assert.rejects(client.chat.completions.create({ model, messages: msgs, n: 2 }), (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && typeof e.message === 'string');
  await assert.rejects(client.chat.completions.create({ model: 'nope', messages: msgs }), (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(client.chat.completions.create({ model, messages: [{ role: 'wizard', content: 'x' }] }), (e) => e.status === 400);
  const bad = new OpenAI({ baseURL: process.env.Q3_BASE_URL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});
