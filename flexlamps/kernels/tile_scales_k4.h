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
    if (x->k6) return k6_group(sz, g, n);  /* (Q6_K's form: tile_scales_k6.h) */
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

/* With 8-bit x rounded per super-block (QRows.k4 == K4_SUPER: one dx a 256 inputs, `x_block`, as
 * llama.cpp's Q8_K) a row's super-block sum is d (sum_g sc_g S_g) - dmin (sum_g m_g Q_g), times dx:
 * S_g the group's exact int32 sum of u q, Q_g its x codes' sum. Every variant takes these fp32 steps,
 * in this order, for each output and row (so a row's bits do not depend on the variant or the rows
 * beside it):
 *   sb = cvt(S_0) sc_0; sb = fma(cvt(S_g), sc_g, sb) for g = 1..7   (sc_g exact in fp32)
 *   tot = fma(fmsub(d, sb, dmin cvt(M)), dx, tot), M = sum_g m_g Q_g
 * M is an exact integer (|M| <= 8 * 63 * 32 * 127 < 2^24), so each variant may sum it as it likes: the
 * prompt loops by vpmaddwd of int16 pairs (m_2p, m_2p+1) times (Q_2p, Q_2p+1), the decode loops in fp32
 * (every partial sum an integer under 2^24: exact). A group takes cvt + fma where the per-group form
 * (K4_GROUPWISE, 16-bit x) took cvt, mul and two fmas; tot is read and written once a super-block. */
#define K4_GROUPWISE 1  /* QRows.k4: Q4_K's form with x rounded per group (16-bit x) */
#define K4_SUPER 2      /* QRows.k4: Q4_K's form with 8-bit x rounded per super-block */

/* Super-block j's values for 8 lanes (rows lo..lo+3, hi..hi+3 of a tile of n rows; d: the super-block's
 * d plane, `k4_group`'s 2 + g % 8 planes before its groups'): each group q's sc as fp32 at scale + q *
 * stride; d, dmin (fp32) and the m pairs (int32: m_2p | m_2p+1 << 16) at super + slot * stride (slots 0,
 * 1 and 2..5). */
static void k4_super_block(const uint16_t *d, int64_t n, int64_t lo, int64_t hi, float *scale, float *super,
                           int64_t stride) {
#define K4_LOAD(p) _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)((p) + lo)), \
                                      _mm_loadl_epi64((const __m128i *)((p) + hi)))
    _mm256_storeu_ps(super, _mm256_cvtph_ps(K4_LOAD(d)));
    _mm256_storeu_ps(super + stride, _mm256_cvtph_ps(K4_LOAD(d + n)));
    __m256i m[K4_GROUPS];
    for (int q = 0; q < K4_GROUPS; q++) {
        const __m256i sm = _mm256_cvtepu16_epi32(K4_LOAD(d + (2 + q) * n));
        _mm256_storeu_ps(scale + q * stride, _mm256_cvtepi32_ps(_mm256_and_si256(sm, _mm256_set1_epi32(0xFF))));
        m[q] = _mm256_srli_epi32(sm, 8);
    }
    for (int p = 0; p < K4_GROUPS / 2; p++)
        _mm256_storeu_si256((__m256i *)(super + (2 + p) * stride),
                            _mm256_or_si256(m[2 * p], _mm256_slli_epi32(m[2 * p + 1], 16)));
#undef K4_LOAD
}

/* x's group code sums g, g + 1 as the int16 pair vpmaddwd multiplies the m pairs by. */
AI int32_t k4_q_pair(const int32_t *total) { return (int32_t)((uint32_t)(uint16_t)total[0] | (uint32_t)total[1] << 16); }

/* A row's x code sums of a super-block's groups (total: its first) as the 4 int16 pairs vpmaddwd
 * multiplies the m pairs by, each in every lane. */
AI void k4_q_pairs8(const int32_t *total, __m256i qp[4]) {
    for (int p = 0; p < K4_GROUPS / 2; p++) qp[p] = _mm256_set1_epi32(k4_q_pair(total + 2 * p));
}

/* tot + (d sb - dmin M) dx for 8 lanes, M in fp32 (exact). */
AI __m256 k4_close8(__m256 d, __m256 dmin, __m256 sb, __m256 m, __m256 dx, __m256 tot) {
    return _mm256_fmadd_ps(_mm256_fmsub_ps(d, sb, _mm256_mul_ps(dmin, m)), dx, tot);
}

/* k4_close8 with the super-block's values at super (`k4_super_block`), M from the m pairs times qp (the
 * row's `k4_q_pairs8`). */
AI __m256 k4_finish8(const float *super, int64_t stride, __m256 sb, const __m256i qp[4], __m256 dx, __m256 tot) {
    __m256i m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(super + 2 * stride)), qp[0]);
    for (int p = 1; p < K4_GROUPS / 2; p++)
        m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(super + (2 + p) * stride)), qp[p]));
    return k4_close8(_mm256_loadu_ps(super), _mm256_loadu_ps(super + stride), sb, _mm256_cvtepi32_ps(m), dx, tot);
}

/* A group's step into the super-block's M in fp32, mf (its m) times the row's Q: exact, every partial
 * sum an integer under 2^24, so the integer M's value (the decode loops sum it so: no m pairs to make). */
AI __m256 k4_min_step8(__m256 mf, float q, __m256 m, int first) {
    return first ? _mm256_mul_ps(mf, _mm256_set1_ps(q)) : _mm256_fmadd_ps(mf, _mm256_set1_ps(q), m);
}

/* A group's step into the super-block sum: sb = cvt(S) sc (the first group: `first`), else fma. */
AI __m256 k4_step8(__m256i dot, __m256 sc, __m256 sb, int first) {
    return first ? _mm256_mul_ps(_mm256_cvtepi32_ps(dot), sc) : _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc, sb);
}

/* M in fp32 (`k4_min_step8`'s chain) of nb rows (x's code sums at total, row stride `stride`, from the
 * super-block's first group) for 8 lanes, rows r.. of the planes from the super-block's first group's
 * at `plane` (the groups' planes n apart): the m made once for every row. */
AI void k4_mins8(const uint16_t *plane, int64_t n, int64_t r, const int32_t *total, int64_t stride, int nb,
                 __m256 m[]) {
    for (int q = 0; q < K4_GROUPS; q++) {
        const __m256i sm = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(plane + q * n + r)));
        const __m256 mf = _mm256_cvtepi32_ps(_mm256_srli_epi32(sm, 8));
        for (int b = 0; b < nb; b++) m[b] = k4_min_step8(mf, (float)total[b * stride + q], m[b], q == 0);
    }
}

#if defined(__AVX512F__)
/* k4_q_pairs8 for 16 lanes. */
AI void k4_q_pairs16(const int32_t *total, __m512i qp[4]) {
    for (int p = 0; p < K4_GROUPS / 2; p++) qp[p] = _mm512_set1_epi32(k4_q_pair(total + 2 * p));
}

/* k4_close8 for 16 lanes. */
AI __m512 k4_close16(__m512 d, __m512 dmin, __m512 sb, __m512 m, __m512 dx, __m512 tot) {
    return _mm512_fmadd_ps(_mm512_fmsub_ps(d, sb, _mm512_mul_ps(dmin, m)), dx, tot);
}

/* k4_finish8 for 16 lanes. */
AI __m512 k4_finish16(const float *super, int64_t stride, __m512 sb, const __m512i qp[4], __m512 dx, __m512 tot) {
    __m512i m = _mm512_madd_epi16(_mm512_loadu_si512(super + 2 * stride), qp[0]);
    for (int p = 1; p < K4_GROUPS / 2; p++)
        m = _mm512_add_epi32(m, _mm512_madd_epi16(_mm512_loadu_si512(super + (2 + p) * stride), qp[p]));
    return k4_close16(_mm512_loadu_ps(super), _mm512_loadu_ps(super + stride), sb, _mm512_cvtepi32_ps(m), dx, tot);
}

/* k4_min_step8 for 16 lanes. */
AI __m512 k4_min_step16(__m512 mf, float q, __m512 m, int first) {
    return first ? _mm512_mul_ps(mf, _mm512_set1_ps(q)) : _mm512_fmadd_ps(mf, _mm512_set1_ps(q), m);
}

/* k4_step8 for 16 lanes. */
AI __m512 k4_step16(__m512i dot, __m512 sc, __m512 sb, int first) {
    return first ? _mm512_mul_ps(_mm512_cvtepi32_ps(dot), sc) : _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, sb);
}
/* k4_mins8 for 16 lanes. */
AI void k4_mins16(const uint16_t *plane, int64_t n, int64_t r, const int32_t *total, int64_t stride, int nb,
                  __m512 m[]) {
    for (int q = 0; q < K4_GROUPS; q++) {
        const __m512i sm = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(plane + q * n + r)));
        const __m512 mf = _mm512_cvtepi32_ps(_mm512_srli_epi32(sm, 8));
        for (int b = 0; b < nb; b++) m[b] = k4_min_step16(mf, (float)total[b * stride + q], m[b], q == 0);
    }
}
#endif
