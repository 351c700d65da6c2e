/* cmd_chat.c - `mlxcel chat` (not implemented yet). */
#include <stdio.h>

#include "cli/commands.h"

int cmd_chat(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "mlxcel chat: not implemented yet\n");
    return 1;
}
