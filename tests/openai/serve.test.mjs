// q3 serve through the official OpenAI Node client (node --test).
// Q3_BASE_URL points at a running `q3 serve` (tests/test_serve_openai.c starts one).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';

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

// ---- structured output: the answers are checked by an independent validator (ajv) ----
const ajv = new Ajv({ strict: false });
const noThink = { chat_template_kwargs: { enable_thinking: false } };
const record = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 8 },
    n: { type: 'integer', minimum: -5, maximum: 500 },
    tags: { type: 'array', items: { enum: ['x', 'y', 'z'] }, maxItems: 3 },
    ok: { type: 'boolean' },
  },
  required: ['name', 'n', 'tags', 'ok'],
  additionalProperties: false,
};

test('response_format json_schema: every finished answer validates, streaming or not', async () => {
  const validate = ajv.compile(record);
  let finished = 0;
  for (let seed = 1; seed <= 6; seed++) {
    const req = {
      model, messages: [{ role: 'user', content: 'A record.' }], max_tokens: 200, temperature: 1, top_p: 1, seed, ...noThink,
      response_format: { type: 'json_schema', json_schema: { name: 'record', schema: record, strict: true } },
    };
    const r = await client.chat.completions.create(req);
    const stream = await client.chat.completions.create({ ...req, stream: true });
    let text = '', finish = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
    }
    assert.equal(text, r.choices[0].message.content);
    assert.equal(finish, r.choices[0].finish_reason);
    if (r.choices[0].finish_reason === 'stop') {
      finished++;
      const v = JSON.parse(r.choices[0].message.content);
      assert.ok(validate(v), `${r.choices[0].message.content}: ${JSON.stringify(validate.errors)}`);
    } else {
      assert.equal(r.choices[0].finish_reason, 'length');
    }
  }
  assert.ok(finished >= 3, `only ${finished} of 6 answers finished`);
});

test('response_format json_object and llama-server json_schema', async () => {
  const r = await client.chat.completions.create({
    model, messages: msgs, max_tokens: 300, temperature: 0.7, seed: 3, ...noThink, response_format: { type: 'json_object' },
  });
  if (r.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(r.choices[0].message.content), 'object');
  else assert.ok(r.choices[0].message.content.startsWith('{'));
  const s = { enum: ['red', 'green', { k: 1 }] };
  const c = await client.chat.completions.create({ model, messages: msgs, max_tokens: 300, temperature: 1, seed: 4, ...noThink, json_schema: s });
  assert.equal(c.choices[0].finish_reason, 'stop');
  assert.ok(ajv.validate(s, JSON.parse(c.choices[0].message.content)));
});

test('tool_choice forces a call to the named tool, with valid arguments', async () => {
  const params = { type: 'object', properties: { city: { type: 'string', maxLength: 10 }, unit: { enum: ['C', 'F'] } }, required: ['city', 'unit'], additionalProperties: false };
  const tools = [
    { type: 'function', function: { name: 'get_weather', parameters: params } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {}, additionalProperties: false } } },
  ];
  for (const stream of [false, true]) {
    const req = { model, messages: [{ role: 'user', content: 'Weather?' }], max_tokens: 250, temperature: 1, seed: 11, tools, ...noThink,
      tool_choice: { type: 'function', function: { name: 'get_weather' } }, stream };
    let calls, finish;
    if (!stream) {
      const r = await client.chat.completions.create(req);
      calls = r.choices[0].message.tool_calls;
      finish = r.choices[0].finish_reason;
    } else {
      const acc = [];
      for await (const chunk of await client.chat.completions.create(req)) {
        for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
          acc[tc.index] ??= { function: { name: '', arguments: '' } };
          acc[tc.index].function.name += tc.function?.name ?? '';
          acc[tc.index].function.arguments += tc.function?.arguments ?? '';
        }
        if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
      }
      calls = acc;
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].function.name, 'get_weather');
    assert.ok(ajv.validate(params, JSON.parse(calls[0].function.arguments)), calls[0].function.arguments);
  }
  const any = await client.chat.completions.create({ model, messages: msgs, max_tokens: 250, temperature: 1, seed: 2, tools, tool_choice: 'required', ...noThink });
  assert.equal(any.choices[0].finish_reason, 'tool_calls');
  assert.ok(['get_weather', 'get_time'].includes(any.choices[0].message.tool_calls[0].function.name));
});

test('vLLM structured_outputs and guided_*: choice, regex, on chat and completions', async () => {
  const choices = ['positive', 'negative', 'neutral'];
  const a = await client.chat.completions.create({ model, messages: msgs, max_tokens: 10, temperature: 1, seed: 5, ...noThink, structured_outputs: { choice: choices } });
  assert.ok(choices.includes(a.choices[0].message.content), a.choices[0].message.content);
  assert.equal(a.choices[0].finish_reason, 'stop');
  const b = await client.completions.create({ model, prompt: 'Phone: ', max_tokens: 20, temperature: 1, seed: 6, guided_regex: '[0-9]{3}-[0-9]{4}' });
  assert.match(b.choices[0].text, /^[0-9]{3}-[0-9]{4}$/);
  const c = await client.completions.create({ model, prompt: 'Pick: ', max_tokens: 10, temperature: 1, seed: 7, guided_choice: ['yes', 'no'] });
  assert.ok(['yes', 'no'].includes(c.choices[0].text));
  const d = await client.completions.create({ model, prompt: 'Say: ', max_tokens: 10, temperature: 1, seed: 8, grammar: 'root ::= "ab" [0-9]' });
  assert.match(d.choices[0].text, /^ab[0-9]$/);
});

test('an unsupported keyword is a 400 that names it', async () => {
  await assert.rejects(client.chat.completions.create({
    model, messages: msgs, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'integer', multipleOf: 3 } } },
  }), (e) => e instanceof OpenAI.BadRequestError && /multipleOf/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model, messages: msgs, structured_outputs: { regex: 'a(?=b)' } }),
    (e) => e.status === 400 && /lookaround/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model, messages: msgs, guided_choice: ['a'], json_schema: {} }),
    (e) => e.status === 400 && /one constraint/.test(e.message));
});
