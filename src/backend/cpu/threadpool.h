/* One persistent pool of worker threads for the cpu unit. A job is a number
 * of work items; the calling thread and the workers claim items from a
 * shared counter until none are left, and q3_pool_run returns when every
 * item is done, which is the barrier between two ops.
 *
 * A job never waits for a thread that has not claimed an item: on a busy
 * machine, where a worker may be descheduled for a whole time slice, the
 * threads that are running do the work (a fork-join pool that waits for
 * every thread would stall for the slice at every op). Workers spin briefly
 * waiting for the next job (ops follow each other within microseconds),
 * then sleep on a futex so an idle pool costs nothing; the caller, waiting
 * for items other threads hold, spins briefly too and then sleeps, so its
 * core goes idle and the scheduler can move a descheduled worker onto it.
 * When joins keep waiting a scheduler slice for such a worker anyway, or the
 * caller itself keeps losing its core (the machine's other work wants one),
 * the pool runs the next jobs with one thread fewer for a while
 * (q3_pool_shed_jobs). */
#ifndef Q3_BACKEND_CPU_THREADPOOL_H
#define Q3_BACKEND_CPU_THREADPOOL_H

#include <stdint.h>

typedef struct q3_pool q3_pool;

typedef struct q3_pool_job {
    /* optional: runs on a thread before the first item it claims in this job
       (per-thread preparation, e.g. packing activations into its scratch) */
    void (*begin)(void *ctx, int ith);
    void (*item)(void *ctx, int item, int ith); /* item in [0, n_items), ith in [0, nth) */
    void *ctx;
    int n_items;
} q3_pool_job;

/* Starts n_threads - 1 workers (the caller is thread 0). NULL on failure. */
q3_pool *q3_pool_new(int n_threads);
void q3_pool_free(q3_pool *p);
int q3_pool_size(const q3_pool *p);

/* Runs every item of the job and returns when all are done. One job at a
 * time (the caller serialises). */
void q3_pool_run(q3_pool *p, const q3_pool_job *job);

/* Jobs run since the pool started (each ends in a join: one synchronisation). */
uint64_t q3_pool_jobs(const q3_pool *p);

/* Of those, the jobs of several items run with fewer threads than the pool
 * has, because its threads kept losing their cores (see threadpool.c). */
uint64_t q3_pool_shed_jobs(const q3_pool *p);

/* The threads that take items now (the caller included): the pool's size
 * unless contention took some off. */
int q3_pool_active(const q3_pool *p);

#endif
