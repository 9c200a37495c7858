/* Every grammar of llama.cpp's grammars/ folder (tests/data/gbnf, copied with
 * its origin and license) compiles with `q3 grammar --grammar-file`, and sample
 * texts walked through the token masks as the tokenizer splits them are
 * accepted, incomplete or rejected at the right byte. Drives build/q3 (Q3_BIN
 * overrides it); one q3 run per sample, each a fraction of a second. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "temps.h"
#include "test.h"

#define GBNF TEST_DATA "/gbnf"
#define TOKENIZER TEST_DATA "/golden/e2e/tokenizer.json"

static const struct {
    const char *grammar; /* a file of tests/data/gbnf */
    const char *text;
    const char *verdict; /* what q3 grammar --check prints first */
    int rc;
} cases[] = {
    {"arithmetic", "2+3=5\n(a*2)/b = c\n", "accepted", 0},
    {"arithmetic", "2+=5\n", "rejected at byte 2", 1},
    {"c", "int f(int x){x = x+1;return x;}int main(){return f(2);}", "accepted", 0},
    {"chess", "1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6\n", "accepted", 0},
    {"chess", "1. e4 e5\n", "incomplete", 0},
    {"english", "Hello, world! It's 42.", "accepted", 0},
    {"japanese", "こんにちは 世界", "accepted", 0},
    {"json", "{\"a\": [1, 2.5, \"x\\u00e9\"], \"b\": {\"c\": null, \"d\": true}}", "accepted", 0},
    {"json", "{\"a\": tru}", "rejected at byte 9", 1},
    {"json_arr", "[\n{\"a\": 1},\n\"x\"]", "accepted", 0},
    {"list", "- milk\n- eggs\n", "accepted", 0},
};

/* Runs q3 grammar on the grammar file and the text; returns its exit status, *out its first line. */
static int check(const char *grammar, const char *text, char *out, size_t cap)
{
    const char *sample = test_tmp("sample.txt");
    FILE *f = fopen(sample, "wb");
    if (!f || fputs(text, f) < 0 || fclose(f)) return -1;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s grammar --grammar-file %s/%s.gbnf --tokenizer %s --check %s 2>&1", q3_bin(), GBNF,
             grammar, TOKENIZER, sample);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    out[0] = 0;
    if (!fgets(out, (int)cap, p)) out[0] = 0;
    char rest[256];
    while (fgets(rest, sizeof rest, p)) {}
    int st = pclose(p);
    remove(sample);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void)
{
    const char *all[] = {"arithmetic", "c", "chess", "english", "japanese", "json", "json_arr", "list"};
    for (size_t g = 0; g < sizeof all / sizeof *all; g++) { /* every file has a sample */
        int seen = 0;
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) seen |= !strcmp(cases[i].grammar, all[g]);
        CHECK(seen, "%s.gbnf: no sample", all[g]);
    }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char line[512];
        int rc = check(cases[i].grammar, cases[i].text, line, sizeof line);
        CHECK(rc == cases[i].rc && !strncmp(line, cases[i].verdict, strlen(cases[i].verdict)),
              "%s.gbnf on %s: exit %d, '%s' (want exit %d, '%s')", cases[i].grammar, cases[i].text, rc, line,
              cases[i].rc, cases[i].verdict);
    }
    TEST_DONE();
}
