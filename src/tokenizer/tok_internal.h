/* tok_internal.h - shared structures of the tokenizer module (not public).
 *
 * The tokenizer mirrors HF tokenizers' pipeline:
 *   added tokens (raw) -> normalizer -> added tokens (normalized) ->
 *   pre-tokenizer -> BPE model -> ids
 * and for decoding: ids -> token strings -> decoder chain -> UTF-8.
 * Each stage is a small tagged struct built once from tokenizer.json. */
#ifndef MX_TOK_INTERNAL_H
#define MX_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* ---- small containers (tok_util.c) ---- */

typedef struct { char *p; size_t n, cap; } tok_buf;          /* bytes */
typedef struct { int32_t *p; size_t n, cap; } tok_ids;        /* int32 */
typedef struct { size_t *p; size_t n, cap; } tok_sizes;       /* size_t */

int tok_buf_reserve(tok_buf *b, size_t extra);     /* 0 or -1 (no memory) */
int tok_buf_put(tok_buf *b, const void *s, size_t n);
void tok_buf_free(tok_buf *b);
int tok_ids_push(tok_ids *v, int32_t id);
int tok_ids_append(tok_ids *v, const int32_t *ids, size_t n);
int tok_sizes_push2(tok_sizes *v, size_t a, size_t b);

/* ---- UTF-8 (tok_util.c) ---- */

/* Length (1..4) of the well-formed UTF-8 character at s, storing its code
 * point; 0 when the bytes there are not a complete well-formed character. */
int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);
int tok_utf8_put(uint32_t cp, char out[4]);
/* Offset of the first ill-formed byte, or n when all of s is valid. */
size_t tok_utf8_check(const char *s, size_t n);
/* Appends s to out, replacing each maximal ill-formed subpart with U+FFFD
 * (the policy of Rust's String::from_utf8_lossy, which HF uses). */
int tok_utf8_lossy(tok_buf *out, const char *s, size_t n);

uint64_t tok_hash(const void *s, size_t n);
/* Unicode White_Space (Rust's char::is_whitespace). */
int tok_is_ws(uint32_t cp);

/* GPT-2 bytes_to_unicode: byte -> code point, and the reverse (-1 if the
 * code point is not one of the 256). */
uint32_t tok_byte_to_cp(unsigned b);
int tok_cp_to_byte(uint32_t cp);

/* ---- hash tables (tok_util.c) ---- */

/* string -> int32.  Keys are borrowed from one buffer (base) and stored as
 * offsets with their hash, so a probe rarely touches the key bytes. */
typedef struct {
    uint32_t h, len;
    int32_t val;
    uint32_t koff;
} tok_strent;
typedef struct { tok_strent *e; size_t mask, count; const char *base; } tok_strmap;
int tok_strmap_init(tok_strmap *m, size_t expected, const char *base);
/* Inserts or overwrites the key base[koff, koff+len).  -1 on no memory. */
int tok_strmap_put(tok_strmap *m, uint32_t koff, uint32_t len, int32_t val);
int32_t tok_strmap_get(const tok_strmap *m, const char *k, size_t len); /* -1 */
void tok_strmap_free(tok_strmap *m);

/* (left id, right id) -> (rank, merged id). */
typedef struct { uint64_t key; int32_t rank, id; } tok_pairent;
typedef struct { tok_pairent *e; size_t mask, count; } tok_pairmap;
int tok_pairmap_init(tok_pairmap *m, size_t expected);
/* A repeated pair overwrites the earlier one (HF collects into a map). */
int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const tok_pairent *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b);
void tok_pairmap_free(tok_pairmap *m);

/* ---- JSON parsing of the pipeline parts ---- */
struct cJSON;
/* file names the tokenizer.json in messages; where is the JSON path of the
 * object ("normalizer.normalizers[1]"). */
typedef struct tok_norm tok_norm;
typedef struct tok_pretok tok_pretok;
typedef struct tok_dec tok_dec;
int tok_norm_parse(const struct cJSON *j, const char *file, const char *where, tok_norm *out,
                   mx_err *e);
int tok_pretok_parse(const struct cJSON *j, const char *file, const char *where,
                     tok_pretok *out, mx_err *e);
int tok_dec_parse(const struct cJSON *j, const char *file, const char *where, tok_dec *out,
                  mx_err *e);
/* Metaspace's prepend_scheme (or legacy add_prefix_space) -> PREPEND_*. */
int tok_parse_prepend_scheme(const struct cJSON *j, const char *file, const char *where,
                             int *out, mx_err *e);
/* A one-character string field: UTF-8 in out (NUL-terminated), code point in
 * cp; returns its byte length, or 0 after filling e. */
int tok_parse_char(const struct cJSON *j, const char *key, const char *file, const char *where,
                   char out[5], uint32_t *cp, mx_err *e);
/* Reads the type field; a missing one is an error naming where. */
int tok_json_type(const struct cJSON *j, const char *file, const char *where,
                  const char **type, mx_err *e);
/* A "Sequence" component (normalizer, pre-tokenizer or decoder): j[key] is
 * an array whose items are parsed by `parse` into a new zeroed array of
 * n + 1 elements of elem_size bytes.  *kids and *n_kids are set even on
 * failure (to what was parsed so far) so the caller's free routine can
 * release them. */
typedef int (*tok_kid_parse)(const struct cJSON *j, const char *file, const char *where,
                             void *out, mx_err *e);
int tok_parse_sequence(const struct cJSON *j, const char *key, const char *file,
                       const char *where, size_t elem_size, tok_kid_parse parse, void **kids,
                       int *n_kids, mx_err *e);

/* ---- patterns (tok_normalize.c) ---- */

/* A literal string or a PCRE2 regex (HF's {"String": ..} / {"Regex": ..}). */
typedef struct {
    char *lit;
    size_t lit_len;
    pcre2_code *re;
} tok_pattern;

/* Appends the [start, end) spans of every non-overlapping match in s to
 * spans (as pairs).  Empty matches are skipped. */
int tok_pattern_find(const tok_pattern *p, const char *s, size_t n, tok_sizes *spans,
                     pcre2_match_data *md);
void tok_pattern_free(tok_pattern *p);
/* Parses HF's {"String": "..."} or {"Regex": "..."}. */
int tok_pattern_parse(const struct cJSON *j, const char *file, const char *where,
                      tok_pattern *out, mx_err *e);
/* Compiles a regex with PCRE2_UTF|PCRE2_UCP (+ JIT when available). */
int tok_regex_compile(const char *src, size_t len, pcre2_code **out, const char *file,
                      const char *where, mx_err *e);

/* ---- normalizers (tok_normalize.c) ---- */

enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE, NORM_PREPEND,
       NORM_REPLACE, NORM_STRIP, NORM_SEQUENCE };

struct tok_norm {
    int type;
    char *str;            /* Prepend text, Replace content */
    size_t str_len;
    tok_pattern pat;      /* Replace pattern */
    int strip_left, strip_right;
    struct tok_norm *kids;  /* Sequence */
    int n_kids;
};

/* Normalizes s into out (cleared first). */
int tok_normalize(const tok_norm *nm, const char *s, size_t n, tok_buf *out,
                  pcre2_match_data *md);
void tok_norm_free(tok_norm *nm);

/* ---- pre-tokenizers (tok_pretok.c) ---- */

enum { PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE, PRE_DIGITS, PRE_SEQUENCE };
enum { BEH_REMOVED, BEH_ISOLATED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

struct tok_pretok {
    int type;
    tok_pattern pat;        /* Split; ByteLevel use_regex (GPT-2 regex) */
    int behavior, invert;   /* Split */
    int add_prefix_space;   /* ByteLevel */
    int use_regex;          /* ByteLevel */
    char rep[5];            /* Metaspace replacement, UTF-8 */
    int rep_len;
    int prepend_scheme, split;  /* Metaspace */
    int individual_digits;  /* Digits */
    struct tok_pretok *kids;
    int n_kids;
};

/* A piece of text in an arena (offsets, since the arena may grow). */
typedef struct { size_t off, len; int first; } tok_piece;
typedef struct { tok_piece *p; size_t n, cap; } tok_pieces;
int tok_pieces_push(tok_pieces *v, size_t off, size_t len, int first);

/* Splits the pieces in *io (text in arena) further; new text is appended to
 * the arena.  tmp is scratch. */
int tok_pretokenize(const tok_pretok *pt, tok_buf *arena, tok_pieces *io, tok_pieces *tmp,
                    tok_sizes *spans, pcre2_match_data *md);
void tok_pretok_free(tok_pretok *pt);

/* ---- decoders (tok_decode.c) ---- */

enum { DEC_BYTELEVEL, DEC_METASPACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_REPLACE,
       DEC_SEQUENCE };

struct tok_dec {
    int type;
    uint32_t ch;            /* Metaspace replacement / Strip content */
    int prepend_scheme;     /* Metaspace */
    int start, stop;        /* Strip */
    tok_pattern pat;        /* Replace */
    char *str;
    size_t str_len;
    struct tok_dec *kids;
    int n_kids;
};
void tok_dec_free(tok_dec *d);

/* ---- added tokens ---- */

typedef struct {
    int32_t id;
    char *content;          /* as in the file */
    size_t len;
    char *match;            /* what is searched: content, or normalized content */
    size_t match_len;
    uint8_t special, lstrip, rstrip, normalized, single_word;
} tok_added;

/* Added tokens of one kind (raw or normalized), indexed by first byte and
 * sorted longest first, for leftmost-longest matching. */
typedef struct {
    int *idx;               /* into mx_tokenizer.added */
    int n;
    int start[257];         /* idx[start[b] .. start[b+1]) begin with byte b */
} tok_addset;

/* ---- BPE word cache (tok_bpe.c) ---- */
typedef struct tok_cache tok_cache;
tok_cache *tok_cache_new(void);
void tok_cache_free(tok_cache *c);

struct mx_tokenizer {
    /* id -> string used for decoding (added content wins over vocab). */
    int32_t n_ids;                /* max id + 1 */
    const char **tok_str;
    uint32_t *tok_len;
    uint8_t *tok_flags;           /* TOKF_* */
    char *arena;                  /* vocab strings */

    /* BPE model */
    tok_strmap vocab;             /* model vocab only */
    tok_pairmap merges;
    int32_t unk_id;               /* -1 when none */
    int byte_fallback, fuse_unk, ignore_merges;
    char *cont_prefix, *eow_suffix;   /* "" when absent */
    size_t cont_prefix_len, eow_suffix_len;
    int32_t fallback_ids[256];    /* <0xNN> ids, -1 when absent */
    int32_t byte_ids[256];        /* ids of the byte-level chars, -1 absent */
    int byte_level;               /* pieces are raw bytes to map to byte-level chars */

    tok_added *added;
    int n_added;
    tok_addset add_raw, add_norm;

    tok_norm *norm;               /* NULL: none */
    tok_pretok *pretok;           /* NULL: none */
    tok_dec *dec;                 /* NULL: join with spaces, as HF */

    tok_cache *cache;
};

enum { TOKF_VOCAB = 1, TOKF_ADDED = 2, TOKF_SPECIAL = 4 };

/* BPE of one pre-token piece, appending ids. (tok_bpe.c) */
typedef struct tok_scratch tok_scratch;
tok_scratch *tok_scratch_new(void);
void tok_scratch_free(tok_scratch *s);
int tok_bpe_word(const mx_tokenizer *t, const char *s, size_t n, tok_ids *out, tok_scratch *sc);

/* Decode ids into raw bytes via the decoder chain (tok_decode.c). */
int tok_decode_ids(const mx_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                   tok_buf *out, mx_err *e);

#endif
