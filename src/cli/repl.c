/* repl.c - line input for the chat REPL.
 *
 * On a terminal, lines are read with libedit (emacs keys, arrows, history,
 * ~/.editrc).  Ctrl-C must not kill the process: a reply in progress stops
 * at the next token, and at the prompt the line is dropped.  The SIGINT
 * handler only sets a flag and writes a byte into a pipe; it may run on any
 * thread (OpenMP workers included), so the prompt does not wait for an
 * interrupted read() but polls stdin and the pipe together, in its own
 * character reader (libedit's reader retries interrupted reads).
 *
 * From a pipe (no terminal) lines are read with getline and Ctrl-C between
 * replies ends the process as it would any filter. */
#include "cli/repl.h"

#include <errno.h>
#include <fcntl.h>
#include <histedit.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

struct repl {
    EditLine *el;             /* NULL when reading from a pipe */
    History *hist;
    char *history_path;
    const char *prompt;
    char *line;               /* the last line, without its newline */
    size_t cap;
    struct sigaction old_int;
};

static volatile sig_atomic_t g_interrupted;
static volatile sig_atomic_t g_quit_on_int;   /* pipe mode: Ctrl-C ends the process */
static int g_wake[2] = {-1, -1};               /* the handler writes here */

static void on_sigint(int sig)
{
    if (g_quit_on_int) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    int saved = errno;
    g_interrupted = 1;
    if (g_wake[1] >= 0 && write(g_wake[1], "", 1) < 0) {
        /* the pipe is full: a wake-up is already pending */
    }
    errno = saved;
}

int repl_interrupted(void) { return g_interrupted; }

void repl_clear_interrupt(void)
{
    char buf[64];
    g_interrupted = 0;
    while (g_wake[0] >= 0 && read(g_wake[0], buf, sizeof buf) > 0) {
    }
}

static char *prompt_of(EditLine *el)
{
    repl *r = NULL;
    el_get(el, EL_CLIENTDATA, &r);
    return (char *)(r && r->prompt ? r->prompt : "");
}

/* One character for libedit: waits on stdin and the interrupt pipe, so that
 * Ctrl-C makes el_gets return (1: a character, 0: end of input, -1: Ctrl-C
 * or an error). */
static int read_char(EditLine *el, wchar_t *wc)
{
    (void)el;
    mbstate_t st;
    memset(&st, 0, sizeof st);
    for (;;) {
        struct pollfd p[2] = {{STDIN_FILENO, POLLIN, 0}, {g_wake[0], POLLIN, 0}};
        if (g_interrupted)
            return -1;
        int k = poll(p, 2, -1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 || g_interrupted || (p[1].revents & POLLIN))
            return -1;
        if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        char c;
        ssize_t n = read(STDIN_FILENO, &c, 1);
        if (n == 0)
            return 0;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -1;
        }
        size_t used = mbrtowc(wc, &c, 1, &st);
        if (used == (size_t)-2)
            continue;   /* the middle of a UTF-8 sequence */
        if (used == (size_t)-1)
            *wc = (wchar_t)(unsigned char)c;
        return 1;
    }
}

/* Model text is UTF-8: edit in a UTF-8 locale even when the environment
 * names none (only the character type category changes). */
static void utf8_ctype(void)
{
    const char *l = setlocale(LC_CTYPE, "");
    if (!l || strcmp(nl_langinfo(CODESET), "UTF-8") != 0)
        setlocale(LC_CTYPE, "C.UTF-8");
}

static int open_editor(repl *r)
{
    utf8_ctype();
    r->el = el_init("mlxcel", stdin, stderr, stderr);
    r->hist = history_init();
    if (!r->el || !r->hist)
        return -1;
    HistEvent ev;
    history(r->hist, &ev, H_SETSIZE, 1000);
    history(r->hist, &ev, H_SETUNIQUE, 1);
    if (r->history_path)
        history(r->hist, &ev, H_LOAD, r->history_path);   /* absent on first use */
    el_set(r->el, EL_CLIENTDATA, r);
    el_set(r->el, EL_PROMPT, prompt_of);
    el_set(r->el, EL_EDITOR, "emacs");
    el_set(r->el, EL_HIST, history, r->hist);
    el_set(r->el, EL_GETCFN, read_char);
    el_source(r->el, NULL);   /* the user's ~/.editrc, if any */
    return 0;
}

repl *repl_open(const char *history_path)
{
    repl *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    if (history_path && !(r->history_path = strdup(history_path))) {
        free(r);
        return NULL;
    }
    const int tty = isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
    if (pipe(g_wake) == 0) {
        for (int i = 0; i < 2; i++)
            fcntl(g_wake[i], F_SETFL, fcntl(g_wake[i], F_GETFL) | O_NONBLOCK);
    }
    if (tty && (g_wake[0] < 0 || open_editor(r))) {
        repl_close(r);
        return NULL;
    }
    g_interrupted = 0;
    g_quit_on_int = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &r->old_int);
    return r;
}

void repl_close(repl *r)
{
    if (!r)
        return;
    sigaction(SIGINT, &r->old_int, NULL);
    if (r->hist) {
        HistEvent ev;
        if (r->history_path && r->el)
            history(r->hist, &ev, H_SAVE, r->history_path);
        history_end(r->hist);
    }
    if (r->el)
        el_end(r->el);
    for (int i = 0; i < 2; i++) {
        if (g_wake[i] >= 0)
            close(g_wake[i]);
        g_wake[i] = -1;
    }
    free(r->history_path);
    free(r->line);
    free(r);
}

int repl_is_tty(const repl *r) { return r->el != NULL; }

static int keep_line(repl *r, const char *s, size_t n)
{
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r'))
        n--;
    if (n + 1 > r->cap) {
        char *t = realloc(r->line, n + 1);
        if (!t)
            return REPL_ERROR;
        r->line = t;
        r->cap = n + 1;
    }
    memcpy(r->line, s, n);
    r->line[n] = 0;
    return REPL_LINE;
}

int repl_read(repl *r, const char *prompt, const char **line)
{
    *line = NULL;
    if (!r->el) {
        /* a pipe: Ctrl-C while waiting here ends the process */
        g_quit_on_int = 1;
        char *buf = NULL;
        size_t cap = 0;
        ssize_t n = getline(&buf, &cap, stdin);
        g_quit_on_int = 0;
        int rc = n < 0 ? REPL_EOF : keep_line(r, buf, (size_t)n);
        free(buf);
        if (rc == REPL_LINE)
            *line = r->line;
        return rc;
    }
    repl_clear_interrupt();
    r->prompt = prompt;
    el_resize(r->el);   /* the terminal may have changed size during a reply */
    int count = 0;
    const char *s = el_gets(r->el, &count);
    if (g_interrupted) {
        repl_clear_interrupt();
        el_reset(r->el);
        return REPL_INTERRUPT;
    }
    if (!s || count <= 0)
        return count < 0 ? REPL_ERROR : REPL_EOF;
    int rc = keep_line(r, s, (size_t)count);
    if (rc == REPL_LINE)
        *line = r->line;
    return rc;
}

void repl_remember(repl *r, const char *line)
{
    if (!r->hist || !*line)
        return;
    HistEvent ev;
    history(r->hist, &ev, H_ENTER, line);
}
