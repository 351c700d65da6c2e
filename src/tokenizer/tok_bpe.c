/* tok_bpe.c - the BPE model: a pre-token piece becomes one symbol per
 * character (byte-level char, or <0xNN> byte fallback, or unk), then the
 * adjacent pair with the lowest merge rank is merged until none is left.
 * Symbols form a linked list and candidate merges sit in a binary heap, as
 * in HF tokenizers, so long words cost O(n log n).  A shared cache keyed by
 * the piece text skips all of it for words already seen. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct { int32_t id, prev, next; } sym;
typedef struct { int32_t rank, pos, id; } cand;

struct tok_scratch {
    sym *syms;
    size_t scap;
    cand *heap;
    size_t hcap, hn;
    tok_buf key;
    tok_ids ids;
};

tok_scratch *tok_scratch_new(void)
{
    return calloc(1, sizeof(tok_scratch));
}

void tok_scratch_free(tok_scratch *s)
{
    if (!s)
        return;
    free(s->syms);
    free(s->heap);
    tok_buf_free(&s->key);
    free(s->ids.p);
    free(s);
}

/* ---- cache ---- */

#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_WORDS (CACHE_SLOTS / 2)
#define CACHE_MAX_KEY 64          /* longer pieces are rare; not worth keeping */
#define CACHE_MAX_BYTES (4u << 20)

typedef struct { uint64_t h; uint32_t koff, klen, voff, vn; } cent;

struct tok_cache {
    pthread_mutex_t mu;
    cent *slots;                  /* CACHE_SLOTS, allocated on first insert */
    size_t count;
    tok_buf keys;
    tok_ids vals;
};

tok_cache *tok_cache_new(void)
{
    tok_cache *c = calloc(1, sizeof *c);
    if (c && pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        c = NULL;
    }
    return c;
}

void tok_cache_free(tok_cache *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->mu);
    free(c->slots);
    tok_buf_free(&c->keys);
    free(c->vals.p);
    free(c);
}

static uint64_t cache_hash(const char *s, size_t n)
{
    return tok_hash(s, n) | 1;    /* 0 marks an empty slot */
}

/* Appends the cached ids of s to out; 1 on a hit. */
static int cache_get(tok_cache *c, uint64_t h, const char *s, size_t n, tok_ids *out)
{
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    if (c->slots) {
        for (size_t i = h & (CACHE_SLOTS - 1); c->slots[i].h; i = (i + 1) & (CACHE_SLOTS - 1)) {
            const cent *ce = &c->slots[i];
            if (ce->h == h && ce->klen == n && memcmp(c->keys.p + ce->koff, s, n) == 0) {
                /* a word of unknown characters may have no ids (and the
                 * buffer no storage yet) */
                hit = !ce->vn || tok_ids_append(out, c->vals.p + ce->voff, ce->vn) == 0;
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

static void cache_put(tok_cache *c, uint64_t h, const char *s, size_t n, const int32_t *ids,
                      size_t k)
{
    pthread_mutex_lock(&c->mu);
    if (!c->slots)
        c->slots = calloc(CACHE_SLOTS, sizeof *c->slots);
    if (c->slots && (c->count >= CACHE_MAX_WORDS || c->keys.n > CACHE_MAX_BYTES)) {
        /* full: start over rather than track recency */
        memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
        c->count = 0;
        c->keys.n = 0;
        c->vals.n = 0;
    }
    if (c->slots) {
        size_t koff = c->keys.n, voff = c->vals.n;
        if (tok_buf_put(&c->keys, s, n) == 0 && tok_ids_append(&c->vals, ids, k) == 0) {
            size_t i = h & (CACHE_SLOTS - 1);
            while (c->slots[i].h)
                i = (i + 1) & (CACHE_SLOTS - 1);
            c->slots[i] = (cent){h, (uint32_t)koff, (uint32_t)n, (uint32_t)voff, (uint32_t)k};
            c->count++;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- heap of merge candidates: lowest rank first, then leftmost ---- */

static int cand_less(cand a, cand b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static int heap_push(tok_scratch *sc, cand c)
{
    if (sc->hn == sc->hcap) {
        size_t nc = sc->hcap ? sc->hcap * 2 : 64;
        cand *q = realloc(sc->heap, nc * sizeof *q);
        if (!q)
            return -1;
        sc->heap = q;
        sc->hcap = nc;
    }
    size_t i = sc->hn++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(c, sc->heap[p]))
            break;
        sc->heap[i] = sc->heap[p];
        i = p;
    }
    sc->heap[i] = c;
    return 0;
}

static cand heap_pop(tok_scratch *sc)
{
    cand top = sc->heap[0], last = sc->heap[--sc->hn];
    size_t i = 0, n = sc->hn;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        cand best = last;
        if (l < n && cand_less(sc->heap[l], best)) {
            m = l;
            best = sc->heap[l];
        }
        if (l + 1 < n && cand_less(sc->heap[l + 1], best))
            m = l + 1;
        if (m == i)
            break;
        sc->heap[i] = sc->heap[m];
        i = m;
    }
    if (n)
        sc->heap[i] = last;
    return top;
}

static int push_pair(const mx_tokenizer *t, tok_scratch *sc, int32_t pos)
{
    int32_t nx = sc->syms[pos].next;
    if (nx < 0)
        return 0;
    const tok_pairent *pe = tok_pairmap_get(&t->merges, sc->syms[pos].id, sc->syms[nx].id);
    return pe ? heap_push(sc, (cand){pe->rank, pos, pe->id}) : 0;
}

static int add_sym(tok_scratch *sc, size_t *n, int32_t id)
{
    if (*n == sc->scap) {
        size_t nc = sc->scap ? sc->scap * 2 : 64;
        sym *q = realloc(sc->syms, nc * sizeof *q);
        if (!q)
            return -1;
        sc->syms = q;
        sc->scap = nc;
    }
    sc->syms[*n].id = id;
    (*n)++;
    return 0;
}

/* A character with no vocab entry: its <0xNN> bytes when byte_fallback has
 * them all, else unk (fused with a preceding unk when fuse_unk), else it is
 * dropped, as HF does. */
static int unknown_char(const mx_tokenizer *t, tok_scratch *sc, size_t *n,
                        const unsigned char *c, size_t l)
{
    if (t->byte_fallback) {
        size_t k = 0;
        while (k < l && t->fallback_ids[c[k]] >= 0)
            k++;
        if (k == l) {
            for (k = 0; k < l; k++)
                if (add_sym(sc, n, t->fallback_ids[c[k]]))
                    return -1;
            return 0;
        }
    }
    if (t->unk_id < 0)
        return 0;
    if (t->fuse_unk && *n && sc->syms[*n - 1].id == t->unk_id)
        return 0;
    return add_sym(sc, n, t->unk_id);
}

/* The text of the piece in vocab space (byte-level chars when byte_level). */
static int vocab_form(const mx_tokenizer *t, const char *s, size_t n, tok_buf *out)
{
    out->n = 0;
    if (!t->byte_level)
        return tok_buf_put(out, s, n);
    if (tok_buf_reserve(out, 2 * n))
        return -1;
    for (size_t i = 0; i < n; i++)
        out->n += (size_t)tok_utf8_put(tok_byte_to_cp((unsigned char)s[i]), out->p + out->n);
    return 0;
}

static int initial_symbols(const mx_tokenizer *t, const char *s, size_t len, tok_scratch *sc,
                           size_t *n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (t->byte_level && !t->cont_prefix_len && !t->eow_suffix_len) {
        for (size_t i = 0; i < len; i++) {
            int32_t id = t->byte_ids[u[i]];
            int rc = id >= 0 ? add_sym(sc, n, id) : unknown_char(t, sc, n, u + i, 1);
            if (rc)
                return rc;
        }
        return 0;
    }
    tok_buf form = {0};
    if (t->byte_level) {
        if (vocab_form(t, s, len, &form))
            return -1;
        s = form.p;
        len = form.n;
        u = (const unsigned char *)s;
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < len;) {
        uint32_t cp;
        int l = tok_utf8_next(u + i, len - i, &cp);
        if (!l)
            l = 1;
        int32_t id;
        if (!t->cont_prefix_len && !t->eow_suffix_len) {
            id = tok_strmap_get(&t->vocab, s + i, (size_t)l);
        } else {
            sc->key.n = 0;
            if ((i > 0 && tok_buf_put(&sc->key, t->cont_prefix, t->cont_prefix_len)) ||
                tok_buf_put(&sc->key, s + i, (size_t)l) ||
                (i + (size_t)l == len && tok_buf_put(&sc->key, t->eow_suffix, t->eow_suffix_len))) {
                rc = -1;
                break;
            }
            id = tok_strmap_get(&t->vocab, sc->key.p, sc->key.n);
        }
        rc = id >= 0 ? add_sym(sc, n, id) : unknown_char(t, sc, n, u + i, (size_t)l);
        i += (size_t)l;
    }
    tok_buf_free(&form);
    return rc;
}

static int merge_word(const mx_tokenizer *t, const char *s, size_t len, tok_scratch *sc,
                      tok_ids *out)
{
    if (t->ignore_merges) {
        /* the whole word is a token: take it without merging (Llama-3) */
        if (vocab_form(t, s, len, &sc->key))
            return -1;
        int32_t id = tok_strmap_get(&t->vocab, sc->key.p, sc->key.n);
        if (id >= 0)
            return tok_ids_push(out, id);
    }
    size_t n = 0;
    if (initial_symbols(t, s, len, sc, &n))
        return -1;
    for (size_t i = 0; i < n; i++) {
        sc->syms[i].prev = (int32_t)i - 1;
        sc->syms[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    sc->hn = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (push_pair(t, sc, (int32_t)i))
            return -1;
    while (sc->hn) {
        cand c = heap_pop(sc);
        sym *a = &sc->syms[c.pos];
        if (a->id < 0 || a->next < 0)
            continue;
        sym *b = &sc->syms[a->next];
        const tok_pairent *pe = tok_pairmap_get(&t->merges, a->id, b->id);
        if (!pe || pe->id != c.id)
            continue;   /* stale: one side changed since it was queued */
        a->id = c.id;
        a->next = b->next;
        if (b->next >= 0)
            sc->syms[b->next].prev = c.pos;
        b->id = -1;
        if ((a->prev >= 0 && push_pair(t, sc, a->prev)) || push_pair(t, sc, c.pos))
            return -1;
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = sc->syms[i].next)
        if (tok_ids_push(out, sc->syms[i].id))
            return -1;
    return 0;
}

int tok_bpe_word(const mx_tokenizer *t, const char *s, size_t n, tok_ids *out, tok_scratch *sc)
{
    if (!n)
        return 0;
    int cacheable = t->cache && n <= CACHE_MAX_KEY;
    uint64_t h = 0;
    if (cacheable) {
        h = cache_hash(s, n);
        if (cache_get(t->cache, h, s, n, out))
            return 0;
    }
    sc->ids.n = 0;
    if (merge_word(t, s, n, sc, &sc->ids))
        return -1;
    if (cacheable)
        cache_put(t->cache, h, s, n, sc->ids.p, sc->ids.n);
    return tok_ids_append(out, sc->ids.p, sc->ids.n);
}
