/* q3_status is written twice: include/q3.h (installed alone) and
 * src/util/status.h (what the internals include instead of the public API),
 * under one guard. This program compiles both, the public one renamed, and
 * checks them value for value; and compares the two enum blocks' names in
 * order, so a status added to one file and not the other fails here. */
#include <stdlib.h>

#define q3_status pub_status
#define Q3_OK PUB_OK
#define Q3_ERR_IO PUB_ERR_IO
#define Q3_ERR_FORMAT PUB_ERR_FORMAT
#define Q3_ERR_INVALID PUB_ERR_INVALID
#define Q3_ERR_UNSUPPORTED PUB_ERR_UNSUPPORTED
#define Q3_ERR_NOMEM PUB_ERR_NOMEM
#define Q3_ERR_CONTEXT PUB_ERR_CONTEXT
#define Q3_ERR_KV_FULL PUB_ERR_KV_FULL
#include "q3.h"
#undef q3_status
#undef Q3_OK
#undef Q3_ERR_IO
#undef Q3_ERR_FORMAT
#undef Q3_ERR_INVALID
#undef Q3_ERR_UNSUPPORTED
#undef Q3_ERR_NOMEM
#undef Q3_ERR_CONTEXT
#undef Q3_ERR_KV_FULL
#undef Q3_STATUS_DEFINED
#include "util/status.h"

#include "test.h"

_Static_assert(Q3_OK == (int)PUB_OK, "Q3_OK");
_Static_assert(Q3_ERR_IO == (int)PUB_ERR_IO, "Q3_ERR_IO");
_Static_assert(Q3_ERR_FORMAT == (int)PUB_ERR_FORMAT, "Q3_ERR_FORMAT");
_Static_assert(Q3_ERR_INVALID == (int)PUB_ERR_INVALID, "Q3_ERR_INVALID");
_Static_assert(Q3_ERR_UNSUPPORTED == (int)PUB_ERR_UNSUPPORTED, "Q3_ERR_UNSUPPORTED");
_Static_assert(Q3_ERR_NOMEM == (int)PUB_ERR_NOMEM, "Q3_ERR_NOMEM");
_Static_assert(Q3_ERR_CONTEXT == (int)PUB_ERR_CONTEXT, "Q3_ERR_CONTEXT");
_Static_assert(Q3_ERR_KV_FULL == (int)PUB_ERR_KV_FULL, "Q3_ERR_KV_FULL");
_Static_assert(sizeof(q3_status) == sizeof(pub_status), "the same size");

/* The enumerators of "typedef enum q3_status { ... } q3_status;" in path, one
 * per line, each without its comment and spaces ("Q3_OK=0", "Q3_ERR_IO"), into
 * out (NUL-separated); how many, or -1 when the block is not there. */
static int enum_block(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int in = 0, n = 0;
    size_t used = 0;
    while (fgets(line, sizeof line, f)) {
        if (!in) {
            in = strstr(line, "typedef enum q3_status {") != NULL;
            continue;
        }
        if (strstr(line, "} q3_status;")) {
            fclose(f);
            return n;
        }
        char *c = strstr(line, "/*");
        if (c) *c = 0;
        char name[128];
        size_t k = 0;
        for (char *p = line; *p && k + 1 < sizeof name; p++)
            if (*p != ' ' && *p != '\t' && *p != '\n' && *p != ',') name[k++] = *p;
        name[k] = 0;
        if (!k) continue;
        if (used + k + 1 > cap) break;
        memcpy(out + used, name, k + 1);
        used += k + 1;
        n++;
    }
    fclose(f);
    return -1;
}

int main(void)
{
    char pub[4096], in[4096];
    int np = enum_block("include/q3.h", pub, sizeof pub), ni = enum_block("src/util/status.h", in, sizeof in);
    CHECK(np > 0 && ni > 0, "enum blocks: q3.h %d, status.h %d", np, ni);
    CHECK(np == ni, "q3.h has %d statuses, src/util/status.h %d", np, ni);
    const char *a = pub, *b = in;
    for (int i = 0; i < np && i < ni; i++, a += strlen(a) + 1, b += strlen(b) + 1)
        CHECK(!strcmp(a, b), "status %d: q3.h %s, src/util/status.h %s", i, a, b);
    /* every internal status has a name of its own (the library's switch is complete) */
    for (int s = Q3_OK; s <= Q3_ERR_KV_FULL; s++)
        CHECK(strcmp(q3_status_name((pub_status)s), "unknown status") != 0, "status %d has no name", s);
    TEST_DONE();
}
