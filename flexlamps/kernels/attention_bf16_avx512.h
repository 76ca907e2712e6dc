/* attention.c's bf16 paths on CPUs with AVX512_BF16: the products of bf16 pairs summed in fp32 by
 * vdpbf16ps, with nothing converted first (the same fp32 arithmetic up to the order of the sums).
 * Included by attention.c only, for its AVX-512 variants (it uses attention.c's Args, `visible`,
 * `lanes`, `sums_vw` and `store_rounded`). */
#define BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,fma")))

BF16_TARGET static void scores_bf16(const Args *a, int64_t row, int64_t kvh, int group, float *sc) {
    const uint16_t *keys = a->k + row * a->st[3] + kvh * a->st[4];
    const uint8_t *mask = a->mt;
    int64_t blocks = a->d / 32;
    const __m512 scale = _mm512_set1_ps(a->scale), ninf = _mm512_set1_ps(-INFINITY);
    __m512i qv[MAX_GROUP][MAX_D / 32];
    for (int g = 0; g < group; g++)
        for (int64_t b = 0; b < blocks; b++)
            qv[g][b] = _mm512_loadu_si512(a->qt + (kvh * group + g) * a->st[1] + 32 * b);
    for (int64_t j0 = 0; j0 < a->span; j0 += 16) {
        int count = a->span - j0 < 16 ? (int)(a->span - j0) : 16;
        __mmask16 vis = visible(a, mask, j0, count);
        for (int g = 0; g < group; g++) {
            __m512 acc[16];
            for (int j = 0; j < 16; j++) {
                acc[j] = _mm512_setzero_ps();
                if (j >= count) continue;
                const uint16_t *key = keys + (j0 + j) * a->st[5];
                for (int64_t b = 0; b < blocks; b++)
                    acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)qv[g][b], (__m512bh)_mm512_loadu_si512(key + 32 * b));
            }
            __m512 s = _mm512_mask_blend_ps(vis, ninf, _mm512_mul_ps(sums_vw(acc), scale));
            _mm512_mask_storeu_ps(sc + g * a->span + j0, lanes(count), s);
        }
    }
}

/* Two keys at a time: their values interleaved (v_j[e], v_j+1[e]) and their probabilities paired,
 * one vdpbf16ps adds p_j v_j[e] + p_j+1 v_j+1[e]; the interleave puts outputs e = 8L..8L+3 of a
 * 32-block in lane L of `lo` and 8L+4..8L+7 in lane L of `hi`, put back in order at the end. */
BF16_TARGET AI void weighted_values_bf16_fixed(const Args *a, int64_t row, int64_t kvh, const float *pr,
                                               const int G, const int B) {
    const uint16_t *values = a->v + row * a->st[6] + kvh * a->st[7];
    __m512 lo[G * B], hi[G * B];
    for (int i = 0; i < G * B; i++) lo[i] = hi[i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < a->span; j += 2) {
        int two = j + 1 < a->span;
        __m512i il[B], ih[B];
        for (int b = 0; b < B; b++) {
            __m512i v0 = _mm512_loadu_si512(values + j * a->st[8] + 32 * b);
            __m512i v1 = two ? _mm512_loadu_si512(values + (j + 1) * a->st[8] + 32 * b) : _mm512_setzero_si512();
            il[b] = _mm512_unpacklo_epi16(v0, v1);
            ih[b] = _mm512_unpackhi_epi16(v0, v1);
        }
        for (int g = 0; g < G; g++) {
            union { float f; uint32_t u; } p0 = { pr[g * a->span + j] }, p1 = { two ? pr[g * a->span + j + 1] : 0.0f };
            if (!(p0.u | p1.u)) continue;  /* masked, or rounded to 0: adds exactly 0 */
            __m512bh pair = (__m512bh)_mm512_set1_epi32((int)((p0.u >> 16) | (p1.u & 0xFFFF0000u)));
            /* one key of the pair at probability 0 adds nothing: its value (a masked key's may be NaN
             * or Inf, and 0 * NaN is NaN) is read as 0 (the low half of each lane is key j's) */
            __m512i keep = _mm512_set1_epi32((int)((p0.u ? 0xFFFFu : 0u) | (p1.u ? 0xFFFF0000u : 0u)));
            int lone = !p0.u || !p1.u;
            for (int b = 0; b < B; b++) {
                __m512i l = lone ? _mm512_and_si512(il[b], keep) : il[b], h = lone ? _mm512_and_si512(ih[b], keep) : ih[b];
                lo[g * B + b] = _mm512_dpbf16_ps(lo[g * B + b], pair, (__m512bh)l);
                hi[g * B + b] = _mm512_dpbf16_ps(hi[g * B + b], pair, (__m512bh)h);
            }
        }
    }
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int g = 0; g < G; g++)
        for (int b = 0; b < B; b++) {
            store_rounded(a, row, kvh, G, g, 2 * b, _mm512_permutex2var_ps(lo[g * B + b], first, hi[g * B + b]));
            store_rounded(a, row, kvh, G, g, 2 * b + 1, _mm512_permutex2var_ps(lo[g * B + b], second, hi[g * B + b]));
        }
}

/* 1 if this (group, head size) has a bf16 path, which then ran. */
BF16_TARGET static int weighted_values_bf16(const Args *a, int64_t row, int64_t kvh, int group, const float *pr) {
#define FIXED(G, B) if (group == G && a->d == 32 * B) { weighted_values_bf16_fixed(a, row, kvh, pr, G, B); return 1; }
    FIXED(1, 2) FIXED(2, 2) FIXED(3, 2) FIXED(4, 2) FIXED(5, 2) FIXED(6, 2) FIXED(8, 2)
    FIXED(1, 4) FIXED(2, 4) FIXED(3, 4) FIXED(4, 4)
#undef FIXED
    return 0;
}
