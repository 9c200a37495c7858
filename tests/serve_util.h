/* Helpers for the q3 serve tests: start `q3 serve` on a free loopback port,
 * raw HTTP/1.1 requests over a socket (chunked bodies decoded), SSE events,
 * a /metrics value, a node --test file run against the server. */
#ifndef Q3_TESTS_SERVE_UTIL_H
#define Q3_TESTS_SERVE_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

typedef struct test_server {
    pid_t pid;
    int port;
    int admin_port; /* --admin-port's listener, 0 if none */
    FILE *err;    /* the server's stderr */
} test_server;

static inline double ts_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Starts $BUILD/q3 serve with extra args (NULL-terminated), port 0, and reads
 * the port from its first stderr line. 0 on success. */
static inline int ts_start(test_server *s, const char *const *extra)
{
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char exe[256];
    snprintf(exe, sizeof exe, "%s/q3", build);
    memset(s, 0, sizeof *s);
    int p[2];
    if (pipe(p)) return -1;
    const char *argv[64];
    int n = 0;
    argv[n++] = exe;
    argv[n++] = "serve";
    argv[n++] = "--port";
    argv[n++] = "0";
    int log_given = 0;
    for (int i = 0; extra[i] && n < 60; i++) {
        log_given |= !strcmp(extra[i], "--log-format");
        argv[n++] = extra[i];
    }
    /* no access log unless a test asks: nobody reads the pipe after start-up */
    if (!log_given) argv[n++] = "--log-format", argv[n++] = "none";
    argv[n] = NULL;
    s->pid = fork();
    if (s->pid < 0) return -1;
    if (s->pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    s->err = fdopen(p[0], "r");
    char line[512];
    s->port = 0;
    while (fgets(line, sizeof line, s->err)) {
        const char *h = strstr(line, "listening on http://127.0.0.1:");
        if (h) {
            s->port = atoi(h + strlen("listening on http://127.0.0.1:"));
            const char *a = strstr(line, "also on http://127.0.0.1:");
            if (a) s->admin_port = atoi(a + strlen("also on http://127.0.0.1:"));
            break;
        }
        fprintf(stderr, "server: %s", line);
    }
    return s->port > 0 ? 0 : -1;
}

/* Reads the server's stderr until a line containing `what` (or EOF). */
static inline int ts_wait_line(test_server *s, const char *what)
{
    char line[512];
    while (fgets(line, sizeof line, s->err))
        if (strstr(line, what)) return 0;
    return -1;
}

/* Sends SIGTERM and waits; returns the exit status (or -1). */
static inline int ts_stop(test_server *s)
{
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 600; i++) { /* 30 s at most */
        pid_t r = waitpid(s->pid, &st, WNOHANG);
        if (r == s->pid) {
            if (s->err) fclose(s->err);
            s->err = NULL;
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(50000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    return -1;
}

static inline int ts_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 60};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return -1; }
    return fd;
}

/* A connection whose reads give up after `seconds` (a hang shows as a failed check, not a stuck test). */
static inline int ts_connect_timeout(int port, int seconds)
{
    int fd = ts_connect(port);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = seconds};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static inline int ts_send_all(int fd, const char *buf, size_t n)
{
    while (n) {
        ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Sends a request (Connection: close). extra_headers: "" or lines ending in \r\n. */
static inline int ts_send_request(int fd, const char *method, const char *path, const char *extra_headers, const char *body)
{
    size_t bl = body ? strlen(body) : 0;
    size_t hl = strlen(extra_headers) + 256 + strlen(path);
    char *h = malloc(hl);
    snprintf(h, hl, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%zu\r\n\r\n", method, path,
             extra_headers, body ? "Content-Type: application/json\r\nContent-Length: " : "Content-Length: ", bl);
    int r = ts_send_all(fd, h, strlen(h));
    free(h);
    if (!r && bl) r = ts_send_all(fd, body, bl);
    return r;
}

typedef struct ts_resp {
    int status;
    char *head;   /* status line and headers */
    char *body;   /* decoded (chunked transfer removed), NUL-terminated */
    size_t len;
} ts_resp;

static inline void ts_resp_free(ts_resp *r) { free(r->head); free(r->body); memset(r, 0, sizeof *r); }

/* Reads a whole response until the server closes. */
static inline int ts_read_response(int fd, ts_resp *r)
{
    memset(r, 0, sizeof *r);
    size_t cap = 1 << 16, len = 0;
    char *raw = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) raw = realloc(raw, cap *= 2);
        ssize_t n = recv(fd, raw + len, cap - len - 1, 0);
        if (n <= 0) break;
        len += (size_t)n;
    }
    raw[len] = 0;
    char *sep = strstr(raw, "\r\n\r\n");
    if (!sep) { free(raw); return -1; }
    *sep = 0;
    r->head = strdup(raw);
    sscanf(raw, "HTTP/1.%*d %d", &r->status);
    const char *b = sep + 4;
    size_t bl = len - (size_t)(b - raw);
    r->body = malloc(bl + 1);
    if (strcasestr(r->head, "transfer-encoding: chunked")) {
        size_t o = 0;
        const char *p = b, *end = b + bl;
        while (p < end) {
            char *e;
            unsigned long n = strtoul(p, &e, 16);
            const char *crlf = strstr(p, "\r\n");
            if (!crlf || n == 0) break;
            p = crlf + 2;
            if (p + n > end) n = (unsigned long)(end - p);
            memcpy(r->body + o, p, n);
            o += n;
            p += n + 2;
        }
        r->len = o;
    } else {
        memcpy(r->body, b, bl);
        r->len = bl;
    }
    r->body[r->len] = 0;
    free(raw);
    return 0;
}

static inline int ts_request(int port, const char *method, const char *path, const char *headers, const char *body, ts_resp *r)
{
    int fd = ts_connect(port);
    if (fd < 0) { memset(r, 0, sizeof *r); return -1; }
    int rc = ts_send_request(fd, method, path, headers ? headers : "", body);
    if (!rc) rc = ts_read_response(fd, r);
    else memset(r, 0, sizeof *r);
    close(fd);
    return rc;
}

/* The value of metric `name` (a line "name value" or "name{labels} value")
 * in a Prometheus text body; -1 if absent. */
static inline double ts_metric(const char *text, const char *name)
{
    const char *p = text;
    size_t n = strlen(name);
    while (p && (p = strstr(p, name))) {
        if ((p == text || p[-1] == '\n') && (p[n] == '{' || p[n] == ' ')) {
            const char *sp = p[n] == '{' ? strchr(strchr(p, '}'), ' ') : strchr(p, ' ');
            return sp ? atof(sp + 1) : -1;
        }
        p += n;
    }
    return -1;
}

/* Runs `node --test` on one file with the environment `env` (e.g.
 * "Q3_BASE_URL=... Q3_API_KEY=..."), a 120 s limit, and counts its tests
 * into this program's: every node test passed or failed is one CHECK. Its
 * failing lines go to stderr. A missing openai client (make deps installs
 * it) is a failure, never a skip. */
static inline void ts_node_test(const char *env, const char *file)
{
    if (access("tests/openai/node_modules/openai/package.json", R_OK)) {
        fprintf(stderr, "tests/openai/node_modules/openai is missing: run `make deps` (npm ci in tests/openai)\n");
        CHECK(0, "the openai npm client is installed");
        return;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s timeout 120 node --test --test-reporter=tap %s 2>&1", env, file);
    FILE *p = popen(cmd, "r");
    int pass = -1, fail = -1;
    char line[1024];
    while (p && fgets(line, sizeof line, p)) {
        if (!strncmp(line, "# pass ", 7)) pass = atoi(line + 7);
        else if (!strncmp(line, "# fail ", 7)) fail = atoi(line + 7);
        if (strstr(line, "not ok") || strstr(line, "Error") || strstr(line, "expected") || strstr(line, "actual")) fputs(line, stderr);
    }
    int rc = p ? pclose(p) : -1;
    CHECK(pass > 0 && fail == 0 && rc == 0, "node --test %s: %d passed, %d failed, exit %d", file, pass, fail, rc);
    if (pass > 0) test_passed += pass - 1; /* the CHECK above stands for the first */
    if (fail > 0) test_failed += fail - 1;
}

#endif
