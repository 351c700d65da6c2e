/* mlxcel.h - the public C API of libmlxcel: load an MLX-format quantized
 * language model (an mlx-community checkpoint folder: config.json,
 * safetensors, tokenizer.json), tokenize, render its chat template, and
 * run it: prefill, decode steps, sampling and streaming generation.
 *
 * This is the library's only public header.  It is C99 (and C++) clean and
 * exposes no internal type: models and contexts are opaque handles.
 *
 * Conventions
 * - Functions that can fail return an int status: MLXCEL_OK (0) or one of
 *   the MLXCEL_E* codes below.  The failing call also records a one-line
 *   message naming what was wrong (the file, field, argument or value);
 *   mlxcel_last_error() returns it.  The message is per thread, like errno:
 *   a failure sets it, a success leaves it as it was.
 * - A NULL handle, a handle of the wrong kind (a context passed as a
 *   model) or a NULL required pointer is MLXCEL_EINVAL, never a crash.
 *   Using a handle after freeing it is undefined behaviour.
 * - Buffers the library returns (token ids, text) are allocated by it and
 *   released with mlxcel_free().  Text is UTF-8 and NUL-terminated.
 * - Structs the caller allocates (options, sampling parameters) start with
 *   a `size` member, which the matching *_init() function sets to the
 *   sizeof the caller was compiled with.  Later versions only append
 *   members; the library gives members beyond the caller's `size` their
 *   defaults, so a program built against an older header keeps working.
 *   Always call the *_init() function before setting members.
 *
 * Thread safety
 * - A model is shared read-only: any number of threads may use one model
 *   (tokenize, render, create contexts) at the same time.
 * - A context belongs to one thread at a time: never call two functions on
 *   the same context concurrently.  Different contexts may be used from
 *   different threads, including contexts of the same model.
 * - Forward passes (prefill, decode, generation steps) run one at a time in
 *   the whole process: the library holds an internal lock for each pass.
 *   A pass already uses all the threads the model was loaded with, and a
 *   model keeps the scratch memory of its passes itself, so passes of two
 *   contexts of one model must not overlap.  The lock is held per pass, not
 *   per generation: two threads generating at once take turns token by
 *   token.  Callbacks run outside the lock.
 * - A model must outlive its contexts: free every context first.
 *
 * Model support: the families mlxcel runs (qwen2_moe, qwen3_moe, mixtral,
 * olmoe, ...); see the project's README and docs/library.md. */
#ifndef MLXCEL_H
#define MLXCEL_H

#include <stddef.h>
#include <stdint.h>

/* ---- version ------------------------------------------------------------- */

/* The version of this header.  The library's shared-object version
 * (SONAME libmlxcel.so.MAJOR) changes when the ABI breaks. */
#define MLXCEL_VERSION_MAJOR 0
#define MLXCEL_VERSION_MINOR 1
#define MLXCEL_VERSION_PATCH 0
#define MLXCEL_VERSION_STRING "0.1.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH, for #if comparisons */
#define MLXCEL_VERSION_NUMBER \
    (MLXCEL_VERSION_MAJOR * 10000 + MLXCEL_VERSION_MINOR * 100 + MLXCEL_VERSION_PATCH)

/* Symbols of the shared library are exported with default visibility, all
 * others are hidden.  Define MLXCEL_API before including this header to
 * override (e.g. empty when linking the static library into a shared one
 * that should not re-export the API). */
#ifndef MLXCEL_API
#if defined(__GNUC__) && __GNUC__ >= 4
#define MLXCEL_API __attribute__((visibility("default")))
#else
#define MLXCEL_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library actually loaded: "MAJOR.MINOR.PATCH". */
MLXCEL_API const char *mlxcel_version(void);
/* The same as MLXCEL_VERSION_NUMBER computes, for the library loaded. */
MLXCEL_API int mlxcel_version_number(void);

/* ---- errors and memory --------------------------------------------------- */

enum mlxcel_status {
    MLXCEL_OK = 0,
    MLXCEL_EIO = 1,          /* a file could not be opened, read or mapped */
    MLXCEL_EFORMAT = 2,      /* a malformed file (safetensors, JSON, tokenizer) */
    MLXCEL_ECONFIG = 3,      /* a config.json field missing or wrong */
    MLXCEL_EUNSUPPORTED = 4, /* valid but not supported (family, bits, option value) */
    MLXCEL_ENOMEM = 5,       /* out of memory */
    MLXCEL_EINVAL = 6,       /* a bad argument or handle */
    MLXCEL_ERANGE = 7        /* a value out of range (token id, context full) */
};

/* The message of the last call that failed on this thread ("" when none
 * has).  The pointer stays valid until the next failing call on this
 * thread. */
MLXCEL_API const char *mlxcel_last_error(void);
/* A short description of a status code ("I/O error", ...); never NULL. */
MLXCEL_API const char *mlxcel_strerror(int status);
/* Releases a buffer the library returned (NULL is allowed). */
MLXCEL_API void mlxcel_free(void *p);

/* ---- models -------------------------------------------------------------- */

typedef struct mlxcel_model mlxcel_model;

typedef struct mlxcel_model_options {
    size_t size;             /* sizeof(mlxcel_model_options); set by _init */
    int threads;             /* worker threads of this model's forward passes;
                                0 (default): MLXCEL_THREADS, else every CPU;
                                at most 256 */
    int context;             /* context size of mlxcel_context_new(m, 0, ...);
                                0 (default): the model's max_position_embeddings,
                                at most 4096 */
    int fused_moe;           /* the fused single-token MoE kernel: 1 on, 0 off,
                                -1 (default): MLXCEL_FUSED_MOE decides (on unless
                                it says 0/false/off/no) */
    const char *precision;   /* the integer kernels' arithmetic: "exact"
                                (activations as three int8 levels per group,
                                as close as float rounding) or "fast" (one
                                level: less work per token, slightly different
                                numbers; CPUs without VNNI kernels stay exact);
                                NULL (default): MLXCEL_PRECISION decides
                                (exact unless it says fast); another value
                                is MLXCEL_EUNSUPPORTED */
} mlxcel_model_options;

/* Fills o with the defaults (and o->size). */
MLXCEL_API void mlxcel_model_options_init(mlxcel_model_options *o);

/* Loads the checkpoint folder `dir` (config.json, generation_config.json,
 * safetensors, and tokenizer.json + tokenizer_config.json when present;
 * weights are memory-mapped, not copied).  opts may be NULL (defaults).
 * On success *out is a new model (free with mlxcel_model_free); on failure
 * *out is NULL. */
MLXCEL_API int mlxcel_model_load(const char *dir, const mlxcel_model_options *opts,
                                 mlxcel_model **out);
/* Frees a model (NULL is allowed).  Free its contexts first. */
MLXCEL_API void mlxcel_model_free(mlxcel_model *m);

/* Model facts.  On a bad handle the integer getters return -1 and the
 * string getter NULL (and record the error). */
MLXCEL_API const char *mlxcel_model_family(const mlxcel_model *m);   /* config's model_type */
MLXCEL_API int mlxcel_model_n_layers(const mlxcel_model *m);
MLXCEL_API int mlxcel_model_n_vocab(const mlxcel_model *m);          /* logits per token */
MLXCEL_API int mlxcel_model_n_ctx_train(const mlxcel_model *m);      /* max_position_embeddings
                                                                       (-1 when absent) */
MLXCEL_API int mlxcel_model_n_ctx(const mlxcel_model *m);            /* the default context */
MLXCEL_API int mlxcel_model_n_experts(const mlxcel_model *m);        /* 0 for a dense model */
MLXCEL_API int mlxcel_model_n_experts_used(const mlxcel_model *m);   /* experts per token */
MLXCEL_API int mlxcel_model_has_tokenizer(const mlxcel_model *m);    /* 1 when tokenizer.json
                                                                       was loaded */

/* Special tokens.  BOS: config's bos_token_id, -1 when none.  End-of-
 * sequence ids (config.json, generation_config.json and the chat
 * template's eos_token together): mlxcel_model_n_eos of them, read with
 * mlxcel_model_eos(m, i) for i in [0, n) (-1 outside). */
MLXCEL_API int32_t mlxcel_model_bos(const mlxcel_model *m);
MLXCEL_API int mlxcel_model_n_eos(const mlxcel_model *m);
MLXCEL_API int32_t mlxcel_model_eos(const mlxcel_model *m, int i);
/* 1 when id ends a sequence, 0 when not, -1 on a bad handle. */
MLXCEL_API int mlxcel_model_is_eos(const mlxcel_model *m, int32_t id);

/* ---- tokenizer and chat template ----------------------------------------- */
/* These need the checkpoint's tokenizer.json: without one they fail with
 * MLXCEL_EUNSUPPORTED. */

/* Encodes len bytes of UTF-8 text (invalid UTF-8 is MLXCEL_EINVAL).
 * parse_special != 0: special tokens written in the text ("<|im_end|>")
 * become their ids, as for a rendered chat prompt; 0: they are plain
 * text.  No BOS/EOS is added.  *ids (free with mlxcel_free) gets *n ids;
 * an empty text gives *n = 0 and a valid (empty) buffer. */
MLXCEL_API int mlxcel_tokenize(const mlxcel_model *m, const char *text, size_t len,
                               int parse_special, int32_t **ids, size_t *n);
/* Decodes n ids to UTF-8 text: *text (free with mlxcel_free), NUL-
 * terminated, *len bytes (len may be NULL).  skip_special != 0 drops special
 * tokens.  An id outside the tokenizer's vocabulary is MLXCEL_ERANGE. */
MLXCEL_API int mlxcel_detokenize(const mlxcel_model *m, const int32_t *ids, size_t n,
                                 int skip_special, char **text, size_t *len);
/* The id of one token's string (vocabulary or added token, e.g.
 * "<|im_end|>"), or -1 when there is none (or on a bad handle). */
MLXCEL_API int32_t mlxcel_token_id(const mlxcel_model *m, const char *token);

/* Renders the model's chat template (tokenizer_config.json's chat_template;
 * ChatML when it has none) exactly as transformers' apply_chat_template
 * does.  messages_json: a JSON array of message objects
 * ([{"role": "user", "content": "Hi"}], also with tool_calls, ...);
 * tools_json: a JSON array of tool definitions or NULL; extra_json: a JSON
 * object of further template variables ({"enable_thinking": false}) or
 * NULL.  add_generation_prompt != 0 appends the assistant's header.  The
 * result (*text, free with mlxcel_free) is tokenized with parse_special = 1. */
MLXCEL_API int mlxcel_chat_render(const mlxcel_model *m, const char *messages_json,
                                  const char *tools_json, const char *extra_json,
                                  int add_generation_prompt, char **text);

/* ---- sampling ------------------------------------------------------------ */

/* Applied in this order: repetition penalty, frequency/presence penalties,
 * then greedy when temperature <= 0, else temperature, top-k, top-p,
 * min-p and a draw from a PRNG seeded with `seed` (the same seed and
 * inputs give the same draws). */
typedef struct mlxcel_sampling {
    size_t size;             /* sizeof(mlxcel_sampling); set by _init */
    float temperature;       /* default 0.8; <= 0: greedy (the most likely id,
                                the lowest on ties) */
    int top_k;               /* default 40; <= 0: off */
    float top_p;             /* default 0.95; >= 1: off */
    float min_p;             /* default 0.05; <= 0: off */
    float repeat_penalty;    /* default 1 (off) */
    int repeat_last_n;       /* default 64: tokens the penalty looks back at */
    float frequency_penalty; /* default 0 (off): logit -= f * count */
    float presence_penalty;  /* default 0 (off): logit -= p * (count > 0) */
    uint64_t seed;           /* default 0 */
} mlxcel_sampling;

/* Fills s with the defaults above (and s->size). */
MLXCEL_API void mlxcel_sampling_init(mlxcel_sampling *s);

/* ---- contexts: a sequence and its KV cache ------------------------------- */

typedef struct mlxcel_context mlxcel_context;

/* A new, empty context of n_ctx tokens (0: the model's default context)
 * for model m, with the default sampling parameters.  Its KV cache is
 * reserved for n_ctx tokens and committed as it fills. */
MLXCEL_API int mlxcel_context_new(mlxcel_model *m, int n_ctx, mlxcel_context **out);
/* Frees a context (NULL is allowed). */
MLXCEL_API void mlxcel_context_free(mlxcel_context *c);

/* The context size, and the number of tokens now in its cache (-1 on a
 * bad handle). */
MLXCEL_API int mlxcel_context_n_ctx(const mlxcel_context *c);
MLXCEL_API int mlxcel_context_n_tokens(const mlxcel_context *c);
/* Copies up to cap of the cached token ids to ids (ids may be NULL when
 * cap is 0) and returns how many the cache holds (-1 on a bad handle). */
MLXCEL_API int mlxcel_context_tokens(const mlxcel_context *c, int32_t *ids, size_t cap);

/* Empties the cache (position 0).  The sampler's PRNG is not reseeded. */
MLXCEL_API int mlxcel_context_reset(mlxcel_context *c);
/* Keeps the first n cached tokens and drops the rest (0 <= n <=
 * n_tokens), so a new continuation reuses their K/V.  The logits are gone
 * until the next prefill or decode.  A model with recurrent layers
 * (qwen3_next, lfm2_moe) cannot step its state back: keeping fewer tokens
 * than it holds runs the kept ones through the model again. */
MLXCEL_API int mlxcel_context_keep(mlxcel_context *c, int n);

/* Runs n tokens through the model after those already cached (a prompt, or
 * its continuation); afterwards mlxcel_context_logits gives the last
 * token's logits.  n == 0 does nothing.  Running past the context
 * (MLXCEL_ERANGE) or an id outside the vocabulary (MLXCEL_ERANGE) leaves
 * the context as it was. */
MLXCEL_API int mlxcel_context_prefill(mlxcel_context *c, const int32_t *ids, size_t n);
/* One decode step: mlxcel_context_prefill of the single token id. */
MLXCEL_API int mlxcel_context_decode(mlxcel_context *c, int32_t id);
/* Makes the cache hold exactly ids[0..n), reusing the longest common
 * prefix already cached: only the rest runs through the model (the last
 * token always does, so fresh logits follow).  *n_reused (may be NULL)
 * gets how many cached tokens were reused (0 for a model with recurrent
 * layers unless the whole cache is the prefix).  n must be >= 1. */
MLXCEL_API int mlxcel_context_set_tokens(mlxcel_context *c, const int32_t *ids, size_t n,
                                         size_t *n_reused);

/* The logits [mlxcel_model_n_vocab] of the last token run through the
 * model, or NULL when there are none (a new, reset or kept context, or
 * after mlxcel_generate).  Valid until the next call that changes c. */
MLXCEL_API const float *mlxcel_context_logits(const mlxcel_context *c);

/* Sets the sampling parameters (NULL: the defaults) and restarts the
 * context's PRNG from their seed. */
MLXCEL_API int mlxcel_context_set_sampling(mlxcel_context *c, const mlxcel_sampling *s);
/* Picks the next token from the current logits (which stay unchanged) with
 * the context's sampler; the cached tokens are the penalties' history.
 * The token is not run through the model: mlxcel_context_decode does that.
 * No logits is MLXCEL_EINVAL. */
MLXCEL_API int mlxcel_context_sample(mlxcel_context *c, int32_t *id);

/* ---- streaming generation ------------------------------------------------ */

/* Called for every generated token with the text it completes (after the
 * stop-string filter; may be empty while a multi-byte character or a
 * possible stop string is held back); and, when text was still held back
 * at the end, once more with id -1 and that text.  An end-of-sequence
 * token is not passed.  text is not NUL-terminated; it is NULL when the
 * model has no tokenizer.  Return 0 to go on, nonzero to stop the
 * generation (finish MLXCEL_FINISH_CANCELLED; no call with id -1 follows). */
typedef int (*mlxcel_token_callback)(void *user, int32_t id, const char *text, size_t len);

enum mlxcel_finish {
    MLXCEL_FINISH_STOP = 0,      /* an end-of-sequence token or a stop string */
    MLXCEL_FINISH_LENGTH = 1,    /* max_tokens, or the context is full */
    MLXCEL_FINISH_CANCELLED = 2  /* the callback returned nonzero */
};

typedef struct mlxcel_generate_options {
    size_t size;               /* sizeof(mlxcel_generate_options); set by _init */
    int max_tokens;            /* default 256; -1: until end of sequence or
                                  a full context */
    const char *const *stop;   /* n_stop stop strings (NULL: none); the text
                                  stops before a stop string */
    size_t n_stop;
    int ignore_eos;            /* default 0: nonzero generates past EOS */
    int keep_special;          /* default 0: nonzero streams special tokens' text */
} mlxcel_generate_options;

/* Fills o with the defaults (and o->size). */
MLXCEL_API void mlxcel_generate_options_init(mlxcel_generate_options *o);

/* Generates from prompt[0..n_prompt) (1 <= n_prompt < n_ctx) with the
 * context's sampling parameters (its PRNG starts from their seed at each
 * call): the cache's common prefix with the prompt is reused (as
 * mlxcel_context_set_tokens), the rest prefilled, then tokens are sampled
 * and streamed to cb (may be NULL) until EOS, a stop string, max_tokens, a
 * full context or cb stops it.  *finish (may be NULL) gets an
 * mlxcel_finish value.  Afterwards the cache holds the prompt and every
 * generated token but the last (which was sampled, not run), so passing
 * the whole conversation as the next prompt recomputes only what is new.
 * opts may be NULL (defaults). */
MLXCEL_API int mlxcel_generate(mlxcel_context *c, const int32_t *prompt, size_t n_prompt,
                               const mlxcel_generate_options *opts, mlxcel_token_callback cb,
                               void *user, int *finish);

#ifdef __cplusplus
}
#endif

#endif
