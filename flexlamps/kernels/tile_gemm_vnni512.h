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
enum { ZMM_PLAIN, ZMM_K4, ZMM_K6 };  /* the fp32 steps: add_dots_with's, Q4_K's form's (x per super-block), Q6_K's */

/* Whether the 512-bit pass takes these codes: 4-bit ones in groups of 32 (Q4_0, Q4_K), biased int8 ones
 * in groups of 16 (Q6_K); other int8 codes take tile_gemm.h's passes. */
AI int zmm_takes(const Prepared *prep, int64_t group, int split) {
    return split ? group == 16 && prep->biased : group == 32;
}

/* Group g's exact sums of nb rows (`group` inputs, a constant in each copy) by the prepared codes:
 * acc[b][i] holds lanes 16i.. of the 256-bit passes' order (their vectors 2i, 2i + 1). */
AI void zmm_group(const Prepared *prep, const QRows *x, int64_t g, int64_t group, int biased, __m512i acc[][2],
                  int nb) {
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
}

/* add_dots' fp32 steps for 16 lanes, the running sums in registers (tot; Q4_K's super-block sums `sb`,
 * Q6_K's integer ones `acc6`): each lane's operations and their order those of add_dots_with, k4_add_dots
 * and k6_add_dots, so the same bits. `offsets`: add_dots_with's last step (fma by +0 is exact: see there). */
AI void zmm_add_dots(const Prepared *prep, int64_t g, const QRows *x, const __m512i acc[][2], __m512 t[][2],
                     __m512 sb[][2], __m512i acc6[][2], int form, int offsets, int nb) {
    const float *scale = prep->scale + g * SUB;
    for (int b = 0; b < nb; b++) {
        const int64_t at = b * x->groups + g;
        for (int i = 0; i < 2; i++) {
            if (form == ZMM_K4) {  /* the super-block's last group: zmm_k4_finish */
                sb[b][i] = k4_step16(acc[b][i], _mm512_loadu_ps(scale + 16 * i), sb[b][i], g % K4_GROUPS == 0);
            } else if (form == ZMM_K6) {
                const int64_t j = g % K6_GROUPS;
                __m512i sum = _mm512_mullo_epi32(acc[b][i], _mm512_loadu_si512(scale + 16 * i));
                acc6[b][i] = j ? _mm512_add_epi32(sum, acc6[b][i]) : sum;
                if (j == K6_GROUPS - 1)
                    t[b][i] = k6_step16(acc6[b][i], _mm512_loadu_ps(prep->offset + g / K6_GROUPS * SUB + 16 * i),
                                        x->scale[at], t[b][i]);
            } else {
                __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[b][i]), _mm512_set1_ps(x->scale[at]));
                v = _mm512_fmadd_ps(_mm512_loadu_ps(scale + 16 * i), v, t[b][i]);
                if (offsets) v = _mm512_fmadd_ps(_mm512_loadu_ps(prep->offset + g * SUB + 16 * i), _mm512_set1_ps(x->sum[at]), v);
                t[b][i] = v;
            }
        }
    }
}

/* Q4_K's form: super-block j0's sums (sb) of nb rows closed into t (k4_add_dots' last step, 16 lanes). */
AI void zmm_k4_finish(const Prepared *prep, int64_t j0, const QRows *x, __m512 sb[][2], __m512 t[][2], int nb) {
    for (int b = 0; b < nb; b++) {
        __m512i qp[K4_GROUPS / 2];
        k4_q_pairs16(x->total + b * x->groups + j0, qp);
        const __m512 dx = _mm512_set1_ps(x->scale[b * x->groups + j0]);
        for (int i = 0; i < 2; i++) t[b][i] = k4_finish16(prep->offset + j0 * SUB + 16 * i, SUB, sb[b][i], qp, dx, t[b][i]);
    }
}

/* The 32 outputs (lane order) of nb (<= ZMM_ROWS) rows of x by a prepared sub-tile into tot (row b's
 * at tot + 32 b), every group, the sums in registers. */
AI void zmm_pass(const Prepared *prep, const QRows *x, int64_t group, int split, int form, float *tot, int nb) {
    __m512 t[ZMM_ROWS][2], sb[ZMM_ROWS][2];
    __m512i acc6[ZMM_ROWS][2];
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < 2; i++) t[b][i] = sb[b][i] = _mm512_setzero_ps(), acc6[b][i] = _mm512_setzero_si512();
    const int offsets = !split || prep->offsets;
    for (int64_t g = 0; g < x->groups; g++) {
        __m512i acc[ZMM_ROWS][2];
        if (nb == ZMM_ROWS) {  /* the next pass's rows, a group ahead (as pass2) */
            for (int b = ZMM_ROWS; b < 2 * ZMM_ROWS; b++)
                _mm_prefetch((const char *)(x->q8 + b * x->cols + g * group), _MM_HINT_T0);
        }
        zmm_group(prep, x, g, group, split, acc, nb);
        zmm_add_dots(prep, g, x, acc, t, sb, acc6, form, offsets, nb);
        if (form == ZMM_K4 && g % K4_GROUPS == K4_GROUPS - 1) zmm_k4_finish(prep, g + 1 - K4_GROUPS, x, sb, t, nb);
    }
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < 2; i++) _mm512_storeu_ps(tot + 32 * b + 16 * i, t[b][i]);
}

/* Every row of x by one prepared sub-tile (gemm_rows' arguments), ZMM_ROWS rows a pass; the group
 * sizes constant in each copy, so the compiler unrolls a group's steps. */
static void zmm_rows(const Prepared *prep, const QRows *x, int64_t rows, int64_t group, int split, uint16_t *out,
                     int64_t n, int64_t s, int64_t h, int fp16) {
    const int form = x->k4 == K4_SUPER ? ZMM_K4 : prep->k6 ? ZMM_K6 : ZMM_PLAIN;
    for (int64_t b0 = 0; b0 < rows; b0 += ZMM_ROWS) {
        const int nb = rows - b0 < ZMM_ROWS ? (int)(rows - b0) : ZMM_ROWS;
        QRows xb = rows_from(x, b0);
        float tot[32 * ZMM_ROWS];
        if (nb == ZMM_ROWS && form == ZMM_K6) zmm_pass(prep, &xb, 16, 1, ZMM_K6, tot, ZMM_ROWS);
        else if (nb == ZMM_ROWS && split) zmm_pass(prep, &xb, 16, 1, ZMM_PLAIN, tot, ZMM_ROWS);
        else if (nb == ZMM_ROWS && form == ZMM_K4) zmm_pass(prep, &xb, 32, 0, ZMM_K4, tot, ZMM_ROWS);
        else if (nb == ZMM_ROWS) zmm_pass(prep, &xb, 32, 0, ZMM_PLAIN, tot, ZMM_ROWS);
        else zmm_pass(prep, &xb, group, split, form, tot, nb);
        for (int b = 0; b < nb; b++)
            store_pass(tot + 32 * b, out + (b0 + b) * n + 16 * s, out + (b0 + b) * n + h + 16 * s, fp16);
    }
}
