/* x @ w.T for a few rows of x (decode), w a 4-bit weight in torch's CPU int4 tile layout
 * (quant/int4_tiles.py) or an int8 weight held as two such 4-bit halves (quant/int8_weight.py),
 * read where it lies with AVX-512 VNNI integer dot products: x is rounded to 16-bit (or, as
 * llama.cpp does for its block types, 8-bit) integers with one scale per group of the weight's
 * inputs, each group's products are summed exactly in int32, and the group's scales are applied
 * in fp32.
 *
 * Layout: tiles of 64 output rows; tile t holds K * 32 bytes, byte (k, j) with row 64t + j in
 * its low nibble and row 64t + 32 + j in its high nibble. A byte permute (VBMI) gathers four
 * columns of a row into one 32-bit lane, which is what an 8-bit VNNI dot product multiplies; for
 * 16-bit x the lane's bytes are widened to two lanes of two 16-bit codes each.
 * scale_zero is (K/G, N, 2) 16-bit floats (bf16 or fp16, as x and out): w = (q - 8) * scale + zero.
 * An int8 weight's split (N, 2K) has its codes' high nibbles in columns 0..K-1 (scale 16 d,
 * zero 0) and its low nibbles in K..2K-1 (scale d, zero 8 d + m): joined back, u = q + 128 and
 * w = d * u + (zero - 136 d).
 * A 5-bit weight (GGUF's Q5_x: codes u in [0, 31]) holds its low nibbles as a 4-bit weight does
 * and its fifth bits in a plane of 64-bit words, one per register of codes tile_codes makes: for
 * tile t and columns k..k+3, words t K + k .. t K + k + 3, bit 4i + c of word q the fifth bit of
 * row 64t + 16q + i, column k + c (quant/int8_weight.py writes it); w = (u - 16) * scale + zero.
 *
 * Integer sums are exact, so a row's result does not depend on the rows beside it, on the
 * thread count, or on the split of the work. Built and loaded by flexlamps/kernels/tile_gemv.py. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_halves.h"

#define TILE 64
#define ROWS_PER_PASS 4
/* How far ahead the codes are prefetched: decode's weights stream from memory, and the hardware
 * prefetcher alone left a SmolLM2 step at about a third of the read bandwidth. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 512
#endif

static float half_to_float(uint16_t h, int fp16) {
    if (fp16) return _cvtsh_ss(h);
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}

/* The rows of x as int8 codes, a scale per group (codes * scale ~ x) and each group's sum. */
typedef struct { const int8_t *q8; const int16_t *q16; const float *scale, *sum; int64_t cols, groups; } QRows;

/* tot[b] += scale * dx * acc[b] + (zero - bias * scale) * sum_x for one group of a tile's 64 rows. */
AI void add_group(const uint16_t *sz, float bias, int fp16, __m512i acc[][4], const QRows *x, int64_t g,
                  float tot[][TILE], int nb) {
    for (int i = 0; i < 4; i++) {
        __m512i pairs = _mm512_loadu_si512(sz + 32 * i);  /* 16 rows' (scale, zero) */
        __m512 scale = halves_to_floats(_mm512_cvtepi32_epi16(pairs), fp16);
        __m512 zero = halves_to_floats(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)), fp16);
        __m512 offset = _mm512_fnmadd_ps(_mm512_set1_ps(bias), scale, zero);
        for (int b = 0; b < nb; b++) {
            __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[b][i]), _mm512_set1_ps(x->scale[b * x->groups + g]));
            __m512 t = _mm512_fmadd_ps(scale, dot, _mm512_loadu_ps(tot[b] + 16 * i));
            t = _mm512_fmadd_ps(offset, _mm512_set1_ps(x->sum[b * x->groups + g]), t);
            _mm512_storeu_ps(tot[b] + 16 * i, t);
        }
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

/* A weight's kind: 4-bit codes, an int8 split, or 5-bit codes (nibbles and a plane of fifth bits). */
enum { KIND_INT4 = 0, KIND_INT8_SPLIT = 1, KIND_INT5 = 2 };

/* The codes of columns k..k+3 of a tile's 64 rows, 16 rows a register, 4 bytes a row: 4-bit
 * codes, an int8 split's halves joined back (high nibbles from the first half, low ones from
 * the second: q + 128), or 4-bit codes plus 16 where `fifth`'s words (the plane at k) say. */
AI void tile_codes(const uint8_t *p, int64_t low_half, const uint64_t *fifth, const Indices *idx, int kind,
                   __m512i c[4]) {
    const __m512i nib = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8((char)0xF0);
    __m512i p0, p1;
    _mm_prefetch((const char *)(p + PREFETCH_BYTES), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + PREFETCH_BYTES + 64), _MM_HINT_T0);
    gather4(p, idx->lo, idx->hi, &p0, &p1);
    if (kind == KIND_INT8_SPLIT) {
        __m512i l0, l1;
        _mm_prefetch((const char *)(p + low_half + PREFETCH_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + low_half + PREFETCH_BYTES + 64), _MM_HINT_T0);
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
            _mm_prefetch((const char *)fifth + PREFETCH_BYTES / 4, _MM_HINT_T0);
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

/* One tile (64 output rows) for nb <= ROWS_PER_PASS rows of x; kind: the weight's (fifth: its
 * plane for this tile); wide: x in 16-bit codes. */
AI void tile_pass(const uint8_t *codes, const uint64_t *fifth, const uint16_t *sz, int64_t n, int64_t group,
                  const QRows *x, const Indices *indices, float tot[][TILE], int fp16, int kind, int wide, int nb) {
    const Indices idx = *indices;
    const int64_t low_half = x->cols * 32;  /* an int8 split: the low nibbles' columns start at K */
    const int split = kind == KIND_INT8_SPLIT;
    for (int b = 0; b < nb; b++)
        for (int r = 0; r < TILE; r++) tot[b][r] = 0.0f;
    for (int64_t g = 0; g < x->groups; g++) {
        __m512i acc[ROWS_PER_PASS][4], pairs[ROWS_PER_PASS][4][2];
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < 4; i++) acc[b][i] = pairs[b][i][0] = pairs[b][i][1] = _mm512_setzero_si512();
        if (g + 2 < x->groups) {  /* the scales two groups on: a strided read the prefetcher misses */
            const char *next = (const char *)(sz + (split ? g + 2 + x->groups : g + 2) * n * 2);
            for (int line = 0; line < 4; line++) _mm_prefetch(next + 64 * line, _MM_HINT_T0);
        }
        for (int64_t k = g * group; k < (g + 1) * group; k += 4) {
            __m512i c[4];
            tile_codes(codes + k * 32, low_half, kind == KIND_INT5 ? fifth + k : NULL, &idx, kind, c);
            dot4(c, x, k, wide, nb, acc, pairs);
        }
        if (wide)
            for (int b = 0; b < nb; b++)
                for (int i = 0; i < 4; i++) acc[b][i] = pair_sums_to_rows(pairs[b][i][0], pairs[b][i][1], idx.order);
        const uint16_t *group_sz = sz + (split ? g + x->groups : g) * n * 2;
        add_group(group_sz, split ? 136.0f : kind == KIND_INT5 ? 16.0f : 8.0f, fp16, acc, x, g, tot, nb);
    }
}

static void run_tile(const uint8_t *codes, const uint64_t *fifth, const uint16_t *sz, int64_t n, int64_t group,
                     const QRows *x, const Indices *idx, int64_t rows, uint16_t *out, int fp16, int kind) {
    float tot[ROWS_PER_PASS][TILE] __attribute__((aligned(64)));
    const int wide = x->q16 != NULL, per_pass = wide ? 2 : ROWS_PER_PASS;  /* wide: twice the accumulators */
    for (int64_t b0 = 0; b0 < rows; b0 += per_pass) {
        int nb = rows - b0 < per_pass ? (int)(rows - b0) : per_pass;
        QRows xb = {wide ? NULL : x->q8 + b0 * x->cols, wide ? x->q16 + b0 * x->cols : NULL,
                    x->scale + b0 * x->groups, x->sum + b0 * x->groups, x->cols, x->groups};
        switch (wide * 8 + nb) {  /* constant row counts, so the accumulators stay in registers */
            case 1: tile_pass(codes, fifth, sz, n, group, &xb, idx, tot, fp16, kind, 0, 1); break;
            case 2: tile_pass(codes, fifth, sz, n, group, &xb, idx, tot, fp16, kind, 0, 2); break;
            case 3: tile_pass(codes, fifth, sz, n, group, &xb, idx, tot, fp16, kind, 0, 3); break;
            case 4: tile_pass(codes, fifth, sz, n, group, &xb, idx, tot, fp16, kind, 0, 4); break;
            case 9: tile_pass(codes, fifth, sz, n, group, &xb, idx, tot, fp16, kind, 1, 1); break;
            default: tile_pass(codes, fifth, sz, n, group, &xb, idx, tot, fp16, kind, 1, 2); break;
        }
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < 4; i++)
                _mm256_storeu_si256((__m256i *)(out + (b0 + b) * n + 16 * i),
                                    floats_to_halves(_mm512_loadu_ps(tot[b] + 16 * i), fp16));
    }
}

/* Each row's groups of x as codes q of `bits` bits (8 or 16; scale = max |x| / top, top = 127 or
 * 32767, q = round(x / scale)) and the sum of the values they stand for, scale * sum(q): a
 * weight's zero point then multiplies the same x as its codes do (with the exact sum of x, errors
 * grew 1.5-3x). */
static void quantize_rows(const uint16_t *x, int64_t rows, int64_t cols, int64_t group, int fp16, int bits,
                          void *q, float *scale, float *sum) {
    const float top = bits == 16 ? 32767.0f : 127.0f;
    for (int64_t g = 0; g < rows * (cols / group); g++) {  /* the groups of all rows, in order */
        const uint16_t *xg = x + g * group;
        float amax = 0.0f;
        int32_t total = 0;
        if (group % 16 == 0) {  /* 16 values at a time: the same results as the scalar loop below */
            __m512 m = _mm512_setzero_ps();
            for (int64_t i = 0; i < group; i += 16)
                m = _mm512_max_ps(m, _mm512_abs_ps(halves_to_floats(_mm256_loadu_si256((const __m256i *)(xg + i)), fp16)));
            amax = _mm512_reduce_max_ps(m);
            __m512 inv = _mm512_set1_ps(amax > 0.0f ? top / amax : 0.0f);
            __m512i t = _mm512_setzero_si512();
            for (int64_t i = 0; i < group; i += 16) {
                __m512 f = halves_to_floats(_mm256_loadu_si256((const __m256i *)(xg + i)), fp16);
                __m512i c = _mm512_cvt_roundps_epi32(_mm512_mul_ps(f, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                t = _mm512_add_epi32(t, c);
                if (bits == 16) _mm256_storeu_si256((__m256i *)((int16_t *)q + g * group + i), _mm512_cvtepi32_epi16(c));
                else _mm_storeu_si128((__m128i *)((int8_t *)q + g * group + i), _mm512_cvtepi32_epi8(c));
            }
            total = _mm512_reduce_add_epi32(t);
        } else {
            for (int64_t i = 0; i < group; i++) amax = fmaxf(amax, fabsf(half_to_float(xg[i], fp16)));
            float inv = amax > 0.0f ? top / amax : 0.0f;
            for (int64_t i = 0; i < group; i++) {
                long code = lrintf(half_to_float(xg[i], fp16) * inv);
                if (bits == 16) ((int16_t *)q)[g * group + i] = (int16_t)code;
                else ((int8_t *)q)[g * group + i] = (int8_t)code;
                total += (int32_t)code;
            }
        }
        scale[g] = amax / top;
        sum[g] = scale[g] * (float)total;
    }
}

/* out (rows, n) = x (rows, cols) @ w.T, w (n, cols) in 4-bit tiles (kind 0), an int8 weight's
 * (n, 2 cols) split (kind 1) or 5-bit codes, 4-bit tiles and the plane `fifth` (kind 2), x
 * rounded to codes of x_bits (8 or 16) bits; returns 0, or -1 for what it does not take. */
int flexlamps_tile_gemv(const uint8_t *codes, const uint64_t *fifth, const uint16_t *scale_zero, const uint16_t *x,
                        uint16_t *out, int64_t n, int64_t cols, int64_t group, int64_t rows, int fp16, int kind,
                        int x_bits, int threads) {
    if (n % TILE || group <= 0 || group % 4 || group > 256 || cols % group || rows <= 0 || (x_bits != 8 && x_bits != 16)
        || kind < KIND_INT4 || kind > KIND_INT5 || (kind == KIND_INT5 && !fifth))
        return -1;
    const int64_t groups = cols / group;
    void *buf = malloc((size_t)(rows * cols * (x_bits / 8)) + 2 * sizeof(float) * (size_t)(rows * groups) + 64);
    if (!buf) return -1;
    float *scale = (float *)buf, *sum = scale + rows * groups;
    void *q = sum + rows * groups;
    quantize_rows(x, rows, cols, group, fp16, x_bits, q, scale, sum);
    QRows xr = {x_bits == 8 ? q : NULL, x_bits == 16 ? q : NULL, scale, sum, cols, groups};
    const Indices idx = make_indices();
    const int64_t tiles = n / TILE, tile_bytes = (kind == KIND_INT8_SPLIT ? 2 : 1) * cols * 32;
    if (threads <= 1 || tiles == 1) {  /* no parallel region to enter: a few microseconds a call */
        for (int64_t t = 0; t < tiles; t++)
            run_tile(codes + t * tile_bytes, fifth ? fifth + t * cols : NULL, scale_zero + t * TILE * 2, n, group, &xr,
                     &idx, rows, out + t * TILE, fp16, kind);
    } else {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t t = 0; t < tiles; t++)
            run_tile(codes + t * tile_bytes, fifth ? fifth + t * cols : NULL, scale_zero + t * TILE * 2, n, group, &xr,
                     &idx, rows, out + t * TILE, fp16, kind);
    }
    free(buf);
    return 0;
}
