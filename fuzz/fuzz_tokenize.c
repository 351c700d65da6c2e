/* fuzz_tokenize.c - libFuzzer entry: the real tokenizers (Qwen2/Qwen3,
 * Mixtral, OLMoE, Phi-3.5-MoE from the reference fixtures, and the bundled
 * demo model's, which is the only one without fixtures) on arbitrary input.
 *
 * The first byte picks the tokenizer (bits 0-2) and what to do (bits 3-4):
 *  0  encode the rest as text (special tokens not parsed); valid UTF-8 must
 *     encode, and decoding the ids must give the text back as the tokenizer
 *     normalizes it: NFC for the byte-level ones, U+2581 as a space for the
 *     SentencePiece-style ones (both are otherwise lossless), unless the
 *     text holds an added token that strips the whitespace beside it
 *     (lstrip/rstrip, as HF does: Phi-3.5's "</s>" is matched even when
 *     special tokens are not parsed);
 *  1  the same with special tokens parsed (no crash, ids in range, decodes);
 *  2  decode the rest as little-endian 16/32-bit ids (bit 5: 32-bit, so
 *     out-of-range ids occur), with and without special tokens, whole and
 *     one id at a time through the stream decoder: both must give the same
 *     text when it is valid UTF-8 (invalid bytes become U+FFFD, and a
 *     stream cannot take back text it already gave: SentencePiece byte
 *     fallback replaces a whole run of byte tokens once the run turns out
 *     invalid), and an id outside the vocabulary must be an error. */
#include "fuzz_util.h"

#include <cjson/cJSON.h>
#include <utf8proc.h>

#include "tokenizer/tokenizer.h"
#include "util/file.h"

typedef struct fz_tok {
    const char *name;
    int sentencepiece;          /* Metaspace normalizer: U+2581 decodes as a space */
    mx_tokenizer *t;
    char **stripping;           /* added tokens with lstrip or rstrip */
    int n_stripping;
} fz_tok;

static fz_tok toks[8];
static int n_toks;

static void load(const char *name, const char *dir, int sp)
{
    mx_err e;
    mx_tokenizer *t;
    if (!dir)
        return;
    if (mx_tok_load_dir(dir, &t, &e)) {
        fprintf(stderr, "fuzz_tokenize: %s\n", e.msg);
        abort();
    }
    fz_tok *ft = &toks[n_toks++];
    *ft = (fz_tok){name, sp, t, NULL, 0};
    /* the added tokens that eat whitespace beside them */
    char path[4096], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cJSON *j = mx_read_file(path, &text, &len, &e) ? NULL : cJSON_ParseWithLength(text, len);
    const cJSON *a, *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    ft->stripping = calloc((size_t)cJSON_GetArraySize(added) + 1, sizeof *ft->stripping);
    cJSON_ArrayForEach(a, added)
    {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (cJSON_IsString(c) && ft->stripping &&
            (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "lstrip")) ||
             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "rstrip"))))
            ft->stripping[ft->n_stripping++] = strdup(c->valuestring);
    }
    cJSON_Delete(j);
    free(text);
}

static int has_stripping_token(const fz_tok *ft, const char *text, size_t len)
{
    for (int i = 0; i < ft->n_stripping; i++)
        if (memmem(text, len, ft->stripping[i], strlen(ft->stripping[i])))
            return 1;
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char b[4096];
    load("kjv-moe", fz_source("models/kjv-moe", b, sizeof b), 0);
    load("qwen2_moe_tiny_chat", fz_fixture("qwen2_moe_tiny_chat", b, sizeof b), 0);
    load("qwen3", fz_fixture("tokenizers/qwen3", b, sizeof b), 0);
    load("olmoe", fz_fixture("tokenizers/olmoe", b, sizeof b), 0);
    load("mixtral", fz_fixture("tokenizers/mixtral", b, sizeof b), 1);
    load("phimoe", fz_fixture("tokenizers/phimoe", b, sizeof b), 1);
    fprintf(stderr, "fuzz_tokenize: %d tokenizers%s\n", n_toks,
            n_toks == 1 ? " (no fixtures: the demo model's only)" : "");
    return 0;
}

/* What decode(encode(text)) must give: NFC, or U+2581 as a space. */
static char *expected_text(const fz_tok *ft, const char *text, size_t len)
{
    if (ft->sentencepiece) {
        char *r = malloc(len + 1), *w = r;
        if (!r)
            return NULL;
        for (size_t i = 0; i < len;) {
            if (i + 3 <= len && !memcmp(text + i, "\xe2\x96\x81", 3)) {
                *w++ = ' ';
                i += 3;
            } else {
                *w++ = text[i++];
            }
        }
        *w = 0;
        return r;
    }
    utf8proc_uint8_t *nfc = NULL;
    if (utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfc,
                     UTF8PROC_STABLE | UTF8PROC_COMPOSE) < 0)
        return NULL;
    return (char *)nfc;
}

static void encode(const fz_tok *ft, const char *text, size_t len, int special)
{
    int32_t *ids = NULL;
    size_t n = 0;
    mx_err e;
    int valid = utf8proc_decompose((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, NULL, 0, 0) >= 0 &&
                !memchr(text, 0, len);
    if (mx_tok_encode(ft->t, text, len, special, &ids, &n, &e)) {
        if (valid)
            abort();   /* valid UTF-8 always encodes */
        return;
    }
    int32_t vocab = mx_tok_vocab_size(ft->t);
    for (size_t k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= vocab)
            abort();
    char *back = NULL;
    size_t blen = 0;
    if (mx_tok_decode(ft->t, ids, n, 0, &back, &blen, &e))
        abort();   /* what encode gives, decode takes */
    if (!special && valid && !has_stripping_token(ft, text, len)) {
        char *want = expected_text(ft, text, len);
        if (want && (strlen(want) != blen || memcmp(want, back, blen))) {
            fprintf(stderr, "%s: round trip differs:\n  want [%s]\n  got  [%.*s]\n", ft->name, want,
                    (int)blen, back);
            abort();
        }
        free(want);
    }
    free(back);
    free(ids);
}

static void decode(const fz_tok *ft, const uint8_t *d, size_t size, int wide, int skip)
{
    size_t w = wide ? 4 : 2, n = size / w;
    if (n > 4096)
        n = 4096;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return;
    int32_t vocab = mx_tok_vocab_size(ft->t);
    int in_range = 1;
    for (size_t k = 0; k < n; k++) {
        uint32_t v = d[k * w] | (uint32_t)d[k * w + 1] << 8;
        if (wide)
            v |= (uint32_t)d[k * w + 2] << 16 | (uint32_t)d[k * w + 3] << 24;
        ids[k] = (int32_t)v;
        in_range &= ids[k] >= 0 && ids[k] < vocab;
    }
    char *whole = NULL;
    size_t wlen = 0;
    mx_err e;
    int rc = mx_tok_decode(ft->t, ids, n, skip, &whole, &wlen, &e);
    if ((rc == 0) != in_range)
        abort();   /* out-of-range ids, and only they, are errors */
    if (rc) {
        free(ids);
        return;
    }
    mx_tok_stream *s = mx_tok_stream_new(ft->t, skip);
    char *acc = malloc(wlen + 1);
    size_t alen = 0;
    int differs = !s || !acc;
    for (size_t k = 0; k <= n && !differs; k++) {
        char *piece = NULL;
        size_t plen = 0;
        if (k < n ? mx_tok_stream_push(s, ids[k], &piece, &plen, &e)
                  : mx_tok_stream_flush(s, &piece, &plen, &e))
            abort();
        if (alen + plen > wlen || (plen && memcmp(whole + alen, piece, plen)))
            differs = 1;
        else
            memcpy(acc + alen, piece, plen), alen += plen;
        free(piece);
    }
    if (!differs && alen != wlen)
        differs = 1;
    int replaced = memmem(whole, wlen, "\xef\xbf\xbd", 3) != NULL;
    if (differs && s && acc && !replaced) {
        fprintf(stderr, "%s: stream decode differs from whole decode (skip_special %d)\n", ft->name, skip);
        abort();
    }
    mx_tok_stream_free(s);
    free(acc);
    free(whole);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || n_toks == 0)
        return 0;
    const fz_tok *ft = &toks[(data[0] & 7) % n_toks];
    int mode = (data[0] >> 3) & 3;
    const uint8_t *rest = data + 1;
    size_t n = size - 1;
    if (mode <= 1) {
        char *text = malloc(n ? n : 1);   /* exact size: no NUL to lean on */
        if (!text)
            return 0;
        memcpy(text, rest, n);
        encode(ft, text, n, mode);
        free(text);
    } else {
        decode(ft, rest, n, data[0] >> 5 & 1, data[0] >> 6 & 1);
    }
    return 0;
}
