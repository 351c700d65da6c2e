/* tok_pretok.c - pre-tokenizers: Split (regex or literal, the five HF split
 * behaviours, invert), ByteLevel (prefix space, GPT-2 regex), Metaspace
 * (replacement, prepend_scheme, split), Digits and Sequence.
 *
 * Pieces live in one arena and are referred to by offset; a pre-tokenizer
 * that rewrites text appends the new text to the arena.  The byte-level
 * character mapping itself is done by the BPE step (tok_bpe.c) straight from
 * the raw bytes, which is why ByteLevel must come last. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

/* The GPT-2 pattern ByteLevel uses when use_regex is set. */
static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct { size_t a, b; int m; } seg;
typedef struct { seg *p; size_t n, cap; } segs;

static int segs_push(segs *v, size_t a, size_t b, int m)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        seg *q = realloc(v->p, nc * sizeof *q);
        if (!q)
            return -1;
        v->p = q;
        v->cap = nc;
    }
    v->p[v->n].a = a;
    v->p[v->n].b = b;
    v->p[v->n].m = m;
    v->n++;
    return 0;
}

/* Turns the (match / gap) segments covering one piece into output pieces
 * following HF's SplitDelimiterBehavior. */
static int apply_behavior(segs *sg, segs *outr, int behavior, const tok_piece *pc, tok_pieces *out)
{
    outr->n = 0;
    int prev_m = 0, have_prev = 0;
    if (behavior == BEH_MERGED_NEXT) {
        /* walk backwards: a match joins the piece that follows it */
        for (size_t i = sg->n; i-- > 0;) {
            seg s = sg->p[i];
            if (s.m && !prev_m && outr->n)
                outr->p[outr->n - 1].a = s.a;
            else if (segs_push(outr, s.a, s.b, 0))
                return -1;
            prev_m = s.m;
        }
        for (size_t i = 0; i < outr->n / 2; i++) {
            seg t = outr->p[i];
            outr->p[i] = outr->p[outr->n - 1 - i];
            outr->p[outr->n - 1 - i] = t;
        }
    } else {
        for (size_t i = 0; i < sg->n; i++) {
            seg s = sg->p[i];
            int r = 0;
            switch (behavior) {
            case BEH_REMOVED:
                if (!s.m)
                    r = segs_push(outr, s.a, s.b, 0);
                break;
            case BEH_ISOLATED:
                r = segs_push(outr, s.a, s.b, 0);
                break;
            case BEH_MERGED_PREV:
                if (s.m && !prev_m && outr->n)
                    outr->p[outr->n - 1].b = s.b;
                else
                    r = segs_push(outr, s.a, s.b, 0);
                break;
            case BEH_CONTIGUOUS:
                if (have_prev && s.m == prev_m)
                    outr->p[outr->n - 1].b = s.b;
                else
                    r = segs_push(outr, s.a, s.b, 0);
                break;
            }
            if (r)
                return -1;
            prev_m = s.m;
            have_prev = 1;
        }
    }
    for (size_t i = 0; i < outr->n; i++) {
        seg s = outr->p[i];
        if (s.b > s.a && tok_pieces_push(out, pc->off + s.a, s.b - s.a, pc->first && s.a == 0))
            return -1;
    }
    return 0;
}

typedef struct {
    tok_buf *arena;
    tok_sizes *spans;
    pcre2_match_data *md;
    segs sg, outr;
} pt_ctx;

/* Splits one piece by a pattern. */
static int split_piece(pt_ctx *c, const tok_pattern *pat, int behavior, int invert,
                       const tok_piece *pc, tok_pieces *out)
{
    c->spans->n = 0;
    int rc = tok_pattern_find(pat, c->arena->p + pc->off, pc->len, c->spans, c->md);
    if (rc)
        return rc;
    c->sg.n = 0;
    size_t prev = 0;
    for (size_t i = 0; i < c->spans->n; i += 2) {
        size_t a = c->spans->p[i], b = c->spans->p[i + 1];
        if (a > prev && segs_push(&c->sg, prev, a, invert))
            return -1;
        if (segs_push(&c->sg, a, b, !invert))
            return -1;
        prev = b;
    }
    if (prev < pc->len && segs_push(&c->sg, prev, pc->len, invert))
        return -1;
    return apply_behavior(&c->sg, &c->outr, behavior, pc, out);
}

static int digits_piece(pt_ctx *c, int individual, const tok_piece *pc, tok_pieces *out)
{
    const unsigned char *u = (const unsigned char *)c->arena->p + pc->off;
    c->sg.n = 0;
    size_t gap = 0;
    for (size_t i = 0; i < pc->len;) {
        uint32_t cp;
        int l = tok_utf8_next(u + i, pc->len - i, &cp);
        if (!l)
            l = 1;
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
        int num = cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
                  cat == UTF8PROC_CATEGORY_NO;
        if (num) {
            if (i > gap && segs_push(&c->sg, gap, i, 0))
                return -1;
            if (segs_push(&c->sg, i, i + (size_t)l, 1))
                return -1;
            gap = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (gap < pc->len && segs_push(&c->sg, gap, pc->len, 0))
        return -1;
    return apply_behavior(&c->sg, &c->outr, individual ? BEH_ISOLATED : BEH_CONTIGUOUS, pc, out);
}

/* Copies arena text [off, off+len) to the arena's end behind an optional
 * prefix, returning the new offset. */
static int arena_copy(tok_buf *arena, const char *prefix, size_t plen, size_t off, size_t len,
                      size_t *new_off)
{
    if (tok_buf_reserve(arena, plen + len))
        return -1;
    *new_off = arena->n;
    memcpy(arena->p + arena->n, prefix, plen);
    memmove(arena->p + arena->n + plen, arena->p + off, len);
    arena->n += plen + len;
    return 0;
}

static int bytelevel_piece(pt_ctx *c, const tok_pretok *pt, const tok_piece *pc,
                           tok_pieces *out)
{
    tok_piece p = *pc;
    if (pt->add_prefix_space && c->arena->p[p.off] != ' ') {
        if (arena_copy(c->arena, " ", 1, p.off, p.len, &p.off))
            return -1;
        p.len++;
    }
    if (pt->use_regex)
        return split_piece(c, &pt->pat, BEH_ISOLATED, 0, &p, out);
    return tok_pieces_push(out, p.off, p.len, p.first);
}

static int metaspace_piece(pt_ctx *c, const tok_pretok *pt, const tok_piece *pc,
                           tok_pieces *out)
{
    size_t rl = (size_t)pt->rep_len;
    if (tok_buf_reserve(c->arena, pc->len * rl + rl))
        return -1;
    char *src = c->arena->p + pc->off;
    char *dst = c->arena->p + c->arena->n;
    size_t off = c->arena->n, k = 0;
    int starts = pc->len && (src[0] == ' ' ||
                             (pc->len >= rl && memcmp(src, pt->rep, rl) == 0));
    if (!starts && (pt->prepend_scheme == PREPEND_ALWAYS ||
                    (pt->prepend_scheme == PREPEND_FIRST && pc->first))) {
        memcpy(dst, pt->rep, rl);
        k += rl;
    }
    for (size_t i = 0; i < pc->len; i++) {
        if (src[i] == ' ') {
            memcpy(dst + k, pt->rep, rl);
            k += rl;
        } else {
            dst[k++] = src[i];
        }
    }
    c->arena->n += k;
    if (!pt->split)
        return tok_pieces_push(out, off, k, pc->first);
    /* MergedWithNext on the replacement: a piece starts at each one */
    const char *s = c->arena->p + off;
    size_t start = 0;
    for (size_t i = 1; i + rl <= k; i++) {
        if (memcmp(s + i, pt->rep, rl) == 0) {
            if (tok_pieces_push(out, off + start, i - start, pc->first && start == 0))
                return -1;
            start = i;
            i += rl - 1;
        }
    }
    return tok_pieces_push(out, off + start, k - start, pc->first && start == 0);
}

static int run(pt_ctx *c, const tok_pretok *pt, tok_pieces *io, tok_pieces *tmp)
{
    if (pt->type == PRE_SEQUENCE) {
        for (int i = 0; i < pt->n_kids; i++) {
            int rc = run(c, &pt->kids[i], io, tmp);
            if (rc)
                return rc;
        }
        return 0;
    }
    tmp->n = 0;
    for (size_t i = 0; i < io->n; i++) {
        tok_piece pc = io->p[i];
        int rc = 0;
        switch (pt->type) {
        case PRE_SPLIT:
            rc = split_piece(c, &pt->pat, pt->behavior, pt->invert, &pc, tmp);
            break;
        case PRE_BYTELEVEL:
            rc = bytelevel_piece(c, pt, &pc, tmp);
            break;
        case PRE_METASPACE:
            rc = metaspace_piece(c, pt, &pc, tmp);
            break;
        case PRE_DIGITS:
            rc = digits_piece(c, pt->individual_digits, &pc, tmp);
            break;
        }
        if (rc)
            return rc;
    }
    tok_pieces t = *io;
    *io = *tmp;
    *tmp = t;
    return 0;
}

int tok_pretokenize(const tok_pretok *pt, tok_buf *arena, tok_pieces *io, tok_pieces *tmp,
                    tok_sizes *spans, pcre2_match_data *md)
{
    pt_ctx c = {arena, spans, md, {0}, {0}};
    int rc = run(&c, pt, io, tmp);
    free(c.sg.p);
    free(c.outr.p);
    return rc;
}

void tok_pretok_free(tok_pretok *pt)
{
    if (!pt)
        return;
    tok_pattern_free(&pt->pat);
    for (int i = 0; i < pt->n_kids; i++)
        tok_pretok_free(&pt->kids[i]);
    free(pt->kids);
    memset(pt, 0, sizeof *pt);
}

/* ---- parsing ---- */

static int parse_behavior(const cJSON *j, const char *file, const char *where, int *out,
                          mx_err *e)
{
    static const struct { const char *name; int b; } tab[] = {
        {"Removed", BEH_REMOVED}, {"Isolated", BEH_ISOLATED},
        {"MergedWithPrevious", BEH_MERGED_PREV}, {"MergedWithNext", BEH_MERGED_NEXT},
        {"Contiguous", BEH_CONTIGUOUS},
    };
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "behavior");
    if (!cJSON_IsString(v))
        return mx_fail(e, MX_EFORMAT, "%s: %s.behavior is missing", file, where);
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(v->valuestring, tab[i].name) == 0) {
            *out = tab[i].b;
            return MX_OK;
        }
    return mx_fail(e, MX_EUNSUPPORTED, "%s: %s.behavior '%s' is not supported", file, where,
                   v->valuestring);
}

static int get_bool(const cJSON *j, const char *key, int def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* Metaspace's prepend_scheme, or the legacy add_prefix_space flag. */
int tok_parse_prepend_scheme(const cJSON *j, const char *file, const char *where, int *out,
                             mx_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
    if (cJSON_IsString(v)) {
        if (strcmp(v->valuestring, "always") == 0)
            *out = PREPEND_ALWAYS;
        else if (strcmp(v->valuestring, "first") == 0)
            *out = PREPEND_FIRST;
        else if (strcmp(v->valuestring, "never") == 0)
            *out = PREPEND_NEVER;
        else
            return mx_fail(e, MX_EUNSUPPORTED, "%s: %s.prepend_scheme '%s' is not supported",
                           file, where, v->valuestring);
        return MX_OK;
    }
    *out = get_bool(j, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
    return MX_OK;
}

/* The replacement must be one character. Returns its UTF-8 length. */
int tok_parse_char(const cJSON *j, const char *key, const char *file, const char *where,
                   char out[5], uint32_t *cp, mx_err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    size_t n = cJSON_IsString(v) ? strlen(v->valuestring) : 0;
    int l = n ? tok_utf8_next((const unsigned char *)v->valuestring, n, cp) : 0;
    if (!l || (size_t)l != n) {
        mx_fail(e, MX_EFORMAT, "%s: %s.%s must be a single character", file, where, key);
        return 0;
    }
    memcpy(out, v->valuestring, n);
    out[n] = 0;
    return l;
}

/* Whether ByteLevel appears anywhere but as the very last step. */
static int bytelevel_not_last(const tok_pretok *pt, int is_last)
{
    if (pt->type == PRE_BYTELEVEL)
        return !is_last;
    if (pt->type == PRE_SEQUENCE)
        for (int i = 0; i < pt->n_kids; i++)
            if (bytelevel_not_last(&pt->kids[i], is_last && i == pt->n_kids - 1))
                return 1;
    return 0;
}

static int parse_one(const cJSON *j, const char *file, const char *where, tok_pretok *out,
                     mx_err *e);

static int parse_kid(const cJSON *j, const char *file, const char *where, void *out, mx_err *e)
{
    return parse_one(j, file, where, out, e);
}

static int parse_one(const cJSON *j, const char *file, const char *where, tok_pretok *out,
                     mx_err *e)
{
    memset(out, 0, sizeof *out);
    const char *type;
    int rc = tok_json_type(j, file, where, &type, e);
    if (rc)
        return rc;
    char sub[256];
    if (strcmp(type, "Split") == 0) {
        out->type = PRE_SPLIT;
        out->invert = get_bool(j, "invert", 0);
        if ((rc = parse_behavior(j, file, where, &out->behavior, e)))
            return rc;
        snprintf(sub, sizeof sub, "%s.pattern", where);
        return tok_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"), file, sub,
                                 &out->pat, e);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        out->type = PRE_BYTELEVEL;
        out->add_prefix_space = get_bool(j, "add_prefix_space", 1);
        out->use_regex = get_bool(j, "use_regex", 1);
        if (out->use_regex)
            return tok_regex_compile(GPT2_REGEX, sizeof GPT2_REGEX - 1, &out->pat.re, file,
                                     where, e);
        return MX_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        out->type = PRE_METASPACE;
        uint32_t cp;
        int l = tok_parse_char(j, "replacement", file, where, out->rep, &cp, e);
        if (l <= 0)
            return e ? e->code : MX_EFORMAT;
        out->rep_len = l;
        out->split = get_bool(j, "split", 1);
        return tok_parse_prepend_scheme(j, file, where, &out->prepend_scheme, e);
    }
    if (strcmp(type, "Digits") == 0) {
        out->type = PRE_DIGITS;
        out->individual_digits = get_bool(j, "individual_digits", 0);
        return MX_OK;
    }
    if (strcmp(type, "Sequence") == 0) {
        out->type = PRE_SEQUENCE;
        void *kids;
        rc = tok_parse_sequence(j, "pretokenizers", file, where, sizeof *out->kids, parse_kid,
                                &kids, &out->n_kids, e);
        out->kids = kids;
        return rc;
    }
    return mx_fail(e, MX_EUNSUPPORTED, "%s: %s.type '%s' is not supported", file, where, type);
}

int tok_pretok_parse(const cJSON *j, const char *file, const char *where, tok_pretok *out,
                     mx_err *e)
{
    int rc = parse_one(j, file, where, out, e);
    if (rc == 0 && bytelevel_not_last(out, 1))
        rc = mx_fail(e, MX_EUNSUPPORTED,
                     "%s: %s: a ByteLevel pre-tokenizer followed by others is not supported",
                     file, where);
    return rc;
}
