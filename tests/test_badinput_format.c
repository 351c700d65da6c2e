/* test_badinput_format.c - deterministic mutation testing of the safetensors
 * and config parsers, so CI (and the ASan build) exercises thousands of
 * malformed inputs without needing libFuzzer.  Seeds are small built-in
 * files plus, when MLXCEL_FIXTURES is set, the fixture headers and configs.
 * Every input must either parse to something self-consistent or fail with a
 * message; a crash or sanitizer report fails the test. */
#include "format/config.h"
#include "format/safetensors.h"
#include "test.h"

#include <dirent.h>
#include <stdint.h>
#include "util/file.h"

typedef struct seed {
    uint8_t *p;
    size_t n;
} seed;

static seed st_seeds[32], cfg_seeds[32];
static int n_st, n_cfg;

static void add_seed(seed *arr, int *n, const void *p, size_t len)
{
    if (*n >= 32)
        return;
    arr[*n].p = malloc(len + 1);
    memcpy(arr[*n].p, p, len);
    arr[*n].n = len;
    (*n)++;
}

static void add_st_text(const char *hdr, const char *data)
{
    size_t h = strlen(hdr), d = strlen(data);
    uint8_t *b = malloc(8 + h + d);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    memcpy(b + 8 + h, data, d);
    add_seed(st_seeds, &n_st, b, 8 + h + d);
    free(b);
}

/* Header plus a little data of a fixture file (whole files are MBs). */
static void add_st_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return;
    uint8_t l8[8];
    if (fread(l8, 1, 8, f) == 8) {
        uint64_t h = 0;
        for (int i = 7; i >= 0; i--)
            h = h << 8 | l8[i];
        if (h < (1u << 20)) {
            size_t n = 8 + (size_t)h + 64;
            uint8_t *b = malloc(n);
            memcpy(b, l8, 8);
            n = 8 + fread(b + 8, 1, n - 8, f);
            add_seed(st_seeds, &n_st, b, n);
            free(b);
        }
    }
    fclose(f);
}

static void add_cfg_file(const char *path)
{
    char *t;
    size_t n;
    mx_err e;
    if (mx_read_file(path, &t, &n, &e) == 0) {
        add_seed(cfg_seeds, &n_cfg, t, n);
        free(t);
    }
}

static void load_fixture_seeds(const char *fx)
{
    DIR *d = opendir(fx);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char dir[512], p[1024];
        snprintf(dir, sizeof dir, "%s/%s", fx, de->d_name);
        DIR *sub = opendir(dir);
        struct dirent *fe;
        while (sub && (fe = readdir(sub))) {
            snprintf(p, sizeof p, "%s/%s", dir, fe->d_name);
            size_t l = strlen(fe->d_name);
            if (l > 12 && strcmp(fe->d_name + l - 12, ".safetensors") == 0)
                add_st_file(p);
            else if (strcmp(fe->d_name, "config.json") == 0 ||
                     strcmp(fe->d_name, "model.safetensors.index.json") == 0)
                add_cfg_file(p);
        }
        if (sub)
            closedir(sub);
    }
    if (d)
        closedir(d);
}

/* One random edit: overwrite with a JSON-significant byte, flip bits,
 * truncate, duplicate a slice, or write a digit run. */
static size_t mutate(uint8_t *b, size_t n, size_t cap, unsigned long long *rs)
{
    static const char pick[] = "{}[]\",:-.0123456789eE \\nulltrue";
    if (n == 0)
        return 0;
    size_t at = (size_t)(test_rand_u64(rs) % n);
    switch (test_rand_u64(rs) % 6) {
    case 0:
        b[at] = (uint8_t)pick[test_rand_u64(rs) % (sizeof pick - 1)];
        break;
    case 1:
        b[at] ^= (uint8_t)(1u << (test_rand_u64(rs) % 8));
        break;
    case 2:
        return at;   /* truncate */
    case 3: {
        size_t len = (size_t)(test_rand_u64(rs) % 32);
        if (n + len <= cap) {
            memmove(b + at + len, b + at, n - at);
            n += len;   /* duplicate the bytes that follow */
        }
        break;
    }
    case 4: {
        const char *nums[] = {"99999999999999999999", "-1", "1.5", "1e308", "0",
                              "4294967296", "18446744073709551615"};
        const char *s = nums[test_rand_u64(rs) % 7];
        size_t l = strlen(s);
        if (at + l <= n)
            memcpy(b + at, s, l);
        break;
    }
    default:
        /* the length prefix of a safetensors image */
        b[test_rand_u64(rs) % (n < 8 ? n : 8)] = (uint8_t)test_rand_u64(rs);
        break;
    }
    return n;
}

static int check_st(const uint8_t *b, size_t n)
{
    mx_tensor *ts;
    size_t nt;
    mx_err e = {0};
    if (mx_st_parse(b, n, "mut.safetensors", &ts, &nt, &e) != 0)
        return e.msg[0] != 0 && ts == NULL && nt == 0;
    int ok = 1;
    for (size_t i = 0; i < nt; i++) {
        const uint8_t *p = ts[i].data;
        ok &= p >= b && ts[i].nbytes <= n && p + ts[i].nbytes <= b + n;
        ok &= (uint64_t)mx_tensor_numel(&ts[i]) * mx_dtype_size(ts[i].dtype) == ts[i].nbytes;
    }
    mx_st_free_tensors(ts, nt);
    return ok;
}

static int check_cfg(const uint8_t *b, size_t n)
{
    char *t = malloc(n + 1);
    memcpy(t, b, n);
    t[n] = 0;
    mx_config c;
    mx_err e = {0};
    int ok = 1;
    if (mx_config_parse(t, "mut/config.json", &c, &e) == 0) {
        int bits, gs;
        for (int i = 0; i < c.quant.n_overrides; i++)
            mx_quant_for(&c.quant, c.quant.overrides[i].module, &bits, &gs);
        mx_config_parse_generation(t, "mut/generation_config.json", &c, &e);
        ok = c.n_eos >= 0 && c.n_eos <= MX_MAX_EOS;
    } else {
        ok = e.msg[0] != 0 && c.quant.overrides == NULL;
    }
    mx_config_free(&c);
    free(t);
    return ok;
}

static void run(seed *seeds, int ns, int iters, int (*check)(const uint8_t *, size_t),
                const char *what)
{
    unsigned long long rs = 0x9e3779b97f4a7c15ull;
    int bad = 0, total = 0;
    for (int s = 0; s < ns; s++) {
        size_t cap = seeds[s].n + 256;
        uint8_t *b = malloc(cap);
        for (int it = 0; it < iters; it++) {
            memcpy(b, seeds[s].p, seeds[s].n);
            size_t n = seeds[s].n;
            int edits = 1 + (int)(test_rand_u64(&rs) % 4);
            for (int k = 0; k < edits; k++)
                n = mutate(b, n, cap, &rs);
            /* an exact-size copy so ASan sees any read past the end */
            uint8_t *x = malloc(n ? n : 1);
            memcpy(x, b, n);
            if (!check(x, n)) {
                bad++;
                fprintf(stderr, "%s: seed %d iteration %d inconsistent\n", what, s, it);
            }
            free(x);
            total++;
        }
        free(b);
        CHECKF(check(seeds[s].p, seeds[s].n), "%s: seed %d does not parse", what, s);
    }
    CHECK(bad == 0);
    fprintf(stderr, "%s: %d mutated inputs from %d seeds\n", what, total, ns);
}

int main(void)
{
    add_st_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", "abcdefgh");
    add_st_text("{\"__metadata__\":{\"format\":\"mlx\"},\"b\":{\"dtype\":\"U8\",\"shape\":[1,3],"
                "\"data_offsets\":[0,3]},\"c\":{\"dtype\":\"BF16\",\"shape\":[],"
                "\"data_offsets\":[3,5]}}   ", "xyzwv");
    const char *cfg = "{\"model_type\":\"qwen2_moe\",\"hidden_size\":8,\"rope_parameters\":"
                      "{\"rope_type\":\"default\",\"rope_theta\":10000.0},\"eos_token_id\":[1,2],"
                      "\"sliding_window\":null,\"mlp_only_layers\":[1],\"quantization\":"
                      "{\"group_size\":64,\"bits\":4,\"lm_head\":false,\"m.gate\":{\"bits\":8}}}";
    add_seed(cfg_seeds, &n_cfg, cfg, strlen(cfg));
    const char *fx = getenv("MLXCEL_FIXTURES");
    if (fx && *fx && (fx = test_fixtures()))
        load_fixture_seeds(fx);
    /* Fewer iterations under sanitizers keep the run short. */
    int iters = getenv("MLXCEL_SANITIZED") ? 300 : 1500;
    run(st_seeds, n_st, iters, check_st, "safetensors");
    run(cfg_seeds, n_cfg, iters, check_cfg, "config");
    for (int i = 0; i < n_st; i++)
        free(st_seeds[i].p);
    for (int i = 0; i < n_cfg; i++)
        free(cfg_seeds[i].p);
    return test_summary();
}
