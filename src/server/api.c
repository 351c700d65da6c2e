/* api.c - the OpenAI-style JSON of the server: parsing and validating
 * request bodies into srv_req, and building responses, stream chunks and
 * errors.  Nothing here touches HTTP or threads; every bad input becomes a
 * 4xx reply with a message naming the field. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "moe/moe.h"
#include "server/srv_int.h"
#include "util/clock.h"

static const char *error_type(int status)
{
    if (status == 401)
        return "authentication_error";
    if (status == 404)
        return "not_found_error";
    if (status >= 500)
        return "server_error";
    return "invalid_request_error";
}

void srv_error(srv_reply *rep, int status, const char *code, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", msg);
    cJSON_AddStringToObject(err, "type", error_type(status));
    if (code)
        cJSON_AddStringToObject(err, "code", code);
    else
        cJSON_AddNullToObject(err, "code");
    rep->status = status;
    free(rep->body);
    rep->body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
}

/* Prints root into rep with status 200 and frees it. */
static void reply_json(srv_reply *rep, cJSON *root)
{
    free(rep->body);
    rep->body = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (rep->body)
        rep->status = 200;
    else
        srv_error(rep, 500, NULL, "out of memory");
}

/* Deepest nesting of arrays and objects in a JSON text (brackets inside
 * strings do not count).  cJSON would stop at 1000 levels with a generic
 * error; no request needs more than a few dozen. */
static int json_depth(const char *s, size_t n)
{
    int depth = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = 0;
        } else if (ch == '"') {
            in_str = 1;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max)
                max = depth;
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return max;
}

/* The body as a JSON object, or NULL with a 400. */
static cJSON *parse_object(const char *body, size_t len, srv_reply *rep)
{
    if (!body || !len) {
        srv_error(rep, 400, "invalid_json", "the request body is empty (expected a JSON object)");
        return NULL;
    }
    if (json_depth(body, len) > SRV_MAX_JSON_DEPTH) {
        srv_error(rep, 400, "invalid_json",
                  "the request body is too deeply nested (more than %d levels of arrays and objects)",
                  SRV_MAX_JSON_DEPTH);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        srv_error(rep, 400, "invalid_json", "the request body is not valid JSON (near byte %zu)", off);
        return NULL;
    }
    /* only whitespace may follow the value */
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            cJSON_Delete(root);
            srv_error(rep, 400, "invalid_json", "the request body has data after the JSON value");
            return NULL;
        }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        srv_error(rep, 400, "invalid_json", "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

static const cJSON *field(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(v) ? NULL : v;
}

/* An optional number in [lo, hi]; 0 when absent or valid (*out set). */
static int get_number(const cJSON *o, const char *name, double lo, double hi, double *out,
                      srv_reply *rep)
{
    const cJSON *v = field(o, name);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        srv_error(rep, 400, "invalid_type", "'%s' must be a number", name);
        return -1;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        srv_error(rep, 400, "invalid_value", "'%s' must be in [%g, %g] (got %g)", name, lo, hi,
                  v->valuedouble);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

static int get_int(const cJSON *o, const char *name, double lo, double hi, long long *out,
                   srv_reply *rep)
{
    const cJSON *v = field(o, name);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble)) {
        srv_error(rep, 400, "invalid_type", "'%s' must be an integer", name);
        return -1;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        srv_error(rep, 400, "invalid_value", "'%s' must be in [%.0f, %.0f] (got %g)", name, lo, hi,
                  v->valuedouble);
        return -1;
    }
    *out = (long long)v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *o, const char *name, int *out, srv_reply *rep)
{
    const cJSON *v = field(o, name);
    if (!v)
        return 0;
    if (!cJSON_IsBool(v)) {
        srv_error(rep, 400, "invalid_type", "'%s' must be true or false", name);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

static int add_stop(srv_req *r, const cJSON *s, srv_reply *rep)
{
    if (!cJSON_IsString(s)) {
        srv_error(rep, 400, "invalid_type", "'stop' must be a string or a list of strings");
        return -1;
    }
    size_t n = strlen(s->valuestring);
    if (n == 0 || n > SRV_MAX_STOP_LEN) {
        srv_error(rep, 400, "invalid_value", "each 'stop' string must have 1 to %d bytes",
                  SRV_MAX_STOP_LEN);
        return -1;
    }
    if (r->gen.n_stops >= SRV_MAX_STOPS) {
        srv_error(rep, 400, "invalid_value", "at most %d 'stop' strings", SRV_MAX_STOPS);
        return -1;
    }
    if (!(r->stops[r->gen.n_stops] = strdup(s->valuestring))) {
        srv_error(rep, 500, NULL, "out of memory");
        return -1;
    }
    r->gen.n_stops++;
    return 0;
}

static int parse_stops(srv_req *r, const cJSON *o, srv_reply *rep)
{
    const cJSON *v = field(o, "stop");
    if (!v)
        return 0;
    if (!cJSON_IsArray(v))
        return add_stop(r, v, rep);
    const cJSON *s;
    cJSON_ArrayForEach(s, v) if (add_stop(r, s, rep)) return -1;
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100], ...}. */
static int parse_logit_bias(const srv_ctx *c, srv_req *r, const cJSON *o, srv_reply *rep)
{
    const cJSON *b = field(o, "logit_bias");
    if (!b)
        return 0;
    if (!cJSON_IsObject(b)) {
        srv_error(rep, 400, "invalid_type", "'logit_bias' must be an object of token id -> bias");
        return -1;
    }
    int n = cJSON_GetArraySize(b);
    if (n > SRV_MAX_BIAS) {
        srv_error(rep, 400, "invalid_value", "'logit_bias' has %d entries (at most %d)", n, SRV_MAX_BIAS);
        return -1;
    }
    if (!n)
        return 0;
    r->bias_ids = malloc(sizeof *r->bias_ids * (size_t)n);
    r->bias_vals = malloc(sizeof *r->bias_vals * (size_t)n);
    if (!r->bias_ids || !r->bias_vals) {
        srv_error(rep, 500, NULL, "out of memory");
        return -1;
    }
    const int vocab = c->g->model->vocab;
    const cJSON *v;
    size_t k = 0;
    cJSON_ArrayForEach(v, b)
    {
        char *end;
        long id = strtol(v->string, &end, 10);
        if (!*v->string || *end || id < 0 || id >= vocab) {
            srv_error(rep, 400, "invalid_value", "'logit_bias': '%.40s' is not a token id in [0, %d)",
                      v->string, vocab);
            return -1;
        }
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < -100 ||
            v->valuedouble > 100) {
            srv_error(rep, 400, "invalid_value", "'logit_bias'[\"%ld\"] must be a number in [-100, 100]", id);
            return -1;
        }
        r->bias_ids[k] = (int32_t)id;
        r->bias_vals[k++] = (float)v->valuedouble;
    }
    r->gen.bias_ids = r->bias_ids;
    r->gen.bias_vals = r->bias_vals;
    r->gen.n_bias = k;
    return 0;
}

/* Chat: "logprobs": bool, "top_logprobs": 0..20.  Completions:
 * "logprobs": 0..20 (the number of alternatives; null: off). */
static int parse_logprobs(srv_req *r, const cJSON *o, srv_reply *rep)
{
    long long top = 0;
    if (r->kind == SRV_CHAT) {
        if (get_bool(o, "logprobs", &r->gen.logprobs, rep) ||
            get_int(o, "top_logprobs", 0, MX_MAX_TOP_LOGPROBS, &top, rep))
            return -1;
        if (field(o, "top_logprobs") && !r->gen.logprobs) {
            srv_error(rep, 400, "invalid_value", "'top_logprobs' needs 'logprobs': true");
            return -1;
        }
    } else if (field(o, "logprobs")) {
        if (get_int(o, "logprobs", 0, MX_MAX_TOP_LOGPROBS, &top, rep))
            return -1;
        r->gen.logprobs = 1;
    }
    r->gen.top_logprobs = (int)top;
    return 0;
}

/* Completions fields this server does not implement: an error, not a
 * silently different answer. */
static int refuse_unsupported(const srv_req *r, const cJSON *o, srv_reply *rep)
{
    if (r->kind != SRV_COMPLETION)
        return 0;
    const cJSON *v;
    if ((v = field(o, "echo")) && !cJSON_IsFalse(v)) {
        srv_error(rep, 400, "unsupported_value", "'echo' is not supported");
        return -1;
    }
    if ((v = field(o, "suffix")) && !(cJSON_IsString(v) && !*v->valuestring)) {
        srv_error(rep, 400, "unsupported_value", "'suffix' (insertion) is not supported");
        return -1;
    }
    if ((v = field(o, "best_of")) && !(cJSON_IsNumber(v) && v->valuedouble == r->n)) {
        srv_error(rep, 400, "unsupported_value", "'best_of' is not supported (other than equal to 'n')");
        return -1;
    }
    return 0;
}

/* A token's bytes for the grammar: special tokens and ids past the
 * tokenizer (padding rows) are never produced under a grammar. */
static int vocab_token_bytes(void *ud, int32_t id, char *buf, size_t cap)
{
    const mx_tokenizer *t = ud;
    if (id >= mx_tok_vocab_size(t) || mx_tok_is_special(t, id))
        return -1;
    return mx_tok_token_bytes(t, id, buf, cap);
}

struct mx_grammar_vocab *srv_grammar_vocab(const srv_ctx *c, srv_reply *rep)
{
    pthread_mutex_lock(&c->gv->mu);
    if (!c->gv->v) {
        mx_err e = {0};
        double t0 = mx_now();
        if (mx_grammar_vocab_new(c->g->model->vocab, vocab_token_bytes, c->g->tok, c->g->eos, c->g->n_eos,
                                 &c->gv->v, &e))
            srv_error(rep, 500, NULL, "%s", e.msg);
        else if (!c->o->quiet)
            fprintf(stderr, "serve: grammar vocabulary built (%d tokens) in %.3f s\n", c->g->model->vocab,
                    mx_now() - t0);
    }
    struct mx_grammar_vocab *v = c->gv->v;
    pthread_mutex_unlock(&c->gv->mu);
    return v;
}

/* Compiles GBNF text into r's grammar; 400 naming the problem. */
static int set_grammar(const srv_ctx *c, srv_req *r, const char *gbnf, const char *field,
                       srv_reply *rep)
{
    mx_err e = {0};
    if (r->grammar) {
        srv_error(rep, 400, "invalid_value", "give only one of 'response_format' json, 'grammar', "
                                             "'json_schema' and a forced tool call");
        return -1;
    }
    if (mx_grammar_parse(gbnf, strlen(gbnf), &r->grammar, &e)) {
        srv_error(rep, 400, "invalid_grammar", "'%s': %s", field, e.msg);
        return -1;
    }
    if (!(r->gen.grammar_vocab = srv_grammar_vocab(c, rep)))
        return -1;
    r->gen.grammar = r->grammar;
    return 0;
}

static int set_schema(const srv_ctx *c, srv_req *r, const cJSON *schema, const char *field,
                      srv_reply *rep)
{
    char *gbnf = NULL;
    mx_err e = {0};
    if (mx_grammar_from_schema(schema, &gbnf, &e)) {
        srv_error(rep, 400, e.code == MX_ENOMEM ? "out_of_memory" : "unsupported_schema", "'%s': %s",
                  field, e.msg);
        return -1;
    }
    int rc = set_grammar(c, r, gbnf, field, rep);
    free(gbnf);
    return rc;
}

/* response_format ({type: text | json_object | json_schema}), llama.cpp's
 * 'grammar' (GBNF) and 'json_schema': a grammar over the output. */
static int parse_constraints(const srv_ctx *c, srv_req *r, const cJSON *o, srv_reply *rep)
{
    const cJSON *rf = field(o, "response_format"), *v;
    if (rf) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(t)) {
            srv_error(rep, 400, "invalid_type", "'response_format' must be an object with a string 'type'");
            return -1;
        }
        if (!strcmp(t->valuestring, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(js, "schema");
            if (!cJSON_IsObject(js) || !sc) {
                srv_error(rep, 400, "missing_field", "'response_format.json_schema.schema' is required");
                return -1;
            }
            if (set_schema(c, r, sc, "response_format.json_schema.schema", rep))
                return -1;
        } else if (!strcmp(t->valuestring, "json_object")) {
            /* llama-server also takes a schema here */
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(rf, "schema");
            if (sc ? set_schema(c, r, sc, "response_format.schema", rep)
                   : set_grammar(c, r, mx_grammar_json_object_gbnf(), "response_format", rep))
                return -1;
        } else if (strcmp(t->valuestring, "text") != 0) {
            srv_error(rep, 400, "invalid_value",
                      "'response_format.type' must be text, json_object or json_schema (got '%.40s')",
                      t->valuestring);
            return -1;
        }
    }
    if ((v = field(o, "grammar"))) {
        if (!cJSON_IsString(v)) {
            srv_error(rep, 400, "invalid_type", "'grammar' must be a string (GBNF)");
            return -1;
        }
        if (set_grammar(c, r, v->valuestring, "grammar", rep))
            return -1;
    }
    if ((v = field(o, "json_schema")) && set_schema(c, r, v, "json_schema", rep))
        return -1;
    return 0;
}

/* Sampling, length and streaming fields shared by both endpoints. */
static int parse_common(const srv_ctx *c, srv_req *r, const cJSON *o, srv_reply *rep)
{
    const mx_server_opts *so = c->o;
    const cJSON *m = field(o, "model");
    if (m && !cJSON_IsString(m)) {
        srv_error(rep, 400, "invalid_type", "'model' must be a string");
        return -1;
    }
    if (m && *m->valuestring && strcmp(m->valuestring, c->model_id) != 0) {
        srv_error(rep, 404, "model_not_found", "the model '%.200s' does not exist (this server has '%s')",
                  m->valuestring, c->model_id);
        return -1;
    }
    mx_sample_params *sp = &r->gen.sample;
    *sp = so->sample;
    r->gen.lookup = so->lookup;
    r->gen.lookup_always = so->lookup_always;
    double d;
    long long i;
    long long max_tokens = so->n_predict;
    if (get_int(o, "max_tokens", 1, so->n_ctx, &max_tokens, rep) ||
        get_int(o, "max_completion_tokens", 1, so->n_ctx, &max_tokens, rep))
        return -1;
    r->gen.max_tokens = (int)max_tokens;
    d = sp->temperature;
    if (get_number(o, "temperature", 0, 100, &d, rep))
        return -1;
    sp->temperature = (float)d;
    d = sp->top_p;
    if (get_number(o, "top_p", 0, 1, &d, rep))
        return -1;
    sp->top_p = (float)d;
    d = sp->min_p;
    if (get_number(o, "min_p", 0, 1, &d, rep))
        return -1;
    sp->min_p = (float)d;
    d = sp->repeat_penalty;
    if (get_number(o, "repeat_penalty", 0.01, 100, &d, rep))
        return -1;
    sp->repeat_penalty = (float)d;
    i = sp->top_k;
    if (get_int(o, "top_k", 0, 1 << 30, &i, rep))
        return -1;
    sp->top_k = (int)i;
    /* without a seed every request draws differently */
    static uint64_t draws;
    sp->seed = so->sample.seed ^ (__atomic_add_fetch(&draws, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull);
    i = 0;
    if (field(o, "seed")) {
        if (get_int(o, "seed", -9007199254740992.0, 9007199254740992.0, &i, rep))
            return -1;
        sp->seed = (uint64_t)i;
    }
    i = 1;
    if (get_int(o, "n", 1, SRV_MAX_N, &i, rep))
        return -1;
    r->n = (int)i;
    d = 0;
    if (get_number(o, "frequency_penalty", -2, 2, &d, rep))
        return -1;
    sp->frequency_penalty = (float)d;
    d = 0;
    if (get_number(o, "presence_penalty", -2, 2, &d, rep))
        return -1;
    sp->presence_penalty = (float)d;
    if (parse_logit_bias(c, r, o, rep) || parse_logprobs(r, o, rep) || parse_constraints(c, r, o, rep))
        return -1;
    if (get_bool(o, "stream", &r->stream, rep) || get_bool(o, "ignore_eos", &r->gen.ignore_eos, rep))
        return -1;
    const cJSON *so_ = field(o, "stream_options");
    if (so_) {
        if (!cJSON_IsObject(so_)) {
            srv_error(rep, 400, "invalid_type", "'stream_options' must be an object");
            return -1;
        }
        if (get_bool(so_, "include_usage", &r->include_usage, rep))
            return -1;
    }
    return parse_stops(r, o, rep);
}

/* Message content: a string, null, or a list of {"type": "text", "text"}
 * parts (joined).  Returns a new cJSON string, or NULL with rep set. */
static cJSON *message_content(const cJSON *msg, size_t idx, srv_reply *rep)
{
    const cJSON *c = field(msg, "content");
    if (!c)
        return cJSON_CreateString("");
    if (cJSON_IsString(c))
        return cJSON_CreateString(c->valuestring);
    if (!cJSON_IsArray(c)) {
        srv_error(rep, 400, "invalid_type", "messages[%zu].content must be a string or a list of parts",
                  idx);
        return NULL;
    }
    size_t total = 1;
    const cJSON *p;
    cJSON_ArrayForEach(p, c)
    {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(t) || strcmp(t->valuestring, "text") != 0 ||
            !cJSON_IsString(x)) {
            srv_error(rep, 400, "invalid_value",
                      "messages[%zu].content: only {\"type\": \"text\", \"text\": ...} parts are supported",
                      idx);
            return NULL;
        }
        total += strlen(x->valuestring);
    }
    char *s = malloc(total);
    if (!s) {
        srv_error(rep, 500, NULL, "out of memory");
        return NULL;
    }
    size_t n = 0;
    cJSON_ArrayForEach(p, c)
    {
        const char *x = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t k = strlen(x);
        memcpy(s + n, x, k);
        n += k;
    }
    s[n] = 0;
    cJSON *v = cJSON_CreateString(s);
    free(s);
    return v;
}

/* OpenAI clients send an earlier call's arguments as a JSON string; the
 * hermes and mistral templates want an object (they print it with tojson;
 * Qwen3's takes either), so a string that is JSON becomes that value. */
static void tool_call_arguments_as_objects(cJSON *msg)
{
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"), *call;
    if (!cJSON_IsArray(calls))
        return;
    cJSON_ArrayForEach(call, calls)
    {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *v = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (v && !cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", v))
            cJSON_Delete(v);
    }
}

/* The request's messages as the template sees them: every message an
 * object with a string role; content normalised to a string (null and
 * absent become "", text parts are joined); other fields (tool_calls,
 * tool_call_id, name, ...) passed through, with tool-call arguments as
 * objects for templates of a known tool format.  NULL with rep set on
 * error. */
static cJSON *template_messages(const srv_ctx *c, const cJSON *o, srv_reply *rep)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!msgs) {
        srv_error(rep, 400, "missing_field", "'messages' is required");
        return NULL;
    }
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        srv_error(rep, 400, "invalid_type", "'messages' must be a non-empty list of messages");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    size_t i = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role) || !*role->valuestring) {
            srv_error(rep, 400, "invalid_value", "messages[%zu] must be an object with a string 'role'", i);
            cJSON_Delete(out);
            return NULL;
        }
        cJSON *content = message_content(msg, i, rep);
        cJSON *m = content ? cJSON_Duplicate(msg, 1) : NULL;
        if (!m) {
            if (content)
                srv_error(rep, 500, NULL, "out of memory");
            cJSON_Delete(content);
            cJSON_Delete(out);
            return NULL;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(m, "content");
        cJSON_AddItemToObject(m, "content", content);
        if (c->tool_fmt != MX_TOOLS_NONE)
            tool_call_arguments_as_objects(m);
        cJSON_AddItemToArray(out, m);
        i++;
    }
    return out;
}

enum { TOOL_AUTO, TOOL_NONE, TOOL_REQUIRED, TOOL_NAMED };

/* A chat request's tools and tool_choice, validated. */
typedef struct tool_req {
    const cJSON *tools;          /* a non-empty list, or NULL */
    int choice;                  /* TOOL_* */
    const char *name;            /* TOOL_NAMED: the function */
} tool_req;

static int parse_tools(const cJSON *o, tool_req *t, srv_reply *rep)
{
    memset(t, 0, sizeof *t);
    const cJSON *tools = field(o, "tools"), *choice = field(o, "tool_choice"), *v;
    /* the deprecated forms would need their own response shape: refused,
     * not ignored */
    if (field(o, "functions") || field(o, "function_call")) {
        srv_error(rep, 400, "unsupported_value", "'functions' and 'function_call' (deprecated) are not "
                                                 "supported: use 'tools' and 'tool_choice'");
        return -1;
    }
    if (tools && !cJSON_IsArray(tools)) {
        srv_error(rep, 400, "invalid_type", "'tools' must be a list");
        return -1;
    }
    int i = 0;
    cJSON_ArrayForEach(v, tools)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(v, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsObject(v) || (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function"))) ||
            !cJSON_IsObject(fn) || !cJSON_IsString(name) || !*name->valuestring ||
            strlen(name->valuestring) > 256 || (params && !cJSON_IsObject(params) && !cJSON_IsNull(params))) {
            srv_error(rep, 400, "invalid_value",
                      "'tools'[%d] must be {\"type\": \"function\", \"function\": {\"name\": "
                      "\"...\" (1 to 256 bytes), \"parameters\": {JSON Schema}}}", i);
            return -1;
        }
        i++;
    }
    t->tools = i ? tools : NULL;
    t->choice = TOOL_AUTO;
    if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) {
        t->choice = TOOL_NONE;
    } else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) {
        t->choice = TOOL_REQUIRED;
    } else if (cJSON_IsObject(choice)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice, "function"),
                                                             "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name)) {
            srv_error(rep, 400, "invalid_value", "'tool_choice' as an object must be {\"type\": \"function\", "
                                                 "\"function\": {\"name\": \"...\"}}");
            return -1;
        }
        t->choice = TOOL_NAMED;
        t->name = name->valuestring;
    } else if (choice && !(cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto"))) {
        srv_error(rep, 400, "invalid_value", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                             "{\"type\": \"function\", \"function\": {\"name\": \"...\"}}");
        return -1;
    }
    if ((t->choice == TOOL_REQUIRED || t->choice == TOOL_NAMED) && !t->tools) {
        srv_error(rep, 400, "invalid_value", "'tool_choice' %s needs a non-empty 'tools' list",
                  t->choice == TOOL_NAMED ? "naming a function" : "\"required\"");
        return -1;
    }
    if (t->choice == TOOL_NAMED) {
        int found = 0;
        cJSON_ArrayForEach(v, t->tools)
        {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(v, "function"), "name");
            found |= !strcmp(name->valuestring, t->name);
        }
        if (!found) {
            srv_error(rep, 400, "invalid_value", "'tool_choice' names the function '%.100s', which is not in 'tools'",
                      t->name);
            return -1;
        }
    }
    if (get_bool(o, "parallel_tool_calls", &(int){0}, rep))
        return -1;
    if (t->choice == TOOL_NONE)
        t->tools = NULL;             /* the model is not told about them */
    return 0;
}

/* Renders a chat request (messages, the tools of t, chat_template_kwargs)
 * with the checkpoint's template and the generation prompt: the one path of
 * chat completions and /apply-template.  *text is malloc'ed. */
static int render_chat(const srv_ctx *c, const cJSON *o, const tool_req *t, char **text, srv_reply *rep)
{
    *text = NULL;
    if (!c->g->tmpl) {
        srv_error(rep, 400, "no_tokenizer", "this checkpoint has no tokenizer.json");
        return -1;
    }
    const cJSON *kw = field(o, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw)) {
        srv_error(rep, 400, "invalid_type", "'chat_template_kwargs' must be an object");
        return -1;
    }
    cJSON *msgs = template_messages(c, o, rep);
    if (!msgs)
        return -1;
    mx_err e = {0};
    int rc = mx_chat_render_json(c->g->tmpl, msgs, t->tools, kw, 1, text, &e);
    cJSON_Delete(msgs);
    if (rc) {
        srv_error(rep, 400, "invalid_prompt", "chat template: %s", e.msg);
        return -1;
    }
    return 0;
}

/* Tools offered (tool_choice other than none): the output is parsed for
 * calls in the template's format, and required / a named function force
 * one call with a grammar.  A template without a known format cannot be
 * used with tools: refused rather than answered with unparsed text. */
static int setup_tools(const srv_ctx *c, srv_req *r, const tool_req *t, srv_reply *rep)
{
    if (!t->tools)
        return 0;
    if (c->tool_fmt == MX_TOOLS_NONE) {
        srv_error(rep, 400, "tools_unsupported",
                  "this model's chat template has no tool-call format that mlxcel knows (it mentions "
                  "neither <tool_call> nor [TOOL_CALLS]), so tool calls can be neither forced nor read: "
                  "leave 'tools' out, send 'tool_choice': \"none\", or start the server with "
                  "--chat-template-file FILE naming a template with tool support");
        return -1;
    }
    r->tool_fmt = c->tool_fmt;
    /* Mistral's [TOOL_CALLS] is a special token: keep it in the text */
    if (c->tool_fmt == MX_TOOLS_MISTRAL)
        r->gen.keep_special = 1;
    if (t->choice != TOOL_REQUIRED && t->choice != TOOL_NAMED)
        return 0;
    char *gbnf = NULL;
    mx_err e = {0};
    if (mx_tool_grammar(c->tool_fmt, t->tools, t->choice == TOOL_NAMED ? t->name : NULL, &gbnf, &e)) {
        srv_error(rep, e.code == MX_ENOMEM ? 500 : 400, e.code == MX_ENOMEM ? NULL : "unsupported_schema",
                  "%s", e.msg);
        return -1;
    }
    int rc = set_grammar(c, r, gbnf, "tool_choice", rep);
    free(gbnf);
    return rc;
}

static int encode_chat(const srv_ctx *c, srv_req *r, const cJSON *o, srv_reply *rep)
{
    char *text = NULL;
    tool_req t;
    if (parse_tools(o, &t, rep) || setup_tools(c, r, &t, rep) || render_chat(c, o, &t, &text, rep))
        return -1;
    mx_err e = {0};
    int rc = mx_engine_encode(c->g, text, &r->prompts[0], &r->n_prompt_of[0], &e);
    r->n_prompts = 1;
    free(text);
    if (rc) {
        srv_error(rep, 400, "invalid_prompt", "chat template output: %s", e.msg);
        return -1;
    }
    return 0;
}

void srv_apply_template(const srv_ctx *c, const char *body, size_t len, srv_reply *rep)
{
    cJSON *o = parse_object(body, len, rep);
    if (!o)
        return;
    char *text = NULL;
    tool_req t;
    if (!parse_tools(o, &t, rep) && !render_chat(c, o, &t, &text, rep)) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "prompt", text);
        reply_json(rep, r);
    }
    free(text);
    cJSON_Delete(o);
}

/* A list of token ids as prompt k. */
static int prompt_ids(const srv_ctx *c, srv_req *r, int k, const cJSON *a, srv_reply *rep)
{
    int n = cJSON_GetArraySize(a);
    if (!(r->prompts[k] = malloc(sizeof *r->prompts[k] * (size_t)(n ? n : 1)))) {
        srv_error(rep, 500, NULL, "out of memory");
        return -1;
    }
    const int vocab = c->g->model->vocab;
    const cJSON *v;
    int i = 0;
    cJSON_ArrayForEach(v, a)
    {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= vocab) {
            srv_error(rep, 400, "invalid_value", "'prompt'[%d] must be a token id in [0, %d)", i, vocab);
            return -1;
        }
        r->prompts[k][i++] = (int32_t)v->valuedouble;
    }
    r->n_prompt_of[k] = i;
    return 0;
}

/* One prompt (a string or a list of ids) as prompt k. */
static int one_prompt(const srv_ctx *c, srv_req *r, int k, const cJSON *p, srv_reply *rep)
{
    r->n_prompts = k + 1;
    if (cJSON_IsArray(p)) {
        const cJSON *v;
        cJSON_ArrayForEach(v, p) if (!cJSON_IsNumber(v))
        {
            srv_error(rep, 400, "invalid_value", "'prompt' must be a string, a list of token ids, "
                                                 "or a list of those");
            return -1;
        }
        return prompt_ids(c, r, k, p, rep);
    }
    if (!cJSON_IsString(p)) {
        srv_error(rep, 400, "invalid_type", "'prompt' must be a string, a list of token ids, or a list of those");
        return -1;
    }
    mx_err e = {0};
    if (mx_engine_encode(c->g, p->valuestring, &r->prompts[k], &r->n_prompt_of[k], &e)) {
        srv_error(rep, 400, "invalid_prompt", "prompt: %s", e.msg);
        return -1;
    }
    return 0;
}

/* "prompt": a string, a list of token ids, or a list of up to
 * SRV_MAX_PROMPTS of those (one choice per prompt, times n). */
static int encode_prompt(const srv_ctx *c, srv_req *r, const cJSON *o, srv_reply *rep)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!p) {
        srv_error(rep, 400, "missing_field", "'prompt' is required");
        return -1;
    }
    int list = cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 &&
               (cJSON_IsString(p->child) || cJSON_IsArray(p->child));
    if (!list)
        return one_prompt(c, r, 0, p, rep);
    int n = cJSON_GetArraySize(p);
    if (n > SRV_MAX_PROMPTS) {
        srv_error(rep, 400, "invalid_value", "'prompt' has %d prompts (at most %d)", n, SRV_MAX_PROMPTS);
        return -1;
    }
    int k = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, p)
    {
        if (cJSON_IsArray(v) && cJSON_GetArraySize(v) && !cJSON_IsNumber(v->child)) {
            srv_error(rep, 400, "invalid_value", "'prompt'[%d] must be a string or a list of token ids", k);
            return -1;
        }
        if (one_prompt(c, r, k++, v, rep))
            return -1;
    }
    return 0;
}

static void make_id(srv_req *r, const char *prefix)
{
    static unsigned long counter;
    unsigned long k = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    uint64_t x = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)k * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    snprintf(r->id, sizeof r->id, "%s%016llx%04lx", prefix, (unsigned long long)x, k & 0xffff);
}

srv_req *srv_parse_generation(const srv_ctx *c, int kind, const char *body, size_t len,
                              srv_reply *rep)
{
    cJSON *o = parse_object(body, len, rep);
    if (!o)
        return NULL;
    srv_req *r = srv_req_new();
    if (!r) {
        cJSON_Delete(o);
        srv_error(rep, 500, NULL, "out of memory");
        return NULL;
    }
    r->kind = kind;
    int rc = parse_common(c, r, o, rep);
    if (!rc)
        rc = refuse_unsupported(r, o, rep);
    if (!rc)
        rc = kind == SRV_CHAT ? encode_chat(c, r, o, rep) : encode_prompt(c, r, o, rep);
    cJSON_Delete(o);
    for (int k = 0; !rc && k < r->n_prompts; k++) {
        if (r->n_prompt_of[k] == 0) {
            srv_error(rep, 400, "invalid_prompt", "the prompt is empty (it encodes to no tokens)");
            rc = -1;
        } else if (r->n_prompt_of[k] >= c->o->n_ctx) {
            srv_error(rep, 400, "context_length_exceeded",
                      "the prompt has %d tokens but the context holds %d (--ctx-size)",
                      r->n_prompt_of[k], c->o->n_ctx);
            rc = -1;
        }
        r->n_prompt += r->n_prompt_of[k];
    }
    r->n_choices = r->n * r->n_prompts;
    if (!rc && r->n_choices > SRV_MAX_CHOICES) {
        srv_error(rep, 400, "invalid_value", "n x prompts is %d choices (at most %d)", r->n_choices,
                  SRV_MAX_CHOICES);
        rc = -1;
    }
    if (!rc && !(r->ch = calloc((size_t)r->n_choices, sizeof *r->ch))) {
        srv_error(rep, 500, NULL, "out of memory");
        rc = -1;
    }
    if (rc) {
        srv_req_free(r);
        return NULL;
    }
    make_id(r, kind == SRV_CHAT ? "chatcmpl-" : "cmpl-");
    r->created = (long)time(NULL);
    return r;
}

static cJSON *usage_json(const srv_req *r, int n_gen)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + n_gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", r->n_cached);
    return u;
}

/* llama-server's "timings": the prompt tokens prefilled (cache hits
 * excluded) and the tokens generated, with the scheduler's seconds for each.
 * Decode speed as `mlxcel generate --stats` has it: the first token comes
 * from the prefill, the others from the decode seconds. */
static cJSON *timings_json(const srv_req *r)
{
    cJSON *t = cJSON_CreateObject();
    int dec = r->n_gen > 1 ? r->n_gen - 1 : 0;
    cJSON_AddNumberToObject(t, "prompt_n", r->n_prefilled);
    cJSON_AddNumberToObject(t, "prompt_ms", r->t_prefill * 1e3);
    cJSON_AddNumberToObject(t, "prompt_per_second", r->t_prefill > 0 ? r->n_prefilled / r->t_prefill : 0.0);
    cJSON_AddNumberToObject(t, "predicted_n", r->n_gen);
    cJSON_AddNumberToObject(t, "predicted_ms", r->t_decode * 1e3);
    cJSON_AddNumberToObject(t, "predicted_per_second", r->t_decode > 0 ? dec / r->t_decode : 0.0);
    if (r->gen.lookup > 0) {     /* llama-server's names for a speculative draft */
        cJSON_AddNumberToObject(t, "draft_n", r->n_drafted);
        cJSON_AddNumberToObject(t, "draft_n_accepted", r->n_accepted);
    }
    return t;
}

/* A cJSON string from bytes that are not NUL-terminated. */
static cJSON *string_n(const char *s, size_t n)
{
    char *t = malloc(n + 1);
    if (!t)
        return NULL;
    if (n)
        memcpy(t, s, n);
    t[n] = 0;
    cJSON *v = cJSON_CreateString(t);
    free(t);
    return v;
}

static cJSON *envelope(const srv_ctx *c, const srv_req *r, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", c->model_id);
    cJSON_AddStringToObject(o, "system_fingerprint", "mlxcel");
    return o;
}

/* Valid UTF-8 from bytes: invalid sequences become U+FFFD. */
static cJSON *lossy_string(const unsigned char *b, size_t n)
{
    char *t = malloc(3 * n + 1);
    if (!t)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = b[i];
        size_t l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = l && i + l <= n && c != 0;
        for (size_t k = 1; ok && k < l; k++)
            ok = (b[i + k] & 0xC0) == 0x80;
        /* overlong forms, surrogates and values past U+10FFFF are not UTF-8 */
        if (ok && l == 2)
            ok = c >= 0xC2;
        if (ok && l == 3)
            ok = !(c == 0xE0 && b[i + 1] < 0xA0) && !(c == 0xED && b[i + 1] >= 0xA0);
        if (ok && l == 4)
            ok = c <= 0xF4 && !(c == 0xF0 && b[i + 1] < 0x90) && !(c == 0xF4 && b[i + 1] >= 0x90);
        if (ok) {
            memcpy(t + o, b + i, l);
            o += l;
            i += l;
        } else {
            memcpy(t + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    t[o] = 0;
    cJSON *v = cJSON_CreateString(t);
    free(t);
    return v;
}

/* A token's text (lossy) and, when bytes is not NULL, its bytes as a list
 * of integers. */
static cJSON *token_text(const srv_ctx *c, int32_t id, cJSON **bytes)
{
    unsigned char buf[256];
    int n = c->g->tok ? mx_tok_token_bytes(c->g->tok, id, (char *)buf, sizeof buf) : -1;
    if (n < 0)
        n = 0;              /* padding ids past the tokenizer: no text */
    if ((size_t)n > sizeof buf)
        n = sizeof buf;
    if (bytes) {
        *bytes = cJSON_CreateArray();
        for (int i = 0; i < n; i++)
            cJSON_AddItemToArray(*bytes, cJSON_CreateNumber(buf[i]));
    }
    return lossy_string(buf, (size_t)n);
}

/* JSON has no -inf: a ruled-out alternative gets -9999, as OpenAI does. */
static double lp_value(float x) { return isfinite(x) ? x : -9999.0; }

static cJSON *chat_lp_entry(const srv_ctx *c, int32_t id, float lp)
{
    cJSON *e = cJSON_CreateObject(), *bytes = NULL;
    cJSON_AddItemToObject(e, "token", token_text(c, id, &bytes));
    cJSON_AddNumberToObject(e, "logprob", lp_value(lp));
    cJSON_AddItemToObject(e, "bytes", bytes);
    return e;
}

/* The "logprobs" of a choice for tokens lp[n]: chat's {"content": [...]}
 * or completions' {tokens, token_logprobs, top_logprobs, text_offset}. */
static cJSON *logprobs_json(const srv_ctx *c, const srv_req *r, const srv_lp *lp, int n)
{
    if (!r->gen.logprobs)
        return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    if (r->kind == SRV_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (int i = 0; i < n; i++) {
            const mx_token_logprob *t = &lp[i].lp;
            cJSON *e = chat_lp_entry(c, t->id, t->logprob);
            cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int j = 0; j < t->n_top; j++)
                cJSON_AddItemToArray(top, chat_lp_entry(c, t->top_id[j], t->top_logprob[j]));
            cJSON_AddItemToArray(content, e);
        }
        return o;
    }
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = r->gen.top_logprobs ? cJSON_AddArrayToObject(o, "top_logprobs")
                                      : cJSON_AddNullToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (int i = 0; i < n; i++) {
        const mx_token_logprob *t = &lp[i].lp;
        cJSON_AddItemToArray(tokens, token_text(c, t->id, NULL));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_value(t->logprob)));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)lp[i].off));
        if (r->gen.top_logprobs) {
            cJSON *m = cJSON_CreateObject();
            for (int j = 0; j < t->n_top; j++) {
                cJSON *s = token_text(c, t->top_id[j], NULL);
                /* two ids with the same text: the more likely one stays */
                if (cJSON_IsString(s) && !cJSON_GetObjectItemCaseSensitive(m, s->valuestring))
                    cJSON_AddNumberToObject(m, s->valuestring, lp_value(t->top_logprob[j]));
                cJSON_Delete(s);
            }
            cJSON_AddItemToArray(tops, m);
        }
    }
    return o;
}

/* A fresh tool-call id: OpenAI's "call_" and 24 letters or digits, or the
 * 9 letters and digits that Mistral's templates insist on. */
static void tool_call_id(mx_tool_format f, char *buf, size_t cap)
{
    static const char an[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static uint64_t counter;
    uint64_t x = (uint64_t)(mx_now() * 1e9) ^ __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull;
    size_t n = f == MX_TOOLS_MISTRAL ? 9 : 24, o = 0;
    if (f != MX_TOOLS_MISTRAL)
        o = (size_t)snprintf(buf, cap, "call_");
    for (size_t i = 0; i < n && o + 1 < cap; i++) {
        /* splitmix64 steps */
        x += 0x9E3779B97F4A7C15ull;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        buf[o++] = an[(z ^ (z >> 31)) % (sizeof an - 1)];
    }
    buf[o] = 0;
}

/* {"id", "type": "function", "function": {"name", "arguments"}}, with the
 * stream's "index" when index >= 0. */
static cJSON *tool_call_json(const srv_req *r, const mx_tool_call *tc, int index, int with_args)
{
    char id[48];
    cJSON *o = cJSON_CreateObject();
    if (index >= 0)
        cJSON_AddNumberToObject(o, "index", index);
    if (tc->id)
        snprintf(id, sizeof id, "%s", tc->id);
    else
        tool_call_id(r->tool_fmt, id, sizeof id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(o, "function");
    cJSON_AddStringToObject(fn, "name", tc->name);
    cJSON_AddStringToObject(fn, "arguments", with_args ? tc->arguments : "");
    return o;
}

const char *srv_finish_reason(const srv_req *r, const srv_choice *ch, int n_calls)
{
    const char *f = ch->finish ? ch->finish : r->finish;
    return n_calls && f && !strcmp(f, "stop") ? "tool_calls" : f;
}

/* A chat choice's message: its text, or with tools the content and the
 * calls the text holds (content null when it is only calls). */
static cJSON *chat_message(const srv_req *r, const srv_choice *sc, int *n_calls)
{
    cJSON *msg = cJSON_CreateObject();
    cJSON_AddStringToObject(msg, "role", "assistant");
    *n_calls = 0;
    if (!r->tool_fmt) {
        cJSON_AddItemToObject(msg, "content", string_n(sc->text ? sc->text : "", sc->len));
        return msg;
    }
    mx_tool_parser p;
    mx_tool_out out = {0};
    mx_tool_parser_init(&p, r->tool_fmt);
    if (mx_tool_parse(&p, sc->text ? sc->text : "", sc->len, 1, &out)) {
        mx_tool_out_free(&out);
        cJSON_Delete(msg);
        return NULL;
    }
    if (out.n_calls && !out.len)
        cJSON_AddNullToObject(msg, "content");
    else
        cJSON_AddItemToObject(msg, "content", string_n(out.content ? out.content : "", out.len));
    if (out.n_calls) {
        cJSON *calls = cJSON_AddArrayToObject(msg, "tool_calls");
        for (int i = 0; i < out.n_calls; i++)
            cJSON_AddItemToArray(calls, tool_call_json(r, &out.calls[i], -1, 1));
    }
    *n_calls = out.n_calls;
    mx_tool_out_free(&out);
    return msg;
}

void srv_completion_json(const srv_ctx *c, const srv_req *r, srv_reply *rep)
{
    int chat = r->kind == SRV_CHAT;
    cJSON *o = envelope(c, r, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int k = 0; k < r->n_choices; k++) {
        const srv_choice *sc = &r->ch[k];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, ch);
        cJSON_AddNumberToObject(ch, "index", k);
        int n_calls = 0;
        if (chat) {
            cJSON *msg = chat_message(r, sc, &n_calls);
            if (!msg) {
                cJSON_Delete(o);
                srv_error(rep, 500, NULL, "out of memory");
                return;
            }
            cJSON_AddItemToObject(ch, "message", msg);
        } else {
            cJSON_AddItemToObject(ch, "text", string_n(sc->text ? sc->text : "", sc->len));
        }
        cJSON_AddItemToObject(ch, "logprobs", logprobs_json(c, r, sc->lp, sc->n_lp));
        cJSON_AddStringToObject(ch, "finish_reason", srv_finish_reason(r, sc, n_calls));
    }
    cJSON_AddItemToObject(o, "usage", usage_json(r, r->n_gen));
    cJSON_AddItemToObject(o, "timings", timings_json(r));
    reply_json(rep, o);
}

/* "data: JSON\n\n" from a tree (freed). */
static char *sse(cJSON *o)
{
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!j)
        return NULL;
    size_t n = strlen(j);
    char *s = malloc(n + 9);
    if (s) {
        memcpy(s, "data: ", 6);
        memcpy(s + 6, j, n);
        memcpy(s + 6 + n, "\n\n", 3);
    }
    free(j);
    return s;
}

char *srv_chunk_sse(const srv_ctx *c, const srv_req *r, int k, const char *text, size_t len,
                    const srv_lp *lp, int n_lp, const char *finish, int role_chunk)
{
    int chat = r->kind == SRV_CHAT;
    cJSON *o = envelope(c, r, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", k);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role_chunk)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (role_chunk || text)
            cJSON_AddItemToObject(d, "content", string_n(text ? text : "", text ? len : 0));
    } else {
        cJSON_AddItemToObject(ch, "text", string_n(text ? text : "", text ? len : 0));
    }
    if (n_lp)
        cJSON_AddItemToObject(ch, "logprobs", logprobs_json(c, r, lp, n_lp));
    else
        cJSON_AddNullToObject(ch, "logprobs");
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    return sse(o);
}

/* One chat chunk of choice k whose delta carries tool call tc. */
static char *tool_call_chunk(const srv_ctx *c, const srv_req *r, int k, const mx_tool_call *tc, int index,
                             int header)
{
    cJSON *o = envelope(c, r, "chat.completion.chunk");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), ch);
    cJSON_AddNumberToObject(ch, "index", k);
    cJSON *d = cJSON_AddObjectToObject(ch, "delta");
    cJSON *calls = cJSON_AddArrayToObject(d, "tool_calls");
    if (header) {
        cJSON_AddItemToArray(calls, tool_call_json(r, tc, index, 0));
    } else {
        cJSON *call = cJSON_CreateObject();
        cJSON_AddNumberToObject(call, "index", index);
        cJSON_AddStringToObject(cJSON_AddObjectToObject(call, "function"), "arguments", tc->arguments);
        cJSON_AddItemToArray(calls, call);
    }
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    return sse(o);
}

char *srv_tool_calls_sse(const srv_ctx *c, const srv_req *r, int k, const mx_tool_call *calls, int n,
                         int first)
{
    size_t len = 0;
    char *all = calloc(1, 1);
    for (int i = 0; all && i < 2 * n; i++) {
        char *ev = tool_call_chunk(c, r, k, &calls[i / 2], first + i / 2, i % 2 == 0);
        size_t m = ev ? strlen(ev) : 0;
        char *q = ev ? realloc(all, len + m + 1) : NULL;
        if (!q) {
            free(ev);
            free(all);
            return NULL;
        }
        memcpy(q + len, ev, m + 1);
        len += m;
        all = q;
        free(ev);
    }
    return all;
}

char *srv_usage_sse(const srv_ctx *c, const srv_req *r, int n_gen)
{
    cJSON *o = envelope(c, r, r->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage_json(r, n_gen));
    cJSON_AddItemToObject(o, "timings", timings_json(r));
    return sse(o);
}

char *srv_error_sse(const char *msg, const char *code)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(err, "message", msg);
    cJSON_AddStringToObject(err, "type", "server_error");
    if (code)
        cJSON_AddStringToObject(err, "code", code);
    else
        cJSON_AddNullToObject(err, "code");
    return sse(o);
}

static cJSON *model_object(const srv_ctx *c)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", c->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "mlxcel");
    cJSON_AddNumberToObject(m, "context_length", c->o->n_ctx);
    return m;
}

void srv_models(const srv_ctx *c, srv_reply *rep)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddItemToArray(data, model_object(c));
    reply_json(rep, o);
}

void srv_model_get(const srv_ctx *c, const char *id, srv_reply *rep)
{
    if (strcmp(id, c->model_id) != 0) {
        srv_error(rep, 404, "model_not_found", "the model '%.200s' does not exist (this server has '%s')",
                  id, c->model_id);
        return;
    }
    reply_json(rep, model_object(c));
}

void srv_slots_json(const srv_ctx *c, const srv_slot_info *info, int n, srv_reply *rep)
{
    static const char *names[] = {"idle", "prefill", "decode"};
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(a, o);
        cJSON_AddNumberToObject(o, "id", i);
        cJSON_AddNumberToObject(o, "n_ctx", c->o->n_ctx);
        int st = info[i].state >= 0 && info[i].state <= 2 ? info[i].state : 0;
        cJSON_AddStringToObject(o, "state", names[st]);
        cJSON_AddBoolToObject(o, "is_processing", st != SLOT_FREE);
        cJSON_AddNumberToObject(o, "n_cached", info[i].n_cached);
        if (st != SLOT_FREE) {
            cJSON_AddStringToObject(o, "id_task", info[i].req_id);
            cJSON_AddNumberToObject(o, "n_prompt_tokens", info[i].n_prompt);
            cJSON_AddNumberToObject(o, "n_decoded", info[i].n_gen);
        }
    }
    reply_json(rep, a);
}

void srv_props(const srv_ctx *c, srv_reply *rep)
{
    const mx_server_opts *so = c->o;
    const mx_sample_params *sp = &so->sample;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", c->model_id);
    cJSON_AddStringToObject(o, "model_path", c->g->model->dir ? c->g->model->dir : "");
    cJSON_AddStringToObject(o, "model_type", c->g->model->cfg.model_type);
    cJSON_AddNumberToObject(o, "n_ctx", so->n_ctx);
    cJSON_AddNumberToObject(o, "n_ctx_train", c->g->model->cfg.max_position_embeddings);
    cJSON_AddNumberToObject(o, "n_vocab", c->g->model->vocab);
    cJSON_AddNumberToObject(o, "total_slots", so->parallel);
    const char *t = mx_chat_template_text(c->g->tmpl);
    cJSON_AddStringToObject(o, "chat_template", t ? t : "");
    cJSON_AddBoolToObject(o, "chat_template_is_fallback", mx_chat_template_is_fallback(c->g->tmpl));
    const char *tu = mx_chat_template_tool_text(c->g->tmpl);
    if (tu)
        cJSON_AddStringToObject(o, "chat_template_tool_use", tu);
    const char *tf = mx_tool_format_name(c->tool_fmt);
    if (tf)
        cJSON_AddStringToObject(o, "tool_call_format", tf);
    else
        cJSON_AddNullToObject(o, "tool_call_format");
    const char *bos = mx_chat_template_bos(c->g->tmpl), *eos = mx_chat_template_eos(c->g->tmpl);
    cJSON_AddStringToObject(o, "bos_token", bos ? bos : "");
    cJSON_AddStringToObject(o, "eos_token", eos ? eos : "");
    cJSON_AddStringToObject(o, "build_info", SRV_BUILD_INFO);
    cJSON *d = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON_AddNumberToObject(d, "n_ctx", so->n_ctx);
    cJSON *p = cJSON_AddObjectToObject(d, "params");
    cJSON_AddNumberToObject(p, "n_predict", so->n_predict);
    cJSON_AddNumberToObject(p, "temperature", sp->temperature);
    cJSON_AddNumberToObject(p, "top_k", sp->top_k);
    cJSON_AddNumberToObject(p, "top_p", sp->top_p);
    cJSON_AddNumberToObject(p, "min_p", sp->min_p);
    cJSON_AddNumberToObject(p, "repeat_penalty", sp->repeat_penalty);
    cJSON_AddNumberToObject(p, "repeat_last_n", sp->repeat_last_n);
    /* the MoE blocks run on each path since the server started, all
     * requests together (the chat page shows what one reply added) */
    mx_moe_stats ms;
    mx_moe_stats_get(&ms);
    cJSON *md = cJSON_AddObjectToObject(o, "moe_dispatch");
    cJSON_AddBoolToObject(md, "fused_enabled", mx_moe_fused_enabled());
    cJSON_AddNumberToObject(md, "fused", (double)ms.fused);
    cJSON_AddNumberToObject(md, "gather", (double)ms.gather);
    cJSON *mod = cJSON_AddObjectToObject(o, "modalities");
    cJSON_AddBoolToObject(mod, "vision", 0);
    cJSON_AddBoolToObject(mod, "audio", 0);
    reply_json(rep, o);
}

void srv_tokenize(const srv_ctx *c, const char *body, size_t len, srv_reply *rep)
{
    cJSON *o = parse_object(body, len, rep);
    if (!o)
        return;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "content");
    if (!t)
        t = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    int parse_special = 1;
    if (!cJSON_IsString(t)) {
        srv_error(rep, 400, t ? "invalid_type" : "missing_field", "'content' must be a string");
    } else if (!get_bool(o, "parse_special", &parse_special, rep)) {
        int32_t *ids = NULL;
        size_t n = 0;
        mx_err e = {0};
        if (!c->g->tok) {
            srv_error(rep, 400, "no_tokenizer", "this checkpoint has no tokenizer.json");
        } else if (mx_tok_encode(c->g->tok, t->valuestring, strlen(t->valuestring), parse_special,
                                 &ids, &n, &e)) {
            srv_error(rep, 400, "invalid_value", "content: %s", e.msg);
        } else {
            cJSON *r = cJSON_CreateObject();
            cJSON *a = cJSON_AddArrayToObject(r, "tokens");
            for (size_t i = 0; i < n; i++)
                cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
            reply_json(rep, r);
        }
        free(ids);
    }
    cJSON_Delete(o);
}

void srv_detokenize(const srv_ctx *c, const char *body, size_t len, srv_reply *rep)
{
    cJSON *o = parse_object(body, len, rep);
    if (!o)
        return;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "tokens");
    int n = cJSON_GetArraySize(a);
    int32_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
    if (!cJSON_IsArray(a)) {
        srv_error(rep, 400, a ? "invalid_type" : "missing_field", "'tokens' must be a list of token ids");
    } else if (!c->g->tok) {
        srv_error(rep, 400, "no_tokenizer", "this checkpoint has no tokenizer.json");
    } else if (!ids) {
        srv_error(rep, 500, NULL, "out of memory");
    } else {
        const cJSON *v;
        int i = 0, bad = 0;
        cJSON_ArrayForEach(v, a)
        {
            if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
                v->valuedouble >= 0x7fffffff) {
                srv_error(rep, 400, "invalid_value", "'tokens'[%d] must be a token id", i);
                bad = 1;
                break;
            }
            ids[i++] = (int32_t)v->valuedouble;
        }
        char *text = NULL;
        size_t tl = 0;
        mx_err e = {0};
        if (!bad && mx_tok_decode(c->g->tok, ids, (size_t)i, 0, &text, &tl, &e)) {
            srv_error(rep, 400, "invalid_value", "tokens: %s", e.msg);
        } else if (!bad) {
            cJSON *r = cJSON_CreateObject();
            cJSON_AddItemToObject(r, "content", string_n(text, tl));
            reply_json(rep, r);
        }
        free(text);
    }
    free(ids);
    cJSON_Delete(o);
}
