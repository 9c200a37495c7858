#include "cli/opts.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "q3 %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see q3 %s --help)\n", cmd);
    va_end(ap);
    return 2;
}

/* What the last cli_parse saw given (for cli_given). */
static const cli_spec *given_spec;
static unsigned char given[128];

int cli_given(const cli_spec *s, const char *name)
{
    if (s != given_spec) return 0;
    for (int i = 0; s->opts[i].name && i < 128; i++)
        if (!strcmp(s->opts[i].name, name) && given[i]) return 1;
    return 0;
}

/* Stores value v (spelled `spelled` on the command line) into o. Returns 0 or 2 (printed). */
static int store(const cli_spec *s, const cli_opt *o, const char *spelled, const char *v)
{
    long long n;
    double x;
    switch (o->kind) {
    case CLI_FLAG:
    case CLI_ONOFF: *(int *)o->dest = 1; return 0;
    case CLI_STR: *(const char **)o->dest = v; return 0;
    case CLI_FILE: {
        struct stat st;
        if (!*v) return cli_usage_error(s->cmd, "%s: an empty path", spelled);
        if (!((o->flags & CLI_STDIN) && !strcmp(v, "-")) && stat(v, &st) != 0)
            return cli_usage_error(s->cmd, "%s: %.200s: %s", spelled, v,
                                   errno == ENOENT ? "no such file or folder" : strerror(errno));
        *(const char **)o->dest = v;
        return 0;
    }
    case CLI_STRS:
        if (*o->count >= (int)o->hi) return cli_usage_error(s->cmd, "%s: at most %d of them", spelled, (int)o->hi);
        ((const char **)o->dest)[(*o->count)++] = v;
        return 0;
    case CLI_INT:
    case CLI_LLONG: {
        /* (double)LLONG_MAX rounds up past LLONG_MAX: clamp before converting back */
        long long lo = o->lo <= -9.2e18 ? LLONG_MIN : (long long)o->lo, hi = o->hi >= 9.2e18 ? LLONG_MAX : (long long)o->hi;
        if (cli_scan_int(v, lo, hi, &n))
            return cli_usage_error(s->cmd, "%s must be an integer in %lld..%lld, not '%.40s'", spelled, lo, hi, v);
        if (o->kind == CLI_INT) *(int *)o->dest = (int)n;
        else *(long long *)o->dest = n;
        return 0;
    }
    case CLI_FLOAT:
    case CLI_DOUBLE:
        if (cli_scan_double(v, o->lo, o->hi, &x))
            return cli_usage_error(s->cmd, "%s must be a number in %g..%g, not '%.40s'", spelled, o->lo, o->hi, v);
        if (o->kind == CLI_FLOAT) *(float *)o->dest = (float)x;
        else *(double *)o->dest = x;
        return 0;
    }
    return 0;
}

int cli_parse(const cli_spec *s, int argc, char **argv, int *n_pos)
{
    int w = 1, only_pos = 0;
    given_spec = s;
    memset(given, 0, sizeof given);
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (only_pos || a[0] != '-' || !a[1]) {
            argv[w++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            only_pos = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_help(s, stdout);
            return CLI_HELP_SHOWN;
        }
        const cli_opt *o = NULL;
        const char *inline_v = NULL;
        char spelled[64];
        if (a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            for (int k = 0; s->opts[k].name; k++)
                if (strlen(s->opts[k].name) == len && !strncmp(s->opts[k].name, a + 2, len)) o = &s->opts[k];
            snprintf(spelled, sizeof spelled, "--%.*s", (int)(len < 40 ? len : 40), a + 2);
            if (eq) inline_v = eq + 1;
        } else if (a[2]) { /* "-ngl": a name of several letters, or a number glued to "-n" */
            for (int k = 0; s->opts[k].name; k++)
                if (s->opts[k].dash && !strcmp(s->opts[k].dash, a + 1)) o = &s->opts[k];
            snprintf(spelled, sizeof spelled, "-%.40s", a + 1);
            if (!o) {
                for (int k = 0; s->opts[k].name; k++)
                    if (s->opts[k].short_name == a[1]) o = &s->opts[k];
                long long n;
                double x;
                int number = o && (o->kind == CLI_INT || o->kind == CLI_LLONG ? !cli_scan_int(a + 2, LLONG_MIN, LLONG_MAX, &n)
                                   : o->kind == CLI_FLOAT || o->kind == CLI_DOUBLE ? !cli_scan_double(a + 2, -HUGE_VAL, HUGE_VAL, &x)
                                   : 0);
                if (!number) o = NULL;
                else inline_v = a + 2, snprintf(spelled, sizeof spelled, "-%c", a[1]);
            }
        } else {
            for (int k = 0; s->opts[k].name; k++)
                if (s->opts[k].short_name == a[1]) o = &s->opts[k];
            snprintf(spelled, sizeof spelled, "-%c", a[1]);
        }
        if (!o) return cli_usage_error(s->cmd, "unknown option '%.60s'", a);
        given[o - s->opts] = 1;
        if (o->kind == CLI_FLAG) {
            if (inline_v) return cli_usage_error(s->cmd, "%s takes no value", spelled);
            *(int *)o->dest = 1;
            continue;
        }
        if (o->kind == CLI_ONOFF) {
            static const char *const on[] = {"on", "auto", "1", "true"}, *const off[] = {"off", "0", "false"};
            const char *v = inline_v ? inline_v : i + 1 < argc ? argv[i + 1] : "";
            int val = -1;
            for (size_t k = 0; k < 4; k++) if (!strcmp(v, on[k])) val = 1;
            for (size_t k = 0; k < 3; k++) if (!strcmp(v, off[k])) val = 0;
            if (inline_v && val < 0) return cli_usage_error(s->cmd, "%s takes on, off or auto, not '%.40s'", spelled, v);
            if (val >= 0 && !inline_v) i++;
            *(int *)o->dest = val < 0 ? 1 : val;
            continue;
        }
        const char *v = inline_v;
        if (!v) {
            if (i + 1 >= argc) return cli_usage_error(s->cmd, "%s needs a value (%s)", spelled, o->meta ? o->meta : "");
            v = argv[++i];
        }
        int rc = store(s, o, spelled, v);
        if (rc) return rc;
    }
    int n = w - 1;
    if (s->max_positional == 0 && n > 0)
        return cli_usage_error(s->cmd, "unexpected argument '%.60s': this command takes no positional arguments",
                               argv[1]);
    if (s->max_positional > 0 && n > s->max_positional)
        return cli_usage_error(s->cmd, "unexpected argument '%.60s' (at most %d positional)", argv[1 + s->max_positional],
                               s->max_positional);
    for (int k = 0; s->opts[k].name; k++)
        if ((s->opts[k].flags & CLI_REQUIRED) && !given[k]) {
            if (s->opts[k].short_name)
                return cli_usage_error(s->cmd, "missing -%c/--%s %s", s->opts[k].short_name, s->opts[k].name,
                                       s->opts[k].meta ? s->opts[k].meta : "");
            return cli_usage_error(s->cmd, "missing --%s %s", s->opts[k].name, s->opts[k].meta ? s->opts[k].meta : "");
        }
    if (n_pos) *n_pos = n;
    return 0;
}

void cli_help(const cli_spec *s, FILE *f)
{
    const char *u = s->usage;
    int first = 1;
    while (*u) {
        const char *nl = strchr(u, '\n');
        size_t len = nl ? (size_t)(nl - u) : strlen(u);
        fprintf(f, "%s%.*s\n", first ? "usage: " : "       ", (int)len, u);
        first = 0;
        u += len + (nl != NULL);
    }
    if (s->about) fprintf(f, "%s", s->about);
    fprintf(f, "\noptions:\n");
    for (int k = 0; s->opts[k].name; k++) {
        const cli_opt *o = &s->opts[k];
        if (o->flags & CLI_HIDDEN) continue;
        char left[80];
        int n = 0;
        if (o->short_name) n = snprintf(left, sizeof left, "-%c, ", o->short_name);
        if (o->dash) n += snprintf(left + n, sizeof left - (size_t)n, "-%s, ", o->dash);
        n += snprintf(left + n, sizeof left - (size_t)n, "--%s", o->name);
        if (o->kind == CLI_ONOFF) snprintf(left + n, sizeof left - (size_t)n, " [%s]", o->meta ? o->meta : "on|off");
        else if (o->kind != CLI_FLAG) snprintf(left + n, sizeof left - (size_t)n, " %s", o->meta ? o->meta : "V");
        const char *h = o->help ? o->help : "";
        if (strlen(left) > 24) fprintf(f, "  %s\n%28s", left, "");
        else fprintf(f, "  %-24s  ", left);
        for (const char *p = h; *p; p++) {
            fputc(*p, f);
            if (*p == '\n' && p[1]) fprintf(f, "%28s", "");
        }
        if (!*h || h[strlen(h) - 1] != '\n') fputc('\n', f);
    }
    fprintf(f, "  %-24s  this help\n", "-h, --help");
    if (s->notes) fprintf(f, "\n%s", s->notes);
}

int cli_parse_ids(const char *text, int32_t **ids, size_t *n, const char **bad)
{
    size_t cap = 64, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    *bad = NULL;
    if (!v) return -1;
    const char *p = text;
    for (;;) {
        p += strspn(p, " \t\r\n,[]");
        if (!*p) break;
        long long x;
        const char *end = p + strcspn(p, " \t\r\n,[]");
        char num[24];
        size_t len = (size_t)(end - p);
        if (len >= sizeof num || (memcpy(num, p, len), num[len] = 0, cli_scan_int(num, 0, INT32_MAX, &x))) {
            free(v);
            *bad = p;
            return -1;
        }
        if (k == cap) {
            int32_t *g = realloc(v, (cap *= 2) * sizeof *v);
            if (!g) {
                free(v);
                return -1;
            }
            v = g;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n = k;
    return 0;
}

/* ---- llama.cpp's spellings ---- */

int cli_llama_add_opts(cli_llama *l, int *chunk, cli_opt *t)
{
    const cli_opt o[] = {
        CLI_OPT("n-gpu-layers", 0, CLI_STR, &l->ngl, "N", "llama.cpp's GPU offload: accepted; q3 has no GPU unit yet, so a\n"
                "CPU build says it ignores it", .dash = "ngl"),
        CLI_OPT("gpu-layers", 0, CLI_STR, &l->ngl, "N", NULL, .flags = CLI_HIDDEN),
        CLI_OPT("flash-attn", 0, CLI_ONOFF, &l->fa, "on|off|auto", "accepted for llama.cpp: q3's attention is always fused", .dash = "fa"),
        CLI_OPT("cache-type-k", 0, CLI_STR, &l->ctk, "TYPE", "llama.cpp's K cache type: q3 has one type for K and V, so\n"
                "-ctk and -ctv must agree with each other and --kv", .dash = "ctk"),
        CLI_OPT("cache-type-v", 0, CLI_STR, &l->ctv, "TYPE", "llama.cpp's V cache type (see -ctk)", .dash = "ctv"),
        CLI_OPT("batch-size", 'b', CLI_INT, &l->batch, "N", "llama.cpp's logical batch: accepted; q3 prefills in --chunk pieces",
                .lo = 1, .hi = 1 << 30),
        CLI_OPT("ubatch-size", 0, CLI_INT, chunk, "N", "llama.cpp's physical batch: the same as --chunk", .lo = 1, .hi = 4096,
                .dash = "ub"),
    };
    memcpy(t, o, sizeof o);
    return (int)(sizeof o / sizeof o[0]);
}

int cli_llama_apply(const cli_spec *s, const cli_llama *l, const char **kv_dtype)
{
    static const char *const types[] = {"f32", "f16", "bf16", "q8_0"};
    const char *given_by[3] = {"--kv", "-ctk", "-ctv"}, *vals[3] = {*kv_dtype, l->ctk, l->ctv};
    const char *kv = NULL, *by = NULL;
    for (int k = 0; k < 3; k++) {
        if (!vals[k]) continue;
        int known = 0;
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) known |= !strcmp(vals[k], types[t]);
        if (!known)
            return cli_usage_error(s->cmd, "%s: q3's KV cache types are f32, f16, bf16 and q8_0, not '%.40s'", given_by[k],
                                   vals[k]);
        if (kv && strcmp(kv, vals[k]))
            return cli_usage_error(s->cmd, "%s %s and %s %s differ: q3 keeps K and V in one type (--kv)", by, kv, given_by[k],
                                   vals[k]);
        kv = vals[k];
        by = given_by[k];
    }
    *kv_dtype = kv;
    if (l->ngl) fprintf(stderr, "q3 %s: -ngl %.40s ignored: this build has no GPU unit, every layer runs on the CPU\n", s->cmd, l->ngl);
    return 0;
}
