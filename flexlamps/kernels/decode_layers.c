/* Every decoder layer of one step in one call (a decode step, one token a row, or a prompt chunk:
 * the products by phase, as the weight kinds choose): the LLaMA layer the Python forward runs
 * (models/blocks/decoder.py) on 4-bit / int8 codes in bf16, with the same kernels in the same
 * order on the same values, so the same bits:
 *   h = rms_norm(x); qkv = h @ Wqkv; q, k rotated (rope, half-split); k, v written to the cache;
 *   a = attention(q, cache); x = round(a @ Wo + x); h = rms_norm(x); g = silu_mul(h @ Wgu);
 *   x = round(g @ Wd + x)
 * The products, norms, SwiGLU and attention are the other kernels' own functions, handed over
 * as pointers (`Kernels`), so this file adds only what the forward did in torch's ops: the
 * rotation (x * cos + swap(x) * signed_sin, each product and the sum rounded to the dtype, as
 * torch's bf16 ops round them), the cache writes (copies) and the residual adds (fp32 sum,
 * rounded once). What it saves is the Python between the ~10 kernel calls of each layer
 * (flexlamps/models/blocks/native_decode.py). Rows are independent: a row's arithmetic is the
 * row's alone, as in the kernels it calls. Built and loaded by flexlamps/kernels/decode_layers.py. */
#include <stdlib.h>
#include <string.h>

#include "native_simd.h"
#include "pool_hook.h"  /* the threads of this file's passes: tile_gemv's claim pool */

/* The other kernels' signatures, as their sources declare them: a change there must be made here too
 * (tests/unit/test_native_decode.py compares the loop's bits with the Python forward's, which calls them
 * through ctypes with their declared arguments). */
typedef int (*gemv_fn)(const void *, const void *, const void *, const uint16_t *, uint16_t *, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int, int, int, int);
typedef int (*gemm_fn)(const void *, const void *, const void *, const uint16_t *, uint16_t *, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int, int, int);
typedef struct {  /* one weight of a group of products that read the same x (tile_gemv.c's GemvPart) */
    const void *codes, *plane, *scale_zero;
    uint16_t *out;
    int64_t n, cols, group, tile;
    int32_t kind, x_bits;
} GemvPart;
typedef int (*gemv_group_fn)(const GemvPart *, int, const uint16_t *, int64_t, int, int);
typedef void (*norm_fn)(const uint16_t *, const uint16_t *, uint16_t *, int64_t, int64_t, int64_t, float, int, int);
typedef void (*silu_fn)(const uint16_t *, uint16_t *, int64_t, int64_t, int64_t, int, int);
typedef int (*attn_fn)(const uint16_t *, const uint16_t *, const uint16_t *, const uint8_t *, uint16_t *, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, const int64_t *, float, int, int, int);

typedef struct {  /* the other kernels' entry points (tile_gemv.c's products, elementwise.c, attention.c) */
    void *gemv, *gemm, *norm, *silu, *attention, *gemv_group;
} Kernels;

typedef struct {  /* one weight as tile_gemv's products take it (plane: the 5- or 6-bit form's) */
    const void *codes, *plane, *scale_zero;
    int64_t n, cols, group, tile;
    int32_t kind, x_bits;
} Matrix;

typedef struct {
    const uint16_t *attn_norm, *mlp_norm;
    Matrix qkv, o, gate_up, down;
    Matrix q, k, v;  /* q, k and v apart where qkv.codes is NULL (weights of different kinds) */
    float scale;  /* the attention's softmax scale */
    int32_t unused;
} Layer;

/* One step: `rows` rows of `tokens` tokens, the model's sizes, the cache (slots, kv_heads, capacity, d). */
typedef struct {
    int64_t rows, tokens, hidden, heads, kv_heads, head_dim, inter, capacity;
    int64_t first;  /* the first slot when the rows are a block of slots (one attention call), else -1 */
    int64_t span;  /* keys 0..span-1 of a row are read, as `mask` (rows, tokens, span) lets each token */
    const int64_t *slots, *positions;  /* each row's cache slot; each token's position (rows, tokens) */
    const uint16_t *cos, *sin;  /* (rows * tokens, head_dim) each: the rope's cos and signed sin (rope_tables) */
    const uint8_t *mask;
    uint16_t *const *k_cache, *const *v_cache;  /* a layer's keys and values */
    float eps;
    int32_t fp16, bf16_dot, threads;
    const int64_t *keep;  /* a prompt chunk's token a row read after the last layer (rows,), or NULL: all */
} Step;

/* out = x @ m.T for all the step's tokens: the decode product (one token a row) or the prompts' one,
 * as the weight's kind chooses by phase (models/blocks/coded_weights.py). */
static int prompt_product(const Kernels *kn, const Matrix *m, const uint16_t *x, uint16_t *out, int64_t count,
                          const Step *s) {
    return ((gemm_fn)kn->gemm)(m->codes, m->plane, m->scale_zero, x, out, m->n, m->cols, m->group, count, m->tile,
                               s->fp16, m->kind, s->threads);
}

static int product(const Kernels *kn, const Matrix *m, const uint16_t *x, uint16_t *out, const Step *s) {
    const int64_t count = s->rows * s->tokens;
    if (s->tokens > 1) return prompt_product(kn, m, x, out, count, s);
    return ((gemv_fn)kn->gemv)(m->codes, m->plane, m->scale_zero, x, out, m->n, m->cols, m->group, count, m->tile,
                               s->fp16, m->kind, m->x_bits, s->threads);
}

/* Tokens from which this file's own passes (rotation, adds, copies) split over the threads (tile_gemv's
 * claim pool, pool_hook.h), as torch's ops would: each token's values are its own, so the split
 * changes no bit. */
#define PARALLEL_FROM 256

/* One of this file's passes over `count` tokens, for the threads' chunks: chunk c is tokens c * per ... */
typedef struct {
    const Step *s;
    int64_t layer, count, width, per;
    const uint16_t *in;
    uint16_t *out;
    int fp16;
} Pass;

/* Chunk c's tokens [*first, return value). */
static int64_t pass_tokens(const Pass *p, int64_t c, int64_t *first) { return chunk_range(c, p->per, p->count, first); }

/* fn over the pass's tokens: split over the threads from PARALLEL_FROM tokens, else on this one. */
static void over_tokens(Pass *p, int threads, chunk_fn fn) {
    run_split(threads, threads > 1 && p->count >= PARALLEL_FROM, p->count, &p->per, fn, p);
}

/* Chunk c of x = round(x + y) (out = x, in = y). */
static void add_chunk(void *ctx, int64_t c, int slot) {
    const Pass *p = ctx;
    int64_t first, end = pass_tokens(p, c, &first);
    (void)slot;
    for (int64_t i = first * p->width; i < end * p->width; i += VW) {
        vmask m = lanes(end * p->width - i);
        store_halves(p->out + i, vf_add(load_halves(p->in + i, p->fp16, m), load_halves(p->out + i, p->fp16, m)),
                     p->fp16, m);
    }
}

/* x = round(x + y), `tokens` rows of `width` values (torch's `out.add_(x)` on the product's output). */
static void add_rounded(uint16_t *x, const uint16_t *y, int64_t tokens, int64_t width, int fp16, int threads) {
    Pass p = {NULL, 0, tokens, width, 1, y, x, fp16};
    over_tokens(&p, threads, add_chunk);
}

/* One head's d values rotated: round(round(x * cos) + round(swap(x) * sin)), swap(x) the halves
 * exchanged (torch's roll by d / 2), as blocks/rope.py's rotate_half_split. */
static void rotate(const uint16_t *x, const uint16_t *cos, const uint16_t *sin, uint16_t *out, int64_t d, int fp16) {
    uint16_t swapped[512];
    const int64_t half = d / 2;
    memcpy(swapped, x + half, sizeof(uint16_t) * (size_t)half);
    memcpy(swapped + half, x, sizeof(uint16_t) * (size_t)half);
    for (int64_t e = 0; e < d; e += VW) {
        vmask m = lanes(d - e);
        vf a = rounded(vf_mul(load_halves(x + e, fp16, m), load_halves(cos + e, fp16, m)), fp16);
        vf b = rounded(vf_mul(load_halves(swapped + e, fp16, m), load_halves(sin + e, fp16, m)), fp16);
        store_halves(out + e, vf_add(a, b), fp16, m);
    }
}

/* rotate's arithmetic where the halves are whole vectors (d / 2 a multiple of VW), the tables
 * already fp32 (the same values): no copy of the swapped halves, no lane masks, the dtype a
 * constant. */
AI void rotate_whole(const uint16_t *x, const float *cos, const float *sin, uint16_t *out, int64_t d, const int fp16) {
    const int64_t half = d / 2;
    for (int64_t e = 0; e < d; e += VW) {
        const uint16_t *swapped = x + (e < half ? e + half : e - half);
        vf a = rounded(vf_mul(load_halves(x + e, fp16, ALL_LANES), vf_load(cos + e)), fp16);
        vf b = rounded(vf_mul(load_halves(swapped, fp16, ALL_LANES), vf_load(sin + e)), fp16);
        store_halves(out + e, vf_add(a, b), fp16, ALL_LANES);
    }
}

/* `count` heads (count, d) rotated by the same tables into out: rotate's bits, the tables converted
 * to fp32 once for the token's heads. */
static void rotate_heads(const uint16_t *x, const uint16_t *cos, const uint16_t *sin, uint16_t *out, int64_t count,
                         int64_t d, int fp16) {
    if ((d / 2) % VW) {
        for (int64_t h = 0; h < count; h++) rotate(x + h * d, cos, sin, out + h * d, d, fp16);
        return;
    }
    float cos32[512], sin32[512];
    for (int64_t e = 0; e < d; e += VW) {
        vf_store(cos32 + e, load_halves(cos + e, fp16, ALL_LANES));
        vf_store(sin32 + e, load_halves(sin + e, fp16, ALL_LANES));
    }
    for (int64_t h = 0; h < count; h++) {
        if (fp16) rotate_whole(x + h * d, cos32, sin32, out + h * d, d, 1);
        else rotate_whole(x + h * d, cos32, sin32, out + h * d, d, 0);
    }
}

/* Chunk c of `rotate_and_store` (in = qkv, out = qk). */
static void rotate_chunk(void *ctx, int64_t c, int slot) {
    const Pass *p = ctx;
    const Step *s = p->s;
    const int64_t d = s->head_dim, rotated = s->heads + s->kv_heads, width = (rotated + s->kv_heads) * d;
    const int64_t slot_stride = s->kv_heads * s->capacity * d, head_stride = s->capacity * d;
    int64_t first, end = pass_tokens(p, c, &first);
    (void)slot;
    for (int64_t i = first; i < end; i++) {
        const uint16_t *token = p->in + i * width;
        rotate_heads(token, s->cos + i * d, s->sin + i * d, p->out + i * rotated * d, rotated, d, s->fp16);
        const int64_t at = s->slots[i / s->tokens] * slot_stride + s->positions[i] * d;
        for (int64_t h = 0; h < s->kv_heads; h++) {
            const uint16_t *k = p->out + (i * rotated + s->heads + h) * d;
            memcpy(s->k_cache[p->layer] + at + h * head_stride, k, sizeof(uint16_t) * d);
            memcpy(s->v_cache[p->layer] + at + h * head_stride, token + (rotated + h) * d, sizeof(uint16_t) * d);
        }
    }
}

/* q and k of every token rotated into qk (tokens, heads + kv_heads, d); k and v written to the cache
 * at the token's position in its row's slot. */
static void rotate_and_store(const Step *s, int64_t layer, const uint16_t *qkv, uint16_t *qk) {
    Pass p = {s, layer, s->rows * s->tokens, 0, 1, qkv, qk, s->fp16};
    over_tokens(&p, s->threads, rotate_chunk);
}

/* The tokens' attention over their rows' cached keys into out (rows, heads, tokens, d): one call for
 * a block of slots, else a call a row. */
static int attend(const Kernels *kn, const Step *s, int64_t layer, float scale, const uint16_t *qk, uint16_t *out) {
    const int64_t d = s->head_dim, rotated = s->heads + s->kv_heads, t = s->tokens;
    const int64_t slot_stride = s->kv_heads * s->capacity * d, head_stride = s->capacity * d;
    const int64_t st[12] = {t * rotated * d, d, rotated * d, slot_stride, head_stride, d, slot_stride, head_stride, d,
                            t * s->span, s->span, 1};
    attn_fn fn = (attn_fn)kn->attention;
    if (s->first >= 0)
        return fn(qk, s->k_cache[layer] + s->first * slot_stride, s->v_cache[layer] + s->first * slot_stride, s->mask,
                  out, s->rows, s->heads, s->kv_heads, t, s->span, d, st, scale, s->fp16, s->bf16_dot, s->threads);
    for (int64_t r = 0; r < s->rows; r++) {
        const int64_t at = s->slots[r] * slot_stride;
        if (fn(qk + r * t * rotated * d, s->k_cache[layer] + at, s->v_cache[layer] + at, s->mask + r * t * s->span,
               out + r * s->heads * t * d, 1, s->heads, s->kv_heads, t, s->span, d, st, scale, s->fp16, s->bf16_dot,
               s->threads))
            return 1;
    }
    return 0;
}

/* Chunk c of `heads_last` (in = by head, out = att). */
static void heads_last_chunk(void *ctx, int64_t c, int slot) {
    const Pass *p = ctx;
    const Step *s = p->s;
    const int64_t d = s->head_dim, t = s->tokens;
    int64_t first, end = pass_tokens(p, c, &first);
    (void)slot;
    for (int64_t i = first; i < end; i++) {  /* token i = (row r, position j) */
        const int64_t r = i / t, j = i % t;
        for (int64_t h = 0; h < s->heads; h++)
            memcpy(p->out + (i * s->heads + h) * d, p->in + ((r * s->heads + h) * t + j) * d, sizeof(uint16_t) * d);
    }
}

/* The attention's (rows, heads, tokens, d) as (rows, tokens, heads d): the forward's transpose. */
static void heads_last(const Step *s, const uint16_t *by_head, uint16_t *att) {
    Pass p = {s, 0, s->rows * s->tokens, 0, 1, by_head, att, s->fp16};
    over_tokens(&p, s->threads, heads_last_chunk);
}

/* A step's buffers, each (rows * tokens, width): `apart` holds q, k and v made apart, then the
 * attention's output by head (tokens > 1) before `heads_last`. */
typedef struct { uint16_t *h, *qkv, *qk, *att, *tmp, *gu, *act, *apart; } Scratch;

/* q, k and v made apart (of different kinds) into `apart`, each (tokens, its n) after the last: a
 * decode step's as one group (tile_gemv's `flexlamps_tile_gemv_group`: each weight's own product,
 * their tiles in one pool job), a prompt's one product each. */
static int qkv_apart(const Kernels *kn, const Step *s, const Layer *l, const uint16_t *h, uint16_t *apart) {
    const Matrix *parts[3] = {&l->q, &l->k, &l->v};
    const int64_t count = s->rows * s->tokens;
    GemvPart group[3];
    uint16_t *out = apart;
    for (int p = 0; p < 3; out += count * parts[p]->n, p++) {
        const Matrix *m = parts[p];
        if (s->tokens > 1 && prompt_product(kn, m, h, out, count, s)) return 1;
        GemvPart w = {m->codes, m->plane, m->scale_zero, out, m->n, m->cols, m->group, m->tile, m->kind, m->x_bits};
        group[p] = w;
    }
    return s->tokens == 1 && ((gemv_group_fn)kn->gemv_group)(group, 3, h, count, s->fp16, s->threads);
}

/* qkv (tokens, (heads + 2 kv_heads) d) = h @ [Wq; Wk; Wv]: one product, or three (q, k, v of
 * different kinds, `qkv_apart`) laid side by side in each token's row as the stacked one's are. */
static int qkv_product(const Kernels *kn, const Step *s, const Layer *l, Scratch *b) {
    if (l->qkv.codes) return product(kn, &l->qkv, b->h, b->qkv, s);
    const Matrix *parts[3] = {&l->q, &l->k, &l->v};
    const int64_t width = (s->heads + 2 * s->kv_heads) * s->head_dim, count = s->rows * s->tokens;
    if (qkv_apart(kn, s, l, b->h, b->apart)) return 1;
    const uint16_t *from = b->apart;
    int64_t at = 0;
    for (int p = 0; p < 3; from += count * parts[p]->n, at += parts[p]->n, p++)
        for (int64_t i = 0; i < count; i++)
            memcpy(b->qkv + i * width + at, from + i * parts[p]->n, sizeof(uint16_t) * (size_t)parts[p]->n);
    return 0;
}

static int layer_step(const Kernels *kn, const Step *s, const Layer *l, int64_t index, uint16_t *x, Scratch *b) {
    const int64_t count = s->rows * s->tokens, hidden = s->hidden;
    norm_fn norm = (norm_fn)kn->norm;
    norm(x, l->attn_norm, b->h, count, hidden, hidden, s->eps, s->fp16, s->threads);
    if (qkv_product(kn, s, l, b)) return 1;
    rotate_and_store(s, index, b->qkv, b->qk);
    if (attend(kn, s, index, l->scale, b->qk, s->tokens > 1 ? b->apart : b->att)) return 2;
    if (s->tokens > 1) heads_last(s, b->apart, b->att);
    if (product(kn, &l->o, b->att, b->tmp, s)) return 1;
    add_rounded(x, b->tmp, count, hidden, s->fp16, s->threads);
    norm(x, l->mlp_norm, b->h, count, hidden, hidden, s->eps, s->fp16, s->threads);
    if (product(kn, &l->gate_up, b->h, b->gu, s)) return 1;
    ((silu_fn)kn->silu)(b->gu, b->act, count, s->inter, 2 * s->inter, s->fp16, s->threads);
    if (product(kn, &l->down, b->act, b->tmp, s)) return 1;
    add_rounded(x, b->tmp, count, hidden, s->fp16, s->threads);
    return 0;
}

/* Each row's kept token's attention (`keep`) into out (rows, heads d): one query a row, as the
 * chunk's call computes it (a query's result is its own). */
static int attend_kept(const Kernels *kn, const Step *s, int64_t layer, float scale, const uint16_t *qk,
                       uint16_t *out) {
    const int64_t d = s->head_dim, rotated = s->heads + s->kv_heads;
    const int64_t slot_stride = s->kv_heads * s->capacity * d, head_stride = s->capacity * d;
    const int64_t st[12] = {rotated * d, d, rotated * d, slot_stride, head_stride, d, slot_stride, head_stride, d,
                            s->span, s->span, 1};
    for (int64_t r = 0; r < s->rows; r++) {
        const int64_t i = r * s->tokens + s->keep[r], at = s->slots[r] * slot_stride;
        if (((attn_fn)kn->attention)(qk + i * rotated * d, s->k_cache[layer] + at, s->v_cache[layer] + at,
                                     s->mask + i * s->span, out + r * s->heads * d, 1, s->heads, s->kv_heads, 1,
                                     s->span, d, st, scale, s->fp16, s->bf16_dot, s->threads))
            return 1;
    }
    return 0;
}

/* The last layer of a prompt chunk read at one token a row (`keep`): every token's keys and values
 * are written, the rest of the layer (attention, o, the MLP) runs for the kept tokens alone, by the
 * prompts' product as the whole chunk's call runs it (a row's result is the row's alone), so they
 * get the same bits; the other tokens' rows of x are left as they were. */
static int kept_layer_step(const Kernels *kn, const Step *s, const Layer *l, int64_t index, uint16_t *x,
                           Scratch *b) {
    const int64_t count = s->rows * s->tokens, hidden = s->hidden, rows = s->rows;
    uint16_t *kept = b->tmp, *y = b->tmp + rows * hidden;  /* tokens > 1: tmp holds both */
    norm_fn norm = (norm_fn)kn->norm;
    norm(x, l->attn_norm, b->h, count, hidden, hidden, s->eps, s->fp16, s->threads);
    if (qkv_product(kn, s, l, b)) return 1;
    rotate_and_store(s, index, b->qkv, b->qk);
    if (attend_kept(kn, s, index, l->scale, b->qk, b->att)) return 2;
    for (int64_t r = 0; r < rows; r++)
        memcpy(kept + r * hidden, x + (r * s->tokens + s->keep[r]) * hidden, sizeof(uint16_t) * (size_t)hidden);
    if (prompt_product(kn, &l->o, b->att, y, rows, s)) return 1;
    add_rounded(kept, y, rows, hidden, s->fp16, s->threads);
    norm(kept, l->mlp_norm, b->h, rows, hidden, hidden, s->eps, s->fp16, s->threads);
    if (prompt_product(kn, &l->gate_up, b->h, b->gu, rows, s)) return 1;
    ((silu_fn)kn->silu)(b->gu, b->act, rows, s->inter, 2 * s->inter, s->fp16, s->threads);
    if (prompt_product(kn, &l->down, b->act, y, rows, s)) return 1;
    add_rounded(kept, y, rows, hidden, s->fp16, s->threads);
    for (int64_t r = 0; r < rows; r++)
        memcpy(x + (r * s->tokens + s->keep[r]) * hidden, kept + r * hidden, sizeof(uint16_t) * (size_t)hidden);
    return 0;
}

/* x (rows * tokens, hidden) through layers 0..num_layers-1, in place (where `keep` is given, only the
 * kept tokens' rows after the last layer); 0, or 1 (a product refused), 2 (the attention refused)
 * or 3 (no memory). */
int flexlamps_decode_layers(const Kernels *kn, const Step *s, const Layer *layers, int64_t num_layers, uint16_t *x) {
    const int64_t count = s->rows * s->tokens, d = s->head_dim, qkv = (s->heads + 2 * s->kv_heads) * d;
    if (d > 512) return 1;
    const int64_t widths[8] = {s->hidden, qkv, (s->heads + s->kv_heads) * d, s->heads * d, s->hidden, 2 * s->inter,
                               s->inter, qkv};
    int64_t total = 0;
    for (int i = 0; i < 8; i++) total += count * widths[i];
    uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)total + 64);
    if (!buf) return 3;
    uint16_t *parts[8];
    int64_t at = 0;
    for (int i = 0; i < 8; i++) {
        parts[i] = buf + at;
        at += count * widths[i];
    }
    Scratch b = {parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], parts[6], parts[7]};
    int status = 0;
    for (int64_t i = 0; i < num_layers && !status; i++)
        status = s->keep && s->tokens > 1 && i == num_layers - 1 ? kept_layer_step(kn, s, layers + i, i, x, &b)
                                                                 : layer_step(kn, s, layers + i, i, x, &b);
    free(buf);
    return status;
}

/* The rotation alone, for the loader's check: x (count, d) -> out, each head by the same tables. */
void flexlamps_rotate_heads(const uint16_t *x, const uint16_t *cos, const uint16_t *sin, uint16_t *out, int64_t count,
                            int64_t d, int fp16) {
    rotate_heads(x, cos, sin, out, count, d, fp16);
}
