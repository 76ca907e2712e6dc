/* Q6_K's scales as the file holds them (kind KIND_INT6_K; QRows.k6): the 6-bit form's codes q in
 * [-32, 31] whose group of 16 inputs has w = d sc q, sc an int8, d fp16 a super-block of 16 groups
 * (quant/int8_weight.py: `Int8Weight.from_k6_blocks`). Laid out as scale_zero is, planes of n 16-bit
 * values (a row's at its row), K6_PLANES a super-block: d (the file's fp16 bits), then each group's
 * sc (as int16); 1.06 bits a weight, where the 6-bit form's bf16 scale a group held 1.
 *
 * With x rounded to int8 per super-block (one dx a 256 inputs, llama.cpp's Q8_K: `x_block`), a
 * super-block's sum S = sum over its groups of sc times the group's exact sum of q x is an integer
 * (|S| <= 256 * 128 * 32 * 127 < 2^31), summed exactly in int32, and one fp32 step a super-block
 * takes it: tot = fma(float(S), d * dx, tot), rounded as it is written here in every variant and
 * path (prompts, decode, the AMX tiles): a row's bits depend on that row alone, where the 6-bit
 * form took three fp32 steps a group of 16. Only 8-bit x: a head (16-bit x) takes the 6-bit
 * form's scales (`as_logits_head`). Included by tile_gemv.c only. */
#define K6_PLANES 17
#define K6_GROUPS 16  /* groups of 16 inputs a super-block */

/* Scale planes of `groups` groups a tile row: K6_PLANES a super-block. */
static inline int64_t k6_planes(int64_t groups) { return groups / K6_GROUPS * K6_PLANES; }

/* Group g's plane of sc in Q6_K's form, a tile of n rows at sz. */
AI const uint16_t *k6_group(const uint16_t *sz, int64_t g, int64_t n) {
    return sz + ((g / K6_GROUPS) * K6_PLANES + 1 + g % K6_GROUPS) * n;
}

/* Group g's super-block's plane of d, a tile of n rows at sz. */
AI const uint16_t *k6_d(const uint16_t *sz, int64_t g, int64_t n) {
    return sz + (g / K6_GROUPS) * K6_PLANES * n;
}

/* 8 rows' sc (int16 at p) as int32 lanes. */
AI __m256i k6_sc8(const uint16_t *p) { return _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)p)); }

/* A super-block's step for 8 lanes: tot + float(S) * (d * dx), one fma (every variant's, in this order). */
AI __m256 k6_step8(__m256i s, __m256 d, float dx, __m256 tot) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(dx)), tot);
}

#if defined(__AVX512F__)
/* k6_step8 for 16 lanes: the same operations on each lane, the same bits. */
AI __m512 k6_step16(__m512i s, __m512 d, float dx, __m512 tot) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(dx)), tot);
}
#endif
