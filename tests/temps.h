/* Temporary files of a test: one scratch folder per test program, made with
 * mkdtemp under $TMPDIR (tests/run.sh points TMPDIR at its own per-run folder,
 * which it removes at the end) and removed with everything in it when the
 * program exits. Never a fixed name in a shared folder. Shell commands a test
 * runs see the folder as $Q3_TEST_TMP.
 *
 * Also: counting the temporary files an output left beside it (util/outfile.h
 * names them PATH.<hex>.tmp, or .q3-<hex>.tmp for very long names). */
#ifndef Q3_TEST_TEMPS_H
#define Q3_TEST_TEMPS_H

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char test_tmp_root[512];
static pid_t test_tmp_owner;

static int test_tmp_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void test_tmp_cleanup(void)
{
    /* a forked child that exits runs this too: only the creator removes */
    if (test_tmp_root[0] && getpid() == test_tmp_owner) nftw(test_tmp_root, test_tmp_rm, 16, FTW_DEPTH | FTW_PHYS);
}

/* The program's scratch folder ($TMPDIR/q3-<program>-XXXXXX), made on first
 * use (and put in the environment as Q3_TEST_TMP) and removed at exit; exits
 * the program if it cannot be made. */
__attribute__((unused)) static const char *test_tmpdir(void)
{
    if (test_tmp_root[0]) return test_tmp_root;
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    snprintf(test_tmp_root, sizeof test_tmp_root, "%s/q3-%s-XXXXXX", base, program_invocation_short_name);
    if (!mkdtemp(test_tmp_root)) {
        fprintf(stderr, "mkdtemp %s: %s\n", test_tmp_root, strerror(errno));
        exit(1);
    }
    test_tmp_owner = getpid();
    atexit(test_tmp_cleanup);
    setenv("Q3_TEST_TMP", test_tmp_root, 1);
    return test_tmp_root;
}

/* The path of name in the scratch folder (one of 8 static buffers, in turn). */
__attribute__((unused)) static const char *test_tmp(const char *name)
{
    static char buf[8][768];
    static int next;
    char *p = buf[next++ & 7];
    snprintf(p, sizeof buf[0], "%s/%s", test_tmpdir(), name);
    return p;
}

/* Entries in path's folder named BASE.*.tmp or .q3-*.tmp; -1 if the folder cannot be read. */
__attribute__((unused)) static int temps_beside(const char *path)
{
    char dir[512];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    size_t bl = strlen(base);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        int tmp = len > 4 && !strcmp(e->d_name + len - 4, ".tmp");
        if (tmp && ((len > bl + 1 && !strncmp(e->d_name, base, bl) && e->d_name[bl] == '.') ||
                    !strncmp(e->d_name, ".q3-", 4)))
            n++;
    }
    closedir(d);
    return n;
}

#endif
