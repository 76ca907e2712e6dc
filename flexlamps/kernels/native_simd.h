/* fp32 vectors of the variant a kernel is built for, shared by attention.c and elementwise.c:
 * `vf` holds VW lanes (16 on AVX-512, 8 on AVX2), `vmask` says which lanes of a row's partial
 * last vector are live, and the ops below are the instructions of that width, so a kernel's
 * code is written once and its variants differ only in the compiler flags. 16-bit floats (bf16
 * or fp16) are loaded and stored by lane mask with torch's rounding (native_halves.h). The
 * libraries' build keys cover this file and the one it includes (flexlamps/kernels/build.py). */
#ifndef FLEXLAMPS_NATIVE_SIMD_H
#define FLEXLAMPS_NATIVE_SIMD_H
#include <string.h>

#include "native_halves.h"  /* halves_to_floats(8), floats_to_halves(8), AI */

#ifdef __AVX512F__
#define VW 16
typedef __m512 vf;
typedef __mmask16 vmask;
#define ALL_LANES ((vmask)0xFFFF)
#define vf_zero _mm512_setzero_ps
#define vf_set1 _mm512_set1_ps
#define vf_load _mm512_loadu_ps
#define vf_store _mm512_storeu_ps
#define vf_add _mm512_add_ps
#define vf_sub _mm512_sub_ps
#define vf_mul _mm512_mul_ps
#define vf_div _mm512_div_ps
#define vf_max _mm512_max_ps
#define vf_fmadd _mm512_fmadd_ps
#define vf_fnmadd _mm512_fnmadd_ps
#define vf_sum _mm512_reduce_add_ps
#define vf_hmax _mm512_reduce_max_ps
#define vi_sum _mm512_reduce_add_epi32

/* The first min(left, 16) lanes: a vector's worth, or a row's partial last one. */
AI vmask lanes(int64_t left) { return left >= 16 ? (vmask)0xFFFF : (vmask)((1u << left) - 1); }

/* 16 halves (the lanes of `m`; others 0) as fp32. */
AI vf load_halves(const uint16_t *p, int fp16, vmask m) { return halves_to_floats(_mm256_maskz_loadu_epi16(m, p), fp16); }

AI void store_halves(uint16_t *p, vf f, int fp16, vmask m) { _mm256_mask_storeu_epi16(p, m, floats_to_halves(f, fp16)); }

/* The lanes of `m` of f, others 0. */
AI vf vf_keep(vmask m, vf f) { return _mm512_maskz_mov_ps(m, f); }

AI vf vf_round_nearest(vf f) { return _mm512_roundscale_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

/* f * 2^k, k integral: one rounding. */
AI vf vf_scale2(vf f, vf k) { return _mm512_scalef_ps(f, k); }

/* Lanes where a >= b (ordered), as a mask. */
AI vmask vf_ge(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }

AI vf vf_select(vmask m, vf yes, vf no) { return _mm512_mask_blend_ps(m, no, yes); }  /* yes where m */
AI vf vf_load_lanes(vmask m, const float *p) { return _mm512_maskz_loadu_ps(m, p); }  /* others 0 */
AI void vf_store_lanes(float *p, vmask m, vf f) { _mm512_mask_storeu_ps(p, m, f); }
AI vmask vmask_from_bits(int bits) { return (vmask)bits; }  /* lane i live where bit i is set */

#else /* AVX2 + FMA + F16C */
#define VW 8
typedef __m256 vf;
typedef __m256 vmask;  /* all ones in a live lane, zeros elsewhere */
#define ALL_LANES (_mm256_castsi256_ps(_mm256_set1_epi32(-1)))
#define vf_zero _mm256_setzero_ps
#define vf_set1 _mm256_set1_ps
#define vf_load _mm256_loadu_ps
#define vf_store _mm256_storeu_ps
#define vf_add _mm256_add_ps
#define vf_sub _mm256_sub_ps
#define vf_mul _mm256_mul_ps
#define vf_div _mm256_div_ps
#define vf_max _mm256_max_ps
#define vf_fmadd _mm256_fmadd_ps
#define vf_fnmadd _mm256_fnmadd_ps

AI float vf_sum(vf f) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

AI float vf_hmax(vf f) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

AI int32_t vi_sum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

/* The first min(left, 8) lanes: a vector's worth, or a row's partial last one. */
AI vmask lanes(int64_t left) {
    const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(left >= 8 ? 8 : (int)left), index));
}

AI int live_lanes(vmask m) { return __builtin_popcount(_mm256_movemask_ps(m)); }  /* a prefix of lanes */

/* 8 halves (the lanes of `m`, a prefix; others 0) as fp32. */
AI vf load_halves(const uint16_t *p, int fp16, vmask m) {
    int n = live_lanes(m);
    if (n == 8) return halves_to_floats8(_mm_loadu_si128((const __m128i *)p), fp16);
    uint16_t part[8] = {0};
    memcpy(part, p, sizeof(uint16_t) * (size_t)n);
    return halves_to_floats8(_mm_loadu_si128((const __m128i *)part), fp16);
}

AI void store_halves(uint16_t *p, vf f, int fp16, vmask m) {
    int n = live_lanes(m);
    __m128i h = floats_to_halves8(f, fp16);
    if (n == 8) {
        _mm_storeu_si128((__m128i *)p, h);
        return;
    }
    uint16_t part[8];
    _mm_storeu_si128((__m128i *)part, h);
    memcpy(p, part, sizeof(uint16_t) * (size_t)n);
}

AI vf vf_keep(vmask m, vf f) { return _mm256_and_ps(m, f); }

AI vf vf_round_nearest(vf f) { return _mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

/* f * 2^k, k integral: two exact powers of two, one rounding where the result is normal (as
 * AVX-512's scalef); k is clamped to [-252, 254], which still overflows to inf and underflows to 0. */
AI vf vf_scale2(vf f, vf k) {
    k = _mm256_min_ps(_mm256_max_ps(k, _mm256_set1_ps(-252.0f)), _mm256_set1_ps(254.0f));
    __m256i ki = _mm256_cvtps_epi32(k), half = _mm256_srai_epi32(ki, 1), rest = _mm256_sub_epi32(ki, half);
    const __m256i bias = _mm256_set1_epi32(127);
    vf p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    vf p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(f, p1), p2);
}

AI vmask vf_ge(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }

AI vf vf_select(vmask m, vf yes, vf no) { return _mm256_blendv_ps(no, yes, m); }  /* yes where m */
AI vf vf_load_lanes(vmask m, const float *p) { return _mm256_maskload_ps(p, _mm256_castps_si256(m)); }
AI void vf_store_lanes(float *p, vmask m, vf f) { _mm256_maskstore_ps(p, _mm256_castps_si256(m), f); }
AI vmask vmask_from_bits(int bits) {  /* lane i live where bit i is set */
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits), bit), bit));
}
#endif

/* f rounded to the 16-bit dtype, as fp32. */
AI vf rounded(vf f, int fp16) {
#ifdef __AVX512F__
    return halves_to_floats(floats_to_halves(f, fp16), fp16);
#else
    return halves_to_floats8(floats_to_halves8(f, fp16), fp16);
#endif
}

/* exp(z) within 2 ulp: z = k ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial (Cephes' expf) times
 * 2^k; inf above ~88.7, denormal then 0 below ~-87.3 (callers mask where they need exact 0s). */
AI vf exp_poly(vf z) {
    vf k = vf_round_nearest(vf_mul(z, vf_set1(1.44269504088896341f)));
    vf r = vf_fnmadd(k, vf_set1(0.693359375f), z);
    r = vf_fnmadd(k, vf_set1(-2.12194440e-4f), r);
    vf p = vf_set1(1.9875691500e-4f);
    p = vf_fmadd(p, r, vf_set1(1.3981999507e-3f));
    p = vf_fmadd(p, r, vf_set1(8.3334519073e-3f));
    p = vf_fmadd(p, r, vf_set1(4.1665795894e-2f));
    p = vf_fmadd(p, r, vf_set1(1.6666665459e-1f));
    p = vf_fmadd(p, r, vf_set1(5.0000001201e-1f));
    p = vf_fmadd(vf_mul(p, r), r, vf_add(r, vf_set1(1.0f)));
    return vf_scale2(p, k);
}

#endif
