/* args.c - option parsing helpers for the subcommands. */
#include "cli/args.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int arg_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "mlxcel: %s: '%s' is not an integer in [%ld, %ld]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int arg_float(const char *opt, const char *s, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "mlxcel: %s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

int arg_ids(const char *opt, const char *s, int32_t **ids, int *n)
{
    size_t cap = 16, cnt = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v)
        return -1;
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX ||
            (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n')) {
            fprintf(stderr, "mlxcel: %s: '%s' is not a list of token ids (decimal, comma or space separated)\n",
                    opt, s);
            free(v);
            return -1;
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
            cap *= 2;
        }
        v[cnt++] = (int32_t)x;
        p = end;
    }
    if (!cnt) {
        fprintf(stderr, "mlxcel: %s: no token ids given\n", opt);
        free(v);
        return -1;
    }
    *ids = v;
    *n = (int)cnt;
    return 0;
}

const char *arg_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "mlxcel: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

char *arg_read_text(const char *opt, const char *path)
{
    const int is_stdin = !strcmp(path, "-");
    const char *name = is_stdin ? "standard input" : path;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "mlxcel: %s %s: %s\n", opt, path, strerror(errno));
        return NULL;
    }
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap);
    int err = !buf;
    while (!err) {
        if (n + 1 == cap) {
            char *nb = cap < ((size_t)1 << 30) ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                err = ENOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) {
            if (ferror(f))
                err = errno ? errno : EIO;
            break;
        }
    }
    if (!is_stdin)
        fclose(f);
    if (err) {
        fprintf(stderr, "mlxcel: %s %s: %s\n", opt, name, strerror(err));
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (strlen(buf) != n) {
        fprintf(stderr, "mlxcel: %s %s: the text has a NUL byte at offset %zu\n", opt, name, strlen(buf));
        free(buf);
        return NULL;
    }
    if (n && buf[n - 1] == '\n')
        buf[--n] = 0;
    if (n && buf[n - 1] == '\r')
        buf[--n] = 0;
    return buf;
}

/* Optimal string alignment distance: insertions, deletions, substitutions
 * and transpositions of neighbours each cost one ("--tmep" is one typo). */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return (size_t)-1;
    size_t d[65][65];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

const char *arg_closest(const char *word, const char *const *cands, size_t n)
{
    const char *best = NULL, *prefix_of = NULL;
    size_t best_d = (size_t)-1, n_prefix = 0;
    size_t wl = strlen(word), core = wl;
    for (const char *p = word; *p == '-' || *p == '/'; p++)
        core--;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(word, cands[i]);
        if (d < best_d) {
            best_d = d;
            best = cands[i];
        }
        if (core >= 3 && !strncmp(cands[i], word, wl) && cands[i][wl]) {
            prefix_of = cands[i];
            n_prefix++;
        }
    }
    /* a typo changes a few characters: allow more in longer words */
    size_t allowed = core <= 4 ? 1 : core <= 8 ? 2 : 3;
    if (best && best_d && best_d <= allowed)
        return best;
    /* "--max" for "--max-tokens": an abbreviation of exactly one option */
    return n_prefix == 1 ? prefix_of : NULL;
}

/* The option names a help text mentions: words that start with - or -- at
 * the start of a line or after a space, comma, bracket or bar. */
static size_t help_options(const char *text, char ***out)
{
    size_t n = 0, cap = 0;
    char **v = NULL;
    for (const char *p = text; *p; p++) {
        if (*p != '-' || (p > text && !strchr(" \t\n,([|", p[-1])))
            continue;
        const char *s = p, *q = p + 1 + (p[1] == '-');
        if (!isalpha((unsigned char)*q))
            continue;
        while (isalnum((unsigned char)*q) || *q == '-')
            q++;
        size_t len = (size_t)(q - s);
        int dup = 0;
        for (size_t i = 0; i < n && !dup; i++)
            dup = strlen(v[i]) == len && !strncmp(v[i], s, len);
        if (!dup && n == cap) {
            char **nv = realloc(v, (cap = cap ? 2 * cap : 32) * sizeof *v);
            if (!nv)
                break;
            v = nv;
        }
        if (!dup && (v[n] = strndup(s, len)))
            n++;
        p = q - 1;
    }
    *out = v;
    return n;
}

int arg_unknown(const char *cmd, const char *arg, void (*help)(FILE *))
{
    if (arg[0] != '-' || !arg[1]) {
        fprintf(stderr, "mlxcel %s: unexpected argument '%s' (options come with a name, e.g. -p TEXT; "
                        "see --help)\n", cmd, arg);
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f) {
        help(f);
        fclose(f);
    }
    char **opts = NULL;
    size_t n = text ? help_options(text, &opts) : 0;
    const char *near = arg_closest(arg, (const char *const *)opts, n);
    if (near)
        fprintf(stderr, "mlxcel %s: unknown option '%s' (did you mean '%s'?)\n", cmd, arg, near);
    else
        fprintf(stderr, "mlxcel %s: unknown option '%s' (see --help)\n", cmd, arg);
    for (size_t i = 0; i < n; i++)
        free(opts[i]);
    free(opts);
    free(text);
    return 2;
}
