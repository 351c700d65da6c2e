/* main.c - the mlxcel executable: dispatches to a subcommand, answers
 * --version and `help COMMAND`, and suggests the command meant by a typo. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dist/dist.h"
#include "mx_gitdesc.h"
#include "quant/quant.h"
#include "util/parallel.h"
#include "util/sysinfo.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"generate", cmd_generate, "generate text or token ids from a prompt"},
    {"chat", cmd_chat, "interactive chat through the model's chat template"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
    {"template", cmd_template, "print the prompt the chat template renders for messages"},
    {"bench", cmd_bench, "measure prefill and decode speed"},
    {"inspect", cmd_inspect, "summarise a checkpoint (shapes, quantization, memory)"},
    {"perplexity", cmd_perplexity, "perplexity of a text; KL divergence against a saved run"},
    {"synth", cmd_synth, "write a synthetic MLX checkpoint with random weights"},
    {"tokenize", cmd_tokenize, "text to token ids"},
    {"detokenize", cmd_detokenize, "token ids to text"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: mlxcel COMMAND [options]   (mlxcel help COMMAND for details)\n"
               "       mlxcel --version\n\n"
               "Runs MLX-format quantized language models (mixture-of-experts first) on the CPU.\n\n"
               "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nenvironment:\n"
               "  MLXCEL_THREADS=N            worker threads (default: all CPUs)\n"
               "  MLXCEL_DEVICE=cuda          run the model on GPU 0 (builds with -DMLXCEL_CUDA=ON)\n"
               "  MLXCEL_FUSED_MOE=0          disable the fused single-token MoE kernel\n"
               "  MLXCEL_FUSED_MOE_MAX_DFF=N  largest expert width the fused kernel takes\n"
               "  MLXCEL_KERNEL=NAME          force a kernel variant (scalar, avx2, avx512, avx512vnni)\n"
               "  MLXCEL_PRECISION=fast       one int8 level of x in the integer kernels (default exact)\n"
               "  MLXCEL_TRACE_MOE=1          print MoE dispatch counts on stderr\n"
               "\nexpert parallelism (builds with MPI; docs/distributed.md):\n"
               "  mpirun -np N mlxcel COMMAND ... [--expert-map FILE]   the routed experts over N ranks\n");
}

/* Version, the commit and compiler it was built from, and the kernel variant
 * this CPU gets (the one thing that changes speed between machines). */
static int version(void)
{
    printf("mlxcel %s (commit %s)\n", mx_version(), MX_GIT_DESCRIBE);
    printf("build: %s\n", mx_build_info());
    printf("kernel: %s (this CPU runs:", mx_qkernels_active()->name);
    for (const char *const *k = mx_qkernels_names(); *k; k++)
        if (mx_qkernels_get(*k))
            printf(" %s", *k);
    printf("; MLXCEL_KERNEL picks one)\n");
    printf("threads: %d\n", mx_threads());
    return 0;
}

static int find_command(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].name))
            return (int)i;
    return -1;
}

/* One line naming the unknown command, with the likely one when it is close. */
static int unknown_command(const char *name)
{
    const char *names[N_COMMANDS];
    for (size_t i = 0; i < N_COMMANDS; i++)
        names[i] = commands[i].name;
    const char *near = arg_closest(name, names, N_COMMANDS);
    if (near)
        fprintf(stderr, "mlxcel: unknown command '%s' (did you mean '%s'?)\n", name, near);
    else
        fprintf(stderr, "mlxcel: unknown command '%s' (mlxcel --help lists the commands)\n", name);
    return 2;
}

static int run(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *a = argv[1];
    if (!strcmp(a, "--help") || !strcmp(a, "-h") || (!strcmp(a, "help") && argc == 2)) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(a, "--version") || !strcmp(a, "-v") || !strcmp(a, "version"))
        return version();
    if (!strcmp(a, "help")) {
        /* `mlxcel help CMD` is `mlxcel CMD --help` */
        int c = find_command(argv[2]);
        if (c < 0)
            return unknown_command(argv[2]);
        char *args[] = {argv[2], "--help", NULL};
        return commands[c].fn(2, args);
    }
    int c = find_command(a);
    if (c >= 0)
        return commands[c].fn(argc - 1, argv + 1);
    if (a[0] == '-') {
        static const char *const top[] = {"--help", "--version"};
        const char *near = arg_closest(a, top, 2);
        if (near)
            fprintf(stderr, "mlxcel: unknown option '%s' (did you mean '%s'?)\n", a, near);
        else
            fprintf(stderr, "mlxcel: unknown option '%s' (options go after the command: mlxcel COMMAND "
                            "--help)\n", a);
        return 2;
    }
    return unknown_command(a);
}

/* Under mpirun the ranks other than 0 serve rank 0's MoE blocks (dist.h);
 * rank 0 runs the command. */
int main(int argc, char **argv)
{
    mx_err e = {0};
    if (mx_dist_init(&argc, &argv, &e)) {
        fprintf(stderr, "mlxcel: %s\n", e.msg);
        return 2;
    }
    if (mx_dist_rank() > 0)
        return mx_dist_worker();
    int rc = run(argc, argv);
    mx_dist_finalize(rc);
    return rc;
}
