/* The threads of a kernel other than tile_gemv: chunks of its work run on tile_gemv's claim pool
 * (claim_pool.h), which the loader hands over once the library is loaded (`flexlamps_use_pool`,
 * flexlamps/kernels/loader.py), so one set of workers serves every kernel of a step. Each kernel
 * built with -fopenmp had its own OpenMP team beside the pool: on a 2-core box, a decode step at 2
 * threads whose attention took the team (8 kv heads: 8 tasks) had the team's worker spinning after
 * each attention while the pool's worker ran the next products, three threads on two cores
 * (llama-3.2-1b Q4_K_M, under load 6: 291 ms of CPU a step against 161 with the teams asleep).
 * Without a pool (a library loaded by hand) every chunk runs on the calling thread. Which thread
 * runs a chunk never changes its result: chunks write disjoint outputs. */
#ifndef FLEXLAMPS_POOL_HOOK_H
#define FLEXLAMPS_POOL_HOOK_H
#include <stdint.h>

typedef void (*chunk_fn)(void *ctx, int64_t chunk, int slot);
typedef void (*pool_run_fn)(int threads, int64_t chunks, chunk_fn fn, void *ctx);

static pool_run_fn shared_pool;

/* The loader's hand-over: tile_gemv's `flexlamps_pool_run`. */
void flexlamps_use_pool(pool_run_fn run) { shared_pool = run; }

/* fn(ctx, c, slot) for every chunk c < chunks, on up to `threads` threads (slot < threads). */
static void run_chunks(int threads, int64_t chunks, chunk_fn fn, void *ctx) {
    if (shared_pool && threads > 1 && chunks > 1) {
        shared_pool(threads, chunks, fn, ctx);
        return;
    }
    for (int64_t c = 0; c < chunks; c++) fn(ctx, c, 0);
}

/* Chunks of `items` items for `threads` threads: a few a thread, so a slowed thread holds back
 * little; chunk c is items [c * per, min((c + 1) * per, items)). */
static int64_t chunk_items(int64_t items, int threads, int64_t *per) {
    const int64_t want = threads > 1 ? 4 * (int64_t)threads : 1;
    *per = (items + want - 1) / want > 0 ? (items + want - 1) / want : 1;
    return (items + *per - 1) / *per;
}

/* Chunk c's items [*first, return value) of `items` in chunks of `per` (`chunk_items`). */
static inline int64_t chunk_range(int64_t c, int64_t per, int64_t items, int64_t *first) {
    *first = c * per;
    return *first + per < items ? *first + per : items;
}

/* fn over `items` items in `chunk_items` chunks (*per set): split over `threads` where `split`, else
 * one chunk on the calling thread. */
static void run_split(int threads, int split, int64_t items, int64_t *per, chunk_fn fn, void *ctx) {
    const int64_t chunks = chunk_items(items, split ? threads : 1, per);
    run_chunks(split ? threads : 1, chunks, fn, ctx);
}
#endif
