/* q3 serve against hostile and odd clients (issue 27), over raw sockets on
 * 127.0.0.1 with the e2e golden model: header and body deadlines however the
 * bytes trickle, the per-address connection limit, the key, route, method and
 * length checked on the headers before any body byte (and before
 * `100 Continue`), HTTP framing (%00, Transfer-Encoding, two Content-Lengths,
 * HEAD, `bearer`), error bodies that stay valid JSON and UTF-8, duplicate JSON
 * keys, NUL bytes in text, /tokenize bounded, half-closed clients, a KV cache
 * smaller than the context, the admin listener, and a second SIGINT ending the
 * drain at once. Each check failed before its fix. */
#include <cjson/cJSON.h>

#include "serve_util.h"
#include "test.h"

#define MODEL TEST_DATA "/golden/e2e"
#define KEY "Authorization: Bearer k3y\r\n"

static int port;

/* Whether s[0..n) is valid UTF-8 (JSON text must be). */
static int valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t len = s[i] < 0x80 ? 1 : (s[i] & 0xe0) == 0xc0 && s[i] >= 0xc2 ? 2 : (s[i] & 0xf0) == 0xe0 ? 3
                 : (s[i] & 0xf8) == 0xf0 && s[i] <= 0xf4 ? 4 : 0;
        if (!len || i + len > n) return 0;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

/* Raw bytes in, the whole answer out (the server closes); reads give up after 5 s. */
static int raw(const char *bytes, ts_resp *r, double *seconds)
{
    memset(r, 0, sizeof *r);
    int fd = ts_connect_timeout(port, 5);
    if (fd < 0) return -1;
    double t0 = ts_now();
    int rc = ts_send_all(fd, bytes, strlen(bytes));
    if (!rc) rc = ts_read_response(fd, r);
    if (seconds) *seconds = ts_now() - t0;
    close(fd);
    return rc;
}

/* Seconds until the server closes fd, sending `drip` every 0.4 s meanwhile (at most `limit`). */
static double time_to_close(int fd, const char *drip, double limit)
{
    double t0 = ts_now();
    struct timeval tv = {.tv_sec = 0, .tv_usec = 400000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (ts_now() - t0 < limit) {
        char b[512];
        ssize_t n = recv(fd, b, sizeof b, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return ts_now() - t0;
        if (send(fd, drip, strlen(drip), MSG_NOSIGNAL) < 0) return ts_now() - t0;
    }
    return 1e9;
}


static void test_deadlines(void)
{
    /* headers trickled a line every 0.4 s: closed at the 2 s header deadline (MHD's idle timeout never fires) */
    int fd = ts_connect(port);
    ts_send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n", 31);
    double t = time_to_close(fd, "X-Slow: 1\r\n", 8);
    close(fd);
    CHECK(t > 1.5 && t < 6, "trickled headers closed at the header deadline: %.1f s", t);
    /* a body trickled a byte every 0.4 s: closed at the 2 s body deadline */
    fd = ts_connect(port);
    ts_send_all(fd, "POST /tokenize HTTP/1.1\r\nHost: x\r\n" KEY "Content-Length: 100\r\n\r\n{", 81);
    t = time_to_close(fd, " ", 8);
    close(fd);
    CHECK(t > 1.5 && t < 6, "trickled body closed at the body deadline: %.1f s", t);
    /* an idle connection that never sends a byte: the same */
    fd = ts_connect(port);
    t = time_to_close(fd, "", 8);
    close(fd);
    CHECK(t > 1.5 && t < 6, "a silent connection closed at the header deadline: %.1f s", t);
}

static void test_per_address(void)
{
    int fds[12], n_open = 0;
    for (int i = 0; i < 12; i++)
        if ((fds[i] = ts_connect(port)) >= 0) n_open++;
    usleep(200000);
    int extra = ts_connect_timeout(port, 2);
    char b[64];
    ssize_t n = extra >= 0 ? recv(extra, b, sizeof b, 0) : 0;
    CHECK(n_open == 12 && n <= 0, "the 13th connection from one address is closed at once (recv %zd)", n);
    if (extra >= 0) close(extra);
    for (int i = 0; i < 12; i++)
        if (fds[i] >= 0) close(fds[i]);
    usleep(300000);
    ts_resp r;
    ts_request(port, "GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200, "a connection again once those closed: %d", r.status);
    ts_resp_free(&r);
}

static void test_headers_first(void)
{
    ts_resp r;
    double t;
    /* no key: 401 before the body (none of it sent) */
    raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n", &r, &t);
    CHECK(r.status == 401 && t < 1.5, "401 on the headers alone: %d in %.1f s", r.status, t);
    ts_resp_free(&r);
    raw("POST /nope HTTP/1.1\r\nHost: x\r\n" KEY "Content-Length: 60000\r\n\r\n", &r, &t);
    CHECK(r.status == 404 && t < 1.5, "404 on the headers alone: %d in %.1f s", r.status, t);
    ts_resp_free(&r);
    raw("PUT /v1/completions HTTP/1.1\r\nHost: x\r\n" KEY "Content-Length: 60000\r\n\r\n", &r, &t);
    CHECK(r.status == 405 && t < 1.5, "405 on the headers alone: %d in %.1f s", r.status, t);
    ts_resp_free(&r);
    /* Expect: 100-continue with a body past --max-body: 413 and no 100 Continue */
    raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\n" KEY "Expect: 100-continue\r\nContent-Length: 2147483648\r\n\r\n", &r, &t);
    CHECK(r.status == 413 && t < 1.5 && r.head && strstr(r.body ? r.body : "", "\"error\""), "413 before 100 Continue: %d in %.1f s",
          r.status, t);
    ts_resp_free(&r);
    raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 20\r\n\r\n", &r, &t);
    CHECK(r.status == 401, "401 instead of 100 Continue: %d", r.status);
    ts_resp_free(&r);
    /* a good request with Expect gets its 100 and its answer */
    {
        int fd = ts_connect_timeout(port, 5);
        const char *body = "{\"prompt\":\"hi\"}";
        char h[256];
        snprintf(h, sizeof h, "POST /tokenize HTTP/1.1\r\nHost: x\r\n" KEY "Connection: close\r\nExpect: 100-continue\r\n"
                 "Content-Length: %zu\r\n\r\n", strlen(body));
        ts_send_all(fd, h, strlen(h));
        char b[64] = {0};
        ssize_t n = recv(fd, b, sizeof b - 1, 0);
        CHECK(n > 0 && strstr(b, "100 Continue"), "100 Continue for an accepted request: '%s'", b);
        ts_send_all(fd, body, strlen(body));
        ts_read_response(fd, &r);
        CHECK(r.status == 200, "then its answer: %d", r.status);
        ts_resp_free(&r);
        close(fd);
    }
}

static void test_framing(void)
{
    ts_resp r;
    double t;
    raw("HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &r, NULL);
    CHECK(r.status == 200, "HEAD /health: %d", r.status);
    ts_resp_free(&r);
    raw("GET /v1/models%00junk HTTP/1.1\r\nHost: x\r\n" KEY "Connection: close\r\n\r\n", &r, NULL);
    CHECK(r.status == 400, "/v1/models%%00junk: %d", r.status);
    ts_resp_free(&r);
    raw("GET /health%00/../x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &r, NULL);
    CHECK(r.status == 400, "/health%%00/../x: %d", r.status);
    ts_resp_free(&r);
    raw("POST /tokenize HTTP/1.1\r\nHost: x\r\n" KEY "Transfer-Encoding: gzip\r\n\r\n", &r, &t);
    CHECK(r.status == 501 && t < 1.5, "Transfer-Encoding: gzip: %d in %.1f s", r.status, t);
    ts_resp_free(&r);
    raw("POST /tokenize HTTP/1.1\r\nHost: x\r\n" KEY "Content-Length: 15\r\nContent-Length: 3\r\n\r\n{\"prompt\":\"hi\"}", &r, NULL);
    CHECK(r.status == 400, "two different Content-Lengths: %d", r.status);
    ts_resp_free(&r);
    ts_request(port, "POST", "/tokenize", "Authorization: bearer k3y\r\n", "{\"prompt\":\"hi\"}", &r);
    CHECK(r.status == 200, "the bearer scheme in lower case: %d", r.status);
    ts_resp_free(&r);
    ts_request(port, "POST", "/tokenize", "Authorization: Bearer wrong\r\n", "{\"prompt\":\"hi\"}", &r);
    CHECK(r.status == 401, "a wrong key still refused: %d", r.status);
    ts_resp_free(&r);
    /* a chunked body past --max-body: the connection is closed, nothing more is read */
    {
        int fd = ts_connect_timeout(port, 5);
        const char *h = "POST /tokenize HTTP/1.1\r\nHost: x\r\n" KEY "Transfer-Encoding: chunked\r\n\r\n";
        ts_send_all(fd, h, strlen(h));
        char chunk[8200];
        int k = snprintf(chunk, sizeof chunk, "2000\r\n");
        memset(chunk + k, 'a', 0x2000);
        memcpy(chunk + k + 0x2000, "\r\n", 2);
        int sent = 0, failed = 0;
        for (int i = 0; i < 12 && !failed; i++, sent++) failed = ts_send_all(fd, chunk, (size_t)k + 0x2000 + 2) != 0;
        char b[256];
        ssize_t n = recv(fd, b, sizeof b, 0);
        CHECK(n <= 0 || failed, "a chunked body past the limit ends the connection (recv %zd after %d chunks)", n, sent);
        close(fd);
    }
}

/* Error bodies are valid JSON and UTF-8, whatever the client sent. */
static void test_error_bodies(void)
{
    ts_resp r;
    ts_request(port, "POST", "/v1/completions", KEY, "{\"model\":\"\xff\xfe\",\"prompt\":\"hi\"}", &r);
    cJSON *j = cJSON_Parse(r.body);
    CHECK(r.status == 404 && j && valid_utf8((unsigned char *)r.body, r.len), "a model name \\xff\\xfe: %d %s", r.status, r.body);
    cJSON_Delete(j);
    ts_resp_free(&r);
    raw("GET /%ff%fe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &r, NULL);
    j = cJSON_Parse(r.body);
    CHECK(r.status == 404 && j && valid_utf8((unsigned char *)r.body, r.len), "GET /%%ff%%fe: %d %s", r.status, r.body);
    cJSON_Delete(j);
    ts_resp_free(&r);
    /* a name cut inside a character by the message's length limit */
    char body[512] = "{\"model\":\"";
    for (int i = 0; i < 60; i++) strcat(body, "\xc3\xa9");
    strcat(body, "\",\"prompt\":\"hi\"}");
    ts_request(port, "POST", "/v1/completions", KEY, body, &r);
    CHECK(r.status == 404 && valid_utf8((unsigned char *)r.body, r.len), "a long name cut at a character: %d", r.status);
    ts_resp_free(&r);
    ts_request(port, "POST", "/tokenize", KEY, "{\"\xff\":1}", &r);
    CHECK(r.status == 400 && valid_utf8((unsigned char *)r.body, r.len), "an unknown field \\xff: %d", r.status);
    ts_resp_free(&r);
    /* duplicate keys, at the top and inside */
    ts_request(port, "POST", "/v1/completions", KEY, "{\"prompt\":\"hi\",\"max_tokens\":1,\"max_tokens\":2}", &r);
    CHECK(r.status == 400 && strstr(r.body, "max_tokens"), "a duplicate key: %d %s", r.status, r.body);
    ts_resp_free(&r);
    ts_request(port, "POST", "/v1/chat/completions", KEY,
               "{\"messages\":[{\"role\":\"user\",\"role\":\"system\",\"content\":\"x\"}],\"max_tokens\":1}", &r);
    CHECK(r.status == 400, "a duplicate key in a message: %d", r.status);
    ts_resp_free(&r);
    ts_request(port, "POST", "/v1/completions", KEY, "{\"prompt\":\"\"}", &r);
    j = cJSON_Parse(r.body);
    const cJSON *param = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "param");
    CHECK(r.status == 400 && cJSON_IsString(param) && !strcmp(param->valuestring, "prompt"), "the empty prompt names 'prompt': %s", r.body);
    cJSON_Delete(j);
    ts_resp_free(&r);
}

static void test_text(void)
{
    ts_resp r;
    /* token 188 is the byte 0x00 */
    ts_request(port, "POST", "/detokenize", KEY, "{\"tokens\":[32,188,32,33]}", &r);
    CHECK(r.status == 200 && strstr(r.body, "\"A\\u0000AB\""), "detokenize keeps a NUL: %s", r.body);
    ts_resp_free(&r);
    ts_request(port, "POST", "/v1/completions", KEY, "{\"prompt\":\"hi\",\"max_tokens\":2,\"temperature\":0,\"logit_bias\":{\"188\":100}}", &r);
    CHECK(r.status == 200 && strstr(r.body, "\"text\":\"\\u0000\\u0000\""), "generated NUL bytes: %s", r.body);
    ts_resp_free(&r);
    ts_request(port, "POST", "/v1/completions", KEY,
               "{\"prompt\":\"hi\",\"max_tokens\":2,\"temperature\":0,\"stream\":true,\"logit_bias\":{\"188\":100}}", &r);
    CHECK(r.status == 200 && strstr(r.body, "\"text\":\"\\u0000\""), "streamed NUL bytes: %s", r.body);
    ts_resp_free(&r);
    /* the first sampled token ends the turn (a sanitizer build once aborted here) */
    ts_request(port, "POST", "/v1/chat/completions", KEY,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,\"logit_bias\":{\"151645\":100}}", &r);
    CHECK(r.status == 200 && strstr(r.body, "\"finish_reason\":\"stop\""), "a chat ended by its first token: %d %s", r.status, r.body);
    ts_resp_free(&r);
    ts_request(port, "POST", "/v1/chat/completions", KEY,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3,\"stream\":true,\"logit_bias\":{\"151645\":100}}", &r);
    CHECK(r.status == 200 && strstr(r.body, "\"finish_reason\":\"stop\"") && strstr(r.body, "[DONE]"), "the same streamed: %d", r.status);
    ts_resp_free(&r);
    /* /tokenize refuses text that cannot fit the context without tokenizing it */
    size_t n = 60000;
    char *big = malloc(n + 32);
    strcpy(big, "{\"prompt\":\"");
    for (size_t i = 0; i < n; i++) big[11 + i] = "ab "[i % 3];
    strcpy(big + 11 + n, "\"}");
    double t0 = ts_now();
    ts_request(port, "POST", "/tokenize", KEY, big, &r);
    CHECK(r.status == 400 && strstr(r.body, "context_length_exceeded"), "/tokenize of 60000 bytes with a 128-token context: %d in %.2f s",
          r.status, ts_now() - t0);
    ts_resp_free(&r);
    memcpy(big, "{\"prompt\":\"", 11);
    ts_request(port, "POST", "/v1/completions", KEY, big, &r);
    CHECK(r.status == 400 && strstr(r.body, "context_length_exceeded"), "completions of the same: %d", r.status);
    ts_resp_free(&r);
    free(big);
    /* under the bound, completions stop tokenizing once a prefix holds more than the context */
    big = malloc(20000 + 32);
    strcpy(big, "{\"prompt\":\"");
    for (size_t i = 0; i < 20000; i += 7) memcpy(big + 11 + i, "ab cd\\n", 7);
    strcpy(big + 11 + 20000 - 20000 % 7, "\"}");
    ts_request(port, "POST", "/v1/completions", KEY, big, &r);
    CHECK(r.status == 400 && strstr(r.body, "context_length_exceeded") && strstr(r.body, "more than"),
          "a 20000-byte prompt refused from a prefix: %d %.200s", r.status, r.body);
    ts_resp_free(&r);
    free(big);
    /* /detokenize takes at most a context of tokens (8 MB of the longest token's id, 56940: 128 spaces, was 178 MB of text) */
    big = malloc(129 * 8 + 32);
    for (int k = 128; k <= 129; k++) {
        strcpy(big, "{\"tokens\":[");
        for (int i = 0; i < k; i++) strcat(big, i ? ",56940" : "56940");
        strcat(big, "]}");
        ts_request(port, "POST", "/detokenize", KEY, big, &r);
        if (k == 128) CHECK(r.status == 200 && r.len > 128 * 64, "/detokenize of a context of tokens: %d, %zu bytes", r.status, r.len);
        else CHECK(r.status == 400 && strstr(r.body, "context_length_exceeded"), "/detokenize of more: %d %.200s", r.status, r.body);
        ts_resp_free(&r);
    }
    free(big);
    /* a body of more JSON values than a request can use is refused before cJSON makes a node of each */
    big = malloc(2 * 6000 + 64);
    char *w = big + sprintf(big, "{\"prompt\":\"hi\",\"stop\":[1");
    for (int i = 1; i < 6000; i++) w += sprintf(w, ",1");
    strcpy(w, "]}");
    ts_request(port, "POST", "/v1/completions", KEY, big, &r);
    CHECK(r.status == 400 && strstr(r.body, "JSON values"), "6000 values in a body for a 128-token context: %d %.200s", r.status, r.body);
    ts_resp_free(&r);
    free(big);
    /* within the bound, /tokenize answers its tokens */
    ts_request(port, "POST", "/tokenize", KEY, "{\"prompt\":\"a b a b\"}", &r);
    cJSON *j = cJSON_Parse(r.body);
    CHECK(r.status == 200 && cJSON_GetArraySize(cJSON_GetObjectItem(j, "tokens")) == (int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "count")) &&
          cJSON_GetNumberValue(cJSON_GetObjectItem(j, "count")) >= 4, "/tokenize: %s", r.body);
    cJSON_Delete(j);
    ts_resp_free(&r);
}

/* shutdown(SHUT_WR) after the request: the answer still comes. */
static void test_half_close(void)
{
    for (int stream = 0; stream < 2; stream++) {
        int fd = ts_connect_timeout(port, 10);
        ts_send_request(fd, "POST", "/v1/completions", KEY,
                        stream ? "{\"prompt\":\"Once upon\",\"max_tokens\":6,\"temperature\":0,\"stream\":true}"
                               : "{\"prompt\":\"Once upon\",\"max_tokens\":6,\"temperature\":0}");
        shutdown(fd, SHUT_WR);
        ts_resp r;
        ts_read_response(fd, &r);
        close(fd);
        if (stream)
            CHECK(r.status == 200 && r.body && strstr(r.body, "\"finish_reason\":\"length\"") && strstr(r.body, "data: [DONE]"),
                  "a half-closed stream gets its events: %d %s", r.status, r.body ? r.body : "");
        else
            CHECK(r.status == 200 && r.body && strstr(r.body, "\"completion_tokens\":6"), "a half-closed request gets its answer: %d %s",
                  r.status, r.body ? r.body : "");
        ts_resp_free(&r);
    }
}

/* --kv-size 64 below --ctx 128: max_tokens defaults to what fits */
static void test_kv_room(test_server *srv)
{
    ts_resp r;
    ts_request(port, "POST", "/v1/completions", KEY, "{\"prompt\":\"Once upon a time\",\"temperature\":0}", &r);
    cJSON *j = cJSON_Parse(r.body);
    double ct = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens"));
    double pt = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens"));
    CHECK(r.status == 200 && pt + ct <= 64, "no max_tokens with a KV cache below the context: %d, %g + %g tokens", r.status, pt, ct);
    cJSON_Delete(j);
    ts_resp_free(&r);
    ts_request(port, "POST", "/v1/completions", KEY, "{\"prompt\":\"Once upon a time\",\"max_tokens\":100}", &r);
    CHECK(r.status == 400 && strstr(r.body, "kv-size"), "max_tokens past the KV cache: %d %s", r.status, r.body);
    ts_resp_free(&r);
    (void)srv;
}

/* Two answers that do not fit the 64-token pool together (each alone does):
 * both are served (the younger is preempted and resumed), each the same
 * text as when it ran alone, and the preemption is counted. */
static void test_preempt(int admin)
{
    const char *body[2] = {"{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true}",
                           "{\"prompt\":\"The weather today\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true}"};
    ts_resp alone[2], both[2];
    for (int i = 0; i < 2; i++) ts_request(port, "POST", "/v1/completions", KEY, body[i], &alone[i]);
    int fd[2];
    for (int i = 0; i < 2; i++) {
        fd[i] = ts_connect_timeout(port, 60);
        ts_send_request(fd[i], "POST", "/v1/completions", KEY, body[i]);
    }
    for (int i = 0; i < 2; i++) {
        ts_read_response(fd[i], &both[i]);
        close(fd[i]);
    }
    for (int i = 0; i < 2; i++) {
        cJSON *a = cJSON_Parse(alone[i].body), *b = cJSON_Parse(both[i].body);
        const char *ta = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(a, "choices"), 0), "text"));
        const char *tb = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"), 0), "text"));
        CHECK(alone[i].status == 200 && both[i].status == 200 && ta && tb && !strcmp(ta, tb) &&
              strstr(both[i].body, "\"completion_tokens\":40"),
              "request %d beside another in a pool too small for both: %d %d, same text %d", i, alone[i].status,
              both[i].status, ta && tb && !strcmp(ta, tb));
        cJSON_Delete(a);
        cJSON_Delete(b);
        ts_resp_free(&alone[i]);
        ts_resp_free(&both[i]);
    }
    ts_resp r;
    ts_request(admin, "GET", "/metrics", NULL, NULL, &r);
    CHECK(r.status == 200 && ts_metric(r.body, "vllm:num_preemptions_total") >= 1, "preemptions counted: %g",
          r.body ? ts_metric(r.body, "vllm:num_preemptions_total") : -1);
    ts_resp_free(&r);
}

static void test_admin(int admin)
{
    ts_resp r;
    CHECK(admin > 0, "the admin listener's port is printed");
    if (admin <= 0) return;
    ts_request(admin, "GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200, "admin /health: %d", r.status);
    ts_resp_free(&r);
    ts_request(admin, "GET", "/metrics", NULL, NULL, &r);
    CHECK(r.status == 200 && ts_metric(r.body, "vllm:num_requests_running") == 0 && ts_metric(r.body, "q3:http_connections") >= 0,
          "admin /metrics: %d", r.status);
    ts_resp_free(&r);
    ts_request(admin, "POST", "/v1/completions", KEY, "{\"prompt\":\"hi\"}", &r);
    CHECK(r.status == 404, "no inference on the admin listener: %d", r.status);
    ts_resp_free(&r);
}

int main(void)
{
    test_server srv = {0};
    const char *args[] = {"-m", MODEL, "-t", "1", "--parallel", "2", "--ctx", "128", "--kv-size", "64", "--max-body", "65536",
                          "--api-key", "k3y", "--header-timeout", "2", "--body-timeout", "2", "--max-connections-per-ip", "12",
                          "--admin-port", "0", NULL};
    CHECK(ts_start(&srv, args) == 0, "server started");
    if (!srv.port) TEST_DONE();
    port = srv.port;
    CHECK(ts_wait_line(&srv, "smaller than the context") == 0, "a warning for --kv-size below --ctx");
    CHECK(ts_wait_line(&srv, "ready") == 0, "ready");
    test_admin(srv.admin_port);
    test_headers_first();
    test_framing();
    test_error_bodies();
    test_text();
    test_half_close();
    test_kv_room(&srv);
    if (srv.admin_port > 0) test_preempt(srv.admin_port);
    test_deadlines();
    test_per_address();
    CHECK(ts_stop(&srv) == 0, "exit 0 on SIGTERM");

    /* a second SIGINT ends the drain at once, a stream still running */
    const char *args2[] = {"-m", MODEL, "-t", "1", "--parallel", "1", "--drain-timeout", "60", NULL};
    CHECK(ts_start(&srv, args2) == 0 && ts_wait_line(&srv, "ready") == 0, "second server");
    port = srv.port;
    int fd = ts_connect_timeout(port, 10);
    ts_send_request(fd, "POST", "/v1/completions", "", "{\"prompt\":\"hi\",\"stream\":true}");
    char b[256];
    ssize_t got = recv(fd, b, sizeof b, 0);
    kill(srv.pid, SIGINT);
    CHECK(got > 0 && ts_wait_line(&srv, "draining") == 0, "draining");
    double t0 = ts_now();
    kill(srv.pid, SIGINT);
    int st = -1;
    while (ts_now() - t0 < 10 && waitpid(srv.pid, &st, WNOHANG) == 0) usleep(20000);
    double dt = ts_now() - t0;
    CHECK(dt < 5 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "a second SIGINT stops in %.1f s (drain timeout 60)", dt);
    if (dt >= 5) ts_stop(&srv);
    else { fclose(srv.err); srv.pid = 0; }
    close(fd);
    TEST_DONE();
}
