/* cmd_chat.c - `mlxcel chat`: an interactive conversation.  Each turn the
 * whole conversation is rendered through the chat template; the session's
 * KV cache already holds all but the new part, so only that is prefilled.
 *
 * Lines come from repl.c (line editing and history on a terminal, plain
 * lines from a pipe).  A line starting with / is a command answered here,
 * never sent to the model; Ctrl-C stops a reply and keeps what it said. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/repl.h"
#include "util/file.h"

static void help(FILE *f)
{
    fprintf(f, "usage: mlxcel chat -m DIR [--system TEXT] [-p TEXT | -f FILE] [options]\n\n"
               "Interactive chat through the checkpoint's chat template.  Type a message and press\n"
               "enter (a line ending in \\ continues on the next).  On a terminal the line can be\n"
               "edited (arrows, emacs keys, Up/Down for history, kept in ~/.mlxcel_history);\n"
               "Ctrl-C stops a reply (what it said so far stays in the conversation), Ctrl-D quits.\n"
               "From a pipe: one message per line.  Commands (/help lists them): /reset, /save FILE,\n"
               "/load FILE, /system [TEXT], /exit; //text sends \"/text\" to the model.\n\n"
               "      --system TEXT       system message\n"
               "  -p, --prompt TEXT       first user message, answered before reading input\n"
               "                          (-p - reads it from stdin)\n"
               "  -f, --file FILE         first user message from FILE\n");
    cli_common_help(f);
    fprintf(f, "\nDefaults: --temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05; --temp 0 is greedy.\n"
               "MLXCEL_HISTORY=FILE keeps the line history elsewhere (empty: not kept).\n");
}

/* ---- the conversation --------------------------------------------------- */

typedef struct convo {
    mx_chat_msg *m;           /* user/assistant turns; the strings are owned */
    size_t n, cap;
    char *system;             /* NULL: none (the template's default applies) */
} convo;

static int convo_add(convo *c, const char *role, const char *content)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        mx_chat_msg *m = realloc(c->m, cap * sizeof *m);
        if (!m)
            return -1;
        c->m = m;
        c->cap = cap;
    }
    char *r = strdup(role), *t = strdup(content);
    if (!r || !t) {
        free(r);
        free(t);
        return -1;
    }
    c->m[c->n++] = (mx_chat_msg){r, t};
    return 0;
}

static void convo_truncate(convo *c, size_t keep)
{
    while (c->n > keep) {
        c->n--;
        free((char *)c->m[c->n].role);
        free((char *)c->m[c->n].content);
    }
}

static int convo_set_system(convo *c, const char *text)
{
    char *s = text ? strdup(text) : NULL;
    if (text && !s)
        return -1;
    free(c->system);
    c->system = s;
    return 0;
}

static void convo_free(convo *c)
{
    convo_truncate(c, 0);
    free(c->m);
    free(c->system);
}

/* The messages as the template gets them: the system message first. */
static mx_chat_msg *convo_messages(const convo *c, size_t *n)
{
    mx_chat_msg *all = malloc((c->n + 1) * sizeof *all);
    if (!all)
        return NULL;
    size_t k = 0;
    if (c->system)
        all[k++] = (mx_chat_msg){"system", c->system};
    memcpy(all + k, c->m, c->n * sizeof *all);
    *n = k + c->n;
    return all;
}

/* ---- a turn ------------------------------------------------------------- */

typedef struct chat {
    mx_engine *g;
    mx_session *s;
    cli_opts *o;
    convo c;
    repl *in;
} chat;

typedef struct reply {
    char *text;
    size_t len, cap;
} reply;

static int on_token(void *ud, int32_t id, const char *text, size_t len)
{
    (void)id;
    reply *r = ud;
    if (repl_interrupted())
        return 1;   /* Ctrl-C: stop here, before this token's text */
    if (!len)
        return 0;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (r->len + len + 1 > r->cap) {
        size_t cap = (r->len + len + 1) * 2;
        char *t = realloc(r->text, cap);
        if (!t)
            return 1;   /* cancel: out of memory */
        r->text = t;
        r->cap = cap;
    }
    memcpy(r->text + r->len, text, len);
    r->len += len;
    r->text[r->len] = 0;
    return 0;
}

/* One user turn: render the conversation, generate, stream the reply and
 * append it.  A turn that cannot run (e.g. a full context) is reported and
 * dropped, and the conversation goes on; a reply stopped by Ctrl-C is kept
 * as far as it got.  Only running out of memory ends the chat (-1). */
static int turn(chat *ch, const char *text)
{
    mx_err e = {0};
    const size_t before = ch->c.n;
    if (convo_add(&ch->c, "user", text))
        return -1;
    size_t nm = 0;
    mx_chat_msg *msgs = convo_messages(&ch->c, &nm);
    if (!msgs)
        return -1;
    int32_t *ids = NULL;
    int nid = 0;
    reply r = {0};
    mx_gen_stats st = {0};
    repl_clear_interrupt();
    int rc = mx_engine_encode_chat(ch->g, msgs, nm, &ids, &nid, NULL, &e);
    if (!rc)
        rc = mx_generate(ch->g, ch->s, ids, nid, &ch->o->gen, on_token, &r, &st, &e);
    free(ids);
    free(msgs);
    const int stopped = !rc && st.finish && !strcmp(st.finish, "cancelled") && repl_interrupted();
    repl_clear_interrupt();
    printf("\n");
    fflush(stdout);
    if (rc || (stopped && !r.len)) {
        if (rc)
            fprintf(stderr, "mlxcel chat: %s\n", e.msg);
        else
            fprintf(stderr, "(stopped before the reply began: the message is dropped; Up recalls it)\n");
        convo_truncate(&ch->c, before);
        free(r.text);
        return 0;
    }
    if (stopped)
        fprintf(stderr, "(stopped: the reply so far stays in the conversation)\n");
    if (ch->o->stats)
        fprintf(stderr, "[%d prompt tokens (%d cached), %d generated, %.1f tok/s, %s]\n", st.n_prompt,
                st.n_cached, st.n_gen, st.t_decode > 0 ? (st.n_gen - 1) / st.t_decode : 0.0, st.finish);
    int bad = convo_add(&ch->c, "assistant", r.text ? r.text : "");
    free(r.text);
    return bad ? -1 : 0;
}

/* ---- commands ----------------------------------------------------------- */

static int do_help(chat *ch, const char *arg);
static int do_reset(chat *ch, const char *arg);
static int do_save(chat *ch, const char *arg);
static int do_load(chat *ch, const char *arg);
static int do_system(chat *ch, const char *arg);
static int do_exit(chat *ch, const char *arg);

/* fn returns 0 to go on, 1 to quit, -1 when out of memory */
static const struct command {
    const char *name, *args, *what;
    int (*fn)(chat *, const char *);
} commands[] = {
    {"/help", "", "this list", do_help},
    {"/reset", "", "start over (the system message stays)", do_reset},
    {"/save", "FILE", "write the conversation as JSON (mlxcel template --messages reads it)", do_save},
    {"/load", "FILE", "replace the conversation with the messages of a JSON file", do_load},
    {"/system", "[TEXT]", "set the system message; without TEXT, remove it", do_system},
    {"/exit", "", "quit (also /quit, Ctrl-D)", do_exit},
    {"/quit", NULL, NULL, do_exit},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static int do_help(chat *ch, const char *arg)
{
    (void)ch;
    (void)arg;
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (commands[i].what) {
            char head[32];
            snprintf(head, sizeof head, "%s %s", commands[i].name, commands[i].args);
            fprintf(stderr, "  %-15s %s\n", head, commands[i].what);
        }
    fprintf(stderr, "  %-15s %s\n", "//TEXT", "send a message that starts with /");
    fprintf(stderr, "  A line ending in \\ continues on the next.  Ctrl-C stops a reply; Ctrl-D quits.\n");
    return 0;
}

static int do_reset(chat *ch, const char *arg)
{
    (void)arg;
    convo_truncate(&ch->c, 0);
    mx_session_reset(ch->s);
    fprintf(stderr, "(conversation cleared)\n");
    return 0;
}

static int do_save(chat *ch, const char *arg)
{
    if (!*arg) {
        fprintf(stderr, "/save needs a file name: /save FILE\n");
        return 0;
    }
    cJSON *arr = cJSON_CreateArray();
    size_t n = 0;
    mx_chat_msg *msgs = arr ? convo_messages(&ch->c, &n) : NULL;
    for (size_t i = 0; msgs && i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, m);
        cJSON_AddStringToObject(m, "role", msgs[i].role);
        cJSON_AddStringToObject(m, "content", msgs[i].content);
    }
    char *text = msgs ? cJSON_Print(arr) : NULL;
    free(msgs);
    cJSON_Delete(arr);
    if (!text)
        return -1;
    FILE *f = fopen(arg, "wb");
    int bad = !f || fputs(text, f) < 0 || fputc('\n', f) == EOF;
    if (f && fclose(f) != 0)
        bad = 1;
    free(text);
    if (bad)
        fprintf(stderr, "/save %s: cannot write the file\n", arg);
    else
        fprintf(stderr, "(%zu messages saved to %s)\n", n, arg);
    return 0;
}

/* Reads a messages array (or an object with one) of role/content strings. */
static int do_load(chat *ch, const char *arg)
{
    if (!*arg) {
        fprintf(stderr, "/load needs a file name: /load FILE\n");
        return 0;
    }
    mx_err e = {0};
    char *text = NULL;
    size_t len = 0;
    if (mx_read_file(arg, &text, &len, &e)) {
        fprintf(stderr, "/load: %s\n", e.msg);
        return 0;
    }
    cJSON *doc = cJSON_Parse(text);
    free(text);
    const cJSON *arr = cJSON_IsObject(doc) ? cJSON_GetObjectItemCaseSensitive(doc, "messages") : doc;
    const char *why = !doc ? "not JSON" : !cJSON_IsArray(arr) ? "not a JSON array of messages" : NULL;
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, arr)
    {
        if (why)
            break;
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "content")))
            why = "a message without string \"role\" and \"content\"";
        else
            i++;
    }
    if (why) {
        fprintf(stderr, "/load %s: %s (message %d); the conversation is unchanged\n", arg, why, i);
        cJSON_Delete(doc);
        return 0;
    }
    convo fresh = {0};
    int oom = 0;
    i = 0;
    cJSON_ArrayForEach(m, arr)
    {
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        const char *content = cJSON_GetObjectItemCaseSensitive(m, "content")->valuestring;
        if (i++ == 0 && !strcmp(role, "system"))
            oom |= convo_set_system(&fresh, content);
        else
            oom |= convo_add(&fresh, role, content);
    }
    cJSON_Delete(doc);
    if (oom) {
        convo_free(&fresh);
        return -1;
    }
    convo_free(&ch->c);
    ch->c = fresh;
    fprintf(stderr, "(%d messages loaded from %s)\n", i, arg);
    return 0;
}

static int do_system(chat *ch, const char *arg)
{
    if (convo_set_system(&ch->c, *arg ? arg : NULL))
        return -1;
    fprintf(stderr, *arg ? "(system message set)\n" : "(system message removed: the template's default applies)\n");
    return 0;
}

static int do_exit(chat *ch, const char *arg)
{
    (void)ch;
    (void)arg;
    return 1;
}

/* A line starting with /: a command, answered here and never sent. */
static int command(chat *ch, const char *line)
{
    size_t len = strcspn(line, " \t");
    const char *arg = line + len;
    arg += strspn(arg, " \t");
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strlen(commands[i].name) == len && !strncmp(line, commands[i].name, len))
            return commands[i].fn(ch, arg);
    const char *names[N_COMMANDS];
    for (size_t i = 0; i < N_COMMANDS; i++)
        names[i] = commands[i].name;
    char word[64];
    snprintf(word, sizeof word, "%.*s", (int)(len < 63 ? len : 63), line);
    const char *near = arg_closest(word, names, N_COMMANDS);
    if (near)
        fprintf(stderr, "unknown command '%s' (did you mean %s?); /help lists the commands, //text sends "
                        "text starting with /\n", word, near);
    else
        fprintf(stderr, "unknown command '%s': /help lists the commands, //text sends text starting with /\n",
                word);
    return 0;
}

/* ---- the loop ----------------------------------------------------------- */

/* Reads one message: lines ending in a backslash continue it.  Returns a
 * REPL_ code; on REPL_LINE *msg is malloc'ed. */
static int read_message(repl *in, char **msg)
{
    *msg = NULL;
    char *acc = NULL;
    size_t n = 0;
    for (;;) {
        const char *line;
        int k = repl_read(in, acc ? "... " : "> ", &line);
        if (k != REPL_LINE) {
            free(acc);
            /* the end of input in the middle of a continued message sends it */
            if (k == REPL_EOF && acc)
                break;
            return k;
        }
        size_t len = strlen(line);
        const int more = len > 0 && line[len - 1] == '\\';
        char *t = realloc(acc, n + len + 2);
        if (!t) {
            free(acc);
            return REPL_ERROR;
        }
        acc = t;
        memcpy(acc + n, line, len - (size_t)more);
        n += len - (size_t)more;
        acc[n] = 0;
        if (!more)
            break;
        acc[n++] = '\n';
        acc[n] = 0;
    }
    *msg = acc;
    return acc ? REPL_LINE : REPL_EOF;
}

static char *history_file(void)
{
    const char *env = getenv("MLXCEL_HISTORY");
    if (env)
        return *env ? strdup(env) : NULL;
    const char *home = getenv("HOME");
    if (!home || !*home)
        return NULL;
    size_t len = strlen(home) + 32;
    char *p = malloc(len);
    if (p)
        snprintf(p, len, "%s/.mlxcel_history", home);
    return p;
}

static int loop(chat *ch)
{
    const int tty = repl_is_tty(ch->in);
    for (;;) {
        char *msg = NULL;
        int k = read_message(ch->in, &msg);
        if (k == REPL_EOF) {
            if (tty)
                fputc('\n', stderr);   /* Ctrl-D: the shell's prompt starts on a new line */
            return 0;
        }
        if (k == REPL_INTERRUPT) {
            fputs("^C\n", stderr);
            continue;
        }
        if (k != REPL_LINE)
            return -1;
        repl_remember(ch->in, msg);
        int r = 0;
        if (msg[0] == '/' && msg[1] != '/')
            r = command(ch, msg);
        else if (msg[0])
            r = turn(ch, msg[0] == '/' ? msg + 1 : msg);
        free(msg);
        if (r)
            return r > 0 ? 0 : -1;
    }
}

int cmd_chat(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o, 0.8f);
    const char *system = NULL, *first = NULL, *file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_common_option(argc, argv, &i, &o);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return 0;
        } else if (!strcmp(a, "--system")) {
            if (!(system = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(first = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = arg_value(argc, argv, &i)))
                return 2;
        } else {
            return arg_unknown("chat", a, help);
        }
    }
    if (!o.model) {
        fprintf(stderr, "mlxcel chat: -m DIR is required (see --help)\n");
        return 2;
    }
    if (first && file) {
        fprintf(stderr, "mlxcel chat: give at most one of -p, -f\n");
        return 2;
    }
    char *read_text = NULL;
    if (file || (first && !strcmp(first, "-"))) {
        if (!(read_text = arg_read_text(file ? "-f" : "-p", file ? file : "-")))
            return 2;
        first = read_text;
    }
    mx_err e = {0};
    chat ch = {.o = &o};
    int n_ctx = 0, rc = 0;
    if (mx_engine_load(o.model, MX_TOKENIZER_REQUIRED, &ch.g, &e) ||
        mx_session_new(ch.g, n_ctx = cli_ctx(&o, ch.g->model), &ch.s, &e)) {
        fprintf(stderr, "mlxcel chat: %s\n", e.msg);
        rc = 1;
    }
    char *hist = NULL;
    if (!rc) {
        o.gen.max_tokens = cli_max_tokens(&o, n_ctx);
        cli_lookup_check(&o, ch.g->model);
        hist = history_file();
        if (!(ch.in = repl_open(hist)) || (system && convo_set_system(&ch.c, system))) {
            fprintf(stderr, "mlxcel chat: cannot start line input (out of memory or no terminal)\n");
            rc = 1;
        }
    }
    if (!rc) {
        if (repl_is_tty(ch.in))
            fprintf(stderr, "mlxcel chat: %s — /help for commands, Ctrl-C stops a reply, Ctrl-D quits\n",
                    o.model);
        int r = first ? turn(&ch, first) : 0;
        if (!r)
            r = loop(&ch);
        if (r < 0) {
            fprintf(stderr, "mlxcel chat: out of memory\n");
            rc = 1;
        }
    }
    repl_close(ch.in);
    free(hist);
    free(read_text);
    convo_free(&ch.c);
    mx_session_free(ch.s);
    mx_engine_free(ch.g);
    return rc;
}
