/* Decode's dense bf16 products on AMX tiles, with the bits of oneDNN's AMX call of 32 rows:
 *   half_amx:  out = round(x @ w.T + b), x (m, k), w (n, k), b (n) or none; bf16 throughout
 * dense_gemm runs a bf16 decode row on an AMX CPU in a oneDNN call of exactly 32 rows (its kernel, and
 * so a row's bits, follow the call's row count), which reads a weight at 5-9 GB/s for one row. Here
 * the weight is the A operand as it lies (16 output rows x 32 inputs a tile, no reorder), x the B
 * operand (its rows' 32 inputs as pairs, 16 rows a tile: `pack_x`), and each output is one tile
 * accumulator over the inner dimension in order, 32 inputs a tdpbf16ps, from zero: the chain oneDNN's
 * 32-row call runs (checked bit for bit at load, half_amx.py). An output's bits depend on its row and
 * the weight only, never on the rows beside it, the tile it lands in or the thread count (each output
 * on one thread). The bias is added to the fp32 sum before the one rounding (RNE), as oneDNN's. Fast
 * at one row (the weight read once a CHUNK of 128 rows) and at many (a 1008-row step: x's CHUNK stays in L2
 * while the weight streams), so dense_gemm sends every decode call here.
 * Linux lends a process the tiles' state only when asked (arch_prctl): where it refuses, -2.
 * Built and loaded by flexlamps/kernels/half_amx.py. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define KB 32        /* inputs a tile multiplies (16 pairs) */
#define NB 16        /* outputs an A tile holds */
#define MB 16        /* rows of x a B tile holds */
#define AHEAD 8      /* input blocks of the weight prefetched ahead */
#define CHUNK 8      /* row tiles one pass over the weight multiplies (128 rows x 2048 inputs: 512 KiB of L2) */

static int amx_permitted(void) {
    static int permitted = -1;
    if (permitted < 0) permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return permitted;
}

/* Tiles 0, 1: A (16 weight rows x 32 inputs); 2, 3: B (16 pairs x 16 rows); 4-7: the sums (16 x 16 fp32). */
static void amx_configure(void) {
    struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
}

/* x's rows as B tiles: xp[(b * kbs + q) * 512 + p * 32 + 2 * r + j] = x[b * 16 + r][q * 32 + 2 * p + j],
 * zero past m rows and k inputs (zeros add exact zeros to a sum). */
static void pack_x(const uint16_t *x, int64_t m, int64_t k, int64_t x_stride, int64_t kbs, uint16_t *xp) {
    int64_t blocks = (m + MB - 1) / MB;
    memset(xp, 0, sizeof(uint16_t) * (size_t)(blocks * kbs * MB * KB));
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *row = x + i * x_stride;
        uint32_t *dst = (uint32_t *)(xp + (i / MB) * kbs * MB * KB) + i % MB;  /* pairs, 32 bits each */
        for (int64_t c = 0; c + 1 < k; c += 2) {
            uint32_t pair;
            memcpy(&pair, row + c, 4);
            dst[(c / KB) * MB * KB / 2 + (c % KB) / 2 * MB] = pair;
        }
        if (k % 2) dst[(k - 1) / KB * MB * KB / 2 + ((k - 1) % KB) / 2 * MB] = row[k - 1];
    }
}

/* The A tile of outputs [n0, n0 + 16) and inputs [q * 32, +32): the weight where it lies whole, else a
 * zero-padded copy in `pad` (the last outputs, the last inputs). Returns the pointer and sets the stride. */
static const uint16_t *a_tile(const uint16_t *w, int64_t n, int64_t k, int64_t n0, int64_t q, uint16_t *pad,
                              int64_t *stride) {
    int64_t c0 = q * KB, cols = k - c0 < KB ? k - c0 : KB, rows = n - n0 < NB ? n - n0 : NB;
    if (cols == KB && rows == NB) {
        *stride = k * 2;
        return w + n0 * k + c0;
    }
    memset(pad, 0, NB * KB * 2);
    for (int64_t r = 0; r < rows; r++) memcpy(pad + r * KB, w + (n0 + r) * k + c0, (size_t)cols * 2);
    *stride = KB * 2;
    return pad;
}

/* out rows [i0, i0 + rows) of outputs [n0, n0 + 16) (fewer at the end) from the stored sums c (16 outputs
 * x 16 rows), plus the bias, rounded once. */
static void put_rows(const float *c, int64_t i0, int64_t rows, int64_t n0, int64_t n, const uint16_t *b,
                     uint16_t *out) {
    __mmask16 live = n - n0 >= NB ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - n0)) - 1);
    __m512 bias = b ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                          _mm256_maskz_loadu_epi16(live, b + n0)), 16)) : _mm512_setzero_ps();
    __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                        _mm512_set1_epi32(MB));
    for (int64_t r = 0; r < rows; r++) {
        __m512 v = _mm512_i32gather_ps(column, c + r, 4);
        if (b) v = _mm512_add_ps(v, bias);
        _mm256_mask_storeu_epi16(out + (i0 + r) * n + n0, live, (__m256i)_mm512_cvtneps_pbh(v));
    }
}

/* Outputs [n0, n0 + 32) (two A tiles; the second may be past n) for x's row blocks [b0, b0 + bs), bs <= 2. */
static void block_pair(const uint16_t *w, int64_t n, int64_t k, int64_t n0, const uint16_t *xp, int64_t kbs,
                       int64_t m, int64_t b0, int bs, const uint16_t *b, uint16_t *out, uint16_t *pad, float *c) {
    int two = n0 + NB < n;
    _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
    for (int64_t q = 0; q < kbs; q++) {
        int64_t sa, sb;
        if (q + AHEAD < kbs)
            for (int r = 0; r < 2 * NB && n0 + r < n; r++) _mm_prefetch((const char *)(w + (n0 + r) * k + (q + AHEAD) * KB), _MM_HINT_T0);
        const uint16_t *a0 = a_tile(w, n, k, n0, q, pad, &sa);
        _tile_loadd(0, a0, sa);
        if (two) {
            const uint16_t *a1 = a_tile(w, n, k, n0 + NB, q, pad + NB * KB, &sb);
            _tile_loadd(1, a1, sb);
        }
        _tile_loadd(2, xp + (b0 * kbs + q) * MB * KB, 64);
        _tile_dpbf16ps(4, 0, 2);
        if (two) _tile_dpbf16ps(6, 1, 2);
        if (bs > 1) {
            _tile_loadd(3, xp + ((b0 + 1) * kbs + q) * MB * KB, 64);
            _tile_dpbf16ps(5, 0, 3);
            if (two) _tile_dpbf16ps(7, 1, 3);
        }
    }
    for (int j = 0; j < bs; j++) {
        int64_t i0 = (b0 + j) * MB, rows = m - i0 < MB ? m - i0 : MB;
        if (j == 0) _tile_stored(4, c, 64); else _tile_stored(5, c, 64);
        put_rows(c, i0, rows, n0, n, b, out);
        if (two) {
            if (j == 0) _tile_stored(6, c, 64); else _tile_stored(7, c, 64);
            put_rows(c, i0, rows, n0 + NB, n, b, out);
        }
    }
}

/* x (m, k) with row stride x_stride, w (n, k) contiguous, b (n) or NULL, out (m, n) contiguous, all bf16.
 * 0; -1: no memory; -2: the tiles refused. Threads split the outputs in pairs of tiles. */
int flexlamps_half_amx(const uint16_t *x, int64_t m, int64_t k, int64_t x_stride, const uint16_t *w, int64_t n,
                       const uint16_t *b, uint16_t *out, int threads) {
    if (!amx_permitted()) return -2;
    int64_t kbs = (k + KB - 1) / KB, blocks = (m + MB - 1) / MB, pairs = (n + 2 * NB - 1) / (2 * NB);
    uint16_t *xp = aligned_alloc(64, sizeof(uint16_t) * (size_t)(blocks * kbs * MB * KB));
    if (!xp) return -1;
    pack_x(x, m, k, x_stride, kbs, xp);
#pragma omp parallel num_threads(threads) if (threads > 1 && n * k >= (1 << 20))
    {
        uint16_t pad[2 * NB * KB] __attribute__((aligned(64)));
        float c[NB * MB] __attribute__((aligned(64)));
        amx_configure();
        for (int64_t c0 = 0; c0 < blocks; c0 += CHUNK) {  /* x's tiles of a chunk stay in L2 for the whole weight */
            int64_t c1 = c0 + CHUNK < blocks ? c0 + CHUNK : blocks;
#pragma omp for schedule(static)
            for (int64_t p = 0; p < pairs; p++)
                for (int64_t b0 = c0; b0 < c1; b0 += 2)
                    block_pair(w, n, k, p * 2 * NB, xp, kbs, m, b0, c1 - b0 >= 2 ? 2 : 1, b, out, pad, c);
        }
        _tile_release();
    }
    free(xp);
    return 0;
}
