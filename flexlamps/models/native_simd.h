/* AVX-512 helpers shared by the kernels of flexlamps/models (native_attention.c,
 * native_elementwise.c): 16-bit floats (bf16 or fp16) to fp32 and back with torch's rounding,
 * and exp. The library's build key covers this file (quant/native_build.py). */
#ifndef FLEXLAMPS_NATIVE_SIMD_H
#define FLEXLAMPS_NATIVE_SIMD_H
#include <immintrin.h>
#include <stdint.h>

#define AI static inline __attribute__((always_inline))

/* The first min(left, 16) lanes: a vector's worth, or a row's partial last one. */
AI __mmask16 lanes(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

/* 16 halves (the lanes of `m`; others 0) as fp32. */
AI __m512 load_halves(const uint16_t *p, int fp16, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (fp16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* fp32 -> bf16 (round to nearest even; NaNs stay NaNs) or fp16, one per 32-bit lane: what
 * torch's `.to(dtype)` gives. */
AI __m512i round_bits(__m512 f, int fp16) {
    if (fp16) return _mm512_cvtepu16_epi32(_mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m512i u = _mm512_castps_si512(f);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

AI void store_halves(uint16_t *p, __m512 f, int fp16, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(round_bits(f, fp16)));
}

/* f rounded to the 16-bit dtype, as fp32. */
AI __m512 rounded(__m512 f, int fp16) {
    __m512i bits = round_bits(f, fp16);
    if (fp16) return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(bits));
    return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
}

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
