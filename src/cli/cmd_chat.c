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

static void help(void)
{
    printf("usage: mlxcel chat -m DIR [--system TEXT] [options]\n\n"
           "Interactive chat through the checkpoint's chat template.  Type a message and press\n"
           "enter; /reset clears the conversation, /exit (or end of input) quits.  Works with\n"
           "stdin from a pipe: one message per line.\n\n"
           "      --system TEXT       system message\n");
    cli_common_help();
    printf("\nDefaults: --temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05; --temp 0 is greedy.\n");
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

int cmd_chat(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o, 0.8f);
    const char *system = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_common_option(argc, argv, &i, &o);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            help();
            return 0;
        } else if (!strcmp(argv[i], "--system")) {
            if (!(system = arg_value(argc, argv, &i)))
                return 2;
        } else {
            fprintf(stderr, "mlxcel chat: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (!o.model) {
        fprintf(stderr, "mlxcel chat: -m DIR is required (see --help)\n");
        return 2;
    }
    mx_err e = {0};
    mx_engine *g = NULL;
    mx_session *s = NULL;
    if (mx_engine_load(o.model, MX_TOKENIZER_REQUIRED, &g, &e) ||
        mx_session_new(g, cli_ctx(&o, g->model), &s, &e)) {
        fprintf(stderr, "mlxcel chat: %s\n", e.msg);
        mx_engine_free(g);
        return 1;
    }
    o.gen.max_tokens = o.max_tokens;
    const int tty = isatty(STDIN_FILENO);
    if (tty)
        fprintf(stderr, "mlxcel chat: %s — /reset to start over, /exit to quit\n", o.model);
    convo c = {0};
    size_t base = 0;
    if (system) {
        convo_add(&c, "system", strdup(system));
        base = 1;
    }
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    for (;;) {
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
            convo_clear(&c, base);
            mx_session_reset(s);
            if (tty)
                fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        if (!n)
            continue;
        if (convo_add(&c, "user", strdup(line))) {
            rc = mx_fail(&e, MX_ENOMEM, "out of memory");
            break;
        }
        int32_t *ids = NULL;
        int nid = 0;
        reply r = {0};
        mx_gen_stats st;
        rc = mx_engine_encode_chat(g, c.m, c.n, &ids, &nid, NULL, &e);
        if (!rc)
            rc = mx_generate(g, s, ids, nid, &o.gen, on_token, &r, &st, &e);
        free(ids);
        printf("\n");
        fflush(stdout);
        if (rc) {
            /* a turn that cannot run (e.g. context full) is reported and
             * dropped; the conversation goes on */
            fprintf(stderr, "mlxcel chat: %s\n", e.msg);
            free(c.owned[--c.n]);
            free(r.text);
            rc = 0;
            continue;
        }
        if (o.stats)
            fprintf(stderr, "[%d prompt tokens (%d cached), %d generated, %.1f tok/s, %s]\n", st.n_prompt,
                    st.n_cached, st.n_gen, st.t_decode > 0 ? (st.n_gen - 1) / st.t_decode : 0.0, st.finish);
        convo_add(&c, "assistant", r.text ? r.text : strdup(""));
    }
    free(line);
    convo_clear(&c, 0);
    free(c.m);
    free(c.owned);
    mx_session_free(s);
    mx_engine_free(g);
    if (rc)
        fprintf(stderr, "mlxcel chat: %s\n", e.msg);
    return rc ? 1 : 0;
}
