/* Q4_K's scales as the file holds them (kind KIND_INT4_K; QRows.k4): 4-bit codes u whose group of
 * 32 inputs has w = d sc u - dmin m, sc and m 6-bit integers, d and dmin fp16 a super-block of 8
 * groups (quant/int4_weight.py: `Int4Weight.from_k_blocks`). Laid out as scale_zero is, planes of
 * n 16-bit values (a row's at its row), K4_PLANES a super-block: d, dmin (the file's fp16 bits),
 * then each group's sc | m << 8; 2.5 bytes a row a super-block, 4.625 bits a weight with the codes,
 * where a bf16 (scale, zero) pair a group held 5. Each loop makes a group's scale d sc and offset
 * -dmin m (the value of code 0) in fp32, exactly (11 by 6 significant bits), where the pairs
 * rounded d sc and 8 d sc - dmin m to bf16: llama.cpp's values (`dequantize_row_q4_K`). Every
 * variant reads them through these helpers and takes the same fp32 steps after, so a row's bits do
 * not depend on the variant or on the rows beside it. Included by tile_gemv.c only. */
#define K4_PLANES 10
#define K4_GROUPS 8  /* groups of 32 inputs a super-block */

/* Scale-zero planes (or pair groups) of `groups` groups a tile row: Q4_K's K4_PLANES a super-block. */
static inline int64_t k4_planes(int64_t groups) { return groups / K4_GROUPS * K4_PLANES; }

/* Group g's plane of sc | m << 8 in Q4_K's form, a tile of n rows at sz. */
AI const uint16_t *k4_group(const uint16_t *sz, int64_t g, int64_t n) {
    return sz + ((g / K4_GROUPS) * K4_PLANES + 2 + g % K4_GROUPS) * n;
}

/* Where group g's scales lie in a tile of n rows at sz: its scale-zero pairs (an int8 split's low
 * halves'; `sz_group`), or in Q4_K's form its plane of sc | m << 8 (the super-block's d and dmin lie
 * 2 + g % 8 and 1 + g % 8 planes before it: `k4_lanes`). */
AI const uint16_t *group_scales(const uint16_t *sz, int64_t g, int64_t n, const QRows *x, int kind) {
    if (x->k4) return k4_group(sz, g, n);
    return sz + sz_group(g, x->groups, kind) * n * x->sz_width;
}

/* Lanes' fp32 scale d sc and offset -dmin m from their 16-bit sc | m << 8 (as int32), d and dmin in fp32. */
AI void k4_make8_ps(__m256i sm, __m256 d, __m256 dmin, __m256 *scale, __m256 *offset) {
    *scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(sm, _mm256_set1_epi32(0xFF))));
    *offset = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(sm, 8)), _mm256_setzero_ps());
}

/* k4_make8_ps with d and dmin as the file's fp16 bits. */
AI void k4_make8(__m256i sm, __m128i d, __m128i dmin, __m256 *scale, __m256 *offset) {
    k4_make8_ps(sm, _mm256_cvtph_ps(d), _mm256_cvtph_ps(dmin), scale, offset);
}

/* Group g's scale and offset for the 8 rows r.. (at = `group_scales`, a tile of n rows). */
AI void k4_rows8(const uint16_t *at, int64_t g, int64_t n, int64_t r, __m256 *scale, __m256 *offset) {
    const uint16_t *d = at - (2 + g % K4_GROUPS) * n + r;
    k4_make8(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(at + r))), _mm_loadu_si128((const __m128i *)d),
             _mm_loadu_si128((const __m128i *)(d + n)), scale, offset);
}

/* Group g's fp32 scale d sc and offset -dmin m for 8 lanes, 0-3 the rows at lo, 4-7 at hi (row
 * indices within the tile; at = `group_scales`). */
AI void k4_lanes(const uint16_t *at, int64_t g, int64_t n, int64_t lo, int64_t hi, __m256 *scale, __m256 *offset) {
    const uint16_t *d = at - (2 + g % K4_GROUPS) * n;
#define K4_LOAD(p) _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)((p) + lo)), \
                                      _mm_loadl_epi64((const __m128i *)((p) + hi)))
    k4_make8(_mm256_cvtepu16_epi32(K4_LOAD(at)), K4_LOAD(d), K4_LOAD(d + n), scale, offset);
#undef K4_LOAD
}
