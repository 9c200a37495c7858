#include "tools/load.h"

#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "q3.h"

static double load1(void)
{
    double v = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

/* The "cpu " line of /proc/stat: busy (user nice system irq softirq), steal and
 * the total of the eight first fields. 0 on success. */
static int cpu_jiffies(unsigned long long *busy, unsigned long long *steal, unsigned long long *total)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 8) return -1;
    *busy = v[0] + v[1] + v[2] + v[5] + v[6];
    *steal = v[7];
    *total = 0;
    for (int i = 0; i < 8; i++) *total += v[i];
    return 0;
}

static double self_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

void q3_load_begin(q3_load *l)
{
    memset(l, 0, sizeof *l);
    l->load1_begin = load1();
    l->t0 = q3_now();
    l->self_cpu0 = self_cpu();
    if (cpu_jiffies(&l->busy0, &l->steal0, &l->total0)) l->total0 = 0;
}

void q3_load_end(q3_load *l)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN), hz = sysconf(_SC_CLK_TCK);
    l->n_cpus = n > 0 ? (int)n : 1;
    l->load1_end = load1();
    l->others = l->steal = -1;
    unsigned long long busy, steal, total;
    double wall = q3_now() - l->t0, mine = self_cpu() - l->self_cpu0;
    if (l->total0 && hz > 0 && wall > 0 && !cpu_jiffies(&busy, &steal, &total) && total > l->total0) {
        double busy_s = (double)(busy - l->busy0) / (double)hz;
        double others = (busy_s - mine) / (wall * l->n_cpus);
        l->others = others < 0 ? 0 : others > 1 ? 1 : others;
        l->steal = (double)(steal - l->steal0) / (double)(total - l->total0);
    }
    l->noisy = l->others > Q3_LOAD_NOISY_OTHERS || l->steal > Q3_LOAD_NOISY_STEAL;
}
