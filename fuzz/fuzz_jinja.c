/* fuzz_jinja.c - libFuzzer entry: chat templates are programs that come
 * with a checkpoint.  Input: one byte of flags, then a template, a NUL, and
 * JSON.  Flags bit 0 picks the path:
 *  0  mx_jinja_render of the template with the JSON as its variables (any
 *     JSON: a non-object is an empty context);
 *  1  the chat path (mx_chat_template_from_string + mx_chat_render_json,
 *     what `mlxcel template`, generate --chat and the server run) with the
 *     JSON's "messages", "tools" and the rest as extra variables;
 * bit 1: add_generation_prompt.  Every template must render or fail with a
 * message, within the engine's limits (depth, steps, output, memory). */
#include "fuzz_util.h"

#include <cjson/cJSON.h>

#include "chat/template.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    return 0;
}

static void check_result(int rc, char *out, const mx_err *e)
{
    if (rc == 0 && !out)
        abort();
    if (rc != 0 && (out || !e->msg[0]))
        abort();   /* an error says why and hands back nothing */
    free(out);
}

static void render_plain(const char *tmpl, cJSON *ctx)
{
    char *out = NULL;
    mx_err e = {0};
    cJSON *empty = NULL;
    if (!cJSON_IsObject(ctx))
        ctx = empty = cJSON_CreateObject();
    int rc = mx_jinja_render(tmpl, ctx, &out, &e);
    check_result(rc, out, &e);
    cJSON_Delete(empty);
    /* the syntax check agrees with rendering about parse errors */
    mx_err e2 = {0};
    if (mx_jinja_check(tmpl, &e2) != 0 && rc == 0)
        abort();
}

static void render_chat(const char *tmpl, cJSON *ctx, int gen)
{
    mx_chat_template *t = NULL;
    mx_err e = {0};
    if (mx_chat_template_from_string(tmpl, "<s>", "</s>", &t, &e)) {
        if (t || !e.msg[0])
            abort();
        return;
    }
    cJSON *msgs = cJSON_DetachItemFromObjectCaseSensitive(ctx, "messages");
    cJSON *tools = cJSON_DetachItemFromObjectCaseSensitive(ctx, "tools");
    if (!msgs)
        msgs = cJSON_CreateArray();
    char *out = NULL;
    int rc = mx_chat_render_json(t, msgs, tools, cJSON_IsObject(ctx) ? ctx : NULL, gen, &out, &e);
    check_result(rc, out, &e);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    mx_chat_template_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *tmpl, *json;
    size_t nj;
    if (fz_split(data + 1, size - 1, &tmpl, &json, &nj))
        return 0;
    cJSON *ctx = cJSON_ParseWithLength(json, nj);
    if (data[0] & 1) {
        if (!cJSON_IsObject(ctx)) {
            cJSON_Delete(ctx);
            ctx = cJSON_CreateObject();
        }
        if (ctx)
            render_chat(tmpl, ctx, data[0] >> 1 & 1);
    }
    else
        render_plain(tmpl, ctx);
    cJSON_Delete(ctx);
    free(tmpl);
    free(json);
    return 0;
}
