/* q3 serve through the official OpenAI Node client: starts `q3 serve` on a
 * free loopback port with an API key, runs tests/openai/serve.test.mjs (the
 * API as OpenAI documents it) and compat.test.mjs (what SDKs and llama.cpp
 * clients send beyond it, the routes without /v1) with node's test runner,
 * and reports its pass/fail counts. A missing node or
 * client (make deps installs it) counts as a failure, never a skip. */
#include "serve_util.h"
#include "test.h"

int main(void)
{
    test_server srv = {0};
    const char *args[] = {"-m", TEST_DATA "/golden/e2e", "-t", "1", "--parallel", "4", "--ctx", "512", "--api-key", "k3y", NULL};
    CHECK(ts_start(&srv, args) == 0 && ts_wait_line(&srv, "ready") == 0, "server started");
    if (!srv.port) TEST_DONE();
    /* one node run per file, each with its own time limit (a loaded 2-core machine is slow) */
    static const char *const files[] = {"tests/openai/serve.test.mjs", "tests/openai/compat.test.mjs"};
    char env[128];
    snprintf(env, sizeof env, "Q3_BASE_URL=http://127.0.0.1:%d/v1 Q3_API_KEY=k3y", srv.port);
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) ts_node_test(env, files[f]);
    CHECK(ts_stop(&srv) == 0, "server exits 0 on SIGTERM");
    TEST_DONE();
}
