/* cmd_chat.c - `mlxcel chat`: an interactive conversation.  Each turn the
 * whole conversation is rendered through the chat template; the session's
 * KV cache already holds all but the new part, so only that is prefilled.
 * Reads lines from stdin (a terminal or a pipe); /reset starts over, /exit
 * or end of input quits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"

static void help(FILE *f)
{
    fprintf(f, "usage: mlxcel chat -m DIR [--system TEXT] [-p TEXT | -f FILE] [options]\n\n"
               "Interactive chat through the checkpoint's chat template.  Type a message and press\n"
               "enter; /reset clears the conversation, /exit (or end of input) quits.  Works with\n"
               "stdin from a pipe: one message per line.\n\n"
               "      --system TEXT       system message\n"
               "  -p, --prompt TEXT       first user message, answered before reading input\n"
               "                          (-p - reads it from stdin)\n"
               "  -f, --file FILE         first user message from FILE\n");
    cli_common_help(f);
    fprintf(f, "\nDefaults: --temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05; --temp 0 is greedy.\n");
}

typedef struct reply {
    char *text;
    size_t len, cap;
} reply;

static int on_token(void *ud, int32_t id, const char *text, size_t len)
{
    (void)id;
    reply *r = ud;
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

typedef struct convo {
    mx_chat_msg *m;
    char **owned;
    size_t n, cap;
} convo;

static int convo_add(convo *c, const char *role, char *content)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        mx_chat_msg *m = realloc(c->m, cap * sizeof *m);
        char **o = realloc(c->owned, cap * sizeof *o);
        if (m)
            c->m = m;
        if (o)
            c->owned = o;
        if (!m || !o)
            return -1;
        c->cap = cap;
    }
    c->owned[c->n] = content;
    c->m[c->n++] = (mx_chat_msg){role, content};
    return 0;
}

static void convo_clear(convo *c, size_t keep)
{
    while (c->n > keep)
        free(c->owned[--c->n]);
}

/* Everything a turn needs. */
typedef struct chat {
    mx_engine *g;
    mx_session *s;
    cli_opts *o;
    convo c;
} chat;

/* One user turn: render the conversation, generate, stream the reply and
 * append it.  A turn that cannot run (e.g. context full) is reported and
 * dropped, and the conversation goes on; only running out of memory ends it. */
static int turn(chat *ch, const char *text, mx_err *e)
{
    char *msg = strdup(text);
    if (!msg || convo_add(&ch->c, "user", msg)) {
        free(msg);
        return mx_fail(e, MX_ENOMEM, "out of memory");
    }
    int32_t *ids = NULL;
    int nid = 0;
    reply r = {0};
    mx_gen_stats st;
    int rc = mx_engine_encode_chat(ch->g, ch->c.m, ch->c.n, &ids, &nid, NULL, e);
    if (!rc)
        rc = mx_generate(ch->g, ch->s, ids, nid, &ch->o->gen, on_token, &r, &st, e);
    free(ids);
    printf("\n");
    fflush(stdout);
    if (rc) {
        fprintf(stderr, "mlxcel chat: %s\n", e->msg);
        free(ch->c.owned[--ch->c.n]);
        free(r.text);
        return 0;
    }
    if (ch->o->stats)
        fprintf(stderr, "[%d prompt tokens (%d cached), %d generated, %.1f tok/s, %s]\n", st.n_prompt,
                st.n_cached, st.n_gen, st.t_decode > 0 ? (st.n_gen - 1) / st.t_decode : 0.0, st.finish);
    char *answer = r.text ? r.text : strdup("");
    if (!answer || convo_add(&ch->c, "assistant", answer)) {
        free(answer);
        return mx_fail(e, MX_ENOMEM, "out of memory");
    }
    return 0;
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
    int n_ctx = 0;
    if (mx_engine_load(o.model, MX_TOKENIZER_REQUIRED, &ch.g, &e) ||
        mx_session_new(ch.g, n_ctx = cli_ctx(&o, ch.g->model), &ch.s, &e)) {
        fprintf(stderr, "mlxcel chat: %s\n", e.msg);
        mx_engine_free(ch.g);
        free(read_text);
        return 1;
    }
    o.gen.max_tokens = cli_max_tokens(&o, n_ctx);
    const int tty = isatty(STDIN_FILENO);
    if (tty)
        fprintf(stderr, "mlxcel chat: %s — /reset to start over, /exit to quit\n", o.model);
    size_t base = 0;
    char *sys = system ? strdup(system) : NULL;
    if (system && (!sys || convo_add(&ch.c, "system", sys))) {
        free(sys);
        fprintf(stderr, "mlxcel chat: out of memory\n");
        return 1;
    }
    base = ch.c.n;
    int rc = first ? turn(&ch, first, &e) : 0;
    char *line = NULL;
    size_t cap = 0;
    while (!rc) {
        if (tty)
            fprintf(stderr, "> ");
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0)
            break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit"))
            break;
        if (!strcmp(line, "/reset")) {
            convo_clear(&ch.c, base);
            mx_session_reset(ch.s);
            if (tty)
                fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        if (n)
            rc = turn(&ch, line, &e);
    }
    free(line);
    free(read_text);
    convo_clear(&ch.c, 0);
    free(ch.c.m);
    free(ch.c.owned);
    mx_session_free(ch.s);
    mx_engine_free(ch.g);
    if (rc)
        fprintf(stderr, "mlxcel chat: %s\n", e.msg);
    return rc ? 1 : 0;
}
