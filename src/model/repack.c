/* repack.c - the repacked copy of a model's 4-bit matrices (quant.h:
 * mx_qmat.rp), made in anonymous memory at load when MLXCEL_REPACK=mem.
 * The MLX views stay as they are (other readers, and the kernels without a
 * repacked path, use them); rp is an extra copy: about the weights' size
 * again in RAM beside the page cache. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/parallel.h"
#include "util/clock.h"
#include "util/scratch.h"

static void visit(mx_linear *l, void (*fn)(mx_linear *, void *), void *ctx)
{
    if (l->quantized && l->q.w)
        fn(l, ctx);
}

static void visit_mlp(mx_mlp *p, void (*fn)(mx_linear *, void *), void *ctx)
{
    visit(&p->gate, fn, ctx);
    visit(&p->up, fn, ctx);
    visit(&p->down, fn, ctx);
}

void mx_model_each_qlinear(mx_model *m, void (*fn)(mx_linear *l, void *ctx), void *ctx)
{
    for (int i = 0; m->layers && i < m->n_layers; i++) {
        mx_layer *L = &m->layers[i];
        mx_linear *mix[] = {&L->attn.q, &L->attn.k, &L->attn.v, &L->attn.o, &L->dn.qkvz,
                            &L->dn.ba, &L->dn.out, &L->sc.in, &L->sc.out};
        for (size_t j = 0; j < sizeof mix / sizeof mix[0]; j++)
            visit(mix[j], fn, ctx);
        visit_mlp(&L->mlp, fn, ctx);
        if (!L->is_moe)
            continue;
        mx_moe_block *b = &L->moe;
        visit(&b->router, fn, ctx);
        visit_mlp(&b->shared, fn, ctx);
        visit(&b->shared_gate, fn, ctx);
        for (int x = 0; x < b->experts.n; x++) {
            if (b->bound && !b->bound[x])
                continue;
            visit(&b->experts.gate[x], fn, ctx);
            visit(&b->experts.up[x], fn, ctx);
            visit(&b->experts.down[x], fn, ctx);
        }
    }
    visit(&m->lm_head, fn, ctx);   /* the embedding itself is read a row at a time */
}

typedef struct collect {
    mx_qmat **q;
    size_t n, bytes;
} collect;

static void count_one(mx_linear *l, void *ctx)
{
    collect *c = ctx;
    size_t b = mx_qmat_repack_bytes(&l->q);
    if (!b)
        return;
    if (c->q)
        c->q[c->n] = &l->q;
    c->n++;
    c->bytes += mx_align64(b);
}

int mx_model_repack_mem(mx_model *m, mx_err *e)
{
    collect c = {0};
    mx_model_each_qlinear(m, count_one, &c);
    if (!c.n)
        return MX_OK;
    c.q = malloc(c.n * sizeof *c.q);
    void **owned = realloc(m->owned, sizeof *owned * (size_t)(m->n_owned + 1));
    if (owned) {
        m->owned = owned;
        m->cap_owned = m->n_owned + 1;
    }
    uint8_t *buf = c.q && owned ? aligned_alloc(64, c.bytes) : NULL;
    if (!buf) {
        free(c.q);
        return mx_fail(e, MX_ENOMEM, "MLXCEL_REPACK=mem: out of memory for %.2f GB of repacked weights",
                       (double)c.bytes / 1e9);
    }
    m->owned[m->n_owned++] = buf;
    c.n = c.bytes = 0;
    mx_model_each_qlinear(m, count_one, &c);
    size_t *off = malloc(c.n * sizeof *off);
    if (!off) {
        free(c.q);
        return mx_fail(e, MX_ENOMEM, "out of memory");
    }
    for (size_t i = 0, o = 0; i < c.n; o += mx_align64(mx_qmat_repack_bytes(c.q[i])), i++)
        off[i] = o;
    double t0 = mx_now();
#pragma omp parallel for schedule(dynamic, 1) num_threads(mx_threads())
    for (long i = 0; i < (long)c.n; i++) {
        mx_qmat_repack(c.q[i], buf + off[i]);
        c.q[i]->rp = buf + off[i];
    }
    fprintf(stderr, "mlxcel: repacked %zu matrices (%.2f GB) in memory in %.1f s\n", c.n,
            (double)c.bytes / 1e9, mx_now() - t0);
    free(off);
    free(c.q);
    return MX_OK;
}
