/* test_lookup.c - prompt lookup (speculative decoding, gen.h).
 *
 * - mx_lookup_draft on hand-made contexts: the longest suffix n-gram wins,
 *   the most recent among equals, a draft reaching the end of the context
 *   goes on from itself, no earlier occurrence drafts nothing.
 * - mx_lookup_choose on hand-set costs and rates (the expected tokens per
 *   second worked out by hand), the first draft of one token, the probe.
 * - The guarantee it rests on: a forward call of up to MX_BATCH_SMALL
 *   tokens gives every token the same logits, bit for bit, as one-token
 *   steps (the demo model and every attention-only fixture).
 * - mx_gen_req_verify with drafts made from the plain greedy output: fully
 *   accepted (and the token after), fully rejected, accepted in part, a
 *   draft that runs past max_tokens and one that reaches the end of the
 *   context; the text afterwards equals plain decoding (the cache kept
 *   only what was accepted).
 * - Whole generations with --lookup equal those without, token for token:
 *   greedy, sampled with a seed and a repetition penalty, a stop string,
 *   the context's end, drafting at every match and by the cost model; on
 *   recurrent models lookup stays off and verifying a draft is an error.
 *
 * The demo model (models/kjv-moe, in the tree) needs no fixtures; the
 * fixture models run when MLXCEL_FIXTURES is set. */
#include "test.h"

#include <dirent.h>
#include <stdint.h>

#include "gen/gen.h"

/* ---- drafting ------------------------------------------------------------------ */

static void test_draft(void)
{
    int32_t d[8];
    int match = -1;
    /* suffix "1 2 3" occurred at the start: what followed it, then the
     * draft continues itself (9 1 2 3 | 9 1 ...) */
    const int32_t a[] = {1, 2, 3, 9, 1, 2, 3};
    CHECK(mx_lookup_draft(a, 7, 4, 6, d, &match) == 6);
    CHECK(match == 3);
    const int32_t want_a[] = {9, 1, 2, 3, 9, 1};
    CHECK(!memcmp(d, want_a, sizeof want_a));
    /* the longest match wins over a more recent shorter one: "5 7 8" at the
     * start (then 1) against "8" alone at index 4 (then 6) */
    const int32_t b[] = {5, 7, 8, 1, 8, 6, 5, 7, 8};
    CHECK(mx_lookup_draft(b, 9, 4, 2, d, &match) == 2);
    CHECK(match == 3 && d[0] == 1 && d[1] == 8);
    /* max_ngram caps the length compared: then the most recent of equals */
    CHECK(mx_lookup_draft(b, 9, 1, 1, d, &match) == 1);
    CHECK(match == 1 && d[0] == 6);
    /* among equal lengths the most recent: "4 2" then 10 (early) or 11 (late) */
    const int32_t c[] = {4, 2, 10, 4, 2, 11, 4, 2};
    CHECK(mx_lookup_draft(c, 8, 4, 1, d, &match) == 1);
    CHECK(match == 2 && d[0] == 11);
    /* a token repeated: the cycle of one */
    const int32_t e[] = {3, 3};
    CHECK(mx_lookup_draft(e, 2, 4, 5, d, &match) == 5);
    CHECK(match == 1 && d[0] == 3 && d[4] == 3);
    /* the last token never occurred before; too short a context */
    const int32_t f[] = {1, 2, 3, 4};
    CHECK(mx_lookup_draft(f, 4, 4, 5, d, &match) == 0 && match == 0);
    CHECK(mx_lookup_draft(f, 1, 4, 5, d, &match) == 0);
    CHECK(mx_lookup_draft(e, 2, 4, 0, d, &match) == 0);
}

/* ---- the cost model --------------------------------------------------------------- */

static void test_choose(void)
{
    mx_lookup lk;
    /* always: what is available, capped by max_draft */
    mx_lookup_init(&lk, 5, 1);
    CHECK(mx_lookup_choose(&lk, 1, 9) == 5);
    CHECK(mx_lookup_choose(&lk, 1, 3) == 3);

    mx_lookup_init(&lk, 15, 0);
    CHECK(mx_lookup_choose(&lk, 2, 15) == 0);     /* no one-token step timed yet */
    mx_lookup_record(&lk, 1, 1.0, 0, 0, 0);
    CHECK(mx_lookup_choose(&lk, 2, 15) == 1);     /* nothing beyond one token timed: measure two */

    /* a call of two tokens as dear as one: sizes 3 and 4 are guessed as
     * dear as two, 5 is too far.  Rates with nothing recorded: 1/2 each,
     * so 1.5, 1.75, 1.875 tokens per second for k = 1, 2, 3 against 1 for
     * a plain step: k = 3 */
    mx_lookup_record(&lk, 2, 1.0, 2, 0, 0);
    CHECK(mx_lookup_choose(&lk, 2, 15) == 1);     /* timed once: once more */
    mx_lookup_record(&lk, 2, 1.0, 2, 0, 0);
    CHECK(mx_lookup_choose(&lk, 2, 15) == 3);

    /* calls that cost what they hold (T tokens: T seconds): a draft never
     * beats a plain step (1 + p + ... + p^k <= k + 1); the 64th match
     * passed over drafts one token, then the 128th ... up to every 1024th */
    mx_lookup_init(&lk, 15, 0);
    for (int T = 1; T <= MX_LOOKUP_MAX + 1; T++)
        for (int i = 0; i < 2; i++)
            mx_lookup_record(&lk, T, (double)T, 0, 0, 0);
    for (int probe = 64; probe <= 2048; probe *= 2) {
        int zeros = 0;
        while (zeros < 5000 && mx_lookup_choose(&lk, 3, 15) == 0)
            zeros++;
        const int want = (probe < 1024 ? probe : 1024) - 1;
        CHECKF(zeros == want, "%d matches passed over before a probe (want %d)", zeros, want);
    }

    /* cheap calls (1 + 0.1 (T-1) seconds): 4-gram matches that were always
     * accepted draft all 15; unigram matches always rejected at once draft
     * nothing (p0 = 1/(n+2) -> rate (1 + p0 ...) / 1.1 < 1) */
    mx_lookup_init(&lk, 15, 0);
    for (int T = 1; T <= MX_LOOKUP_MAX + 1; T++)
        for (int i = 0; i < 2; i++)
            mx_lookup_record(&lk, T, 1 + 0.1 * (T - 1), 0, 0, 0);

    for (int i = 0; i < 30; i++) {
        mx_lookup_record(&lk, 16, 0, 4, 15, 15);   /* (no time: the costs stay) */
        mx_lookup_record(&lk, 2, 0, 1, 1, 0);
    }
    CHECK(mx_lookup_choose(&lk, 4, 15) == 15);
    CHECK(mx_lookup_choose(&lk, 4, 7) == 7);
    CHECK(mx_lookup_choose(&lk, 1, 15) == 0);

    /* two tokens 2 s, one 1 s: a draft of one never pays (1 + p < 2); three
     * and four tokens are guessed at 2 s, so a draft of three pays when
     * 1 + p0 + p0 p1 + p0 p1 p2 > 2: with every draft token accepted so far
     * it is tried; timed at 8 s it is not tried again, and five to eight
     * stay unguessed (-1): nothing is drafted */
    mx_lookup_init(&lk, 15, 0);
    mx_lookup_record(&lk, 1, 1.0, 0, 0, 0);
    for (int i = 0; i < 2; i++)
        mx_lookup_record(&lk, 2, 2.0, 0, 0, 0);
    for (int i = 0; i < 20; i++)
        mx_lookup_record(&lk, 0, 0, 4, 3, 3);
    CHECK(mx_lookup_choose(&lk, 4, 15) == 3);
    mx_lookup_record(&lk, 4, 8.0, 4, 3, 3);
    CHECK(mx_lookup_choose(&lk, 4, 15) == 0);

    /* times: the mean of the first five calls of a size (1.1 and 1.3 give
     * 1.2), then a moving average (a slow sixth call, 2.2, moves it a fifth
     * of the way: 1.4) */
    mx_lookup_init(&lk, 15, 0);
    mx_lookup_record(&lk, 2, 1.1, 0, 0, 0);
    mx_lookup_record(&lk, 2, 1.3, 0, 0, 0);
    CHECK(fabs(lk.t_fwd[2] - 1.2) < 1e-12);
    for (int i = 0; i < 3; i++)
        mx_lookup_record(&lk, 2, 1.2, 0, 0, 0);
    mx_lookup_record(&lk, 2, 2.2, 0, 0, 0);
    CHECK(fabs(lk.t_fwd[2] - 1.4) < 1e-12);
}

/* ---- models --------------------------------------------------------------------- */

typedef struct ids_out {
    int32_t ids[1024];
    int n;
} ids_out;

static int collect(void *ud, int32_t id, const char *text, size_t len)
{
    (void)text, (void)len;
    ids_out *o = ud;
    if (id >= 0 && o->n < (int)(sizeof o->ids / sizeof o->ids[0]))
        o->ids[o->n++] = id;
    return 0;
}

/* A generation in a fresh session of n_ctx tokens. */
static int run(mx_engine *g, int n_ctx, const int32_t *prompt, int np, const mx_gen_opts *o,
               ids_out *out, mx_gen_stats *st)
{
    mx_err e = {0};
    mx_session *s = NULL;
    out->n = 0;
    int rc = mx_session_new(g, n_ctx, &s, &e);
    if (!rc)
        rc = mx_generate(g, s, prompt, np, o, collect, out, st, &e);
    if (rc)
        fprintf(stderr, "  generate: %s\n", e.msg);
    mx_session_free(s);
    return rc;
}

/* The logits of 16 tokens fed at once equal those of 16 one-token steps,
 * bit for bit: what makes lookup's output exactly plain decoding's. */
static void check_same_bits(const char *name, mx_model *m)
{
    enum { P = 12, T = MX_BATCH_SMALL };
    mx_err e = {0};
    mx_seq *a = NULL, *b = NULL;
    const size_t V = (size_t)m->vocab;
    float *la = malloc(sizeof(float) * V * T), *lb = malloc(sizeof(float) * V * T);
    int32_t toks[P + T];
    for (int i = 0; i < P + T; i++)
        toks[i] = (int32_t)((i * 7919u + 13u) % (unsigned)m->vocab);
    CHECK_OK(mx_seq_new(m, 64, &a, &e), &e);
    CHECK_OK(mx_seq_new(m, 64, &b, &e), &e);
    if (!a || !b || !la || !lb)
        goto out;
    CHECK_OK(mx_forward(m, a, toks, P, NULL, NULL, &e), &e);
    CHECK_OK(mx_forward(m, b, toks, P, NULL, NULL, &e), &e);
    for (int t = 0; t < T; t++)
        CHECK_OK(mx_forward(m, a, toks + P + t, 1, la + t * V, NULL, &e), &e);
    mx_forward_trace tr = {.all_logits = lb};
    CHECK_OK(mx_forward(m, b, toks + P, T, NULL, &tr, &e), &e);
    int differ = 0;
    for (size_t i = 0; i < V * T; i++)
        differ += memcmp(&la[i], &lb[i], sizeof(float)) != 0;
    CHECKF(differ == 0, "%s: %d of %zu logits of a %d-token call differ from one-token steps", name,
           differ, V * T, (int)T);
out:
    free(la);
    free(lb);
    mx_seq_free(a);
    mx_seq_free(b);
}

static int same_ids(const ids_out *a, const ids_out *b)
{
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof a->ids[0] * (size_t)a->n);
}

/* Plain decoding against lookup in several settings, token for token. */
static void check_generations(const char *name, mx_engine *g, const int32_t *prompt, int np,
                              int *drafted_total, int *accepted_total)
{
    const int recurrent = mx_model_state_floats(g->model) > 0;
    /* shorter under the sanitizers (an unoptimised build, ten models) */
    const int n = getenv("MLXCEL_SANITIZED") ? 20 : 48;
    struct {
        const char *what;
        float temp, rep_pen;
        int lookup, always, n_ctx, max_tokens;
    } cases[] = {
        {"greedy, lookup 15 at every match", 0, 1, 15, 1, 512, n},
        {"greedy, lookup 3 at every match", 0, 1, 3, 1, 512, n},
        {"greedy, lookup 8 by the cost model", 0, 1, 8, 0, 512, n},
        {"sampled (seed, repetition penalty 1.3), lookup 6", 0.9f, 1.3f, 6, 1, 512, n},
        {"greedy to the end of the context, lookup 15", 0, 1, 15, 1, np + n / 2 + 6, 1000},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mx_gen_opts o = {0};
        mx_sample_defaults(&o.sample);
        o.sample.temperature = cases[c].temp;
        o.sample.repeat_penalty = cases[c].rep_pen;
        o.sample.seed = 5;
        o.ignore_eos = 1;
        o.max_tokens = cases[c].max_tokens;
        ids_out plain, look;
        mx_gen_stats sp, sl;
        if (run(g, cases[c].n_ctx, prompt, np, &o, &plain, &sp)) {
            CHECKF(0, "%s: plain generation failed", name);
            continue;
        }
        o.lookup = cases[c].lookup;
        o.lookup_always = cases[c].always;
        if (run(g, cases[c].n_ctx, prompt, np, &o, &look, &sl)) {
            CHECKF(0, "%s: %s: generation failed", name, cases[c].what);
            continue;
        }
        CHECKF(same_ids(&plain, &look) && !strcmp(sp.finish, sl.finish),
               "%s: %s: %d tokens (%s) with lookup, %d (%s) without, or other ids", name,
               cases[c].what, look.n, sl.finish, plain.n, sp.finish);
        CHECK(sl.n_accepted <= sl.n_drafted);
        if (recurrent)
            CHECKF(sl.n_drafted == 0, "%s: lookup drafted on a recurrent model", name);
        if (cases[c].max_tokens > cases[c].n_ctx)
            CHECKF(!strcmp(sl.finish, "length") && np + look.n == cases[c].n_ctx,
                   "%s: to the context's end: finish %s after %d tokens", name, sl.finish, look.n);
        *drafted_total += sl.n_drafted;
        *accepted_total += sl.n_accepted;
    }
}

/* A prompt that repeats itself: 12 ids three times, then the first 5. */
static int repeating_prompt(const mx_model *m, int32_t *p)
{
    unsigned long long s = 99;
    int n = 0;
    int32_t base[12];
    for (int i = 0; i < 12; i++)
        base[i] = (int32_t)(test_rand_u64(&s) % (unsigned long long)(m->vocab < 500 ? m->vocab : 500));
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 12; i++)
            p[n++] = base[i];
    for (int i = 0; i < 5; i++)
        p[n++] = base[i];
    return n;
}

static void test_fixture(const char *dir, const char *name, int *drafted, int *accepted)
{
    mx_err e = {0};
    mx_engine *g = NULL;
    if (mx_engine_load(dir, MX_TOKENIZER_NONE, &g, &e)) {
        CHECKF(0, "%s: %s", name, e.msg);
        return;
    }
    int32_t prompt[64];
    int np = repeating_prompt(g->model, prompt);
    if (mx_model_state_floats(g->model) == 0) {
        check_same_bits(name, g->model);
    } else {
        /* a draft cannot be verified where the state cannot drop tokens */
        mx_session *s = NULL;
        mx_gen_req *r = NULL;
        mx_gen_opts o = {.max_tokens = 8};
        int32_t next = 0, out = 0, draft[2] = {1, 2};
        CHECK_OK(mx_session_new(g, 128, &s, &e), &e);
        CHECK_OK(mx_gen_req_new(g, s, prompt, np, &o, NULL, NULL, &r, &e), &e);
        CHECK_OK(mx_gen_req_prefill(r, &e), &e);
        CHECK(mx_gen_req_step(r, &next, &e) == 0);
        CHECK(mx_gen_req_verify(r, next, draft, 2, &out, &e) < 0);
        fprintf(stderr, "  expected error: %s\n", e.msg);
        mx_gen_req_free(r);
        mx_session_free(s);
    }
    check_generations(name, g, prompt, np, drafted, accepted);
    mx_engine_free(g);
}

/* ---- verification with chosen drafts on the demo model ---------------------------- */

typedef struct verify_ctx {
    mx_engine *g;
    int32_t prompt[256];
    int np;
    ids_out ref;                 /* plain greedy ids from the prompt */
} verify_ctx;

/* A request on a fresh session (n_ctx) that has sampled its first token. */
static mx_gen_req *start(verify_ctx *v, int n_ctx, int max_tokens, ids_out *out, mx_session **s,
                         int32_t *next)
{
    mx_err e = {0};
    mx_gen_req *r = NULL;
    mx_gen_opts o = {.max_tokens = max_tokens, .ignore_eos = 1};
    mx_sample_defaults(&o.sample);
    o.sample.temperature = 0;
    out->n = 0;
    if (mx_session_new(v->g, n_ctx, s, &e) ||
        mx_gen_req_new(v->g, *s, v->prompt, v->np, &o, collect, out, &r, &e) ||
        mx_gen_req_prefill(r, &e) || mx_gen_req_step(r, next, &e) != 0) {
        CHECKF(0, "starting a request: %s", e.msg);
        mx_gen_req_free(r);
        return NULL;
    }
    return r;
}

static void test_verify(verify_ctx *v)
{
    mx_err e = {0};
    const int32_t *R = v->ref.ids;
    const int V = v->g->model->vocab, P = v->np;
    ids_out out;
    mx_session *s = NULL;
    int32_t next, d[MX_LOOKUP_MAX + 1];

    /* fully accepted, fully rejected, accepted in part, then plain steps:
     * the whole output is the reference */
    mx_gen_req *r = start(v, 512, v->ref.n, &out, &s, &next);
    if (r) {
        CHECK(next == R[0]);
        CHECK(mx_gen_req_verify(r, next, R + 1, 5, &next, &e) == 0);
        CHECKF(next == R[6] && s->seq->pos == P + 6 && mx_gen_req_stats(r)->n_accepted == 5,
               "fully accepted: next %d (want %d), pos %d (want %d)", next, R[6], s->seq->pos, P + 6);
        for (int i = 0; i < 4; i++)
            d[i] = (R[7 + i] + 1) % V;
        CHECK(mx_gen_req_verify(r, next, d, 4, &next, &e) == 0);
        CHECKF(next == R[7] && s->seq->pos == P + 7 && mx_gen_req_stats(r)->n_accepted == 5,
               "fully rejected: next %d (want %d), pos %d (want %d)", next, R[7], s->seq->pos, P + 7);
        d[0] = R[8];
        d[1] = R[9];
        d[2] = (R[10] + 1) % V;
        d[3] = R[11];
        CHECK(mx_gen_req_verify(r, next, d, 4, &next, &e) == 0);
        CHECKF(next == R[10] && s->seq->pos == P + 10 && mx_gen_req_stats(r)->n_accepted == 7,
               "accepted in part: next %d (want %d), pos %d (want %d)", next, R[10], s->seq->pos, P + 10);
        int k = 0;
        while (k == 0)
            k = mx_gen_req_decode(r, next, &next, &e);
        CHECK(k == 1);
        CHECKF(same_ids(&out, &v->ref), "after the drafts: %d tokens, not the reference's %d", out.n,
               v->ref.n);
        CHECK(mx_gen_req_stats(r)->n_drafted == 13 && mx_gen_req_stats(r)->n_verify == 3);
        /* a draft longer than one call may hold */
        CHECK(mx_gen_req_verify(r, R[0], R, MX_LOOKUP_MAX + 1, &next, &e) < 0);
        mx_gen_req_free(r);
    }
    mx_session_free(s);
    s = NULL;

    /* max_tokens ends the generation inside a draft: 8 tokens, the cache
     * holds the 7 fed (the last token is never fed), as without lookup */
    r = start(v, 512, 8, &out, &s, &next);
    if (r) {
        CHECK(mx_gen_req_verify(r, next, R + 1, 10, &next, &e) == 1);
        CHECKF(out.n == 8 && !memcmp(out.ids, R, sizeof *R * 8) && s->seq->pos == P + 7 &&
                   !strcmp(mx_gen_req_stats(r)->finish, "length"),
               "max_tokens inside a draft: %d tokens, pos %d (want 8, %d)", out.n, s->seq->pos, P + 7);
        mx_gen_req_free(r);
    }
    mx_session_free(s);
    s = NULL;

    /* the end of the context: a context of P + 12 holds the prompt and 11
     * fed tokens, so 12 are generated; a draft of 10 reaches it exactly and
     * the token after the draft is the last; 12 drafted do not fit */
    for (int k = 10; k <= 12; k++) {
        r = start(v, P + 12, 1000, &out, &s, &next);
        if (!r)
            break;
        int res = mx_gen_req_verify(r, next, R + 1, k, &next, &e);
        if (k < 12) {
            CHECKF(res == 1 && out.n == 12 && !memcmp(out.ids, R, sizeof *R * 12) &&
                       s->seq->pos == P + 11 && !strcmp(mx_gen_req_stats(r)->finish, "length"),
                   "a draft of %d to the context's end: %d, %d tokens, pos %d", k, res, out.n,
                   s->seq->pos);
        } else {
            CHECKF(res < 0 && s->seq->pos == P, "a draft past the context's end: %d, pos %d", res,
                   s->seq->pos);
            fprintf(stderr, "  expected error: %s\n", e.msg);
        }
        mx_gen_req_free(r);
        mx_session_free(s);
        s = NULL;
    }
}

/* mx_decode_greedy: the same ids as a greedy generation (ref, after the
 * prompt), the position advanced by the steps, and its argument errors
 * leaving the sequence where it was. */
static void test_decode_greedy(mx_model *m, const int32_t *prompt, int np, const ids_out *ref)
{
    mx_err e = {0};
    mx_seq *s = NULL;
    int32_t ids[64];
    const int n = ref->n < 64 ? ref->n : 64;
    CHECK_OK(mx_seq_new(m, np + n + 2, &s, &e), &e);
    if (!s)
        return;
    CHECK_OK(mx_forward(m, s, prompt, np - 1, NULL, NULL, &e), &e);
    CHECK_OK(mx_decode_greedy(m, s, prompt[np - 1], n, ids, &e), &e);
    CHECKF(s->pos == np - 1 + n, "decode_greedy: position %d after %d steps from %d", s->pos, n, np - 1);
    int same = 0;
    while (same < n && ids[same] == ref->ids[same])
        same++;
    CHECKF(same == n, "decode_greedy: id %d of %d differs from the greedy generation's", same, n);
    const int pos = s->pos;
    CHECK(mx_decode_greedy(m, s, 1, 0, ids, &e) == MX_EINVAL);
    CHECK(mx_decode_greedy(m, s, -1, 1, ids, &e) == MX_ERANGE);
    CHECK(mx_decode_greedy(m, s, m->vocab, 1, ids, &e) == MX_ERANGE);
    CHECK(mx_decode_greedy(m, s, 1, 4, ids, &e) == MX_ERANGE);   /* room for 3 */
    CHECKF(s->pos == pos, "decode_greedy: a refused call moved the position %d -> %d", pos, s->pos);
    mx_seq_free(s);
}

static void test_demo_model(int *drafted, int *accepted)
{
    const char *src = getenv("MLXCEL_SRC");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/kjv-moe", src && *src ? src : ".");
    mx_err e = {0};
    verify_ctx v = {0};
    if (mx_engine_load(dir, MX_TOKENIZER_REQUIRED, &v.g, &e)) {
        CHECKF(0, "the demo model: %s", e.msg);
        return;
    }
    check_same_bits("kjv-moe", v.g->model);
    /* a passage and its first half again */
    const char *text = "And God said, Let there be light: and there was light. And God saw the light, "
                       "that it was good: and God divided the light from the darkness.\n"
                       "And God said, Let there be light: and there was";
    int32_t *ids = NULL;
    int n = 0;
    CHECK_OK(mx_engine_encode(v.g, text, &ids, &n, &e), &e);
    if (ids && n < (int)(sizeof v.prompt / sizeof v.prompt[0])) {
        memcpy(v.prompt, ids, sizeof *ids * (size_t)n);
        v.np = n;
        check_generations("kjv-moe", v.g, v.prompt, v.np, drafted, accepted);
        mx_gen_opts o = {.max_tokens = 40, .ignore_eos = 1};
        mx_sample_defaults(&o.sample);
        o.sample.temperature = 0;
        if (!run(v.g, 512, v.prompt, v.np, &o, &v.ref, NULL) && v.ref.n == 40) {
            test_verify(&v);
            test_decode_greedy(v.g->model, v.prompt, v.np, &v.ref);
        }
        else
            CHECKF(0, "the demo model's reference generation");
        /* a stop string inside a draft: the same text */
        ids_out a, b;
        mx_gen_stats sa, sb;
        const char *stops[] = {"darkness"};
        o.stops = stops;
        o.n_stops = 1;
        o.max_tokens = 200;
        run(v.g, 512, v.prompt, v.np, &o, &a, &sa);
        o.lookup = 15;
        o.lookup_always = 1;
        run(v.g, 512, v.prompt, v.np, &o, &b, &sb);
        CHECKF(same_ids(&a, &b) && !strcmp(sa.finish, sb.finish),
               "with a stop string: %d tokens (%s) with lookup, %d (%s) without", b.n, sb.finish, a.n,
               sa.finish);
    }
    free(ids);
    mx_engine_free(v.g);
}

int main(void)
{
    test_draft();
    test_choose();
    int drafted = 0, accepted = 0;
    test_demo_model(&drafted, &accepted);
    const char *fx = test_fixtures();
    if (fx) {
        DIR *d = opendir(fx);
        struct dirent *ent;
        while (d && (ent = readdir(d))) {
            char dir[4096], cfg[4200];
            struct stat st;
            snprintf(dir, sizeof dir, "%s/%s", fx, ent->d_name);
            snprintf(cfg, sizeof cfg, "%s/config.json", dir);
            if (ent->d_name[0] == '.' || stat(cfg, &st) != 0)
                continue;
            fprintf(stderr, "%s\n", ent->d_name);
            test_fixture(dir, ent->d_name, &drafted, &accepted);
        }
        if (d)
            closedir(d);
    } else {
        fprintf(stderr, "(the fixture models are skipped; the demo model ran)\n");
    }
    fprintf(stderr, "whole generations: %d tokens drafted, %d accepted\n", drafted, accepted);
    CHECK(accepted > 0 && accepted < drafted);
    return test_summary();
}
