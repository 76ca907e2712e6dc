/* 16-bit floats (bf16 or fp16) to fp32 and back, as torch converts them: 16 lanes at a time where
 * the kernel is built for AVX-512, 8 at a time (AVX2 + F16C) in every variant. Shared by the
 * kernels here (tile_gemv.c, int8_gemm.c, and through native_simd.h the others). The libraries'
 * build keys cover this file (flexlamps/kernels/build.py). */
#ifndef FLEXLAMPS_NATIVE_HALVES_H
#define FLEXLAMPS_NATIVE_HALVES_H
#include <immintrin.h>
#include <stdint.h>

#define AI static inline __attribute__((always_inline))

/* 8 halves as fp32 (exact). */
AI __m256 halves_to_floats8(__m128i h, int fp16) {
    if (fp16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 fp32 as halves, rounded as torch's `.to(dtype)` (bf16: to nearest even; NaNs stay quiet NaNs). */
AI __m128i floats_to_halves8(__m256 f, int fp16) {
    if (fp16) return _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i u = _mm256_castps_si256(f);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));  /* each < 2^16 */
}

#ifdef __AVX512F__
/* 16 halves as fp32 (exact). */
AI __m512 halves_to_floats(__m256i h, int fp16) {
    if (fp16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 fp32 as halves, rounded as torch's `.to(dtype)`. */
AI __m256i floats_to_halves(__m512 f, int fp16) {
    if (fp16) return _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i u = _mm512_castps_si512(f);  /* bf16: round to nearest even; NaNs stay (quiet) NaNs */
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}
#endif

#endif
