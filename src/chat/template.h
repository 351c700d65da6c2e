/* template.h - chat templates: the Jinja subset real chat templates use, and
 * tokenizer_config.json's chat_template / special token strings.
 *
 * The engine renders byte-identically to Python jinja2 as transformers uses
 * it (trim_blocks and lstrip_blocks on, keep_trailing_newline off).  Values
 * come in as cJSON trees (messages, add_generation_prompt, bos_token, ...). */
#ifndef MX_TEMPLATE_H
#define MX_TEMPLATE_H

#include <stddef.h>

#include "util/err.h"

struct cJSON;

/* Renders `tmpl` with the variables of the JSON object `ctx`.  *out is
 * malloc'ed.  Template syntax errors and raise_exception() are errors with
 * the message. */
int mx_jinja_render(const char *tmpl, const struct cJSON *ctx, char **out, mx_err *e);

typedef struct mx_chat_msg {
    const char *role;
    const char *content;
} mx_chat_msg;

typedef struct mx_chat_template mx_chat_template;

/* Reads DIR/tokenizer_config.json (chat_template as string or as a list of
 * {name, template}: "default" is used, and "tool_use", when the list has
 * one, for renderings with tools; bos_token/eos_token as strings or
 * {"content": ...}).  A missing file or template gives the ChatML fallback. */
int mx_chat_template_load(const char *dir, mx_chat_template **out, mx_err *e);
/* A template from text (tests); bos/eos may be NULL. */
int mx_chat_template_from_string(const char *tmpl, const char *bos, const char *eos,
                                 mx_chat_template **out, mx_err *e);
void mx_chat_template_free(mx_chat_template *t);
const char *mx_chat_template_eos(const mx_chat_template *t);   /* may be NULL */
const char *mx_chat_template_bos(const mx_chat_template *t);   /* may be NULL */
int mx_chat_template_is_fallback(const mx_chat_template *t);

/* Renders messages (add_generation_prompt as given) to *out (malloc'ed). */
int mx_chat_render(const mx_chat_template *t, const mx_chat_msg *msgs, size_t n,
                   int add_generation_prompt, char **out, mx_err *e);

/* Like mx_chat_render with the messages as a JSON array (so messages may
 * carry tool_calls, reasoning_content, ...), `tools` as a JSON array or NULL
 * (rendered as None, as transformers does; not NULL selects the "tool_use"
 * template when there is one), and `extra` an optional JSON object of
 * further template variables (e.g. {"enable_thinking": false}). */
int mx_chat_render_json(const mx_chat_template *t, const struct cJSON *messages,
                        const struct cJSON *tools, const struct cJSON *extra,
                        int add_generation_prompt, char **out, mx_err *e);

/* The template text in use (the fallback's when is_fallback). */
const char *mx_chat_template_text(const mx_chat_template *t);
/* The "tool_use" template that renders requests with tools, or NULL when
 * the checkpoint has none (then mx_chat_template_text renders them). */
const char *mx_chat_template_tool_text(const mx_chat_template *t);

/* Syntax check only. */
int mx_jinja_check(const char *tmpl, mx_err *e);

#endif
