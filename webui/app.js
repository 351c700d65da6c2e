/* app.js - the chat page of `mlxcel serve` (docs/server.md, "The chat page").
 *
 * It talks only to the server it came from: GET /v1/models (the model's
 * name), GET /props (the server's defaults, and the MoE dispatch counts
 * read before and after a reply), and POST /v1/chat/completions streamed
 * (server-sent events read from fetch's ReadableStream, with
 * stream_options.include_usage for the token counts).  A 401 asks for the
 * API key, which is kept in localStorage with the settings.
 *
 * A reply's text is rendered by markdown.js into DOM nodes; nothing the
 * model or the user writes is ever parsed as HTML. */
'use strict';
(function () {
  const $ = (id) => document.getElementById(id);
  const ui = {
    model: $('model'), log: $('log'), empty: $('empty'), status: $('status'),
    composer: $('composer'), prompt: $('prompt'), send: $('send'), stop: $('stop'), regen: $('regen'),
    newChat: $('new-chat'), settings: $('settings'), settingsToggle: $('settings-toggle'),
    settingsClose: $('settings-close'), system: $('system'), temperature: $('temperature'),
    topP: $('top-p'), maxTokens: $('max-tokens'), resetSettings: $('reset-settings'),
    keyState: $('key-state'), changeKey: $('change-key'), forgetKey: $('forget-key'),
    keyDialog: $('key-dialog'), keyForm: $('key-form'), keyInput: $('api-key'), keyMsg: $('key-msg'),
    keyCancel: $('key-cancel'),
    stat: {
      ttft: $('stat-ttft'), tps: $('stat-tps'), prefill: $('stat-prefill'), prompt: $('stat-prompt'), gen: $('stat-gen'),
      moe: $('stat-moe'),
    },
  };

  /* ---- storage (a browser may refuse it: then nothing is kept) ---- */

  const store = {
    get(k) {
      try { return localStorage.getItem('mlxcel.' + k); } catch (e) { return null; }
    },
    set(k, v) {
      try {
        if (v === null) localStorage.removeItem('mlxcel.' + k);
        else localStorage.setItem('mlxcel.' + k, v);
      } catch (e) { /* private mode: kept for this page only */ }
    },
  };

  const state = {
    messages: [],          /* {role, content, node}: the conversation sent to the model */
    chat: 0,               /* counts new chats: a reply cut by one is not kept */
    busy: false,
    controller: null,
    modelId: null,
    apiKey: store.get('apiKey'),
    defaults: { temperature: 0.7, top_p: 0.95, max_tokens: 512 },
  };

  /* ---- the API key ---- */

  let keyPrompt = null;    /* the open dialog's promise: callers share one */

  /* Shows the key dialog; resolves to the key typed, or null (cancelled). */
  function askKey(message) {
    if (keyPrompt)
      return keyPrompt;
    keyPrompt = new Promise((resolve) => {
      const back = document.activeElement;
      ui.keyMsg.textContent = message;
      ui.keyInput.value = '';
      const done = (key) => {
        ui.keyForm.removeEventListener('submit', onSubmit);
        ui.keyCancel.removeEventListener('click', onCancel);
        ui.keyDialog.removeEventListener('cancel', onCancel);
        if (ui.keyDialog.open) ui.keyDialog.close();
        keyPrompt = null;
        if (back && back.focus) back.focus();
        resolve(key);
      };
      const onSubmit = (e) => {
        e.preventDefault();
        const k = ui.keyInput.value.trim();
        if (k) done(k);
      };
      const onCancel = (e) => {
        e.preventDefault();
        done(null);
      };
      ui.keyForm.addEventListener('submit', onSubmit);
      ui.keyCancel.addEventListener('click', onCancel);
      ui.keyDialog.addEventListener('cancel', onCancel);
      ui.keyDialog.showModal();
      ui.keyInput.focus();
    });
    return keyPrompt;
  }

  function setKey(k) {
    state.apiKey = k;
    store.set('apiKey', k);
    ui.keyState.textContent = k ? 'A key is stored in this browser.' : 'No key stored.';
    ui.forgetKey.disabled = !k;
  }

  /* fetch with the key; a 401 asks for a key and tries again with it. */
  async function api(path, init) {
    init = init || {};
    for (;;) {
      const headers = new Headers(init.headers || {});
      if (state.apiKey)
        headers.set('Authorization', 'Bearer ' + state.apiKey);
      const res = await fetch(path, Object.assign({}, init, { headers }));
      if (res.status !== 401)
        return res;
      const key = await askKey(state.apiKey
        ? 'The server did not accept the stored API key. Enter the key it was started with (--api-key).'
        : 'This server asks for an API key (it was started with --api-key). It is kept in this browser\'s local storage.');
      if (key === null)
        return res;
      setKey(key);
    }
  }

  /* The message of an error response (OpenAI style), or its status. */
  async function errorOf(res) {
    try {
      const j = await res.json();
      if (j && j.error && j.error.message)
        return j.error.message + ' (HTTP ' + res.status + ')';
    } catch (e) { /* not JSON */ }
    return 'HTTP ' + res.status + ' ' + res.statusText;
  }

  /* ---- settings ---- */

  const fields = [['system', ui.system], ['temperature', ui.temperature], ['top_p', ui.topP], ['max_tokens', ui.maxTokens]];

  function loadSettings() {
    for (const [k, input] of fields) {
      const v = store.get('setting.' + k);
      if (v !== null)
        input.value = v;
    }
  }

  function saveSettings() {
    for (const [k, input] of fields)
      store.set('setting.' + k, input.value);
  }

  /* The server's defaults for the fields the user has not set. */
  function applyDefaults(fromUser) {
    const d = state.defaults;
    const pairs = [['temperature', ui.temperature, d.temperature], ['top_p', ui.topP, d.top_p], ['max_tokens', ui.maxTokens, d.max_tokens]];
    for (const [k, input, v] of pairs)
      if (fromUser || store.get('setting.' + k) === null)
        input.value = String(v);
  }

  function number(input, lo, hi, integer) {
    let v = Number(input.value);
    if (!Number.isFinite(v))
      v = Number(input.defaultValue);
    v = Math.min(hi, Math.max(lo, v));
    return integer ? Math.round(v) : v;
  }

  function openSettings(open) {
    ui.settings.classList.toggle('open', open);
    ui.settingsToggle.setAttribute('aria-expanded', String(open));
    if (open) ui.system.focus();
    else ui.settingsToggle.focus();
  }

  /* ---- the conversation ---- */

  function scrollToEnd() {
    ui.log.scrollTop = ui.log.scrollHeight;
  }

  /* A message's element: who, the text, a line for its state. */
  function messageNode(role) {
    const node = document.createElement('article');
    node.className = 'msg ' + role;
    const who = document.createElement('h2');
    who.className = 'who';
    who.textContent = role === 'user' ? 'You' : (state.modelId || 'Assistant');
    const body = document.createElement('div');
    body.className = 'body';
    const note = document.createElement('p');
    note.className = 'note';
    node.append(who, body, note);
    ui.empty.hidden = true;
    ui.log.append(node);
    scrollToEnd();
    return node;
  }

  function addUser(text) {
    const node = messageNode('user');
    node.querySelector('.body').textContent = text;   /* as typed: plain text */
    state.messages.push({ role: 'user', content: text, node });
  }

  /* Renders an assistant message's Markdown (once per frame while it streams). */
  function render(msg) {
    if (msg.pending)
      return;
    msg.pending = true;
    requestAnimationFrame(() => {
      msg.pending = false;
      const body = msg.node.querySelector('.body');
      const stick = ui.log.scrollHeight - ui.log.scrollTop - ui.log.clientHeight < 40;
      body.replaceChildren(window.mlxcelMarkdown.render(msg.content));
      if (stick)
        scrollToEnd();
    });
  }

  function setBusy(busy) {
    state.busy = busy;
    ui.send.hidden = busy;
    ui.stop.hidden = !busy;
    updateRegen();
  }

  function updateRegen() {
    ui.regen.disabled = state.busy || !state.messages.some((m) => m.role === 'user');
  }

  function say(text) {
    ui.status.textContent = text;
  }

  /* ---- statistics ---- */

  const fmt = (v, digits) => v.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });

  function clearStats() {
    for (const k in ui.stat)
      ui.stat[k].textContent = '\u2013';
  }

  /* s: t0 (request sent), tFirst/tLast (first/last text), tokens (text
   * chunks: about one per token), and from the stream's last chunk the
   * usage (token counts) and timings (the server's own seconds), finish.
   * While streaming, the speed is the chunks' rate as they arrive; at the
   * end, the server's (chunks can arrive together when decoding outruns
   * the network). */
  function showStats(s) {
    if (s.tFirst)
      ui.stat.ttft.textContent = fmt(s.tFirst - s.t0, 0) + ' ms';
    const n = s.usage ? s.usage.completion_tokens : s.tokens;
    const dt = (s.tLast - s.tFirst) / 1000;
    const t = s.timings;
    if (t && t.predicted_n > 1 && t.predicted_ms > 0)
      ui.stat.tps.textContent = fmt(t.predicted_per_second, 1) + ' tokens/s';
    else
      ui.stat.tps.textContent = !t && n > 1 && dt > 0 ? fmt((n - 1) / dt, 1) + ' tokens/s' : '\u2013';
    if (t && t.prompt_n > 0 && t.prompt_ms > 0)
      ui.stat.prefill.textContent = fmt(t.prompt_per_second, 1) + ' tokens/s';
    if (s.usage) {
      const cached = s.usage.prompt_tokens_details ? s.usage.prompt_tokens_details.cached_tokens : 0;
      ui.stat.prompt.textContent = s.usage.prompt_tokens + ' tokens' + (cached ? ' (' + cached + ' cached)' : '');
    }
    ui.stat.gen.textContent = n + (n === 1 ? ' token' : ' tokens') + (s.finish ? ' (' + s.finish + ')' : '');
  }

  /* The server's MoE dispatch counts (GET /props), or null. */
  async function moeCounts() {
    try {
      const res = await api('/props');
      if (!res.ok)
        return null;
      const p = await res.json();
      return p.moe_dispatch || null;
    } catch (e) {
      return null;
    }
  }

  function showMoe(before, after) {
    if (!before || !after)
      return;
    const f = after.fused - before.fused, g = after.gather - before.gather;
    ui.stat.moe.textContent = f || g ? 'fused ' + f + ' \u00b7 gather ' + g + ' blocks'
                                     : after.fused_enabled ? 'none ran' : 'gather (fused off)';
  }

  /* ---- streaming ---- */

  /* The data of each server-sent event of a response, as it arrives. */
  async function* events(res) {
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done)
        break;
      buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k);
        buf = buf.slice(k + 2);
        const data = ev.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, ''));
        if (data.length)
          yield data.join('\n');
      }
    }
  }

  function requestMessages() {
    const out = [];
    const sys = ui.system.value.trim();
    if (sys)
      out.push({ role: 'system', content: sys });
    for (const m of state.messages)
      out.push({ role: m.role, content: m.content });
    return out;
  }

  /* Streams the assistant's answer to the conversation so far. */
  async function generate() {
    const body = {
      messages: requestMessages(),
      stream: true,
      stream_options: { include_usage: true },
      temperature: number(ui.temperature, 0, 100, false),
      top_p: number(ui.topP, 0, 1, false),
      max_tokens: number(ui.maxTokens, 1, Number(ui.maxTokens.max) || 1e9, true),
    };
    if (state.modelId)
      body.model = state.modelId;
    const msg = { role: 'assistant', content: '', node: messageNode('assistant') };
    msg.node.setAttribute('aria-busy', 'true');
    const ctl = new AbortController();
    const chat = state.chat;
    state.controller = ctl;
    setBusy(true);
    clearStats();
    say('Generating\u2026');
    const before = await moeCounts();
    const s = { t0: performance.now(), tFirst: 0, tLast: 0, tokens: 0, usage: null, timings: null, finish: null };
    let error = null;
    try {
      const res = await api('/v1/chat/completions', {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: ctl.signal,
      });
      if (!res.ok)
        throw new Error(await errorOf(res));
      for await (const data of events(res)) {
        if (data === '[DONE]')
          break;
        const j = JSON.parse(data);
        if (j.error)
          throw new Error(j.error.message || 'the server reported an error');
        if (j.usage)
          s.usage = j.usage;
        if (j.timings)
          s.timings = j.timings;
        const c = j.choices && j.choices[0];
        if (c && c.delta && c.delta.content) {
          const now = performance.now();
          if (!s.tFirst)
            s.tFirst = now;
          s.tLast = now;
          s.tokens++;
          msg.content += c.delta.content;
          render(msg);
        }
        if (c && c.finish_reason)
          s.finish = c.finish_reason;
        showStats(s);
      }
    } catch (e) {
      if (e.name === 'AbortError')
        s.finish = 'stopped';
      else
        error = e.message || String(e);
    }
    state.controller = null;
    if (chat !== state.chat) {
      /* "New chat" was pressed during the reply */
      msg.node.remove();
      setBusy(false);
      return;
    }
    msg.node.removeAttribute('aria-busy');
    const note = msg.node.querySelector('.note');
    if (s.finish === 'stopped') {
      note.textContent = 'Stopped.';
      msg.node.classList.add('stopped');
    } else if (error) {
      note.textContent = 'Error: ' + error;
      msg.node.classList.add('error');
    } else if (s.finish === 'length') {
      note.textContent = 'Cut at the max tokens setting.';
    }
    /* a reply that produced text stays in the conversation, even if cut */
    if (msg.content)
      state.messages.push(msg);
    else if (!error)
      msg.node.querySelector('.body').textContent = '(no text)';
    render(msg);
    showStats(s);
    showMoe(before, await moeCounts());
    setBusy(false);
    say(error ? 'Error: ' + error
      : (s.finish === 'stopped' ? 'Stopped after ' : 'Reply done: ') + ui.stat.gen.textContent + ', ' + ui.stat.tps.textContent + '.');
  }

  /* ---- actions ---- */

  function send() {
    const text = ui.prompt.value;
    if (state.busy || !text.trim())
      return;
    ui.prompt.value = '';
    dropErrors();
    addUser(text);
    generate();
  }

  function stop() {
    if (state.controller)
      state.controller.abort();
  }

  /* Failed replies are shown until the next message (they are not part of
   * the conversation). */
  function dropErrors() {
    for (const n of ui.log.querySelectorAll('.msg.error'))
      if (!state.messages.some((m) => m.node === n))
        n.remove();
  }

  function regenerate() {
    if (state.busy)
      return;
    const last = state.messages[state.messages.length - 1];
    if (last && last.role === 'assistant') {
      state.messages.pop();
      last.node.remove();
    }
    dropErrors();
    if (state.messages.length)
      generate();
  }

  function newChat() {
    stop();
    state.chat++;
    state.messages = [];
    for (const n of ui.log.querySelectorAll('.msg'))
      n.remove();
    ui.empty.hidden = false;
    clearStats();
    updateRegen();
    say('New chat.');
    ui.prompt.focus();
  }

  async function copyCode(button) {
    const code = button.closest('.code').querySelector('code');
    try {
      await navigator.clipboard.writeText(code.textContent);
      button.textContent = 'Copied';
    } catch (e) {
      button.textContent = 'Copy failed';
    }
    setTimeout(() => { button.textContent = 'Copy'; }, 1500);
  }

  /* ---- start ---- */

  async function connect() {
    try {
      const res = await api('/v1/models');
      if (!res.ok) {
        ui.model.textContent = 'server: ' + (await errorOf(res));
        return;
      }
      const j = await res.json();
      state.modelId = j.data && j.data[0] ? j.data[0].id : null;
      ui.model.textContent = state.modelId || 'no model';
      document.title = (state.modelId ? state.modelId + ' \u00b7 ' : '') + 'mlxcel chat';
      const p = await api('/props');
      if (p.ok) {
        const props = await p.json();
        const g = props.default_generation_settings || {};
        const d = g.params || {};
        if (typeof d.temperature === 'number') state.defaults.temperature = Math.round(d.temperature * 1000) / 1000;
        if (typeof d.top_p === 'number') state.defaults.top_p = Math.round(d.top_p * 1000) / 1000;
        if (typeof d.n_predict === 'number') state.defaults.max_tokens = d.n_predict;
        if (typeof props.n_ctx === 'number') ui.maxTokens.max = String(props.n_ctx);
        applyDefaults(false);
      }
    } catch (e) {
      ui.model.textContent = 'cannot reach the server: ' + e.message;
    }
  }

  ui.composer.addEventListener('submit', (e) => {
    e.preventDefault();
    send();
  });
  ui.prompt.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    } else if (e.key === 'Escape' && state.busy) {
      e.preventDefault();
      stop();
    }
  });
  ui.stop.addEventListener('click', () => {
    stop();
    ui.prompt.focus();
  });
  ui.regen.addEventListener('click', regenerate);
  ui.newChat.addEventListener('click', newChat);
  ui.settingsToggle.addEventListener('click', () => openSettings(!ui.settings.classList.contains('open')));
  ui.settingsClose.addEventListener('click', () => openSettings(false));
  ui.settings.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && ui.settings.classList.contains('open'))
      openSettings(false);
  });
  ui.settings.addEventListener('change', saveSettings);
  ui.settings.addEventListener('submit', (e) => e.preventDefault());
  ui.resetSettings.addEventListener('click', () => {
    applyDefaults(true);
    saveSettings();
    say('Settings reset to the server\'s defaults.');
  });
  ui.changeKey.addEventListener('click', async () => {
    const k = await askKey('Enter the API key the server was started with (--api-key). It is kept in this browser\'s local storage.');
    if (k !== null) {
      setKey(k);
      connect();
    }
  });
  ui.forgetKey.addEventListener('click', () => {
    setKey(null);
    say('The API key was removed from this browser.');
  });
  ui.log.addEventListener('click', (e) => {
    const b = e.target.closest('button.copy');
    if (b)
      copyCode(b);
  });

  loadSettings();
  setKey(state.apiKey);
  clearStats();
  updateRegen();
  connect();
})();
