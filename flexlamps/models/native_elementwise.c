/* A decoder layer's element-wise ops in bf16 / fp16 on AVX-512 CPUs, each one pass over its rows
 * with fp32 arithmetic and torch's roundings: torch runs them as several ops (rms_norm: an upcast,
 * a square, a mean, an rsqrt, two products; SwiGLU: silu on a strided half, then a product), each
 * a few us of dispatch on a decode row and a pass over memory on a prompt.
 *   rms_norm:  out = w * round(x / sqrt(mean(x^2) + eps))   (round: to the dtype, as torch's
 *              rms_norm rounds before the scale)
 *   silu_mul:  out = round(round(silu(gate)) * up), gate and up the two halves of a row
 * Rows are independent: a row's result does not depend on the others or on the thread count.
 * Built and loaded by flexlamps/models/native_elementwise.py. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define AI static inline __attribute__((always_inline))

AI __m512 load16(const uint16_t *p, int fp16, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (fp16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* fp32 -> bf16 (round to nearest even; NaNs stay NaNs) or fp16, as 16 halves. */
AI __m256i halves(__m512 f, int fp16) {
    if (fp16) return _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i u = _mm512_castps_si512(f);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

AI __m512 rounded(__m512 f, int fp16) {
    __m256i h = halves(f, fp16);
    if (fp16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AI __mmask16 part(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

static void rms_norm_row(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t cols, float eps, int fp16) {
    __m512 ss = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 16) {
        __m512 v = load16(x + c, fp16, part(cols - c));
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    __m512 r = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(ss) / (float)cols + eps));
    for (int64_t c = 0; c < cols; c += 16) {
        __mmask16 m = part(cols - c);
        __m512 y = rounded(_mm512_mul_ps(load16(x + c, fp16, m), r), fp16);
        _mm256_mask_storeu_epi16(out + c, m, halves(_mm512_mul_ps(load16(w + c, fp16, m), y), fp16));
    }
}

/* x / (1 + exp(-x)) in fp32, as torch computes it: exp by 2^k * p(r), |r| <= ln2 / 2, a degree-6
 * polynomial (2 ulp), overflowing to inf below x = -88 (a quotient of -0, as torch's) and taken at
 * -88 above x = 88 (a quotient of x). */
AI __m512 silu16(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    __m512 z = _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), x), _mm512_set1_ps(-88.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(z, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), z);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512 e = _mm512_scalef_ps(p, k);  /* exp(-x) */
    return _mm512_div_ps(x, _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}

static void silu_mul_row(const uint16_t *gu, uint16_t *out, int64_t half, int fp16) {
    for (int64_t c = 0; c < half; c += 16) {
        __mmask16 m = part(half - c);
        __m512 s = rounded(silu16(load16(gu + c, fp16, m)), fp16);
        _mm256_mask_storeu_epi16(out + c, m, halves(_mm512_mul_ps(s, load16(gu + half + c, fp16, m)), fp16));
    }
}

/* x (rows, cols) with row stride x_stride, w (cols), out (rows, cols) contiguous. */
void flexlamps_rms_norm(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t rows, int64_t cols,
                        int64_t x_stride, float eps, int fp16, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows * cols >= (1 << 16))
    for (int64_t i = 0; i < rows; i++) rms_norm_row(x + i * x_stride, w, out + i * cols, cols, eps, fp16);
}

/* gate_up (rows, 2 * half) with row stride gu_stride, out (rows, half) contiguous. */
void flexlamps_silu_mul(const uint16_t *gu, uint16_t *out, int64_t rows, int64_t half, int64_t gu_stride, int fp16,
                        int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows * half >= (1 << 16))
    for (int64_t i = 0; i < rows; i++) silu_mul_row(gu + i * gu_stride, out + i * half, half, fp16);
}
