/* jinja_scope.c - jinja2's static scoping rules, reduced to what changes
 * rendered output.
 *
 * jinja2 compiles each frame (the template root, a loop body, a macro, a
 * call/set/filter block body, a with block) to Python locals.  A name that
 * a frame assigns is local to the whole frame, and its starting value is:
 *   - the outer variable's value, if an enclosing frame has that name;
 *   - the context's value, if the frame reads it before assigning it, or
 *     assigns it only conditionally (inside an if);
 *   - undefined otherwise, even when the context has a value, and even
 *     for reads from nested frames that run before the assignment.
 * The evaluator looks names up dynamically through the scope chain, which
 * gives the first two cases for free.  This pass finds the third kind and
 * records them on the frame's node, so each new scope starts with those
 * names bound to undefined. */
#include "chat/jinja_int.h"

#include <string.h>

typedef struct nameset {
    const char **v;
    size_t n, cap;
} nameset;

typedef struct frame {
    struct frame *parent;
    nameset declared;   /* every name with a local reference in the frame */
    nameset undef;      /* the subset that starts undefined */
    jnode **nested;     /* frames inside, analysed after this one */
    int *nested_kind;
    size_t nnested, capn;
} frame;

static int has(const nameset *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], name))
            return 1;
    return 0;
}

static void add(jstate *st, nameset *s, const char *name)
{
    if (has(s, name))
        return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **v = ja_alloc(st, cap * sizeof *v);
        if (s->n)
            memcpy(v, s->v, s->n * sizeof *v);
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = name;
}

static int find_ref(const frame *f, const char *name)
{
    for (; f; f = f->parent)
        if (has(&f->declared, name))
            return 1;
    return 0;
}

static void load(jstate *st, frame *f, const char *name)
{
    if (!find_ref(f, name))
        add(st, &f->declared, name);
}

static void store(jstate *st, frame *f, const char *name, int conditional)
{
    if (has(&f->declared, name))
        return;
    add(st, &f->declared, name);
    if (!find_ref(f->parent, name) && !conditional)
        add(st, &f->undef, name);
}

enum { FR_FOR, FR_FORELSE, FR_MACRO, FR_BLOCK, FR_WITH };

static void nest(jstate *st, frame *f, jnode *n, int kind)
{
    if (f->nnested == f->capn) {
        size_t cap = f->capn ? f->capn * 2 : 8;
        jnode **v = ja_alloc(st, cap * sizeof *v);
        int *k = ja_alloc(st, cap * sizeof *k);
        if (f->nnested) {
            memcpy(v, f->nested, f->nnested * sizeof *v);
            memcpy(k, f->nested_kind, f->nnested * sizeof *k);
        }
        f->nested = v;
        f->nested_kind = k;
        f->capn = cap;
    }
    f->nested[f->nnested] = n;
    f->nested_kind[f->nnested++] = kind;
}

static void loads(jstate *st, frame *f, const jnode *e, int depth)
{
    if (!e || depth > JJ_MAX_DEPTH * 4)
        return;
    if (e->kind == N_NAME) {
        load(st, f, e->name);
        return;
    }
    loads(st, f, e->a, depth + 1);
    loads(st, f, e->b, depth + 1);
    loads(st, f, e->c, depth + 1);
    loads(st, f, e->d, depth + 1);
    for (size_t i = 0; i < e->nitems; i++)
        loads(st, f, e->items[i], depth + 1);
    for (size_t i = 0; i < e->nitems2; i++)
        loads(st, f, e->items2[i], depth + 1);
}

static void visit(jstate *st, frame *f, const jnode *body, int conditional)
{
    if (!body)
        return;
    for (size_t i = 0; i < body->nitems; i++) {
        jnode *n = body->items[i];
        switch (n->kind) {
        case N_OUTPUT: loads(st, f, n->a, 0); break;
        case N_IF:
            loads(st, f, n->a, 0);
            visit(st, f, n->b, 1);
            visit(st, f, n->c, 1);
            break;
        case N_FOR:
            loads(st, f, n->a, 0);
            nest(st, f, n, FR_FOR);
            if (n->c)
                nest(st, f, n, FR_FORELSE);
            break;
        case N_SET:
            loads(st, f, n->b, 0);
            if (n->a)
                load(st, f, n->a->name);
            else
                for (size_t k = 0; k < n->nnames; k++)
                    store(st, f, n->names[k], conditional);
            break;
        case N_SETBLOCK:
            store(st, f, n->names[0], conditional);
            nest(st, f, n, FR_BLOCK);
            break;
        case N_MACRO:
            store(st, f, n->name, conditional);
            nest(st, f, n, FR_MACRO);
            break;
        case N_CALLBLOCK:
            loads(st, f, n->a, 0);
            nest(st, f, n, FR_MACRO);
            break;
        case N_FILTERBLOCK:
            loads(st, f, n->c, 0);
            nest(st, f, n, FR_BLOCK);
            break;
        case N_BODY:
            for (size_t k = 0; k < n->nitems2; k++)
                loads(st, f, n->items2[k], 0);
            nest(st, f, n, FR_WITH);
            break;
        default: break;
        }
    }
}

static void analyze(jstate *st, frame *parent, jnode *owner, int kind, int depth);

/* Analyses one frame's body, then the frames nested in it (which see the
 * whole of this frame's names, as in jinja2). */
static void run_frame(jstate *st, frame *f, jnode *owner, const jnode *body, int kind,
                      int depth)
{
    visit(st, f, body, 0);
    if (kind == FR_FORELSE) {
        owner->undef2 = f->undef.v;
        owner->nundef2 = f->undef.n;
    } else {
        owner->undef = f->undef.v;
        owner->nundef = f->undef.n;
    }
    for (size_t i = 0; i < f->nnested; i++)
        analyze(st, f, f->nested[i], f->nested_kind[i], depth + 1);
}

static void analyze(jstate *st, frame *parent, jnode *n, int kind, int depth)
{
    if (depth > JJ_MAX_DEPTH)
        jfail(st, n->line, "template nested too deeply");
    frame f = {.parent = parent};
    switch (kind) {
    case FR_FOR:
        for (size_t i = 0; i < n->nnames; i++)
            add(st, &f.declared, n->names[i]);
        add(st, &f.declared, "loop");
        run_frame(st, &f, n, n->b, kind, depth);
        break;
    case FR_FORELSE: run_frame(st, &f, n, n->c, kind, depth); break;
    case FR_MACRO:
        for (size_t i = 0; i < n->nnames; i++)
            add(st, &f.declared, n->names[i]);
        add(st, &f.declared, "varargs");
        add(st, &f.declared, "kwargs");
        add(st, &f.declared, "caller");
        run_frame(st, &f, n, n->b, kind, depth);
        break;
    case FR_BLOCK: run_frame(st, &f, n, n->b, kind, depth); break;
    case FR_WITH:
        for (size_t i = 0; i < n->nnames; i++)
            add(st, &f.declared, n->names[i]);
        run_frame(st, &f, n, n, kind, depth);
        break;
    }
}

/* Flags every node with a slice below it (see eval_output / try_const). */
static int mark_slices(jnode *n, int depth)
{
    if (!n || depth > JJ_MAX_DEPTH * 4)
        return 0;
    int s = n->kind == N_SLICE;
    s |= mark_slices(n->a, depth + 1);
    s |= mark_slices(n->b, depth + 1);
    s |= mark_slices(n->c, depth + 1);
    s |= mark_slices(n->d, depth + 1);
    for (size_t i = 0; i < n->nitems; i++)
        s |= mark_slices(n->items[i], depth + 1);
    for (size_t i = 0; i < n->nitems2; i++)
        s |= mark_slices(n->items2[i], depth + 1);
    n->has_slice = s;
    return s;
}

void jj_analyze(jstate *st, jnode *root)
{
    frame f = {0};
    run_frame(st, &f, root, root, FR_BLOCK, 0);
    mark_slices(root, 0);
}
