/* bench_grammar.c - the per-token cost of a grammar's mask over a real
 * vocabulary (the 151k-token Qwen tokenizer of the fixtures).
 *
 *   MLXCEL_FIXTURES=... build/bench_grammar [tokenizer.json] [tokens]
 *
 * Builds the vocabulary trie once (timed), then generates `tokens` tokens
 * (default 300) under each grammar: at each step the mask is computed over
 * the whole vocabulary, a random allowed token is picked and accepted.
 * Prints the mean and worst mask time, with cache hits and misses apart. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int token_bytes(void *ud, int32_t id, char *buf, size_t cap)
{
    const mx_tokenizer *t = ud;
    if (id >= mx_tok_vocab_size(t) || mx_tok_is_special(t, id))
        return -1;
    return mx_tok_token_bytes(t, id, buf, cap);
}

static void run(const char *name, const char *gbnf, const mx_grammar_vocab *v, int32_t V, int steps)
{
    mx_grammar *g = NULL;
    mx_grammar_state *s = NULL;
    mx_err e = {0};
    if (mx_grammar_parse(gbnf, strlen(gbnf), &g, &e) || mx_grammar_state_new(g, v, &s, &e)) {
        fprintf(stderr, "%s: %s\n", name, e.msg);
        exit(1);
    }
    float *logits = malloc(sizeof *logits * (size_t)V);
    int32_t *ok = malloc(sizeof *ok * (size_t)V);
    double t_all = 0, t_max = 0;
    int n = 0, restarts = 0;
    uint64_t rng = 12345;
    for (int i = 0; i < steps; i++) {
        for (int32_t k = 0; k < V; k++)
            logits[k] = 0;
        double t0 = now();
        size_t allowed = mx_grammar_mask(s, logits, V);
        double dt = now() - t0;
        t_all += dt;
        if (dt > t_max)
            t_max = dt;
        n++;
        size_t m = 0;
        for (int32_t k = 0; k < V; k++)
            if (!isinf(logits[k]))
                ok[m++] = k;
        if (!allowed || !m || mx_grammar_finished(s)) {
            /* start over when the sentence is done */
            mx_grammar_state_free(s);
            mx_grammar_state_new(g, v, &s, &e);
            restarts++;
            continue;
        }
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int32_t id = ok[(rng >> 33) % m];
        if (mx_grammar_accept_token(s, id)) {
            mx_grammar_state_free(s);
            mx_grammar_state_new(g, v, &s, &e);
            restarts++;
        }
    }
    printf("%-12s %4d masks: mean %.3f ms, worst %.3f ms (%d sentences finished)\n", name, n,
           1e3 * t_all / n, 1e3 * t_max, restarts);
    free(logits);
    free(ok);
    mx_grammar_state_free(s);
    mx_grammar_free(g);
}

int main(int argc, char **argv)
{
    char path[4096];
    const char *fx = getenv("MLXCEL_FIXTURES");
    if (argc > 1)
        snprintf(path, sizeof path, "%s", argv[1]);
    else if (fx)
        snprintf(path, sizeof path, "%s/qwen2_moe_tiny_chat/tokenizer.json", fx);
    else {
        fprintf(stderr, "usage: bench_grammar tokenizer.json [tokens] (or set MLXCEL_FIXTURES)\n");
        return 2;
    }
    int steps = argc > 2 ? atoi(argv[2]) : 300;
    mx_tokenizer *t = NULL;
    mx_err e = {0};
    if (mx_tok_load(path, &t, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    int32_t V = mx_tok_vocab_size(t), eos = mx_tok_lookup(t, "<|im_end|>");
    mx_grammar_vocab *v = NULL;
    double t0 = now();
    if (mx_grammar_vocab_new(V, token_bytes, t, &eos, 1, &v, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    printf("vocabulary: %d tokens, trie built in %.1f ms\n", V, 1e3 * (now() - t0));
    run("json_object", mx_grammar_json_object_gbnf(), v, V, steps);
    const char *schema = "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"},"
                         "\"age\": {\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\":"
                         "{\"type\": \"string\", \"maxLength\": 10}}}, \"required\": [\"name\", \"age\"]}";
    cJSON *j = cJSON_Parse(schema);
    char *gbnf = NULL;
    if (mx_grammar_from_schema(j, &gbnf, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    run("json_schema", gbnf, v, V, steps);
    run("digits", "root ::= [0-9]{1,200}", v, V, steps);
    free(gbnf);
    cJSON_Delete(j);
    mx_grammar_vocab_free(v);
    mx_tok_free(t);
    return 0;
}
