/* Prompts' products on plain 16-bit (bf16 / fp16) weights, for an AVX2 CPU (no 16-bit FMA, no oneDNN
 * bf16): torch's 16-bit GEMM there runs a prompt's rows at ~1-3 GFLOP/s, and converting the weight to
 * fp32 for MKL's GEMM costs a pass over it on every call.
 *   half_gemm:     out = round(x @ w.T + b), x (m, k), w (n, k), b (n) or none
 *   expert_swiglu: one routed expert on its picked tokens, added into the layer's output, with the
 *                  roundings of half_gemv.c's (torch's ops in models/blocks/moe.py)
 * Each output is one fp32 multiply-add chain over the inner dimension in order, starting at 0
 * (c = fma(x[p], w[p], c), p = 0 .. k-1): a row's result depends on that row and the weight only,
 * never on how many rows share the call, its place in a tile, a chunk, or the thread count (each
 * output is computed by one thread). The weight is converted to fp32 a panel of NR outputs at a
 * time into an L2-resident buffer (k x NR, outputs interleaved), which every MR-row tile of the
 * rows reads: an expert's weights are read once per call for all its tokens. The products are AVX2's
 * (8-lane) in every variant (an AVX-512 CPU multiplies bf16 with oneDNN, which the callers prefer);
 * the element-wise steps are native_simd.h's. Loaded by flexlamps/kernels/half_gemm.py. */
#include <stdlib.h>

#include "native_simd.h"

#define MR 4        /* rows a tile holds in registers */
#define NR 24       /* outputs a panel holds (three vectors) */
#define MC 384      /* rows converted to fp32 at once (a multiple of MR) */

/* panel[p * NR + j] = w[(n0 + j) * k + p] as fp32 for j < outs (the rest 0): 8 x 8 blocks transposed. */
static void pack_panel(const uint16_t *w, int64_t n0, int outs, int64_t k, float *panel, int fp16) {
    int64_t p = 0;
    for (; p + 8 <= k; p += 8)
        for (int half = 0; half < NR; half += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++)
                r[j] = half + j < outs
                           ? halves_to_floats8(_mm_loadu_si128((const __m128i *)(w + (n0 + half + j) * k + p)), fp16)
                           : _mm256_setzero_ps();
            __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
            __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
            __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
            __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
            __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *dst = panel + p * NR + half;
            _mm256_storeu_ps(dst + 0 * NR, _mm256_permute2f128_ps(s0, s4, 0x20));
            _mm256_storeu_ps(dst + 1 * NR, _mm256_permute2f128_ps(s1, s5, 0x20));
            _mm256_storeu_ps(dst + 2 * NR, _mm256_permute2f128_ps(s2, s6, 0x20));
            _mm256_storeu_ps(dst + 3 * NR, _mm256_permute2f128_ps(s3, s7, 0x20));
            _mm256_storeu_ps(dst + 4 * NR, _mm256_permute2f128_ps(s0, s4, 0x31));
            _mm256_storeu_ps(dst + 5 * NR, _mm256_permute2f128_ps(s1, s5, 0x31));
            _mm256_storeu_ps(dst + 6 * NR, _mm256_permute2f128_ps(s2, s6, 0x31));
            _mm256_storeu_ps(dst + 7 * NR, _mm256_permute2f128_ps(s3, s7, 0x31));
        }
    for (; p < k; p++)
        for (int j = 0; j < NR; j++) {
            uint16_t h = j < outs ? w[(n0 + j) * k + p] : 0;
            panel[p * NR + j] = _mm256_cvtss_f32(halves_to_floats8(_mm_cvtsi32_si128(h), fp16));
        }
}

/* c (R <= MR rows, row stride cs; its first `outs` columns) = a (R rows of k fp32, stride as) @ the panel.
 * A short tile multiplies its last row again in the missing rows' registers (never stored): every tile
 * is the same unrolled code, its accumulators in registers (4 rows: 8 prompt tokens fill two tiles). */
static void tile(const float *a, int64_t as, const float *panel, int64_t k, float *c, int64_t cs, int outs, int R) {
    const float *a0 = a, *a1 = a + (R > 1 ? 1 : 0) * as;
    const float *a2 = a + (R > 2 ? 2 : R - 1) * as, *a3 = a + (R > 3 ? 3 : R - 1) * as;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
    __m256 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
/* one row's three accumulators += its p-th value times the panel's p-th row */
#define ROW(ar, x0, x1, x2) do { __m256 av = _mm256_broadcast_ss(ar + p); x0 = _mm256_fmadd_ps(av, b0, x0); \
        x1 = _mm256_fmadd_ps(av, b1, x1); x2 = _mm256_fmadd_ps(av, b2, x2); } while (0)
    for (int64_t p = 0; p < k; p++) {
        const float *bp = panel + p * NR;
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8), b2 = _mm256_loadu_ps(bp + 16);
        ROW(a0, c00, c01, c02);
        ROW(a1, c10, c11, c12);
        ROW(a2, c20, c21, c22);
        ROW(a3, c30, c31, c32);
    }
#undef ROW
    float rows[MR][NR];
    __m256 accs[MR][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22}, {c30, c31, c32}};
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < 3; v++) _mm256_storeu_ps(rows[r] + 8 * v, accs[r][v]);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < outs; j++) c[r * cs + j] = rows[r][j];
}

/* Every MR-row tile of a's m rows on one panel. */
static void panel_rows(const float *a, int64_t as, int64_t m, const float *panel, int64_t k, float *c,
                       int64_t cs, int outs) {
    for (int64_t i = 0; i < m; i += MR)
        tile(a + i * as, as, panel, k, c + i * cs, cs, outs, m - i < MR ? (int)(m - i) : MR);
}

/* c (m, n; row stride cs) = a (m, k fp32; row stride as) @ w (n, k 16-bit).T in fp32, panels split over
 * threads (each with its own panel buffer). 0, or -1 (no memory). */
static int gemm_rows(const float *a, int64_t as, int64_t m, int64_t k, const uint16_t *w, int64_t n, float *c,
                     int64_t cs, int fp16, int threads) {
    int64_t panels = (n + NR - 1) / NR;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && panels > 1)
    {
        float *panel = aligned_alloc(64, (size_t)((k * NR * sizeof(float) + 63) / 64 * 64));
        if (!panel) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t b = 0; b < panels; b++) {
            if (!panel) continue;
            int outs = n - b * NR < NR ? (int)(n - b * NR) : NR;
            pack_panel(w, b * NR, outs, k, panel, fp16);
            panel_rows(a, as, m, panel, k, c + b * NR, cs, outs);
        }
        free(panel);
    }
    return failed ? -1 : 0;
}

/* rows of 16-bit x (picked by `rows` / div, or the first m) as fp32 (row stride k). */
static void widen_rows(const uint16_t *x, int64_t x_stride, const int64_t *rows, int64_t div, int64_t m, int64_t k,
                       float *xf, int fp16) {
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *src = x + (rows ? rows[i] / div : i) * x_stride;
        for (int64_t c = 0; c < k; c += VW) {
            vmask lm = lanes(k - c);
            vf_store_lanes(xf + i * k + c, lm, load_halves(src + c, fp16, lm));
        }
    }
}

/* x (m, k) with row stride x_stride, w (n, k) contiguous, b (n) or NULL, out (m, n) contiguous. 0, or -1
 * (no memory). The bias is added to the fp32 sum before the one rounding (half_gemv.c's). */
int flexlamps_half_gemm(const uint16_t *x, int64_t m, int64_t k, int64_t x_stride, const uint16_t *w, int64_t n,
                        const uint16_t *b, uint16_t *out, int fp16, int threads) {
    int64_t chunk = m < MC ? m : MC;
    float *xf = malloc(sizeof(float) * (size_t)(chunk * k + chunk * n));
    if (!xf) return -1;
    float *c = xf + chunk * k;
    int rc = 0;
    for (int64_t i0 = 0; i0 < m && rc == 0; i0 += chunk) {
        int64_t rows = m - i0 < chunk ? m - i0 : chunk;
        widen_rows(x + i0 * x_stride, x_stride, NULL, 1, rows, k, xf, fp16);
        rc = gemm_rows(xf, k, rows, k, w, n, c, n, fp16, threads);
        for (int64_t i = 0; i < rows && rc == 0; i++)
            for (int64_t col = 0; col < n; col += VW) {
                vmask lm = lanes(n - col);
                vf v = vf_load_lanes(lm, c + i * n + col);
                store_halves(out + (i0 + i) * n + col, b ? vf_add(v, load_halves(b + col, fp16, lm)) : v, fp16, lm);
            }
    }
    free(xf);
    return rc;
}

/* x / (1 + exp(-x)) in fp32 (elementwise.c's silu). */
AI vf silu(vf x) {
    vf e = exp_poly(vf_max(vf_sub(vf_zero(), x), vf_set1(-88.0f)));
    return vf_div(x, vf_add(e, vf_set1(1.0f)));
}

/* h = round(round(silu(round(g))) * round(u)), m rows of `inter` (row stride inter), in place over g. */
static void swiglu_rows(float *g, const float *u, int64_t m, int64_t inter, int fp16) {
    for (int64_t i = 0; i < m * inter; i += VW) {
        vmask lm = lanes(m * inter - i);
        vf s = rounded(silu(rounded(vf_load_lanes(lm, g + i), fp16)), fp16);
        vf_store_lanes(g + i, lm, rounded(vf_mul(s, rounded(vf_load_lanes(lm, u + i), fp16)), fp16));
    }
}

/* out[t] = round(out[t] + round(round(y[i]) * weights[picks[i]])), t = picks[i] / slots, for m picks. */
static void add_terms(const float *y, int64_t m, int64_t hidden, const int64_t *picks, int64_t slots,
                      const float *weights, uint16_t *out, int fp16) {
    for (int64_t i = 0; i < m; i++) {
        uint16_t *row = out + (picks[i] / slots) * hidden;
        vf pw = vf_set1(weights[picks[i]]);
        for (int64_t c = 0; c < hidden; c += VW) {
            vmask lm = lanes(hidden - c);
            vf t = rounded(vf_mul(rounded(vf_load_lanes(lm, y + i * hidden + c), fp16), pw), fp16);
            store_halves(row + c, vf_add(load_halves(row + c, fp16, lm), t), fp16, lm);
        }
    }
}

/* One expert on m picks (flat token * slots + slot positions `picks`, token = pick / slots): x (N, hidden)
 * with row stride x_stride, gate and up (inter, hidden), down (hidden, inter), `weights` the picks' flat
 * routing weights (fp32), out (N, hidden) contiguous, added into in pick order. 0, or -1 (no memory). */
int flexlamps_expert_swiglu_rows(const uint16_t *x, int64_t x_stride, int64_t hidden, const uint16_t *gate,
                                 const uint16_t *up, const uint16_t *down, int64_t inter, const int64_t *picks,
                                 int64_t m, int64_t slots, const float *weights, uint16_t *out, int fp16,
                                 int threads) {
    int64_t chunk = m < MC ? m : MC;
    float *xf = malloc(sizeof(float) * (size_t)(chunk * (2 * hidden + 2 * inter)));
    if (!xf) return -1;
    float *g = xf + chunk * hidden, *u = g + chunk * inter, *y = u + chunk * inter;
    int rc = 0;
    for (int64_t i0 = 0; i0 < m && rc == 0; i0 += chunk) {
        int64_t rows = m - i0 < chunk ? m - i0 : chunk;
        widen_rows(x, x_stride, picks + i0, slots, rows, hidden, xf, fp16);
        rc = gemm_rows(xf, hidden, rows, hidden, gate, inter, g, inter, fp16, threads);
        rc = rc ? rc : gemm_rows(xf, hidden, rows, hidden, up, inter, u, inter, fp16, threads);
        if (rc) break;
        swiglu_rows(g, u, rows, inter, fp16);
        rc = gemm_rows(g, inter, rows, inter, down, hidden, y, hidden, fp16, threads);
        if (rc == 0) add_terms(y, rows, hidden, picks + i0, slots, weights, out, fp16);
    }
    free(xf);
    return rc;
}
