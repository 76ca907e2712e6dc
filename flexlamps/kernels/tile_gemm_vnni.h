/* tile_gemm.h's passes on AVX-VNNI (the avx_vnni variant: Intel's desktop cores since 12th gen):
 * vpdpbusd adds a lane's 4 products of unsigned codes and signed x codes straight into its int32
 * sum, one instruction where vpmaddubsw, vpaddw and a widening took two and more, and with no
 * int16 bound a group's sums run in one piece.
 *   4-bit codes: vpdpbusd(codes 0..15, x) from 0;
 *   int8 codes held biased (q + CODE_BIAS, |q| <= 32): from -CODE_BIAS times the group's x codes'
 *           sum (x->total), so the sums end at those of q x;
 *   other int8 codes: vpdpbusd(|q|, x signed by q).
 * The same exact int32 sums as the AVX2 passes and the same fp32 steps (add_dots): the same bits.
 * Included by tile_gemm.h only, where built with -mavxvnni. */

/* One step (4 inputs) of one or two rows of x (row stride `stride`) by a sub-tile's 4 vectors of codes at
 * w (int8 ones: magnitudes at w, signed codes at q, where `sign`), added to each row's 4 vectors of int32
 * sums: asm, as tile_gemm.h's step_rows (from intrinsics gcc copied the sums between registers and
 * spilled them every step). {vex}: AVX-VNNI's encoding, not AVX512-VNNI's. */
#define VNNI_TIMES(x, v, a) "%{vex%} vpdpbusd %%ymm14, %%ymm1" v ", %[" a v "]\n\t"
#define VNNI_SIGNED(x, v, a) "vpsignb " v "*32(%[q]), %%ymm14, %%ymm15\n\t" \
                             "%{vex%} vpdpbusd %%ymm15, %%ymm1" v ", %[" a v "]\n\t"

AI void vnni_step(const uint8_t *w, const uint8_t *q, const int8_t *x, int64_t stride, __m256i p[][4], int sign,
                  int nb) {
    STEP_FORMS(VNNI_TIMES, VNNI_SIGNED, sign);
}

/* The 32 outputs (lane order) of nb rows of x by a prepared sub-tile, every group, into tot. */
AI void vnni_pass(const Prepared *prep, const QRows *x, int64_t group, int split, float *tot, int nb) {
    const int biased = split && prep->biased, sign = split && !biased;
    const uint8_t *w = sign ? prep->magnitude : prep->codes;
    memset(tot, 0, sizeof(float) * 32 * (size_t)nb);
    for (int64_t g = 0; g < x->groups; g++) {
        __m256i dot[GEMM_ROWS][4];
        for (int b = 0; b < nb; b++)
            for (int v = 0; v < 4; v++)
                dot[b][v] = biased ? _mm256_set1_epi32(-CODE_BIAS * x->total[b * x->groups + g]) : _mm256_setzero_si256();
        if (nb == 2) {  /* the next pass's rows, a group ahead (as pass2) */
            _mm_prefetch((const char *)(x->q8 + 2 * x->cols + g * group), _MM_HINT_T0);
            _mm_prefetch((const char *)(x->q8 + 3 * x->cols + g * group), _MM_HINT_T0);
        }
        for (int64_t k = g * group; k < (g + 1) * group; k += 4)
            vnni_step(w + k * 32, prep->codes + k * 32, x->q8 + k, x->cols, dot, sign, nb);
        add_dots(prep, g, x, dot, tot, nb, split);
    }
}

/* tile_gemm.h's gemm_pass on AVX-VNNI: the common groups' counts constant, so the compiler unrolls
 * them (4-bit codes in groups of 32: Q4_0, Q4_K; Q6_K's biased int8 codes in groups of 16). */
AI void gemm_pass(const Prepared *prep, const QRows *x, int64_t group, int split, float *tot, int nb) {
    if (!split && group == 32) vnni_pass(prep, x, 32, 0, tot, nb);
    else if (split && group == 16 && prep->biased) vnni_pass(prep, x, 16, 1, tot, nb);
    else vnni_pass(prep, x, group, split, tot, nb);
}
