/* test_grammar.c - GBNF parsing (and its errors), matching bytes, JSON
 * Schema compilation (and refused keywords), and masks checked against a
 * brute force over a small vocabulary, including tokens that split UTF-8
 * characters and span grammar boundaries. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "test.h"

static mx_grammar *parse(const char *g)
{
    mx_grammar *out = NULL;
    mx_err e = {0};
    if (mx_grammar_parse(g, strlen(g), &out, &e))
        fprintf(stderr, "parse: %s\n", e.msg);
    return out;
}

/* 1: text is accepted (complete when want_complete), 0: refused. */
static int matches(const mx_grammar *g, const char *text, int *complete)
{
    mx_grammar_state *s = NULL;
    mx_err e = {0};
    if (mx_grammar_state_new(g, NULL, &s, &e))
        return -1;
    int ok = mx_grammar_accept_bytes(s, text, strlen(text)) == 0;
    if (complete)
        *complete = ok && mx_grammar_complete(s);
    mx_grammar_state_free(s);
    return ok;
}

static int full(const mx_grammar *g, const char *text)
{
    int c = 0;
    return matches(g, text, &c) == 1 && c;
}

static void parse_errors(void)
{
    static const struct { const char *g, *msg; } bad[] = {
        {"start ::= \"a\"", "no 'root'"},
        {"root ::= foo", "'foo' is used but not defined"},
        {"root ::= root \"a\"", "left-recursive"},
        {"root ::= x\nx ::= \"\"* \"a\"", "left-recursive"},
        {"root ::= \"abc", "unterminated"},
        {"root ::= [a-", "unterminated"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {"root ::= (\"a\" | \"b\"", "expected ')'"},
        {"root ::= [z-a]", "out of order"},
        {"root ::= \"a\"{2,1}", "n < m"},
        {"root ::= \"a\"{5000}", "over 1000"},
        {"root \"a\"", "expected '::='"},
        {"root ::= \"a\" ) ", "unexpected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mx_grammar *g = NULL;
        mx_err e = {0};
        int rc = mx_grammar_parse(bad[i].g, strlen(bad[i].g), &g, &e);
        CHECKF(rc != 0 && !g && strstr(e.msg, bad[i].msg), "'%s' -> '%s' (want '%s')", bad[i].g, e.msg,
               bad[i].msg);
        mx_grammar_free(g);
    }
    /* the line number is in the message */
    mx_grammar *g = NULL;
    mx_err e = {0};
    const char *t = "root ::= a\n\na ::= \"x\" \"unterminated\n";
    CHECK(mx_grammar_parse(t, strlen(t), &g, &e) != 0 && strstr(e.msg, "line 3"));
}

static void matching(void)
{
    mx_grammar *g = parse("# a comment\n"
                          "root ::= greeting (\" \" name)? \"!\"{1,3}\n"
                          "greeting ::= \"hello\" | \"hi\"\n"
                          "name ::= [A-Z] [a-z]* # trailing comment\n"
                          "  | \"\\u00e9t\\xe9\"\n");
    CHECK(g != NULL);
    if (!g)
        return;
    CHECK(full(g, "hello!"));
    CHECK(full(g, "hi Bob!!!"));
    CHECK(full(g, "hi \xc3\xa9t\xc3\xa9!"));
    CHECK(!full(g, "hi Bob!!!!"));
    CHECK(!full(g, "hi bob!"));
    CHECK(matches(g, "hel", NULL) == 1 && !full(g, "hel"));
    CHECK(matches(g, "hex", NULL) == 0);
    CHECK(matches(g, "hi \xc3", NULL) == 1);        /* half of é: still possible */
    CHECK(matches(g, "hi \xc3\xa8", NULL) == 0);    /* è is not */
    CHECK(matches(g, "hi \xff", NULL) == 0);        /* not UTF-8 */
    mx_grammar_free(g);

    /* repetitions, negated classes, any character, groups repeated */
    g = parse("root ::= (\"ab\")+ [^x-z]? . \"e\"{2} d{0,2}\nd ::= [0-9]");
    CHECK(g && full(g, "abab\xe2\x82\xac" "ee") && full(g, "abq!ee12") && !full(g, "abx!ee") &&
          !full(g, "ab!ee123") && !full(g, "!ee"));
    mx_grammar_free(g);
    /* finished: complete and nothing may follow */
    g = parse("root ::= \"a\" \"b\"?");
    mx_grammar_state *s = NULL;
    mx_err e = {0};
    CHECK_OK(mx_grammar_state_new(g, NULL, &s, &e), &e);
    CHECK(!mx_grammar_complete(s));
    CHECK(mx_grammar_accept_bytes(s, "a", 1) == 0 && mx_grammar_complete(s) && !mx_grammar_finished(s));
    CHECK(mx_grammar_accept_bytes(s, "c", 1) == -1 && mx_grammar_complete(s));   /* unchanged */
    CHECK(mx_grammar_accept_bytes(s, "b", 1) == 0 && mx_grammar_finished(s));
    mx_grammar_state_free(s);
    mx_grammar_free(g);
}

static mx_grammar *schema_grammar(const char *schema, char *err, size_t cap)
{
    cJSON *j = cJSON_Parse(schema);
    char *gbnf = NULL;
    mx_err e = {0};
    mx_grammar *g = NULL;
    err[0] = 0;
    if (mx_grammar_from_schema(j, &gbnf, &e) == 0 && mx_grammar_parse(gbnf, strlen(gbnf), &g, &e) == 0) {
        free(gbnf);
        cJSON_Delete(j);
        return g;
    }
    snprintf(err, cap, "%s", e.msg);
    free(gbnf);
    cJSON_Delete(j);
    return NULL;
}

static void schemas(void)
{
    char err[600];
    mx_grammar *g = schema_grammar(
        "{\"type\": \"object\", \"properties\": {"
        "\"name\": {\"type\": \"string\", \"maxLength\": 8},"
        "\"age\": {\"type\": \"integer\"},"
        "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"b\", 3]}, \"minItems\": 1, \"maxItems\": 2},"
        "\"kind\": {\"const\": \"x\"},"
        "\"when\": {\"type\": \"string\", \"format\": \"date\"},"
        "\"sub\": {\"$ref\": \"#/$defs/point\"},"
        "\"opt\": {\"type\": [\"number\", \"null\"]}},"
        "\"required\": [\"name\", \"age\", \"tags\"], \"additionalProperties\": false,"
        "\"$defs\": {\"point\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}, \"required\": [\"x\"]}}}",
        err, sizeof err);
    CHECKF(g != NULL, "schema: %s", err);
    if (g) {
        CHECK(full(g, "{\"name\": \"Al\", \"age\": 3, \"tags\": [\"a\"]}"));
        CHECK(full(g, "{\"name\":\"\",\"age\":-12,\"tags\":[3, \"b\"],\"kind\":\"x\",\"when\":\"2024-02-29\","
                      "\"sub\":{\"x\":1.5e3},\"opt\":null}"));
        CHECK(full(g, "{\n  \"name\": \"x\",\n  \"age\": 0,\n  \"tags\": [\"b\"],\n  \"opt\": 2.5\n}"));
        CHECK(!full(g, "{\"name\": \"Al\", \"tags\": [\"a\"]}"));                      /* age missing */
        CHECK(!full(g, "{\"name\": \"toolongname\", \"age\": 3, \"tags\": [\"a\"]}"));  /* maxLength */
        CHECK(!full(g, "{\"name\": \"Al\", \"age\": 3, \"tags\": []}"));              /* minItems */
        CHECK(!full(g, "{\"name\": \"Al\", \"age\": 3, \"tags\": [\"a\", \"a\", \"a\"]}"));
        CHECK(!full(g, "{\"name\": \"Al\", \"age\": 3.5, \"tags\": [\"a\"]}"));       /* integer */
        CHECK(!full(g, "{\"name\": \"Al\", \"age\": 3, \"tags\": [\"c\"]}"));         /* enum */
        CHECK(!full(g, "{\"name\": \"Al\", \"age\": 3, \"tags\": [\"a\"], \"zz\": 1}")); /* additional */
        CHECK(!full(g, "{\"age\": 3, \"name\": \"Al\", \"tags\": [\"a\"]}"));         /* schema order */
        CHECK(!full(g, "{\"name\": \"Al\", \"age\": 3, \"tags\": [\"a\"], \"when\": \"2024-13-01\"}"));
        mx_grammar_free(g);
    }
    static const struct { const char *schema, *msg; } bad[] = {
        {"{\"type\": \"string\", \"pattern\": \"^a\"}", "'pattern' is not supported"},
        {"{\"allOf\": [{}]}", "'allOf' is not supported"},
        {"{\"type\": \"string\", \"format\": \"email\"}", "format 'email'"},
        {"{\"type\": \"thing\"}", "unknown type 'thing'"},
        {"{\"$ref\": \"#/nowhere\"}", "$ref"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}", "required"},
        {"{\"$ref\": \"#\"}", "64 levels"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        g = schema_grammar(bad[i].schema, err, sizeof err);
        CHECKF(!g && strstr(err, bad[i].msg), "%s -> '%s'", bad[i].schema, err);
        mx_grammar_free(g);
    }
    /* json_object: any object */
    const char *jo = mx_grammar_json_object_gbnf();
    g = parse(jo);
    CHECK(g && full(g, "{}") && full(g, "{\"a\": [1, {\"b\": null}, \"\\u00e9\"], \"c\": true}") &&
          !full(g, "[1]") && !full(g, "{\"a\": }"));
    mx_grammar_free(g);
}

/* format "date" accepts exactly the real dates: every day of a few years
 * (leap, common, century and 400-year) against the calendar rule. */
static void dates(void)
{
    char err[600];
    mx_grammar *g = schema_grammar("{\"type\": \"string\", \"format\": \"date\"}", err, sizeof err);
    mx_grammar *t = schema_grammar("{\"type\": \"string\", \"format\": \"date-time\"}", err, sizeof err);
    CHECKF(g && t, "%s", err);
    if (!g || !t) {
        mx_grammar_free(g);
        mx_grammar_free(t);
        return;
    }
    static const int years[] = {0, 4, 100, 1900, 1996, 2000, 2023, 2024, 2100, 2400, 9999};
    static const int mdays[] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int wrong = 0;
    for (size_t i = 0; i < sizeof years / sizeof *years; i++) {
        int y = years[i], leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
        for (int m = 0; m <= 13; m++)
            for (int d = 0; d <= 32; d++) {
                char s[32];
                snprintf(s, sizeof s, "\"%04d-%02d-%02d\"", y, m, d);
                int real = m >= 1 && m <= 12 && d >= 1 && d <= (m == 2 && leap ? 29 : mdays[m]);
                if (full(g, s) != real) {
                    wrong++;
                    fprintf(stderr, "date %s: grammar %d, calendar %d\n", s, !real, real);
                }
            }
    }
    CHECK(wrong == 0);
    CHECK(full(t, "\"2024-02-29T23:59:59.5+05:30\"") && full(t, "\"2023-12-31T00:00:00Z\""));
    CHECK(!full(t, "\"2023-02-29T10:00:00Z\"") && !full(t, "\"2024-01-01T24:00:00Z\"") &&
          !full(t, "\"2024-01-01T10:00:00+24:00\"") && !full(t, "\"2024-01-01T10:00:00+05:60\""));
    mx_grammar_free(g);
    mx_grammar_free(t);
}

/* ---- masks against brute force ---- */

static const char *vocab[] = {
    "{", "}", "\"", "\":", ": ", "a", "ab", "abc", "b\"", "\"a", "\"ab\"", " ", "  ", "\n", ",",
    "1", "12", "-", ".5", "e", "true", "tr", "ue", "null", "[", "]", "],", "\xc3", "\xa9", "\xc3\xa9",
    "\xa9\"", "\xe2\x82", "\xac", "\xe2\x82\xac", "\xff", "x", "\"x\":", "{\"", "\"}", "",
};
#define NV ((int32_t)(sizeof vocab / sizeof *vocab))

static int vocab_bytes(void *ud, int32_t id, char *buf, size_t cap)
{
    (void)ud;
    if (id >= NV)
        return -1;
    size_t n = strlen(vocab[id]);
    memcpy(buf, vocab[id], n < cap ? n : cap);
    return n ? (int)n : -1;
}

static void mask_vs_brute(const char *gbnf, const char *const *prefixes, size_t n_prefixes)
{
    mx_grammar *g = parse(gbnf);
    int32_t eos = NV;            /* one id past the strings */
    mx_grammar_vocab *v = NULL;
    mx_err e = {0};
    CHECK_OK(mx_grammar_vocab_new(NV + 1, vocab_bytes, NULL, &eos, 1, &v, &e), &e);
    if (!g || !v)
        return;
    for (size_t p = 0; p < n_prefixes; p++) {
        mx_grammar_state *s = NULL;
        CHECK_OK(mx_grammar_state_new(g, v, &s, &e), &e);
        CHECKF(mx_grammar_accept_bytes(s, prefixes[p], strlen(prefixes[p])) == 0, "prefix '%s'", prefixes[p]);
        for (int round = 0; round < 2; round++) {   /* the second round comes from the cache */
            float logits[NV + 1];
            for (int i = 0; i <= NV; i++)
                logits[i] = 0;
            size_t allowed = mx_grammar_mask(s, logits, NV + 1), count = 0;
            for (int32_t id = 0; id <= NV; id++) {
                /* brute force: a fresh state over prefix + token */
                mx_grammar_state *b = NULL;
                mx_grammar_state_new(g, v, &b, &e);
                mx_grammar_accept_bytes(b, prefixes[p], strlen(prefixes[p]));
                int ok;
                if (id == NV)
                    ok = mx_grammar_complete(b);
                else
                    ok = strlen(vocab[id]) > 0 && mx_grammar_accept_bytes(b, vocab[id], strlen(vocab[id])) == 0;
                mx_grammar_state_free(b);
                count += ok;
                CHECKF(ok == !isinf(logits[id]), "prefix '%s' token %d '%s': brute %d, mask %d", prefixes[p],
                       id, id < NV ? vocab[id] : "eos", ok, !isinf(logits[id]));
            }
            CHECK(allowed == count);
        }
        /* accept_token agrees with the mask for a few ids */
        for (int32_t id = 0; id < NV; id++) {
            mx_grammar_state *b = NULL;
            mx_grammar_state_new(g, v, &b, &e);
            mx_grammar_accept_bytes(b, prefixes[p], strlen(prefixes[p]));
            mx_grammar_state *c = NULL;
            mx_grammar_state_new(g, v, &c, &e);
            mx_grammar_accept_bytes(c, prefixes[p], strlen(prefixes[p]));
            int by_token = mx_grammar_accept_token(b, id) == 0;
            int by_bytes = strlen(vocab[id]) > 0 && mx_grammar_accept_bytes(c, vocab[id], strlen(vocab[id])) == 0;
            CHECKF(by_token == by_bytes, "accept_token %d", id);
            mx_grammar_state_free(b);
            mx_grammar_state_free(c);
        }
        mx_grammar_state_free(s);
    }
    mx_grammar_vocab_free(v);
    mx_grammar_free(g);
}

/* Inputs the fuzz targets found (fuzz/regress has the raw inputs). */
static void fuzz_findings(void)
{
    /* Each optional item may be skipped, so after a character every stack
     * re-expands most of the others: the work per character is bounded
     * (MAX_EXPAND in match.c).  A short chain matches as before; past the
     * bound the character is refused instead of taking seconds. */
    mx_grammar *g = parse("root ::= [a-z]?{8} \"!\"");
    CHECK(g && full(g, "abc!") && full(g, "!") && !matches(g, "abcdefghi!", NULL));
    mx_grammar_free(g);
    g = parse("root ::= [a-z]?{400} \"!\"");
    CHECK(g && full(g, "!") && matches(g, "a", NULL) == 0);
    mx_grammar_free(g);

    /* rules without a final newline still end their line */
    cJSON *obj = cJSON_Parse("{\"type\": \"integer\"}");
    const cJSON *two[2] = {obj, obj};
    const char *names[2] = {"call-a", "call-b"};
    char *gbnf = NULL;
    mx_err e = {0};
    CHECK_OK(mx_grammar_from_schemas("root ::= call-a \",\" call-b", 2, two, names, &gbnf, &e), &e);
    g = gbnf ? parse(gbnf) : NULL;
    CHECK(g && full(g, "1,-2"));
    mx_grammar_free(g);
    free(gbnf);
    cJSON_Delete(obj);

    /* a schema string that is not UTF-8 is refused by name */
    obj = cJSON_Parse("{\"enum\": [\"red\", \"gr\xe9" "en\"]}");
    gbnf = NULL;
    CHECK(obj && mx_grammar_from_schema(obj, &gbnf, &e) == MX_EINVAL && !gbnf &&
          strstr(e.msg, "UTF-8"));
    cJSON_Delete(obj);
}

int main(void)
{
    fuzz_findings();
    parse_errors();
    matching();
    schemas();
    dates();
    static const char *jp[] = {"", "{", "{\"", "{\"a", "{\"ab\"", "{\"ab\": ", "{\"ab\": [", "{\"ab\": [1",
                               "{\"ab\": \"\xc3", "{\"ab\": \"\xe2\x82", "{\"ab\": \"x\"", "{\"ab\": {}}"};
    mask_vs_brute(mx_grammar_json_object_gbnf(), jp, sizeof jp / sizeof *jp);
    static const char *up[] = {"", "\xc3", "\xc3\xa9", "\xc3\xa9\xe2\x82"};
    mask_vs_brute("root ::= [\\u00e9\\u20ac]+ \"\\\"\"?", up, sizeof up / sizeof *up);
    return test_summary();
}
