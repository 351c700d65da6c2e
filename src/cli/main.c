/* main.c - the mlxcel executable: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"generate", cmd_generate, "generate text or token ids from a prompt"},
    {"chat", cmd_chat, "interactive chat through the model's chat template"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
    {"bench", cmd_bench, "measure prefill and decode speed"},
    {"inspect", cmd_inspect, "summarise a checkpoint (shapes, quantization, memory)"},
    {"synth", cmd_synth, "write a synthetic MLX checkpoint with random weights"},
    {"tokenize", cmd_tokenize, "text to token ids"},
    {"detokenize", cmd_detokenize, "token ids to text"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mlxcel COMMAND [options]   (mlxcel COMMAND --help for details)\n\n"
               "Runs MLX-format quantized language models (mixture-of-experts first) on the CPU.\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nenvironment:\n"
               "  MLXCEL_THREADS=N            worker threads (default: all CPUs)\n"
               "  MLXCEL_FUSED_MOE=0          disable the fused single-token MoE kernel\n"
               "  MLXCEL_FUSED_MOE_MAX_DFF=N  largest expert width the fused kernel takes\n"
               "  MLXCEL_KERNEL=NAME          force a kernel variant (scalar, avx2, avx512)\n"
               "  MLXCEL_TRACE_MOE=1          print MoE dispatch counts on stderr\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "mlxcel: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
