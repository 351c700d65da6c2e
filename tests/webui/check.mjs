// check.mjs - drives the chat page of `mlxcel serve` in a real headless
// Chromium (Debian's, through playwright-core) as a person would: see
// tests/test_webui.sh, which starts the server and runs
//   node check.mjs URL API_KEY OUT_DIR CHROMIUM
// The model is the qwen2_moe_tiny_chat fixture (random weights): its text is
// gibberish, but greedy (temperature 0) text is deterministic, so what the
// page shows is compared with what the API answers to the same request.
// Exit 0 when every check passed; otherwise each failure is printed.
import { chromium } from 'playwright-core';

const [base, key, outDir, chromiumPath] = process.argv.slice(2);
if (!chromiumPath) {
  console.error('usage: node check.mjs URL API_KEY OUT_DIR CHROMIUM');
  process.exit(2);
}
const origin = new URL(base).origin;

let failures = 0;
function check(ok, what, detail) {
  if (!ok) {
    failures++;
    console.error('FAIL: ' + what + (detail === undefined ? '' : ': ' + JSON.stringify(detail)));
  }
  return ok;
}

// ---- the API directly: the reference for what the page shows ----

const auth = { Authorization: 'Bearer ' + key };
async function getJSON(path) {
  const r = await fetch(base + path, { headers: auth });
  if (!r.ok) throw new Error(path + ': HTTP ' + r.status);
  return r.json();
}
// The non-streamed greedy answer to messages.
async function reference(messages, maxTokens) {
  const r = await fetch(base + '/v1/chat/completions', {
    method: 'POST',
    headers: { ...auth, 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, temperature: 0, top_p: 1, max_tokens: maxTokens }),
  });
  if (!r.ok) throw new Error('reference request: HTTP ' + r.status + ' ' + (await r.text()));
  const j = await r.json();
  return { content: j.choices[0].message.content, usage: j.usage };
}

const modelId = (await getJSON('/v1/models')).data[0].id;

// ---- the browser ----

const browser = await chromium.launch({
  executablePath: chromiumPath,
  headless: true,
  // as root in a container, without a GPU, and with no network but loopback:
  // nothing in the background may try to reach Google's hosts
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
         '--disable-component-update', '--disable-sync'],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
const requests = [];
const problems = [];
context.on('request', (r) => requests.push(r.url()));
// the bodies of the page's streamed chat requests, in order (null: cut)
const streams = [];
context.on('response', (r) => {
  if (r.url() !== origin + '/v1/chat/completions')
    return;
  // (the DevTools protocol decodes a text/* body by its Content-Type's
  // charset, Latin-1 without one: the server names utf-8)
  check(r.headers()['content-type'] === 'text/event-stream; charset=utf-8', 'the stream\'s Content-Type',
        r.headers()['content-type']);
  streams.push(r.body().then((b) => b.toString('utf8'), () => null));
});
// What the page read from its last stream: text, usage and timings.
async function lastStream() {
  const body = await streams[streams.length - 1];
  const s = { content: '', usage: null, timings: null, done: false };
  for (const line of (body || '').split('\n')) {
    if (!line.startsWith('data: '))
      continue;
    if (line === 'data: [DONE]') {
      s.done = true;
      continue;
    }
    const j = JSON.parse(line.slice(6));
    const c = j.choices && j.choices[0];
    if (c && c.delta && c.delta.content)
      s.content += c.delta.content;
    s.usage = j.usage || s.usage;
    s.timings = j.timings || s.timings;
  }
  return s;
}
const fmt = (v, digits) => v.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
context.on('page', watch);
// CSP violations, reported from every page load on
const violations = [];
await context.exposeBinding('__cspViolation', (_, v) => violations.push(v));
await context.addInitScript(() => {
  document.addEventListener('securitypolicyviolation', (e) => window.__cspViolation(e.violatedDirective + ' ' + e.blockedURI));
});
function watch(page) {
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('console', (m) => {
    // the browser reports each 401 of the key flow as a failed load
    if (m.type() === 'error' && !/status of 401/.test(m.text()))
      problems.push('console error: ' + m.text());
  });
}

const page = await context.newPage();
const $ = (sel) => page.locator(sel);
const text = (sel) => $(sel).textContent();
const lastReply = '.msg.assistant >> nth=-1';

// Waits for a reply to end: the Send button is back.
async function replyDone() {
  await $('#send').waitFor({ state: 'visible', timeout: 120000 });
  await $(lastReply + ' >> .body').waitFor({ state: 'attached' });
}
// The visible text that the page's renderer makes of markdown.
function rendered(markdown) {
  return page.evaluate((t) => {
    const d = document.createElement('div');
    d.append(window.mlxcelMarkdown.render(t));
    return d.textContent;
  }, markdown);
}

// 1. The page asks for the API key: a wrong one is refused, the right one kept.
await page.goto(base + '/');
await $('#key-dialog').waitFor({ state: 'visible' });
await $('#api-key').fill('not-the-key');
await $('#key-save').click();
await page.waitForFunction(() => /did not accept/.test(document.getElementById('key-msg').textContent));
check(await $('#key-dialog').isVisible(), 'a wrong key asks again');
await $('#api-key').fill(key);
await $('#key-save').click();
await page.waitForFunction((id) => document.getElementById('model').textContent === id, modelId);
check(await page.evaluate(() => localStorage.getItem('mlxcel.apiKey')) === key, 'the key is kept in localStorage');
check((await page.title()).startsWith(modelId), 'the title names the model', await page.title());

// 2. Labels and roles.
const unlabelled = await page.evaluate(() =>
  [...document.querySelectorAll('input, textarea, select')].filter((e) => !e.labels.length && !e.getAttribute('aria-label')).map((e) => e.id));
check(unlabelled.length === 0, 'every field has a label', unlabelled);
check(await $('#log').getAttribute('role') === 'log', 'the conversation is a log region');
check(await $('#status').getAttribute('aria-live') === 'polite', 'the status line is live');

// 3. A first message, typed with Shift+Enter for its line break and sent
// with Enter; greedy, so the page must show exactly the API's answer.
const system = 'You are terse.';
const first = 'Hello there.\nWhat is a mixture of experts?';
await $('#system').fill(system);
await $('#temperature').fill('0');
await $('#top-p').fill('1');
await $('#max-tokens').fill('16');
const lines = first.split('\n');
await $('#prompt').click();
await page.keyboard.type(lines[0]);
await page.keyboard.press('Shift+Enter');
await page.keyboard.type(lines[1]);
check(await $('#prompt').inputValue() === first, 'Shift+Enter makes a new line', await $('#prompt').inputValue());
check(await $('.msg').count() === 0, 'Shift+Enter does not send');
await page.keyboard.press('Enter');
await $('.msg.user').waitFor();
check(await text('.msg.user >> .body') === first, 'the message is shown as typed', await text('.msg.user >> .body'));
check(await $('#prompt').inputValue() === '', 'the box is emptied');
await replyDone();
const conv = [{ role: 'system', content: system }, { role: 'user', content: first }];
const ref1 = await reference(conv, 16);
const s1 = await lastStream();
check(s1.done && s1.content === ref1.content, 'the page streamed the greedy answer', { stream: s1.content, api: ref1.content });
check(s1.usage && s1.timings, 'the stream ends with usage and timings', s1);
check(s1.timings.predicted_n === s1.usage.completion_tokens, 'timings.predicted_n is the completion tokens', s1);
check(s1.timings.prompt_n === s1.usage.prompt_tokens - s1.usage.prompt_tokens_details.cached_tokens,
      'timings.prompt_n is the prompt tokens not cached', s1);
check(await text(lastReply + ' >> .body') === await rendered(ref1.content), 'the streamed reply equals the API answer',
      { page: await text(lastReply + ' >> .body'), api: ref1.content });
check(await text('#stat-prompt') === ref1.usage.prompt_tokens + ' tokens' ||
      (await text('#stat-prompt')).startsWith(ref1.usage.prompt_tokens + ' tokens ('), 'prompt tokens from the usage chunk',
      { page: await text('#stat-prompt'), api: ref1.usage.prompt_tokens });
check((await text('#stat-gen')).startsWith(ref1.usage.completion_tokens + ' tokens'), 'generated tokens from the usage chunk',
      { page: await text('#stat-gen'), api: ref1.usage.completion_tokens });
check(/^[\d,]+ ms$/.test(await text('#stat-ttft')), 'time to first token', await text('#stat-ttft'));
check(await text('#stat-tps') === fmt(s1.timings.predicted_per_second, 1) + ' tokens/s', 'tokens per second from the timings',
      { page: await text('#stat-tps'), stream: s1.timings });
check(await text('#stat-prefill') === fmt(s1.timings.prompt_per_second, 1) + ' tokens/s', 'prefill speed from the timings',
      { page: await text('#stat-prefill'), stream: s1.timings });
const moe = /^fused (\d+) · gather (\d+) blocks$/.exec(await text('#stat-moe'));
check(moe && Number(moe[1]) + Number(moe[2]) > 0, 'the MoE paths that ran', await text('#stat-moe'));
check(/^Reply done: /.test(await text('#status')), 'the status line says the reply is done', await text('#status'));

// 4. A second turn: the whole conversation (system prompt included) goes back.
await $('#prompt').fill('Say it again, shorter.');
await $('#send').click();
await replyDone();
conv.push({ role: 'assistant', content: ref1.content }, { role: 'user', content: 'Say it again, shorter.' });
const ref2 = await reference(conv, 16);
check(await text(lastReply + ' >> .body') === await rendered(ref2.content), 'the second reply equals the API answer to the whole conversation');
check((await text('#stat-prompt')).startsWith(ref2.usage.prompt_tokens + ' tokens'), 'the second prompt counts the history',
      { page: await text('#stat-prompt'), api: ref2.usage.prompt_tokens });

// 5. Regenerate replaces the last reply (greedy: the same text again).
await $('#regen').click();
await replyDone();
check(await $('.msg.assistant').count() === 2, 'regenerate replaces the last reply', await $('.msg.assistant').count());
check(await text(lastReply + ' >> .body') === await rendered(ref2.content), 'the regenerated reply');

await page.screenshot({ path: outDir + '/webui.png' });

// 6. Stop mid-stream: a long reply, stopped once text and live statistics are there.
await $('#max-tokens').fill('3000');
await $('#prompt').fill('Now write a very long story.');
await $('#prompt').press('Enter');
await $('#stop').waitFor({ state: 'visible' });
// What the page shows once 8 tokens are in, and the click on Stop, in one
// task of the page: the tiny model streams 3000 tokens in under 2 s, and
// a round trip per check between them let the reply end before the click
// on a loaded machine.
const live = await page.evaluate(() => new Promise((resolve) => {
  const poll = () => {
    const gen = document.getElementById('stat-gen').textContent;
    if (!/^\d+ tokens$/.test(gen) || parseInt(gen, 10) < 8)
      return void setTimeout(poll, 2);
    const stop = document.getElementById('stop'), replies = document.querySelectorAll('.msg.assistant');
    const seen = {
      visible: stop.getClientRects().length > 0 && getComputedStyle(stop).visibility !== 'hidden' && !stop.disabled,
      tps: document.getElementById('stat-tps').textContent,
      busy: replies.length ? replies[replies.length - 1].getAttribute('aria-busy') : null,
    };
    stop.click();
    resolve(seen);
  };
  poll();
}));
check(live.visible, 'still streaming when the live statistics show tokens', live);
check(/tokens\/s$/.test(live.tps), 'live tokens per second while streaming', live.tps);
check(live.busy === 'true', 'the streamed reply is marked busy', live.busy);
await replyDone();
const stopped = await text(lastReply + ' >> .body');
check(stopped.length > 0, 'the stopped reply keeps its text');
check(await text(lastReply + ' >> .note') === 'Stopped.', 'the reply says it was stopped');
check(/\(stopped\)$/.test(await text('#stat-gen')), 'the statistics say it was stopped', await text('#stat-gen'));
check(await page.evaluate(() => document.activeElement.id) === 'prompt', 'focus goes back to the message box');
await page.waitForTimeout(300);
check(await text(lastReply + ' >> .body') === stopped, 'no text arrives after stop');
console.log('stopped after ' + (await text('#stat-gen')));

// 7. New chat.
await $('#new-chat').click();
check(await $('.msg').count() === 0, 'new chat empties the conversation');
check(await $('#empty').isVisible(), 'new chat shows the hint again');
check(await $('#regen').isDisabled(), 'nothing to regenerate in a new chat');

// 8. The Markdown renderer on hostile text: elements only from its fixed set,
// no HTML from the text, links only to http(s).
const md = await page.evaluate(() => {
  const src = '<img src=x onerror="window.__pwned=1"> **bold** *em* `a<b>` ~~del~~ [ok](https://example.com/x) ' +
              '[bad](javascript:window.__pwned=1) <script>window.__pwned=1</script>\n\n' +
              '# Title\n\n```js\n<b>not bold</b>\n```\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\n' +
              '- x\n  - y\n- z\n\n3. three\n4. four\n\n> quoted';
  const d = document.createElement('div');
  document.body.append(d);
  d.append(window.mlxcelMarkdown.render(src));
  const tags = [...d.querySelectorAll('*')].map((e) => e.tagName.toLowerCase());
  const r = {
    tags: [...new Set(tags)].sort(),
    links: [...d.querySelectorAll('a')].map((a) => a.getAttribute('href')),
    text: d.textContent,
    code: d.querySelector('pre code') && d.querySelector('pre code').textContent,
    right: d.querySelector('td.align-right') && d.querySelector('td.align-right').textContent,
    nested: !!d.querySelector('ul > li ul > li'),
    start: d.querySelector('ol') && d.querySelector('ol').start,
    pwned: window.__pwned,
  };
  d.remove();
  return r;
});
const allowed = new Set(['p', 'strong', 'em', 'code', 'del', 'a', 'h1', 'div', 'span', 'button', 'pre', 'table', 'thead',
                         'tbody', 'tr', 'th', 'td', 'ul', 'ol', 'li', 'blockquote', 'br']);
check(md.tags.every((t) => allowed.has(t)), 'rendered Markdown has only its own elements', md.tags);
check(['strong', 'em', 'del', 'h1', 'pre', 'table', 'blockquote'].every((t) => md.tags.includes(t)), 'Markdown elements', md.tags);
check(JSON.stringify(md.links) === '["https://example.com/x"]', 'only the http(s) link is a link', md.links);
check(md.text.includes('<img src=x onerror="window.__pwned=1">') && md.text.includes('<script>'), 'HTML in the text stays text');
check(md.code === '<b>not bold</b>', 'a code block keeps its text', md.code);
check(md.right === '2' && md.nested && md.start === 3, 'table alignment, nested and numbered lists', md);
check(md.pwned === undefined, 'nothing in the text ran');

// 9. A phone-sized screen: nothing wider than the screen, the box and Send
// on screen, the settings a drawer opened and closed from the keyboard.
await page.setViewportSize({ width: 390, height: 844 });
await page.evaluate(() => localStorage.setItem('mlxcel.setting.max_tokens', '24'));
await page.reload();
await page.waitForFunction((id) => document.getElementById('model').textContent === id, modelId);
check(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth), 'no sideways scrolling on a phone');
for (const sel of ['#prompt', '#send', '#new-chat', '#settings-toggle']) {
  const b = await $(sel).boundingBox();
  check(b && b.x >= 0 && b.y >= 0 && b.x + b.width <= 390 && b.y + b.height <= 844, sel + ' is on a phone screen', b);
}
check(!(await $('#settings').isVisible()), 'the settings are closed on a phone');
check(await $('#temperature').inputValue() === '0', 'settings are kept across reloads', await $('#temperature').inputValue());
await $('#settings-toggle').focus();
await page.keyboard.press('Enter');
check(await $('#settings').isVisible(), 'the settings open');
check(await $('#settings-toggle').getAttribute('aria-expanded') === 'true', 'the toggle says they are open');
check(await page.evaluate(() => document.activeElement.id) === 'system', 'focus moves into the settings');
await page.keyboard.press('Escape');
check(!(await $('#settings').isVisible()), 'Escape closes the settings');
check(await page.evaluate(() => document.activeElement.id) === 'settings-toggle', 'focus returns to the toggle');
await $('#prompt').fill('Hi');
await $('#prompt').press('Enter');
await replyDone();
await page.screenshot({ path: outDir + '/webui-phone.png' });

// 10. Nothing but the server was asked for anything, and nothing was refused.
const foreign = requests.filter((u) => !u.startsWith(origin + '/'));
check(foreign.length === 0, 'no request leaves the server', foreign);
check(violations.length === 0, 'no Content-Security-Policy violation', violations);
check(problems.length === 0, 'no script error', problems);
console.log(requests.length + ' requests, all to ' + origin);

await browser.close();
if (failures)
  console.error(failures + ' check(s) failed');
process.exit(failures ? 1 : 0);
