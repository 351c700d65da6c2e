/* template.c - the public chat-template API: rendering a Jinja template
 * against a JSON context, and loading a model's chat template and special
 * token strings from tokenizer_config.json. */
#include "chat/template.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chat/jinja_int.h"
#include "util/file.h"

/* Used when a model ships no chat template: plain ChatML. */
static const char FALLBACK[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

struct mx_chat_template {
    char *tmpl;
    char *tool_tmpl;             /* the "tool_use" template of a named list, or NULL */
    char *bos, *eos;
    int fallback;
};

/* Parses (and renders, when ctx is given) with all errors caught. */
static int jinja_run(const char *tmpl, const cJSON *ctx, int render, char **out, mx_err *e)
{
    jstate *st = calloc(1, sizeof *st);
    if (!st)
        return mx_fail(e, MX_ENOMEM, "chat template: out of memory");
    volatile int phase = 0;
    if (setjmp(st->jb)) {
        int code = phase == 0 ? MX_EFORMAT : MX_EINVAL;
        mx_fail(e, code, "chat template %s: %s", phase == 0 ? "syntax error" : "error", st->err);
        ja_free_all(st);
        free(st);
        if (out)
            *out = NULL;
        return code;
    }
    jnode *root = jj_parse(st, tmpl, strlen(tmpl));
    phase = 1;
    if (render) {
        jrender r = {.st = st};
        if (ctx && cJSON_IsObject(ctx)) {
            jv g = jv_from_cjson(st, ctx);
            r.globals = g.u.d;
        }
        jscope *top = ja_alloc(st, sizeof *top);
        jj_enter_root(&r, top, root);
        jj_exec(&r, top, root, &r.out);
        char *s = malloc(r.out.n + 1);
        if (!s) {
            ja_free_all(st);
            free(st);
            return mx_fail(e, MX_ENOMEM, "chat template: out of memory for the output");
        }
        if (r.out.n)
            memcpy(s, r.out.p, r.out.n);
        s[r.out.n] = 0;
        *out = s;
    }
    ja_free_all(st);
    free(st);
    return MX_OK;
}

int mx_jinja_render(const char *tmpl, const struct cJSON *ctx, char **out, mx_err *e)
{
    *out = NULL;
    if (!tmpl)
        return mx_fail(e, MX_EINVAL, "chat template: no template");
    return jinja_run(tmpl, ctx, 1, out, e);
}

int mx_jinja_check(const char *tmpl, mx_err *e)
{
    if (!tmpl)
        return mx_fail(e, MX_EINVAL, "chat template: no template");
    return jinja_run(tmpl, NULL, 0, NULL, e);
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

int mx_chat_template_from_string(const char *tmpl, const char *bos, const char *eos,
                                 mx_chat_template **out, mx_err *e)
{
    *out = NULL;
    int rc = mx_jinja_check(tmpl, e);
    if (rc)
        return rc;
    mx_chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return mx_fail(e, MX_ENOMEM, "chat template: out of memory");
    t->tmpl = strdup(tmpl);
    t->bos = dup_or_null(bos);
    t->eos = dup_or_null(eos);
    if (!t->tmpl || (bos && !t->bos) || (eos && !t->eos)) {
        mx_chat_template_free(t);
        return mx_fail(e, MX_ENOMEM, "chat template: out of memory");
    }
    *out = t;
    return MX_OK;
}

/* A special token as a string, {"content": ...}, or null/absent. */
static const char *token_string(const cJSON *v)
{
    if (cJSON_IsString(v))
        return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c))
            return c->valuestring;
    }
    return NULL;
}

/* chat_template: a string, or a list of {name, template} ("default" wins,
 * else the first; `name` picks another, e.g. "tool_use"). */
static const char *pick_template(const cJSON *ct, const char *want)
{
    if (cJSON_IsString(ct))
        return want ? NULL : ct->valuestring;
    if (!cJSON_IsArray(ct))
        return NULL;
    const char *first = NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, ct)
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *tp = cJSON_GetObjectItemCaseSensitive(it, "template");
        if (!cJSON_IsString(tp))
            continue;
        if (cJSON_IsString(name) && !strcmp(name->valuestring, want ? want : "default"))
            return tp->valuestring;
        if (!first)
            first = tp->valuestring;
    }
    return want ? NULL : first;
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

int mx_chat_template_load(const char *dir, mx_chat_template **out, mx_err *e)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *text = NULL, *side = NULL;
    size_t len = 0;
    cJSON *cfg = NULL;
    const char *tmpl = NULL, *tool_tmpl = NULL, *bos = NULL, *eos = NULL;
    if (file_exists(path)) {
        int rc = mx_read_file(path, &text, &len, e);
        if (rc)
            return rc;
        cfg = cJSON_ParseWithLength(text, len);
        if (!cfg || !cJSON_IsObject(cfg)) {
            cJSON_Delete(cfg);
            free(text);
            return mx_fail(e, MX_EFORMAT, "%s: not a JSON object", path);
        }
        tmpl = pick_template(cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), NULL);
        tool_tmpl = pick_template(cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), "tool_use");
        bos = token_string(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"));
        eos = token_string(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"));
    }
    /* newer checkpoints keep the template beside the config */
    if (!tmpl) {
        char jpath[4096];
        snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
        size_t n;
        if (file_exists(jpath) && mx_read_file(jpath, &side, &n, NULL) == MX_OK)
            tmpl = side;
    }
    int fallback = !tmpl;
    int rc = mx_chat_template_from_string(tmpl ? tmpl : FALLBACK, bos, eos, out, e);
    if (!rc && tool_tmpl && (rc = mx_jinja_check(tool_tmpl, e)) == 0 &&
        !((*out)->tool_tmpl = strdup(tool_tmpl)))
        rc = mx_fail(e, MX_ENOMEM, "chat template: out of memory");
    if (rc) {
        mx_err_prefix(e, "%s", path);
        mx_chat_template_free(*out);
        *out = NULL;
    } else {
        (*out)->fallback = fallback;
    }
    cJSON_Delete(cfg);
    free(text);
    free(side);
    return rc;
}

void mx_chat_template_free(mx_chat_template *t)
{
    if (!t)
        return;
    free(t->tmpl);
    free(t->tool_tmpl);
    free(t->bos);
    free(t->eos);
    free(t);
}

const char *mx_chat_template_eos(const mx_chat_template *t) { return t ? t->eos : NULL; }
const char *mx_chat_template_bos(const mx_chat_template *t) { return t ? t->bos : NULL; }
int mx_chat_template_is_fallback(const mx_chat_template *t) { return t ? t->fallback : 0; }
const char *mx_chat_template_text(const mx_chat_template *t) { return t ? t->tmpl : NULL; }
const char *mx_chat_template_tool_text(const mx_chat_template *t) { return t ? t->tool_tmpl : NULL; }

int mx_chat_render_json(const mx_chat_template *t, const struct cJSON *messages,
                        const struct cJSON *tools, const struct cJSON *extra,
                        int add_generation_prompt, char **out, mx_err *e)
{
    *out = NULL;
    cJSON *ctx = cJSON_CreateObject();
    if (!ctx)
        return mx_fail(e, MX_ENOMEM, "chat template: out of memory");
    /* what transformers' apply_chat_template passes: messages, tools and
     * documents (None when absent), add_generation_prompt, the special
     * tokens that are set, then any extra keyword arguments */
    cJSON_AddItemToObject(ctx, "messages", messages ? cJSON_Duplicate(messages, 1)
                                                    : cJSON_CreateArray());
    cJSON_AddItemToObject(ctx, "tools", tools ? cJSON_Duplicate(tools, 1) : cJSON_CreateNull());
    cJSON_AddNullToObject(ctx, "documents");
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", add_generation_prompt);
    if (t->bos)
        cJSON_AddStringToObject(ctx, "bos_token", t->bos);
    if (t->eos)
        cJSON_AddStringToObject(ctx, "eos_token", t->eos);
    if (cJSON_IsObject(extra)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, extra)
        {
            if (!it->string)
                continue;
            cJSON_DeleteItemFromObjectCaseSensitive(ctx, it->string);
            cJSON_AddItemToObject(ctx, it->string, cJSON_Duplicate(it, 1));
        }
    }
    /* as transformers does: a named "tool_use" template renders requests
     * that have tools */
    int rc = mx_jinja_render(tools && t->tool_tmpl ? t->tool_tmpl : t->tmpl, ctx, out, e);
    cJSON_Delete(ctx);
    return rc;
}

int mx_chat_render(const mx_chat_template *t, const mx_chat_msg *msgs, size_t n,
                   int add_generation_prompt, char **out, mx_err *e)
{
    *out = NULL;
    cJSON *arr = cJSON_CreateArray();
    if (!arr)
        return mx_fail(e, MX_ENOMEM, "chat template: out of memory");
    for (size_t i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, m);
        cJSON_AddStringToObject(m, "role", msgs[i].role ? msgs[i].role : "");
        cJSON_AddStringToObject(m, "content", msgs[i].content ? msgs[i].content : "");
    }
    int rc = mx_chat_render_json(t, arr, NULL, NULL, add_generation_prompt, out, e);
    cJSON_Delete(arr);
    return rc;
}
