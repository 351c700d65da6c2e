/* test_cli_generate.c - the generate command end to end on the chat
 * fixture: the chat template renders the prompt the reference used, greedy
 * ids match the reference, and the dispatch trace proves which MoE path ran
 * (fused = MoE layers x decode steps with the flag on, 0 with it off;
 * prefill always on the gather path). */
#include "test.h"

#include <stdint.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "gen/gen.h"
#include "util/file.h"

static char *run(const char *cmd, char **err_out)
{
    char errf[] = "/tmp/mlxcel-test-XXXXXX";
    int fd = mkstemp(errf);
    if (fd < 0)
        return NULL;
    close(fd);
    char full[4096];
    snprintf(full, sizeof full, "%s 2>%s", cmd, errf);
    FILE *p = popen(full, "r");
    char *buf = calloc(1, 1 << 16);
    size_t n = 0, k;
    while (p && buf && (k = fread(buf + n, 1, (1 << 16) - n - 1, p)) > 0)
        n += k;
    int st = p ? pclose(p) : -1;
    mx_err e;
    size_t len;
    if (err_out && mx_read_file(errf, err_out, &len, &e))
        *err_out = NULL;
    unlink(errf);
    if (st != 0) {
        fprintf(stderr, "command failed (%d): %s\n", st, full);
        free(buf);
        return NULL;
    }
    return buf;
}

static int parse_ids(const char *s, int32_t *ids, int max)
{
    int n = 0;
    char *end;
    while (n < max) {
        long v = strtol(s, &end, 10);
        if (end == s)
            break;
        ids[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

int main(void)
{
    const char *root = test_fixtures();
    if (!root)
        return TEST_SKIP;
    const char *bin = getenv("MLXCEL_BIN");
    if (!bin)
        bin = "build/mlxcel";
    char dir[1024], refp[1100], cmd[3000];
    snprintf(dir, sizeof dir, "%s/qwen2_moe_tiny_chat", root);
    snprintf(refp, sizeof refp, "%s/reference.safetensors", dir);
    mx_err e = {0};
    mx_st_set *ref = NULL;
    CHECK_OK(mx_st_open_file(refp, &ref, &e), &e);
    if (!ref)
        return test_summary();
    const mx_tensor *tp = mx_st_find(ref, "prompt_ids"), *tg = mx_st_find(ref, "greedy_ids");
    CHECK(tp && tg);
    if (!tp || !tg)
        return test_summary();
    const int T = (int)tp->shape[0], N = (int)tg->shape[0];
    const int32_t *prompt = tp->data, *greedy = tg->data;
    const char *msg = "What is a mixture of experts?";

    /* the rendered chat prompt tokenizes to the reference prompt */
    mx_engine *g = NULL;
    CHECK_OK(mx_engine_load(dir, MX_TOKENIZER_REQUIRED, &g, &e), &e);
    if (g) {
        mx_chat_msg m = {"user", msg};
        int32_t *ids = NULL;
        int n = 0;
        char *text = NULL;
        CHECK_OK(mx_engine_encode_chat(g, &m, 1, &ids, &n, &text, &e), &e);
        int same = n == T;
        for (int i = 0; same && i < n; i++)
            same = ids[i] == prompt[i];
        CHECKF(same, "rendered prompt tokenizes to %d ids, reference has %d:\n%s", n, T, text ? text : "");
        free(ids);
        free(text);
        mx_engine_free(g);
    }

    /* greedy ids through the CLI, fused on and off, with the trace */
    static const char *const flags[] = {"1", "0", "OFF"};
    for (int f = 0; f < 3; f++) {
        snprintf(cmd, sizeof cmd,
                 "MLXCEL_FUSED_MOE=%s MLXCEL_TRACE_MOE=1 '%s' generate -m '%s' --chat '%s' --temp 0 -n %d --ids-only",
                 flags[f], bin, dir, msg, N);
        char *err = NULL;
        char *out = run(cmd, &err);
        CHECKF(out != NULL, "%s", cmd);
        if (!out)
            continue;
        int32_t got[256];
        int n = parse_ids(out, got, 256);
        int same = n == N;
        for (int i = 0; same && i < n; i++)
            same = got[i] == greedy[i];
        CHECKF(same, "MLXCEL_FUSED_MOE=%s: greedy ids differ from the reference: %s", flags[f], out);
        /* stdout is exactly the ids and a newline */
        CHECKF(out[strlen(out) - 1] == '\n' && strchr(out, '\n') == out + strlen(out) - 1,
               "stdout has more than one line: %s", out);
        long fused = -1, gather = -1;
        const char *line = err ? strstr(err, "moe-dispatch ") : NULL;
        if (line)
            sscanf(line, "moe-dispatch fused=%ld gather=%ld", &fused, &gather);
        const long layers = 3, steps = N - 1;
        if (f == 0)
            CHECKF(fused == layers * steps && gather == layers, "trace: fused=%ld gather=%ld", fused, gather);
        else
            CHECKF(fused == 0 && gather == layers * (steps + 1), "trace: fused=%ld gather=%ld", fused, gather);
        free(err);
        free(out);
    }

    /* --dump-logits writes the last prompt logits (raw f32) */
    char dump[] = "/tmp/mlxcel-logits-XXXXXX";
    int fd = mkstemp(dump);
    close(fd);
    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' --chat '%s' --temp 0 -n 1 --ids-only --dump-logits %s",
             bin, dir, msg, dump);
    char *out = run(cmd, NULL);
    free(out);
    char *raw = NULL;
    size_t len = 0;
    const mx_tensor *tl = mx_st_find(ref, "prefill_last_logits");
    CHECK_OK(mx_read_file(dump, &raw, &len, &e), &e);
    if (raw && tl) {
        CHECK(len == tl->nbytes);
        double worst = 0;
        const float *a = (const float *)raw, *b = tl->data;
        for (size_t i = 0; len == tl->nbytes && i < len / 4; i++)
            if (fabs(a[i] - b[i]) > worst)
                worst = fabs(a[i] - b[i]);
        CHECKF(worst < 1e-3, "dumped logits differ by %g", worst);
    }
    free(raw);
    unlink(dump);
    mx_st_close(ref);
    return test_summary();
}
