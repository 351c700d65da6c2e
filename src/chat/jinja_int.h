/* jinja_int.h - internals of the Jinja subset shared by the lexer/parser,
 * the evaluator and the builtins.  Not a public header.
 *
 * Memory: everything of one render (tokens, AST, values) lives in one arena
 * that is dropped at the end, so values are plain structs that can be
 * copied and shared freely (they are immutable except namespaces).
 * Errors: any failure longjmps to the render entry point with a message;
 * the arena makes that leak-free. */
#ifndef MX_JINJA_INT_H
#define MX_JINJA_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

/* Limits that keep a hostile template from hanging or exhausting memory. */
#define JJ_MAX_DEPTH 256                  /* nested expressions / calls */
#define JJ_MAX_OUTPUT (64u << 20)         /* rendered bytes */
#define JJ_MAX_ARENA (512u << 20)         /* arena bytes */
#define JJ_MAX_STEPS 50000000ULL          /* evaluation steps */
#define JJ_MAX_SEQ 10000000u              /* elements of one list/range */

/* ---- arena ---- */
typedef struct jchunk {
    struct jchunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} jchunk;

typedef struct jstate {
    jchunk *chunks;
    size_t total;
    jmp_buf jb;
    char err[480];
} jstate;

void *ja_alloc(jstate *st, size_t n);                  /* zeroed */
char *ja_strndup(jstate *st, const char *s, size_t n); /* NUL-terminated */
void ja_free_all(jstate *st);
_Noreturn void jfail(jstate *st, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- values ---- */
enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR,
    JV_LIST, JV_DICT, JV_NS, JV_FUNC,
};

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;

typedef struct jv {
    int t;
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;   /* UTF-8, also JV_UNDEF's name */
        jlist *l;
        jdict *d;                                /* JV_DICT and JV_NS */
        jfunc *fn;
    } u;
} jv;

/* Lists also stand for Python's lazy results: generators (select, map,
 * unique, the items filter, reversed lists) are always truthy, have no
 * len() and fail only when iterated (err); dict views print as
 * dict_items([...]) and are not JSON serialisable. */
enum { JL_LIST, JL_GEN, JL_ITEMS, JL_KEYS, JL_VALUES };
struct jlist {
    size_t n;
    jv *v;
    int tuple;
    int kind;
    const char *err;   /* JL_GEN: the error its iteration raises */
};

struct jdict {
    size_t n, cap;
    jv *k, *v;
};

struct jnode;
struct jscope;

/* Callable values: builtins (globals and bound methods), macros, caller. */
enum { JF_BUILTIN, JF_METHOD, JF_MACRO, JF_CYCLE };
struct jfunc {
    int kind;
    int id;                       /* builtin / method id */
    jv self;                      /* receiver of a method; items of loop.cycle */
    const struct jnode *macro;    /* JF_MACRO */
    struct jscope *closure;       /* scope the macro was defined in */
    const struct jnode *caller;   /* {% call %} body bound as `caller` */
    struct jscope *caller_scope;
};

static inline jv jv_undef(const char *name)
{
    jv v = {JV_UNDEF, {0}};
    v.u.s.p = name;
    return v;
}
static inline jv jv_none(void) { jv v = {JV_NONE, {0}}; return v; }
static inline jv jv_bool(int b) { jv v = {JV_BOOL, {0}}; v.u.b = !!b; return v; }
static inline jv jv_int(int64_t i) { jv v = {JV_INT, {0}}; v.u.i = i; return v; }
static inline jv jv_float(double f) { jv v = {JV_FLOAT, {0}}; v.u.f = f; return v; }
static inline jv jv_strn(const char *p, size_t n)
{
    jv v = {JV_STR, {0}};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

jv jv_str_copy(jstate *st, const char *p, size_t n);
jv jv_list_new(jstate *st, size_t n, int tuple);   /* n items, all undefined */
jv jv_dict_new(jstate *st);
void jdict_set(jstate *st, jdict *d, jv key, jv val);
int jdict_get(const jdict *d, jv key, jv *out);     /* 1 if found */
int jdict_get_str(const jdict *d, const char *key, jv *out);
jv jv_from_cjson(jstate *st, const void *cjson);

/* ---- growable byte buffer (in the arena; output buffers use limits) ---- */
typedef struct jbuf {
    char *p;
    size_t n, cap;
    size_t limit;   /* 0: JJ_MAX_OUTPUT */
} jbuf;
void jb_put(jstate *st, jbuf *b, const char *s, size_t n);
void jb_puts(jstate *st, jbuf *b, const char *s);
void jb_putc(jstate *st, jbuf *b, char c);

/* ---- conversions (Python semantics) ---- */
int jv_truthy(jv v);
const char *jv_type_name(jv v);
void jv_to_str(jstate *st, jbuf *b, jv v);        /* str(v) */
void jv_repr(jstate *st, jbuf *b, jv v);          /* repr(v) */
jv jv_stringify(jstate *st, jv v);                /* str(v) as a value */
void jv_float_repr(char *out, size_t cap, double f);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) */
void jv_to_json(jstate *st, jbuf *b, jv v, const char *indent, int depth,
                const char *item_sep, const char *key_sep, int sort_keys, int line);
int jv_equal(jv a, jv b);
int jv_compare(jstate *st, jv a, jv b, int line);  /* <0, 0, >0; error if unordered */
int jv_is_number(jv v);
double jv_num(jv v);

/* UTF-8 helpers: code points of valid UTF-8; stray bytes count as one. */
size_t ju_next(const char *s, size_t n, size_t i, uint32_t *cp);
size_t ju_len(const char *s, size_t n);
size_t ju_offset(const char *s, size_t n, size_t idx);   /* byte offset of the idx'th code point */
void ju_put(jstate *st, jbuf *b, uint32_t cp);
int ju_isspace(uint32_t cp);

/* ---- AST ---- */
enum {
    /* statements */
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK,
    N_BREAK, N_CONTINUE, N_FILTERBLOCK, N_BODY,
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_BINOP, N_NEG, N_POS, N_NOT, N_AND, N_OR, N_COND, N_COMPARE,
    N_LISTLIT, N_TUPLELIT, N_DICTLIT, N_CONCAT,
};

typedef struct jnode {
    int kind;
    int line;
    int op;                   /* operator / negate flag */
    const char *name;         /* names, attributes, filters, tests */
    struct jnode *a, *b, *c, *d;
    struct jnode **items;     /* args, list items, body, compare operands */
    size_t nitems;
    struct jnode **items2;    /* kwarg values, else-body, dict values */
    size_t nitems2;
    const char **names;       /* kwarg names, for/macro targets, compare ops */
    size_t nnames;
    jv lit;
    /* Frames (root, loop body, macro, ...): names assigned in the frame that
     * start out undefined, hiding outer values (jinja2's static scoping,
     * see jj_analyze).  undef2: the for-else frame. */
    const char **undef;
    size_t nundef;
    const char **undef2;
    size_t nundef2;
    int has_slice;            /* a slice below: compile-time folding matters */
} jnode;

/* Parses the template into a body node (N_BODY), scope analysis included. */
jnode *jj_parse(jstate *st, const char *src, size_t len);
/* Marks, per frame, which assigned names start undefined (jinja_scope.c). */
void jj_analyze(jstate *st, jnode *root);

/* ---- evaluation ---- */
typedef struct jscope {
    struct jscope *parent;
    jdict vars;
} jscope;

typedef struct jrender {
    jstate *st;
    jdict *globals;           /* the context object */
    unsigned long long steps;
    int depth;
    jbuf out;
    int loop_ctl;             /* 1 break, 2 continue */
    int folded;               /* evaluating a {{ }} made only of literals */
} jrender;

jv jj_eval(jrender *r, jscope *sc, const jnode *n);
void jj_exec(jrender *r, jscope *sc, const jnode *body, jbuf *out);
void jj_enter_root(jrender *r, jscope *top, const jnode *root);
jv jj_call(jrender *r, jv fn, jv *args, size_t nargs, const char **kwn, jv *kwv,
           size_t nkw, int line);
jv jj_getattr(jrender *r, jv obj, const char *name, size_t nlen, int line);
jv jj_getitem(jrender *r, jv obj, jv key, int line);
jv jj_iter_list(jrender *r, jv v, int line);   /* list of the items of v */
/* str % args (Python printf-style formatting) */
jv jj_percent_format(jrender *r, jv fmt, jv args, int line);

/* builtins (jinja_builtins.c) */
jv jj_filter(jrender *r, const char *name, jv v, jv *args, size_t nargs,
             const char **kwn, jv *kwv, size_t nkw, int line);
int jj_filter_exists(const char *name);
int jj_test(jrender *r, const char *name, jv v, jv *args, size_t nargs, int line);
int jj_test_exists(const char *name);
int jj_method_id(jv obj, const char *name, size_t nlen);   /* -1 if none */
jv jj_call_method(jrender *r, jfunc *f, jv *args, size_t nargs, const char **kwn,
                  jv *kwv, size_t nkw, int line);
int jj_global_id(const char *name);                        /* -1 if none */
jv jj_call_global(jrender *r, int id, jv *args, size_t nargs, const char **kwn,
                  jv *kwv, size_t nkw, int line);

#endif
