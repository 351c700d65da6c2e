/* options.c - the command-line options of expert parallelism, taken out of
 * argv before a command parses it, so every command takes them. */
#include <string.h>

#include "dist/dist_int.h"

int mx_dist_take_options(int *argc, char **argv, const char **map, mx_err *e)
{
    int n = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--expert-map")) {
            if (i + 1 >= *argc)
                return mx_fail(e, MX_EINVAL, "--expert-map needs a FILE");
            *map = argv[++i];
        } else if (!strncmp(a, "--expert-map=", 13)) {
            *map = a + 13;
        } else {
            argv[n++] = argv[i];
        }
    }
    argv[n] = NULL;
    *argc = n;
    return MX_OK;
}
