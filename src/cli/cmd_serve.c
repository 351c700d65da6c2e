/* cmd_serve.c - `mlxcel serve`: the OpenAI-compatible HTTP server
 * (src/server/).  Loads the engine, starts the server, waits for SIGINT or
 * SIGTERM, then stops gracefully. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "server/server.h"
#include "util/file.h"
#include "util/parallel.h"

static void help(FILE *f)
{
    fprintf(f, "usage: mlxcel serve -m DIR [options]\n\n"
           "OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions,\n"
           "GET /v1/models, GET /health, POST /tokenize, POST /detokenize, POST /apply-template,\n"
           "GET /props, GET /slots, GET /metrics, and a chat page at GET / (docs/server.md).\n"
           "Requests are decoded together (continuous batching); logs go to stderr.\n\n"
           "server:\n"
           "      --host ADDR         address to listen on (default 127.0.0.1; 0.0.0.0 exposes it)\n"
           "      --port N            port (default 8080; 0 picks a free one, printed at start)\n"
           "      --parallel N        requests decoded at once, one KV cache each (default 4)\n"
           "      --queue N           requests that may wait for a slot before 503 (default 16)\n"
           "      --n-predict N       max_tokens when a request gives none (default 256; same as -n)\n"
           "      --api-key KEY       require 'Authorization: Bearer KEY' (not for /health)\n"
           "      --alias NAME        model id in /v1/models and responses (default: folder name)\n"
           "      --timeout S         idle connection timeout in seconds (default 30)\n"
           "      --max-conns N       concurrent connections (default 64)\n"
           "      --max-body BYTES    largest request body (default 1048576; larger: 413)\n"
           "      --prefill-chunk N   prompt tokens prefilled per scheduler turn (default 256)\n"
           "      --batch MODE        decode steps of several requests: auto (time both, use the\n"
           "                          faster), on (always one batched forward), off (one per request)\n"
           "      --cors-origin ORIGIN  allow browsers from ORIGIN ('*' for any) to call the API\n"
           "                          (CORS headers and preflight; default: off)\n"
           "      --metrics           serve GET /metrics (Prometheus text format)\n"
           "      --no-webui          no chat page at GET / (404 there)\n"
           "      --chat-template-file FILE  use this Jinja chat template instead of the\n"
           "                          checkpoint's (e.g. one with tool support)\n"
           "      --quiet             no per-request log lines\n"
           "model and sampling defaults (a request's fields override them):\n");
    cli_common_help(f);
    fprintf(f, "\nThe context size (--ctx-size) is per slot: memory grows with --parallel.\n");
}

static int parse(int argc, char **argv, cli_opts *co, mx_server_opts *so, const char **tmpl_file)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        int r = cli_common_option(argc, argv, &i, co);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
#define VAL() do { if (!(v = arg_value(argc, argv, &i))) return 2; } while (0)
#define INT(lo, hi, dst) do { VAL(); if (arg_long(a, v, lo, hi, &n)) return 2; dst = (int)n; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return 1;
        } else if (!strcmp(a, "--host")) {
            VAL();
            so->host = v;
        } else if (!strcmp(a, "--port")) {
            INT(0, 65535, so->port);
        } else if (!strcmp(a, "--parallel") || !strcmp(a, "-np")) {
            INT(1, 256, so->parallel);
        } else if (!strcmp(a, "--queue")) {
            INT(0, 4096, so->queue);
        } else if (!strcmp(a, "--n-predict")) {
            INT(1, 1 << 24, co->max_tokens);
        } else if (!strcmp(a, "--api-key")) {
            VAL();
            so->api_key = *v ? v : NULL;
        } else if (!strcmp(a, "--alias")) {
            VAL();
            so->model_id = v;
        } else if (!strcmp(a, "--timeout")) {
            INT(1, 86400, so->timeout_s);
        } else if (!strcmp(a, "--max-conns")) {
            INT(1, 4096, so->max_conns);
        } else if (!strcmp(a, "--max-body")) {
            VAL();
            if (arg_long(a, v, 1024, 1L << 30, &n))
                return 2;
            so->max_body = (size_t)n;
        } else if (!strcmp(a, "--prefill-chunk")) {
            INT(1, 1 << 20, so->prefill_chunk);
        } else if (!strcmp(a, "--batch")) {
            VAL();
            if (!strcmp(v, "auto"))
                so->batch = 0;
            else if (!strcmp(v, "off"))
                so->batch = 1;
            else if (!strcmp(v, "on"))
                so->batch = 2;
            else {
                fprintf(stderr, "mlxcel serve: --batch takes auto, on or off\n");
                return 2;
            }
        } else if (!strcmp(a, "--cors-origin")) {
            VAL();
            so->cors_origin = *v ? v : NULL;
        } else if (!strcmp(a, "--metrics")) {
            so->metrics = 1;
        } else if (!strcmp(a, "--no-webui")) {
            so->webui = 0;
        } else if (!strcmp(a, "--chat-template-file")) {
            VAL();
            *tmpl_file = v;
        } else if (!strcmp(a, "--quiet")) {
            so->quiet = 1;
        } else {
            return arg_unknown("serve", a, help);
        }
#undef INT
#undef VAL
    }
    if (!co->model) {
        fprintf(stderr, "mlxcel serve: -m DIR is required (see --help)\n");
        return 2;
    }
    if (co->gen.n_stops)
        fprintf(stderr, "mlxcel serve: --stop is per request here (the 'stop' field); ignored\n");
    return 0;
}

/* Replaces the checkpoint's chat template with the one in FILE (its
 * bos/eos token strings stay the checkpoint's). */
static int use_template_file(mx_engine *g, const char *path, mx_err *e)
{
    char *text = NULL;
    size_t len = 0;
    mx_chat_template *t = NULL;
    int rc = mx_read_file(path, &text, &len, e);
    if (!rc && strlen(text) != len)
        rc = mx_fail(e, MX_EFORMAT, "%s: the template holds a NUL byte", path);
    if (!rc && (rc = mx_chat_template_from_string(text, mx_chat_template_bos(g->tmpl),
                                                  mx_chat_template_eos(g->tmpl), &t, e)))
        mx_err_prefix(e, "%s", path);
    if (!rc) {
        mx_chat_template_free(g->tmpl);
        g->tmpl = t;
    }
    free(text);
    return rc;
}

int cmd_serve(int argc, char **argv)
{
    cli_opts co;
    cli_opts_init(&co, 0.8f);
    mx_server_opts so;
    mx_server_opts_defaults(&so);
    const char *tmpl_file = NULL;
    int pr = parse(argc, argv, &co, &so, &tmpl_file);
    if (pr)
        return pr == 1 ? 0 : pr;

    /* Signals are taken by sigwait below: block them before any thread
     * (MHD, scheduler, OpenMP) exists so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    mx_err e = {0};
    mx_engine *g = NULL;
    if (mx_engine_load(co.model, MX_TOKENIZER_REQUIRED, &g, &e)) {
        fprintf(stderr, "mlxcel serve: %s\n", e.msg);
        return 1;
    }
    if (tmpl_file && use_template_file(g, tmpl_file, &e)) {
        fprintf(stderr, "mlxcel serve: --chat-template-file: %s\n", e.msg);
        mx_engine_free(g);
        return 1;
    }
    so.n_ctx = cli_ctx(&co, g->model);
    so.n_predict = co.max_tokens ? cli_max_tokens(&co, so.n_ctx) : 256;
    so.sample = co.gen.sample;
    cli_lookup_check(&co, g->model);
    so.lookup = co.gen.lookup;
    so.lookup_always = co.gen.lookup_always;
    mx_server *s = NULL;
    if (mx_server_start(g, &so, &s, &e)) {
        fprintf(stderr, "mlxcel serve: %s\n", e.msg);
        mx_engine_free(g);
        return 1;
    }
    fprintf(stderr, "serve: listening on http://%s:%d (model %s, %d slots x %d ctx, %d threads)\n",
            so.host, mx_server_port(s), mx_server_model_id(s), so.parallel, so.n_ctx,
            mx_threads());
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "serve: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    mx_server_stop(s);
    mx_engine_free(g);
    fprintf(stderr, "serve: stopped\n");
    return 0;
}
