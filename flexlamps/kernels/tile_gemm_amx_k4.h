/* Q4_K's form from 256 rows a call on the AMX tiles (tile_gemm_amx.h's `amx_rows_planes`, called by
 * tile_gemm_call.h's gemm_subtile in chunks of 64 rows or more): x per super-block on the tiles with
 * Q6_K's planes and super-block products (`amx_k6_planes`, `amx_k6_super`), and Q4_K's step
 * (`amx_k4_step`). Included by tile_gemm_amx.h only. */

/* Q4_K's form with x per super-block on the tiles, as Q6_K's: c = sc u (u the 4-bit code, 0 <= c <= 945)
 * split into bytes 256 hi + lo (both unsigned: hi <= 3, so tdpbssd takes it as amx_k6_super does), a
 * super-block's exact S = sum_g sc_g S_g in int32 from four tiles, K = 64 a product. Every other path
 * sums sb = sc_0 S_0, fma(S_g, sc_g, sb) in fp32 (tile_scales_k4.h): each partial sum is an integer
 * bounded by 945 A (A: the row's sum of |x codes| over the super-block), exact while A <= K4_FITS, so
 * there float(S) is that sb bit for bit; a row and super-block over it (`k4_fit_rows` says which:
 * rare, |x| near its maximum across the super-block) takes the groups' own sums and the fp32 chain
 * (`amx_k4_chain`). Then k4_finish16, as every path: the same bits whatever rows share the call. */
#define K4_FITS 17753  /* 945 A <= 2^24 */

/* fits[r * supers + j]: whether row r's super-block j has sum |x codes| <= K4_FITS (rows c * 64..). */
typedef struct {
    const QRows *x;
    int64_t rows;
    uint8_t *fits;
} K4Fits;

static void k4_fit_rows(void *ctx, int64_t c, int slot) {
    const K4Fits *f = ctx;
    const int64_t supers = f->x->cols / 256;
    (void)slot;
    for (int64_t r = c * 64; r < f->rows && r < (c + 1) * 64; r++)
        for (int64_t j = 0; j < supers; j++) {
            const int8_t *q = f->x->q8 + r * f->x->cols + 256 * j;
            __m512i a = _mm512_setzero_si512();
            for (int i = 0; i < 256; i += 64)  /* (vpsadbw against 0: each 8 bytes' sum of |codes|) */
                a = _mm512_add_epi64(a, _mm512_sad_epu8(_mm512_abs_epi8(_mm512_loadu_si512(q + i)),
                                                        _mm512_setzero_si512()));
            f->fits[r * supers + j] = _mm512_reduce_add_epi64(a) <= K4_FITS;
        }
}

/* Lanes' (16 at i) sb of row b (x codes at q, the super-block's) by the fp32 chain of its groups' exact
 * sums (vpmaddubsw pairs of u <= 15 and |x| <= 128 fit int16), for a super-block over K4_FITS. */
AI __m512 amx_k4_chain(const Prepared *prep, const int8_t *q, int64_t sb, int i) {
    __m512 sum = _mm512_setzero_ps();
    for (int g = 0; g < K4_GROUPS; g++) {
        __m512i dot = _mm512_setzero_si512();
        for (int k = 32 * g; k < 32 * g + 32; k += 4) {
            const __m512i u = _mm512_loadu_si512(prep->codes + (256 * sb + k) * 32 + 4 * i);
            const __m512i pairs = _mm512_maddubs_epi16(u, _mm512_set1_epi32(*(const int32_t *)(q + k)));
            dot = _mm512_add_epi32(dot, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
        }
        sum = k4_step16(dot, _mm512_loadu_ps(prep->scale + (sb * K4_GROUPS + g) * SUB + i), sum, g == 0);
    }
    return sum;
}

/* The stored S_hi, S_lo of super-block sb (16 rows x 32 each) joined into sb and taken into tot by
 * k4_finish16; fits: the 16 rows' `k4_fit_rows` flags (stride supers). */
AI void amx_k4_step(const Prepared *prep, const QRows *x, const int32_t *sums, int64_t sb, float *tot,
                    const uint8_t *fits) {
    const int64_t j0 = sb * K4_GROUPS, supers = x->cols / 256;
    const float *super = prep->offset + j0 * SUB;
    for (int b = 0; b < AMX_ROWS; b++) {
        __m512i qp[K4_GROUPS / 2];
        k4_q_pairs16(x->total + b * x->groups + j0, qp);
        const __m512 dx = _mm512_set1_ps(x->scale[b * x->groups + j0]);
        const int fit = fits[b * supers + sb];
        float *at = tot + 32 * b;
        for (int i = 0; i < 32; i += 16) {
            __m512i h = _mm512_loadu_si512(sums + 32 * b + i), l = _mm512_loadu_si512(sums + 512 + 32 * b + i);
            __m512 s = fit ? _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l))
                           : amx_k4_chain(prep, x->q8 + b * x->cols + 256 * sb, sb, i);
            _mm512_storeu_ps(at + i, k4_finish16(super + i, SUB, s, qp, dx, _mm512_loadu_ps(at + i)));
        }
    }
}
