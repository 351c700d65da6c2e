/* cmd_perplexity.c - `mlxcel perplexity`: the perplexity of a model on a
 * text, and the KL divergence of a run against a saved base run (the
 * definitions are in docs/quality.md).  Progress goes to stderr, the result
 * to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/common.h"
#include "cli/commands.h"
#include "cuda/cuda.h"
#include "eval/eval.h"
#include "moe/moe.h"
#include "tokenizer/tokenizer.h"
#include "util/parallel.h"
#include "util/clock.h"
#include "util/file.h"

static void help(FILE *f)
{
    fprintf(f, "usage: mlxcel perplexity -m DIR -f FILE [--ctx N] [--chunks N] [--json]\n"
               "                         [--kl-divergence-base OUT [--top-k K] | --kl-divergence-base BASE --kl-divergence]\n\n"
               "Perplexity of the model on the text of FILE, as llama.cpp's llama-perplexity measures it:\n"
               "the whole file, exactly as it is, is tokenized (no BOS or other token added), cut into\n"
               "chunks of N tokens, each chunk runs from an empty cache, and the second half of every\n"
               "chunk is scored.\n"
               "Prints PPL = exp(mean NLL) +- its uncertainty; a progress line per chunk goes to stderr.\n\n"
               "  -m, --model DIR             MLX checkpoint folder with tokenizer.json\n"
               "  -f, --file FILE             UTF-8 text to score\n"
               "  -c, --ctx N                 tokens per chunk (default 512)\n"
               "      --chunks N              score at most the first N chunks\n"
               "      --batch N               tokens per forward call (default: the whole chunk); 1 runs every\n"
               "                              token through the single-token decode path (fused MoE kernel)\n"
               "  -t, --threads N             worker threads\n"
               "      --precision P           exact (default) or fast (docs/quality.md)\n"
               "      --repack MODE           off (default), auto, rebuild or mem (docs/cache.md)\n"
               "      --device NAME           cpu (default) or cuda: run the model on GPU 0 (MLXCEL_DEVICE)\n"
               "      --json                  print the result as one JSON object on stdout\n"
               "      --kl-divergence-base F  without --kl-divergence: save this run's distributions to F\n"
               "      --top-k K               with a base file to write: store each position's K most likely\n"
               "                              tokens and the rest's mass (default 0 = the full distribution)\n"
               "      --kl-divergence         compare this run with base file F: KL divergence, same top\n"
               "                              token, PPL of both, RMS of the change in the correct token's\n"
               "                              probability.  --ctx and --chunks default to the base file's\n\n"
               "See docs/quality.md for the definitions, the base file's format and how to compare builds.\n");
}

typedef struct ppl_args {
    const char *model, *file, *kl_base;
    int ctx, chunks, batch, top_k, json, kl;
    int ctx_set, chunks_set, top_k_set;
} ppl_args;

static int parse(int argc, char **argv, ppl_args *a)
{
    memset(a, 0, sizeof *a);
    a->ctx = 512;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
        long n;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            help(stdout);
            return 1;
        } else if (!strcmp(o, "-m") || !strcmp(o, "--model")) {
            if (!(a->model = arg_value(argc, argv, &i)))
                return -1;
        } else if (!strcmp(o, "-f") || !strcmp(o, "--file")) {
            if (!(a->file = arg_value(argc, argv, &i)))
                return -1;
        } else if (!strcmp(o, "-c") || !strcmp(o, "--ctx") || !strcmp(o, "--ctx-size")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_long(o, v, 4, 1 << 20, &n))
                return -1;
            a->ctx = (int)n, a->ctx_set = 1;
        } else if (!strcmp(o, "--chunks")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_long(o, v, 1, 1 << 30, &n))
                return -1;
            a->chunks = (int)n, a->chunks_set = 1;
        } else if (!strcmp(o, "--batch")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_long(o, v, 1, 1 << 20, &n))
                return -1;
            a->batch = (int)n;
        } else if (!strcmp(o, "--precision")) {
            if (!(v = arg_value(argc, argv, &i)) || cli_precision(o, v))
                return -1;
        } else if (!strcmp(o, "--repack")) {
            if (!(v = arg_value(argc, argv, &i)) || cli_repack(o, v))
                return -1;
        } else if (!strcmp(o, "-t") || !strcmp(o, "--threads")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_long(o, v, 1, 256, &n))
                return -1;
            mx_set_threads((int)n);
        } else if (!strcmp(o, "--device")) {
            if (!(v = arg_value(argc, argv, &i)))
                return -1;
            setenv("MLXCEL_DEVICE", v, 1);
        } else if (!strcmp(o, "--top-k")) {
            if (!(v = arg_value(argc, argv, &i)) || arg_long(o, v, 0, MX_KLBASE_MAX_TOPK, &n))
                return -1;
            a->top_k = (int)n, a->top_k_set = 1;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (!strcmp(o, "--kl-divergence-base")) {
            if (!(a->kl_base = arg_value(argc, argv, &i)))
                return -1;
        } else if (!strcmp(o, "--kl-divergence")) {
            a->kl = 1;
        } else {
            arg_unknown("perplexity", o, help);
            return -1;
        }
    }
    if (!a->model || !a->file) {
        fprintf(stderr, "mlxcel perplexity: -m DIR and -f FILE are required (see --help)\n");
        return -1;
    }
    if (a->kl && !a->kl_base) {
        fprintf(stderr, "mlxcel perplexity: --kl-divergence needs --kl-divergence-base FILE (the base run)\n");
        return -1;
    }
    if (a->top_k_set && (!a->kl_base || a->kl)) {
        fprintf(stderr, "mlxcel perplexity: --top-k applies only when writing a base file "
                        "(--kl-divergence-base OUT without --kl-divergence)\n");
        return -1;
    }
    return 0;
}

/* True when DIR/tokenizer_config.json asks for a BOS token in front of every
 * text; perplexity adds none (see docs/quality.md), so it says so. */
static int wants_bos(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *s = NULL;
    size_t len = 0;
    if (mx_read_file(path, &s, &len, NULL))
        return 0;
    cJSON *j = cJSON_ParseWithLength(s, len);
    free(s);
    int yes = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "add_bos_token"));
    cJSON_Delete(j);
    return yes;
}

/* The whole file as token ids. */
static int tokenize_file(const char *dir, const char *file, int32_t **ids, long *n, mx_err *e)
{
    char *text = NULL;
    size_t len = 0;
    int rc = mx_read_file(file, &text, &len, e);
    if (rc)
        return rc;
    if (len == 0) {
        free(text);
        return mx_fail(e, MX_EINVAL, "%s: the file is empty", file);
    }
    mx_tokenizer *t = NULL;
    rc = mx_tok_load_dir(dir, &t, e);
    size_t cnt = 0;
    if (!rc) {
        /* special tokens written in the text are matched, as HF tokenizers do */
        rc = mx_tok_encode(t, text, len, 1, ids, &cnt, e);
        if (rc)
            mx_err_prefix(e, "%s", file);
    }
    *n = (long)cnt;
    mx_tok_free(t);
    free(text);
    return rc;
}

static void fmt_eta(double s, char *buf, size_t cap)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%lds", t);
}

static void print_text(const ppl_args *a, const mx_ppl_run *r, const mx_kl_summary *k,
                       const mx_klbase_info *bi)
{
    printf("PPL = %.6f ± %.6f\n", mx_ppl(&r->nll), mx_ppl_err(&r->nll));
    if (!k)
        return;
    printf("PPL(base)      = %.6f ± %.6f\n", k->ppl_base, k->ppl_base_err);
    printf("ΔPPL           = %.6g ± %.3g (%+.4g ± %.3g %%)\n", k->dppl, k->dppl_err, 100 * k->dppl_rel,
           100 * k->dppl_rel_err);
    if (bi->form == MX_KLBASE_TOPK)
        printf("KL divergence from the base's top %d (a lower bound, see docs/quality.md):\n", bi->top_k);
    printf("mean KLD       = %.6g ± %.3g\n", k->kl_mean, k->kl_mean_err);
    printf("median KLD     = %.6g\n", k->kl_median);
    printf("99%% KLD        = %.6g\n", k->kl_p99);
    printf("max KLD        = %.6g\n", k->kl_max);
    printf("same top token = %.3f ± %.3f %%\n", 100 * k->same_top, 100 * k->same_top_err);
    printf("mean Δp        = %.4g ± %.3g %%\n", 100 * k->dp_mean, 100 * k->dp_mean_err);
    printf("RMS Δp         = %.4g ± %.3g %%\n", 100 * k->dp_rms, 100 * k->dp_rms_err);
    (void)a;
}

static void print_json(const ppl_args *a, const mx_ppl_run *r, long n_tokens, const mx_kl_summary *k,
                       const mx_klbase_info *bi)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", a->model);
    cJSON_AddStringToObject(o, "file", a->file);
    cJSON_AddNumberToObject(o, "n_tokens", (double)n_tokens);
    cJSON_AddNumberToObject(o, "ctx", r->ctx);
    cJSON_AddNumberToObject(o, "chunks", r->n_chunks);
    cJSON_AddNumberToObject(o, "first", r->first);
    cJSON_AddNumberToObject(o, "scored", (double)r->nll.n);
    cJSON_AddNumberToObject(o, "mean_nll", r->nll.mean);
    cJSON_AddNumberToObject(o, "ppl", mx_ppl(&r->nll));
    cJSON_AddNumberToObject(o, "ppl_err", mx_ppl_err(&r->nll));
    if (a->kl_base && !a->kl)
        cJSON_AddStringToObject(o, "kl_divergence_base_written", a->kl_base);
    if (k) {
        cJSON *x = cJSON_AddObjectToObject(o, "kl_divergence");
        cJSON_AddStringToObject(x, "base", a->kl_base);
        cJSON_AddStringToObject(x, "form", bi->form == MX_KLBASE_FULL ? "full" : "top-k");
        cJSON_AddNumberToObject(x, "top_k", bi->top_k);
        cJSON_AddNumberToObject(x, "positions", (double)k->n);
        cJSON_AddNumberToObject(x, "ppl_base", k->ppl_base);
        cJSON_AddNumberToObject(x, "ppl_base_err", k->ppl_base_err);
        cJSON_AddNumberToObject(x, "ppl", k->ppl_new);
        cJSON_AddNumberToObject(x, "ppl_err", k->ppl_new_err);
        cJSON_AddNumberToObject(x, "delta_ppl", k->dppl);
        cJSON_AddNumberToObject(x, "delta_ppl_err", k->dppl_err);
        cJSON_AddNumberToObject(x, "delta_ppl_percent", 100 * k->dppl_rel);
        cJSON_AddNumberToObject(x, "delta_ppl_percent_err", 100 * k->dppl_rel_err);
        cJSON_AddNumberToObject(x, "kl_mean", k->kl_mean);
        cJSON_AddNumberToObject(x, "kl_mean_err", k->kl_mean_err);
        cJSON_AddNumberToObject(x, "kl_median", k->kl_median);
        cJSON_AddNumberToObject(x, "kl_p99", k->kl_p99);
        cJSON_AddNumberToObject(x, "kl_max", k->kl_max);
        cJSON_AddNumberToObject(x, "kl_min", k->kl_min);
        cJSON_AddNumberToObject(x, "same_top_percent", 100 * k->same_top);
        cJSON_AddNumberToObject(x, "same_top_percent_err", 100 * k->same_top_err);
        cJSON_AddNumberToObject(x, "dp_mean_percent", 100 * k->dp_mean);
        cJSON_AddNumberToObject(x, "dp_mean_percent_err", 100 * k->dp_mean_err);
        cJSON_AddNumberToObject(x, "dp_rms_percent", 100 * k->dp_rms);
        cJSON_AddNumberToObject(x, "dp_rms_percent_err", 100 * k->dp_rms_err);
    }
    char *s = cJSON_Print(o);
    if (s)
        printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
}

/* Runs every chunk with a progress line on stderr. */
static int run_chunks(mx_ppl_run *r, mx_err *e)
{
    double t0 = mx_now();
    for (int i = 0; i < r->n_chunks; i++) {
        int rc = mx_ppl_chunk(r, i, e);
        if (rc)
            return rc;
        double dt = mx_now() - t0, tps = (double)(i + 1) * r->ctx / (dt > 0 ? dt : 1e-9);
        char eta[32];
        fmt_eta(dt / (i + 1) * (r->n_chunks - i - 1), eta, sizeof eta);
        fprintf(stderr, "[%d/%d] PPL = %.4f ± %.4f, %.1f tok/s, ETA %s\n", i + 1, r->n_chunks, mx_ppl(&r->nll),
                mx_ppl_err(&r->nll), tps, eta);
    }
    return MX_OK;
}

int cmd_perplexity(int argc, char **argv)
{
    ppl_args a;
    int prc = parse(argc, argv, &a);
    if (prc)
        return prc > 0 ? 0 : 2;

    mx_err e = {0};
    mx_model *m = NULL;
    mx_klbase *base = NULL, *save = NULL;
    int32_t *ids = NULL;
    long n_ids = 0;
    mx_ppl_run r = {0};
    mx_kl_summary ks;
    int have_ks = 0, begun = 0;

    int rc = 0;
    if (a.kl) {
        /* the base file decides ctx and chunks unless they are given */
        rc = mx_klbase_open(a.kl_base, &base, &e);
        if (!rc) {
            const mx_klbase_info *bi = mx_klbase_get_info(base);
            a.ctx = a.ctx_set ? a.ctx : bi->ctx;
            a.chunks = a.chunks_set ? a.chunks : bi->n_chunks;
        }
    }
    if (!rc)
        rc = tokenize_file(a.model, a.file, &ids, &n_ids, &e);
    if (!rc && wants_bos(a.model))
        fprintf(stderr, "mlxcel perplexity: note: tokenizer_config.json sets add_bos_token; "
                        "perplexity adds no BOS (docs/quality.md)\n");
    if (!rc) {
        rc = mx_ppl_plan(n_ids, a.ctx, a.chunks, &r.n_chunks, &e);
        if (rc)
            mx_err_prefix(&e, "%s", a.file);
    }
    if (!rc)
        rc = mx_model_load(a.model, &m, &e);
    if (!rc)
        rc = mx_device_select(m, NULL, &e);
    if (!rc && base)
        rc = mx_klbase_check(base, m->vocab, a.ctx, r.n_chunks, ids, &e);
    if (!rc && a.kl_base && !a.kl) {
        mx_klbase_info bi = {.form = a.top_k ? MX_KLBASE_TOPK : MX_KLBASE_FULL,
                             .top_k = a.top_k, .vocab = m->vocab, .ctx = a.ctx,
                             .n_chunks = r.n_chunks, .first = a.ctx / 2,
                             .params = mx_model_param_count(m)};
        snprintf(bi.model_type, sizeof bi.model_type, "%s", m->cfg.model_type);
        if (bi.top_k > bi.vocab)
            rc = mx_fail(&e, MX_EINVAL, "--top-k %d is larger than the vocabulary (%d)", bi.top_k, bi.vocab);
        if (!rc)
            rc = mx_klbase_create(a.kl_base, &bi, ids, &save, &e);
    }
    if (!rc) {
        r.m = m, r.tokens = ids, r.ctx = a.ctx, r.batch = a.batch;
        r.save = save, r.base = base;
        rc = mx_ppl_begin(&r, &e);
        begun = !rc;
    }
    if (!rc) {
        fprintf(stderr, "perplexity: %ld tokens, %d chunks of %d, scoring positions %d..%d of each "
                        "(%ld in all); kernel %s, %d threads\n",
                n_ids, r.n_chunks, r.ctx, r.first, r.ctx - 2, (long)r.n_chunks * (r.ctx - 1 - r.first),
                mx_qkernels_active()->name, mx_threads());
        mx_moe_stats_reset();
        rc = run_chunks(&r, &e);
    }
    if (!rc && mx_env_flag("MLXCEL_TRACE_MOE", 0)) {
        mx_moe_stats ms;
        mx_moe_stats_get(&ms);
        fprintf(stderr, "moe-dispatch fused=%ld gather=%ld\n", ms.fused, ms.gather);
    }
    if (!rc && save) {
        rc = mx_klbase_close(save, &e);
        save = NULL;
    }
    if (!rc && base) {
        rc = mx_kl_summarize(r.cmp, r.n_cmp, &ks, &e);
        have_ks = !rc;
    }
    if (!rc) {
        const mx_klbase_info *bi = base ? mx_klbase_get_info(base) : NULL;
        if (a.json)
            print_json(&a, &r, n_ids, have_ks ? &ks : NULL, bi);
        else
            print_text(&a, &r, have_ks ? &ks : NULL, bi);
        if (save || (a.kl_base && !a.kl))
            fprintf(stderr, "perplexity: distributions written to %s\n", a.kl_base);
    } else {
        fprintf(stderr, "mlxcel perplexity: %s\n", e.msg);
    }
    mx_klbase_close(save, NULL);   /* only after an error: removes the partial file */
    mx_klbase_close(base, NULL);
    if (begun)
        mx_ppl_end(&r);
    mx_model_free(m);
    free(ids);
    return rc ? 1 : 0;
}
