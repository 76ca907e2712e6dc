/* tile_gemv.c's inner loops on AVX-512 (F, BW, VL, DQ, VBMI, VNNI): one tile of 64 output rows
 * for up to ROWS_PER_PASS rows of x, a byte permute (VBMI) gathering four columns of a row into
 * one 32-bit lane for an 8-bit VNNI dot product (16-bit x: the bytes widened, vpdpwssd).
 * Included by tile_gemv.c only, for its AVX-512 variant. */
#define ROWS_PER_PASS 4
/* How far ahead the codes are prefetched, in bytes of a tile's stream: further than tile_gemv.c's
 * PREFETCH_BYTES for 4-bit codes (Zen 4, one thread, a 32768 x 4096 weight from memory: 512 -> 1536 bytes took Q4_K's
 * decode product 4.51 -> 4.20 ms, Q4_0's 4.08 -> 3.71), not for the 6-bit form's two streams. */
#ifndef DECODE_PREFETCH_4BIT
#define DECODE_PREFETCH_4BIT 1536
#endif
#ifndef DECODE_PREFETCH_6BIT
#define DECODE_PREFETCH_6BIT 512
#endif
/* And the 4-bit code streams again this far ahead into L2 (the fifth bits' plane in proportion): more
 * lines in flight than the hardware's prefetchers keep for one core (Zen 4, 1 thread, a 32768 x 4096 Q4_K
 * weight from memory: 4.23 -> 2.90 ms, 18 -> 27 GB/s; 4096 bytes 4.05, 16384 2.95; Q4_0 3.53 -> 3.36).
 * Not the 6-bit form's: no faster with it (Q6_K 4.41 against 4.47 ms), its head's 16-bit x slower. */
#ifndef DECODE_PREFETCH_FAR
#define DECODE_PREFETCH_FAR 8192
#endif

/* tot[b] += scale * dx * acc[b] + (zero - bias * scale) * sum_x for one group of a tile's 64 rows
 * (x->sz_width 1: the scales alone, zero = 8 scale, exact; x->k4: Q4_K's, tile_scales_k4.h). */
AI void add_group(const uint16_t *sz, int64_t n, float bias, int fp16, __m512i acc[][4], const QRows *x, int64_t g,
                  float tot[][TILE], int nb) {
    for (int i = 0; i < 4; i++) {
        __m512 scale, zero;
        if (x->k4) {  /* Q4_K's form (tile_scales_k4.h: k4_make8's steps, 16 lanes); `zero` the offset itself */
            const uint16_t *d = sz - (2 + g % K4_GROUPS) * n + 16 * i;
            const __m512i sm = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(sz + 16 * i)));
            scale = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d)),
                                  _mm512_cvtepi32_ps(_mm512_and_si512(sm, _mm512_set1_epi32(0xFF))));
            zero = _mm512_fnmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + n))),
                                    _mm512_cvtepi32_ps(_mm512_srli_epi32(sm, 8)), _mm512_setzero_ps());
        } else if (x->sz_width == 1) {
            scale = halves_to_floats(_mm256_loadu_si256((const __m256i *)(sz + 16 * i)), fp16);
            zero = _mm512_mul_ps(scale, _mm512_set1_ps(8.0f));
        } else {
            __m512i pairs = _mm512_loadu_si512(sz + 32 * i);  /* 16 rows' (scale, zero) */
            scale = halves_to_floats(_mm512_cvtepi32_epi16(pairs), fp16);
            zero = halves_to_floats(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)), fp16);
        }
        __m512 offset = x->k4 ? zero : _mm512_fnmadd_ps(_mm512_set1_ps(bias), scale, zero);
        for (int b = 0; b < nb; b++) {
            __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[b][i]), _mm512_set1_ps(x->scale[b * x->groups + g]));
            __m512 t = _mm512_fmadd_ps(scale, dot, _mm512_loadu_ps(tot[b] + 16 * i));
            t = _mm512_fmadd_ps(offset, _mm512_set1_ps(x->sum[b * x->groups + g]), t);
            _mm512_storeu_ps(tot[b] + 16 * i, t);
        }
    }
}

/* Q4_K's form with 8-bit x per super-block (tile_scales_k4.h's K4_SUPER steps) for group g of a tile's
 * 64 rows (at = `group_scales`, n rows a plane): its sums into the super-block's S (sums), after its
 * last group the super-block into tot, M summed then (`k4_mins16`). */
AI void k4_group16(const uint16_t *at, int64_t n, __m512i acc[][4], const QRows *x, int64_t g, float sums[][TILE],
                   float tot[][TILE], int nb) {
    const int64_t q = g % K4_GROUPS, j0 = g - q;
    for (int i = 0; i < 4; i++) {
        const __m512i sm = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(at + 16 * i)));
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_and_si512(sm, _mm512_set1_epi32(0xFF)));
        for (int b = 0; b < nb; b++)
            _mm512_storeu_ps(sums[b] + 16 * i, k4_step16(acc[b][i], sc, _mm512_loadu_ps(sums[b] + 16 * i), q == 0));
        if (q < K4_GROUPS - 1) continue;
        const uint16_t *d = at - (2 + q) * n + 16 * i;  /* (the super-block's d and dmin planes) */
        const __m512 dd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + n)));
        __m512 m[ROWS_PER_PASS];
        k4_mins16(at - q * n, n, 16 * i, x->total + j0, x->groups, nb, m);
        for (int b = 0; b < nb; b++)
            _mm512_storeu_ps(tot[b] + 16 * i, k4_close16(dd, dmin, _mm512_loadu_ps(sums[b] + 16 * i), m[b],
                                                         _mm512_set1_ps(x->scale[b * x->groups + j0]),
                                                         _mm512_loadu_ps(tot[b] + 16 * i)));
    }
}

/* Q6_K's form (tile_scales_k6.h): group g's exact sums acc times each row's sc added to the super-block
 * sums isum (int32), and at its last group the super-block's one fp32 step into tot (tile_gemm.h's
 * k6_add_dots' operations on each row: the same bits). */
AI void k6_rows16(const uint16_t *sz, int64_t n, int64_t g, const QRows *x, __m512i acc[][4], __m512i isum[][4],
                  float tot[][TILE], int nb) {
    const int64_t j = g % K6_GROUPS;
    const uint16_t *sc = k6_group(sz, g, n), *d = k6_d(sz, g, n);
    for (int i = 0; i < 4; i++) {
        const __m512i s = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(sc + 16 * i)));
        for (int b = 0; b < nb; b++) {
            const __m512i t = _mm512_mullo_epi32(acc[b][i], s);
            isum[b][i] = j ? _mm512_add_epi32(isum[b][i], t) : t;
        }
        if (j < K6_GROUPS - 1) continue;
        const __m512 dd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + 16 * i)));
        for (int b = 0; b < nb; b++)
            _mm512_storeu_ps(tot[b] + 16 * i, k6_step16(isum[b][i], dd, x->scale[b * x->groups + g],
                                                        _mm512_loadu_ps(tot[b] + 16 * i)));
    }
}

/* Row sums of a 16-bit product: lo/hi hold, per 128-bit lane L, two 32-bit pair sums for each
 * of rows 4L, 4L+1 (lo) and 4L+2, 4L+3 (hi); back to one lane per row, rows in order. */
AI __m512i pair_sums_to_rows(__m512i lo, __m512i hi, __m512i order) {
    lo = _mm512_add_epi32(lo, _mm512_srli_epi64(lo, 32));
    hi = _mm512_add_epi32(hi, _mm512_srli_epi64(hi, 32));
    return _mm512_permutex2var_epi32(lo, order, hi);
}

/* Four columns k..k+3 of a tile's rows j and j + 16 (j < 16), as 32-bit lanes of 4 bytes. */
AI void gather4(const uint8_t *p, __m512i idx_lo, __m512i idx_hi, __m512i *rows_lo, __m512i *rows_hi) {
    __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 64);
    *rows_lo = _mm512_permutex2var_epi8(a, idx_lo, b);
    *rows_hi = _mm512_permutex2var_epi8(a, idx_hi, b);
}

/* gather4 of the 6-bit form's high nibbles (the split's: plane_high16's bytes) of columns k..k+3,
 * from the 64 bytes of the plane at q (two blocks: columns k, k+1, then k+2, k+3). */
AI void plane_gather4(const uint8_t *q, __m512i idx_lo, __m512i idx_hi, __m512i *rows_lo, __m512i *rows_hi) {
    const __m512i mask = _mm512_set1_epi8(0x33), six = _mm512_set1_epi8(0x66);
    __m512i v = _mm512_loadu_si512(q);
    __m512i even = _mm512_and_si512(v, mask), odd = _mm512_and_si512(_mm512_srli_epi16(v, 2), mask);
    __m512i a = _mm512_add_epi8(_mm512_shuffle_i64x2(even, odd, 0x44), six);  /* columns k | k + 1 */
    __m512i b = _mm512_add_epi8(_mm512_shuffle_i64x2(even, odd, 0xEE), six);  /* columns k + 2 | k + 3 */
    *rows_lo = _mm512_permutex2var_epi8(a, idx_lo, b);
    *rows_hi = _mm512_permutex2var_epi8(a, idx_hi, b);
}

/* The permutes' indices: four columns of a row into a lane (rows j and j + 16, j < 16), and the
 * order pair_sums_to_rows puts rows back in. */
typedef struct { __m512i lo, hi, order; } Indices;

static Indices make_indices(void) {
    uint8_t lo[64], hi[64];
    int32_t rows[16];
    for (int i = 0; i < 16; i++) {
        for (int c = 0; c < 4; c++) {
            lo[4 * i + c] = (uint8_t)((c & 2 ? 64 : 0) + (c & 1 ? 32 : 0) + i);
            hi[4 * i + c] = (uint8_t)(lo[4 * i + c] + 16);
        }
        rows[i] = (i % 4 >= 2 ? 16 : 0) + 4 * (i / 4) + 2 * (i % 2);
    }
    Indices idx = {_mm512_loadu_si512(lo), _mm512_loadu_si512(hi), _mm512_loadu_si512(rows)};
    return idx;
}


/* Prefetch a code stream's two lines `ahead` bytes on (into L1) and, `far`, DECODE_PREFETCH_FAR on (into L2). */
AI void prefetch_codes(const uint8_t *p, int64_t ahead, int far) {
    _mm_prefetch((const char *)(p + ahead), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + ahead + 64), _MM_HINT_T0);
    if (!far) return;
    _mm_prefetch((const char *)(p + DECODE_PREFETCH_FAR), _MM_HINT_T1);
    _mm_prefetch((const char *)(p + DECODE_PREFETCH_FAR + 64), _MM_HINT_T1);
}

/* The codes of columns k..k+3 of a tile's 64 rows, 16 rows a register, 4 bytes a row: 4-bit
 * codes, an int8 split's halves joined back (high nibbles from the first half, low ones from
 * the second: q + 128), the 6-bit form's (high nibbles from its plane at k, low ones at p: the
 * same q + 128), or 4-bit codes plus 16 where `fifth`'s words (the plane at k) say. */
AI void tile_codes(const uint8_t *p, int64_t low_half, const void *plane, const Indices *idx, int kind,
                   __m512i c[4]) {
    const __m512i nib = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8((char)0xF0);
    const uint64_t *fifth = plane;
    __m512i p0, p1;
    const int64_t ahead = kind == KIND_INT6 ? DECODE_PREFETCH_6BIT : DECODE_PREFETCH_4BIT;
    if (kind == KIND_INT6) {
        _mm_prefetch((const char *)plane + ahead / 2, _MM_HINT_T0);
        plane_gather4(plane, idx->lo, idx->hi, &p0, &p1);
    } else {
        prefetch_codes(p, ahead, 1);
        gather4(p, idx->lo, idx->hi, &p0, &p1);
    }
    if (kind == KIND_INT8_SPLIT || kind == KIND_INT6) {
        __m512i l0, l1;
        prefetch_codes(p + low_half, ahead, kind != KIND_INT6);
        gather4(p + low_half, idx->lo, idx->hi, &l0, &l1);
        c[0] = _mm512_ternarylogic_epi32(high, _mm512_slli_epi16(p0, 4), l0, 0xCA);
        c[1] = _mm512_ternarylogic_epi32(high, _mm512_slli_epi16(p1, 4), l1, 0xCA);
        c[2] = _mm512_ternarylogic_epi32(high, p0, _mm512_srli_epi16(l0, 4), 0xCA);
        c[3] = _mm512_ternarylogic_epi32(high, p1, _mm512_srli_epi16(l1, 4), 0xCA);
    } else {
        c[0] = _mm512_and_si512(p0, nib);
        c[1] = _mm512_and_si512(p1, nib);
        c[2] = _mm512_and_si512(_mm512_srli_epi16(p0, 4), nib);
        c[3] = _mm512_and_si512(_mm512_srli_epi16(p1, 4), nib);
        if (kind == KIND_INT5) {
            const __m512i sixteen = _mm512_set1_epi8(16);
            _mm_prefetch((const char *)fifth + ahead / 4, _MM_HINT_T0);
            _mm_prefetch((const char *)fifth + DECODE_PREFETCH_FAR / 4, _MM_HINT_T1);
            for (int i = 0; i < 4; i++) c[i] = _mm512_mask_add_epi8(c[i], _cvtu64_mask64(fifth[i]), c[i], sixteen);
        }
    }
}

/* acc (8-bit x) or pairs (16-bit x: codes widened, two pair sums a row) += codes * x's k..k+3. */
AI void dot4(const __m512i c[4], const QRows *x, int64_t k, int wide, int nb, __m512i acc[][4],
             __m512i pairs[][4][2]) {
    const __m512i zero = _mm512_setzero_si512();
    if (wide) {
        for (int i = 0; i < 4; i++) {
            __m512i lo = _mm512_unpacklo_epi8(c[i], zero), hi = _mm512_unpackhi_epi8(c[i], zero);
            for (int b = 0; b < nb; b++) {
                int64_t four;  /* x's 16-bit codes k..k+3, broadcast to every 64-bit lane */
                memcpy(&four, x->q16 + b * x->cols + k, sizeof four);
                __m512i xb = _mm512_set1_epi64(four);
                pairs[b][i][0] = _mm512_dpwssd_epi32(pairs[b][i][0], lo, xb);
                pairs[b][i][1] = _mm512_dpwssd_epi32(pairs[b][i][1], hi, xb);
            }
        }
    } else {
        for (int b = 0; b < nb; b++) {
            int32_t four;  /* x's codes k..k+3, broadcast to every lane */
            memcpy(&four, x->q8 + b * x->cols + k, sizeof four);
            __m512i xb = _mm512_set1_epi32(four);
            for (int i = 0; i < 4; i++) acc[b][i] = _mm512_dpbusd_epi32(acc[b][i], c[i], xb);
        }
    }
}

/* Prefetch group g's scales in a tile of n rows at sz: its plane's (or pairs') lines and, at a
 * super-block's first group, the super-block's d (and Q4_K's dmin) planes, which no group's plane
 * reaches. Strided reads (a plane a group, n rows apart) that the hardware's prefetchers miss: `far`
 * for the next tile's (a tile's time ahead, into L2), else two groups on (into L1). */
AI void prefetch_scales(const uint16_t *sz, int64_t g, int64_t n, const QRows *x, int kind, int far) {
    const char *at = (const char *)group_scales(sz, g, n, x, kind), *d = NULL;
    if (x->k4 && g % K4_GROUPS == 0) d = (const char *)(sz + (g / K4_GROUPS) * K4_PLANES * n);
    if (x->k6 && g % K6_GROUPS == 0) d = (const char *)k6_d(sz, g, n);
    for (int line = 0; line < 2 * x->sz_width; line++) {
        if (far) _mm_prefetch(at + 64 * line, _MM_HINT_T1);
        else _mm_prefetch(at + 64 * line, _MM_HINT_T0);
    }
    for (int line = 0; d && line < (x->k4 ? 4 : 2); line++) {  /* d's two lines (and dmin's, n rows on) */
        const char *p = d + (line & 2 ? 2 * n : 0) + 64 * (line & 1);
        if (far) _mm_prefetch(p, _MM_HINT_T1);
        else _mm_prefetch(p, _MM_HINT_T0);
    }
}

/* One tile (64 output rows) for nb <= ROWS_PER_PASS rows of x; kind: the weight's (plane: its
 * plane for this tile, the 5- or 6-bit form's); wide: x in 16-bit codes. */
AI void tile_pass(const uint8_t *codes, const uint8_t *plane, const uint16_t *sz, int64_t n, int64_t group,
                  const QRows *x, const Indices *indices, float tot[][TILE], int fp16, int kind, int wide, int nb) {
    const Indices idx = *indices;
    /* an int8 split: the low nibbles' columns start at K; the 6-bit form's are its tiles */
    const int64_t low_half = kind == KIND_INT8_SPLIT ? x->cols * 32 : 0;
    const int split = kind == KIND_INT8_SPLIT || kind == KIND_INT6;
    const int super = x->k4 == K4_SUPER && !wide;  /* Q4_K's form, x per super-block: `k4_group16` */
    float sums[ROWS_PER_PASS][TILE] __attribute__((aligned(64)));
    for (int b = 0; b < nb; b++)
        for (int r = 0; r < TILE; r++) tot[b][r] = 0.0f;
    __m512i isum[ROWS_PER_PASS][4];  /* Q6_K's form's super-block sums */
    for (int64_t g = 0; g < x->groups; g++) {
        __m512i acc[ROWS_PER_PASS][4], pairs[ROWS_PER_PASS][4][2];
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < 4; i++) acc[b][i] = pairs[b][i][0] = pairs[b][i][1] = _mm512_setzero_si512();
        if (g + 2 < x->groups) prefetch_scales(sz, g + 2, n, x, kind, 0);
        prefetch_scales(sz + TILE * x->sz_width, g, n, x, kind, 1);
        for (int64_t k = g * group; k < (g + 1) * group; k += 4) {
            __m512i c[4];
            const void *at = kind == KIND_INT5 ? (const void *)((const uint64_t *)plane + k)
                             : kind == KIND_INT6 ? (const void *)(plane + 16 * k) : NULL;  /* the plane's columns k.. */
            tile_codes(codes + k * 32, low_half, at, &idx, kind, c);
            dot4(c, x, k, wide, nb, acc, pairs);
        }
        if (wide)
            for (int b = 0; b < nb; b++)
                for (int i = 0; i < 4; i++) acc[b][i] = pair_sums_to_rows(pairs[b][i][0], pairs[b][i][1], idx.order);
        if (split && !wide)  /* 8-bit x: the sums of q = u - 128, as the prompt kernel's (tile_gemm.h) */
            for (int b = 0; b < nb; b++)
                for (int i = 0; i < 4; i++)
                    acc[b][i] = _mm512_sub_epi32(acc[b][i], _mm512_set1_epi32(128 * x->total[b * x->groups + g]));
        if (x->k6) {
            k6_rows16(sz, n, g, x, acc, isum, tot, nb);
            continue;
        }
        const uint16_t *group_sz = group_scales(sz, g, n, x, kind);
        const float bias = split ? (wide ? 136.0f : 8.0f) : kind == KIND_INT5 ? 16.0f : 8.0f;
        if (super) k4_group16(group_sz, n, acc, x, g, sums, tot, nb);
        else add_group(group_sz, n, bias, fp16, acc, x, g, tot, nb);
    }
}

static void run_tile(const uint8_t *codes, const uint8_t *plane, const uint16_t *sz, int64_t n, int64_t group,
                     const QRows *x, const Indices *idx, int64_t rows, uint16_t *out, int fp16, int kind) {
    float tot[ROWS_PER_PASS][TILE] __attribute__((aligned(64)));
    const int wide = x->q16 != NULL, per_pass = wide ? 2 : ROWS_PER_PASS;  /* wide: twice the accumulators */
    for (int64_t b0 = 0; b0 < rows; b0 += per_pass) {
        int nb = rows - b0 < per_pass ? (int)(rows - b0) : per_pass;
        QRows xb = {wide ? NULL : x->q8 + b0 * x->cols, wide ? x->q16 + b0 * x->cols : NULL,
                    x->scale + b0 * x->groups, x->sum + b0 * x->groups, x->cols, x->groups, x->total + b0 * x->groups,
                    NULL, NULL, NULL, x->sz_width, x->k4, x->k6};
        switch (wide * 8 + nb) {  /* constant row counts, so the accumulators stay in registers */
            case 1: tile_pass(codes, plane, sz, n, group, &xb, idx, tot, fp16, kind, 0, 1); break;
            case 2: tile_pass(codes, plane, sz, n, group, &xb, idx, tot, fp16, kind, 0, 2); break;
            case 3: tile_pass(codes, plane, sz, n, group, &xb, idx, tot, fp16, kind, 0, 3); break;
            case 4: tile_pass(codes, plane, sz, n, group, &xb, idx, tot, fp16, kind, 0, 4); break;
            case 9: tile_pass(codes, plane, sz, n, group, &xb, idx, tot, fp16, kind, 1, 1); break;
            default: tile_pass(codes, plane, sz, n, group, &xb, idx, tot, fp16, kind, 1, 2); break;
        }
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < 4; i++)
                _mm256_storeu_si256((__m256i *)(out + (b0 + b) * n + 16 * i),
                                    floats_to_halves(_mm512_loadu_ps(tot[b] + 16 * i), fp16));
    }
}

typedef Indices Setup;  /* what run_tile needs prepared once a call */

/* The AVX2 variants' starts of the 6-bit form's sums (tile_gemv_avx2_x8.h): none here. */
static int32_t *six_starts(const QRows *x, int64_t rows, int64_t tile, int64_t group) {
    (void)x; (void)rows; (void)tile; (void)group;
    return NULL;
}

static int takes_tile(int64_t tile, int kind, int x_bits) { (void)kind; (void)x_bits; return tile == TILE; }

static Setup make_setup(int64_t tile) { (void)tile; return make_indices(); }

/* One block of x's values (xgroup of them) as codes: amax, the codes at q and their sum per group of
 * `group` inputs (xgroup / group sums at totals); 16 values at a time (the same results as
 * tile_gemv.c's scalar loop). Returns 0 where the groups are not whole vectors. */
static int quantize_group_simd(const uint16_t *xg, int64_t xgroup, int64_t group, int fp16, int bits, void *q,
                               float *amax_out, int32_t *totals) {
    if (group % 16 || xgroup % group) return 0;
    const float top = bits == 16 ? 32767.0f : 127.0f;
    __m512 m = _mm512_setzero_ps();
    for (int64_t i = 0; i < xgroup; i += 16)
        m = _mm512_max_ps(m, _mm512_abs_ps(halves_to_floats(_mm256_loadu_si256((const __m256i *)(xg + i)), fp16)));
    float amax = _mm512_reduce_max_ps(m);
    __m512 inv = _mm512_set1_ps(amax > 0.0f ? top / amax : 0.0f);
    for (int64_t g = 0; g < xgroup; g += group) {
        __m512i t = _mm512_setzero_si512();
        for (int64_t i = g; i < g + group; i += 16) {
            __m512 f = halves_to_floats(_mm256_loadu_si256((const __m256i *)(xg + i)), fp16);
            __m512i c = _mm512_cvt_roundps_epi32(_mm512_mul_ps(f, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            t = _mm512_add_epi32(t, c);
            if (bits == 16) _mm256_storeu_si256((__m256i *)((int16_t *)q + i), _mm512_cvtepi32_epi16(c));
            else _mm_storeu_si128((__m128i *)((int8_t *)q + i), _mm512_cvtepi32_epi8(c));
        }
        totals[g / group] = _mm512_reduce_add_epi32(t);
    }
    *amax_out = amax;
    return 1;
}
