/* schema.c - JSON Schema -> GBNF.
 *
 * Each schema node becomes a rule; objects list their properties in the
 * schema's order (required ones always, optional ones may be left out),
 * with commas placed by a chain of rules: rest_i_first / rest_i_more for
 * "nothing written yet" and "something written".  Whitespace between
 * tokens is bounded (a weak model must not be able to wander in it
 * forever).  Keywords outside the documented subset are refused by name
 * rather than ignored: an output that silently breaks the schema is worse
 * than a 400. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "grammar/grammar.h"

typedef struct sb {
    char *p;
    size_t n, cap;
    int oom;
} sb;

static void sb_add(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sb *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t c = b->cap ? b->cap * 2 : 4096;
        while (c < b->n + (size_t)k + 1)
            c *= 2;
        char *q = realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = c;
    }
}

typedef struct comp {
    sb out;
    const cJSON *root;
    int n_rules;
    int depth;
    mx_err *e;
    int failed;
} comp;

static const char *PRIMITIVES =
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"
    "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"
    "json-char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "json-int ::= \"-\"? ([0-9] | [1-9] [0-9]{1,15})\n"
    "json-number ::= json-int (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
    "json-bool ::= \"true\" | \"false\"\n"
    "json-null ::= \"null\"\n"
    "json-value ::= json-object | json-array | json-string | json-number | json-bool | json-null\n"
    "json-object ::= \"{\" ws (json-string ws \":\" ws json-value ws (\",\" ws json-string ws \":\" ws "
    "json-value ws)*)? \"}\"\n"
    "json-array ::= \"[\" ws (json-value ws (\",\" ws json-value ws)*)? \"]\"\n";

const char *mx_grammar_json_object_gbnf(void)
{
    static char buf[2048];
    if (!buf[0])
        snprintf(buf, sizeof buf, "root ::= json-object\n%s", PRIMITIVES);
    return buf;
}

static int cfail(comp *c, const char *fmt, const char *a)
{
    if (!c->failed)
        mx_fail(c->e, MX_EINVAL, fmt, a);
    c->failed = 1;
    return -1;
}

static int valid_utf8(const char *s)
{
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    utf8proc_ssize_t n = (utf8proc_ssize_t)strlen(s);
    while (n > 0) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate(p, n, &cp);
        if (l <= 0)
            return 0;
        p += l;
        n -= l;
    }
    return 1;
}

/* A GBNF string literal for the JSON text of v (e.g. "\"abc\"" for "abc"). */
static void literal_of_json(comp *c, const cJSON *v)
{
    char *j = cJSON_PrintUnformatted(v);
    if (!j) {
        c->out.oom = 1;
        return;
    }
    if (!valid_utf8(j)) {
        /* GBNF literals are UTF-8 text (and JSON is, by RFC 8259) */
        cfail(c, "json schema: a string in the schema is not valid UTF-8%s", "");
        free(j);
        return;
    }
    sb_add(&c->out, "\"");
    for (const unsigned char *p = (const unsigned char *)j; *p; p++) {
        if (*p == '"' || *p == '\\')
            sb_add(&c->out, "\\%c", *p);
        else if (*p < 0x20)
            sb_add(&c->out, "\\x%02x", *p);
        else
            sb_add(&c->out, "%c", *p);
    }
    sb_add(&c->out, "\"");
    free(j);
}

static int node(comp *c, const cJSON *s, int *rule);

static const char *const known[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength",
    "maxLength", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "description", "title", "default", "examples", "$schema", "$id", "$comment", "strict", "nullable",
    "deprecated", "readOnly", "writeOnly", NULL};

static int check_keywords(comp *c, const cJSON *s)
{
    const cJSON *k;
    cJSON_ArrayForEach(k, s)
    {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++)
            ok = !strcmp(k->string, known[i]);
        if (!ok)
            return cfail(c, "json schema: the keyword '%s' is not supported", k->string);
    }
    return 0;
}

static int new_rule(comp *c) { return c->n_rules++; }

static long get_count(const cJSON *s, const char *key, long def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 1e6 ? (long)v->valuedouble : def;
}

static int string_rule(comp *c, const cJSON *s, int r)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (f) {
        const char *fmt = cJSON_IsString(f) ? f->valuestring : "";
        /* RFC 3339 full-date: each month its own days, February 29 only
         * in leap years (divisible by 4; of the centuries, those divisible
         * by 400), so the output is always a real date */
        const char *date =
            "([0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | "
            "(\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | "
            "\"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])) | "
            "([0-9] [0-9] (\"0\" [48] | [2468] [048] | [13579] [26]) | "
            "(\"0\" [048] | [2468] [048] | [13579] [26]) \"00\") \"-02-29\")";
        /* RFC 3339 full-time: the offset's hours and minutes in range too */
        const char *time = "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
                           "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
        if (!strcmp(fmt, "date"))
            sb_add(&c->out, "r%d ::= \"\\\"\" %s \"\\\"\"\n", r, date);
        else if (!strcmp(fmt, "time"))
            sb_add(&c->out, "r%d ::= \"\\\"\" %s \"\\\"\"\n", r, time);
        else if (!strcmp(fmt, "date-time"))
            sb_add(&c->out, "r%d ::= \"\\\"\" %s \"T\" %s \"\\\"\"\n", r, date, time);
        else if (!strcmp(fmt, "uuid"))
            sb_add(&c->out, "r%d ::= \"\\\"\" [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" "
                            "[0-9a-f]{4} \"-\" [0-9a-f]{12} \"\\\"\"\n", r);
        else
            return cfail(c, "json schema: the string format '%s' is not supported (date, time, "
                            "date-time, uuid are)", fmt);
        return 0;
    }
    long lo = get_count(s, "minLength", 0), hi = get_count(s, "maxLength", -1);
    if (hi >= 0 && hi < lo)
        return cfail(c, "json schema: maxLength < minLength%s", "");
    if (lo > 1000 || hi > 1000)
        return cfail(c, "json schema: minLength/maxLength over 1000 are not supported%s", "");
    if (hi >= 0)
        sb_add(&c->out, "r%d ::= \"\\\"\" json-char{%ld,%ld} \"\\\"\"\n", r, lo, hi);
    else if (lo > 0)
        sb_add(&c->out, "r%d ::= \"\\\"\" json-char{%ld,} \"\\\"\"\n", r, lo);
    else
        sb_add(&c->out, "r%d ::= json-string\n", r);
    return 0;
}

static int array_rule(comp *c, const cJSON *s, int r)
{
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    if (prefix) {
        if (!cJSON_IsArray(prefix))
            return cfail(c, "json schema: 'prefixItems' must be a list%s", "");
        if (items && !cJSON_IsFalse(items))
            return cfail(c, "json schema: 'items' beside 'prefixItems' is not supported%s", "");
        int n = cJSON_GetArraySize(prefix), k = 0;
        int *sub = calloc((size_t)(n ? n : 1), sizeof *sub);
        if (!sub)
            return cfail(c, "json schema: out of memory%s", "");
        const cJSON *it;
        cJSON_ArrayForEach(it, prefix) if (node(c, it, &sub[k++])) break;
        if (!c->failed) {
            sb_add(&c->out, "r%d ::= \"[\" ws", r);
            for (int i = 0; i < n; i++)
                sb_add(&c->out, "%s r%d ws", i ? " \",\" ws" : "", sub[i]);
            sb_add(&c->out, " \"]\"\n");
        }
        free(sub);
        return c->failed ? -1 : 0;
    }
    int item = -1;
    if (items && !cJSON_IsTrue(items)) {
        if (node(c, items, &item))
            return -1;
    }
    long lo = get_count(s, "minItems", 0), hi = get_count(s, "maxItems", -1);
    if (hi >= 0 && hi < lo)
        return cfail(c, "json schema: maxItems < minItems%s", "");
    if (lo > 100 || hi > 100)
        return cfail(c, "json schema: minItems/maxItems over 100 are not supported%s", "");
    char it[32];
    if (item >= 0)
        snprintf(it, sizeof it, "r%d", item);
    else
        snprintf(it, sizeof it, "json-value");
    if (hi == 0) {
        sb_add(&c->out, "r%d ::= \"[\" ws \"]\"\n", r);
    } else if (lo == 0) {
        if (hi < 0)
            sb_add(&c->out, "r%d ::= \"[\" ws (%s ws (\",\" ws %s ws)*)? \"]\"\n", r, it, it);
        else
            sb_add(&c->out, "r%d ::= \"[\" ws (%s ws (\",\" ws %s ws){0,%ld})? \"]\"\n", r, it, it, hi - 1);
    } else {
        if (hi < 0)
            sb_add(&c->out, "r%d ::= \"[\" ws %s ws (\",\" ws %s ws){%ld,} \"]\"\n", r, it, it, lo - 1);
        else
            sb_add(&c->out, "r%d ::= \"[\" ws %s ws (\",\" ws %s ws){%ld,%ld} \"]\"\n", r, it, it, lo - 1,
                   hi - 1);
    }
    return 0;
}

static int is_required(const cJSON *req, const char *name)
{
    const cJSON *v;
    cJSON_ArrayForEach(v, req) if (cJSON_IsString(v) && !strcmp(v->valuestring, name)) return 1;
    return 0;
}

static int object_rule(comp *c, const cJSON *s, int r)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return cfail(c, "json schema: 'properties' must be an object%s", "");
    if (req && !cJSON_IsArray(req))
        return cfail(c, "json schema: 'required' must be a list%s", "");
    if (!props) {
        if (add && !cJSON_IsTrue(add) && !(cJSON_IsObject(add) && !add->child))
            return cfail(c, "json schema: 'additionalProperties' with a schema is not supported "
                            "(only true, or false with 'properties')%s", "");
        sb_add(&c->out, "r%d ::= json-object\n", r);
        return 0;
    }
    if (add && cJSON_IsTrue(add))
        return cfail(c, "json schema: 'additionalProperties': true beside 'properties' is not "
                        "supported (the properties listed are the ones produced)%s", "");
    const cJSON *v;
    cJSON_ArrayForEach(v, req) if (!cJSON_IsString(v) || !cJSON_GetObjectItemCaseSensitive(props, v->valuestring))
        return cfail(c, "json schema: a 'required' entry is not among the 'properties'%s", "");
    int n = cJSON_GetArraySize(props);
    int *kv = calloc((size_t)(n ? n : 1), sizeof *kv);
    int *reqd = calloc((size_t)(n ? n : 1), sizeof *reqd);
    if (!kv || !reqd) {
        free(kv);
        free(reqd);
        return cfail(c, "json schema: out of memory%s", "");
    }
    int i = 0;
    cJSON_ArrayForEach(v, props)
    {
        int sub;
        if (node(c, v, &sub))
            break;
        kv[i] = new_rule(c);
        reqd[i] = is_required(req, v->string);
        sb_add(&c->out, "r%d ::= ", kv[i]);
        cJSON *name = cJSON_CreateString(v->string);
        literal_of_json(c, name);
        cJSON_Delete(name);
        sb_add(&c->out, " ws \":\" ws r%d\n", sub);
        i++;
    }
    if (!c->failed) {
        /* rest chains: first = nothing written yet, more = something written */
        int base = c->n_rules;
        c->n_rules += 2 * (n + 1);
        for (int k = 0; k <= n; k++) {
            int first = base + 2 * k, more = first + 1;
            if (k == n) {
                sb_add(&c->out, "r%d ::= \"\"\nr%d ::= \"\"\n", first, more);
                continue;
            }
            int nf = base + 2 * (k + 1), nm = nf + 1;
            sb_add(&c->out, "r%d ::= r%d ws r%d%s", first, kv[k], nm, reqd[k] ? "\n" : "");
            if (!reqd[k])
                sb_add(&c->out, " | r%d\n", nf);
            sb_add(&c->out, "r%d ::= \",\" ws r%d ws r%d%s", more, kv[k], nm, reqd[k] ? "\n" : "");
            if (!reqd[k])
                sb_add(&c->out, " | r%d\n", nm);
        }
        sb_add(&c->out, "r%d ::= \"{\" ws r%d \"}\"\n", r, base);
    }
    free(kv);
    free(reqd);
    return c->failed ? -1 : 0;
}

/* The schema a "$ref" points to ("#/$defs/x", "#/definitions/x", "#"). */
static const cJSON *resolve_ref(comp *c, const char *ref)
{
    if (!strcmp(ref, "#"))
        return c->root;
    const char *pre[] = {"#/$defs/", "#/definitions/"};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(pre[i]);
        if (!strncmp(ref, pre[i], n)) {
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(c->root, i ? "definitions" : "$defs");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(d, ref + n);
            if (t)
                return t;
        }
    }
    cfail(c, "json schema: '$ref' '%s' does not point into $defs or definitions", ref);
    return NULL;
}

static int typed_rule(comp *c, const cJSON *s, const char *type, int r)
{
    if (!strcmp(type, "string"))
        return string_rule(c, s, r);
    if (!strcmp(type, "integer"))
        sb_add(&c->out, "r%d ::= json-int\n", r);
    else if (!strcmp(type, "number"))
        sb_add(&c->out, "r%d ::= json-number\n", r);
    else if (!strcmp(type, "boolean"))
        sb_add(&c->out, "r%d ::= json-bool\n", r);
    else if (!strcmp(type, "null"))
        sb_add(&c->out, "r%d ::= json-null\n", r);
    else if (!strcmp(type, "array"))
        return array_rule(c, s, r);
    else if (!strcmp(type, "object"))
        return object_rule(c, s, r);
    else
        return cfail(c, "json schema: unknown type '%s'", type);
    return 0;
}

/* Compiles schema s into a new rule; *rule gets its number. */
static int node(comp *c, const cJSON *s, int *rule)
{
    if (++c->depth > 64) {
        c->depth--;
        return cfail(c, "json schema: nested more than 64 levels (or a $ref cycle)%s", "");
    }
    int r = *rule = new_rule(c);
    int rc = 0;
    const cJSON *v;
    if (cJSON_IsTrue(s) || (cJSON_IsObject(s) && !s->child)) {
        sb_add(&c->out, "r%d ::= json-value\n", r);
    } else if (!cJSON_IsObject(s)) {
        rc = cfail(c, "json schema: a schema must be an object or true%s", "");
    } else if (check_keywords(c, s)) {
        rc = -1;
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        const cJSON *t = cJSON_IsString(v) ? resolve_ref(c, v->valuestring) : NULL;
        int sub;
        if (!t || node(c, t, &sub))
            rc = cfail(c, "json schema: bad '$ref'%s", "");
        else
            sb_add(&c->out, "r%d ::= r%d\n", r, sub);
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        sb_add(&c->out, "r%d ::= ", r);
        literal_of_json(c, v);
        sb_add(&c->out, "\n");
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        if (!cJSON_IsArray(v) || !v->child)
            return cfail(c, "json schema: 'enum' must be a non-empty list%s", "");
        sb_add(&c->out, "r%d ::= ", r);
        const cJSON *x;
        cJSON_ArrayForEach(x, v)
        {
            if (x != v->child)
                sb_add(&c->out, " | ");
            literal_of_json(c, x);
        }
        sb_add(&c->out, "\n");
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "anyOf")) ||
               (v = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        if (!cJSON_IsArray(v) || !v->child)
            return cfail(c, "json schema: 'anyOf'/'oneOf' must be a non-empty list%s", "");
        int n = cJSON_GetArraySize(v), k = 0;
        int *sub = calloc((size_t)n, sizeof *sub);
        if (!sub)
            return cfail(c, "json schema: out of memory%s", "");
        const cJSON *x;
        cJSON_ArrayForEach(x, v) if (node(c, x, &sub[k++])) break;
        if (!c->failed) {
            sb_add(&c->out, "r%d ::= ", r);
            for (int i = 0; i < n; i++)
                sb_add(&c->out, "%sr%d", i ? " | " : "", sub[i]);
            sb_add(&c->out, "\n");
        }
        free(sub);
        rc = c->failed ? -1 : 0;
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        if (cJSON_IsString(v)) {
            rc = typed_rule(c, s, v->valuestring, r);
        } else if (cJSON_IsArray(v) && v->child) {
            /* ["string", "null"]: one rule per type */
            int n = cJSON_GetArraySize(v), k = 0;
            int *sub = calloc((size_t)n, sizeof *sub);
            if (!sub)
                return cfail(c, "json schema: out of memory%s", "");
            const cJSON *x;
            cJSON_ArrayForEach(x, v)
            {
                if (!cJSON_IsString(x)) {
                    rc = cfail(c, "json schema: 'type' entries must be strings%s", "");
                    break;
                }
                sub[k] = new_rule(c);
                if ((rc = typed_rule(c, s, x->valuestring, sub[k++])))
                    break;
            }
            if (!rc) {
                sb_add(&c->out, "r%d ::= ", r);
                for (int i = 0; i < n; i++)
                    sb_add(&c->out, "%sr%d", i ? " | " : "", sub[i]);
                sb_add(&c->out, "\n");
            }
            free(sub);
        } else {
            rc = cfail(c, "json schema: 'type' must be a string or a list of strings%s", "");
        }
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties")) {
        rc = object_rule(c, s, r);
    } else {
        sb_add(&c->out, "r%d ::= json-value\n", r);
    }
    c->depth--;
    return rc;
}

int mx_grammar_from_schema(const cJSON *schema, char **gbnf, mx_err *e)
{
    const char *name = "root";
    return mx_grammar_from_schemas(NULL, 1, &schema, &name, gbnf, e);
}

int mx_grammar_from_schemas(const char *rules, int n, const cJSON *const *schemas,
                            const char *const *names, char **gbnf, mx_err *e)
{
    *gbnf = NULL;
    comp c = {.e = e};
    /* the caller's rules end their last line even when the text does not,
     * so the compiled rules after them start on a line of their own */
    if (rules && *rules)
        sb_add(&c.out, "%s%s", rules, rules[strlen(rules) - 1] == '\n' ? "" : "\n");
    for (int i = 0; i < n && !c.failed; i++) {
        int r;
        /* "$ref": "#" means this schema's own root */
        c.root = schemas[i];
        if (node(&c, schemas[i], &r))
            break;
        sb_add(&c.out, "%s ::= r%d\n", names[i], r);
    }
    if (c.failed) {
        free(c.out.p);
        return e && e->code ? e->code : MX_EINVAL;
    }
    sb_add(&c.out, "%s", PRIMITIVES);
    if (c.out.oom) {
        free(c.out.p);
        return mx_fail(e, MX_ENOMEM, "json schema: out of memory");
    }
    *gbnf = c.out.p;
    return MX_OK;
}
