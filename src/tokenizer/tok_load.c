/* tok_load.c - reads tokenizer.json into an mx_tokenizer: the BPE model
 * (vocab, merges as "a b" strings or [a, b] pairs, byte_fallback, unk),
 * added tokens, normalizer, pre-tokenizer and decoder.  Anything of a type
 * we do not implement is an error naming the type and its JSON path. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_json.h"
#include "util/file.h"

#define MAX_TOKEN_ID (1 << 24)   /* far above any real vocabulary */

static int get_bool(const cJSON *j, const char *key, int def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* A string field that may be null or absent (then ""). */
static int opt_string(const cJSON *j, const char *key, char **out, size_t *len)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    *out = strdup(s);
    *len = strlen(s);
    return *out ? 0 : -1;
}

static int valid_id(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < MAX_TOKEN_ID &&
           v->valuedouble == (double)v->valueint;
}

/* The raw text of tokenizer.json with the two huge spans it holds. */
typedef struct {
    const char *text;
    size_t vocab[2], merges[2];
} raw_parts;

typedef struct { uint32_t off, len; int32_t id; } vent;

/* Reads the integer token id at p. */
static const char *read_id(const char *p, const char *end, int32_t *id)
{
    long v = 0;
    const char *q = p;
    while (q < end && *q >= '0' && *q <= '9' && v < MAX_TOKEN_ID)
        v = v * 10 + (*q++ - '0');
    if (q == p || v >= MAX_TOKEN_ID || (q < end && (*q == '.' || *q == 'e' || *q == 'E')))
        return NULL;
    *id = (int32_t)v;
    return q;
}

/* model.vocab, scanned straight into t->arena: its strings and their ids. */
static int scan_vocab(mx_tokenizer *t, const raw_parts *rp, vent **out, size_t *count,
                      int32_t *max_id, const char *file, mx_err *e)
{
    const char *p = rp->text + rp->vocab[0], *end = rp->text + rp->vocab[1];
    if (p >= end || *p != '{')
        return mx_fail(e, MX_EFORMAT, "%s: model.vocab is missing or not an object", file);
    size_t span = (size_t)(end - p);
    /* decoded keys are never longer than their JSON text, so the arena
     * never moves while we fill it */
    tok_buf arena = {malloc(span + 16), 0, span + 16};
    size_t cap = 1024, n = 0;
    vent *v = malloc(cap * sizeof *v);
    t->arena = arena.p;
    *out = v;
    if (!arena.p || !v)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory for the vocabulary", file);
    p++;
    for (;;) {
        p = tok_json_ws(p, end);
        if (p < end && *p == '}' && n == 0)
            break;
        size_t off = arena.n;
        const char *q = tok_json_string(p, end, &arena);
        int32_t id = -1;
        if (q)
            q = tok_json_ws(q, end);
        if (q && q < end && *q == ':')
            q = read_id(tok_json_ws(q + 1, end), end, &id);
        else
            q = NULL;
        if (!q || arena.p != t->arena)
            return mx_fail(e, MX_EFORMAT, "%s: model.vocab: bad entry at byte %zu", file,
                           (size_t)(p - rp->text));
        if (tok_buf_put(&arena, "", 1))     /* NUL after each string */
            return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
        if (n == cap) {
            cap *= 2;
            vent *nv = realloc(v, cap * sizeof *v);
            if (!nv)
                return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
            *out = v = nv;
        }
        v[n++] = (vent){(uint32_t)off, (uint32_t)(arena.n - off - 1), id};
        if (id > *max_id)
            *max_id = id;
        p = tok_json_ws(q, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == '}')
            break;
        return mx_fail(e, MX_EFORMAT, "%s: model.vocab: expected ',' or '}' at byte %zu", file,
                       (size_t)(p - rp->text));
    }
    *count = n;
    return MX_OK;
}

static int load_vocab(mx_tokenizer *t, const vent *v, size_t n, const char *file, mx_err *e)
{
    if (tok_strmap_init(&t->vocab, n, t->arena))
        return mx_fail(e, MX_ENOMEM, "%s: out of memory for the vocabulary", file);
    for (size_t i = 0; i < n; i++) {
        const char *s = t->arena + v[i].off;
        int32_t id = v[i].id;
        if (tok_strmap_put(&t->vocab, v[i].off, v[i].len, id))
            return mx_fail(e, MX_ENOMEM, "%s: out of memory for the vocabulary", file);
        t->tok_str[id] = s;
        t->tok_len[id] = v[i].len;
        t->tok_flags[id] |= TOKF_VOCAB;
    }
    return MX_OK;
}

/* One merge at p: "a b" or ["a", "b"]; a and b are decoded into ab as
 * "a\0b" with the split point in *al. */
static const char *scan_merge(const char *p, const char *end, tok_buf *ab, size_t *al)
{
    ab->n = 0;
    if (*p == '"') {
        const char *q = tok_json_string(p, end, ab);
        char *sp = q ? memchr(ab->p, ' ', ab->n) : NULL;
        if (!sp || memchr(sp + 1, ' ', ab->n - (size_t)(sp + 1 - ab->p)))
            return NULL;
        *sp = 0;
        *al = (size_t)(sp - ab->p);
        return q;
    }
    if (*p != '[')
        return NULL;
    const char *q = tok_json_string(tok_json_ws(p + 1, end), end, ab);
    if (!q)
        return NULL;
    *al = ab->n;
    if (tok_buf_put(ab, "", 1))
        return NULL;
    q = tok_json_ws(q, end);
    if (q >= end || *q != ',')
        return NULL;
    q = tok_json_string(tok_json_ws(q + 1, end), end, ab);
    if (!q)
        return NULL;
    q = tok_json_ws(q, end);
    return q < end && *q == ']' ? q + 1 : NULL;
}

static int add_merge(mx_tokenizer *t, const tok_buf *ab, size_t al, int rank, tok_buf *cat,
                     const char *file, mx_err *e)
{
    const char *a = ab->p, *b = ab->p + al + 1;
    size_t bl = ab->n - al - 1;
    int32_t ia = tok_strmap_get(&t->vocab, a, al), ib = tok_strmap_get(&t->vocab, b, bl);
    /* the merged token drops b's continuing-subword prefix */
    size_t skip = t->cont_prefix_len && bl >= t->cont_prefix_len &&
                          memcmp(b, t->cont_prefix, t->cont_prefix_len) == 0
                      ? t->cont_prefix_len : 0;
    cat->n = 0;
    if (tok_buf_put(cat, a, al) || tok_buf_put(cat, b + skip, bl - skip))
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    int32_t im = tok_strmap_get(&t->vocab, cat->p, cat->n);
    if (ia < 0 || ib < 0 || im < 0) {
        const char *what = ia < 0 ? a : ib < 0 ? b : cat->p;
        size_t wl = ia < 0 ? al : ib < 0 ? bl : cat->n;
        return mx_fail(e, MX_EFORMAT, "%s: model.merges[%d]: '%.*s' is not in model.vocab",
                       file, rank, (int)(wl > 100 ? 100 : wl), what);
    }
    if (tok_pairmap_put(&t->merges, ia, ib, rank, im))
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    return MX_OK;
}

static int load_merges(mx_tokenizer *t, const raw_parts *rp, const char *file, mx_err *e)
{
    const char *p = rp->text + rp->merges[0], *end = rp->text + rp->merges[1];
    /* about one merge per 10 bytes of JSON: size the table once */
    if (tok_pairmap_init(&t->merges, (size_t)(end - p) / 10 + 16))
        return mx_fail(e, MX_ENOMEM, "%s: out of memory for the merges", file);
    if (p == end || (end - p == 4 && memcmp(p, "null", 4) == 0))
        return MX_OK;
    if (*p != '[')
        return mx_fail(e, MX_EFORMAT, "%s: model.merges is not an array", file);
    tok_buf ab = {0}, cat = {0};
    int rank = 0, rc = MX_OK;
    p = tok_json_ws(p + 1, end);
    while (rc == MX_OK && p < end && *p != ']') {
        size_t al = 0;
        const char *q = scan_merge(p, end, &ab, &al);
        if (!q) {
            rc = mx_fail(e, MX_EFORMAT, "%s: model.merges[%d] is not \"a b\" or [a, b] (byte "
                         "%zu)", file, rank, (size_t)(p - rp->text));
            break;
        }
        rc = add_merge(t, &ab, al, rank, &cat, file, e);
        rank++;
        p = tok_json_ws(q, end);
        if (p < end && *p == ',')
            p = tok_json_ws(p + 1, end);
        else if (p >= end || *p != ']')
            rc = rc ? rc : mx_fail(e, MX_EFORMAT, "%s: model.merges: expected ',' or ']' at "
                                   "byte %zu", file, (size_t)(p - rp->text));
    }
    tok_buf_free(&ab);
    tok_buf_free(&cat);
    return rc;
}

/* Largest added-token id, checking each entry's shape. */
static int check_added(const cJSON *added, const char *file, int32_t *max_id, mx_err *e)
{
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(v, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (!valid_id(id) || !cJSON_IsString(content))
            return mx_fail(e, MX_EFORMAT, "%s: added_tokens[%d] needs an integer id and a "
                           "string content", file, i);
        if (id->valueint > *max_id)
            *max_id = id->valueint;
        i++;
    }
    return MX_OK;
}

static int load_model(mx_tokenizer *t, const cJSON *root, const raw_parts *rp, const char *file,
                      mx_err *e)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model))
        return mx_fail(e, MX_EFORMAT, "%s: model is missing", file);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    int has_merges = rp->merges[1] > rp->merges[0];
    if (cJSON_IsString(type) ? strcmp(type->valuestring, "BPE") != 0 : !has_merges)
        return mx_fail(e, MX_EUNSUPPORTED, "%s: model.type '%s' is not supported (only BPE)",
                       file, cJSON_IsString(type) ? type->valuestring : "(none)");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        return mx_fail(e, MX_EFORMAT, "%s: added_tokens is not an array", file);

    vent *v = NULL;
    size_t nv = 0;
    int32_t max_id = -1;
    int rc = scan_vocab(t, rp, &v, &nv, &max_id, file, e);
    if (rc == MX_OK && cJSON_IsArray(added))
        rc = check_added(added, file, &max_id, e);
    if (rc == MX_OK) {
        t->n_ids = max_id + 1;
        size_t n = (size_t)t->n_ids + 1;
        t->tok_str = calloc(n, sizeof *t->tok_str);
        t->tok_len = calloc(n, sizeof *t->tok_len);
        t->tok_flags = calloc(n, 1);
        if (!t->tok_str || !t->tok_len || !t->tok_flags)
            rc = mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    }
    if (rc == MX_OK)
        rc = load_vocab(t, v, nv, file, e);
    free(v);
    if (rc)
        return rc;

    t->byte_fallback = get_bool(model, "byte_fallback", 0);
    t->fuse_unk = get_bool(model, "fuse_unk", 0);
    t->ignore_merges = get_bool(model, "ignore_merges", 0);
    if (opt_string(model, "continuing_subword_prefix", &t->cont_prefix, &t->cont_prefix_len) ||
        opt_string(model, "end_of_word_suffix", &t->eow_suffix, &t->eow_suffix_len))
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    t->unk_id = cJSON_IsString(unk) ? tok_strmap_get(&t->vocab, unk->valuestring,
                                                     strlen(unk->valuestring)) : -1;
    for (int b = 0; b < 256; b++) {
        char name[8], enc[4];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->fallback_ids[b] = tok_strmap_get(&t->vocab, name, 6);
        int l = tok_utf8_put(tok_byte_to_cp((unsigned)b), enc);
        t->byte_ids[b] = tok_strmap_get(&t->vocab, enc, (size_t)l);
    }
    return load_merges(t, rp, file, e);
}

static int load_added(mx_tokenizer *t, const cJSON *root, const char *file, mx_err *e)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsArray(arr))
        return MX_OK;
    int n = cJSON_GetArraySize(arr);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        tok_added *a = &t->added[t->n_added];
        const char *content = cJSON_GetObjectItemCaseSensitive(v, "content")->valuestring;
        a->id = cJSON_GetObjectItemCaseSensitive(v, "id")->valueint;
        a->content = strdup(content);
        if (!a->content)
            return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
        t->n_added++;
        a->len = strlen(content);
        a->special = (uint8_t)get_bool(v, "special", 0);
        a->lstrip = (uint8_t)get_bool(v, "lstrip", 0);
        a->rstrip = (uint8_t)get_bool(v, "rstrip", 0);
        a->single_word = (uint8_t)get_bool(v, "single_word", 0);
        a->normalized = (uint8_t)get_bool(v, "normalized", !a->special);
        t->tok_str[a->id] = a->content;
        t->tok_len[a->id] = (uint32_t)a->len;
        t->tok_flags[a->id] |= TOKF_ADDED | (a->special ? TOKF_SPECIAL : 0);
    }
    return MX_OK;
}

typedef struct { int idx; unsigned char first; size_t len; } addkey;

static int addkey_cmp(const void *x, const void *y)
{
    const addkey *a = x, *b = y;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;    /* longest first */
    return a->idx - b->idx;
}

/* Index of the added tokens matched before (raw) or after (normalized) the
 * normalizer runs, sorted by first byte then longest first. */
static int build_addset(mx_tokenizer *t, tok_addset *set, int normalized)
{
    addkey *k = calloc((size_t)t->n_added + 1, sizeof *k);
    set->idx = calloc((size_t)t->n_added + 1, sizeof *set->idx);
    if (!k || !set->idx) {
        free(k);
        return -1;
    }
    int n = 0;
    for (int i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (a->normalized == normalized && a->match_len)
            k[n++] = (addkey){i, (unsigned char)a->match[0], a->match_len};
    }
    qsort(k, (size_t)n, sizeof *k, addkey_cmp);
    int j = 0;
    for (int b = 0; b < 256; b++) {
        set->start[b] = j;
        while (j < n && k[j].first == b)
            j++;
    }
    set->start[256] = n;
    for (int i = 0; i < n; i++)
        set->idx[i] = k[i].idx;
    set->n = n;
    free(k);
    return 0;
}

static int prepare_added(mx_tokenizer *t, const char *file, mx_err *e)
{
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    tok_buf nb = {0};
    int rc = MX_OK;
    for (int i = 0; i < t->n_added && rc == MX_OK; i++) {
        tok_added *a = &t->added[i];
        /* HF matches normalized added tokens in normalized text, so it
         * normalizes their content the same way */
        if (a->normalized && t->norm) {
            if (tok_normalize(t->norm, a->content, a->len, &nb, md)) {
                rc = mx_fail(e, MX_EFORMAT, "%s: added_tokens[%d]: cannot normalize", file, i);
                break;
            }
            a->match = malloc(nb.n + 1);
            if (a->match) {
                memcpy(a->match, nb.p, nb.n);
                a->match[nb.n] = 0;
            }
            a->match_len = nb.n;
        } else {
            a->match = strdup(a->content);
            a->match_len = a->len;
        }
        if (!a->match)
            rc = mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    }
    tok_buf_free(&nb);
    pcre2_match_data_free(md);
    if (rc == MX_OK && (build_addset(t, &t->add_raw, 0) || build_addset(t, &t->add_norm, 1)))
        rc = mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
    return rc;
}

static int has_bytelevel(const tok_pretok *pt)
{
    if (pt->type == PRE_BYTELEVEL)
        return 1;
    for (int i = 0; i < pt->n_kids; i++)
        if (has_bytelevel(&pt->kids[i]))
            return 1;
    return 0;
}

/* normalizer / pre_tokenizer / decoder: null or absent means none. */
static int load_parts(mx_tokenizer *t, const cJSON *root, const char *file, mx_err *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    int rc;
    if (j && !cJSON_IsNull(j)) {
        if (!(t->norm = calloc(1, sizeof *t->norm)))
            return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
        if ((rc = tok_norm_parse(j, file, "normalizer", t->norm, e)))
            return rc;
    }
    j = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (j && !cJSON_IsNull(j)) {
        if (!(t->pretok = calloc(1, sizeof *t->pretok)))
            return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
        if ((rc = tok_pretok_parse(j, file, "pre_tokenizer", t->pretok, e)))
            return rc;
        t->byte_level = has_bytelevel(t->pretok);
    }
    j = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (j && !cJSON_IsNull(j)) {
        if (!(t->dec = calloc(1, sizeof *t->dec)))
            return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
        if ((rc = tok_dec_parse(j, file, "decoder", t->dec, e)))
            return rc;
    }
    return MX_OK;
}

/* The document without the values of model.vocab and model.merges (they
 * become {} and []), so cJSON parses only the small rest.  cut[] records
 * the removed spans to map cJSON's error offsets back to the file. */
typedef struct { size_t at, removed; } cut;

static char *strip_parts(const char *s, size_t n, const raw_parts *rp, size_t *out_len,
                         cut cuts[2])
{
    size_t sp[2][2] = {{rp->vocab[0], rp->vocab[1]}, {rp->merges[0], rp->merges[1]}};
    const char *fill[2] = {"{}", "[]"};
    if (sp[1][0] < sp[0][0]) {
        size_t a = sp[0][0], b = sp[0][1];
        sp[0][0] = sp[1][0], sp[0][1] = sp[1][1], sp[1][0] = a, sp[1][1] = b;
        fill[0] = "[]", fill[1] = "{}";
    }
    char *r = malloc(n + 5);
    if (!r)
        return NULL;
    size_t k = 0, pos = 0;
    for (int i = 0; i < 2; i++) {
        cuts[i].at = 0;
        cuts[i].removed = 0;
        if (sp[i][1] - sp[i][0] < 2)
            continue;
        memcpy(r + k, s + pos, sp[i][0] - pos);
        k += sp[i][0] - pos;
        cuts[i].at = k + 2;
        cuts[i].removed = sp[i][1] - sp[i][0] - 2;
        memcpy(r + k, fill[i], 2);
        k += 2;
        pos = sp[i][1];
    }
    memcpy(r + k, s + pos, n - pos);
    k += n - pos;
    r[k] = 0;
    *out_len = k;
    return r;
}

static long file_offset(long off, const cut cuts[2])
{
    long add = 0;
    for (int i = 0; i < 2; i++)
        if (cuts[i].removed && off >= (long)cuts[i].at)
            add += (long)cuts[i].removed;
    return off < 0 ? off : off + add;
}

int mx_tok_load(const char *path, mx_tokenizer **out, mx_err *e)
{
    *out = NULL;
    char *buf;
    size_t len;
    int rc = mx_read_file(path, &buf, &len, e);
    if (rc)
        return rc;
    rc = mx_tok_load_mem(buf, len, path, out, e);
    free(buf);
    return rc;
}

int mx_tok_load_mem(const char *buf, size_t len, const char *path, mx_tokenizer **out, mx_err *e)
{
    *out = NULL;
    int rc = MX_OK;
    raw_parts rp = {buf, {0, 0}, {0, 0}};
    char *rest = NULL;
    size_t rest_len = len;
    cut cuts[2] = {{0, 0}, {0, 0}};
    if (tok_json_model_parts(buf, len, rp.vocab, rp.merges) == 0)
        rest = strip_parts(buf, len, &rp, &rest_len, cuts);
    cJSON *root = cJSON_ParseWithLength(rest ? rest : buf, rest_len);
    if (!root) {
        const char *base = rest ? rest : buf, *at = cJSON_GetErrorPtr();
        long off = at && at >= base && at <= base + rest_len ? (long)(at - base) : -1;
        free(rest);
        return mx_fail(e, MX_EFORMAT, "%s: not valid JSON (near byte %ld)", path,
                       file_offset(off, cuts));
    }
    free(rest);
    mx_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
    }
    t->unk_id = -1;
    if (!cJSON_IsObject(root))
        rc = mx_fail(e, MX_EFORMAT, "%s: top level is not an object", path);
    if (rc == MX_OK)
        rc = load_model(t, root, &rp, path, e);
    if (rc == MX_OK)
        rc = load_added(t, root, path, e);
    if (rc == MX_OK)
        rc = load_parts(t, root, path, e);
    if (rc == MX_OK)
        rc = prepare_added(t, path, e);
    if (rc == MX_OK && !(t->cache = tok_cache_new()))
        rc = mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
    cJSON_Delete(root);
    if (rc) {
        mx_tok_free(t);
        return rc;
    }
    *out = t;
    return MX_OK;
}

int mx_tok_load_dir(const char *dir, mx_tokenizer **out, mx_err *e)
{
    size_t n = strlen(dir);
    char *path = malloc(n + sizeof "/tokenizer.json");
    if (!path)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", dir);
    memcpy(path, dir, n);
    strcpy(path + n, "/tokenizer.json");
    int rc = mx_tok_load(path, out, e);
    free(path);
    return rc;
}

void mx_tok_free(mx_tokenizer *t)
{
    if (!t)
        return;
    free(t->tok_str);
    free(t->tok_len);
    free(t->tok_flags);
    free(t->arena);
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    free(t->cont_prefix);
    free(t->eow_suffix);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].match);
    }
    free(t->added);
    free(t->add_raw.idx);
    free(t->add_norm.idx);
    tok_norm_free(t->norm);
    free(t->norm);
    tok_pretok_free(t->pretok);
    free(t->pretok);
    tok_dec_free(t->dec);
    free(t->dec);
    tok_cache_free(t->cache);
    free(t);
}

int32_t mx_tok_vocab_size(const mx_tokenizer *t)
{
    return t->n_ids;
}

int32_t mx_tok_lookup(const mx_tokenizer *t, const char *token)
{
    for (int i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].content, token) == 0)
            return t->added[i].id;
    return tok_strmap_get(&t->vocab, token, strlen(token));
}

int mx_tok_is_special(const mx_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && (t->tok_flags[id] & TOKF_SPECIAL) != 0;
}
