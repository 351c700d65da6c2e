/* tokenizer.h - HF tokenizers' tokenizer.json: byte-level BPE (Qwen2, GPT-2,
 * Llama-3 style) and SentencePiece-style BPE (Mixtral: metaspace, <0xNN> byte
 * fallback), with normalizers, pre-tokenizers, added/special tokens and
 * decoders as the file describes them. */
#ifndef MX_TOKENIZER_H
#define MX_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct mx_tokenizer mx_tokenizer;

/* Loads tokenizer.json.  An unsupported model/normalizer/pre-tokenizer/decoder
 * type is an error naming it. */
int mx_tok_load(const char *tokenizer_json_path, mx_tokenizer **out, mx_err *e);
/* The same from the file's text in memory (buf[len], not NUL-terminated;
 * not kept); `name` stands for the file in error messages. */
int mx_tok_load_mem(const char *buf, size_t len, const char *name, mx_tokenizer **out, mx_err *e);
/* Loads DIR/tokenizer.json. */
int mx_tok_load_dir(const char *dir, mx_tokenizer **out, mx_err *e);
void mx_tok_free(mx_tokenizer *t);

/* Encodes UTF-8 text (invalid UTF-8 is an error).  Special/added tokens that
 * appear literally in the text are matched when parse_special is set.  No
 * BOS/EOS is added.  *ids is malloc'ed; the caller frees it. */
int mx_tok_encode(const mx_tokenizer *t, const char *text, size_t len, int parse_special,
                  int32_t **ids, size_t *n, mx_err *e);

/* Decodes ids to text (*text malloc'ed, NUL-terminated, *len bytes).
 * skip_special drops special tokens.  An id outside the vocabulary is an
 * error. */
int mx_tok_decode(const mx_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                  char **text, size_t *len, mx_err *e);

int32_t mx_tok_vocab_size(const mx_tokenizer *t);   /* max id + 1 */
/* Id of a token string (vocab or added), or -1. */
int32_t mx_tok_lookup(const mx_tokenizer *t, const char *token);
/* 1 when id is a special added token. */
int mx_tok_is_special(const mx_tokenizer *t, int32_t id);

/* The bytes token `id` adds to decoded text (byte-level tokens may hold
 * part of a UTF-8 character: those bytes, unrepaired; "<0xNN>" is that
 * byte; the metaspace is a space; special tokens are their content).
 * Writes up to cap bytes to buf and returns the full length, or -1 for an
 * id outside the vocabulary (or out of memory). */
int mx_tok_token_bytes(const mx_tokenizer *t, int32_t id, char *buf, size_t cap);

/* Stream-safe incremental decoding: push ids one at a time; each push yields
 * only text that is final (never half a UTF-8 sequence). */
typedef struct mx_tok_stream mx_tok_stream;
mx_tok_stream *mx_tok_stream_new(const mx_tokenizer *t, int skip_special);
/* Appends the newly final text to a malloc'ed *out (NUL-terminated, *len
 * bytes, may be 0).  Caller frees *out. */
int mx_tok_stream_push(mx_tok_stream *s, int32_t id, char **out, size_t *len, mx_err *e);
/* Whatever is left (incomplete bytes become U+FFFD as HF does). */
int mx_tok_stream_flush(mx_tok_stream *s, char **out, size_t *len, mx_err *e);
void mx_tok_stream_free(mx_tok_stream *s);

#endif
