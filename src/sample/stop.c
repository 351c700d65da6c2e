/* stop.c - stop strings over streamed text.
 *
 * Invariant: the held-back text is the longest suffix of what was fed that
 * is still a proper prefix of some stop string.  Everything before it can
 * never become part of a match (a match starting earlier would make a longer
 * such suffix), so it is emitted at once.  When a stop string completes, the
 * text before its start is emitted and the rest is dropped.  Since stop
 * strings are valid UTF-8 and a held suffix starts where a stop starts, the
 * split always falls on a character boundary. */
#include "sample/sample.h"

#include <stdlib.h>
#include <string.h>

struct mx_stopper {
    char **stops;
    size_t *lens;
    size_t n;
    char *held;       /* pending text (not NUL-terminated) */
    size_t nheld, cap;
    int stopped;
};

mx_stopper *mx_stopper_new(const char *const *stops, size_t n)
{
    mx_stopper *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    if (n) {
        s->stops = calloc(n, sizeof *s->stops);
        s->lens = calloc(n, sizeof *s->lens);
        if (!s->stops || !s->lens) {
            mx_stopper_free(s);
            return NULL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0])   /* an empty stop would match anywhere */
            continue;
        s->stops[s->n] = strdup(stops[i]);
        if (!s->stops[s->n]) {
            mx_stopper_free(s);
            return NULL;
        }
        s->lens[s->n] = strlen(stops[i]);
        s->n++;
    }
    return s;
}

void mx_stopper_free(mx_stopper *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(s->stops[i]);
    free(s->stops);
    free(s->lens);
    free(s->held);
    free(s);
}

static int emit(const char *p, size_t n, char **out, size_t *outlen)
{
    char *b = malloc(n + 1);
    if (!b) {
        *out = NULL;
        *outlen = 0;
        return -1;
    }
    if (n)
        memcpy(b, p, n);
    b[n] = 0;
    *out = b;
    *outlen = n;
    return 0;
}

/* Earliest start of a complete stop string in h[0..n), or n if none. */
static size_t find_stop(const mx_stopper *s, const char *h, size_t n)
{
    size_t best = n;
    for (size_t i = 0; i < s->n; i++) {
        size_t L = s->lens[i];
        if (L > n)
            continue;
        for (size_t at = 0; at + L <= n && at < best; at++)
            if (h[at] == s->stops[i][0] && memcmp(h + at, s->stops[i], L) == 0) {
                best = at;
                break;
            }
    }
    return best;
}

/* Length of the longest suffix of h[0..n) that is a proper prefix of a stop. */
static size_t held_suffix(const mx_stopper *s, const char *h, size_t n)
{
    size_t best = 0;
    for (size_t i = 0; i < s->n; i++) {
        size_t L = s->lens[i] - 1;   /* proper prefix */
        if (L > n)
            L = n;
        for (size_t k = L; k > best; k--)
            if (memcmp(h + n - k, s->stops[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

int mx_stopper_feed(mx_stopper *s, const char *text, size_t len, char **out, size_t *outlen)
{
    if (s->stopped) {
        emit("", 0, out, outlen);
        return 1;
    }
    if (s->nheld + len > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < s->nheld + len)
            cap *= 2;
        char *nb = realloc(s->held, cap);
        if (!nb) {   /* out of memory: pass the text through unfiltered */
            emit(text, len, out, outlen);
            return 0;
        }
        s->held = nb;
        s->cap = cap;
    }
    if (len)
        memcpy(s->held + s->nheld, text, len);
    s->nheld += len;

    size_t at = find_stop(s, s->held, s->nheld);
    if (at < s->nheld) {
        emit(s->held, at, out, outlen);
        s->nheld = 0;
        s->stopped = 1;
        return 1;
    }
    size_t keep = held_suffix(s, s->held, s->nheld);
    size_t give = s->nheld - keep;
    emit(s->held, give, out, outlen);
    memmove(s->held, s->held + give, keep);
    s->nheld = keep;
    return 0;
}

void mx_stopper_flush(mx_stopper *s, char **out, size_t *outlen)
{
    emit(s->held ? s->held : "", s->nheld, out, outlen);
    s->nheld = 0;
}
