/* tile_gemv.c's prompt product's call (flexlamps_tile_gemm, and decode calls of many rows): x's rows
 * in chunks, each by every sub-tile of the weight laid out once (tile_gemm.h's `prepare`) in a
 * thread's buffer, then multiplied by the variant's loops (tile_gemm.h's gemm_rows, AMX's
 * amx_rows / amx_rows16). Included by tile_gemv.c only, after its QRows, PartialTile and the
 * variants' headers. */

/* Rows of a call (its chunk's) up to which the AMX tiles prefetch the next tile's codes (`next_tile`). */
#ifndef AHEAD_MAX_ROWS
#define AHEAD_MAX_ROWS 256
#endif

/* x's int8 codes a prompt call's row chunk holds (`gemm_subtile`): rows in whole 16s (the AMX tiles'). */
#ifndef GEMM_CHUNK_X_BYTES
#define GEMM_CHUNK_X_BYTES (1 << 20)
#endif

/* The same for Q6_K's form on the AMX tiles (`amx_rows_planes`): a chunk's sub-tiles lay their planes out
 * again, so more rows a chunk (1.1B down 2048 x 5632 at 4,096 rows, 1 thread, CPU time, load ~6, the
 * 6-bit form's ~440 ms: 437-457 ms at 512 KiB, 270 at 1 MiB, 241-245 at 2, 242 at 4, 256 at 8). */
#ifndef K6_CHUNK_X_BYTES
#define K6_CHUNK_X_BYTES (1 << 21)
#endif

/* A chunk's rows from which Q6_K's form takes the planes on the AMX tiles (`amx_rows_planes`); below, the
 * groups' products (`amx_rows`, then k6_add_dots' integer steps): the same bits. With the planes laid
 * out in 16-bit products' bytes (kern31) they pay from a decode step's 32 rows (the 1.1B layer's Q6_K
 * products 1.14x there; with the older planes 0.82x at 32, 1.24x at 64). */
#ifndef K6_PLANES_FROM_ROWS
#define K6_PLANES_FROM_ROWS 32
#endif

/* A call's rows from which Q4_K's form with x per super-block takes the planes on the AMX tiles
 * (`amx_rows_planes`, in its chunks of 64 rows or more), as Q6_K's; below, the groups' products (`amx_rows`):
 * the same bits. The 1.1B's down (2048 x 5632) ran 0.68x at 64 rows and 0.80x at 128 on the planes,
 * 1.15-1.18x from 176 (gate / up and o 1.2-1.4x at 128): a batch-1 prompt's 128 rows keep the groups'. */
#ifndef K4_PLANES_FROM_ROWS
#define K4_PLANES_FROM_ROWS 256
#endif

/* Bytes of the buffer one thread prepares sub-tiles in (`Prepared`). */
static size_t prepared_bytes(int64_t cols, int64_t groups, int split, int k4) {
    /* (two more planes of bytes, Q6_K's and Q4_K's forms' sc q on the AMX tiles, `amx_k6_planes`) */
    return (size_t)((split ? 4 : k4 ? 3 : 1) * cols * SUB) + 2 * sizeof(float) * (size_t)(groups * SUB);
}

/* A prompt call's arguments, for the threads' sub-tiles (`gemm_subtile`): each thread lays a
 * sub-tile out in its own part of `prepared` (`per_thread` bytes a slot). */
typedef struct {
    const uint8_t *codes, *plane;
    const uint16_t *scale_zero;
    const QRows *x;
    uint16_t *out;
    int64_t n, rows, group, tile, chunk_rows, subs;
    int fp16, split, wide;  /* wide: x's 16-bit codes as two bytes (`QRows.lo8`), on the AMX tiles */
    uint8_t *prepared;
    size_t per_thread;
    const PartialTile *partial;
    uint8_t *k4_fits;  /* Q4_K's form on the AMX planes: x's rows' `k4_fit_rows` flags, else NULL */
} GemmCall;

#if defined(__AMX_INT8__)
/* What `prepare` reads of tile t + 1 (none after the last, nor at a prompt's many rows, whose tiles
 * are laid out once per row chunk: for them the reads are a small part already). */
static Ahead next_tile(const GemmCall *g, int64_t t, int64_t cols, int64_t h) {
    Ahead a = {{NULL, NULL}, NULL, {0, 0}, 0, 0, 0};
    const int64_t tile_bytes = (g->split && !g->plane ? 2 : 1) * cols * h, next = (t + 1) * g->tile;
    if (next >= g->n || g->rows > AHEAD_MAX_ROWS || (next + g->tile > g->n && g->partial->first < g->n)) return a;
    a.at[0] = (const char *)(g->codes + (t + 1) * tile_bytes);
    a.lines[0] = tile_bytes / 64;
    if (g->plane) {
        a.at[1] = (const char *)(g->plane + (t + 1) * (cols * h / 2));
        a.lines[1] = cols * h / 2 / 64;
    }
    const int64_t groups = g->x->groups, w = g->x->sz_width;  /* `prepare`'s pairs: an int8 split's low halves' */
    a.pairs = (const char *)(g->scale_zero + ((g->split && !g->plane ? groups : 0) * g->n + next) * w);
    a.groups = sz_groups(g->x, KIND_INT4);
    a.pair_lines = g->tile * 2 * w / 64;
    a.stride = g->n * 2 * w;
    return a;
}
#endif

/* Sub-tile `sub` (32 rows) prepared in the slot's buffer, then the rows of x of row chunk `c / subs`
 * by it: the threads take a chunk's sub-tiles in turn, so its rows of x stay in their caches (all
 * 4,096 rows of x, 8 MiB, streamed once per sub-tile from memory, ran the AMX tiles at 300-330
 * GFLOP/s a core where 128 rows ran at 370-440). Each row's arithmetic is the same in any chunk. */
static void gemm_subtile(void *ctx, int64_t c, int slot) {
    const GemmCall *whole = ctx;
    const int64_t sub = c % whole->subs, r0 = c / whole->subs * whole->chunk_rows;
    QRows part = rows_from(whole->x, r0);
    GemmCall chunk = *whole;
    chunk.x = &part;
    chunk.rows = whole->rows - r0 < whole->chunk_rows ? whole->rows - r0 : whole->chunk_rows;
    const GemmCall *g = &chunk;
    const int64_t cols = g->x->cols, h = g->tile / 2, per_tile = g->tile / SUB;
    const int64_t tile_bytes = (g->split && !g->plane ? 2 : 1) * cols * h;
    uint8_t *buf = g->prepared + g->per_thread * (size_t)slot;
    float *scale = (float *)(buf + (g->split ? 2 : 1) * cols * SUB);
#if defined(__AMX_INT8__)
    const int amx = amx_takes(g->group);  /* int8 codes stay signed there (tdpbssd): not biased */
#else
    const int amx = 0;
#endif
    /* the split's magnitudes and their int16 steps serve gemm_rows only: not where the tiles take every row */
    const int tiles_only = g->wide || (amx && g->rows % 16 == 0);
    int32_t acc[16 * 32] __attribute__((aligned(64)));  /* Q6_K's form's super-block sums: up to 16 rows (AMX's) */
    Prepared prep = {buf, g->split && !tiles_only ? buf + cols * SUB : NULL, scale, scale + g->x->groups * SUB, 1, 0,
                     g->x->starts16 != NULL && !amx, g->wide, 0, g->x->k6, acc,
                     (uint8_t *)(scale + 2 * g->x->groups * SUB)};
    int64_t t = sub / per_tile, s = sub % per_tile;
    const int own = t * g->tile == g->partial->first;  /* the partial last tile: its own pairs and output */
    const int64_t n = own ? g->tile : g->n;
    prepare(g->codes + t * tile_bytes, g->plane ? g->plane + t * (cols * h / 2) : NULL,
            own ? g->partial->sz : g->scale_zero + t * g->tile * g->x->sz_width, s, h, n, cols, g->x->groups,
            g->x->sz_width, g->x->k4, g->fp16, g->split, &prep);
    uint16_t *out = (own ? g->partial->out : g->out + t * g->tile) + r0 * n;
    int64_t done = 0;
#if defined(__AMX_INT8__)
    const Ahead ahead = next_tile(g, t, cols, h);
    if (g->wide) done = amx_rows16(&prep, g->x, g->rows, g->group, g->split, out, n, s, h, g->fp16, &ahead);
    else if (amx && prep.k6 && g->rows >= K6_PLANES_FROM_ROWS)
        done = amx_rows_planes(&prep, g->x, g->rows, out, n, s, h, g->fp16, &ahead, NULL);
    else if (g->k4_fits && g->rows >= 64)
        done = amx_rows_planes(&prep, g->x, g->rows, out, n, s, h, g->fp16, &ahead, g->k4_fits + r0 * (cols / 256));
    else if (amx) done = amx_rows(&prep, g->x, g->rows, g->group, g->split, out, n, s, h, g->fp16, &ahead);
#endif
    if (done < g->rows) {
        QRows rest = rows_from(g->x, done);
        gemm_rows(&prep, &rest, g->rows - done, g->group, g->split, out + done * n, n, s, h, g->fp16);
    }
}

/* Q4_K's form with x per super-block on the AMX planes (a call of K4_PLANES_FROM_ROWS rows or more):
 * its rows' `k4_fit_rows` flags (free them), else NULL; *failed where it could not get memory. */
static uint8_t *k4_fits_of(const QRows *x, int64_t rows, int amx, int slots, int *failed) {
    *failed = 0;
#if defined(__AMX_INT8__)
    if (!amx || x->k4 != K4_SUPER || rows < K4_PLANES_FROM_ROWS) return NULL;
    K4Fits f = {x, rows, malloc((size_t)(rows * (x->cols / 256)) + 64)};
    if (!f.fits) {
        *failed = 1;
        return NULL;
    }
    pool_run(slots, (rows + 63) / 64, k4_fit_rows, &f);
    return f.fits;
#else
    (void)x, (void)rows, (void)amx, (void)slots;
    return NULL;
#endif
}

/* A call's work on x's rows already rounded to int8 (`quantized_x`) laid out for the threads:
 * `gemm_subtile` over *chunks chunks of *call, each sub-tile laid out once per call (the 6-bit form's
 * as the split's: the same codes); `biased` and `partial` are the caller's and stay until `gemm_close`.
 * 0, or -1 where it could not get memory (nothing held then). */
static int gemm_open(GemmCall *call, QRows *biased, PartialTile *partial, const uint8_t *codes, const uint8_t *plane,
                     const uint16_t *scale_zero, const QRows *x, uint16_t *out, int64_t n, int64_t rows,
                     int64_t group, int64_t tile, int fp16, int kind, int wide, int threads, int64_t *chunks) {
    const int split = kind != KIND_INT4;
    const int slots = threads > 1 ? (threads < POOL_MAX_WORKERS + 1 ? threads : POOL_MAX_WORKERS + 1) : 1;
    const int planes4 = x->k4 == K4_SUPER && rows >= K4_PLANES_FROM_ROWS;
    const size_t per_thread = (prepared_bytes(x->cols, x->groups, split, planes4) + 63) / 64 * 64;
    uint8_t *prepared = malloc(per_thread * (size_t)slots + 64);
    if (!prepared || partial_open(partial, scale_zero, n, tile, sz_groups(x, kind), rows, x->sz_width)) {
        free(prepared);
        return -1;
    }
#if defined(__AMX_INT8__)
    const int amx = amx_takes(group);  /* the tiles multiply int8 codes signed: no sub-tile is biased */
#else
    const int amx = 0;
#endif
    *biased = *x;  /* with the starts of biased int8 codes' sums (serial work: ~6 ms a 4,096-row Q6_K down) */
    biased->starts16 = split && !wide && !amx ? bias_starts(x, rows) : NULL;
    int failed;
    uint8_t *fits = k4_fits_of(x, rows, amx, slots, &failed);
    if (failed) {
        partial_close(partial, NULL, n, tile, 0);
        free(prepared);
        free((void *)biased->starts16);
        return -1;
    }
    int64_t chunk_rows = ((amx && x->k6 ? K6_CHUNK_X_BYTES : GEMM_CHUNK_X_BYTES) / x->cols) / 16 * 16;
    chunk_rows = chunk_rows < 64 ? 64 : chunk_rows;
    const int64_t subs = (n + tile - 1) / tile * (tile / SUB);
    *chunks = (rows + chunk_rows - 1) / chunk_rows * subs;
    GemmCall c = {codes, kind == KIND_INT6 ? plane : NULL, scale_zero, biased, out, n, rows, group, tile,
                  chunk_rows, subs, fp16, split, wide, prepared, per_thread, partial, fits};
    *call = c;
    return 0;
}

/* What `gemm_open` held: the partial tile's columns copied out, the buffers freed. */
static void gemm_close(GemmCall *call, PartialTile *partial) {
    partial_close(partial, call->out, call->n, call->tile, call->rows);
    free(call->prepared);
    free((void *)call->x->starts16);
    free(call->k4_fits);
}

/* out = x @ w.T for x's rows already rounded to int8 (`quantized_x`), on the threads (`gemm_open`);
 * 0, or -1 where it could not get memory. */
static int gemm_codes(const uint8_t *codes, const uint8_t *plane, const uint16_t *scale_zero, const QRows *x,
                      uint16_t *out, int64_t n, int64_t rows, int64_t group, int64_t tile, int fp16, int kind,
                      int wide, int threads) {
    GemmCall call;
    QRows biased;
    PartialTile partial;
    int64_t chunks;
    if (gemm_open(&call, &biased, &partial, codes, plane, scale_zero, x, out, n, rows, group, tile, fp16, kind, wide,
                  threads, &chunks))
        return -1;
    pool_run(threads, chunks, gemm_subtile, &call);
    gemm_close(&call, &partial);
    return 0;
}
