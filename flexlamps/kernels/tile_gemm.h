/* tile_gemv.c's product for prompts (calls of many rows) on AVX2 + FMA + F16C: x rounded to int8
 * codes per group of the weight's inputs (as llama.cpp rounds x for its block types), times the
 * codes where they lie, 32 multiply-adds an instruction (vpmaddubsw), summed exactly in integers
 * and scaled into fp32 once a group.
 *
 * A tile of torch's layout is taken 32 output rows at a time (a "sub-tile": rows 16s..16s+15 in
 * the low nibbles of a column's 16-byte slice s, rows h+16s.. in its high ones; h = tile / 2).
 * Each sub-tile's codes are first laid out once for all the call's rows (`prepare`): for every 4
 * inputs, 4 vectors of 8 rows' 4 codes (lanes 0-3: low rows 4v..4v+3, lanes 4-7: the high ones'),
 * and each group's (scale, offset) in the same lane order. Rows of x then pass GEMM_ROWS at a time:
 *   4-bit:  vpmaddubsw(codes 0..15, x's codes) sums pairs in int16 (at most 8 steps: 8 * 2 * 15 *
 *           127 < 2^15), vpmaddwd widens them to int32;
 *   int8:   the split's halves joined to q = u - 128 in [-128, 127]; vpmaddubsw(|q|, x signed by
 *           q) (pairs of at most 2 * 128 * 127 < 2^15), widened each step.
 * Then per group: tot += scale * (dot * dx) + offset * sum_x, offset = zero - 8 * scale (for the
 * int8 split, the low half's pair: w = d q + zero - 8 d). Integer sums are exact and the fp32 steps
 * of a row run in the same order whatever rows share the call, the blocking or the threads: a
 * row's result depends on that row alone. Included by tile_gemv.c. */
#ifndef GEMM_ROWS
#define GEMM_ROWS 2
#endif  /* rows of x a pass multiplies by a sub-tile's codes, their sums in registers */
#define SUB 32        /* output rows of a sub-tile */

/* One sub-tile's codes laid out for the passes, and its groups' scales and offsets (lane order). */
typedef struct { uint8_t *codes, *magnitude; float *scale, *offset; } Prepared;

/* Column slice p's 16 bytes as codes: low nibbles (rows j) in the low 128-bit lane, high ones
 * (rows h + j) in the high lane. */
AI __m256i nibble_lanes(const uint8_t *p) {
    __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* Columns c0..c3 (each: 16 rows a lane) into 4 vectors of 4 rows' 4 codes a lane. */
AI void transpose4(__m256i c0, __m256i c1, __m256i c2, __m256i c3, __m256i *out) {
    __m256i ab_lo = _mm256_unpacklo_epi8(c0, c1), ab_hi = _mm256_unpackhi_epi8(c0, c1);
    __m256i cd_lo = _mm256_unpacklo_epi8(c2, c3), cd_hi = _mm256_unpackhi_epi8(c2, c3);
    _mm256_storeu_si256(out, _mm256_unpacklo_epi16(ab_lo, cd_lo));
    _mm256_storeu_si256(out + 1, _mm256_unpackhi_epi16(ab_lo, cd_lo));
    _mm256_storeu_si256(out + 2, _mm256_unpacklo_epi16(ab_hi, cd_hi));
    _mm256_storeu_si256(out + 3, _mm256_unpackhi_epi16(ab_hi, cd_hi));
}

/* Column k of the sub-tile at p (column stride h): a 4-bit code, or the int8 split's q (its high
 * nibbles at p, its low ones `low_half` bytes on). */
AI __m256i column_codes(const uint8_t *p, int64_t low_half, int split) {
    if (!split) return nibble_lanes(p);
    __m256i u = _mm256_or_si256(_mm256_slli_epi16(nibble_lanes(p), 4), nibble_lanes(p + low_half));
    return _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
}

/* Sub-tile s of the tile at `codes` (scale_zero `sz` at its first row; n rows in all) laid out in `prep`. */
static void prepare(const uint8_t *codes, const uint16_t *sz, int64_t s, int64_t h, int64_t n, int64_t cols,
                    int64_t groups, int fp16, int split, const Prepared *prep) {
    const int64_t low_half = cols * h;
    for (int64_t k = 0; k < cols; k += 4) {
        const uint8_t *p = codes + k * h + 16 * s;
        __m256i *out = (__m256i *)(prep->codes + k * 32);
        transpose4(column_codes(p, low_half, split), column_codes(p + h, low_half, split),
                   column_codes(p + 2 * h, low_half, split), column_codes(p + 3 * h, low_half, split), out);
        if (split)
            for (int v = 0; v < 4; v++)
                _mm256_storeu_si256((__m256i *)(prep->magnitude + k * 32) + v, _mm256_abs_epi8(_mm256_loadu_si256(out + v)));
    }
    for (int64_t g = 0; g < groups; g++) {
        const uint16_t *pairs = sz + (split ? g + groups : g) * n * 2;
        for (int lane = 0; lane < SUB; lane++) {  /* vector lane / 8, row 4 (lane / 8) + lane % 4, high half from 4 */
            int64_t row = 16 * s + 4 * (lane / 8) + lane % 4 + (lane % 8 >= 4 ? h : 0);
            float scale = half_to_float(pairs[2 * row], fp16), zero = half_to_float(pairs[2 * row + 1], fp16);
            prep->scale[g * SUB + lane] = scale;
            prep->offset[g * SUB + lane] = zero - 8.0f * scale;
        }
    }
}

/* tot[b] += scale * (dot[b] * dx) + offset * sum_x for group g of nb rows. */
AI void add_dots(const Prepared *prep, int64_t g, const QRows *x, __m256i dot[][4], __m256 tot[][4], int nb) {
    for (int b = 0; b < nb; b++) {
        __m256 dx = _mm256_set1_ps(x->scale[b * x->groups + g]), sx = _mm256_set1_ps(x->sum[b * x->groups + g]);
        for (int v = 0; v < 4; v++) {
            __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[b][v]), dx);
            t = _mm256_fmadd_ps(_mm256_loadu_ps(prep->scale + g * SUB + 8 * v), t, tot[b][v]);
            tot[b][v] = _mm256_fmadd_ps(_mm256_loadu_ps(prep->offset + g * SUB + 8 * v), sx, t);
        }
    }
}

/* Exact sums of inputs k0..k1 (at most 32) of nb rows by the 4-bit codes, added to dot. */
AI void dots4(const Prepared *prep, const QRows *x, int64_t k0, int64_t k1, __m256i dot[][4], int nb) {
    __m256i pairs[GEMM_ROWS][4];
    for (int b = 0; b < nb; b++)
        for (int v = 0; v < 4; v++) pairs[b][v] = _mm256_setzero_si256();
    for (int64_t k = k0; k < k1; k += 4) {
        const __m256i *w = (const __m256i *)(prep->codes + k * 32);
        __m256i w0 = _mm256_loadu_si256(w), w1 = _mm256_loadu_si256(w + 1);
        __m256i w2 = _mm256_loadu_si256(w + 2), w3 = _mm256_loadu_si256(w + 3);
        for (int b = 0; b < nb; b++) {
            int32_t four;
            memcpy(&four, x->q8 + b * x->cols + k, sizeof four);
            __m256i xb = _mm256_set1_epi32(four);
            pairs[b][0] = _mm256_add_epi16(pairs[b][0], _mm256_maddubs_epi16(w0, xb));
            pairs[b][1] = _mm256_add_epi16(pairs[b][1], _mm256_maddubs_epi16(w1, xb));
            pairs[b][2] = _mm256_add_epi16(pairs[b][2], _mm256_maddubs_epi16(w2, xb));
            pairs[b][3] = _mm256_add_epi16(pairs[b][3], _mm256_maddubs_epi16(w3, xb));
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = 0; b < nb; b++)
        for (int v = 0; v < 4; v++) dot[b][v] = _mm256_add_epi32(dot[b][v], _mm256_madd_epi16(pairs[b][v], ones));
}

/* Exact sums of inputs k0..k1 of nb rows by the int8 codes q, added to dot. */
AI void dots8(const Prepared *prep, const QRows *x, int64_t k0, int64_t k1, __m256i dot[][4], int nb) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t k = k0; k < k1; k += 4) {
        const __m256i *q = (const __m256i *)(prep->codes + k * 32), *m = (const __m256i *)(prep->magnitude + k * 32);
        for (int b = 0; b < nb; b++) {
            int32_t four;
            memcpy(&four, x->q8 + b * x->cols + k, sizeof four);
            __m256i xb = _mm256_set1_epi32(four);
            for (int v = 0; v < 4; v++) {
                __m256i pairs = _mm256_maddubs_epi16(_mm256_loadu_si256(m + v), _mm256_sign_epi8(xb, _mm256_loadu_si256(q + v)));
                dot[b][v] = _mm256_add_epi32(dot[b][v], _mm256_madd_epi16(pairs, ones));
            }
        }
    }
}

/* The 32 outputs (lane order) of nb rows of x by a prepared sub-tile, every group. */
AI void gemm_pass(const Prepared *prep, const QRows *x, int64_t group, int split, __m256 tot[][4], int nb) {
    for (int b = 0; b < nb; b++)
        for (int v = 0; v < 4; v++) tot[b][v] = _mm256_setzero_ps();
    for (int64_t g = 0; g < x->groups; g++) {
        __m256i dot[GEMM_ROWS][4];
        for (int b = 0; b < nb; b++)
            for (int v = 0; v < 4; v++) dot[b][v] = _mm256_setzero_si256();
        for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
            int64_t end = k + 32 < (g + 1) * group ? k + 32 : (g + 1) * group;
            if (split) dots8(prep, x, k, end, dot, nb);
            else dots4(prep, x, k, end, dot, nb);
        }
        add_dots(prep, g, x, dot, tot, nb);
    }
}

/* A pass's outputs in lane order to rows j (low, out_lo) and h + j (high, out_hi), j < 16. */
AI void store_pass(__m256 tot[4], uint16_t *out_lo, uint16_t *out_hi, int fp16) {
    for (int half = 0; half < 2; half++) {  /* rows 0-7, then 8-15 */
        __m256 lo = _mm256_permute2f128_ps(tot[2 * half], tot[2 * half + 1], 0x20);
        __m256 hi = _mm256_permute2f128_ps(tot[2 * half], tot[2 * half + 1], 0x31);
        _mm_storeu_si128((__m128i *)(out_lo + 8 * half), floats_to_halves8(lo, fp16));
        _mm_storeu_si128((__m128i *)(out_hi + 8 * half), floats_to_halves8(hi, fp16));
    }
}

/* Every row of x by one prepared sub-tile (its rows 16s.. and h + 16s.. of the tile whose first
 * output column is out). */
static void gemm_rows(const Prepared *prep, const QRows *x, int64_t rows, int64_t group, int split, uint16_t *out,
                      int64_t n, int64_t s, int64_t h, int fp16) {
    for (int64_t b0 = 0; b0 < rows; b0 += GEMM_ROWS) {
        int nb = rows - b0 < GEMM_ROWS ? (int)(rows - b0) : GEMM_ROWS;
        QRows xb = {x->q8 + b0 * x->cols, NULL, x->scale + b0 * x->groups, x->sum + b0 * x->groups, x->cols, x->groups,
                    x->total + b0 * x->groups};
        __m256 tot[GEMM_ROWS][4];
        if (nb == GEMM_ROWS) gemm_pass(prep, &xb, group, split, tot, GEMM_ROWS);  /* constant counts: sums in registers */
        else gemm_pass(prep, &xb, group, split, tot, 1);
        for (int b = 0; b < nb; b++)
            store_pass(tot[b], out + (b0 + b) * n + 16 * s, out + (b0 + b) * n + h + 16 * s, fp16);
    }
}
