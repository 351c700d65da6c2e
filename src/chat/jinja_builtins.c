/* jinja_builtins.c - filters, tests, str/dict methods and global functions
 * (range, namespace, dict, raise_exception, strftime_now), each matching
 * what jinja2 3.1 (as transformers configures it) and Python return. */
#include "chat/jinja_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ------------------------------------------------------------ arguments */

typedef struct jargs {
    jv *a;
    size_t na;
    const char **kwn;
    jv *kwv;
    size_t nkw;
    int line;
} jargs;

/* Argument `pos` (0-based, after the filtered value) or keyword `name`. */
static jv arg(const jargs *A, size_t pos, const char *name, jv def)
{
    if (pos < A->na)
        return A->a[pos];
    for (size_t i = 0; i < A->nkw; i++)
        if (name && !strcmp(A->kwn[i], name))
            return A->kwv[i];
    return def;
}

static jv str_arg(jrender *r, const jargs *A, size_t pos, const char *name, const char *what)
{
    jv v = arg(A, pos, name, jv_undef(name));
    if (v.t != JV_STR)
        jfail(r->st, A->line, "%s: expected a string argument, got %s", what, jv_type_name(v));
    return v;
}

static jv S(const char *s) { return jv_strn(s, strlen(s)); }

/* ------------------------------------------------------------ string helpers */

typedef uint32_t (*cp_map)(uint32_t);
static uint32_t to_upper(uint32_t c) { return (uint32_t)utf8proc_toupper((utf8proc_int32_t)c); }
static uint32_t to_lower(uint32_t c) { return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c); }
static uint32_t to_title(uint32_t c) { return (uint32_t)utf8proc_totitle((utf8proc_int32_t)c); }

static int is_cased(uint32_t c)
{
    return to_upper(c) != c || to_lower(c) != c || to_title(c) != c;
}

static jv map_cps(jrender *r, jv s, cp_map f)
{
    jbuf b = {0};
    uint32_t cp;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t j = ju_next(s.u.s.p, s.u.s.n, i, &cp);
        ju_put(r->st, &b, f(cp));
        i = j;
    }
    return jv_strn(b.p ? b.p : "", b.n);
}

/* Python str.title(): a cased char after an uncased one is titled. */
static jv py_title(jrender *r, jv s)
{
    jbuf b = {0};
    uint32_t cp;
    int prev_cased = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        i = ju_next(s.u.s.p, s.u.s.n, i, &cp);
        if (is_cased(cp)) {
            ju_put(r->st, &b, prev_cased ? to_lower(cp) : to_title(cp));
            prev_cased = 1;
        } else {
            ju_put(r->st, &b, cp);
            prev_cased = 0;
        }
    }
    return jv_strn(b.p ? b.p : "", b.n);
}

/* jinja's title filter: words start after whitespace, -, (, {, [ or <. */
static jv jinja_title(jrender *r, jv s)
{
    jbuf b = {0};
    uint32_t cp;
    int start = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        i = ju_next(s.u.s.p, s.u.s.n, i, &cp);
        int sep = ju_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
        if (sep) {
            ju_put(r->st, &b, cp);
            start = 1;
        } else {
            ju_put(r->st, &b, start ? to_upper(cp) : to_lower(cp));
            start = 0;
        }
    }
    return jv_strn(b.p ? b.p : "", b.n);
}

static jv py_capitalize(jrender *r, jv s)
{
    jbuf b = {0};
    uint32_t cp;
    for (size_t i = 0, k = 0; i < s.u.s.n; k++) {
        i = ju_next(s.u.s.p, s.u.s.n, i, &cp);
        ju_put(r->st, &b, k == 0 ? to_title(cp) : to_lower(cp));
    }
    return jv_strn(b.p ? b.p : "", b.n);
}

static int in_chars(uint32_t cp, jv chars)
{
    if (chars.t != JV_STR)
        return ju_isspace(cp);
    uint32_t c;
    for (size_t i = 0; i < chars.u.s.n;) {
        i = ju_next(chars.u.s.p, chars.u.s.n, i, &c);
        if (c == cp)
            return 1;
    }
    return 0;
}

/* strip: which bit 1 = left, 2 = right; chars None = whitespace. */
static jv py_strip(jv s, jv chars, int which)
{
    size_t a = 0, b = s.u.s.n;
    uint32_t cp;
    if (which & 1)
        while (a < b) {
            size_t j = ju_next(s.u.s.p, b, a, &cp);
            if (!in_chars(cp, chars))
                break;
            a = j;
        }
    if (which & 2)
        while (b > a) {
            size_t k = b - 1;   /* back to the start of the last code point */
            while (k > a && ((unsigned char)s.u.s.p[k] & 0xc0) == 0x80 && b - k < 4)
                k--;
            size_t j = ju_next(s.u.s.p, b, k, &cp);
            if (j != b) {   /* not a clean code point: treat the byte alone */
                k = b - 1;
                cp = (unsigned char)s.u.s.p[k];
            }
            if (!in_chars(cp, chars))
                break;
            b = k;
        }
    return jv_strn(s.u.s.p + a, b - a);
}

static jv py_replace(jrender *r, jv s, jv old, jv new, int64_t count)
{
    jbuf b = {0};
    if (old.u.s.n == 0) {   /* insert between code points and at both ends */
        uint32_t cp;
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            if (count < 0 || done < count) {
                jb_put(r->st, &b, new.u.s.p, new.u.s.n);
                done++;
            }
            if (i >= s.u.s.n)
                break;
            size_t j = ju_next(s.u.s.p, s.u.s.n, i, &cp);
            jb_put(r->st, &b, s.u.s.p + i, j - i);
            i = j;
        }
        return jv_strn(b.p ? b.p : "", b.n);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i <= s.u.s.n) {
        const char *hit = (count < 0 || done < count)
                              ? memmem(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n) : NULL;
        if (!hit) {
            jb_put(r->st, &b, s.u.s.p + i, s.u.s.n - i);
            break;
        }
        size_t at = (size_t)(hit - s.u.s.p);
        jb_put(r->st, &b, s.u.s.p + i, at - i);
        jb_put(r->st, &b, new.u.s.p, new.u.s.n);
        i = at + old.u.s.n;
        done++;
    }
    return jv_strn(b.p ? b.p : "", b.n);
}

static void list_push(jrender *r, jv *l, size_t *cap, jv x)
{
    jlist *L = l->u.l;
    if (L->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        if (nc > JJ_MAX_SEQ)
            jfail(r->st, 0, "list too long");
        jv *v = ja_alloc(r->st, nc * sizeof *v);
        if (L->n)
            memcpy(v, L->v, L->n * sizeof *v);
        L->v = v;
        *cap = nc;
    }
    L->v[L->n++] = x;
}

static jv py_split(jrender *r, jv s, jv sep, int64_t maxsplit, int line)
{
    jv out = jv_list_new(r->st, 0, 0);
    size_t cap = 0;
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.t == JV_NONE || sep.t == JV_UNDEF) {
        size_t i = 0;
        int64_t done = 0;
        uint32_t cp;
        for (;;) {
            while (i < n) {   /* skip whitespace */
                size_t j = ju_next(p, n, i, &cp);
                if (!ju_isspace(cp))
                    break;
                i = j;
            }
            if (i >= n)
                break;
            if (maxsplit >= 0 && done >= maxsplit) {
                /* the rest, with trailing whitespace removed */
                jv rest = py_strip(jv_strn(p + i, n - i), jv_none(), 2);
                list_push(r, &out, &cap, rest);
                break;
            }
            size_t st = i;
            while (i < n) {
                size_t j = ju_next(p, n, i, &cp);
                if (ju_isspace(cp))
                    break;
                i = j;
            }
            list_push(r, &out, &cap, jv_strn(p + st, i - st));
            done++;
        }
        return out;
    }
    if (sep.t != JV_STR)
        jfail(r->st, line, "must be str or None, not %s", jv_type_name(sep));
    if (sep.u.s.n == 0)
        jfail(r->st, line, "empty separator");
    size_t i = 0;
    int64_t done = 0;
    for (;;) {
        const char *hit = (maxsplit < 0 || done < maxsplit)
                              ? memmem(p + i, n - i, sep.u.s.p, sep.u.s.n) : NULL;
        if (!hit) {
            list_push(r, &out, &cap, jv_strn(p + i, n - i));
            break;
        }
        size_t at = (size_t)(hit - p);
        list_push(r, &out, &cap, jv_strn(p + i, at - i));
        i = at + sep.u.s.n;
        done++;
    }
    return out;
}

static jv py_rsplit(jrender *r, jv s, jv sep, int64_t maxsplit, int line)
{
    if (maxsplit < 0 || sep.t != JV_STR)
        return py_split(r, s, sep, maxsplit, line);
    if (sep.u.s.n == 0)
        jfail(r->st, line, "empty separator");
    /* collect split points from the right */
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, end = n;
    size_t *cuts = ja_alloc(r->st, (size_t)(maxsplit + 1) * sizeof *cuts);
    int64_t k = 0;
    while (k < maxsplit && end >= sep.u.s.n) {
        size_t at = end - sep.u.s.n;
        int found = 0;
        for (;;) {
            if (memcmp(p + at, sep.u.s.p, sep.u.s.n) == 0) {
                found = 1;
                break;
            }
            if (at == 0)
                break;
            at--;
        }
        if (!found)
            break;
        cuts[k++] = at;
        end = at;
    }
    jv out = jv_list_new(r->st, (size_t)k + 1, 0);
    size_t start = 0;
    for (int64_t i = k - 1; i >= 0; i--) {
        out.u.l->v[k - 1 - i] = jv_strn(p + start, cuts[i] - start);
        start = cuts[i] + sep.u.s.n;
    }
    out.u.l->v[k] = jv_strn(p + start, n - start);
    /* cuts were found right to left; the pieces above are in order */
    return out;
}

/* Python str.splitlines() line boundaries; returns the boundary length. */
static size_t line_break(const char *p, size_t n, size_t i)
{
    unsigned char c = (unsigned char)p[i];
    if (c == '\r')
        return (i + 1 < n && p[i + 1] == '\n') ? 2 : 1;
    if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e))
        return 1;
    if (c == 0xc2 && i + 1 < n && (unsigned char)p[i + 1] == 0x85)
        return 2;
    if (c == 0xe2 && i + 2 < n && (unsigned char)p[i + 1] == 0x80 &&
        ((unsigned char)p[i + 2] == 0xa8 || (unsigned char)p[i + 2] == 0xa9))
        return 3;
    return 0;
}

static jv py_splitlines(jrender *r, jv s, int keepends)
{
    jv out = jv_list_new(r->st, 0, 0);
    size_t cap = 0, st = 0, i = 0;
    while (i < s.u.s.n) {
        size_t k = line_break(s.u.s.p, s.u.s.n, i);
        if (k) {
            list_push(r, &out, &cap, jv_strn(s.u.s.p + st, i - st + (keepends ? k : 0)));
            i += k;
            st = i;
        } else {
            i++;
        }
    }
    if (st < s.u.s.n)
        list_push(r, &out, &cap, jv_strn(s.u.s.p + st, s.u.s.n - st));
    return out;
}

static int starts_ends(jrender *r, jv s, jv pre, int ends, int line)
{
    if (pre.t == JV_LIST && pre.u.l->tuple) {
        for (size_t i = 0; i < pre.u.l->n; i++)
            if (starts_ends(r, s, pre.u.l->v[i], ends, line))
                return 1;
        return 0;
    }
    if (pre.t != JV_STR)
        jfail(r->st, line, "%s first arg must be str or a tuple of str, not %s",
              ends ? "endswith" : "startswith", jv_type_name(pre));
    if (pre.u.s.n > s.u.s.n)
        return 0;
    const char *at = ends ? s.u.s.p + s.u.s.n - pre.u.s.n : s.u.s.p;
    return memcmp(at, pre.u.s.p, pre.u.s.n) == 0;
}

static jv str_join(jrender *r, jv sep, jv items, int strict, int line)
{
    jbuf b = {0};
    jv l = jj_iter_list(r, items, line);
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (i)
            jb_put(r->st, &b, sep.u.s.p, sep.u.s.n);
        jv x = l.u.l->v[i];
        if (strict && x.t != JV_STR)
            jfail(r->st, line, "sequence item %zu: expected str instance, %s found", i,
                  jv_type_name(x));
        jv_to_str(r->st, &b, x);
    }
    return jv_strn(b.p ? b.p : "", b.n);
}

/* ------------------------------------------------------------ methods */

enum {
    M_STRIP, M_LSTRIP, M_RSTRIP, M_UPPER, M_LOWER, M_TITLE, M_CAPITALIZE, M_STARTSWITH,
    M_ENDSWITH, M_SPLIT, M_RSPLIT, M_REPLACE, M_FIND, M_RFIND, M_COUNT, M_JOIN, M_SPLITLINES,
    M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE, M_ISUPPER, M_ISLOWER, M_FORMAT,
    M_STR_END,
    M_ITEMS = 100, M_KEYS, M_VALUES, M_GET,
    M_LCOUNT = 200, M_LINDEX,
};

static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize", "startswith",
    "endswith", "split", "rsplit", "replace", "find", "rfind", "count", "join", "splitlines",
    "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "format", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};
static const char *const LIST_METHODS[] = {"count", "index", NULL};

static int find_name(const char *const *names, const char *s, size_t n)
{
    for (int i = 0; names[i]; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0)
            return i;
    return -1;
}

int jj_method_id(jv obj, const char *name, size_t nlen)
{
    int k;
    if (obj.t == JV_STR && (k = find_name(STR_METHODS, name, nlen)) >= 0)
        return k;
    if (obj.t == JV_DICT && (k = find_name(DICT_METHODS, name, nlen)) >= 0)
        return M_ITEMS + k;
    if (obj.t == JV_LIST && !obj.u.l->kind && (k = find_name(LIST_METHODS, name, nlen)) >= 0)
        return M_LCOUNT + k;
    return -1;
}

static jv items_list(jrender *r, jdict *d)
{
    jv l = jv_list_new(r->st, d->n, 0);
    for (size_t i = 0; i < d->n; i++) {
        jv t = jv_list_new(r->st, 2, 1);
        t.u.l->v[0] = d->k[i];
        t.u.l->v[1] = d->v[i];
        l.u.l->v[i] = t;
    }
    return l;
}

static int64_t int_arg(jrender *r, jv v, int64_t def, int line)
{
    if (v.t == JV_UNDEF || v.t == JV_NONE)
        return def;
    if (v.t == JV_INT)
        return v.u.i;
    if (v.t == JV_BOOL)
        return v.u.b;
    jfail(r->st, line, "'%s' object cannot be interpreted as an integer", jv_type_name(v));
}

static int str_pred(jv s, int id)
{
    if (s.u.s.n == 0)
        return 0;
    int any_cased = 0;
    uint32_t cp;
    for (size_t i = 0; i < s.u.s.n;) {
        i = ju_next(s.u.s.p, s.u.s.n, i, &cp);
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
        int alpha = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        int digit = c == UTF8PROC_CATEGORY_ND;
        switch (id) {
        case M_ISDIGIT: if (!digit) return 0; break;
        case M_ISALPHA: if (!alpha) return 0; break;
        case M_ISALNUM: if (!alpha && !digit && c != UTF8PROC_CATEGORY_NL && c != UTF8PROC_CATEGORY_NO) return 0; break;
        case M_ISSPACE: if (!ju_isspace(cp)) return 0; break;
        case M_ISUPPER:
            if (to_upper(cp) != cp && to_lower(cp) == cp) return 0;
            if (is_cased(cp)) any_cased = 1;
            break;
        case M_ISLOWER:
            if (to_lower(cp) != cp && to_upper(cp) == cp) return 0;
            if (is_cased(cp)) any_cased = 1;
            break;
        }
    }
    if (id == M_ISUPPER || id == M_ISLOWER)
        return any_cased;
    return 1;
}

static jv py_brace_format(jrender *r, jv fmt, const jargs *A);

jv jj_call_method(jrender *r, jfunc *f, jv *args, size_t nargs, const char **kwn, jv *kwv,
                  size_t nkw, int line)
{
    jargs A = {args, nargs, kwn, kwv, nkw, line};
    jv s = f->self;
    switch (f->id) {
    case M_STRIP: return py_strip(s, arg(&A, 0, "chars", jv_none()), 3);
    case M_LSTRIP: return py_strip(s, arg(&A, 0, "chars", jv_none()), 1);
    case M_RSTRIP: return py_strip(s, arg(&A, 0, "chars", jv_none()), 2);
    case M_UPPER: return map_cps(r, s, to_upper);
    case M_LOWER: return map_cps(r, s, to_lower);
    case M_TITLE: return py_title(r, s);
    case M_CAPITALIZE: return py_capitalize(r, s);
    case M_STARTSWITH:
    case M_ENDSWITH: {
        jv pre = arg(&A, 0, NULL, jv_undef("prefix"));
        jv st = arg(&A, 1, NULL, jv_none()), en = arg(&A, 2, NULL, jv_none());
        if (st.t != JV_NONE || en.t != JV_NONE) {
            jv sl = jv_none();
            /* s[start:end] by code points */
            size_t len = ju_len(s.u.s.p, s.u.s.n);
            int64_t a = int_arg(r, st, 0, line), b = int_arg(r, en, (int64_t)len, line);
            if (a < 0) a += (int64_t)len;
            if (b < 0) b += (int64_t)len;
            if (a < 0) a = 0;
            if (b > (int64_t)len) b = (int64_t)len;
            if (a > b)
                return jv_bool(0);
            size_t oa = ju_offset(s.u.s.p, s.u.s.n, (size_t)a), ob = ju_offset(s.u.s.p, s.u.s.n, (size_t)b);
            sl = jv_strn(s.u.s.p + oa, ob - oa);
            s = sl;
        }
        return jv_bool(starts_ends(r, s, pre, f->id == M_ENDSWITH, line));
    }
    case M_SPLIT:
    case M_RSPLIT: {
        jv sep = arg(&A, 0, "sep", jv_none());
        int64_t mx = int_arg(r, arg(&A, 1, "maxsplit", jv_int(-1)), -1, line);
        return f->id == M_SPLIT ? py_split(r, s, sep, mx, line) : py_rsplit(r, s, sep, mx, line);
    }
    case M_REPLACE: {
        jv old = str_arg(r, &A, 0, "old", "replace"), nw = str_arg(r, &A, 1, "new", "replace");
        return py_replace(r, s, old, nw, int_arg(r, arg(&A, 2, "count", jv_int(-1)), -1, line));
    }
    case M_FIND:
    case M_RFIND:
    case M_COUNT: {
        jv sub = str_arg(r, &A, 0, NULL, STR_METHODS[f->id]);
        if (f->id == M_COUNT) {
            if (sub.u.s.n == 0)
                return jv_int((int64_t)ju_len(s.u.s.p, s.u.s.n) + 1);
            int64_t c = 0;
            size_t i = 0;
            const char *h;
            while ((h = memmem(s.u.s.p + i, s.u.s.n - i, sub.u.s.p, sub.u.s.n))) {
                c++;
                i = (size_t)(h - s.u.s.p) + sub.u.s.n;
            }
            return jv_int(c);
        }
        const char *h = NULL;
        if (f->id == M_FIND) {
            h = memmem(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n);
        } else {
            for (size_t i = s.u.s.n + 1; i-- > 0;)
                if (i + sub.u.s.n <= s.u.s.n && memcmp(s.u.s.p + i, sub.u.s.p, sub.u.s.n) == 0) {
                    h = s.u.s.p + i;
                    break;
                }
        }
        if (!h)
            return jv_int(-1);
        return jv_int((int64_t)ju_len(s.u.s.p, (size_t)(h - s.u.s.p)));
    }
    case M_JOIN: return str_join(r, s, arg(&A, 0, NULL, jv_undef("iterable")), 1, line);
    case M_SPLITLINES:
        return py_splitlines(r, s, jv_truthy(arg(&A, 0, "keepends", jv_bool(0))));
    case M_ISDIGIT: case M_ISALPHA: case M_ISALNUM: case M_ISSPACE: case M_ISUPPER:
    case M_ISLOWER:
        return jv_bool(str_pred(s, f->id));
    case M_FORMAT: return py_brace_format(r, s, &A);
    case M_ITEMS: {
        jv l = items_list(r, s.u.d);
        l.u.l->kind = JL_ITEMS;
        return l;
    }
    case M_KEYS:
    case M_VALUES: {
        jv l = jv_list_new(r->st, s.u.d->n, 0);
        for (size_t i = 0; i < s.u.d->n; i++)
            l.u.l->v[i] = f->id == M_KEYS ? s.u.d->k[i] : s.u.d->v[i];
        l.u.l->kind = f->id == M_KEYS ? JL_KEYS : JL_VALUES;
        return l;
    }
    case M_LCOUNT:
    case M_LINDEX: {
        jv x = arg(&A, 0, NULL, jv_undef("value"));
        int64_t c = 0;
        for (size_t i = 0; i < s.u.l->n; i++)
            if (jv_equal(s.u.l->v[i], x)) {
                if (f->id == M_LINDEX)
                    return jv_int((int64_t)i);
                c++;
            }
        if (f->id == M_LINDEX)
            jfail(r->st, line, "list.index(x): x not in list");
        return jv_int(c);
    }
    case M_GET: {
        jv v;
        if (jdict_get(s.u.d, arg(&A, 0, NULL, jv_none()), &v))
            return v;
        return arg(&A, 1, NULL, jv_none());
    }
    }
    jfail(r->st, line, "internal error: unknown method");
}

/* "{}".format(...) with positional/keyword fields and no format specs. */
static jv py_brace_format(jrender *r, jv fmt, const jargs *A)
{
    jbuf b = {0};
    size_t auto_idx = 0;
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') {
            jb_putc(r->st, &b, '{');
            i++;
        } else if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') {
            jb_putc(r->st, &b, '}');
            i++;
        } else if (p[i] == '{') {
            size_t j = i + 1;
            while (j < n && p[j] != '}')
                j++;
            if (j >= n)
                jfail(r->st, A->line, "Single '{' encountered in format string");
            jv v;
            if (j == i + 1) {
                if (auto_idx >= A->na)
                    jfail(r->st, A->line, "Replacement index %zu out of range", auto_idx);
                v = A->a[auto_idx++];
            } else if (p[i + 1] >= '0' && p[i + 1] <= '9') {
                size_t k = (size_t)strtoul(p + i + 1, NULL, 10);
                if (k >= A->na)
                    jfail(r->st, A->line, "Replacement index %zu out of range", k);
                v = A->a[k];
            } else {
                char key[128];
                snprintf(key, sizeof key, "%.*s", (int)(j - i - 1), p + i + 1);
                v = jv_undef(NULL);
                for (size_t k = 0; k < A->nkw; k++)
                    if (!strcmp(A->kwn[k], key))
                        v = A->kwv[k];
                if (v.t == JV_UNDEF)
                    jfail(r->st, A->line, "KeyError: '%s'", key);
            }
            jv_to_str(r->st, &b, v);
            i = j;
        } else {
            jb_putc(r->st, &b, p[i]);
        }
    }
    return jv_strn(b.p ? b.p : "", b.n);
}

/* Python's str % args: a tuple supplies the arguments in order; any other
 * value is one argument, and a "mapping" (anything subscriptable except str
 * and tuple) may also feed %(name)s.  Conversions s r d i f x and %%. */
jv jj_percent_format(jrender *r, jv fmt, jv args, int line)
{
    jbuf b = {0};
    int is_tuple = args.t == JV_LIST && args.u.l->tuple && !args.u.l->kind;
    int mapping = !is_tuple && (args.t == JV_DICT || args.t == JV_UNDEF ||
                                (args.t == JV_LIST && !args.u.l->kind));
    size_t nargs = is_tuple ? args.u.l->n : 1, ai = 0;
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') {
            jb_putc(r->st, &b, p[i]);
            continue;
        }
        if (++i >= n)
            jfail(r->st, line, "incomplete format");
        jv v;
        int have = 0;
        if (p[i] == '(') {   /* %(key)s */
            size_t j = i + 1;
            while (j < n && p[j] != ')')
                j++;
            if (j >= n)
                jfail(r->st, line, "incomplete format key");
            if (!mapping)
                jfail(r->st, line, "format requires a mapping");
            v = jj_getitem(r, args, jv_strn(p + i + 1, j - i - 1), line);
            have = 1;
            i = j + 1;
            if (i >= n)
                jfail(r->st, line, "incomplete format");
        }
        char c = p[i];
        if (c == '%') {
            jb_putc(r->st, &b, '%');
            continue;
        }
        if (!have) {
            if (ai >= nargs)
                jfail(r->st, line, "not enough arguments for format string");
            v = is_tuple ? args.u.l->v[ai] : args;
            ai++;
        }
        char num[64];
        switch (c) {
        case 's': jv_to_str(r->st, &b, v); break;
        case 'r': jv_repr(r->st, &b, v); break;
        case 'd':
        case 'i':
        case 'x':
            if (!jv_is_number(v))
                jfail(r->st, line, "%%%c format: a real number is required, not %s", c, jv_type_name(v));
            {
                long long x = v.t == JV_FLOAT ? (long long)v.u.f : v.t == JV_INT ? v.u.i : v.u.b;
                if (c == 'x')
                    snprintf(num, sizeof num, x < 0 ? "-%llx" : "%llx", x < 0 ? -(unsigned long long)x : (unsigned long long)x);
                else
                    snprintf(num, sizeof num, "%lld", x);
            }
            jb_puts(r->st, &b, num);
            break;
        case 'f':
            if (!jv_is_number(v))
                jfail(r->st, line, "must be real number, not %s", jv_type_name(v));
            snprintf(num, sizeof num, "%f", jv_num(v));
            jb_puts(r->st, &b, num);
            break;
        default: jfail(r->st, line, "unsupported format character '%c'", c);
        }
    }
    if (ai < nargs && !mapping)
        jfail(r->st, line, "not all arguments converted during string formatting");
    return jv_strn(b.p ? b.p : "", b.n);
}

/* ------------------------------------------------------------ tests */

static const char *const TESTS[] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number",
    "string", "mapping", "iterable", "sequence", "callable", "odd", "even", "divisibleby",
    "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan",
    ">", "ge", ">=", "in", "sameas", "lower", "upper", "escaped", "filter", "test", NULL};

int jj_test_exists(const char *name) { return find_name(TESTS, name, strlen(name)) >= 0; }

int jj_filter_exists(const char *name);

int jj_test(jrender *r, const char *name, jv v, jv *args, size_t nargs, int line)
{
    int id = find_name(TESTS, name, strlen(name));
    if (id < 0)
        jfail(r->st, line, "no test named '%s'", name);
    jv a0 = nargs ? args[0] : jv_undef("argument");
    const char *t = TESTS[id];
#define IS(x) (!strcmp(t, x))
    if (IS("defined")) return v.t != JV_UNDEF;
    if (IS("undefined")) return v.t == JV_UNDEF;
    if (IS("none")) return v.t == JV_NONE;
    if (IS("boolean")) return v.t == JV_BOOL;
    if (IS("false")) return v.t == JV_BOOL && !v.u.b;
    if (IS("true")) return v.t == JV_BOOL && v.u.b;
    if (IS("integer")) return v.t == JV_INT;
    if (IS("float")) return v.t == JV_FLOAT;
    if (IS("number")) return jv_is_number(v);
    if (IS("string")) return v.t == JV_STR;
    if (IS("mapping")) return v.t == JV_DICT;
    if (IS("iterable")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    if (IS("sequence"))
        return v.t == JV_STR || (v.t == JV_LIST && !v.u.l->kind) || v.t == JV_DICT || v.t == JV_UNDEF;
    if (IS("callable")) return v.t == JV_FUNC;
    if (IS("odd") || IS("even") || IS("divisibleby")) {
        if (v.t == JV_UNDEF)
            jfail(r->st, line, "'%s' is undefined", v.u.s.p ? v.u.s.p : "value");
        if (!jv_is_number(v))
            jfail(r->st, line, "unsupported operand type(s) for %%: '%s' and 'int'", jv_type_name(v));
        if (IS("divisibleby")) {
            if (!jv_is_number(a0))
                jfail(r->st, line, "divisibleby needs a number");
            if (jv_num(a0) == 0)
                jfail(r->st, line, "integer division or modulo by zero");
            double m = fmod(jv_num(v), jv_num(a0));
            return m == 0;
        }
        int64_t x = v.t == JV_INT ? v.u.i : v.t == JV_BOOL ? v.u.b : (int64_t)v.u.f;
        if (v.t == JV_FLOAT && v.u.f != floor(v.u.f))
            return IS("odd") ? 0 : 0;
        return IS("odd") ? (x % 2 != 0) : (x % 2 == 0);
    }
    if (IS("eq") || IS("equalto") || IS("==")) return jv_equal(v, a0);
    if (IS("ne") || IS("!=")) return !jv_equal(v, a0);
    if (IS("lt") || IS("lessthan") || IS("<")) return jv_compare(r->st, v, a0, line) < 0;
    if (IS("le") || IS("<=")) return jv_compare(r->st, v, a0, line) <= 0;
    if (IS("gt") || IS("greaterthan") || IS(">")) return jv_compare(r->st, v, a0, line) > 0;
    if (IS("ge") || IS(">=")) return jv_compare(r->st, v, a0, line) >= 0;
    if (IS("in")) {
        if (a0.t == JV_STR) {
            if (v.t != JV_STR)
                jfail(r->st, line, "'in <string>' requires string as left operand");
            return v.u.s.n == 0 || memmem(a0.u.s.p, a0.u.s.n, v.u.s.p, v.u.s.n) != NULL;
        }
        if (a0.t == JV_LIST) {
            for (size_t i = 0; i < a0.u.l->n; i++)
                if (jv_equal(a0.u.l->v[i], v))
                    return 1;
            return 0;
        }
        if (a0.t == JV_DICT)
            return jdict_get(a0.u.d, v, NULL);
        if (a0.t == JV_UNDEF)
            return 0;
        jfail(r->st, line, "argument of type '%s' is not iterable", jv_type_name(a0));
    }
    if (IS("sameas")) {
        if (v.t != a0.t)
            return 0;
        switch (v.t) {
        case JV_NONE: case JV_UNDEF: return 1;
        case JV_BOOL: return v.u.b == a0.u.b;
        case JV_INT: return v.u.i == a0.u.i && v.u.i >= -5 && v.u.i <= 256;   /* CPython's cache */
        case JV_STR: return v.u.s.p == a0.u.s.p && v.u.s.n == a0.u.s.n;
        case JV_LIST: return v.u.l == a0.u.l;
        case JV_DICT: case JV_NS: return v.u.d == a0.u.d;
        case JV_FUNC: return v.u.fn == a0.u.fn;
        default: return 0;
        }
    }
    if (IS("lower") || IS("upper")) {
        jv s = jv_stringify(r->st, v);
        return str_pred(s, IS("lower") ? M_ISLOWER : M_ISUPPER);
    }
    if (IS("escaped")) return 0;
    if (IS("filter")) return v.t == JV_STR && jj_filter_exists(ja_strndup(r->st, v.u.s.p, v.u.s.n));
    if (IS("test")) return v.t == JV_STR && jj_test_exists(ja_strndup(r->st, v.u.s.p, v.u.s.n));
#undef IS
    return 0;
}

/* ------------------------------------------------------------ filters */

/* jinja's make_attrgetter: "a.b.0" looked up item by item. */
static jv attr_path(jrender *r, jv v, jv path, int line)
{
    if (path.t == JV_INT)
        return jj_getitem(r, v, path, line);
    if (path.t != JV_STR)
        jfail(r->st, line, "attribute must be a string or an integer");
    const char *p = path.u.s.p;
    size_t n = path.u.s.n, i = 0;
    while (i <= n) {
        size_t j = i;
        while (j < n && p[j] != '.')
            j++;
        int digits = j > i;
        for (size_t k = i; k < j; k++)
            if (p[k] < '0' || p[k] > '9')
                digits = 0;
        jv key = digits ? jv_int(strtoll(p + i, NULL, 10)) : jv_strn(p + i, j - i);
        v = jj_getitem(r, v, key, line);
        i = j + 1;
        if (j >= n)
            break;
    }
    return v;
}

/* Sort key for sort/unique/min/max: lowercased strings unless case_sensitive. */
static jv sort_key(jrender *r, jv v, jv attr, int case_sensitive, int line)
{
    if (attr.t != JV_NONE && attr.t != JV_UNDEF)
        v = attr_path(r, v, attr, line);
    if (!case_sensitive && v.t == JV_STR)
        v = map_cps(r, v, to_lower);
    return v;
}

static void merge_sort(jrender *r, jv *items, jv *keys, size_t n, int reverse, int line)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    merge_sort(r, items, keys, h, reverse, line);
    merge_sort(r, items + h, keys + h, n - h, reverse, line);
    jv *ti = ja_alloc(r->st, n * sizeof *ti), *tk = ja_alloc(r->st, n * sizeof *tk);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c = jv_compare(r->st, keys[j], keys[i], line);
        int take_right = reverse ? c > 0 : c < 0;   /* stable either way */
        if (take_right) {
            ti[k] = items[j];
            tk[k++] = keys[j++];
        } else {
            ti[k] = items[i];
            tk[k++] = keys[i++];
        }
    }
    while (i < h) {
        ti[k] = items[i];
        tk[k++] = keys[i++];
    }
    while (j < n) {
        ti[k] = items[j];
        tk[k++] = keys[j++];
    }
    memcpy(items, ti, n * sizeof *ti);
    memcpy(keys, tk, n * sizeof *tk);
}

static jv list_copy(jrender *r, jv l)
{
    jv c = jv_list_new(r->st, l.u.l->n, 0);
    if (l.u.l->n)
        memcpy(c.u.l->v, l.u.l->v, l.u.l->n * sizeof(jv));
    return c;
}

static jv f_indent(jrender *r, jv s, const jargs *A)
{
    jv w = arg(A, 0, "width", jv_int(4));
    jv first = arg(A, 1, "first", jv_bool(0)), blank = arg(A, 2, "blank", jv_bool(0));
    jbuf ind = {0};
    if (w.t == JV_STR)
        jb_put(r->st, &ind, w.u.s.p, w.u.s.n);
    else
        for (int64_t i = 0; i < int_arg(r, w, 4, A->line) && i < 4096; i++)
            jb_putc(r->st, &ind, ' ');
    jv indent = jv_strn(ind.p ? ind.p : "", ind.n);
    /* s + "\n", split into lines (Python splitlines) */
    jbuf tmp = {0};
    jb_put(r->st, &tmp, s.u.s.p, s.u.s.n);
    jb_putc(r->st, &tmp, '\n');
    jv lines = py_splitlines(r, jv_strn(tmp.p, tmp.n), 0);
    jbuf b = {0};
    if (jv_truthy(blank)) {
        for (size_t i = 0; i < lines.u.l->n; i++) {
            if (i) {
                jb_putc(r->st, &b, '\n');
                jb_put(r->st, &b, indent.u.s.p, indent.u.s.n);
            }
            jb_put(r->st, &b, lines.u.l->v[i].u.s.p, lines.u.l->v[i].u.s.n);
        }
    } else {
        for (size_t i = 0; i < lines.u.l->n; i++) {
            jv ln = lines.u.l->v[i];
            if (i) {
                jb_putc(r->st, &b, '\n');
                if (ln.u.s.n)
                    jb_put(r->st, &b, indent.u.s.p, indent.u.s.n);
            }
            jb_put(r->st, &b, ln.u.s.p, ln.u.s.n);
        }
    }
    if (jv_truthy(first)) {
        jbuf c = {0};
        jb_put(r->st, &c, indent.u.s.p, indent.u.s.n);
        jb_put(r->st, &c, b.p ? b.p : "", b.n);
        return jv_strn(c.p, c.n);
    }
    return jv_strn(b.p ? b.p : "", b.n);
}

static jv f_tojson(jrender *r, jv v, const jargs *A)
{
    jv ind = arg(A, 0, "indent", jv_none());
    jv seps = arg(A, 2, "separators", jv_none());
    jv sk = arg(A, 3, "sort_keys", jv_bool(0));
    const char *indent = NULL;
    if (ind.t == JV_INT || ind.t == JV_BOOL) {
        int64_t k = int_arg(r, ind, 0, A->line);
        if (k > 1024)
            k = 1024;
        char *sp = ja_alloc(r->st, (size_t)(k > 0 ? k : 0) + 1);
        for (int64_t i = 0; i < k; i++)
            sp[i] = ' ';
        indent = sp;
    } else if (ind.t == JV_STR) {
        indent = ja_strndup(r->st, ind.u.s.p, ind.u.s.n);
    } else if (ind.t != JV_NONE && ind.t != JV_UNDEF) {
        jfail(r->st, A->line, "tojson: indent must be an int or a string");
    }
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (seps.t == JV_LIST && seps.u.l->n == 2 && seps.u.l->v[0].t == JV_STR &&
        seps.u.l->v[1].t == JV_STR) {
        item_sep = ja_strndup(r->st, seps.u.l->v[0].u.s.p, seps.u.l->v[0].u.s.n);
        key_sep = ja_strndup(r->st, seps.u.l->v[1].u.s.p, seps.u.l->v[1].u.s.n);
    }
    jbuf b = {0};
    jv_to_json(r->st, &b, v, indent, 0, item_sep, key_sep, jv_truthy(sk), A->line);
    return jv_strn(b.p ? b.p : "", b.n);
}

/* select / reject / selectattr / rejectattr */
static jv f_select(jrender *r, jv seq, const jargs *A, int by_attr, int keep_true)
{
    jv l = jj_iter_list(r, seq, A->line);
    jv out = jv_list_new(r->st, 0, 0);
    size_t cap = 0;
    size_t base = by_attr ? 1 : 0;
    jv attr = by_attr ? arg(A, 0, NULL, jv_undef("attribute")) : jv_none();
    const char *test = NULL;
    if (A->na > base) {
        jv t = A->a[base];
        if (t.t != JV_STR)
            jfail(r->st, A->line, "test name must be a string");
        test = ja_strndup(r->st, t.u.s.p, t.u.s.n);
        if (!jj_test_exists(test))
            jfail(r->st, A->line, "no test named '%s'", test);
    }
    jv *targs = A->na > base + 1 ? A->a + base + 1 : NULL;
    size_t ntargs = A->na > base + 1 ? A->na - base - 1 : 0;
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv x = l.u.l->v[i];
        jv subject = by_attr ? attr_path(r, x, attr, A->line) : x;
        int ok = test ? jj_test(r, test, subject, targs, ntargs, A->line) : jv_truthy(subject);
        if (ok == keep_true)
            list_push(r, &out, &cap, x);
    }
    return out;
}

static jv f_map(jrender *r, jv seq, const jargs *A)
{
    jv l = jj_iter_list(r, seq, A->line);
    jv out = jv_list_new(r->st, l.u.l->n, 0);
    jv attr = arg(A, 1000, "attribute", jv_undef(NULL));
    if (attr.t != JV_UNDEF) {
        jv def = arg(A, 1000, "default", jv_undef(NULL));
        for (size_t i = 0; i < l.u.l->n; i++) {
            jv x = attr_path(r, l.u.l->v[i], attr, A->line);
            out.u.l->v[i] = (x.t == JV_UNDEF && def.t != JV_UNDEF) ? def : x;
        }
        return out;
    }
    if (A->na == 0 || A->a[0].t != JV_STR)
        jfail(r->st, A->line, "map requires a filter name or attribute=");
    const char *fname = ja_strndup(r->st, A->a[0].u.s.p, A->a[0].u.s.n);
    for (size_t i = 0; i < l.u.l->n; i++)
        out.u.l->v[i] = jj_filter(r, fname, l.u.l->v[i], A->a + 1, A->na - 1, A->kwn, A->kwv,
                                  A->nkw, A->line);
    return out;
}

static const char *const FILTERS[] = {
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "format", "indent", "int", "items", "join", "last", "length", "list", "lower",
    "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe",
    "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "unique",
    "upper", "wordcount", "batch", "center", "truncate", "forceescape", "striptags", NULL};

int jj_filter_exists(const char *name) { return find_name(FILTERS, name, strlen(name)) >= 0; }

static jv as_str(jrender *r, jv v) { return jv_stringify(r->st, v); }

static jv f_round(jrender *r, jv v, const jargs *A)
{
    int64_t prec = int_arg(r, arg(A, 0, "precision", jv_int(0)), 0, A->line);
    jv m = arg(A, 1, "method", S("common"));
    if (!jv_is_number(v))
        jfail(r->st, A->line, "type %s doesn't define __round__ method", jv_type_name(v));
    double x = jv_num(v), p10 = pow(10.0, (double)prec);
    if (m.t == JV_STR && m.u.s.n == 4 && !memcmp(m.u.s.p, "ceil", 4))
        return jv_float(ceil(x * p10) / p10);
    if (m.t == JV_STR && m.u.s.n == 5 && !memcmp(m.u.s.p, "floor", 5))
        return jv_float(floor(x * p10) / p10);
    if (m.t != JV_STR || m.u.s.n != 6 || memcmp(m.u.s.p, "common", 6))
        jfail(r->st, A->line, "method must be common, ceil or floor");
    if (v.t != JV_FLOAT)   /* round(int, n) stays an int */
        return v.t == JV_BOOL ? jv_int(v.u.b) : v;
    if (!isfinite(x))
        return v;
    /* Python rounds the exact binary value half-to-even: printf does too */
    char buf[512];
    if (prec >= 0 && prec < 300) {
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
        return jv_float(strtod(buf, NULL));
    }
    return jv_float(rint(x * p10) / p10);
}

static jv filter_impl(jrender *r, const char *f, jv v, jv *args, size_t nargs,
                      const char **kwn, jv *kwv, size_t nkw, int line);

/* The filters jinja2 implements as generators run lazily there: their
 * result is always truthy and their errors surface only on iteration.
 * They run eagerly here, with any error kept inside the result. */
static const char *const GEN_FILTERS[] = {"select", "reject", "selectattr", "rejectattr", "map",
                                          "unique", "items", NULL};

static jv gen_filter(jrender *r, const char *f, jv v, jv *args, size_t nargs, const char **kwn,
                     jv *kwv, size_t nkw, int line)
{
    jstate *st = r->st;
    jmp_buf saved;
    memcpy(saved, st->jb, sizeof(jmp_buf));
    int depth = r->depth;
    jv out;
    if (setjmp(st->jb) == 0) {
        if (!strcmp(f, "items")) {
            if (v.t == JV_UNDEF)
                out = jv_list_new(st, 0, 0);
            else if (v.t != JV_DICT)
                jfail(st, line, "Can only get item pairs from a mapping.");
            else
                out = items_list(r, v.u.d);
        } else {
            out = filter_impl(r, f, v, args, nargs, kwn, kwv, nkw, line);
        }
        memcpy(st->jb, saved, sizeof(jmp_buf));
    } else {
        memcpy(st->jb, saved, sizeof(jmp_buf));
        r->depth = depth;
        out = jv_list_new(st, 0, 0);
        out.u.l->err = ja_strndup(st, st->err, strlen(st->err));
    }
    out.u.l->kind = JL_GEN;
    return out;
}

jv jj_filter(jrender *r, const char *name, jv v, jv *args, size_t nargs, const char **kwn,
             jv *kwv, size_t nkw, int line)
{
    int id = find_name(FILTERS, name, strlen(name));
    if (id < 0)
        jfail(r->st, line, "no filter named '%s'", name);
    if (find_name(GEN_FILTERS, name, strlen(name)) >= 0)
        return gen_filter(r, FILTERS[id], v, args, nargs, kwn, kwv, nkw, line);
    return filter_impl(r, FILTERS[id], v, args, nargs, kwn, kwv, nkw, line);
}

static jv filter_impl(jrender *r, const char *f, jv v, jv *args, size_t nargs,
                      const char **kwn, jv *kwv, size_t nkw, int line)
{
    jargs A = {args, nargs, kwn, kwv, nkw, line};
#define IS(x) (!strcmp(f, x))
    if (IS("default") || IS("d")) {
        jv def = arg(&A, 0, "default_value", S(""));
        int boolean = jv_truthy(arg(&A, 1, "boolean", jv_bool(0)));
        if (v.t == JV_UNDEF || (boolean && !jv_truthy(v)))
            return def;
        return v;
    }
    if (IS("safe")) return v;
    if (IS("length") || IS("count")) {
        switch (v.t) {
        case JV_UNDEF: return jv_int(0);
        case JV_STR: return jv_int((int64_t)ju_len(v.u.s.p, v.u.s.n));
        case JV_LIST:
            if (v.u.l->kind == JL_GEN)
                jfail(r->st, line, "object of type 'generator' has no len()");
            return jv_int((int64_t)v.u.l->n);
        case JV_DICT: return jv_int((int64_t)v.u.d->n);
        default: jfail(r->st, line, "object of type '%s' has no len()", jv_type_name(v));
        }
    }
    if (IS("tojson")) return f_tojson(r, v, &A);
    if (IS("string")) return as_str(r, v);
    if (IS("trim")) return py_strip(as_str(r, v), arg(&A, 0, "chars", jv_none()), 3);
    if (IS("upper")) return map_cps(r, as_str(r, v), to_upper);
    if (IS("lower")) return map_cps(r, as_str(r, v), to_lower);
    if (IS("title")) return jinja_title(r, as_str(r, v));
    if (IS("capitalize")) return py_capitalize(r, as_str(r, v));
    if (IS("replace")) {
        jv s = as_str(r, v);
        jv old = str_arg(r, &A, 0, "old", "replace"), nw = str_arg(r, &A, 1, "new", "replace");
        return py_replace(r, s, old, nw, int_arg(r, arg(&A, 2, "count", jv_none()), -1, line));
    }
    if (IS("indent")) {   /* jinja does `s += "\n"` on the raw value */
        if (v.t != JV_STR)
            jfail(r->st, line, "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(v));
        return f_indent(r, v, &A);
    }
    if (IS("e") || IS("escape") || IS("forceescape")) {
        jv s = as_str(r, v);
        jbuf b = {0};
        for (size_t i = 0; i < s.u.s.n; i++) {
            char c = s.u.s.p[i];
            const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;"
                          : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : NULL;
            if (e)
                jb_puts(r->st, &b, e);
            else
                jb_putc(r->st, &b, c);
        }
        return jv_strn(b.p ? b.p : "", b.n);
    }
    if (IS("wordcount")) {   /* runs of \w (letters, digits, _) */
        jv s = as_str(r, v);
        int64_t words = 0;
        int in_word = 0;
        uint32_t cp;
        for (size_t i = 0; i < s.u.s.n;) {
            i = ju_next(s.u.s.p, s.u.s.n, i, &cp);
            utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
            int w = cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
                    (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
            if (w && !in_word)
                words++;
            in_word = w;
        }
        return jv_int(words);
    }
    if (IS("format")) {
        jv fmtargs = jv_list_new(r->st, nargs, 1);
        for (size_t i = 0; i < nargs; i++)
            fmtargs.u.l->v[i] = args[i];
        return jj_percent_format(r, as_str(r, v), fmtargs, line);
    }
    if (IS("center")) {
        jv s = as_str(r, v);
        int64_t w = int_arg(r, arg(&A, 0, "width", jv_int(80)), 80, line);
        int64_t len = (int64_t)ju_len(s.u.s.p, s.u.s.n);
        if (w <= len || w > (1 << 20))
            return s;
        int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
        jbuf b = {0};
        for (int64_t i = 0; i < left; i++)
            jb_putc(r->st, &b, ' ');
        jb_put(r->st, &b, s.u.s.p, s.u.s.n);
        for (int64_t i = 0; i < pad - left; i++)
            jb_putc(r->st, &b, ' ');
        return jv_strn(b.p, b.n);
    }
    if (IS("join")) {
        jv sep = arg(&A, 0, "d", S(""));
        jv attr = arg(&A, 1, "attribute", jv_none());
        if (sep.t != JV_STR)
            sep = as_str(r, sep);
        jv l = jj_iter_list(r, v, line);
        if (attr.t != JV_NONE) {
            jv m = jv_list_new(r->st, l.u.l->n, 0);
            for (size_t i = 0; i < l.u.l->n; i++)
                m.u.l->v[i] = attr_path(r, l.u.l->v[i], attr, line);
            l = m;
        }
        return str_join(r, sep, l, 0, line);
    }
    if (IS("list")) return list_copy(r, jj_iter_list(r, v, line));

    if (IS("first") || IS("last")) {
        if (IS("last") && v.t == JV_LIST && v.u.l->kind == JL_GEN)
            jfail(r->st, line, "'generator' object is not reversible");
        jv l = jj_iter_list(r, v, line);
        if (!l.u.l->n)
            return jv_undef("first");
        return IS("first") ? l.u.l->v[0] : l.u.l->v[l.u.l->n - 1];
    }
    if (IS("reverse")) {
        if (v.t == JV_STR) {
            jv l = jj_iter_list(r, v, line);
            jbuf b = {0};
            for (size_t i = l.u.l->n; i-- > 0;)
                jb_put(r->st, &b, l.u.l->v[i].u.s.p, l.u.l->v[i].u.s.n);
            return jv_strn(b.p ? b.p : "", b.n);
        }
        int lazy = v.t == JV_LIST && v.u.l->kind != JL_GEN;   /* reversed(): an iterator */
        jv l = jj_iter_list(r, v, line);
        jv out = jv_list_new(r->st, l.u.l->n, 0);
        for (size_t i = 0; i < l.u.l->n; i++)
            out.u.l->v[i] = l.u.l->v[l.u.l->n - 1 - i];
        if (lazy)
            out.u.l->kind = JL_GEN;
        return out;
    }
    if (IS("sort") || IS("dictsort")) {
        int dict = IS("dictsort");
        if (dict && v.t != JV_DICT)
            jfail(r->st, line, "'%s' object has no attribute 'items'", jv_type_name(v));
        jv l = dict ? items_list(r, v.u.d) : list_copy(r, jj_iter_list(r, v, line));
        int rev = jv_truthy(arg(&A, dict ? 2 : 0, "reverse", jv_bool(0)));
        int cs = jv_truthy(arg(&A, dict ? 0 : 1, "case_sensitive", jv_bool(0)));
        jv attr = dict ? jv_none() : arg(&A, 2, "attribute", jv_none());
        jv by = dict ? arg(&A, 1, "by", S("key")) : jv_none();
        size_t n = l.u.l->n;
        jv *keys = ja_alloc(r->st, (n ? n : 1) * sizeof *keys);
        for (size_t i = 0; i < n; i++) {
            jv x = l.u.l->v[i];
            if (dict)
                x = x.u.l->v[(by.t == JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5)) ? 1 : 0];
            keys[i] = sort_key(r, x, attr, cs, line);
        }
        merge_sort(r, l.u.l->v, keys, n, rev, line);
        return l;
    }
    if (IS("unique")) {
        jv l = jj_iter_list(r, v, line);   /* (lazy: see gen_filter) */
        int cs = jv_truthy(arg(&A, 0, "case_sensitive", jv_bool(0)));
        jv attr = arg(&A, 1, "attribute", jv_none());
        jv out = jv_list_new(r->st, 0, 0), seen = jv_list_new(r->st, 0, 0);
        size_t cap = 0, cap2 = 0;
        for (size_t i = 0; i < l.u.l->n; i++) {
            jv k = sort_key(r, l.u.l->v[i], attr, cs, line);
            int dup = 0;
            for (size_t j = 0; j < seen.u.l->n && !dup; j++)
                dup = jv_equal(seen.u.l->v[j], k);
            if (!dup) {
                list_push(r, &seen, &cap2, k);
                list_push(r, &out, &cap, l.u.l->v[i]);
            }
        }
        return out;
    }
    if (IS("min") || IS("max")) {
        jv l = jj_iter_list(r, v, line);
        int cs = jv_truthy(arg(&A, 0, "case_sensitive", jv_bool(0)));
        jv attr = arg(&A, 1, "attribute", jv_none());
        if (!l.u.l->n)
            return jv_undef(f);
        size_t best = 0;
        jv bk = sort_key(r, l.u.l->v[0], attr, cs, line);
        for (size_t i = 1; i < l.u.l->n; i++) {
            jv k = sort_key(r, l.u.l->v[i], attr, cs, line);
            int c = jv_compare(r->st, k, bk, line);
            if (IS("min") ? c < 0 : c > 0) {
                best = i;
                bk = k;
            }
        }
        return l.u.l->v[best];
    }
    if (IS("sum")) {
        jv l = jj_iter_list(r, v, line);
        jv attr = arg(&A, 0, "attribute", jv_none());
        jv acc = arg(&A, 1, "start", jv_int(0));
        for (size_t i = 0; i < l.u.l->n; i++) {
            jv x = attr.t != JV_NONE ? attr_path(r, l.u.l->v[i], attr, line) : l.u.l->v[i];
            if (!jv_is_number(x) || !jv_is_number(acc))
                jfail(r->st, line, "unsupported operand type(s) for +: '%s' and '%s'",
                      jv_type_name(acc), jv_type_name(x));
            if (acc.t == JV_FLOAT || x.t == JV_FLOAT)
                acc = jv_float(jv_num(acc) + jv_num(x));
            else {
                int64_t s;
                if (__builtin_add_overflow(acc.t == JV_INT ? acc.u.i : acc.u.b,
                                           x.t == JV_INT ? x.u.i : x.u.b, &s))
                    jfail(r->st, line, "integer overflow");
                acc = jv_int(s);
            }
        }
        return acc;
    }
    if (IS("map")) return f_map(r, v, &A);
    if (IS("select")) return f_select(r, v, &A, 0, 1);
    if (IS("reject")) return f_select(r, v, &A, 0, 0);
    if (IS("selectattr")) return f_select(r, v, &A, 1, 1);
    if (IS("rejectattr")) return f_select(r, v, &A, 1, 0);
    if (IS("attr")) {   /* Python attributes only: dict keys are not attributes */
        jv nm = str_arg(r, &A, 0, "name", "attr");
        if (v.t == JV_NS || jj_method_id(v, nm.u.s.p, nm.u.s.n) >= 0)
            return jj_getattr(r, v, nm.u.s.p, nm.u.s.n, line);
        return jv_undef(ja_strndup(r->st, nm.u.s.p, nm.u.s.n));
    }
    if (IS("abs")) {
        if (v.t == JV_INT) {
            if (v.u.i == INT64_MIN)
                jfail(r->st, line, "integer overflow");
            return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == JV_BOOL) return jv_int(v.u.b);
        if (v.t == JV_FLOAT) return jv_float(fabs(v.u.f));
        jfail(r->st, line, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    if (IS("int")) {
        jv def = arg(&A, 0, "default", jv_int(0));
        if (v.t == JV_UNDEF)
            jfail(r->st, line, "'%s' is undefined", v.u.s.p ? v.u.s.p : "value");
        if (v.t == JV_INT) return v;
        if (v.t == JV_BOOL) return jv_int(v.u.b);
        if (v.t == JV_FLOAT) {
            if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18)
                return def;
            return jv_int((int64_t)v.u.f);
        }
        if (v.t == JV_STR) {
            char *tmp = ja_strndup(r->st, v.u.s.p, v.u.s.n), *end;
            jv t = py_strip(jv_strn(tmp, v.u.s.n), jv_none(), 3);
            tmp = ja_strndup(r->st, t.u.s.p, t.u.s.n);
            errno = 0;
            long long x = strtoll(tmp, &end, 10);
            if (*tmp && !*end && !errno)
                return jv_int(x);
            double d = strtod(tmp, &end);   /* jinja falls back to int(float(s)) */
            if (*tmp && !*end && isfinite(d) && fabs(d) < 9.2e18)
                return jv_int((int64_t)d);
        }
        return def;
    }
    if (IS("float")) {
        jv def = arg(&A, 0, "default", jv_float(0.0));
        if (v.t == JV_UNDEF)
            jfail(r->st, line, "'%s' is undefined", v.u.s.p ? v.u.s.p : "value");
        if (v.t == JV_FLOAT) return v;
        if (v.t == JV_INT) return jv_float((double)v.u.i);
        if (v.t == JV_BOOL) return jv_float(v.u.b);
        if (v.t == JV_STR) {
            jv t = py_strip(v, jv_none(), 3);
            char *tmp = ja_strndup(r->st, t.u.s.p, t.u.s.n), *end;
            double d = strtod(tmp, &end);
            if (*tmp && !*end)
                return jv_float(d);
        }
        return def;
    }
    if (IS("round")) return f_round(r, v, &A);
    jfail(r->st, line, "filter '%s' is not supported", f);
#undef IS
}

/* ------------------------------------------------------------ globals */

static const char *const GLOBALS[] = {"range", "namespace", "dict", "raise_exception",
                                      "strftime_now", NULL};

int jj_global_id(const char *name) { return find_name(GLOBALS, name, strlen(name)); }

jv jj_call_global(jrender *r, int id, jv *args, size_t nargs, const char **kwn, jv *kwv,
                  size_t nkw, int line)
{
    switch (id) {
    case 0: {   /* range: the sandbox caps it at 100000 items */
        int64_t a = 0, b, s = 1;
        if (nargs == 0 || nargs > 3)
            jfail(r->st, line, "range expected 1 to 3 arguments, got %zu", nargs);
        for (size_t i = 0; i < nargs; i++)
            if (args[i].t != JV_INT && args[i].t != JV_BOOL)
                jfail(r->st, line, "'%s' object cannot be interpreted as an integer",
                      jv_type_name(args[i]));
        if (nargs == 1)
            b = int_arg(r, args[0], 0, line);
        else {
            a = int_arg(r, args[0], 0, line);
            b = int_arg(r, args[1], 0, line);
            if (nargs == 3)
                s = int_arg(r, args[2], 1, line);
        }
        if (s == 0)
            jfail(r->st, line, "range() arg 3 must not be zero");
        double cnt = s > 0 ? ceil(((double)b - (double)a) / (double)s)
                           : ceil(((double)a - (double)b) / (double)-s);
        if (cnt < 0)
            cnt = 0;
        if (cnt > 100000)
            jfail(r->st, line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jv l = jv_list_new(r->st, (size_t)cnt, 0);
        for (size_t i = 0; i < (size_t)cnt; i++)
            l.u.l->v[i] = jv_int(a + (int64_t)i * s);
        return l;
    }
    case 1:     /* namespace(mapping?, **kw) */
    case 2: {   /* dict(mapping?, **kw) */
        jv d = jv_dict_new(r->st);
        if (id == 1)
            d.t = JV_NS;
        if (nargs > 1)
            jfail(r->st, line, "%s expected at most 1 positional argument", GLOBALS[id]);
        if (nargs == 1) {
            if (args[0].t != JV_DICT)
                jfail(r->st, line, "%s: the positional argument must be a mapping", GLOBALS[id]);
            for (size_t i = 0; i < args[0].u.d->n; i++)
                jdict_set(r->st, d.u.d, args[0].u.d->k[i], args[0].u.d->v[i]);
        }
        for (size_t i = 0; i < nkw; i++)
            jdict_set(r->st, d.u.d, S(kwn[i]), kwv[i]);
        return d;
    }
    case 3: {   /* raise_exception(message) */
        jv m = nargs ? jv_stringify(r->st, args[0]) : S("");
        jfail(r->st, line, "%.*s", (int)(m.u.s.n > 380 ? 380 : m.u.s.n), m.u.s.p);
    }
    case 4: {   /* strftime_now(format) */
        if (!nargs || args[0].t != JV_STR)
            jfail(r->st, line, "strftime_now expects a format string");
        char fmt[256], out[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)args[0].u.s.n, args[0].u.s.p);
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t k = strftime(out, sizeof out, fmt, &tmv);
        return jv_str_copy(r->st, out, k);
    }
    }
    jfail(r->st, line, "internal error: unknown global");
}
