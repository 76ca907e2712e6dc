/* tile_gemm.h's passes on AVX512-VNNI (the avx512 and amx variants' rows off the AMX tiles; AMD's
 * Zen 4, which has no AVX-VNNI and no AMX, runs its prompts here): vpdpbusd on 512-bit vectors, a
 * step's 4 inputs of ZMM_ROWS rows of x by the sub-tile's 128 bytes of codes (two vectors: lanes
 * v = 0, 1 and 2, 3 of the 256-bit layout), x's 4 codes broadcast. 32 vector registers hold the 8
 * sums and the codes, where the 256-bit passes (tile_gemm_vnni.h's, or vpmaddubsw's) had 16 for
 * 2 rows: the AVX-VNNI asm's sums spilled every step here (0.7x vpmaddubsw's rate on Zen 4).
 *   4-bit codes: vpdpbusd(codes 0..15, x) from 0;
 *   int8 codes held biased (q + CODE_BIAS, |q| <= 32): from -CODE_BIAS times the group's x codes' sum.
 * The same exact int32 sums as the other passes, each row's fp32 steps the same (add_dots, per pair of
 * rows in order): the same bits. Included by tile_gemm.h where __AVX512VNNI__ is set. */

#define ZMM_ROWS 4  /* rows of x a pass takes: 8 sums of 16 lanes in registers (vpdpbusd's latency 4-5) */

/* Whether the 512-bit pass takes these codes: 4-bit ones in groups of 32 (Q4_0, Q4_K), biased int8 ones
 * in groups of 16 (Q6_K); other int8 codes take tile_gemm.h's passes. */
AI int zmm_takes(const Prepared *prep, int64_t group, int split) {
    return split ? group == 16 && prep->biased : group == 32;
}

/* Group g's exact sums of nb rows (`group` inputs, a constant in each copy) by the prepared codes,
 * as add_dots takes them (dot[b][v]: lanes of vector v). */
AI void zmm_group(const Prepared *prep, const QRows *x, int64_t g, int64_t group, int biased, __m256i dot[][4],
                  int nb) {
    __m512i acc[ZMM_ROWS][2];
    for (int b = 0; b < nb; b++)
        acc[b][0] = acc[b][1] = biased ? _mm512_set1_epi32(-CODE_BIAS * x->total[b * x->groups + g])
                                       : _mm512_setzero_si512();
    const uint8_t *w = prep->codes + g * group * 32;
    const int8_t *xq = x->q8 + g * group;
    for (int64_t k = 0; k < group; k += 4) {
        const __m512i c0 = _mm512_loadu_si512(w + k * 32), c1 = _mm512_loadu_si512(w + k * 32 + 64);
        for (int b = 0; b < nb; b++) {
            int32_t four;
            memcpy(&four, xq + b * x->cols + k, 4);
            const __m512i xb = _mm512_set1_epi32(four);
            acc[b][0] = _mm512_dpbusd_epi32(acc[b][0], c0, xb);
            acc[b][1] = _mm512_dpbusd_epi32(acc[b][1], c1, xb);
        }
    }
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < 2; i++) {
            dot[b][2 * i] = _mm512_castsi512_si256(acc[b][i]);
            dot[b][2 * i + 1] = _mm512_extracti64x4_epi64(acc[b][i], 1);
        }
}

/* The 32 outputs (lane order) of nb (<= ZMM_ROWS) rows of x by a prepared sub-tile into tot: rows 0, 1
 * at tot and tot + 32, rows 2, 3 at tot + 128 and tot + 160 (each pair's second 64 floats: Q4_K's
 * super-block sums, `k4_add_dots`); rows 2, 3 take Q6_K's super-block sums from prep->acc + 64. */
AI void zmm_pass(const Prepared *prep, const QRows *x, int64_t group, int split, float *tot, int nb) {
    memset(tot, 0, sizeof(float) * 4 * 32 * (size_t)ZMM_ROWS);
    Prepared high = *prep;
    high.acc = prep->acc + 2 * 32;
    const QRows x23 = rows_from(x, 2);
    for (int64_t g = 0; g < x->groups; g++) {
        __m256i dot[ZMM_ROWS][4];
        if (nb == ZMM_ROWS) {  /* the next pass's rows, a group ahead (as pass2) */
            for (int b = ZMM_ROWS; b < 2 * ZMM_ROWS; b++)
                _mm_prefetch((const char *)(x->q8 + b * x->cols + g * group), _MM_HINT_T0);
        }
        zmm_group(prep, x, g, group, split, dot, nb);
        add_dots(prep, g, x, dot, tot, nb < 2 ? nb : 2, split);
        if (nb > 2) add_dots(&high, g, &x23, dot + 2, tot + 128, nb - 2, split);
    }
}

/* Every row of x by one prepared sub-tile (gemm_rows' arguments), ZMM_ROWS rows a pass; the group
 * sizes constant in each copy, so the compiler unrolls a group's steps. */
static void zmm_rows(const Prepared *prep, const QRows *x, int64_t rows, int64_t group, int split, uint16_t *out,
                     int64_t n, int64_t s, int64_t h, int fp16) {
    for (int64_t b0 = 0; b0 < rows; b0 += ZMM_ROWS) {
        const int nb = rows - b0 < ZMM_ROWS ? (int)(rows - b0) : ZMM_ROWS;
        QRows xb = rows_from(x, b0);
        float tot[4 * 32 * ZMM_ROWS];
        if (nb == ZMM_ROWS && split) zmm_pass(prep, &xb, 16, 1, tot, ZMM_ROWS);
        else if (nb == ZMM_ROWS) zmm_pass(prep, &xb, 32, 0, tot, ZMM_ROWS);
        else zmm_pass(prep, &xb, group, split, tot, nb);
        for (int b = 0; b < nb; b++) {
            const float *row = tot + b / 2 * 128 + b % 2 * 32;
            store_pass(row, out + (b0 + b) * n + 16 * s, out + (b0 + b) * n + h + 16 * s, fp16);
        }
    }
}
