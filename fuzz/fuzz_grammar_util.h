/* fuzz_grammar_util.h - for the grammar fuzz targets: a small vocabulary
 * (every single byte, a few multi-byte strings, an eos id) and a walk that
 * feeds bytes through a grammar state checking the mask against
 * acceptance at every step. */
#ifndef MX_FUZZ_GRAMMAR_UTIL_H
#define MX_FUZZ_GRAMMAR_UTIL_H

#include <math.h>

#include "grammar/grammar.h"

static const char *const fzg_multi[] = {"{\"", "\":", "\", \"", "true", "null", "\xc3\xa9", "\xe2\x82\xac", "12"};
#define FZG_NMULTI ((int32_t)(sizeof fzg_multi / sizeof *fzg_multi))
#define FZG_EOS (256 + FZG_NMULTI)
#define FZG_NVOCAB (FZG_EOS + 1)
#define FZG_STEPS 48

static int fzg_token_bytes(void *ud, int32_t id, char *buf, size_t cap)
{
    (void)ud;
    if (id < 256) {
        if (cap)
            buf[0] = (char)id;
        return 1;
    }
    if (id >= FZG_EOS)
        return -1;
    size_t n = strlen(fzg_multi[id - 256]);
    memcpy(buf, fzg_multi[id - 256], n < cap ? n : cap);
    return (int)n;
}

static mx_grammar_vocab *fzg_vocab(void)
{
    static mx_grammar_vocab *v;
    if (!v) {
        int32_t eos = FZG_EOS;
        mx_err e;
        if (mx_grammar_vocab_new(FZG_NVOCAB, fzg_token_bytes, NULL, &eos, 1, &v, &e)) {
            fprintf(stderr, "fuzz: %s\n", e.msg);
            abort();
        }
    }
    return v;
}

/* Feeds text[n] a byte at a time: the mask must allow a byte exactly when
 * the state accepts it, and eos exactly when the text so far is complete. */
static void fzg_walk(const mx_grammar *g, const char *text, size_t n)
{
    mx_grammar_state *s = NULL;
    mx_err e;
    if (mx_grammar_state_new(g, fzg_vocab(), &s, &e))
        return;   /* out of memory */
    float logits[FZG_NVOCAB];
    for (size_t i = 0; i <= n && i < FZG_STEPS; i++) {
        for (int k = 0; k < FZG_NVOCAB; k++)
            logits[k] = 0;
        size_t allowed = mx_grammar_mask(s, logits, FZG_NVOCAB);
        size_t count = 0;
        for (int k = 0; k < FZG_NVOCAB; k++)
            count += logits[k] == 0;
        if (count != allowed || (logits[FZG_EOS] == 0) != mx_grammar_complete(s))
            abort();
        if (i == n)
            break;
        unsigned char b = (unsigned char)text[i];
        int ok = mx_grammar_accept_bytes(s, (const char *)&b, 1) == 0;
        if (ok != (logits[b] == 0))
            abort();   /* the mask and acceptance disagree */
        if (!ok)
            break;
    }
    mx_grammar_state_free(s);
}

#endif
