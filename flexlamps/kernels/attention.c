/* Attention for bf16 or fp16 queries, keys and values, grouped-query heads: a
 * decode step (one query a row) or a prompt chunk. For each (row, kv head, query position) the
 * group's queries are scored
 * against every visible key in fp32; exp(score - max) in fp32 is rounded to the activations'
 * dtype (the largest weight is exactly 1), multiplied by the values with fp32 sums, divided by
 * the weights' sum and rounded once: the arithmetic of torch's flash kernel in that dtype
 * (models/blocks/attention.py). One task reads its
 * keys and values once for all the heads of its group, and a task's result depends on nothing
 * but its own query, keys, values and mask: not on the other rows, the thread count or the
 * split of the work.
 *
 * Shapes (elements; the last dim of every tensor contiguous):
 *   q (n, heads, t, d), keys and values (n, kv_heads, span, d), mask (n, t, span) (1: attend),
 *   out (n, heads, t, d) contiguous; heads = kv_heads * group, d a multiple of 16, at most 256.
 * strides: q's (row, head, position), keys' (row, head, position), values' likewise, mask's
 * (row, query, key). Keys after a query's last visible one are not read (a causal prompt reads
 * half); a query that sees no key gets zeros.
 * Built and loaded by flexlamps/kernels/attention.py. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "native_simd.h"
#include "pool_hook.h"  /* the threads: tile_gemv's claim pool */

#define MAX_D 256
#define MAX_GROUP 16

AI vf load_vec(const uint16_t *p, int fp16) { return load_halves(p, fp16, ALL_LANES); }

/* exp(x) for x <= 0 (scores minus their max); below -87.3 exactly 0. */
AI vf exp_nonpositive(vf x) { return vf_keep(vf_ge(x, vf_set1(-87.3f)), exp_poly(x)); }

typedef struct {
    const uint16_t *q, *k, *v; const uint8_t *mask; uint16_t *out;
    int64_t heads, kv_heads, span, d, t; const int64_t *st; float scale; int fp16, bf16_dot;
    /* per task: its queries, its mask row and its outputs at their position, and each query's
     * sum of weights; `span` is cut after its last visible key */
    const uint16_t *qt; const uint8_t *mt; uint16_t *ot; float sums[MAX_GROUP];
    /* a prompt block's keys and values of its (row, kv head) in fp32, made once for its queries
     * (`block_task`; rows of d, zeros past the span), or NULL: converted as they are read */
    const float *kf, *vf;
} Args;

/* VW vectors' horizontal sums as one vector, in order: pairs are added after unpacking, a level at a
 * time; the first two levels make each 4 keys' sums (`quad_sums`), the rest join the quads. */
#ifdef __AVX512F__
#define QUADS 4
AI vf quad_sums(const vf *a) {
    __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    __m512d s = _mm512_castps_pd(t0), r = _mm512_castps_pd(t1);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(s, r)), _mm512_castpd_ps(_mm512_unpackhi_pd(s, r)));
}

AI vf join_quads(const vf *u) {
    __m512 v[2];
    for (int w = 0; w < 2; w++)
        v[w] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * w], u[2 * w + 1], 0x88), _mm512_shuffle_f32x4(u[2 * w], u[2 * w + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88), _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
}
#else
#define QUADS 2
AI vf quad_sums(const vf *a) {
    vf t0 = _mm256_add_ps(_mm256_unpacklo_ps(a[0], a[1]), _mm256_unpackhi_ps(a[0], a[1]));
    vf t1 = _mm256_add_ps(_mm256_unpacklo_ps(a[2], a[3]), _mm256_unpackhi_ps(a[2], a[3]));
    __m256d s = _mm256_castps_pd(t0), r = _mm256_castps_pd(t1);
    return _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(s, r)), _mm256_castpd_ps(_mm256_unpackhi_pd(s, r)));
}

AI vf join_quads(const vf *u) {
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}
#endif

AI vf sums_vw(vf *a) {
    vf u[QUADS];
    for (int q = 0; q < QUADS; q++) u[q] = quad_sums(a + 4 * q);
    return join_quads(u);
}

/* Which of keys j0..j0+count-1 the row attends to, as a lane mask. */
AI vmask visible(const Args *a, const uint8_t *mask, int64_t j0, int count) {
#ifdef __AVX512F__
    if (a->st[11] == 1 && count == 16)
        return _mm_test_epi8_mask(_mm_loadu_si128((const __m128i *)(mask + j0)), _mm_set1_epi8(-1));
    __mmask16 m = 0;
    for (int j = 0; j < count; j++) m |= (__mmask16)((mask[(j0 + j) * a->st[11]] != 0) << j);
    return m;
#else
    int m = 0;
    for (int j = 0; j < count; j++) m |= (mask[(j0 + j) * a->st[11]] != 0) << j;
    return vmask_from_bits(m);
#endif
}

#define TILE_GROUP 3  /* queries a key row loaded serves in `tile_sums` (3 x 4 sums in registers) */

/* VW keys as `tile_sums` reads them: fp32 rows (`f`) or the cache's 16-bit rows (`h`), `stride` apart. */
typedef struct { const float *f; const uint16_t *h; int64_t stride; } KeyRows;
enum { KEYS_FP32, KEYS_BF16, KEYS_FP16 };

/* Key j's elements c..c+VW-1 in fp32 (`kind` a constant where inlined: no branch a chunk). */
AI vf key_chunk(KeyRows keys, const int kind, int64_t j, int64_t c) {
    return kind == KEYS_FP32 ? vf_load(keys.f + j * keys.stride + c) : load_vec(keys.h + j * keys.stride + c, kind == KEYS_FP16);
}

/* Queries qf[0..G-1]'s dot products with VW keys as one vector each (`out`), 4 keys x G queries at a
 * time so each key chunk loaded (and converted) serves G queries; G and kind constants where
 * inlined. Each sum takes its own key's steps (a product, then multiply-adds chunk by chunk, then
 * `sums_vw`'s levels), so the tiling changes no bit. */
AI void tile_sums(const float *qf, KeyRows keys, const int kind, int64_t d, vf *out, const int G) {
    vf u[TILE_GROUP][QUADS];
    for (int quad = 0; quad < QUADS; quad++) {
        vf acc[TILE_GROUP * 4];
        for (int j = 0; j < 4; j++) {
            vf kc = key_chunk(keys, kind, 4 * quad + j, 0);
            for (int g = 0; g < G; g++) acc[g * 4 + j] = vf_mul(vf_load(qf + g * d), kc);
        }
        for (int64_t c = VW; c < d; c += VW) {
            vf qc[TILE_GROUP];
            for (int g = 0; g < G; g++) qc[g] = vf_load(qf + g * d + c);
            for (int j = 0; j < 4; j++) {
                vf kc = key_chunk(keys, kind, 4 * quad + j, c);
                for (int g = 0; g < G; g++) acc[g * 4 + j] = vf_fmadd(qc[g], kc, acc[g * 4 + j]);
            }
        }
        for (int g = 0; g < G; g++) u[g][quad] = quad_sums(acc + g * 4);
    }
    for (int g = 0; g < G; g++) out[g] = join_quads(u[g]);
}

/* tile_sums with its queries and key kind constants in each copy. */
static void tile_sums_of(const float *qf, KeyRows keys, int kind, int64_t d, vf *out, int queries) {
#define TILE(G, K) if (queries == G && kind == K) { tile_sums(qf, keys, K, d, out, G); return; }
#define TILES(G) TILE(G, KEYS_FP32) TILE(G, KEYS_BF16) TILE(G, KEYS_FP16)
    TILES(1) TILES(2) TILES(3)
#undef TILES
#undef TILE
}

/* VW keys from j0 as `tile_sums` reads them: a prompt block's fp32 rows (`kf`: zeros past the span),
 * the cache's rows where all VW are there, else the `count` there converted into `kb` and zeros. */
static int key_rows(const Args *a, const uint16_t *keys, int64_t j0, int count, float *kb, KeyRows *rows) {
    if (a->kf) {
        *rows = (KeyRows){a->kf + j0 * a->d, NULL, a->d};
        return KEYS_FP32;
    }
    if (count == VW) {
        *rows = (KeyRows){NULL, keys + j0 * a->st[5], a->st[5]};
        return a->fp16 ? KEYS_FP16 : KEYS_BF16;
    }
    for (int j = 0; j < VW; j++)
        for (int64_t c = 0; c < a->d; c += VW)
            vf_store(kb + j * a->d + c, j < count ? load_vec(keys + (j0 + j) * a->st[5] + c, a->fp16) : vf_zero());
    *rows = (KeyRows){kb, NULL, a->d};
    return KEYS_FP32;
}

/* The group's scores against every key, scaled; masked keys get -inf. Each tile of queries reads
 * VW keys (`key_rows`) at a time. */
static void scores(const Args *a, int64_t row, int64_t kvh, const float *qf, int group, float *sc, float *kb) {
    const uint16_t *keys = a->k + row * a->st[3] + kvh * a->st[4];
    const int64_t d = a->d;
    const vf scale = vf_set1(a->scale), ninf = vf_set1(-INFINITY);
    for (int64_t j0 = 0; j0 < a->span; j0 += VW) {
        int count = a->span - j0 < VW ? (int)(a->span - j0) : VW;
        KeyRows rows;
        int kind = key_rows(a, keys, j0, count, kb, &rows);
        vmask vis = visible(a, a->mt, j0, count);
        for (int g0 = 0; g0 < group; g0 += TILE_GROUP) {
            int queries = group - g0 < TILE_GROUP ? group - g0 : TILE_GROUP;
            vf sums[TILE_GROUP];
            tile_sums_of(qf + g0 * d, rows, kind, d, sums, queries);
            for (int g = 0; g < queries; g++) {
                vf s = vf_select(vis, vf_mul(sums[g], scale), ninf);
                float *to = sc + (g0 + g) * a->span + j0;
                if (count == VW) vf_store(to, s);  /* (a masked store is slow on some CPUs) */
                else vf_store_lanes(to, lanes(count), s);
            }
        }
    }
}

#define EXPS_AT_ONCE 4  /* vectors of scores `weights_in` exponentiates side by side */

/* One query's scores -> weights in place: e_j = exp(s_j - max) rounded to the dtype (the
 * largest is exactly 1, as in torch's flash kernel, so the key that dominates adds no rounding);
 * returns their sum, by which the weighted values are divided once. */
AI float weights_in(float *sc, int64_t span, const int fp16) {
    vf mx = vf_set1(-INFINITY);
    int64_t j = 0;
    for (; j + VW <= span; j += VW) mx = vf_max(mx, vf_load(sc + j));
    float m = vf_hmax(mx);
    for (; j < span; j++) m = sc[j] > m ? sc[j] : m;
    vf vm = vf_set1(m), sum = vf_zero();
    /* whole vectors side by side (exp's chain is long: one at a time left the core waiting on
     * it), added to the sum in order: the same bits */
    for (j = 0; j + EXPS_AT_ONCE * VW <= span; j += EXPS_AT_ONCE * VW) {
        vf e[EXPS_AT_ONCE];
        for (int u = 0; u < EXPS_AT_ONCE; u++)
            e[u] = rounded(exp_nonpositive(vf_sub(vf_load(sc + j + u * VW), vm)), fp16);
        for (int u = 0; u < EXPS_AT_ONCE; u++) {
            vf_store(sc + j + u * VW, e[u]);
            sum = vf_add(sum, e[u]);
        }
    }
    for (; j + VW <= span; j += VW) {
        vf e = rounded(exp_nonpositive(vf_sub(vf_load(sc + j), vm)), fp16);
        vf_store(sc + j, e);
        sum = vf_add(sum, e);
    }
    if (j < span) {  /* the partial last vector, unmasked loads and stores (masked ones are slow on AMD): its
                      * lanes past the span (the next query's scores, or `task`'s spare floats) written back as read */
        vmask part = lanes(span - j);
        vf x = vf_load(sc + j), e = vf_keep(part, rounded(exp_nonpositive(vf_sub(x, vm)), fp16));
        vf_store(sc + j, vf_select(part, e, x));
        sum = vf_add(sum, e);
    }
    return vf_sum(sum);
}

/* weights_in with the dtype a constant in each copy (no branch a vector). */
static float weights(float *sc, int64_t span, int fp16) {
    return fp16 ? weights_in(sc, span, 1) : weights_in(sc, span, 0);
}

/* The weighted sum x of query g, chunk c, divided by the weights' sum and rounded once. */
AI void store_rounded(const Args *a, int64_t row, int64_t kvh, int group, int g, int64_t c, vf x) {
    uint16_t *out = a->ot + (kvh * group + g) * a->t * a->d + VW * c;
    x = vf_div(x, vf_set1(a->sums[g]));
    store_halves(out, x, a->fp16, ALL_LANES);
}

/* Value j's chunk c in fp32: from `vf` where a prompt block made it, else converted here. */
AI vf value_at(const Args *a, const uint16_t *values, int64_t j, int64_t c) {
    return a->vf ? vf_load(a->vf + j * a->d + VW * c) : load_vec(values + j * a->st[8] + VW * c, a->fp16);
}

#ifdef __AVX512F__
/* Bit i set where p[i] is not 0 (NaN counts as not 0, as `p == 0.0f` is false for it). */
AI int nonzero_lanes(const float *p) { return (int)_mm512_cmp_ps_mask(vf_load(p), vf_zero(), _CMP_NEQ_UQ); }
#define EVERY_LANE 0xFFFF
/* queries of a tile of 4, 2 or 1 chunks: its sums, a broadcast each and a value in 32 registers */
#define TILE_QUERIES(chunks) ((chunks) == 4 ? 5 : 6)
#else
AI int nonzero_lanes(const float *p) { return _mm256_movemask_ps(_mm256_cmp_ps(vf_load(p), vf_zero(), _CMP_NEQ_UQ)); }
#define EVERY_LANE 0xFF
/* queries of a tile of 4, 2 or 1 chunks: its sums, a broadcast each and a value in 16 registers */
#define TILE_QUERIES(chunks) ((chunks) == 4 ? 3 : (chunks) == 2 ? 5 : 6)
#endif

/* Outputs of queries g0..g0+G-1, chunks c0..c0+C-1 (a tile whose sums stay in registers; G, C
 * constants where inlined) = probabilities @ values: fp32 sums over the keys in order, divided and
 * rounded once. A probability of exactly 0 (a masked key, or one rounded to 0) adds exactly 0 and
 * is skipped: VW keys whose G x VW probabilities are all nonzero (nearly every visible block) take
 * their multiply-adds after one vector test, others each nonzero one's. Every output's sum takes
 * the same steps in the same order whatever the tile, so the tiling changes no bit. */
AI void values_tile(const Args *a, int64_t row, int64_t kvh, const float *pr, int group, int g0, int64_t c0,
                    const int G, const int C) {
    const uint16_t *values = a->v + row * a->st[6] + kvh * a->st[7];
    const int64_t span = a->span;
    const float *p = pr + g0 * span;
    vf acc[6 * 4];  /* G x C: fixed sizes (a variable-length array stays in memory after inlining) */
    for (int i = 0; i < G * C; i++) acc[i] = vf_zero();
    for (int64_t j0 = 0; j0 < span; j0 += VW) {
        int64_t end = span - j0 < VW ? span : j0 + VW;
        int live = end - j0 == VW ? EVERY_LANE : 0;
        for (int g = 0; g < G && live == EVERY_LANE; g++) live &= nonzero_lanes(p + g * span + j0);
        if (live == EVERY_LANE) {
            for (int64_t j = j0; j < end; j++) {
                vf vp[6];
                for (int g = 0; g < G; g++) vp[g] = vf_set1(p[g * span + j]);
                for (int c = 0; c < C; c++) {
                    vf v = value_at(a, values, j, c0 + c);
                    for (int g = 0; g < G; g++) acc[g * C + c] = vf_fmadd(vp[g], v, acc[g * C + c]);
                }
            }
            continue;
        }
        for (int64_t j = j0; j < end; j++)
            for (int g = 0; g < G; g++) {
                if (p[g * span + j] == 0.0f) continue;
                vf vp = vf_set1(p[g * span + j]);
                for (int c = 0; c < C; c++) acc[g * C + c] = vf_fmadd(vp, value_at(a, values, j, c0 + c), acc[g * C + c]);
            }
    }
    for (int g = 0; g < G; g++)
        for (int c = 0; c < C; c++) store_rounded(a, row, kvh, group, g0 + g, c0 + c, acc[g * C + c]);
}

/* values_tile with its shape a constant in each copy. */
static void values_tile_of(const Args *a, int64_t row, int64_t kvh, const float *pr, int group, int g0, int64_t c0,
                           int queries, int chunks) {
#define TILE(G, C) if (queries == G && chunks == C) { values_tile(a, row, kvh, pr, group, g0, c0, G, C); return; }
#define TILES(C) TILE(1, C) TILE(2, C) TILE(3, C) TILE(4, C) TILE(5, C) TILE(6, C)
    TILES(1) TILES(2) TILES(4)
#undef TILES
#undef TILE
}

/* out rows of the group = probabilities @ values, a register tile of queries x chunks at a time
 * (each tile reads the keys' probabilities and its chunks of the values: L1 for a block's keys). */
static void weighted_values(const Args *a, int64_t row, int64_t kvh, int group, const float *pr) {
    const int64_t chunks = a->d / VW;
    const int per_tile = chunks % 4 == 0 ? 4 : chunks % 2 == 0 ? 2 : 1, most = TILE_QUERIES(per_tile);
    for (int g0 = 0; g0 < group; g0 += most)
        for (int64_t c0 = 0; c0 < chunks; c0 += per_tile)
            values_tile_of(a, row, kvh, pr, group, g0, c0, group - g0 < most ? group - g0 : most, per_tile);
}

#ifdef __AVX512F__
#include "attention_bf16_avx512.h"  /* scores_bf16, weighted_values_bf16 */
#endif

/* The queries of kv head `kvh`'s group at position `pos` of row `row`. */
static int task(const Args *shared, int64_t row, int64_t kvh, int64_t pos) {
    Args own = *shared, *a = &own;
    int group = (int)(a->heads / a->kv_heads);
    a->qt = a->q + row * a->st[0] + pos * a->st[2];
    a->mt = a->mask + row * a->st[9] + pos * a->st[10];
    a->ot = a->out + (row * a->heads * a->t + pos) * a->d;
    while (a->span > 0 && !a->mt[(a->span - 1) * a->st[11]]) a->span--;  /* a causal row's later keys */
    if (a->span == 0) {  /* no key to attend to: zeros, not 0/0 */
        for (int g = 0; g < group; g++) a->sums[g] = 1.0f;
        for (int g = 0; g < group; g++)
            for (int64_t c = 0; c < a->d / VW; c++) store_rounded(a, row, kvh, group, g, c, vf_zero());
        return 0;
    }
    float qf[MAX_GROUP * MAX_D], kb[VW * MAX_D];
    float *sc = malloc(sizeof(float) * (size_t)(group * a->span + 16));  /* + a block's tail */
    if (!sc) return 1;
    for (int g = 0; g < group; g++) {
        const uint16_t *q = a->qt + (kvh * group + g) * a->st[1];
        for (int64_t c = 0; c < a->d / VW; c++) vf_store(qf + g * a->d + VW * c, load_vec(q + VW * c, a->fp16));
    }
#ifdef __AVX512F__
    int bf16_dot = a->bf16_dot && !a->fp16 && a->d % 32 == 0;
    if (bf16_dot) scores_bf16(a, row, kvh, group, sc);
    else scores(a, row, kvh, qf, group, sc, kb);
    for (int g = 0; g < group; g++) a->sums[g] = weights(sc + g * a->span, a->span, a->fp16);
    if (!(bf16_dot && weighted_values_bf16(a, row, kvh, group, sc))) weighted_values(a, row, kvh, group, sc);
#else  /* vdpbf16ps is AVX-512's: the fp32 paths */
    scores(a, row, kvh, qf, group, sc, kb);
    for (int g = 0; g < group; g++) a->sums[g] = weights(sc + g * a->span, a->span, a->fp16);
    weighted_values(a, row, kvh, group, sc);
#endif
    free(sc);
    return 0;
}

/* Keys or values 0..span-1 of a (row, kv head) (position stride `stride`) as fp32 rows of d, then
 * VW rows of zeros. */
static void to_floats(const uint16_t *src, int64_t stride, int64_t span, int64_t d, int fp16, float *dst) {
    for (int64_t j = 0; j < span; j++)
        for (int64_t c = 0; c < d; c += VW) vf_store(dst + j * d + c, load_vec(src + j * stride + c, fp16));
    memset(dst + span * d, 0, sizeof(float) * (size_t)(VW * d));
}

/* Queries pos0..pos0+count-1 of kv head `kvh`'s group in row `row`: their keys and values converted to
 * fp32 once for all of them (a prompt chunk's queries read the same keys), then each query as `task`
 * computes it (the same values, so the same bits). The bf16 dot paths read the keys as they are. */
static int block_task(const Args *shared, int64_t row, int64_t kvh, int64_t pos0, int64_t count) {
    Args own = *shared;
    int64_t span = 0;
    for (int64_t p = pos0; p < pos0 + count; p++) {  /* the block's last key any query sees */
        const uint8_t *m = own.mask + row * own.st[9] + p * own.st[10];
        for (int64_t j = own.span; j > span; j--)
            if (m[(j - 1) * own.st[11]]) { span = j; break; }
    }
    float *buf = NULL;
    if (span > 0 && !(own.bf16_dot && !own.fp16 && own.d % 32 == 0)) {
        buf = malloc(sizeof(float) * (size_t)(2 * (span + VW) * own.d));
        if (!buf) return 1;
        to_floats(own.k + row * own.st[3] + kvh * own.st[4], own.st[5], span, own.d, own.fp16, buf);
        float *values = buf + (span + VW) * own.d;
        to_floats(own.v + row * own.st[6] + kvh * own.st[7], own.st[8], span, own.d, own.fp16, values);
        own.kf = buf;
        own.vf = values;
    }
    int failed = 0;
    for (int64_t p = pos0; p < pos0 + count && !failed; p++) failed = task(&own, row, kvh, p);
    free(buf);
    return failed;
}

/* A prompt chunk's queries per task: keys converted once for that many queries. */
#define QUERY_BLOCK 16

/* A call's tasks, for the threads' chunks (`attention_chunk`): chunk c runs tasks c * per ..; a
 * decode task is a (row, kv head), a prompt chunk's a (row, kv head, block of QUERY_BLOCK queries). */
typedef struct {
    const Args *a;
    int64_t tasks, blocks, per;
    _Atomic int failed;
} Call;

static void attention_chunk(void *ctx, int64_t c, int slot) {
    Call *call = ctx;
    const Args *a = call->a;
    const int64_t blocks = call->blocks;
    int64_t first, end = chunk_range(c, call->per, call->tasks, &first);
    int failed = 0;
    (void)slot;
    for (int64_t i = first; i < end; i++) {
        if (a->t == 1) {
            failed |= task(a, i / a->kv_heads, i % a->kv_heads, 0);
        } else {
            int64_t block = i % blocks, first = block * QUERY_BLOCK;
            failed |= block_task(a, i / (a->kv_heads * blocks), (i / blocks) % a->kv_heads, first,
                                 a->t - first < QUERY_BLOCK ? a->t - first : QUERY_BLOCK);
        }
    }
    if (failed) atomic_store(&call->failed, 1);
}

/* Returns 0, or 1 for shapes it does not take (nothing written) or a failed allocation. */
int flexlamps_attention(const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint8_t *mask,
                               uint16_t *out, int64_t n, int64_t heads, int64_t kv_heads, int64_t t, int64_t span,
                               int64_t d, const int64_t *strides, float scale, int fp16, int bf16_dot, int threads) {
    if (d % 16 || d > MAX_D || kv_heads < 1 || heads % kv_heads || heads / kv_heads > MAX_GROUP || span < 1 || t < 1)
        return 1;
    Args a = {q, k, v, mask, out, heads, kv_heads, span, d, t, strides, scale, fp16, bf16_dot, 0, 0, 0, {0}, 0, 0};
    const int64_t blocks = (t + QUERY_BLOCK - 1) / QUERY_BLOCK, tasks = t > 1 ? n * kv_heads * blocks : n * kv_heads;
    Call call = {&a, tasks, blocks, tasks, 0};
    /* a task is 1-40 us a query: below a few per thread one thread runs them all; a row's query
     * blocks are neighbouring tasks, which read the same keys */
    run_split(threads, threads > 1 && tasks >= 4 * threads, tasks, &call.per, attention_chunk, &call);
    return atomic_load(&call.failed);
}
