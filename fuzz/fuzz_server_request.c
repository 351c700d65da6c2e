/* fuzz_server_request.c - libFuzzer entry: a request body as the server's
 * HTTP threads hand it to api.c (no HTTP layer: srv_parse_generation and
 * the small endpoints take the body bytes).  The first byte picks the
 * endpoint (bits 0-2: chat/completions, completions, apply-template,
 * tokenize, detokenize) and the chat template (bits 3-4: the checkpoint's,
 * the repository's mistral tool template, the hermes-style Qwen3 template
 * of the fixtures).  The engine is qwen2_moe_tiny_chat from the fixtures
 * (the real Qwen vocabulary), or the bundled demo model without them.
 *
 * Every body gets a reply or a request: a reply's body is JSON, an error
 * has a 4xx/5xx status, and a parsed request respects the limits the
 * scheduler relies on (prompts in the vocabulary and shorter than the
 * context, choices, stops). */
#include "fuzz_util.h"

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
#include "server/srv_int.h"
#include "util/file.h"

#define FZ_CTX 512

static mx_engine *eng;
static mx_server_opts opts;
static srv_vocab vocab = {PTHREAD_MUTEX_INITIALIZER, NULL};
static srv_ctx ctxs[3];
static mx_engine tmpl_eng[3];   /* the engine with another template */
static int n_ctxs;

static void add_ctx(mx_chat_template *t)
{
    tmpl_eng[n_ctxs] = *eng;
    tmpl_eng[n_ctxs].tmpl = t;
    const char *tt = mx_chat_template_tool_text(t);
    ctxs[n_ctxs] = (srv_ctx){.g = &tmpl_eng[n_ctxs], .o = &opts, .model_id = "fuzz", .gv = &vocab,
                             .tool_fmt = mx_tool_format_detect(tt ? tt : mx_chat_template_text(t))};
    n_ctxs++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char b[4096];
    const char *dir = fz_fixture("qwen2_moe_tiny_chat", b, sizeof b);
    if (!dir)
        dir = fz_source("models/kjv-moe", b, sizeof b);
    mx_err e;
    if (mx_engine_load(dir, MX_TOKENIZER_REQUIRED, &eng, &e)) {
        fprintf(stderr, "fuzz_server_request: %s\n", e.msg);
        abort();
    }
    mx_server_opts_defaults(&opts);
    opts.n_ctx = FZ_CTX;
    opts.parallel = 1;
    opts.quiet = 1;
    add_ctx(eng->tmpl);
    char *text = NULL;
    size_t len;
    mx_chat_template *t;
    if (mx_read_file(fz_source("tests/data/mistral_tools.jinja", b, sizeof b), &text, &len, &e) ||
        mx_chat_template_from_string(text, "<s>", "</s>", &t, &e)) {
        fprintf(stderr, "fuzz_server_request: %s\n", e.msg);
        abort();
    }
    free(text);
    add_ctx(t);
    if (fz_fixture("tokenizers/qwen3", b, sizeof b)) {
        if (mx_chat_template_load(b, &t, &e)) {
            fprintf(stderr, "fuzz_server_request: %s\n", e.msg);
            abort();
        }
        add_ctx(t);
    }
    fprintf(stderr, "fuzz_server_request: engine %s, %d templates\n", dir, n_ctxs);
    return 0;
}

static void check_request(const srv_ctx *c, const srv_req *r)
{
    if (r->n_prompts < 1 || r->n_prompts > SRV_MAX_PROMPTS || r->n < 1 || r->n > SRV_MAX_N ||
        r->n_choices != r->n * r->n_prompts || r->n_choices > SRV_MAX_CHOICES || !r->ch)
        abort();
    int total = 0;
    for (int k = 0; k < r->n_prompts; k++) {
        if (r->n_prompt_of[k] < 1 || r->n_prompt_of[k] >= c->o->n_ctx)
            abort();
        for (int i = 0; i < r->n_prompt_of[k]; i++)
            if (r->prompts[k][i] < 0 || r->prompts[k][i] >= c->g->model->vocab)
                abort();
        total += r->n_prompt_of[k];
    }
    if (total != r->n_prompt || r->gen.n_stops > SRV_MAX_STOPS ||
        r->gen.top_logprobs > MX_MAX_TOP_LOGPROBS || (r->gen.grammar && !r->gen.grammar_vocab))
        abort();
    for (size_t i = 0; i < r->gen.n_stops; i++)
        if (!r->gen.stops[i] || strlen(r->gen.stops[i]) > SRV_MAX_STOP_LEN)
            abort();
    for (size_t i = 0; i < r->gen.n_bias; i++)
        if (r->gen.bias_ids[i] < 0 || r->gen.bias_ids[i] >= c->g->model->vocab)
            abort();
}

static void check_reply(const srv_reply *rep, int parsed)
{
    if (parsed && rep->body)
        abort();   /* a request or an error, not both */
    if (!parsed) {
        if (!rep->body || (rep->status != 200 && (rep->status < 400 || rep->status > 599)))
            abort();
        cJSON *j = cJSON_Parse(rep->body);
        if (!j)
            abort();   /* every answer is JSON */
        cJSON_Delete(j);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const srv_ctx *c = &ctxs[(data[0] >> 3 & 3) % n_ctxs];
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    srv_reply rep = {0};
    switch ((data[0] & 7) % 5) {
    case 0:
    case 1: {
        srv_req *r = srv_parse_generation(c, data[0] & 1 ? SRV_COMPLETION : SRV_CHAT, body, len, &rep);
        check_reply(&rep, r != NULL);
        if (r) {
            check_request(c, r);
            srv_req_free(r);
        } else if (rep.status == 200) {
            abort();
        }
        break;
    }
    case 2:
        srv_apply_template(c, body, len, &rep);
        check_reply(&rep, 0);
        break;
    case 3:
        srv_tokenize(c, body, len, &rep);
        check_reply(&rep, 0);
        break;
    default:
        srv_detokenize(c, body, len, &rep);
        check_reply(&rep, 0);
        break;
    }
    free(rep.body);
    return 0;
}
