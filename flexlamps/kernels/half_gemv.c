/* Decode's products on plain 16-bit (bf16 / fp16) weights, in a fixed order: torch's 16-bit GEMM
 * on an AVX2 CPU (no oneDNN bf16 there) runs a decode row at ~1-5 GFLOP/s and a small MoE expert
 * as ~10 dispatched ops.
 *   half_gemv:      out = round(x @ w.T + b), x (m, k), w (n, k), b (n) or none
 *   expert_swiglu:  one routed expert on its tokens, added into the layer's output:
 *                   g = round(x @ gate.T), u = round(x @ up.T), h = round(round(silu(g)) * u),
 *                   y = round(h @ down.T), out[t] = round(out[t] + round(y * weight))
 *                   (the roundings of torch's ops in models/blocks/moe.py; round: to the dtype)
 * Every dot product is one VW-lane fp32 accumulator over the inner dimension in order (the partial
 * last vector zero-padded), then vf_sum: a row's result depends on that row and the weight only,
 * never on how many rows share the call, which tile it lands in, or the thread count (each output
 * is computed by one thread). Weights are read once per tile of TILE_N outputs for TILE_M rows; where
 * more than WIDEN_ROWS rows share a call (a large batch's decode step), a tile's weight rows are converted
 * to fp32 once for all of them (the same values: the same bits, 22 -> 32 GFLOP/s at 64 rows of a
 * 768 x 2048 expert, 1 thread, Zen 1-class EPYC).
 * Written once over native_simd.h's vectors. Built and loaded by flexlamps/kernels/half_gemv.py. */
#include <stdlib.h>

#include "native_simd.h"

#define TILE_N 4  /* weight rows a tile reads together */

/* VW whole halves as fp32 (load_halves without a lane mask: the inner loop's loads). */
AI vf load_all_halves(const uint16_t *p, int fp16) {
#ifdef __AVX512F__
    return halves_to_floats(_mm256_loadu_si256((const __m256i *)p), fp16);
#else
    return halves_to_floats8(_mm_loadu_si128((const __m128i *)p), fp16);
#endif
}
/* activation rows each weight vector is multiplied by while loaded (dots_range: TILE_M down to 1): 4 x 6
 * accumulators fit AVX-512's 32 registers, 4 x 3 AVX2's 16 */
#ifdef __AVX512F__
#define TILE_M 6
#else
#define TILE_M 3
#endif
#define WIDEN_ROWS 6  /* above this many rows, a tile's weight rows are converted to fp32 once, not once per TILE_M rows */

/* R outputs x T rows: acc[r][t] = w[r] . x[t] over k (x in fp32, zero-padded to whole vectors). The
 * weight rows are 16-bit (wf NULL) or, where many rows share them, already converted (wf: R rows of ws
 * fp32, zero-padded): the same values (the conversion is exact), so the same sums. */
AI void dot_tile(const uint16_t *w, const float *wf, int64_t ws, int64_t k, const float *x, int64_t xs, float *dots,
                 int R, int T, int fp16) {
    vf acc[TILE_N][TILE_M];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = vf_zero();
    int64_t c = 0;
    for (; c + VW <= k; c += VW) {
        for (int r = 0; r < R; r++) {
            vf wv = wf ? vf_load(wf + r * ws + c) : load_all_halves(w + r * k + c, fp16);
            for (int t = 0; t < T; t++) acc[r][t] = vf_fmadd(wv, vf_load(x + t * xs + c), acc[r][t]);
        }
    }
    if (c < k) {
        vmask m = lanes(k - c);
        for (int r = 0; r < R; r++) {
            vf wv = wf ? vf_load(wf + r * ws + c) : load_halves(w + r * k + c, fp16, m);
            for (int t = 0; t < T; t++) acc[r][t] = vf_fmadd(wv, vf_load(x + t * xs + c), acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) dots[t * TILE_N + r] = vf_sum(acc[r][t]);
}

/* rows [n0, n0 + outs) of w as fp32 into wf (row stride ws = k padded to whole vectors, the padding 0). */
static void widen_weights(const uint16_t *w, int64_t n0, int outs, int64_t k, float *wf, int64_t ws, int fp16) {
    for (int r = 0; r < outs; r++)
        for (int64_t c = 0; c < ws; c += VW) {
            vmask lm = lanes(k - c > 0 ? k - c : 0);
            vf_store(wf + r * ws + c, k - c > 0 ? load_halves(w + (n0 + r) * k + c, fp16, lm) : vf_zero());
        }
}

/* dots (m, n) row stride ds = x (m, k; fp32, row stride xs) @ w (n, k).T, outputs [n0, n1) (at most TILE_N).
 * `wf` (TILE_N rows of xs fp32, or NULL): where more than one tile of rows reads the weight rows, they are
 * converted into it once. */
static void dots_range(const uint16_t *w, int64_t n0, int64_t n1, int64_t k, const float *x, int64_t m,
                       int64_t xs, float *dots, int64_t ds, int fp16, float *wf) {
    float tile[TILE_M * TILE_N];
    int full = n1 - n0 == TILE_N, outs = (int)(n1 - n0);
    const uint16_t *wj = w + n0 * k;
    if (m <= WIDEN_ROWS || !wf) wf = NULL;
    else widen_weights(w, n0, outs, k, wf, xs, fp16);
    for (int64_t i = 0; i < m;) {
        int rows = m - i < TILE_M ? (int)(m - i) : TILE_M;
        const float *xi = x + i * xs;
        /* constant R and T in every call: each is unrolled into registers */
#define ROWS_CASE(T) case T: \
            if (full) dot_tile(wj, wf, xs, k, xi, xs, tile, TILE_N, T, fp16); \
            else for (int r = 0; r < outs; r++) \
                dot_tile(wj + r * k, wf ? wf + r * xs : NULL, xs, k, xi, xs, tile + r, 1, T, fp16); \
            break;
        switch (rows) {
#if TILE_M > 3
            ROWS_CASE(6) ROWS_CASE(5) ROWS_CASE(4)
#endif
            ROWS_CASE(3) ROWS_CASE(2) default: ROWS_CASE(1)
        }
#undef ROWS_CASE
        for (int t = 0; t < rows; t++)
            for (int r = 0; r < outs; r++) dots[(i + t) * ds + n0 + r] = tile[t * TILE_N + r];
        i += rows;
    }
}

/* All n outputs, split over threads in whole tiles (an output's sum is the same on any thread); each
 * thread converts its weight rows into its own buffer where many rows share them (none: 16-bit loads). */
static void dots_all(const uint16_t *w, int64_t n, int64_t k, const float *x, int64_t m, int64_t xs, float *dots,
                     int64_t ds, int fp16, int threads) {
    int64_t tiles = (n + TILE_N - 1) / TILE_N;
#pragma omp parallel num_threads(threads) if (threads > 1 && n * k * m >= (1 << 18))
    {
        float *wf = m > WIDEN_ROWS ? malloc(sizeof(float) * (size_t)(TILE_N * xs)) : NULL;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < tiles; b++) {
            int64_t n0 = b * TILE_N, n1 = n0 + TILE_N < n ? n0 + TILE_N : n;
            dots_range(w, n0, n1, k, x, m, xs, dots, ds, fp16, wf);
        }
        free(wf);
    }
}

static int64_t padded(int64_t k) { return (k + VW - 1) / VW * VW; }

/* rows of 16-bit x (picked by `rows`, or the first m) as fp32, zero-padded to xs columns. */
static void widen(const uint16_t *x, int64_t x_stride, const int64_t *rows, int64_t div, int64_t m, int64_t k,
                  float *xf, int64_t xs, int fp16) {
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *src = x + (rows ? rows[i] / div : i) * x_stride;
        for (int64_t c = 0; c < xs; c += VW) {
            vmask lm = lanes(k - c > 0 ? k - c : 0);
            vf v = k - c > 0 ? load_halves(src + c, fp16, lm) : vf_zero();
            vf_store(xf + i * xs + c, v);
        }
    }
}

/* x (m, k) with row stride x_stride, w (n, k) contiguous, b (n) or NULL, out (m, n) contiguous. 0, or -1
 * (no memory). The bias is added to the fp32 sum before the one rounding, as torch's addmm. */
int flexlamps_half_gemv(const uint16_t *x, int64_t m, int64_t k, int64_t x_stride, const uint16_t *w, int64_t n,
                        const uint16_t *b, uint16_t *out, int fp16, int threads) {
    int64_t xs = padded(k);
    float *xf = malloc(sizeof(float) * (size_t)(m * xs + m * n));
    if (!xf) return -1;
    float *dots = xf + m * xs;
    widen(x, x_stride, NULL, 1, m, k, xf, xs, fp16);
    dots_all(w, n, k, xf, m, xs, dots, n, fp16, threads);
    for (int64_t i = 0; i < m; i++)
        for (int64_t c = 0; c < n; c += VW) {
            vmask lm = lanes(n - c);
            vf v = vf_load_lanes(lm, dots + i * n + c);
            store_halves(out + i * n + c, b ? vf_add(v, load_halves(b + c, fp16, lm)) : v, fp16, lm);
        }
    free(xf);
    return 0;
}

/* x / (1 + exp(-x)) in fp32 (elementwise.c's silu). */
AI vf silu(vf x) {
    vf e = exp_poly(vf_max(vf_sub(vf_zero(), x), vf_set1(-88.0f)));
    return vf_div(x, vf_add(e, vf_set1(1.0f)));
}

/* One expert on m picks (flat token * slots + slot positions `picks`; token = pick / slots): x (N, hidden)
 * with row stride x_stride, gate and up (inter, hidden), down (hidden, inter), `weights` the picks' flat
 * routing weights (fp32), out (N, hidden) contiguous, added into. 0, or -1 (no memory). */
int flexlamps_expert_swiglu(const uint16_t *x, int64_t x_stride, int64_t hidden, const uint16_t *gate,
                            const uint16_t *up, const uint16_t *down, int64_t inter, const int64_t *picks, int64_t m,
                            int64_t slots, const float *weights, uint16_t *out, int fp16, int threads) {
    int64_t hs = padded(hidden), is = padded(inter);
    float *xf = calloc((size_t)(m * hs + 3 * m * is + m * hs), sizeof(float));  /* padding: 0 */
    if (!xf) return -1;
    float *g = xf + m * hs, *u = g + m * is, *h = u + m * is, *y = h + m * is;
    widen(x, x_stride, picks, slots, m, hidden, xf, hs, fp16);
    dots_all(gate, inter, hidden, xf, m, hs, g, is, fp16, threads);
    dots_all(up, inter, hidden, xf, m, hs, u, is, fp16, threads);
    for (int64_t i = 0; i < m; i++)
        for (int64_t c = 0; c < is; c += VW) {  /* the padding stays 0 (silu(0) * 0): down's tail adds 0 */
            vf s = rounded(silu(rounded(vf_load(g + i * is + c), fp16)), fp16);
            vf_store(h + i * is + c, rounded(vf_mul(s, rounded(vf_load(u + i * is + c), fp16)), fp16));
        }
    dots_all(down, hidden, inter, h, m, is, y, hs, fp16, threads);
    for (int64_t i = 0; i < m; i++) {
        uint16_t *row = out + (picks[i] / slots) * hidden;
        vf pw = vf_set1(weights[picks[i]]);
        for (int64_t c = 0; c < hidden; c += VW) {
            vmask lm = lanes(hidden - c);
            vf t = rounded(vf_mul(rounded(vf_load(y + i * hs + c), fp16), pw), fp16);
            store_halves(row + c, vf_add(load_halves(row + c, fp16, lm), t), fp16, lm);
        }
    }
    free(xf);
    return 0;
}
