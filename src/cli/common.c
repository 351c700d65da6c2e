/* common.c - options shared by generate, chat and serve. */
#include "cli/common.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "quant/quant.h"
#include "util/parallel.h"
#include "wcache/wcache.h"

void cli_opts_init(cli_opts *o, float default_temp)
{
    memset(o, 0, sizeof *o);
    o->max_tokens = 256;
    mx_sample_defaults(&o->gen.sample);
    o->gen.sample.temperature = default_temp;
    /* a different draw each run unless --seed is given */
    o->gen.sample.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    o->gen.stops = o->stops;
    /* MLXCEL_LOOKUP_ADAPT=0: --lookup drafts at every match (tests, and
     * measuring what the cost model saves) */
    o->gen.lookup_always = !mx_env_flag("MLXCEL_LOOKUP_ADAPT", 1);
}

void cli_common_help(FILE *f)
{
    fprintf(f, "  -m, --model DIR         MLX checkpoint folder (config.json, *.safetensors, tokenizer.json)\n"
               "  -n, --max-tokens N      tokens to generate (default 256; -1 = until end of sequence\n"
               "                          or a full context)\n"
               "  -c, --ctx-size N        context size in tokens (default min(model max, 4096); above the\n"
               "                          model's max_position_embeddings: a warning)\n"
               "  -t, --threads N         worker threads (default: MLXCEL_THREADS or all CPUs)\n"
               "      --precision P       exact (default) or fast: x as one int8 level per group in\n"
               "                          the integer kernels (MLXCEL_PRECISION; docs/quality.md)\n"
               "      --repack MODE       repacked weights: auto (default where the CPU's kernels read\n"
               "                          them: a cache file built once, then mmap'ed), off, rebuild,\n"
               "                          mem (MLXCEL_REPACK, MLXCEL_CACHE_DIR; docs/cache.md)\n"
               "      --device NAME       cpu (default) or cuda: run the model on GPU 0 (MLXCEL_DEVICE)\n"
               "      --temp T            temperature (also --temperature); 0 = greedy\n"
               "      --top-k K           keep the K most likely tokens (0 = off, default 40)\n"
               "      --top-p P           nucleus sampling (1 = off, default 0.95)\n"
               "      --min-p P           drop tokens below P x the top probability (0 = off, default 0.05)\n"
               "      --repeat-penalty R  penalise recent tokens (1 = off, default)\n"
               "      --repeat-last-n N   window for the repetition penalty (default 64)\n"
               "      --seed S            seed for reproducible sampling\n"
               "      --stop TEXT         stop when TEXT is generated (repeatable)\n"
               "      --ignore-eos        keep going past end-of-sequence tokens\n"
               "      --lookup N          prompt lookup: draft up to N tokens (1..%d) that follow an\n"
               "                          earlier occurrence of the text's last words and verify them in\n"
               "                          one forward call; the output is unchanged (greedy or sampled),\n"
               "                          only faster when text repeats (off for recurrent models)\n"
               "      --stats             print timing and dispatch statistics on stderr\n",
            MX_LOOKUP_MAX);
}

int cli_precision(const char *opt, const char *v)
{
    if (mx_precision_set(v) == 0)
        return 0;
    fprintf(stderr, "mlxcel: %s: '%s' is not a precision (exact, fast)\n", opt, v);
    return -1;
}

int cli_repack(const char *opt, const char *v)
{
    if (mx_repack_mode_set(v) == 0)
        return 0;
    fprintf(stderr, "mlxcel: %s: '%s' is not a repack mode (off, auto, rebuild, mem)\n", opt, v);
    return -1;
}

void cli_wcache_stats(const mx_model *m)
{
    const mx_wcache_info *w = m->wcache ? mx_wcache_get_info(m->wcache) : NULL;
    if (!w)
        return;
    const double mib = (double)w->file_bytes / 1048576.0;
    switch (w->state) {
    case MX_WCACHE_USED:
    case MX_WCACHE_BUILT:
        fprintf(stderr, "weight cache: %s %s (%.0f MiB, %zu matrices, %.3f s)\n",
                w->state == MX_WCACHE_USED ? "used" : "built", w->path, mib, w->n_mats, w->seconds);
        break;
    case MX_WCACHE_MEM:
        fprintf(stderr, "weight cache: repacked in memory (%.0f MiB, %zu matrices, %.3f s)\n", mib,
                w->n_mats, w->seconds);
        break;
    case MX_WCACHE_FAILED:
        fprintf(stderr, "weight cache: not used (%s)\n", w->reason);
        break;
    default:
        fprintf(stderr, "weight cache: off%s%s\n", w->reason[0] ? ": " : " (--repack auto to use one)",
                w->reason);
    }
}

int cli_common_option(int argc, char **argv, int *i, cli_opts *o)
{
    const char *a = argv[*i], *v;
    long n;
    mx_sample_params *sp = &o->gen.sample;
#define VAL() do { if (!(v = arg_value(argc, argv, i))) return -1; } while (0)
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        VAL();
        o->model = v;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
        VAL();
        if (arg_long(a, v, -1, 1 << 30, &n))
            return -1;
        o->max_tokens = (int)n;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        VAL();
        if (arg_long(a, v, 1, 1 << 24, &n))
            return -1;
        o->ctx = (int)n;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        VAL();
        if (arg_long(a, v, 1, 256, &n))
            return -1;
        mx_set_threads((int)n);
    } else if (!strcmp(a, "--precision")) {
        VAL();
        if (cli_precision(a, v))
            return -1;
    } else if (!strcmp(a, "--repack")) {
        VAL();
        if (cli_repack(a, v))
            return -1;
    } else if (!strcmp(a, "--device")) {
        VAL();
        setenv("MLXCEL_DEVICE", v, 1);   /* read where the engine is loaded (gen.c) */
    } else if (!strcmp(a, "--temp") || !strcmp(a, "--temperature")) {
        VAL();
        return arg_float(a, v, 0, 100, &sp->temperature) ? -1 : 1;
    } else if (!strcmp(a, "--top-k")) {
        VAL();
        if (arg_long(a, v, 0, 1 << 30, &n))
            return -1;
        sp->top_k = (int)n;
    } else if (!strcmp(a, "--top-p")) {
        VAL();
        return arg_float(a, v, 0, 1, &sp->top_p) ? -1 : 1;
    } else if (!strcmp(a, "--min-p")) {
        VAL();
        return arg_float(a, v, 0, 1, &sp->min_p) ? -1 : 1;
    } else if (!strcmp(a, "--repeat-penalty")) {
        VAL();
        return arg_float(a, v, 0.01, 100, &sp->repeat_penalty) ? -1 : 1;
    } else if (!strcmp(a, "--repeat-last-n")) {
        VAL();
        if (arg_long(a, v, 0, 1 << 24, &n))
            return -1;
        sp->repeat_last_n = (int)n;
    } else if (!strcmp(a, "--seed")) {
        VAL();
        if (arg_long(a, v, 0, 0x7fffffffffffffffL, &n))
            return -1;
        sp->seed = (uint64_t)n;
    } else if (!strcmp(a, "--stop")) {
        VAL();
        if (o->gen.n_stops >= CLI_MAX_STOPS) {
            fprintf(stderr, "mlxcel: at most %d --stop strings\n", CLI_MAX_STOPS);
            return -1;
        }
        if (!*v) {
            fprintf(stderr, "mlxcel: --stop needs a non-empty string\n");
            return -1;
        }
        o->stops[o->gen.n_stops++] = v;
    } else if (!strcmp(a, "--ignore-eos")) {
        o->gen.ignore_eos = 1;
    } else if (!strcmp(a, "--lookup")) {
        VAL();
        if (arg_long(a, v, 0, MX_LOOKUP_MAX, &n))
            return -1;
        o->gen.lookup = (int)n;
    } else if (!strcmp(a, "--stats")) {
        o->stats = 1;
    } else {
        return 0;
    }
#undef VAL
    return 1;
}

int cli_ctx(const cli_opts *o, const mx_model *m)
{
    int mp = m->cfg.max_position_embeddings;
    if (o->ctx > 0) {
        /* allowed (rope extrapolates, and tests use it), but say so */
        if (mp > 0 && o->ctx > mp)
            fprintf(stderr, "mlxcel: warning: --ctx-size %d is above the model's maximum of %d tokens "
                            "(max_position_embeddings); text past %d positions may degrade\n",
                    o->ctx, mp, mp);
        return o->ctx;
    }
    return mp > 0 && mp < 4096 ? mp : 4096;
}

void cli_lookup_check(cli_opts *o, const mx_model *m)
{
    if (o->gen.lookup > 0 && mx_model_state_floats(m) > 0) {
        fprintf(stderr, "mlxcel: note: --lookup is off for this model: its recurrent layers cannot drop "
                        "rejected draft tokens\n");
        o->gen.lookup = 0;
    } else if (o->gen.lookup > 0 && m->backend) {
        fprintf(stderr, "mlxcel: note: --lookup is off on device %s: its calls of several tokens use "
                        "other kernels than one-token steps, so the output would not be exactly the "
                        "same\n", m->backend->name);
        o->gen.lookup = 0;
    }
}

int cli_max_tokens(const cli_opts *o, int n_ctx)
{
    return o->max_tokens < 0 ? (n_ctx > 0 ? n_ctx : INT_MAX) : o->max_tokens;
}
