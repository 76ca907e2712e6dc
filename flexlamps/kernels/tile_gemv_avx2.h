/* tile_gemv.c's inner loops on AVX2 + FMA + F16C (AVX-VNNI's vpdpwssd where built with it): a
 * tile of 32 or 64 output rows (torch's layout has 32 on AVX2 builds, 64 on AVX-512 ones).
 *
 * 16-bit x: up to PASS_ROWS rows of x a pass. A tile's rows are taken 16 at a time (a 16-byte
 * slice of each column: rows j in the low nibbles, rows j + tile/2 in the high ones): the codes of
 * two columns are widened to 16 bits and paired in a row's 32-bit lane, and vpmaddwd adds the
 * row's two products to its int32 sum (exact, as the AVX-512 variant's). A call of PREPARED_FROM
 * rows or more (an output head at batch 32) widens and pairs a tile's codes once into a buffer
 * that every pass reads, rather than once a pass: the same sums and fp32 steps, so the same bits.
 * 8-bit x (tile_gemv_avx2_x8.h): the codes stay bytes, paired for vpmaddubsw, and sums are kept
 * in int16 for up to 32 inputs: about twice the rate, enough to stream a decode step's weights.
 *
 * The fp32 steps after each group are the AVX-512 variant's, in the same order, so both give the
 * same bits. Included by tile_gemv.c only, for its AVX2 variants. */
#define PASS_ROWS 2
#ifndef PREPARED_FROM
#define PREPARED_FROM 4  /* rows of 16-bit x from which a tile's paired codes are made once a call */
#endif

#ifdef __AVXVNNI__
#define DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#else
#define DPWSSD(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))  /* codes >= 0: no overflow */
#endif

typedef struct { int64_t tile; } Setup;  /* what run_tile needs prepared once a call */

/* 4-bit codes, int8 splits and the 6-bit form, no 5-bit plane (its words are laid out for the
 * AVX-512 registers). */
static int takes_tile(int64_t tile, int kind, int x_bits) {
    (void)x_bits;
    return (tile == 32 || tile == 64) && kind != KIND_INT5;
}

static Setup make_setup(int64_t tile) { Setup s = {tile}; return s; }

/* Columns k, k + 1 of a 16-row slice at p (column stride h) as 32-bit lanes of two 16-bit
 * codes: c[0] rows 0-3 | 8-11 and c[1] rows 4-7 | 12-15 of the low nibbles' rows, c[2], c[3] the
 * same of the high nibbles'. An int8 split joins its halves (high nibbles at p, low ones at p +
 * low_half) into u = q + 128; the 6-bit form its high nibbles from the plane (p at the tile's
 * byte off, low_half 0), the same u. */
AI void pair_codes(const uint8_t *p, const uint8_t *plane, int64_t off, int64_t h, int64_t low_half, int kind,
                   __m256i c[4]) {
    const __m256i nib = _mm256_set1_epi16(0x0F);
    const int from_plane = kind == KIND_INT6;
    __m256i a0 = _mm256_cvtepu8_epi16(from_plane ? plane_high16(plane, off) : _mm_loadu_si128((const __m128i *)p));
    __m256i a1 = _mm256_cvtepu8_epi16(from_plane ? plane_high16(plane, off + h)
                                                 : _mm_loadu_si128((const __m128i *)(p + h)));
    __m256i l0, l1, h0, h1;
    if (kind == KIND_INT8_SPLIT || from_plane) {
        const __m256i top = _mm256_set1_epi16(0xF0);
        __m256i b0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + low_half)));
        __m256i b1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + low_half + h)));
        l0 = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(a0, nib), 4), _mm256_and_si256(b0, nib));
        l1 = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(a1, nib), 4), _mm256_and_si256(b1, nib));
        h0 = _mm256_or_si256(_mm256_and_si256(a0, top), _mm256_srli_epi16(b0, 4));
        h1 = _mm256_or_si256(_mm256_and_si256(a1, top), _mm256_srli_epi16(b1, 4));
    } else {
        l0 = _mm256_and_si256(a0, nib);
        l1 = _mm256_and_si256(a1, nib);
        h0 = _mm256_srli_epi16(a0, 4);
        h1 = _mm256_srli_epi16(a1, 4);
    }
    c[0] = _mm256_unpacklo_epi16(l0, l1);
    c[1] = _mm256_unpackhi_epi16(l0, l1);
    c[2] = _mm256_unpacklo_epi16(h0, h1);
    c[3] = _mm256_unpackhi_epi16(h0, h1);
}

/* 8 rows' (scale, zero) pairs of 16-bit floats as fp32 (width 2), or their scales alone (width 1:
 * zero = 8 scale, exact). */
AI void scale_zero8(const uint16_t *sz, int64_t width, int fp16, __m256 *scale, __m256 *zero) {
    if (width == 1) {
        *scale = halves_to_floats8(_mm_loadu_si128((const __m128i *)sz), fp16);
        *zero = _mm256_mul_ps(*scale, _mm256_set1_ps(8.0f));
        return;
    }
    __m256i pairs = _mm256_loadu_si256((const __m256i *)sz);
    if (!fp16) {  /* bf16: the upper 16 bits of an fp32 */
        *scale = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
        *zero = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32((int)0xFFFF0000u)));
        return;
    }
    __m256i low = _mm256_and_si256(pairs, _mm256_set1_epi32(0xFFFF)), high = _mm256_srli_epi32(pairs, 16);
    *scale = halves_to_floats8(_mm_packus_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1)), fp16);
    *zero = halves_to_floats8(_mm_packus_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1)), fp16);
}

/* Rows r..r+7's scale and offset (zero - bias * scale; Q4_K's form: -dmin m, tile_scales_k4.h) for
 * group g, its scales at sz (`group_scales`, a tile of n rows). */
AI void scale_offset8(const uint16_t *sz, int64_t n, int64_t r, float bias, int fp16, const QRows *x, int64_t g,
                      __m256 *scale, __m256 *offset) {
    if (x->k4) {
        k4_rows8(sz, g, n, r, scale, offset);
        return;
    }
    __m256 zero;
    scale_zero8(sz + x->sz_width * r, x->sz_width, fp16, scale, &zero);
    *offset = _mm256_fnmadd_ps(_mm256_set1_ps(bias), *scale, zero);
}

/* tot[b][r..r+7] += scale * (dot * dx) + (zero - bias * scale) * sum_x: the AVX-512 variant's steps. */
AI void add_group8(const uint16_t *sz, int64_t n, int64_t r, float bias, int fp16, const __m256i dot[],
                   const QRows *x, int64_t g, float tot[][64], int nb) {
    __m256 scale, offset;
    scale_offset8(sz, n, r, bias, fp16, x, g, &scale, &offset);
    for (int b = 0; b < nb; b++) {
        __m256 d = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[b]), _mm256_set1_ps(x->scale[b * x->groups + g]));
        __m256 t = _mm256_fmadd_ps(scale, d, _mm256_loadu_ps(tot[b] + r));
        _mm256_storeu_ps(tot[b] + r, _mm256_fmadd_ps(offset, _mm256_set1_ps(x->sum[b * x->groups + g]), t));
    }
}

/* The 16-row slice `s` of a tile (rows 16s.. in the low nibbles, h + 16s.. in the high ones) for
 * nb rows of x, every group; its paired codes read from `paired` (4 vectors per 2 columns, as
 * pair_codes makes them) where given, else made from the codes. */
AI void slice_pass(const uint8_t *codes, const uint8_t *plane, const __m256i *paired, const uint16_t *sz, int64_t n,
                   int64_t h, int64_t s, int64_t group, const QRows *x, float tot[][64], int fp16, int kind, int nb) {
    const int split = kind == KIND_INT8_SPLIT || kind == KIND_INT6;
    const int64_t low_half = kind == KIND_INT8_SPLIT ? x->cols * h : 0;
    const int64_t first[4] = {16 * s, 16 * s + 8, h + 16 * s, h + 16 * s + 8};
    const float bias = split ? 136.0f : 8.0f;
    for (int64_t g = 0; g < x->groups; g++) {
        __m256i acc[PASS_ROWS][4];
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < 4; i++) acc[b][i] = _mm256_setzero_si256();
        for (int64_t k = g * group; k < (g + 1) * group; k += 2) {
            __m256i c[4];
            if (paired) {
                for (int i = 0; i < 4; i++) c[i] = _mm256_loadu_si256(paired + 2 * k + i);
            } else {
                const uint8_t *p = codes + k * h + 16 * s;
                if ((k & 3) == 0) _mm_prefetch((const char *)(p + 16 * h), _MM_HINT_T0);
                pair_codes(p, plane, k * h + 16 * s, h, low_half, kind, c);
            }
            for (int b = 0; b < nb; b++) {
                int32_t two;  /* x's 16-bit codes k, k + 1, broadcast */
                memcpy(&two, x->q16 + b * x->cols + k, sizeof two);
                __m256i xb = _mm256_set1_epi32(two);
                for (int i = 0; i < 4; i++) acc[b][i] = DPWSSD(acc[b][i], c[i], xb);
            }
        }
        const uint16_t *group_sz = group_scales(sz, g, n, x, kind);
        for (int half = 0; half < 2; half++)  /* the low nibbles' rows, then the high ones' */
            for (int upper = 0; upper < 2; upper++) {  /* rows 0-7 of the slice's 16, then 8-15 */
                __m256i dot[PASS_ROWS];
                for (int b = 0; b < nb; b++)
                    dot[b] = _mm256_permute2x128_si256(acc[b][2 * half], acc[b][2 * half + 1], upper ? 0x31 : 0x20);
                add_group8(group_sz, n, first[2 * half + upper], bias, fp16, dot, x, g, tot, nb);
            }
    }
}

/* Every slice of a tile's codes widened and paired once (pair_codes' 4 vectors per 2 columns, 2
 * cols vectors a slice), or NULL where memory is short (the passes then pair them themselves). */
static __m256i *paired_slices(const uint8_t *codes, const uint8_t *plane, int64_t cols, int64_t h, int kind) {
    __m256i *paired = aligned_alloc(sizeof(__m256i), sizeof(__m256i) * (size_t)(2 * cols * (h / 16)));  /* stored whole */
    if (!paired) return NULL;
    for (int64_t s = 0; s < h / 16; s++)
        for (int64_t k = 0; k < cols; k += 2) {
            const uint8_t *p = codes + k * h + 16 * s;
            if ((k & 3) == 0) _mm_prefetch((const char *)(p + 16 * h), _MM_HINT_T0);
            pair_codes(p, plane, k * h + 16 * s, h, kind == KIND_INT8_SPLIT ? cols * h : 0, kind,
                       paired + s * 2 * cols + 2 * k);
        }
    return paired;
}

#include "tile_gemv_avx2_x8.h"

/* The 6-bit form in tiles of 32 rows, groups of whole 16s, by one row of 16-bit x (an output head
 * at batch 1): a step's codes joined as bytes (u = q + 32 in [0, 63], `six_codes4`), widened to 16
 * bits and multiplied by vpmaddwd into exact int32 sums of u x; the split's sums of (q + 128) x are
 * those plus 96 times the group's x codes' sum, exactly, and the fp32 steps are add_group8's: the
 * same bits as `slice_pass` with about half its instructions (pair_codes rebuilds the split's bytes
 * two columns at a time). acc[2i], acc[2i + 1]: rows 0-3, 4-7 of six_codes4's u[i], columns (k, k + 2)
 * in the low 128 bits and (k + 1, k + 3) in the high ones, as x16_pairs pairs x's codes. */
AI __m256i x16_pairs(const int16_t *q) {
    return x_picked(q, 8, _mm256_setr_epi8(0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5, 0, 1, 4, 5,
                                           2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7, 2, 3, 6, 7));
}

/* Groups ahead whose scale-zero pairs are prefetched: unfetched, their loads were half the time of
 * a 128256 x 2048 head (1 thread, Zen 1-class EPYC). */
#define SIX16_SZ_AHEAD 4

/* Half the 6-bit form's codes u = q + 32 of 4 columns of a tile of 32 rows (low nibbles at p, high parts
 * at plane), paired as six_codes4 pairs them: its u[0], u[2] (the slices' unpacked low bytes), or where
 * `upper` u[1], u[3]. */
AI void six_codes2(const uint8_t *p, const uint8_t *plane, int upper, __m256i u[2]) {
    const __m256i nib = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    const __m256i a = _mm256_loadu_si256((const __m256i *)p), b = _mm256_loadu_si256((const __m256i *)(p + 32));
    const __m256i v = _mm256_loadu_si256((const __m256i *)plane), w = _mm256_srli_epi16(v, 2);
    const __m256i rows = upper ? _mm256_unpackhi_epi8(a, b) : _mm256_unpacklo_epi8(a, b);
    const __m256i high = upper ? _mm256_unpackhi_epi8(v, w) : _mm256_unpacklo_epi8(v, w);
    u[0] = _mm256_or_si256(_mm256_and_si256(rows, nib), _mm256_and_si256(_mm256_slli_epi16(high, 4), top));
    u[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(rows, 4), nib), _mm256_and_si256(high, top));
}

/* Half the tile's rows (six_codes2's) for the columns k0..k1 of a group into acc[0..3] (acc[2j],
 * acc[2j + 1] of its u[j]): a half at a time, its sums, x's pairs and the masks stay in AVX2's 16
 * registers, where the whole tile's (8 sums) spilled three sums and the codes' temporaries to the
 * stack every step (Zen 4, 1 thread, a 128256 x 2048 head in turns: 15.1 -> 14.2 ms). */
AI void six_half16(const uint8_t *codes, const uint8_t *plane, const int16_t *xq, int64_t k0, int64_t k1, int upper,
                   __m256i acc[4]) {
    const __m256i zero = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) acc[i] = zero;
    for (int64_t k = k0; k < k1; k += 4) {  /* 4 columns: 64 code bytes, 32 of the plane */
        if (!upper) {
            _mm_prefetch((const char *)(codes + 16 * k + PREFETCH8_BYTES), _MM_HINT_T0);
            _mm_prefetch((const char *)(plane + 8 * k + PREFETCH8_BYTES / 2), _MM_HINT_T0);
        }
        __m256i u[2];
        six_codes2(codes + 16 * k, plane + 8 * k, upper, u);
        const __m256i xb = x16_pairs(xq + k);
        for (int j = 0; j < 2; j++) {
            acc[2 * j] = DPWSSD(acc[2 * j], _mm256_unpacklo_epi8(u[j], zero), xb);
            acc[2 * j + 1] = DPWSSD(acc[2 * j + 1], _mm256_unpackhi_epi8(u[j], zero), xb);
        }
    }
}

/* tot[0][r] for the tile's 32 rows += every group's products with the row of x (see x16_pairs). */
static void six_tile16(const uint8_t *codes, const uint8_t *plane, const uint16_t *sz, int64_t n, int64_t group,
                       const QRows *x, float tot[][64], int fp16) {
    for (int64_t g = 0; g < x->groups; g++) {
        __m256i lower[4], upper[4];
        if (g + SIX16_SZ_AHEAD < x->groups) {  /* a group's pairs lie n rows apart: the prefetcher misses them */
            _mm_prefetch((const char *)(sz + (g + SIX16_SZ_AHEAD) * n * x->sz_width), _MM_HINT_T0);
            if (x->sz_width == 2) _mm_prefetch((const char *)(sz + (g + SIX16_SZ_AHEAD) * n * 2 + 32), _MM_HINT_T0);
        }
        for (int64_t line = 0; line < x->sz_width; line++)  /* the next tile's, into L2 (`next_tile_scales`) */
            _mm_prefetch((const char *)(sz + (g * n + 32) * x->sz_width + 32 * line), _MM_HINT_T1);
        six_half16(codes, plane, x->q16, g * group, (g + 1) * group, 0, lower);
        six_half16(codes, plane, x->q16, g * group, (g + 1) * group, 1, upper);
        const __m256i acc[8] = {lower[0], lower[1], upper[0], upper[1], lower[2], lower[3], upper[2], upper[3]};
        const __m256i extra = _mm256_set1_epi32(96 * x->total[g]);
        for (int i = 0; i < 4; i++) {  /* rows 8i .. 8i + 7 (u[i]: rows 0-7, 8-15 of each nibble half) */
            __m256i dot = _mm256_add_epi32(_mm256_permute2x128_si256(acc[2 * i], acc[2 * i + 1], 0x20),
                                           _mm256_permute2x128_si256(acc[2 * i], acc[2 * i + 1], 0x31));
            dot = _mm256_add_epi32(dot, extra);
            add_group8(sz + g * n * x->sz_width, n, 8 * i, 136.0f, fp16, &dot, x, g, tot, 1);
        }
    }
}

/* Whether six_tile16 takes the call: the 6-bit form in tiles of 32, groups of whole 16s, 16-bit x,
 * too few rows for the paired codes (`PREPARED_FROM`). */
static int takes_six16(const QRows *x, int64_t tile, int64_t group, int64_t rows, int kind) {
    return kind == KIND_INT6 && !x->q8 && tile == 32 && group % 16 == 0 && rows < PREPARED_FROM;
}

static void run_six16(const uint8_t *codes, const uint8_t *plane, const uint16_t *sz, int64_t n, int64_t group,
                      const QRows *x, int64_t rows, uint16_t *out, int fp16) {
    float tot[PASS_ROWS][64] __attribute__((aligned(32)));
    for (int64_t b = 0; b < rows; b++) {
        QRows xb = {NULL, x->q16 + b * x->cols, x->scale + b * x->groups, x->sum + b * x->groups, x->cols, x->groups,
                    x->total + b * x->groups, NULL, NULL, NULL, x->sz_width, x->k4, x->k6};
        for (int r = 0; r < 32; r++) tot[0][r] = 0.0f;
        six_tile16(codes, plane, sz, n, group, &xb, tot, fp16);
        for (int64_t r = 0; r < 32; r += 8)
            _mm_storeu_si128((__m128i *)(out + b * n + r), floats_to_halves8(_mm256_loadu_ps(tot[0] + r), fp16));
    }
}

static void run_tile(const uint8_t *codes, const uint8_t *plane, const uint16_t *sz, int64_t n, int64_t group,
                     const QRows *x, const Setup *setup, int64_t rows, uint16_t *out, int fp16, int kind) {
    if (x->q8) {
        run_tile8(codes, kind == KIND_INT6 ? plane : NULL, sz, n, group, x, setup->tile, rows, out, fp16, kind);
        return;
    }
    if (takes_six16(x, setup->tile, group, rows, kind)) {
        run_six16(codes, plane, sz, n, group, x, rows, out, fp16);
        return;
    }
    float tot[PASS_ROWS][64] __attribute__((aligned(32)));
    const int64_t tile = setup->tile, h = tile / 2, slices = h / 16;
    __m256i *paired = rows >= PREPARED_FROM ? paired_slices(codes, plane, x->cols, h, kind) : NULL;
    for (int64_t b0 = 0; b0 < rows; b0 += PASS_ROWS) {
        int nb = rows - b0 < PASS_ROWS ? (int)(rows - b0) : PASS_ROWS;
        QRows xb = {NULL, x->q16 + b0 * x->cols, x->scale + b0 * x->groups, x->sum + b0 * x->groups, x->cols, x->groups,
                    NULL, NULL, NULL, NULL, x->sz_width, x->k4, x->k6};
        for (int b = 0; b < nb; b++)
            for (int64_t r = 0; r < tile; r++) tot[b][r] = 0.0f;
        for (int64_t s = 0; s < slices; s++) {  /* constant row counts, so the sums stay in registers */
            const __m256i *ps = paired ? paired + s * 2 * x->cols : NULL;
            if (nb == PASS_ROWS) slice_pass(codes, plane, ps, sz, n, h, s, group, &xb, tot, fp16, kind, PASS_ROWS);
            else slice_pass(codes, plane, ps, sz, n, h, s, group, &xb, tot, fp16, kind, 1);
        }
        for (int b = 0; b < nb; b++)
            for (int64_t r = 0; r < tile; r += 8)
                _mm_storeu_si128((__m128i *)(out + (b0 + b) * n + r), floats_to_halves8(_mm256_loadu_ps(tot[b] + r), fp16));
    }
    free(paired);
}

/* One block of x's values (xgroup of them) as codes of `bits` bits (8 or 16): amax, the codes at q
 * and their sum per group of `group` inputs (xgroup / group sums at totals); 8 values at a time
 * (the same results as tile_gemv.c's scalar loop). Returns 0 where the groups are not whole vectors. */
static int quantize_group_simd(const uint16_t *xg, int64_t xgroup, int64_t group, int fp16, int bits, void *q,
                               float *amax_out, int32_t *totals) {
    if (group % 8 || xgroup % group) return 0;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int64_t i = 0; i < xgroup; i += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, halves_to_floats8(_mm_loadu_si128((const __m128i *)(xg + i)), fp16)));
    float amax = vf_hmax(m);
    __m256 inv = _mm256_set1_ps(amax > 0.0f ? (bits == 16 ? 32767.0f : 127.0f) / amax : 0.0f);
    for (int64_t g = 0; g < xgroup; g += group) {
        __m256i t = _mm256_setzero_si256();
        for (int64_t i = g; i < g + group; i += 8) {
            __m256 f = halves_to_floats8(_mm_loadu_si128((const __m128i *)(xg + i)), fp16);
            __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(f, inv));  /* nearest even, as lrintf */
            t = _mm256_add_epi32(t, c);
            __m128i c16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
            if (bits == 16) _mm_storeu_si128((__m128i *)((int16_t *)q + i), c16);
            else _mm_storel_epi64((__m128i *)((int8_t *)q + i), _mm_packs_epi16(c16, c16));
        }
        totals[g / group] = vi_sum(t);
    }
    *amax_out = amax;
    return 1;
}
