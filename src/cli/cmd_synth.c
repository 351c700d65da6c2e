/* cmd_synth.c - `mlxcel synth`: write a synthetic MLX checkpoint (random
 * weights of a published architecture) for tests, demos and benchmarks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "synth/synth.h"

static uint64_t phys_ram_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

/* A checkpoint "fits" when its weights leave room for the OS, the KV cache
 * and activations: at most 85% of physical memory.  Otherwise it runs by
 * paging weights from disk (mmap). */
static int fits_in_ram(uint64_t bytes, uint64_t ram)
{
    return ram && (double)bytes <= 0.85 * (double)ram;
}

static void usage(FILE *f, const mx_synth_opts *o)
{
    fprintf(f,
        "usage: mlxcel synth --preset NAME --out DIR [options]\n\n"
        "Writes an MLX-format quantized checkpoint with random weights (config.json,\n"
        "safetensors shards + index, tokenizer.json, tokenizer_config.json), streamed to\n"
        "disk tensor by tensor.  Weights are a pure function of (seed, tensor name).\n\n"
        "options:\n"
        "  --preset NAME          architecture (below)\n"
        "  --out DIR              output directory (created; must be empty unless --force)\n"
        "  --bits B               2, 3, 4, 5, 6 or 8 (default 4; routers 8-bit where mlx-lm keeps them so)\n"
        "  --group-size G         32, 64 or 128 (default 64)\n"
        "  --scale-dtype T        f16, bf16 or f32 (default: the model's torch_dtype)\n"
        "  --layout L             per-expert (one tensor per expert) or stacked (one per projection)\n"
        "  --layers N             only N layers of the preset's shape (a scaled-down variant)\n"
        "  --seed S               random seed (default 0)\n"
        "  --shard-gb N           max shard size in GB (default 5, fractions allowed)\n"
        "  --shard-mb N           max shard size in MB (for small tests)\n"
        "  --force                replace the checkpoint files in a non-empty DIR\n"
        "  --quiet                no progress on stderr\n\n");
    uint64_t ram = phys_ram_bytes();
    fprintf(f, "presets (size on disk at %d-bit, group %d; this machine has %.1f GiB RAM):\n",
            o->bits, o->group_size, (double)ram / (double)(1ull << 30));
    const mx_family *fam;
    for (int fi = 0; (fam = mx_family_at(fi)); fi++)
    for (const mx_preset *p = fam->presets; p && p->name; p++) {
        mx_synth_opts po = *o;
        po.preset = p->name;
        mx_synth_plan plan;
        mx_err e;
        char size[600];
        const char *fit = "";
        if (mx_synth_plan_build(&po, &plan, &e) == MX_OK) {
            double gb = (double)plan.total_bytes / 1e9;
            if (gb >= 1.0)
                snprintf(size, sizeof size, "%.1f GB", gb);
            else
                snprintf(size, sizeof size, "%.1f MB", (double)plan.total_bytes / 1e6);
            fit = fits_in_ram(plan.total_bytes, ram) ? "fits in RAM"
                                                    : "does NOT fit in RAM: pages from disk";
            mx_synth_plan_free(&plan);
        } else {
            snprintf(size, sizeof size, "n/a (%s)", e.msg);
        }
        fprintf(f, "  %-18s %s\n", p->name, p->about);
        fprintf(f, "  %-18s %s, vocab %d, hidden %d, %d layers, %d/%d heads (dim %d), "
                   "%d experts top-%d, expert width %d",
                "", fam->model_type, p->vocab, p->hidden, p->layers, p->heads, p->kv_heads,
                p->head_dim, p->experts, p->top_k, p->moe_intermediate);
        if (p->shared_intermediate)
            fprintf(f, ", shared expert %d", p->shared_intermediate);
        fprintf(f, "\n  %-18s %s on disk, %s\n", "", size, fit);
    }
}

static int parse_int(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < -2147483647L || v > 2147483647L)
        return -1;
    *out = (int)v;
    return 0;
}

/* The help text with the default options (what arg_unknown reads the option
 * names from). */
static void default_usage(FILE *f)
{
    mx_synth_opts o;
    mx_synth_opts_default(&o);
    usage(f, &o);
}

static int takes_value(const char *a)
{
    static const char *const opts[] = {"--preset", "--out", "--bits", "--group-size", "--scale-dtype",
                                       "--layout", "--layers", "--seed", "--shard-gb", "--shard-mb"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (!strcmp(a, opts[i]))
            return 1;
    return 0;
}

int cmd_synth(int argc, char **argv)
{
    mx_synth_opts o;
    mx_synth_opts_default(&o);
    o.progress = 1;
    const char *out = NULL, *preset = NULL;
    int help = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            help = 1;
            takes = 0;
        } else if (!strcmp(a, "--force")) {
            o.force = 1;
            takes = 0;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            o.progress = 0;
            takes = 0;
        } else if (!v) {
            if (!takes_value(a))
                return arg_unknown("synth", a, default_usage);
            fprintf(stderr, "mlxcel synth: option %s needs a value\n", a);
            return 2;
        } else if (!strcmp(a, "--preset")) {
            preset = v;
        } else if (!strcmp(a, "--out")) {
            out = v;
        } else if (!strcmp(a, "--bits")) {
            if (parse_int(v, &o.bits)) {
                fprintf(stderr, "mlxcel synth: --bits: '%s' is not a number\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--group-size")) {
            if (parse_int(v, &o.group_size)) {
                fprintf(stderr, "mlxcel synth: --group-size: '%s' is not a number\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--scale-dtype")) {
            if (!strcmp(v, "f16") || !strcmp(v, "float16"))
                o.scale_dtype = MX_F16;
            else if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16"))
                o.scale_dtype = MX_BF16;
            else if (!strcmp(v, "f32") || !strcmp(v, "float32"))
                o.scale_dtype = MX_F32;
            else {
                fprintf(stderr, "mlxcel synth: --scale-dtype must be f16, bf16 or f32\n");
                return 2;
            }
        } else if (!strcmp(a, "--layout")) {
            if (!strcmp(v, "stacked"))
                o.layout = MX_SYNTH_STACKED;
            else if (!strcmp(v, "per-expert"))
                o.layout = MX_SYNTH_PER_EXPERT;
            else {
                fprintf(stderr, "mlxcel synth: --layout must be stacked or per-expert\n");
                return 2;
            }
        } else if (!strcmp(a, "--layers")) {
            if (parse_int(v, &o.layers) || o.layers < 1) {
                fprintf(stderr, "mlxcel synth: --layers: '%s' is not a positive number\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o.seed = strtoull(v, &end, 0);
            if (errno || end == v || *end) {
                fprintf(stderr, "mlxcel synth: --seed: '%s' is not a number\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--shard-gb") || !strcmp(a, "--shard-mb")) {
            char *end;
            double x = strtod(v, &end);
            double unit = !strcmp(a, "--shard-gb") ? (double)(1ull << 30) : (double)(1ull << 20);
            if (end == v || *end || !(x > 0) || x * unit > 1e15) {
                fprintf(stderr, "mlxcel synth: %s: '%s' is not a positive size\n", a, v);
                return 2;
            }
            o.shard_bytes = (uint64_t)(x * unit);
            if (o.shard_bytes == 0)
                o.shard_bytes = 1;
        } else {
            return arg_unknown("synth", a, default_usage);
        }
        i += takes;
    }
    if (help) {
        usage(stdout, &o);
        return 0;
    }
    if (!preset || !out) {
        fprintf(stderr, "mlxcel synth: --preset and --out are required\n\n");
        usage(stderr, &o);
        return 2;
    }
    if (!mx_preset_find(preset, NULL)) {
        fprintf(stderr, "mlxcel synth: unknown preset '%s'; presets:", preset);
        const mx_family *fam;
        for (int fi = 0; (fam = mx_family_at(fi)); fi++)
            for (const mx_preset *p = fam->presets; p && p->name; p++)
                fprintf(stderr, " %s", p->name);
        fprintf(stderr, "\n");
        return 2;
    }
    o.preset = preset;
    mx_err e;
    mx_err_clear(&e);
    int rc = mx_synth_write(&o, out, &e);
    if (rc) {
        fprintf(stderr, "mlxcel synth: %s\n", e.msg);
        return rc == MX_EINVAL ? 2 : 1;
    }
    return 0;
}
