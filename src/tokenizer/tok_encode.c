/* tok_encode.c - text -> ids.
 *
 * As in HF tokenizers: added tokens that are not normalized are found in the
 * raw text first; each stretch between them is normalized, then searched for
 * the normalized added tokens; what is left is pre-tokenized into pieces and
 * each piece is BPE-encoded.  Added tokens are found leftmost-longest, with
 * their lstrip/rstrip/single_word options. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

typedef struct {
    const mx_tokenizer *t;
    int parse_special;
    tok_ids *out;
    tok_buf norm, arena;
    tok_pieces pieces, tmp;
    tok_sizes spans;
    pcre2_match_data *md;
    tok_scratch *sc;
} enc_ctx;

/* Pre-tokenizes and BPE-encodes a stretch with no added tokens in it.
 * first: the stretch starts the original text (Metaspace prepend "first"). */
static int encode_plain(enc_ctx *c, const char *s, size_t n, int first)
{
    if (!n)
        return 0;
    c->arena.n = 0;
    c->pieces.n = 0;
    if (tok_buf_put(&c->arena, s, n) || tok_pieces_push(&c->pieces, 0, n, first))
        return -1;
    if (c->t->pretok) {
        int rc = tok_pretokenize(c->t->pretok, &c->arena, &c->pieces, &c->tmp, &c->spans, c->md);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < c->pieces.n; i++)
        if (tok_bpe_word(c->t, c->arena.p + c->pieces.p[i].off, c->pieces.p[i].len, c->out, c->sc))
            return -1;
    return 0;
}

/* Code point ending at s[end) (end > 0), and its start. */
static uint32_t char_before(const char *s, size_t end, size_t *start)
{
    size_t k = end - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
        k--;
    uint32_t cp = 0;
    if (!tok_utf8_next((const unsigned char *)s + k, end - k, &cp))
        cp = 0xFFFD;
    *start = k;
    return cp;
}

static int is_word_char(uint32_t cp)
{
    if (cp == '_')
        return 1;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

/* single_word: the match is not glued to word characters on either side. */
static int alone(const char *s, size_t n, size_t a, size_t b)
{
    size_t cs;
    uint32_t cp;
    if (a > 0 && is_word_char(char_before(s, a, &cs)))
        return 0;
    if (b < n && tok_utf8_next((const unsigned char *)s + b, n - b, &cp) && is_word_char(cp))
        return 0;
    return 1;
}

/* Longest added token of the set that starts at s[i], or -1. */
static int match_at(const mx_tokenizer *t, const tok_addset *set, const char *s, size_t n,
                    size_t i)
{
    unsigned char b = (unsigned char)s[i];
    for (int k = set->start[b]; k < set->start[b + 1]; k++) {
        const tok_added *a = &t->added[set->idx[k]];
        if (a->match_len <= n - i && memcmp(s + i, a->match, a->match_len) == 0)
            return set->idx[k];
    }
    return -1;
}

static int normalized_stretch(enc_ctx *c, const char *s, size_t n, int first);

/* Finds the set's tokens in s, encoding the stretches between them with
 * encode_plain (normalized set) or normalized_stretch (raw set). */
static int split_added(enc_ctx *c, const tok_addset *set, const char *s, size_t n, int first,
                       int raw)
{
    const mx_tokenizer *t = c->t;
    size_t done = 0, i = 0;
    while (set->n && i < n) {
        if (set->start[(unsigned char)s[i]] == set->start[(unsigned char)s[i] + 1]) {
            i++;
            continue;
        }
        int k = match_at(t, set, s, n, i);
        if (k < 0) {
            i++;
            continue;
        }
        const tok_added *a = &t->added[k];
        size_t a0 = i, b0 = i + a->match_len, cs;
        i = b0;     /* a rejected match is still consumed, as HF's matcher does */
        if (a->special && !c->parse_special)
            continue;
        if (a->single_word && !alone(s, n, a0, b0))
            continue;
        if (a->lstrip)
            while (a0 > done && tok_is_ws(char_before(s, a0, &cs)))
                a0 = cs;
        if (a->rstrip) {
            uint32_t cp;
            int l;
            while (b0 < n && (l = tok_utf8_next((const unsigned char *)s + b0, n - b0, &cp)) &&
                   tok_is_ws(cp))
                b0 += (size_t)l;
        }
        int rc = raw ? normalized_stretch(c, s + done, a0 - done, first && done == 0)
                     : encode_plain(c, s + done, a0 - done, first && done == 0);
        if (rc || tok_ids_push(c->out, a->id))
            return rc ? rc : -1;
        done = i = b0;
    }
    return raw ? normalized_stretch(c, s + done, n - done, first && done == 0)
               : encode_plain(c, s + done, n - done, first && done == 0);
}

static int normalized_stretch(enc_ctx *c, const char *s, size_t n, int first)
{
    if (!n)
        return 0;
    if (!c->t->norm)
        return split_added(c, &c->t->add_norm, s, n, first, 0);
    /* the normalized text must outlive the nested pass: take it out of the
     * context buffer (nested calls do not normalize again) */
    if (tok_normalize(c->t->norm, s, n, &c->norm, c->md))
        return -1;
    return split_added(c, &c->t->add_norm, c->norm.p, c->norm.n, first, 0);
}

int mx_tok_encode(const mx_tokenizer *t, const char *text, size_t len, int parse_special,
                  int32_t **ids, size_t *n, mx_err *e)
{
    *ids = NULL;
    *n = 0;
    if (!text && len)
        return mx_fail(e, MX_EINVAL, "encode: NULL text");
    size_t bad = len ? tok_utf8_check(text, len) : 0;
    if (bad != len)
        return mx_fail(e, MX_EINVAL, "encode: input is not valid UTF-8 (byte %zu)", bad);
    tok_ids out = {0};
    enc_ctx c = {t, parse_special, &out, {0}, {0}, {0}, {0}, {0}, NULL, NULL};
    c.md = pcre2_match_data_create(1, NULL);
    c.sc = tok_scratch_new();
    int rc = -1;
    if (c.md && c.sc && tok_ids_push(&out, 0) == 0) {
        out.n = 0;    /* the array always exists, even for empty text */
        rc = len ? split_added(&c, &t->add_raw, text, len, 1, 1) : 0;
    }
    tok_buf_free(&c.norm);
    tok_buf_free(&c.arena);
    free(c.pieces.p);
    free(c.tmp.p);
    free(c.spans.p);
    if (c.md)
        pcre2_match_data_free(c.md);
    tok_scratch_free(c.sc);
    if (rc) {
        free(out.p);
        return rc == -2 ? mx_fail(e, MX_EINVAL, "encode: regex matching failed (input too "
                                  "complex for the pre-tokenizer pattern)")
                        : mx_fail(e, MX_ENOMEM, "encode: out of memory");
    }
    *ids = out.p;
    *n = out.n;
    return MX_OK;
}
