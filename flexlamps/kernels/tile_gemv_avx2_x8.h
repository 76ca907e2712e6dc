/* tile_gemv.c's decode loops on AVX2 for x in 8-bit codes (llama.cpp's rounding of x for its block
 * types): a tile's codes stay bytes and vpmaddubsw multiplies 32 of them an instruction.
 *
 * A tile's rows are taken 16 at a time (the 16-byte slice s of each column: rows 16s + j in the low
 * nibbles, h + 16s + j in the high ones; h = tile / 2). Columns k..k+3 are read as two registers
 * (columns k, k+1 and k+2, k+3, a column a 128-bit lane) and interleaved bytewise, which pairs in
 * every 16-bit lane one row's codes of columns (k, k+2) in the low 128-bit lane and (k+1, k+3) in
 * the high one; x's codes are paired the same way, so vpmaddubsw(codes 0..15, x) adds two of a
 * row's products a 16-bit lane. Those sums stay in int16 for at most 8 such steps (32 inputs: 8 *
 * 2 * 15 * 127 < 2^15), then the two lanes of a row are widened and added into its exact int32
 * group sum. An int8 split's halves run as two 4-bit weights (high nibbles times 16, plus low
 * ones) and its group sum is taken for q = u - 128, as the prompt kernel's (tile_gemm.h).
 *
 * The fp32 steps after each group are the prompt kernel's: the same bits for a row whichever of
 * the two multiplies it (tile_gemv.c lets decode calls of many rows take the prompt kernel).
 * Included by tile_gemv_avx2.h only. */
#define PASS8_ROWS 2   /* rows of x a pass multiplies by a slice's codes, their sums in registers */
#define SEGMENT8 32    /* inputs whose products a 16-bit lane can hold */
#ifndef PREFETCH8_BYTES  /* how far ahead the codes are prefetched (a decode step streams them): 1024 was */
#define PREFETCH8_BYTES 2048  /* 5% faster than 512 on Zen 2; 2048 on Zen 4 (1 thread, 32768 x 4096 from
                               * memory): Q4_0 6-9%, Q6_K's 6-bit form 3%, Q4_K 1% faster than 1024 */
#endif
#ifndef PREFETCH8_FAR  /* and the 4-bit streams again this far ahead into L2: more lines in flight than */
#define PREFETCH8_FAR 8192  /* a core's hardware prefetchers keep (tile_gemv_avx512.h's DECODE_PREFETCH_FAR) */
#endif

/* Columns k..k+3 of a 16-row slice as codes 0..15, paired for vpmaddubsw: c[0] rows 0-7, c[1] rows
 * 8-15 of the low nibbles, c[2], c[3] of the high ones; from the slice's bytes of columns k, k+1 (a)
 * and k+2, k+3 (b), a column a 128-bit lane. */
AI void pair_columns4(__m256i a, __m256i b, __m256i c[4]) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    __m256i rows_lo = _mm256_unpacklo_epi8(a, b), rows_hi = _mm256_unpackhi_epi8(a, b);
    c[0] = _mm256_and_si256(rows_lo, nib);
    c[1] = _mm256_and_si256(rows_hi, nib);
    c[2] = _mm256_and_si256(_mm256_srli_epi16(rows_lo, 4), nib);
    c[3] = _mm256_and_si256(_mm256_srli_epi16(rows_hi, 4), nib);
}

/* pair_columns4 of the slice at p (column stride h). */
AI void slice_codes4(const uint8_t *p, int64_t h, __m256i c[4]) {
    if (h == 16)  /* torch's AVX2 layout: the four columns' slices are 64 contiguous bytes */
        pair_columns4(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 32)), c);
    else
        pair_columns4(_mm256_loadu2_m128i((const __m128i *)(p + h), (const __m128i *)p),
                      _mm256_loadu2_m128i((const __m128i *)(p + 3 * h), (const __m128i *)(p + 2 * h)), c);
}

/* The 6-bit form's high two bits of the slice at the tile's byte off as slice_codes4 pairs codes
 * (c[i] in [0, 3]; the split's high nibbles less 6), from its plane (tile_gemv.c: 64 tile bytes a
 * 32-byte block). Tiles of 32 rows: one block holds columns k..k+3, k and k+1 in its bits 0-1 and
 * 4-5, k+2 and k+3 in bits 2-3 and 6-7, so the block interleaved with itself shifted by 2 pairs
 * them as slice_codes4 does (10 instructions a step, as a nibble half's). */
AI void plane_codes4(const uint8_t *plane, int64_t off, int64_t h, __m256i c[4]) {
    const __m256i three = _mm256_set1_epi8(3), mask = _mm256_set1_epi8(0x33);
    if (h == 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(plane + off / 2)), w = _mm256_srli_epi16(v, 2);
        __m256i rows_lo = _mm256_unpacklo_epi8(v, w), rows_hi = _mm256_unpackhi_epi8(v, w);
        c[0] = _mm256_and_si256(rows_lo, three);
        c[1] = _mm256_and_si256(rows_hi, three);
        c[2] = _mm256_and_si256(_mm256_srli_epi16(rows_lo, 4), three);
        c[3] = _mm256_and_si256(_mm256_srli_epi16(rows_hi, 4), three);
        return;
    }
    const uint8_t *at = plane + (off >> 6) * 32 + (off & 31);  /* columns k, k+1 | k+2, k+3: two blocks */
    __m256i v = _mm256_loadu2_m128i((const __m128i *)(at + 32), (const __m128i *)at);
    __m256i even = _mm256_and_si256(v, mask), odd = _mm256_and_si256(_mm256_srli_epi16(v, 2), mask);
    pair_columns4(_mm256_permute2x128_si256(even, odd, 0x20), _mm256_permute2x128_si256(even, odd, 0x31), c);
}

/* `bytes` (4 or 8) bytes of x's codes at q in every lane, each 128-bit lane's bytes picked by `order`. */
AI __m256i x_picked(const void *q, const int bytes, __m256i order) {
    int64_t v = 0;
    memcpy(&v, q, (size_t)bytes);
    return _mm256_shuffle_epi8(bytes == 4 ? _mm256_set1_epi32((int32_t)v) : _mm256_set1_epi64x(v), order);
}

/* x's codes k..k+3 paired as slice_codes4 pairs the weight's: (k, k+2) in the low lane, (k+1, k+3)
 * in the high one. */
AI __m256i x_pairs(const int8_t *q) {
    return x_picked(q, 4, _mm256_setr_epi8(0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2,
                                           1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3, 1, 3));
}

/* dot[b][i] += 2^shift * each row's int16 sums in acc[b][i]: its two 16-bit lanes (low and high 128
 * bits) widened into its int32. */
AI void widen_into(__m256i acc[][4], int shift, __m256i dot[][4], int nb) {
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < 4; i++) {
            __m256i low = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(acc[b][i]));
            __m256i high = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(acc[b][i], 1));
            dot[b][i] = _mm256_add_epi32(dot[b][i], _mm256_slli_epi32(_mm256_add_epi32(low, high), shift));
        }
}

/* Tiles of 32 rows of the 6-bit form, groups of whole 16s: a step's codes are joined, u = q + 32 in
 * [0, 63] (the nibble tile's low nibbles, the plane's high two bits), and one vpmaddubsw a register
 * adds two of a row's products u x (at most 2 * 63 * 127: no saturation) to int16 sums that start
 * at -32 times the x codes they multiply, mod 2^16 (`six_starts`), so after 4 steps (16 inputs,
 * 8 a lane) they hold the exact sums of q x, |q x| summed <= 8 * 32 * 127 < 2^15 (vpaddw wraps on
 * the way): the split's dot products with one multiply a register where its two halves take two,
 * and one widening per 16 inputs. Same exact sums: the same bits. */
#define SIX_INPUTS 16

/* For each row of x and each 16 of its inputs, the int16 starts of the 6-bit form's sums: -32 times
 * the sum of the x codes a low 128-bit lane multiplies (inputs 0, 2 mod 4: the even ones) in the
 * low 16 bits, of the high lane's (the odd ones) in the high 16; a malloc'd array, or NULL where
 * the joined path does not run (then the two-half path does). */
static int32_t *six_starts(const QRows *x, int64_t rows, int64_t tile, int64_t group) {
    const int64_t per_row = x->cols / SIX_INPUTS;
    if (tile != 32 || group % SIX_INPUTS || !x->q8) return NULL;
    int32_t *starts = malloc(sizeof(int32_t) * (size_t)(rows * per_row) + 1);
    for (int64_t i = 0; starts && i < rows * per_row; i++) {
        const int8_t *q = x->q8 + i * SIX_INPUTS;  /* rows are whole 16s: chunk i of all rows in order */
        int32_t even = 0, odd = 0;
        for (int j = 0; j < SIX_INPUTS; j += 2) {
            even += q[j];
            odd += q[j + 1];
        }
        starts[i] = (int32_t)((uint32_t)(uint16_t)(-32 * even) | (uint32_t)(uint16_t)(-32 * odd) << 16);
    }
    return starts;
}

/* The 6-bit form's codes u = q + 32 of 4 columns of a tile of 32 rows (low nibbles at p, high parts
 * at plane), paired as slice_codes4 pairs them. */
AI void six_codes4(const uint8_t *p, const uint8_t *plane, __m256i u[4]) {
    const __m256i top = _mm256_set1_epi8(0x30);
    slice_codes4(p, 16, u);  /* the low nibbles */
    __m256i v = _mm256_loadu_si256((const __m256i *)plane), w = _mm256_srli_epi16(v, 2);
    __m256i rows_lo = _mm256_unpacklo_epi8(v, w), rows_hi = _mm256_unpackhi_epi8(v, w);  /* as plane_codes4 */
    u[0] = _mm256_or_si256(u[0], _mm256_and_si256(_mm256_slli_epi16(rows_lo, 4), top));
    u[1] = _mm256_or_si256(u[1], _mm256_and_si256(_mm256_slli_epi16(rows_hi, 4), top));
    u[2] = _mm256_or_si256(u[2], _mm256_and_si256(rows_lo, top));
    u[3] = _mm256_or_si256(u[3], _mm256_and_si256(rows_hi, top));
}

/* dot[b][i] += the exact sums of q x for the 16 inputs from k of nb rows of x (codes at xq, row
 * stride cols) by the 6-bit form's slice (tiles of 32: low nibbles at p, high parts at plane),
 * starts at `start` (row stride cols / 16). */
AI void segment8_six(const uint8_t *p, const uint8_t *plane, const int8_t *xq, int64_t cols, const int32_t *start,
                     __m256i dot[][4], int nb) {
    const __m256i halves = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                            2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    __m256i acc[PASS8_ROWS][4];
    for (int b = 0; b < nb; b++) {
        __m256i s = _mm256_shuffle_epi8(_mm256_set1_epi32(start[b * (cols / SIX_INPUTS)]), halves);
        for (int i = 0; i < 4; i++) acc[b][i] = s;
    }
    for (int step = 0; step < SIX_INPUTS / 4; step++) {
        _mm_prefetch((const char *)(p + 64 * step + PREFETCH8_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(plane + 32 * step + PREFETCH8_BYTES / 2), _MM_HINT_T0);
        __m256i u[4];
        six_codes4(p + 64 * step, plane + 32 * step, u);
        for (int b = 0; b < nb; b++) {
            __m256i xb = x_pairs(xq + b * cols + 4 * step);
            for (int i = 0; i < 4; i++) acc[b][i] = _mm256_add_epi16(acc[b][i], _mm256_maddubs_epi16(u[i], xb));
        }
    }
    widen_into(acc, 0, dot, nb);
}

/* dot[b][i] += 2^shift * the exact sums of `steps` (at most 8) steps of 4 inputs of nb rows of x
 * (codes at xq, row stride cols) by the slice's codes at p, or where `plane` is given by the 6-bit
 * form's high nibbles at the tile's byte off (`plane_codes4`). */
AI void segment8(const uint8_t *p, const uint8_t *plane, int64_t off, int64_t h, const int8_t *xq, int64_t cols,
                 int64_t steps, int shift, __m256i dot[][4], int nb) {
    __m256i acc[PASS8_ROWS][4];
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < 4; i++) acc[b][i] = _mm256_setzero_si256();
    for (int64_t step = 0; step < steps; step++) {
        __m256i c[4];
        if (plane) {
            _mm_prefetch((const char *)(plane + (off + 4 * step * h + PREFETCH8_BYTES) / 2), _MM_HINT_T0);
            plane_codes4(plane, off + 4 * step * h, h, c);
        } else {
            const uint8_t *at = p + 4 * step * h;
            _mm_prefetch((const char *)(at + PREFETCH8_BYTES), _MM_HINT_T0);
            _mm_prefetch((const char *)(at + PREFETCH8_FAR), _MM_HINT_T1);
            slice_codes4(at, h, c);
        }
        for (int b = 0; b < nb; b++) {
            __m256i xb = x_pairs(xq + b * cols + 4 * step);
            for (int i = 0; i < 4; i++) acc[b][i] = _mm256_add_epi16(acc[b][i], _mm256_maddubs_epi16(c[i], xb));
        }
    }
    widen_into(acc, shift, dot, nb);
}

/* Q4_K's form: the super-block's d and dmin (the file's fp16) of rows first[i]..first[i]+7 as fp32,
 * made once for its 8 groups (`k4_scales8`) where k4_rows8 made them again each group. */
AI void k4_super8(const uint16_t *d, int64_t n, const int64_t first[4], __m256 kd[4], __m256 kdmin[4]) {
    for (int i = 0; i < 4; i++) {
        kd[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + first[i])));
        kdmin[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + n + first[i])));
    }
}

/* Rows r..r+7's scale d sc and offset -dmin m in Q4_K's form, their d and dmin given (`k4_make8_ps`). */
AI void k4_scales8(const uint16_t *group_sz, int64_t r, __m256 kd, __m256 kdmin, __m256 *scale, __m256 *offset) {
    k4_make8_ps(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(group_sz + r))), kd, kdmin, scale, offset);
}

/* tot[b][i] (rows first[i]..first[i]+7) += scale * (dot * dx) + (zero - 8 scale) * sum_x for
 * group g: add_group8's fp32 steps in its order (the same bits), the sums kept in registers; in
 * Q4_K's form the super-block's d and dmin from kd, kdmin (`k4_super8`). */
AI void add_group_rows(const uint16_t *group_sz, int64_t n, const int64_t first[4], int fp16, __m256i dot[][4],
                       const QRows *x, int64_t g, const __m256 kd[4], const __m256 kdmin[4], __m256 tot[][4], int nb) {
    __m256 dx[PASS8_ROWS], sx[PASS8_ROWS];
    for (int b = 0; b < nb; b++) {
        dx[b] = _mm256_set1_ps(x->scale[b * x->groups + g]);
        sx[b] = _mm256_set1_ps(x->sum[b * x->groups + g]);
    }
    for (int i = 0; i < 4; i++) {
        __m256 scale, offset;
        if (x->k4) k4_scales8(group_sz, first[i], kd[i], kdmin[i], &scale, &offset);
        else scale_offset8(group_sz, n, first[i], 8.0f, fp16, x, g, &scale, &offset);
        for (int b = 0; b < nb; b++) {
            __m256 t = _mm256_fmadd_ps(scale, _mm256_mul_ps(_mm256_cvtepi32_ps(dot[b][i]), dx[b]), tot[b][i]);
            tot[b][i] = _mm256_fmadd_ps(offset, sx[b], t);
        }
    }
}

/* Q4_K's form with 8-bit x per super-block (tile_scales_k4.h's K4_SUPER steps) for group g of the
 * rows first[i]..first[i]+7 (group_sz = `group_scales`, n rows a plane): its sums into the super-block's
 * S (sb), after its last group the super-block into tot, M summed then (`k4_mins8`). */
AI void k4_group_rows(const uint16_t *group_sz, int64_t n, const int64_t first[4], __m256i dot[][4], const QRows *x,
                      int64_t g, __m256 sb[][4], __m256 tot[][4], int nb) {
    const int64_t q = g % K4_GROUPS, j0 = g - q;
    for (int i = 0; i < 4; i++) {
        const __m256i sm = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(group_sz + first[i])));
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_and_si256(sm, _mm256_set1_epi32(0xFF)));
        for (int b = 0; b < nb; b++) sb[b][i] = k4_step8(dot[b][i], sc, sb[b][i], q == 0);
        if (q < K4_GROUPS - 1) continue;
        const uint16_t *d = group_sz - (2 + q) * n + first[i];  /* (the super-block's d and dmin planes) */
        const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + n)));
        __m256 m[PASS8_ROWS];
        k4_mins8(group_sz - q * n, n, first[i], x->total + j0, x->groups, nb, m);
        for (int b = 0; b < nb; b++)
            tot[b][i] = k4_close8(dd, dmin, sb[b][i], m[b], _mm256_set1_ps(x->scale[b * x->groups + j0]), tot[b][i]);
    }
}

/* Q6_K's form (tile_scales_k6.h): group g's exact sums dot times each row's sc added to the super-block
 * sums isum (int32), and at its last group the super-block's one fp32 step into tot (tile_gemm.h's
 * k6_add_dots' operations on each row: the same bits). */
AI void k6_rows8(const uint16_t *sz, int64_t n, const int64_t first[4], int64_t g, const QRows *x, __m256i dot[][4],
                 __m256i isum[][4], __m256 tot[][4], int nb) {
    const int64_t j = g % K6_GROUPS;
    const uint16_t *sc = k6_group(sz, g, n), *d = k6_d(sz, g, n);
    for (int i = 0; i < 4; i++) {
        const __m256i s = k6_sc8(sc + first[i]);
        for (int b = 0; b < nb; b++) {
            const __m256i t = _mm256_mullo_epi32(dot[b][i], s);
            isum[b][i] = j ? _mm256_add_epi32(isum[b][i], t) : t;
        }
        if (j < K6_GROUPS - 1) continue;
        const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + first[i])));
        for (int b = 0; b < nb; b++) tot[b][i] = k6_step8(isum[b][i], dd, x->scale[b * x->groups + g], tot[b][i]);
    }
}

/* The next tile's scales of a group (its `group_scales` at sz; in Q4_K's form with its super-block's d
 * and dmin planes where `super`) into L2, a tile of codes ahead: each group's lie n rows apart, lines
 * the hardware prefetcher does not follow, and two groups ahead (slice_pass8) is too late to hide
 * the memory's latency; 1.1B Q4_K rows, streamed, 1 thread: 7.4 -> 8.6 GB/s. */
AI void next_tile_scales(const uint16_t *sz, int64_t n, int64_t tile, int64_t w, const int64_t first[4], int super) {
    const uint16_t *next = sz + w * tile;
    _mm_prefetch((const char *)(next + w * first[0]), _MM_HINT_T1);
    _mm_prefetch((const char *)(next + w * first[2]), _MM_HINT_T1);
    if (super) {
        _mm_prefetch((const char *)(next - 2 * n + first[0]), _MM_HINT_T1);
        _mm_prefetch((const char *)(next - n + first[0]), _MM_HINT_T1);
    }
}

/* The 16-row slice s of a tile for nb rows of x (8-bit codes), every group, into out (row stride n);
 * an int8 split's, or with `plane` the 6-bit form's (its low nibbles at codes). */
AI void slice_pass8(const uint8_t *codes, const uint8_t *plane, const uint16_t *sz, int64_t n, int64_t h, int64_t s,
                    int64_t group, const QRows *x, uint16_t *out, int fp16, int split, int nb) {
    const int64_t low_half = plane ? 0 : x->cols * h, first[4] = {16 * s, 16 * s + 8, h + 16 * s, h + 16 * s + 8};
    __m256 tot[PASS8_ROWS][4], kd[4], kdmin[4], sb[PASS8_ROWS][4];
    const int super = x->k4 == K4_SUPER;  /* Q4_K's form, x per super-block (`k4_group_rows`) */
    __m256i isum[PASS8_ROWS][4];  /* Q6_K's form's super-block sums */
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < 4; i++) tot[b][i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < x->groups; g++) {
        __m256i dot[PASS8_ROWS][4];
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < 4; i++) dot[b][i] = _mm256_setzero_si256();
        const int64_t w = x->sz_width;
        const int kind = split && !plane ? KIND_INT8_SPLIT : KIND_INT4;  /* (where its scales lie: the 6-bit form's as 4-bit) */
        const uint16_t *group_sz = group_scales(sz, g, n, x, kind);
        if (x->k4 == K4_GROUPWISE && g % K4_GROUPS == 0) k4_super8(group_sz - 2 * n, n, first, kd, kdmin);  /* (its d and dmin planes) */
        if (g + 2 < x->groups) {  /* the scales two groups on: a strided read the prefetcher misses */
            const uint16_t *ahead = group_scales(sz, g + 2, n, x, kind);
            _mm_prefetch((const char *)(ahead + w * first[0]), _MM_HINT_T0);
            _mm_prefetch((const char *)(ahead + w * first[2]), _MM_HINT_T0);
        }
        next_tile_scales(group_sz, n, 2 * h, w, first, x->k4 && g % K4_GROUPS == 0);
        const int joined = plane && h == 16 && x->starts6;  /* the 6-bit form's codes joined (segment8_six) */
        for (int64_t k = g * group; joined && k < (g + 1) * group; k += SIX_INPUTS)
            segment8_six(codes + k * h, plane + k * h / 2, x->q8 + k, x->cols, x->starts6 + k / SIX_INPUTS, dot, nb);
        for (int64_t k = g * group; !joined && k < (g + 1) * group; k += SEGMENT8) {
            int64_t steps = ((g + 1) * group - k < SEGMENT8 ? (g + 1) * group - k : SEGMENT8) / 4;
            const uint8_t *p = codes + k * h + 16 * s;
            segment8(p, plane, k * h + 16 * s, h, x->q8 + k, x->cols, steps, split ? 4 : 0, dot, nb);
            if (split) segment8(p + low_half, NULL, 0, h, x->q8 + k, x->cols, steps, 0, dot, nb);
        }
        if (split && !joined)  /* the sums of q = u - 128 (the 6-bit form's: of u - 32, its high parts 6 less) */
            for (int b = 0; b < nb; b++)
                for (int i = 0; i < 4; i++)
                    dot[b][i] = _mm256_sub_epi32(dot[b][i], _mm256_set1_epi32((plane ? 32 : 128) * x->total[b * x->groups + g]));
        if (super) k4_group_rows(group_sz, n, first, dot, x, g, sb, tot, nb);
        else if (x->k6) k6_rows8(sz, n, first, g, x, dot, isum, tot, nb);
        else add_group_rows(group_sz, n, first, fp16, dot, x, g, kd, kdmin, tot, nb);
    }
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < 4; i++)
            _mm_storeu_si128((__m128i *)(out + b * n + first[i]), floats_to_halves8(tot[b][i], fp16));
}

/* One tile (h = 16 or 32 codes a column: constant in each call, so the loads specialise) for
 * every row of x, PASS8_ROWS at a time. */
AI void tile8(const uint8_t *codes, const uint8_t *plane, const uint16_t *sz, int64_t n, int64_t h, int64_t group,
              const QRows *x, int64_t rows, uint16_t *out, int fp16, int split) {
    for (int64_t b0 = 0; b0 < rows; b0 += PASS8_ROWS) {
        int nb = rows - b0 < PASS8_ROWS ? (int)(rows - b0) : PASS8_ROWS;
        QRows xb = {x->q8 + b0 * x->cols, NULL, x->scale + b0 * x->groups, x->sum + b0 * x->groups, x->cols,
                    x->groups, x->total + b0 * x->groups, NULL,
                    x->starts6 ? x->starts6 + b0 * (x->cols / SIX_INPUTS) : NULL, NULL, x->sz_width, x->k4, x->k6};
        for (int64_t s = 0; s < h / 16; s++) {  /* constant row counts, so the sums stay in registers */
            if (nb == PASS8_ROWS)
                slice_pass8(codes, plane, sz, n, h, s, group, &xb, out + b0 * n, fp16, split, PASS8_ROWS);
            else slice_pass8(codes, plane, sz, n, h, s, group, &xb, out + b0 * n, fp16, split, 1);
        }
    }
}

/* `plane`: the 6-bit form's (kind KIND_INT6), else NULL. */
static void run_tile8(const uint8_t *codes, const uint8_t *plane, const uint16_t *sz, int64_t n, int64_t group,
                      const QRows *x, int64_t tile, int64_t rows, uint16_t *out, int fp16, int kind) {
    switch ((tile == 32) * 3 + (kind == KIND_INT8_SPLIT) + 2 * (kind == KIND_INT6)) {  /* constant layouts */
        case 0: tile8(codes, NULL, sz, n, 32, group, x, rows, out, fp16, 0); break;
        case 1: tile8(codes, NULL, sz, n, 32, group, x, rows, out, fp16, 1); break;
        case 2: tile8(codes, plane, sz, n, 32, group, x, rows, out, fp16, 1); break;
        case 3: tile8(codes, NULL, sz, n, 16, group, x, rows, out, fp16, 0); break;
        case 4: tile8(codes, NULL, sz, n, 16, group, x, rows, out, fp16, 1); break;
        default: tile8(codes, plane, sz, n, 16, group, x, rows, out, fp16, 1); break;
    }
}
