/* gbnf.c - GBNF text -> mx_grammar.
 *
 * Recursive descent over the text.  Groups and repetitions become
 * generated rules (X* is R ::= X R | empty, X+ is X X*, X? is R ::= X |
 * empty, X{m,n} is m copies then nested optionals), so the matcher only
 * knows character sets and rule references.  After parsing, references are
 * resolved by name and left recursion is refused: the matcher expands
 * rules depth first and would never stop on it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

#define MAX_REPEAT 1000
#define MAX_RULES 100000

/* A rule under construction: alternatives as element lists. */
typedef struct seq {
    g_elem *el;
    size_t n, cap;
} seq;

typedef struct rule {
    char *name;                  /* NULL for generated rules */
    seq *alts;
    size_t n_alts, cap_alts;
    int defined;
    int line;                    /* first reference, for errors */
} rule;

typedef struct parser {
    const char *s, *end;
    int line;
    rule *rules;
    size_t n_rules, cap_rules;
    uint32_t *ranges;
    size_t n_ranges, cap_ranges;
    mx_err *e;
    int failed;
} parser;

static int fail(parser *p, const char *fmt, const char *what)
{
    if (!p->failed)
        mx_fail(p->e, MX_EINVAL, fmt, p->line, what);
    p->failed = 1;
    return -1;
}

static int grow(void **buf, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 8;
    while (c < need)
        c *= 2;
    void *q = realloc(*buf, c * size);
    if (!q)
        return -1;
    *buf = q;
    *cap = c;
    return 0;
}

static int seq_push(parser *p, seq *q, g_elem x)
{
    if (grow((void **)&q->el, &q->cap, q->n + 1, sizeof *q->el))
        return fail(p, "grammar: line %d: out of memory%s", "");
    q->el[q->n++] = x;
    return 0;
}

static int new_rule(parser *p, const char *name, size_t len)
{
    if (p->n_rules >= MAX_RULES)
        return fail(p, "grammar: line %d: too many rules%s", "");
    if (grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof *p->rules))
        return fail(p, "grammar: line %d: out of memory%s", "");
    rule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->line = p->line;
    if (name) {
        if (!(r->name = malloc(len + 1)))
            return fail(p, "grammar: line %d: out of memory%s", "");
        memcpy(r->name, name, len);
        r->name[len] = 0;
    }
    return (int)p->n_rules++;
}

static int find_rule(parser *p, const char *name, size_t len)
{
    for (size_t i = 0; i < p->n_rules; i++)
        if (p->rules[i].name && strlen(p->rules[i].name) == len && !memcmp(p->rules[i].name, name, len))
            return (int)i;
    return new_rule(p, name, len);
}

/* Adds an empty alternative to rule r and returns it. */
static seq *add_alt(parser *p, int r)
{
    rule *ru = &p->rules[r];
    if (grow((void **)&ru->alts, &ru->cap_alts, ru->n_alts + 1, sizeof *ru->alts)) {
        fail(p, "grammar: line %d: out of memory%s", "");
        return NULL;
    }
    seq *q = &ru->alts[ru->n_alts++];
    memset(q, 0, sizeof *q);
    return q;
}

static int add_range(parser *p, uint32_t lo, uint32_t hi)
{
    if (grow((void **)&p->ranges, &p->cap_ranges, p->n_ranges + 2, sizeof *p->ranges))
        return fail(p, "grammar: line %d: out of memory%s", "");
    p->ranges[p->n_ranges++] = lo;
    p->ranges[p->n_ranges++] = hi;
    return 0;
}

/* ---- lexing ---- */

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* Skips spaces, tabs and comments; newlines too when `nl`. */
static void skip_space(parser *p, int nl)
{
    while (p->s < p->end) {
        char c = *p->s;
        if (c == ' ' || c == '\t' || c == '\r') {
            p->s++;
        } else if (c == '#') {
            while (p->s < p->end && *p->s != '\n')
                p->s++;
        } else if (c == '\n' && nl) {
            p->line++;
            p->s++;
        } else {
            break;
        }
    }
}

/* One UTF-8 character; -1 when invalid. */
static int64_t utf8_char(parser *p)
{
    const unsigned char *u = (const unsigned char *)p->s;
    size_t left = (size_t)(p->end - p->s);
    unsigned c = u[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || (size_t)n > left)
        return -1;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80)
            return -1;
        cp = cp << 6 | (u[i] & 0x3F);
    }
    p->s += n;
    return cp;
}

static int hexdigits(parser *p, int n, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        if (p->s >= p->end)
            return -1;
        char c = *p->s++;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* A character of a literal or class, escapes included; -1 on error. */
static int64_t lit_char(parser *p)
{
    if (p->s >= p->end || *p->s == '\n')
        return fail(p, "grammar: line %d: unterminated literal or character class%s", "");
    if (*p->s != '\\') {
        int64_t c = utf8_char(p);
        return c < 0 ? fail(p, "grammar: line %d: invalid UTF-8%s", "") : c;
    }
    p->s++;
    if (p->s >= p->end)
        return fail(p, "grammar: line %d: escape at the end%s", "");
    char c = *p->s++;
    uint32_t v;
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '0': return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return c;
    case 'x': if (hexdigits(p, 2, &v)) break; return v;
    case 'u': if (hexdigits(p, 4, &v)) break; return v;
    case 'U': if (hexdigits(p, 8, &v) || v > 0x10FFFF) break; return v;
    default: break;
    }
    return fail(p, "grammar: line %d: unknown escape%s", "");
}

/* ---- parsing ---- */

static int parse_alts(parser *p, int r, int nested);

/* An element appended to q: a literal's characters, a class, '.', a rule
 * reference or a group.  *start: where it begins in q. */
static int parse_item(parser *p, seq *q, int r, size_t *start, int *alt_idx)
{
    *start = q->n;
    char c = *p->s;
    if (c == '"') {
        p->s++;
        while (p->s < p->end && *p->s != '"') {
            int64_t ch = lit_char(p);
            if (ch < 0)
                return -1;
            size_t a = p->n_ranges / 2;
            if (add_range(p, (uint32_t)ch, (uint32_t)ch) ||
                seq_push(p, q, (g_elem){GE_CHARS, 0, (uint32_t)a, 1}))
                return -1;
            q = &p->rules[r].alts[*alt_idx];
        }
        if (p->s >= p->end)
            return fail(p, "grammar: line %d: unterminated string literal%s", "");
        p->s++;
        return 0;
    }
    if (c == '[') {
        p->s++;
        int neg = p->s < p->end && *p->s == '^';
        if (neg)
            p->s++;
        size_t a = p->n_ranges / 2, n = 0;
        while (p->s < p->end && *p->s != ']') {
            int64_t lo = lit_char(p), hi = lo;
            if (lo < 0)
                return -1;
            if (p->s + 1 < p->end && *p->s == '-' && p->s[1] != ']') {
                p->s++;
                if ((hi = lit_char(p)) < 0)
                    return -1;
                if (hi < lo)
                    return fail(p, "grammar: line %d: character range out of order%s", "");
            }
            if (add_range(p, (uint32_t)lo, (uint32_t)hi))
                return -1;
            n++;
        }
        if (p->s >= p->end)
            return fail(p, "grammar: line %d: unterminated character class%s", "");
        p->s++;
        return seq_push(p, q, (g_elem){GE_CHARS, (uint8_t)neg, (uint32_t)a, (uint32_t)n});
    }
    if (c == '.') {
        p->s++;
        size_t a = p->n_ranges / 2;
        return add_range(p, 0, 0x10FFFF) || seq_push(p, q, (g_elem){GE_CHARS, 0, (uint32_t)a, 1});
    }
    if (c == '(') {
        p->s++;
        int g = new_rule(p, NULL, 0);
        if (g < 0 || parse_alts(p, g, 1))
            return -1;
        skip_space(p, 1);
        if (p->s >= p->end || *p->s != ')')
            return fail(p, "grammar: line %d: expected ')'%s", "");
        p->s++;
        q = &p->rules[r].alts[*alt_idx];
        return seq_push(p, q, (g_elem){GE_RULE, 0, (uint32_t)g, 0});
    }
    if (is_name_char(c)) {
        const char *n0 = p->s;
        while (p->s < p->end && is_name_char(*p->s))
            p->s++;
        int ref = find_rule(p, n0, (size_t)(p->s - n0));
        if (ref < 0)
            return -1;
        q = &p->rules[r].alts[*alt_idx];
        return seq_push(p, q, (g_elem){GE_RULE, 0, (uint32_t)ref, 0});
    }
    char what[8];
    snprintf(what, sizeof what, "'%c'", c);
    return fail(p, "grammar: line %d: unexpected %s", what);
}

/* A new rule whose alternatives are `body` (elements copied) followed by
 * `tail` (a rule, or -1), then, when `empty`, the empty alternative. */
static int gen_rule(parser *p, const g_elem *body, size_t n, int tail, int with_body_only, int empty)
{
    int g = new_rule(p, NULL, 0);
    if (g < 0)
        return -1;
    seq *a = add_alt(p, g);
    if (!a)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (seq_push(p, a, body[i]))
            return -1;
    if (tail >= 0 && seq_push(p, a, (g_elem){GE_RULE, 0, (uint32_t)tail, 0}))
        return -1;
    if (with_body_only) {
        if (!(a = add_alt(p, g)))
            return -1;
        for (size_t i = 0; i < n; i++)
            if (seq_push(p, a, body[i]))
                return -1;
    }
    if (empty && !add_alt(p, g))
        return -1;
    return g;
}

/* Replaces the item q->el[start..] by its repetition {min, max} (max < 0:
 * unbounded). */
static int repeat(parser *p, int r, int alt_idx, size_t start, long min, long max)
{
    seq *q = &p->rules[r].alts[alt_idx];
    size_t n = q->n - start;
    g_elem *body = malloc(sizeof *body * (n ? n : 1));
    if (!body)
        return fail(p, "grammar: line %d: out of memory%s", "");
    if (n)
        memcpy(body, q->el + start, sizeof *body * n);
    q->n = start;
    int rc = 0;
    /* min copies */
    for (long i = 0; i < min && !rc; i++)
        for (size_t k = 0; k < n && !rc; k++)
            rc = seq_push(p, &p->rules[r].alts[alt_idx], body[k]);
    int tail = -1;
    if (!rc && max < 0) {
        /* R ::= body R | empty */
        int g = new_rule(p, NULL, 0);
        seq *a = g < 0 ? NULL : add_alt(p, g);
        for (size_t k = 0; a && k < n && !rc; k++)
            rc = seq_push(p, &p->rules[g].alts[0], body[k]);
        if (!a || rc || seq_push(p, &p->rules[g].alts[0], (g_elem){GE_RULE, 0, (uint32_t)g, 0}) ||
            !add_alt(p, g))
            rc = -1;
        tail = g;
    } else if (!rc) {
        /* up to max - min more: Q1 ::= body | empty, Qk ::= body Q(k-1) | empty */
        for (long i = min; i < max && !rc; i++) {
            int g = gen_rule(p, body, n, tail, 0, 1);
            if (g < 0)
                rc = -1;
            tail = g;
        }
    }
    if (!rc && tail >= 0)
        rc = seq_push(p, &p->rules[r].alts[alt_idx], (g_elem){GE_RULE, 0, (uint32_t)tail, 0});
    free(body);
    return rc;
}

static int parse_number(parser *p, long *out)
{
    if (p->s >= p->end || *p->s < '0' || *p->s > '9')
        return fail(p, "grammar: line %d: expected a number in {}%s", "");
    long v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        v = v * 10 + (*p->s++ - '0');
        if (v > MAX_REPEAT)
            return fail(p, "grammar: line %d: repetition count over 1000%s", "");
    }
    *out = v;
    return 0;
}

/* One alternative of rule r. */
static int parse_seq(parser *p, int r, int nested)
{
    int alt_idx = (int)p->rules[r].n_alts;
    if (!add_alt(p, r))
        return -1;
    for (;;) {
        skip_space(p, nested);
        if (p->s >= p->end || *p->s == '|' || *p->s == ')' || *p->s == '\n')
            return 0;
        size_t start;
        if (parse_item(p, &p->rules[r].alts[alt_idx], r, &start, &alt_idx))
            return -1;
        /* postfix repetitions (several may follow: X?* is allowed) */
        while (p->s < p->end && (*p->s == '*' || *p->s == '+' || *p->s == '?' || *p->s == '{')) {
            char op = *p->s++;
            long min = 0, max = -1;
            if (op == '+')
                min = 1;
            else if (op == '?')
                max = 1;
            else if (op == '{') {
                skip_space(p, 0);
                if (parse_number(p, &min))
                    return -1;
                skip_space(p, 0);
                max = min;
                if (p->s < p->end && *p->s == ',') {
                    p->s++;
                    skip_space(p, 0);
                    max = -1;
                    if (p->s < p->end && *p->s != '}' && parse_number(p, &max))
                        return -1;
                    skip_space(p, 0);
                }
                if (p->s >= p->end || *p->s != '}')
                    return fail(p, "grammar: line %d: expected '}'%s", "");
                p->s++;
                if (max >= 0 && max < min)
                    return fail(p, "grammar: line %d: {m,n} with n < m%s", "");
            }
            if (repeat(p, r, alt_idx, start, min, max))
                return -1;
            start = p->rules[r].alts[alt_idx].n - 1;   /* the repetition is one item now */
            if (min > 0 || max == 0) {
                /* the copies are several elements: wrap them for a further operator */
                if (p->s < p->end && (*p->s == '*' || *p->s == '+' || *p->s == '?' || *p->s == '{'))
                    return fail(p, "grammar: line %d: repeat a repetition through a group: (X+)*%s", "");
            }
        }
    }
}

static int parse_alts(parser *p, int r, int nested)
{
    if (parse_seq(p, r, nested))
        return -1;
    for (;;) {
        skip_space(p, nested);
        if (!nested && p->s < p->end && *p->s == '\n') {
            /* a following line that starts with '|' continues the rule */
            const char *save = p->s;
            int line = p->line;
            skip_space(p, 1);
            if (p->s >= p->end || *p->s != '|') {
                p->s = save;
                p->line = line;
                return 0;
            }
        }
        if (p->s >= p->end || *p->s != '|')
            return 0;
        p->s++;
        skip_space(p, 1);
        if (parse_seq(p, r, nested))
            return -1;
    }
}

static int parse_rules(parser *p)
{
    for (;;) {
        skip_space(p, 1);
        if (p->s >= p->end)
            return 0;
        const char *n0 = p->s;
        while (p->s < p->end && is_name_char(*p->s))
            p->s++;
        if (p->s == n0)
            return fail(p, "grammar: line %d: expected a rule name%s", "");
        size_t nl = (size_t)(p->s - n0);
        skip_space(p, 0);
        if (p->end - p->s < 3 || memcmp(p->s, "::=", 3) != 0)
            return fail(p, "grammar: line %d: expected '::=' after the rule name%s", "");
        p->s += 3;
        int r = find_rule(p, n0, nl);
        if (r < 0)
            return -1;
        if (p->rules[r].defined) {
            char what[80];
            snprintf(what, sizeof what, "'%.60s'", p->rules[r].name);
            return fail(p, "grammar: line %d: rule %s is defined twice", what);
        }
        p->rules[r].defined = 1;
        skip_space(p, 0);
        if (parse_alts(p, r, 0))
            return -1;
        skip_space(p, 0);
        if (p->s < p->end && *p->s != '\n') {
            char what[8];
            snprintf(what, sizeof what, "'%c'", *p->s);
            return fail(p, "grammar: line %d: unexpected %s", what);
        }
    }
}

/* ---- checks and flattening ---- */

static int alt_nullable(const parser *p, const seq *a, const uint8_t *nullable)
{
    for (size_t i = 0; i < a->n; i++)
        if (a->el[i].type != GE_RULE || !nullable[a->el[i].a])
            return 0;
    return 1;
}

/* Left recursion: a rule that can reach itself before consuming anything. */
static int left_rec(parser *p, size_t r, const uint8_t *nullable, uint8_t *state)
{
    if (state[r] == 1)
        return 1;
    if (state[r] == 2)
        return 0;
    state[r] = 1;
    const rule *ru = &p->rules[r];
    for (size_t k = 0; k < ru->n_alts; k++) {
        const seq *a = &ru->alts[k];
        for (size_t i = 0; i < a->n && a->el[i].type == GE_RULE; i++) {
            if (left_rec(p, a->el[i].a, nullable, state))
                return 1;
            if (!nullable[a->el[i].a])
                break;
        }
    }
    state[r] = 2;
    return 0;
}

static const char *rule_label(const parser *p, size_t r)
{
    return p->rules[r].name ? p->rules[r].name : "(a group or repetition)";
}

static int check(parser *p, uint32_t *root)
{
    int found = -1;
    for (size_t r = 0; r < p->n_rules; r++) {
        if (p->rules[r].name && !p->rules[r].defined) {
            p->line = p->rules[r].line;
            char what[80];
            snprintf(what, sizeof what, "'%.60s'", p->rules[r].name);
            return fail(p, "grammar: line %d: rule %s is used but not defined", what);
        }
        if (p->rules[r].name && !strcmp(p->rules[r].name, "root"))
            found = (int)r;
    }
    if (found < 0)
        return mx_fail(p->e, MX_EINVAL, "grammar: no 'root' rule (the start rule)");
    *root = (uint32_t)found;
    uint8_t *nullable = calloc(p->n_rules, 1), *state = calloc(p->n_rules, 1);
    if (!nullable || !state) {
        free(nullable);
        free(state);
        return mx_fail(p->e, MX_ENOMEM, "grammar: out of memory");
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t r = 0; r < p->n_rules; r++)
            for (size_t k = 0; !nullable[r] && k < p->rules[r].n_alts; k++)
                if (alt_nullable(p, &p->rules[r].alts[k], nullable))
                    nullable[r] = changed = 1;
    }
    int rc = 0;
    for (size_t r = 0; r < p->n_rules && !rc; r++)
        if (left_rec(p, r, nullable, state))
            rc = mx_fail(p->e, MX_EINVAL,
                         "grammar: rule '%s' is left-recursive (it can reach itself before "
                         "consuming a character; a repetition of something that may be empty does "
                         "this too)", rule_label(p, r));
    free(nullable);
    free(state);
    return rc;
}

static int flatten(parser *p, uint32_t root, mx_grammar **out)
{
    size_t n_el = 0, n_alts = 0;
    for (size_t r = 0; r < p->n_rules; r++) {
        n_alts += p->rules[r].n_alts;
        for (size_t k = 0; k < p->rules[r].n_alts; k++)
            n_el += p->rules[r].alts[k].n + 1;
    }
    mx_grammar *g = calloc(1, sizeof *g);
    if (!g)
        return mx_fail(p->e, MX_ENOMEM, "grammar: out of memory");
    g->el = malloc(sizeof *g->el * (n_el ? n_el : 1));
    g->alts = malloc(sizeof *g->alts * (n_alts ? n_alts : 1));
    g->rule_alt = malloc(sizeof *g->rule_alt * (p->n_rules + 1));
    g->ranges = malloc(sizeof *g->ranges * (p->n_ranges ? p->n_ranges : 1));
    if (!g->el || !g->alts || !g->rule_alt || !g->ranges) {
        mx_grammar_free(g);
        return mx_fail(p->e, MX_ENOMEM, "grammar: out of memory");
    }
    if (p->n_ranges)
        memcpy(g->ranges, p->ranges, sizeof *g->ranges * p->n_ranges);
    g->n_ranges = (uint32_t)p->n_ranges;
    uint32_t e = 0, a = 0;
    for (size_t r = 0; r < p->n_rules; r++) {
        g->rule_alt[r] = a;
        for (size_t k = 0; k < p->rules[r].n_alts; k++) {
            const seq *q = &p->rules[r].alts[k];
            g->alts[a++] = e;
            if (q->n)
                memcpy(g->el + e, q->el, sizeof *q->el * q->n);
            e += (uint32_t)q->n;
            g->el[e++] = (g_elem){GE_END, 0, 0, 0};
        }
    }
    g->rule_alt[p->n_rules] = a;
    g->n_el = e;
    g->n_rules = (uint32_t)p->n_rules;
    g->root = root;
    *out = g;
    return MX_OK;
}

int mx_grammar_parse(const char *text, size_t len, mx_grammar **out, mx_err *e)
{
    *out = NULL;
    parser p = {.s = text, .end = text + len, .line = 1, .e = e};
    int rc = parse_rules(&p) ? -1 : 0;
    uint32_t root = 0;
    if (!rc && p.n_rules == 0)
        rc = mx_fail(e, MX_EINVAL, "grammar: no rules");
    if (!rc)
        rc = check(&p, &root);
    if (!rc)
        rc = flatten(&p, root, out);
    for (size_t r = 0; r < p.n_rules; r++) {
        for (size_t k = 0; k < p.rules[r].n_alts; k++)
            free(p.rules[r].alts[k].el);
        free(p.rules[r].alts);
        free(p.rules[r].name);
    }
    free(p.rules);
    free(p.ranges);
    return rc ? (e && e->code ? e->code : MX_EINVAL) : MX_OK;
}

void mx_grammar_free(mx_grammar *g)
{
    if (!g)
        return;
    free(g->el);
    free(g->alts);
    free(g->rule_alt);
    free(g->ranges);
    free(g);
}
