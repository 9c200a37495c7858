/* Process-wide set-up of the q3 binary (tools/process.c): it needs what the
 * library keeps internal (temporary output files, the table of mapped files). */
#ifndef Q3_TOOLS_PROCESS_H
#define Q3_TOOLS_PROCESS_H

/* Called first in main: opens /dev/null on any of descriptors 0-2 that is
 * closed (so no output file is ever opened as stdout or stderr); on SIGINT,
 * SIGTERM and SIGHUP (unless ignored) removes temporary output files and dies
 * of the signal; on SIGBUS in a mapped model file prints
 * "q3: PATH: the file changed while q3 was reading it ..." and exits 1;
 * ignores SIGXFSZ so that an over-size write fails with a message. */
void q3_process_init(void);

/* Called last in main with the command's exit status: flushes and closes
 * stdout, and if any write to it failed (a full disk, /dev/full) prints
 * "q3: error writing to standard output: ..." and returns 1 when rc was 0. */
int q3_process_finish_stdout(int rc);

#endif
