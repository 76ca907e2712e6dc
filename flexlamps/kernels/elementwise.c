/* A decoder layer's element-wise ops in bf16 / fp16, each one pass over its rows with fp32
 * arithmetic and torch's roundings: torch runs them as several ops (rms_norm: an upcast, a
 * square, a mean, an rsqrt, two products; SwiGLU: silu on a strided half, then a product), each
 * a few us of dispatch on a decode row and a pass over memory on a prompt.
 *   rms_norm:  out = w * round(x / sqrt(mean(x^2) + eps))   (round: to the dtype, as torch's
 *              rms_norm rounds before the scale)
 *   silu_mul:  out = round(round(silu(gate)) * up), gate and up the two halves of a row
 * Written once over native_simd.h's vectors: the AVX-512 and AVX2 variants differ in their flags.
 * Rows are independent: a row's result does not depend on the others or on the thread count
 * (rows split over tile_gemv's claim pool: pool_hook.h).
 * Built and loaded by flexlamps/kernels/elementwise.py. */
#include <math.h>

#include "native_simd.h"
#include "pool_hook.h"  /* the threads: tile_gemv's claim pool */

static void rms_norm_row(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t cols, float eps, int fp16) {
    vf ss = vf_zero();
    for (int64_t c = 0; c < cols; c += VW) {
        vf v = load_halves(x + c, fp16, lanes(cols - c));
        ss = vf_fmadd(v, v, ss);
    }
    vf r = vf_set1(1.0f / sqrtf(vf_sum(ss) / (float)cols + eps));
    for (int64_t c = 0; c < cols; c += VW) {
        vmask m = lanes(cols - c);
        vf y = rounded(vf_mul(load_halves(x + c, fp16, m), r), fp16);
        store_halves(out + c, vf_mul(load_halves(w + c, fp16, m), y), fp16, m);
    }
}

/* x / (1 + exp(-x)) in fp32, as torch computes it: exp(-x) overflows to inf below x = -88 (a
 * quotient of -0, as torch's) and is taken at -88 above x = 88 (a quotient of x). */
AI vf silu(vf x) {
    vf e = exp_poly(vf_max(vf_sub(vf_zero(), x), vf_set1(-88.0f)));  /* exp(-x) */
    return vf_div(x, vf_add(e, vf_set1(1.0f)));
}

/* UNROLL whole vectors an iteration: silu's chain (exp's polynomial, a division) is long, and one
 * vector at a time left the core waiting on it; independent vectors side by side overlap their
 * chains (each lane's arithmetic unchanged: the same bits). 4096 x 1536 bf16 on this EPYC (Zen 1,
 * 1 thread, under load): 31.8 -> 19.2 ms, with the dtype a constant in each copy (no branch a vector). */
#define UNROLL 4

AI void silu_mul_row(const uint16_t *gu, uint16_t *out, int64_t half, const int fp16) {
    int64_t c = 0;
    for (; c + UNROLL * VW <= half; c += UNROLL * VW) {
        vf s[UNROLL];
        for (int u = 0; u < UNROLL; u++) s[u] = silu(load_halves(gu + c + u * VW, fp16, ALL_LANES));
        for (int u = 0; u < UNROLL; u++) {
            vf up = load_halves(gu + half + c + u * VW, fp16, ALL_LANES);
            store_halves(out + c + u * VW, vf_mul(rounded(s[u], fp16), up), fp16, ALL_LANES);
        }
    }
    for (; c < half; c += VW) {
        vmask m = lanes(half - c);
        vf s = rounded(silu(load_halves(gu + c, fp16, m)), fp16);
        store_halves(out + c, vf_mul(s, load_halves(gu + half + c, fp16, m)), fp16, m);
    }
}

/* A call's rows, for the threads' chunks: chunk c is rows c * per .. (`norm_chunk`, `silu_chunk`). */
typedef struct {
    const uint16_t *in, *w;
    uint16_t *out;
    int64_t rows, cols, stride, per;
    float eps;
    int fp16;
} Rows;

static void norm_chunk(void *ctx, int64_t c, int slot) {
    const Rows *r = ctx;
    int64_t first, end = chunk_range(c, r->per, r->rows, &first);
    (void)slot;
    for (int64_t i = first; i < end; i++)
        rms_norm_row(r->in + i * r->stride, r->w, r->out + i * r->cols, r->cols, r->eps, r->fp16);
}

static void silu_chunk(void *ctx, int64_t c, int slot) {
    const Rows *r = ctx;
    int64_t first, end = chunk_range(c, r->per, r->rows, &first);
    (void)slot;
    for (int64_t i = first; i < end; i++) {
        if (r->fp16) silu_mul_row(r->in + i * r->stride, r->out + i * r->cols, r->cols, 1);
        else silu_mul_row(r->in + i * r->stride, r->out + i * r->cols, r->cols, 0);
    }
}

/* The rows split over the threads where there are enough values to pay for it. */
static void run_rows(Rows *r, int threads, chunk_fn fn) {
    run_split(threads, threads > 1 && r->rows * r->cols >= (1 << 16), r->rows, &r->per, fn, r);
}

/* x (rows, cols) with row stride x_stride, w (cols), out (rows, cols) contiguous. */
void flexlamps_rms_norm(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t rows, int64_t cols,
                        int64_t x_stride, float eps, int fp16, int threads) {
    Rows r = {x, w, out, rows, cols, x_stride, 1, eps, fp16};
    run_rows(&r, threads, norm_chunk);
}

/* gate_up (rows, 2 * half) with row stride gu_stride, out (rows, half) contiguous. */
void flexlamps_silu_mul(const uint16_t *gu, uint16_t *out, int64_t rows, int64_t half, int64_t gu_stride, int fp16,
                        int threads) {
    Rows r = {gu, NULL, out, rows, half, gu_stride, 1, 0.0f, fp16};
    run_rows(&r, threads, silu_chunk);
}
