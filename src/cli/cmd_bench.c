/* cmd_bench.c - `mlxcel bench`: prefill and decode speed, fused vs gather,
 * and how close decode comes to the memory-bandwidth roofline.
 *
 * Decode of one token must read every active weight byte once, so
 * tok/s <= bandwidth / active bytes per token.  The bandwidth is probed in
 * the same process, beside the measurement, because it varies from run to
 * run on shared machines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/common.h"
#include "wcache/wcache.h"
#include "cli/commands.h"
#include "cuda/cuda.h"
#include "dist/dist.h"
#include "gen/gen.h"
#include "model/model.h"
#include "moe/moe.h"
#include "sample/sample.h"
#include "util/membw.h"
#include "util/parallel.h"
#include "util/sysinfo.h"
#include "util/clock.h"

static void help(FILE *f)
{
    fprintf(f, "usage: mlxcel bench -m DIR [-p N] [-n N] [-r N] [-c N] [--batch N] [--compare-fused] [--json] [-t N]\n\n"
               "Measures prefill of an N-token prompt and decode of N tokens (greedy, random prompt ids),\n"
               "after a warm-up that is not counted; reports min/median/max over the repeats.  Decode\n"
               "takes the argmax on the GPU with --device cuda (the steps back to back, as llama-bench's\n"
               "tg does not sample at all; MLXCEL_CUDA_GREEDY=0: on the host, as generate samples).\n\n"
               "  -p, --prompt N      prompt tokens (default 128)\n"
               "  -n, --gen N         decoded tokens per repeat (default 64)\n"
               "  -r, --repeats N     repeats (default 3)\n"
               "  -c, --ctx-size N    context each sequence is made for (default: the prompt + the\n"
               "                      decode + 2; generate and chat make min(model max, 4096)), so\n"
               "                      that what a large context costs a decode step shows\n"
               "  -t, --threads N     worker threads (default: MLXCEL_THREADS or all CPUs)\n"
           "      --precision P   exact (default) or fast (one int8 level of x per group)\n"
           "      --repack MODE   off (default), auto, rebuild or mem: repacked weights (docs/cache.md)\n"
           "      --device NAME   cpu (default) or cuda: run the model on GPU 0 (MLXCEL_DEVICE);\n"
           "                      the bandwidth probe then measures the GPU's copy bandwidth\n"
               "      --compare-fused decode each repeat with the fused MoE kernel and with the gather\n"
               "                      path (order F G G F) and report both and their ratio\n"
               "      --batch N       then N sequences, each with its own random prompt of -p tokens,\n"
               "                      decode -n tokens together (one mx_forward_batch a step, as the\n"
               "                      server does): aggregate tok/s (N x steps / time) and per sequence\n"
               "                      (default 1: no batched run)\n"
               "      --bw-mb N       size of the bandwidth probe buffer, probed before and after the\n"
               "                      decode of every repeat (default 1024 MiB; 0 = skip)\n"
               "      --json          one JSON object on stdout\n");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct series {
    double v[64];
    int n;
} series;

static void push(series *s, double x) { if (s->n < 64) s->v[s->n++] = x; }
static double med(const series *s)
{
    if (!s->n)
        return 0;
    double t[64];
    memcpy(t, s->v, sizeof(double) * (size_t)s->n);
    qsort(t, (size_t)s->n, sizeof *t, cmp_double);
    /* an even count (two fused runs per repeat) takes the middle pair's mean,
     * the way each repeat's roofline averages its runs */
    return s->n % 2 ? t[s->n / 2] : (t[s->n / 2 - 1] + t[s->n / 2]) / 2;
}
static double mn(const series *s) { double m = s->n ? s->v[0] : 0; for (int i = 1; i < s->n; i++) if (s->v[i] < m) m = s->v[i]; return m; }
static double mxv(const series *s) { double m = s->n ? s->v[0] : 0; for (int i = 1; i < s->n; i++) if (s->v[i] > m) m = s->v[i]; return m; }


/* Expert parallelism (mpirun -np N, docs/distributed.md): each rank's
 * statistics summed over the timed decode runs. */
#define MAX_RANKS 256
typedef struct rank_sums {
    mx_dist_stats st[MAX_RANKS];
    long tokens;
} rank_sums;

static void ranks_add(rank_sums *rs, long tokens)
{
    mx_dist_stats now[MAX_RANKS];
    mx_err e = {0};
    if (mx_dist_size() > MAX_RANKS || mx_dist_stats_get(now, &e))
        return;
    for (int r = 0; r < mx_dist_size(); r++) {
        mx_dist_stats *a = &rs->st[r];
        a->t_compute += now[r].t_compute, a->t_comm += now[r].t_comm, a->t_idle += now[r].t_idle;
        a->expert_bytes += now[r].expert_bytes, a->jobs += now[r].jobs;
        a->sent += now[r].sent, a->received += now[r].received;
        a->peak_rss = now[r].peak_rss;
    }
    rs->tokens += tokens;
}

/* Weights one decode step reads besides the routed experts (on rank 0). */
static uint64_t base_bytes_per_token(const mx_model *m)
{
    uint64_t ex = 0;
    for (int l = 0; l < m->n_layers; l++)
        if (m->layers[l].is_moe)
            ex += (uint64_t)m->top_k * m->layers[l].moe.expert_bytes;
    const uint64_t all = mx_model_active_bytes(m);
    return all > ex ? all - ex : 0;
}

static void ranks_print(const rank_sums *rs, const mx_model *m)
{
    const double n = rs->tokens > 0 ? (double)rs->tokens : 1, mib = 1048576.0;
    printf("ranks            %d (expert parallelism over MPI; per decoded token)\n", mx_dist_size());
    for (int r = 0; r < mx_dist_size(); r++) {
        const mx_dist_stats *a = &rs->st[r];
        printf("  rank %-3d       experts %6.2f MiB", r, (double)a->expert_bytes / n / mib);
        if (r == 0)
            printf(" + %.2f MiB besides", (double)base_bytes_per_token(m) / mib);
        printf(", compute %.3f ms, ", 1e3 * a->t_compute / n);
        const double rss = (double)a->peak_rss / mib;
        if (r == 0)
            printf("exchange %.3f ms (sent %.1f KiB, received %.1f KiB), peak RSS %.0f MiB\n",
                   1e3 * a->t_comm / n, (double)a->sent / n / 1024, (double)a->received / n / 1024, rss);
        else
            printf("waiting for rank 0 %.3f ms, peak RSS %.0f MiB\n", 1e3 * a->t_idle / n, rss);
    }
}

static void ranks_json(cJSON *o, const rank_sums *rs, const mx_model *m)
{
    const double n = rs->tokens > 0 ? (double)rs->tokens : 1;
    cJSON *arr = cJSON_AddArrayToObject(o, "ranks");
    for (int r = 0; r < mx_dist_size(); r++) {
        const mx_dist_stats *a = &rs->st[r];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "rank", r);
        cJSON_AddNumberToObject(x, "expert_bytes_per_token", (double)a->expert_bytes / n);
        if (r == 0)
            cJSON_AddNumberToObject(x, "other_bytes_per_token", (double)base_bytes_per_token(m));
        cJSON_AddNumberToObject(x, "compute_s_per_token", a->t_compute / n);
        cJSON_AddNumberToObject(x, r == 0 ? "exchange_s_per_token" : "wait_s_per_token",
                                (r == 0 ? a->t_comm : a->t_idle) / n);
        cJSON_AddNumberToObject(x, "sent_bytes_per_token", (double)a->sent / n);
        cJSON_AddNumberToObject(x, "received_bytes_per_token", (double)a->received / n);
        cJSON_AddNumberToObject(x, "peak_rss_bytes", (double)a->peak_rss);
        cJSON_AddItemToArray(arr, x);
    }
}

/* Decodes n tokens from position `pos` (the prompt already in the cache),
 * returning tok/s: greedy steps through mx_decode_greedy (on a GPU the
 * argmax there, no round trip to the host a token; MLXCEL_CUDA_GREEDY=0
 * takes the host's, as generate does).  A recurrent state cannot be
 * rewound to the prompt's end: such a model feeds the prompt again first
 * (not timed). */
static int decode_run(mx_model *m, mx_seq *s, const int32_t *prompt, int pos, int32_t first, int n,
                      double *tok_s, mx_err *e)
{
    if (mx_seq_rewind(s, pos) < pos) {
        int rc = mx_forward(m, s, prompt, pos, NULL, NULL, e);
        if (rc)
            return rc;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!ids)
        return mx_fail(e, MX_ENOMEM, "bench: out of memory");
    double t0 = mx_now();
    int rc = mx_decode_greedy(m, s, first, n, ids, e);
    *tok_s = n / (mx_now() - t0);
    free(ids);
    return rc;
}

/* The batched decode: nb sequences, each with its own random prompt of np
 * tokens (fed once, not timed), decode ng greedy steps together through
 * mx_forward_batch, once per repeat from the prompts' end; *agg gets each
 * repeat's aggregate tok/s (nb x ng / time). */
static int batch_runs(mx_model *m, int nb, int np, int ng, int nctx, int reps, series *agg, mx_err *e)
{
    const size_t V = (size_t)m->vocab;
    mx_seq **seqs = calloc((size_t)nb, sizeof *seqs);
    int32_t *prompts = malloc(sizeof(int32_t) * (size_t)nb * (size_t)np);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)nb);
    float *logits = malloc(sizeof(float) * (size_t)nb * V);
    int rc = MX_OK;
    if (!seqs || !prompts || !ids || !logits)
        rc = mx_fail(e, MX_ENOMEM, "bench --batch %d: out of memory", nb);
    uint64_t seed = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; !rc && i < (size_t)nb * (size_t)np; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        prompts[i] = (int32_t)(seed % (uint64_t)V);
    }
    for (int i = 0; i < nb && !rc; i++)
        if (!(rc = mx_seq_new(m, nctx, &seqs[i], e)))
            rc = mx_forward(m, seqs[i], prompts + (size_t)i * (size_t)np, np, logits, NULL, e);
    /* repeat 0 is the warm-up (scratch grown, kernels loaded), not counted */
    for (int r = 0; r <= reps && !rc; r++) {
        for (int i = 0; i < nb && !rc; i++) {
            if (mx_seq_rewind(seqs[i], np) < np)   /* a recurrent state: the prompt again */
                rc = mx_forward(m, seqs[i], prompts + (size_t)i * (size_t)np, np, NULL, NULL, e);
            ids[i] = prompts[(size_t)i * (size_t)np + (size_t)np - 1];
        }
        const int steps = r == 0 ? (ng < 4 ? ng : 4) : ng;
        const double t0 = mx_now();
        for (int j = 0; j < steps && !rc; j++) {
            rc = mx_forward_batch(m, seqs, ids, nb, logits, e);
            for (int i = 0; i < nb && !rc; i++)
                ids[i] = mx_argmax(logits + (size_t)i * V, m->vocab);
        }
        if (!rc && r > 0)
            push(agg, (double)nb * steps / (mx_now() - t0));
    }
    for (int i = 0; seqs && i < nb; i++)
        mx_seq_free(seqs[i]);
    free(seqs), free(prompts), free(ids), free(logits);
    return rc;
}

/* The bandwidth of the memory the weights are read from: this machine's
 * (a threaded read), or the GPU's (a device copy, bytes read + written). */
static double probe_bw(const mx_model *m, size_t bytes)
{
    return m->backend ? mx_cuda_membw_probe(bytes, 5) : mx_membw_probe(bytes, 3);
}

static void line(const char *what, const series *s)
{
    printf("%-16s %8.2f tok/s median   (min %.2f, max %.2f, %d runs)\n", what, med(s), mn(s), mxv(s), s->n);
}

int cmd_bench(int argc, char **argv)
{
    const char *dir = NULL;
    long np = 128, ng = 64, reps = 3, bw_mb = 1024, nbatch = 1, nctx = 0, v;
    int compare = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *s;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(s = arg_value(argc, argv, &i)) || arg_long(a, s, 1, 1 << 20, &np))
                return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--gen")) {
            if (!(s = arg_value(argc, argv, &i)) || arg_long(a, s, 1, 1 << 20, &ng))
                return 2;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!(s = arg_value(argc, argv, &i)) || arg_long(a, s, 1, 1 << 24, &nctx))
                return 2;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--repeats")) {
            if (!(s = arg_value(argc, argv, &i)) || arg_long(a, s, 1, 64, &reps))
                return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(s = arg_value(argc, argv, &i)) || arg_long(a, s, 1, 256, &v))
                return 2;
            mx_set_threads((int)v);
        } else if (!strcmp(a, "--precision")) {
            if (!(s = arg_value(argc, argv, &i)) || cli_precision(a, s))
                return 2;
        } else if (!strcmp(a, "--repack")) {
            if (!(s = arg_value(argc, argv, &i)) || cli_repack(a, s))
                return 2;
        } else if (!strcmp(a, "--device")) {
            if (!(s = arg_value(argc, argv, &i)))
                return 2;
            setenv("MLXCEL_DEVICE", s, 1);
        } else if (!strcmp(a, "--batch")) {
            if (!(s = arg_value(argc, argv, &i)) || arg_long(a, s, 1, 4096, &nbatch))
                return 2;
        } else if (!strcmp(a, "--bw-mb")) {
            if (!(s = arg_value(argc, argv, &i)) || arg_long(a, s, 0, 1 << 20, &bw_mb))
                return 2;
        } else if (!strcmp(a, "--compare-fused")) {
            compare = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else {
            return arg_unknown("bench", a, help);
        }
    }
    if (!dir) {
        fprintf(stderr, "mlxcel bench: -m DIR is required (see --help)\n");
        return 2;
    }
    if (nctx == 0) {
        nctx = np + ng + 2;
    } else if (nctx < np + ng + 2) {
        fprintf(stderr, "mlxcel bench: --ctx-size %ld is below the prompt + the decode + 2 = %ld tokens\n", nctx,
                np + ng + 2);
        return 2;
    }

    mx_err e = {0};
    mx_model *m = NULL;
    double t0 = mx_now();
    if (mx_model_load(dir, &m, &e) || mx_device_select(m, NULL, &e)) {
        fprintf(stderr, "mlxcel bench: %s\n", e.msg);
        mx_model_free(m);
        return 1;
    }
    double load_s = mx_now() - t0;
    int32_t *prompt = malloc(sizeof *prompt * (size_t)np);
    float *logits = malloc(sizeof(float) * (size_t)m->vocab);
    mx_seq *s = NULL;
    int rc = mx_seq_new(m, (int)nctx, &s, &e);
    if (rc || !prompt || !logits)
        goto fail;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (long i = 0; i < np; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        prompt[i] = (int32_t)(seed % (uint64_t)m->vocab);
    }

    fprintf(stderr, "bench: %s, device %s, %d threads, kernel %s, prompt %ld, decode %ld, context %ld, %ld repeats\n",
            dir, mx_device_name(m), mx_threads(), mx_qkernels_active()->name, np, ng, nctx, reps);
    /* warm-up (not counted): page in the weights, grow the scratch buffers */
    double tw = mx_now();
    if ((rc = mx_forward(m, s, prompt, (int)np, logits, NULL, &e)))
        goto fail;
    double ttft_first = mx_now() - tw;
    int32_t first = mx_argmax(logits, m->vocab);
    double dummy;
    if ((rc = decode_run(m, s, prompt, (int)np, first, ng < 4 ? (int)ng : 4, &dummy, &e)))
        goto fail;
    if (compare) {   /* the gather path warmed up too (on a GPU: its step graph captured) */
        mx_moe_set_fused(0);
        rc = decode_run(m, s, prompt, (int)np, first, ng < 4 ? (int)ng : 4, &dummy, &e);
        mx_moe_set_fused(-1);
        if (rc)
            goto fail;
    }
    fprintf(stderr, "bench: warm-up done (first prefill %.2f s)\n", ttft_first);

    /* The machine's bandwidth drifts within seconds on shared hosts (seen
     * here: 35 and 60 GB/s a minute apart), so it is probed just before and
     * just after every repeat's decode, and each repeat's roofline fraction
     * uses the mean of its two probes.  The resident set is read before the
     * first probe (whose buffer would count in the peak). */
    series pre = {0}, dec = {0}, fused = {0}, gather = {0}, ttft = {0}, bws = {0}, roofs = {0};
    static rank_sums ranks;   /* large: not on the stack */
    const int dist = mx_dist_size() > 1;
    long long rss = 0;
    const uint64_t bpt = mx_model_active_bytes(m);
    for (long r = 0; r < reps; r++) {
        mx_seq_reset(s);
        double ta = mx_now();
        if ((rc = mx_forward(m, s, prompt, (int)np, logits, NULL, &e)))
            goto fail;
        double tp = mx_now() - ta;
        first = mx_argmax(logits, m->vocab);
        push(&ttft, mx_now() - ta);
        push(&pre, np / tp);
        if (!rss)
            rss = mx_peak_rss_bytes();
        const double bw0 = bw_mb > 0 ? probe_bw(m, (size_t)bw_mb << 20) : 0;
        const int nd = dec.n;
        if (dist)
            mx_dist_stats_reset();
        if (!compare) {
            double ts;
            if ((rc = decode_run(m, s, prompt, (int)np, first, (int)ng, &ts, &e)))
                goto fail;
            push(&dec, ts);
        } else {
            /* F G G F: each path runs once first and once second in every
             * repeat, so neither gains from weights the other left in the
             * last-level cache or from drift in the machine's speed */
            for (int k = 0; k < 4; k++) {
                int use_fused = k == 0 || k == 3;
                double ts;
                mx_moe_set_fused(use_fused);
                if ((rc = decode_run(m, s, prompt, (int)np, first, (int)ng, &ts, &e)))
                    goto fail;
                push(use_fused ? &fused : &gather, ts);
                push(&dec, ts);
            }
            mx_moe_set_fused(-1);
        }
        if (dist)
            ranks_add(&ranks, compare ? 4 * ng : ng);
        if (bw_mb > 0) {
            const double bwr = (bw0 + probe_bw(m, (size_t)bw_mb << 20)) / 2;
            /* this repeat's default-path decode: all of it, or its fused runs */
            double sum = 0;
            int cnt = 0;
            for (int i = nd; i < dec.n; i++)
                if (!compare || i - nd == 0 || i - nd == 3)
                    sum += dec.v[i], cnt++;
            push(&bws, bwr);
            if (bwr > 0 && cnt)
                push(&roofs, sum / cnt * (double)bpt / (bwr * 1e9));
        }
        fprintf(stderr, "bench: repeat %ld/%ld done\n", r + 1, reps);
    }
    if (compare)
        dec = fused;   /* the default path is the fused one */
    series bat = {0};
    if (nbatch > 1) {
        if ((rc = batch_runs(m, (int)nbatch, (int)np, (int)ng, (int)nctx, (int)reps, &bat, &e)))
            goto fail;
        fprintf(stderr, "bench: batch of %ld done\n", nbatch);
    }

    double bw = med(&bws), roof = med(&roofs);

    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", dir);
        cJSON_AddStringToObject(o, "model_type", m->cfg.model_type);
        cJSON_AddStringToObject(o, "device", mx_device_name(m));
        cJSON_AddNumberToObject(o, "threads", mx_threads());
        cJSON_AddStringToObject(o, "kernel", mx_qkernels_active()->name);
        cJSON_AddStringToObject(o, "precision", mx_precision_name(mx_precision_get()));
        cJSON_AddStringToObject(o, "repack", mx_repack_mode_name(mx_repack_mode_get()));
        cJSON_AddStringToObject(o, "weight_cache",
                                m->wcache ? mx_wcache_state_name(mx_wcache_get_info(m->wcache)->state)
                                          : "off");
        cJSON_AddNumberToObject(o, "prompt_tokens", (double)np);
        cJSON_AddNumberToObject(o, "gen_tokens", (double)ng);
        cJSON_AddNumberToObject(o, "repeats", (double)reps);
        cJSON_AddNumberToObject(o, "prefill_tok_s", med(&pre));
        cJSON_AddNumberToObject(o, "prefill_tok_s_min", mn(&pre));
        cJSON_AddNumberToObject(o, "prefill_tok_s_max", mxv(&pre));
        cJSON_AddNumberToObject(o, "decode_tok_s", med(&dec));
        cJSON_AddNumberToObject(o, "decode_tok_s_min", mn(&dec));
        cJSON_AddNumberToObject(o, "decode_tok_s_max", mxv(&dec));
        if (compare) {
            cJSON_AddNumberToObject(o, "decode_tok_s_fused", med(&fused));
            cJSON_AddNumberToObject(o, "decode_tok_s_gather", med(&gather));
            cJSON_AddNumberToObject(o, "fused_over_gather", med(&gather) > 0 ? med(&fused) / med(&gather) : 0);
        }
        if (nbatch > 1) {
            cJSON_AddNumberToObject(o, "batch", (double)nbatch);
            cJSON_AddNumberToObject(o, "batch_decode_tok_s", med(&bat));
            cJSON_AddNumberToObject(o, "batch_decode_tok_s_min", mn(&bat));
            cJSON_AddNumberToObject(o, "batch_decode_tok_s_max", mxv(&bat));
            cJSON_AddNumberToObject(o, "batch_decode_tok_s_per_seq", med(&bat) / (double)nbatch);
        }
        cJSON_AddNumberToObject(o, "ttft_s", med(&ttft));
        cJSON_AddNumberToObject(o, "load_s", load_s);
        cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)rss);
        cJSON_AddNumberToObject(o, "weight_bytes_per_token", (double)bpt);
        cJSON_AddNumberToObject(o, "mem_bw_gbs", bw);
        cJSON_AddNumberToObject(o, "mem_bw_gbs_min", mn(&bws));
        cJSON_AddNumberToObject(o, "mem_bw_gbs_max", mxv(&bws));
        cJSON_AddNumberToObject(o, "roofline_fraction", roof);
        cJSON_AddNumberToObject(o, "roofline_fraction_min", mn(&roofs));
        cJSON_AddNumberToObject(o, "roofline_fraction_max", mxv(&roofs));
        cJSON_AddNumberToObject(o, "kv_cache_bytes_per_token", (double)mx_model_kv_bytes(m, 1));
        cJSON_AddNumberToObject(o, "recurrent_state_bytes", (double)(mx_model_state_floats(m) * sizeof(float)));
        if (dist)
            ranks_json(o, &ranks, m);
        char *str = cJSON_PrintUnformatted(o);
        printf("%s\n", str);
        free(str);
        cJSON_Delete(o);
    } else {
        printf("model            %s (%s), %d threads, kernel %s\n", dir, m->cfg.model_type, mx_threads(),
               mx_qkernels_active()->name);
        printf("device           %s\n", mx_device_name(m));
        line("prefill", &pre);
        if (compare) {
            line("decode fused", &fused);
            line("decode gather", &gather);
            printf("fused / gather   %8.3f\n", med(&gather) > 0 ? med(&fused) / med(&gather) : 0);
        } else {
            line("decode", &dec);
        }
        if (nbatch > 1) {
            char what[48];
            snprintf(what, sizeof what, "decode batch %ld", nbatch);
            line(what, &bat);
            printf("  per sequence   %8.2f tok/s median (aggregate / %ld)\n", med(&bat) / (double)nbatch, nbatch);
        }
        printf("time to first    %8.3f s (prompt of %ld tokens)\n", med(&ttft), np);
        printf("load             %8.3f s\n", load_s);
        printf("weights/token    %8.1f MiB\n", (double)bpt / 1048576.0);
        if (bw > 0)
            printf("memory bandwidth %8.1f GB/s median (min %.1f, max %.1f; probed around each repeat)\n",
                   bw, mn(&bws), mxv(&bws));
        if (roof > 0)
            printf("roofline         %8.1f %% median (min %.1f, max %.1f; decode tok/s x bytes/token /\n"
                   "                          bandwidth, each repeat against its own probes)\n",
                   100 * roof, 100 * mn(&roofs), 100 * mxv(&roofs));
        printf("peak RSS         %8.1f MiB\n", (double)rss / 1048576.0);
        printf("sequence memory  %8.1f KiB per token of KV cache, %.1f KiB of recurrent state\n",
               (double)mx_model_kv_bytes(m, 1) / 1024.0,
               (double)(mx_model_state_floats(m) * sizeof(float)) / 1024.0);
        if (dist)
            ranks_print(&ranks, m);
    }
    mx_seq_free(s);
    free(prompt);
    free(logits);
    mx_model_free(m);
    return 0;
fail:
    fprintf(stderr, "mlxcel bench: %s\n", e.msg[0] ? e.msg : "out of memory");
    mx_seq_free(s);
    free(prompt);
    free(logits);
    mx_model_free(m);
    return 1;
}
