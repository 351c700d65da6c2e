/* toolcall.h - OpenAI tool calls over a model's own tool-call format.
 *
 * A chat model calls tools by writing a marked-up JSON call in its reply, in
 * the format its chat template teaches it (the template shows the tools and
 * renders earlier calls the same way).  This module knows those formats:
 *
 *   hermes   (Qwen2.5, Qwen3, Hermes, ...)  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 *            (one block per call; several blocks for several calls)
 *   mistral  (Mistral, Mixtral with tools)  [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]
 *
 * It finds a template's format (mx_tool_format_detect), splits the model's
 * output into content and calls, incrementally so that a stream never shows
 * the start of a call as content (mx_tool_parse), and builds the GBNF
 * grammar that forces exactly one call of an allowed function whose
 * arguments follow its parameters' JSON Schema (mx_tool_grammar). */
#ifndef MX_TOOLCALL_H
#define MX_TOOLCALL_H

#include <stddef.h>

#include "util/err.h"

struct cJSON;

typedef enum mx_tool_format {
    MX_TOOLS_NONE = 0,           /* the template has no tool-call format we know */
    MX_TOOLS_HERMES,
    MX_TOOLS_MISTRAL,
} mx_tool_format;

/* The format a chat template teaches: hermes when its text mentions
 * "<tool_call>", mistral when it mentions "[TOOL_CALLS]", else none. */
mx_tool_format mx_tool_format_detect(const char *template_text);
/* "hermes", "mistral", or NULL for none. */
const char *mx_tool_format_name(mx_tool_format f);

/* One parsed call.  arguments is JSON text (an object as the model wrote
 * it, re-printed compactly; a string the model gave as is); id is the
 * model's own call id when it wrote one (mistral), else NULL. */
typedef struct mx_tool_call {
    char *name;
    char *arguments;
    char *id;
} mx_tool_call;

/* What one mx_tool_parse call released: content text certain to be content
 * (it may be empty) and the calls completed. */
typedef struct mx_tool_out {
    char *content;
    size_t len, cap;
    mx_tool_call *calls;
    int n_calls, cap_calls;
} mx_tool_out;

void mx_tool_out_free(mx_tool_out *o);

/* Parse state over one growing output. */
typedef struct mx_tool_parser {
    mx_tool_format fmt;
    size_t pos;                  /* bytes of the text consumed */
    int in_call;                 /* a start marker was seen at call_start */
    size_t call_start;
    size_t ws_start;             /* whitespace before it starts here */
    int after_call;              /* drop whitespace at pos: it follows a call */
    int n_calls;                 /* calls found so far */
} mx_tool_parser;

void mx_tool_parser_init(mx_tool_parser *p, mx_tool_format f);

/* Consumes text[p->pos..len): `text` is the whole output so far (it only
 * grows between calls) and done says no more comes.  Appends to out the
 * content that can no longer turn out to be part of a call, and the calls
 * completed.  Text that may still be the start of a call marker, and
 * whitespace that may still precede one, is held back until it is decided.
 * Whitespace around calls is dropped (also at the end, once a call was
 * found); a block that is not a valid call (bad JSON, no "name") stays
 * content exactly as written, marker and whitespace included.  Fed piece by piece or all at once, the same
 * text gives the same content and calls.  Returns 0, or MX_ENOMEM. */
int mx_tool_parse(mx_tool_parser *p, const char *text, size_t len, int done, mx_tool_out *out);

/* GBNF that forces exactly one call in format f of one function of `tools`
 * (an OpenAI tools list: [{"type": "function", "function": {"name",
 * "parameters"}}]), or only of the function named `only` when that is not
 * NULL, with arguments that follow the function's "parameters" JSON Schema
 * (any object when it has none).  The call is written as the format's
 * templates render earlier calls.  A schema outside the compiler's subset
 * is an error naming tools[i] and the keyword.  *gbnf is malloc'ed. */
int mx_tool_grammar(mx_tool_format f, const struct cJSON *tools, const char *only, char **gbnf,
                    mx_err *e);

#endif
