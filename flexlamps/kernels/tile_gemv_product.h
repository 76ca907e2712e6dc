/* A decode product's work as chunks of the claim pool (`Product`): x rounded for the weight, its
 * partial tile, and its tiles (`decode_tiles`: the per-row path) or sub-tiles (tile_gemm_call.h's
 * `gemm_subtile`, from DECODE_GEMM_FROM_ROWS rows) for whichever thread claims them; opened, run
 * (alone by flexlamps_tile_gemv, or beside other products that read the same x by
 * flexlamps_tile_gemv_group), closed. Included by tile_gemv.c only, after tile_gemm_call.h. */
#ifndef FLEXLAMPS_TILE_GEMV_PRODUCT_H
#define FLEXLAMPS_TILE_GEMV_PRODUCT_H

/* A decode call's arguments, for the threads' chunks of tiles (`decode_tiles`). */
typedef struct {
    const uint8_t *codes;
    const uint8_t *plane;
    const uint16_t *scale_zero;
    uint16_t *out;
    const QRows *x;
    Setup setup;
    int64_t n, group, rows, tile;
    int fp16, kind;
    const int64_t *starts;  /* chunk c's tiles: starts[c] .. starts[c + 1] - 1 */
    int64_t tile_bytes, plane_bytes;
    const PartialTile *partial;
} DecodeCall;

#define DECODE_MAX_CHUNKS 256  /* of a call's tiles, largest first (`pool_guided`) */

/* Chunk c of a decode call: its tiles. */
static void decode_tiles(void *ctx, int64_t c, int slot) {
    const DecodeCall *d = ctx;
    (void)slot;
    for (int64_t t = d->starts[c]; t < d->starts[c + 1]; t++) {
        const int own = t * d->tile == d->partial->first;  /* the partial last tile: its own pairs and output */
        run_tile(d->codes + t * d->tile_bytes, d->plane ? d->plane + t * d->plane_bytes : NULL,
                 own ? d->partial->sz : d->scale_zero + t * d->tile * d->x->sz_width, own ? d->tile : d->n, d->group, d->x,
                 &d->setup, d->rows, own ? d->partial->out : d->out + t * d->tile, d->fp16, d->kind);
    }
}

/* Rows of 8-bit x from which a decode call lays the codes out once for all its rows (tile_gemm.h)
 * rather than unpacking them once per pass of PASS8_ROWS: the same exact sums and fp32 steps, so
 * the same bits (a row's result still does not depend on the rows beside it); only the speed
 * differs. AVX2, measured on this EPYC (Zen 1, 1 thread, 5632 x 2048, after 0bc8686), decode path
 * against the prompt kernel: 4-bit codes 37.3 against 36.0 GFLOP/s at 6 rows, 37.4 against 39.4 at
 * 8, 37.5 against 45.7 at 16; an int8 split of Q6_K's codes (groups of 16) 15.5 against 18.0 at 4;
 * of Q8_0's 20.2 against 21.1 at 6 (20.0 against 17.8 at 4). AVX-512 keeps the thresholds measured
 * before (24 and 8; its decode path multiplies with VNNI). */
#if defined(__AVX512F__)
#define GEMM_FROM_4BIT 24
#define GEMM_FROM_SPLIT 8
#else
#define GEMM_FROM_4BIT 8
#define GEMM_FROM_SPLIT 6
#endif
#ifndef DECODE_GEMM_FROM_ROWS
#define DECODE_GEMM_FROM_ROWS GEMM_FROM_4BIT
#endif
#ifndef DECODE_GEMM_FROM_ROWS_SPLIT
#define DECODE_GEMM_FROM_ROWS_SPLIT GEMM_FROM_SPLIT
#endif

/* One decode product on the threads, or one of a group that reads the same x
 * (`flexlamps_tile_gemv_group`): x rounded for its weight, its partial tile, and its work as
 * `chunks` chunks of fn(ctx, ...), which any thread may run (each chunk's tiles or sub-tiles get
 * the same bits on any). Opened in place (the calls point into it), run, closed. */
typedef struct {
    void *buf;  /* x's codes for this weight (`quantized_x`), or NULL */
    QRows xr, biased;
    PartialTile partial;
    DecodeCall decode;
    GemmCall gemm;
    int64_t starts[DECODE_MAX_CHUNKS + 1];
    pool_fn fn;  /* decode_tiles or gemm_subtile; NULL where nothing is left to run */
    void *ctx;
    int64_t chunks;
} Product;

/* The per-row path's tiles of p's weight (rows of xr) as chunks (`decode_tiles`); 0, or -1 (memory). */
static int tiles_open(Product *p, const uint8_t *codes, const uint8_t *plane, const uint16_t *scale_zero,
                      uint16_t *out, int64_t n, int64_t cols, int64_t group, int64_t rows, int64_t tile, int fp16,
                      int kind, int threads) {
    p->xr.starts6 = kind == KIND_INT6 && p->xr.q8 /* 8-bit x */ ? six_starts(&p->xr, rows, tile, group) : NULL;
    if (partial_open(&p->partial, scale_zero, n, tile, sz_groups(&p->xr, kind), rows, p->xr.sz_width)) {
        free((void *)p->xr.starts6);
        return -1;
    }
    p->chunks = pool_guided((n + tile - 1) / tile, threads, p->starts, DECODE_MAX_CHUNKS);
    DecodeCall call = {codes, plane, scale_zero, out, &p->xr, make_setup(tile), n, group, rows, tile, fp16, kind,
                       p->starts, tile_code_bytes(cols, tile, kind), tile_plane_bytes(cols, tile, kind), &p->partial};
    p->decode = call;
    p->fn = decode_tiles;
    p->ctx = &p->decode;
    return 0;
}

/* p opened for out (rows, n) = x (rows, cols) @ w.T (`flexlamps_tile_gemv`'s arguments): 0, or -1
 * for what this variant does not take or memory it could not get (nothing held then). */
static int product_open(Product *p, const uint8_t *codes, const uint8_t *plane, const uint16_t *scale_zero,
                        const uint16_t *x, uint16_t *out, int64_t n, int64_t cols, int64_t group, int64_t rows,
                        int64_t tile, int fp16, int kind, int x_bits, int threads) {
    int64_t width;
    int k4, k6;
    kind = run_kind(kind, &width, &k4, &k6);
    p->buf = NULL, p->fn = NULL, p->ctx = NULL, p->chunks = 0;
    if (tile <= 0 || n <= 0 || group <= 0 || group % 4 || group > 256 || cols % group || rows <= 0
        || (x_bits != 8 && x_bits != 16) || kind < KIND_INT4 || kind > KIND_INT6 || (k4 && (group != 32 || cols % 256))
        || (k6 && (group != 16 || cols % 256 || x_bits != 8))  /* Q6_K's form: super-blocks, 8-bit x */
        || (kind == KIND_INT5 && (!plane || n % tile))  /* the 5-bit form's plane: whole tiles only */
        || (kind == KIND_INT6 && (!plane || cols * tile % 128))  /* the 6-bit form's plane: blocks of 64 tile bytes */
        || !takes_tile(tile, kind, x_bits))
        return -1;
    p->buf = quantized_x(x, rows, cols, group, x_block(group, cols, x_bits, k4 || k6), fp16, x_bits, &p->xr, threads);
    if (!p->buf) return -1;
    p->xr.sz_width = width;
    p->xr.k4 = k4 ? (x_bits == 8 ? K4_SUPER : K4_GROUPWISE) : 0;  /* 8-bit x: rounded per super-block (`x_block`) */
    p->xr.k6 = k6;
    const int64_t gemm_from = kind == KIND_INT4 ? DECODE_GEMM_FROM_ROWS : DECODE_GEMM_FROM_ROWS_SPLIT;
    int status = 0;
    if (x_bits == 8 && rows >= gemm_from && gemm_takes(tile, group, kind)) {
        status = gemm_open(&p->gemm, &p->biased, &p->partial, codes, plane, scale_zero, &p->xr, out, n, rows, group,
                           tile, fp16, kind, 0, threads, &p->chunks);
        p->fn = status ? NULL : gemm_subtile, p->ctx = &p->gemm;
    } else {
#if defined(__AMX_INT8__)  /* 16-bit x's rows in whole 16s on the tiles now (their own call), the rest below */
        const int64_t done = x_bits == 16 ? amx16_lead(codes, plane, scale_zero, &p->xr, out, n, rows, group, tile,
                                                       fp16, kind, threads) : 0;
        if (done == rows) return 0;
        status = done < 0 ? -1 : 0;
        p->xr = rows_from(&p->xr, done > 0 ? done : 0);  /* the last rows (under 16) on the per-row path: the same bits */
        rows -= done, out += done * n;
#endif
        if (!status) status = tiles_open(p, codes, plane, scale_zero, out, n, cols, group, rows, tile, fp16, kind,
                                         threads);
    }
    if (status) {
        free(p->buf);
        p->buf = NULL;
    }
    return status;
}

/* What product_open held: the partial tile's columns copied out, the buffers freed. */
static void product_close(Product *p) {
    if (p->fn == gemm_subtile) gemm_close(&p->gemm, &p->partial);
    else if (p->fn == decode_tiles) {
        partial_close(&p->partial, p->decode.out, p->decode.n, p->decode.tile, p->decode.rows);
        free((void *)p->xr.starts6);
    }
    free(p->buf);
}
#endif
