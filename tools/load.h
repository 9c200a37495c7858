/* How busy the machine was while a benchmark ran: the load average, the CPU
 * time other processes took and the time the hypervisor stole, so a report can
 * say a run was noisy instead of letting a verdict flip without a word. Read
 * from /proc (Linux); elsewhere every figure is -1 and nothing is judged. */
#ifndef Q3_TOOLS_LOAD_H
#define Q3_TOOLS_LOAD_H

typedef struct q3_load {
    /* filled by q3_load_begin */
    double t0, self_cpu0;         /* wall clock, this process's CPU seconds */
    unsigned long long busy0, steal0, total0; /* /proc/stat jiffies, all CPUs */
    /* filled by q3_load_end */
    int n_cpus;                   /* online CPUs */
    double load1_begin, load1_end; /* 1-minute load average (-1: unknown) */
    double others;                /* CPU time of other processes / (wall x CPUs), 0..1 (-1: unknown) */
    double steal;                 /* stolen time / all CPU time, 0..1 (-1: unknown) */
    int noisy;                    /* others > Q3_LOAD_NOISY_OTHERS or steal > Q3_LOAD_NOISY_STEAL */
} q3_load;

/* Other processes above a tenth of the machine, or more than 5% stolen, make a run noisy. */
#define Q3_LOAD_NOISY_OTHERS 0.10
#define Q3_LOAD_NOISY_STEAL 0.05

void q3_load_begin(q3_load *l);
void q3_load_end(q3_load *l);

#endif
