/* repack.c - the model's quantized linears, visited in a fixed order: what
 * the weight cache (src/wcache, hooked in load.c) gives repacked forms
 * (quant.h: mx_qmat.rp) in a cache file or, with MLXCEL_REPACK=mem, in
 * anonymous memory.  The MLX views stay as they are (other readers, and
 * the kernels without a repacked path, use them). */
#include "model/model.h"

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
