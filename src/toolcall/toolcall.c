/* toolcall.c - tool-call formats: detection, output parsing, forcing
 * grammars (see toolcall.h). */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "toolcall/toolcall.h"

/* A format's markup.  `end` NULL: the call is the JSON value after the
 * start marker (a list of calls, or one call). */
typedef struct tool_markup {
    const char *start;
    const char *end;
    const char *gbnf_open;       /* GBNF literals around the forced call object */
    const char *gbnf_close;
} tool_markup;

/* The forced call is written exactly as the families' templates render an
 * earlier call, so the model sees its own habit: Qwen3's template writes
 * '<tool_call>\n{"name": "' name '", "arguments": ' args '}\n</tool_call>',
 * Mistral's '[TOOL_CALLS] [' {"name": ..., "arguments": ...} ']'. */
static const tool_markup MARKUP[] = {
    [MX_TOOLS_HERMES] = {"<tool_call>", "</tool_call>", "\"<tool_call>\\n{\"", "\"}\\n</tool_call>\""},
    [MX_TOOLS_MISTRAL] = {"[TOOL_CALLS]", NULL, "\"[TOOL_CALLS] [{\"", "\"}]\""},
};

mx_tool_format mx_tool_format_detect(const char *t)
{
    if (!t)
        return MX_TOOLS_NONE;
    if (strstr(t, "<tool_call>"))
        return MX_TOOLS_HERMES;
    if (strstr(t, "[TOOL_CALLS]"))
        return MX_TOOLS_MISTRAL;
    return MX_TOOLS_NONE;
}

const char *mx_tool_format_name(mx_tool_format f)
{
    return f == MX_TOOLS_HERMES ? "hermes" : f == MX_TOOLS_MISTRAL ? "mistral" : NULL;
}

/* ---- output ---- */

void mx_tool_out_free(mx_tool_out *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->n_calls; i++) {
        free(o->calls[i].name);
        free(o->calls[i].arguments);
        free(o->calls[i].id);
    }
    free(o->calls);
    free(o->content);
    memset(o, 0, sizeof *o);
}

static int out_text(mx_tool_out *o, const char *s, size_t n)
{
    if (!n)
        return 0;
    if (o->len + n + 1 > o->cap) {
        size_t c = o->cap ? o->cap * 2 : 256;
        while (c < o->len + n + 1)
            c *= 2;
        char *q = realloc(o->content, c);
        if (!q)
            return MX_ENOMEM;
        o->content = q;
        o->cap = c;
    }
    memcpy(o->content + o->len, s, n);
    o->len += n;
    o->content[o->len] = 0;
    return 0;
}

/* Appends call c (taking its strings). */
static int out_call(mx_tool_out *o, mx_tool_call c)
{
    if (o->n_calls == o->cap_calls) {
        int n = o->cap_calls ? 2 * o->cap_calls : 4;
        mx_tool_call *q = realloc(o->calls, sizeof *q * (size_t)n);
        if (!q)
            return MX_ENOMEM;
        o->calls = q;
        o->cap_calls = n;
    }
    o->calls[o->n_calls++] = c;
    return 0;
}

/* ---- parsing ---- */

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static const char *find(const char *s, size_t n, const char *pat)
{
    return memmem(s, n, pat, strlen(pat));
}

/* Length of the longest proper prefix of pat that s[0..n) ends with. */
static size_t partial_suffix(const char *s, size_t n, const char *pat)
{
    size_t m = strlen(pat);
    for (size_t k = m - 1; k > 0; k--)
        if (k <= n && !memcmp(s + n - k, pat, k))
            return k;
    return 0;
}

/* Where the JSON array or object starting at s[0] ends (one past its
 * closing bracket), 0 while it is incomplete, -1 when s[0] starts neither. */
static long json_value_end(const char *s, size_t n)
{
    if (!n)
        return 0;
    if (s[0] != '[' && s[0] != '{')
        return -1;
    long depth = 0;
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            depth++;
        } else if ((c == ']' || c == '}') && --depth == 0) {
            return (long)i + 1;
        }
    }
    return 0;
}

/* JSON text s[0..n) (whitespace around allowed) as a tree, or NULL. */
static cJSON *parse_json(const char *s, size_t n)
{
    while (n && is_ws(*s))
        s++, n--;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (!j)
        return NULL;
    for (; end && end < s + n; end++)
        if (!is_ws(*end)) {
            cJSON_Delete(j);
            return NULL;
        }
    return j;
}

static void call_free(mx_tool_call *c)
{
    free(c->name);
    free(c->arguments);
    free(c->id);
}

/* {"name": "f", "arguments": {...} | "..."} (also "parameters", as some
 * models write) into c; -1 when it is not a call. */
static int call_from_json(const cJSON *o, mx_tool_call *c)
{
    memset(c, 0, sizeof *c);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    if (!args)
        args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(o) || !cJSON_IsString(name) || !*name->valuestring)
        return -1;
    if (args && !cJSON_IsObject(args) && !cJSON_IsString(args))
        return -1;
    c->name = strdup(name->valuestring);
    c->arguments = !args ? strdup("{}")
                   : cJSON_IsString(args) ? strdup(args->valuestring)
                                          : cJSON_PrintUnformatted(args);
    if (cJSON_IsString(id) && *id->valuestring)
        c->id = strdup(id->valuestring);
    if (!c->name || !c->arguments || (cJSON_IsString(id) && *id->valuestring && !c->id)) {
        call_free(c);
        return MX_ENOMEM;
    }
    return 0;
}

/* The calls in a block body: one call object, or (mistral) a list of them.
 * Returns the number of calls added to out, 0 when the body is not valid
 * (nothing added), or -MX_ENOMEM. */
static int parse_body(const char *s, size_t n, mx_tool_out *out)
{
    cJSON *j = parse_json(s, n);
    if (!j)
        return 0;
    int count = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : 1;
    mx_tool_call *calls = calloc((size_t)(count ? count : 1), sizeof *calls);
    int k = 0, rc = count ? 0 : -1;
    if (!calls) {
        cJSON_Delete(j);
        return -MX_ENOMEM;
    }
    if (cJSON_IsArray(j)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, j) if ((rc = call_from_json(it, &calls[k])) != 0) break;
        else k++;
    } else if ((rc = call_from_json(j, &calls[0])) == 0) {
        k = 1;
    }
    cJSON_Delete(j);
    int added = 0;
    for (int i = 0; i < k; i++) {
        if (rc == 0 && out_call(out, calls[i]) == 0) {
            added++;
        } else {
            if (rc == 0)
                rc = MX_ENOMEM;
            call_free(&calls[i]);
        }
    }
    free(calls);
    if (rc == MX_ENOMEM)
        return -MX_ENOMEM;
    return rc ? 0 : added;
}

void mx_tool_parser_init(mx_tool_parser *p, mx_tool_format f)
{
    memset(p, 0, sizeof *p);
    p->fmt = f;
}

/* The end of the call whose JSON value ends at `end`: past the closing
 * tag when one follows (whitespace before it allowed).  0 while the text
 * after the value may still become the tag. */
static int closing_tag(const tool_markup *m, const char *text, size_t len, int done, size_t *end)
{
    if (!m->end)
        return 1;
    size_t j = *end, ml = strlen(m->end);
    while (j < len && is_ws(text[j]))
        j++;
    size_t rest = len - j;
    if (rest >= ml) {
        if (!memcmp(text + j, m->end, ml))
            *end = j + ml;
        return 1;
    }
    /* a missing tag (cut short, or the model went on) still leaves a call */
    return done || memcmp(text + j, m->end, rest) != 0;
}

/* Inside a call: finds where it ends and takes it (as calls, or as content
 * when it is not a valid call).  The end is found by the JSON's brackets,
 * not by searching for the closing tag, which a string argument may hold.
 * Returns 1 when the call was decided, 0 when more text is needed. */
static int take_call(mx_tool_parser *p, const tool_markup *m, const char *text, size_t len, int done,
                     mx_tool_out *out, int *err)
{
    size_t body = p->call_start + strlen(m->start), i = body, end;
    while (i < len && is_ws(text[i]))
        i++;
    long k = json_value_end(text + i, len - i);
    int n = 0;
    if (k > 0) {
        end = i + (size_t)k;
        if (!closing_tag(m, text, len, done, &end))
            return 0;
        n = parse_body(text + i, (size_t)k, out);
    } else if (k == 0 && !done) {
        return 0;
    } else if (k < 0 && m->end) {
        /* not JSON: the block up to its closing tag is content */
        const char *e = find(text + body, len - body, m->end);
        if (!e && !done)
            return 0;
        end = e ? (size_t)(e - text) + strlen(m->end) : len;
    } else {
        /* cut short inside the JSON, or (mistral) no JSON after the marker */
        end = k < 0 ? body : len;
    }
    if (n < 0) {
        *err = -n;
        return 1;
    }
    if (n > 0) {
        p->n_calls += n;
        p->after_call = 1;
    } else if ((*err = out_text(out, text + p->ws_start, end - p->ws_start))) {
        return 1;
    }
    p->pos = end;
    p->in_call = 0;
    return 1;
}

int mx_tool_parse(mx_tool_parser *p, const char *text, size_t len, int done, mx_tool_out *out)
{
    if (p->fmt == MX_TOOLS_NONE) {
        int rc = len > p->pos ? out_text(out, text + p->pos, len - p->pos) : 0;
        if (!rc)
            p->pos = len;
        return rc;
    }
    const tool_markup *m = &MARKUP[p->fmt];
    int err = 0;
    for (;;) {
        if (p->in_call) {
            if (!take_call(p, m, text, len, done, out, &err))
                return 0;
            if (err)
                return err;
            continue;
        }
        if (p->after_call) {
            while (p->pos < len && is_ws(text[p->pos]))
                p->pos++;
            if (p->pos == len)
                return 0;
            p->after_call = 0;
        }
        const char *s = find(text + p->pos, len - p->pos, m->start);
        size_t stop;
        if (s) {
            stop = (size_t)(s - text);
        } else if (done) {
            stop = len;
        } else {
            /* hold back what may be the start of a marker */
            stop = len - partial_suffix(text + p->pos, len - p->pos, m->start);
        }
        /* whitespace before a call (or, once there were calls, at the end)
         * is dropped; before undecided text it waits (and before a block
         * that turns out not to be a call, it goes out with the block) */
        size_t keep = stop;
        if (s || !done || p->n_calls)
            while (keep > p->pos && is_ws(text[keep - 1]))
                keep--;
        if ((err = out_text(out, text + p->pos, keep - p->pos)))
            return err;
        if (s) {
            p->in_call = 1;
            p->ws_start = keep;
            p->call_start = stop;
            p->pos = stop;
            continue;
        }
        p->pos = done ? len : keep;
        return 0;
    }
}

/* ---- forcing grammar ---- */

typedef struct strbuf {
    char *p;
    size_t n, cap;
    int oom;
} strbuf;

static void sb_add(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(strbuf *b, const char *fmt, ...)
{
    va_list ap;
    while (!b->oom) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
        } else if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        } else {
            size_t c = b->cap ? b->cap * 2 : 256;
            while (c < b->n + (size_t)k + 1)
                c *= 2;
            char *q = realloc(b->p, c);
            if (q) {
                b->p = q;
                b->cap = c;
            } else {
                b->oom = 1;
            }
        }
    }
}

/* A GBNF literal's inside for the JSON encoding of string s ("f" becomes
 * \"f\"); cJSON escapes control characters, so only " and \ need it. */
static void sb_json_string(strbuf *b, const char *s)
{
    cJSON *j = cJSON_CreateString(s);
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!t) {
        b->oom = 1;
        return;
    }
    for (const char *p = t; *p; p++)
        sb_add(b, *p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
    free(t);
}

/* root ::= <open> tool-call <close>
 * tool-call ::= tool-0 | tool-1 | ...
 * tool-K ::= "\"name\": \"NAME\", \"arguments\": " tool-args-K
 * and tool-args-K is the grammar of function K's parameters. */
int mx_tool_grammar(mx_tool_format f, const cJSON *tools, const char *only, char **gbnf, mx_err *e)
{
    *gbnf = NULL;
    if (f != MX_TOOLS_HERMES && f != MX_TOOLS_MISTRAL)
        return mx_fail(e, MX_EUNSUPPORTED, "tool calls: the chat template has no known tool-call format");
    int n = cJSON_GetArraySize(tools);
    const cJSON **schemas = calloc((size_t)(n ? n : 1), sizeof *schemas);
    char(*names)[32] = calloc((size_t)(n ? n : 1), sizeof *names);
    const char **name_ptrs = calloc((size_t)(n ? n : 1), sizeof *name_ptrs);
    cJSON *any_object = cJSON_CreateObject();
    strbuf alts = {0}, defs = {0};
    int rc = !schemas || !names || !name_ptrs || !any_object ||
                     !cJSON_AddStringToObject(any_object, "type", "object")
                 ? MX_ENOMEM
                 : 0;
    int k = 0, i = -1;
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools)
    {
        i++;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (rc)
            break;
        if (!cJSON_IsString(name)) {
            rc = mx_fail(e, MX_EINVAL, "tools[%d].function.name must be a string", i);
            break;
        }
        if (only && strcmp(only, name->valuestring) != 0)
            continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        schemas[k] = params && !cJSON_IsNull(params) ? params : any_object;
        /* compiled alone first, so that an error names the tool */
        char *one = NULL;
        if ((rc = mx_grammar_from_schema(schemas[k], &one, e))) {
            mx_err_prefix(e, "tools[%d].function.parameters", i);
            break;
        }
        free(one);
        snprintf(names[k], sizeof names[k], "tool-args-%d", k);
        name_ptrs[k] = names[k];
        sb_add(&alts, "%s tool-%d", k ? " |" : "tool-call ::=", k);
        sb_add(&defs, "tool-%d ::= \"\\\"name\\\": ", k);
        sb_json_string(&defs, name->valuestring);
        sb_add(&defs, ", \\\"arguments\\\": \" %s\n", names[k]);
        k++;
    }
    if (!rc && !k)
        rc = only ? mx_fail(e, MX_EINVAL, "tool_choice: no function named '%.100s' in 'tools'", only)
                  : mx_fail(e, MX_EINVAL, "tool calls: 'tools' has no function");
    strbuf rules = {0};
    if (!rc) {
        sb_add(&rules, "root ::= %s tool-call %s\n%s\n%s", MARKUP[f].gbnf_open, MARKUP[f].gbnf_close,
               alts.p, defs.p);
        rc = rules.oom || alts.oom || defs.oom ? mx_fail(e, MX_ENOMEM, "tool calls: out of memory") : 0;
    }
    if (!rc)
        rc = mx_grammar_from_schemas(rules.p, k, schemas, name_ptrs, gbnf, e);
    else if (rc == MX_ENOMEM && e && !e->code)
        mx_fail(e, MX_ENOMEM, "tool calls: out of memory");
    free(rules.p);
    free(alts.p);
    free(defs.p);
    free(names);
    free(name_ptrs);
    free(schemas);
    cJSON_Delete(any_object);
    return rc;
}
