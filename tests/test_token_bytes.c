/* test_token_bytes.c - mx_tok_token_bytes: the bytes of the tokens of an
 * encoding concatenate to the text (byte-level BPE: exactly; SentencePiece
 * with a prepended metaspace: a space, then the text), and a byte-level
 * token that is one byte of a multi-byte character yields that byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "tokenizer/tokenizer.h"

/* Concatenated token bytes of encode(text), into out (cap bytes); length. */
static size_t concat(const mx_tokenizer *t, const char *text, char *out, size_t cap)
{
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    mx_err e = {0};
    CHECK_OK(mx_tok_encode(t, text, strlen(text), 0, &ids, &n, &e), &e);
    for (size_t i = 0; i < n; i++) {
        int k = mx_tok_token_bytes(t, ids[i], out + len, cap - len);
        CHECK(k >= 0 && len + (size_t)k < cap);
        if (k > 0)
            len += (size_t)k;
    }
    free(ids);
    return len;
}

static const char *texts[] = {
    "Hello world", "caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",
    "emoji \xf0\x9f\x8e\x89\xf0\x9f\x91\x8d and {\"json\": [1, 2.5e3]}\n\ttabs",
};

int main(void)
{
    const char *fx = test_fixtures();
    if (!fx)
        return 77;
    char path[4096], buf[4096];
    mx_err e = {0};
    mx_tokenizer *t = NULL;

    snprintf(path, sizeof path, "%s/qwen2_moe_tiny_chat/tokenizer.json", fx);
    CHECK_OK(mx_tok_load(path, &t, &e), &e);
    if (t) {
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
            size_t n = concat(t, texts[i], buf, sizeof buf);
            CHECKF(n == strlen(texts[i]) && !memcmp(buf, texts[i], n), "qwen bytes of '%s'", texts[i]);
        }
        /* GPT-2's byte map keeps byte 0xE4 as U+00E4: that token is the lone byte */
        int32_t id = mx_tok_lookup(t, "\xc3\xa4");
        CHECK(id >= 0 && mx_tok_token_bytes(t, id, buf, sizeof buf) == 1 && (unsigned char)buf[0] == 0xE4);
        /* special tokens are their content; ids past the vocabulary are -1 */
        id = mx_tok_lookup(t, "<|im_end|>");
        CHECK(mx_tok_token_bytes(t, id, buf, sizeof buf) == 10 && !memcmp(buf, "<|im_end|>", 10));
        CHECK(mx_tok_token_bytes(t, mx_tok_vocab_size(t), buf, sizeof buf) == -1);
        CHECK(mx_tok_token_bytes(t, -1, buf, sizeof buf) == -1);
        /* a short buffer gets a prefix, the length is the full one */
        id = mx_tok_lookup(t, "<|im_start|>");
        CHECK(mx_tok_token_bytes(t, id, buf, 3) == 12 && !memcmp(buf, "<|i", 3));
        mx_tok_free(t);
    }

    snprintf(path, sizeof path, "%s/tokenizers/mixtral/tokenizer.json", fx);
    t = NULL;
    CHECK_OK(mx_tok_load(path, &t, &e), &e);
    if (t) {
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
            size_t n = concat(t, texts[i], buf, sizeof buf);
            CHECKF(n == strlen(texts[i]) + 1 && buf[0] == ' ' && !memcmp(buf + 1, texts[i], n - 1),
                   "mixtral bytes of '%s'", texts[i]);
        }
        /* <0xE2> is byte fallback for one byte */
        int32_t id = mx_tok_lookup(t, "<0xE2>");
        CHECK(id >= 0 && mx_tok_token_bytes(t, id, buf, sizeof buf) == 1 && (unsigned char)buf[0] == 0xE2);
        mx_tok_free(t);
    }
    return test_summary();
}
