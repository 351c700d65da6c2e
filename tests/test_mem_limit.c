/* test_mem_limit.c - out of memory said up front: a KV cache (--ctx-size x
 * sequences) that does not fit the available memory fails at set-up with
 * needed vs available bytes; one that fits only when the weights are paged
 * from disk runs (with a warning); MLXCEL_MEM_AVAILABLE stands in for the
 * machine's number.  Runs on the bundled demo model (no fixtures needed). */
#include "test.h"

#include <stdint.h>

#include "gen/gen.h"
#include "server/server.h"
#include "util/sysinfo.h"

static void set_avail(uint64_t bytes)
{
    char b[32];
    snprintf(b, sizeof b, "%llu", (unsigned long long)bytes);
    setenv("MLXCEL_MEM_AVAILABLE", b, 1);
}

static int has_number(const char *msg, uint64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%llu bytes", (unsigned long long)v);
    return strstr(msg, b) != NULL;
}

static void available(void)
{
    const char *src = NULL;
    unsetenv("MLXCEL_MEM_AVAILABLE");
    uint64_t real = mx_mem_available(&src);
    CHECKF(real > 0 && src && strcmp(src, "MLXCEL_MEM_AVAILABLE"), "%llu from %s",
           (unsigned long long)real, src ? src : "?");
    setenv("MLXCEL_MEM_AVAILABLE", "3K", 1);
    CHECK(mx_mem_available(&src) == 3072 && !strcmp(src, "MLXCEL_MEM_AVAILABLE"));
    setenv("MLXCEL_MEM_AVAILABLE", "2GiB", 1);
    CHECK(mx_mem_available(NULL) == 2ull << 30);
    setenv("MLXCEL_MEM_AVAILABLE", "12345", 1);
    CHECK(mx_mem_available(NULL) == 12345);
    /* not a number: the machine's own */
    setenv("MLXCEL_MEM_AVAILABLE", "lots", 1);
    CHECK(mx_mem_available(&src) > 0 && strcmp(src, "MLXCEL_MEM_AVAILABLE"));
    unsetenv("MLXCEL_MEM_AVAILABLE");
}

int main(void)
{
    available();
    const char *src = getenv("MLXCEL_SRC");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/kjv-moe", src ? src : ".");
    mx_engine *g = NULL;
    mx_err e = {0};
    if (mx_engine_load(dir, MX_TOKENIZER_REQUIRED, &g, &e)) {
        fprintf(stderr, "FAIL: %s\n", e.msg);
        return 1;
    }
    const mx_model *m = g->model;

    /* the KV cache: keys and values of every layer (qwen2_moe: all of one
     * geometry, no recurrent state), f32, plus the ids */
    mx_mem_need need = mx_engine_memory_need(g, 512, 3);
    uint64_t kv1 = 2ull * (uint64_t)m->n_layers * (uint64_t)m->n_kv * 512 * (uint64_t)m->head_dim * 4;
    CHECK(mx_model_kv_bytes(m, 512) == kv1 && mx_model_state_floats(m) == 0);
    CHECK(need.kv == 3 * (kv1 + 512 * 4));
    CHECK(need.weights == mx_model_weight_bytes(m) && need.weights > 0 && need.scratch > 0);
    uint64_t run = need.kv + need.scratch;

    /* not even the KV cache fits: an error with both numbers */
    set_avail(run - 1);
    e = (mx_err){0};
    CHECK(mx_engine_check_memory(g, 512, 3, &e) == MX_ENOMEM);
    CHECKF(has_number(e.msg, run) && has_number(e.msg, run - 1) && has_number(e.msg, need.kv) &&
               strstr(e.msg, "--parallel") && strstr(e.msg, "MLXCEL_MEM_AVAILABLE"),
           "%s", e.msg);
    /* the KV cache fits, the weights do not: paged from disk, a warning */
    set_avail(run);
    CHECK(mx_engine_check_memory(g, 512, 3, &e) == MX_OK);
    set_avail(run + need.weights);
    CHECK(mx_engine_check_memory(g, 512, 3, &e) == MX_OK);

    /* a session checks its own sequence */
    mx_session *s = NULL;
    set_avail(mx_engine_memory_need(g, 64, 1).kv + mx_engine_memory_need(g, 64, 1).scratch);
    CHECK_OK(mx_session_new(g, 64, &s, &e), &e);
    mx_session_free(s);
    s = NULL;
    CHECK(mx_session_new(g, 4096, &s, &e) == MX_ENOMEM && !s && strstr(e.msg, "--ctx-size"));

    /* the server checks all its slots before it listens */
    mx_server_opts o;
    mx_server_opts_defaults(&o);
    o.port = 0;
    o.quiet = 1;
    o.parallel = 64;
    o.n_ctx = 2048;
    set_avail(mx_engine_memory_need(g, 2048, 63).kv + mx_engine_memory_need(g, 2048, 63).scratch);
    mx_server *srv = NULL;
    e = (mx_err){0};
    CHECK(mx_server_start(g, &o, &srv, &e) == MX_ENOMEM && !srv &&
          has_number(e.msg, mx_engine_memory_need(g, 2048, 64).kv));
    if (srv)
        mx_server_stop(srv);
    unsetenv("MLXCEL_MEM_AVAILABLE");
    mx_engine_free(g);
    return test_summary();
}
