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
 *   int8:   the split's halves joined to q = u - 128 in [-128, 127], summed in int16 for as many
 *           steps as the largest |q| allows (the sub-tile's `steps8`: 4 for Q6_K's |q| <= 32, 1 for
 *           Q8_0's), then widened. Where |q| <= 32 the codes are held biased, q + 64 (unsigned, as
 *           4-bit codes), and each 16-bit sum starts at -64 times the x codes it multiplies, mod
 *           2^16: it ends at the exact sum of q x (which fits int16; vpaddw wraps), with no vpsignb
 *           (Q6_K 33 -> 40 GFLOP/s on a 1.1B layer). Larger codes: vpmaddubsw(|q|, x signed by q).
 * A step's multiply-adds are asm (`step_rows`) and the common group sizes have constant counts
 * (`gemm_pass`, `pass2`): 1.2x the rate gcc made of the same intrinsics (this EPYC, 1 thread,
 * 2048 x 2048, 128 rows: 4-bit 41 -> 49 GFLOP/s, Q6_K 26 -> 32; vpmaddubsw's peak there is 79:
 * scripts/bench_prompt_kernel.py).
 * Then per group: tot += scale * (dot * dx) + offset * sum_x, offset = zero - 8 * scale (for the
 * int8 split, the low half's pair: w = d q + zero - 8 d); Q4_K's form, x rounded per super-block,
 * takes tile_scales_k4.h's K4_SUPER steps instead (`k4_add_dots`). Integer sums are exact and the fp32 steps
 * of a row run in the same order whatever rows share the call, the blocking or the threads: a
 * row's result depends on that row alone. The avx_vnni variant's passes (tile_gemm_vnni.h) sum with
 * vpdpbusd into int32: the same exact sums, the same bits. Included by tile_gemv.c. */
#ifndef GEMM_ROWS
#define GEMM_ROWS 2
#endif  /* rows of x a pass multiplies by a sub-tile's codes, their sums in registers */
#define SUB 32        /* output rows of a sub-tile */

#define CODE_BIAS 64   /* added to int8 codes of |q| <= 32, so vpmaddubsw takes them unsigned */
#define BIAS_INPUTS 16 /* inputs a biased sum covers: its start is per 16 of a row's inputs */

/* One sub-tile's codes laid out for the passes, and its groups' scales and offsets (lane order);
 * `biased`: int8 codes held as q + CODE_BIAS (where `can_bias`: x's rows come with bias_starts);
 * `offsets`: whether any offset is other than +0 (`prepare` says; Q6_K's and Q4_0's are all +0). */
typedef struct {
    uint8_t *codes, *magnitude;
    float *scale, *offset;
    int64_t steps8;
    int biased, can_bias, wide, offsets;
    int k6;  /* Q6_K's form (tile_scales_k6.h): `scale` holds each group's sc (int32), `offset` each super-block's d */
    int32_t *acc;  /* Q6_K's form: the rows' super-block sums (a pass's rows x 32 lanes) */
    uint8_t *planes;  /* Q6_K's form on AMX tiles: sc q's high and low bytes, as `codes` (tile_gemm_amx.h) */
} Prepared;

/* Whether any of n floats is other than +0 (its bits nonzero). */
AI int any_nonzero(const float *f, int64_t n) {
    __m256i any = _mm256_setzero_si256();
    for (int64_t i = 0; i < n; i += 8) any = _mm256_or_si256(any, _mm256_loadu_si256((const __m256i *)(f + i)));
    return !_mm256_testz_si256(any, any);
}

/* A column slice's 16 bytes as codes: low nibbles (rows j) in the low 128-bit lane, high ones
 * (rows h + j) in the high lane. */
AI __m256i nibble_lanes(__m128i bytes) {
    __m256i b = _mm256_broadcastsi128_si256(bytes);
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
 * nibbles at p, its low ones `low_half` bytes on; the 6-bit form's: its high nibbles from the plane,
 * at the tile's byte `off`, its low ones at p). */
AI __m256i column_codes(const uint8_t *p, const uint8_t *plane, int64_t off, int64_t low_half, int split) {
    if (!split) return nibble_lanes(_mm_loadu_si128((const __m128i *)p));
    __m128i high = plane ? plane_high16(plane, off) : _mm_loadu_si128((const __m128i *)p);
    __m256i low = nibble_lanes(_mm_loadu_si128((const __m128i *)(p + low_half)));
    __m256i u = _mm256_or_si256(_mm256_slli_epi16(nibble_lanes(high), 4), low);
    return _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
}

/* 8 lanes' (scale, zero) pairs of 16-bit floats as fp32: lanes 0-3 the 4 rows' at lo, 4-7 at hi
 * (width 1: their scales alone, zero = 8 scale, exact). */
AI void lane_scales(const uint16_t *lo, const uint16_t *hi, int64_t width, int fp16, __m256 *scale, __m256 *zero) {
    if (width == 1) {
        *scale = halves_to_floats8(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)lo),
                                                      _mm_loadl_epi64((const __m128i *)hi)), fp16);
        *zero = _mm256_mul_ps(*scale, _mm256_set1_ps(8.0f));
        return;
    }
    __m256i pairs = _mm256_loadu2_m128i((const __m128i *)hi, (const __m128i *)lo);
    if (!fp16) {  /* bf16: the upper 16 bits of an fp32 */
        *scale = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
        *zero = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32((int)0xFFFF0000u)));
        return;
    }
    __m256i low = _mm256_and_si256(pairs, _mm256_set1_epi32(0xFFFF)), high = _mm256_srli_epi32(pairs, 16);
    *scale = halves_to_floats8(_mm_packus_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1)), fp16);
    *zero = halves_to_floats8(_mm_packus_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1)), fp16);
}

/* Q6_K's form's scales of sub-tile s (tile_scales_k6.h) in prep's lane order: each group's sc as int32 at
 * `scale`, each super-block's d at `offset`; no offsets. */
static void k6_prepare(const uint16_t *sz, int64_t s, int64_t h, int64_t n, int64_t groups, Prepared *prep) {
#define K6_LANES(p) _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)((p) + 16 * s + 4 * v)), \
                                       _mm_loadl_epi64((const __m128i *)((p) + h + 16 * s + 4 * v)))
    for (int64_t g = 0; g < groups; g++)
        for (int v = 0; v < 4; v++) {  /* vector v: rows 16s + 4v.. (lanes 0-3) and h + 16s + 4v.. (4-7) */
            _mm256_storeu_si256((__m256i *)(prep->scale + g * SUB + 8 * v), _mm256_cvtepi16_epi32(K6_LANES(k6_group(sz, g, n))));
            if (g % K6_GROUPS == 0)
                _mm256_storeu_ps(prep->offset + g / K6_GROUPS * SUB + 8 * v, _mm256_cvtph_ps(K6_LANES(k6_d(sz, g, n))));
        }
#undef K6_LANES
    prep->offsets = 0;
}

#if defined(__AVX512VBMI__)
#include "tile_prepare_512.h"  /* prepare's permutes for 64-row tiles */
#endif

/* Sub-tile s of the tile at `codes` (its plane at `plane` for the 6-bit form, else NULL; scale_zero
 * `sz` at its first row; n rows in all) laid out in `prep`, and for int8 codes the steps whose pairs
 * int16 holds (`steps8`, from their largest |q|). */
static void prepare(const uint8_t *codes, const uint8_t *plane, const uint16_t *sz, int64_t s, int64_t h, int64_t n,
                    int64_t cols, int64_t groups, int64_t width, int k4, int fp16, int split, Prepared *prep) {
    const int64_t low_half = plane ? 0 : cols * h;
    __m256i top = _mm256_setzero_si256();
#if defined(__AVX512VBMI__)
    const int fast = h == 32 && (!split || plane);  /* tile_prepare_512.h's permutes (the same bytes) */
    const Layout512 layout = layout512(fast ? s : 0);
#else
    const int fast = 0;
#endif
    for (int64_t k = 0; k < cols; k += 4) {
        const int64_t off = k * h + 16 * s;
        const uint8_t *p = codes + off;
        __m256i *out = (__m256i *)(prep->codes + k * 32);
#if defined(__AVX512VBMI__)
        if (fast) prepare4_512(codes + k * h, plane, k, &layout, prep->codes + k * 32);
        else
#endif
        transpose4(column_codes(p, plane, off, low_half, split), column_codes(p + h, plane, off + h, low_half, split),
                   column_codes(p + 2 * h, plane, off + 2 * h, low_half, split),
                   column_codes(p + 3 * h, plane, off + 3 * h, low_half, split), out);
        if (split && prep->magnitude)  /* (none on AMX tiles taking every row: they multiply q) */
            for (int v = 0; v < 4; v++) {
                __m256i magnitude = _mm256_abs_epi8(_mm256_loadu_si256(out + v));
                top = _mm256_max_epu8(top, magnitude);
                _mm256_storeu_si256((__m256i *)(prep->magnitude + k * 32) + v, magnitude);
            }
    }
    uint8_t lanes[32];
    _mm256_storeu_si256((__m256i *)lanes, top);
    int64_t largest = 1;
    for (int i = 0; i < 32; i++) largest = lanes[i] > largest ? lanes[i] : largest;
    prep->steps8 = 32767 / (2 * 127 * largest) < 8 ? 32767 / (2 * 127 * largest) : 8;
    prep->biased = prep->can_bias && split && prep->steps8 >= BIAS_INPUTS / 4 && (cols / groups) % BIAS_INPUTS == 0;
    for (int64_t i = 0; prep->biased && i < cols * SUB; i += 32) {
        __m256i *at = (__m256i *)(prep->codes + i);
        _mm256_storeu_si256(at, _mm256_add_epi8(_mm256_loadu_si256(at), _mm256_set1_epi8(CODE_BIAS)));
    }
    if (prep->k6) {
        k6_prepare(sz, s, h, n, groups, prep);
        return;
    }
    for (int64_t j = 0; k4 == K4_SUPER && j < groups / K4_GROUPS; j++)  /* Q4_K's form, x per super-block */
        for (int v = 0; v < 4; v++)
            k4_super_block(sz + j * K4_PLANES * n, n, 16 * s + 4 * v, h + 16 * s + 4 * v,
                           prep->scale + j * K4_GROUPS * SUB + 8 * v, prep->offset + j * K4_GROUPS * SUB + 8 * v, SUB);
    for (int64_t g = 0; k4 != K4_SUPER && g < groups; g++) {
        const uint16_t *pairs = sz + (split && !plane ? g + groups : g) * n * width;
        for (int v = 0; k4 && v < 4; v++) {  /* Q4_K's form (tile_scales_k4.h): the offset itself */
            __m256 scale, offset;
            k4_lanes(k4_group(sz, g, n), g, n, 16 * s + 4 * v, h + 16 * s + 4 * v, &scale, &offset);
            _mm256_storeu_ps(prep->scale + g * SUB + 8 * v, scale);
            _mm256_storeu_ps(prep->offset + g * SUB + 8 * v, offset);
        }
        for (int v = 0; !k4 && v < 4; v++) {  /* vector v: rows 16s + 4v.. (lanes 0-3) and h + 16s + 4v.. (4-7) */
            __m256 scale, zero;
            lane_scales(pairs + width * (16 * s + 4 * v), pairs + width * (h + 16 * s + 4 * v), width, fp16, &scale, &zero);
            _mm256_storeu_ps(prep->scale + g * SUB + 8 * v, scale);
            /* 16-bit x (`wide`) on an int8 split: decode's offset for u = q + 128, zero - 136 scale rounded once */
            __m256 offset = prep->wide && split ? _mm256_fnmadd_ps(_mm256_set1_ps(136.0f), scale, zero)
                                                : _mm256_sub_ps(zero, _mm256_mul_ps(_mm256_set1_ps(8.0f), scale));
            _mm256_storeu_ps(prep->offset + g * SUB + 8 * v, offset);
        }
    }
    prep->offsets = any_nonzero(prep->offset, groups * SUB);
}

/* tot[b][v] (8 floats each, in memory) += scale * (dot[b][v] * dx) + offset * sum_x for group g of
 * nb rows: the fp32 steps of every variant, in this order. Where every offset is +0 (`offsets` 0) the
 * last step is left out: fma(+0, sum_x, t) is t, bit for bit, for a finite sum_x (t is never -0: tot
 * starts at +0 and a sum that cancels rounds to +0), and where x holds an inf or NaN, dx is NaN or
 * inf and t already NaN. So the bits are those of the per-row path, which takes every step. */
AI void add_dots_with(const Prepared *prep, int64_t g, const QRows *x, const __m256i dot[][4], float *tot, int nb,
                      int offsets) {
    for (int b = 0; b < nb; b++) {
        __m256 dx = _mm256_set1_ps(x->scale[b * x->groups + g]), sx = _mm256_set1_ps(x->sum[b * x->groups + g]);
        for (int v = 0; v < 4; v++) {
            float *at = tot + (b * 4 + v) * 8;
            __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[b][v]), dx);
            t = _mm256_fmadd_ps(_mm256_loadu_ps(prep->scale + g * SUB + 8 * v), t, _mm256_loadu_ps(at));
            if (offsets) t = _mm256_fmadd_ps(_mm256_loadu_ps(prep->offset + g * SUB + 8 * v), sx, t);
            _mm256_storeu_ps(at, t);
        }
    }
}

/* Q4_K's form with x per super-block (tile_scales_k4.h's K4_SUPER steps): group g's sums into the
 * super-block sums (at tot + 32 GEMM_ROWS: the passes' tot holds both), after its last group the
 * super-block into tot. `prepare` laid out the groups' sc at scale, the super-blocks' values at offset. */
AI void k4_add_dots(const Prepared *prep, int64_t g, const QRows *x, const __m256i dot[][4], float *tot, int nb) {
    const int64_t q = g % K4_GROUPS, j0 = g - q;
    float *sums = tot + 32 * GEMM_ROWS;
    for (int b = 0; b < nb; b++)
        for (int v = 0; v < 4; v++) {
            float *sum = sums + (b * 4 + v) * 8;
            _mm256_storeu_ps(sum, k4_step8(dot[b][v], _mm256_loadu_ps(prep->scale + g * SUB + 8 * v),
                                           _mm256_loadu_ps(sum), q == 0));
        }
    for (int b = 0; q == K4_GROUPS - 1 && b < nb; b++) {
        __m256i qp[K4_GROUPS / 2];
        k4_q_pairs8(x->total + b * x->groups + j0, qp);
        const __m256 dx = _mm256_set1_ps(x->scale[b * x->groups + j0]);
        for (int v = 0; v < 4; v++) {
            float *at = tot + (b * 4 + v) * 8;
            _mm256_storeu_ps(at, k4_finish8(prep->offset + j0 * SUB + 8 * v, SUB, _mm256_loadu_ps(sums + (b * 4 + v) * 8),
                                            qp, dx, _mm256_loadu_ps(at)));
        }
    }
}

/* Q6_K's form (tile_scales_k6.h): group g's exact sums times each lane's sc added to the rows' super-block
 * sums (prep->acc, in int32), and at the super-block's last group its one fp32 step into tot. */
AI void k6_add_dots(const Prepared *prep, int64_t g, const QRows *x, const __m256i dot[][4], float *tot, int nb) {
    const int64_t j = g % K6_GROUPS;
    for (int b = 0; b < nb; b++)
        for (int v = 0; v < 4; v++) {
            int32_t *acc = prep->acc + (b * 4 + v) * 8;
            __m256i sum = _mm256_mullo_epi32(dot[b][v], _mm256_loadu_si256((const __m256i *)(prep->scale + g * SUB + 8 * v)));
            if (j) sum = _mm256_add_epi32(sum, _mm256_loadu_si256((const __m256i *)acc));
            if (j < K6_GROUPS - 1) {
                _mm256_storeu_si256((__m256i *)acc, sum);
                continue;
            }
            float *at = tot + (b * 4 + v) * 8;
            const __m256 d = _mm256_loadu_ps(prep->offset + g / K6_GROUPS * SUB + 8 * v);
            _mm256_storeu_ps(at, k6_step8(sum, d, x->scale[b * x->groups + g], _mm256_loadu_ps(at)));
        }
}

/* add_dots_with, `offsets` a constant in each copy; for int8 codes (`split`) alone: the 4-bit passes'
 * offsets are rarely +0 (Q4_0's), and two copies of the steps cost the AVX2 4-bit pass 3-4%. Q4_K's
 * form with x per super-block: k4_add_dots. tot: 2 GEMM_ROWS x 32 floats. */
AI void add_dots(const Prepared *prep, int64_t g, const QRows *x, const __m256i dot[][4], float *tot, int nb,
                 int split) {
    if (x->k4 == K4_SUPER) k4_add_dots(prep, g, x, dot, tot, nb);
    else if (prep->k6) k6_add_dots(prep, g, x, dot, tot, nb);
    else if (split && !prep->offsets) add_dots_with(prep, g, x, dot, tot, nb, 0);
    else add_dots_with(prep, g, x, dot, tot, nb, 1);
}

/* One step (4 inputs) of one or two rows of x by a sub-tile's 4 vectors of codes, added to each row's
 * 4 vectors of int16 sums, in asm: compiled from intrinsics, gcc hoisted a chunk's loads of codes and
 * reordered its adds into a tree, held every product at once and spilled them (1.4x slower).
 * 4-bit codes: vpmaddubsw(codes, x). int8 codes: vpmaddubsw(|q|, x signed by q), q read from memory. */
#define LOAD_CODES "vmovdqu (%[w]), %%ymm10\n\tvmovdqu 32(%[w]), %%ymm11\n\tvmovdqu 64(%[w]), %%ymm12\n\t" \
                   "vmovdqu 96(%[w]), %%ymm13\n\t"
#define TIMES_CODES(x, v, a) "vpmaddubsw %%ymm14, %%ymm1" v ", %%ymm15\n\tvpaddw %%ymm15, %[" a v "], %[" a v "]\n\t"
#define TIMES_SIGNED(x, v, a) "vpsignb " v "*32(%[q]), %%ymm14, %%ymm15\n\t" \
                              "vpmaddubsw %%ymm15, %%ymm1" v ", %%ymm15\n\tvpaddw %%ymm15, %[" a v "], %[" a v "]\n\t"
#define TIMES_SIGNED_WIDE(x, v, a) "vpsignb " v "*32(%[q]), %%ymm14, %%ymm15\n\t" \
    "vpmaddubsw %%ymm15, %%ymm1" v ", %%ymm15\n\tvpmaddwd %[ones], %%ymm15, %%ymm15\n\tvpaddd %%ymm15, %[" a v "], %[" a v "]\n\t"
#define TIMES_FIRST(x, v, a) "vpmaddubsw %%ymm14, %%ymm1" v ", %[" a v "]\n\t"
#define ROW(times, x, a) "vpbroadcastd " x ", %%ymm14\n\t" times(x, "0", a) times(x, "1", a) times(x, "2", a) \
                         times(x, "3", a)
#define SUMS(a, p) [a##0] "+x"(p[0]), [a##1] "+x"(p[1]), [a##2] "+x"(p[2]), [a##3] "+x"(p[3])
#define FIRST_SUMS(a, p) [a##0] "=x"(p[0]), [a##1] "=x"(p[1]), [a##2] "=x"(p[2]), [a##3] "=x"(p[3])
#define STEP_READS(w, q, x) "m"(*(const uint8_t(*)[128])(w)), "m"(*(const uint8_t(*)[128])(q)), "m"(*(const int32_t *)(x))
#define STEP_CLOBBERS "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"

/* The four asm forms of a step (codes, or int8 codes signed by q, where `sign`; one row or two), their
 * multiply-adds written by the row macros T (codes) and S (signed): step_rows' and the VNNI step's. */
#define STEP_FORMS(T, S, sign)                                                                                     \
    const int8_t *x1 = x + stride;                                                                                 \
    if (!(sign) && nb == 2)                                                                                        \
        __asm__(LOAD_CODES ROW(T, "(%[x])", "a") ROW(T, "(%[x1])", "b")                                            \
                : SUMS(a, p[0]), SUMS(b, p[1]) : [w] "r"(w), [x] "r"(x), [x1] "r"(x1), STEP_READS(w, w, x),        \
                  "m"(*(const int32_t *)x1) : STEP_CLOBBERS);                                                      \
    else if (!(sign))                                                                                              \
        __asm__(LOAD_CODES ROW(T, "(%[x])", "a") : SUMS(a, p[0]) : [w] "r"(w), [x] "r"(x),                         \
                STEP_READS(w, w, x) : STEP_CLOBBERS);                                                              \
    else if (nb == 2)                                                                                              \
        __asm__(LOAD_CODES ROW(S, "(%[x])", "a") ROW(S, "(%[x1])", "b")                                            \
                : SUMS(a, p[0]), SUMS(b, p[1]) : [w] "r"(w), [q] "r"(q), [x] "r"(x), [x1] "r"(x1),                 \
                  STEP_READS(w, q, x), "m"(*(const int32_t *)x1) : STEP_CLOBBERS);                                 \
    else                                                                                                           \
        __asm__(LOAD_CODES ROW(S, "(%[x])", "a") : SUMS(a, p[0]) : [w] "r"(w), [q] "r"(q), [x] "r"(x),             \
                STEP_READS(w, q, x) : STEP_CLOBBERS)

/* Step of nb (1 or 2) rows at x (row stride `stride`) by the codes at w (int8: magnitudes at w, q at q). */
AI void step_rows(const uint8_t *w, const uint8_t *q, const int8_t *x, int64_t stride, __m256i p[][4], int split,
                  int nb) {
    STEP_FORMS(TIMES_CODES, TIMES_SIGNED, split);
}

/* The first step of two rows by 4-bit (or biased int8) codes at w: the products start the sums (one
 * vpaddw less a group than adding them to zeros). */
AI void first_step2(const uint8_t *w, const int8_t *x, int64_t stride, __m256i p[][4]) {
    const int8_t *x1 = x + stride;
    __asm__(LOAD_CODES ROW(TIMES_FIRST, "(%[x])", "a") ROW(TIMES_FIRST, "(%[x1])", "b")
            : FIRST_SUMS(a, p[0]), FIRST_SUMS(b, p[1]) : [w] "r"(w), [x] "r"(x), [x1] "r"(x1), STEP_READS(w, w, x),
              "m"(*(const int32_t *)x1) : STEP_CLOBBERS);
}

/* As step_rows for int8 codes up to +-128, each step's pairs widened and added to int32 sums. */
AI void wide_step_rows(const uint8_t *w, const uint8_t *q, const int8_t *x, int64_t stride, __m256i p[][4], int nb) {
    const int8_t *x1 = x + stride;
    const __m256i ones = _mm256_set1_epi16(1);
    if (nb == 2)
        __asm__(LOAD_CODES ROW(TIMES_SIGNED_WIDE, "(%[x])", "a") ROW(TIMES_SIGNED_WIDE, "(%[x1])", "b")
                : SUMS(a, p[0]), SUMS(b, p[1]) : [w] "r"(w), [q] "r"(q), [x] "r"(x), [x1] "r"(x1), [ones] "x"(ones),
                  STEP_READS(w, q, x), "m"(*(const int32_t *)x1) : STEP_CLOBBERS);
    else
        __asm__(LOAD_CODES ROW(TIMES_SIGNED_WIDE, "(%[x])", "a") : SUMS(a, p[0]) : [w] "r"(w), [q] "r"(q), [x] "r"(x),
                [ones] "x"(ones), STEP_READS(w, q, x) : STEP_CLOBBERS);
}

/* Where row b's int16 sums of biased codes (q + CODE_BIAS) from input k start: -CODE_BIAS times the
 * sum of x's codes each 16-bit lane multiplies, mod 2^16. The sums then end at the exact sums of q x
 * (|q| <= 32: they fit int16, and vpaddw wraps), as the sign path's, without vpsignb. */
AI __m256i bias_start(const QRows *x, int b, int64_t k) {
    return _mm256_set1_epi32(x->starts16[b * (x->cols / BIAS_INPUTS) + k / BIAS_INPUTS]);
}

/* dot[b][v] (+)= the exact sums of `steps` steps of 4 inputs from k of nb rows: 4-bit codes (at most
 * 8 steps: 8 * 2 * 15 * 127 < 2^15) or int8 codes (the sub-tile's `steps8`: 2 * 127 * max|q| a step
 * stays below 2^15 for that many), pairs summed in int16, then widened. */
AI void chunk_sums(const Prepared *prep, const QRows *x, int64_t k, int64_t steps, __m256i dot[][4], int add, int split,
              int nb) {
    __m256i pairs[GEMM_ROWS][4];
    const int biased = split && prep->biased, sign = split && !biased;
    for (int b = 0; b < nb; b++)
        for (int v = 0; v < 4; v++) pairs[b][v] = biased ? bias_start(x, b, k) : _mm256_setzero_si256();
    const uint8_t *w = (sign ? prep->magnitude : prep->codes) + k * 32, *q = prep->codes + k * 32;
    if (split && prep->steps8 == 1) {  /* codes up to +-128: every step widened */
        for (int64_t step = 0; step < steps; step++)
            wide_step_rows(w + step * 128, q + step * 128, x->q8 + k + 4 * step, x->cols, pairs, nb);
        for (int b = 0; b < nb; b++)
            for (int v = 0; v < 4; v++) dot[b][v] = add ? _mm256_add_epi32(dot[b][v], pairs[b][v]) : pairs[b][v];
        return;
    }
    for (int64_t step = 0; step < steps; step++)
        step_rows(w + step * 128, q + step * 128, x->q8 + k + 4 * step, x->cols, pairs, sign, nb);
    for (int b = 0; b < nb; b++)
        for (int v = 0; v < 4; v++) {
            __m256i wide = _mm256_madd_epi16(pairs[b][v], _mm256_set1_epi16(1));
            dot[b][v] = add ? _mm256_add_epi32(dot[b][v], wide) : wide;
        }
}

/* The 32 outputs (lane order) of nb rows of x by a prepared sub-tile, every group, into tot; `chunk`
 * inputs at a time have their pairs summed in int16. */
AI void groups_pass(const Prepared *prep, const QRows *x, int64_t group, int64_t chunk, int split, float *tot,
                    int nb) {
    memset(tot, 0, sizeof(float) * 32 * (size_t)nb);
    for (int64_t g = 0; g < x->groups; g++) {
        __m256i dot[GEMM_ROWS][4];
        for (int64_t k = g * group; k < (g + 1) * group; k += chunk) {
            int64_t steps = ((g + 1) * group - k < chunk ? (g + 1) * group - k : chunk) / 4;
            chunk_sums(prep, x, k, steps, dot, k > g * group, split, nb);
        }
        add_dots(prep, g, x, dot, tot, nb, split);
    }
}

/* groups_pass for two rows in the common groups, `steps` (constant) steps of 4 inputs a group summed
 * in int16 and widened once: 4-bit codes in groups of 32 (Q4_0, Q4_K), int8 codes with |q| <= 32 in
 * groups of 16 (Q6_K). Written out, it keeps the sums in registers where groups_pass's chunk loop
 * spilled them (Q6_K 28 -> 32 GFLOP/s on 2048 x 2048, 128 rows). */
AI void pass2(const Prepared *prep, const QRows *x, int64_t steps, int split, float *tot) {
    memset(tot, 0, sizeof(float) * 64);
    const uint8_t *w = prep->codes;  /* 4-bit codes, or int8 ones biased */
    for (int64_t g = 0; g < x->groups; g++) {
        __m256i p[2][4];
        int64_t k = g * 4 * steps;
        /* the next pass's rows, a group ahead: each pass starts 2 rows on, in pages the hardware
         * prefetcher has not seen (4096 rows: 8% slower without) */
        _mm_prefetch((const char *)(x->q8 + 2 * x->cols + k), _MM_HINT_T0);
        _mm_prefetch((const char *)(x->q8 + 3 * x->cols + k), _MM_HINT_T0);
        if (split) {
            for (int b = 0; b < 2; b++)
                for (int v = 0; v < 4; v++) p[b][v] = bias_start(x, b, k);
        } else {
            first_step2(w + k * 32, x->q8 + k, x->cols, p);
            k += 4;
        }
        for (; k < (g + 1) * 4 * steps; k += 4)
            step_rows(w + k * 32, w + k * 32, x->q8 + k, x->cols, p, 0, 2);
        __m256i dot[2][4];
        for (int b = 0; b < 2; b++)
            for (int v = 0; v < 4; v++) dot[b][v] = _mm256_madd_epi16(p[b][v], _mm256_set1_epi16(1));
        add_dots(prep, g, x, dot, tot, 2, split);
    }
}

#ifdef __AVXVNNI__
#include "tile_gemm_vnni.h"  /* gemm_pass with vpdpbusd */
#else
/* groups_pass, its counts constant for the common groups (4-bit codes in groups of 32: Q4_0, Q4_K;
 * Q6_K's int8 codes, |q| <= 32, in groups of 16; Q8_0's), so the compiler unrolls them. */
AI void gemm_pass(const Prepared *prep, const QRows *x, int64_t group, int split, float *tot, int nb) {
    /* inputs whose pairs int16 holds (biased codes: those of one start) */
    const int64_t chunk = split && prep->biased ? BIAS_INPUTS : split && prep->steps8 > 1 ? 4 * prep->steps8 : 32;
    if (!split && group == 32 && nb == 2) pass2(prep, x, 8, 0, tot);
    else if (!split && group == 32) groups_pass(prep, x, 32, 32, 0, tot, nb);
    else if (split && group == 16 && prep->biased && nb == 2) pass2(prep, x, 4, 1, tot);
    else if (split && group == 16 && prep->biased) groups_pass(prep, x, 16, 16, 1, tot, nb);
    else if (split && group == 32 && prep->steps8 == 1) groups_pass(prep, x, 32, 32, 1, tot, nb);  /* Q8_0 */
    else groups_pass(prep, x, group, chunk, split, tot, nb);
}
#endif

/* bias_start's values for every row of x and every 16 of its inputs (a malloc'd array), or NULL
 * where no sub-tile can be biased (cols not 16s) or memory is short (then none is). */
static int32_t *bias_starts(const QRows *x, int64_t rows) {
    const int64_t per_row = x->cols / BIAS_INPUTS;
    int32_t *starts = x->cols % BIAS_INPUTS ? NULL : malloc(sizeof(int32_t) * (size_t)(rows * per_row) + 1);
    for (int64_t i = 0; starts && i < rows * per_row; i++) {
        const int8_t *q = x->q8 + i * BIAS_INPUTS;  /* rows are whole 16s: chunk i of all rows in order */
        int32_t low = 0, high = 0;  /* lanes' inputs: 4s, 4s + 1 (low 16 bits), 4s + 2, 4s + 3 (high) */
        for (int j = 0; j < BIAS_INPUTS; j += 4) {
            low += q[j] + q[j + 1];
            high += q[j + 2] + q[j + 3];
        }
        starts[i] = (int32_t)((uint32_t)(uint16_t)(-CODE_BIAS * low) | (uint32_t)(uint16_t)(-CODE_BIAS * high) << 16);
    }
    return starts;
}

/* A pass's outputs in lane order (4 vectors at tot) to rows j (low, out_lo) and h + j (high, out_hi), j < 16. */
AI void store_pass(const float *tot, uint16_t *out_lo, uint16_t *out_hi, int fp16) {
    for (int half = 0; half < 2; half++) {  /* rows 0-7, then 8-15 */
        __m256 a = _mm256_loadu_ps(tot + 16 * half), b = _mm256_loadu_ps(tot + 16 * half + 8);
        __m256 lo = _mm256_permute2f128_ps(a, b, 0x20), hi = _mm256_permute2f128_ps(a, b, 0x31);
        _mm_storeu_si128((__m128i *)(out_lo + 8 * half), floats_to_halves8(lo, fp16));
        _mm_storeu_si128((__m128i *)(out_hi + 8 * half), floats_to_halves8(hi, fp16));
    }
}

/* Rows of x from b0 as a QRows of their own. */
AI QRows rows_from(const QRows *x, int64_t b0) {
    QRows xb = {x->q8 ? x->q8 + b0 * x->cols : NULL, x->q16 ? x->q16 + b0 * x->cols : NULL, x->scale + b0 * x->groups,
                x->sum + b0 * x->groups, x->cols, x->groups, x->total + b0 * x->groups,
                x->starts16 ? x->starts16 + b0 * (x->cols / BIAS_INPUTS) : NULL, NULL,
                x->lo8 ? x->lo8 + b0 * x->cols : NULL, x->sz_width, x->k4, x->k6};
    return xb;
}

#if defined(__AVX512VNNI__)
#include "tile_gemm_vnni512.h"  /* zmm_rows: vpdpbusd on 512 bits, 4 rows a pass */
#endif

/* Every row of x by one prepared sub-tile (its rows 16s.. and h + 16s.. of the tile whose first
 * output column is out). */
static void gemm_rows(const Prepared *prep, const QRows *x, int64_t rows, int64_t group, int split, uint16_t *out,
                      int64_t n, int64_t s, int64_t h, int fp16) {
#if defined(__AVX512VNNI__)
    if (zmm_takes(prep, group, split)) {
        zmm_rows(prep, x, rows, group, split, out, n, s, h, fp16);
        return;
    }
#endif
    for (int64_t b0 = 0; b0 < rows; b0 += GEMM_ROWS) {
        int nb = rows - b0 < GEMM_ROWS ? (int)(rows - b0) : GEMM_ROWS;
        QRows xb = rows_from(x, b0);
        float tot[2 * GEMM_ROWS * 32];  /* (the second half: Q4_K's super-block sums, `k4_add_dots`) */
        if (nb == GEMM_ROWS) gemm_pass(prep, &xb, group, split, tot, GEMM_ROWS);  /* constant counts: sums in registers */
        else gemm_pass(prep, &xb, group, split, tot, 1);
        for (int b = 0; b < nb; b++)
            store_pass(tot + 32 * b, out + (b0 + b) * n + 16 * s, out + (b0 + b) * n + h + 16 * s, fp16);
    }
}
