/* replay_main.c - runs a fuzz target's entry point over files, without
 * libFuzzer: the ordinary builds (gcc, clang, ASan/UBSan) compile every
 * target with this main, and ctest replays fuzz/regress/<target>/, the
 * inputs that once crashed or hung it (CMakeLists.txt).
 *
 *   replay_<target> FILE|DIR...      exit 0 when every input ran */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/clock.h"
#include "util/file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* optional, as with libFuzzer */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path)
{
    char *buf = NULL;
    size_t len = 0;
    mx_err e;
    if (mx_read_file(path, &buf, &len, &e)) {
        fprintf(stderr, "replay: %s\n", e.msg);
        return 1;
    }
    /* an exact-size copy, as libFuzzer hands inputs over */
    uint8_t *data = malloc(len ? len : 1);
    if (!data) {
        free(buf);
        return 1;
    }
    memcpy(data, buf, len);
    free(buf);
    double t0 = mx_now();
    LLVMFuzzerTestOneInput(data, len);
    fprintf(stderr, "replay: %s (%zu bytes) ok in %.3f s\n", path, len, mx_now() - t0);
    free(data);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    int bad = 0, n = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: not found\n", argv[i]);
            bad++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad += run_file(argv[i]);
            n++;
            continue;
        }
        struct dirent **names;
        int k = scandir(argv[i], &names, NULL, by_name);
        for (int j = 0; j < k; j++) {
            if (names[j]->d_name[0] != '.') {
                char p[4096];
                snprintf(p, sizeof p, "%s/%s", argv[i], names[j]->d_name);
                bad += run_file(p);
                n++;
            }
            free(names[j]);
        }
        free(k >= 0 ? names : NULL);
    }
    printf("%d passed, %d failed\n", n - bad, bad);
    return bad ? 1 : 0;
}
