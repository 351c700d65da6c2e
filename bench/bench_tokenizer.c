/* bench_tokenizer.c - load time of a tokenizer.json and encode throughput.
 *
 *   bench_tokenizer [tokenizer.json] [MB of English] [repeats]
 *
 * Without a path it uses $MLXCEL_FIXTURES/qwen2_moe_tiny_chat/tokenizer.json.
 * The text is generated: English-like sentences (common words plus made-up
 * ones, so the word cache does not see only repeats, numbers, punctuation,
 * newlines) and separately CJK text.  Reports min / median over the repeats;
 * the first encode of each text runs with an empty word cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "util/clock.h"

static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static unsigned rnd(unsigned n)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (unsigned)((rng * 2685821657736338717ULL) >> 33) % n;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void stats(double *v, int n, double *mn, double *med)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    *mn = v[0];
    *med = v[n / 2];
}

static char *english(size_t bytes)
{
    static const char *common[] = {
        "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with",
        "be", "by", "on", "not", "he", "I", "this", "are", "or", "his", "from", "at", "which",
        "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can",
        "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so",
        "model", "expert", "router", "token", "layer", "weights", "inference", "memory",
        "quickly", "between", "government", "information", "development", "understanding",
        "however", "because", "through", "different", "important", "experience", "mixture",
        "don't", "it's", "we're", "they've", "running", "computation", "language", "people"};
    static const char *syl[] = {"ka", "ter", "pro", "lin", "vo", "dra", "mes", "qui", "on",
                                "zel", "ast", "ric", "um", "bel", "tor", "gan", "ex", "ly"};
    char *s = malloc(bytes + 64);
    size_t n = 0;
    int start = 1;
    while (n < bytes) {
        char w[64];
        int wl;
        unsigned r = rnd(100);
        if (r < 78) {
            wl = snprintf(w, sizeof w, "%s", common[rnd(sizeof common / sizeof *common)]);
        } else if (r < 95) {
            wl = 0;
            for (unsigned k = 0, m = 2 + rnd(3); k < m; k++)
                wl += snprintf(w + wl, sizeof w - (size_t)wl, "%s", syl[rnd(18)]);
        } else {
            wl = snprintf(w, sizeof w, "%u", rnd(100000));
        }
        if (start && w[0] >= 'a' && w[0] <= 'z')
            w[0] = (char)(w[0] - 32);
        start = 0;
        memcpy(s + n, w, (size_t)wl);
        n += (size_t)wl;
        r = rnd(100);
        if (r < 6) {
            memcpy(s + n, ". ", 2);
            n += 2;
            start = 1;
        } else if (r < 10) {
            memcpy(s + n, ", ", 2);
            n += 2;
        } else if (r < 11) {
            memcpy(s + n, ".\n\n", 3);
            n += 3;
            start = 1;
        } else {
            s[n++] = ' ';
        }
    }
    s[n] = 0;
    return s;
}

static char *cjk(size_t bytes)
{
    char *s = malloc(bytes + 16);
    size_t n = 0;
    while (n < bytes) {
        /* mostly from the first few thousand (common) CJK ideographs */
        unsigned cp = 0x4E00 + rnd(rnd(4) ? 3000 : 20000);
        s[n++] = (char)(0xE0 | (cp >> 12));
        s[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        s[n++] = (char)(0x80 | (cp & 0x3F));
        if (rnd(20) == 0) {
            memcpy(s + n, rnd(2) ? "\xEF\xBC\x8C" : "\xE3\x80\x82", 3);   /* ，or 。 */
            n += 3;
        }
    }
    s[n] = 0;
    return s;
}

static int bench_encode(const mx_tokenizer *t, const char *label, const char *text, int reps)
{
    size_t len = strlen(text);
    double *v = calloc((size_t)reps, sizeof *v), first = 0, mn, med;
    size_t ntok = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids = NULL;
        mx_err e = {0};
        double t0 = mx_now();
        if (mx_tok_encode(t, text, len, 1, &ids, &ntok, &e)) {
            fprintf(stderr, "encode failed: %s\n", e.msg);
            free(v);
            return 1;
        }
        v[r] = mx_now() - t0;
        if (r == 0)
            first = v[r];
        free(ids);
    }
    stats(v, reps, &mn, &med);
    double mb = (double)len / 1e6;
    printf("encode %-8s %6.2f MB -> %8zu tokens: %6.2f MB/s best, %6.2f MB/s median, "
           "%6.2f MB/s first (cold cache)\n", label, mb, ntok, mb / mn, mb / med, mb / first);
    free(v);
    return 0;
}

int main(int argc, char **argv)
{
    char def[1024];
    const char *path = argc > 1 ? argv[1] : NULL;
    if (!path) {
        const char *fx = getenv("MLXCEL_FIXTURES");
        if (!fx) {
            fprintf(stderr, "usage: bench_tokenizer [tokenizer.json] [MB] [repeats] "
                            "(or set MLXCEL_FIXTURES)\n");
            return 2;
        }
        snprintf(def, sizeof def, "%s/qwen2_moe_tiny_chat/tokenizer.json", fx);
        path = def;
    }
    double mbytes = argc > 2 ? atof(argv[2]) : 4.0;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (reps < 1)
        reps = 1;

    double *lt = calloc((size_t)reps, sizeof *lt), mn, med;
    mx_tokenizer *t = NULL;
    for (int r = 0; r < reps; r++) {
        mx_err e = {0};
        mx_tok_free(t);
        double t0 = mx_now();
        if (mx_tok_load(path, &t, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        lt[r] = mx_now() - t0;
    }
    stats(lt, reps, &mn, &med);
    printf("load %s: %.1f ms best, %.1f ms median (%d runs, vocab %d)\n", path, mn * 1e3,
           med * 1e3, reps, (int)mx_tok_vocab_size(t));
    free(lt);

    char *en = english((size_t)(mbytes * 1e6));
    char *zh = cjk((size_t)(mbytes * 1e6 / 4));
    int rc = bench_encode(t, "english", en, reps) || bench_encode(t, "cjk", zh, reps);

    /* decode throughput of the English ids */
    int32_t *ids = NULL;
    size_t n = 0;
    mx_err e = {0};
    if (!rc && !mx_tok_encode(t, en, strlen(en), 1, &ids, &n, &e)) {
        char *s = NULL;
        size_t sl = 0;
        double t0 = mx_now();
        rc = mx_tok_decode(t, ids, n, 0, &s, &sl, &e);
        double dt = mx_now() - t0;
        printf("decode english %zu tokens: %.2f MB/s%s\n", n, (double)sl / 1e6 / dt,
               !rc && sl == strlen(en) && memcmp(s, en, sl) == 0 ? " (round trip exact)" : " (MISMATCH)");
        free(s);
        free(ids);
    }
    free(en);
    free(zh);
    mx_tok_free(t);
    return rc;
}
