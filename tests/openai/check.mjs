// check.mjs - the official OpenAI Node SDK against a running `mlxcel serve`
// (started by tests/test_server_openai.sh with a tool-capable chat template,
// --cors-origin '*', --metrics and an API key):
//
//   node check.mjs BASE_URL API_KEY
//
// Tool calls forced by name and by "required" (non-streamed, streamed through
// the SDK's own stream accumulator) parse as JSON and validate against the
// function's schema (ajv); a tool result goes back for a second turn;
// response_format json_schema output validates (also through the SDK's
// parse()); logprobs shapes (chat, streamed chat, completions); the CORS
// preflight; /metrics as Prometheus text.  Prints "N passed, N failed".
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import OpenAI from 'openai';
import http from 'node:http';

const [base, apiKey] = process.argv.slice(2);
if (!base || !apiKey) {
  console.error('usage: node check.mjs BASE_URL API_KEY');
  process.exit(2);
}
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 300000 });
const ajv = new Ajv({ allErrors: true, strict: false });
addFormats(ajv);

let pass = 0, fail = 0;
function check(what, cond, detail) {
  if (cond) pass++;
  else {
    fail++;
    console.error(`FAIL: ${what}${detail === undefined ? '' : ': ' + detail}`);
  }
}
function parseJSON(s) {
  try { return { ok: true, value: JSON.parse(s) }; } catch (e) { return { ok: false, error: String(e) }; }
}
// Arguments (a JSON string) parse and follow schema.
function checkJSON(what, text, schema) {
  const p = parseJSON(text);
  check(`${what}: parses as JSON`, p.ok, `${p.error} in ${JSON.stringify(text)}`);
  if (!p.ok) return null;
  const validate = ajv.compile(schema);
  check(`${what}: follows the schema`, validate(p.value), `${ajv.errorsText(validate.errors)} in ${text}`);
  return p.value;
}

const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 12 },
    days: { type: 'integer' },
    unit: { enum: ['celsius', 'fahrenheit'] },
  },
  required: ['city', 'days'],
  additionalProperties: false,
};
const reminder = {
  type: 'object',
  properties: {
    text: { type: 'string', maxLength: 20 },
    at: { type: 'string', format: 'date-time' },
    repeat: { type: 'boolean' },
  },
  required: ['text', 'at', 'repeat'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather forecast for a city', parameters: weather } },
  { type: 'function', function: { name: 'set_reminder', description: 'Set a reminder', parameters: reminder } },
];
const schemaOf = { get_weather: weather, set_reminder: reminder };
const messages = [{ role: 'user', content: 'What will the weather be in Paris for the next 3 days?' }];
const models = await client.models.list();
const model = models.data[0]?.id;
check('models.list gives the model', typeof model === 'string' && model.length > 0, JSON.stringify(models.data));

// ---- tools: a forced function ----
for (const seed of [1, 2]) {
  const r = await client.chat.completions.create({
    model, messages, tools, seed, temperature: 1, max_tokens: 300,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const c = r.choices[0];
  check(`forced (seed ${seed}): finish_reason tool_calls`, c.finish_reason === 'tool_calls', c.finish_reason);
  const calls = c.message.tool_calls || [];
  check(`forced (seed ${seed}): one tool call`, calls.length === 1, JSON.stringify(c.message));
  if (calls.length) {
    const tc = calls[0];
    check(`forced (seed ${seed}): id and type`, typeof tc.id === 'string' && tc.id.length > 0 && tc.type === 'function', JSON.stringify(tc));
    check(`forced (seed ${seed}): the named function`, tc.function.name === 'get_weather', tc.function.name);
    checkJSON(`forced (seed ${seed}) arguments`, tc.function.arguments, weather);
  }
}

// "required": one of the functions, streamed through the SDK's accumulator
{
  const stream = client.chat.completions.stream({
    model, messages, tools, seed: 3, temperature: 1, max_tokens: 300, tool_choice: 'required',
  });
  let deltas = 0;
  stream.on('chunk', (chunk) => { if (chunk.choices[0]?.delta?.tool_calls) deltas++; });
  const final = await stream.finalChatCompletion();
  const c = final.choices[0];
  check('required streamed: finish_reason tool_calls', c.finish_reason === 'tool_calls', c.finish_reason);
  check('required streamed: tool_calls arrived as deltas', deltas >= 1, deltas);
  const calls = c.message.tool_calls || [];
  check('required streamed: one tool call', calls.length === 1, JSON.stringify(c.message));
  if (calls.length) {
    const tc = calls[0];
    check('required streamed: a function from the list', tc.function.name in schemaOf, tc.function.name);
    if (tc.function.name in schemaOf)
      checkJSON('required streamed arguments', tc.function.arguments, schemaOf[tc.function.name]);
    // a second turn with the tool's result, as an agent does
    const r2 = await client.chat.completions.create({
      model, tools, tool_choice: 'none', max_tokens: 8, temperature: 0,
      messages: [...messages, c.message, { role: 'tool', tool_call_id: tc.id, content: '{"forecast": "sunny"}' }],
    });
    check('a tool result goes back: a text answer', typeof r2.choices[0].message.content === 'string' &&
      !r2.choices[0].message.tool_calls, JSON.stringify(r2.choices[0]));
  }
}
// the same forced call streamed by hand: the deltas rebuild the call
{
  const stream = await client.chat.completions.create({
    model, messages, tools, seed: 1, temperature: 1, max_tokens: 300, stream: true,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const acc = {};
  let finish = null, content = '';
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    content += ch.delta?.content || '';
    for (const d of ch.delta?.tool_calls || []) {
      const a = (acc[d.index] ||= { id: '', name: '', arguments: '' });
      if (d.id) a.id = d.id;
      if (d.function?.name) a.name += d.function.name;
      if (d.function?.arguments) a.arguments += d.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  const calls = Object.values(acc);
  check('forced streamed: one call, no content, finish tool_calls',
    calls.length === 1 && content === '' && finish === 'tool_calls', JSON.stringify({ calls, content, finish }));
  if (calls.length === 1) {
    check('forced streamed: get_weather', calls[0].name === 'get_weather', calls[0].name);
    checkJSON('forced streamed arguments', calls[0].arguments, weather);
  }
}
// a function that is not offered: the SDK's BadRequestError
try {
  await client.chat.completions.create({
    model, messages, tools, max_tokens: 4, tool_choice: { type: 'function', function: { name: 'nope' } },
  });
  check('unknown forced function: an error', false);
} catch (e) {
  check('unknown forced function: BadRequestError 400', e instanceof OpenAI.BadRequestError && e.status === 400, String(e));
}

// ---- structured output: json_schema ----
const person = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 16 },
    age: { type: 'integer' },
    email: { type: ['string', 'null'], maxLength: 24 },
    tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, minItems: 1, maxItems: 3 },
    address: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 10 }, zip: { type: 'string', maxLength: 6 } },
      required: ['city'],
      additionalProperties: false,
    },
  },
  required: ['name', 'age', 'tags', 'address'],
  additionalProperties: false,
};
const rf = { type: 'json_schema', json_schema: { name: 'person', schema: person, strict: true } };
for (const seed of [1, 2, 3]) {
  const r = await client.chat.completions.create({
    model, seed, temperature: 1, max_tokens: 400, response_format: rf,
    messages: [{ role: 'user', content: 'Describe a person as JSON.' }],
  });
  const c = r.choices[0];
  check(`json_schema (seed ${seed}): finish_reason stop`, c.finish_reason === 'stop', c.finish_reason);
  checkJSON(`json_schema (seed ${seed}) output`, c.message.content, person);
}
{
  const r = await client.chat.completions.parse({
    model, seed: 4, temperature: 1, max_tokens: 400, response_format: rf,
    messages: [{ role: 'user', content: 'Describe a person as JSON.' }],
  });
  const parsed = r.choices[0].message.parsed;
  const validate = ajv.compile(person);
  check('json_schema through parse(): parsed follows the schema', parsed !== null && validate(parsed),
    `${ajv.errorsText(validate.errors)} in ${r.choices[0].message.content}`);
}
{
  const stream = await client.chat.completions.create({
    model, seed: 5, temperature: 1, max_tokens: 400, response_format: rf, stream: true,
    messages: [{ role: 'user', content: 'Describe a person as JSON.' }],
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content || '';
  checkJSON('json_schema streamed output', text, person);
}

// ---- logprobs ----
{
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  const lp = r.choices[0].logprobs?.content;
  check('chat logprobs: one entry per token', Array.isArray(lp) && lp.length === r.usage.completion_tokens,
    `${lp?.length} vs ${r.usage.completion_tokens}`);
  check('chat logprobs: entry shape', Array.isArray(lp) && lp.every((e) =>
    typeof e.token === 'string' && typeof e.logprob === 'number' && e.logprob <= 0 &&
    Array.isArray(e.bytes) && e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256) &&
    Array.isArray(e.top_logprobs) && e.top_logprobs.length === 3 &&
    e.top_logprobs.every((t, i, a) => typeof t.token === 'string' && typeof t.logprob === 'number' &&
      Array.isArray(t.bytes) && (i === 0 || a[i - 1].logprob >= t.logprob))), JSON.stringify(lp?.[0]));
  check('chat logprobs: greedy picks the top alternative', Array.isArray(lp) &&
    lp.every((e) => e.logprob === e.top_logprobs[0].logprob), JSON.stringify(lp?.[0]));
  const bytes = Buffer.from((lp || []).flatMap((e) => e.bytes));
  check('chat logprobs: the bytes make the text', bytes.toString('utf8') === r.choices[0].message.content);
}
{
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 1, stream: true,
    stream_options: { include_usage: true },
  });
  let n = 0, usage = null;
  for await (const chunk of stream) {
    n += chunk.choices[0]?.logprobs?.content?.length || 0;
    if (chunk.usage) usage = chunk.usage;
  }
  check('streamed chat logprobs: one entry per token', usage && n === usage.completion_tokens, `${n} vs ${usage?.completion_tokens}`);
}
{
  const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 4, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  const n = r.usage.completion_tokens;
  check('completions logprobs shape', lp && lp.tokens.length === n && lp.token_logprobs.length === n &&
    lp.text_offset.length === n && lp.top_logprobs.length === n &&
    lp.tokens.every((t) => typeof t === 'string') && lp.token_logprobs.every((x) => typeof x === 'number') &&
    lp.top_logprobs.every((o) => Object.keys(o).length >= 1 && Object.keys(o).length <= 2) &&
    lp.text_offset[0] === 0, JSON.stringify(lp));
}

// ---- CORS preflight (as a browser sends it) ----
function request(method, path, headers) {
  return new Promise((resolve, reject) => {
    const req = http.request(new URL(path, base), { method, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}
{
  const r = await request('OPTIONS', '/v1/chat/completions', {
    Origin: 'http://app.example',
    'Access-Control-Request-Method': 'POST',
    'Access-Control-Request-Headers': 'authorization, content-type',
  });
  check('preflight: 204', r.status === 204, r.status);
  check('preflight: allow-origin', r.headers['access-control-allow-origin'] === '*', r.headers['access-control-allow-origin']);
  check('preflight: allow-methods has POST', /\bPOST\b/.test(r.headers['access-control-allow-methods'] || ''),
    r.headers['access-control-allow-methods']);
  check('preflight: allow-headers has authorization and content-type',
    /authorization/i.test(r.headers['access-control-allow-headers'] || '') &&
    /content-type/i.test(r.headers['access-control-allow-headers'] || ''), r.headers['access-control-allow-headers']);
  const g = await request('GET', '/v1/models', { Origin: 'http://app.example', Authorization: `Bearer ${apiKey}` });
  check('a CORS GET: 200 with allow-origin', g.status === 200 && g.headers['access-control-allow-origin'] === '*', g.status);
}

// ---- /metrics: Prometheus text format 0.0.4 ----
// Each line: "# HELP name text", "# TYPE name type", or a sample
// "name{label="value",...} value [timestamp]"; a TYPE comes before its
// samples and at most once; the value is a Go-style float.
function parsePrometheus(text) {
  const name = '[a-zA-Z_:][a-zA-Z0-9_:]*';
  const label = '[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\\\\n]|\\\\[\\\\"n])*"';
  const sampleRe = new RegExp(`^(${name})(?:\\{(?:${label}(?:,${label})*,?)?\\})? (\\S+)(?: (-?\\d+))?$`);
  const typeRe = new RegExp(`^# TYPE (${name}) (counter|gauge|histogram|summary|untyped)$`);
  const helpRe = new RegExp(`^# HELP (${name}) .*$`);
  const types = {}, samples = {}, errors = [];
  text.split('\n').forEach((line, i) => {
    if (line === '') return;
    let m;
    if ((m = typeRe.exec(line))) {
      if (types[m[1]] || samples[m[1]]) errors.push(`line ${i + 1}: TYPE after samples or twice: ${line}`);
      types[m[1]] = m[2];
    } else if (helpRe.test(line) || (line.startsWith('#') && !line.startsWith('# TYPE') && !line.startsWith('# HELP'))) {
      // comment
    } else if ((m = sampleRe.exec(line))) {
      const v = m[2];
      if (!/^(?:[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|[+-]?Inf|NaN)$/.test(v))
        errors.push(`line ${i + 1}: bad value: ${line}`);
      (samples[m[1]] ||= []).push(Number(v.replace('Inf', 'Infinity')));
    } else {
      errors.push(`line ${i + 1}: not a Prometheus line: ${JSON.stringify(line)}`);
    }
  });
  return { types, samples, errors };
}
{
  const r = await request('GET', '/metrics', { Authorization: `Bearer ${apiKey}` });
  check('/metrics: 200', r.status === 200, r.status);
  check('/metrics: text/plain version 0.0.4', /^text\/plain; version=0\.0\.4/.test(r.headers['content-type'] || ''),
    r.headers['content-type']);
  const m = parsePrometheus(r.body);
  check('/metrics: every line parses', m.errors.length === 0, m.errors.join('; '));
  check('/metrics: the body ends with a newline', r.body.endsWith('\n'));
  for (const [n, t] of [['mlxcel_requests_total', 'counter'], ['mlxcel_tokens_predicted_total', 'counter'],
    ['mlxcel_prompt_tokens_total', 'counter'], ['mlxcel_requests_processing', 'gauge'],
    ['mlxcel_kv_cache_usage_ratio', 'gauge']])
    check(`/metrics: ${n} is a ${t}`, m.types[n] === t && m.samples[n]?.length >= 1, `${m.types[n]} ${m.samples[n]}`);
  check('/metrics: the requests made here are counted', m.samples.mlxcel_requests_total?.[0] >= 12,
    m.samples.mlxcel_requests_total);
  check('/metrics: every sample has a TYPE', Object.keys(m.samples).every((n) => m.types[n] ||
    Object.keys(m.types).some((t) => n.startsWith(t))), Object.keys(m.samples).filter((n) => !m.types[n]).join(','));
}

// ---- authentication: the SDK's error class ----
try {
  await new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 }).models.list();
  check('a wrong API key: an error', false);
} catch (e) {
  check('a wrong API key: AuthenticationError 401', e instanceof OpenAI.AuthenticationError && e.status === 401, String(e));
}

console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
