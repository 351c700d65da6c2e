/* test_cli_template.c - `mlxcel template` against prompts rendered by Python
 * jinja2 the way transformers renders them:
 *  - every chat case of the real tokenizers' fixtures
 *    ($MLXCEL_FIXTURES/tokenizers/NAME/cases.json, "chat_cases": the
 *    `rendered` text byte for byte, its `rendered_ids` through --ids, and the
 *    `error` cases as errors carrying the template's message);
 *  - the real-template vectors of tests/template_cases/real_templates.json
 *    through --template FILE and --kwarg;
 *  - the prompt generate --chat feeds the model (the fixture's reference
 *    prompt ids) through --ids. */
#include "test.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "util/file.h"

static char tmpdir[] = "/tmp/mx_cli_template_XXXXXX";

typedef struct result {
    int status;          /* exit status, or -1 when it did not exit normally */
    char *out, *err;
    size_t out_len;
} result;

static char *slurp(const char *path, size_t *len)
{
    char *s = NULL;
    mx_err e;
    if (mx_read_file(path, &s, len, &e))
        return NULL;
    return s;
}

/* Runs argv with stdout and stderr to files (no shell: arguments go through
 * exactly as given). */
static result run(char *const *argv)
{
    result r = {.status = -1};
    char outp[512], errp[512];
    snprintf(outp, sizeof outp, "%s/stdout", tmpdir);
    snprintf(errp, sizeof errp, "%s/stderr", tmpdir);
    pid_t pid = fork();
    if (pid == 0) {
        int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int in = open("/dev/null", O_RDONLY);
        if (o < 0 || e < 0 || in < 0)
            _exit(127);
        dup2(o, 1);
        dup2(e, 2);
        dup2(in, 0);
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st))
        r.status = WEXITSTATUS(st);
    size_t n;
    r.out = slurp(outp, &r.out_len);
    r.err = slurp(errp, &n);
    return r;
}

static void result_free(result *r)
{
    free(r->out);
    free(r->err);
}

static void write_json(const char *path, const cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    FILE *f = fopen(path, "wb");
    if (f && s)
        fputs(s, f);
    if (f)
        fclose(f);
    free(s);
}

static void write_text(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(s, f);
        fclose(f);
    }
}

static const char *bin(void)
{
    const char *b = getenv("MLXCEL_BIN");
    return b && *b ? b : "build/mlxcel";
}

/* The argv of `mlxcel template` for a case: messages, tools (when not null),
 * add_generation_prompt, and every other variable as --kwarg KEY=JSON. */
typedef struct cmdline {
    char *argv[96];
    int n;
    char *owned[96];
    int n_owned;
} cmdline;

static void arg(cmdline *c, const char *s)
{
    if (c->n < 94)
        c->argv[c->n++] = (char *)s;
    c->argv[c->n] = NULL;
}

static void arg_owned(cmdline *c, char *s)
{
    if (c->n_owned < 96)
        c->owned[c->n_owned++] = s;
    arg(c, s);
}

static void cmdline_free(cmdline *c)
{
    for (int i = 0; i < c->n_owned; i++)
        free(c->owned[i]);
}

static void build(cmdline *c, const char *dir, const char *tmpl_file, const cJSON *messages,
                  const cJSON *tools, int gen_prompt, const cJSON *extra)
{
    static char mpath[512], tpath[512];
    snprintf(mpath, sizeof mpath, "%s/messages.json", tmpdir);
    snprintf(tpath, sizeof tpath, "%s/tools.json", tmpdir);
    write_json(mpath, messages);
    arg(c, bin());
    arg(c, "template");
    arg(c, "-m");
    arg(c, dir);
    arg(c, "--messages");
    arg(c, mpath);
    if (tmpl_file) {
        arg(c, "--template");
        arg(c, tmpl_file);
    }
    if (tools && !cJSON_IsNull(tools)) {
        write_json(tpath, tools);
        arg(c, "--tools");
        arg(c, tpath);
    }
    if (gen_prompt)
        arg(c, "--add-generation-prompt");
    const cJSON *it;
    cJSON_ArrayForEach(it, extra)
    {
        char *v = cJSON_PrintUnformatted(it);
        size_t len = strlen(it->string) + strlen(v ? v : "") + 2;
        char *kv = malloc(len);
        snprintf(kv, len, "%s=%s", it->string, v ? v : "null");
        free(v);
        arg(c, "--kwarg");
        arg_owned(c, kv);
    }
}

static int same_ids(const char *text, const cJSON *want)
{
    const cJSON *id;
    const char *p = text;
    cJSON_ArrayForEach(id, want)
    {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v != (long)id->valuedouble)
            return 0;
        p = end;
    }
    while (*p == ' ' || *p == '\n')
        p++;
    return *p == 0;
}

static void show_diff(const char *name, const char *want, const char *got, size_t got_len)
{
    size_t i = 0;
    while (want[i] && i < got_len && want[i] == got[i])
        i++;
    fprintf(stderr, "  %s: first difference at byte %zu (want %zu bytes, got %zu)\n", name, i,
            strlen(want), got_len);
}

/* One chat case of a real tokenizer's fixtures. */
static void chat_case(const char *dir, const char *family, const cJSON *c)
{
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
    const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(c, "rendered"));
    const char *err = cJSON_GetStringValue(cJSON_GetObjectItem(c, "error"));
    const cJSON *want_ids = cJSON_GetObjectItem(c, "rendered_ids");
    CHECKF(name && (want || err), "%s: malformed chat case", family);
    if (!name || (!want && !err))
        return;
    cmdline cl = {0};
    build(&cl, dir, NULL, cJSON_GetObjectItem(c, "messages"), cJSON_GetObjectItem(c, "tools"),
          cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")), cJSON_GetObjectItem(c, "extra_context"));
    result r = run(cl.argv);
    if (want) {
        int ok = r.status == 0 && r.out && r.out_len == strlen(want) && !memcmp(r.out, want, r.out_len);
        CHECKF(ok, "%s/%s: exit %d, %s", family, name, r.status, r.err ? r.err : "");
        if (!ok && r.out)
            show_diff(name, want, r.out, r.out_len);
        if (want_ids) {
            arg(&cl, "--ids");
            result ri = run(cl.argv);
            CHECKF(ri.status == 0 && ri.out && same_ids(ri.out, want_ids), "%s/%s --ids: exit %d: %s", family,
                   name, ri.status, ri.out ? ri.out : "");
            result_free(&ri);
        }
    } else {
        /* an error the template raises: exit 1 with its message, nothing on stdout */
        CHECKF(r.status == 1 && r.err && strstr(r.err, err) && r.out_len == 0,
               "%s/%s: want the error '%s', got exit %d: %s", family, name, err, r.status, r.err ? r.err : "");
    }
    printf("%s/%s: %s\n", family, name, want ? "rendered" : "error");
    result_free(&r);
    cmdline_free(&cl);
}

static int fixture_chat_cases(const char *fx)
{
    char root[4096];
    snprintf(root, sizeof root, "%s/tokenizers", fx);
    DIR *d = opendir(root);
    CHECKF(d != NULL, "cannot open %s", root);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char dir[8192], path[8300];
        snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
        snprintf(path, sizeof path, "%s/cases.json", dir);
        size_t len;
        char *text = slurp(path, &len);
        if (!text)
            continue;
        cJSON *doc = cJSON_Parse(text);
        free(text);
        CHECKF(doc != NULL, "%s: invalid JSON", path);
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "chat_cases"))
        {
            chat_case(dir, de->d_name, c);
            n++;
        }
        cJSON_Delete(doc);
    }
    closedir(d);
    return n;
}

/* The real-template vectors: the template from a file, each context
 * variable passed the way a user would. */
static int template_vectors(void)
{
    const char *src = getenv("MLXCEL_SRC");
    char path[4096], tfile[600], empty[600];
    snprintf(path, sizeof path, "%s/tests/template_cases/real_templates.json", src && *src ? src : ".");
    snprintf(tfile, sizeof tfile, "%s/template.jinja", tmpdir);
    snprintf(empty, sizeof empty, "%s/checkpoint", tmpdir);
    mkdir(empty, 0700);
    size_t len;
    char *text = slurp(path, &len);
    CHECKF(text != NULL, "cannot read %s", path);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    free(text);
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, doc)
    {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
        const char *tmpl = cJSON_GetStringValue(cJSON_GetObjectItem(c, "template"));
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(c, "expected"));
        cJSON *ctx = cJSON_Duplicate(cJSON_GetObjectItem(c, "context"), 1);
        if (!name || !tmpl || !ctx) {
            cJSON_Delete(ctx);
            continue;
        }
        write_text(tfile, tmpl);
        cJSON *msgs = cJSON_DetachItemFromObject(ctx, "messages");
        cJSON *tools = cJSON_DetachItemFromObject(ctx, "tools");
        cJSON *agp = cJSON_DetachItemFromObject(ctx, "add_generation_prompt");
        cmdline cl = {0};
        cJSON *empty_list = msgs ? NULL : cJSON_CreateArray();
        build(&cl, empty, tfile, msgs ? msgs : empty_list, tools, cJSON_IsTrue(agp), ctx);
        result r = run(cl.argv);
        if (want) {
            int ok = r.status == 0 && r.out && r.out_len == strlen(want) && !memcmp(r.out, want, r.out_len);
            CHECKF(ok, "vector %s: exit %d: %s", name, r.status, r.err ? r.err : "");
            if (!ok && r.out)
                show_diff(name, want, r.out, r.out_len);
        } else {
            CHECKF(r.status == 1, "vector %s: want an error, got exit %d", name, r.status);
        }
        n++;
        result_free(&r);
        cmdline_free(&cl);
        cJSON_Delete(msgs);
        cJSON_Delete(tools);
        cJSON_Delete(agp);
        cJSON_Delete(empty_list);
        cJSON_Delete(ctx);
    }
    cJSON_Delete(doc);
    return n;
}

/* The rendered prompt is the one generate --chat feeds the model: its ids
 * are the fixture's reference prompt (what transformers tokenized). */
static void generate_prompt(const char *fx)
{
    char dir[4096], ref[4200], mpath[600];
    snprintf(dir, sizeof dir, "%s/qwen2_moe_tiny_chat", fx);
    snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
    snprintf(mpath, sizeof mpath, "%s/chat.json", tmpdir);
    write_text(mpath, "[{\"role\": \"user\", \"content\": \"What is a mixture of experts?\"}]");
    mx_err e = {0};
    mx_st_set *st = NULL;
    CHECK_OK(mx_st_open_file(ref, &st, &e), &e);
    const mx_tensor *tp = st ? mx_st_find(st, "prompt_ids") : NULL;
    CHECK(tp != NULL);
    if (tp) {
        char *argv[] = {(char *)bin(), "template", "-m", dir, "--messages", mpath, "--add-generation-prompt",
                        "--ids", NULL};
        result r = run(argv);
        cJSON *want = cJSON_CreateIntArray((const int *)tp->data, (int)tp->shape[0]);
        CHECKF(r.status == 0 && r.out && same_ids(r.out, want), "template --ids of the generate prompt: %s",
               r.out ? r.out : "");
        cJSON_Delete(want);
        result_free(&r);
    }
    mx_st_close(st);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "cannot make a temporary folder\n");
        return 1;
    }
    int nv = template_vectors();
    printf("real-template vectors through the CLI: %d\n", nv);
    CHECK(nv >= 100);
    const char *fx = getenv("MLXCEL_FIXTURES");
    if (fx && *fx) {
        int nc = fixture_chat_cases(fx);
        printf("real-tokenizer chat cases: %d\n", nc);
        CHECK(nc >= 10);
        generate_prompt(fx);
    } else {
        fprintf(stderr, "SKIP (part): MLXCEL_FIXTURES is not set; the real tokenizers' chat cases are not "
                        "checked\n");
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_summary();
}
