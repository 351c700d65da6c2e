/* cmd_template.c - `mlxcel template`: the prompt a checkpoint's chat template
 * renders for a list of messages, printed exactly (or as token ids).  It
 * loads the template and renders it with the same calls generate --chat, the
 * chat REPL and the server make (mx_chat_template_load, mx_chat_render_json),
 * so what it prints is what those feed the model; no weights are loaded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "chat/template.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"
#include "util/file.h"

static void help(FILE *f)
{
    fprintf(f, "usage: mlxcel template -m DIR --messages FILE [--tools FILE] [--add-generation-prompt]\n"
               "                       [--kwarg KEY=JSON]... [--template FILE] [--ids]\n\n"
               "Prints the prompt the checkpoint's chat template renders for the messages, byte for\n"
               "byte as generate --chat, chat and serve render it (no newline is added unless stdout\n"
               "is a terminal).  Only tokenizer_config.json (or chat_template.jinja) is read; no\n"
               "weights are loaded.\n\n"
               "  -m, --model DIR            checkpoint folder\n"
               "      --messages FILE        JSON array of messages ({\"role\", \"content\", ...}, as in the\n"
               "                             OpenAI API; tool_calls and other fields reach the template),\n"
               "                             or an object with a \"messages\" array; - reads stdin\n"
               "      --tools FILE           JSON array of tools, the template's `tools` (default none)\n"
               "      --add-generation-prompt  end with the header of the assistant's turn\n"
               "      --kwarg KEY=JSON       a further template variable, e.g. enable_thinking=false or\n"
               "                             name='\"text\"' (repeatable)\n"
               "      --template FILE        render this Jinja template instead of the checkpoint's\n"
               "                             (bos/eos tokens still come from the checkpoint)\n"
               "      --ids                  print the token ids of the rendered prompt instead (special\n"
               "                             tokens recognised, nothing added; needs tokenizer.json)\n");
}

/* Reads and parses a JSON file named by option `opt`; NULL after an error. */
static cJSON *read_json(const char *opt, const char *path)
{
    char *text = arg_read_text(opt, path);
    if (!text)
        return NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
    if (!j)
        fprintf(stderr, "mlxcel template: %s %s: invalid JSON at byte %zu\n", opt, path,
                end && end >= text ? (size_t)(end - text) : 0);
    free(text);
    return j;
}

/* The messages: an array of objects with a string role. */
static int check_messages(const char *path, const cJSON *msgs)
{
    if (!cJSON_IsArray(msgs)) {
        fprintf(stderr, "mlxcel template: --messages %s: expected a JSON array of messages "
                        "(or an object with a \"messages\" array)\n", path);
        return -1;
    }
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role"))) {
            fprintf(stderr, "mlxcel template: --messages %s: message %d is not an object with a "
                            "string \"role\"\n", path, i);
            return -1;
        }
        i++;
    }
    return 0;
}

/* KEY=JSON into obj[KEY]. */
static int add_kwarg(cJSON *obj, const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg) {
        fprintf(stderr, "mlxcel template: --kwarg '%s': expected KEY=JSON, e.g. enable_thinking=false\n", arg);
        return -1;
    }
    cJSON *v = cJSON_ParseWithOpts(eq + 1, NULL, 1);
    if (!v) {
        fprintf(stderr, "mlxcel template: --kwarg '%s': the value is not JSON (a string needs quotes: "
                        "KEY='\"text\"')\n", arg);
        return -1;
    }
    char *key = strndup(arg, (size_t)(eq - arg));
    if (!key) {
        cJSON_Delete(v);
        return -1;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddItemToObject(obj, key, v);
    free(key);
    return 0;
}

/* The checkpoint's template, or --template FILE with the checkpoint's
 * special tokens. */
static int load_template(const char *dir, const char *file, mx_chat_template **t, mx_err *e)
{
    int rc = mx_chat_template_load(dir, t, e);
    if (rc || !file)
        return rc;
    char *text = NULL;
    size_t len = 0;
    if ((rc = mx_read_file(file, &text, &len, e)) == 0) {
        mx_chat_template *own = NULL;
        rc = mx_chat_template_from_string(text, mx_chat_template_bos(*t), mx_chat_template_eos(*t), &own, e);
        mx_chat_template_free(*t);
        *t = own;
    }
    free(text);
    return rc;
}

static int print_ids(const char *dir, const char *text, mx_err *e)
{
    mx_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = mx_tok_load_dir(dir, &tok, e);
    if (!rc)
        rc = mx_tok_encode(tok, text, strlen(text), 1, &ids, &n, e);
    for (size_t i = 0; !rc && i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    if (!rc)
        printf("\n");
    free(ids);
    mx_tok_free(tok);
    return rc;
}

int cmd_template(int argc, char **argv)
{
    const char *dir = NULL, *msgs_path = NULL, *tools_path = NULL, *tmpl_path = NULL;
    int gen_prompt = 0, ids = 0;
    cJSON *extra = cJSON_CreateObject();
    if (!extra)
        return 1;
    int usage = 0;
    for (int i = 1; i < argc && !usage; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            cJSON_Delete(extra);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            usage = !(dir = arg_value(argc, argv, &i));
        } else if (!strcmp(a, "--messages")) {
            usage = !(msgs_path = arg_value(argc, argv, &i));
        } else if (!strcmp(a, "--tools")) {
            usage = !(tools_path = arg_value(argc, argv, &i));
        } else if (!strcmp(a, "--template")) {
            usage = !(tmpl_path = arg_value(argc, argv, &i));
        } else if (!strcmp(a, "--add-generation-prompt")) {
            gen_prompt = 1;
        } else if (!strcmp(a, "--ids")) {
            ids = 1;
        } else if (!strcmp(a, "--kwarg")) {
            usage = !(v = arg_value(argc, argv, &i)) || add_kwarg(extra, v);
        } else {
            usage = arg_unknown("template", a, help);
        }
    }
    if (!usage && (!dir || !msgs_path)) {
        fprintf(stderr, "mlxcel template: -m DIR and --messages FILE are required (see --help)\n");
        usage = 1;
    }
    struct stat st;
    if (!usage && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "mlxcel template: %s: not a directory\n", dir);
        usage = 1;
    }
    cJSON *doc = NULL, *tools = NULL;
    const cJSON *msgs = NULL;
    if (!usage && !(doc = read_json("--messages", msgs_path)))
        usage = 1;
    if (!usage) {
        msgs = cJSON_IsObject(doc) ? cJSON_GetObjectItemCaseSensitive(doc, "messages") : doc;
        usage = check_messages(msgs_path, msgs) != 0;
    }
    if (!usage && tools_path && !(tools = read_json("--tools", tools_path)))
        usage = 1;
    if (!usage && tools && !cJSON_IsArray(tools) && !cJSON_IsNull(tools)) {
        fprintf(stderr, "mlxcel template: --tools %s: expected a JSON array of tools\n", tools_path);
        usage = 1;
    }
    int rc = 0;
    if (!usage) {
        mx_err e = {0};
        mx_chat_template *t = NULL;
        char *out = NULL;
        rc = load_template(dir, tmpl_path, &t, &e);
        if (!rc && !tmpl_path && mx_chat_template_is_fallback(t))
            fprintf(stderr, "mlxcel template: %s has no chat template: the ChatML fallback renders\n", dir);
        if (!rc)
            rc = mx_chat_render_json(t, msgs, cJSON_IsNull(tools) ? NULL : tools, extra, gen_prompt, &out, &e);
        if (!rc && ids) {
            rc = print_ids(dir, out, &e);
        } else if (!rc) {
            fwrite(out, 1, strlen(out), stdout);
            if (isatty(STDOUT_FILENO))
                putchar('\n');
        }
        if (rc)
            fprintf(stderr, "mlxcel template: %s\n", e.msg);
        free(out);
        mx_chat_template_free(t);
    }
    cJSON_Delete(doc);
    cJSON_Delete(tools);
    cJSON_Delete(extra);
    return usage ? 2 : rc ? 1 : 0;
}
