/* int8_gemm.c's AVX-512 VNNI loops: packing, quantizing and micro-tiles of up to MAX_ROWS rows by
 * MAX_BLOCKS 16-column blocks (vpdpbusd). Included by int8_gemm.c only, for its AVX-512 variant. */
#define MAX_ROWS 4               /* rows per micro-tile */
#define MAX_BLOCKS 3             /* 16-column blocks per micro-tile */

/* 16 inputs of a weight row: fp32 (kind 2) or halves (bf16 0, fp16 1). */
AI __m512 load_weights(const void *row, int64_t c, int kind) {
    if (kind == 2) return _mm512_loadu_ps((const float *)row + c);
    return load_halves((const uint16_t *)row + c, kind, ALL_LANES);  /* native_simd.h */
}

/* max |w| over a row of a weight, and whether it holds a NaN. */
static float row_amax(const void *src, int64_t cols, int kind, int *nan) {
    __m512 amax = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int64_t c = 0; c < cols; c += 16) {
        __m512 v = load_weights(src, c, kind);
        amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    *nan = bad != 0;
    return _mm512_reduce_max_ps(amax);
}

/* A row's codes round(w / s), clamped to +-127, plus 128, 4 at a time every 64 bytes from `dst`. */
static void pack_codes(const void *src, int64_t cols, int kind, uint8_t *dst, float s) {
    __m512 div = _mm512_set1_ps(s);
    for (int64_t c = 0; c < cols; c += 16) {
        __m512i q = _mm512_cvtps_epi32(_mm512_div_ps(load_weights(src, c, kind), div));
        q = _mm512_add_epi32(_mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127)),
                             _mm512_set1_epi32(128));
        uint8_t bytes[16];
        _mm_storeu_si128((__m128i *)bytes, _mm512_cvtepi32_epi8(q));
        for (int j = 0; j < 4; j++) memcpy(dst + (c / 4 + j) * 64, bytes + 4 * j, 4);
    }
}

/* One row: codes, a scale and a start per group of 64 (cols a multiple of 64). */
static void quantize_row(const uint16_t *x, int64_t cols, int fp16, int8_t *q, float *scale, int32_t *init) {
    for (int64_t g = 0; g < cols / GROUP; g++) {
        __m512 v[4], amax = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (int j = 0; j < 4; j++) {
            v[j] = load_halves(x + g * GROUP + 16 * j, fp16, ALL_LANES);
            amax = _mm512_max_ps(amax, _mm512_abs_ps(v[j]));
            nan |= _mm512_cmp_ps_mask(v[j], v[j], _CMP_UNORD_Q);
        }
        float m = _mm512_reduce_max_ps(amax);
        if (nan || m == INFINITY) {  /* NaN or inf in x: the row's outputs NaN, as a float GEMM's */
            memset(q + g * GROUP, 0, GROUP);
            scale[g] = NAN;
            init[g] = 0;
            continue;
        }
        __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
        __m512i sum = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(v[j], inv));  /* nearest even; |c| <= 127 */
            sum = _mm512_add_epi32(sum, c);
            _mm_storeu_si128((__m128i *)(q + g * GROUP + 16 * j), _mm512_cvtepi32_epi8(c));
        }
        scale[g] = m / 127.0f;
        init[g] = -128 * _mm512_reduce_add_epi32(sum);
    }
}

/* out[rows, 16 * blocks] of one micro-tile; `valid` columns of the last block are stored. The
 * loops have constant bounds where this is inlined (see `tile`), so the sums live in registers. */
AI void micro_tile(const int8_t *q, const float *scale, const int32_t *init, const uint8_t *w, const float *sw,
                   uint16_t *out, int64_t cols, int64_t out_stride, int rows, int blocks, __mmask16 last, int fp16) {
    int64_t groups = cols / GROUP, block_bytes = cols * 16;
    __m512 acc[MAX_ROWS][MAX_BLOCKS];
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < blocks; b++) acc[r][b] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512i sum[MAX_ROWS][MAX_BLOCKS];
        for (int r = 0; r < rows; r++)
            for (int b = 0; b < blocks; b++) sum[r][b] = _mm512_set1_epi32(init[r * groups + g]);
        for (int64_t s = g * STEPS; s < (g + 1) * STEPS; s++) {
            __m512i wv[MAX_BLOCKS];
            for (int b = 0; b < blocks; b++) wv[b] = _mm512_loadu_si512(w + b * block_bytes + s * 64);
            for (int r = 0; r < rows; r++) {
                int32_t four;  /* x's 4 codes of this step, broadcast */
                memcpy(&four, q + r * cols + s * 4, 4);
                __m512i xv = _mm512_set1_epi32(four);
                for (int b = 0; b < blocks; b++) sum[r][b] = _mm512_dpbusd_epi32(sum[r][b], wv[b], xv);
            }
        }
        for (int r = 0; r < rows; r++) {
            __m512 sc = _mm512_set1_ps(scale[r * groups + g]);
            for (int b = 0; b < blocks; b++) acc[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][b]), sc, acc[r][b]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < blocks; b++) {
            __m256i h = floats_to_halves(_mm512_mul_ps(acc[r][b], _mm512_loadu_ps(sw + 16 * b)), fp16);
            _mm256_mask_storeu_epi16(out + r * out_stride + 16 * b, b == blocks - 1 ? last : 0xFFFF, h);
        }
}

/* A micro-tile of any size up to MAX_ROWS x MAX_BLOCKS, each size its own unrolled copy. */
static void tile(const int8_t *q, const float *scale, const int32_t *init, const uint8_t *w, const float *sw,
                 uint16_t *out, int64_t cols, int64_t out_stride, int rows, int blocks, __mmask16 last, int fp16) {
#define TILE(R, B) micro_tile(q, scale, init, w, sw, out, cols, out_stride, R, B, last, fp16)
    switch (rows * 4 + blocks) {
    case 4 * 4 + 3: TILE(4, 3); break;
    case 4 * 4 + 2: TILE(4, 2); break;
    case 4 * 4 + 1: TILE(4, 1); break;
    case 3 * 4 + 3: TILE(3, 3); break;
    case 3 * 4 + 2: TILE(3, 2); break;
    case 3 * 4 + 1: TILE(3, 1); break;
    case 2 * 4 + 3: TILE(2, 3); break;
    case 2 * 4 + 2: TILE(2, 2); break;
    case 2 * 4 + 1: TILE(2, 1); break;
    case 1 * 4 + 3: TILE(1, 3); break;
    case 1 * 4 + 2: TILE(1, 2); break;
    default: TILE(1, 1); break;
    }
#undef TILE
}

/* `tile` with the last block's valid columns (`left`, 1..16) as a store mask. */
static void run_tile(const int8_t *q, const float *scale, const int32_t *init, const uint8_t *w, const float *sw,
                     uint16_t *out, int64_t cols, int64_t out_stride, int rows, int blocks, int64_t left, int fp16) {
    __mmask16 last = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    tile(q, scale, init, w, sw, out, cols, out_stride, rows, blocks, last, fp16);
}
