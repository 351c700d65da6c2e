/* test_toolcall.c - tool-call formats: detection from real templates (and
 * the named "tool_use" template of a tokenizer_config.json),
 * parsing model output into content and calls (all at once and byte by
 * byte, which must agree), and the forcing grammar: hand-written calls
 * accepted or refused, and random walks through the grammar over a small
 * vocabulary that must all parse back into a valid call. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat/template.h"
#include "grammar/grammar.h"
#include "test.h"
#include "toolcall/toolcall.h"
#include "util/file.h"

/* ---- detection ---- */

static char *fixture_template(const char *fx, const char *rel)
{
    char path[1024], *text = NULL;
    size_t len = 0;
    mx_err e = {0};
    snprintf(path, sizeof path, "%s/%s", fx, rel);
    if (mx_read_file(path, &text, &len, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return NULL;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    char *out = cJSON_IsString(t) ? strdup(t->valuestring) : NULL;
    cJSON_Delete(j);
    return out;
}

static void detection(void)
{
    CHECK(mx_tool_format_detect(NULL) == MX_TOOLS_NONE);
    CHECK(mx_tool_format_detect("{{ '[TOOL_CALLS] [' }}") == MX_TOOLS_MISTRAL);
    CHECK(mx_tool_format_detect("{{- '<tool_call>\\n' }}") == MX_TOOLS_HERMES);
    CHECK(!strcmp(mx_tool_format_name(MX_TOOLS_HERMES), "hermes") && !mx_tool_format_name(MX_TOOLS_NONE));
    const char *fx = test_fixtures();
    if (!fx)
        return;
    static const struct { const char *rel; mx_tool_format f; } cases[] = {
        {"tokenizers/qwen3/tokenizer_config.json", MX_TOOLS_HERMES},
        {"tokenizers/mixtral/tokenizer_config.json", MX_TOOLS_NONE},
        {"qwen2_moe_tiny_chat/tokenizer_config.json", MX_TOOLS_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *t = fixture_template(fx, cases[i].rel);
        CHECKF(t && mx_tool_format_detect(t) == cases[i].f, "%s", cases[i].rel);
        free(t);
    }
}

/* A tokenizer_config.json with a named list of templates: requests with
 * tools render with "tool_use" (as transformers picks it), the others with
 * "default"; the tool format is the tool_use template's. */
static void named_templates(void)
{
    char dir[] = "/tmp/mx_toolcall_XXXXXX", path[64];
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("{\"chat_template\": [{\"name\": \"default\", \"template\": \"plain {{ messages[0].content }}\"},"
              " {\"name\": \"tool_use\", \"template\": \"tools {{ tools | length }} <tool_call>\"}]}", f);
        fclose(f);
    }
    mx_chat_template *t = NULL;
    mx_err e = {0};
    CHECK_OK(mx_chat_template_load(dir, &t, &e), &e);
    if (t) {
        cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
        cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]");
        char *a = NULL, *b = NULL;
        CHECK_OK(mx_chat_render_json(t, msgs, NULL, NULL, 0, &a, &e), &e);
        CHECK_OK(mx_chat_render_json(t, msgs, tools, NULL, 0, &b, &e), &e);
        CHECKF(a && !strcmp(a, "plain hi"), "%s", a ? a : "(null)");
        CHECKF(b && !strcmp(b, "tools 1 <tool_call>"), "%s", b ? b : "(null)");
        CHECK(mx_tool_format_detect(mx_chat_template_text(t)) == MX_TOOLS_NONE &&
              mx_tool_format_detect(mx_chat_template_tool_text(t)) == MX_TOOLS_HERMES);
        free(a);
        free(b);
        cJSON_Delete(msgs);
        cJSON_Delete(tools);
        mx_chat_template_free(t);
    }
    remove(path);
    rmdir(dir);
}

/* ---- parsing ---- */

/* "name|arguments" joined by ";" (ids as "#id" after the arguments). */
static void calls_string(const mx_tool_out *o, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < o->n_calls && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s|%s%s%s", i ? ";" : "", o->calls[i].name,
                              o->calls[i].arguments, o->calls[i].id ? "#" : "",
                              o->calls[i].id ? o->calls[i].id : "");
}

static void parse_case(mx_tool_format f, const char *text, const char *content, const char *calls)
{
    mx_tool_parser p;
    mx_tool_out all = {0}, inc = {0};
    char got[2048], got_inc[2048];
    size_t len = strlen(text);
    /* all at once */
    mx_tool_parser_init(&p, f);
    CHECK(mx_tool_parse(&p, text, len, 1, &all) == 0);
    calls_string(&all, got, sizeof got);
    const char *c = all.content ? all.content : "";
    CHECKF(!strcmp(c, content), "%s: content '%s', expected '%s'", text, c, content);
    CHECKF(!strcmp(got, calls), "%s: calls '%s', expected '%s'", text, got, calls);
    CHECK(p.n_calls == all.n_calls);
    /* byte by byte, as a stream sees it: the same content and calls, and
     * no content before its time (content released is never taken back,
     * so the concatenation equal to the final content is the proof) */
    mx_tool_parser_init(&p, f);
    for (size_t k = 1; k <= len; k++)
        CHECK(mx_tool_parse(&p, text, k, 0, &inc) == 0);
    CHECK(mx_tool_parse(&p, text, len, 1, &inc) == 0);
    calls_string(&inc, got_inc, sizeof got_inc);
    c = inc.content ? inc.content : "";
    CHECKF(!strcmp(c, content), "%s (streamed): content '%s', expected '%s'", text, c, content);
    CHECKF(!strcmp(got_inc, calls), "%s (streamed): calls '%s', expected '%s'", text, got_inc, calls);
    mx_tool_out_free(&all);
    mx_tool_out_free(&inc);
}

static void parsing(void)
{
    const mx_tool_format H = MX_TOOLS_HERMES, M = MX_TOOLS_MISTRAL;
    /* plain text stays as it is, trailing whitespace too */
    parse_case(H, "Hello <b>world</b> a < b\n", "Hello <b>world</b> a < b\n", "");
    parse_case(H, "", "", "");
    parse_case(H, "<tool_ca", "<tool_ca", "");
    /* one call, Qwen3's layout */
    parse_case(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
               "", "get_weather|{\"city\":\"Paris\",\"days\":3}");
    /* text before, two calls, whitespace between dropped, text after */
    parse_case(H, "Let me check.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
                  "<tool_call>{\"name\":\"b\",\"arguments\":{\"x\":[1,2]}}</tool_call>\n\nDone.\n",
               "Let me check.Done.", "a|{};b|{\"x\":[1,2]}");
    /* arguments given as a string, "parameters", no arguments */
    parse_case(H, "<tool_call>{\"name\": \"s\", \"arguments\": \"{\\\"q\\\": 1}\"}</tool_call>", "", "s|{\"q\": 1}");
    parse_case(H, "<tool_call>{\"name\": \"p\", \"parameters\": {\"k\": true}}</tool_call>", "", "p|{\"k\":true}");
    parse_case(H, "<tool_call>{\"name\": \"n\"}</tool_call>", "", "n|{}");
    /* not a call: the block stays content, marker and all */
    parse_case(H, "x <tool_call>{\"name\": 5}</tool_call> y", "x <tool_call>{\"name\": 5}</tool_call> y", "");
    parse_case(H, "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", "");
    parse_case(H, "<tool_call>[1, 2]</tool_call>", "<tool_call>[1, 2]</tool_call>", "");
    parse_case(H, "<tool_call>{\"name\": \"f\"} and more", "and more", "f|{}");
    parse_case(H, "<tool_call>{\"name\": \"f\"}</tool_c", "</tool_c", "f|{}");
    /* cut short (max_tokens): an unfinished call is content; a whole JSON
     * without its closing tag is still a call */
    parse_case(H, "ok <tool_call>\n{\"name\": \"f\", \"argum", "ok <tool_call>\n{\"name\": \"f\", \"argum", "");
    parse_case(H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n", "", "f|{}");
    /* a marker-like prefix that turns out to be text */
    parse_case(H, "a <tool_cal> b", "a <tool_cal> b", "");
    /* braces in strings do not confuse the JSON */
    parse_case(H, "<tool_call>{\"name\": \"e\", \"arguments\": {\"s\": \"}</tool_call>{\"}}</tool_call>", "",
               "e|{\"s\":\"}</tool_call>{\"}");
    /* mistral: a list after the marker, ids kept */
    parse_case(M, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {}, "
                  "\"id\": \"abcDEF123\"}]",
               "", "f|{\"a\":1};g|{}#abcDEF123");
    parse_case(M, "Sure. [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"s\": \"]\"}}]", "Sure.", "f|{\"s\":\"]\"}");
    parse_case(M, "[TOOL_CALLS] {\"name\": \"one\", \"arguments\": {}}", "", "one|{}");
    parse_case(M, "see [1] and [TOOL", "see [1] and [TOOL", "");
    parse_case(M, "[TOOL_CALLS] oops", "[TOOL_CALLS] oops", "");
    parse_case(M, "[TOOL_CALLS] [{\"name\": \"f\"", "[TOOL_CALLS] [{\"name\": \"f\"", "");
    parse_case(M, "[TOOL_CALLS] [{\"name\": \"f\"}, 3]", "[TOOL_CALLS] [{\"name\": \"f\"}, 3]", "");
    /* the other format's markup is plain text */
    parse_case(M, "<tool_call>{\"name\": \"f\"}</tool_call>", "<tool_call>{\"name\": \"f\"}</tool_call>", "");
    parse_case(MX_TOOLS_NONE, "[TOOL_CALLS] [] \n", "[TOOL_CALLS] [] \n", "");
}

/* ---- the forcing grammar ---- */

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"d\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {"
    "    \"city\": {\"type\": \"string\", \"maxLength\": 6},"
    "    \"unit\": {\"enum\": [\"c\", \"f\"]}, \"days\": {\"type\": \"integer\"}},"
    "    \"required\": [\"city\", \"days\"], \"additionalProperties\": false}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"ping\", \"parameters\": null}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"say \\\"hi\\\"\", \"parameters\": {"
    "    \"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}}, \"required\": [\"ok\"]}}}]";

static mx_grammar *tool_grammar(mx_tool_format f, const cJSON *tools, const char *only)
{
    char *gbnf = NULL;
    mx_err e = {0};
    mx_grammar *g = NULL;
    if (mx_tool_grammar(f, tools, only, &gbnf, &e) || mx_grammar_parse(gbnf, strlen(gbnf), &g, &e))
        fprintf(stderr, "tool grammar: %s\n%s\n", e.msg, gbnf ? gbnf : "");
    free(gbnf);
    return g;
}

static int full(const mx_grammar *g, const char *text)
{
    mx_grammar_state *s = NULL;
    mx_err e = {0};
    if (mx_grammar_state_new(g, NULL, &s, &e))
        return -1;
    int ok = mx_grammar_accept_bytes(s, text, strlen(text)) == 0 && mx_grammar_complete(s);
    mx_grammar_state_free(s);
    return ok;
}

/* A small vocabulary: every printable ASCII byte, some multi-byte pieces of
 * the markup, and an eos id at the end. */
static const char *const PIECES[] = {"<tool_call>", "</tool_call>", "[TOOL_CALLS]", "\"name\"", "\": ",
                                     "\", \"", "{\"", "\"}", "\n", "arguments", "get_", "\xc3\xa9"};
#define N_PIECES ((int)(sizeof PIECES / sizeof *PIECES))
#define N_VOCAB (95 + N_PIECES + 1)

static int piece_bytes(void *ud, int32_t id, char *buf, size_t cap)
{
    (void)ud;
    if (id < 95) {
        buf[0] = (char)(' ' + id);
        return 1;
    }
    if (id < 95 + N_PIECES) {
        size_t n = strlen(PIECES[id - 95]);
        if (n <= cap)
            memcpy(buf, PIECES[id - 95], n);
        return (int)n;
    }
    return -1;
}

/* Walks the grammar with uniformly random allowed tokens until it is
 * finished (or eos is drawn once complete); the text into buf. */
static int random_walk(const mx_grammar *g, const mx_grammar_vocab *v, unsigned long long *seed, char *buf,
                       size_t cap)
{
    mx_grammar_state *s = NULL;
    mx_err e = {0};
    if (mx_grammar_state_new(g, v, &s, &e))
        return -1;
    float logits[N_VOCAB];
    size_t n = 0;
    int rc = -1;
    for (int step = 0; step < 4000; step++) {
        for (int i = 0; i < N_VOCAB; i++)
            logits[i] = 0;
        size_t allowed = mx_grammar_mask(s, logits, N_VOCAB);
        if (!allowed)
            break;
        size_t pick = (size_t)(test_rand_u64(seed) % allowed);
        int32_t id = 0;
        for (; id < N_VOCAB; id++)
            if (!isinf(logits[id]) && pick-- == 0)
                break;
        if (mx_grammar_accept_token(s, id))
            break;
        if (id == N_VOCAB - 1) {
            rc = 0;
            break;
        }
        char tb[32];
        int k = piece_bytes(NULL, id, tb, sizeof tb);
        if (n + (size_t)k + 1 >= cap)
            break;
        memcpy(buf + n, tb, (size_t)k);
        n += (size_t)k;
        if (mx_grammar_finished(s)) {
            rc = 0;
            break;
        }
    }
    buf[n] = 0;
    mx_grammar_state_free(s);
    return rc;
}

static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* The call parsed from a walk's text is one of the allowed functions with
 * arguments that follow its schema. */
static int valid_call(const mx_tool_out *o, const char *only)
{
    if (o->n_calls != 1 || o->len)
        return 0;
    const mx_tool_call *c = &o->calls[0];
    if (only && strcmp(c->name, only))
        return 0;
    cJSON *a = cJSON_Parse(c->arguments);
    int ok = cJSON_IsObject(a);
    if (ok && !strcmp(c->name, "get_weather")) {
        const cJSON *city = cJSON_GetObjectItemCaseSensitive(a, "city");
        const cJSON *days = cJSON_GetObjectItemCaseSensitive(a, "days");
        const cJSON *unit = cJSON_GetObjectItemCaseSensitive(a, "unit");
        ok = cJSON_IsString(city) && utf8_chars(city->valuestring) <= 6 && cJSON_IsNumber(days) &&
             days->valuedouble == floor(days->valuedouble) &&
             (!unit || (cJSON_IsString(unit) && (!strcmp(unit->valuestring, "c") || !strcmp(unit->valuestring, "f"))));
        for (const cJSON *k = a->child; ok && k; k = k->next)
            ok = !strcmp(k->string, "city") || !strcmp(k->string, "days") || !strcmp(k->string, "unit");
    } else if (ok && !strcmp(c->name, "say \"hi\"")) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(a, "ok");
        ok = cJSON_IsBool(v) && cJSON_GetArraySize(a) == 1;
    } else if (ok) {
        ok = !strcmp(c->name, "ping");
    }
    cJSON_Delete(a);
    return ok;
}

static void grammar(void)
{
    cJSON *tools = cJSON_Parse(TOOLS);
    CHECK(tools != NULL);
    mx_grammar *g = tool_grammar(MX_TOOLS_HERMES, tools, NULL);
    CHECK(g != NULL);
    if (g) {
        CHECK(full(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>"));
        CHECK(full(g, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"any\": [1]}}\n</tool_call>"));
        CHECK(full(g, "<tool_call>\n{\"name\": \"say \\\"hi\\\"\", \"arguments\": {\"ok\": true}}\n</tool_call>"));
        CHECK(!full(g, "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"));
        CHECK(!full(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
        CHECK(!full(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris!!\", \"days\": 3}}\n</tool_call>"));
        CHECK(!full(g, "<tool_call>\n{\"name\": \"ping\", \"arguments\": 3}\n</tool_call>"));
        CHECK(!full(g, "Sure! <tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
        CHECK(!full(g, "[TOOL_CALLS] [{\"name\": \"ping\", \"arguments\": {}}]"));
        mx_grammar_free(g);
    }
    g = tool_grammar(MX_TOOLS_MISTRAL, tools, "ping");
    CHECK(g && full(g, "[TOOL_CALLS] [{\"name\": \"ping\", \"arguments\": {}}]") &&
          !full(g, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a\", \"days\": 1}}]"));
    mx_grammar_free(g);

    /* random walks: every finished output is one valid call */
    mx_grammar_vocab *v = NULL;
    mx_err e = {0};
    int32_t eos = N_VOCAB - 1;
    CHECK_OK(mx_grammar_vocab_new(N_VOCAB, piece_bytes, NULL, &eos, 1, &v, &e), &e);
    unsigned long long seed = 0x1234567ull;
    static const struct { mx_tool_format f; const char *only; } runs[] = {
        {MX_TOOLS_HERMES, NULL}, {MX_TOOLS_MISTRAL, NULL}, {MX_TOOLS_HERMES, "get_weather"},
        {MX_TOOLS_MISTRAL, "say \"hi\""},
    };
    for (size_t r = 0; v && r < sizeof runs / sizeof *runs; r++) {
        g = tool_grammar(runs[r].f, tools, runs[r].only);
        int good = 0, walks = 40, seen[3] = {0};
        for (int w = 0; g && w < walks; w++) {
            char buf[8192];
            mx_tool_parser p;
            mx_tool_out o = {0};
            int rc = random_walk(g, v, &seed, buf, sizeof buf);
            mx_tool_parser_init(&p, runs[r].f);
            mx_tool_parse(&p, buf, strlen(buf), 1, &o);
            if (rc == 0 && valid_call(&o, runs[r].only)) {
                good++;
                seen[!strcmp(o.calls[0].name, "ping") ? 1 : !strcmp(o.calls[0].name, "get_weather") ? 0 : 2]++;
            } else {
                fprintf(stderr, "walk %d of run %zu: not a valid call: %s\n", w, r, buf);
            }
            mx_tool_out_free(&o);
        }
        CHECKF(good == walks, "run %zu: %d of %d walks gave a valid call", r, good, walks);
        /* without tool_choice naming one, every function gets called */
        if (!runs[r].only)
            CHECKF(seen[0] && seen[1] && seen[2], "run %zu: calls %d %d %d", r, seen[0], seen[1], seen[2]);
        mx_grammar_free(g);
    }
    mx_grammar_vocab_free(v);

    /* errors name the tool */
    char *gbnf = NULL;
    cJSON *bad = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}},"
                             " {\"type\": \"function\", \"function\": {\"name\": \"g\", \"parameters\":"
                             " {\"type\": \"object\", \"patternProperties\": {}}}}]");
    e = (mx_err){0};
    CHECK_FAILS(mx_tool_grammar(MX_TOOLS_HERMES, bad, NULL, &gbnf, &e), &e);
    CHECK(strstr(e.msg, "tools[1].function.parameters") && strstr(e.msg, "'patternProperties'"));
    e = (mx_err){0};
    CHECK_OK(mx_tool_grammar(MX_TOOLS_HERMES, bad, "f", &gbnf, &e), &e);   /* only f is compiled */
    free(gbnf);
    gbnf = NULL;
    e = (mx_err){0};
    CHECK_FAILS(mx_tool_grammar(MX_TOOLS_HERMES, tools, "nope", &gbnf, &e), &e);
    CHECK(strstr(e.msg, "'nope'") != NULL);
    e = (mx_err){0};
    CHECK_FAILS(mx_tool_grammar(MX_TOOLS_NONE, tools, NULL, &gbnf, &e), &e);
    CHECK(gbnf == NULL);
    cJSON_Delete(bad);
    cJSON_Delete(tools);
}

int main(void)
{
    detection();
    named_templates();
    parsing();
    grammar();
    return test_summary();
}
