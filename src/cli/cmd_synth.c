/* cmd_synth.c - `mlxcel synth` (not implemented yet). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_synth(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "mlxcel synth: not implemented yet\n");
    return 1;
}
