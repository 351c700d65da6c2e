/* match.c - running a grammar over bytes, and masking a vocabulary.
 *
 * State: a set of parse stacks (each a list of element positions, top
 * last; the top is always a character set, an empty stack means the text
 * is a complete sentence) plus the bytes of a UTF-8 character not yet
 * complete.  A byte either completes a character, which every stack whose
 * top accepts it advances over (then rules at the top are expanded again),
 * or is kept as part of the character, as long as some stack could still
 * take a character that starts with those bytes.
 *
 * Masking walks a trie of the vocabulary's byte strings depth first,
 * advancing the state one byte per edge: a token is allowed when the state
 * at its node is alive, and a dead state prunes the whole subtree, so
 * tokens that share a prefix share its matching.  Stacks and stack lists
 * live in two arenas used like a call stack (truncated on the way back
 * up), so the walk allocates nothing once they have grown.  The resulting
 * mask is cached by the exact state: generating inside a JSON string, say,
 * meets the same state token after token. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

#define MAX_STACKS 512           /* stacks per state (ambiguity bound) */
#define MAX_DEPTH 4096           /* elements per stack */
#define CACHE_SLOTS 16
/* Expansion steps allowed for one character (or the start).  Without a
 * bound, an ambiguous grammar such as [a-z]?{200} (each optional item may
 * be skipped, so every stack re-expands most of the others) costs seconds
 * per token; past the bound the character counts as not accepted (the
 * state stays alive for others), and at the start it is an error. */
#define MAX_EXPAND (16 * MAX_STACKS)
#define DEDUP_SLOTS (4 * MAX_STACKS)   /* a power of two, well above MAX_STACKS */

/* ---- vocabulary trie ---- */

typedef struct tnode {
    uint32_t child;              /* first child node (children are contiguous) */
    uint32_t n_child;
    uint32_t tok, n_tok;         /* tokens ending here: ids[tok .. tok + n_tok) */
    uint8_t byte;                /* the edge into this node */
} tnode;

struct mx_grammar_vocab {
    int32_t n_vocab;
    tnode *nodes;
    uint32_t n_nodes, cap_nodes;
    int32_t *ids;                /* token ids in trie order */
    int32_t *eos;
    int n_eos;
    uint32_t max_len;
    unsigned char *bytes;        /* every token's bytes */
    uint32_t *off, *len;         /* [n_vocab]; len 0: never produced */
};

typedef struct tok_ref {
    const unsigned char *b;
    uint32_t len;
    int32_t id;
} tok_ref;

static int tok_cmp(const void *x, const void *y)
{
    const tok_ref *a = x, *b = y;
    uint32_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->b, b->b, n);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Builds node `at` from the sorted tokens [lo, hi) that share `depth`
 * bytes: those of exactly that length end here, the rest are grouped by
 * their next byte into contiguous children. */
static int build_node(mx_grammar_vocab *v, uint32_t at, const tok_ref *t, size_t lo, size_t hi,
                      uint32_t depth, uint32_t *next_id)
{
    size_t i = lo;
    v->nodes[at].tok = (uint32_t)i;
    while (i < hi && t[i].len == depth) {
        v->ids[i] = t[i].id;
        i++;
    }
    v->nodes[at].n_tok = (uint32_t)(i - v->nodes[at].tok);
    uint32_t n_child = 0;
    for (size_t k = i; k < hi; n_child++) {
        unsigned char b = t[k].b[depth];
        while (k < hi && t[k].b[depth] == b)
            k++;
    }
    uint32_t first = *next_id;
    *next_id += n_child;
    v->nodes[at].child = first;
    v->nodes[at].n_child = n_child;
    uint32_t c = first;
    for (size_t k = i; k < hi; c++) {
        unsigned char b = t[k].b[depth];
        size_t k0 = k;
        while (k < hi && t[k].b[depth] == b)
            k++;
        v->nodes[c].byte = b;
        if (build_node(v, c, t, k0, k, depth + 1, next_id))
            return -1;
    }
    return 0;
}

int mx_grammar_vocab_new(int32_t n_vocab, mx_token_bytes_fn token_bytes, void *ud,
                         const int32_t *eos, int n_eos, mx_grammar_vocab **out, mx_err *e)
{
    *out = NULL;
    mx_grammar_vocab *v = calloc(1, sizeof *v);
    tok_ref *t = calloc((size_t)n_vocab, sizeof *t);
    unsigned char *arena = NULL;
    size_t used = 0, cap = 0;
    if (!v || !t)
        goto oom;
    v->off = calloc((size_t)n_vocab, sizeof *v->off);
    v->len = calloc((size_t)n_vocab, sizeof *v->len);
    if (!v->off || !v->len)
        goto oom;
    /* byte strings into one arena (offsets first: the arena may move) */
    size_t n = 0;
    char buf[1024];
    for (int32_t id = 0; id < n_vocab; id++) {
        int k = token_bytes(ud, id, buf, sizeof buf);
        if (k <= 0 || (size_t)k > sizeof buf)
            continue;            /* never produced (special, padding, empty or huge) */
        if (used + (size_t)k > cap) {
            size_t c = cap ? cap * 2 : 1 << 20;
            while (c < used + (size_t)k)
                c *= 2;
            unsigned char *q = realloc(arena, c);
            if (!q)
                goto oom;
            arena = q;
            cap = c;
        }
        memcpy(arena + used, buf, (size_t)k);
        t[n].b = (const unsigned char *)(uintptr_t)used;
        t[n].len = (uint32_t)k;
        t[n].id = id;
        v->off[id] = (uint32_t)used;
        v->len[id] = (uint32_t)k;
        used += (size_t)k;
        if ((uint32_t)k > v->max_len)
            v->max_len = (uint32_t)k;
        n++;
    }
    for (size_t i = 0; i < n; i++)
        t[i].b = arena + (uintptr_t)t[i].b;
    qsort(t, n, sizeof *t, tok_cmp);
    /* nodes: at most one per byte of all strings, plus the root */
    v->cap_nodes = (uint32_t)used + 1;
    v->nodes = calloc(v->cap_nodes, sizeof *v->nodes);
    v->ids = malloc(sizeof *v->ids * (n ? n : 1));
    v->eos = malloc(sizeof *v->eos * (size_t)(n_eos > 0 ? n_eos : 1));
    if (!v->nodes || !v->ids || !v->eos)
        goto oom;
    uint32_t next = 1;
    if (build_node(v, 0, t, 0, n, 0, &next))
        goto oom;
    v->n_nodes = next;
    tnode *shrunk = realloc(v->nodes, sizeof *v->nodes * next);
    if (shrunk)
        v->nodes = shrunk;
    v->n_vocab = n_vocab;
    for (int i = 0; i < n_eos; i++)
        v->eos[i] = eos[i];
    v->n_eos = n_eos;
    free(t);
    v->bytes = arena;
    *out = v;
    return MX_OK;
oom:
    free(t);
    free(arena);
    mx_grammar_vocab_free(v);
    return mx_fail(e, MX_ENOMEM, "grammar: out of memory for the vocabulary trie");
}

void mx_grammar_vocab_free(mx_grammar_vocab *v)
{
    if (!v)
        return;
    free(v->nodes);
    free(v->ids);
    free(v->eos);
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v);
}

/* ---- stack sets ---- */

typedef struct stk {
    uint32_t off, len;           /* elements arena[off .. off + len) */
} stk;

/* A state: stacks list[first .. first + n) plus a partial character. */
typedef struct sset {
    uint32_t first, n;
    uint32_t cp;                 /* bits of the character so far */
    uint8_t need;                /* continuation bytes still to come */
    uint8_t len;                 /* bytes of the character so far */
} sset;

typedef struct cache_ent {
    uint32_t *key;
    size_t key_len, key_cap;
    uint64_t hash;
    uint64_t *bits;
    size_t allowed;
    int used;
} cache_ent;

struct mx_grammar_state {
    const mx_grammar *g;
    const mx_grammar_vocab *v;
    uint32_t *ar;                /* stack elements */
    size_t ar_n, ar_cap;
    stk *ls;                     /* stack lists */
    size_t ls_n, ls_cap;
    uint32_t *tmp;               /* a stack being built */
    sset cur;                    /* the state (its stacks at the start of the arenas) */
    uint64_t *bits;              /* mask being computed */
    cache_ent cache[CACHE_SLOTS];
    int cache_next;
    int oom;
    uint32_t *key;               /* scratch key */
    size_t key_cap;
    /* the set being built: its stacks by hash (entries of older sets have
     * an older epoch), and the expansion steps it took so far */
    struct { uint64_t h; uint32_t epoch, idx; } dedup[DEDUP_SLOTS];
    uint32_t epoch;
    uint32_t work;
};

/* Starts building a new set of stacks: empty dedup table, fresh budget. */
static void new_set(mx_grammar_state *s)
{
    if (++s->epoch == 0) {
        memset(s->dedup, 0, sizeof s->dedup);
        s->epoch = 1;
    }
    s->work = 0;
}

static uint64_t stack_hash(const uint32_t *st, uint32_t len)
{
    uint64_t h = 1469598103934665603ull ^ len;
    for (uint32_t i = 0; i < len; i++)
        h = (h ^ st[i]) * 1099511628211ull;
    return h;
}

static int reserve(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * size);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int chars_match(const mx_grammar *g, const g_elem *x, uint32_t cp)
{
    const uint32_t *r = g->ranges + 2 * (size_t)x->a;
    int in = 0;
    for (uint32_t i = 0; i < x->n && !in; i++)
        in = cp >= r[2 * i] && cp <= r[2 * i + 1];
    return in != x->neg;
}

/* Whether the set x accepts some character in [lo, hi]. */
static int chars_meet(const mx_grammar *g, const g_elem *x, uint32_t lo, uint32_t hi)
{
    const uint32_t *r = g->ranges + 2 * (size_t)x->a;
    if (!x->neg) {
        for (uint32_t i = 0; i < x->n; i++)
            if (r[2 * i] <= hi && r[2 * i + 1] >= lo)
                return 1;
        return 0;
    }
    /* complement: some point of [lo, hi] outside every range */
    uint32_t p = lo;
    for (int moved = 1; moved && p <= hi;) {
        moved = 0;
        for (uint32_t i = 0; i < x->n; i++)
            if (p >= r[2 * i] && p <= r[2 * i + 1]) {
                if (r[2 * i + 1] >= hi)
                    return 0;
                p = r[2 * i + 1] + 1;
                moved = 1;
            }
    }
    return p <= hi;
}

/* Appends stack tmp[0..len) to the list, unless it is already there. */
static void add_stack(mx_grammar_state *s, sset *out, const uint32_t *st, uint32_t len)
{
    uint64_t h = stack_hash(st, len);
    uint32_t slot = (uint32_t)h & (DEDUP_SLOTS - 1);
    for (; s->dedup[slot].epoch == s->epoch; slot = (slot + 1) & (DEDUP_SLOTS - 1)) {
        if (s->dedup[slot].h != h)
            continue;
        const stk *k = &s->ls[out->first + s->dedup[slot].idx];
        if (k->len == len && (!len || !memcmp(s->ar + k->off, st, sizeof *st * len)))
            return;
    }
    if (out->n >= MAX_STACKS || reserve((void **)&s->ar, &s->ar_cap, s->ar_n + len, sizeof *s->ar) ||
        reserve((void **)&s->ls, &s->ls_cap, s->ls_n + 1, sizeof *s->ls)) {
        s->oom = 1;
        return;
    }
    if (len)
        memcpy(s->ar + s->ar_n, st, sizeof *st * len);
    s->ls[s->ls_n++] = (stk){(uint32_t)s->ar_n, len};
    s->ar_n += len;
    s->dedup[slot].h = h;
    s->dedup[slot].epoch = s->epoch;
    s->dedup[slot].idx = out->n++;
}

/* Expands st (in s->tmp, len elements) until its top is a character set,
 * adding every resulting stack to out.  tmp is used as a stack of stacks:
 * st is at tmp + base. */
static void expand(mx_grammar_state *s, sset *out, size_t base, uint32_t len)
{
    const mx_grammar *g = s->g;
    uint32_t *st = s->tmp + base;
    if (++s->work > MAX_EXPAND) {
        s->oom = 1;
        return;
    }
    while (len && g->el[st[len - 1]].type == GE_END)
        len--;                   /* a finished alternative: back to the caller */
    if (!len || g->el[st[len - 1]].type == GE_CHARS) {
        add_stack(s, out, st, len);
        return;
    }
    if (len + 1 > MAX_DEPTH || base + 2 * (size_t)len + 2 > (size_t)MAX_DEPTH * 8) {
        s->oom = 1;
        return;
    }
    /* a rule reference: continue after it, into each alternative */
    const g_elem *ref = &g->el[st[len - 1]];
    uint32_t after = st[len - 1] + 1;
    for (uint32_t a = g->rule_alt[ref->a]; a < g->rule_alt[ref->a + 1]; a++) {
        size_t nb = base + len + 1;
        uint32_t *ns = s->tmp + nb;
        st = s->tmp + base;
        memcpy(ns, st, sizeof *st * (len - 1));
        uint32_t nl = len - 1;
        if (g->el[after].type != GE_END)
            ns[nl++] = after;    /* a reference in tail position leaves nothing behind */
        ns[nl++] = g->alts[a];
        expand(s, out, nb, nl);
    }
}

/* Every stack of in advanced over character cp, into out. */
static void accept_cp(mx_grammar_state *s, const sset *in, sset *out, uint32_t cp)
{
    const mx_grammar *g = s->g;
    out->first = (uint32_t)s->ls_n;
    out->n = 0;
    out->cp = 0;
    out->need = out->len = 0;
    new_set(s);
    for (uint32_t i = 0; i < in->n && !s->oom; i++) {
        stk k = s->ls[in->first + i];
        if (!k.len)
            continue;
        uint32_t top = s->ar[k.off + k.len - 1];
        if (!chars_match(g, &g->el[top], cp))
            continue;
        memcpy(s->tmp, s->ar + k.off, sizeof *s->tmp * k.len);
        s->tmp[k.len - 1] = top + 1;
        expand(s, out, 0, k.len);
    }
}

/* Whether some stack of in could take a character in [lo, hi]. */
static int can_take(const mx_grammar_state *s, const sset *in, uint32_t lo, uint32_t hi)
{
    for (uint32_t i = 0; i < in->n; i++) {
        stk k = s->ls[in->first + i];
        if (k.len && chars_meet(s->g, &s->g->el[s->ar[k.off + k.len - 1]], lo, hi))
            return 1;
    }
    return 0;
}

/* The range of characters that start with the partial character of x. */
static void partial_range(const sset *x, uint32_t *lo, uint32_t *hi)
{
    unsigned sh = 6u * x->need;
    *lo = x->cp << sh;
    *hi = *lo | ((1u << sh) - 1);
    /* the smallest character of each length (no overlong forms) */
    uint32_t min = x->len + x->need == 2 ? 0x80 : x->len + x->need == 3 ? 0x800 : 0x10000;
    if (*lo < min)
        *lo = min;
    if (*hi > 0x10FFFF)
        *hi = 0x10FFFF;
}

/* in advanced over byte b into out; returns 1 when out is alive. */
static int accept_byte(mx_grammar_state *s, const sset *in, sset *out, unsigned char b)
{
    if (!in->need) {
        if (b < 0x80) {
            accept_cp(s, in, out, b);
            return out->n > 0;
        }
        int n = (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        if (!n || b == 0xC0 || b == 0xC1 || b > 0xF4)
            return 0;
        *out = *in;
        out->cp = b & (0x7F >> n);
        out->need = (uint8_t)(n - 1);
        out->len = 1;
    } else {
        if ((b & 0xC0) != 0x80)
            return 0;
        *out = *in;
        out->cp = in->cp << 6 | (b & 0x3F);
        out->need = (uint8_t)(in->need - 1);
        out->len = (uint8_t)(in->len + 1);
        if (!out->need) {
            uint32_t cp = out->cp;
            uint32_t min = out->len == 2 ? 0x80 : out->len == 3 ? 0x800 : 0x10000;
            if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return 0;
            sset t = *in;        /* the stacks, without the partial character */
            accept_cp(s, &t, out, cp);
            return out->n > 0;
        }
    }
    uint32_t lo, hi;
    partial_range(out, &lo, &hi);
    return lo <= hi && can_take(s, out, lo, hi);
}

static int has_empty(const mx_grammar_state *s, const sset *x)
{
    if (x->need)
        return 0;
    for (uint32_t i = 0; i < x->n; i++)
        if (!s->ls[x->first + i].len)
            return 1;
    return 0;
}

/* ---- the state ---- */

int mx_grammar_state_new(const mx_grammar *g, const mx_grammar_vocab *v, mx_grammar_state **out,
                         mx_err *e)
{
    *out = NULL;
    mx_grammar_state *s = calloc(1, sizeof *s);
    if (!s)
        return mx_fail(e, MX_ENOMEM, "grammar: out of memory");
    s->g = g;
    s->v = v;
    s->tmp = malloc(sizeof *s->tmp * (size_t)MAX_DEPTH * 8);
    size_t words = v ? ((size_t)v->n_vocab + 63) / 64 : 1;
    s->bits = malloc(sizeof *s->bits * words);
    if (!s->tmp || !s->bits) {
        mx_grammar_state_free(s);
        return mx_fail(e, MX_ENOMEM, "grammar: out of memory");
    }
    /* the start: root's alternatives, expanded */
    s->cur = (sset){0};
    new_set(s);
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        s->tmp[0] = g->alts[a];
        expand(s, &s->cur, 0, 1);
    }
    if (s->oom) {
        mx_grammar_state_free(s);
        return mx_fail(e, MX_EINVAL, "grammar: too ambiguous or too deeply nested at the start");
    }
    *out = s;
    return MX_OK;
}

void mx_grammar_state_free(mx_grammar_state *s)
{
    if (!s)
        return;
    free(s->ar);
    free(s->ls);
    free(s->tmp);
    free(s->bits);
    free(s->key);
    for (int i = 0; i < CACHE_SLOTS; i++) {
        free(s->cache[i].key);
        free(s->cache[i].bits);
    }
    free(s);
}

int mx_grammar_accept_bytes(mx_grammar_state *s, const char *b, size_t n)
{
    size_t ar0 = s->ar_n, ls0 = s->ls_n;
    sset x = s->cur;
    s->oom = 0;
    for (size_t i = 0; i < n; i++) {
        sset y;
        if (!accept_byte(s, &x, &y, (unsigned char)b[i]) || s->oom) {
            s->ar_n = ar0;
            s->ls_n = ls0;
            return -1;
        }
        x = y;
    }
    /* x's stacks may sit anywhere in the arenas; copy them out of the way
     * first, as compact moves data towards the start */
    if (n) {
        size_t need_a = 0;
        for (uint32_t i = 0; i < x.n; i++)
            need_a += s->ls[x.first + i].len;
        uint32_t *sa = malloc(sizeof *sa * (need_a ? need_a : 1));
        stk *sl = malloc(sizeof *sl * (x.n ? x.n : 1));
        if (!sa || !sl) {
            free(sa);
            free(sl);
            s->ar_n = ar0;
            s->ls_n = ls0;
            return -1;
        }
        size_t o = 0;
        for (uint32_t i = 0; i < x.n; i++) {
            stk k = s->ls[x.first + i];
            if (k.len)
                memcpy(sa + o, s->ar + k.off, sizeof *sa * k.len);
            sl[i] = (stk){(uint32_t)o, k.len};
            o += k.len;
        }
        if (o)
            memcpy(s->ar, sa, sizeof *sa * o);
        if (x.n)
            memcpy(s->ls, sl, sizeof *sl * x.n);
        s->ar_n = o;
        s->ls_n = x.n;
        x.first = 0;
        s->cur = x;
        free(sa);
        free(sl);
    }
    return 0;
}

static int is_eos(const mx_grammar_vocab *v, int32_t id)
{
    for (int i = 0; v && i < v->n_eos; i++)
        if (v->eos[i] == id)
            return 1;
    return 0;
}

int mx_grammar_complete(const mx_grammar_state *s) { return has_empty(s, &s->cur); }

int mx_grammar_finished(const mx_grammar_state *s)
{
    if (s->cur.need)
        return 0;
    for (uint32_t i = 0; i < s->cur.n; i++)
        if (s->ls[s->cur.first + i].len)
            return 0;
    return s->cur.n > 0;
}

int mx_grammar_accept_token(mx_grammar_state *s, int32_t id)
{
    const mx_grammar_vocab *v = s->v;
    if (is_eos(v, id))
        return mx_grammar_complete(s) ? 0 : -1;
    if (!v || id < 0 || id >= v->n_vocab || !v->len[id])
        return -1;
    return mx_grammar_accept_bytes(s, (const char *)v->bytes + v->off[id], v->len[id]);
}

/* ---- masks ---- */

static void walk(mx_grammar_state *s, uint32_t node, const sset *x)
{
    const mx_grammar_vocab *v = s->v;
    const tnode *t = &v->nodes[node];
    for (uint32_t i = 0; i < t->n_tok; i++) {
        int32_t id = v->ids[t->tok + i];
        s->bits[id >> 6] |= 1ull << (id & 63);
    }
    for (uint32_t c = t->child; c < t->child + t->n_child; c++) {
        size_t ar0 = s->ar_n, ls0 = s->ls_n;
        sset y;
        if (accept_byte(s, x, &y, v->nodes[c].byte) && !s->oom)
            walk(s, c, &y);
        s->oom = 0;
        s->ar_n = ar0;
        s->ls_n = ls0;
    }
}

/* The state as a key: the partial character, then each stack. */
static size_t state_key(mx_grammar_state *s, uint64_t *hash)
{
    size_t n = 2 + s->cur.n;
    for (uint32_t i = 0; i < s->cur.n; i++)
        n += s->ls[s->cur.first + i].len;
    if (reserve((void **)&s->key, &s->key_cap, n, sizeof *s->key))
        return 0;
    size_t o = 0;
    s->key[o++] = s->cur.cp;
    s->key[o++] = (uint32_t)s->cur.need << 8 | s->cur.len;
    for (uint32_t i = 0; i < s->cur.n; i++) {
        stk k = s->ls[s->cur.first + i];
        s->key[o++] = 0x80000000u | k.len;
        if (k.len)
            memcpy(s->key + o, s->ar + k.off, sizeof *s->key * k.len);
        o += k.len;
    }
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < o; i++)
        h = (h ^ s->key[i]) * 1099511628211ull;
    *hash = h;
    return o;
}

size_t mx_grammar_mask(mx_grammar_state *s, float *logits, int32_t n_vocab)
{
    const mx_grammar_vocab *v = s->v;
    size_t words = ((size_t)v->n_vocab + 63) / 64;
    uint64_t h = 0;
    size_t kl = state_key(s, &h);
    cache_ent *hit = NULL;
    for (int i = 0; kl && i < CACHE_SLOTS; i++) {
        cache_ent *c = &s->cache[i];
        if (c->used && c->hash == h && c->key_len == kl && !memcmp(c->key, s->key, sizeof *s->key * kl))
            hit = c;
    }
    const uint64_t *bits;
    if (hit) {
        bits = hit->bits;
    } else {
        memset(s->bits, 0, sizeof *s->bits * words);
        walk(s, 0, &s->cur);
        if (mx_grammar_complete(s))
            for (int i = 0; i < v->n_eos; i++)
                if (v->eos[i] >= 0 && v->eos[i] < v->n_vocab)
                    s->bits[v->eos[i] >> 6] |= 1ull << (v->eos[i] & 63);
        bits = s->bits;
        cache_ent *c = &s->cache[s->cache_next];
        if (kl && !reserve((void **)&c->key, &c->key_cap, kl, sizeof *c->key) &&
            (c->bits || (c->bits = malloc(sizeof *c->bits * words)))) {
            s->cache_next = (s->cache_next + 1) % CACHE_SLOTS;
            memcpy(c->key, s->key, sizeof *c->key * kl);
            c->key_len = kl;
            c->hash = h;
            memcpy(c->bits, s->bits, sizeof *c->bits * words);
            c->used = 1;
        }
    }
    size_t allowed = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        int ok = i < v->n_vocab && (bits[i >> 6] >> (i & 63) & 1);
        if (ok)
            allowed++;
        else
            logits[i] = -INFINITY;
    }
    return allowed;
}
