/* One persistent pool of worker threads for the cpu unit. The calling thread
 * is thread 0 and works too; q3_pool_run returns when every thread has
 * finished, which is the barrier between two ops. Workers spin briefly
 * waiting for the next job (ops follow each other within microseconds), then
 * sleep on a futex so an idle pool costs nothing. */
#ifndef Q3_BACKEND_CPU_THREADPOOL_H
#define Q3_BACKEND_CPU_THREADPOOL_H

#include <stdint.h>

typedef struct q3_pool q3_pool;

/* A job: runs on every thread; ith in [0, nth). */
typedef void (*q3_pool_fn)(void *ctx, int ith, int nth);

/* Starts n_threads - 1 workers (the caller is the n-th). NULL on failure. */
q3_pool *q3_pool_new(int n_threads);
void q3_pool_free(q3_pool *p);
int q3_pool_size(const q3_pool *p);

/* Runs fn(ctx, ith, nth) on all threads and waits for all of them. Not
 * reentrant: one job at a time (the caller serialises). */
void q3_pool_run(q3_pool *p, q3_pool_fn fn, void *ctx);

/* Inside a job: returns when all nth threads of the job have reached it. */
void q3_pool_barrier(q3_pool *p);

/* Synchronisation counts since the pool started: runs (each one ends in a
 * join, i.e. a barrier) and barriers taken inside jobs. */
typedef struct q3_pool_stats {
    uint64_t runs;
    uint64_t inner_barriers;
} q3_pool_stats;
q3_pool_stats q3_pool_get_stats(const q3_pool *p);

#endif
