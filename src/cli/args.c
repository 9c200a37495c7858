#include "cli/args.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "cli/cli.h"

int cli_parse_int(const char *cmd, const char *name, const char *text, long long lo, long long hi,
                  long long *out)
{
    const char *p = text + (*text == '-' || *text == '+');
    int digits = *p != 0;
    for (const char *q = p; *q; q++) digits &= *q >= '0' && *q <= '9';
    if (digits) {
        char *end;
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (!errno && !*end && v >= lo && v <= hi) {
            *out = v;
            return 0;
        }
    }
    return cli_error(cmd, "%s must be an integer in %lld..%lld, not '%.40s'", name, lo, hi, text);
}

int cli_parse_double(const char *cmd, const char *name, const char *text, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end != text && !*end && !isspace((unsigned char)*text) && isfinite(v) && v >= lo && v <= hi) {
        *out = v;
        return 0;
    }
    return cli_error(cmd, "%s must be a number in %g..%g, not '%.40s'", name, lo, hi, text);
}
