/* Files q3 writes and reads under hostile conditions (issue 11, round 2):
 * concurrent writers of one output, planted symlinks, closed standard
 * descriptors, signals mid-write, full devices, a model truncated while
 * mapped, FIFOs and devices where files belong, a tensor in two shards.
 * Library checks first, then q3 itself run as a child process. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/gguf_write.h"
#include "model/model.h"
#include "tools/safetensors_write.h"
#include "q3.h"
#include "temps.h"
#include "test.h"
#include "util/file.h"
#include "util/outfile.h"

#define GOLDEN TEST_DATA "/golden"

static char work[512]; /* this run's scratch folder */

/* work/name, the same string for the same name for the whole run (interned). */
static char *interned[256];
static int n_interned;

static const char *in_work(const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", work, name);
    for (int i = 0; i < n_interned; i++)
        if (!strcmp(interned[i], p)) return interned[i];
    if (n_interned == 256) abort(); /* a test bug: more distinct names than slots */
    return interned[n_interned++] = strdup(p);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    char *text = NULL;
    if (q3_read_file(path, (size_t)1 << 30, &text, n) != Q3_OK) return NULL;
    return (uint8_t *)text;
}

/* /proc files report size 0: read them to their end. */
static int proc_maps_has(pid_t pid, const char *needle)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char *text = NULL;
    size_t len = 0;
    q3_read_stream(f, path, (size_t)1 << 26, &text, &len);
    fclose(f);
    int found = text && strstr(text, needle);
    free(text);
    return found;
}

static int same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    uint8_t *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fputs(text, f) >= 0;
    return (fclose(f) == 0) && ok;
}

/* Entries of folder dir other than "." and ".." whose names end in ".tmp". */
static int count_temps(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".tmp")) n++;
    }
    closedir(d);
    return n;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void fresh_dir(const char *name)
{
    nftw(in_work(name), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    mkdir(in_work(name), 0755);
}

/* ==== running q3 ========================================================== */

typedef struct child {
    const char *argv[24];
    const char *stdin_path;   /* NULL: /dev/null */
    const char *stdout_path;  /* NULL: a file in work */
    int stdin_pipe;           /* 1: stdin is a pipe, its write end in pipe_fd */
    int close_stderr;         /* 1: the child starts with descriptor 2 closed */
    long fsize_limit;         /* >0: RLIMIT_FSIZE in bytes, SIGXFSZ ignored */
    pid_t pid;
    int pipe_fd;
} child;

static const char *child_err_path(void) { return in_work("child.stderr"); }
static const char *child_out_path(void) { return in_work("child.stdout"); }

static void child_start(child *c)
{
    int p[2] = {-1, -1};
    if (c->stdin_pipe && pipe(p) != 0) p[0] = p[1] = -1;
    fflush(NULL);
    c->pid = fork();
    if (c->pid == 0) {
        int in = c->stdin_pipe ? p[0] : open(c->stdin_path ? c->stdin_path : "/dev/null", O_RDONLY);
        int out = open(c->stdout_path ? c->stdout_path : child_out_path(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int err = open(child_err_path(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (in < 0 || out < 0 || err < 0) _exit(126);
        dup2(in, 0);
        dup2(out, 1);
        dup2(err, 2);
        if (c->stdin_pipe) close(p[1]);
        if (in > 2) close(in);
        if (out > 2) close(out);
        if (err > 2) close(err);
        if (c->close_stderr) close(2);
        if (c->fsize_limit > 0) {
            struct rlimit rl = {(rlim_t)c->fsize_limit, (rlim_t)c->fsize_limit};
            setrlimit(RLIMIT_FSIZE, &rl);
            signal(SIGXFSZ, SIG_IGN);
        }
        /* the signals the tests send act as on a terminal, even when the test
           itself runs under nohup (SIGHUP ignored, which q3 rightly keeps) */
        signal(SIGHUP, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        execv(q3_bin(), (char *const *)c->argv);
        _exit(127);
    }
    if (c->stdin_pipe) {
        close(p[0]);
        c->pipe_fd = p[1];
    }
}

/* Waits at most timeout_s for the child; kills it (SIGKILL) on time-out and
 * returns -1; otherwise its wait status. */
static int child_wait(child *c, double timeout_s)
{
    struct timespec t0, now, nap = {0, 2000000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int st;
        pid_t r = waitpid(c->pid, &st, WNOHANG);
        if (r == c->pid) return st;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec) > timeout_s) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &st, 0);
            return -1;
        }
        nanosleep(&nap, NULL);
    }
}

/* Runs q3 with the given arguments (NULL-terminated), waits up to 120 s. */
static int run_q3(child *c)
{
    c->argv[0] = q3_bin();
    child_start(c);
    return child_wait(c, 120);
}

static char *child_stderr(void)
{
    size_t n;
    char *s = (char *)slurp(child_err_path(), &n);
    return s ? s : calloc(1, 1);
}

static int exited_with(int st, int code) { return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == code; }

/* ==== library: the output-file helper ===================================== */

static void test_outfile(void)
{
    fresh_dir("of");
    const char *path = in_work("of/out.bin");
    q3_outfile *a, *b;
    CHECK(q3_outfile_open(path, &a) == Q3_OK, "open a: %s", q3_last_error());
    CHECK(q3_outfile_open(path, &b) == Q3_OK, "open b: %s", q3_last_error());
    CHECK(strcmp(q3_outfile_temp_path(a), q3_outfile_temp_path(b)) != 0, "two writers, two temporary files: %s",
          q3_outfile_temp_path(a));
    CHECK(!strncmp(q3_outfile_temp_path(a), in_work("of/"), strlen(in_work("of/"))), "temporary beside the target");
    CHECK(q3_outfile_write(a, "AAAA", 4) == Q3_OK && q3_outfile_write(b, "BBBBBBBB", 8) == Q3_OK, "writes");
    CHECK(count_temps(in_work("of")) == 2 && !q3_file_exists(path), "both temporaries, no final file yet");
    CHECK(q3_outfile_commit(a) == Q3_OK, "commit a: %s", q3_last_error());
    size_t n = 0;
    uint8_t *got = slurp(path, &n);
    CHECK(got && n == 4 && !memcmp(got, "AAAA", 4), "a's bytes, whole");
    free(got);
    CHECK(q3_outfile_write(b, "BB", 2) == Q3_OK && q3_outfile_commit(b) == Q3_OK, "commit b");
    got = slurp(path, &n);
    CHECK(got && n == 10 && !memcmp(got, "BBBBBBBBBB", 10), "then b's bytes, whole");
    free(got);
    CHECK(count_temps(in_work("of")) == 0, "no temporary left");

    /* abandoned: the temporary goes, the old file stays */
    CHECK(q3_outfile_open(path, &a) == Q3_OK && q3_outfile_write(a, "x", 1) == Q3_OK, "open again");
    q3_outfile_abort(a);
    got = slurp(path, &n);
    CHECK(got && n == 10 && count_temps(in_work("of")) == 0, "abort: old file kept, temporary removed");
    free(got);

    /* the signal-handler path: live temporaries are removed, others untouched */
    CHECK(q3_outfile_open(path, &a) == Q3_OK, "open for remove_temps");
    char tmp_copy[512];
    snprintf(tmp_copy, sizeof tmp_copy, "%s", q3_outfile_temp_path(a));
    CHECK(access(tmp_copy, F_OK) == 0, "temporary exists");
    q3_outfile_remove_temps();
    CHECK(access(tmp_copy, F_OK) != 0 && q3_file_exists(path), "remove_temps removed it, not the output");
    q3_outfile_abort(a);

    /* checks before any work */
    CHECK(q3_outfile_check("") == Q3_ERR_INVALID, "empty path refused");
    CHECK_CONTAINS(q3_last_error(), "empty");
    CHECK(q3_outfile_check(in_work("of")) == Q3_ERR_INVALID, "a folder refused");
    CHECK_CONTAINS(q3_last_error(), "is a folder");
    CHECK(q3_outfile_check(in_work("of/")) == Q3_ERR_INVALID, "a trailing slash refused");
    CHECK(q3_outfile_check(in_work("nope/x.bin")) == Q3_ERR_IO, "a missing folder refused");
    CHECK_CONTAINS(q3_last_error(), "no such folder");
    CHECK(q3_outfile_check(in_work("of/out.bin/x")) == Q3_ERR_IO, "a file as the folder refused");
    CHECK_CONTAINS(q3_last_error(), "is not a folder");
    CHECK(mkfifo(in_work("of/fifo"), 0644) == 0, "mkfifo");
    CHECK(q3_outfile_check(in_work("of/fifo")) == Q3_ERR_INVALID, "a FIFO refused");
    CHECK_CONTAINS(q3_last_error(), "is a FIFO");
    CHECK(q3_outfile_check("/dev/null") == Q3_ERR_INVALID, "a device refused (never renamed over)");
    CHECK_CONTAINS(q3_last_error(), "is a character device");
    CHECK(q3_write_file_atomic(in_work("of/w.txt"), "hello", 5) == Q3_OK, "write_file_atomic");
    CHECK(q3_file_exists(in_work("of/w.txt")) && count_temps(in_work("of")) == 0, "written, no temporary");
}

/* ==== item 1: two writers of one path ====================================== */

static float gg_data[2][4096];
static q3_gguf_writer *gg_inner;
static const char *gg_inner_path;

static q3_gguf_writer *make_gguf(int which)
{
    q3_gguf_writer *w;
    if (q3_gguf_writer_new(&w)) return NULL;
    for (int i = 0; i < 4096; i++) gg_data[which][i] = (float)(which * 10000 + i);
    q3_gguf_writer_add_str(w, "general.architecture", which ? "writer-b" : "writer-a");
    int64_t shape[2] = {64, 64};
    for (int t = 0; t < (which ? 2 : 3); t++) { /* a has three tensors, b two: the files differ in length */
        char name[32];
        snprintf(name, sizeof name, "t%d", t);
        q3_gguf_writer_add_tensor(w, name, Q3_F32, 2, shape, gg_data[which]);
    }
    return w;
}

/* After a's first tensor, b writes the same path from start to end. */
static int write_b_inside(void *user, size_t done, size_t total, uint64_t bd, uint64_t bt)
{
    (void)user, (void)total, (void)bd, (void)bt;
    if (done == 1 && gg_inner) {
        q3_gguf_writer_write(gg_inner, gg_inner_path, NULL, NULL);
        gg_inner = NULL;
    }
    return 0;
}

static void test_two_writers(void)
{
    fresh_dir("two");
    q3_gguf_writer *a = make_gguf(0), *b = make_gguf(1);
    CHECK(a && b, "writers");
    if (!a || !b) return;
    CHECK(q3_gguf_writer_write(a, in_work("two/a.gguf"), NULL, NULL) == Q3_OK, "a alone");
    CHECK(q3_gguf_writer_write(b, in_work("two/b.gguf"), NULL, NULL) == Q3_OK, "b alone");
    const char *path = in_work("two/both.gguf");
    gg_inner = b;
    gg_inner_path = path;
    q3_status st = q3_gguf_writer_write(a, path, write_b_inside, NULL);
    CHECK(st == Q3_OK, "a, with b written meanwhile: %s", q3_last_error());
    CHECK(same_file(path, in_work("two/a.gguf")) || same_file(path, in_work("two/b.gguf")),
          "the final name holds one writer's complete file, not a mix");
    CHECK(same_file(path, in_work("two/a.gguf")), "the last to finish (a) wins");
    CHECK(count_temps(in_work("two")) == 0, "no temporary left");
    q3_gguf_writer_free(a);
    q3_gguf_writer_free(b);

    /* safetensors: two writers open at once, interleaved */
    const char *sp = in_work("two/m.safetensors");
    q3_st_writer *x, *y;
    int64_t shape[1] = {256};
    float vx[256], vy[256];
    for (int i = 0; i < 256; i++) vx[i] = (float)i, vy[i] = (float)-i;
    CHECK(q3_st_writer_new(sp, &x) == Q3_OK && q3_st_writer_new(sp, &y) == Q3_OK, "two st writers");
    CHECK(q3_st_writer_add(x, "w", Q3_F32, 1, shape) == Q3_OK && q3_st_writer_add(y, "w", Q3_F32, 1, shape) == Q3_OK &&
              q3_st_writer_add(y, "extra", Q3_F32, 1, shape) == Q3_OK, "declare");
    CHECK(q3_st_writer_begin_data(x) == Q3_OK && q3_st_writer_begin_data(y) == Q3_OK, "headers");
    CHECK(q3_st_writer_write(x, 0, 0, vx, 512) == Q3_OK, "x first half");
    CHECK(q3_st_writer_write(y, 0, 0, vy, sizeof vy) == Q3_OK && q3_st_writer_write(y, 1, 0, vy, sizeof vy) == Q3_OK,
          "y whole");
    CHECK(q3_st_writer_commit(y) == Q3_OK, "y commits: %s", q3_last_error());
    CHECK(q3_st_writer_write(x, 0, 512, vx + 128, 512) == Q3_OK, "x second half: %s", q3_last_error());
    CHECK(q3_st_writer_commit(x) == Q3_OK, "x commits: %s", q3_last_error());
    q3_safetensors s;
    CHECK(q3_safetensors_open(sp, &s) == Q3_OK, "the result opens: %s", q3_last_error());
    const q3_tensor *t = q3_safetensors_find(&s, "w");
    CHECK(t && !memcmp(t->data, vx, sizeof vx) && !q3_safetensors_find(&s, "extra"), "x's file, whole");
    q3_safetensors_close(&s);
    CHECK(count_temps(in_work("two")) == 0, "no temporary left");
}

/* ==== item 3: a symlink planted at the old temporary name ================== */

static void test_planted_symlink(void)
{
    fresh_dir("sym");
    const char *victim = in_work("sym/victim.txt");
    CHECK(write_text(victim, "precious"), "victim");
    const char *out = in_work("sym/out.gguf");
    char planted[600];
    snprintf(planted, sizeof planted, "%s.tmp", out);
    CHECK(symlink(victim, planted) == 0, "plant %s", planted);
    q3_gguf_writer *w = make_gguf(0);
    CHECK(w && q3_gguf_writer_write(w, out, NULL, NULL) == Q3_OK, "gguf write: %s", q3_last_error());
    q3_gguf_writer_free(w);
    const char *st_out = in_work("sym/m.safetensors");
    snprintf(planted, sizeof planted, "%s.tmp", st_out);
    CHECK(symlink(victim, planted) == 0, "plant %s", planted);
    q3_st_writer *sw;
    int64_t shape[1] = {4};
    float v[4] = {1, 2, 3, 4};
    CHECK(q3_st_writer_new(st_out, &sw) == Q3_OK, "st writer");
    if (sw) {
        q3_st_writer_add(sw, "v", Q3_F32, 1, shape);
        q3_st_writer_begin_data(sw);
        q3_st_writer_write(sw, 0, 0, v, sizeof v);
        CHECK(q3_st_writer_commit(sw) == Q3_OK, "st commit: %s", q3_last_error());
    }
    size_t n = 0;
    uint8_t *got = slurp(victim, &n);
    CHECK(got && n == 8 && !memcmp(got, "precious", 8), "the symlink's target is untouched");
    free(got);
    struct stat sb;
    CHECK(lstat(planted, &sb) == 0 && S_ISLNK(sb.st_mode), "the planted link is left as it was");

    /* a symlink at the final name is replaced by the file, its target untouched */
    const char *link_out = in_work("sym/link.bin");
    CHECK(symlink(victim, link_out) == 0, "link at the final name");
    CHECK(q3_write_file_atomic(link_out, "new", 3) == Q3_OK, "write over the link");
    CHECK(lstat(link_out, &sb) == 0 && S_ISREG(sb.st_mode), "the final name is now a regular file");
    got = slurp(victim, &n);
    CHECK(got && n == 8 && !memcmp(got, "precious", 8), "the link's target is untouched");
    free(got);
}

/* ==== item 15: the tensor weight_map names ================================= */

static void test_weight_map_shard(void)
{
    fresh_dir("shards");
    /* two shards both holding the tiny model's weights; the second's are the real
     * ones, the first's are zeros for one tensor; weight_map names the second */
    q3_safetensors src;
    CHECK(q3_safetensors_open(GOLDEN "/tiny/model.safetensors", &src) == Q3_OK, "tiny: %s", q3_last_error());
    const char *dup_name = "model.norm.weight";
    const q3_tensor *real = q3_safetensors_find(&src, dup_name);
    CHECK(real != NULL, "tiny has %s", dup_name);
    if (!real) {
        q3_safetensors_close(&src);
        return;
    }
    /* shard 1: only model.norm.weight, all zeros; shard 2: everything */
    q3_st_writer *w;
    CHECK(q3_st_writer_new(in_work("shards/a.safetensors"), &w) == Q3_OK, "shard a");
    q3_st_writer_add(w, dup_name, real->dtype, real->ndim, real->shape);
    q3_st_writer_begin_data(w);
    void *zeros = calloc(1, real->nbytes);
    q3_st_writer_write(w, 0, 0, zeros, real->nbytes);
    free(zeros);
    CHECK(q3_st_writer_commit(w) == Q3_OK, "shard a written: %s", q3_last_error());
    size_t n = 0;
    uint8_t *whole = slurp(GOLDEN "/tiny/model.safetensors", &n);
    FILE *f = fopen(in_work("shards/b.safetensors"), "wb");
    CHECK(whole && f && fwrite(whole, 1, n, f) == n, "shard b");
    if (f) fclose(f);
    free(whole);
    /* the index: every tensor in b; a is mentioned first (for a key of its own) so it opens first */
    char *index = malloc(1 << 16);
    size_t k = (size_t)snprintf(index, 1 << 16, "{\"weight_map\": {\"unused.a\": \"a.safetensors\"");
    for (int i = 0; i < src.n_tensors; i++)
        k += (size_t)snprintf(index + k, (1 << 16) - k, ", \"%s\": \"b.safetensors\"", src.tensors[i].name);
    snprintf(index + k, (1 << 16) - k, "}}");
    CHECK(write_text(in_work("shards/model.safetensors.index.json"), index), "index");
    free(index);
    uint8_t *cfg = slurp(GOLDEN "/tiny/config.json", &n);
    f = fopen(in_work("shards/config.json"), "wb");
    CHECK(cfg && f && fwrite(cfg, 1, n, f) == n, "config");
    if (f) fclose(f);
    free(cfg);

    q3_model *m;
    CHECK(q3_model_open(in_work("shards"), &m) == Q3_OK, "sharded open: %s", q3_last_error());
    if (m) {
        CHECK(m->n_files == 2 && strstr(m->files[0].path, "a.safetensors"), "a opened first");
        CHECK(m->w.out_norm && m->w.out_norm->nbytes == real->nbytes &&
                  !memcmp(m->w.out_norm->data, real->data, real->nbytes),
              "%s comes from b, as weight_map says, not from a (the first shard holding one)", dup_name);
        q3_model_close(m);
    }
    q3_safetensors_close(&src);
}

/* ==== q3 itself ============================================================= */

/* Item 1 through the CLI: two converts of one model to one -o at once. */
static void test_cli_concurrent_convert(void)
{
    fresh_dir("cc");
    child ref = {.argv = {NULL, "convert", GOLDEN "/small", "-o", in_work("cc/ref-f32.gguf"), "--type", "f32",
                          "--no-tokenizer", "--quiet", NULL}};
    CHECK(exited_with(run_q3(&ref), 0), "reference f32");
    child ref2 = {.argv = {NULL, "convert", GOLDEN "/small", "-o", in_work("cc/ref-q8.gguf"), "--type", "q8_0",
                           "--no-tokenizer", "--quiet", NULL}};
    CHECK(exited_with(run_q3(&ref2), 0), "reference q8_0");
    for (int round = 0; round < 3; round++) {
        char out[512];
        snprintf(out, sizeof out, "%s", in_work("cc/out.gguf"));
        child a = {.argv = {q3_bin(), "convert", GOLDEN "/small", "-o", out, "--type", "f32", "--no-tokenizer",
                            "--quiet", NULL}};
        child b = {.argv = {q3_bin(), "convert", GOLDEN "/small", "-o", out, "--type", "q8_0", "--no-tokenizer",
                            "--quiet", NULL},
                   .stdout_path = in_work("cc/b.stdout")};
        child_start(&a);
        child_start(&b);
        int sa = child_wait(&a, 120), sb = child_wait(&b, 120);
        CHECK(exited_with(sa, 0) && exited_with(sb, 0), "round %d: both succeed (%d, %d)", round, sa, sb);
        CHECK(same_file(out, in_work("cc/ref-f32.gguf")) || same_file(out, in_work("cc/ref-q8.gguf")),
              "round %d: the output is one conversion, whole", round);
        CHECK(count_temps(in_work("cc")) == 0, "round %d: no temporary left", round);
    }
}

/* Item 2: descriptors 0-2 closed at start-up. */
static void test_cli_closed_stderr(void)
{
    fresh_dir("fd");
    /* chat waits on stdin once the model is loaded: look at its descriptor 2 then */
    child c = {.argv = {NULL, "chat", "-m", GOLDEN "/e2e", "-n", "1", NULL}, .stdin_pipe = 1, .close_stderr = 1};
    c.argv[0] = q3_bin();
    child_start(&c);
    char proc[64], link[512] = "";
    int mapped = 0;
    for (int i = 0; i < 3000 && !mapped; i++) { /* until the weights are mapped (at most 30 s) */
        mapped = proc_maps_has(c.pid, "model.safetensors");
        if (!mapped) usleep(10000);
    }
    CHECK(mapped, "chat loaded the model");
    snprintf(proc, sizeof proc, "/proc/%d/fd/2", (int)c.pid);
    ssize_t len = readlink(proc, link, sizeof link - 1);
    link[len > 0 ? len : 0] = 0;
    CHECK(!strcmp(link, "/dev/null"), "a closed stderr is /dev/null, not a file q3 opened: '%s'", link);
    close(c.pipe_fd);
    CHECK(exited_with(child_wait(&c, 60), 0), "chat ends at end of input");

    /* a convert long enough to print progress, with stderr closed: the file is
     * byte for byte the one made with stderr open (stopped a while mid-write so
     * that the progress line is due) */
    child ref = {.argv = {NULL, "convert", GOLDEN "/e2e", "-o", in_work("fd/ref.gguf"), "--type", "q4_0",
                          "--quiet", NULL}};
    CHECK(exited_with(run_q3(&ref), 0), "reference conversion");
    int stopped = 0;
    for (int attempt = 0; attempt < 5 && !stopped; attempt++) {
        fresh_dir("fd/run");
        char out[512];
        snprintf(out, sizeof out, "%s", in_work("fd/run/out.gguf"));
        child cv = {.argv = {q3_bin(), "convert", GOLDEN "/e2e", "-o", out, "--type", "q4_0", NULL},
                    .close_stderr = 1};
        child_start(&cv);
        for (int i = 0; i < 20000 && !stopped; i++) {
            if (count_temps(in_work("fd/run")) > 0) {
                kill(cv.pid, SIGSTOP);
                stopped = count_temps(in_work("fd/run")) > 0; /* still writing when stopped */
                usleep(1200000);
                kill(cv.pid, SIGCONT);
                break;
            }
            int st;
            if (waitpid(cv.pid, &st, WNOHANG) == cv.pid) {
                cv.pid = -1;
                break;
            }
            usleep(500);
        }
        if (cv.pid > 0) {
            int st = child_wait(&cv, 120);
            CHECK(exited_with(st, 0), "convert with stderr closed: %d", st);
        }
        if (stopped)
            CHECK(same_file(out, in_work("fd/ref.gguf")), "no progress line inside the GGUF");
    }
    CHECK(stopped, "caught a conversion mid-write");
}

/* Item 4: signals mid-write leave nothing; a bad -o fails before the work. */
static void test_cli_signals_and_output_checks(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t s = 0; s < 3; s++) {
        int caught = 0;
        for (int attempt = 0; attempt < 5 && !caught; attempt++) {
            fresh_dir("sig");
            child cv = {.argv = {q3_bin(), "convert", GOLDEN "/e2e", "-o", in_work("sig/out.gguf"), "--type",
                                 "f32", "--quiet", NULL}};
            child_start(&cv);
            int st = 0, done = 0;
            for (int i = 0; i < 40000; i++) {
                if (count_temps(in_work("sig")) > 0) {
                    kill(cv.pid, sigs[s]);
                    break;
                }
                if (waitpid(cv.pid, &st, WNOHANG) == cv.pid) {
                    done = 1;
                    break;
                }
                usleep(250);
            }
            if (!done) st = child_wait(&cv, 60);
            if (st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == sigs[s]) {
                caught = 1;
                CHECK(count_entries(in_work("sig")) == 0, "signal %d: no temporary and no output left (%d entries)",
                      sigs[s], count_entries(in_work("sig")));
            }
        }
        CHECK(caught, "signal %d ended a conversion mid-write", sigs[s]);
    }

    /* -o checked before the model is even opened: the message is about -o
       (a model that does not exist is a usage error of its own, exit 2) */
    struct { const char *out, *want; } bad[] = {
        {"", "empty"},
        {work, "is a folder"},
        {"/nonexistent-q3-folder/x.gguf", "no such folder"},
        {"/dev/null", "is a character device"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        child c = {.argv = {NULL, "convert", GOLDEN "/tiny", "-o", bad[i].out, NULL}};
        int st = run_q3(&c);
        char *err = child_stderr();
        CHECK(exited_with(st, 1), "convert -o '%s': exit %d", bad[i].out, st);
        CHECK_CONTAINS(err, bad[i].want);
        free(err);
        child l = {.argv = {NULL, "logits", "-m", GOLDEN "/tiny", "--tokens", "1", "-o", bad[i].out, NULL}};
        st = run_q3(&l);
        err = child_stderr();
        CHECK(exited_with(st, 1), "logits -o '%s': exit %d", bad[i].out, st);
        CHECK_CONTAINS(err, bad[i].want);
        free(err);
    }
    child sy = {.argv = {NULL, "synth", "-o", "", NULL}};
    int st = run_q3(&sy);
    char *err = child_stderr();
    CHECK(exited_with(st, 1), "synth -o '': exit %d", st);
    CHECK_CONTAINS(err, "empty");
    free(err);
}

/* Item 5: write errors. */
static void test_cli_write_errors(void)
{
    fresh_dir("full");
    CHECK(write_text(in_work("full/text.txt"), "hello world"), "input");
    CHECK(write_text(in_work("full/ids.txt"), "1,2,3"), "ids");
    struct { const char *argv[12]; const char *in; } cmds[] = {
        {{"tokenize", "--tokenizer", GOLDEN "/e2e", NULL}, "full/text.txt"},
        {{"detokenize", "--tokenizer", GOLDEN "/e2e", NULL}, "full/ids.txt"},
        {{"info", "-m", GOLDEN "/tiny", NULL}, NULL},
        {{"run", "-m", GOLDEN "/e2e", "-p", "hi", "-n", "3", "--temp", "0", NULL}, NULL},
        {{"chat-template", NULL}, "full/conv.json"},
    };
    CHECK(write_text(in_work("full/conv.json"), "[{\"role\":\"user\",\"content\":\"hi\"}]"), "conversation");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        child ok = {.stdin_path = cmds[i].in ? in_work(cmds[i].in) : NULL};
        child full = {.stdout_path = "/dev/full", .stdin_path = ok.stdin_path};
        for (int a = 0; cmds[i].argv[a]; a++) ok.argv[a + 1] = full.argv[a + 1] = cmds[i].argv[a];
        int st = run_q3(&ok);
        CHECK(exited_with(st, 0), "%s to a file: exit %d", cmds[i].argv[0], st);
        st = run_q3(&full);
        char *err = child_stderr();
        CHECK(exited_with(st, 1), "%s >/dev/full: exit %d", cmds[i].argv[0], st);
        CHECK_CONTAINS(err, "error writing to standard output");
        free(err);
    }

    /* logits -o on a "full disk" (a file-size limit): an error, and nothing under the final name */
    char out[512];
    snprintf(out, sizeof out, "%s", in_work("full/logits.f32"));
    child l = {.argv = {NULL, "logits", "-m", GOLDEN "/tiny", "--tokens", "1,2,3,4", "-o", out, NULL},
               .fsize_limit = 4096};
    int st = run_q3(&l);
    char *err = child_stderr();
    CHECK(exited_with(st, 1), "logits over the size limit: exit %d", st);
    CHECK_CONTAINS(err, "write failed");
    free(err);
    CHECK(access(out, F_OK) != 0, "no partial file under the final name");
    CHECK(count_temps(in_work("full")) == 0, "no temporary left");
    child lok = {.argv = {NULL, "logits", "-m", GOLDEN "/tiny", "--tokens", "1,2,3,4", "-o", out, NULL}};
    CHECK(exited_with(run_q3(&lok), 0), "logits without a limit");
    struct stat sb;
    CHECK(stat(out, &sb) == 0 && sb.st_size == 4 * 1024 * 4, "4 rows of 1024 floats: %lld", (long long)sb.st_size);
}

/* Item 9: the model file truncated while mapped. */
static void test_cli_truncated_model(void)
{
    fresh_dir("trunc");
    size_t n = 0;
    uint8_t *w = slurp(GOLDEN "/e2e/model.safetensors", &n);
    FILE *f = fopen(in_work("trunc/model.safetensors"), "wb");
    CHECK(w && f && fwrite(w, 1, n, f) == n, "copy the model");
    if (f) fclose(f);
    free(w);
    static const char *links[] = {"config.json", "tokenizer.json", "tokenizer_config.json"};
    char cwd[400];
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "cwd");
    for (int i = 0; i < 3; i++) {
        char target[600], name[64];
        snprintf(target, sizeof target, "%s/" GOLDEN "/e2e/%s", cwd, links[i]);
        snprintf(name, sizeof name, "trunc/%s", links[i]);
        CHECK(symlink(target, in_work(name)) == 0, "link %s", links[i]);
    }
    child c = {.argv = {NULL, "chat", "-m", in_work("trunc"), "-n", "4", "--temp", "0", NULL}, .stdin_pipe = 1};
    c.argv[0] = q3_bin();
    child_start(&c);
    int mapped = 0;
    for (int i = 0; i < 3000 && !mapped; i++) {
        mapped = proc_maps_has(c.pid, "trunc/model.safetensors");
        if (!mapped) usleep(10000);
    }
    CHECK(mapped, "the model is mapped");
    CHECK(truncate(in_work("trunc/model.safetensors"), 4096) == 0, "truncate underneath");
    CHECK(write(c.pipe_fd, "hello\n", 6) == 6, "a message");
    close(c.pipe_fd);
    int st = child_wait(&c, 60);
    char *err = child_stderr();
    CHECK(exited_with(st, 1), "exit 1, not a bare SIGBUS: status %d (signal %d)", st,
          st != -1 && WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    CHECK_CONTAINS(err, "trunc/model.safetensors: the file changed while q3 was reading it");
    free(err);
}

/* Item 15: FIFOs, devices and loops where files belong. */
static void test_cli_special_inputs(void)
{
    fresh_dir("fifo");
    const char *fifo = in_work("fifo/p");
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo");
    /* each would block forever in open() before; 20 s is ample */
    child m = {.argv = {NULL, "run", "-m", GOLDEN "/e2e", "--messages", fifo, "-n", "1", NULL}};
    m.argv[0] = q3_bin();
    child_start(&m);
    int st = child_wait(&m, 20);
    char *err = child_stderr();
    CHECK(exited_with(st, 1), "--messages FIFO: exit %d", st);
    CHECK_CONTAINS(err, "is a FIFO");
    free(err);
    child t = {.argv = {NULL, "tokenize", "--tokenizer", fifo, NULL}, .stdin_path = GOLDEN "/e2e/config.json"};
    t.argv[0] = q3_bin();
    child_start(&t);
    st = child_wait(&t, 20);
    err = child_stderr();
    CHECK(exited_with(st, 1), "--tokenizer FIFO: exit %d", st);
    CHECK_CONTAINS(err, "is a FIFO");
    free(err);
    child rt = {.argv = {NULL, "run", "-m", GOLDEN "/tiny", "--tokenizer", fifo, "-p", "hi", NULL}};
    rt.argv[0] = q3_bin();
    child_start(&rt);
    st = child_wait(&rt, 20);
    err = child_stderr();
    CHECK(exited_with(st, 1), "--tokenizer FIFO: exit %d", st);
    CHECK_CONTAINS(err, "is a FIFO");
    free(err);

    /* tokenizer_config.json a FIFO: an error, not the built-in template */
    char cwd[400];
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "cwd");
    fresh_dir("tcfg");
    static const char *links[] = {"config.json", "tokenizer.json", "model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char target[600], name[64];
        snprintf(target, sizeof target, "%s/" GOLDEN "/e2e/%s", cwd, links[i]);
        snprintf(name, sizeof name, "tcfg/%s", links[i]);
        CHECK(symlink(target, in_work(name)) == 0, "link %s", links[i]);
    }
    CHECK(mkfifo(in_work("tcfg/tokenizer_config.json"), 0644) == 0, "FIFO as tokenizer_config.json");
    child tc = {.argv = {NULL, "run", "-m", in_work("tcfg"), "-p", "hi", "-n", "1", NULL}};
    tc.argv[0] = q3_bin();
    child_start(&tc);
    st = child_wait(&tc, 30);
    err = child_stderr();
    CHECK(exited_with(st, 1), "FIFO tokenizer_config.json: exit %d", st);
    CHECK_CONTAINS(err, "tokenizer_config.json: is a FIFO");
    free(err);
    child cv = {.argv = {NULL, "convert", in_work("tcfg"), "-o", in_work("fifo/x.gguf"), "--quiet", NULL}};
    cv.argv[0] = q3_bin();
    child_start(&cv);
    st = child_wait(&cv, 30);
    err = child_stderr();
    CHECK(exited_with(st, 1), "convert with a FIFO tokenizer_config.json: exit %d", st);
    CHECK_CONTAINS(err, "tokenizer_config.json: is a FIFO");
    free(err);
    CHECK(access(in_work("fifo/x.gguf"), F_OK) != 0, "no GGUF without its chat template");

    /* the model path: say what it is */
    CHECK(symlink("loop-b", in_work("fifo/loop-a")) == 0 && symlink("loop-a", in_work("fifo/loop-b")) == 0, "loop");
    /* a path that does not resolve is a usage error (exit 2); one that is not a model, a runtime error (1) */
    struct { const char *model, *want; int code; } models[] = {
        {in_work("fifo/loop-a"), "oo many levels of symbolic links", 2},
        {"/dev/zero", "is a character device", 1},
        {fifo, "is a FIFO", 1},
        {in_work("fifo/none"), "no such file or folder", 2},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        child c = {.argv = {NULL, "info", "-m", models[i].model, NULL}};
        c.argv[0] = q3_bin();
        child_start(&c);
        st = child_wait(&c, 20);
        err = child_stderr();
        CHECK(exited_with(st, models[i].code), "info -m %s: exit %d", models[i].model, st);
        CHECK_CONTAINS(err, models[i].want);
        free(err);
    }
}

int main(void)
{
    snprintf(work, sizeof work, "%s", test_tmpdir());
    test_outfile();
    test_two_writers();
    test_planted_symlink();
    test_weight_map_shard();
    test_cli_concurrent_convert();
    test_cli_closed_stderr();
    test_cli_signals_and_output_checks();
    test_cli_write_errors();
    test_cli_truncated_model();
    test_cli_special_inputs();
    nftw(work, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    for (int i = 0; i < n_interned; i++) free(interned[i]);
    TEST_DONE();
}
