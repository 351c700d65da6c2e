/* test_safetensors.c - safetensors reader/writer: round trips through the
 * writer, hand-made malformed files (each must give an error, not a crash),
 * sharded directories, and the reference fixtures when MLXCEL_FIXTURES is
 * set. */
#include "format/safetensors.h"
#include "test.h"

#include <dirent.h>
#include <stdint.h>
#include <unistd.h>

static char tmpdir[64];

static void path_in(char *out, size_t cap, const char *sub, const char *name)
{
    if (sub)
        snprintf(out, cap, "%s/%s/%s", tmpdir, sub, name);
    else
        snprintf(out, cap, "%s/%s", tmpdir, name);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    if (n)
        fwrite(p, 1, n, f);
    fclose(f);
}

/* Builds header-length + header + data in a malloc'ed buffer; hlen_override
 * (if non-zero) replaces the true header length in the prefix. */
static uint8_t *image(const char *hdr, size_t dlen, uint64_t hlen_override, size_t *len)
{
    size_t h = strlen(hdr);
    *len = 8 + h + dlen;
    uint8_t *b = calloc(1, *len);
    uint64_t v = hlen_override ? hlen_override : h;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    memcpy(b + 8, hdr, h);
    for (size_t i = 0; i < dlen; i++)
        b[8 + h + i] = (uint8_t)i;
    return b;
}

static void write_image(const char *path, const char *hdr, size_t dlen)
{
    size_t n;
    uint8_t *b = image(hdr, dlen, 0, &n);
    write_bytes(path, b, n);
    free(b);
}

/* Parses an in-memory image that must fail; checks the message names the
 * file and (when given) the tensor. */
static void expect_bad(const char *what, const char *hdr, size_t dlen, uint64_t hlen,
                       const char *tensor)
{
    size_t n;
    uint8_t *b = image(hdr, dlen, hlen, &n);
    mx_tensor *ts = NULL;
    size_t nt = 99;
    mx_err e = {0};
    int rc = mx_st_parse(b, n, "bad.safetensors", &ts, &nt, &e);
    CHECKF(rc != 0, "%s: parse succeeded", what);
    CHECKF(ts == NULL && nt == 0, "%s: outputs not cleared", what);
    CHECKF(strstr(e.msg, "bad.safetensors") != NULL, "%s: message lacks file: %s", what,
           e.msg);
    if (tensor)
        CHECKF(strstr(e.msg, tensor) != NULL, "%s: message lacks tensor '%s': %s", what,
               tensor, e.msg);
    fprintf(stderr, "  %-24s -> %s\n", what, e.msg);
    free(b);
}

static void test_round_trip(void)
{
    mx_st_decl d[MX_DTYPE_COUNT + 2] = {0};
    static const char *names[MX_DTYPE_COUNT] = {"f32", "f16", "bf16", "u32", "i32",
                                                "i64", "u8",  "i8",   "bool"};
    for (int i = 0; i < MX_DTYPE_COUNT; i++) {
        d[i].name = names[i];
        d[i].dtype = (mx_dtype)i;
        d[i].ndim = 1 + i % 3;
        for (int k = 0; k < d[i].ndim; k++)
            d[i].shape[k] = 2 + i + k;
    }
    /* A scalar, a zero-size tensor, and a name that needs JSON escaping. */
    d[MX_DTYPE_COUNT] = (mx_st_decl){.name = "scalar \"q\"\\", .dtype = MX_F32, .ndim = 0};
    d[MX_DTYPE_COUNT + 1] =
        (mx_st_decl){.name = "empty", .dtype = MX_U32, .ndim = 2, .shape = {0, 5}};
    size_t nd = MX_DTYPE_COUNT + 2;

    char path[256];
    path_in(path, sizeof path, NULL, "rt.safetensors");
    mx_err e = {0};
    mx_st_writer *w;
    CHECK_OK(mx_st_writer_open(path, d, nd, &w, &e), &e);
    unsigned long long seed = 7;
    uint8_t *expect[MX_DTYPE_COUNT + 2];
    size_t sizes[MX_DTYPE_COUNT + 2];
    for (size_t i = 0; i < nd; i++) {
        size_t n = mx_dtype_size(d[i].dtype);
        for (int k = 0; k < d[i].ndim; k++)
            n *= (size_t)d[i].shape[k];
        sizes[i] = n;
        expect[i] = malloc(n + 1);
        for (size_t k = 0; k < n; k++)
            expect[i][k] = (uint8_t)test_rand_u64(&seed);
        /* write in two pieces to exercise partial writes */
        CHECK_OK(mx_st_writer_write(w, expect[i], n / 2, &e), &e);
        CHECK_OK(mx_st_writer_write(w, expect[i] + n / 2, n - n / 2, &e), &e);
    }
    CHECK_OK(mx_st_writer_close(w, &e), &e);

    /* Header padded to a multiple of 8, so data starts aligned. */
    FILE *f = fopen(path, "rb");
    uint8_t l8[8] = {0};
    CHECK(f && fread(l8, 1, 8, f) == 8);
    if (f)
        fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | l8[i];
    CHECKF(hl % 8 == 0, "header length %llu", (unsigned long long)hl);

    mx_st_set *s = NULL;
    CHECK_OK(mx_st_open_file(path, &s, &e), &e);
    if (s) {
        CHECK(mx_st_count(s) == nd);
        CHECK(mx_st_nfiles(s) == 1);
        struct stat st;
        stat(path, &st);
        CHECK(mx_st_file_bytes(s) == (uint64_t)st.st_size);
        for (size_t i = 0; i < nd; i++) {
            const mx_tensor *t = mx_st_find(s, d[i].name);
            CHECKF(t != NULL, "missing %s", d[i].name);
            if (!t)
                continue;
            CHECK(t->dtype == d[i].dtype && t->ndim == d[i].ndim);
            CHECK(memcmp(t->shape, d[i].shape, sizeof(int64_t) * (size_t)d[i].ndim) == 0);
            CHECK(t->nbytes == sizes[i]);
            CHECK((size_t)mx_tensor_numel(t) * mx_dtype_size(t->dtype) == sizes[i]);
            CHECKF(sizes[i] == 0 || memcmp(t->data, expect[i], sizes[i]) == 0,
                   "data of %s", d[i].name);
            CHECK(strcmp(t->file, path) == 0);
        }
        CHECK(mx_st_find(s, "nope") == NULL);
        /* mx_st_at iterates in name order. */
        for (size_t i = 1; i < mx_st_count(s); i++)
            CHECK(strcmp(mx_st_at(s, i - 1)->name, mx_st_at(s, i)->name) < 0);
        CHECK(mx_st_at(s, nd) == NULL);
        mx_st_close(s);
    }
    for (size_t i = 0; i < nd; i++)
        free(expect[i]);

    for (int i = 0; i < MX_DTYPE_COUNT; i++) {
        mx_dtype t;
        CHECK(mx_dtype_parse(mx_dtype_name((mx_dtype)i), &t) == 0 && t == (mx_dtype)i);
    }
    mx_dtype t;
    CHECK(mx_dtype_parse("F64", &t) != 0 && mx_dtype_parse("f32", &t) != 0);
    CHECK(mx_dtype_size(MX_BF16) == 2 && mx_dtype_size(MX_I64) == 8 &&
          mx_dtype_size(MX_BOOL) == 1);
}

static int file_exists(const char *p)
{
    return access(p, F_OK) == 0;
}

/* No "x.safetensors.tmp.*" may be left behind by a failed write. */
static int temp_files_left(void)
{
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        n += strstr(de->d_name, ".tmp.") != NULL;
    if (d)
        closedir(d);
    return n;
}

static void test_writer_errors(void)
{
    char path[256];
    path_in(path, sizeof path, NULL, "short.safetensors");
    mx_st_decl d[2] = {{.name = "a", .dtype = MX_F32, .ndim = 1, .shape = {4}},
                       {.name = "b", .dtype = MX_U8, .ndim = 1, .shape = {3}}};
    mx_err e = {0};
    mx_st_writer *w;
    float four[4] = {1, 2, 3, 4};
    CHECK_OK(mx_st_writer_open(path, d, 2, &w, &e), &e);
    CHECK_OK(mx_st_writer_write(w, four, sizeof four, &e), &e);
    CHECK_FAILS(mx_st_writer_close(w, &e), &e);   /* b never written */
    CHECK(!file_exists(path));
    CHECK(temp_files_left() == 0);

    CHECK_OK(mx_st_writer_open(path, d, 2, &w, &e), &e);
    uint8_t big[32] = {0};
    CHECK_FAILS(mx_st_writer_write(w, big, sizeof big, &e), &e);   /* too much */
    CHECK_FAILS(mx_st_writer_close(w, &e), &e);
    CHECK(!file_exists(path));
    CHECK(temp_files_left() == 0);

    mx_st_decl dup[2] = {d[0], d[0]};
    CHECK_FAILS(mx_st_writer_open(path, dup, 2, &w, &e), &e);
    mx_st_decl neg = {.name = "n", .dtype = MX_F32, .ndim = 1, .shape = {-1}};
    CHECK_FAILS(mx_st_writer_open(path, &neg, 1, &w, &e), &e);
    CHECK_FAILS(mx_st_writer_open("/nonexistent-dir/x.safetensors", d, 2, &w, &e), &e);
    CHECK(!file_exists(path));

    /* An empty file (no tensors) is valid. */
    CHECK_OK(mx_st_writer_open(path, d, 0, &w, &e), &e);
    CHECK_OK(mx_st_writer_close(w, &e), &e);
    mx_st_set *s;
    CHECK_OK(mx_st_open_file(path, &s, &e), &e);
    if (s) {
        CHECK(mx_st_count(s) == 0 && mx_st_find(s, "a") == NULL);
        mx_st_close(s);
    }
}

static void test_bad_inputs(void)
{
    /* A valid image first, so the helpers are known to be right. */
    {
        size_t n;
        uint8_t *b = image("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                           "\"__metadata__\":{\"format\":\"mlx\"}}   ",
                           16, 0, &n);
        mx_tensor *ts;
        size_t nt;
        mx_err e = {0};
        CHECK_OK(mx_st_parse(b, n, "good", &ts, &nt, &e), &e);
        CHECK(nt == 1 && ts && ts[0].nbytes == 16 && ts[0].data == b + n - 16);
        mx_st_free_tensors(ts, nt);
        /* every truncation of a valid image fails cleanly */
        for (size_t k = 0; k < n; k++) {
            int rc = mx_st_parse(b, k, "cut", &ts, &nt, &e);
            CHECKF(rc != 0, "truncated to %zu bytes parsed", k);
        }
        free(b);
    }
    {
        mx_tensor *ts;
        size_t nt;
        mx_err e = {0};
        const uint8_t tiny[4] = {1, 0, 0, 0};
        CHECK_FAILS(mx_st_parse(tiny, sizeof tiny, "bad.safetensors", &ts, &nt, &e), &e);
    }
    const char *ok1 = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_bad("header past end", ok1, 8, 4096, NULL);
    expect_bad("header > max", ok1, 8, (uint64_t)MX_ST_MAX_HEADER + 1, NULL);
    expect_bad("header len 2^63", ok1, 8, 1ull << 63, NULL);
    expect_bad("garbage header", "\x01\x02garbage\xff\xfe", 0, 0, NULL);
    expect_bad("empty header", "", 8, 0, NULL);
    expect_bad("trailing garbage", "{}  x", 0, 0, NULL);
    expect_bad("not an object", "[1,2,3]", 0, 0, NULL);
    expect_bad("string header", "\"abc\"", 0, 0, NULL);
    expect_bad("entry not object", "{\"t\":5}", 0, 0, "'t'");
    expect_bad("unknown dtype",
               "{\"w.x\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0,
               "'w.x'");
    expect_bad("F64 unsupported",
               "{\"w.x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, 0,
               "'w.x'");
    expect_bad("dtype not string",
               "{\"w\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, "'w'");
    expect_bad("missing shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, 0,
               "'w'");
    expect_bad("negative shape",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, 0,
               "'w'");
    expect_bad("float shape",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,6]}}", 8, 0,
               "'w'");
    expect_bad("string shape",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, 0,
               "'w'");
    expect_bad("too many dims",
               "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
               "\"data_offsets\":[0,1]}}", 8, 0, "'w'");
    expect_bad("offsets out of range",
               "{\"model.layers.0.mlp.gate.weight\":{\"dtype\":\"U8\",\"shape\":[10],"
               "\"data_offsets\":[10,20]}}", 12, 0, "model.layers.0.mlp.gate.weight");
    expect_bad("begin > end",
               "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, 0, "'w'");
    expect_bad("offsets 3 values",
               "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4,8]}}", 8, 0, "'w'");
    expect_bad("negative offset",
               "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-4,0]}}", 8, 0, "'w'");
    expect_bad("overlap",
               "{\"a\":{\"dtype\":\"U8\",\"shape\":[6],\"data_offsets\":[0,6]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[6],\"data_offsets\":[4,10]}}", 12, 0, "'a'");
    expect_bad("size mismatch",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12, 0, "'w'");
    expect_bad("shape overflow",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
               "\"data_offsets\":[0,0]}}", 8, 0, "'w'");
    expect_bad("bytes overflow",
               "{\"w\":{\"dtype\":\"I64\",\"shape\":[4611686018427387904],"
               "\"data_offsets\":[0,0]}}", 8, 0, "'w'");
    expect_bad("huge dim",
               "{\"w\":{\"dtype\":\"U8\",\"shape\":[1e300],\"data_offsets\":[0,0]}}", 8, 0,
               "'w'");
    expect_bad("duplicate names",
               "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, 0, "'w'");
    expect_bad("metadata not strings", "{\"__metadata__\":{\"a\":1}}", 0, 0, NULL);
    expect_bad("metadata not object", "{\"__metadata__\":[]}", 0, 0, NULL);
    expect_bad("empty name",
               "{\"\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 8, 0, NULL);
    expect_bad("deep nesting",
               "{\"w\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
               "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
               0, 0, NULL);
    expect_bad("unterminated string", "{\"w\\", 0, 0, NULL);

    /* Holes between tensors and zero-size tensors anywhere are accepted. */
    {
        size_t n;
        uint8_t *b = image("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                           "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]},"
                           "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}",
                           8, 0, &n);
        mx_tensor *ts;
        size_t nt;
        mx_err e = {0};
        CHECK_OK(mx_st_parse(b, n, "holes", &ts, &nt, &e), &e);
        CHECK(nt == 3);
        mx_st_free_tensors(ts, nt);
        free(b);
    }

    /* Files: truncated after a valid header, empty, a directory. */
    char path[256];
    mx_err e = {0};
    mx_st_set *s = NULL;
    path_in(path, sizeof path, NULL, "trunc.safetensors");
    write_image(path, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 9);
    CHECK_FAILS(mx_st_open_file(path, &s, &e), &e);
    CHECK(s == NULL);
    CHECK(strstr(e.msg, "trunc.safetensors") && strstr(e.msg, "'w'"));
    path_in(path, sizeof path, NULL, "empty.safetensors");
    write_bytes(path, "", 0);
    CHECK_FAILS(mx_st_open_file(path, &s, &e), &e);
    CHECK_FAILS(mx_st_open_file(tmpdir, &s, &e), &e);
    path_in(path, sizeof path, NULL, "missing.safetensors");
    CHECK_FAILS(mx_st_open_file(path, &s, &e), &e);
    CHECK(strstr(e.msg, "missing.safetensors") != NULL);
}

static void mkdir_in(const char *sub)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", tmpdir, sub);
    mkdir(p, 0755);
}

static void put(const char *sub, const char *name, const char *text)
{
    char p[256];
    path_in(p, sizeof p, sub, name);
    write_bytes(p, text, strlen(text));
}

static void put_st(const char *sub, const char *name, const char *hdr, size_t dlen)
{
    char p[256];
    path_in(p, sizeof p, sub, name);
    write_image(p, hdr, dlen);
}

static void test_dirs(void)
{
    const char *a = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    const char *b = "{\"b\":{\"dtype\":\"U8\",\"shape\":[2,2],\"data_offsets\":[0,4]},"
                    "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[4,5]}}";
    char dir[256];
    mx_err e = {0};
    mx_st_set *s = NULL;

    /* Good sharded checkpoint; reference.safetensors is not part of it. */
    mkdir_in("sharded");
    put_st("sharded", "m-1.safetensors", a, 4);
    put_st("sharded", "m-2.safetensors", b, 5);
    put_st("sharded", "reference.safetensors", a, 4);
    put("sharded", "model.safetensors.index.json",
        "{\"metadata\":{\"total_size\":9},\"weight_map\":{\"a\":\"m-1.safetensors\","
        "\"b\":\"m-2.safetensors\",\"c\":\"m-2.safetensors\"}}");
    path_in(dir, sizeof dir, NULL, "sharded");
    CHECK_OK(mx_st_open_dir(dir, &s, &e), &e);
    if (s) {
        CHECK(mx_st_count(s) == 3 && mx_st_nfiles(s) == 2);
        const mx_tensor *t = mx_st_find(s, "b");
        CHECK(t && t->ndim == 2 && t->shape[0] == 2 && strstr(t->file, "m-2.safetensors"));
        CHECK(t && ((const uint8_t *)t->data)[3] == 3);
        t = mx_st_find(s, "c");
        CHECK(t && ((const uint8_t *)t->data)[0] == 4);
        mx_st_close(s);
    }

    /* Index naming a missing shard. */
    mkdir_in("noshard");
    put_st("noshard", "m-1.safetensors", a, 4);
    put("noshard", "model.safetensors.index.json",
        "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"b\":\"m-9.safetensors\"}}");
    path_in(dir, sizeof dir, NULL, "noshard");
    CHECK_FAILS(mx_st_open_dir(dir, &s, &e), &e);
    CHECK(s == NULL);
    CHECK(strstr(e.msg, "m-9.safetensors") && strstr(e.msg, "index.json"));

    /* Index naming a tensor absent from its shard. */
    mkdir_in("notensor");
    put_st("notensor", "m-1.safetensors", a, 4);
    put("notensor", "model.safetensors.index.json",
        "{\"weight_map\":{\"a\":\"m-1.safetensors\",\"zz\":\"m-1.safetensors\"}}");
    path_in(dir, sizeof dir, NULL, "notensor");
    CHECK_FAILS(mx_st_open_dir(dir, &s, &e), &e);
    CHECK(strstr(e.msg, "'zz'") && strstr(e.msg, "m-1.safetensors"));

    /* Index mapping a tensor to the wrong shard. */
    mkdir_in("wrong");
    put_st("wrong", "m-1.safetensors", a, 4);
    put_st("wrong", "m-2.safetensors", b, 5);
    put("wrong", "model.safetensors.index.json",
        "{\"weight_map\":{\"a\":\"m-2.safetensors\",\"b\":\"m-1.safetensors\"}}");
    path_in(dir, sizeof dir, NULL, "wrong");
    CHECK_FAILS(mx_st_open_dir(dir, &s, &e), &e);

    /* Bad index files. */
    mkdir_in("badindex");
    put_st("badindex", "m-1.safetensors", a, 4);
    path_in(dir, sizeof dir, NULL, "badindex");
    const char *bad_idx[] = {
        "{\"weight_map\":", "[]", "{\"weight_map\":[]}", "{\"weight_map\":{}}",
        "{\"weight_map\":{\"a\":1}}", "{\"weight_map\":{\"a\":\"../m-1.safetensors\"}}",
        "{\"weight_map\":{\"a\":\"/etc/passwd\"}}",
    };
    for (size_t i = 0; i < sizeof bad_idx / sizeof bad_idx[0]; i++) {
        put("badindex", "model.safetensors.index.json", bad_idx[i]);
        CHECK_FAILS(mx_st_open_dir(dir, &s, &e), &e);
        CHECK(s == NULL);
    }

    /* No index: all *.safetensors, names unique across files. */
    mkdir_in("glob");
    put_st("glob", "x.safetensors", a, 4);
    put_st("glob", "y.safetensors", b, 5);
    put_st("glob", "reference.safetensors", a, 4);
    put("glob", "notes.txt", "hello");
    path_in(dir, sizeof dir, NULL, "glob");
    CHECK_OK(mx_st_open_dir(dir, &s, &e), &e);
    if (s) {
        CHECK(mx_st_count(s) == 3 && mx_st_nfiles(s) == 2);
        mx_st_close(s);
    }
    put_st("glob", "z.safetensors", a, 4);   /* 'a' now in two files */
    CHECK_FAILS(mx_st_open_dir(dir, &s, &e), &e);
    CHECK(strstr(e.msg, "'a'") && strstr(e.msg, "x.safetensors") &&
          strstr(e.msg, "z.safetensors"));
    /* A bad shard fails the whole directory. */
    put_st("glob", "z.safetensors", "{\"q\":1}", 0);
    CHECK_FAILS(mx_st_open_dir(dir, &s, &e), &e);
    CHECK(strstr(e.msg, "z.safetensors") != NULL);

    mkdir_in("none");
    path_in(dir, sizeof dir, NULL, "none");
    CHECK_FAILS(mx_st_open_dir(dir, &s, &e), &e);
    path_in(dir, sizeof dir, NULL, "does-not-exist");
    CHECK_FAILS(mx_st_open_dir(dir, &s, &e), &e);
}

/* Many tensors: the lookup table must find every one. */
static void test_many(void)
{
    enum { N = 20000 };
    mx_st_decl *d = calloc(N, sizeof *d);
    char (*names)[48] = calloc(N, sizeof *names);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.mlp.experts.%d.w", i / 64,
                 i % 64);
        d[i] = (mx_st_decl){.name = names[i], .dtype = MX_U8, .ndim = 1, .shape = {1}};
    }
    char path[256];
    path_in(path, sizeof path, NULL, "many.safetensors");
    mx_err e = {0};
    mx_st_writer *w;
    CHECK_OK(mx_st_writer_open(path, d, N, &w, &e), &e);
    for (int i = 0; i < N; i++) {
        uint8_t v = (uint8_t)i;
        mx_st_writer_write(w, &v, 1, &e);
    }
    CHECK_OK(mx_st_writer_close(w, &e), &e);
    mx_st_set *s;
    CHECK_OK(mx_st_open_file(path, &s, &e), &e);
    if (s) {
        int bad = 0;
        for (int i = 0; i < N; i++) {
            const mx_tensor *t = mx_st_find(s, names[i]);
            bad += !t || *(const uint8_t *)t->data != (uint8_t)i;
        }
        CHECK(bad == 0 && mx_st_count(s) == N);
        mx_st_close(s);
    }
    free(d);
    free(names);
}

static void test_fixtures_dirs(const char *fx)
{
    static const char *dirs[] = {"qwen2_moe_tiny_chat", "qwen2_moe_gqa_mixed",
                                 "qwen3_moe_tiny", "mixtral_tiny", "olmoe_tiny"};
    static const size_t counts[] = {319, 127, 91, 185, 63};
    for (size_t i = 0; i < 5; i++) {
        char dir[512], ref[600];
        snprintf(dir, sizeof dir, "%s/%s", fx, dirs[i]);
        mx_err e = {0};
        mx_st_set *s = NULL;
        CHECK_OK(mx_st_open_dir(dir, &s, &e), &e);
        if (!s)
            continue;
        CHECKF(mx_st_count(s) == counts[i], "%s: %zu tensors", dirs[i], mx_st_count(s));
        CHECK(mx_st_nfiles(s) == (i == 0 ? 2u : 1u));
        CHECK(mx_st_find(s, "model.norm.weight") != NULL);
        int bad = 0;
        for (size_t k = 0; k < mx_st_count(s); k++) {
            const mx_tensor *t = mx_st_at(s, k);
            bad += (uint64_t)mx_tensor_numel(t) * mx_dtype_size(t->dtype) != t->nbytes;
            bad += mx_st_find(s, t->name) != t;
        }
        CHECK(bad == 0);
        const mx_tensor *emb = mx_st_find(s, "model.embed_tokens.weight");
        CHECK(emb && emb->dtype == MX_U32 && emb->ndim == 2);
        if (i == 0) {
            CHECK(emb && emb->shape[0] == 151936 && emb->shape[1] == 16);
            CHECK(mx_st_find(s, "model.layers.0.mlp.experts.7.down_proj.scales") != NULL);
            CHECK(emb && strstr(emb->file, "model-00002-of-00002.safetensors"));
        }
        if (i == 1) {
            CHECK(mx_st_find(s, "lm_head.weight") == NULL);
            /* 6-bit down_proj: in 320 -> 320*6/32 = 60 words */
            const mx_tensor *dp = mx_st_find(s, "model.layers.0.mlp.switch_mlp.down_proj.weight");
            CHECK(dp && dp->ndim == 3 && dp->shape[0] == 16 && dp->shape[2] == 60);
        }
        mx_st_close(s);
        snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
        CHECK_OK(mx_st_open_file(ref, &s, &e), &e);
        if (s) {
            const mx_tensor *t = mx_st_find(s, "prompt_ids");
            CHECK(t && t->dtype == MX_I32 && t->ndim == 1);
            mx_st_close(s);
        }
    }
}

static void rm_rf(const char *p)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", p);
}

int main(void)
{
    strcpy(tmpdir, "/tmp/mx_st_test.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_writer_errors();
    test_bad_inputs();
    test_dirs();
    test_many();
    const char *fx = getenv("MLXCEL_FIXTURES");
    if (fx && *fx && (fx = test_fixtures()))
        test_fixtures_dirs(fx);
    else
        fprintf(stderr, "note: MLXCEL_FIXTURES unset; fixture checks skipped\n");
    rm_rf(tmpdir);
    return test_summary();
}
