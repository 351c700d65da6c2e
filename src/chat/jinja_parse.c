/* jinja_parse.c - lexer and recursive-descent parser for the Jinja subset.
 *
 * The lexer follows jinja2's with trim_blocks and lstrip_blocks on:
 *   - newlines are normalised to \n and one trailing newline is dropped;
 *   - `{%-` / `{{-` / `{#-` strip all whitespace before the tag, `-%}` etc.
 *     all whitespace after it;
 *   - a block or comment tag that is alone on its line (only spaces or tabs
 *     before it) loses that indentation, unless opened with `{%+`;
 *   - one newline right after `%}` or `#}` is dropped, unless closed `+%}`.
 * The parser builds the AST of jinja_int.h with jinja2's precedence:
 * conditional < or < and < not < comparison < + - < ~ < * / // % < ** <
 * unary minus < postfix (. [] ()) < filters and tests. */
#include "chat/jinja_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct jtok {
    int t;
    int line;
    const char *p;   /* raw text (names, operators) */
    size_t n;
    jv val;          /* strings and numbers */
} jtok;

typedef struct lexer {
    jstate *st;
    const char *s;
    size_t n, pos;
    int line;
    jtok *toks;
    size_t ntok, cap;
} lexer;

static void push(lexer *L, int t, int line, const char *p, size_t n, jv val)
{
    if (L->ntok == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *nt = ja_alloc(L->st, cap * sizeof *nt);
        if (L->ntok)
            memcpy(nt, L->toks, L->ntok * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    L->toks[L->ntok++] = (jtok){t, line, p, n, val};
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
           (c >= 0x1c && c <= 0x1f);
}

/* Byte length of the whitespace code point (Python's \s) at p[i], or 0. */
static size_t ws_at(const char *p, size_t n, size_t i)
{
    if (i >= n)
        return 0;
    if (is_ws(p[i]))
        return 1;
    if ((unsigned char)p[i] < 0x80)
        return 0;
    uint32_t cp;
    size_t j = ju_next(p, n, i, &cp);
    return (j - i > 1 && ju_isspace(cp)) ? j - i : 0;
}

/* Length of the whitespace code point ending at p[n-1], or 0. */
static size_t ws_before(const char *p, size_t n)
{
    if (n == 0)
        return 0;
    if (is_ws(p[n - 1]))
        return 1;
    for (size_t k = 2; k <= 3 && k <= n; k++)
        if (ws_at(p, n, n - k) == k)
            return k;
    return 0;
}

static size_t skip_ws(lexer *L, size_t at)
{
    size_t k;
    while ((k = ws_at(L->s, L->n, at)) > 0) {
        L->line += L->s[at] == '\n';
        at += k;
    }
    return at;
}

static int count_nl(const char *p, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == '\n';
    return k;
}

/* Emits text, applying the strip rules of the tag that follows it. */
static void emit_text(lexer *L, const char *p, size_t n, int line, char sign, int lstrip_ok,
                      int line_starting)
{
    if (sign == '-') {
        size_t k;
        while ((k = ws_before(p, n)) > 0)
            n -= k;
    } else if (sign != '+' && lstrip_ok) {
        size_t l = n;
        while (l > 0 && p[l - 1] != '\n')
            l--;
        if ((l > 0 || line_starting) && l < n) {
            size_t i = l, k;
            while ((k = ws_at(p, n, i)) > 0)
                i += k;
            if (i == n)
                n = l;
        }
    }
    if (n)
        push(L, T_TEXT, line, p, n, jv_strn(p, n));
}

/* After a closing `%}` / `#}` (or raw end): the strip rules for what follows.
 * `at` points just past the closing delimiter; sign is the char before it. */
static size_t after_close(lexer *L, size_t at, char sign, int *line_starting)
{
    const char *s = L->s;
    if (sign == '-') {
        at = skip_ws(L, at);
    } else if (sign != '+' && at < L->n && s[at] == '\n') {
        L->line++;
        at++;
    }
    *line_starting = at > 0 && s[at - 1] == '\n';
    return at;
}

/* Python string-literal escapes (jinja decodes with unicode-escape). */
static jv unescape(lexer *L, const char *p, size_t n)
{
    jbuf b = {0};
    b.limit = JJ_MAX_OUTPUT;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c != '\\' || i + 1 >= n) {
            jb_putc(L->st, &b, c);
            continue;
        }
        char e = p[++i];
        uint32_t cp = 0;
        int digits = 0;
        switch (e) {
        case '\n': break;   /* line continuation */
        case '\\': jb_putc(L->st, &b, '\\'); break;
        case '\'': jb_putc(L->st, &b, '\''); break;
        case '"': jb_putc(L->st, &b, '"'); break;
        case 'a': jb_putc(L->st, &b, '\a'); break;
        case 'b': jb_putc(L->st, &b, '\b'); break;
        case 'f': jb_putc(L->st, &b, '\f'); break;
        case 'n': jb_putc(L->st, &b, '\n'); break;
        case 'r': jb_putc(L->st, &b, '\r'); break;
        case 't': jb_putc(L->st, &b, '\t'); break;
        case 'v': jb_putc(L->st, &b, '\v'); break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                int k = 0;
                while (k < 3 && i < n && p[i] >= '0' && p[i] <= '7') {
                    cp = cp * 8 + (uint32_t)(p[i] - '0');
                    i++;
                    k++;
                }
                i--;
                ju_put(L->st, &b, cp);
            } else {   /* unknown escapes stay as written */
                jb_putc(L->st, &b, '\\');
                jb_putc(L->st, &b, e);
            }
        }
        if (digits) {
            for (int k = 0; k < digits; k++) {
                char h = i + 1 < n ? p[i + 1] : 0;
                int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (v < 0)
                    jfail(L->st, L->line, "truncated \\%c escape in string literal", e);
                cp = cp * 16 + (uint32_t)v;
                i++;
            }
            if (cp > 0x10ffff)
                jfail(L->st, L->line, "illegal Unicode character in string literal");
            ju_put(L->st, &b, cp);
        }
    }
    return jv_strn(b.p ? b.p : "", b.n);
}

static const char *const OPS2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char OPS1[] = "+-/*%~[](){}><=.:|,;";

/* Lexes the inside of {{ }} / {% %} up to the matching end. */
static size_t lex_tag(lexer *L, size_t i, int is_block, int *line_starting)
{
    const char *s = L->s;
    int depth = 0;
    for (;;) {
        while (i < L->n && is_ws(s[i])) {
            L->line += s[i] == '\n';
            i++;
        }
        if (i >= L->n)
            jfail(L->st, L->line, "unexpected end of template, expected '%s'",
                  is_block ? "end of statement block" : "end of print statement");
        if (depth == 0) {
            if (is_block) {
                char sign = 0;
                size_t j = i;
                if ((s[j] == '-' || s[j] == '+') && j + 2 < L->n && s[j + 1] == '%' &&
                    s[j + 2] == '}')
                    sign = s[j++];
                if (j + 1 < L->n && s[j] == '%' && s[j + 1] == '}') {
                    push(L, T_BEND, L->line, s + i, 0, jv_none());
                    return after_close(L, j + 2, sign, line_starting);
                }
            } else {
                size_t j = i;
                int strip = 0;
                if (s[j] == '-' && j + 2 < L->n && s[j + 1] == '}' && s[j + 2] == '}') {
                    strip = 1;
                    j++;
                }
                if (j + 1 < L->n && s[j] == '}' && s[j + 1] == '}') {
                    push(L, T_VEND, L->line, s + i, 0, jv_none());
                    j += 2;
                    if (strip)
                        j = skip_ws(L, j);
                    *line_starting = s[j - 1] == '\n';
                    return j;
                }
            }
        }
        char c = s[i];
        size_t st = i;
        if (isdigit((unsigned char)c)) {
            int is_float = 0;
            while (i < L->n && (isdigit((unsigned char)s[i]) || (s[i] == '_' && i + 1 < L->n &&
                                isdigit((unsigned char)s[i + 1]))))
                i++;
            int after_dot = st > 0 && s[st - 1] == '.';
            if (!after_dot && i + 1 < L->n && s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
                is_float = 1;
                i++;
                while (i < L->n && (isdigit((unsigned char)s[i]) || s[i] == '_'))
                    i++;
            }
            if (!after_dot && i < L->n && (s[i] == 'e' || s[i] == 'E')) {
                size_t k = i + 1;
                if (k < L->n && (s[k] == '+' || s[k] == '-'))
                    k++;
                if (k < L->n && isdigit((unsigned char)s[k])) {
                    is_float = 1;
                    i = k;
                    while (i < L->n && (isdigit((unsigned char)s[i]) || s[i] == '_'))
                        i++;
                }
            }
            char num[64];
            size_t m = 0;
            for (size_t k = st; k < i && m < sizeof num - 1; k++)
                if (s[k] != '_')
                    num[m++] = s[k];
            num[m] = 0;
            if (is_float) {
                push(L, T_FLOAT, L->line, s + st, i - st, jv_float(strtod(num, NULL)));
            } else {
                errno = 0;
                long long v = strtoll(num, NULL, 10);
                if (errno)
                    jfail(L->st, L->line, "integer literal %s is too large", num);
                push(L, T_INT, L->line, s + st, i - st, jv_int(v));
            }
            continue;
        }
        if (isalpha((unsigned char)c) || c == '_') {
            while (i < L->n && (isalnum((unsigned char)s[i]) || s[i] == '_'))
                i++;
            push(L, T_NAME, L->line, s + st, i - st, jv_none());
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t k = i + 1;
            int line0 = L->line;
            while (k < L->n && s[k] != c) {
                if (s[k] == '\\' && k + 1 < L->n)
                    k++;
                k++;
            }
            if (k >= L->n)
                jfail(L->st, L->line, "unterminated string literal");
            L->line += count_nl(s + i, k - i);
            push(L, T_STRING, line0, s + st, k + 1 - st, unescape(L, s + i + 1, k - i - 1));
            i = k + 1;
            continue;
        }
        size_t oplen = 0;
        for (int k = 0; OPS2[k]; k++)
            if (i + 1 < L->n && s[i] == OPS2[k][0] && s[i + 1] == OPS2[k][1])
                oplen = 2;
        if (!oplen && strchr(OPS1, c) && c)
            oplen = 1;
        if (!oplen)
            jfail(L->st, L->line, "unexpected char '%c'", c);
        if (c == '(' || c == '[' || c == '{')
            depth++;
        else if (c == ')' || c == ']' || c == '}') {
            if (depth == 0)
                jfail(L->st, L->line, "unexpected '%c'", c);
            depth--;
        }
        push(L, T_OP, L->line, s + i, oplen, jv_none());
        i += oplen;
    }
}

/* `{% raw %}` ... `{% endraw %}`: returns the position after the end tag,
 * or 0 if the block tag at i is not a raw begin. */
static size_t try_raw(lexer *L, size_t i, int *line_starting, int line_text, const char *text,
                      size_t ntext, char sign)
{
    const char *s = L->s;
    size_t j = i + 2 + (sign ? 1 : 0);
    while (j < L->n && is_ws(s[j]))
        j++;
    if (L->n - j < 3 || memcmp(s + j, "raw", 3) != 0)
        return 0;
    j += 3;
    if (j < L->n && (isalnum((unsigned char)s[j]) || s[j] == '_'))
        return 0;
    while (j < L->n && is_ws(s[j]))
        j++;
    int strip_after = 0;
    if (j < L->n && s[j] == '-') {
        strip_after = 1;
        j++;
    }
    if (j + 1 >= L->n || s[j] != '%' || s[j + 1] != '}')
        return 0;
    j += 2;
    emit_text(L, text, ntext, line_text, sign, 1, *line_starting);
    L->line += count_nl(s + i, j - i);
    if (strip_after)
        j = skip_ws(L, j);
    int ls = s[j - 1] == '\n';
    /* find {%[-+]? endraw [-+]?%} */
    for (size_t k = j; k + 1 < L->n; k++) {
        if (s[k] != '{' || s[k + 1] != '%')
            continue;
        size_t m = k + 2;
        char esign = 0;
        if (m < L->n && (s[m] == '-' || s[m] == '+'))
            esign = s[m++];
        while (m < L->n && is_ws(s[m]))
            m++;
        if (L->n - m < 6 || memcmp(s + m, "endraw", 6) != 0)
            continue;
        m += 6;
        while (m < L->n && is_ws(s[m]))
            m++;
        char csign = 0;
        if (m < L->n && (s[m] == '-' || s[m] == '+'))
            csign = s[m++];
        if (m + 1 >= L->n || s[m] != '%' || s[m + 1] != '}')
            continue;
        int line0 = L->line;
        emit_text(L, s + j, k - j, line0, esign, 1, ls);
        L->line += count_nl(s + j, m + 2 - j);
        return after_close(L, m + 2, csign, line_starting);
    }
    jfail(L->st, L->line, "missing end of raw directive");
}

static void lex(lexer *L)
{
    const char *s = L->s;
    size_t pos = 0;
    int line_starting = 1;
    L->line = 1;
    while (pos < L->n) {
        size_t i = pos;
        while (i + 1 < L->n && !(s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' ||
                                                  s[i + 1] == '#')))
            i++;
        if (i + 1 >= L->n) {
            push(L, T_TEXT, L->line, s + pos, L->n - pos, jv_strn(s + pos, L->n - pos));
            return;
        }
        const char *text = s + pos;
        size_t ntext = i - pos;
        int line_text = L->line;
        L->line += count_nl(text, ntext);
        char kind = s[i + 1];
        char sign = (i + 2 < L->n && (s[i + 2] == '-' || s[i + 2] == '+')) ? s[i + 2] : 0;
        if (kind == '%') {
            size_t r = try_raw(L, i, &line_starting, line_text, text, ntext, sign);
            if (r) {
                pos = r;
                continue;
            }
        }
        emit_text(L, text, ntext, line_text, sign, kind != '{', line_starting);
        size_t j = i + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t k = j;
            while (k + 1 < L->n && !(s[k] == '#' && s[k + 1] == '}'))
                k++;
            if (k + 1 >= L->n)
                jfail(L->st, L->line, "missing end of comment tag");
            char csign = (k > j && (s[k - 1] == '-' || s[k - 1] == '+')) ? s[k - 1] : 0;
            L->line += count_nl(s + j, k - j);
            pos = after_close(L, k + 2, csign, &line_starting);
            continue;
        }
        push(L, kind == '%' ? T_BBEGIN : T_VBEGIN, L->line, s + i, 2, jv_none());
        pos = lex_tag(L, j, kind == '%', &line_starting);
    }
}

/* ------------------------------------------------------------------ parser */

typedef struct parser {
    jstate *st;
    jtok *t;
    size_t n, i;
    int depth;
} parser;

static jtok *cur(parser *P) { return &P->t[P->i]; }

static int is_name(parser *P, const char *s)
{
    jtok *t = cur(P);
    return t->t == T_NAME && t->n == strlen(s) && memcmp(t->p, s, t->n) == 0;
}

static int is_op(parser *P, const char *s)
{
    jtok *t = cur(P);
    return t->t == T_OP && t->n == strlen(s) && memcmp(t->p, s, t->n) == 0;
}

static const char *tok_desc(jtok *t)
{
    switch (t->t) {
    case T_VEND: return "end of print statement";
    case T_BEND: return "end of statement block";
    case T_EOF: return "end of template";
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    case T_TEXT: return "template data";
    default: return "token";
    }
}

static _Noreturn void unexpected(parser *P, const char *what)
{
    jtok *t = cur(P);
    if (t->t == T_NAME || t->t == T_OP)
        jfail(P->st, t->line, "expected %s, got '%.*s'", what, (int)t->n, t->p);
    jfail(P->st, t->line, "expected %s, got %s", what, tok_desc(t));
}

static void expect_op(parser *P, const char *s)
{
    if (!is_op(P, s)) {
        char w[32];
        snprintf(w, sizeof w, "'%s'", s);
        unexpected(P, w);
    }
    P->i++;
}

static const char *expect_name(parser *P)
{
    if (cur(P)->t != T_NAME)
        unexpected(P, "a name");
    jtok *t = &P->t[P->i++];
    return ja_strndup(P->st, t->p, t->n);
}

static void expect_block_end(parser *P)
{
    if (cur(P)->t != T_BEND)
        unexpected(P, "end of statement block");
    P->i++;
}

static jnode *mk(parser *P, int kind)
{
    jnode *n = ja_alloc(P->st, sizeof *n);
    n->kind = kind;
    n->line = cur(P)->line;
    return n;
}

/* growable node list */
typedef struct nlist {
    jnode **v;
    size_t n, cap;
} nlist;

static void nl_push(jstate *st, nlist *l, jnode *x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        jnode **v = ja_alloc(st, cap * sizeof *v);
        if (l->n)
            memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

typedef struct slist {
    const char **v;
    size_t n, cap;
} slist;

static void sl_push(jstate *st, slist *l, const char *x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        const char **v = ja_alloc(st, cap * sizeof *v);
        if (l->n)
            memcpy(v, l->v, l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

static jnode *parse_expr(parser *P);
static jnode *parse_or(parser *P);
static jnode *parse_unary(parser *P, int with_filter);
static jnode *parse_primary(parser *P);
static jnode *parse_postfix(parser *P, jnode *n);

static void enter(parser *P)
{
    if (++P->depth > JJ_MAX_DEPTH)
        jfail(P->st, cur(P)->line, "template nested too deeply");
}

/* a, b, c -> tuple (when more than one or a trailing comma) */
static jnode *parse_tuple(parser *P, int with_condexpr, int explicit_parens)
{
    int line = cur(P)->line;
    nlist items = {0};
    int trailing = 0;
    for (;;) {
        if (items.n) {
            if (!is_op(P, ","))
                break;
            P->i++;
            trailing = 1;
        }
        /* stop where a tuple can end */
        jtok *t = cur(P);
        if (t->t == T_VEND || t->t == T_BEND || is_op(P, ")") || is_name(P, "in") ||
            is_name(P, "if") || is_name(P, "recursive") || is_op(P, "="))
            break;
        if (!items.n && explicit_parens && is_op(P, ")"))
            break;
        nl_push(P->st, &items, with_condexpr ? parse_expr(P) : parse_or(P));
        trailing = 0;
    }
    if (items.n == 1 && !trailing)
        return items.v[0];
    if (!items.n && !explicit_parens)
        unexpected(P, "an expression");
    jnode *n = ja_alloc(P->st, sizeof *n);
    n->kind = N_TUPLELIT;
    n->line = line;
    n->items = items.v;
    n->nitems = items.n;
    return n;
}

static void parse_call_args(parser *P, jnode *n)
{
    expect_op(P, "(");
    nlist args = {0}, kwv = {0};
    slist kwn = {0};
    while (!is_op(P, ")")) {
        if (args.n || kwn.n)
            expect_op(P, ",");
        if (is_op(P, ")"))
            break;
        if (cur(P)->t == T_NAME && P->i + 1 < P->n && P->t[P->i + 1].t == T_OP &&
            P->t[P->i + 1].n == 1 && P->t[P->i + 1].p[0] == '=') {
            sl_push(P->st, &kwn, expect_name(P));
            P->i++;
            nl_push(P->st, &kwv, parse_expr(P));
        } else {
            if (kwn.n)
                jfail(P->st, cur(P)->line, "positional argument after keyword argument");
            nl_push(P->st, &args, parse_expr(P));
        }
    }
    P->i++;
    n->items = args.v;
    n->nitems = args.n;
    n->items2 = kwv.v;
    n->nitems2 = kwv.n;
    n->names = kwn.v;
    n->nnames = kwn.n;
}

static const char *dotted_name(parser *P)
{
    const char *nm = expect_name(P);
    while (is_op(P, ".") && P->t[P->i + 1].t == T_NAME) {
        P->i++;
        const char *more = expect_name(P);
        size_t a = strlen(nm), b = strlen(more);
        char *j = ja_alloc(P->st, a + b + 2);
        memcpy(j, nm, a);
        j[a] = '.';
        memcpy(j + a + 1, more, b + 1);
        nm = j;
    }
    return nm;
}

static jnode *parse_filter(parser *P, jnode *n)
{
    P->i++;   /* | */
    jnode *f = mk(P, N_FILTER);
    f->name = dotted_name(P);
    f->a = n;
    if (is_op(P, "("))
        parse_call_args(P, f);
    return f;
}

static jnode *parse_test(parser *P, jnode *n)
{
    P->i++;   /* is */
    int negate = 0;
    if (is_name(P, "not")) {
        P->i++;
        negate = 1;
    }
    jnode *t = mk(P, N_TEST);
    t->name = dotted_name(P);
    t->a = n;
    jtok *c = cur(P);
    if (is_op(P, "(")) {
        parse_call_args(P, t);
    } else if ((c->t == T_NAME || c->t == T_STRING || c->t == T_INT || c->t == T_FLOAT ||
                is_op(P, "[") || is_op(P, "{")) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        if (is_name(P, "is"))
            jfail(P->st, c->line, "You cannot chain multiple tests with is");
        jnode *arg = parse_postfix(P, parse_primary(P));
        t->items = ja_alloc(P->st, sizeof *t->items);
        t->items[0] = arg;
        t->nitems = 1;
    }
    if (negate) {
        jnode *x = mk(P, N_NOT);
        x->a = t;
        return x;
    }
    return t;
}

static jnode *parse_filter_expr(parser *P, jnode *n)
{
    for (;;) {
        if (is_op(P, "|"))
            n = parse_filter(P, n);
        else if (is_name(P, "is"))
            n = parse_test(P, n);
        else if (is_op(P, "(")) {
            jnode *c = mk(P, N_CALL);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else
            return n;
    }
}

static jnode *parse_subscript(parser *P, jnode *obj)
{
    int line = cur(P)->line;
    P->i++;   /* [ */
    jnode *parts[3] = {NULL, NULL, NULL};
    int colons = 0;
    if (!is_op(P, ":"))
        parts[0] = parse_expr(P);
    while (is_op(P, ":") && colons < 2) {
        P->i++;
        colons++;
        if (!is_op(P, ":") && !is_op(P, "]"))
            parts[colons] = parse_expr(P);
    }
    expect_op(P, "]");
    jnode *n = ja_alloc(P->st, sizeof *n);
    n->line = line;
    n->a = obj;
    if (!colons) {
        if (!parts[0])
            jfail(P->st, line, "expected an expression in subscript");
        n->kind = N_ITEM;
        n->b = parts[0];
    } else {
        n->kind = N_SLICE;
        n->b = parts[0];
        n->c = parts[1];
        n->d = parts[2];
    }
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n)
{
    for (;;) {
        if (is_op(P, ".")) {
            P->i++;
            jtok *t = cur(P);
            if (t->t == T_NAME) {
                jnode *a = mk(P, N_ATTR);
                a->a = n;
                a->name = expect_name(P);
                n = a;
            } else if (t->t == T_INT) {
                jnode *a = mk(P, N_ITEM);
                a->a = n;
                jnode *k = mk(P, N_LIT);
                k->lit = t->val;
                a->b = k;
                P->i++;
                n = a;
            } else {
                unexpected(P, "a name after '.'");
            }
        } else if (is_op(P, "[")) {
            n = parse_subscript(P, n);
        } else if (is_op(P, "(")) {
            jnode *c = mk(P, N_CALL);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static jnode *parse_primary(parser *P)
{
    jtok *t = cur(P);
    jnode *n;
    enter(P);
    switch (t->t) {
    case T_NAME: {
        static const struct { const char *s; int t, b; } lits[] = {
            {"true", JV_BOOL, 1}, {"True", JV_BOOL, 1}, {"false", JV_BOOL, 0},
            {"False", JV_BOOL, 0}, {"none", JV_NONE, 0}, {"None", JV_NONE, 0}};
        n = mk(P, N_NAME);
        for (size_t k = 0; k < sizeof lits / sizeof lits[0]; k++)
            if (t->n == strlen(lits[k].s) && memcmp(t->p, lits[k].s, t->n) == 0) {
                n->kind = N_LIT;
                n->lit = lits[k].t == JV_BOOL ? jv_bool(lits[k].b) : jv_none();
            }
        if (n->kind == N_NAME)
            n->name = ja_strndup(P->st, t->p, t->n);
        P->i++;
        break;
    }
    case T_STRING: {
        n = mk(P, N_LIT);
        n->lit = t->val;
        P->i++;
        if (cur(P)->t == T_STRING) {   /* adjacent literals concatenate */
            jbuf b = {0};
            jb_put(P->st, &b, n->lit.u.s.p, n->lit.u.s.n);
            while (cur(P)->t == T_STRING) {
                jb_put(P->st, &b, cur(P)->val.u.s.p, cur(P)->val.u.s.n);
                P->i++;
            }
            n->lit = jv_strn(b.p, b.n);
        }
        break;
    }
    case T_INT:
    case T_FLOAT:
        n = mk(P, N_LIT);
        n->lit = t->val;
        P->i++;
        break;
    case T_OP:
        if (is_op(P, "(")) {
            P->i++;
            n = parse_tuple(P, 1, 1);
            expect_op(P, ")");
            break;
        }
        if (is_op(P, "[")) {
            n = mk(P, N_LISTLIT);
            P->i++;
            nlist items = {0};
            while (!is_op(P, "]")) {
                if (items.n)
                    expect_op(P, ",");
                if (is_op(P, "]"))
                    break;
                nl_push(P->st, &items, parse_expr(P));
            }
            P->i++;
            n->items = items.v;
            n->nitems = items.n;
            break;
        }
        if (is_op(P, "{")) {
            n = mk(P, N_DICTLIT);
            P->i++;
            nlist ks = {0}, vs = {0};
            while (!is_op(P, "}")) {
                if (ks.n)
                    expect_op(P, ",");
                if (is_op(P, "}"))
                    break;
                nl_push(P->st, &ks, parse_expr(P));
                expect_op(P, ":");
                nl_push(P->st, &vs, parse_expr(P));
            }
            P->i++;
            n->items = ks.v;
            n->nitems = ks.n;
            n->items2 = vs.v;
            n->nitems2 = vs.n;
            break;
        }
        /* fallthrough */
    default:
        unexpected(P, "an expression");
    }
    P->depth--;
    return n;
}

static jnode *parse_unary(parser *P, int with_filter)
{
    jnode *n;
    enter(P);
    if (is_op(P, "-") || is_op(P, "+")) {
        n = mk(P, is_op(P, "-") ? N_NEG : N_POS);
        P->i++;
        n->a = parse_unary(P, 0);
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    if (with_filter)
        n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jnode *binop(parser *P, int op, jnode *a, jnode *b, int line)
{
    jnode *n = ja_alloc(P->st, sizeof *n);
    n->kind = N_BINOP;
    n->op = op;
    n->a = a;
    n->b = b;
    n->line = line;
    return n;
}

static jnode *parse_pow(parser *P)
{
    jnode *n = parse_unary(P, 1);
    while (is_op(P, "**")) {
        int line = cur(P)->line;
        P->i++;
        n = binop(P, 'P', n, parse_unary(P, 1), line);
    }
    return n;
}

static jnode *parse_math2(parser *P)
{
    jnode *n = parse_pow(P);
    for (;;) {
        int op = is_op(P, "*") ? '*' : is_op(P, "/") ? '/' : is_op(P, "//") ? 'F'
               : is_op(P, "%") ? '%' : 0;
        if (!op)
            return n;
        int line = cur(P)->line;
        P->i++;
        n = binop(P, op, n, parse_pow(P), line);
    }
}

static jnode *parse_concat(parser *P)
{
    jnode *first = parse_math2(P);
    if (!is_op(P, "~"))
        return first;
    jnode *n = mk(P, N_CONCAT);
    nlist items = {0};
    nl_push(P->st, &items, first);
    while (is_op(P, "~")) {
        P->i++;
        nl_push(P->st, &items, parse_math2(P));
    }
    n->items = items.v;
    n->nitems = items.n;
    return n;
}

static jnode *parse_math1(parser *P)
{
    jnode *n = parse_concat(P);
    for (;;) {
        int op = is_op(P, "+") ? '+' : is_op(P, "-") ? '-' : 0;
        if (!op)
            return n;
        int line = cur(P)->line;
        P->i++;
        n = binop(P, op, n, parse_concat(P), line);
    }
}

static jnode *parse_compare(parser *P)
{
    jnode *first = parse_math1(P);
    nlist ops = {0};
    slist names = {0};
    for (;;) {
        const char *op = NULL;
        static const char *const cmp[] = {"==", "!=", "<=", ">=", "<", ">", NULL};
        for (int k = 0; cmp[k]; k++)
            if (is_op(P, cmp[k]))
                op = cmp[k];
        if (op) {
            P->i++;
        } else if (is_name(P, "in")) {
            P->i++;
            op = "in";
        } else if (is_name(P, "not") && P->t[P->i + 1].t == T_NAME &&
                   P->t[P->i + 1].n == 2 && memcmp(P->t[P->i + 1].p, "in", 2) == 0) {
            P->i += 2;
            op = "notin";
        } else {
            break;
        }
        sl_push(P->st, &names, op);
        nl_push(P->st, &ops, parse_math1(P));
    }
    if (!names.n)
        return first;
    jnode *n = mk(P, N_COMPARE);
    n->a = first;
    n->items = ops.v;
    n->nitems = ops.n;
    n->names = names.v;
    n->nnames = names.n;
    return n;
}

static jnode *parse_not(parser *P)
{
    if (is_name(P, "not")) {
        jnode *n = mk(P, N_NOT);
        P->i++;
        enter(P);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P)
{
    jnode *n = parse_not(P);
    while (is_name(P, "and")) {
        jnode *x = mk(P, N_AND);
        P->i++;
        x->a = n;
        x->b = parse_not(P);
        n = x;
    }
    return n;
}

static jnode *parse_or(parser *P)
{
    jnode *n = parse_and(P);
    while (is_name(P, "or")) {
        jnode *x = mk(P, N_OR);
        P->i++;
        x->a = n;
        x->b = parse_and(P);
        n = x;
    }
    return n;
}

static jnode *parse_expr(parser *P)
{
    enter(P);
    jnode *n = parse_or(P);
    while (is_name(P, "if")) {
        jnode *c = mk(P, N_COND);
        P->i++;
        c->b = n;
        c->a = parse_or(P);
        if (is_name(P, "else")) {
            P->i++;
            c->c = parse_expr(P);
        }
        n = c;
    }
    P->depth--;
    return n;
}

/* ------------------------------------------------------------------ statements */

static jnode *parse_body(parser *P, const char *const *ends, const char **which);

static jnode *body_node(parser *P, nlist *l, int line)
{
    jnode *b = ja_alloc(P->st, sizeof *b);
    b->kind = N_BODY;
    b->line = line;
    b->items = l->v;
    b->nitems = l->n;
    return b;
}

/* Consumes `{% endX %}` after parse_body stopped on it. */
static void end_tag(parser *P)
{
    P->i++;   /* the name */
    expect_block_end(P);
}

static jnode *parse_if(parser *P)
{
    jnode *n = mk(P, N_IF);
    P->i++;
    n->a = parse_tuple(P, 1, 0);
    expect_block_end(P);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *which;
    n->b = parse_body(P, ends, &which);
    if (!strcmp(which, "elif")) {   /* the rest becomes an else-body holding one if */
        nlist one = {0};
        int line = cur(P)->line;
        nl_push(P->st, &one, parse_if(P));   /* consumes through endif */
        n->c = body_node(P, &one, line);
        return n;
    }
    if (!strcmp(which, "else")) {
        P->i++;
        expect_block_end(P);
        static const char *const e2[] = {"endif", NULL};
        n->c = parse_body(P, e2, &which);
    }
    end_tag(P);
    return n;
}

static void parse_targets(parser *P, jnode *n)
{
    slist names = {0};
    int paren = 0;
    if (is_op(P, "(")) {
        P->i++;
        paren = 1;
    }
    do {
        if (names.n)
            P->i++;
        if (paren && is_op(P, ")"))
            break;
        sl_push(P->st, &names, expect_name(P));
    } while (is_op(P, ","));
    if (paren)
        expect_op(P, ")");
    n->names = names.v;
    n->nnames = names.n;
    n->op = names.n > 1 || paren;   /* unpack */
}

static jnode *parse_for(parser *P)
{
    jnode *n = mk(P, N_FOR);
    P->i++;
    parse_targets(P, n);
    if (!is_name(P, "in"))
        unexpected(P, "'in'");
    P->i++;
    n->a = parse_tuple(P, 0, 0);
    if (is_name(P, "if")) {
        P->i++;
        n->d = parse_expr(P);
    }
    if (is_name(P, "recursive"))
        jfail(P->st, cur(P)->line, "recursive loops are not supported");
    expect_block_end(P);
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *which;
    n->b = parse_body(P, ends, &which);
    if (!strcmp(which, "else")) {
        P->i++;
        expect_block_end(P);
        static const char *const e2[] = {"endfor", NULL};
        n->c = parse_body(P, e2, &which);
    }
    end_tag(P);
    return n;
}

static jnode *parse_set(parser *P)
{
    jnode *n = mk(P, N_SET);
    P->i++;
    const char *first = expect_name(P);
    if (is_op(P, ".")) {   /* ns.attr */
        P->i++;
        n->name = expect_name(P);
        n->a = mk(P, N_NAME);
        n->a->name = first;
    } else {
        slist names = {0};
        sl_push(P->st, &names, first);
        while (is_op(P, ",")) {
            P->i++;
            sl_push(P->st, &names, expect_name(P));
        }
        n->names = names.v;
        n->nnames = names.n;
        n->op = names.n > 1;
    }
    if (is_op(P, "=")) {
        P->i++;
        n->b = parse_tuple(P, 1, 0);
        expect_block_end(P);
        return n;
    }
    if (n->a || n->nnames != 1)
        unexpected(P, "'='");
    n->kind = N_SETBLOCK;
    jnode *chain = NULL;
    while (is_op(P, "|"))   /* {% set x | filter %} */
        chain = parse_filter(P, chain);
    n->c = chain;
    expect_block_end(P);
    static const char *const ends[] = {"endset", NULL};
    const char *which;
    n->b = parse_body(P, ends, &which);
    end_tag(P);
    return n;
}

/* (a, b=default, ...) for macros and call blocks */
static void parse_params(parser *P, jnode *n)
{
    slist names = {0};
    nlist defs = {0};
    if (!is_op(P, "("))
        return;
    P->i++;
    while (!is_op(P, ")")) {
        if (names.n)
            expect_op(P, ",");
        if (is_op(P, ")"))
            break;
        sl_push(P->st, &names, expect_name(P));
        jnode *def = NULL;
        if (is_op(P, "=")) {
            P->i++;
            def = parse_expr(P);
        }
        nl_push(P->st, &defs, def);
    }
    P->i++;
    n->names = names.v;
    n->nnames = names.n;
    n->items2 = defs.v;
    n->nitems2 = defs.n;
}

static jnode *parse_macro(parser *P)
{
    jnode *n = mk(P, N_MACRO);
    P->i++;
    n->name = expect_name(P);
    if (!is_op(P, "("))
        unexpected(P, "'('");
    parse_params(P, n);
    expect_block_end(P);
    static const char *const ends[] = {"endmacro", NULL};
    const char *which;
    n->b = parse_body(P, ends, &which);
    end_tag(P);
    return n;
}

static jnode *parse_callblock(parser *P)
{
    jnode *n = mk(P, N_CALLBLOCK);
    P->i++;
    if (is_op(P, "("))
        parse_params(P, n);
    n->a = parse_expr(P);
    if (n->a->kind != N_CALL)
        jfail(P->st, n->line, "expected call");
    expect_block_end(P);
    static const char *const ends[] = {"endcall", NULL};
    const char *which;
    n->b = parse_body(P, ends, &which);
    end_tag(P);
    return n;
}

static jnode *parse_filterblock(parser *P)
{
    jnode *n = mk(P, N_FILTERBLOCK);
    jnode *chain = parse_filter(P, NULL);   /* skips the `filter` keyword like a '|' */
    while (is_op(P, "|"))
        chain = parse_filter(P, chain);
    n->c = chain;
    expect_block_end(P);
    static const char *const ends[] = {"endfilter", NULL};
    const char *which;
    n->b = parse_body(P, ends, &which);
    end_tag(P);
    return n;
}

static jnode *parse_with(parser *P)
{
    jnode *n = mk(P, N_BODY);
    P->i++;
    slist names = {0};
    nlist vals = {0};
    while (cur(P)->t != T_BEND) {
        if (names.n)
            expect_op(P, ",");
        sl_push(P->st, &names, expect_name(P));
        expect_op(P, "=");
        nl_push(P->st, &vals, parse_expr(P));
    }
    expect_block_end(P);
    static const char *const ends[] = {"endwith", NULL};
    const char *which;
    jnode *body = parse_body(P, ends, &which);
    end_tag(P);
    n->op = 1;   /* scoped */
    n->names = names.v;
    n->nnames = names.n;
    n->items2 = vals.v;
    n->nitems2 = vals.n;
    n->items = body->items;
    n->nitems = body->nitems;
    return n;
}

static jnode *parse_statement(parser *P)
{
    jtok *t = cur(P);
    if (t->t != T_NAME)
        unexpected(P, "a statement name");
    if (is_name(P, "if"))
        return parse_if(P);
    if (is_name(P, "for"))
        return parse_for(P);
    if (is_name(P, "set"))
        return parse_set(P);
    if (is_name(P, "macro"))
        return parse_macro(P);
    if (is_name(P, "call"))
        return parse_callblock(P);
    if (is_name(P, "filter"))
        return parse_filterblock(P);
    if (is_name(P, "with"))
        return parse_with(P);
    if (is_name(P, "break") || is_name(P, "continue")) {
        jnode *n = mk(P, is_name(P, "break") ? N_BREAK : N_CONTINUE);
        P->i++;
        expect_block_end(P);
        return n;
    }
    if (is_name(P, "generation")) {   /* transformers' assistant-mask tag */
        P->i++;
        expect_block_end(P);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        jnode *b = parse_body(P, ends, &which);
        end_tag(P);
        b->op = 2;   /* its own frame, like a call block */
        return b;
    }
    jfail(P->st, t->line, "encountered unknown tag '%.*s'", (int)t->n, t->p);
}

/* Parses statements until one of `ends` (left unconsumed; *which names it)
 * or the end of the template when ends is NULL. */
static jnode *parse_body(parser *P, const char *const *ends, const char **which)
{
    nlist items = {0};
    int line = cur(P)->line;
    enter(P);
    for (;;) {
        jtok *t = cur(P);
        if (t->t == T_EOF) {
            if (ends)
                jfail(P->st, t->line, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        if (t->t == T_TEXT) {
            jnode *n = mk(P, N_TEXT);
            n->lit = t->val;
            P->i++;
            nl_push(P->st, &items, n);
            continue;
        }
        if (t->t == T_VBEGIN) {
            jnode *n = mk(P, N_OUTPUT);
            P->i++;
            n->a = parse_tuple(P, 1, 0);
            if (cur(P)->t != T_VEND)
                unexpected(P, "end of print statement");
            P->i++;
            nl_push(P->st, &items, n);
            continue;
        }
        if (t->t != T_BBEGIN)
            unexpected(P, "template data");
        P->i++;
        if (ends && cur(P)->t == T_NAME) {
            for (int k = 0; ends[k]; k++)
                if (is_name(P, ends[k])) {
                    *which = ends[k];
                    P->depth--;
                    return body_node(P, &items, line);
                }
        }
        if (cur(P)->t == T_NAME) {
            static const char *const stray[] = {"endif", "endfor", "else", "elif", "endset",
                                                "endmacro", "endcall", "endfilter", "endwith",
                                                "endgeneration", NULL};
            for (int k = 0; stray[k]; k++)
                if (is_name(P, stray[k]))
                    jfail(P->st, cur(P)->line, "unexpected '%s'%s%s", stray[k],
                          ends ? ", expected '" : "", ends ? ends[0] : "");
        }
        nl_push(P->st, &items, parse_statement(P));
    }
    P->depth--;
    return body_node(P, &items, line);
}

jnode *jj_parse(jstate *st, const char *src, size_t len)
{
    /* normalise newlines (\r\n, \r -> \n) and drop one trailing newline */
    char *s = ja_alloc(st, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n')
        n--;
    s[n] = 0;
    lexer L = {.st = st, .s = s, .n = n};
    lex(&L);
    push(&L, T_EOF, L.line, s + n, 0, jv_none());
    parser P = {.st = st, .t = L.toks, .n = L.ntok};
    jnode *root = parse_body(&P, NULL, NULL);
    jj_analyze(st, root);
    return root;
}
