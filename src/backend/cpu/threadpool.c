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
#include <sys/resource.h>
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
/* Contention. Two signs say the machine's other work keeps taking a core:
 *  - a join that waited over LONG_JOIN_NS, and over 4x the caller's own share
 *    of the job: it waited for a worker that lost its core while it held an
 *    item (a scheduler slice, ~4 ms measured beside a busy loop, where items
 *    take tens of microseconds; a sleeping worker's wake-up stays well under
 *    it). On a 2-core VM beside one busy loop a 64-token decode met 89;
 *  - the caller itself preempted: every PREEMPT_CHECK_JOBS jobs it reads its
 *    involuntary context switches, and PREEMPT_MIN of them, at least one per
 *    millisecond of the stretch, count. Beside one busy loop (three threads
 *    for two cores) Q4_K_M decode met 14-47 a 64-job window, against 0-3
 *    quiet; such a caller makes no progress while it waits for its core, and
 *    the long joins alone came too seldom (every ~200 ms) to notice it.
 * CONTENDED_EVENTS signs, each within CONTENDED_WINDOW jobs of the one
 * before, take one thread off the pool for the next SHED_JOBS jobs (about 7
 * decode tokens of Qwen3-0.6B): its highest worker takes no items (on 2
 * threads the caller runs the jobs alone); the same items run the same way,
 * so the same bits. Signs during such a stretch take one more thread off
 * and start it again. When it ends every thread is tried again; a stretch
 * that starts within SHED_RETRY_WINDOW jobs of the last one's end (the other
 * work is still there: the retry cost three slices) keeps that one's thread
 * count and is twice as long, up to SHED_JOBS_MAX (~55 tokens); one that
 * starts later takes one thread off and SHED_JOBS again. */
#define LONG_JOIN_NS 2000000
#define PREEMPT_CHECK_JOBS 64
#define PREEMPT_MIN 8
#define CONTENDED_WINDOW 512
#define CONTENDED_EVENTS 3
#define SHED_JOBS 1024
#define SHED_JOBS_MAX 8192
#define SHED_RETRY_WINDOW 2048
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
    _Atomic int active;                    /* threads that take items: [0, active) (set between jobs) */
    uint64_t jobs;
    /* contention (caller only) */
    uint64_t last_event;                   /* the job of the last sign of contention */
    int event_run;                         /* signs in a row, each within the window of the one before */
    uint64_t check_job, check_ns;          /* the last read of the involuntary context switches */
    long nivcsw;                           /* and what it read */
    pthread_t check_thread;                /* on which thread (callers may take turns) */
    uint64_t shed;                         /* jobs still to run with active < nth */
    uint64_t shed_len;                     /* the last stretch's length (0 before the first) */
    int shed_active;                       /* and its thread count */
    uint64_t shed_end;                     /* the job that ended it */
    uint64_t shed_total;                   /* jobs of several items run with active < nth */
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

/* Waits until generation differs from seen (spinning spin_ns, then asleep);
 * returns the new value. */
static uint32_t wait_for_job(q3_pool *p, uint32_t seen, uint64_t spin_ns)
{
    uint64_t deadline = now_ns() + spin_ns;
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
        /* a worker taken off the pool sleeps at once: its spin would take a
           core the machine's other work needs */
        bool on = w->ith < atomic_load_explicit(&p->active, memory_order_relaxed);
        seen = wait_for_job(p, seen, on ? SPIN_NS : 0);
        if (atomic_load(&p->quit)) break;
        if (w->ith < atomic_load_explicit(&p->active, memory_order_relaxed)) work(p, seen, w->ith);
    }
    return NULL;
}

q3_pool *q3_pool_new(int n_threads)
{
    if (n_threads < 1) n_threads = 1;
    q3_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nth = n_threads;
    atomic_store(&p->active, n_threads);
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
            atomic_store(&p->active, i);
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

/* Whether the caller was preempted often since the last check (see
 * "Contention"); reads the count every PREEMPT_CHECK_JOBS jobs. */
static bool caller_preempted(q3_pool *p)
{
    if (p->jobs - p->check_job < PREEMPT_CHECK_JOBS) return false;
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru)) return false;
    uint64_t t = now_ns();
    long n = ru.ru_nivcsw - p->nivcsw;
    bool first = p->check_job == 0 || !pthread_equal(p->check_thread, pthread_self());
    bool many = n >= PREEMPT_MIN && (uint64_t)n * 1000000u >= t - p->check_ns;
    p->check_thread = pthread_self();
    p->check_job = p->jobs;
    p->check_ns = t;
    p->nivcsw = ru.ru_nivcsw;
    return !first && many;
}

/* After a job: counts a sign of contention (event), ends or starts a stretch
 * with fewer threads. */
static void after_job(q3_pool *p, bool event)
{
    if (p->shed && --p->shed == 0) {
        atomic_store_explicit(&p->active, p->nth, memory_order_relaxed);
        p->shed_end = p->jobs;
    }
    if (!event) return;
    p->event_run = p->last_event && p->jobs - p->last_event <= CONTENDED_WINDOW ? p->event_run + 1 : 1;
    p->last_event = p->jobs;
    if (p->event_run < CONTENDED_EVENTS) return;
    p->event_run = 0;
    p->last_event = 0;
    if (p->shed) { /* still contended with fewer threads: one more off */
        p->shed_active = p->shed_active > 1 ? p->shed_active - 1 : 1;
    } else if (p->shed_len && p->jobs - p->shed_end <= SHED_RETRY_WINDOW) { /* back soon: as before, for longer */
        p->shed_len = 2 * p->shed_len < SHED_JOBS_MAX ? 2 * p->shed_len : SHED_JOBS_MAX;
    } else {
        p->shed_len = SHED_JOBS;
        p->shed_active = p->nth - 1;
    }
    p->shed = p->shed_len;
    atomic_store_explicit(&p->active, p->shed_active, memory_order_relaxed);
}

void q3_pool_run(q3_pool *p, const q3_pool_job *job)
{
    p->jobs++;
    if (job->n_items <= 0) return;
    if (job->n_items > 1 && p->shed) p->shed_total++;
    if (p->nth == 1 || job->n_items == 1 || atomic_load_explicit(&p->active, memory_order_relaxed) == 1) {
        for (int i = 0; i < job->n_items; i++) {
            if (i == 0 && job->begin) job->begin(job->ctx, 0);
            job->item(job->ctx, i, 0);
        }
        if (p->nth > 1) after_job(p, caller_preempted(p));
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
    bool long_join = waited > LONG_JOIN_NS && waited > 4 * (t1 - t0);
    after_job(p, caller_preempted(p) || long_join);
}

uint64_t q3_pool_shed_jobs(const q3_pool *p) { return p->shed_total; }

int q3_pool_active(const q3_pool *p) { return atomic_load_explicit(&p->active, memory_order_relaxed); }
