/* The persistent thread pool: a generation counter announces each job;
 * workers spin on it for a short while, then sleep on it with a futex. */
#include "backend/cpu/threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Pause instructions a worker spins before it sleeps: ~100-200 us on recent
 * x86 (a pause is ~40-140 cycles), longer than the gap between two ops of a
 * graph, shorter than a human would notice as CPU burn. */
#define SPIN_PAUSES 4000

typedef struct worker {
    q3_pool *pool;
    int ith;
    pthread_t thread;
} worker;

struct q3_pool {
    int nth;
    worker *workers;                 /* [nth], [0] unused (the caller) */
    /* the job; written by the caller before generation is bumped */
    q3_pool_fn fn;
    void *ctx;
    bool quit;
    _Alignas(64) _Atomic uint32_t generation; /* futex word: bumped once per job */
    _Alignas(64) _Atomic int sleepers;        /* workers in (or entering) futex_wait */
    _Alignas(64) _Atomic int pending;         /* workers that have not finished the job */
    _Alignas(64) _Atomic int bar_count;       /* threads arrived at the inner barrier */
    _Alignas(64) _Atomic uint32_t bar_phase;
    uint64_t runs, inner_barriers;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Waits until generation differs from seen; returns the new value. */
static uint32_t wait_for_job(q3_pool *p, uint32_t seen)
{
    for (int i = 0; i < SPIN_PAUSES; i++) {
        uint32_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
    }
    for (;;) {
        atomic_fetch_add(&p->sleepers, 1); /* seq_cst: pairs with the caller's bump then check */
        uint32_t g = atomic_load(&p->generation);
        if (g == seen) futex_wait(&p->generation, seen);
        atomic_fetch_sub(&p->sleepers, 1);
        g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen) return g;
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    q3_pool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_for_job(p, seen);
        if (p->quit) break;
        p->fn(p->ctx, w->ith, p->nth);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

q3_pool *q3_pool_new(int n_threads)
{
    if (n_threads < 1) n_threads = 1;
    q3_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nth = n_threads;
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        p->workers[i] = (worker){.pool = p, .ith = i};
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0) {
            p->nth = i; /* run with the threads we got */
            break;
        }
    }
    return p;
}

void q3_pool_free(q3_pool *p)
{
    if (!p) return;
    p->quit = true;
    atomic_fetch_add(&p->generation, 1);
    futex_wake_all(&p->generation);
    for (int i = 1; i < p->nth; i++) pthread_join(p->workers[i].thread, NULL);
    free(p->workers);
    free(p);
}

int q3_pool_size(const q3_pool *p) { return p->nth; }

void q3_pool_run(q3_pool *p, q3_pool_fn fn, void *ctx)
{
    p->runs++;
    if (p->nth == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->nth - 1, memory_order_relaxed);
    atomic_fetch_add(&p->generation, 1); /* seq_cst: publishes fn/ctx, then sleepers is read */
    if (atomic_load(&p->sleepers) > 0) futex_wake_all(&p->generation);
    fn(ctx, 0, p->nth);
    for (unsigned spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        cpu_relax();
        if (spins > (1u << 20)) sched_yield(); /* a worker was descheduled: let it run */
    }
}

void q3_pool_barrier(q3_pool *p)
{
    if (p->nth == 1) return;
    uint32_t phase = atomic_load_explicit(&p->bar_phase, memory_order_acquire);
    if (atomic_fetch_add(&p->bar_count, 1) == p->nth - 1) {
        p->inner_barriers++;
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        atomic_store_explicit(&p->bar_phase, phase + 1, memory_order_release);
        return;
    }
    for (unsigned spins = 0; atomic_load_explicit(&p->bar_phase, memory_order_acquire) == phase; spins++) {
        cpu_relax();
        if (spins > (1u << 20)) sched_yield();
    }
}

q3_pool_stats q3_pool_get_stats(const q3_pool *p)
{
    return (q3_pool_stats){.runs = p->runs, .inner_barriers = p->inner_barriers};
}
