/* repl.h - line input for the chat REPL: line editing and history through
 * libedit when stdin and stderr are a terminal, plain lines from a pipe
 * otherwise, and Ctrl-C as a flag the caller polls instead of a kill. */
#ifndef MX_REPL_H
#define MX_REPL_H

typedef struct repl repl;

enum { REPL_LINE, REPL_EOF, REPL_INTERRUPT, REPL_ERROR };

/* Starts line input on stdin and takes over SIGINT (see repl_interrupted).
 * history_path: where the history of a terminal session is loaded from and
 * saved to (NULL: kept in memory only).  NULL when out of memory. */
repl *repl_open(const char *history_path);
/* Restores SIGINT, saves the history and frees everything. */
void repl_close(repl *r);
/* True when lines are edited on a terminal (prompts are shown). */
int repl_is_tty(const repl *r);

/* Reads one line, shown after `prompt` on a terminal.  On REPL_LINE, *line
 * is the text without its newline, valid until the next call.  Ctrl-C while
 * reading gives REPL_INTERRUPT (the typed text is dropped), Ctrl-D on an
 * empty line or the end of a pipe REPL_EOF. */
int repl_read(repl *r, const char *prompt, const char **line);
/* Adds a line to the history (Up/Down recall it; saved by repl_close). */
void repl_remember(repl *r, const char *line);

/* Whether Ctrl-C was pressed since the last repl_clear_interrupt: a reply
 * in progress polls this to stop at the next token. */
int repl_interrupted(void);
void repl_clear_interrupt(void);

#endif
