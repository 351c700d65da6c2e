/* jinja_eval.c - evaluates the AST: statements write into a buffer,
 * expressions produce values with Python / jinja2 semantics.
 *
 * Scoping follows jinja2: a for-loop iteration and a macro call get a fresh
 * scope (assignments inside do not leak out, nor into the next iteration);
 * if-blocks share the enclosing scope.  Undefined values render as "" and
 * are falsy, but arithmetic, attribute access or calls on them fail, as
 * with jinja2's default Undefined. */
#include "chat/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static jscope *scope_new(jrender *r, jscope *parent)
{
    jscope *s = ja_alloc(r->st, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(jrender *r, jscope *s, const char *name, jv v)
{
    jdict_set(r->st, &s->vars, jv_strn(name, strlen(name)), v);
}

/* A new frame: names it assigns unconditionally start undefined (jinja_scope.c). */
static jscope *frame_new(jrender *r, jscope *parent, const char **undef, size_t n)
{
    jscope *s = scope_new(r, parent);
    for (size_t i = 0; i < n; i++)
        scope_set(r, s, undef[i], jv_undef(undef[i]));
    return s;
}

void jj_enter_root(jrender *r, jscope *top, const jnode *root)
{
    for (size_t i = 0; i < root->nundef; i++)
        scope_set(r, top, root->undef[i], jv_undef(root->undef[i]));
}

static jv lookup(jrender *r, jscope *s, const char *name)
{
    jv v;
    for (; s; s = s->parent)
        if (jdict_get_str(&s->vars, name, &v))
            return v;
    if (r->globals && jdict_get_str(r->globals, name, &v))
        return v;
    int id = jj_global_id(name);
    if (id >= 0) {
        jv f = {JV_FUNC, {0}};
        f.u.fn = ja_alloc(r->st, sizeof *f.u.fn);
        f.u.fn->kind = JF_BUILTIN;
        f.u.fn->id = id;
        return f;
    }
    return jv_undef(name);
}

static _Noreturn void fail_undef(jrender *r, jv v, int line)
{
    jfail(r->st, line, "'%s' is undefined", v.u.s.p ? v.u.s.p : "value");
}

static void step(jrender *r, int line)
{
    if (++r->steps > JJ_MAX_STEPS)
        jfail(r->st, line, "template takes too many steps");
}

/* ------------------------------------------------------------ attributes */

jv jj_getattr(jrender *r, jv obj, const char *name, size_t nlen, int line)
{
    if (obj.t == JV_UNDEF)
        fail_undef(r, obj, line);
    int mid = jj_method_id(obj, name, nlen);
    if (mid >= 0) {
        jv f = {JV_FUNC, {0}};
        f.u.fn = ja_alloc(r->st, sizeof *f.u.fn);
        f.u.fn->kind = JF_METHOD;
        f.u.fn->id = mid;
        f.u.fn->self = obj;
        return f;
    }
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        jv v;
        if (jdict_get(obj.u.d, jv_strn(name, nlen), &v))
            return v;
    }
    return jv_undef(ja_strndup(r->st, name, nlen));
}

static int64_t norm_index(int64_t i, size_t n, int *ok)
{
    if (i < 0)
        i += (int64_t)n;
    *ok = i >= 0 && (uint64_t)i < n;
    return i;
}

jv jj_getitem(jrender *r, jv obj, jv key, int line)
{
    if (obj.t == JV_UNDEF)
        fail_undef(r, obj, line);
    if (obj.t == JV_DICT) {
        jv v;
        if (jdict_get(obj.u.d, key, &v))
            return v;
    } else if (((obj.t == JV_LIST && !obj.u.l->kind) || obj.t == JV_STR) &&
               (key.t == JV_INT || key.t == JV_BOOL)) {
        int ok;
        int64_t k = key.t == JV_INT ? key.u.i : key.u.b;
        if (obj.t == JV_LIST) {
            int64_t i = norm_index(k, obj.u.l->n, &ok);
            if (ok)
                return obj.u.l->v[i];
        } else {
            size_t len = ju_len(obj.u.s.p, obj.u.s.n);
            int64_t i = norm_index(k, len, &ok);
            if (ok) {
                size_t a = ju_offset(obj.u.s.p, obj.u.s.n, (size_t)i);
                uint32_t cp;
                size_t b = ju_next(obj.u.s.p, obj.u.s.n, a, &cp);
                return jv_strn(obj.u.s.p + a, b - a);
            }
        }
        return jv_undef("item");
    }
    if (key.t == JV_STR)
        return jj_getattr(r, obj, key.u.s.p, key.u.s.n, line);
    return jv_undef("item");
}

/* Python slice bounds. */
static void slice_bounds(jrender *r, int64_t n, jv a, jv b, jv c, int line, int64_t *start,
                         int64_t *stop, int64_t *stepv)
{
    int64_t st = 1;
    if (c.t != JV_NONE && c.t != JV_UNDEF) {
        if (c.t != JV_INT)
            jfail(r->st, line, "slice indices must be integers");
        st = c.u.i;
        if (st == 0)
            jfail(r->st, line, "slice step cannot be zero");
    }
    int64_t lo, hi;
    if (st > 0) {
        lo = 0;
        hi = n;
    } else {
        lo = -1;
        hi = n - 1;
    }
    int64_t s0 = st > 0 ? lo : hi, s1 = st > 0 ? hi : lo;
    if (a.t != JV_NONE && a.t != JV_UNDEF) {
        if (a.t != JV_INT)
            jfail(r->st, line, "slice indices must be integers");
        s0 = a.u.i;
        if (s0 < 0) {
            s0 += n;
            if (s0 < lo)
                s0 = lo;
        } else if (s0 > hi) {
            s0 = hi;
        }
    }
    if (b.t != JV_NONE && b.t != JV_UNDEF) {
        if (b.t != JV_INT)
            jfail(r->st, line, "slice indices must be integers");
        s1 = b.u.i;
        if (s1 < 0) {
            s1 += n;
            if (s1 < lo)
                s1 = lo;
        } else if (s1 > hi) {
            s1 = hi;
        }
    }
    *start = s0;
    *stop = s1;
    *stepv = st;
}

static jv do_slice(jrender *r, jv obj, jv a, jv b, jv c, int line)
{
    if (obj.t == JV_UNDEF)
        fail_undef(r, obj, line);
    if (obj.t == JV_LIST && !obj.u.l->kind) {
        int64_t s0, s1, st;
        slice_bounds(r, (int64_t)obj.u.l->n, a, b, c, line, &s0, &s1, &st);
        size_t cnt = 0;
        for (int64_t i = s0; st > 0 ? i < s1 : i > s1; i += st)
            cnt++;
        jv out = jv_list_new(r->st, cnt, obj.u.l->tuple);
        size_t k = 0;
        for (int64_t i = s0; st > 0 ? i < s1 : i > s1; i += st)
            out.u.l->v[k++] = obj.u.l->v[i];
        return out;
    }
    if (obj.t == JV_STR) {
        /* index code points */
        size_t n = ju_len(obj.u.s.p, obj.u.s.n);
        size_t *off = ja_alloc(r->st, (n + 1) * sizeof *off);
        uint32_t cp;
        size_t i = 0, k = 0;
        while (i < obj.u.s.n) {
            off[k++] = i;
            i = ju_next(obj.u.s.p, obj.u.s.n, i, &cp);
        }
        off[k] = obj.u.s.n;
        int64_t s0, s1, st;
        slice_bounds(r, (int64_t)n, a, b, c, line, &s0, &s1, &st);
        jbuf out = {0};
        for (int64_t j = s0; st > 0 ? j < s1 : j > s1; j += st)
            jb_put(r->st, &out, obj.u.s.p + off[j], off[j + 1] - off[j]);
        return jv_strn(out.p ? out.p : "", out.n);
    }
    /* jinja2 compiles slices to a plain Python subscript (an error here),
     * except where it folded literals through getitem (undefined) */
    if (r->folded)
        return jv_undef("slice");
    if (obj.t == JV_DICT)
        jfail(r->st, line, "unhashable type: 'slice'");
    jfail(r->st, line, "'%s' object is not subscriptable", jv_type_name(obj));
}

/* ------------------------------------------------------------ iteration */

jv jj_iter_list(jrender *r, jv v, int line)
{
    switch (v.t) {
    case JV_UNDEF: return jv_list_new(r->st, 0, 0);
    case JV_LIST:
        if (v.u.l->err)   /* the message already names its line */
            jfail(r->st, 0, "%s", v.u.l->err);
        if (v.u.l->kind) {   /* iterating a lazy value gives a plain list */
            jv l = jv_list_new(r->st, v.u.l->n, 0);
            if (v.u.l->n)
                memcpy(l.u.l->v, v.u.l->v, v.u.l->n * sizeof(jv));
            return l;
        }
        return v;
    case JV_DICT: {
        jv l = jv_list_new(r->st, v.u.d->n, 0);
        for (size_t i = 0; i < v.u.d->n; i++)
            l.u.l->v[i] = v.u.d->k[i];
        return l;
    }
    case JV_STR: {
        size_t n = ju_len(v.u.s.p, v.u.s.n), i = 0, k = 0;
        jv l = jv_list_new(r->st, n, 0);
        uint32_t cp;
        while (i < v.u.s.n) {
            size_t j = ju_next(v.u.s.p, v.u.s.n, i, &cp);
            l.u.l->v[k++] = jv_strn(v.u.s.p + i, j - i);
            i = j;
        }
        return l;
    }
    default:
        jfail(r->st, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ------------------------------------------------------------ operators */

static jv arith(jrender *r, int op, jv a, jv b, int line)
{
    if (a.t == JV_UNDEF)
        fail_undef(r, a, line);
    if (op == '%' && a.t == JV_STR)   /* str % Undefined formats (it acts as a mapping) */
        return jj_percent_format(r, a, b, line);
    if (b.t == JV_UNDEF)
        fail_undef(r, b, line);
    if (op == '+') {
        if (a.t == JV_STR && b.t == JV_STR) {
            size_t n = a.u.s.n + b.u.s.n;
            if (n > JJ_MAX_OUTPUT)
                jfail(r->st, line, "string too long");
            char *p = ja_alloc(r->st, n + 1);
            memcpy(p, a.u.s.p, a.u.s.n);
            memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
            return jv_strn(p, n);
        }
        if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple && !a.u.l->kind &&
            !b.u.l->kind) {
            jv l = jv_list_new(r->st, a.u.l->n + b.u.l->n, a.u.l->tuple);
            if (a.u.l->n)
                memcpy(l.u.l->v, a.u.l->v, a.u.l->n * sizeof(jv));
            if (b.u.l->n)
                memcpy(l.u.l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(jv));
            return l;
        }
    }
    int a_seq = a.t == JV_STR || (a.t == JV_LIST && !a.u.l->kind);
    int b_seq = b.t == JV_STR || (b.t == JV_LIST && !b.u.l->kind);
    int a_int = a.t == JV_INT || a.t == JV_BOOL, b_int = b.t == JV_INT || b.t == JV_BOOL;
    if (op == '*' && ((a_seq && b_int) || (b_seq && a_int))) {
        jv s = (a.t == JV_STR || a.t == JV_LIST) ? a : b;
        jv k = (a.t == JV_STR || a.t == JV_LIST) ? b : a;
        int64_t times = k.t == JV_INT ? k.u.i : k.u.b;
        if (times < 0)
            times = 0;
        if (s.t == JV_STR) {
            if (s.u.s.n && (uint64_t)times > JJ_MAX_OUTPUT / s.u.s.n)
                jfail(r->st, line, "string too long");
            jbuf out = {0};
            for (int64_t i = 0; i < times; i++)
                jb_put(r->st, &out, s.u.s.p, s.u.s.n);
            return jv_strn(out.p ? out.p : "", out.n);
        }
        if (s.u.l->n && (uint64_t)times > JJ_MAX_SEQ / s.u.l->n)
            jfail(r->st, line, "list too long");
        jv l = jv_list_new(r->st, s.u.l->n * (size_t)times, s.u.l->tuple);
        for (int64_t i = 0; i < times; i++)
            if (s.u.l->n)
                memcpy(l.u.l->v + (size_t)i * s.u.l->n, s.u.l->v, s.u.l->n * sizeof(jv));
        return l;
    }
    if (op == '%' && a.t == JV_STR)
        return jj_percent_format(r, a, b, line);
    if (!jv_is_number(a) || !jv_is_number(b)) {
        static const char *names[] = {"+", "-", "*", "/", "//", "%", "**"};
        const char *o = op == '+' ? names[0] : op == '-' ? names[1] : op == '*' ? names[2]
                      : op == '/' ? names[3] : op == 'F' ? names[4] : op == '%' ? names[5] : names[6];
        jfail(r->st, line, "unsupported operand type(s) for %s: '%s' and '%s'", o,
              jv_type_name(a), jv_type_name(b));
    }
    int ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
    int64_t x = a.t == JV_INT ? a.u.i : a.u.b, y = b.t == JV_INT ? b.u.i : b.u.b;
    double fx = jv_num(a), fy = jv_num(b);
    int64_t res;
    switch (op) {
    case '+':
        if (!ints)
            return jv_float(fx + fy);
        if (__builtin_add_overflow(x, y, &res))
            jfail(r->st, line, "integer overflow");
        return jv_int(res);
    case '-':
        if (!ints)
            return jv_float(fx - fy);
        if (__builtin_sub_overflow(x, y, &res))
            jfail(r->st, line, "integer overflow");
        return jv_int(res);
    case '*':
        if (!ints)
            return jv_float(fx * fy);
        if (__builtin_mul_overflow(x, y, &res))
            jfail(r->st, line, "integer overflow");
        return jv_int(res);
    case '/':
        if (fy == 0)
            jfail(r->st, line, "division by zero");
        return jv_float(fx / fy);
    case 'F':
    case '%':
        if (ints) {
            if (y == 0)
                jfail(r->st, line, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1)
                jfail(r->st, line, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q -= 1;
                m += y;
            }
            return op == 'F' ? jv_int(q) : jv_int(m);
        } else {
            if (fy == 0)
                jfail(r->st, line, "float division by zero");
            /* CPython's float divmod */
            double m = fmod(fx, fy), d = (fx - m) / fy;
            if (m != 0) {
                if ((fy < 0) != (m < 0)) {
                    m += fy;
                    d -= 1.0;
                }
            } else {
                m = copysign(0.0, fy);
            }
            if (op == '%')
                return jv_float(m);
            double fd;
            if (d != 0) {
                fd = floor(d);
                if (d - fd > 0.5)
                    fd += 1.0;
            } else {
                fd = copysign(0.0, fx / fy);
            }
            return jv_float(fd);
        }
    default:   /* ** */
        if (ints && y >= 0) {
            int64_t acc = 1, base = x;
            int64_t e = y;
            while (e > 0) {
                if (e & 1)
                    if (__builtin_mul_overflow(acc, base, &acc))
                        jfail(r->st, line, "integer overflow");
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base))
                    jfail(r->st, line, "integer overflow");
            }
            return jv_int(acc);
        }
        if (fx == 0 && fy < 0)
            jfail(r->st, line, "0.0 cannot be raised to a negative power");
        return jv_float(pow(fx, fy));
    }
}

static int contains(jrender *r, jv container, jv item, int line)
{
    switch (container.t) {
    case JV_UNDEF: return 0;
    case JV_STR:
        if (item.t != JV_STR)
            jfail(r->st, line, "'in <string>' requires string as left operand, not %s",
                  jv_type_name(item));
        if (item.u.s.n == 0)
            return 1;
        return memmem(container.u.s.p, container.u.s.n, item.u.s.p, item.u.s.n) != NULL;
    case JV_LIST:
        if (container.u.l->err)
            jfail(r->st, 0, "%s", container.u.l->err);
        for (size_t i = 0; i < container.u.l->n; i++)
            if (jv_equal(container.u.l->v[i], item))
                return 1;
        return 0;
    case JV_DICT:
    case JV_NS:
        if ((item.t == JV_LIST && (!item.u.l->tuple || item.u.l->kind)) || item.t == JV_DICT)
            jfail(r->st, line, "unhashable type: '%s'", jv_type_name(item));
        return jdict_get(container.u.d, item, NULL);
    default:
        jfail(r->st, line, "argument of type '%s' is not iterable", jv_type_name(container));
    }
}

static int compare_op(jrender *r, const char *op, jv a, jv b, int line)
{
    if (!strcmp(op, "=="))
        return jv_equal(a, b);
    if (!strcmp(op, "!="))
        return !jv_equal(a, b);
    if (!strcmp(op, "in"))
        return contains(r, b, a, line);
    if (!strcmp(op, "notin"))
        return !contains(r, b, a, line);
    int c = jv_compare(r->st, a, b, line);
    if (!strcmp(op, "<"))
        return c < 0;
    if (!strcmp(op, "<="))
        return c <= 0;
    if (!strcmp(op, ">"))
        return c > 0;
    return c >= 0;
}

/* ------------------------------------------------------------ calls */

static void eval_args(jrender *r, jscope *sc, const jnode *n, jv **args, jv **kwv)
{
    *args = n->nitems ? ja_alloc(r->st, n->nitems * sizeof(jv)) : NULL;
    *kwv = n->nitems2 ? ja_alloc(r->st, n->nitems2 * sizeof(jv)) : NULL;
    for (size_t i = 0; i < n->nitems; i++)
        (*args)[i] = jj_eval(r, sc, n->items[i]);
    for (size_t i = 0; i < n->nitems2; i++)
        (*kwv)[i] = jj_eval(r, sc, n->items2[i]);
}

static jv call_macro(jrender *r, jfunc *f, jv *args, size_t nargs, const char **kwn, jv *kwv,
                     size_t nkw, int line)
{
    const jnode *m = f->macro;
    if (++r->depth > JJ_MAX_DEPTH)
        jfail(r->st, line, "maximum recursion depth exceeded");
    jscope *sc = frame_new(r, f->closure, m->undef, m->nundef);
    size_t np = m->nnames;
    uint8_t *bound = np ? ja_alloc(r->st, np) : NULL;
    jv extra = jv_list_new(r->st, nargs > np ? nargs - np : 0, 1);
    for (size_t i = 0; i < nargs; i++) {
        if (i < np) {
            scope_set(r, sc, m->names[i], args[i]);
            bound[i] = 1;
        } else {
            extra.u.l->v[i - np] = args[i];
        }
    }
    jv kwextra = jv_dict_new(r->st);
    jv callerv = jv_undef("caller");
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (!strcmp(m->names[i], kwn[k]))
                break;
        if (i < np) {
            if (bound[i])
                jfail(r->st, line, "macro '%s' got multiple values for argument '%s'",
                      m->name ? m->name : "caller", kwn[k]);
            scope_set(r, sc, m->names[i], kwv[k]);
            bound[i] = 1;
        } else if (!strcmp(kwn[k], "caller")) {
            callerv = kwv[k];
        } else {
            jdict_set(r->st, kwextra.u.d, jv_strn(kwn[k], strlen(kwn[k])), kwv[k]);
        }
    }
    for (size_t i = 0; i < np; i++)
        if (!bound[i])
            scope_set(r, sc, m->names[i],
                      m->items2 && m->items2[i] ? jj_eval(r, sc, m->items2[i])
                                                : jv_undef(m->names[i]));
    scope_set(r, sc, "varargs", extra);
    scope_set(r, sc, "kwargs", kwextra);
    if (callerv.t != JV_UNDEF)
        scope_set(r, sc, "caller", callerv);
    jbuf out = {0};
    int saved = r->loop_ctl;
    jj_exec(r, sc, m->b, &out);
    r->loop_ctl = saved;
    r->depth--;
    return jv_strn(out.p ? out.p : "", out.n);
}

jv jj_call(jrender *r, jv fn, jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw,
           int line)
{
    if (fn.t == JV_UNDEF)
        fail_undef(r, fn, line);
    if (fn.t != JV_FUNC)
        jfail(r->st, line, "'%s' object is not callable", jv_type_name(fn));
    jfunc *f = fn.u.fn;
    switch (f->kind) {
    case JF_BUILTIN: return jj_call_global(r, f->id, args, nargs, kwn, kwv, nkw, line);
    case JF_METHOD: return jj_call_method(r, f, args, nargs, kwn, kwv, nkw, line);
    case JF_CYCLE:
        if (!nargs)
            jfail(r->st, line, "no items for cycling given");
        return args[(size_t)f->self.u.i % nargs];
    default: return call_macro(r, f, args, nargs, kwn, kwv, nkw, line);
    }
}

/* ------------------------------------------------------------ expressions */

/* Python's has_safe_repr: what jinja2 accepts as a folded constant. */
static int safe_repr(jv v, int depth)
{
    if (depth > 64)
        return 0;
    switch (v.t) {
    case JV_NONE: case JV_BOOL: case JV_INT: case JV_FLOAT: case JV_STR: return 1;
    case JV_LIST:
        if (v.u.l->kind)
            return 0;
        for (size_t i = 0; i < v.u.l->n; i++)
            if (!safe_repr(v.u.l->v[i], depth + 1))
                return 0;
        return 1;
    case JV_DICT:
        for (size_t i = 0; i < v.u.d->n; i++)
            if (!safe_repr(v.u.d->k[i], depth + 1) || !safe_repr(v.u.d->v[i], depth + 1))
                return 0;
        return 1;
    default: return 0;
    }
}

/* jinja2's optimiser replaces every sub-expression whose value it can
 * compute from literals alone (short-circuits included) by that value,
 * when the value has a safe repr; a whole {{ }} is computed the same way
 * even when the value is undefined.  The compile-time evaluation differs
 * from the run-time one in a single respect that matters: a failed slice
 * is undefined there, an error here.  So where a slice is involved, the
 * constant evaluation is tried first (r->folded: names and calls abort). */
static int try_const(jrender *r, jscope *sc, const jnode *n, int need_safe, jv *out)
{
    jstate *st = r->st;
    jmp_buf saved;
    memcpy(saved, st->jb, sizeof(jmp_buf));
    int depth = r->depth;
    if (setjmp(st->jb) == 0) {
        r->folded = 1;
        jv v = jj_eval(r, sc, n);
        r->folded = 0;
        memcpy(st->jb, saved, sizeof(jmp_buf));
        if (need_safe && !safe_repr(v, 0))
            return 0;
        *out = v;
        return 1;
    }
    memcpy(st->jb, saved, sizeof(jmp_buf));
    r->folded = 0;
    r->depth = depth;
    return 0;
}

jv jj_eval(jrender *r, jscope *sc, const jnode *n)
{
    if (n->has_slice && !r->folded && n->kind != N_SLICE) {
        jv c;
        if (try_const(r, sc, n, 1, &c))
            return c;
    }
    step(r, n->line);
    if (++r->depth > JJ_MAX_DEPTH)
        jfail(r->st, n->line, "maximum recursion depth exceeded");
    jv v;
    switch (n->kind) {
    case N_LIT: v = n->lit; break;
    case N_NAME:
        if (r->folded)
            jfail(r->st, n->line, "not constant");
        v = lookup(r, sc, n->name);
        break;
    case N_ATTR:
        v = jj_getattr(r, jj_eval(r, sc, n->a), n->name, strlen(n->name), n->line);
        break;
    case N_ITEM: {
        jv obj = jj_eval(r, sc, n->a);
        v = jj_getitem(r, obj, jj_eval(r, sc, n->b), n->line);
        break;
    }
    case N_SLICE: {
        jv obj = jj_eval(r, sc, n->a);
        jv a = n->b ? jj_eval(r, sc, n->b) : jv_none();
        jv b = n->c ? jj_eval(r, sc, n->c) : jv_none();
        jv c = n->d ? jj_eval(r, sc, n->d) : jv_none();
        v = do_slice(r, obj, a, b, c, n->line);
        break;
    }
    case N_CALL: {
        if (r->folded)
            jfail(r->st, n->line, "not constant");
        jv fn = jj_eval(r, sc, n->a);
        jv *args, *kwv;
        eval_args(r, sc, n, &args, &kwv);
        v = jj_call(r, fn, args, n->nitems, n->names, kwv, n->nitems2, n->line);
        break;
    }
    case N_FILTER: {
        if (r->folded && (!strcmp(n->name, "map") || !strncmp(n->name, "select", 6) ||
                          !strncmp(n->name, "reject", 6)))   /* context filters */
            jfail(r->st, n->line, "not constant");
        jv x = n->a ? jj_eval(r, sc, n->a) : jv_undef("value");
        jv *args, *kwv;
        eval_args(r, sc, n, &args, &kwv);
        v = jj_filter(r, n->name, x, args, n->nitems, n->names, kwv, n->nitems2, n->line);
        break;
    }
    case N_TEST: {
        jv x = jj_eval(r, sc, n->a);
        jv *args, *kwv;
        eval_args(r, sc, n, &args, &kwv);
        v = jv_bool(jj_test(r, n->name, x, args, n->nitems, n->line));
        break;
    }
    case N_BINOP: {
        jv a = jj_eval(r, sc, n->a);
        v = arith(r, n->op, a, jj_eval(r, sc, n->b), n->line);
        break;
    }
    case N_CONCAT: {
        jbuf b = {0};
        for (size_t i = 0; i < n->nitems; i++)
            jv_to_str(r->st, &b, jj_eval(r, sc, n->items[i]));
        v = jv_strn(b.p ? b.p : "", b.n);
        break;
    }
    case N_NEG:
    case N_POS: {
        jv a = jj_eval(r, sc, n->a);
        if (a.t == JV_UNDEF)
            fail_undef(r, a, n->line);
        if (!jv_is_number(a))
            jfail(r->st, n->line, "bad operand type for unary %c: '%s'",
                  n->kind == N_NEG ? '-' : '+', jv_type_name(a));
        if (n->kind == N_POS)
            v = a.t == JV_BOOL ? jv_int(a.u.b) : a;
        else if (a.t == JV_FLOAT)
            v = jv_float(-a.u.f);
        else {
            int64_t x = a.t == JV_INT ? a.u.i : a.u.b;
            if (x == INT64_MIN)
                jfail(r->st, n->line, "integer overflow");
            v = jv_int(-x);
        }
        break;
    }
    case N_NOT: v = jv_bool(!jv_truthy(jj_eval(r, sc, n->a))); break;
    case N_AND: {
        jv a = jj_eval(r, sc, n->a);
        v = jv_truthy(a) ? jj_eval(r, sc, n->b) : a;
        break;
    }
    case N_OR: {
        jv a = jj_eval(r, sc, n->a);
        v = jv_truthy(a) ? a : jj_eval(r, sc, n->b);
        break;
    }
    case N_COND:
        if (jv_truthy(jj_eval(r, sc, n->a)))
            v = jj_eval(r, sc, n->b);
        else
            v = n->c ? jj_eval(r, sc, n->c) : jv_undef("conditional");
        break;
    case N_COMPARE: {
        jv a = jj_eval(r, sc, n->a);
        v = jv_bool(1);
        for (size_t i = 0; i < n->nitems; i++) {
            jv b = jj_eval(r, sc, n->items[i]);
            if (!compare_op(r, n->names[i], a, b, n->line)) {
                v = jv_bool(0);
                break;
            }
            a = b;
        }
        break;
    }
    case N_LISTLIT:
    case N_TUPLELIT: {
        v = jv_list_new(r->st, n->nitems, n->kind == N_TUPLELIT);
        for (size_t i = 0; i < n->nitems; i++)
            v.u.l->v[i] = jj_eval(r, sc, n->items[i]);
        break;
    }
    case N_DICTLIT: {
        v = jv_dict_new(r->st);
        for (size_t i = 0; i < n->nitems; i++) {
            jv k = jj_eval(r, sc, n->items[i]);
            if (k.t == JV_LIST && !k.u.l->tuple)
                jfail(r->st, n->line, "unhashable type: 'list'");
            if (k.t == JV_DICT)
                jfail(r->st, n->line, "unhashable type: 'dict'");
            jdict_set(r->st, v.u.d, k, jj_eval(r, sc, n->items2[i]));
        }
        break;
    }
    default:
        jfail(r->st, n->line, "internal error: not an expression");
    }
    r->depth--;
    return v;
}

/* ------------------------------------------------------------ statements */

static void bind_targets(jrender *r, jscope *sc, const jnode *n, jv item)
{
    if (!n->op) {
        scope_set(r, sc, n->names[0], item);
        return;
    }
    jv l = item.t == JV_LIST ? item : jj_iter_list(r, item, n->line);
    if (l.u.l->n != n->nnames)
        jfail(r->st, n->line, "cannot unpack %zu values into %zu names", l.u.l->n, n->nnames);
    for (size_t i = 0; i < n->nnames; i++)
        scope_set(r, sc, n->names[i], l.u.l->v[i]);
}

static jv loop_object(jrender *r, size_t i, size_t len, jv items)
{
    jv d = jv_dict_new(r->st);
    jdict *x = d.u.d;
#define LSET(k, v) jdict_set(r->st, x, jv_strn(k, sizeof k - 1), v)
    LSET("index", jv_int((int64_t)i + 1));
    LSET("index0", jv_int((int64_t)i));
    LSET("revindex", jv_int((int64_t)(len - i)));
    LSET("revindex0", jv_int((int64_t)(len - i - 1)));
    LSET("first", jv_bool(i == 0));
    LSET("last", jv_bool(i + 1 == len));
    LSET("length", jv_int((int64_t)len));
    LSET("depth", jv_int(1));
    LSET("depth0", jv_int(0));
    if (i > 0)
        LSET("previtem", items.u.l->v[i - 1]);
    if (i + 1 < len)
        LSET("nextitem", items.u.l->v[i + 1]);
    jv cyc = {JV_FUNC, {0}};
    cyc.u.fn = ja_alloc(r->st, sizeof *cyc.u.fn);
    cyc.u.fn->kind = JF_CYCLE;
    cyc.u.fn->self = jv_int((int64_t)i);
    LSET("cycle", cyc);
#undef LSET
    return d;
}

static void exec_for(jrender *r, jscope *sc, const jnode *n, jbuf *out)
{
    jv items = jj_iter_list(r, jj_eval(r, sc, n->a), n->line);
    if (n->d) {   /* `for x in y if cond`: filter first, so loop.length counts survivors */
        jv kept = jv_list_new(r->st, items.u.l->n, 0);
        size_t k = 0;
        for (size_t i = 0; i < items.u.l->n; i++) {
            jscope *fs = scope_new(r, sc);
            bind_targets(r, fs, n, items.u.l->v[i]);
            if (jv_truthy(jj_eval(r, fs, n->d)))
                kept.u.l->v[k++] = items.u.l->v[i];
        }
        kept.u.l->n = k;
        items = kept;
    }
    size_t len = items.u.l->n;
    for (size_t i = 0; i < len; i++) {
        step(r, n->line);
        jscope *it = frame_new(r, sc, n->undef, n->nundef);
        bind_targets(r, it, n, items.u.l->v[i]);
        scope_set(r, it, "loop", loop_object(r, i, len, items));
        jj_exec(r, it, n->b, out);
        if (r->loop_ctl == 1) {
            r->loop_ctl = 0;
            break;
        }
        r->loop_ctl = 0;
    }
    if (len == 0 && n->c)
        jj_exec(r, frame_new(r, sc, n->undef2, n->nundef2), n->c, out);
}

static jv apply_filter_chain(jrender *r, jscope *sc, const jnode *f, jv v)
{
    if (!f)
        return v;
    v = apply_filter_chain(r, sc, f->a, v);
    jv *args, *kwv;
    eval_args(r, sc, f, &args, &kwv);
    return jj_filter(r, f->name, v, args, f->nitems, f->names, kwv, f->nitems2, f->line);
}

static jv eval_output(jrender *r, jscope *sc, const jnode *e)
{
    jv v;
    if (e->has_slice && try_const(r, sc, e, 0, &v))
        return v;
    return jj_eval(r, sc, e);
}

static void exec_stmt(jrender *r, jscope *sc, const jnode *n, jbuf *out)
{
    step(r, n->line);
    switch (n->kind) {
    case N_TEXT: jb_put(r->st, out, n->lit.u.s.p, n->lit.u.s.n); return;
    case N_OUTPUT: jv_to_str(r->st, out, eval_output(r, sc, n->a)); return;
    case N_IF:
        if (jv_truthy(jj_eval(r, sc, n->a)))
            jj_exec(r, sc, n->b, out);
        else if (n->c)
            jj_exec(r, sc, n->c, out);
        return;
    case N_FOR: exec_for(r, sc, n, out); return;
    case N_SET: {
        jv v = jj_eval(r, sc, n->b);
        if (n->a) {   /* ns.attr = v */
            jv ns = jj_eval(r, sc, n->a);
            if (ns.t != JV_NS)
                jfail(r->st, n->line, "cannot assign attribute on non-namespace object");
            jdict_set(r->st, ns.u.d, jv_strn(n->name, strlen(n->name)), v);
        } else {
            bind_targets(r, sc, n, v);
        }
        return;
    }
    case N_SETBLOCK: {
        jbuf b = {0};
        jj_exec(r, frame_new(r, sc, n->undef, n->nundef), n->b, &b);
        jv v = jv_strn(b.p ? b.p : "", b.n);
        scope_set(r, sc, n->names[0], apply_filter_chain(r, sc, n->c, v));
        return;
    }
    case N_MACRO: {
        jv f = {JV_FUNC, {0}};
        f.u.fn = ja_alloc(r->st, sizeof *f.u.fn);
        f.u.fn->kind = JF_MACRO;
        f.u.fn->macro = n;
        f.u.fn->closure = sc;
        scope_set(r, sc, n->name, f);
        return;
    }
    case N_CALLBLOCK: {
        /* the body becomes a macro named caller, passed to the call */
        jv caller = {JV_FUNC, {0}};
        caller.u.fn = ja_alloc(r->st, sizeof *caller.u.fn);
        caller.u.fn->kind = JF_MACRO;
        caller.u.fn->macro = n;
        caller.u.fn->closure = sc;
        const jnode *call = n->a;
        jv fn = jj_eval(r, sc, call->a);
        jv *args, *kwv;
        eval_args(r, sc, call, &args, &kwv);
        size_t nkw = call->nitems2 + 1;
        const char **kwn = ja_alloc(r->st, nkw * sizeof *kwn);
        jv *kv = ja_alloc(r->st, nkw * sizeof *kv);
        for (size_t i = 0; i < call->nitems2; i++) {
            kwn[i] = call->names[i];
            kv[i] = kwv[i];
        }
        kwn[nkw - 1] = "caller";
        kv[nkw - 1] = caller;
        jv_to_str(r->st, out, jj_call(r, fn, args, call->nitems, kwn, kv, nkw, n->line));
        return;
    }
    case N_BREAK: r->loop_ctl = 1; return;
    case N_CONTINUE: r->loop_ctl = 2; return;
    case N_FILTERBLOCK: {
        jbuf b = {0};
        jj_exec(r, frame_new(r, sc, n->undef, n->nundef), n->b, &b);
        jv v = apply_filter_chain(r, sc, n->c, jv_strn(b.p ? b.p : "", b.n));
        jv_to_str(r->st, out, v);
        return;
    }
    case N_BODY: {
        jscope *inner = sc;
        if (n->op) {   /* {% with %} (1) and {% generation %} (2) are frames */
            inner = frame_new(r, sc, n->undef, n->nundef);
            for (size_t i = 0; i < n->nnames; i++)
                scope_set(r, inner, n->names[i], jj_eval(r, sc, n->items2[i]));
        }
        jj_exec(r, inner, n, out);
        return;
    }
    default:
        jfail(r->st, n->line, "internal error: not a statement");
    }
}

void jj_exec(jrender *r, jscope *sc, const jnode *body, jbuf *out)
{
    if (++r->depth > JJ_MAX_DEPTH)
        jfail(r->st, body->line, "maximum recursion depth exceeded");
    for (size_t i = 0; i < body->nitems && !r->loop_ctl; i++)
        exec_stmt(r, sc, body->items[i], out);
    r->depth--;
}
