// `dory serve` driven by the official `openai` npm client (the version pinned in
// package-lock.json). Starts the server itself on a free loopback port (--port 0,
// the port read from its first stderr line) and stops it at the end.
//
//   DORY_BIN=build/dory DORY_SERVE_MODEL=DIR node openai_client.mjs
//
// Run by tests/serve/test_openai_node.py, which makes the model and runs `npm ci`.
import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';

const DORY = process.env.DORY_BIN;
const MODEL = process.env.DORY_SERVE_MODEL;
const KEY = 'test-key-123';
let server;
let base;
let client;

function startServer() {
  return new Promise((resolve, reject) => {
    const p = spawn(DORY, ['serve', '-m', MODEL, '--port', '0', '-t', '2', '--parallel', '2', '--api-key', KEY],
                    { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    const timer = setTimeout(() => reject(new Error('no port from dory serve: ' + err)), 30000);
    p.stderr.on('data', (d) => {
      err += d.toString();
      const m = err.match(/listening on http:\/\/([\d.]+):(\d+)/);
      if (m && !base) {
        clearTimeout(timer);
        base = `http://127.0.0.1:${m[2]}`;
        resolve(p);
      }
    });
    p.on('exit', (code) => { if (!base) reject(new Error(`dory serve exited ${code}: ${err}`)); });
  });
}

async function waitHealthy() {
  for (let i = 0; i < 600; ++i) {
    try {
      const r = await fetch(base + '/health');
      if (r.status === 200) return;
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error('dory serve never became healthy');
}

async function metric(name) {
  const r = await fetch(base + '/metrics', { headers: { Authorization: `Bearer ${KEY}` } });
  const line = (await r.text()).split('\n').find((l) => l.startsWith(name + ' '));
  return Number(line.split(' ')[1]);
}

before(async () => {
  server = await startServer();
  await waitHealthy();
  client = new OpenAI({ baseURL: base + '/v1', apiKey: KEY, maxRetries: 0, timeout: 60000 });
});

after(async () => {
  const done = new Promise((r) => server.on('exit', (code, sig) => r([code, sig])));
  server.kill('SIGTERM');
  const [code] = await done;
  assert.equal(code, 0, 'dory serve should exit 0 on SIGTERM');
});

const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Hello there' }];

test('models.list names the model', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(typeof list.data[0].id, 'string');
});

test('chat, non-streaming and streaming, agree', async () => {
  const body = { model: 'dory', messages, max_tokens: 16, temperature: 0 };
  const whole = await client.chat.completions.create(body);
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(whole.choices[0].finish_reason));
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

  const stream = await client.chat.completions.create({ ...body, stream: true,
                                                        stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
});

test('completions, non-streaming and streaming', async () => {
  const body = { model: 'dory', prompt: 'The king said', max_tokens: 12, temperature: 0 };
  const whole = await client.completions.create(body);
  assert.equal(whole.object, 'text_completion');
  assert.equal(typeof whole.choices[0].text, 'string');
  let text = '';
  for await (const chunk of await client.completions.create({ ...body, stream: true }))
    text += chunk.choices[0]?.text ?? '';
  assert.equal(text, whole.choices[0].text);
});

test('a stop string ends the answer before it', async () => {
  const body = { model: 'dory', prompt: 'Once upon a time', max_tokens: 40, temperature: 0, ignore_eos: true };
  const text = (await client.completions.create(body)).choices[0].text;
  assert.ok(text.length > 12, text);
  const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
  const cut = await client.completions.create({ ...body, stop: [stop] });
  assert.equal(cut.choices[0].text, text.slice(0, text.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, 'stop');
});

test('a seed reproduces a sampled answer', async () => {
  const body = { model: 'dory', messages, max_tokens: 16, temperature: 1.0, top_p: 1.0, seed: 1234 };
  const a = await client.chat.completions.create(body);
  const b = await client.chat.completions.create(body);
  const c = await client.chat.completions.create({ ...body, seed: 4321 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);
});

test('bad requests are API errors the client understands', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'dory', messages, temperature: -1 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.error?.param ?? e.param, 'temperature');
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: 'dory', messages: [{ role: 'wizard', content: 'x' }] }),
                       OpenAI.BadRequestError);
  const wrong = new OpenAI({ baseURL: base + '/v1', apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrong.models.list(), OpenAI.AuthenticationError);
});

test('aborting a stream frees the slot', async () => {
  const ac = new AbortController();
  const stream = await client.completions.create(
    { model: 'dory', prompt: 'Go on', max_tokens: 100000, ignore_eos: true, stream: true }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const _ of stream) {  // eslint-disable-line no-unused-vars
      if (++n === 3) ac.abort();  // the SDK ends the iteration (or throws an abort error)
    }
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
  }
  assert.ok(n >= 3, `only ${n} chunks before the stream ended`);
  const t0 = Date.now();
  while (await metric('dory_requests_in_flight') !== 0) {
    assert.ok(Date.now() - t0 < 2000, 'the slot stayed busy after the abort');
    await new Promise((r) => setTimeout(r, 20));
  }
});
