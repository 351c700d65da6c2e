/* bench_attend.c - one head of decode attention (mx_attend_head) at a given
 * context length: microseconds per head and what that is per token for a
 * model of L layers and H heads on N threads.
 *
 * usage: bench_attend [positions [head_dim [reps [heads]]]]   (default 1024 128 2000 1)
 * With heads > 1 every call reads the next head's cache, heads * positions *
 * head_dim * 8 bytes in all: beyond the caches it measures attention from
 * memory, as in decode (16 kv heads x 24 layers at 1024 positions: 400 MB). */
#include <stdio.h>
#include <stdlib.h>

#include "model/ops.h"
#include "util/err.h"
#include "util/clock.h"

int main(int argc, char **argv)
{
    int pos = argc > 1 ? atoi(argv[1]) : 1024, hd = argc > 2 ? atoi(argv[2]) : 128;
    int reps = argc > 3 ? atoi(argv[3]) : 2000, heads = argc > 4 ? atoi(argv[4]) : 1;
    if (pos < 0 || hd < 2 || hd % 2 || reps < 1 || heads < 1) {
        fprintf(stderr, "usage: bench_attend [positions [head_dim [reps [heads]]]]\n");
        return 2;
    }
    const size_t per = (size_t)(pos + 1) * (size_t)hd;   /* one head's cache */
    size_t n = per * (size_t)heads;
    float *K = malloc(n * sizeof *K), *V = malloc(n * sizeof *V), *q = malloc(hd * sizeof *q),
          *out = malloc(hd * sizeof *out), *sc = malloc((size_t)(pos + 1) * sizeof *sc);
    if (!K || !V || !q || !out || !sc)
        return 1;
    for (size_t i = 0; i < n; i++) {
        K[i] = (float)(i % 97) * 0.01f - 0.5f;
        V[i] = (float)(i % 89) * 0.01f - 0.4f;
    }
    for (int i = 0; i < hd; i++)
        q[i] = (float)(i % 13) * 0.1f;
    mx_attend_head(q, K, V, 0, pos, hd, 0.088f, sc, out);   /* warm-up */
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = mx_now();
        for (int i = 0; i < reps; i++) {
            const size_t h = (size_t)(i % heads) * per;
            mx_attend_head(q, K + h, V + h, 0, pos, hd, 0.088f, sc, out);
        }
        double t = (mx_now() - t0) / reps;
        if (t < best)
            best = t;
    }
    printf("attend_head: %d positions, head_dim %d, %d head caches (%.0f MB): %.2f us per head "
           "(best of 5); 16 heads x 24 layers on 2 threads: %.2f ms per token\n",
           pos + 1, hd, heads, 2.0 * n * sizeof(float) / 1e6, best * 1e6, best * 16 * 24 / 2 * 1e3);
    free(K), free(V), free(q), free(out), free(sc);
    return 0;
}
