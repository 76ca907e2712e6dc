/* int8_gemm.c's AVX2 loops: packing, quantizing and micro-tiles of up to MAX_ROWS rows by one
 * 16-column block (two vectors of 8 outputs). A step's 4 inputs of 8 outputs lie in one vector;
 * with AVX-VNNI, vpdpbusd adds (w + 128) * x from the group's start -128 * sum(x), as the AVX-512
 * variant; without it, vpmaddubsw multiplies |x| by the weight carrying x's sign (pairs of at most
 * 2 * 127 * 127: no saturation) and vpmaddwd adds the pairs: the same int32 sums, from 0.
 * Included by int8_gemm.c only, for its AVX2 variants. */
#define MAX_ROWS 4               /* rows per micro-tile */
#define MAX_BLOCKS 1             /* 16-column blocks per micro-tile */

/* 8 inputs of a weight row: fp32 (kind 2) or halves (bf16 0, fp16 1). */
AI __m256 load_weights8(const void *row, int64_t c, int kind) {
    if (kind == 2) return _mm256_loadu_ps((const float *)row + c);
    return halves_to_floats8(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + c)), kind);
}

/* max |v| over 8 lanes of `count` (a multiple of 8) values, and whether any is NaN. */
AI float amax_of(const void *row, int64_t count, int kind, int *nan) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    int bad = 0;
    for (int64_t c = 0; c < count; c += 8) {
        __m256 v = load_weights8(row, c, kind);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    *nan = bad != 0;
    return vf_hmax(amax);
}

/* max |w| over a row of a weight, and whether it holds a NaN. */
static float row_amax(const void *src, int64_t cols, int kind, int *nan) { return amax_of(src, cols, kind, nan); }

/* A row's codes round(w / s), clamped to +-127, plus 128, 4 at a time every 64 bytes from `dst`. */
static void pack_codes(const void *src, int64_t cols, int kind, uint8_t *dst, float s) {
    __m256 div = _mm256_set1_ps(s);
    for (int64_t c = 0; c < cols; c += 8) {
        __m256i q = _mm256_cvtps_epi32(_mm256_div_ps(load_weights8(src, c, kind), div));
        q = _mm256_add_epi32(_mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127)),
                             _mm256_set1_epi32(128));
        int32_t codes[8];
        _mm256_storeu_si256((__m256i *)codes, q);
        for (int j = 0; j < 8; j++) dst[(c / 4 + j / 4) * 64 + j % 4] = (uint8_t)codes[j];
    }
}

/* One row: codes, a scale and a start per group of 64 (cols a multiple of 64). */
static void quantize_row(const uint16_t *x, int64_t cols, int fp16, int8_t *q, float *scale, int32_t *init) {
    for (int64_t g = 0; g < cols / GROUP; g++) {
        int nan;
        float m = amax_of(x + g * GROUP, GROUP, fp16, &nan);
        if (nan || m == INFINITY) {  /* NaN or inf in x: the row's outputs NaN, as a float GEMM's */
            memset(q + g * GROUP, 0, GROUP);
            scale[g] = NAN;
            init[g] = 0;
            continue;
        }
        __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
        __m256i sum = _mm256_setzero_si256();
        for (int j = 0; j < GROUP; j += 8) {
            __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(load_weights8(x + g * GROUP, j, fp16), inv));  /* |c| <= 127 */
            sum = _mm256_add_epi32(sum, c);
            int32_t codes[8];
            _mm256_storeu_si256((__m256i *)codes, c);
            for (int i = 0; i < 8; i++) q[g * GROUP + j + i] = (int8_t)codes[i];
        }
        scale[g] = m / 127.0f;
        init[g] = -128 * vi_sum(sum);
    }
}

/* sum += the 4-input dot products of 8 outputs' weights (w + 128, bytes) and x's 4 codes. */
AI __m256i dot4(__m256i sum, __m256i w, __m256i x) {
#ifdef __AVXVNNI__
    return _mm256_dpbusd_avx_epi32(sum, w, x);
#else
    __m256i signed_w = _mm256_sign_epi8(_mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)), x);
    __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(x), signed_w);
    return _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

/* out[rows, 16] of one micro-tile; `left` (1..16) columns stored. Constant rows where inlined (`run_tile`),
 * so the sums live in registers. */
AI void micro_tile(const int8_t *q, const float *scale, const int32_t *init, const uint8_t *w, const float *sw,
                   uint16_t *out, int64_t cols, int64_t out_stride, int rows, int64_t left, int fp16) {
    int64_t groups = cols / GROUP;
    (void)init;  /* the AVX-VNNI path's group starts; the other sums from 0 */
    __m256 acc[MAX_ROWS][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m256i sum[MAX_ROWS][2];
        for (int r = 0; r < rows; r++)
#ifdef __AVXVNNI__
            sum[r][0] = sum[r][1] = _mm256_set1_epi32(init[r * groups + g]);
#else
            sum[r][0] = sum[r][1] = _mm256_setzero_si256();
#endif
        for (int64_t s = g * STEPS; s < (g + 1) * STEPS; s++) {
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + s * 64));
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + s * 64 + 32));
            for (int r = 0; r < rows; r++) {
                int32_t four;  /* x's 4 codes of this step, broadcast */
                memcpy(&four, q + r * cols + s * 4, 4);
                __m256i xv = _mm256_set1_epi32(four);
                sum[r][0] = dot4(sum[r][0], w0, xv);
                sum[r][1] = dot4(sum[r][1], w1, xv);
            }
        }
        for (int r = 0; r < rows; r++) {
            __m256 sc = _mm256_set1_ps(scale[r * groups + g]);
            for (int h = 0; h < 2; h++) acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r][h]), sc, acc[r][h]);
        }
    }
    for (int r = 0; r < rows; r++) {
        uint16_t halves[16];
        for (int h = 0; h < 2; h++)
            _mm_storeu_si128((__m128i *)(halves + 8 * h),
                             floats_to_halves8(_mm256_mul_ps(acc[r][h], _mm256_loadu_ps(sw + 8 * h)), fp16));
        memcpy(out + r * out_stride, halves, sizeof(uint16_t) * (size_t)left);
    }
}

/* A micro-tile of 1..MAX_ROWS rows by one block (`blocks` is 1), each row count its own copy. */
static void run_tile(const int8_t *q, const float *scale, const int32_t *init, const uint8_t *w, const float *sw,
                     uint16_t *out, int64_t cols, int64_t out_stride, int rows, int blocks, int64_t left, int fp16) {
    (void)blocks;
    left = left < 16 ? left : 16;  /* the panel's valid columns: all 16 but in the last */
    switch (rows) {
    case 4: micro_tile(q, scale, init, w, sw, out, cols, out_stride, 4, left, fp16); break;
    case 3: micro_tile(q, scale, init, w, sw, out, cols, out_stride, 3, left, fp16); break;
    case 2: micro_tile(q, scale, init, w, sw, out, cols, out_stride, 2, left, fp16); break;
    default: micro_tile(q, scale, init, w, sw, out, cols, out_stride, 1, left, fp16); break;
    }
}
