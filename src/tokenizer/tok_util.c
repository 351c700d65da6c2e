/* tok_util.c - growable buffers, strict UTF-8, hashing and the two open
 * addressing hash tables (vocab string -> id, id pair -> merge) that make
 * loading a 150k-token vocabulary and BPE merging fast. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* ---- containers ---- */

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = nc;
    return 0;
}

int tok_buf_reserve(tok_buf *b, size_t extra)
{
    /* one spare byte so callers can NUL-terminate */
    return grow((void **)&b->p, &b->cap, b->n + extra + 1, 1);
}

int tok_buf_put(tok_buf *b, const void *s, size_t n)
{
    if (tok_buf_reserve(b, n))
        return -1;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void tok_buf_free(tok_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

int tok_ids_push(tok_ids *v, int32_t id)
{
    if (grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p))
        return -1;
    v->p[v->n++] = id;
    return 0;
}

int tok_ids_append(tok_ids *v, const int32_t *ids, size_t n)
{
    if (grow((void **)&v->p, &v->cap, v->n + n, sizeof *v->p))
        return -1;
    if (n)
        memcpy(v->p + v->n, ids, n * sizeof *ids);
    v->n += n;
    return 0;
}

int tok_sizes_push2(tok_sizes *v, size_t a, size_t b)
{
    if (grow((void **)&v->p, &v->cap, v->n + 2, sizeof *v->p))
        return -1;
    v->p[v->n++] = a;
    v->p[v->n++] = b;
    return 0;
}

int tok_pieces_push(tok_pieces *v, size_t off, size_t len, int first)
{
    if (grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p))
        return -1;
    v->p[v->n].off = off;
    v->p[v->n].len = len;
    v->p[v->n].first = first;
    v->n++;
    return 0;
}

/* ---- UTF-8 ---- */

/* Bounds of the first continuation byte after lead byte c (Unicode table 3-7);
 * the others are always 80..BF. Returns the number of continuation bytes, or
 * -1 when c cannot start a character. */
static int utf8_lead(unsigned c, unsigned *lo, unsigned *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        return 1;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;  /* no surrogates */
        return 2;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;  /* <= U+10FFFF */
        return 3;
    }
    return -1;
}

int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (!n)
        return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    unsigned lo, hi;
    int need = utf8_lead(c, &lo, &hi);
    if (need < 0 || (size_t)need + 1 > n)
        return 0;
    uint32_t v = c & (0x3Fu >> need);
    for (int i = 1; i <= need; i++) {
        unsigned b = s[i];
        if (i == 1 ? (b < lo || b > hi) : ((b & 0xC0) != 0x80))
            return 0;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return need + 1;
}

int tok_utf8_put(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tok_utf8_check(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int l = tok_utf8_next(u + i, n - i, &cp);
        if (!l)
            return i;
        i += (size_t)l;
    }
    return n;
}

/* Length of the maximal subpart of an ill-formed sequence at s: the lead
 * byte plus the continuation bytes that were still acceptable. */
static size_t maximal_subpart(const unsigned char *s, size_t n)
{
    unsigned lo, hi;
    int need = utf8_lead(s[0], &lo, &hi);
    if (need < 0)
        return 1;
    size_t k = 1;
    for (int i = 0; i < need && k < n; i++, k++) {
        unsigned b = s[k];
        if (i == 0 ? (b < lo || b > hi) : ((b & 0xC0) != 0x80))
            break;
    }
    return k;
}

int tok_utf8_lossy(tok_buf *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t ok = tok_utf8_check(s + i, n - i);
        if (tok_buf_put(out, s + i, ok))
            return -1;
        i += ok;
        if (i >= n)
            break;
        if (tok_buf_put(out, "\xEF\xBF\xBD", 3))
            return -1;
        i += maximal_subpart(u + i, n - i);
    }
    if (tok_buf_reserve(out, 0))
        return -1;
    out->p[out->n] = 0;
    return 0;
}

/* ---- hashing ---- */

uint64_t tok_hash(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n)
        memcpy(&w, s, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return h;
}

/* ---- GPT-2 byte <-> unicode ---- */

/* Printable bytes map to themselves; the other 68 (0-32, 127-160, 173) map
 * in order to U+0100.. U+0143, so every byte has a visible character. */
uint32_t tok_byte_to_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256 + b;
    if (b <= 160)
        return 256 + 33 + (b - 127);
    return 256 + 33 + 34;   /* 173 */
}

int tok_cp_to_byte(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp >= 256 && cp <= 288)
        return (int)(cp - 256);
    if (cp >= 289 && cp <= 322)
        return (int)(cp - 289 + 127);
    if (cp == 323)
        return 173;
    return -1;
}

/* ---- string map ---- */

static size_t pow2_for(size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2)
        cap *= 2;
    return cap;
}

int tok_strmap_init(tok_strmap *m, size_t expected, const char *base)
{
    size_t cap = pow2_for(expected);
    m->e = calloc(cap, sizeof *m->e);
    if (!m->e)
        return -1;
    m->mask = cap - 1;
    m->count = 0;
    m->base = base;
    return 0;
}

/* 0 marks an empty slot, so real hashes are never 0 */
static uint32_t str_hash(const char *k, size_t len)
{
    uint32_t h = (uint32_t)(tok_hash(k, len) >> 32);
    return h ? h : 1;
}

static tok_strent *strmap_slot(const tok_strmap *m, uint32_t h, const char *k, size_t len)
{
    size_t i = h & m->mask;
    for (;;) {
        tok_strent *s = &m->e[i];
        if (!s->h || (s->h == h && s->len == len && memcmp(m->base + s->koff, k, len) == 0))
            return s;
        i = (i + 1) & m->mask;
    }
}

int tok_strmap_put(tok_strmap *m, uint32_t koff, uint32_t len, int32_t val)
{
    if ((m->count + 1) * 2 > m->mask + 1) {
        tok_strmap big;
        if (tok_strmap_init(&big, m->count + 1, m->base))
            return -1;
        for (size_t i = 0; i <= m->mask; i++) {
            const tok_strent *o = &m->e[i];
            if (o->h)
                *strmap_slot(&big, o->h, m->base + o->koff, o->len) = *o;
        }
        big.count = m->count;
        free(m->e);
        *m = big;
    }
    const char *k = m->base + koff;
    uint32_t h = str_hash(k, len);
    tok_strent *s = strmap_slot(m, h, k, len);
    if (!s->h)
        m->count++;
    *s = (tok_strent){h, len, val, koff};
    return 0;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *k, size_t len)
{
    if (!m->e)
        return -1;
    const tok_strent *s = strmap_slot(m, str_hash(k, len), k, len);
    return s->h ? s->val : -1;
}

void tok_strmap_free(tok_strmap *m)
{
    free(m->e);
    m->e = NULL;
}

/* ---- pair map ---- */

#define PAIR_EMPTY UINT64_MAX

static uint64_t pair_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

static size_t pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return (size_t)k;
}

int tok_pairmap_init(tok_pairmap *m, size_t expected)
{
    size_t cap = pow2_for(expected);
    m->e = malloc(cap * sizeof *m->e);
    if (!m->e)
        return -1;
    for (size_t i = 0; i < cap; i++)
        m->e[i].key = PAIR_EMPTY;
    m->mask = cap - 1;
    m->count = 0;
    return 0;
}

static tok_pairent *pair_slot(const tok_pairmap *m, uint64_t key)
{
    size_t i = pair_hash(key) & m->mask;
    while (m->e[i].key != PAIR_EMPTY && m->e[i].key != key)
        i = (i + 1) & m->mask;
    return &m->e[i];
}

int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    if ((m->count + 1) * 2 > m->mask + 1) {
        tok_pairmap big;
        if (tok_pairmap_init(&big, m->count + 1))
            return -1;
        for (size_t i = 0; i <= m->mask; i++)
            if (m->e[i].key != PAIR_EMPTY)
                *pair_slot(&big, m->e[i].key) = m->e[i];
        big.count = m->count;
        free(m->e);
        *m = big;
    }
    uint64_t key = pair_key(a, b);
    tok_pairent *s = pair_slot(m, key);
    if (s->key != key)
        m->count++;
    s->key = key;
    s->rank = rank;
    s->id = id;
    return 0;
}

const tok_pairent *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b)
{
    uint64_t key = pair_key(a, b);
    const tok_pairent *s = pair_slot(m, key);
    return s->key == key ? s : NULL;
}

void tok_pairmap_free(tok_pairmap *m)
{
    free(m->e);
    m->e = NULL;
}

int tok_is_ws(uint32_t cp)
{
    if (cp < 0x80)
        return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}
