/* jinja_value.c - the arena, the value type and its Python-compatible
 * conversions: str(), repr(), json.dumps(), ==, <, truthiness. */
#include "chat/jinja_int.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---------------------------------------------------------------- arena */

void *ja_alloc(jstate *st, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    jchunk *c = st->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        if (st->total + cap > JJ_MAX_ARENA)
            jfail(st, 0, "template uses too much memory");
        c = malloc(sizeof *c + cap);
        if (!c)
            jfail(st, 0, "out of memory");
        c->next = st->chunks;
        c->used = 0;
        c->cap = cap;
        st->chunks = c;
        st->total += cap;
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *ja_strndup(jstate *st, const char *s, size_t n)
{
    char *p = ja_alloc(st, n + 1);
    if (n)
        memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void ja_free_all(jstate *st)
{
    jchunk *c = st->chunks;
    while (c) {
        jchunk *nx = c->next;
        free(c);
        c = nx;
    }
    st->chunks = NULL;
    st->total = 0;
}

void jfail(jstate *st, int line, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        snprintf(st->err, sizeof st->err, "line %d: %s", line, msg);
    else
        snprintf(st->err, sizeof st->err, "%s", msg);
    longjmp(st->jb, 1);
}

/* ---------------------------------------------------------------- buffer */

static void jb_grow(jstate *st, jbuf *b, size_t need)
{
    size_t limit = b->limit ? b->limit : JJ_MAX_OUTPUT;
    if (need > limit)
        jfail(st, 0, "template output exceeds %zu bytes", limit);
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    char *p = ja_alloc(st, cap);
    if (b->n)
        memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
}

void jb_put(jstate *st, jbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap)
        jb_grow(st, b, b->n + n + 1);
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jb_puts(jstate *st, jbuf *b, const char *s) { jb_put(st, b, s, strlen(s)); }
void jb_putc(jstate *st, jbuf *b, char c) { jb_put(st, b, &c, 1); }

/* ---------------------------------------------------------------- UTF-8 */

size_t ju_next(const char *s, size_t n, size_t i, uint32_t *cp)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                          (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {   /* a stray byte stands for itself */
        *cp = (unsigned char)s[i];
        return i + 1;
    }
    *cp = (uint32_t)c;
    return i + (size_t)k;
}

size_t ju_len(const char *s, size_t n)
{
    size_t k = 0;
    uint32_t cp;
    for (size_t i = 0; i < n; k++)
        i = ju_next(s, n, i, &cp);
    return k;
}

size_t ju_offset(const char *s, size_t n, size_t idx)
{
    size_t i = 0;
    uint32_t cp;
    while (idx-- > 0 && i < n)
        i = ju_next(s, n, i, &cp);
    return i;
}

void ju_put(jstate *st, jbuf *b, uint32_t cp)
{
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)cp, tmp);
    if (k <= 0) {   /* not a scalar value (lone surrogate): keep a byte */
        jb_putc(st, b, (char)(cp & 0xff));
        return;
    }
    jb_put(st, b, (const char *)tmp, (size_t)k);
}

/* Python's str.isspace(). */
int ju_isspace(uint32_t c)
{
    if ((c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
        c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
        c == 0x202f || c == 0x205f || c == 0x3000)
        return 1;
    return 0;
}

/* ---------------------------------------------------------------- values */

jv jv_str_copy(jstate *st, const char *p, size_t n)
{
    return jv_strn(ja_strndup(st, p, n), n);
}

jv jv_list_new(jstate *st, size_t n, int tuple)
{
    if (n > JJ_MAX_SEQ)
        jfail(st, 0, "sequence of %zu items is too long", n);
    jv v = {JV_LIST, {0}};
    v.u.l = ja_alloc(st, sizeof *v.u.l);
    v.u.l->n = n;
    v.u.l->tuple = tuple;
    v.u.l->v = n ? ja_alloc(st, n * sizeof(jv)) : NULL;
    return v;
}

jv jv_dict_new(jstate *st)
{
    jv v = {JV_DICT, {0}};
    v.u.d = ja_alloc(st, sizeof *v.u.d);
    return v;
}

/* Keys hash as Python does for the cases that matter: 1 == 1.0 == True. */
static int key_equal(jv a, jv b) { return jv_equal(a, b); }

int jdict_get(const jdict *d, jv key, jv *out)
{
    for (size_t i = 0; i < d->n; i++)
        if (key_equal(d->k[i], key)) {
            if (out)
                *out = d->v[i];
            return 1;
        }
    return 0;
}

int jdict_get_str(const jdict *d, const char *key, jv *out)
{
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s.n == n && memcmp(d->k[i].u.s.p, key, n) == 0) {
            if (out)
                *out = d->v[i];
            return 1;
        }
    return 0;
}

void jdict_set(jstate *st, jdict *d, jv key, jv val)
{
    for (size_t i = 0; i < d->n; i++)
        if (key_equal(d->k[i], key)) {
            d->v[i] = val;
            return;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        if (cap > JJ_MAX_SEQ)
            jfail(st, 0, "mapping is too large");
        jv *k = ja_alloc(st, cap * sizeof *k), *v = ja_alloc(st, cap * sizeof *v);
        if (d->n) {
            memcpy(k, d->k, d->n * sizeof *k);
            memcpy(v, d->v, d->n * sizeof *v);
        }
        d->k = k;
        d->v = v;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
}

jv jv_from_cjson(jstate *st, const void *p)
{
    const cJSON *j = p;
    if (!j || cJSON_IsNull(j))
        return jv_none();
    if (cJSON_IsBool(j))
        return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        /* cJSON keeps no int/float distinction: integral values become ints,
         * which is what JSON integers are in Python. */
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9.2e18)
            return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsString(j))
        return jv_str_copy(st, j->valuestring, strlen(j->valuestring));
    if (cJSON_IsArray(j)) {
        size_t n = (size_t)cJSON_GetArraySize(j), i = 0;
        jv l = jv_list_new(st, n, 0);
        for (const cJSON *c = j->child; c && i < n; c = c->next)
            l.u.l->v[i++] = jv_from_cjson(st, c);
        return l;
    }
    if (cJSON_IsObject(j)) {
        jv d = jv_dict_new(st);
        for (const cJSON *c = j->child; c; c = c->next)
            jdict_set(st, d.u.d, jv_str_copy(st, c->string ? c->string : "",
                                             c->string ? strlen(c->string) : 0),
                      jv_from_cjson(st, c));
        return d;
    }
    return jv_none();
}

/* ---------------------------------------------------------------- Python semantics */

int jv_truthy(jv v)
{
    if (v.t == JV_LIST && v.u.l->kind == JL_GEN)
        return 1;
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

const char *jv_type_name(jv v)
{
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str",
                                  "list", "dict", "Namespace", "function"};
    if (v.t == JV_LIST && v.u.l->tuple)
        return "tuple";
    if (v.t == JV_LIST && v.u.l->kind) {
        static const char *kinds[] = {"list", "generator", "dict_items", "dict_keys", "dict_values"};
        return kinds[v.u.l->kind];
    }
    return names[v.t];
}

int jv_is_number(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }

double jv_num(jv v)
{
    return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.t == JV_BOOL ? v.u.b : 0;
}

/* Python's float repr: the shortest digits that round-trip, fixed notation
 * for exponents -4..15, else d.ddde+XX. */
void jv_float_repr(char *out, size_t cap, double f)
{
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    char *o = out;
    size_t left = cap;
#define EMIT(...) do { int w_ = snprintf(o, left, __VA_ARGS__); if (w_ < 0 || (size_t)w_ >= left) return; o += w_; left -= (size_t)w_; } while (0)
    if (neg)
        EMIT("-");
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            EMIT("0.");
            for (int i = 0; i < -exp - 1; i++)
                EMIT("0");
            EMIT("%s", digits);
        } else {
            for (int i = 0; i <= exp; i++)
                EMIT("%c", i < nd ? digits[i] : '0');
            EMIT(".");
            if (nd > exp + 1)
                EMIT("%s", digits + exp + 1);
            else
                EMIT("0");
        }
    } else {
        EMIT("%c", digits[0]);
        if (nd > 1)
            EMIT(".%s", digits + 1);
        EMIT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
#undef EMIT
}

static int py_printable(uint32_t cp)
{
    if (cp == ' ')
        return 1;
    if (cp < 0x20 || cp == 0x7f)
        return 0;
    if (cp < 0x7f)
        return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    switch (c) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default:
        return 1;
    }
}

static void str_repr(jstate *st, jbuf *b, const char *s, size_t n)
{
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    jb_putc(st, b, q);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t j = ju_next(s, n, i, &cp);
        char esc[16];
        if (cp == (uint32_t)q || cp == '\\') {
            esc[0] = '\\';
            esc[1] = (char)cp;
            jb_put(st, b, esc, 2);
        } else if (cp == '\n') {
            jb_puts(st, b, "\\n");
        } else if (cp == '\r') {
            jb_puts(st, b, "\\r");
        } else if (cp == '\t') {
            jb_puts(st, b, "\\t");
        } else if (py_printable(cp)) {
            jb_put(st, b, s + i, j - i);
        } else {
            if (cp < 0x100)
                snprintf(esc, sizeof esc, "\\x%02x", cp);
            else if (cp < 0x10000)
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            else
                snprintf(esc, sizeof esc, "\\U%08x", cp);
            jb_puts(st, b, esc);
        }
        i = j;
    }
    jb_putc(st, b, q);
}

static void repr_depth(jstate *st, jbuf *b, jv v, int depth);

static void to_str_depth(jstate *st, jbuf *b, jv v, int depth)
{
    char num[64];
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_STR: jb_put(st, b, v.u.s.p, v.u.s.n); return;
    case JV_NONE: jb_puts(st, b, "None"); return;
    case JV_BOOL: jb_puts(st, b, v.u.b ? "True" : "False"); return;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        jb_puts(st, b, num);
        return;
    case JV_FLOAT:
        jv_float_repr(num, sizeof num, v.u.f);
        jb_puts(st, b, num);
        return;
    default: repr_depth(st, b, v, depth);
    }
}

static void repr_depth(jstate *st, jbuf *b, jv v, int depth)
{
    if (depth > JJ_MAX_DEPTH)
        jfail(st, 0, "value nested too deeply");
    switch (v.t) {
    case JV_STR: str_repr(st, b, v.u.s.p, v.u.s.n); return;
    case JV_UNDEF: jb_puts(st, b, "Undefined"); return;
    case JV_LIST: {
        jlist *l = v.u.l;
        if (l->kind == JL_GEN) {   /* Python prints an address here */
            jb_puts(st, b, "<generator object>");
            return;
        }
        if (l->kind) {   /* dict_items([...]) */
            jb_puts(st, b, jv_type_name(v));
            jb_putc(st, b, '(');
        }
        jb_putc(st, b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                jb_puts(st, b, ", ");
            repr_depth(st, b, l->v[i], depth + 1);
        }
        if (l->tuple && l->n == 1)
            jb_putc(st, b, ',');
        jb_putc(st, b, l->tuple ? ')' : ']');
        if (l->kind)
            jb_putc(st, b, ')');
        return;
    }
    case JV_NS:
    case JV_DICT: {
        jdict *d = v.u.d;
        if (v.t == JV_NS)
            jb_puts(st, b, "<Namespace ");
        jb_putc(st, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                jb_puts(st, b, ", ");
            repr_depth(st, b, d->k[i], depth + 1);
            jb_puts(st, b, ": ");
            repr_depth(st, b, d->v[i], depth + 1);
        }
        jb_putc(st, b, '}');
        if (v.t == JV_NS)
            jb_putc(st, b, '>');
        return;
    }
    case JV_FUNC: jb_puts(st, b, "<function>"); return;
    default: to_str_depth(st, b, v, depth);
    }
}

void jv_to_str(jstate *st, jbuf *b, jv v) { to_str_depth(st, b, v, 0); }
void jv_repr(jstate *st, jbuf *b, jv v) { repr_depth(st, b, v, 0); }

jv jv_stringify(jstate *st, jv v)
{
    if (v.t == JV_STR)
        return v;
    jbuf b = {0};
    jv_to_str(st, &b, v);
    return jv_strn(b.p ? b.p : "", b.n);
}

/* ---------------------------------------------------------------- JSON */

static void json_str(jstate *st, jbuf *b, const char *s, size_t n)
{
    jb_putc(st, b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        char u[8];
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                e = u;
            }
        }
        if (e) {
            jb_put(st, b, s + run, i - run);
            jb_puts(st, b, e);
            run = i + 1;
        }
    }
    jb_put(st, b, s + run, n - run);
    jb_putc(st, b, '"');
}

static void json_indent(jstate *st, jbuf *b, const char *indent, int depth)
{
    jb_putc(st, b, '\n');
    for (int i = 0; i < depth; i++)
        jb_puts(st, b, indent);
}

static int cmp_str_keys(const void *a, const void *b)
{
    const jv *x = *(const jv *const *)a, *y = *(const jv *const *)b;
    size_t n = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
    int c = memcmp(x->u.s.p, y->u.s.p, n);
    return c ? c : (x->u.s.n > y->u.s.n) - (x->u.s.n < y->u.s.n);
}

void jv_to_json(jstate *st, jbuf *b, jv v, const char *indent, int depth,
                const char *item_sep, const char *key_sep, int sort_keys, int line)
{
    char num[64];
    if (depth > JJ_MAX_DEPTH)
        jfail(st, line, "tojson: value nested too deeply");
    switch (v.t) {
    case JV_NONE: jb_puts(st, b, "null"); return;
    case JV_BOOL: jb_puts(st, b, v.u.b ? "true" : "false"); return;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        jb_puts(st, b, num);
        return;
    case JV_FLOAT:
        if (isnan(v.u.f))
            jb_puts(st, b, "NaN");
        else if (isinf(v.u.f))
            jb_puts(st, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            jv_float_repr(num, sizeof num, v.u.f);
            jb_puts(st, b, num);
        }
        return;
    case JV_STR: json_str(st, b, v.u.s.p, v.u.s.n); return;
    case JV_LIST: {
        jlist *l = v.u.l;
        if (l->kind)
            jfail(st, line, "Object of type %s is not JSON serializable", jv_type_name(v));
        if (l->n == 0) {
            jb_puts(st, b, "[]");
            return;
        }
        jb_putc(st, b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                jb_puts(st, b, item_sep);
            if (indent)
                json_indent(st, b, indent, depth + 1);
            jv_to_json(st, b, l->v[i], indent, depth + 1, item_sep, key_sep, sort_keys, line);
        }
        if (indent)
            json_indent(st, b, indent, depth);
        jb_putc(st, b, ']');
        return;
    }
    case JV_DICT: {
        jdict *d = v.u.d;
        if (d->n == 0) {
            jb_puts(st, b, "{}");
            return;
        }
        /* keys: str as is; int/float/bool/None converted as json.dumps does */
        jv *keys = ja_alloc(st, d->n * sizeof *keys);
        const jv **order = ja_alloc(st, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) {
            jv k = d->k[i];
            if (k.t == JV_BOOL)
                k = jv_strn(k.u.b ? "true" : "false", k.u.b ? 4 : 5);
            else if (k.t == JV_NONE)
                k = jv_strn("null", 4);
            else if (k.t == JV_INT || k.t == JV_FLOAT)
                k = jv_stringify(st, k);
            else if (k.t != JV_STR)
                jfail(st, line, "tojson: keys must be str, int, float, bool or None, not %s",
                      jv_type_name(k));
            keys[i] = k;
            order[i] = &keys[i];
        }
        if (sort_keys)
            qsort(order, d->n, sizeof *order, cmp_str_keys);
        jb_putc(st, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            size_t at = (size_t)(order[i] - keys);
            if (i)
                jb_puts(st, b, item_sep);
            if (indent)
                json_indent(st, b, indent, depth + 1);
            json_str(st, b, keys[at].u.s.p, keys[at].u.s.n);
            jb_puts(st, b, key_sep);
            jv_to_json(st, b, d->v[at], indent, depth + 1, item_sep, key_sep, sort_keys, line);
        }
        if (indent)
            json_indent(st, b, indent, depth);
        jb_putc(st, b, '}');
        return;
    }
    default:
        jfail(st, line, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

/* ---------------------------------------------------------------- comparison */

static int str_cmp(jv a, jv b)
{
    size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
    int c = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
    if (c)
        return c < 0 ? -1 : 1;
    return (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
}

int jv_equal(jv a, jv b)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT)
            return (a.t == JV_INT ? a.u.i : a.u.b) == (b.t == JV_INT ? b.u.i : b.u.b);
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t)
        return 0;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case JV_LIST:
        if (a.u.l->kind || b.u.l->kind)
            return a.u.l == b.u.l;
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n)
            return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i]))
                return 0;
        return 1;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n)
            return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv o;
            if (!jdict_get(b.u.d, a.u.d->k[i], &o) || !jv_equal(a.u.d->v[i], o))
                return 0;
        }
        return 1;
    case JV_NS: return a.u.d == b.u.d;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

int jv_compare(jstate *st, jv a, jv b, int line)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = a.t == JV_INT ? a.u.i : a.u.b, y = b.t == JV_INT ? b.u.i : b.u.b;
            return (x > y) - (x < y);
        }
        double x = jv_num(a), y = jv_num(b);
        return (x > y) - (x < y);
    }
    if (a.t == JV_STR && b.t == JV_STR)
        return str_cmp(a, b);
    if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple && !a.u.l->kind &&
        !b.u.l->kind) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a.u.l->v[i], b.u.l->v[i]))
                continue;
            return jv_compare(st, a.u.l->v[i], b.u.l->v[i], line);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    if (a.t == JV_UNDEF || b.t == JV_UNDEF)
        jfail(st, line, "'%s' is undefined",
              a.t == JV_UNDEF ? (a.u.s.p ? a.u.s.p : "value") : (b.u.s.p ? b.u.s.p : "value"));
    jfail(st, line, "'<' not supported between instances of '%s' and '%s'",
          jv_type_name(a), jv_type_name(b));
}
