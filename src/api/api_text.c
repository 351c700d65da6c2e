/* api_text.c - the tokenizer and the chat template through the public API. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"

/* The model's engine when it has a tokenizer; else the error, recorded. */
static int with_tokenizer(const mlxcel_model *m, const char *fn, const mx_engine **g)
{
    const mlxcel_model *mm = api_model(m, fn);
    if (!mm)
        return MLXCEL_EINVAL;
    if (!mm->g->tok)
        return api_fail(MLXCEL_EUNSUPPORTED, fn, "%s has no tokenizer.json", mm->g->model->dir);
    *g = mm->g;
    return MLXCEL_OK;
}

int mlxcel_tokenize(const mlxcel_model *m, const char *text, size_t len, int parse_special,
                    int32_t **ids, size_t *n)
{
    static const char fn[] = "mlxcel_tokenize";
    if (!ids || !n)
        return api_fail(MLXCEL_EINVAL, fn, "ids and n must not be NULL");
    *ids = NULL;
    *n = 0;
    const mx_engine *g = NULL;
    int rc = with_tokenizer(m, fn, &g);
    if (rc)
        return rc;
    if (!text && len)
        return api_fail(MLXCEL_EINVAL, fn, "text is NULL");
    mx_err e = {0};
    if (mx_tok_encode(g->tok, text ? text : "", len, parse_special != 0, ids, n, &e))
        return api_fail_err(fn, &e);
    /* an empty text still gives a buffer the caller may free */
    if (!*ids && !(*ids = malloc(sizeof **ids)))
        return api_fail(MLXCEL_ENOMEM, fn, "out of memory");
    return MLXCEL_OK;
}

int mlxcel_detokenize(const mlxcel_model *m, const int32_t *ids, size_t n, int skip_special,
                      char **text, size_t *len)
{
    static const char fn[] = "mlxcel_detokenize";
    if (!text)
        return api_fail(MLXCEL_EINVAL, fn, "text must not be NULL");
    *text = NULL;
    if (len)
        *len = 0;
    const mx_engine *g = NULL;
    int rc = with_tokenizer(m, fn, &g);
    if (rc)
        return rc;
    if (!ids && n)
        return api_fail(MLXCEL_EINVAL, fn, "ids is NULL");
    const int32_t vocab = mx_tok_vocab_size(g->tok);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return api_fail(MLXCEL_ERANGE, fn, "ids[%zu] = %d is outside the tokenizer's vocabulary "
                                               "(0..%d)", i, (int)ids[i], (int)vocab - 1);
    mx_err e = {0};
    size_t l = 0;
    if (mx_tok_decode(g->tok, ids, n, skip_special != 0, text, &l, &e))
        return api_fail_err(fn, &e);
    if (len)
        *len = l;
    return MLXCEL_OK;
}

int32_t mlxcel_token_id(const mlxcel_model *m, const char *token)
{
    static const char fn[] = "mlxcel_token_id";
    const mx_engine *g = NULL;
    if (with_tokenizer(m, fn, &g))
        return -1;
    if (!token) {
        api_fail(MLXCEL_EINVAL, fn, "token is NULL");
        return -1;
    }
    return mx_tok_lookup(g->tok, token);
}

/* Parses an argument that must be JSON of one type (cJSON_IsArray, ...);
 * NULL text gives NULL when the argument is optional. */
static int parse_json(const char *text, cJSON_bool (*is)(const cJSON *), const char *name,
                      const char *kind, const char *fn, cJSON **out)
{
    *out = NULL;
    if (!text)
        return MLXCEL_OK;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
    if (!j) {
        size_t at = end ? (size_t)(end - text) : 0;
        return api_fail(MLXCEL_EINVAL, fn, "%s is not valid JSON (at byte %zu)", name, at);
    }
    if (!is(j)) {
        cJSON_Delete(j);
        return api_fail(MLXCEL_EINVAL, fn, "%s must be a JSON %s", name, kind);
    }
    *out = j;
    return MLXCEL_OK;
}

int mlxcel_chat_render(const mlxcel_model *m, const char *messages_json, const char *tools_json,
                       const char *extra_json, int add_generation_prompt, char **text)
{
    static const char fn[] = "mlxcel_chat_render";
    if (!text)
        return api_fail(MLXCEL_EINVAL, fn, "text must not be NULL");
    *text = NULL;
    const mx_engine *g = NULL;
    int rc = with_tokenizer(m, fn, &g);
    if (rc)
        return rc;
    if (!messages_json)
        return api_fail(MLXCEL_EINVAL, fn, "messages_json is NULL");
    cJSON *msgs = NULL, *tools = NULL, *extra = NULL;
    if (!(rc = parse_json(messages_json, cJSON_IsArray, "messages_json", "array", fn, &msgs)) &&
        !(rc = parse_json(tools_json, cJSON_IsArray, "tools_json", "array", fn, &tools)) &&
        !(rc = parse_json(extra_json, cJSON_IsObject, "extra_json", "object", fn, &extra))) {
        mx_err e = {0};
        if (mx_chat_render_json(g->tmpl, msgs, tools, extra, add_generation_prompt != 0, text, &e))
            rc = api_fail_err(fn, &e);
    }
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(extra);
    return rc;
}
