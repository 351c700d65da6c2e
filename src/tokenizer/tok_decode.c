/* tok_decode.c - ids -> token strings -> decoder chain -> UTF-8, and the
 * incremental (stream) decoder.
 *
 * Decoders work as in HF tokenizers: each turns a list of strings into a new
 * list (ByteLevel maps the GPT-2 characters back to bytes, Metaspace turns
 * the replacement back into spaces, ByteFallback turns <0xNN> runs into
 * text, Fuse joins, Strip trims, Replace substitutes) and the final list is
 * concatenated.  The result is always valid UTF-8 (invalid bytes become
 * U+FFFD like Rust's from_utf8_lossy). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* A list of strings in one buffer: se holds (offset, length) pairs. */
typedef struct { tok_buf buf; tok_sizes se; } slist;

static void slist_free(slist *l)
{
    tok_buf_free(&l->buf);
    free(l->se.p);
    memset(l, 0, sizeof *l);
}

static int slist_add(slist *l, const char *s, size_t n)
{
    size_t off = l->buf.n;
    return tok_buf_put(&l->buf, s, n) || tok_sizes_push2(&l->se, off, n) ? -1 : 0;
}

/* Starts a new string at the end of the buffer; grow it with tok_buf_put
 * and close it with slist_close. */
static size_t slist_open(const slist *l)
{
    return l->buf.n;
}

static int slist_close(slist *l, size_t start)
{
    return tok_sizes_push2(&l->se, start, l->buf.n - start);
}

/* (a list of empty strings may have no buffer yet) */
#define TOK(l, i) ((l)->buf.p ? (l)->buf.p + (l)->se.p[2 * (i)] : "")
#define LEN(l, i) ((l)->se.p[2 * (i) + 1])
#define COUNT(l) ((l)->se.n / 2)

static int next_char(const char *s, size_t n, size_t i, uint32_t *cp)
{
    int l = tok_utf8_next((const unsigned char *)s + i, n - i, cp);
    if (!l) {
        *cp = 0xFFFFFFFFu;  /* matches nothing */
        l = 1;
    }
    return l;
}

static int dec_bytelevel(const slist *in, slist *out)
{
    tok_buf raw = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < COUNT(in); i++) {
        const char *s = TOK(in, i);
        size_t n = LEN(in, i), start = raw.n;
        if (tok_buf_reserve(&raw, n)) {
            rc = -1;
            break;
        }
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            k += (size_t)next_char(s, n, k, &cp);
            int b = tok_cp_to_byte(cp);
            if (b < 0) {
                /* not a byte-level token (e.g. an added token): keep as is */
                raw.n = start;
                rc = tok_buf_put(&raw, s, n);
                break;
            }
            raw.p[raw.n++] = (char)b;
        }
    }
    size_t st = slist_open(out);
    if (rc == 0)
        rc = tok_utf8_lossy(&out->buf, raw.p, raw.n) || slist_close(out, st) ? -1 : 0;
    tok_buf_free(&raw);
    return rc;
}

static int dec_metaspace(const tok_dec *d, const slist *in, slist *out)
{
    for (size_t i = 0; i < COUNT(in); i++) {
        const char *s = TOK(in, i);
        size_t n = LEN(in, i), st = slist_open(out);
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            int l = next_char(s, n, k, &cp);
            int r = 0;
            if (cp != d->ch)
                r = tok_buf_put(&out->buf, s + k, (size_t)l);
            else if (!(i == 0 && d->prepend_scheme != PREPEND_NEVER))
                r = tok_buf_put(&out->buf, " ", 1);
            if (r)
                return -1;
            k += (size_t)l;
        }
        if (slist_close(out, st))
            return -1;
    }
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Byte value of a "<0xNN>" token, or -1. */
static int fallback_byte(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

static int flush_bytes(tok_buf *bytes, slist *out)
{
    if (!bytes->n)
        return 0;
    int rc = 0;
    if (tok_utf8_check(bytes->p, bytes->n) == bytes->n)
        rc = slist_add(out, bytes->p, bytes->n);
    else    /* HF: one U+FFFD per byte when the run is not valid UTF-8 */
        for (size_t i = 0; rc == 0 && i < bytes->n; i++)
            rc = slist_add(out, "\xEF\xBF\xBD", 3);
    bytes->n = 0;
    return rc;
}

static int dec_bytefallback(const slist *in, slist *out)
{
    tok_buf bytes = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < COUNT(in); i++) {
        int b = fallback_byte(TOK(in, i), LEN(in, i));
        if (b >= 0) {
            char c = (char)b;
            rc = tok_buf_put(&bytes, &c, 1);
        } else {
            rc = flush_bytes(&bytes, out);
            if (rc == 0)
                rc = slist_add(out, TOK(in, i), LEN(in, i));
        }
    }
    if (rc == 0)
        rc = flush_bytes(&bytes, out);
    tok_buf_free(&bytes);
    return rc;
}

static int dec_fuse(const slist *in, slist *out)
{
    size_t st = slist_open(out);
    for (size_t i = 0; i < COUNT(in); i++)
        if (tok_buf_put(&out->buf, TOK(in, i), LEN(in, i)))
            return -1;
    return slist_close(out, st);
}

static int dec_strip(const tok_dec *d, const slist *in, slist *out)
{
    for (size_t i = 0; i < COUNT(in); i++) {
        const char *s = TOK(in, i);
        size_t n = LEN(in, i), a = 0, b = n;
        uint32_t cp;
        /* up to `start` leading copies of the character */
        for (int k = 0; k < d->start && a < n; k++) {
            int l = next_char(s, n, a, &cp);
            if (cp != d->ch)
                break;
            a += (size_t)l;
        }
        /* up to `stop` trailing copies, never eating into the stripped start */
        for (int k = 0; k < d->stop && b > a; k++) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80)
                p--;
            next_char(s, b, p, &cp);
            if (cp != d->ch)
                break;
            b = p;
        }
        if (slist_add(out, s + a, b - a))
            return -1;
    }
    return 0;
}

static int dec_replace(const tok_dec *d, const slist *in, slist *out)
{
    tok_sizes spans = {0};
    pcre2_match_data *md = d->pat.re ? pcre2_match_data_create(1, NULL) : NULL;
    int rc = d->pat.re && !md ? -1 : 0;
    for (size_t i = 0; rc == 0 && i < COUNT(in); i++) {
        const char *s = TOK(in, i);
        size_t n = LEN(in, i), prev = 0, st = slist_open(out);
        spans.n = 0;
        rc = tok_pattern_find(&d->pat, s, n, &spans, md);
        for (size_t k = 0; rc == 0 && k < spans.n; k += 2) {
            rc = tok_buf_put(&out->buf, s + prev, spans.p[k] - prev) ||
                 tok_buf_put(&out->buf, d->str, d->str_len) ? -1 : 0;
            prev = spans.p[k + 1];
        }
        if (rc == 0)
            rc = tok_buf_put(&out->buf, s + prev, n - prev) || slist_close(out, st) ? -1 : 0;
    }
    free(spans.p);
    if (md)
        pcre2_match_data_free(md);
    return rc;
}

static int dec_run(const tok_dec *d, slist *io)
{
    if (d->type == DEC_SEQUENCE) {
        for (int i = 0; i < d->n_kids; i++)
            if (dec_run(&d->kids[i], io))
                return -1;
        return 0;
    }
    slist out = {0};
    int rc = -1;
    switch (d->type) {
    case DEC_BYTELEVEL: rc = dec_bytelevel(io, &out); break;
    case DEC_METASPACE: rc = dec_metaspace(d, io, &out); break;
    case DEC_BYTEFALLBACK: rc = dec_bytefallback(io, &out); break;
    case DEC_FUSE: rc = dec_fuse(io, &out); break;
    case DEC_STRIP: rc = dec_strip(d, io, &out); break;
    case DEC_REPLACE: rc = dec_replace(d, io, &out); break;
    }
    slist_free(io);
    *io = out;
    return rc;
}

int tok_decode_ids(const mx_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                   tok_buf *out, mx_err *e)
{
    slist l = {0};
    int rc = MX_OK;
    for (size_t i = 0; i < n && rc == MX_OK; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->tok_flags[id]) {
            rc = mx_fail(e, MX_ERANGE, "decode: token id %d is not in the vocabulary (%d ids)",
                         (int)id, (int)t->n_ids);
            break;
        }
        if (skip_special && (t->tok_flags[id] & TOKF_SPECIAL))
            continue;
        if (slist_add(&l, t->tok_str[id], t->tok_len[id]))
            rc = mx_fail(e, MX_ENOMEM, "decode: out of memory");
    }
    if (rc == MX_OK && t->dec && dec_run(t->dec, &l))
        rc = mx_fail(e, MX_ENOMEM, "decode: out of memory");
    out->n = 0;
    if (rc == MX_OK) {
        /* HF joins the tokens with spaces when there is no decoder */
        tok_buf cat = {0};
        for (size_t i = 0; rc == MX_OK && i < COUNT(&l); i++)
            if ((!t->dec && i && tok_buf_put(&cat, " ", 1)) ||
                tok_buf_put(&cat, TOK(&l, i), LEN(&l, i)))
                rc = mx_fail(e, MX_ENOMEM, "decode: out of memory");
        if (rc == MX_OK && tok_utf8_lossy(out, cat.p ? cat.p : "", cat.n))
            rc = mx_fail(e, MX_ENOMEM, "decode: out of memory");
        tok_buf_free(&cat);
    }
    slist_free(&l);
    return rc;
}

static int hand_out(tok_buf *b, char **text, size_t *len, mx_err *e)
{
    if (tok_buf_reserve(b, 0)) {
        tok_buf_free(b);
        return mx_fail(e, MX_ENOMEM, "decode: out of memory");
    }
    b->p[b->n] = 0;
    *text = b->p;
    if (len)
        *len = b->n;
    return MX_OK;
}

int mx_tok_decode(const mx_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                  char **text, size_t *len, mx_err *e)
{
    *text = NULL;
    if (len)
        *len = 0;
    tok_buf b = {0};
    int rc = tok_decode_ids(t, ids, n, skip_special, &b, e);
    if (rc) {
        tok_buf_free(&b);
        return rc;
    }
    return hand_out(&b, text, len, e);
}

/* ---- stream decoding ----
 * The window holds the ids since the last emission's context: `ctx` ids whose
 * decoded text (`prefix`) was already emitted, then the pending ones.  Each
 * push decodes the window; when the text grew and does not end in U+FFFD
 * (an incomplete character, or bytes still waiting for their <0xNN> mates),
 * the growth is emitted and the pending ids become the new context, so that
 * context-dependent decoders (Metaspace's first-token rule, Strip) behave as
 * they do in a full decode. */
struct mx_tok_stream {
    const mx_tokenizer *t;
    int skip_special;
    tok_ids win;
    size_t ctx;
    tok_buf prefix;
};

mx_tok_stream *mx_tok_stream_new(const mx_tokenizer *t, int skip_special)
{
    mx_tok_stream *s = calloc(1, sizeof *s);
    if (s) {
        s->t = t;
        s->skip_special = skip_special;
    }
    return s;
}

void mx_tok_stream_free(mx_tok_stream *s)
{
    if (!s)
        return;
    free(s->win.p);
    tok_buf_free(&s->prefix);
    free(s);
}

static int ends_with_fffd(const tok_buf *b)
{
    return b->n >= 3 && memcmp(b->p + b->n - 3, "\xEF\xBF\xBD", 3) == 0;
}

/* Bytes of cur past what prefix already covered (at a character boundary). */
static size_t new_text_start(const tok_buf *cur, const tok_buf *prefix)
{
    size_t k = 0, m = prefix->n < cur->n ? prefix->n : cur->n;
    while (k < m && cur->p[k] == prefix->p[k])
        k++;
    while (k > 0 && k < cur->n && ((unsigned char)cur->p[k] & 0xC0) == 0x80)
        k--;
    return k;
}

static int emit(mx_tok_stream *s, int final, char **out, size_t *len, mx_err *e)
{
    tok_buf cur = {0}, res = {0};
    int rc = tok_decode_ids(s->t, s->win.p, s->win.n, s->skip_special, &cur, e);
    if (rc == MX_OK && cur.n > s->prefix.n && (final || !ends_with_fffd(&cur))) {
        size_t k = new_text_start(&cur, &s->prefix);
        if (tok_buf_put(&res, cur.p + k, cur.n - k))
            rc = mx_fail(e, MX_ENOMEM, "stream decode: out of memory");
        /* the pending ids become the context of the next step */
        size_t pend = s->win.n - s->ctx;
        memmove(s->win.p, s->win.p + s->ctx, pend * sizeof *s->win.p);
        s->win.n = pend;
        s->ctx = pend;
        s->prefix.n = 0;
        if (rc == MX_OK)
            rc = tok_decode_ids(s->t, s->win.p, s->win.n, s->skip_special, &s->prefix, e);
    }
    tok_buf_free(&cur);
    if (rc == MX_OK)
        rc = hand_out(&res, out, len, e);
    else
        tok_buf_free(&res);
    return rc;
}

int mx_tok_stream_push(mx_tok_stream *s, int32_t id, char **out, size_t *len, mx_err *e)
{
    *out = NULL;
    if (len)
        *len = 0;
    const mx_tokenizer *t = s->t;
    if (id < 0 || id >= t->n_ids || !t->tok_flags[id])
        return mx_fail(e, MX_ERANGE, "decode: token id %d is not in the vocabulary (%d ids)",
                       (int)id, (int)t->n_ids);
    if (tok_ids_push(&s->win, id))
        return mx_fail(e, MX_ENOMEM, "stream decode: out of memory");
    return emit(s, 0, out, len, e);
}

int mx_tok_stream_flush(mx_tok_stream *s, char **out, size_t *len, mx_err *e)
{
    int rc = emit(s, 1, out, len, e);
    s->win.n = 0;
    s->ctx = 0;
    s->prefix.n = 0;
    return rc;
}

/* ---- parsing ---- */

void tok_dec_free(tok_dec *d)
{
    if (!d)
        return;
    tok_pattern_free(&d->pat);
    free(d->str);
    for (int i = 0; i < d->n_kids; i++)
        tok_dec_free(&d->kids[i]);
    free(d->kids);
    memset(d, 0, sizeof *d);
}

static int get_int(const cJSON *j, const char *key, int def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsNumber(v) ? v->valueint : def;
}

static int parse_kid(const cJSON *j, const char *file, const char *where, void *out, mx_err *e)
{
    return tok_dec_parse(j, file, where, out, e);
}

int tok_dec_parse(const cJSON *j, const char *file, const char *where, tok_dec *out,
                  mx_err *e)
{
    memset(out, 0, sizeof *out);
    const char *type;
    int rc = tok_json_type(j, file, where, &type, e);
    if (rc)
        return rc;
    char sub[256], ch[5];
    if (strcmp(type, "ByteLevel") == 0) {
        out->type = DEC_BYTELEVEL;
        return MX_OK;
    }
    if (strcmp(type, "ByteFallback") == 0) {
        out->type = DEC_BYTEFALLBACK;
        return MX_OK;
    }
    if (strcmp(type, "Fuse") == 0) {
        out->type = DEC_FUSE;
        return MX_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        out->type = DEC_METASPACE;
        if (!tok_parse_char(j, "replacement", file, where, ch, &out->ch, e))
            return e ? e->code : MX_EFORMAT;
        return tok_parse_prepend_scheme(j, file, where, &out->prepend_scheme, e);
    }
    if (strcmp(type, "Strip") == 0) {
        out->type = DEC_STRIP;
        if (!tok_parse_char(j, "content", file, where, ch, &out->ch, e))
            return e ? e->code : MX_EFORMAT;
        out->start = get_int(j, "start", 0);
        out->stop = get_int(j, "stop", 0);
        return MX_OK;
    }
    if (strcmp(type, "Replace") == 0) {
        out->type = DEC_REPLACE;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!cJSON_IsString(c))
            return mx_fail(e, MX_EFORMAT, "%s: %s.content is missing", file, where);
        out->str = strdup(c->valuestring);
        if (!out->str)
            return mx_fail(e, MX_ENOMEM, "%s: out of memory", file);
        out->str_len = strlen(out->str);
        snprintf(sub, sizeof sub, "%s.pattern", where);
        return tok_pattern_parse(cJSON_GetObjectItemCaseSensitive(j, "pattern"), file, sub,
                                 &out->pat, e);
    }
    if (strcmp(type, "Sequence") == 0) {
        out->type = DEC_SEQUENCE;
        void *kids;
        rc = tok_parse_sequence(j, "decoders", file, where, sizeof *out->kids, parse_kid, &kids,
                                &out->n_kids, e);
        out->kids = kids;
        return rc;
    }
    return mx_fail(e, MX_EUNSUPPORTED, "%s: %s.type '%s' is not supported", file, where, type);
}
