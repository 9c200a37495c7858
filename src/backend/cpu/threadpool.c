/* The persistent thread pool: a generation counter announces each job (and
 * is the futex workers sleep on); items are claimed from a 64-bit word
 * holding (generation, next item), so a thread that wakes after its job is
 * over sees a different generation and claims nothing. */
#include "backend/cpu/threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* How long a worker spins for the next job before it sleeps: longer than the
 * gap between two ops of a graph (a few inline elementwise ops), short enough
 * that on a shared machine an idle worker soon gives its core back (measured
 * there: 50 us beats 200 us by ~5-10% of decode time). In time, not pause
 * counts: a pause is ~10 cycles on some x86 parts and ~140 on others. */
#define SPIN_NS 50000
/* How long the caller spins for the last items of a job before it sleeps:
 * items are a few to a few tens of microseconds, so a longer wait means a
 * thread holding one lost its core. */
#define JOIN_SPIN_NS 20000
/* A join that waited over LONG_JOIN_NS, and over 4x the caller's own share
 * of the job, waited for a worker that lost its core while it held an item
 * (a scheduler slice: ~4 ms measured beside a busy loop, where items take
 * tens of microseconds; a sleeping worker's wake-up stays well under it).
 * LONG_JOINS such joins, each within LONG_JOIN_WINDOW jobs of the one
 * before, mean the machine's other work keeps taking a core: the next
 * SOLO_JOBS jobs (about 7 decode tokens of Qwen3-0.6B) run on the caller
 * alone, the same items in the same way (so the same bits), and then the
 * workers are tried again. On a 2-core VM beside one busy loop a 64-token
 * decode met 89 waits of ~4.2 ms. */
#define LONG_JOIN_NS 2000000
#define LONG_JOIN_WINDOW 512
#define LONG_JOINS 3
#define SOLO_JOBS 1024
/* Claim-word index meaning "this job is closed: no more claims". */
#define CLOSED 0xffffffffu

typedef struct worker {
    q3_pool *pool;
    int ith;
    pthread_t thread;
} worker;

struct q3_pool {
    int nth;
    worker *workers;                       /* [nth], [0] unused (the caller) */
    q3_pool_job job;                       /* written by the caller while the claim word is closed */
    _Atomic int n_items;                   /* job.n_items, read by workers before they claim */
    _Atomic bool quit;
    _Alignas(64) _Atomic uint64_t claim;   /* generation << 32 | next item */
    _Alignas(64) _Atomic uint32_t generation; /* futex word, bumped once per job */
    _Alignas(64) _Atomic int sleepers;     /* workers in (or entering) futex_wait */
    _Alignas(64) _Atomic uint32_t done;    /* items finished in the current job (futex word of the join) */
    _Atomic int joiner_sleeps;             /* the caller is in (or entering) futex_wait on done */
    uint64_t jobs;
    uint64_t last_long;                    /* the job whose join last waited long (caller only) */
    int long_run;                          /* long joins in a row, each within the window of the last */
    uint64_t solo;                         /* jobs still to run on the caller alone (caller only) */
    uint64_t solo_total;                   /* jobs so run since the pool started */
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_one(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Claims and runs items of job generation gen until none are left. */
static void work(q3_pool *p, uint32_t gen, int ith)
{
    bool begun = false;
    for (;;) {
        uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
        uint32_t i = (uint32_t)v;
        /* n_items may already be the next job's: then the claim word has
           moved on too and the exchange below fails */
        if ((uint32_t)(v >> 32) != gen || i == CLOSED || i >= (uint32_t)atomic_load_explicit(&p->n_items, memory_order_relaxed))
            return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acq_rel, memory_order_relaxed))
            continue;
        /* item i is ours: the job (and its ctx) lives until done reaches n_items */
        if (!begun && p->job.begin) p->job.begin(p->job.ctx, ith);
        begun = true;
        int n = p->job.n_items; /* read before the last done: then the caller may start the next job */
        p->job.item(p->job.ctx, (int)i, ith);
        /* seq_cst: pairs with the joiner's flag-then-check (join) */
        if (atomic_fetch_add(&p->done, 1) + 1 == (uint32_t)n && ith != 0 && atomic_load(&p->joiner_sleeps))
            futex_wake_one(&p->done);
    }
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The caller's wait for the items other threads claimed: a short spin (the
 * usual gap is a fraction of one item), then a futex sleep. Sleeping matters
 * on a busy machine: a worker descheduled while it holds an item waits in a
 * run queue, and a caller that spins or yields keeps its own core busy, so
 * the scheduler never moves the worker there; an idle core pulls it over. */
static void join(q3_pool *p, uint32_t n)
{
    uint64_t deadline = 0;
    for (unsigned i = 1; atomic_load_explicit(&p->done, memory_order_acquire) < n; i++) {
        cpu_relax();
        if (i % 64) continue;
        uint64_t t = now_ns();
        if (!deadline) deadline = t + JOIN_SPIN_NS;
        else if (t > deadline) break;
    }
    for (;;) {
        atomic_store(&p->joiner_sleeps, 1); /* seq_cst: then done is read */
        uint32_t d = atomic_load(&p->done);
        if (d < n) futex_wait(&p->done, d);
        atomic_store_explicit(&p->joiner_sleeps, 0, memory_order_relaxed);
        if (atomic_load_explicit(&p->done, memory_order_acquire) >= n) return;
    }
}

/* Waits until generation differs from seen; returns the new value. */
static uint32_t wait_for_job(q3_pool *p, uint32_t seen)
{
    uint64_t deadline = now_ns() + SPIN_NS;
    for (unsigned i = 1;; i++) {
        uint32_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        if (i % 64 == 0 && now_ns() > deadline) break;
    }
    for (;;) {
        atomic_fetch_add(&p->sleepers, 1); /* seq_cst: pairs with the caller's bump-then-check */
        if (atomic_load(&p->generation) == seen) futex_wait(&p->generation, seen);
        atomic_fetch_sub(&p->sleepers, 1);
        uint32_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
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
        if (atomic_load(&p->quit)) break;
        work(p, seen, w->ith);
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
    atomic_store(&p->claim, (uint64_t)CLOSED);
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
    atomic_store(&p->quit, true);
    atomic_fetch_add(&p->generation, 1);
    futex_wake_all(&p->generation);
    for (int i = 1; i < p->nth; i++) pthread_join(p->workers[i].thread, NULL);
    free(p->workers);
    free(p);
}

int q3_pool_size(const q3_pool *p) { return p->nth; }

uint64_t q3_pool_jobs(const q3_pool *p) { return p->jobs; }

void q3_pool_run(q3_pool *p, const q3_pool_job *job)
{
    p->jobs++;
    if (job->n_items <= 0) return;
    if (p->nth == 1 || job->n_items == 1 || p->solo) {
        if (p->nth > 1 && job->n_items > 1) p->solo--, p->solo_total++;
        for (int i = 0; i < job->n_items; i++) {
            if (i == 0 && job->begin) job->begin(job->ctx, 0);
            job->item(job->ctx, i, 0);
        }
        return;
    }
    /* the claim word is closed since the last job ended: no worker reads job now */
    uint32_t gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    p->job = *job;
    atomic_store_explicit(&p->n_items, job->n_items, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (uint64_t)gen << 32, memory_order_release);
    atomic_store(&p->generation, gen); /* seq_cst: then sleepers is read */
    if (atomic_load(&p->sleepers) > 0) futex_wake_all(&p->generation);
    uint64_t t0 = now_ns();
    work(p, gen, 0);
    uint64_t t1 = now_ns();
    join(p, (uint32_t)job->n_items);
    atomic_store_explicit(&p->claim, (uint64_t)gen << 32 | CLOSED, memory_order_release);
    uint64_t waited = now_ns() - t1;
    if (waited > LONG_JOIN_NS && waited > 4 * (t1 - t0)) {
        p->long_run = p->last_long && p->jobs - p->last_long <= LONG_JOIN_WINDOW ? p->long_run + 1 : 1;
        p->last_long = p->jobs;
        if (p->long_run >= LONG_JOINS) p->solo = SOLO_JOBS, p->long_run = 0, p->last_long = 0;
    }
}

uint64_t q3_pool_solo_jobs(const q3_pool *p) { return p->solo_total; }
