/* test_api.c - the public C API (include/mlxcel.h) through its own calls.
 *
 * On the demo model models/kjv-moe (in the tree; PyTorch's greedy ids in
 * eval/reference_greedy.json):
 *   - errors: NULL and wrong-kind handles, bad arguments, bad options and
 *     struct sizes, each a status code plus a message naming the function;
 *   - model facts against config.json; tokenize/detokenize against the
 *     reference's prompt and prompt_ids; the ChatML fallback template;
 *   - greedy decoding by hand (sample + decode) and by mlxcel_generate equal
 *     to PyTorch's greedy ids, with the fused MoE kernel on and off and one
 *     thread; two threads generating at once on one model;
 *   - KV reuse: keep / set_tokens give bit-identical logits to a fresh
 *     context fed the same way, and within 1e-3 of one whole-prompt prefill;
 *     reset gives the first logits again;
 *   - the stop callback, stop strings, max_tokens, sampling determinism;
 *   - an exact and a fast model used in turns, each in its own precision.
 * With MLXCEL_FIXTURES: qwen2_moe_tiny_chat's chat template and special
 * tokens, and its chat prompt through the API giving the reference ids. */
#include "test.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "mlxcel.h"
#include "quant/quant.h"
#include "util/file.h"

#define MAX_IDS 64

typedef struct ref_greedy {
    char prompt[256];
    int32_t prompt_ids[MAX_IDS], greedy[MAX_IDS];
    size_t n_prompt, n_greedy;
} ref_greedy;

static size_t json_ids(const cJSON *a, int32_t *out)
{
    size_t n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) if (n < MAX_IDS) out[n++] = (int32_t)it->valueint;
    return n;
}

static int read_kjv_reference(const char *dir, ref_greedy *r)
{
    char path[1200], *text = NULL;
    snprintf(path, sizeof path, "%s/eval/reference_greedy.json", dir);
    mx_err e = {0};
    if (mx_read_file(path, &text, NULL, &e))
        return -1;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j)
        return -1;
    snprintf(r->prompt, sizeof r->prompt, "%s", cJSON_GetObjectItem(j, "prompt")->valuestring);
    r->n_prompt = json_ids(cJSON_GetObjectItem(j, "prompt_ids"), r->prompt_ids);
    r->n_greedy = json_ids(cJSON_GetObjectItem(j, "greedy_ids"), r->greedy);
    cJSON_Delete(j);
    return 0;
}

static int config_int(const char *dir, const char *key)
{
    char path[1200], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    mx_err e = {0};
    if (mx_read_file(path, &text, NULL, &e))
        return -2;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *v = cJSON_GetObjectItem(j, key);
    int r = cJSON_IsNumber(v) ? v->valueint : -2;
    cJSON_Delete(j);
    return r;
}

#define CHECK_STATUS(expr, want) do { int rc_ = (expr); \
    CHECKF(rc_ == (want), "%s returned %d, expected %d (%s)", #expr, rc_, (want), mlxcel_last_error()); \
    } while (0)
/* the message names the function that failed */
#define CHECK_MSG(fn) CHECKF(strstr(mlxcel_last_error(), fn) != NULL, "message '%s' lacks %s", \
                             mlxcel_last_error(), fn)

/* ---- errors without a model ------------------------------------------------- */

static void test_version_and_errors(const char *kjv)
{
    CHECK(strcmp(mlxcel_version(), MLXCEL_VERSION_STRING) == 0);
    CHECK(mlxcel_version_number() == MLXCEL_VERSION_MAJOR * 10000 + MLXCEL_VERSION_MINOR * 100 +
                                         MLXCEL_VERSION_PATCH);
    CHECK(strcmp(mlxcel_strerror(MLXCEL_EIO), "I/O error") == 0);
    CHECK(strcmp(mlxcel_strerror(12345), "unknown status") == 0);

    mlxcel_model *m = (mlxcel_model *)1;
    CHECK_STATUS(mlxcel_model_load(NULL, NULL, &m), MLXCEL_EINVAL);
    CHECK(m == NULL);
    CHECK_MSG("mlxcel_model_load");
    CHECK_STATUS(mlxcel_model_load(kjv, NULL, NULL), MLXCEL_EINVAL);
    CHECK_STATUS(mlxcel_model_load("/nonexistent/model", NULL, &m), MLXCEL_EIO);
    CHECK_MSG("/nonexistent/model");
    CHECK(m == NULL);
    /* the message is per thread and stays until the next failure */
    CHECK(mlxcel_version_number() > 0 && strstr(mlxcel_last_error(), "/nonexistent/model"));

    mlxcel_model_options o;
    mlxcel_model_options_init(&o);
    CHECK(o.size == sizeof o && o.threads == 0 && o.context == 0 && o.fused_moe == -1 && !o.precision);
    o.size = 0;
    CHECK_STATUS(mlxcel_model_load(kjv, &o, &m), MLXCEL_EINVAL);
    CHECK_MSG("_init");
    o.size = sizeof o + 8;   /* a newer header than the library */
    CHECK_STATUS(mlxcel_model_load(kjv, &o, &m), MLXCEL_EUNSUPPORTED);
    mlxcel_model_options_init(&o);
    o.threads = -1;
    CHECK_STATUS(mlxcel_model_load(kjv, &o, &m), MLXCEL_EINVAL);
    CHECK_MSG("threads");
    mlxcel_model_options_init(&o);
    o.fused_moe = 2;
    CHECK_STATUS(mlxcel_model_load(kjv, &o, &m), MLXCEL_EINVAL);
    mlxcel_model_options_init(&o);
    o.context = -5;
    CHECK_STATUS(mlxcel_model_load(kjv, &o, &m), MLXCEL_EINVAL);
    mlxcel_model_options_init(&o);
    o.precision = "half";
    CHECK_STATUS(mlxcel_model_load(kjv, &o, &m), MLXCEL_EUNSUPPORTED);
    CHECK_MSG("\"fast\"");
    CHECK(m == NULL);
}

/* Every entry point with a NULL handle, and with a handle of the other kind. */
static void test_bad_handles(mlxcel_model *m, mlxcel_context *c)
{
    mlxcel_context *not_ctx = (mlxcel_context *)(void *)m;
    mlxcel_model *not_model = (mlxcel_model *)(void *)c;
    int32_t *ids = NULL, id = 0;
    size_t n = 0;
    char *text = NULL;
    mlxcel_context *c2 = NULL;
    for (int k = 0; k < 2; k++) {
        mlxcel_model *bm = k ? not_model : NULL;
        mlxcel_context *bc = k ? not_ctx : NULL;
        const char *why = k ? "not a" : "NULL";
        CHECK(mlxcel_model_family(bm) == NULL);
        CHECK_MSG(why);
        CHECK(mlxcel_model_n_layers(bm) == -1 && mlxcel_model_n_vocab(bm) == -1 &&
              mlxcel_model_n_ctx_train(bm) == -1 && mlxcel_model_n_ctx(bm) == -1 &&
              mlxcel_model_n_experts(bm) == -1 && mlxcel_model_n_experts_used(bm) == -1 &&
              mlxcel_model_has_tokenizer(bm) == -1 && mlxcel_model_bos(bm) == -1 &&
              mlxcel_model_n_eos(bm) == -1 && mlxcel_model_eos(bm, 0) == -1 &&
              mlxcel_model_is_eos(bm, 0) == -1 && mlxcel_token_id(bm, "a") == -1);
        CHECK_STATUS(mlxcel_tokenize(bm, "a", 1, 1, &ids, &n), MLXCEL_EINVAL);
        CHECK_MSG("mlxcel_tokenize");
        CHECK_STATUS(mlxcel_detokenize(bm, &id, 1, 0, &text, NULL), MLXCEL_EINVAL);
        CHECK_STATUS(mlxcel_chat_render(bm, "[]", NULL, NULL, 1, &text), MLXCEL_EINVAL);
        CHECK_STATUS(mlxcel_context_new(bm, 0, &c2), MLXCEL_EINVAL);
        CHECK(c2 == NULL);
        CHECK(mlxcel_context_n_ctx(bc) == -1 && mlxcel_context_n_tokens(bc) == -1 &&
              mlxcel_context_tokens(bc, NULL, 0) == -1 && mlxcel_context_logits(bc) == NULL);
        CHECK_STATUS(mlxcel_context_reset(bc), MLXCEL_EINVAL);
        CHECK_STATUS(mlxcel_context_keep(bc, 0), MLXCEL_EINVAL);
        CHECK_STATUS(mlxcel_context_prefill(bc, &id, 1), MLXCEL_EINVAL);
        CHECK_STATUS(mlxcel_context_decode(bc, 0), MLXCEL_EINVAL);
        CHECK_MSG("mlxcel_context_decode");
        CHECK_STATUS(mlxcel_context_set_tokens(bc, &id, 1, NULL), MLXCEL_EINVAL);
        CHECK_STATUS(mlxcel_context_set_sampling(bc, NULL), MLXCEL_EINVAL);
        CHECK_STATUS(mlxcel_context_sample(bc, &id), MLXCEL_EINVAL);
        CHECK_STATUS(mlxcel_generate(bc, &id, 1, NULL, NULL, NULL, NULL), MLXCEL_EINVAL);
        /* freeing a wrong handle is ignored, not a crash */
        mlxcel_model_free(bm);
        mlxcel_context_free(bc);
    }
    /* NULL out-pointers */
    CHECK_STATUS(mlxcel_tokenize(m, "a", 1, 1, NULL, &n), MLXCEL_EINVAL);
    CHECK_STATUS(mlxcel_detokenize(m, &id, 1, 0, NULL, NULL), MLXCEL_EINVAL);
    CHECK_STATUS(mlxcel_chat_render(m, "[]", NULL, NULL, 1, NULL), MLXCEL_EINVAL);
    CHECK_STATUS(mlxcel_context_new(m, 0, NULL), MLXCEL_EINVAL);
    CHECK_STATUS(mlxcel_context_sample(c, NULL), MLXCEL_EINVAL);
    CHECK(mlxcel_context_tokens(c, NULL, 4) == -1);
}

/* ---- the model and its tokenizer ---------------------------------------------- */

static void test_model_facts(mlxcel_model *m, const char *dir, const ref_greedy *r)
{
    CHECK(strcmp(mlxcel_model_family(m), "qwen2_moe") == 0);
    CHECK(mlxcel_model_n_layers(m) == config_int(dir, "num_hidden_layers"));
    CHECK(mlxcel_model_n_vocab(m) == config_int(dir, "vocab_size"));
    CHECK(mlxcel_model_n_ctx_train(m) == config_int(dir, "max_position_embeddings"));
    CHECK(mlxcel_model_n_ctx(m) == 2048);   /* min(max_position_embeddings 2048, 4096) */
    CHECK(mlxcel_model_n_experts(m) == config_int(dir, "num_experts"));
    CHECK(mlxcel_model_n_experts_used(m) == config_int(dir, "num_experts_per_tok"));
    CHECK(mlxcel_model_has_tokenizer(m) == 1);
    CHECK(mlxcel_model_bos(m) == config_int(dir, "bos_token_id"));
    /* eos_token_id 0 in config.json, and the tokenizer_config's eos_token
     * "<|endoftext|>" is id 0 too: one id */
    CHECK(mlxcel_model_n_eos(m) == 1 && mlxcel_model_eos(m, 0) == config_int(dir, "eos_token_id"));
    CHECK(mlxcel_model_eos(m, 1) == -1);
    CHECK_MSG("mlxcel_model_eos");
    CHECK(mlxcel_model_is_eos(m, 0) == 1 && mlxcel_model_is_eos(m, 5) == 0);
    CHECK(mlxcel_token_id(m, "<|im_end|>") == 2 && mlxcel_token_id(m, "no such token") == -1);
    CHECK(mlxcel_token_id(m, NULL) == -1);

    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_STATUS(mlxcel_tokenize(m, r->prompt, strlen(r->prompt), 1, &ids, &n), MLXCEL_OK);
    CHECK(n == r->n_prompt && ids && !memcmp(ids, r->prompt_ids, n * sizeof *ids));
    mlxcel_free(ids);
    CHECK_STATUS(mlxcel_tokenize(m, "", 0, 1, &ids, &n), MLXCEL_OK);
    CHECK(n == 0 && ids != NULL);
    mlxcel_free(ids);
    /* special tokens in the text: parsed or plain */
    CHECK_STATUS(mlxcel_tokenize(m, "<|im_end|>", 10, 1, &ids, &n), MLXCEL_OK);
    CHECK(n == 1 && ids[0] == 2);
    mlxcel_free(ids);
    CHECK_STATUS(mlxcel_tokenize(m, "<|im_end|>", 10, 0, &ids, &n), MLXCEL_OK);
    CHECK(n > 1);
    mlxcel_free(ids);
    CHECK_STATUS(mlxcel_tokenize(m, "\xff\xfe", 2, 1, &ids, &n), MLXCEL_EINVAL);
    CHECK(ids == NULL && n == 0);
    CHECK_STATUS(mlxcel_tokenize(m, NULL, 3, 1, &ids, &n), MLXCEL_EINVAL);

    char *text = NULL;
    size_t len = 0;
    CHECK_STATUS(mlxcel_detokenize(m, r->prompt_ids, r->n_prompt, 0, &text, &len), MLXCEL_OK);
    CHECK(text && len == strlen(r->prompt) && !strcmp(text, r->prompt));
    mlxcel_free(text);
    int32_t with_special[2] = {2, r->prompt_ids[0]};
    CHECK_STATUS(mlxcel_detokenize(m, with_special, 2, 1, &text, NULL), MLXCEL_OK);
    CHECK(text && !strstr(text, "<|im_end|>"));
    mlxcel_free(text);
    int32_t bad_id = mlxcel_model_n_vocab(m) + 7;
    CHECK_STATUS(mlxcel_detokenize(m, &bad_id, 1, 0, &text, &len), MLXCEL_ERANGE);
    CHECK_MSG("outside");
    CHECK(text == NULL);

    /* no chat_template in tokenizer_config.json: the ChatML fallback */
    CHECK_STATUS(mlxcel_chat_render(m, "[{\"role\": \"user\", \"content\": \"Hi\"}]", NULL, NULL, 1, &text),
                 MLXCEL_OK);
    CHECK(text && !strcmp(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
    mlxcel_free(text);
    CHECK_STATUS(mlxcel_chat_render(m, "[{\"role\": \"user\"", NULL, NULL, 1, &text), MLXCEL_EINVAL);
    CHECK_MSG("messages_json is not valid JSON");
    CHECK_STATUS(mlxcel_chat_render(m, "{}", NULL, NULL, 1, &text), MLXCEL_EINVAL);
    CHECK_STATUS(mlxcel_chat_render(m, "[]", "{}", NULL, 1, &text), MLXCEL_EINVAL);
    CHECK_MSG("tools_json");
    CHECK_STATUS(mlxcel_chat_render(m, "[]", NULL, "[]", 1, &text), MLXCEL_EINVAL);
    CHECK_STATUS(mlxcel_chat_render(m, NULL, NULL, NULL, 1, &text), MLXCEL_EINVAL);
    CHECK(text == NULL);
}

/* ---- decoding ------------------------------------------------------------------ */

static void set_greedy(mlxcel_context *c)
{
    mlxcel_sampling s;
    mlxcel_sampling_init(&s);
    s.temperature = 0;
    CHECK_STATUS(mlxcel_context_set_sampling(c, &s), MLXCEL_OK);
}

/* Greedy by hand: set_tokens, then sample + decode; the ids into out. */
static void greedy_by_hand(mlxcel_context *c, const ref_greedy *r, int32_t *out)
{
    set_greedy(c);
    CHECK_STATUS(mlxcel_context_set_tokens(c, r->prompt_ids, r->n_prompt, NULL), MLXCEL_OK);
    for (size_t i = 0; i < r->n_greedy; i++) {
        out[i] = -1;
        if (mlxcel_context_sample(c, &out[i]) || mlxcel_context_decode(c, out[i]))
            break;
    }
}

typedef struct collect {
    int32_t ids[MAX_IDS];
    int n, n_final, stop_after;
    char text[4096];
    size_t len;
} collect;

static int on_token(void *user, int32_t id, const char *text, size_t len)
{
    collect *k = user;
    if (id < 0)
        k->n_final++;
    else if (k->n < MAX_IDS)
        k->ids[k->n++] = id;
    if (text && k->len + len < sizeof k->text) {
        memcpy(k->text + k->len, text, len);
        k->len += len;
        k->text[k->len] = 0;
    }
    return k->stop_after && k->n >= k->stop_after;
}

static void test_greedy(const char *dir, const ref_greedy *r, int threads, int fused)
{
    mlxcel_model_options o;
    mlxcel_model_options_init(&o);
    o.threads = threads;
    o.fused_moe = fused;
    o.precision = "exact";
    mlxcel_model *m = NULL;
    mlxcel_context *c = NULL;
    CHECK_STATUS(mlxcel_model_load(dir, &o, &m), MLXCEL_OK);
    if (!m)
        return;
    CHECK_STATUS(mlxcel_context_new(m, 128, &c), MLXCEL_OK);
    int32_t got[MAX_IDS];
    greedy_by_hand(c, r, got);
    CHECKF(!memcmp(got, r->greedy, r->n_greedy * sizeof *got),
           "threads=%d fused=%d: greedy by hand differs from PyTorch's", threads, fused);

    mlxcel_generate_options go;
    mlxcel_generate_options_init(&go);
    go.max_tokens = (int)r->n_greedy;
    collect k = {0};
    int finish = -1;
    CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, on_token, &k, &finish), MLXCEL_OK);
    CHECKF(k.n == (int)r->n_greedy && !memcmp(k.ids, r->greedy, r->n_greedy * sizeof *k.ids),
           "threads=%d fused=%d: mlxcel_generate's ids differ from PyTorch's", threads, fused);
    CHECK(finish == MLXCEL_FINISH_LENGTH && k.n_final <= 1);
    /* the cache: the prompt and every generated token but the last */
    CHECK(mlxcel_context_n_tokens(c) == (int)(r->n_prompt + r->n_greedy - 1));
    CHECK(mlxcel_context_logits(c) == NULL);
    mlxcel_context_free(c);
    mlxcel_model_free(m);
}

/* ---- KV reuse, reset ------------------------------------------------------------ */

static int same_logits(const float *a, const float *b, int V)
{
    return a && b && !memcmp(a, b, sizeof(float) * (size_t)V);
}

static double max_diff(const float *a, const float *b, int V)
{
    double d = 0;
    for (int i = 0; i < V; i++)
        if (fabs((double)a[i] - b[i]) > d || a[i] != a[i] || b[i] != b[i])
            d = (a[i] != a[i] || b[i] != b[i]) ? INFINITY : fabs((double)a[i] - b[i]);
    return d;
}

static int argmax(const float *x, int V)
{
    int b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* ---- precision ------------------------------------------------------------------ */

/* Two models of one checkpoint, exact and fast, used in turns: each pass
 * runs in its model's precision (the engine's switch is process-wide), the
 * exact logits stay bit-identical to those before any fast pass, and the
 * fast ones pick the same top token (its margin is 1.6 logits). */
static void test_precision(const char *dir, const ref_greedy *r)
{
    mlxcel_model_options o;
    mlxcel_model_options_init(&o);
    mlxcel_model *exact = NULL, *fast = NULL;
    mlxcel_context *ce = NULL, *cf = NULL;
    o.precision = "exact";
    CHECK_STATUS(mlxcel_model_load(dir, &o, &exact), MLXCEL_OK);
    o.precision = "fast";
    CHECK_STATUS(mlxcel_model_load(dir, &o, &fast), MLXCEL_OK);
    if (exact)
        CHECK_STATUS(mlxcel_context_new(exact, 64, &ce), MLXCEL_OK);
    if (fast)
        CHECK_STATUS(mlxcel_context_new(fast, 64, &cf), MLXCEL_OK);
    if (!ce || !cf)
        goto done;
    const int V = mlxcel_model_n_vocab(exact);
    float *first = malloc(sizeof(float) * (size_t)V);
    CHECK_STATUS(mlxcel_context_prefill(ce, r->prompt_ids, r->n_prompt), MLXCEL_OK);
    CHECK(mx_precision_get() == MX_PRECISION_EXACT);
    memcpy(first, mlxcel_context_logits(ce), sizeof(float) * (size_t)V);
    CHECK_STATUS(mlxcel_context_prefill(cf, r->prompt_ids, r->n_prompt), MLXCEL_OK);
    CHECK(mx_precision_get() == MX_PRECISION_FAST);
    CHECK(argmax(mlxcel_context_logits(cf), V) == r->greedy[0]);
    CHECK_STATUS(mlxcel_context_reset(ce), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_prefill(ce, r->prompt_ids, r->n_prompt), MLXCEL_OK);
    CHECK(mx_precision_get() == MX_PRECISION_EXACT);
    CHECKF(same_logits(first, mlxcel_context_logits(ce), V), "exact logits changed after a fast pass");
    free(first);
done:
    mlxcel_context_free(ce);
    mlxcel_context_free(cf);
    mlxcel_model_free(exact);
    mlxcel_model_free(fast);
}

static void test_kv_reuse(mlxcel_model *m, const ref_greedy *r)
{
    const int V = mlxcel_model_n_vocab(m);
    const size_t P = r->n_prompt;
    int32_t seq[MAX_IDS * 2];
    memcpy(seq, r->prompt_ids, P * sizeof *seq);
    memcpy(seq + P, r->greedy, r->n_greedy * sizeof *seq);
    const size_t N = P + r->n_greedy;   /* prompt + 16 */
    float *want = malloc(sizeof(float) * (size_t)V), *first = malloc(sizeof(float) * (size_t)V);
    mlxcel_context *a = NULL, *b = NULL, *w = NULL;
    CHECK_STATUS(mlxcel_context_new(m, 64, &a), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_new(m, 64, &b), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_new(m, 64, &w), MLXCEL_OK);
    CHECK(mlxcel_context_n_ctx(a) == 64 && mlxcel_context_n_tokens(a) == 0);
    CHECK(mlxcel_context_logits(a) == NULL);
    int32_t id;
    CHECK_STATUS(mlxcel_context_sample(a, &id), MLXCEL_EINVAL);
    CHECK_MSG("no logits");

    /* A: the prompt, then every greedy token one by one */
    CHECK_STATUS(mlxcel_context_prefill(a, seq, P), MLXCEL_OK);
    memcpy(first, mlxcel_context_logits(a), sizeof(float) * (size_t)V);
    for (size_t i = P; i < N; i++)
        CHECK_STATUS(mlxcel_context_decode(a, seq[i]), MLXCEL_OK);
    int32_t cached[MAX_IDS * 2];
    CHECK(mlxcel_context_tokens(a, cached, MAX_IDS * 2) == (int)N && !memcmp(cached, seq, N * sizeof *seq));
    CHECK(mlxcel_context_tokens(a, cached, 2) == (int)N);

    /* keep P + 4, then a 4-token continuation; B is fed the same way from
     * empty (prompt, 4 single steps, the same 4-token continuation) */
    const size_t K = P + 4;
    int32_t cont[4] = {seq[K + 2], seq[K], seq[K + 3], seq[K + 1]};   /* not what A held */
    CHECK_STATUS(mlxcel_context_keep(a, (int)K), MLXCEL_OK);
    CHECK(mlxcel_context_n_tokens(a) == (int)K && mlxcel_context_logits(a) == NULL);
    CHECK_STATUS(mlxcel_context_prefill(a, cont, 4), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_prefill(b, seq, P), MLXCEL_OK);
    for (size_t i = P; i < K; i++)
        CHECK_STATUS(mlxcel_context_decode(b, seq[i]), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_prefill(b, cont, 4), MLXCEL_OK);
    CHECKF(same_logits(mlxcel_context_logits(a), mlxcel_context_logits(b), V),
           "keep + prefill: logits differ from a fresh context fed the same way");
    /* and close to one whole prefill of the same tokens (other kernels, so
     * within the tolerance the fixtures tests allow against PyTorch) */
    int32_t whole[MAX_IDS * 2];
    memcpy(whole, seq, K * sizeof *seq);
    memcpy(whole + K, cont, sizeof cont);
    CHECK_STATUS(mlxcel_context_prefill(w, whole, K + 4), MLXCEL_OK);
    memcpy(want, mlxcel_context_logits(w), sizeof(float) * (size_t)V);
    if (mlxcel_context_logits(a)) {
        double d = max_diff(mlxcel_context_logits(a), want, V);
        CHECKF(d < 1e-3, "keep + prefill vs one whole prefill: logits differ by %g", d);
        CHECK(argmax(mlxcel_context_logits(a), V) == argmax(want, V));
    }

    /* set_tokens: reuses the common prefix and runs the rest */
    size_t reused = 99;
    CHECK_STATUS(mlxcel_context_set_tokens(b, whole, K + 4, &reused), MLXCEL_OK);
    CHECK(reused == K + 3);   /* all cached; the last is run again for its logits */
    if (mlxcel_context_logits(b)) {
        double d = max_diff(mlxcel_context_logits(b), want, V);
        CHECKF(d < 1e-3, "set_tokens of the cached tokens: logits differ by %g", d);
    }
    int32_t other[MAX_IDS * 2];
    memcpy(other, whole, (K + 4) * sizeof *other);
    other[P + 1] = (other[P + 1] + 1) % V;   /* differs from position P + 1 on */
    CHECK_STATUS(mlxcel_context_set_tokens(b, other, K + 4, &reused), MLXCEL_OK);
    CHECK(reused == P + 1 && mlxcel_context_n_tokens(b) == (int)(K + 4));
    CHECK_STATUS(mlxcel_context_reset(w), MLXCEL_OK);   /* fed as b was */
    CHECK_STATUS(mlxcel_context_prefill(w, other, P), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_decode(w, other[P]), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_prefill(w, other + P + 1, K + 3 - P), MLXCEL_OK);
    CHECKF(same_logits(mlxcel_context_logits(b), mlxcel_context_logits(w), V),
           "set_tokens with a changed token: logits differ from a fresh context fed the same way");
    CHECK_STATUS(mlxcel_context_set_tokens(b, other, 0, &reused), MLXCEL_EINVAL);

    /* reset: the first logits again */
    CHECK_STATUS(mlxcel_context_reset(a), MLXCEL_OK);
    CHECK(mlxcel_context_n_tokens(a) == 0 && mlxcel_context_logits(a) == NULL);
    CHECK_STATUS(mlxcel_context_prefill(a, seq, P), MLXCEL_OK);
    CHECKF(same_logits(mlxcel_context_logits(a), first, V), "after reset: the prompt's logits differ");

    /* failures leave the context as it was */
    int32_t bad[2] = {seq[0], V};
    CHECK_STATUS(mlxcel_context_prefill(a, bad, 2), MLXCEL_ERANGE);
    CHECK_MSG("outside the vocabulary");
    CHECK_STATUS(mlxcel_context_decode(a, -1), MLXCEL_ERANGE);
    int32_t many[64] = {0};
    CHECK_STATUS(mlxcel_context_prefill(a, many, 64), MLXCEL_ERANGE);
    CHECK_MSG("context full");
    CHECK_STATUS(mlxcel_context_set_tokens(a, many, 65, NULL), MLXCEL_ERANGE);
    CHECK_STATUS(mlxcel_context_keep(a, (int)P + 1), MLXCEL_ERANGE);
    CHECK_STATUS(mlxcel_context_keep(a, -1), MLXCEL_ERANGE);
    CHECK_STATUS(mlxcel_context_prefill(a, NULL, 2), MLXCEL_EINVAL);
    CHECK(mlxcel_context_n_tokens(a) == (int)P);
    CHECKF(same_logits(mlxcel_context_logits(a), first, V), "a failed call changed the logits");
    CHECK_STATUS(mlxcel_context_prefill(a, NULL, 0), MLXCEL_OK);   /* nothing to do */
    CHECK(mlxcel_context_n_tokens(a) == (int)P);

    mlxcel_context_free(a);
    mlxcel_context_free(b);
    mlxcel_context_free(w);
    free(want);
    free(first);
}

/* ---- generation: stop callback, stop strings, options ------------------------------ */

static void test_generate(mlxcel_model *m, const ref_greedy *r)
{
    mlxcel_context *c = NULL;
    CHECK_STATUS(mlxcel_context_new(m, 64, &c), MLXCEL_OK);
    set_greedy(c);
    mlxcel_generate_options go;
    mlxcel_generate_options_init(&go);
    CHECK(go.size == sizeof go && go.max_tokens == 256 && !go.stop && !go.n_stop && !go.ignore_eos);
    go.max_tokens = (int)r->n_greedy;

    /* the callback stops it after 3 tokens: 2 of them were run */
    collect k = {.stop_after = 3};
    int finish = -1;
    CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, on_token, &k, &finish), MLXCEL_OK);
    CHECK(finish == MLXCEL_FINISH_CANCELLED);
    CHECK(k.n == 3 && !memcmp(k.ids, r->greedy, 3 * sizeof *k.ids) && k.n_final == 0);
    CHECK(mlxcel_context_n_tokens(c) == (int)r->n_prompt + 2);

    /* a stop string: the text ends before its first occurrence */
    char *full = NULL;
    CHECK_STATUS(mlxcel_detokenize(m, r->greedy, r->n_greedy, 0, &full, NULL), MLXCEL_OK);
    char *piece = NULL;
    CHECK_STATUS(mlxcel_detokenize(m, r->greedy + 5, 2, 0, &piece, NULL), MLXCEL_OK);
    if (full && piece) {
        const char *stops[1] = {piece};
        go.stop = stops;
        go.n_stop = 1;
        collect s = {0};
        CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, on_token, &s, &finish),
                     MLXCEL_OK);
        size_t before = (size_t)(strstr(full, piece) - full);
        CHECKF(finish == MLXCEL_FINISH_STOP && s.len == before && !strncmp(s.text, full, before),
               "stop \"%s\": got \"%s\" (finish %d), want the first %zu bytes of \"%s\"", piece, s.text,
               finish, before, full);
        const char *bad_stops[1] = {""};
        go.stop = bad_stops;
        CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, on_token, &s, &finish),
                     MLXCEL_EINVAL);
        go.stop = NULL;
        CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, on_token, &s, &finish),
                     MLXCEL_EINVAL);
        go.n_stop = 0;
    }
    mlxcel_free(full);
    mlxcel_free(piece);

    /* no tokens asked; no callback; bad prompts and options */
    go.max_tokens = 0;
    collect z = {0};
    CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, on_token, &z, &finish), MLXCEL_OK);
    CHECK(z.n == 0 && finish == MLXCEL_FINISH_LENGTH);
    go.max_tokens = 2;
    CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, NULL, NULL, NULL), MLXCEL_OK);
    CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, 0, &go, NULL, NULL, NULL), MLXCEL_EINVAL);
    int32_t many[64] = {0};
    CHECK_STATUS(mlxcel_generate(c, many, 64, &go, NULL, NULL, NULL), MLXCEL_ERANGE);
    int32_t bad = mlxcel_model_n_vocab(m);
    CHECK_STATUS(mlxcel_generate(c, &bad, 1, &go, NULL, NULL, NULL), MLXCEL_ERANGE);
    go.max_tokens = -2;
    CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, NULL, NULL, NULL), MLXCEL_EINVAL);
    go.max_tokens = 2;
    go.size = 3;
    CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, NULL, NULL, NULL), MLXCEL_EINVAL);
    /* an older caller's struct (only size and max_tokens): the rest defaults */
    go.size = offsetof(mlxcel_generate_options, stop);
    go.n_stop = 5;   /* past the caller's size: never read */
    collect o = {0};
    CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, on_token, &o, &finish), MLXCEL_OK);
    CHECK(o.n == 2 && !memcmp(o.ids, r->greedy, 2 * sizeof *o.ids));
    mlxcel_context_free(c);
}

/* ---- sampling ------------------------------------------------------------------ */

static void test_sampling(mlxcel_model *m, const ref_greedy *r)
{
    const int V = mlxcel_model_n_vocab(m);
    mlxcel_context *c = NULL;
    CHECK_STATUS(mlxcel_context_new(m, 0, &c), MLXCEL_OK);
    CHECK(mlxcel_context_n_ctx(c) == mlxcel_model_n_ctx(m));
    mlxcel_sampling s;
    mlxcel_sampling_init(&s);
    CHECK(s.size == sizeof s && fabsf(s.temperature - 0.8f) < 1e-6f && s.top_k == 40 &&
          fabsf(s.top_p - 0.95f) < 1e-6f && s.repeat_penalty == 1.0f);
    s.temperature = 1.5f;
    s.top_k = 0;
    s.top_p = 1;
    s.min_p = 0;
    s.seed = 42;
    CHECK_STATUS(mlxcel_context_set_sampling(c, &s), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_prefill(c, r->prompt_ids, r->n_prompt), MLXCEL_OK);
    float *before = malloc(sizeof(float) * (size_t)V);
    memcpy(before, mlxcel_context_logits(c), sizeof(float) * (size_t)V);
    int32_t a[16], b[16];
    for (int i = 0; i < 16; i++)
        CHECK_STATUS(mlxcel_context_sample(c, &a[i]), MLXCEL_OK);
    CHECK(same_logits(before, mlxcel_context_logits(c), V));   /* sampling leaves them */
    /* the same seed: the same draws */
    CHECK_STATUS(mlxcel_context_set_sampling(c, &s), MLXCEL_OK);
    for (int i = 0; i < 16; i++)
        CHECK_STATUS(mlxcel_context_sample(c, &b[i]), MLXCEL_OK);
    CHECK(!memcmp(a, b, sizeof a));
    int distinct = 0;
    for (int i = 1; i < 16; i++)
        distinct += a[i] != a[0];
    CHECKF(distinct > 0, "16 draws at temperature 1.5 were all %d", (int)a[0]);
    s.repeat_penalty = 0;
    CHECK_STATUS(mlxcel_context_set_sampling(c, &s), MLXCEL_EINVAL);
    CHECK_MSG("repeat_penalty");
    s.repeat_penalty = 1;
    s.size = sizeof s + 4;
    CHECK_STATUS(mlxcel_context_set_sampling(c, &s), MLXCEL_EUNSUPPORTED);
    CHECK_STATUS(mlxcel_context_set_sampling(c, NULL), MLXCEL_OK);   /* the defaults */
    free(before);
    mlxcel_context_free(c);
}

/* ---- two threads, one model ------------------------------------------------------ */

typedef struct worker {
    mlxcel_model *m;
    const ref_greedy *r;
    collect k;
    int rc;
} worker;

static void *generate_in_thread(void *arg)
{
    worker *w = arg;
    mlxcel_context *c = NULL;
    w->rc = mlxcel_context_new(w->m, 64, &c);
    mlxcel_sampling s;
    mlxcel_sampling_init(&s);
    s.temperature = 0;
    mlxcel_generate_options go;
    mlxcel_generate_options_init(&go);
    go.max_tokens = (int)w->r->n_greedy;
    if (!w->rc)
        w->rc = mlxcel_context_set_sampling(c, &s);
    if (!w->rc)
        w->rc = mlxcel_generate(c, w->r->prompt_ids, w->r->n_prompt, &go, on_token, &w->k, NULL);
    mlxcel_context_free(c);
    return NULL;
}

static void test_threads(mlxcel_model *m, const ref_greedy *r)
{
    worker w[2];
    memset(w, 0, sizeof w);
    w[0].m = w[1].m = m;
    w[0].r = w[1].r = r;
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&t[i], NULL, generate_in_thread, &w[i]) == 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        CHECKF(w[i].rc == 0 && w[i].k.n == (int)r->n_greedy &&
                   !memcmp(w[i].k.ids, r->greedy, r->n_greedy * sizeof(int32_t)),
               "thread %d: rc %d, %d ids, not PyTorch's greedy ids", i, w[i].rc, w[i].k.n);
    }
}

/* ---- a checkpoint without tokenizer.json --------------------------------------- */

static int saw_text;
static int on_token_text(void *user, int32_t id, const char *text, size_t len)
{
    saw_text |= text != NULL || len != 0;
    return on_token(user, id, text, len);
}

/* kjv-moe's weights and config without its tokenizer: ids in, ids out. */
static void test_no_tokenizer(const char *kjv, const ref_greedy *r)
{
    char tmp[] = "/tmp/mlxcel_api_XXXXXX", from[1200], to[1200];
    if (!mkdtemp(tmp)) {
        CHECKF(0, "mkdtemp failed");
        return;
    }
    static const char *const files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(from, sizeof from, "%s/%s", kjv, files[i]);
        snprintf(to, sizeof to, "%s/%s", tmp, files[i]);
        CHECK(symlink(from, to) == 0);
    }
    mlxcel_model *m = NULL;
    CHECK_STATUS(mlxcel_model_load(tmp, NULL, &m), MLXCEL_OK);
    if (m) {
        int32_t *ids = NULL;
        size_t n = 0;
        char *text = NULL;
        CHECK(mlxcel_model_has_tokenizer(m) == 0);
        CHECK_STATUS(mlxcel_tokenize(m, "a", 1, 1, &ids, &n), MLXCEL_EUNSUPPORTED);
        CHECK_MSG("tokenizer.json");
        CHECK_STATUS(mlxcel_detokenize(m, r->greedy, 1, 0, &text, NULL), MLXCEL_EUNSUPPORTED);
        CHECK_STATUS(mlxcel_chat_render(m, "[]", NULL, NULL, 1, &text), MLXCEL_EUNSUPPORTED);
        CHECK(mlxcel_token_id(m, "a") == -1);
        mlxcel_context *c = NULL;
        CHECK_STATUS(mlxcel_context_new(m, 64, &c), MLXCEL_OK);
        if (c) {
            set_greedy(c);
            mlxcel_generate_options go;
            mlxcel_generate_options_init(&go);
            go.max_tokens = (int)r->n_greedy;
            collect k = {0};
            saw_text = 0;
            CHECK_STATUS(mlxcel_generate(c, r->prompt_ids, r->n_prompt, &go, on_token_text, &k, NULL),
                         MLXCEL_OK);
            CHECK(k.n == (int)r->n_greedy && !memcmp(k.ids, r->greedy, r->n_greedy * sizeof *k.ids));
            CHECK(saw_text == 0);   /* no tokenizer: no text */
        }
        mlxcel_context_free(c);
    }
    mlxcel_model_free(m);
    for (int i = 0; i < 3; i++) {
        snprintf(to, sizeof to, "%s/%s", tmp, files[i]);
        unlink(to);
    }
    rmdir(tmp);
}

/* ---- a chat checkpoint (fixtures) ------------------------------------------------- */

static void test_chat_fixture(const char *fixtures)
{
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/qwen2_moe_tiny_chat", fixtures);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    mx_st_set *ref = NULL;
    mx_err e = {0};
    CHECK_OK(mx_st_open_file(path, &ref, &e), &e);
    if (!ref)
        return;
    const mx_tensor *tp = mx_st_find(ref, "prompt_ids"), *tg = mx_st_find(ref, "greedy_ids");
    mlxcel_model *m = NULL;
    CHECK_STATUS(mlxcel_model_load(dir, NULL, &m), MLXCEL_OK);
    if (!m || !tp || !tg) {
        mx_st_close(ref);
        mlxcel_model_free(m);
        return;
    }
    /* special tokens: config.json's eos 151645 and bos 151643; the template's
     * eos_token "<|im_end|>" is 151645 (tokenizer.json's added tokens) */
    CHECK(mlxcel_model_bos(m) == 151643 && mlxcel_model_n_eos(m) == 1 && mlxcel_model_eos(m, 0) == 151645);
    CHECK(mlxcel_token_id(m, "<|im_start|>") == 151644 && mlxcel_token_id(m, "<|im_end|>") == 151645);
    /* its template adds the default system message when there is none */
    static const char msgs[] = "[{\"role\": \"user\", \"content\": \"What is a mixture of experts?\"}]";
    static const char want[] = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                               "<|im_start|>user\nWhat is a mixture of experts?<|im_end|>\n"
                               "<|im_start|>assistant\n";
    char *text = NULL;
    CHECK_STATUS(mlxcel_chat_render(m, msgs, NULL, NULL, 1, &text), MLXCEL_OK);
    CHECKF(text && !strcmp(text, want), "rendered: %s", text ? text : "(null)");
    int32_t *ids = NULL;
    size_t n = 0;
    if (text)
        CHECK_STATUS(mlxcel_tokenize(m, text, strlen(text), 1, &ids, &n), MLXCEL_OK);
    CHECK(ids && n == (size_t)mx_tensor_numel(tp) && !memcmp(ids, tp->data, n * sizeof *ids));
    mlxcel_context *c = NULL;
    CHECK_STATUS(mlxcel_context_new(m, 0, &c), MLXCEL_OK);
    if (c && ids) {
        set_greedy(c);
        mlxcel_generate_options go;
        mlxcel_generate_options_init(&go);
        go.max_tokens = (int)mx_tensor_numel(tg);
        collect k = {0};
        CHECK_STATUS(mlxcel_generate(c, ids, n, &go, on_token, &k, NULL), MLXCEL_OK);
        CHECKF(k.n == go.max_tokens && !memcmp(k.ids, tg->data, (size_t)k.n * sizeof *k.ids),
               "qwen2_moe_tiny_chat: %d ids, not the reference greedy ids", k.n);
    }
    mlxcel_free(text);
    mlxcel_free(ids);
    mlxcel_context_free(c);
    mlxcel_model_free(m);
    mx_st_close(ref);
}

/* A model with recurrent layers: keep and set_tokens must start its state
 * over and run the kept tokens again; the result equals a fresh context fed
 * the same way, and greedy generation gives the reference ids. */
static void test_recurrent_fixture(const char *fixtures, const char *name)
{
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/%s", fixtures, name);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    mx_st_set *ref = NULL;
    mx_err e = {0};
    CHECK_OK(mx_st_open_file(path, &ref, &e), &e);
    const mx_tensor *tp = ref ? mx_st_find(ref, "prompt_ids") : NULL;
    const mx_tensor *tg = ref ? mx_st_find(ref, "greedy_ids") : NULL;
    mlxcel_model *m = NULL;
    mlxcel_context *a = NULL, *b = NULL;
    CHECK_STATUS(mlxcel_model_load(dir, NULL, &m), MLXCEL_OK);
    if (m)
        CHECK_STATUS(mlxcel_context_new(m, 64, &a), MLXCEL_OK);
    if (m)
        CHECK_STATUS(mlxcel_context_new(m, 64, &b), MLXCEL_OK);
    if (!tp || !tg || !a || !b || mx_tensor_numel(tg) < 8) {
        CHECKF(0, "%s: cannot run the recurrent checks", name);
        goto done;
    }
    const int V = mlxcel_model_n_vocab(m);
    const int32_t *prompt = tp->data, *greedy = tg->data;
    const size_t P = (size_t)mx_tensor_numel(tp);
    int32_t seq[MAX_IDS * 2];
    memcpy(seq, prompt, P * sizeof *seq);
    memcpy(seq + P, greedy, 8 * sizeof *seq);
    CHECK_STATUS(mlxcel_context_prefill(a, prompt, P), MLXCEL_OK);
    for (size_t i = 0; i < 4; i++)
        CHECK_STATUS(mlxcel_context_decode(a, greedy[i]), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_keep(a, (int)P), MLXCEL_OK);
    CHECK(mlxcel_context_n_tokens(a) == (int)P && mlxcel_context_logits(a) == NULL);
    CHECK_STATUS(mlxcel_context_prefill(a, greedy + 4, 4), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_prefill(b, prompt, P), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_prefill(b, greedy + 4, 4), MLXCEL_OK);
    CHECKF(same_logits(mlxcel_context_logits(a), mlxcel_context_logits(b), V),
           "%s: keep + prefill differs from a fresh context fed the same way", name);
    /* set_tokens: a cache that is all prefix is kept; any other rewind
     * starts over (nothing reused) */
    int32_t more[MAX_IDS * 2];
    memcpy(more, prompt, P * sizeof *more);
    memcpy(more + P, greedy + 4, 4 * sizeof *more);
    more[P + 4] = greedy[0];
    size_t reused = 99;
    CHECK_STATUS(mlxcel_context_set_tokens(a, more, P + 5, &reused), MLXCEL_OK);
    CHECK(reused == P + 4);
    more[1] = (more[1] + 1) % V;
    CHECK_STATUS(mlxcel_context_set_tokens(a, more, P + 5, &reused), MLXCEL_OK);
    CHECK(reused == 0 && mlxcel_context_n_tokens(a) == (int)P + 5);
    CHECK_STATUS(mlxcel_context_reset(b), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_prefill(b, more, P + 5), MLXCEL_OK);
    CHECKF(same_logits(mlxcel_context_logits(a), mlxcel_context_logits(b), V),
           "%s: set_tokens after a change differs from a fresh prefill", name);
    /* generation reuses nothing it cannot, and gives the reference ids */
    set_greedy(a);
    mlxcel_generate_options go;
    mlxcel_generate_options_init(&go);
    go.max_tokens = (int)mx_tensor_numel(tg);
    go.ignore_eos = 1;
    collect k = {0};
    CHECK_STATUS(mlxcel_generate(a, prompt, P, &go, on_token, &k, NULL), MLXCEL_OK);
    CHECKF(k.n == go.max_tokens && !memcmp(k.ids, greedy, (size_t)k.n * sizeof *k.ids),
           "%s: %d ids, not the reference greedy ids", name, k.n);
done:
    mlxcel_context_free(a);
    mlxcel_context_free(b);
    mlxcel_model_free(m);
    mx_st_close(ref);
}

int main(void)
{
    const char *src = getenv("MLXCEL_SRC");
    char kjv[1024];
    snprintf(kjv, sizeof kjv, "%s/models/kjv-moe", src && *src ? src : ".");
    static ref_greedy r;
    if (read_kjv_reference(kjv, &r) || !r.n_prompt || !r.n_greedy) {
        fprintf(stderr, "SKIP: %s/eval/reference_greedy.json is not there (set MLXCEL_SRC to the "
                        "source tree)\n", kjv);
        return TEST_SKIP;
    }
    test_version_and_errors(kjv);
    mlxcel_model *m = NULL;
    mlxcel_context *c = NULL;
    CHECK_STATUS(mlxcel_model_load(kjv, NULL, &m), MLXCEL_OK);
    CHECK_STATUS(mlxcel_context_new(m, 64, &c), MLXCEL_OK);
    if (!m || !c)
        return test_summary();
    test_bad_handles(m, c);
    test_model_facts(m, kjv, &r);
    test_kv_reuse(m, &r);
    test_generate(m, &r);
    test_sampling(m, &r);
    test_threads(m, &r);
    mlxcel_context_free(c);
    mlxcel_model_free(m);
    test_greedy(kjv, &r, 0, -1);
    test_greedy(kjv, &r, 0, 0);
    test_greedy(kjv, &r, 1, 1);
    test_no_tokenizer(kjv, &r);
    test_precision(kjv, &r);
    const char *fx = test_fixtures();
    if (fx) {
        test_chat_fixture(fx);
        test_recurrent_fixture(fx, "qwen3_next_tiny");
        test_recurrent_fixture(fx, "lfm2_moe_tiny");
    }
    else
        fprintf(stderr, "(the qwen2_moe_tiny_chat part needs MLXCEL_FIXTURES)\n");
    return test_summary();
}
