/* AVX-512 helpers shared by attention.c and
 * elementwise.c: 16-bit floats (bf16 or fp16) loaded and stored by lane mask with torch's
 * rounding (native_halves.h's conversions), and exp. The libraries' build keys cover this
 * file and the one it includes (flexlamps/kernels/build.py). */
#ifndef FLEXLAMPS_NATIVE_SIMD_H
#define FLEXLAMPS_NATIVE_SIMD_H
#include "native_halves.h"  /* halves_to_floats, floats_to_halves, AI */

/* The first min(left, 16) lanes: a vector's worth, or a row's partial last one. */
AI __mmask16 lanes(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

/* 16 halves (the lanes of `m`; others 0) as fp32. */
AI __m512 load_halves(const uint16_t *p, int fp16, __mmask16 m) {
    return halves_to_floats(_mm256_maskz_loadu_epi16(m, p), fp16);
}

AI void store_halves(uint16_t *p, __m512 f, int fp16, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, floats_to_halves(f, fp16));
}

/* f rounded to the 16-bit dtype, as fp32. */
AI __m512 rounded(__m512 f, int fp16) { return halves_to_floats(floats_to_halves(f, fp16), fp16); }

/* exp(z) within 2 ulp: z = k ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial (Cephes' expf) times
 * 2^k; inf above ~88.7, denormal then 0 below ~-87.3 (callers mask where they need exact 0s). */
AI __m512 exp_poly(__m512 z) {
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(z, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), z);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, k);
}

#endif
