/* cmd_generate.c - `mlxcel generate`: one prompt in, generated text (or ids)
 * streamed to stdout; logs and statistics on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "grammar/grammar.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "moe/moe.h"
#include "util/parallel.h"
#include "util/file.h"
#include "util/sysinfo.h"

static void help(FILE *f)
{
    fprintf(f, "usage: mlxcel generate -m DIR (-p TEXT | -f FILE | --chat TEXT | --prompt-ids IDS) [options]\n\n"
               "Generates a continuation and streams it to stdout (statistics go to stderr).\n\n"
               "prompt:\n"
               "  -p, --prompt TEXT       raw prompt text (special tokens in it are recognised);\n"
               "                          -p - reads it from stdin\n"
               "  -f, --file FILE         raw prompt text from FILE (one trailing newline dropped)\n"
               "      --chat TEXT         TEXT as one user message through the chat template;\n"
               "                          --chat - reads it from stdin\n"
               "      --system TEXT       system message for --chat (a raw prompt has no template:\n"
               "                          with -p or -f it is an error)\n"
               "      --no-chat-template  with --chat: use TEXT as the raw prompt\n"
               "      --prompt-ids IDS    token ids, comma or space separated\n"
               "output:\n"
               "      --ids-only          print generated ids (space separated, one line) instead of text\n"
               "      --keep-special      print special tokens in the text\n"
               "      --dump-logits FILE  write the logits after the last prompt token (raw f32 LE)\n"
           "constrained output:\n"
           "      --grammar-file FILE the output follows this GBNF grammar (docs/server.md)\n"
           "      --json-schema S     the output is JSON valid against schema S (JSON text, or @FILE)\n");
    cli_common_help(f);
    fprintf(f, "\nDefaults: --temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05; --temp 0 is greedy.\n");
}

typedef struct out_state {
    int ids_only, n;
} out_state;

static int on_token(void *ud, int32_t id, const char *text, size_t len)
{
    out_state *o = ud;
    if (o->ids_only) {
        if (id >= 0)
            printf(o->n++ ? " %d" : "%d", id);
    } else if (len) {
        fwrite(text, 1, len, stdout);
    }
    fflush(stdout);
    return 0;
}

static void print_stats(const mx_gen_stats *st, int lookup)
{
    mx_moe_stats ms;
    mx_moe_stats_get(&ms);
    int fed = st->n_prompt - st->n_cached;
    fprintf(stderr, "prompt tokens: %d (%d cached)\n", st->n_prompt, st->n_cached);
    fprintf(stderr, "prefill: %.1f tok/s (%.3f s)\n", st->t_prefill > 0 ? fed / st->t_prefill : 0.0,
            st->t_prefill);
    int dec = st->n_gen > 1 ? st->n_gen - 1 : 0;
    fprintf(stderr, "decode: %.1f tok/s (%d tokens, %.3f s)\n",
            st->t_decode > 0 && dec ? dec / st->t_decode : 0.0, st->n_gen, st->t_decode);
    fprintf(stderr, "time to first token: %.3f s\n", st->t_first);
    fprintf(stderr, "finish: %s\n", st->finish);
    if (lookup)
        fprintf(stderr, "lookup: %d drafted, %d accepted (%.0f %%), %d verify calls\n", st->n_drafted,
                st->n_accepted, st->n_drafted ? 100.0 * st->n_accepted / st->n_drafted : 0.0,
                st->n_verify);
    fprintf(stderr, "peak RSS: %.1f MiB\n", (double)mx_peak_rss_bytes() / 1048576.0);
    fprintf(stderr, "threads: %d, kernel: %s\n", mx_threads(), mx_qkernels_active()->name);
    fprintf(stderr, "moe-dispatch fused=%ld gather=%ld\n", ms.fused, ms.gather);
}

static int grammar_token_bytes(void *ud, int32_t id, char *buf, size_t cap)
{
    const mx_tokenizer *t = ud;
    if (id >= mx_tok_vocab_size(t) || mx_tok_is_special(t, id))
        return -1;
    return mx_tok_token_bytes(t, id, buf, cap);
}

/* --grammar-file FILE or --json-schema (JSON text or @FILE): the grammar
 * and the vocabulary's byte strings it masks. */
static int load_grammar(const mx_engine *g, const char *file, const char *schema, mx_grammar **gram,
                        mx_grammar_vocab **voc, mx_err *e)
{
    if (file && schema)
        return mx_fail(e, MX_EINVAL, "give --grammar-file or --json-schema, not both");
    char *text = NULL, *gbnf = NULL;
    size_t len = 0;
    int rc = MX_OK;
    if (file || schema[0] == '@')
        rc = mx_read_file(file ? file : schema + 1, &text, &len, e);
    if (!rc && schema) {
        cJSON *j = cJSON_Parse(text ? text : schema);
        rc = j ? mx_grammar_from_schema(j, &gbnf, e)
               : mx_fail(e, MX_EINVAL, "--json-schema: not valid JSON");
        cJSON_Delete(j);
    }
    if (!rc)
        rc = gbnf ? mx_grammar_parse(gbnf, strlen(gbnf), gram, e) : mx_grammar_parse(text, len, gram, e);
    if (!rc)
        rc = mx_grammar_vocab_new(g->model->vocab, grammar_token_bytes, g->tok, g->eos, g->n_eos, voc, e);
    free(text);
    free(gbnf);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    cli_opts o;
    cli_opts_init(&o, 0.8f);
    const char *prompt = NULL, *chat = NULL, *system = NULL, *ids_arg = NULL, *file = NULL;
    const char *grammar_file = NULL, *json_schema = NULL;
    int no_template = 0, ids_only = 0;
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
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--chat")) {
            if (!(chat = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--system")) {
            if (!(system = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--prompt-ids")) {
            if (!(ids_arg = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--no-chat-template")) {
            no_template = 1;
        } else if (!strcmp(a, "--ids-only")) {
            ids_only = 1;
        } else if (!strcmp(a, "--keep-special")) {
            o.gen.keep_special = 1;
        } else if (!strcmp(a, "--dump-logits")) {
            if (!(o.gen.dump_logits = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--grammar-file")) {
            if (!(grammar_file = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--json-schema")) {
            if (!(json_schema = arg_value(argc, argv, &i)))
                return 2;
        } else {
            return arg_unknown("generate", a, help);
        }
    }
    if (!o.model) {
        fprintf(stderr, "mlxcel generate: -m DIR is required (see --help)\n");
        return 2;
    }
    if (!!prompt + !!file + !!chat + !!ids_arg != 1) {
        fprintf(stderr, "mlxcel generate: give exactly one of -p, -f, --chat, --prompt-ids\n");
        return 2;
    }
    if (system && !chat) {
        fprintf(stderr, "mlxcel generate: --system needs --chat (a raw -p/-f/--prompt-ids prompt does not "
                        "go through the chat template)\n");
        return 2;
    }
    /* -f FILE, -p - and --chat - : the text from a file or stdin */
    char *read_text = NULL;
    if (file || (prompt && !strcmp(prompt, "-")) || (chat && !strcmp(chat, "-"))) {
        const char *opt = file ? "-f" : prompt ? "-p" : "--chat";
        if (!(read_text = arg_read_text(opt, file ? file : "-")))
            return 2;
        if (chat)
            chat = read_text;
        else
            prompt = read_text;
    }

    int32_t *ids = NULL;
    int n = 0, rc = 0;
    if (ids_arg && arg_ids("--prompt-ids", ids_arg, &ids, &n))
        return 2;

    mx_err e = {0};
    mx_engine *g = NULL;
    int need_tok = ids_arg && ids_only ? MX_TOKENIZER_OPTIONAL : MX_TOKENIZER_REQUIRED;
    if (mx_engine_load(o.model, need_tok, &g, &e)) {
        fprintf(stderr, "mlxcel generate: %s\n", e.msg);
        free(ids);
        free(read_text);
        return 1;
    }
    cli_lookup_check(&o, g->model);
    if (ids_arg) {
        /* parsed above */
    } else if (prompt || no_template) {
        rc = mx_engine_encode(g, prompt ? prompt : chat, &ids, &n, &e);
    } else {
        mx_chat_msg msgs[2];
        size_t nm = 0;
        if (system)
            msgs[nm++] = (mx_chat_msg){"system", system};
        msgs[nm++] = (mx_chat_msg){"user", chat};
        rc = mx_engine_encode_chat(g, msgs, nm, &ids, &n, NULL, &e);
    }
    if (rc == 0 && n == 0)
        rc = mx_fail(&e, MX_EINVAL, "the prompt is empty (it encodes to no tokens)");
    mx_grammar *gram = NULL;
    mx_grammar_vocab *gvoc = NULL;
    if (!rc && (grammar_file || json_schema)) {
        rc = load_grammar(g, grammar_file, json_schema, &gram, &gvoc, &e);
        o.gen.grammar = gram;
        o.gen.grammar_vocab = gvoc;
    }

    mx_session *s = NULL;
    mx_gen_stats st = {0};
    const int n_ctx = cli_ctx(&o, g->model);
    if (!rc)
        rc = mx_session_new(g, n_ctx, &s, &e);
    if (!rc) {
        o.gen.max_tokens = cli_max_tokens(&o, n_ctx);
        out_state os = {.ids_only = ids_only};
        mx_moe_stats_reset();
        rc = mx_generate(g, s, ids, n, &o.gen, on_token, &os, &st, &e);
        /* ids end with a newline; text gets one only on a terminal, so a
         * script reading stdout sees exactly the generated text */
        if (ids_only || (!rc && isatty(STDOUT_FILENO)))
            putchar('\n');
        fflush(stdout);
    }
    if (rc)
        fprintf(stderr, "mlxcel generate: %s\n", e.msg);
    if (!rc && o.stats) {
        print_stats(&st, o.gen.lookup);
        cli_wcache_stats(g->model);
    } else if (!rc && mx_env_flag("MLXCEL_TRACE_MOE", 0)) {
        mx_moe_stats ms;
        mx_moe_stats_get(&ms);
        fprintf(stderr, "moe-dispatch fused=%ld gather=%ld\n", ms.fused, ms.gather);
    }
    free(ids);
    free(read_text);
    mx_grammar_free(gram);
    mx_grammar_vocab_free(gvoc);
    mx_session_free(s);
    mx_engine_free(g);
    return rc ? 1 : 0;
}
