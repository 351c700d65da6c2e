/* test_server_hostile.c - 1000 malformed or hostile requests against a real
 * `mlxcel serve` on 127.0.0.1: mutated and mistyped JSON, garbage bytes
 * instead of HTTP, huge bodies (announced and chunked), dropped and
 * half-sent connections, generations abandoned mid-way, slow clients that
 * never finish their headers.  Every answer must be a 4xx (a few request
 * kinds may also be dropped or, when the mutated body is still valid, 200);
 * never a 5xx, never a crash, and /health and a real generation still work
 * afterwards.  The server must then exit 0 on SIGTERM, which in the ASan
 * build also means no leak and no memory error.
 *
 * Needs MLXCEL_BIN and MLXCEL_FIXTURES (skips without the latter). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

static double mx_test_now(void);
static int g_port;
static unsigned long long g_rng = 0x5eed1234abcdULL;
static int n_sent;

/* ---- a tiny HTTP client over raw sockets ---- */

static int conn_open(int timeout_s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Reads until EOF (requests say Connection: close) and returns the status,
 * 0 when the server closed without answering, -1 on a timeout.  The body
 * goes to out (NUL-terminated, truncated) when given. */
static int read_status(int fd, char *out, size_t cap)
{
    char buf[65536];
    size_t n = 0;
    for (;;) {
        ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (k == 0)
            break;
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == ECONNRESET)
                break;
            return -1;
        }
        n += (size_t)k;
        if (n == sizeof buf - 1)
            n = 1024;            /* keep the head, drop the rest */
    }
    buf[n] = 0;
    int st = 0;
    if (n >= 12 && !strncmp(buf, "HTTP/1.", 7))
        st = atoi(buf + 9);
    if (out) {
        const char *b = strstr(buf, "\r\n\r\n");
        snprintf(out, cap, "%s", b ? b + 4 : "");
    }
    return st;
}

static int http(const char *method, const char *path, const char *extra, const char *body,
                size_t blen, char *out, size_t cap)
{
    int fd = conn_open(60);
    if (fd < 0)
        return -2;
    size_t hcap = (extra ? strlen(extra) : 0) + 1024;
    char *head = malloc(hcap);
    if (!head) {
        close(fd);
        return -2;
    }
    int hn = snprintf(head, hcap,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, extra ? extra : "", blen);
    int st = -2;
    if (send_all(fd, head, (size_t)hn) == 0 && (!blen || send_all(fd, body, blen) == 0))
        st = read_status(fd, out, cap);
    else
        st = read_status(fd, out, cap);  /* the server may have answered early (413) */
    free(head);
    close(fd);
    n_sent++;
    return st;
}

static int post(const char *path, const char *body)
{
    return http("POST", path, NULL, body, strlen(body), NULL, 0);
}

/* ---- the server process ---- */

static pid_t g_pid;
static int g_errfd = -1;

static void *drain(void *arg)
{
    (void)arg;
    char buf[4096];
    ssize_t k;
    while ((k = read(g_errfd, buf, sizeof buf)) > 0)
        if (getenv("MLXCEL_SERVER_LOG") || memmem(buf, (size_t)k, "ERROR", 5) ||
            memmem(buf, (size_t)k, "runtime error", 13))
            fwrite(buf, 1, (size_t)k, stderr);
    return NULL;
}

static int start_server(const char *bin, const char *model)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    g_pid = fork();
    if (g_pid < 0)
        return -1;
    if (g_pid == 0) {
        setenv("OMP_WAIT_POLICY", "passive", 0);   /* spinning OpenMP workers crawl on shared CPUs */
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execl(bin, bin, "serve", "-m", model, "--port", "0", "--ctx-size", "256", "--parallel", "2",
              "--queue", "4", "--timeout", "2", "--max-conns", "48", "--n-predict", "8", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    /* the first line names the port */
    char line[512];
    size_t n = 0;
    while (n + 1 < sizeof line) {
        ssize_t k = read(p[0], line + n, 1);
        if (k <= 0)
            break;
        if (line[n++] == '\n')
            break;
    }
    line[n] = 0;
    const char *u = strstr(line, "http://127.0.0.1:");
    if (!u) {
        fprintf(stderr, "server did not start: %s\n", line);
        return -1;
    }
    g_port = atoi(u + 17);
    g_errfd = p[0];
    pthread_t th;
    pthread_create(&th, NULL, drain, NULL);
    pthread_detach(th);
    return 0;
}

/* ---- request families ---- */

static const char *valid_bodies[] = {
    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi there\"}], \"max_tokens\": 2, \"temperature\": 0}",
    "{\"prompt\": \"Once upon\", \"max_tokens\": 2, \"stop\": [\"a\", \"b\"], \"stream\": true}",
    "{\"content\": \"Hello world\"}",
    "{\"tokens\": [9707, 1879]}",
};
static const char *valid_paths[] = {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"};

static int is_4xx(int st) { return st >= 400 && st < 500; }

/* Random byte-level damage to a valid body. */
static void mutated(void)
{
    int which = (int)(test_rand_u64(&g_rng) % 4);
    char body[1024];
    size_t n = strlen(valid_bodies[which]);
    memcpy(body, valid_bodies[which], n + 1);
    int kind = (int)(test_rand_u64(&g_rng) % 3);
    if (kind == 0) {
        n = test_rand_u64(&g_rng) % n;   /* truncate */
    } else {
        int k = 1 + (int)(test_rand_u64(&g_rng) % 4);
        for (int i = 0; i < k; i++)
            body[test_rand_u64(&g_rng) % n] = (char)(test_rand_u64(&g_rng) & 0xff);
    }
    body[n] = 0;
    cJSON *j = cJSON_ParseWithLength(body, n);
    int valid = j != NULL;
    cJSON_Delete(j);
    int st = http("POST", valid_paths[which], NULL, body, n, NULL, 0);
    /* still-valid JSON may be a fine request; invalid JSON must be a 400 */
    CHECKF(valid ? (st == 200 || is_4xx(st) || st == 503) : st == 400, "mutated body -> %d", st);
}

static const char *bad_fields[] = {
    "\"max_tokens\": -5", "\"max_tokens\": 0", "\"max_tokens\": 1e300", "\"max_tokens\": \"x\"",
    "\"max_tokens\": [1]", "\"max_tokens\": 100000000", "\"temperature\": -1",
    "\"temperature\": {}", "\"top_p\": 1.5", "\"top_k\": -2", "\"top_k\": 0.5", "\"min_p\": null, \"seed\": \"s\"",
    "\"stop\": {}", "\"stop\": [1, 2]", "\"stop\": [\"\"]", "\"stream\": 1", "\"stream_options\": 3",
    "\"stream_options\": {\"include_usage\": \"yes\"}", "\"n\": 17", "\"model\": 7",
    "\"logit_bias\": {\"x\": 1}", "\"frequency_penalty\": 9", "\"logprobs\": \"x\"",
    "\"model\": \"no-such-model\"", "\"repeat_penalty\": 0",
    "\"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]",
};
static const char *bad_chat[] = {
    "\"messages\": null", "\"messages\": {}", "\"messages\": [1]", "\"messages\": [{}]",
    "\"messages\": [{\"role\": \"user\"}], \"x\": 1, \"messages\": 5",
    "\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]",
    "\"messages\": [{\"role\": \"user\", \"content\": [5]}]",
    "\"messages\": [{\"role\": \"\", \"content\": \"x\"}]",
    "\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]",
};
static const char *bad_prompt[] = {
    "\"prompt\": null", "\"prompt\": {}", "\"prompt\": [\"a\", 5]", "\"prompt\": [[1], [\"a\"]]",
    "\"prompt\": [1.5]", "\"prompt\": [-1]", "\"prompt\": [1, \"a\"]", "\"prompt\": []", "\"prompt\": true",
};

static void wrong_types(int i)
{
    char body[2048];
    const char *f = bad_fields[i % (sizeof bad_fields / sizeof *bad_fields)];
    int st;
    if (i % 3 == 0) {
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s}", f);
        st = post("/v1/chat/completions", body);
    } else if (i % 3 == 1) {
        snprintf(body, sizeof body, "{\"prompt\": \"x\", %s}", f);
        st = post("/v1/completions", body);
    } else if (i % 2) {
        snprintf(body, sizeof body, "{%s, \"max_tokens\": 1}", bad_chat[i % (sizeof bad_chat / sizeof *bad_chat)]);
        st = post("/v1/chat/completions", body);
    } else {
        snprintf(body, sizeof body, "{%s, \"max_tokens\": 1}", bad_prompt[i % (sizeof bad_prompt / sizeof *bad_prompt)]);
        st = post("/v1/completions", body);
    }
    CHECKF(is_4xx(st), "%s -> %d", body, st);
}

/* Random bytes instead of an HTTP request: a 4xx or a closed connection. */
static void garbage(void)
{
    int fd = conn_open(10);
    if (fd < 0) {
        CHECK(0);
        return;
    }
    char buf[2048];
    size_t n = 1 + test_rand_u64(&g_rng) % sizeof buf;
    for (size_t i = 0; i < n; i++)
        buf[i] = (char)(test_rand_u64(&g_rng) & 0xff);
    if (test_rand_u64(&g_rng) & 1)
        memcpy(buf + n - (n > 4 ? 4 : n), "\r\n\r\n", n > 4 ? 4 : n);
    send_all(fd, buf, n);
    shutdown(fd, SHUT_WR);
    int st = read_status(fd, NULL, 0);
    close(fd);
    n_sent++;
    CHECKF(st == 0 || is_4xx(st), "garbage -> %d", st);
}

static void huge(int i)
{
    int st;
    if (i % 3 == 0) {
        /* announced, never sent: answered before the body */
        int fd = conn_open(10);
        const char *h = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                        "Content-Length: 1000000000000\r\n\r\n{\"prompt\":";
        send_all(fd, h, strlen(h));
        st = read_status(fd, NULL, 0);
        close(fd);
        n_sent++;
        CHECKF(st == 413, "huge announced -> %d", st);
    } else if (i % 3 == 1) {
        size_t n = (1u << 20) + 100 + test_rand_u64(&g_rng) % 100000;
        char *b = malloc(n);
        memset(b, 'a', n);
        st = http("POST", "/v1/chat/completions", NULL, b, n, NULL, 0);
        free(b);
        CHECKF(st == 413 || st == 0, "huge body -> %d", st);
    } else {
        /* chunked, unannounced, over the limit: dropped */
        int fd = conn_open(10);
        const char *h = "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        send_all(fd, h, strlen(h));
        static char chunk[65536 + 16];
        int hl = snprintf(chunk, 16, "10000\r\n");
        memset(chunk + hl, 'x', 65536);
        memcpy(chunk + hl + 65536, "\r\n", 2);
        for (int k = 0; k < 24; k++)
            if (send_all(fd, chunk, (size_t)hl + 65536 + 2))
                break;
        st = read_status(fd, NULL, 0);
        close(fd);
        n_sent++;
        CHECKF(st == 0 || st == 413 || st == -1, "huge chunked -> %d", st);
    }
}

/* Connections that end early at every stage. */
static void dropped(int i)
{
    int fd = conn_open(10);
    if (fd < 0) {
        CHECK(0);
        return;
    }
    static const char *parts[] = {
        "",
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"messages\": [",
        "GET /health HTTP/1.1\r\nHo",
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
    };
    const char *p = parts[i % 5];
    send_all(fd, p, strlen(p));
    if (i & 1)
        shutdown(fd, SHUT_WR);
    close(fd);
    n_sent++;
    CHECK(1);
}

/* Real generations abandoned at once or after the first bytes: the server
 * must cancel them and free their state. */
static void abandoned(int i)
{
    int fd = conn_open(30);
    if (fd < 0) {
        CHECK(0);
        return;
    }
    char body[256], req[512];
    int bn = snprintf(body, sizeof body,
                      "{\"messages\": [{\"role\": \"user\", \"content\": \"story %d\"}], \"max_tokens\": 40%s}", i,
                      i % 2 ? ", \"stream\": true" : "");
    int rn = snprintf(req, sizeof req, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                       "Content-Length: %d\r\n\r\n%s", bn, body);
    send_all(fd, req, (size_t)rn);
    if (i % 4 == 1) {
        char b[64];
        recv(fd, b, sizeof b, 0);   /* the first bytes of the stream */
    }
    close(fd);
    n_sent++;
    CHECK(1);
}

/* Slow clients: headers trickle in and stop; the idle timeout (2 s) must
 * close them.  Done in parallel so it costs one timeout. */
static void slow_batch(int n)
{
    int fds[32];
    for (int i = 0; i < n; i++) {
        fds[i] = conn_open(10);
        if (fds[i] >= 0)
            send_all(fds[i], "POST /v1/completions HTTP/1.1\r\nHost:", 36);
    }
    sleep(1);
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            send_all(fds[i], " x\r\n", 4);
    double t0 = mx_test_now();
    for (int i = 0; i < n; i++) {
        if (fds[i] < 0) {
            CHECK(0);
            continue;
        }
        int st = read_status(fds[i], NULL, 0);
        close(fds[i]);
        n_sent++;
        CHECKF(st == 0 || is_4xx(st), "slow client -> %d", st);
    }
    CHECKF(mx_test_now() - t0 < 9, "slow clients closed after %.1f s", mx_test_now() - t0);
}

/* Odd but complete requests. */
static void oddities(int i)
{
    char out[256];
    int st;
    double t0 = mx_test_now();
    switch (i % 10) {
    case 0: {
        size_t n = 200000;
        char *b = malloc(n + 1);
        for (size_t k = 0; k < n; k++)
            b[k] = k < n / 2 ? '[' : ']';
        b[n] = 0;
        st = http("POST", "/v1/chat/completions", NULL, b, n, NULL, 0);
        free(b);
        CHECKF(st == 400, "deep nesting -> %d", st);
        break;
    }
    case 1:
        st = post("/v1/completions", "{\"prompt\": \"\xff\xfe bad utf8\", \"max_tokens\": 1}");
        CHECKF(is_4xx(st), "invalid utf-8 -> %d", st);
        break;
    case 2: {
        char h[20000];
        memcpy(h, "X-Long: ", 8);
        memset(h + 8, 'y', sizeof h - 11);
        memcpy(h + sizeof h - 3, "\r\n", 3);
        st = http("GET", "/health", h, "", 0, NULL, 0);
        CHECKF(st == 200 || is_4xx(st) || st == 0, "long header -> %d", st);
        break;
    }
    case 3:
        st = http("DELETE", "/v1/models", NULL, "", 0, out, sizeof out);
        CHECKF(st == 405, "DELETE -> %d", st);
        break;
    case 4:
        st = http("GET", "/../../etc/passwd", NULL, "", 0, out, sizeof out);
        CHECKF(st == 404, "traversal -> %d", st);
        break;
    case 5:
        st = post("/detokenize", "{\"tokens\": [99999999]}");
        CHECKF(st == 400, "detokenize out of range -> %d", st);
        break;
    case 6:
        st = post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]} trailing");
        CHECKF(st == 400, "trailing data -> %d", st);
        break;
    case 7:
        st = post("/v1/chat/completions", "");
        CHECKF(st == 400, "empty body -> %d", st);
        break;
    case 8: {
        int fd = conn_open(10);
        const char *r = "GET /health HTTP/9.9\r\nHost: x\r\n\r\n";
        send_all(fd, r, strlen(r));
        st = read_status(fd, NULL, 0);
        close(fd);
        n_sent++;
        CHECKF(st == 0 || is_4xx(st) || st == 505, "HTTP/9.9 -> %d", st);
        break;
    }
    default: {
        char path[64] = "/v1/";
        for (int k = 4; k < 40; k++)
            path[k] = (char)('!' + test_rand_u64(&g_rng) % 90);
        path[40] = 0;
        for (int k = 0; k < 40; k++)
            if (path[k] == '?' || path[k] == '#' || path[k] == '%')
                path[k] = 'z';
        st = http("GET", path, NULL, "", 0, NULL, 0);
        CHECKF(st == 404 || st == 400, "random path %s -> %d", path, st);
    }
    }
    if (mx_test_now() - t0 > 0.3)
        fprintf(stderr, "  oddity %d took %.1f s\n", i % 10, mx_test_now() - t0);
}

static int health_idle(void)
{
    char out[512];
    for (int k = 0; k < 300; k++) {
        int st = http("GET", "/health", NULL, "", 0, out, sizeof out);
        n_sent--;
        if (st == 200 && strstr(out, "\"slots_busy\":0,") && strstr(out, "\"queued\":0"))
            return 1;
        usleep(100000);
    }
    fprintf(stderr, "health: %s\n", out);
    return 0;
}

static double mx_test_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void)
{
    const char *fx = test_fixtures();
    if (!fx)
        return TEST_SKIP;
    const char *bin = getenv("MLXCEL_BIN");
    if (!bin) {
        fprintf(stderr, "SKIP: MLXCEL_BIN is not set\n");
        return TEST_SKIP;
    }
    signal(SIGPIPE, SIG_IGN);
    char model[4096];
    snprintf(model, sizeof model, "%s/qwen2_moe_tiny_chat", fx);
    if (start_server(bin, model)) {
        CHECK(0);
        return test_summary();
    }
    double t0 = mx_test_now(), t = t0;
#define FAMILY(name, n, call) do { for (int i = 0; i < (n); i++) call; \
        fprintf(stderr, "  %-12s %4d  %.1f s\n", name, n, mx_test_now() - t); t = mx_test_now(); } while (0)
    FAMILY("mutated", 300, mutated());
    FAMILY("wrong types", 250, wrong_types(i));
    FAMILY("garbage", 120, garbage());
    FAMILY("huge", 30, huge(i));
    FAMILY("dropped", 150, dropped(i));
    FAMILY("abandoned", 40, abandoned(i));
    FAMILY("slow", 1, slow_batch(20));
    FAMILY("oddities", 90, oddities(i));
#undef FAMILY
    fprintf(stderr, "%d hostile requests in %.1f s\n", n_sent, mx_test_now() - t0);
    CHECKF(n_sent >= 1000, "sent %d", n_sent);

    /* still alive: idle again, healthy, and generating */
    CHECK(health_idle());
    char out[4096];
    const char *ok = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 3}";
    int st = http("POST", "/v1/chat/completions", NULL, ok, strlen(ok), out, sizeof out);
    CHECKF(st == 200 && strstr(out, "chat.completion"), "generation after the storm -> %d %s", st, out);

    kill(g_pid, SIGTERM);
    int status = 0;
    waitpid(g_pid, &status, 0);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "server exit status %d (signal %d)",
           WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return test_summary();
}
