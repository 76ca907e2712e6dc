/* x @ w.T for a few rows of x (decode), w a 4-bit weight in torch's CPU int4 tile layout
 * (quant/int4_tiles.py) or an int8 weight held as two such 4-bit halves (quant/int8_weight.py),
 * read where it lies with AVX-512 VNNI integer dot products: x is rounded to 16-bit (or, as
 * llama.cpp does for its block types, 8-bit) integers with one scale per group of the weight's
 * inputs, each group's products are summed exactly in int32, and the group's scales are applied
 * in fp32.
 *
 * Layout: tiles of 64 output rows; tile t holds K * 32 bytes, byte (k, j) with row 64t + j in
 * its low nibble and row 64t + 32 + j in its high nibble. A byte permute (VBMI) gathers four
 * columns of a row into one 32-bit lane, which is what an 8-bit VNNI dot product multiplies; for
 * 16-bit x the lane's bytes are widened to two lanes of two 16-bit codes each.
 * scale_zero is (K/G, N, 2) 16-bit floats (bf16 or fp16, as x and out): w = (q - 8) * scale + zero.
 * An int8 weight's split (N, 2K) has its codes' high nibbles in columns 0..K-1 (scale 16 d,
 * zero 0) and its low nibbles in K..2K-1 (scale d, zero 8 d + m): joined back, u = q + 128 and
 * w = d * u + (zero - 136 d).
 * A 5-bit weight (GGUF's Q5_x: codes u in [0, 31]) holds its low nibbles as a 4-bit weight does
 * and its fifth bits in a plane of 64-bit words, one per register of codes tile_codes makes: for
 * tile t and columns k..k+3, words t K + k .. t K + k + 3, bit 4i + c of word q the fifth bit of
 * row 64t + 16q + i, column k + c (quant/int8_weight.py writes it); w = (u - 16) * scale + zero.
 * The 6-bit form (codes q in [-32, 31]: GGUF's Q6_K, Q5_x where the 5-bit form is not taken) holds
 * u = q + 32 as the int8 split's low nibbles alone, 4-bit tiles of its own (n, K), and a plane of
 * its high two bits, u >> 4, laid out as those tiles are (a tile's plane follows the last tile's,
 * cols * tile / 4 bytes): bytes 32b + i of a tile's plane hold, in bits 0-1 and 4-5, the two
 * nibbles of its tile byte 64b + i and, in bits 2-3 and 6-7, those of byte 64b + 32 + i. So a mask
 * (0x33) and a shift by 2 give any 16 consecutive tile bytes' nibbles, and adding 6 to each makes
 * them the split's high nibbles (u + 96 = q + 128) exactly (`plane_high16`): every kernel runs
 * the split's arithmetic on the same bytes, so the 6-bit form gives a row the split's bits. Its
 * scale-zero pairs are the split's low halves' alone (K/G, n, 2): 8 bits a weight, not 12. Q6_K's (w = d q:
 * each zero bf16(8 d) = 8 bf16(d)) are its scales alone (kind 4, (K/G, n): 7 bits a weight), each loop making
 * the zero as 8 scale in fp32, exact: the pair's value, the same bits. Q6_K's file scales (kind 6,
 * 8-bit x alone) take one step a super-block on its exact int32 sum instead (tile_scales_k6.h).
 *
 * Integer sums are exact, so a row's result does not depend on the rows beside it, on the
 * thread count, or on the split of the work.
 *
 * Variants (flexlamps/kernels/tile_gemv.py builds each with its flags): the inner loops come from
 * tile_gemv_avx512.h (VBMI, VNNI; tiles of 64 rows) or tile_gemv_avx2.h (AVX2, AVX-VNNI where
 * present; tiles of 32 or 64; 8-bit x in tile_gemv_avx2_x8.h); both add the same exact sums in the
 * same fp32 steps, so a weight in 64-row tiles gets the same bits from either. With 8-bit x an
 * int8 split's group sum is taken for q = u - 128 (offset zero - 8 d), as the prompt kernel takes
 * it, so decode and prompts give a row the same bits. Built and loaded by
 * flexlamps/kernels/tile_gemv.py.
 *
 * flexlamps_tile_gemm is the product for prompts (many rows a call) on the same codes, in every
 * variant: x rounded to int8 per group, vpmaddubsw on a sub-tile's codes laid out once for all
 * the call's rows (tile_gemm.h). In the amx variant a decode call's 16-bit x (an output head's)
 * takes the AMX tiles too, for its rows in whole 16s: each code as two bytes, their exact sums
 * joined, then the per-row path's fp32 steps (tile_gemm_amx.h's amx_rows16): the same bits. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "claim_pool.h"  /* the threads' split: chunks claimed by whoever asks next */
#include "native_simd.h"  /* vectors of the variant's width, 16-bit floats */

#define TILE 64  /* the AVX-512 variant's tile rows */
/* How far ahead the codes are prefetched: decode's weights stream from memory, and the hardware
 * prefetcher alone left a SmolLM2 step at about a third of the read bandwidth. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 512
#endif

static float half_to_float(uint16_t h, int fp16) {
    if (fp16) return _cvtsh_ss(h);
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}

/* The rows of x as int8 codes, a scale per group (codes * scale ~ x), each group's sum and (8-bit
 * codes) its codes' sum. */
typedef struct {
    const int8_t *q8;
    const int16_t *q16;
    const float *scale, *sum;
    int64_t cols, groups;
    const int32_t *total;
    const int32_t *starts16;  /* biased int8 codes' int16 sums start here, per 16 inputs (tile_gemm.h) */
    const int32_t *starts6;  /* the 6-bit form's decode sums, per 16 inputs (AVX2: tile_gemv_avx2_x8.h) */
    const uint8_t *lo8;  /* 16-bit codes on AMX tiles (tile_gemm_amx.h): their low bytes; q8 their high ones */
    int64_t sz_width;  /* the weight's scale_zero values a row a group (2; 1: KIND_INT6_SCALES'), for every loop */
    int k4;  /* scale_zero in Q4_K's form (KIND_INT4_K; sz_width 1: planes of a value a row, tile_scales_k4.h) */
    int k6;  /* scale_zero in Q6_K's form (KIND_INT6_K, the 6-bit form's codes; 8-bit x: tile_scales_k6.h) */
} QRows;

/* A weight's kind: 4-bit codes, an int8 split, 5-bit codes (nibbles and a plane of fifth bits), or
 * 6-bit codes (nibbles and a plane of high two bits; the split's arithmetic). */
enum { KIND_INT4 = 0, KIND_INT8_SPLIT = 1, KIND_INT5 = 2, KIND_INT6 = 3, KIND_INT6_SCALES = 4, KIND_INT4_K = 5,
       KIND_INT6_K = 6 };

/* The 6-bit form's tile bytes off .. off + 15 (off a multiple of 16) as the int8 split's high
 * nibbles: the plane's two bits of each nibble, plus 6 (see the top of this file). */
AI __m128i plane_high16(const uint8_t *plane, int64_t off) {
    __m128i v = _mm_loadu_si128((const __m128i *)(plane + (off >> 6) * 32 + (off & 31)));
    if (off & 32) v = _mm_srli_epi16(v, 2);
    return _mm_add_epi8(_mm_and_si128(v, _mm_set1_epi8(0x33)), _mm_set1_epi8(0x66));
}

/* The entry points' kind as the loops run it (KIND_INT6_SCALES and KIND_INT6_K as KIND_INT6, KIND_INT4_K as
 * KIND_INT4), its QRows.sz_width in *width, QRows.k4 in *k4, QRows.k6 in *k6. */
static inline int run_kind(int kind, int64_t *width, int *k4, int *k6) {
    *k4 = kind == KIND_INT4_K;
    *k6 = kind == KIND_INT6_K;
    *width = kind == KIND_INT6_SCALES || *k4 || *k6 ? 1 : 2;
    return kind == KIND_INT6_SCALES || *k6 ? KIND_INT6 : *k4 ? KIND_INT4 : kind;
}

/* Where group g's scale-zero pairs start, in groups of n rows: an int8 split's are its low halves'. */
static inline int64_t sz_group(int64_t g, int64_t groups, int kind) { return kind == KIND_INT8_SPLIT ? g + groups : g; }
#include "tile_scales_k6.h"  /* Q6_K's scales as the file holds them */
#include "tile_scales_k4.h"  /* Q4_K's (and `group_scales`, for every form) */

/* x's rows by sub-tiles laid out once a call (tile_gemm_call.h; tile_gemm_amx.h's amx16_lead calls it
 * too); wide: x's 16-bit codes as two bytes (`lo8`), AMX only. */
static int gemm_codes(const uint8_t *codes, const uint8_t *plane, const uint16_t *scale_zero, const QRows *x,
                      uint16_t *out, int64_t n, int64_t rows, int64_t group, int64_t tile, int fp16, int kind,
                      int wide, int threads);

/* Whether the prompt kernel (tile_gemm.h) takes a weight of this tile, group and kind. */
static int gemm_takes(int64_t tile, int64_t group, int kind) {
    return (tile == 32 || tile == 64) && (group <= 32 || group % 32 == 0)
           && (kind == KIND_INT4 || kind == KIND_INT8_SPLIT || kind == KIND_INT6);
}

#if defined(__AVX512F__)
#include "tile_gemv_avx512.h"
#else
#include "tile_gemv_avx2.h"
#endif
#include "tile_gemm.h"
#if defined(__AMX_INT8__)
#include "tile_gemm_amx.h"
#endif

/* Each row's blocks of `xgroup` inputs of x as codes q of `bits` bits (8 or 16; scale = max |x| / top,
 * top = 127 or 32767, q = round(x / scale)), and for each group of the weight's `group` inputs
 * (xgroup a multiple of group) its block's scale, the sum of the values its codes stand for,
 * scale * sum(q), and sum(q): a weight's zero point then multiplies the same x as its codes do
 * (with the exact sum of x, errors grew 1.5-3x). xgroup is the weight's group, or 256 (one scale a
 * K-quant super-block, `x_block`: llama.cpp's Q8_K rounding of x for its K-quants); `scale` holds
 * the block's scale at each of its groups, so every loop reads x's scales per group as before.
 * Whole vectors go through the variant's `quantize_group_simd`, the groups' sums too (the same results). */
static void quantize_rows(const uint16_t *x, int64_t rows, int64_t cols, int64_t group, int64_t xgroup, int fp16,
                          int bits, void *q, float *scale, float *sum, int32_t *codes_sum) {
    const float top = bits == 16 ? 32767.0f : 127.0f;
    const int64_t per = xgroup / group;  /* groups a block: at most 64 (xgroup <= 256, group >= 4) */
    int32_t totals[64];
    for (int64_t blk = 0; blk < rows * (cols / xgroup); blk++) {  /* the blocks of all rows, in order */
        const uint16_t *xg = x + blk * xgroup;
        float amax = 0.0f;
        void *qg = (char *)q + blk * xgroup * (bits / 8);
        if (!quantize_group_simd(xg, xgroup, group, fp16, bits, qg, &amax, totals)) {
            for (int64_t i = 0; i < xgroup; i++) amax = fmaxf(amax, fabsf(half_to_float(xg[i], fp16)));
            float inv = amax > 0.0f ? top / amax : 0.0f;
            for (int64_t j = 0; j < per; j++) totals[j] = 0;
            for (int64_t i = 0; i < xgroup; i++) {
                long code = lrintf(half_to_float(xg[i], fp16) * inv);
                if (bits == 16) ((int16_t *)qg)[i] = (int16_t)code;
                else ((int8_t *)qg)[i] = (int8_t)code;
                totals[i / group] += (int32_t)code;
            }
        }
        for (int64_t j = 0; j < per; j++) {
            const int64_t g = blk * per + j;
            scale[g] = amax / top;
            sum[g] = scale[g] * (float)totals[j];
            codes_sum[g] = totals[j];
        }
    }
}

/* The inputs x is rounded in blocks of for a weight (`quantize_rows`' xgroup): a K-quant's
 * super-block (256, where the caller's weight asks for it with 8-bit x and its rows are whole
 * 256s), else the weight's group. */
static inline int64_t x_block(int64_t group, int64_t cols, int bits, int per_super_block) {
    return per_super_block && bits == 8 && cols % 256 == 0 && 256 % group == 0 ? 256 : group;
}

/* A call's rounding of x (`quantize_rows`), split between threads by rows (`quantize_chunk`). */
typedef struct {
    const uint16_t *x;
    int64_t rows, cols, group, xgroup, per_chunk;
    int fp16, bits;
    void *q;
    float *scale, *sum;
    int32_t *total;
} QuantizeCall;

#define QUANTIZE_CHUNK_VALUES (1 << 15)  /* x's values a chunk of rows rounds, about: ~10 us */

static void quantize_chunk(void *ctx, int64_t c, int slot) {
    const QuantizeCall *a = ctx;
    const int64_t first = c * a->per_chunk, count = first + a->per_chunk < a->rows ? a->per_chunk : a->rows - first;
    const int64_t at = first * (a->cols / a->group);
    (void)slot;
    quantize_rows(a->x + first * a->cols, count, a->cols, a->group, a->xgroup, a->fp16, a->bits,
                  (char *)a->q + first * a->cols * (a->bits / 8), a->scale + at, a->sum + at, a->total + at);
}

/* x's rows rounded to codes of `bits` bits in blocks of xgroup inputs (`x_block`) in one buffer (`xr`
 * points into it; free it), or NULL; a prompt's rows on `threads` threads (each row's codes are the
 * same on any). */
static void *quantized_x(const uint16_t *x, int64_t rows, int64_t cols, int64_t group, int64_t xgroup, int fp16,
                         int bits, QRows *xr, int threads) {
    const int64_t groups = cols / group, codes_bytes = (rows * cols * (bits / 8) + 63) / 64 * 64;
    void *buf = malloc((size_t)codes_bytes + (2 * sizeof(float) + sizeof(int32_t)) * (size_t)(rows * groups) + 64);
    if (!buf) return NULL;
    float *scale = (float *)((char *)buf + codes_bytes), *sum = scale + rows * groups;
    int32_t *total = (int32_t *)(sum + rows * groups);
    const int64_t per_chunk = QUANTIZE_CHUNK_VALUES / cols > 1 ? QUANTIZE_CHUNK_VALUES / cols : 1;
    QuantizeCall call = {x, rows, cols, group, xgroup, per_chunk, fp16, bits, buf, scale, sum, total};
    pool_run(threads, (rows + per_chunk - 1) / per_chunk, quantize_chunk, &call);
    QRows r = {bits == 8 ? buf : NULL, bits == 16 ? buf : NULL, scale, sum, cols, groups, total, NULL, NULL, NULL, 2, 0, 0};
    *xr = r;
    return buf;
}


/* A weight's last tile where its n rows do not fill it. Its codes are stored padded with zero rows
 * to the tile (quant/int4_weight.py); its scale-zero pairs (`sz_groups` groups, n rows each) are
 * copied here into a tile of their own, the missing rows' pairs 0, and the call's products for it
 * go to `out` (rows of whole tiles), whose real columns `partial_close` copies out: the kernels run
 * the tile as any other, so a real row's result has the same bits as in a whole tile. */
typedef struct {
    int64_t first;  /* the tile's first row; n where the rows fill their tiles (then nothing is held) */
    uint16_t *sz, *out;
} PartialTile;

/* 0, or -1 where it could not get memory. */
static int partial_open(PartialTile *p, const uint16_t *scale_zero, int64_t n, int64_t tile, int64_t sz_groups,
                        int64_t rows, int64_t width) {
    p->first = n / tile * tile;
    p->sz = p->out = NULL;
    if (p->first == n) return 0;
    p->sz = calloc((size_t)(sz_groups * tile * width), sizeof(uint16_t));
    p->out = malloc((size_t)(rows * tile) * sizeof(uint16_t));
    if (!p->sz || !p->out) {
        free(p->sz);
        free(p->out);
        return -1;
    }
    for (int64_t g = 0; g < sz_groups; g++)
        memcpy(p->sz + g * tile * width, scale_zero + (g * n + p->first) * width,
               (size_t)((n - p->first) * width) * sizeof(uint16_t));
    return 0;
}

/* The partial tile's real columns into out (rows, n); its buffers freed. */
static void partial_close(PartialTile *p, uint16_t *out, int64_t n, int64_t tile, int64_t rows) {
    for (int64_t r = 0; p->out && r < rows; r++)
        memcpy(out + r * n + p->first, p->out + r * tile, (size_t)(n - p->first) * sizeof(uint16_t));
    free(p->sz);
    free(p->out);
}

/* Scale-zero groups of a weight of this kind (an int8 split's are twice its inputs'; Q4_K's form's planes). */
static int64_t sz_groups(const QRows *x, int kind) {
    return x->k4 ? k4_planes(x->groups) : x->k6 ? k6_planes(x->groups) : (kind == KIND_INT8_SPLIT ? 2 : 1) * x->groups;
}

/* Bytes of a weight's codes a tile of its: an int8 split's two halves, else one 4-bit tile. */
static int64_t tile_code_bytes(int64_t cols, int64_t tile, int kind) {
    return (kind == KIND_INT8_SPLIT ? 2 : 1) * cols * (tile / 2);
}

/* Bytes of a weight's plane a tile (the 5-bit form's fifth bits, the 6-bit form's high two; else 0). */
static int64_t tile_plane_bytes(int64_t cols, int64_t tile, int kind) {
    return kind == KIND_INT5 ? cols * tile / 8 : kind == KIND_INT6 ? cols * tile / 4 : 0;
}

#include "tile_gemm_call.h"  /* the prompt product's call: sub-tiles laid out once, on the threads */
#include "tile_gemv_product.h"  /* a decode product's work as the pool's chunks (`Product`) */

/* out (rows, n) = x (rows, cols) @ w.T, w (n, cols) in 4-bit tiles of `tile` rows (kind 0; the last
 * tile's codes padded with zero rows where n does not fill it, `PartialTile`), an int8
 * weight's (n, 2 cols) split (kind 1), 5-bit codes, 4-bit tiles and the plane of fifth bits (kind
 * 2), or 6-bit codes, 4-bit tiles and the plane of high two bits (kind 3, padded as its tiles; 4: the
 * scales alone; kind 5: 4-bit tiles with Q4_K's scales, tile_scales_k4.h), x rounded to codes of x_bits (8 or 16) bits; returns 0, or -1 for what it (this variant) does
 * not take. */
int flexlamps_tile_gemv(const uint8_t *codes, const uint8_t *plane, const uint16_t *scale_zero, const uint16_t *x,
                        uint16_t *out, int64_t n, int64_t cols, int64_t group, int64_t rows, int64_t tile, int fp16,
                        int kind, int x_bits, int threads) {
    Product p;
    if (product_open(&p, codes, plane, scale_zero, x, out, n, cols, group, rows, tile, fp16, kind, x_bits, threads))
        return -1;
    pool_run(threads, p.chunks, p.fn, p.ctx);
    product_close(&p);
    return 0;
}

/* One weight of a group (`flexlamps_tile_gemv_group`): flexlamps_tile_gemv's arguments of its own. */
typedef struct {
    const uint8_t *codes, *plane;
    const uint16_t *scale_zero;
    uint16_t *out;
    int64_t n, cols, group, tile;
    int32_t kind, x_bits;
} GemvPart;

#define GROUP_MAX_PARTS 4

/* A group's products as one pool job: chunk c is product i's chunk c - first[i]. */
typedef struct {
    const Product *products;
    int64_t first[GROUP_MAX_PARTS + 1];
} Group;

static void group_chunk(void *ctx, int64_t c, int slot) {
    const Group *g = ctx;
    int i = 0;
    while (c >= g->first[i + 1]) i++;
    g->products[i].fn(g->products[i].ctx, c - g->first[i], slot);
}

/* out_i (rows, n_i) = x (rows, cols) @ w_i.T for `count` (<= GROUP_MAX_PARTS) weights that read the
 * same x (a layer's q, k and v of different kinds): each weight's product as flexlamps_tile_gemv
 * computes it (its kind's, the same bits), their chunks in one pool job claimed from one counter, so
 * the threads go on to the next weight's tiles where each call waited for its last ones and handed
 * the next over (a 1.1B decode step had ~110 such joins). 0, or -1 as flexlamps_tile_gemv. */
int flexlamps_tile_gemv_group(const GemvPart *parts, int count, const uint16_t *x, int64_t rows, int fp16,
                              int threads) {
    Product products[GROUP_MAX_PARTS];
    Group g = {products, {0}};
    int opened = 0, status = 0;
    if (count < 1 || count > GROUP_MAX_PARTS) return -1;
    for (; opened < count && !status; opened++) {
        const GemvPart *w = parts + opened;
        status = product_open(products + opened, w->codes, w->plane, w->scale_zero, x, w->out, w->n, w->cols,
                              w->group, rows, w->tile, fp16, w->kind, w->x_bits, threads);
        g.first[opened + 1] = g.first[opened] + products[opened].chunks;
    }
    if (status) opened--;  /* the one that failed holds nothing */
    else pool_run(threads, g.first[opened], group_chunk, &g);
    for (int i = 0; i < opened; i++) product_close(products + i);
    return status;
}

/* This library's claim pool for the other kernels (pool_hook.h): the loader hands it to each, so
 * one set of workers serves every kernel of a step. */
void flexlamps_pool_run(int threads, int64_t chunks, pool_fn fn, void *ctx) { pool_run(threads, chunks, fn, ctx); }

/* out (rows, n) = x (rows, cols) @ w.T for prompts: w (n, cols) in 4-bit tiles of `tile` rows (kind
 * 0; 5: with Q4_K's scales), an int8 weight's (n, 2 cols) split (kind 1) or its 6-bit form (kind 3: tiles and
 * `plane`; 4: the scales alone), x rounded to int8 codes per group (tile_gemm.h). Returns 0, or -1 for what it does not take (or
 * memory it could not get). */
int flexlamps_tile_gemm(const uint8_t *codes, const uint8_t *plane, const uint16_t *scale_zero, const uint16_t *x,
                        uint16_t *out, int64_t n, int64_t cols, int64_t group, int64_t rows, int64_t tile, int fp16,
                        int kind, int threads) {
    int64_t width;
    int k4, k6;
    kind = run_kind(kind, &width, &k4, &k6);
    if (n <= 0 || group <= 0 || group % 4 || cols % group || rows <= 0 || !gemm_takes(tile, group, kind)
        || (k4 && (group != 32 || cols % 256)) || (k6 && (group != 16 || cols % 256))
        || (kind == KIND_INT6 && (!plane || cols * tile % 128)))
        return -1;
    QRows xr;
    void *buf = quantized_x(x, rows, cols, group, x_block(group, cols, 8, k4 || k6), fp16, 8, &xr, threads);
    if (!buf) return -1;
    xr.sz_width = width;
    xr.k4 = k4 ? K4_SUPER : 0;  /* x rounded per super-block (`x_block`) */
    xr.k6 = k6;
    int status = gemm_codes(codes, plane, scale_zero, &xr, out, n, rows, group, tile, fp16, kind, 0, threads);
    free(buf);
    return status;
}
