/* test_tokenizer.c - the tokenizer against HF tokenizers' own output.
 *
 * With MLXCEL_FIXTURES: every case of tokenizer_cases.json (Qwen2 byte-level
 * BPE) must give exactly HF's ids and decoded text, stream decoding must
 * agree with the full decode, plus special tokens, errors and load time.
 * Always: a hand-written SentencePiece-style tokenizer (Prepend+Replace
 * normalizer or Metaspace, <0xNN> byte fallback, ByteFallback/Fuse/Strip
 * decoders) with ids derived by hand, and a synthetic 256-byte byte-level
 * tokenizer like the one `mlxcel synth` writes. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/file.h"

/* ---- helpers ---- */

static int valid_utf8(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!l || (l > 1 && c < 0xC2) || i + l > n)
            return 0;
        for (size_t k = 1; k < l; k++)
            if ((u[i + k] & 0xC0) != 0x80)
                return 0;
        i += l;
    }
    return 1;
}

static char *write_temp(const char *json)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/mx_tok_test_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0)
        return NULL;
    size_t n = strlen(json);
    ssize_t w = write(fd, json, n);
    close(fd);
    return w == (ssize_t)n ? path : NULL;
}

static mx_tokenizer *load_json(const char *json)
{
    char *path = write_temp(json);
    mx_tokenizer *t = NULL;
    mx_err e = {0};
    CHECK(path != NULL);
    if (!path)
        return NULL;
    CHECK_OK(mx_tok_load(path, &t, &e), &e);
    unlink(path);
    return t;
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " %d", (int)ids[i]);
    fputc('\n', stderr);
}

static void check_ids(const mx_tokenizer *t, const char *text, int parse_special,
                      const int32_t *want, size_t nwant)
{
    int32_t *ids = NULL;
    size_t n = 0;
    mx_err e = {0};
    CHECK_OK(mx_tok_encode(t, text, strlen(text), parse_special, &ids, &n, &e), &e);
    int same = n == nwant && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    CHECKF(same, "ids of '%s'", text);
    if (!same) {
        print_ids("got ", ids, n);
        print_ids("want", want, nwant);
    }
    free(ids);
}

static void check_decode(const mx_tokenizer *t, const int32_t *ids, size_t n, int skip,
                         const char *want)
{
    char *s = NULL;
    size_t len = 0;
    mx_err e = {0};
    CHECK_OK(mx_tok_decode(t, ids, n, skip, &s, &len, &e), &e);
    CHECKF(s && len == strlen(want) && memcmp(s, want, len) == 0, "decode: got '%s' want '%s'",
           s ? s : "(null)", want);
    free(s);
}

/* Streams ids one by one; every piece must be valid UTF-8 and the pieces
 * must add up to the full decode. */
static void check_stream(const mx_tokenizer *t, const int32_t *ids, size_t n, int skip,
                         const char *label)
{
    char *full = NULL;
    size_t flen = 0;
    mx_err e = {0};
    CHECK_OK(mx_tok_decode(t, ids, n, skip, &full, &flen, &e), &e);
    mx_tok_stream *s = mx_tok_stream_new(t, skip);
    CHECK(s != NULL);
    if (!s || !full) {
        free(full);
        mx_tok_stream_free(s);
        return;
    }
    char *acc = malloc(flen * 2 + 64);
    size_t an = 0, cap = flen * 2 + 64;
    int pieces_ok = 1, fits = 1;
    for (size_t i = 0; i <= n; i++) {
        char *p = NULL;
        size_t pl = 0;
        int rc = i < n ? mx_tok_stream_push(s, ids[i], &p, &pl, &e)
                       : mx_tok_stream_flush(s, &p, &pl, &e);
        CHECK_OK(rc, &e);
        if (p && !valid_utf8(p, pl))
            pieces_ok = 0;
        if (p && an + pl <= cap) {
            memcpy(acc + an, p, pl);
            an += pl;
        } else if (p) {
            fits = 0;
        }
        free(p);
    }
    CHECKF(pieces_ok, "stream pieces of %s are valid UTF-8", label);
    CHECKF(fits && an == flen && memcmp(acc, full, an) == 0,
           "stream decode of %s equals the full decode ('%.*s' vs '%s')", label, (int)an, acc,
           full);
    free(acc);
    free(full);
    mx_tok_stream_free(s);
}

/* ---- the Qwen2 fixture ---- */

static void test_qwen_cases(const char *fixtures)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/qwen2_moe_tiny_chat/tokenizer.json", fixtures);
    mx_tokenizer *t = NULL;
    mx_err e = {0};
    double t0 = mx_now();
    CHECK_OK(mx_tok_load(path, &t, &e), &e);
    double load_ms = (mx_now() - t0) * 1e3;
    printf("qwen2 tokenizer.json loaded in %.1f ms\n", load_ms);
    if (!t)
        return;
    CHECK(mx_tok_vocab_size(t) == 151646);
    CHECK(mx_tok_lookup(t, "<|im_start|>") == 151644);
    CHECK(mx_tok_lookup(t, "Hello") == 9707);
    CHECK(mx_tok_lookup(t, "no such token here") == -1);
    CHECK(mx_tok_is_special(t, 151645));
    CHECK(!mx_tok_is_special(t, 9707));

    snprintf(path, sizeof path, "%s/tokenizer_cases.json", fixtures);
    char *buf = NULL;
    size_t len = 0;
    CHECK_OK(mx_read_file(path, &buf, &len, &e), &e);
    cJSON *root = buf ? cJSON_ParseWithLength(buf, len) : NULL;
    free(buf);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    CHECK(cJSON_IsArray(cases) && cJSON_GetArraySize(cases) > 10);
    int ncase = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *text = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
        const char *decoded = cJSON_GetObjectItemCaseSensitive(c, "decoded")->valuestring;
        const cJSON *jids = cJSON_GetObjectItemCaseSensitive(c, "ids");
        size_t nw = (size_t)cJSON_GetArraySize(jids);
        int32_t *want = calloc(nw + 1, sizeof *want);
        size_t k = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, jids) want[k++] = v->valueint;
        check_ids(t, text, 1, want, nw);
        check_decode(t, want, nw, 0, decoded);
        check_stream(t, want, nw, 0, text);
        free(want);
        ncase++;
    }
    printf("%d tokenizer cases checked\n", ncase);
    cJSON_Delete(root);

    /* special tokens: matched only with parse_special; skipped on request */
    const char *chat = "<|im_start|>user\nHi<|im_end|>\n";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(mx_tok_encode(t, chat, strlen(chat), 1, &ids, &n, &e), &e);
    CHECK(n >= 4 && ids[0] == 151644);
    check_decode(t, ids, n, 1, "user\nHi\n");
    check_stream(t, ids, n, 1, "chat with skip_special");
    free(ids);
    CHECK_OK(mx_tok_encode(t, chat, strlen(chat), 0, &ids, &n, &e), &e);
    int has_special = 0;
    for (size_t i = 0; i < n; i++)
        has_special |= mx_tok_is_special(t, ids[i]);
    CHECK(n > 4 && !has_special);
    check_decode(t, ids, n, 0, chat);
    free(ids);

    /* empty text */
    CHECK_OK(mx_tok_encode(t, "", 0, 1, &ids, &n, &e), &e);
    CHECK(n == 0);
    free(ids);

    /* invalid UTF-8 is an error */
    static const char *bad[] = {"abc\xff", "\xc3", "x\xed\xa0\x80y", "\xc0\xaf", "\xf4\x90\x80\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ids = NULL;
        int rc = mx_tok_encode(t, bad[i], strlen(bad[i]), 1, &ids, &n, &e);
        CHECKF(rc == MX_EINVAL, "invalid UTF-8 #%zu gives MX_EINVAL (got %d)", i, rc);
        free(ids);
    }

    /* ids outside the vocabulary */
    int32_t oob[] = {9707, 151646};
    char *s = NULL;
    CHECK(mx_tok_decode(t, oob, 2, 0, &s, NULL, &e) == MX_ERANGE);
    free(s);
    int32_t neg[] = {-1};
    CHECK(mx_tok_decode(t, neg, 1, 0, &s, NULL, &e) == MX_ERANGE);
    mx_tok_stream *st = mx_tok_stream_new(t, 0);
    CHECK(mx_tok_stream_push(st, 200000, &s, NULL, &e) == MX_ERANGE);
    mx_tok_stream_free(st);

    /* an emoji split over byte tokens: nothing until it is whole */
    const char *emoji = "\xF0\x9F\x98\x80!";   /* U+1F600 then '!' */
    CHECK_OK(mx_tok_encode(t, emoji, strlen(emoji), 1, &ids, &n, &e), &e);
    check_stream(t, ids, n, 0, "emoji");
    free(ids);
    /* a lone lead byte at the end becomes U+FFFD on flush, like HF */
    int32_t lead[] = {9707, 11162};      /* "Hello", then the bytes F0 9F */
    st = mx_tok_stream_new(t, 0);
    size_t pl = 0;
    CHECK_OK(mx_tok_stream_push(st, lead[0], &s, &pl, &e), &e);
    CHECK(s && strcmp(s, "Hello") == 0);
    free(s);
    CHECK_OK(mx_tok_stream_push(st, lead[1], &s, &pl, &e), &e);
    CHECK(s && pl == 0);
    free(s);
    CHECK_OK(mx_tok_stream_flush(st, &s, &pl, &e), &e);
    CHECK(s && strcmp(s, " \xEF\xBF\xBD") == 0);
    free(s);
    mx_tok_stream_free(st);

    /* random ids (many not UTF-8 on their own): the stream still matches */
    unsigned long long seed = 42;
    for (int round = 0; round < 200; round++) {
        int32_t rid[24];
        size_t rn = 1 + test_rand_u64(&seed) % 24;
        for (size_t i = 0; i < rn; i++)
            rid[i] = (int32_t)(test_rand_u64(&seed) % 151646);
        check_stream(t, rid, rn, round & 1, "random ids");
    }

    /* a large input goes through (regex over a long text, cache reuse) */
    size_t big = 1 << 20;
    char *text = malloc(big + 1);
    const char *words = "The quick brown fox jumps over the lazy dog 12345, again and again. ";
    size_t wl = strlen(words);
    for (size_t i = 0; i < big; i++)
        text[i] = words[i % wl];
    text[big] = 0;
    CHECK_OK(mx_tok_encode(t, text, big, 1, &ids, &n, &e), &e);
    char *back = NULL;
    size_t blen = 0;
    CHECK_OK(mx_tok_decode(t, ids, n, 0, &back, &blen, &e), &e);
    CHECK(back && blen == big && memcmp(back, text, big) == 0);
    free(back);
    free(ids);
    /* a huge whitespace run (the \s+(?!\S) alternative backtracks) */
    memset(text, ' ', big);
    text[big - 1] = 'x';
    CHECK_OK(mx_tok_encode(t, text, big, 1, &ids, &n, &e), &e);
    CHECK_OK(mx_tok_decode(t, ids, n, 0, &back, &blen, &e), &e);
    CHECK(back && blen == big && memcmp(back, text, big) == 0);
    free(back);
    free(ids);
    free(text);
    mx_tok_free(t);
}

/* ---- a SentencePiece-style BPE (Llama-2 / Mixtral layout) ---- */

/* Vocab: <unk> <s> </s>, the 256 <0xNN> byte tokens (ids 3..258), then the
 * pieces below; the merges build "▁hello" and "▁world". */
static char *sp_json(const char *normalizer, const char *pretok, const char *decoder,
                     int byte_fallback)
{
    static const char *pieces[] = {"\xE2\x96\x81", "h", "e", "l", "o", "w", "r", "d", "he",
                                   "ll", "hell", "hello", "\xE2\x96\x81hello",
                                   "\xE2\x96\x81w", "or", "\xE2\x96\x81wor",
                                   "\xE2\x96\x81worl", "\xE2\x96\x81world"};
    static const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xE2\x96\x81 hello",
                                   "\xE2\x96\x81 w", "o r", "\xE2\x96\x81w or",
                                   "\xE2\x96\x81wor l", "\xE2\x96\x81worl d"};
    cJSON *root = cJSON_CreateObject();
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    const char *specials[] = {"<unk>", "<s>", "</s>", "<mask>"};
    int special_ids[] = {0, 1, 2, 277};
    for (int i = 0; i < 4; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", special_ids[i]);
        cJSON_AddStringToObject(a, "content", specials[i]);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", i == 3);   /* <mask> eats spaces before it */
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", i < 3);
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddItemToObject(root, "normalizer", cJSON_Parse(normalizer));
    cJSON_AddItemToObject(root, "pre_tokenizer", cJSON_Parse(pretok));
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse(decoder));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddStringToObject(model, "unk_token", "<unk>");
    cJSON_AddBoolToObject(model, "fuse_unk", 1);
    cJSON_AddBoolToObject(model, "byte_fallback", byte_fallback);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON_AddNumberToObject(vocab, "<unk>", 0);
    cJSON_AddNumberToObject(vocab, "<s>", 1);
    cJSON_AddNumberToObject(vocab, "</s>", 2);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        cJSON_AddNumberToObject(vocab, name, 3 + b);
    }
    for (int i = 0; i < (int)(sizeof pieces / sizeof pieces[0]); i++)
        cJSON_AddNumberToObject(vocab, pieces[i], 259 + i);
    cJSON *m = cJSON_AddArrayToObject(model, "merges");
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++)
        cJSON_AddItemToArray(m, cJSON_CreateString(merges[i]));
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

/* ids of the pieces: ▁=259 h=260 e=261 l=262 o=263 w=264 r=265 d=266
 * he=267 ll=268 hell=269 hello=270 ▁hello=271 ▁w=272 or=273 ▁wor=274
 * ▁worl=275 ▁world=276; <mask>=277; byte b is 3+b. */
static void test_sentencepiece(void)
{
    const char *legacy_norm =
        "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xE2\x96\x81\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}]}";
    const char *legacy_dec =
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xE2\x96\x81\"},"
        "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
        "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}";
    char *json = sp_json(legacy_norm, "null", legacy_dec, 1);
    mx_tokenizer *t = load_json(json);
    cJSON_free(json);
    if (!t)
        return;
    CHECK(mx_tok_vocab_size(t) == 278);

    /* "▁hello▁world": h e -> he, l l -> ll, he ll -> hell, hell o, ▁ hello,
     * then ▁ w, o r, ▁w or, ▁wor l, ▁worl d */
    int32_t hw[] = {271, 276};
    check_ids(t, "hello world", 1, hw, 2);
    check_decode(t, hw, 2, 0, "hello world");
    /* '!' is not in the vocab: byte fallback <0x21> */
    int32_t bang[] = {271, 3 + 0x21};
    check_ids(t, "hello!", 1, bang, 2);
    check_decode(t, bang, 2, 0, "hello!");
    /* é (C3 A9) falls back to two byte tokens after the prepended ▁ */
    int32_t eacute[] = {259, 3 + 0xC3, 3 + 0xA9};
    check_ids(t, "\xC3\xA9", 1, eacute, 3);
    check_decode(t, eacute, 3, 0, "\xC3\xA9");
    check_stream(t, eacute, 3, 0, "sp e-acute");
    /* two spaces: the second ▁ has no merge with the first */
    int32_t two[] = {271, 259, 276};
    check_ids(t, "hello  world", 1, two, 3);
    check_decode(t, two, 3, 0, "hello  world");
    check_stream(t, two, 3, 0, "sp two spaces");
    /* special token in the text; the rest is normalized on its own */
    int32_t bos[] = {1, 271};
    check_ids(t, "<s>hello", 1, bos, 2);
    check_decode(t, bos, 2, 0, "<s> hello");
    check_decode(t, bos, 2, 1, "hello");
    /* not parsed: '<' 's' '>' are bytes (only ▁ and letters are pieces) */
    int32_t nobos[] = {259, 3 + '<', 3 + 's', 3 + '>', 270};
    check_ids(t, "<s>hello", 0, nobos, 5);
    /* lstrip added token swallows the space before it */
    int32_t mask[] = {271, 277};
    check_ids(t, "hello <mask>", 1, mask, 2);
    /* byte-fallback runs that are not UTF-8 decode to one U+FFFD per byte */
    int32_t broken[] = {271, 3 + 0xE2, 3 + 0x96};
    check_decode(t, broken, 3, 0, "hello\xEF\xBF\xBD\xEF\xBF\xBD");
    check_stream(t, broken, 3, 0, "sp broken bytes");
    int32_t empty_ids[] = {0};
    check_ids(t, "", 1, empty_ids, 0);
    mx_tok_free(t);

    /* Without byte fallback an unknown char is <unk>, fused when repeated */
    json = sp_json(legacy_norm, "null", legacy_dec, 0);
    t = load_json(json);
    cJSON_free(json);
    if (t) {
        int32_t unk[] = {259, 0};
        check_ids(t, "\xC3\xA9\xC3\xA9", 1, unk, 2);
        int32_t unk2[] = {271, 0};
        check_ids(t, "hello\xC3\xA9!", 1, unk2, 2);
        mx_tok_free(t);
    }

    /* The newer layout: Metaspace pre-tokenizer (prepend_scheme first) and
     * Metaspace decoder, no normalizer. */
    const char *ms = "{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\","
                     "\"prepend_scheme\":\"first\",\"split\":true}";
    const char *ms_dec = "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Metaspace\","
                         "\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"first\","
                         "\"split\":true},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}";
    json = sp_json("null", ms, ms_dec, 1);
    t = load_json(json);
    cJSON_free(json);
    if (t) {
        check_ids(t, "hello world", 1, hw, 2);
        check_decode(t, hw, 2, 0, "hello world");
        check_stream(t, hw, 2, 0, "metaspace hello world");
        /* after a special token the text is not at the start: no ▁ added */
        int32_t first[] = {1, 270};
        check_ids(t, "<s>hello", 1, first, 2);
        int32_t two_sp[] = {271, 259, 276};
        check_ids(t, "hello  world", 1, two_sp, 3);
        check_decode(t, two_sp, 3, 0, "hello  world");
        mx_tok_free(t);
    }
}

/* ---- the synthetic byte-level tokenizer ---- */

static unsigned byte_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    return b <= 32 ? 256 + b : b <= 160 ? 256 + 33 + (b - 127) : 256 + 67;
}

static char *bytelevel_json(const char *pretok)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddArrayToObject(root, "added_tokens");
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", cJSON_Parse(pretok));
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\":\"ByteLevel\"}"));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = byte_cp(b);
        char s[4] = {0};
        if (cp < 0x80) {
            s[0] = (char)cp;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
        }
        cJSON_AddNumberToObject(vocab, s, b);
    }
    cJSON_AddArrayToObject(model, "merges");
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

static void test_bytelevel(void)
{
    char *json = bytelevel_json("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                                "\"trim_offsets\":true,\"use_regex\":true}");
    mx_tokenizer *t = load_json(json);
    cJSON_free(json);
    if (!t)
        return;
    CHECK(mx_tok_vocab_size(t) == 256);
    static const char *texts[] = {
        "Hello, world!", "  spaces\tand\nnewlines\r\n", "caf\xC3\xA9 \xE6\xB7\xB7\xE5\x90\x88",
        "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "\x01\x7F control",
        "nul\0inside"};
    size_t lens[] = {0, 0, 0, 0, 0, 10};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t len = lens[i] ? lens[i] : strlen(texts[i]);
        int32_t *ids = NULL;
        size_t n = 0;
        mx_err e = {0};
        CHECK_OK(mx_tok_encode(t, texts[i], len, 1, &ids, &n, &e), &e);
        int same = n == len;
        for (size_t k = 0; same && k < n; k++)
            same = ids[k] == (int32_t)(unsigned char)texts[i][k];
        CHECKF(same, "byte-level ids of text %zu are its bytes", i);
        char *s = NULL;
        size_t sl = 0;
        CHECK_OK(mx_tok_decode(t, ids, n, 0, &s, &sl, &e), &e);
        CHECKF(s && sl == len && memcmp(s, texts[i], len) == 0, "round trip of text %zu", i);
        free(s);
        check_stream(t, ids, n, 0, "byte-level text");
        free(ids);
    }
    /* random valid UTF-8 (all planes, controls, NUL) round-trips exactly */
    unsigned long long seed = 7;
    int all_ok = 1;
    for (int round = 0; round < 300 && all_ok; round++) {
        char text[256];
        size_t len = 0, want = test_rand_u64(&seed) % 200;
        while (len + 4 < want) {
            unsigned long long r = test_rand_u64(&seed);
            uint32_t cp = r % 4 == 0 ? (uint32_t)(r >> 8) % 0x80
                        : r % 4 == 1 ? (uint32_t)(r >> 8) % 0x800
                        : r % 4 == 2 ? (uint32_t)(r >> 8) % 0x10000 : 0x10000 + (uint32_t)(r >> 8) % 0x100000;
            if (cp >= 0xD800 && cp <= 0xDFFF)
                continue;
            if (cp < 0x80) {
                text[len++] = (char)cp;
            } else if (cp < 0x800) {
                text[len++] = (char)(0xC0 | (cp >> 6));
                text[len++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                text[len++] = (char)(0xE0 | (cp >> 12));
                text[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                text[len++] = (char)(0x80 | (cp & 0x3F));
            } else {
                text[len++] = (char)(0xF0 | (cp >> 18));
                text[len++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                text[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                text[len++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        int32_t *ids = NULL;
        size_t n = 0;
        char *s = NULL;
        size_t sl = 0;
        mx_err e = {0};
        all_ok = mx_tok_encode(t, text, len, 1, &ids, &n, &e) == 0 && n == len &&
                 mx_tok_decode(t, ids, n, 0, &s, &sl, &e) == 0 && sl == len &&
                 memcmp(s, text, len) == 0;
        if (all_ok && round % 10 == 0)
            check_stream(t, ids, n, 0, "random UTF-8");
        free(ids);
        free(s);
    }
    CHECK(all_ok);
    /* byte by byte, a 4-byte emoji appears only when complete */
    mx_tok_stream *st = mx_tok_stream_new(t, 0);
    const unsigned char em[] = {0xF0, 0x9F, 0x98, 0x80};
    for (int i = 0; i < 4; i++) {
        char *p = NULL;
        size_t pl = 9;
        mx_err e = {0};
        CHECK_OK(mx_tok_stream_push(st, em[i], &p, &pl, &e), &e);
        CHECK(i < 3 ? pl == 0 : (pl == 4 && memcmp(p, em, 4) == 0));
        free(p);
    }
    mx_tok_stream_free(st);
    mx_tok_free(t);

    /* an unsupported type names itself and where it is */
    json = bytelevel_json("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"WhitespaceSplit\"}]}");
    char *path = write_temp(json);
    cJSON_free(json);
    mx_err e = {0};
    t = NULL;
    CHECK_FAILS(mx_tok_load(path, &t, &e), &e);
    CHECK(e.code == MX_EUNSUPPORTED &&
          strstr(e.msg, "pre_tokenizer.pretokenizers[0].type 'WhitespaceSplit' is not supported"));
    unlink(path);
    mx_tok_free(t);
    /* a missing file and broken JSON are errors too */
    CHECK_FAILS(mx_tok_load("/nonexistent/tokenizer.json", &t, &e), &e);
    path = write_temp("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, ");
    CHECK_FAILS(mx_tok_load(path, &t, &e), &e);
    CHECK(e.code == MX_EFORMAT);
    unlink(path);
    path = write_temp("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
    CHECK_FAILS(mx_tok_load(path, &t, &e), &e);
    CHECK(strstr(e.msg, "model.type 'Unigram'") != NULL);
    unlink(path);
    path = write_temp("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}");
    CHECK_FAILS(mx_tok_load(path, &t, &e), &e);
    unlink(path);
}

int main(void)
{
    test_sentencepiece();
    test_bytelevel();
    const char *fx = test_fixtures();
    if (fx)
        test_qwen_cases(fx);
    else
        fprintf(stderr, "(the Qwen2 fixture cases were skipped; the synthetic ones ran)\n");
    return test_summary();
}
