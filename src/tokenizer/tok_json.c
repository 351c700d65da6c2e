/* tok_json.c - a minimal JSON scanner for the two huge members of
 * tokenizer.json (model.vocab, model.merges: ~300k strings for Qwen2).
 * Building a cJSON tree for them costs more than our whole load budget, so
 * they are cut out of the text, read straight into the vocab arena and the
 * merge table, and cJSON parses only what is left. */
#include <string.h>

#include "tokenizer/tok_json.h"

const char *tok_json_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

static int hex4(const char *p, const char *end, uint32_t *v)
{
    if (end - p < 4)
        return -1;
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        x = x * 16 + (uint32_t)d;
    }
    *v = x;
    return 0;
}

const char *tok_json_string(const char *p, const char *end, tok_buf *out)
{
    if (p >= end || *p != '"')
        return NULL;
    p++;
    for (;;) {
        const char *q = p;
        while (q < end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20)
            q++;
        if (out && tok_buf_put(out, p, (size_t)(q - p)))
            return NULL;
        if (q >= end || (unsigned char)*q < 0x20)
            return NULL;
        if (*q == '"')
            return q + 1;
        /* escape */
        if (q + 1 >= end)
            return NULL;
        char c = q[1], lit;
        p = q + 2;
        switch (c) {
        case '"': lit = '"'; break;
        case '\\': lit = '\\'; break;
        case '/': lit = '/'; break;
        case 'b': lit = '\b'; break;
        case 'f': lit = '\f'; break;
        case 'n': lit = '\n'; break;
        case 'r': lit = '\r'; break;
        case 't': lit = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(p, end, &cp))
                return NULL;
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (end - p >= 6 && p[0] == '\\' && p[1] == 'u' && hex4(p + 2, end, &lo) == 0 &&
                    lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                } else {
                    cp = 0xFFFD;    /* lone surrogate */
                }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                cp = 0xFFFD;
            }
            char enc[4];
            int l = tok_utf8_put(cp, enc);
            if (out && tok_buf_put(out, enc, (size_t)l))
                return NULL;
            continue;
        }
        default:
            return NULL;
        }
        if (out && tok_buf_put(out, &lit, 1))
            return NULL;
    }
}

const char *tok_json_skip(const char *p, const char *end)
{
    p = tok_json_ws(p, end);
    if (p >= end)
        return NULL;
    if (*p == '"')
        return tok_json_string(p, end, NULL);
    if (*p == '{' || *p == '[') {
        /* nesting depth only; strings are skipped whole so their brackets
         * do not count */
        int depth = 0;
        while (p < end) {
            char c = *p;
            if (c == '"') {
                p = tok_json_string(p, end, NULL);
                if (!p)
                    return NULL;
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if (c == '}' || c == ']') {
                if (--depth == 0)
                    return p + 1;
            }
            p++;
        }
        return NULL;
    }
    /* number, true, false, null */
    const char *q = p;
    while (q < end && *q != ',' && *q != '}' && *q != ']' && *q != ' ' && *q != '\n' &&
           *q != '\r' && *q != '\t')
        q++;
    return q > p ? q : NULL;
}

/* Finds member `key` of the object starting at p; sets the value's span. */
static int find_member(const char *p, const char *end, const char *key, const char **vs,
                       const char **ve)
{
    p = tok_json_ws(p, end);
    if (p >= end || *p != '{')
        return -1;
    p++;
    size_t klen = strlen(key);
    for (;;) {
        p = tok_json_ws(p, end);
        if (p < end && *p == '}')
            return -1;
        const char *ks = p;
        p = tok_json_string(p, end, NULL);
        if (!p)
            return -1;
        int hit = (size_t)(p - ks) == klen + 2 && memcmp(ks + 1, key, klen) == 0;
        p = tok_json_ws(p, end);
        if (p >= end || *p != ':')
            return -1;
        const char *v = tok_json_ws(p + 1, end);
        p = tok_json_skip(v, end);
        if (!p)
            return -1;
        if (hit) {
            *vs = v;
            *ve = p;
            return 0;
        }
        p = tok_json_ws(p, end);
        if (p >= end || *p != ',')
            return -1;
        p++;
    }
}

int tok_json_model_parts(const char *s, size_t n, size_t vocab[2], size_t merges[2])
{
    const char *end = s + n, *ms, *me, *a, *b;
    vocab[0] = vocab[1] = merges[0] = merges[1] = 0;
    if (find_member(s, end, "model", &ms, &me))
        return -1;
    if (find_member(ms, me, "vocab", &a, &b) == 0) {
        vocab[0] = (size_t)(a - s);
        vocab[1] = (size_t)(b - s);
    }
    if (find_member(ms, me, "merges", &a, &b) == 0) {
        merges[0] = (size_t)(a - s);
        merges[1] = (size_t)(b - s);
    }
    return 0;
}
