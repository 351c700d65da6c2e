/* markdown.js - the chat page's Markdown renderer (webui/README.md says why
 * it is our own).  It builds DOM nodes, never HTML text: whatever the model
 * writes can only become text nodes inside a fixed set of elements (p, h1-h6,
 * ul/ol/li, blockquote, pre/code, table, strong, em, del, a, br, hr), so
 * HTML in a reply is shown as the characters it is made of.  Links are kept
 * only for http:, https: and mailto: addresses.
 *
 * What it reads: ``` and ~~~ fences (an unclosed one runs to the end, as a
 * reply being streamed has it), # headings, rules (--- or *** or ___), > quotes,
 * - * + and 1. 1) lists (nested by indentation), GitHub tables, paragraphs
 * (a single newline is a line break), and inline `code`, **strong**,
 * __strong__, *em*, _em_, ~~del~~, [text](url), <url> and \ escapes.
 *
 * window.mlxcelMarkdown.render(text) returns a DocumentFragment. */
'use strict';
(function () {
  function el(tag, kids, cls) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (kids) e.append(...kids);
    return e;
  }

  /* ---- blocks ---- */

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
  const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
  const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const QUOTE = /^ {0,3}>[ ]?(.*)$/;
  const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])([ \t]+|$)(.*)$/;
  const TABLE_RULE = /^[ \t]*\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;

  const blank = (l) => !l.trim();
  const leading = (l) => l.length - l.trimStart().length;
  const ordered = (m) => /\d/.test(m[2]);

  /* A line that ends a paragraph: a fence, heading, rule, quote, or a list
   * item (an ordered one only when it starts at 1, so that "2024. was" in
   * running text stays text). */
  function interrupts(l) {
    if (FENCE.test(l) || HEADING.test(l) || RULE.test(l) || QUOTE.test(l))
      return true;
    const m = ITEM.exec(l);
    return !!m && m[4].trim() !== '' && (!ordered(m) || parseInt(m[2], 10) === 1);
  }

  function blocks(lines, parent) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (blank(line)) {
        i++;
      } else if ((m = FENCE.exec(line))) {
        i = fence(lines, i, m, parent);
      } else if ((m = HEADING.exec(line))) {
        parent.append(el('h' + m[1].length, inline(m[2] || '')));
        i++;
      } else if (RULE.test(line)) {
        parent.append(el('hr'));
        i++;
      } else if (QUOTE.test(line)) {
        const inner = [];
        while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
          inner.push(m[1]);
          i++;
        }
        const q = el('blockquote');
        blocks(inner, q);
        parent.append(q);
      } else if (ITEM.test(line)) {
        i = list(lines, i, parent);
      } else if (tableStart(lines, i)) {
        i = table(lines, i, parent);
      } else {
        i = paragraph(lines, i, parent);
      }
    }
  }

  function fence(lines, i, m, parent) {
    const mark = m[1];
    const close = new RegExp('^ {0,3}' + (mark[0] === '`' ? '`' : '~') + '{' + mark.length + ',}[ \\t]*$');
    const body = [];
    for (i++; i < lines.length && !close.test(lines[i]); i++)
      body.push(lines[i]);
    parent.append(codeBlock(body.join('\n'), m[2]));
    return i + 1;
  }

  /* A code block with its language (when given) and a copy button (the
   * page's script gives it its action). */
  function codeBlock(text, lang) {
    const code = el('code', [text]);
    lang = lang.replace(/[^\w+#.-]/g, '').slice(0, 32);
    if (lang)
      code.className = 'language-' + lang.replace(/[^\w-]/g, '');
    const copy = el('button', ['Copy'], 'copy');
    copy.type = 'button';
    copy.setAttribute('aria-label', 'Copy the code' + (lang ? ' (' + lang + ')' : ''));
    const head = el('div', [el('span', [lang || 'code'], 'lang'), copy], 'code-head');
    return el('div', [head, el('pre', [code])], 'code');
  }

  function list(lines, i, parent) {
    const first = ITEM.exec(lines[i]);
    const isOrdered = ordered(first);
    const e = el(isOrdered ? 'ol' : 'ul');
    if (isOrdered && parseInt(first[2], 10) !== 1)
      e.start = parseInt(first[2], 10);
    while (i < lines.length) {
      if (blank(lines[i])) {
        /* blank lines between two items of the same list */
        let j = i;
        while (j < lines.length && blank(lines[j]))
          j++;
        const n = j < lines.length && ITEM.exec(lines[j]);
        if (!n || leading(lines[j]) > 3 || ordered(n) !== isOrdered)
          break;
        i = j;
      }
      const m = ITEM.exec(lines[i]);
      if (!m || ordered(m) !== isOrdered)
        break;
      const indent = m[1].length + m[2].length + Math.max(1, Math.min(m[3].length, 4));
      const body = [m[4]];
      for (i++; i < lines.length; i++) {
        const l = lines[i];
        if (blank(l)) {
          /* the item goes on after blank lines only if they are followed
           * by an indented line */
          let j = i;
          while (j < lines.length && blank(lines[j]))
            j++;
          if (j >= lines.length || leading(lines[j]) < Math.min(indent, 2))
            break;
          for (; i < j; i++)
            body.push('');
          i--;
          continue;
        }
        const lead = leading(l);
        if (lead >= 2 || lead >= indent) {
          body.push(l.slice(Math.min(lead, indent)));
        } else if (ITEM.test(l) || interrupts(l)) {
          break;
        } else {
          body.push(l);      /* a lazy continuation of the item's text */
        }
      }
      const li = el('li');
      blocks(body, li);
      e.append(li);
    }
    parent.append(e);
    return i;
  }

  /* The cells of a table row ("| a | b |" or "a | b"); \| is a literal bar. */
  function cells(l) {
    let s = l.trim();
    if (s.startsWith('|'))
      s = s.slice(1);
    if (s.endsWith('|') && !s.endsWith('\\|'))
      s = s.slice(0, -1);
    const out = [];
    let cur = '';
    for (let k = 0; k < s.length; k++) {
      if (s[k] === '\\' && s[k + 1] === '|') {
        cur += '|';
        k++;
      } else if (s[k] === '|') {
        out.push(cur.trim());
        cur = '';
      } else {
        cur += s[k];
      }
    }
    out.push(cur.trim());
    return out;
  }

  function tableStart(lines, i) {
    return i + 1 < lines.length && lines[i].includes('|') && lines[i + 1].includes('|') &&
           TABLE_RULE.test(lines[i + 1]) && cells(lines[i]).length === cells(lines[i + 1]).length;
  }

  function table(lines, i, parent) {
    const head = cells(lines[i]);
    const align = cells(lines[i + 1]).map((c) =>
      c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : c.startsWith(':') ? 'left' : '');
    const row = (tag, cs) => el('tr', head.map((_, k) => el(tag, inline(cs[k] || ''), align[k] ? 'align-' + align[k] : '')));
    const tbody = el('tbody');
    for (i += 2; i < lines.length && !blank(lines[i]) && lines[i].includes('|'); i++)
      tbody.append(row('td', cells(lines[i])));
    const t = el('table', [el('thead', [row('th', head)]), tbody]);
    parent.append(el('div', [t], 'table-wrap'));
    return i;
  }

  function paragraph(lines, i, parent) {
    const text = [lines[i++]];
    while (i < lines.length && !blank(lines[i]) && !interrupts(lines[i]) && !tableStart(lines, i))
      text.push(lines[i++]);
    parent.append(el('p', inline(text.join('\n'))));
    return i;
  }

  /* ---- inline ---- */

  const PUNCT = /[!-/:-@[-`{-~]/;
  const SAFE_URL = /^(https?:\/\/|mailto:)[^\s]*$/i;
  const EMPH = [['**', 'strong'], ['__', 'strong'], ['~~', 'del'], ['*', 'em'], ['_', 'em']];
  const word = (c) => !!c && /[\p{L}\p{N}]/u.test(c);
  const space = (c) => !c || /\s/.test(c);

  /* Where the delimiter d opened at `from` closes in s, or -1: the closer
   * follows a non-space, and an underscore one is not inside a word. */
  function closer(s, d, from) {
    for (let k = s.indexOf(d, from); k >= 0; k = s.indexOf(d, k + 1)) {
      if (k === from || space(s[k - 1]))
        continue;
      if (d[0] === '_' && word(s[k + d.length]))
        continue;
      if (d.length === 1 && s[k + 1] === d)
        continue;              /* a single * does not close on ** */
      return k;
    }
    return -1;
  }

  /* A link [text](url "title") at s[i] === '['; returns [node, end] or null. */
  function link(s, i) {
    let depth = 0, k = i;
    for (; k < s.length; k++) {
      if (s[k] === '\\') {
        k++;
      } else if (s[k] === '[') {
        depth++;
      } else if (s[k] === ']' && --depth === 0) {
        break;
      }
    }
    if (k >= s.length || s[k + 1] !== '(')
      return null;
    const m = /^\(\s*<?([^\s()<>]*)>?(?:\s+"[^"]*")?\s*\)/.exec(s.slice(k + 1));
    if (!m)
      return null;
    const label = inline(s.slice(i + 1, k));
    const end = k + 1 + m[0].length;
    if (!SAFE_URL.test(m[1]))
      return [label, end];   /* the text without the link */
    return [[anchor(m[1], label)], end];
  }

  function anchor(url, kids) {
    const a = el('a', kids);
    a.href = url;
    a.rel = 'noopener noreferrer';
    a.target = '_blank';
    return a;
  }

  function inline(s) {
    const out = [];
    let text = '';
    const flush = () => {
      if (text)
        out.push(document.createTextNode(text));
      text = '';
    };
    for (let i = 0; i < s.length;) {
      const c = s[i];
      if (c === '\\' && PUNCT.test(s[i + 1] || '')) {
        text += s[i + 1];
        i += 2;
        continue;
      }
      if (c === '\n') {
        flush();
        out.push(el('br'));
        i++;
        continue;
      }
      if (c === '`') {
        let n = 0;
        while (s[i + n] === '`')
          n++;
        const run = '`'.repeat(n);
        let k = s.indexOf(run, i + n);
        while (k >= 0 && s[k + n] === '`') {
          /* a longer run is not the closer: skip past it */
          let e = k;
          while (s[e] === '`')
            e++;
          k = s.indexOf(run, e);
        }
        if (k < 0) {
          text += run;
          i += n;
          continue;
        }
        let code = s.slice(i + n, k).replace(/\n/g, ' ');
        if (code.length > 2 && code[0] === ' ' && code[code.length - 1] === ' ')
          code = code.slice(1, -1);
        flush();
        out.push(el('code', [code]));
        i = k + n;
        continue;
      }
      if (c === '[' || (c === '!' && s[i + 1] === '[')) {
        /* an image is shown as its link: the page loads nothing from a reply */
        const r = link(s, c === '!' ? i + 1 : i);
        if (r) {
          flush();
          out.push(...r[0]);
          i = r[1];
          continue;
        }
      }
      if (c === '<') {
        const m = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/i.exec(s.slice(i));
        if (m) {
          flush();
          out.push(anchor(m[1], [m[1]]));
          i += m[0].length;
          continue;
        }
      }
      const em = EMPH.find(([d]) => s.startsWith(d, i));
      if (em && !space(s[i + em[0].length]) && !(em[0][0] === '_' && word(s[i - 1]))) {
        const k = closer(s, em[0], i + em[0].length);
        if (k > i + em[0].length) {
          flush();
          out.push(el(em[1], inline(s.slice(i + em[0].length, k))));
          i = k + em[0].length;
          continue;
        }
      }
      text += em ? em[0] : c;
      i += em ? em[0].length : 1;
    }
    flush();
    return out;
  }

  function render(src) {
    const frag = document.createDocumentFragment();
    blocks(String(src).replace(/\r\n?/g, '\n').split('\n'), frag);
    return frag;
  }

  window.mlxcelMarkdown = { render };
})();
