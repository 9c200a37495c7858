/* The q3 process's own hygiene: descriptors 0-2 open at start-up, temporary
 * output files removed when a signal ends the process, a bus error on a
 * truncated model file reported by name, and stdout's write errors turned
 * into a message and a non-zero exit. */
#include "tools/process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util/file.h"
#include "util/outfile.h"

/* A closed 0, 1 or 2 would be handed to the next open(): an output file
 * opened as descriptor 2 would receive every progress line and message. */
static void open_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        int nfd = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (nfd < 0) _exit(127); /* no /dev/null: nothing safe to do */
        if (nfd != fd) { /* cannot happen when the lower ones are open, but be sure */
            dup2(nfd, fd);
            close(nfd);
        }
    }
}

static void put(const char *s) { (void)!write(STDERR_FILENO, s, strlen(s)); }

/* SIGINT, SIGTERM, SIGHUP: remove the temporary output files, then die of
 * the same signal so that the parent sees how it ended. */
static void on_terminate(int sig)
{
    q3_outfile_remove_temps();
    signal(sig, SIG_DFL);
    raise(sig); /* delivered when the handler returns (sig is blocked until then) */
}

/* SIGBUS inside a mapped model file: the file shrank underneath (truncated,
 * rewritten in place). Name it and exit 1; anything else is a real crash. */
static void on_sigbus(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    const char *path = q3_mapped_file_at(si->si_addr);
    q3_outfile_remove_temps();
    if (!path) {
        signal(sig, SIG_DFL); /* the faulting access repeats and ends the process as before */
        return;
    }
    put("q3: ");
    put(path);
    put(": the file changed while q3 was reading it (truncated or rewritten in place?); stopping\n");
    _exit(1);
}

void q3_process_init(void)
{
    open_std_fds();
    static const int ends[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        struct sigaction old;
        if (sigaction(ends[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue; /* nohup, & */
        struct sigaction sa = {0};
        sa.sa_handler = on_terminate;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(ends[i], &sa, NULL);
    }
    struct sigaction bus = {0};
    bus.sa_sigaction = on_sigbus;
    sigemptyset(&bus.sa_mask);
    bus.sa_flags = SA_SIGINFO;
    sigaction(SIGBUS, &bus, NULL);
    /* over a file-size limit a write fails with EFBIG and is reported, rather than a core dump */
    signal(SIGXFSZ, SIG_IGN);
}

int q3_process_finish_stdout(int rc)
{
    int failed = ferror(stdout) != 0, err = 0;
    if (fflush(stdout) != 0) {
        failed = 1;
        err = errno;
    }
    if (fclose(stdout) != 0 && !err) {
        failed = 1;
        err = errno;
    }
    if (!failed) return rc;
    if (err == EPIPE) return rc ? rc : 1; /* the reader left (SIGPIPE ignored): nothing to tell it */
    fprintf(stderr, "q3: error writing to standard output: %s\n", err ? strerror(err) : "a write failed");
    return rc ? rc : 1;
}
