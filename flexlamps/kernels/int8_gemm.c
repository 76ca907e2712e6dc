/* Matrix products on int8 codes for prompts (calls of many rows): x rounded to
 * int8 per group of 64 inputs (a scale each), the weight held as int8 per output channel (a scale
 * each), products summed exactly in int32 within a group (vpdpbusd: 64 multiply-adds an
 * instruction, twice bf16's vdpbf16ps), each group's sum scaled into an fp32 accumulator.
 *   quantize: xq = round(x / s), s = max|x| / 127 over each group of 64 of a row; and
 *             xinit = -128 * sum(xq) per group (the weight's +128 offset, taken out exactly)
 *   gemm:     out[m, n] = round_dtype(sw[n] * sum_g s[m, g] * (xinit[m, g] + sum_k (w[n, k] + 128) * xq[m, k]))
 * vpdpbusd multiplies unsigned by signed bytes, so the weight is stored as w + 128 (uint8) and
 * each group's sum starts at -128 * sum(xq) instead of 0: the int32 sum is exactly sum w * xq.
 * Every output is computed by the same sequence of operations whatever the rows and columns
 * around it: a row's result does not depend on the batch or the thread count.
 * Packed weight: column blocks of 16, each (K / 4, 16, 4) bytes: the 4 inputs of a dot step of 16
 * outputs lie in one vector.
 * Variants: the loops come from int8_gemm_avx512.h (vpdpbusd on 16 outputs) or int8_gemm_avx2.h
 * (8 outputs a vector: vpdpbusd of AVX-VNNI where present, else vpmaddubsw on |x| and the weight
 * signed by x, then vpmaddwd: the same exact int32 sums); the fp32 steps are the same, so both
 * give the same bits. Built and loaded by flexlamps/kernels/int8_gemm.py. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "native_simd.h"  /* vectors of the variant's width, 16-bit floats */

#define GROUP 64                 /* inputs per x scale */
#define STEPS (GROUP / 4)        /* vpdpbusd steps per group */
#define ROW_CHUNK 64             /* rows whose codes stay in L2 while every column panel passes */

#if defined(__AVX512F__)
#include "int8_gemm_avx512.h"
#else
#include "int8_gemm_avx2.h"
#endif

/* One row of a weight to its packed bytes (code + 128, 4 at a time every 64 bytes from `dst`) and
 * scale: code = round(w / s), s = max|w| / 127. A row past the weight's end (src NULL): zeros. */
static void pack_row(const void *src, int64_t cols, int kind, uint8_t *dst, float *scale) {
    if (src == NULL) {
        for (int64_t s = 0; s < cols / 4; s++) memset(dst + s * 64, 128, 4);
        *scale = 0.0f;
        return;
    }
    int nan;
    float s = row_amax(src, cols, kind, &nan) / 127.0f;
    if (nan || s == INFINITY) {  /* NaN or inf in the row: its outputs NaN, as a float GEMM's */
        pack_row(NULL, cols, kind, dst, scale);
        *scale = NAN;
        return;
    }
    pack_codes(src, cols, kind, dst, s > 0.0f ? s : 1.0f);  /* a zero row: codes 0 */
    *scale = s;
}

/* Rows first .. first + count - 1 of a weight, given as `w` (count, cols) in fp32 or halves (NULL:
 * zero rows, the padding to 16), into their places in packed (column blocks of 16, each
 * (cols / 4, 16, 4) bytes) and scale. */
void flexlamps_int8_pack(const void *w, int kind, int64_t first, int64_t count, int64_t cols, uint8_t *packed,
                         float *scale, int threads) {
    int64_t elem = kind == 2 ? 4 : 2;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && count * cols >= (1 << 18))
    for (int64_t i = 0; i < count; i++) {
        int64_t row = first + i;
        const void *src = w == NULL ? NULL : (const char *)w + i * cols * elem;
        pack_row(src, cols, kind, packed + (row / 16) * cols * 16 + (row % 16) * 4, scale + row);
    }
}

/* x (rows, cols) halves with row stride x_stride -> q (rows, cols), scale and init (rows, cols / 64). */
void flexlamps_int8_quantize(const uint16_t *x, int64_t rows, int64_t cols, int64_t x_stride, int fp16, int8_t *q,
                             float *scale, int32_t *init, int threads) {
    int64_t groups = cols / GROUP;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows * cols >= (1 << 16))
    for (int64_t i = 0; i < rows; i++)
        quantize_row(x + i * x_stride, cols, fp16, q + i * cols, scale + i * groups, init + i * groups);
}

/* out (rows, n) halves, row stride out_stride = q (rows, cols) x packed w (n padded to 16, cols)^T.
 * sw: n padded to a multiple of 16. Threads split the rows' chunks and the column panels. */
void flexlamps_int8_gemm(const int8_t *q, const float *scale, const int32_t *init, const uint8_t *w, const float *sw,
                         uint16_t *out, int64_t rows, int64_t cols, int64_t n, int64_t out_stride, int fp16,
                         int threads) {
    int64_t groups = cols / GROUP, blocks = (n + 15) / 16;
    int64_t panels = (blocks + MAX_BLOCKS - 1) / MAX_BLOCKS, chunks = (rows + ROW_CHUNK - 1) / ROW_CHUNK;
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static) if (threads > 1 && rows * n * cols >= (1 << 22))
    for (int64_t c = 0; c < chunks; c++)
        for (int64_t p = 0; p < panels; p++) {
            int64_t b0 = p * MAX_BLOCKS, nb = blocks - b0 < MAX_BLOCKS ? blocks - b0 : MAX_BLOCKS;
            int64_t left = n - (b0 + nb - 1) * 16;  /* valid columns of the panel's last block */
            int64_t end = (c + 1) * ROW_CHUNK < rows ? (c + 1) * ROW_CHUNK : rows;
            for (int64_t r = c * ROW_CHUNK; r < end; r += MAX_ROWS) {
                int nr = end - r < MAX_ROWS ? (int)(end - r) : MAX_ROWS;
                run_tile(q + r * cols, scale + r * groups, init + r * groups, w + b0 * cols * 16, sw + b0 * 16,
                         out + r * out_stride + b0 * 16, cols, out_stride, nr, (int)nb, left, fp16);
            }
        }
}

