/* The command line as a whole (issue 14): every command refuses each kind of
 * mistake with exit 2 and one line; -t 1 and -t 2 agree; seeds are random,
 * printed and repeatable; docs/cli.md matches every --help; every
 * environment variable q3 reads is documented. Drives build/q3 (Q3_BIN
 * overrides it). Files go to the test's scratch folder, which the shell
 * commands see as $Q3_TEST_TMP. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "q3.h"
#include "golden.h"
#include "temps.h"
#include "test.h"

#define E2E TEST_DATA "/golden/e2e"
#define TINY TEST_DATA "/golden/tiny"

/* Runs the shell command made from fmt; returns the exit status (-1: killed);
 * *out: what it printed (stdout, plus stderr when `err` is set), static. */
static char outbuf[1 << 17];
static int sh_(int err, const char **out, const char *fmt, va_list ap)
{
    char cmd[4096], full[4200];
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    snprintf(full, sizeof full, "%s%s", cmd, err ? " 2>&1" : " 2>/dev/null");
    FILE *f = popen(full, "r");
    size_t got = f ? fread(outbuf, 1, sizeof outbuf - 1, f) : 0;
    outbuf[got] = 0;
    int status = f ? pclose(f) : -1;
    *out = outbuf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
static int sh(const char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(const char **out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = sh_(1, out, fmt, ap);
    va_end(ap);
    return rc;
}
static int sh_stdout(const char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh_stdout(const char **out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = sh_(0, out, fmt, ap);
    va_end(ap);
    return rc;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* Each command, each kind of mistake: exit 2, one line naming the command and its --help. */
static void test_usage_errors(void)
{
    static const struct { const char *cmd, *base, *missing_value, *bad_number, *missing_file, *positional; } c[] = {
        {"run", "-m " E2E " -p hi -n 1", "-m", "-n 1.5", "-m /nonexistent-q3", "stray"},
        {"chat", "-m " E2E, "--temp", "--top-k x", "--system-file /nonexistent-q3", "stray"},
        {"serve", "-m " TINY " --port 0", "--port", "--parallel 1.5", "-m /nonexistent-q3", "stray"},
        {"info", "-m " TINY, "-m", NULL, "-m /nonexistent-q3", "stray"},
        {"logits", "-m " TINY " --tokens 1 -o /dev/null", "--tokens", "--chunk 0", "-m /nonexistent-q3", "stray"},
        {"bench", "-m " TINY " --no-limits --gen 1 --repeats 1", "--chunk", "--gen 1.5", "-m /nonexistent-q3", "stray"},
        {"probe", "-m " TINY " --no-profile", "--chunk", "--chunk 12x", "-m /nonexistent-q3", "stray"},
        {"chat-template", "/dev/null", "--model", NULL, "--model /nonexistent-q3", "a b"},
        {"synth", "-o \"$Q3_TEST_TMP\"/never", "-o", "--seed -1", "--config /nonexistent-q3", "stray"},
        {"convert", "-m " TINY " -o \"$Q3_TEST_TMP\"/never.gguf", "-o", NULL, "/nonexistent-q3", "a b"},
        {"compare", "-m " TINY, "--types", NULL, "--cases /nonexistent-q3", "stray"},
        {"tokenize", "--tokenizer " E2E, "--tokenizer", NULL, "-m /nonexistent-q3", NULL},
        {"detokenize", "--tokenizer " E2E, "-m", NULL, "--tokenizer /nonexistent-q3", NULL},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const char *mistakes[5][2] = {
            {"unknown flag", "--no-such-flag"},
            {"missing value", c[i].missing_value},
            {"bad number", c[i].bad_number},
            {"missing file", c[i].missing_file},
            {"positional", c[i].positional},
        };
        char want[64];
        snprintf(want, sizeof want, "(see q3 %s --help)", c[i].cmd);
        for (int k = 0; k < 5; k++) {
            if (!mistakes[k][1]) continue; /* the command has no such option or takes arguments */
            const char *out;
            /* the missing value goes last: nothing follows the option */
            int rc = sh(&out, "%s %s %s %s </dev/null", q3_bin(), c[i].cmd, c[i].base, mistakes[k][1]);
            CHECK(rc == 2, "%s, %s (%s): exit %d: %s", c[i].cmd, mistakes[k][0], mistakes[k][1], rc, out);
            CHECK(count_lines(out) == 1, "%s, %s: one line: %s", c[i].cmd, mistakes[k][0], out);
            CHECK(strstr(out, want) != NULL, "%s, %s: points to --help: %s", c[i].cmd, mistakes[k][0], out);
            char prefix[64];
            snprintf(prefix, sizeof prefix, "q3 %s: ", c[i].cmd);
            CHECK(!strncmp(out, prefix, strlen(prefix)), "%s, %s: names the command: %s", c[i].cmd, mistakes[k][0],
                  out);
        }
    }
    const char *out;
    int rc = sh(&out, "%s run -p hi", q3_bin());
    CHECK(rc == 2 && strstr(out, "missing -m/--model") && count_lines(out) == 1, "missing required: %s", out);
    rc = sh(&out, "%s no-such-command", q3_bin());
    CHECK(rc == 2 && count_lines(out) == 1, "unknown command: %d %s", rc, out);
    /* a runtime error is 1 */
    rc = sh(&out, "%s info -m /dev/zero", q3_bin());
    CHECK(rc == 1, "not a model: exit %d: %s", rc, out);
}

static void test_syntax(void)
{
    const char *out;
    int rc = sh(&out, "%s --version", q3_bin());
    char want[64];
    snprintf(want, sizeof want, "q3 %s\n", q3_version());
    CHECK(rc == 0 && !strcmp(out, want), "--version: %s", out);
    static char a[1 << 14];
    rc = sh(&out, "%s help run", q3_bin());
    snprintf(a, sizeof a, "%s", out);
    int rc2 = sh(&out, "%s run --help", q3_bin());
    CHECK(rc == 0 && rc2 == 0 && !strcmp(a, out) && strstr(a, "--threads"), "q3 help run = q3 run --help");
    /* --long=value, -xV and -- */
    rc = sh_stdout(&out, "%s tokenize --tokenizer=" E2E " -- -5", q3_bin());
    CHECK(rc == 0 && out[0] == '[', "--tokenizer=PATH and -- : %s", out);
    rc = sh_stdout(&out, "%s run -m " E2E " -p hi -n2 --temp=0 --no-perf", q3_bin());
    CHECK(rc == 0 && out[0], "-n2 --temp=0: %d %s", rc, out);
    /* tokenize pipes into logits and detokenize */
    rc = sh_stdout(&out, "%s tokenize --tokenizer " E2E " hello world | %s detokenize --tokenizer " E2E, q3_bin(),
                   q3_bin());
    CHECK(rc == 0 && !strcmp(out, "hello world\n"), "tokenize | detokenize, with a final newline: '%s'", out);
    rc = sh_stdout(&out, "%s tokenize --tokenizer " E2E " hello | %s logits -m " E2E " --tokens - -o - | wc -c",
                   q3_bin(), q3_bin());
    CHECK(rc == 0 && atol(out) == 151936L * 4, "logits --tokens - -o -: %s bytes", out);
    rc = sh_stdout(&out, "echo '[9707, 1879]' | %s detokenize --tokenizer " E2E " --jsonl", q3_bin());
    CHECK(rc == 0 && strstr(out, "\"text\":\"Hello world\""), "detokenize --jsonl: %s", out);
    rc = sh_stdout(&out, "%s info -m " TINY " --json", q3_bin());
    CHECK(rc == 0 && strstr(out, "\"schema\":\t\"q3.info/1\"") && strstr(out, "\"layers\":\t2"), "info --json: %s",
          out);
}

/* -t 1 and -t 2: the same greedy text. */
static void test_threads(void)
{
    static char one[8192];
    const char *out;
    int rc = sh_stdout(&out, "%s run -m " E2E " -p 'Tell me a story' -n 12 --temp 0 -t 1", q3_bin());
    snprintf(one, sizeof one, "%s", out);
    CHECK(rc == 0 && one[0], "-t 1: %d", rc);
    rc = sh_stdout(&out, "%s run -m " E2E " -p 'Tell me a story' -n 12 --temp 0 --threads 2", q3_bin());
    CHECK(rc == 0 && !strcmp(one, out), "-t 1 and -t 2 agree:\n%s\n%s", one, out);
    rc = sh(&out, "%s bench -m " TINY " -t 1 --no-limits --gen 2 --repeats 1 --chunk 8", q3_bin());
    CHECK(rc == 0 && strstr(out, "1 thread, cpu kernels "), "bench says its threads and kernels: %s", out);
}

/* Random seeds, printed; a printed seed repeats the run. */
static void test_seeds(void)
{
    static char a[8192], b[8192];
    unsigned long long sa = 0, sb = 0;
    const char *out;
    int rc = sh_stdout(&out, "{ %s run -m " E2E " -p hi -n 16 --temp 1 --no-perf 2>\"$Q3_TEST_TMP\"/seed-a; }", q3_bin());
    snprintf(a, sizeof a, "%s", out);
    CHECK(rc == 0, "run a: %d", rc);
    rc = sh_stdout(&out, "{ %s run -m " E2E " -p hi -n 16 --temp 1 --no-perf 2>\"$Q3_TEST_TMP\"/seed-b; }", q3_bin());
    snprintf(b, sizeof b, "%s", out);
    CHECK(rc == 0, "run b: %d", rc);
    CHECK(strcmp(a, b) != 0, "two runs without --seed differ:\n%s\n%s", a, b);
    FILE *f = fopen(test_tmp("seed-a"), "r");
    CHECK(f && fscanf(f, "q3 run: seed %llu", &sa) == 1, "run a printed its seed");
    if (f) fclose(f);
    f = fopen(test_tmp("seed-b"), "r");
    CHECK(f && fscanf(f, "q3 run: seed %llu", &sb) == 1, "run b printed its seed");
    if (f) fclose(f);
    CHECK(sa != sb, "different seeds: %llu %llu", sa, sb);
    rc = sh_stdout(&out, "%s run -m " E2E " -p hi -n 16 --temp 1 --no-perf --seed %llu", q3_bin(), sa);
    CHECK(rc == 0 && !strcmp(out, a), "--seed %llu repeats run a:\n%s\n%s", sa, a, out);
    remove(test_tmp("seed-a"));
    remove(test_tmp("seed-b"));
    /* the timings: load, prompt eval, eval, total; --no-perf hides them */
    rc = sh(&out, "%s run -m " E2E " -p hi -n 4 --temp 0", q3_bin());
    CHECK(rc == 0 && strstr(out, "q3: load time") && strstr(out, "q3: prompt eval time") &&
              strstr(out, "/     3 runs") && strstr(out, "q3: total time") && strstr(out, "tokens per second"),
          "timings: %s", out);
    rc = sh(&out, "%s run -m " E2E " -p hi -n 4 --temp 0 --no-perf", q3_bin());
    CHECK(rc == 0 && !strstr(out, "eval time"), "--no-perf: %s", out);
}

static void test_chat_repl(void)
{
    const char *out;
    int rc = sh(&out,
                "printf '/nope\\n/set temp 0\\n\"\"\"first\\nsecond\"\"\"\\n/clear\\n/bye\\nnot sent\\n' | %s chat -m " E2E
                " -n 3 --no-perf",
                q3_bin());
    CHECK(rc == 0, "chat: %d %s", rc, out);
    CHECK(strstr(out, "unknown command '/nope'") && strstr(out, "/set temp"), "unknown command answered: %s", out);
    CHECK(strstr(out, "(temp 0,") != NULL, "/set temp: %s", out);
    CHECK(strstr(out, "conversation forgotten") != NULL, "/clear: %s", out);
    rc = sh(&out, "printf '\"\"\"a\\nb\"\"\"\\n' | %s chat -m " E2E " -n 2 --verbose-prompt", q3_bin());
    CHECK(rc == 0 && strstr(out, "'a'") && strstr(out, "'\\n'") && strstr(out, "'b'"),
          "a message of two lines is one message: %s", out);
}

/* docs/cli.md's generated part is what the binary prints. */
static void test_docs(void)
{
    size_t len;
    char *doc = golden_slurp("docs/cli.md", &len);
    CHECK(doc != NULL, "docs/cli.md");
    if (!doc) return;
    const char *out;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "sh scripts/gen-cli-doc.sh --print %s", q3_bin());
    int rc = sh_stdout(&out, "%s", cmd);
    CHECK(rc == 0 && strlen(out) > 1000, "gen-cli-doc.sh --print: %d", rc);
    const char *gen = strstr(doc, "<!-- generated by scripts/gen-cli-doc.sh");
    CHECK(gen && !strcmp(gen, out),
          "docs/cli.md agrees with every --help (regenerate: sh scripts/gen-cli-doc.sh)");
    /* every command of q3 --help has its section */
    rc = sh_stdout(&out, "%s --help | sed -n '/^commands:/,/^$/p' | sed -n 's/^  \\([a-z-]*\\) .*/\\1/p'", q3_bin());
    int n = 0;
    char *names = strdup(out), *save = NULL;
    for (char *t = strtok_r(names, "\n", &save); t; t = strtok_r(NULL, "\n", &save), n++) {
        char head[64];
        snprintf(head, sizeof head, "\n## q3 %s\n", t);
        if (strcmp(t, "help")) CHECK(strstr(doc, head) != NULL, "docs/cli.md has %s", head + 1);
    }
    free(names);
    CHECK(n >= 12, "%d commands listed", n);
    /* every environment variable q3 reads is documented */
    rc = sh_stdout(&out, "grep -rhoE 'getenv\\(\"[A-Z_0-9]+\"\\)' src tools | sed 's/getenv(\"\\(.*\\)\")/\\1/' | sort -u");
    int vars = 0;
    char *copy = strdup(out);
    for (char *save = NULL, *v = strtok_r(copy, "\n", &save); v; v = strtok_r(NULL, "\n", &save), vars++) {
        char cell[64];
        snprintf(cell, sizeof cell, "| `%s` |", v);
        CHECK(strstr(doc, cell) != NULL, "environment variable %s is documented in docs/cli.md", v);
    }
    free(copy);
    CHECK(vars >= 6, "found the variables q3 reads: %d", vars);
    free(doc);
}

/* llama.cpp's spellings (issue 28 item 6): the names users type work, and any
 * other "-abc" is "unknown option '-abc'", never bundled letters ("-ngl 99"
 * read as "-n gl"). */
static void test_llama_flags(void)
{
    const char *out;
    static char greedy[4096];
    int rc = sh_stdout(&out, "%s run -m " E2E " -p hi -n 4 --temp 0 --no-perf", q3_bin());
    snprintf(greedy, sizeof greedy, "%s", out);
    CHECK(rc == 0 && greedy[0], "run: %d", rc);
    /* accepted: the same text, -ngl noted as ignored on stderr */
    rc = sh_stdout(&out, "{ %s run -m " E2E " -p hi -n 4 --temp 0 --no-perf -ngl 99 -fa -c 512 -b 512 -ub 64 -ctk f16 -ctv f16 2>&1 >/dev/null; }",
            q3_bin());
    CHECK(rc == 0 && strstr(out, "-ngl 99 ignored") && count_lines(out) == 1, "-ngl -fa -c -b -ub -ctk -ctv: %d %s", rc, out);
    rc = sh_stdout(&out, "%s run -m " E2E " -p hi -n 4 --temp 0 --no-perf -ngl 99 -fa on --ctx-size 512 --flash-attn=auto", q3_bin());
    CHECK(rc == 0 && !strcmp(out, greedy), "llama.cpp flags change nothing: '%s' vs '%s'", out, greedy);
    /* -ctk q8_0 is --kv q8_0: the same text as --kv q8_0 */
    static char kv8[4096];
    rc = sh_stdout(&out, "%s run -m " E2E " -p hi -n 4 --temp 0 --no-perf --kv q8_0", q3_bin());
    snprintf(kv8, sizeof kv8, "%s", out);
    rc |= sh_stdout(&out, "%s run -m " E2E " -p hi -n 4 --temp 0 --no-perf -ctk q8_0 -ctv q8_0", q3_bin());
    CHECK(rc == 0 && !strcmp(out, kv8), "-ctk/-ctv q8_0 = --kv q8_0: '%s' vs '%s'", out, kv8);
    /* -sys is --system */
    static char sys[4096];
    rc = sh_stdout(&out, "%s run -m " E2E " -p hi -n 4 --temp 0 --no-perf --system 'Be brief.'", q3_bin());
    snprintf(sys, sizeof sys, "%s", out);
    rc |= sh_stdout(&out, "%s run -m " E2E " -p hi -n 4 --temp 0 --no-perf -sys 'Be brief.'", q3_bin());
    CHECK(rc == 0 && !strcmp(out, sys), "-sys = --system: '%s' vs '%s'", out, sys);
    /* the warm-up (issue 28 item 8): reported inside the load time, apart from the prompt's; the text is the same without it */
    rc = sh_stdout(&out, "{ %s run -m " E2E " -p hi -n 4 --temp 0 2>&1 >/dev/null; }", q3_bin());
    CHECK(rc == 0 && strstr(out, "load time") && strstr(out, "warm-up decode step") && strstr(out, "prompt eval time"),
          "timings name the warm-up: %s", out);
    rc = sh_stdout(&out, "%s run -m " E2E " -p hi -n 4 --temp 0 --no-perf --no-warmup", q3_bin());
    CHECK(rc == 0 && !strcmp(out, greedy), "--no-warmup: the same text: '%s' vs '%s'", out, greedy);
    /* refused, exit 2, one line each */
    static const struct { const char *args, *want; } bad[] = {
        {"run -m " E2E " -p hi -ngx 1", "unknown option '-ngx'"},
        {"run -m " E2E " -p hi -xyz", "unknown option '-xyz'"},
        {"run -m " E2E " -p hi -nfoo", "unknown option '-nfoo'"},
        {"run -m " E2E " -p hi -ctk q8_0 -ctv f16", "-ctk q8_0 and -ctv f16 differ"},
        {"run -m " E2E " -p hi --kv q4_0", "f32, f16, bf16 and q8_0, not 'q4_0'"},
        {"run -m " E2E " -p hi --flash-attn=maybe", "--flash-attn takes on, off or auto"},
        {"chat -m " E2E " -ctv q5_1", "not 'q5_1'"},
        {"logits -m " E2E " --tokens 1 -o /dev/null -ngl", "-ngl needs a value"},
        {"logits -m " E2E " --tokens 1 -o /dev/null -c 0", "-c must be an integer"},
        {"serve -m " TINY " -np 0", "-np must be an integer in 1..256"},
        {"serve -m " TINY " -c 0", "-c must be an integer"},
        {"serve -m " TINY " --step-tokens fast", "--step-tokens is a count of tokens (1 to 1048576) or paced"},
        {"serve -m " TINY " --step-tokens 0", "--step-tokens is a count of tokens (1 to 1048576) or paced"},
        {"serve -m " TINY " -ctk bf16 --kv f16", "--kv f16 and -ctk bf16 differ"},
        {"tokenize -ngl 1 hello", "unknown option '-ngl'"},
        {"info -m " TINY " -fa", "unknown option '-fa'"},
        {"run -m " E2E " -p hi -c 100000", "-c/--ctx-size 100000 is more than this model's context"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = sh(&out, "%s %s", q3_bin(), bad[i].args);
        CHECK(rc == 2 && strstr(out, bad[i].want) && count_lines(out) == 1, "q3 %s: %d '%s' (want '%s')", bad[i].args, rc,
              out, bad[i].want);
    }
    /* an environment variable q3 cannot use is refused, not ignored (issue 28 item 9) */
    rc = sh(&out, "Q3_THREADS=two %s info -m " TINY, q3_bin());
    CHECK(rc == 2 && strstr(out, "Q3_THREADS='two'") && count_lines(out) == 1, "Q3_THREADS=two: %d %s", rc, out);
    rc = sh(&out, "Q3_CPU_ISA=sse4 %s info -m " TINY, q3_bin());
    CHECK(rc == 2 && strstr(out, "Q3_CPU_ISA='sse4'") && count_lines(out) == 1, "Q3_CPU_ISA=sse4: %d %s", rc, out);
    rc = sh(&out, "Q3_THREADS=1 Q3_CPU_ISA=avx2 %s info -m " TINY, q3_bin());
    CHECK(rc == 0, "valid Q3_THREADS and Q3_CPU_ISA: %d %s", rc, out);
}

int main(void)
{
    test_tmpdir(); /* sets $Q3_TEST_TMP for the commands */
    test_usage_errors();
    test_syntax();
    test_threads();
    test_seeds();
    test_chat_repl();
    test_llama_flags();
    test_docs();
    TEST_DONE();
}
