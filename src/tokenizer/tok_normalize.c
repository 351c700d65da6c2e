/* tok_normalize.c - patterns (literal or PCRE2 regex) and the normalizers:
 * NFC/NFD/NFKC/NFKD (utf8proc), Lowercase, Prepend, Replace, Strip and
 * Sequence, as HF tokenizers applies them to each segment of text between
 * added tokens. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

/* ---- JSON helpers shared by the parse functions ---- */

int tok_json_type(const cJSON *j, const char *file, const char *where, const char **type,
                  mx_err *e)
{
    if (!cJSON_IsObject(j))
        return mx_fail(e, MX_EFORMAT, "%s: %s is not an object", file, where);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t))
        return mx_fail(e, MX_EFORMAT, "%s: %s.type is missing", file, where);
    *type = t->valuestring;
    return MX_OK;
}

int tok_parse_sequence(const cJSON *j, const char *key, const char *file, const char *where,
                       size_t elem_size, tok_kid_parse parse, void **kids, int *n_kids, mx_err *e)
{
    *kids = NULL;
    *n_kids = 0;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsArray(arr))
        return mx_fail(e, MX_EFORMAT, "%s: %s.%s is not an array", file, where, key);
    unsigned char *a = calloc((size_t)cJSON_GetArraySize(arr) + 1, elem_size);
    if (!a)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    *kids = a;
    const cJSON *k;
    char sub[256];
    cJSON_ArrayForEach(k, arr) {
        snprintf(sub, sizeof sub, "%s.%s[%d]", where, key, *n_kids);
        int rc = parse(k, file, sub, a + (size_t)*n_kids * elem_size, e);
        ++*n_kids;
        if (rc)
            return rc;
    }
    return MX_OK;
}

/* ---- patterns ---- */

int tok_regex_compile(const char *src, size_t len, pcre2_code **out, const char *file,
                      const char *where, mx_err *e)
{
    int ec;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)src, len, PCRE2_UTF | PCRE2_UCP, &ec, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return mx_fail(e, MX_EUNSUPPORTED, "%s: %s: regex does not compile at offset %zu: %s",
                       file, where, (size_t)eoff, (const char *)msg);
    }
    /* JIT makes the split regex several times faster; without it (e.g. an
     * unsupported CPU) the interpreter still works. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return MX_OK;
}

int tok_pattern_parse(const cJSON *j, const char *file, const char *where, tok_pattern *out,
                      mx_err *e)
{
    memset(out, 0, sizeof *out);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "Regex");
    if (cJSON_IsString(s)) {
        out->lit = strdup(s->valuestring);
        if (!out->lit)
            return mx_fail(e, MX_ENOMEM, "%s: %s: out of memory", file, where);
        out->lit_len = strlen(s->valuestring);
        return MX_OK;
    }
    if (cJSON_IsString(r))
        return tok_regex_compile(r->valuestring, strlen(r->valuestring), &out->re, file, where,
                                 e);
    return mx_fail(e, MX_EFORMAT, "%s: %s must be {\"String\": ...} or {\"Regex\": ...}", file,
                   where);
}

void tok_pattern_free(tok_pattern *p)
{
    free(p->lit);
    if (p->re)
        pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

static int regex_match(const pcre2_code *re, const char *s, size_t n, size_t pos,
                       pcre2_match_data *md)
{
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
    /* The JIT has a small fixed stack; a pathological input (a huge run of
     * whitespace before a lookahead) can exhaust it: run the interpreter. */
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    return rc;
}

int tok_pattern_find(const tok_pattern *p, const char *s, size_t n, tok_sizes *spans,
                     pcre2_match_data *md)
{
    if (p->re) {
        size_t pos = 0;
        while (pos <= n) {
            int rc = regex_match(p->re, s, n, pos, md);
            if (rc == PCRE2_ERROR_NOMATCH)
                break;
            if (rc < 0)
                return -2;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t a = ov[0], b = ov[1];
            if (b > a) {
                if (tok_sizes_push2(spans, a, b))
                    return -1;
                pos = b;
            } else {
                /* empty match: step over one character */
                if (a >= n)
                    break;
                uint32_t cp;
                int l = tok_utf8_next((const unsigned char *)s + a, n - a, &cp);
                pos = a + (size_t)(l ? l : 1);
            }
        }
        return 0;
    }
    if (!p->lit_len)
        return 0;
    size_t pos = 0;
    while (pos + p->lit_len <= n) {
        const char *m = memmem(s + pos, n - pos, p->lit, p->lit_len);
        if (!m)
            break;
        size_t a = (size_t)(m - s);
        if (tok_sizes_push2(spans, a, a + p->lit_len))
            return -1;
        pos = a + p->lit_len;
    }
    return 0;
}

/* ---- normalizers ---- */

static int is_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return 0;
    return 1;
}

static int norm_unicode(int type, const char *s, size_t n, tok_buf *out)
{
    if (is_ascii(s, n))     /* every normal form leaves ASCII alone */
        return tok_buf_put(out, s, n);
    int opts = UTF8PROC_STABLE;
    if (type == NORM_NFC || type == NORM_NFKC)
        opts |= UTF8PROC_COMPOSE;
    else
        opts |= UTF8PROC_DECOMPOSE;
    if (type == NORM_NFKC || type == NORM_NFKD)
        opts |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)opts);
    if (r < 0)
        return -1;
    int rc = tok_buf_put(out, dst, (size_t)r);
    free(dst);
    return rc;
}

static int norm_lower(const char *s, size_t n, tok_buf *out)
{
    if (tok_buf_reserve(out, n))
        return -1;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            char c = (char)(u[i] >= 'A' && u[i] <= 'Z' ? u[i] + 32 : u[i]);
            if (tok_buf_put(out, &c, 1))
                return -1;
            i++;
            continue;
        }
        uint32_t cp;
        int l = tok_utf8_next(u + i, n - i, &cp);
        if (!l)
            return -1;
        char enc[4];
        int el = tok_utf8_put((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
        if (tok_buf_put(out, enc, (size_t)el))
            return -1;
        i += (size_t)l;
    }
    return 0;
}

static int norm_replace(const tok_norm *nm, const char *s, size_t n, tok_buf *out,
                        pcre2_match_data *md)
{
    tok_sizes spans = {0};
    int rc = tok_pattern_find(&nm->pat, s, n, &spans, md);
    size_t prev = 0;
    for (size_t i = 0; rc == 0 && i < spans.n; i += 2) {
        if (tok_buf_put(out, s + prev, spans.p[i] - prev) ||
            tok_buf_put(out, nm->str, nm->str_len))
            rc = -1;
        prev = spans.p[i + 1];
    }
    if (rc == 0)
        rc = tok_buf_put(out, s + prev, n - prev);
    free(spans.p);
    return rc;
}

static int norm_strip(const tok_norm *nm, const char *s, size_t n, tok_buf *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n;
    uint32_t cp;
    int l;
    while (nm->strip_left && a < b && (l = tok_utf8_next(u + a, b - a, &cp)) && tok_is_ws(cp))
        a += (size_t)l;
    while (nm->strip_right && b > a) {
        size_t k = b - 1;
        while (k > a && (u[k] & 0xC0) == 0x80)
            k--;
        if (!tok_utf8_next(u + k, b - k, &cp) || !tok_is_ws(cp))
            break;
        b = k;
    }
    return tok_buf_put(out, s + a, b - a);
}

static int norm_apply(const tok_norm *nm, const char *s, size_t n, tok_buf *out,
                      pcre2_match_data *md)
{
    out->n = 0;
    switch (nm->type) {
    case NORM_NFC: case NORM_NFD: case NORM_NFKC: case NORM_NFKD:
        return norm_unicode(nm->type, s, n, out);
    case NORM_LOWERCASE:
        return norm_lower(s, n, out);
    case NORM_PREPEND:
        /* HF prepends only to non-empty text */
        if (n && tok_buf_put(out, nm->str, nm->str_len))
            return -1;
        return tok_buf_put(out, s, n);
    case NORM_REPLACE:
        return norm_replace(nm, s, n, out, md);
    case NORM_STRIP:
        return norm_strip(nm, s, n, out);
    case NORM_SEQUENCE: {
        tok_buf a = {0};
        int rc = tok_buf_put(out, s, n);
        for (int i = 0; rc == 0 && i < nm->n_kids; i++) {
            rc = norm_apply(&nm->kids[i], out->p, out->n, &a, md);
            tok_buf t = a;
            a = *out;
            *out = t;
        }
        tok_buf_free(&a);
        return rc;
    }
    }
    return -1;
}

int tok_normalize(const tok_norm *nm, const char *s, size_t n, tok_buf *out,
                  pcre2_match_data *md)
{
    int rc = norm_apply(nm, s, n, out, md);
    if (rc == 0 && tok_buf_reserve(out, 0))
        rc = -1;
    if (rc == 0)
        out->p[out->n] = 0;
    return rc;
}

void tok_norm_free(tok_norm *nm)
{
    if (!nm)
        return;
    free(nm->str);
    tok_pattern_free(&nm->pat);
    for (int i = 0; i < nm->n_kids; i++)
        tok_norm_free(&nm->kids[i]);
    free(nm->kids);
    memset(nm, 0, sizeof *nm);
}

static int dup_str(const cJSON *j, const char *key, char **out, size_t *len, const char *file,
                   const char *where, mx_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsString(v))
        return mx_fail(e, MX_EFORMAT, "%s: %s.%s is missing or not a string", file, where, key);
    *out = strdup(v->valuestring);
    if (!*out)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    *len = strlen(v->valuestring);
    return MX_OK;
}

static int parse_kid(const cJSON *j, const char *file, const char *where, void *out, mx_err *e)
{
    return tok_norm_parse(j, file, where, out, e);
}

int tok_norm_parse(const cJSON *j, const char *file, const char *where, tok_norm *out,
                   mx_err *e)
{
    memset(out, 0, sizeof *out);
    const char *type;
    int rc = tok_json_type(j, file, where, &type, e);
    if (rc)
        return rc;
    static const struct { const char *name; int type; } simple[] = {
        {"NFC", NORM_NFC}, {"NFD", NORM_NFD}, {"NFKC", NORM_NFKC}, {"NFKD", NORM_NFKD},
        {"Lowercase", NORM_LOWERCASE},
    };
    for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
        if (strcmp(type, simple[i].name) == 0) {
            out->type = simple[i].type;
            return MX_OK;
        }
    char sub[256];
    if (strcmp(type, "Prepend") == 0) {
        out->type = NORM_PREPEND;
        return dup_str(j, "prepend", &out->str, &out->str_len, file, where, e);
    }
    if (strcmp(type, "Replace") == 0) {
        out->type = NORM_REPLACE;
        if ((rc = dup_str(j, "content", &out->str, &out->str_len, file, where, e)))
            return rc;
        snprintf(sub, sizeof sub, "%s.pattern", where);
        return tok_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"), file, sub,
                                 &out->pat, e);
    }
    if (strcmp(type, "Strip") == 0) {
        out->type = NORM_STRIP;
        out->strip_left = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_left"));
        out->strip_right = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_right"));
        return MX_OK;
    }
    if (strcmp(type, "Sequence") == 0) {
        out->type = NORM_SEQUENCE;
        void *kids;
        rc = tok_parse_sequence(j, "normalizers", file, where, sizeof *out->kids, parse_kid, &kids,
                                &out->n_kids, e);
        out->kids = kids;
        return rc;
    }
    return mx_fail(e, MX_EUNSUPPORTED, "%s: %s.type '%s' is not supported", file, where, type);
}
