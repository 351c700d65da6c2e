/* test_template.c - the Jinja engine against vectors rendered by Python
 * jinja2 as transformers configures it (the JSON files in tests/template_cases, made by
 * tools/gen_template_cases.py), plus error handling, hostile templates and
 * tokenizer_config.json loading. */
#include "chat/template.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <libgen.h>
#include <unistd.h>

static char *cases_dir(void)
{
    static char buf[4096];
    const char *src = getenv("MLXCEL_SRC");
    if (src && *src) {
        snprintf(buf, sizeof buf, "%s/tests/template_cases", src);
        return buf;
    }
    char file[4096];
    snprintf(file, sizeof file, "%s", __FILE__);
    snprintf(buf, sizeof buf, "%s/template_cases", dirname(file));
    return buf;
}

static void show_diff(const char *want, const char *got)
{
    size_t i = 0;
    while (want[i] && want[i] == got[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "    first difference at byte %zu\n    want: \"", i);
    for (size_t k = from; want[k] && k < i + 40; k++)
        fputs(want[k] == '\n' ? "\\n" : (char[]){want[k], 0}, stderr);
    fprintf(stderr, "\"\n    got:  \"");
    for (size_t k = from; got[k] && k < i + 40; k++)
        fputs(got[k] == '\n' ? "\\n" : (char[]){got[k], 0}, stderr);
    fprintf(stderr, "\"\n");
}

static int run_case(const cJSON *c, const char *file)
{
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
    const char *tmpl = cJSON_GetStringValue(cJSON_GetObjectItem(c, "template"));
    const cJSON *ctx = cJSON_GetObjectItem(c, "context");
    const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(c, "expected"));
    const char *err = cJSON_GetStringValue(cJSON_GetObjectItem(c, "error"));
    const char *etype = cJSON_GetStringValue(cJSON_GetObjectItem(c, "error_type"));
    if (!name || !tmpl || (!want && !err)) {
        fprintf(stderr, "malformed case\n");
        return 0;
    }
    char *out = NULL;
    mx_err e = {0};
    int rc = mx_jinja_render(tmpl, ctx, &out, &e);
    int ok;
    if (want) {
        ok = rc == 0 && out && strcmp(out, want) == 0;
        if (!ok) {
            fprintf(stderr, "FAIL %s %s\n", file, name);
            if (rc)
                fprintf(stderr, "    error: %s\n", e.msg);
            else
                show_diff(want, out);
        }
    } else {
        ok = rc != 0;
        /* raise_exception's message must come through */
        if (ok && etype && !strcmp(etype, "TemplateError") && !strstr(e.msg, err))
            ok = 0;
        if (!ok)
            fprintf(stderr, "FAIL %s %s: expected an error (%s: %s), got %s\n", file, name, etype, err,
                    rc ? e.msg : "success");
    }
    free(out);
    return ok;
}

static void test_vectors(void)
{
    const char *dir = cases_dir();
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "cannot open %s", dir);
    if (!d)
        return;
    struct dirent *de;
    int files = 0, total = 0, good = 0;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 5, ".json"))
            continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        rewind(f);
        char *text = malloc((size_t)len + 1);
        size_t got = fread(text, 1, (size_t)len, f);
        text[got] = 0;
        fclose(f);
        cJSON *arr = cJSON_Parse(text);
        free(text);
        CHECKF(cJSON_IsArray(arr), "%s: not a JSON list", path);
        files++;
        const cJSON *c;
        cJSON_ArrayForEach(c, arr)
        {
            total++;
            int ok = run_case(c, de->d_name);
            good += ok;
            CHECK(ok);
        }
        cJSON_Delete(arr);
    }
    closedir(d);
    printf("template vectors: %d files, %d/%d cases match jinja2\n", files, good, total);
    CHECK(files >= 2);
    CHECK(total >= 200);
}

static int render_str(const char *tmpl, const char *ctx_json, char **out, mx_err *e)
{
    cJSON *ctx = ctx_json ? cJSON_Parse(ctx_json) : NULL;
    int rc = mx_jinja_render(tmpl, ctx, out, e);
    cJSON_Delete(ctx);
    return rc;
}

static void test_errors(void)
{
    char *out;
    mx_err e;
    CHECK_FAILS(render_str("hello {% if x %}", NULL, &out, &e), &e);
    CHECK(strstr(e.msg, "line 1") != NULL);
    CHECK_FAILS(render_str("a\nb\n{{ x | nosuch }}", NULL, &out, &e), &e);
    CHECK(strstr(e.msg, "line 3") != NULL && strstr(e.msg, "nosuch") != NULL);
    CHECK_FAILS(render_str("{{ raise_exception('custom failure 42') }}", NULL, &out, &e), &e);
    CHECK(strstr(e.msg, "custom failure 42") != NULL);
    CHECK(out == NULL);
    /* unbounded macro recursion */
    CHECK_FAILS(render_str("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &out, &e), &e);
    /* deeply nested expressions and blocks are refused, not overflowing the stack */
    size_t depth = 5000;
    char *deep = malloc(depth * 2 + 16);
    size_t k = 0;
    k += (size_t)sprintf(deep + k, "{{ ");
    for (size_t i = 0; i < depth; i++)
        deep[k++] = '(';
    deep[k++] = '1';
    for (size_t i = 0; i < depth; i++)
        deep[k++] = ')';
    k += (size_t)sprintf(deep + k, " }}");
    deep[k] = 0;
    CHECK_FAILS(render_str(deep, NULL, &out, &e), &e);
    free(deep);
    char *nest = malloc(depth * 24 + 16);
    k = 0;
    for (size_t i = 0; i < depth; i++)
        k += (size_t)sprintf(nest + k, "{%% if true %%}");
    for (size_t i = 0; i < depth; i++)
        k += (size_t)sprintf(nest + k, "{%% endif %%}");
    CHECK_FAILS(render_str(nest, NULL, &out, &e), &e);
    free(nest);
    /* runaway loops and output */
    CHECK_FAILS(render_str("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                           NULL, &out, &e), &e);
    CHECK_FAILS(render_str("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(60) %}"
                           "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}", NULL, &out, &e), &e);
    CHECK_FAILS(render_str("{{ 'x' * 1000000000000 }}", NULL, &out, &e), &e);
    /* a non-object context is treated as empty */
    CHECK_OK(render_str("[{{ x }}]", "[1,2]", &out, &e), &e);
    CHECK(out && !strcmp(out, "[]"));
    free(out);
    /* odd bytes in values pass through */
    CHECK_OK(render_str("{{ s|length }}:{{ s }}", "{\"s\":\"a\\u00e9\"}", &out, &e), &e);
    CHECK(out && !strcmp(out, "2:a\xc3\xa9"));
    free(out);
}

static void test_strftime(void)
{
    char *out;
    mx_err e;
    CHECK_OK(render_str("{{ strftime_now('%Y') }}", NULL, &out, &e), &e);
    CHECK(out && strlen(out) == 4 && out[0] >= '1' && out[0] <= '9');
    free(out);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_load(void)
{
    char dir[] = "/tmp/mx_tmpl_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    mx_chat_template *t = NULL;
    mx_err e;

    /* missing file: ChatML fallback */
    CHECK_OK(mx_chat_template_load(dir, &t, &e), &e);
    CHECK(t && mx_chat_template_is_fallback(t));
    CHECK(mx_chat_template_bos(t) == NULL && mx_chat_template_eos(t) == NULL);
    mx_chat_msg msgs[2] = {{"user", "hi"}, {"assistant", "yo"}};
    char *out = NULL;
    CHECK_OK(mx_chat_render(t, msgs, 1, 1, &out, &e), &e);
    CHECK(out && !strcmp(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
    free(out);
    mx_chat_template_free(t);

    /* string template, dict-form tokens */
    write_file(path, "{\"chat_template\": \"{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
                     "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}\", "
                     "\"bos_token\": {\"content\": \"<B>\", \"lstrip\": false}, \"eos_token\": \"<E>\"}");
    CHECK_OK(mx_chat_template_load(dir, &t, &e), &e);
    CHECK(t && !mx_chat_template_is_fallback(t));
    CHECK(t && mx_chat_template_bos(t) && !strcmp(mx_chat_template_bos(t), "<B>"));
    CHECK(t && mx_chat_template_eos(t) && !strcmp(mx_chat_template_eos(t), "<E>"));
    CHECK_OK(mx_chat_render(t, msgs, 2, 0, &out, &e), &e);
    CHECK(out && !strcmp(out, "<B>[user:hi][assistant:yo]<E>"));
    free(out);
    mx_chat_template_free(t);

    /* list of named templates: "default" wins; null bos is undefined */
    write_file(path, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
                     "{\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ messages|length }}\"}], "
                     "\"bos_token\": null, \"eos_token\": \"</s>\"}");
    CHECK_OK(mx_chat_template_load(dir, &t, &e), &e);
    CHECK(t && mx_chat_template_bos(t) == NULL);
    CHECK_OK(mx_chat_render(t, msgs, 2, 1, &out, &e), &e);
    CHECK(out && !strcmp(out, "D2"));
    free(out);
    mx_chat_template_free(t);

    /* list without "default": the first */
    write_file(path, "{\"chat_template\": [{\"name\": \"a\", \"template\": \"first\"}, {\"name\": \"b\", \"template\": \"second\"}]}");
    CHECK_OK(mx_chat_template_load(dir, &t, &e), &e);
    CHECK_OK(mx_chat_render(t, msgs, 0, 0, &out, &e), &e);
    CHECK(out && !strcmp(out, "first"));
    free(out);
    mx_chat_template_free(t);

    /* config without a template: fallback, tokens still read */
    write_file(path, "{\"eos_token\": \"<|im_end|>\"}");
    CHECK_OK(mx_chat_template_load(dir, &t, &e), &e);
    CHECK(t && mx_chat_template_is_fallback(t) && !strcmp(mx_chat_template_eos(t), "<|im_end|>"));
    mx_chat_template_free(t);

    /* bad JSON and bad template syntax are errors */
    write_file(path, "{not json");
    CHECK_FAILS(mx_chat_template_load(dir, &t, &e), &e);
    write_file(path, "{\"chat_template\": \"{% for x in y %}unterminated\"}");
    CHECK_FAILS(mx_chat_template_load(dir, &t, &e), &e);
    unlink(path);
    rmdir(dir);

    /* raise_exception through the chat API */
    CHECK_OK(mx_chat_template_from_string("{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok",
                                          NULL, NULL, &t, &e), &e);
    mx_chat_msg bad[1] = {{"assistant", "x"}};
    CHECK_FAILS(mx_chat_render(t, bad, 1, 1, &out, &e), &e);
    CHECK(strstr(e.msg, "first must be user") != NULL);
    mx_chat_template_free(t);
    CHECK_FAILS(mx_chat_template_from_string("{{ unclosed", NULL, NULL, &t, &e), &e);
}

static void test_fixture(void)
{
    const char *fx = getenv("MLXCEL_FIXTURES");
    if (!fx || !*fx)
        return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/qwen2_moe_tiny_chat", fx);
    mx_chat_template *t = NULL;
    mx_err e;
    CHECK_OK(mx_chat_template_load(dir, &t, &e), &e);
    if (!t)
        return;
    CHECK(!mx_chat_template_is_fallback(t));
    CHECK(mx_chat_template_bos(t) == NULL);
    CHECK(mx_chat_template_eos(t) && !strcmp(mx_chat_template_eos(t), "<|im_end|>"));
    mx_chat_msg msgs[1] = {{"user", "Hi"}};
    char *out = NULL;
    CHECK_OK(mx_chat_render(t, msgs, 1, 1, &out, &e), &e);
    CHECK(out && !strcmp(out, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
    free(out);
    mx_chat_template_free(t);
}

static void test_render_json(void)
{
    /* tools and extra variables reach the template; tools default to None */
    mx_chat_template *t = NULL;
    mx_err e;
    CHECK_OK(mx_chat_template_from_string(
                 "{{ tools is none }}|{% for x in tools or [] %}{{ x.name }}{% endfor %}|"
                 "{{ messages[0].tool_calls[0].function.name }}|{{ enable_thinking }}",
                 NULL, NULL, &t, &e), &e);
    cJSON *msgs = cJSON_Parse("[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                              "[{\"function\":{\"name\":\"f\",\"arguments\":{}}}]}]");
    cJSON *tools = cJSON_Parse("[{\"name\":\"t1\"},{\"name\":\"t2\"}]");
    cJSON *extra = cJSON_Parse("{\"enable_thinking\": false}");
    char *out = NULL;
    CHECK_OK(mx_chat_render_json(t, msgs, tools, extra, 1, &out, &e), &e);
    CHECK(out && !strcmp(out, "False|t1t2|f|False"));
    free(out);
    CHECK_OK(mx_chat_render_json(t, msgs, NULL, NULL, 1, &out, &e), &e);
    CHECK(out && !strcmp(out, "True||f|"));
    free(out);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(extra);
    mx_chat_template_free(t);
}

int main(void)
{
    test_vectors();
    test_errors();
    test_strftime();
    test_load();
    test_fixture();
    test_render_json();
    return test_summary();
}
