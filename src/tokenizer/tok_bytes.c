/* tok_bytes.c - the raw bytes one token stands for, for constrained
 * decoding (a grammar advances over bytes) and logprobs (`bytes` fields).
 *
 * The decoder chain is applied to the token on its own, without the lossy
 * UTF-8 repair of a full decode: a byte-level token that holds half of a
 * character yields exactly those bytes.  Decoders that act on the whole
 * text (Strip of a leading space, Metaspace's first-token rule) are left
 * out: they only change where the text starts, not what a token adds in
 * the middle of it. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* One decoder step over b (in place through a second buffer). */
static int bytes_step(const tok_dec *d, tok_buf *b, tok_buf *tmp)
{
    tmp->n = 0;
    switch (d->type) {
    case DEC_SEQUENCE:
        for (int i = 0; i < d->n_kids; i++)
            if (bytes_step(&d->kids[i], b, tmp))
                return -1;
        return 0;
    case DEC_BYTELEVEL:
        for (size_t k = 0; k < b->n;) {
            uint32_t cp;
            int l = tok_utf8_next((const unsigned char *)b->p + k, b->n - k, &cp);
            int byte = l ? tok_cp_to_byte(cp) : -1;
            if (byte < 0)
                return 0;            /* not a byte-level token: kept as is */
            char c = (char)byte;
            if (tok_buf_put(tmp, &c, 1))
                return -1;
            k += (size_t)l;
        }
        break;
    case DEC_METASPACE:
        for (size_t k = 0; k < b->n;) {
            uint32_t cp;
            int l = tok_utf8_next((const unsigned char *)b->p + k, b->n - k, &cp);
            if (!l)
                l = 1, cp = 0xFFFFFFFFu;
            if (tok_buf_put(tmp, cp == d->ch ? " " : b->p + k, cp == d->ch ? 1 : (size_t)l))
                return -1;
            k += (size_t)l;
        }
        break;
    case DEC_BYTEFALLBACK: {
        static const char hex[] = "0123456789abcdef";
        if (b->n != 6 || memcmp(b->p, "<0x", 3) != 0 || b->p[5] != '>')
            return 0;
        const char *h = strchr(hex, b->p[3] | 0x20), *l = strchr(hex, b->p[4] | 0x20);
        if (!h || !l || !*h || !*l)
            return 0;
        char c = (char)((h - hex) * 16 + (l - hex));
        if (tok_buf_put(tmp, &c, 1))
            return -1;
        break;
    }
    case DEC_REPLACE: {
        tok_sizes spans = {0};
        pcre2_match_data *md = d->pat.re ? pcre2_match_data_create(1, NULL) : NULL;
        int rc = (d->pat.re && !md) || tok_pattern_find(&d->pat, b->p ? b->p : "", b->n, &spans, md);
        size_t prev = 0;
        for (size_t k = 0; !rc && k < spans.n; k += 2) {
            rc = tok_buf_put(tmp, b->p + prev, spans.p[k] - prev) ||
                 tok_buf_put(tmp, d->str, d->str_len);
            prev = spans.p[k + 1];
        }
        if (!rc)
            rc = tok_buf_put(tmp, b->p + prev, b->n - prev);
        free(spans.p);
        if (md)
            pcre2_match_data_free(md);
        if (rc)
            return -1;
        break;
    }
    default:                         /* Fuse, Strip: whole-text decoders */
        return 0;
    }
    tok_buf t = *b;
    *b = *tmp;
    *tmp = t;
    return 0;
}

int mx_tok_token_bytes(const mx_tokenizer *t, int32_t id, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n_ids || !t->tok_flags[id])
        return -1;
    tok_buf b = {0}, tmp = {0};
    int n = -1;
    if (!tok_buf_put(&b, t->tok_str[id], t->tok_len[id]) &&
        !(t->dec && !(t->tok_flags[id] & TOKF_SPECIAL) && bytes_step(t->dec, &b, &tmp))) {
        n = (int)b.n;
        if (cap)
            memcpy(buf, b.p, b.n < cap ? b.n : cap);
    }
    tok_buf_free(&b);
    tok_buf_free(&tmp);
    return n;
}
