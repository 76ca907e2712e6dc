/* tile_gemm.h's prompt product on AMX int8 tiles (the "amx" variant: Sapphire Rapids and later),
 * for 4-bit codes: a prepared sub-tile's codes (`prepare`: for every 4 inputs, 32 output rows' 4
 * codes, 128 bytes) are two B tiles as they lie (the first and last 64 bytes of each 128, stride
 * 128: 16 output rows x 4 codes a tile row), 16 rows of x's int8 codes an A tile (a group's bytes,
 * stride cols), and tdpbsud (signed x by unsigned codes) sums a group's products exactly in int32:
 * the same integers vpmaddubsw's pairs add up to, in the same lane order. Each group's sums are
 * stored and go through add_dots's fp32 steps, in its order (t = dot * dx; t = scale * t + tot;
 * tot = offset * sx + t), 16 lanes a vector: a row gets the bits tile_gemm.h and decode give it,
 * whatever rows share the call (the batch-invariance rule); Q4_K's form with x per super-block: its
 * K4_SUPER steps (`amx_k4_add_dots`), and from 256 rows a call planes of sc u (`amx_rows_planes`, as
 * Q6_K's). Rows in blocks of 32 (two A tiles) and
 * 16; the last rows (under 16) take gemm_rows. Included by tile_gemv.c where __AMX_INT8__ is set.
 * Linux lends a process the tiles' state only when asked (arch_prctl): where it refuses, every row
 * takes gemm_rows. */
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_ROWS 16          /* rows of x an A tile holds */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Whether this process may use the tiles: asked of the kernel once (the answer is the process's). */
static int amx_permitted(void) {
    static int permitted = -1;
    if (permitted < 0) permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return permitted;
}

/* Whether the AMX path takes a prompt call's sub-tiles: groups of 16, 32 or 64 inputs (one product's
 * K), or whole 32s (32 a product). */
static int amx_takes(int64_t group) {
    return (group == 16 || group == 32 || group == 64 || group % 32 == 0) && amx_permitted();
}

/* Tile 0: A (16 rows of x, `chunk` bytes; 1 unused); 2, 3: B (chunk / 4 rows of 64 bytes); 4-7: the sums. */
static void amx_configure(int64_t chunk) {
    struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = t < 2 ? (uint16_t)chunk : 64;
        cfg.rows[t] = t == 2 || t == 3 ? (uint8_t)(chunk / 4) : AMX_ROWS;
    }
    /* gcc does not count ldtilecfg as a read of cfg: inlined into amx_rows beside its larger frame it
     * dropped the loop's stores as dead, and ldtilecfg faulted on the garbage left there */
    __asm__ __volatile__("" : : "m"(cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* The next tile's codes (and plane) and its scale-zero pairs, taken into L2 a share at a time while a
 * sub-tile's rows multiply on the tiles: a decode call of few rows reads each tile's codes once, from
 * memory, and `prepare` waited on those reads with the tiles idle. Lines of two regions, then `groups`
 * runs of `pair_lines` lines `stride` bytes apart. */
typedef struct {
    const char *at[2], *pairs;
    int64_t lines[2], groups, pair_lines, stride;
} Ahead;

/* Share i of `of` of what `a` names prefetched (an empty Ahead: nothing). */
AI void ahead_share(const Ahead *a, int64_t i, int64_t of) {
    const int64_t codes = a->lines[0] + a->lines[1], total = codes + a->groups * a->pair_lines;
    for (int64_t l = i * total / of; l < (i + 1) * total / of; l++) {
        const char *p = l < a->lines[0] ? a->at[0] + 64 * l
                        : l < codes ? a->at[1] + 64 * (l - a->lines[0])
                        : a->pairs + (l - codes) / a->pair_lines * a->stride + 64 * ((l - codes) % a->pair_lines);
        _mm_prefetch(p, _MM_HINT_T1);
    }
}

/* add_dots' fp32 steps for 16 lanes of a row's exact group sums `dot`, into the sums at `at`:
 * t = dot * dx; t = scale * t + tot; tot = offset * sx + t (`offsets`), the order every path takes. */
AI void add_dot16(__m512i dot, __m512 dx, __m512 scale, __m512 off, __m512 sx, float *at, int offsets) {
    const __m512 t = _mm512_fmadd_ps(scale, _mm512_mul_ps(_mm512_cvtepi32_ps(dot), dx), _mm512_loadu_ps(at));
    _mm512_storeu_ps(at, offsets ? _mm512_fmadd_ps(off, sx, t) : t);
}

/* tot (nb rows x 32 floats) += the fp32 steps of group g for the stored sums dots (nb rows x 32); the
 * last (offset * sum_x) only where `offsets` (add_dots says why leaving it out keeps the bits: Q6_K's
 * 32-row calls are bound by these steps' vector ports, 4 a 16 outputs, now 3). */
AI void amx_add_dots(const Prepared *prep, int64_t g, const QRows *x, const int32_t *dots, float *tot, int nb,
                     int offsets) {
    const __m512 scale0 = _mm512_loadu_ps(prep->scale + g * SUB), scale1 = _mm512_loadu_ps(prep->scale + g * SUB + 16);
    const __m512 off0 = _mm512_loadu_ps(prep->offset + g * SUB), off1 = _mm512_loadu_ps(prep->offset + g * SUB + 16);
    for (int b = 0; b < nb; b++) {
        __m512 dx = _mm512_set1_ps(x->scale[b * x->groups + g]), sx = _mm512_set1_ps(x->sum[b * x->groups + g]);
        float *at = tot + 32 * b;
        add_dot16(_mm512_loadu_si512(dots + 32 * b), dx, scale0, off0, sx, at, offsets);
        add_dot16(_mm512_loadu_si512(dots + 32 * b + 16), dx, scale1, off1, sx, at + 16, offsets);
    }
}

/* Q6_K's form (tile_scales_k6.h): tile_gemm.h's k6_add_dots, 16 lanes a vector (the same operations on
 * each lane, so the same bits), for the stored sums dots (nb rows x 32). */
AI void amx_k6_add_dots(const Prepared *prep, int64_t g, const QRows *x, const int32_t *dots, float *tot, int nb) {
    const int64_t j = g % K6_GROUPS;
    const __m512i sc0 = _mm512_loadu_si512(prep->scale + g * SUB), sc1 = _mm512_loadu_si512(prep->scale + g * SUB + 16);
    for (int b = 0; b < nb; b++) {
        int32_t *acc = prep->acc + 32 * b;
        __m512i s0 = _mm512_mullo_epi32(_mm512_loadu_si512(dots + 32 * b), sc0);
        __m512i s1 = _mm512_mullo_epi32(_mm512_loadu_si512(dots + 32 * b + 16), sc1);
        if (j) {
            s0 = _mm512_add_epi32(s0, _mm512_loadu_si512(acc));
            s1 = _mm512_add_epi32(s1, _mm512_loadu_si512(acc + 16));
        }
        if (j < K6_GROUPS - 1) {
            _mm512_storeu_si512(acc, s0);
            _mm512_storeu_si512(acc + 16, s1);
            continue;
        }
        const float dx = x->scale[b * x->groups + g], *d = prep->offset + g / K6_GROUPS * SUB;
        float *at = tot + 32 * b;
        _mm512_storeu_ps(at, k6_step16(s0, _mm512_loadu_ps(d), dx, _mm512_loadu_ps(at)));
        _mm512_storeu_ps(at + 16, k6_step16(s1, _mm512_loadu_ps(d + 16), dx, _mm512_loadu_ps(at + 16)));
    }
}

/* tile_gemm.h's k4_add_dots on the stored sums dots, 16 lanes a vector (the super-block sums at tot +
 * 32 AMX_ROWS): the same steps in the same order, so the same bits. */
AI void amx_k4_add_dots(const Prepared *prep, int64_t g, const QRows *x, const int32_t *dots, float *tot, int nb) {
    const int64_t q = g % K4_GROUPS, j0 = g - q;
    const __m512 sc0 = _mm512_loadu_ps(prep->scale + g * SUB), sc1 = _mm512_loadu_ps(prep->scale + g * SUB + 16);
    float *sums = tot + 32 * AMX_ROWS;
    for (int b = 0; b < nb; b++) {
        float *sum = sums + 32 * b;
        _mm512_storeu_ps(sum, k4_step16(_mm512_loadu_si512(dots + 32 * b), sc0, _mm512_loadu_ps(sum), q == 0));
        _mm512_storeu_ps(sum + 16, k4_step16(_mm512_loadu_si512(dots + 32 * b + 16), sc1, _mm512_loadu_ps(sum + 16),
                                             q == 0));
    }
    const float *super = prep->offset + j0 * SUB;
    for (int b = 0; q == K4_GROUPS - 1 && b < nb; b++) {
        __m512i qp[K4_GROUPS / 2];
        k4_q_pairs16(x->total + b * x->groups + j0, qp);
        const __m512 dx = _mm512_set1_ps(x->scale[b * x->groups + j0]);
        float *at = tot + 32 * b;
        _mm512_storeu_ps(at, k4_finish16(super, SUB, _mm512_loadu_ps(sums + 32 * b), qp, dx, _mm512_loadu_ps(at)));
        _mm512_storeu_ps(at + 16, k4_finish16(super + 16, SUB, _mm512_loadu_ps(sums + 32 * b + 16), qp, dx,
                                              _mm512_loadu_ps(at + 16)));
    }
}

/* amx_add_dots with `offsets` a constant in each copy (the loop then holds no test); Q4_K's form with x
 * per super-block: amx_k4_add_dots (then tot holds 2 AMX_ROWS x 32 floats). */
AI void amx_add_dots_of(const Prepared *prep, int64_t g, const QRows *x, const int32_t *dots, float *tot, int nb) {
    if (x->k4 == K4_SUPER) amx_k4_add_dots(prep, g, x, dots, tot, nb);
    else if (prep->k6) amx_k6_add_dots(prep, g, x, dots, tot, nb);
    else if (prep->offsets) amx_add_dots(prep, g, x, dots, tot, nb, 1);
    else amx_add_dots(prep, g, x, dots, tot, nb, 0);
}

/* Group g's sums of 16 rows of x (at q8, stride cols) by the sub-tile's codes, `group` inputs in
 * chunks of `chunk`, into tiles 4, 5 (g even) or 6, 7 (g odd); the other pair still holds g - 1's. */
AI void amx_group(const uint8_t *codes, const int8_t *q8, int64_t cols, int64_t g, int64_t group, int64_t chunk,
                  int split) {
    if (g & 1) {
        _tile_zero(6);
        _tile_zero(7);
    } else {
        _tile_zero(4);
        _tile_zero(5);
    }
    for (int64_t k = g * group; k < (g + 1) * group; k += chunk) {
        _tile_loadd(0, q8 + k, cols);
        _tile_loadd(2, codes + k * 32, 128);
        _tile_loadd(3, codes + k * 32 + 64, 128);
        if (split && (g & 1)) {  /* int8 codes q, signed */
            _tile_dpbssd(6, 0, 2);
            _tile_dpbssd(7, 0, 3);
        } else if (split) {
            _tile_dpbssd(4, 0, 2);
            _tile_dpbssd(5, 0, 3);
        } else if (g & 1) {  /* 4-bit codes, unsigned */
            _tile_dpbsud(6, 0, 2);
            _tile_dpbsud(7, 0, 3);
        } else {
            _tile_dpbsud(4, 0, 2);
            _tile_dpbsud(5, 0, 3);
        }
    }
}

/* Group g's sums (tiles 4, 5 or 6, 7) stored in dots (16 rows x 32 int32). */
AI void amx_store(int64_t g, int32_t *dots) {
    if (g & 1) {
        _tile_stored(6, dots, 128);
        _tile_stored(7, dots + 16, 128);
    } else {
        _tile_stored(4, dots, 128);
        _tile_stored(5, dots + 16, 128);
    }
}

/* gemm_rows on the tiles for x's rows in whole 16s; returns how many rows it did (the caller runs
 * gemm_rows on the rest). A group's products are issued before the previous group's fp32 steps, so
 * the tiles multiply while the vector units scale (each alone took as long as the other). */
static int64_t amx_rows(const Prepared *prep, const QRows *x, int64_t rows, int64_t group, int split, uint16_t *out,
                        int64_t n, int64_t s, int64_t h, int fp16, const Ahead *ahead) {
    const int64_t chunk = group <= 64 ? group : 32, done = rows / AMX_ROWS * AMX_ROWS;
    if (!done) return 0;
    int32_t dots[2][AMX_ROWS * 32] __attribute__((aligned(64)));
    float tot[2 * AMX_ROWS * 32] __attribute__((aligned(64)));  /* (the second half: `amx_k4_add_dots`') */
    amx_configure(chunk);
    for (int64_t b0 = 0; b0 < done; b0 += AMX_ROWS) {
        QRows xb = rows_from(x, b0);
        memset(tot, 0, sizeof tot / 2);
        for (int64_t g = 0; g < x->groups; g++) {
            amx_group(prep->codes, xb.q8, x->cols, g, group, chunk, split);
            ahead_share(ahead, b0 / AMX_ROWS * x->groups + g, done / AMX_ROWS * x->groups);
            if (g) amx_add_dots_of(prep, g - 1, &xb, dots[(g - 1) & 1], tot, AMX_ROWS);
            amx_store(g, dots[g & 1]);
        }
        amx_add_dots_of(prep, x->groups - 1, &xb, dots[(x->groups - 1) & 1], tot, AMX_ROWS);
        for (int b = 0; b < AMX_ROWS; b++)
            store_pass(tot + 32 * b, out + (b0 + b) * n + 16 * s, out + (b0 + b) * n + h + 16 * s, fp16);
    }
    _tile_release();
    return done;
}

/* Q6_K's form on the tiles (tile_scales_k6.h): each code times its group's sc, c = sc q (|c| <= 4096),
 * split into bytes c = 256 hi + lo (hi signed, lo unsigned) laid out as the codes are (`amx_k6_planes`),
 * so a super-block's exact sum S = sum of sc q x is 256 S_hi + S_lo: K = 64 a product (where a group's
 * own took K = 16), four tiles summing the whole super-block with no store between its groups, then
 * the super-block's one fp32 step (k6_step16: the bits every other path gives the row). */
#define K6_CHUNK 64  /* inputs a product */

/* The prepared sub-tile's codes (cols inputs: Q6_K's signed q, Q4_K's u in 0..15) times their group's
 * sc (prep->scale in lane order: Q6_K's as int32, groups of 16; Q4_K's as fp32, an integer, groups of
 * 32: `k4`), as the planes' bytes: hi at prep->planes, lo cols * SUB bytes on. A group's sc are
 * spread to its codes' 16-bit lanes once (4 inputs' codes share them), and each product's bytes are
 * its 16-bit lane's: lo the even bytes, hi (c >> 8, signed) the odd ones, two permutes a 64 codes. */
static void amx_k6_planes(const Prepared *prep, int64_t cols, int k4) {
    int16_t order[32];
    uint8_t even[64], odd[64];
    for (int e = 0; e < 32; e++) order[e] = (int16_t)(2 * (e / 4));  /* each lane's sc (int32's low half) 4 times */
    for (int i = 0; i < 64; i++) {
        even[i] = (uint8_t)(2 * i);
        odd[i] = (uint8_t)(2 * i + 1);
    }
    const __m512i idx = _mm512_loadu_si512(order), lo_bytes = _mm512_loadu_si512(even), hi_bytes = _mm512_loadu_si512(odd);
    for (int64_t g = 0; g < cols / 16; g++) {
        __m512i sc[4];
        for (int v = 0; v < 4; v++) {  /* lanes 8v..8v+7: the 32 codes of vector v of each 4 inputs */
            const float *lanes = prep->scale + (k4 ? g / 2 : g) * SUB + 8 * v;  /* (Q4_K: 32 inputs a group) */
            sc[v] = _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(
                k4 ? _mm256_cvttps_epi32(_mm256_loadu_ps(lanes)) : _mm256_loadu_si256((const __m256i *)lanes)));
        }
        for (int64_t k = 16 * g; k < 16 * (g + 1); k += 4)
            for (int v = 0; v < 4; v += 2) {  /* 64 codes: two vectors' */
                const int64_t at = k * 32 + 32 * v;
                __m512i c0 = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(prep->codes + at))), sc[v]);
                __m512i c1 = _mm512_mullo_epi16(
                    _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(prep->codes + at + 32))), sc[v + 1]);
                _mm512_storeu_si512(prep->planes + at, _mm512_permutex2var_epi8(c0, hi_bytes, c1));
                _mm512_storeu_si512(prep->planes + cols * SUB + at, _mm512_permutex2var_epi8(c0, lo_bytes, c1));
            }
    }
}

/* Super-block sb's S_hi (tiles 4, 5) and S_lo (6, 7) of 16 rows of x (at q8, stride cols). */
AI void amx_k6_super(const uint8_t *hi, const uint8_t *lo, const int8_t *q8, int64_t cols, int64_t sb) {
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t k = sb * 256; k < (sb + 1) * 256; k += K6_CHUNK) {
        _tile_loadd(0, q8 + k, cols);
        _tile_loadd(2, hi + k * 32, 128);
        _tile_loadd(3, hi + k * 32 + 64, 128);
        _tile_dpbssd(4, 0, 2);
        _tile_dpbssd(5, 0, 3);
        _tile_loadd(2, lo + k * 32, 128);
        _tile_loadd(3, lo + k * 32 + 64, 128);
        _tile_dpbsud(6, 0, 2);
        _tile_dpbsud(7, 0, 3);
    }
}

/* The stored S_hi, S_lo of super-block sb (16 rows x 32 each, at sums and sums + 512) joined and taken
 * into tot by its one fp32 step. */
AI void amx_k6_step(const Prepared *prep, const QRows *x, const int32_t *sums, int64_t sb, float *tot) {
    const float *d = prep->offset + sb * SUB;
    const __m512 d0 = _mm512_loadu_ps(d), d1 = _mm512_loadu_ps(d + 16);
    for (int b = 0; b < AMX_ROWS; b++) {
        const float dx = x->scale[b * x->groups + sb * K6_GROUPS];
        float *at = tot + 32 * b;
        for (int i = 0; i < 32; i += 16) {
            __m512i h = _mm512_loadu_si512(sums + 32 * b + i), l = _mm512_loadu_si512(sums + 512 + 32 * b + i);
            __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(h, 8), l);
            _mm512_storeu_ps(at + i, k6_step16(sum, i ? d1 : d0, dx, _mm512_loadu_ps(at + i)));
        }
    }
}

#include "tile_gemm_amx_k4.h"  /* Q4_K's form from 256 rows: planes of sc u, as Q6_K's */

/* A super-block's step of the planes' forms: Q4_K's (fit: its rows' `k4_fit_rows` flags) or Q6_K's. */
AI void planes_step(const Prepared *prep, const QRows *xb, const int32_t *sums, int64_t sb, float *tot,
                    const uint8_t *fit) {
    if (fit) amx_k4_step(prep, xb, sums, sb, tot, fit);
    else amx_k6_step(prep, xb, sums, sb, tot);
}

/* amx_rows for the planes' forms, Q6_K's (fits NULL) or Q4_K's (fits: `k4_fit_rows`' flags of x's rows):
 * x's rows in whole 16s, a super-block's products issued before the previous super-block's step (as
 * amx_rows does a group's); returns how many rows it did. */
static int64_t amx_rows_planes(const Prepared *prep, const QRows *x, int64_t rows, uint16_t *out, int64_t n,
                               int64_t s, int64_t h, int fp16, const Ahead *ahead, const uint8_t *fits) {
    const int64_t done = rows / AMX_ROWS * AMX_ROWS, supers = x->cols / 256;
    int32_t sums[2][2 * AMX_ROWS * 32] __attribute__((aligned(64)));
    float tot[AMX_ROWS * 32] __attribute__((aligned(64)));
    if (!done) return 0;
    amx_k6_planes(prep, x->cols, fits != NULL);
    const uint8_t *hi = prep->planes, *lo = prep->planes + x->cols * SUB;
    amx_configure(K6_CHUNK);
    for (int64_t b0 = 0; b0 < done; b0 += AMX_ROWS) {
        QRows xb = rows_from(x, b0);
        const uint8_t *fit = fits ? fits + b0 * supers : NULL;
        memset(tot, 0, sizeof tot);
        for (int64_t sb = 0; sb < supers; sb++) {
            amx_k6_super(hi, lo, xb.q8, x->cols, sb);
            ahead_share(ahead, b0 / AMX_ROWS * supers + sb, done / AMX_ROWS * supers);
            if (sb) planes_step(prep, &xb, sums[(sb - 1) & 1], sb - 1, tot, fit);
            _tile_stored(4, sums[sb & 1], 128);
            _tile_stored(5, sums[sb & 1] + 16, 128);
            _tile_stored(6, sums[sb & 1] + 512, 128);
            _tile_stored(7, sums[sb & 1] + 512 + 16, 128);
        }
        planes_step(prep, &xb, sums[(supers - 1) & 1], supers - 1, tot, fit);
        for (int b = 0; b < AMX_ROWS; b++)
            store_pass(tot + 32 * b, out + (b0 + b) * n + 16 * s, out + (b0 + b) * n + h + 16 * s, fp16);
    }
    _tile_release();
    return done;
}

/* 16-bit x (an output head's decode rows) on the tiles. Each code x16 = 256 hi + lo (hi signed, lo
 * unsigned bytes), so a group's exact sum of x16 times the codes is 256 S_hi + S_lo, two int8 tile
 * products (int32 adds wrap, and the sum itself fits: |x16| <= 32767, codes u = q + 128 <= 255 and
 * groups <= 256 inputs keep |sum u x16| < 2^31, the per-row path's own bound). An int8 split's sums
 * are of q, so 128 * sum(x16) turns them into decode's sums of u; then decode's fp32 steps (its
 * offset, zero - 136 scale, rounded once: `Prepared.wide`), so a row's bits are those of the
 * per-row path (tile_gemv_avx512.h), whatever rows share the call. Rows come in whole 16s. */
#define AMX16_FROM_ROWS AMX_ROWS  /* from here the tiles take a 16-bit-x call's rows in whole 16s */

/* Group g's S_hi (tiles 4, 5) and S_lo (6, 7) of 16 rows of x (bytes hi and lo, stride cols). */
AI void amx_group16(const uint8_t *codes, const int8_t *hi, const uint8_t *lo, int64_t cols, int64_t g,
                    int64_t group, int64_t chunk, int split) {
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t k = g * group; k < (g + 1) * group; k += chunk) {
        _tile_loadd(0, hi + k, cols);
        _tile_loadd(1, lo + k, cols);
        _tile_loadd(2, codes + k * 32, 128);
        _tile_loadd(3, codes + k * 32 + 64, 128);
        if (split) {  /* int8 codes q, signed */
            _tile_dpbssd(4, 0, 2);
            _tile_dpbssd(5, 0, 3);
            _tile_dpbusd(6, 1, 2);
            _tile_dpbusd(7, 1, 3);
        } else {  /* 4-bit codes, unsigned */
            _tile_dpbsud(4, 0, 2);
            _tile_dpbsud(5, 0, 3);
            _tile_dpbuud(6, 1, 2);
            _tile_dpbuud(7, 1, 3);
        }
    }
}

/* The stored S_hi, S_lo (16 rows x 32 each, at sums and sums + 512) joined as decode's group sums (an
 * int8 split's plus 128 sum(x16): of u), then add_dots' steps (`add_dot16`) (16-bit x takes no others) in one
 * pass, the joined sums in registers where they were stored and loaded again: the same integers and
 * fp32 steps, so the same bits, with the stores the head's calls were bound by left out. */
AI void amx_join_add16(const Prepared *prep, int64_t g, const QRows *x, const int32_t *sums, float *tot, int split,
                       int offsets) {
    const __m512 scale[2] = {_mm512_loadu_ps(prep->scale + g * SUB), _mm512_loadu_ps(prep->scale + g * SUB + 16)};
    const __m512 off[2] = {_mm512_loadu_ps(prep->offset + g * SUB), _mm512_loadu_ps(prep->offset + g * SUB + 16)};
    for (int b = 0; b < AMX_ROWS; b++) {
        const __m512i shift = _mm512_set1_epi32(split ? 128 * x->total[b * x->groups + g] : 0);
        const __m512 dx = _mm512_set1_ps(x->scale[b * x->groups + g]), sx = _mm512_set1_ps(x->sum[b * x->groups + g]);
        for (int i = 0; i < 2; i++) {
            __m512i h = _mm512_loadu_si512(sums + 32 * b + 16 * i), l = _mm512_loadu_si512(sums + 512 + 32 * b + 16 * i);
            __m512i dot = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l), shift);
            add_dot16(dot, dx, scale[i], off[i], sx, tot + 32 * b + 16 * i, offsets);
        }
    }
}

/* amx_join_add16 with `offsets` a constant in each copy (the loop then holds no test). */
AI void amx_join_add16_of(const Prepared *prep, int64_t g, const QRows *x, const int32_t *sums, float *tot, int split) {
    if (prep->offsets) amx_join_add16(prep, g, x, sums, tot, split, 1);
    else amx_join_add16(prep, g, x, sums, tot, split, 0);
}

/* amx_rows for 16-bit x (q8: the codes' high bytes, lo8: their low ones), rows in whole 16s; a group's
 * products issued before the previous group's fp32 steps, as amx_rows does. */
static int64_t amx_rows16(const Prepared *prep, const QRows *x, int64_t rows, int64_t group, int split, uint16_t *out,
                          int64_t n, int64_t s, int64_t h, int fp16, const Ahead *ahead) {
    const int64_t chunk = group <= 64 ? group : 32, done = rows / AMX_ROWS * AMX_ROWS;
    int32_t sums[2][2 * AMX_ROWS * 32] __attribute__((aligned(64)));
    float tot[AMX_ROWS * 32] __attribute__((aligned(64)));
    if (!done) return 0;
    amx_configure(chunk);
    for (int64_t b0 = 0; b0 < done; b0 += AMX_ROWS) {
        QRows xb = rows_from(x, b0);
        memset(tot, 0, sizeof tot);
        for (int64_t g = 0; g < x->groups; g++) {
            amx_group16(prep->codes, xb.q8, xb.lo8, x->cols, g, group, chunk, split);
            ahead_share(ahead, b0 / AMX_ROWS * x->groups + g, done / AMX_ROWS * x->groups);
            if (g) amx_join_add16_of(prep, g - 1, &xb, sums[(g - 1) & 1], tot, split);
            _tile_stored(4, sums[g & 1], 128);
            _tile_stored(5, sums[g & 1] + 16, 128);
            _tile_stored(6, sums[g & 1] + 512, 128);
            _tile_stored(7, sums[g & 1] + 512 + 16, 128);
        }
        amx_join_add16_of(prep, x->groups - 1, &xb, sums[(x->groups - 1) & 1], tot, split);
        for (int b = 0; b < AMX_ROWS; b++)
            store_pass(tot + 32 * b, out + (b0 + b) * n + 16 * s, out + (b0 + b) * n + h + 16 * s, fp16);
    }
    _tile_release();
    return done;
}

/* A decode call's 16-bit x (xr: its codes, q16) by the tiles for its first rows in whole 16s, where
 * the tiles take the weight: returns how many rows it did (0: none; the caller runs the per-row path
 * on the rest), or -1 where it could not get memory. */
static int64_t amx16_lead(const uint8_t *codes, const uint8_t *plane, const uint16_t *scale_zero, const QRows *xr,
                          uint16_t *out, int64_t n, int64_t rows, int64_t group, int64_t tile, int fp16, int kind,
                          int threads) {
    const int64_t done = rows / AMX_ROWS * AMX_ROWS, values = done * xr->cols;
    if (rows < AMX16_FROM_ROWS || !gemm_takes(tile, group, kind) || !amx_takes(group)) return 0;
    uint8_t *bytes = malloc((size_t)(2 * values) + 64);
    if (!bytes) return -1;
    for (int64_t i = 0; i < values; i++) {  /* x16 = 256 hi + lo */
        bytes[i] = (uint8_t)((uint16_t)xr->q16[i] >> 8);
        bytes[values + i] = (uint8_t)xr->q16[i];
    }
    QRows halves = *xr;
    halves.q8 = (const int8_t *)bytes;
    halves.q16 = NULL;
    halves.lo8 = bytes + values;
    int status = gemm_codes(codes, plane, scale_zero, &halves, out, n, done, group, tile, fp16, kind, 1, threads);
    free(bytes);
    return status ? -1 : done;
}
