#include "tools/defaults.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/synth.h"
#include "util/error.h"
#include "util/file.h"

static int has_tokenizer(const char *dir)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    return q3_file_exists(p);
}

const char *q3_cache_dir(void)
{
    static char dir[PATH_MAX];
    const char *env = getenv("Q3_MODELS");
    if (env && *env) return env;
    if ((env = getenv("Q3_CACHE_DIR")) && *env) return env;
    if ((env = getenv("XDG_CACHE_HOME")) && *env == '/') snprintf(dir, sizeof dir, "%s/q3", env);
    else if ((env = getenv("HOME")) && *env) snprintf(dir, sizeof dir, "%s/.cache/q3", env);
    else snprintf(dir, sizeof dir, "/tmp/q3-cache-%ld", (long)getuid());
    return dir;
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    return mkdir(p, 0755) == 0 || q3_is_dir(p) ? 0 : -1;
}

const char *q3_default_tokenizer_dir(void)
{
    static char found[PATH_MAX];
    const char *env = getenv("Q3_TOKENIZER");
    if (env && has_tokenizer(env)) return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) { /* build/q3 beside models/ of the source tree, or PREFIX/bin/q3 beside PREFIX/share/q3 */
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(found, sizeof found, "%s/../models/qwen3-tokenizer", exe);
        if (has_tokenizer(found)) return found;
        snprintf(found, sizeof found, "%s/../share/q3/qwen3-tokenizer", exe);
        if (has_tokenizer(found)) return found;
    }
    snprintf(found, sizeof found, "%s/qwen3-tokenizer", q3_cache_dir());
    if (has_tokenizer(found)) return found;
    return NULL;
}

q3_status q3_default_model(const char *cmd, const char **out)
{
    static char dir[PATH_MAX];
    const char *root = q3_cache_dir();
    snprintf(dir, sizeof dir, "%s/synth-qwen3-0.6b", root);
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (q3_file_exists(p)) {
        *out = dir;
        return Q3_OK;
    }
    if (make_dirs(root))
        return q3_fail(Q3_ERR_IO, "cannot create the cache folder %s (%s, or pass -m MODEL)", root,
                       getenv("Q3_MODELS") && *getenv("Q3_MODELS") ? "Q3_MODELS names it: point it at a folder you can write"
                       : getenv("Q3_CACHE_DIR") && *getenv("Q3_CACHE_DIR") ? "Q3_CACHE_DIR names it: point it at a folder you can write"
                       : "set Q3_CACHE_DIR to a folder you can write");
    q3_config cfg;
    q3_synth_preset_qwen3_0_6b(&cfg);
    fprintf(stderr, "q3 %s: no model given: writing the synthetic Qwen3-0.6B (random BF16 weights) to %s ...\n", cmd,
            dir);
    double t0 = q3_now();
    q3_status st = q3_synth_write(dir, 0, Q3_BF16, &cfg, q3_default_tokenizer_dir());
    if (st) return st;
    fprintf(stderr, "q3 %s: wrote it in %.1f s\n", cmd, q3_now() - t0);
    *out = dir;
    return Q3_OK;
}
