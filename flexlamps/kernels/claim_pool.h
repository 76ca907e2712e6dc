/* Work split between threads by claiming: `pool_run(threads, chunks, fn, ctx)` runs fn(ctx, c,
 * slot) once for each chunk c < chunks; the calling thread claims chunks (slot 0) and so do up to
 * threads - 1 workers of this library's own pool (slots 1..), each chunk taken by whoever asks
 * next. The caller waits only for chunks already claimed: a worker that has not woken (preempted
 * on a shared box, asleep) takes nothing and is not waited for, where an OpenMP team's barrier
 * waits for every thread of the team to arrive; and a thread slowed mid-call takes fewer chunks
 * where a static split waits for its fixed share. On a 2-core box with other work running, a
 * 1.1B decode step of OpenMP calls took 3-9x its 1-thread time at 2 threads.
 *
 * Workers spin on the job word for POOL_SPIN_NS after their last chunk (decode calls come every
 * few hundred microseconds), then sleep on a condition variable. A call while the pool serves
 * another (two Python threads) runs its chunks on the calling thread alone. After fork() the
 * child has no workers: its caller runs every chunk. Which thread runs a chunk never changes its
 * result (callers' chunks write disjoint outputs). Included by tile_gemv.c, which hands it to the
 * other kernels (`flexlamps_pool_run`, pool_hook.h): one set of workers for all of them. */
#ifndef FLEXLAMPS_CLAIM_POOL_H
#define FLEXLAMPS_CLAIM_POOL_H
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifndef POOL_SPIN_NS
#define POOL_SPIN_NS 1000000  /* 1 ms: most of a decode step's gaps between two products are shorter */
#endif
#define POOL_MAX_WORKERS 63
/* The ticket: the job's number (bits 40-63), its chunks (20-39) and the next chunk to claim (0-19),
 * one word, so a claim never takes a chunk of a job other than the one whose count it read. */
#define POOL_MAX_CHUNKS ((1 << 20) - 1)
#define TICKET_JOB(t) ((uint32_t)((t) >> 40))
#define TICKET_CHUNKS(t) ((int64_t)(((t) >> 20) & POOL_MAX_CHUNKS))
#define TICKET_NEXT(t) ((int64_t)((t) & POOL_MAX_CHUNKS))

typedef void (*pool_fn)(void *ctx, int64_t chunk, int slot);

static struct {
    _Atomic uint64_t ticket;
    _Atomic int64_t done;
    _Atomic int sleepers, busy, started;
    pool_fn fn;
    void *ctx;
    int threads;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pid_t owner;  /* the process whose workers these are (a forked child has none) */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

/* A chunk of job `job` not yet claimed, or -1 where there is none (or the job is over). */
static int64_t pool_claim(uint32_t job) {
    uint64_t t = atomic_load(&pool.ticket);
    while (TICKET_JOB(t) == job && TICKET_NEXT(t) < TICKET_CHUNKS(t))
        if (atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) return TICKET_NEXT(t);
    return -1;
}

/* Claims and runs chunks of job `job` as `slot` until none is left. A claim that succeeds means the
 * job is still on, so the fields read before it are the job's (published before its ticket). */
static void pool_work(uint32_t job, int slot) {
    pool_fn fn = pool.fn;
    void *ctx = pool.ctx;
    int64_t c;
    if (slot >= pool.threads) return;
    while ((c = pool_claim(job)) >= 0) {
        fn(ctx, c, slot);
        atomic_fetch_add(&pool.done, 1);
    }
}

static int64_t pool_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The next job's number after `seen`: spun on for POOL_SPIN_NS, then slept on. */
static uint32_t pool_next_job(uint32_t seen) {
    int64_t until = pool_now_ns() + POOL_SPIN_NS;
    for (int64_t spins = 0;; spins++) {
        uint32_t job = TICKET_JOB(atomic_load(&pool.ticket));
        if (job != seen) return job;
        if ((spins & 255) == 255 && pool_now_ns() > until) break;
        _mm_pause();
    }
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add(&pool.sleepers, 1);
    uint32_t job;
    while ((job = TICKET_JOB(atomic_load(&pool.ticket))) == seen) pthread_cond_wait(&pool.wake, &pool.lock);
    atomic_fetch_sub(&pool.sleepers, 1);
    pthread_mutex_unlock(&pool.lock);
    return job;
}

static void *pool_worker(void *arg) {
    int slot = (int)(intptr_t)arg;
    uint32_t seen = TICKET_JOB(atomic_load(&pool.ticket));
    for (;;) {
        seen = pool_next_job(seen);
        pool_work(seen, slot);
    }
    return NULL;
}

/* Workers up to `want` (slots 1..want) in this process; how many there are. */
static int pool_workers(int want) {
    if (pool.owner != getpid()) {  /* first use, or a forked child: the parent's workers are not here */
        pool.owner = getpid();
        atomic_store(&pool.started, 0);
        atomic_store(&pool.sleepers, 0);
        pthread_mutex_init(&pool.lock, NULL);
        pthread_cond_init(&pool.wake, NULL);
    }
    want = want < POOL_MAX_WORKERS ? want : POOL_MAX_WORKERS;
    while (atomic_load(&pool.started) < want) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int slot = atomic_load(&pool.started) + 1, failed = pthread_create(&thread, &attr, pool_worker,
                                                                           (void *)(intptr_t)slot);
        pthread_attr_destroy(&attr);
        if (failed) break;
        atomic_fetch_add(&pool.started, 1);
    }
    return atomic_load(&pool.started);
}

/* Bounds of chunks of `items` for `threads` (starts[c] .. starts[c + 1], c < the count returned):
 * each a 1 / (2 threads) share of what is left, at least one item and at most an 8th of a thread's
 * share (a thread preempted mid-chunk holds little back), so the threads' last chunks are small and
 * they finish close together; at most max_chunks (the last takes the rest). */
static int64_t pool_guided(int64_t items, int threads, int64_t *starts, int64_t max_chunks) {
    const int64_t parts = threads > 1 ? 2 * (int64_t)threads : 1, cap = items / (4 * parts) > 1 ? items / (4 * parts) : 1;
    int64_t chunks = 0, at = threads > 1 ? 0 : items;  /* one thread: one chunk */
    starts[0] = 0;
    starts[1] = items;
    while (at < items) {
        int64_t left = items - at, size = (left + parts - 1) / parts;
        size = chunks + 1 == max_chunks ? left : size < cap ? size : cap;
        at += size;
        starts[++chunks] = at;
    }
    return threads > 1 ? chunks : 1;
}

/* fn(ctx, c, slot) for every chunk c < chunks, on the caller and up to threads - 1 workers; slot
 * < threads names the thread's scratch (the caller's is 0). */
static void pool_run(int threads, int64_t chunks, pool_fn fn, void *ctx) {
    int expected = 0;
    if (threads <= 1 || chunks <= 1 || chunks > POOL_MAX_CHUNKS
        || !atomic_compare_exchange_strong(&pool.busy, &expected, 1)) {
        for (int64_t c = 0; c < chunks; c++) fn(ctx, c, 0);
        return;
    }
    int workers = pool_workers(threads - 1);
    pool.fn = fn, pool.ctx = ctx, pool.threads = workers + 1 < threads ? workers + 1 : threads;
    atomic_store(&pool.done, 0);
    uint32_t job = (TICKET_JOB(atomic_load(&pool.ticket)) + 1) & 0xFFFFFF;
    atomic_store(&pool.ticket, (uint64_t)job << 40 | (uint64_t)chunks << 20);  /* publishes the fields above */
    if (atomic_load(&pool.sleepers)) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    int64_t c, mine = 0;
    while ((c = pool_claim(job)) >= 0) {
        fn(ctx, c, 0);
        mine++;
    }
    for (int64_t spins = 0; atomic_load(&pool.done) + mine < chunks; spins++) {
        if ((spins & 1023) == 1023) sched_yield();  /* a claimed chunk's thread was preempted */
        else _mm_pause();
    }
    atomic_store(&pool.busy, 0);
}
#endif
