/* Shared pieces of the libFuzzer targets in fuzz/.
 *
 * Each fuzz/fuzz_<name>.c defines `static int fuzz_<name>(const uint8_t *, size_t)`,
 * the whole check of one input, and (unless FUZZ_NO_MAIN is defined) the
 * LLVMFuzzerTestOneInput that calls it. tests/test_fuzz_regressions.c defines
 * FUZZ_NO_MAIN and includes every target, so the regression inputs and the seed
 * corpora go through exactly the code the fuzzer ran.
 *
 * A target checks invariants, not only "no crash": FUZZ_CHECK(cond, ...) aborts
 * under the fuzzer (libFuzzer saves the input as a crash) and counts a failure in
 * the regression test. */
#ifndef Q3_FUZZ_COMMON_H
#define Q3_FUZZ_COMMON_H

#include <ftw.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "q3.h"

/* ---- failing ------------------------------------------------------------- */

static int fuzz_failures; /* regression mode: invariants that failed */

__attribute__((format(printf, 3, 4))) static void fuzz_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FUZZ INVARIANT %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
#ifdef FUZZ_NO_MAIN
    fuzz_failures++;
#else
    abort();
#endif
}

#define FUZZ_CHECK(cond, ...)                                         \
    do {                                                              \
        if (!(cond)) fuzz_fail(__FILE__, __LINE__, __VA_ARGS__);      \
    } while (0)

/* Every failure must carry a known status and a message. */
#define FUZZ_CHECK_FAILURE(st)                                                                   \
    do {                                                                                         \
        FUZZ_CHECK((st) > Q3_OK && (st) <= Q3_ERR_CONTEXT, "unknown status %d", (int)(st));      \
        FUZZ_CHECK(q3_last_error()[0] != 0, "status %s without a message", q3_status_name(st)); \
    } while (0)

/* FUZZ_VERBOSE=1 in the environment: each target says what its entry points
 * answered (to check that seeds reach the code they are meant for). */
static void fuzz_note(const char *what, q3_status st)
{
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("FUZZ_VERBOSE") && *getenv("FUZZ_VERBOSE") != '0';
    if (verbose) fprintf(stderr, "  %s: %s %s\n", what, q3_status_name(st), st ? q3_last_error() : "");
}

/* ---- scratch files ------------------------------------------------------- */

static char fuzz_dir_path[256];

static int fuzz_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void fuzz_remove_dir(void)
{
    if (fuzz_dir_path[0]) nftw(fuzz_dir_path, fuzz_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    fuzz_dir_path[0] = 0;
}

/* A private scratch folder, created on first use and removed at exit: under
 * the fuzzer in /dev/shm when there is one (no disk traffic), in the test
 * suite (FUZZ_NO_MAIN) under $TMPDIR, the suite's per-run folder. */
static const char *fuzz_dir(void)
{
    if (fuzz_dir_path[0]) return fuzz_dir_path;
#ifdef FUZZ_NO_MAIN
    const char *bases[] = {getenv("TMPDIR"), "/tmp"};
#else
    const char *bases[] = {"/dev/shm", getenv("TMPDIR"), "/tmp"};
#endif
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
        if (!bases[i] || !*bases[i]) continue;
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/q3fuzz.XXXXXX", bases[i]);
        if (mkdtemp(fuzz_dir_path)) {
            atexit(fuzz_remove_dir);
            return fuzz_dir_path;
        }
    }
    fprintf(stderr, "fuzz: cannot create a scratch folder\n");
    abort();
}

/* The scratch sub-folder of one target (each target has its own, so that the
 * regression test can run them all in one process). */
static const char *fuzz_subdir(const char *target)
{
    static char buf[4][400];
    static int next;
    char *p = buf[next++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", fuzz_dir(), target);
    mkdir(p, 0700);
    return p;
}

/* Path of `name` in the target's scratch sub-folder (static buffer, 4 in turn). */
static const char *fuzz_path(const char *target, const char *name)
{
    static char buf[4][600];
    static int next;
    char *p = buf[next++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", fuzz_subdir(target), name);
    return p;
}

/* Replaces the file at path with data[0..n). */
static void fuzz_write(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror(path);
        abort();
    }
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            perror(path);
            abort();
        }
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* A NUL-terminated heap copy of data (caller frees). */
static char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* ---- UTF-8, checked independently of src/text/utf8.c ---------------------- */

/* 1 if s[0..n) is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF). */
static int fuzz_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s, *e = p + n;
    while (p < e) {
        unsigned c = *p;
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { p++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else return 0;
        if ((size_t)(e - p) <= k) return 0;
        if (p[1] < lo || p[1] > hi) return 0;
        for (size_t i = 2; i <= k; i++)
            if (p[i] < 0x80 || p[i] > 0xBF) return 0;
        p += k + 1;
    }
    return 1;
}

/* ---- little-endian reads of fuzz input ------------------------------------ */

static uint64_t fuzz_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t fuzz_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- a micro Qwen3 config (1 layer, dim 8) that the model targets load ----- */

#define FUZZ_MICRO_CONFIG                                                                     \
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"head_dim\": 4,"  \
    " \"hidden_size\": 8, \"intermediate_size\": 16, \"max_position_embeddings\": 64,"       \
    " \"num_attention_heads\": 2, \"num_hidden_layers\": 1, \"num_key_value_heads\": 1,"     \
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true,"     \
    " \"torch_dtype\": \"float32\", \"vocab_size\": 16}"

#endif
