/* fuzz_tokenizer_load.c - libFuzzer entry: any bytes as tokenizer.json
 * (its regexes go to PCRE2, its vocabulary and merges to the BPE tables)
 * must load or fail with a message; a tokenizer that loads must then encode
 * and decode without crashing, and ids it gives back must be in range. */
#include "fuzz_util.h"

#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    return 0;
}

static void exercise(const mx_tokenizer *t)
{
    static const char *texts[] = {
        "Hello world", " <|im_start|>user\n  x\t\u00e9\u0301!?", "\xe2\x96\x81\xe2\x96\x81\x61 12345", "",
    };
    int32_t vocab = mx_tok_vocab_size(t);
    mx_err e;
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (mx_tok_encode(t, texts[i], strlen(texts[i]), special, &ids, &n, &e) == 0) {
                for (size_t k = 0; k < n; k++)
                    if (ids[k] < 0 || ids[k] >= vocab)
                        abort();
                char *text = NULL;
                size_t len = 0;
                if (mx_tok_decode(t, ids, n, 0, &text, &len, &e) == 0 && text[len] != 0)
                    abort();   /* NUL-terminated as promised */
                free(text);
            }
            free(ids);
        }
    }
    /* the first ids, one at a time and through the stream decoder */
    mx_tok_stream *s = mx_tok_stream_new(t, 0);
    char buf[64];
    for (int32_t id = 0; id < vocab && id < 48; id++) {
        if (mx_tok_token_bytes(t, id, buf, sizeof buf) < -1)
            abort();
        char *out = NULL;
        size_t len = 0;
        if (s && mx_tok_stream_push(s, id, &out, &len, &e) == 0 && out[len] != 0)
            abort();
        free(out);
    }
    if (s) {
        char *out = NULL;
        size_t len = 0;
        if (mx_tok_stream_flush(s, &out, &len, &e) == 0)
            free(out);
        mx_tok_stream_free(s);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact-size copy: ASan sees any read past the end */
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    mx_tokenizer *t = NULL;
    mx_err e = {0};
    if (mx_tok_load_mem(buf, size, "fuzz/tokenizer.json", &t, &e) == 0) {
        exercise(t);
        mx_tok_free(t);
    } else if (t || !e.msg[0]) {
        abort();   /* an error leaves nothing behind and says why */
    }
    free(buf);
    return 0;
}
