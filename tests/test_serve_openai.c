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
    if (access("tests/openai/node_modules/openai/package.json", R_OK)) {
        fprintf(stderr, "tests/openai/node_modules/openai is missing: run `make deps` (npm ci in tests/openai)\n");
        CHECK(0, "the openai npm client is installed");
        TEST_DONE();
    }
    test_server srv = {0};
    const char *args[] = {"-m", TEST_DATA "/golden/e2e", "-t", "1", "--parallel", "4", "--ctx", "512", "--api-key", "k3y", NULL};
    CHECK(ts_start(&srv, args) == 0 && ts_wait_line(&srv, "ready") == 0, "server started");
    if (!srv.port) TEST_DONE();
    /* one node run per file, each with its own time limit (a loaded 2-core machine is slow) */
    static const char *const files[] = {"tests/openai/serve.test.mjs", "tests/openai/compat.test.mjs"};
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "Q3_BASE_URL=http://127.0.0.1:%d/v1 Q3_API_KEY=k3y timeout 120 node --test --test-reporter=tap %s 2>&1",
                 srv.port, files[f]);
        FILE *p = popen(cmd, "r");
        int pass = -1, fail = -1;
        char line[1024];
        while (p && fgets(line, sizeof line, p)) {
            if (!strncmp(line, "# pass ", 7)) pass = atoi(line + 7);
            else if (!strncmp(line, "# fail ", 7)) fail = atoi(line + 7);
            if (strstr(line, "not ok") || strstr(line, "Error") || strstr(line, "expected") || strstr(line, "actual")) fputs(line, stderr);
        }
        int rc = p ? pclose(p) : -1;
        CHECK(pass > 0 && fail == 0 && rc == 0, "node --test %s: %d passed, %d failed, exit %d", files[f], pass, fail, rc);
        if (pass > 0) test_passed += pass - 1; /* one CHECK above stands for the first */
        if (fail > 0) test_failed += fail - 1;
    }
    CHECK(ts_stop(&srv) == 0, "server exits 0 on SIGTERM");
    TEST_DONE();
}
