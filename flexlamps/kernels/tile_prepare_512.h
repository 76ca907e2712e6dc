/* tile_gemm.h's `prepare` layout of 4 columns of a sub-tile in AVX-512 VBMI byte permutes, for tiles
 * of 64 rows (h = 32: columns k..k+3 of both sub-tiles are 128 contiguous bytes): 4-bit codes and the
 * 6-bit form's (its plane's high two bits joined as `column_codes` joins them). The same bytes as
 * column_codes + transpose4 (test_tile_gemm, test_q4_k_form, test_q6_k_form compare every variant),
 * in 2 loads and 3 permutes where those took 4 loads, 4 shifts and 8 unpacks: at a decode step's 32
 * rows the layout was ~20% of the AMX products (they read each sub-tile's codes once a call).
 * Included by tile_gemm.h where __AVX512VBMI__ is set. */

/* The permutes' indices for sub-tile s: gather[16c + j] = column c's byte 16s + j (of the 128);
 * out[o] (o < 128: lo then hi vector) = row j = 4v + jj's code of column c, its low nibble (the
 * low rows) at o = 32v + 4jj + c, its high nibble (the high rows) 16 bytes on; codes in 64 + i. */
typedef struct {
    __m512i gather, plane, lo, hi, plane_shift;
} Layout512;

static Layout512 layout512(int64_t s) {
    uint8_t gather[64], plane[64], order[128];
    uint16_t shift[32];
    for (int i = 0; i < 64; i++) {
        gather[i] = (uint8_t)(32 * (i / 16) + 16 * s + i % 16);
        plane[i] = (uint8_t)(32 * (i / 32) + 16 * s + i % 16);  /* columns 2p, 2p + 1 share plane bytes */
    }
    for (int i = 0; i < 32; i++) shift[i] = (uint16_t)(i / 8 % 2 ? 2 : 0);  /* odd columns: bits 2-3, 6-7 */
    for (int o = 0; o < 128; o++) {
        const int v = o / 32, high = o / 16 % 2, jj = o / 4 % 4, c = o % 4;
        order[o] = (uint8_t)(64 * high + 16 * c + 4 * v + jj);
    }
    Layout512 l = {_mm512_loadu_si512(gather), _mm512_loadu_si512(plane), _mm512_loadu_si512(order),
                   _mm512_loadu_si512(order + 64), _mm512_loadu_si512(shift)};
    return l;
}

/* Columns k..k+3 of sub-tile s laid out at out (128 bytes): the tile's bytes at p = codes + k h, the
 * 6-bit form's plane bytes at plane + 16 k (NULL: 4-bit codes). */
AI void prepare4_512(const uint8_t *p, const uint8_t *plane, int64_t k, const Layout512 *l, uint8_t *out) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512i r = _mm512_permutex2var_epi8(_mm512_loadu_si512(p), l->gather, _mm512_loadu_si512(p + 64));
    __m512i lo = _mm512_and_si512(r, nib), hi = _mm512_and_si512(_mm512_srli_epi16(r, 4), nib);
    if (plane) {  /* plane_high16's bytes, then u = high << 4 | low, q + 128 as the split's: u ^ 0x80 */
        __m512i ph = _mm512_permutexvar_epi8(l->plane, _mm512_loadu_si512(plane + 16 * k));
        ph = _mm512_add_epi8(_mm512_and_si512(_mm512_srlv_epi16(ph, l->plane_shift), _mm512_set1_epi8(0x33)),
                             _mm512_set1_epi8(0x66));
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        lo = _mm512_xor_si512(_mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(ph, nib), 4), lo), flip);
        hi = _mm512_xor_si512(_mm512_or_si512(_mm512_andnot_si512(nib, ph), hi), flip);
    }
    _mm512_storeu_si512(out, _mm512_permutex2var_epi8(lo, l->lo, hi));
    _mm512_storeu_si512(out + 64, _mm512_permutex2var_epi8(lo, l->hi, hi));
}
