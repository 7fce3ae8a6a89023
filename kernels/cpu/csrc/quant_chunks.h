/* The blocks of quant_blocks.h expanded 8 values (a chunk) at a time, in SIMD registers, to the same float32
 * bits as sub_block_values there.
 *
 * A vector holds chunk j of one column's sub-block (AVX2), or of two columns' (AVX-512: the first
 * column in lanes 0-7, the second in lanes 8-15): each half takes the AVX2 code's steps lane for lane, so
 * both builds give the same bits. The code below is written once for both, on the macros of the width.
 */
#ifndef SWARM_QUANT_CHUNKS_H
#define SWARM_QUANT_CHUNKS_H

#include <immintrin.h>
#include <string.h>

#include "quant_blocks.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define COLUMNS_A_VECTOR 2
typedef __m512 vfloat;
typedef __m512i vint;
#define VI_AND _mm512_and_si512
#define VI_OR _mm512_or_si512
#define VI_ADD _mm512_add_epi32
#define VI_SUB _mm512_sub_epi32
#define VI_SET1 _mm512_set1_epi32
#define VI_SRLI _mm512_srli_epi32
#define VI_SLLI _mm512_slli_epi32
#define VI_SRLV _mm512_srlv_epi32
#define U8_TO_I32 _mm512_cvtepu8_epi32
#define I8_TO_I32 _mm512_cvtepi8_epi32
#define TO_FLOAT _mm512_cvtepi32_ps
#define VF_MUL _mm512_mul_ps
#define VF_ADD _mm512_add_ps
#define VF_SUB _mm512_sub_ps
#define VF_FMADD _mm512_fmadd_ps
#define VF_FMSUB _mm512_fmsub_ps
#define VF_ZERO _mm512_setzero_ps
#define VF_LOAD _mm512_load_ps
#define LANE_INDEX _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7)

/* 8 bytes of each column, at a and b */
INLINE __m128i bytes8(const uint8_t *a, const uint8_t *b) {
    return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b));
}
INLINE vfloat vf_pair(float a, float b) { return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b)); }
INLINE vint vi_pair(const uint8_t *a, const uint8_t *b) {   /* the 32-bit words at a and b */
    int wa, wb;
    memcpy(&wa, a, 4), memcpy(&wb, b, 4);
    return _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(wa), _mm512_set1_epi32(wb));
}
INLINE vfloat x_chunk(const float *x) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(x)); }
INLINE __m256 half_of(vfloat v, int k) { return k ? _mm512_extractf32x8_ps(v, 1) : _mm512_castps512_ps256(v); }
INLINE vfloat halves(const float *low, const float *high) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(low)), _mm256_loadu_ps(high), 1);
}
/* the first column's lanes at `at`, the second's at `at + stride` */
INLINE void store_columns(float *at, int64_t stride, vfloat v) {
    if (stride == 8) {
        _mm512_storeu_ps(at, v);
    } else {
        _mm256_storeu_ps(at, _mm512_castps512_ps256(v));
        _mm256_storeu_ps(at + stride, _mm512_extractf32x8_ps(v, 1));
    }
}

#else
#define COLUMNS_A_VECTOR 1
typedef __m256 vfloat;
typedef __m256i vint;
#define VI_AND _mm256_and_si256
#define VI_OR _mm256_or_si256
#define VI_ADD _mm256_add_epi32
#define VI_SUB _mm256_sub_epi32
#define VI_SET1 _mm256_set1_epi32
#define VI_SRLI _mm256_srli_epi32
#define VI_SLLI _mm256_slli_epi32
#define VI_SRLV _mm256_srlv_epi32
#define U8_TO_I32 _mm256_cvtepu8_epi32
#define I8_TO_I32 _mm256_cvtepi8_epi32
#define TO_FLOAT _mm256_cvtepi32_ps
#define VF_MUL _mm256_mul_ps
#define VF_ADD _mm256_add_ps
#define VF_SUB _mm256_sub_ps
#define VF_FMADD _mm256_fmadd_ps
#define VF_FMSUB _mm256_fmsub_ps
#define VF_ZERO _mm256_setzero_ps
#define VF_LOAD _mm256_load_ps
#define LANE_INDEX _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)

INLINE __m128i bytes8(const uint8_t *a, const uint8_t *b) { (void)b; return _mm_loadl_epi64((const __m128i *)a); }
INLINE vfloat vf_pair(float a, float b) { (void)b; return _mm256_set1_ps(a); }
INLINE vint vi_pair(const uint8_t *a, const uint8_t *b) {
    (void)b;
    int wa;
    memcpy(&wa, a, 4);
    return _mm256_set1_epi32(wa);
}
INLINE vfloat x_chunk(const float *x) { return _mm256_loadu_ps(x); }
INLINE __m256 half_of(vfloat v, int k) { (void)k; return v; }
INLINE vfloat halves(const float *low, const float *high) { (void)high; return _mm256_loadu_ps(low); }
INLINE void store_columns(float *at, int64_t stride, vfloat v) { (void)stride; _mm256_storeu_ps(at, v); }

#endif

/* Every fp16 value as float32, filled when the library loads: a block's scale is then a load from the table,
   which a vector takes as a broadcast, instead of conversions in the vector units the expansion keeps busy. */
static float half_table[1 << 16];

__attribute__((constructor)) static void fill_half_table(void) {
    for (int h = 0; h < 1 << 16; h++) {
        const uint8_t bytes[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        half_table[h] = half_to_float(bytes);
    }
}

/* the float32 value of the fp16 at p */
INLINE const float *half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return half_table + h;
}

/* One column's K-quant super-block scales as float32: d * sc for each sub-block (Q6_K: each 16 values),
   dmin * mn for each sub-block. Decoded 8 at a time, once a super-block. */
typedef struct { float d[16], m[8]; } k_scales;

INLINE void k_scales_of(int format, const uint8_t *block, k_scales *out) {
    if (format == Q6_K) {
        const __m256 d = _mm256_set1_ps(*half_at(block + 208));
        const __m128i sc = _mm_loadu_si128((const __m128i *)(block + 192));
        _mm256_storeu_ps(out->d, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(out->d + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
        return;
    }
    uint32_t w[3];   /* k_scale_min for the 8 sub-blocks at once, a byte each */
    memcpy(w, block + 4, sizeof w);
    const uint64_t sc = (w[0] & 0x3F3F3F3Fu) | (uint64_t)((w[2] & 0x0F0F0F0Fu) | (w[0] >> 2 & 0x30303030u)) << 32;
    const uint64_t mn = (w[1] & 0x3F3F3F3Fu) | (uint64_t)((w[2] >> 4 & 0x0F0F0F0Fu) | (w[1] >> 2 & 0x30303030u)) << 32;
    const __m256 scales = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    _mm256_storeu_ps(out->d, _mm256_mul_ps(_mm256_set1_ps(*half_at(block)), scales));
    _mm256_storeu_ps(out->m, _mm256_mul_ps(_mm256_set1_ps(*half_at(block + 2)), mins));
}

INLINE int is_k_quant(int format) { return format >= Q4_K; }

/* sub-blocks whose codes share bytes (Q4_K's and Q5_K's two nibbles, Q6_K's four 2-bit highs), expanded
   together so that their shifts are constants */
INLINE int subs_sharing_bytes(int format) { return format == Q6_K ? 4 : is_k_quant(format) ? 2 : 1; }

/* what the chunks of sub-block s share, for a vector's columns: the scale of chunks 0-1 and of 2-3 (Q6_K's
   16-value groups), the offset (Q4_1, Q5_1; minus it for Q4_K, Q5_K), Q5_0/Q5_1's word of high bits, and
   the K-quants' shifts to sub-block s's low and high bits (vectors: s need not be a constant) */
typedef struct { vfloat d_low, d_high, m; vint qh, low_shift, high_shift; } sub_header;

/* a, b: the columns' blocks; da, db: their scales as float32 (32-value formats: the block's d; K-quants:
   k_scales.d), ma, mb: their offsets (m; k_scales.m) */
INLINE sub_header sub_header_of(int format, const uint8_t *a, const uint8_t *b, const float *da, const float *db,
                                const float *ma, const float *mb, int s) {
    sub_header h = {VF_ZERO(), VF_ZERO(), VF_ZERO(), VI_SET1(0), VI_SET1(0), VI_SET1(0)};
    if (format == Q6_K) {
        h.d_low = vf_pair(da[2 * s], db[2 * s]);
        h.d_high = vf_pair(da[2 * s + 1], db[2 * s + 1]);
        h.low_shift = VI_SET1(4 * (s / 2 & 1));
        h.high_shift = VI_SET1(2 * (s & 3));
        return h;
    }
    h.d_low = h.d_high = vf_pair(da[s], db[s]);
    if (format == Q4_1 || format == Q5_1 || is_k_quant(format)) h.m = vf_pair(ma[s], mb[s]);
    if (is_k_quant(format)) {
        h.low_shift = VI_SET1(4 * (s & 1));
        h.high_shift = VI_SET1(s);
    }
    if (format == Q5_0) h.qh = vi_pair(a + 2, b + 2);
    if (format == Q5_1) h.qh = vi_pair(a + 4, b + 4);
    return h;
}

/* 8 codes from 8 bytes of each column: their low nibbles, or their high ones */
INLINE vint nibbles(const uint8_t *a, const uint8_t *b, int high) {
    const vint bytes = U8_TO_I32(bytes8(a, b));
    return high ? VI_SRLI(bytes, 4) : VI_AND(bytes, VI_SET1(0x0F));
}

/* bits 8 j to 8 j + 7 of a Q5 word, one a lane, as 0 or 16 */
INLINE vint q5_high(vint qh, int j) {
    return VI_SLLI(VI_AND(VI_SRLV(qh, VI_ADD(LANE_INDEX, VI_SET1(8 * j))), VI_SET1(1)), 4);
}

/* (byte >> shift) & mask for 8 bytes of each column */
INLINE vint k_bits(const uint8_t *a, const uint8_t *b, vint shift, int mask) {
    return VI_AND(VI_SRLV(U8_TO_I32(bytes8(a, b)), shift), VI_SET1(mask));
}

/* values [32 s + 8 j, 32 s + 8 j + 8) of the columns' blocks a and b */
INLINE vfloat chunk_of(int format, const uint8_t *a, const uint8_t *b, int s, int j, sub_header h) {
    const int at = 8 * (j & 1), high = j >= 2;   /* a 32-value block's chunk j: nibbles of bytes at .. at + 7 */
    switch (format) {
        case Q8_0: return VF_MUL(TO_FLOAT(I8_TO_I32(bytes8(a + 2 + 8 * j, b + 2 + 8 * j))), h.d_low);
        case Q4_0: return VF_MUL(h.d_low, TO_FLOAT(VI_SUB(nibbles(a + 2 + at, b + 2 + at, high), VI_SET1(8))));
        case Q4_1: return VF_FMADD(h.d_low, TO_FLOAT(nibbles(a + 4 + at, b + 4 + at, high)), h.m);
        case Q5_0: {
            const vint q = VI_OR(nibbles(a + 6 + at, b + 6 + at, high), q5_high(h.qh, j));
            return VF_MUL(h.d_low, TO_FLOAT(VI_SUB(q, VI_SET1(16))));
        }
        case Q5_1: {
            const vint q = VI_OR(nibbles(a + 8 + at, b + 8 + at, high), q5_high(h.qh, j));
            return VF_FMADD(h.d_low, TO_FLOAT(q), h.m);
        }
        case Q4_K: {
            const int64_t low = 16 + 32 * (s / 2) + 8 * j;
            return VF_FMSUB(h.d_low, TO_FLOAT(k_bits(a + low, b + low, h.low_shift, 0x0F)), h.m);
        }
        case Q5_K: {
            const int64_t low = 48 + 32 * (s / 2) + 8 * j, top = 16 + 8 * j;
            const vint q = VI_OR(k_bits(a + low, b + low, h.low_shift, 0x0F),
                                 VI_SLLI(k_bits(a + top, b + top, h.high_shift, 1), 4));
            return VF_FMSUB(h.d_low, TO_FLOAT(q), h.m);
        }
        default: {   /* Q6_K */
            const int64_t low = 64 * (s / 4) + 32 * (s & 1) + 8 * j, top = 128 + 32 * (s / 4) + 8 * j;
            const vint q = VI_OR(k_bits(a + low, b + low, h.low_shift, 0x0F),
                                 VI_SLLI(k_bits(a + top, b + top, h.high_shift, 3), 4));
            return VF_MUL(j < 2 ? h.d_low : h.d_high, TO_FLOAT(VI_SUB(q, VI_SET1(32))));
        }
    }
}

/* Q4_K's sub-blocks 2 g and 2 g + 1 keep their codes in the low and high nibbles of the same bytes */
INLINE vint q4_k_pair_bytes(const uint8_t *a, const uint8_t *b, int g, int j) {
    return U8_TO_I32(bytes8(a + 16 + 32 * g + 8 * j, b + 16 + 32 * g + 8 * j));
}

/* chunk j of Q4_K sub-block 2 g + t (t a constant) from the pair's bytes: chunk_of's values */
INLINE vfloat q4_k_pair_chunk(vint bytes, int t, sub_header h) {
    const vint q = t ? VI_SRLI(bytes, 4) : VI_AND(bytes, VI_SET1(0x0F));
    return VF_FMSUB(h.d_low, TO_FLOAT(q), h.m);
}

/* blocks [b0, b1) of `vectors` vectors' columns, col[0 ..) (each a row of blocks), to float32: chunk k of the
   span of column c at out + k * chunk_stride + c * column_stride */
INLINE void expand_blocks(int format, const uint8_t *const *col, int vectors, int64_t b0, int64_t b1, float *out,
                          int64_t chunk_stride, int64_t column_stride) {
    const int bv = block_values(format);
    const int64_t bb = block_bytes(format);
    for (int64_t b = b0; b < b1; b++)
        for (int h = 0; h < vectors; h++) {
            const int c = h * COLUMNS_A_VECTOR;
            const uint8_t *a = col[c] + b * bb, *z = col[c + COLUMNS_A_VECTOR - 1] + b * bb;
            k_scales ka, kz;
            if (is_k_quant(format)) {
                k_scales_of(format, a, &ka);
                k_scales_of(format, z, &kz);
            }
            const int k = is_k_quant(format);
            const float *da = k ? ka.d : half_at(a), *dz = k ? kz.d : half_at(z);
            const float *ma = k ? ka.m : half_at(a + 2), *mz = k ? kz.m : half_at(z + 2);
            #pragma GCC unroll 8
            for (int s = 0; s < bv / 32; s++) {
                const sub_header head = sub_header_of(format, a, z, da, dz, ma, mz, s);
                float *at = out + ((b - b0) * bv / 8 + 4 * s) * chunk_stride + c * column_stride;
                for (int j = 0; j < 4; j++) store_columns(at + j * chunk_stride, column_stride, chunk_of(format, a, z, s, j, head));
            }
        }
}

#endif
