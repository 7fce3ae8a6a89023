/* y = x @ W.T + bias for a few rows of float32 x against a weight kept in GGUF's block formats.
 *
 * W[n, 32 b + j] = scale[n, b] * q(n, b, j) + offset[n, b], exactly the float32 value the gguf
 * package's dequantize gives (one multiply, one add, never fused). q is:
 *   bits 4: the block's 16 bytes hold j < 16 in the low nibbles and j >= 16 in the high ones
 *           (Q4_1; Q4_0 is the same with offset = -8 * scale);
 *   bits 8: 32 signed bytes (Q8_0, offset NULL).
 *
 * Each output element sums its 32-wide blocks in the same order whatever the number of rows
 * or threads, so a row's result does not depend on what it is batched with.
 * Built by kernels/cpu/native.py; called through ctypes from kernels/cpu/quant_matmul.py.
 */
#include <stddef.h>
#include <stdint.h>

#define BLOCK 32
#define ROW_TILE 8
#define MAX_ROWS 64        /* rows a pass (kernels/cpu/quant_matmul.py sends no more for decode) */
#define SPAN_BLOCKS 24     /* at most: 8 rows x 768 floats of x, 24 KB, stay in a 32 KB L1 cache */
#define GROUP_COLUMNS 32

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

static inline float sum_lanes(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
/* AVX-512: columns two a vector, column n + 2h in lanes 0-7 of vector h and n + 2h + 1 in lanes
   8-15, each half taking the AVX2 code's steps (below) lane for lane, so both builds give the same
   bits. A pass takes 4 columns, or 8 for 1-2 rows: a column's sum is one chain of dependent
   multiply-adds, and few rows leave too few chains side by side to hide their latency (1 row:
   27.7 -> 19.5 us for SmolLM2's gate_proj with 8 columns a pass against 2). */
#define COLUMNS_AT_ONCE 8
#define COLUMNS_A_PASS(tile) ((tile) <= 2 ? 8 : 4)

/* the j-th 8 values of a block of two columns (q0, q1), as dequant_part below */
INLINE __m512 dequant_part(const uint8_t *q0, const uint8_t *q1, int bits, int j, __m512 scale, __m512 offset,
                           int has_offset) {
    const int at = bits == 4 ? 8 * (j & 1) : 8 * j;
    const __m128i bytes = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(q0 + at)),
                                             _mm_loadl_epi64((const __m128i *)(q1 + at)));
    __m512i codes;
    if (bits == 4) {
        codes = _mm512_cvtepu8_epi32(bytes);
        codes = j < 2 ? _mm512_and_si512(codes, _mm512_set1_epi32(0x0F)) : _mm512_srli_epi32(codes, 4);
    } else {
        codes = _mm512_cvtepi8_epi32(bytes);
    }
    const __m512 w = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(codes));
    return has_offset ? _mm512_add_ps(w, offset) : w;
}

INLINE __m512 pair(float a, float b) {
    return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

/* tile_dot below for `count` columns from n (at most COLUMNS_A_PASS(tile)); lanes of the columns
   past count repeat column n and are dropped */
INLINE void tile_dot(const float *x, int64_t row0, int tile, int64_t K, const uint8_t *q, int64_t q_block,
                     const float *scale, const float *offset, int bits, int has_offset, int64_t first, int64_t last,
                     float *carry, int64_t N, int64_t n, int count, int64_t per_column, const float *bias,
                     float *y) {
    const int vectors = COLUMNS_A_PASS(tile) / 2;
    const int64_t blocks = K / BLOCK;
    int64_t at[8];   /* each column's distance from column n, in columns */
    for (int c = 0; c < 2 * vectors; c++) at[c] = c < count ? c : 0;
    __m512 acc[ROW_TILE][4];
    for (int i = 0; i < tile; i++)
        for (int h = 0; h < vectors; h++) {
            const float *low = carry + at[2 * h] * per_column + 8 * i;
            const float *high = carry + at[2 * h + 1] * per_column + 8 * i;
            acc[i][h] = first == 0 ? _mm512_setzero_ps()
                                   : _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(low)),
                                                        _mm256_loadu_ps(high), 1);
        }
    for (int64_t b = first; b < last; b++) {
        const float *xb = x + row0 * K + b * BLOCK;
        __m512 d[4], m[4];
        for (int h = 0; h < vectors; h++) {
            d[h] = pair(scale[at[2 * h] * blocks + b], scale[at[2 * h + 1] * blocks + b]);
            m[h] = has_offset ? pair(offset[at[2 * h] * blocks + b], offset[at[2 * h + 1] * blocks + b]) : d[h];
        }
        for (int j = 0; j < 4; j++) {
            __m512 w[4];
            for (int h = 0; h < vectors; h++)
                w[h] = dequant_part(q + (at[2 * h] * blocks + b) * q_block, q + (at[2 * h + 1] * blocks + b) * q_block,
                                    bits, j, d[h], m[h], has_offset);
            for (int i = 0; i < tile; i++) {
                const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(xb + i * K + 8 * j));
                for (int h = 0; h < vectors; h++) acc[i][h] = _mm512_fmadd_ps(w[h], xv, acc[i][h]);
            }
        }
    }
    for (int i = 0; i < tile; i++)
        for (int c = 0; c < count; c++) {
            const __m512 both = acc[i][c / 2];
            const __m256 lanes = c % 2 ? _mm512_extractf32x8_ps(both, 1) : _mm512_castps512_ps256(both);
            if (last * BLOCK < K) _mm256_storeu_ps(carry + c * per_column + 8 * i, lanes);
            else y[(row0 + i) * N + n + c] = sum_lanes(lanes) + (bias ? bias[n + c] : 0.0f);
        }
}

#else
#define COLUMNS_AT_ONCE 1
#define COLUMNS_A_PASS(tile) 1

/* the j-th 8 values of a block (bits and whether there is an offset are constants after inlining) */
INLINE __m256 dequant_part(const uint8_t *q, int bits, int j, __m256 scale, __m256 offset, int has_offset) {
    __m256i codes;
    if (bits == 4) {   /* j 0, 1: low nibbles of bytes 0-7, 8-15; j 2, 3: their high nibbles */
        codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * (j & 1))));
        codes = j < 2 ? _mm256_and_si256(codes, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(codes, 4);
    } else {
        codes = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * j)));
    }
    const __m256 w = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(codes));
    return has_offset ? _mm256_add_ps(w, offset) : w;
}

/* rows [row0, row0 + tile) of x against column n over blocks [first, last) of the K axis. The lane
   sums start from and go back to carry ([tile][8]) between spans; the last span writes y. tile,
   bits and whether there is an offset are constants after inlining, so the accumulators stay in
   registers and each block is dequantized one vector at a time, between the products. */
INLINE void tile_dot(const float *x, int64_t row0, int tile, int64_t K, const uint8_t *q, int64_t q_block,
                     const float *scale, const float *offset, int bits, int has_offset, int64_t first, int64_t last,
                     float *carry, int64_t N, int64_t n, int count, int64_t per_column, const float *bias,
                     float *y) {
    (void)count, (void)per_column;
    __m256 acc[ROW_TILE];
    for (int i = 0; i < tile; i++) acc[i] = first == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(carry + 8 * i);
    for (int64_t b = first; b < last; b++) {
        const float *xb = x + row0 * K + b * BLOCK;
        const __m256 d = _mm256_set1_ps(scale[b]), m = has_offset ? _mm256_set1_ps(offset[b]) : d;
        for (int j = 0; j < 4; j++) {
            const __m256 w = dequant_part(q + b * q_block, bits, j, d, m, has_offset);
            for (int i = 0; i < tile; i++) acc[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xb + i * K + 8 * j), acc[i]);
        }
    }
    if (last * BLOCK < K) {
        for (int i = 0; i < tile; i++) _mm256_storeu_ps(carry + 8 * i, acc[i]);
        return;
    }
    for (int i = 0; i < tile; i++) y[(row0 + i) * N + n] = sum_lanes(acc[i]) + (bias ? bias[n] : 0.0f);
}
#endif

/* `count` columns from n (at most COLUMNS_AT_ONCE) in passes of COLUMNS_A_PASS(T) */
#define TILE_DOT(T) \
    for (int c0 = 0; c0 < count; c0 += COLUMNS_A_PASS(T)) \
        tile_dot(x, row0, T, K, q + c0 * blocks * q_block, q_block, scale + c0 * blocks, \
                 has_offset ? offset + c0 * blocks : NULL, bits, has_offset, first, last, carry + c0 * per_column, \
                 N, n + c0, count - c0 < COLUMNS_A_PASS(T) ? count - c0 : COLUMNS_A_PASS(T), per_column, bias, y)

INLINE void rows_dot(const float *x, int64_t M, int64_t K, const uint8_t *q, int64_t q_block, const float *scale,
                     const float *offset, int bits, int has_offset, int64_t first, int64_t last, float *carry,
                     int64_t N, int64_t n, int count, int64_t per_column, const float *bias, float *y) {
    const int64_t blocks = K / BLOCK;
    int64_t row0 = 0;
    for (; row0 + ROW_TILE <= M; row0 += ROW_TILE, carry += 8 * ROW_TILE) TILE_DOT(ROW_TILE);
    switch (M - row0) {
        case 7: TILE_DOT(7); break;
        case 6: TILE_DOT(6); break;
        case 5: TILE_DOT(5); break;
        case 4: TILE_DOT(4); break;
        case 3: TILE_DOT(3); break;
        case 2: TILE_DOT(2); break;
        case 1: TILE_DOT(1); break;
        default: break;
    }
}

/* columns [n0, n1), COLUMNS_AT_ONCE at a time, the K axis in equal spans of at most SPAN_BLOCKS, so
   that a span of x stays in the L1 cache while every column reads it; carry holds each column's
   lane sums between spans. */
INLINE void columns(const float *x, int64_t M, int64_t K, const uint8_t *q, const float *scale, const float *offset,
                    int bits, int has_offset, int64_t N, const float *bias, float *y, int64_t n0, int64_t n1,
                    float *carry) {
    const int64_t blocks = K / BLOCK, q_block = bits == 4 ? BLOCK / 2 : BLOCK, per_column = 8 * M;
    const int64_t spans = (blocks + SPAN_BLOCKS - 1) / SPAN_BLOCKS, span = (blocks + spans - 1) / spans;
    for (int64_t first = 0; first < blocks; first += span) {
        const int64_t last = first + span < blocks ? first + span : blocks;
        for (int64_t n = n0; n < n1; n += COLUMNS_AT_ONCE)
            rows_dot(x, M, K, q + n * blocks * q_block, q_block, scale + n * blocks,
                     has_offset ? offset + n * blocks : NULL, bits, has_offset, first, last,
                     carry + (n - n0) * per_column, N, n,
                     (int)(n1 - n < COLUMNS_AT_ONCE ? n1 - n : COLUMNS_AT_ONCE), per_column, bias, y);
    }
}

static void column_range(const float *x, int64_t M, int64_t K, const uint8_t *q, const float *scale,
                         const float *offset, int bits, int64_t N, const float *bias, float *y, int64_t n0,
                         int64_t n1, float *carry) {
    if (bits == 4 && offset) columns(x, M, K, q, scale, offset, 4, 1, N, bias, y, n0, n1, carry);
    else if (bits == 4) columns(x, M, K, q, scale, offset, 4, 0, N, bias, y, n0, n1, carry);
    else columns(x, M, K, q, scale, offset, 8, 0, N, bias, y, n0, n1, carry);
}

#else  /* portable C: the same arithmetic, one lane at a time */

static void column_range(const float *x, int64_t M, int64_t K, const uint8_t *q, const float *scale,
                         const float *offset, int bits, int64_t N, const float *bias, float *y, int64_t n0,
                         int64_t n1, float *carry) {
    const int64_t blocks = K / BLOCK, q_block = bits == 4 ? BLOCK / 2 : BLOCK;
    (void)carry;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t i = 0; i < M; i++) {
            const float *xr = x + i * K;
            float lanes[8] = {0};
            for (int64_t b = 0; b < blocks; b++) {
                const uint8_t *qb = q + (n * blocks + b) * q_block;
                for (int j = 0; j < BLOCK; j++) {
                    float qv = bits == 4 ? (float)((j < 16 ? qb[j] : qb[j - 16] >> 4) & 0x0F) : (float)(int8_t)qb[j];
                    float w = scale[n * blocks + b] * qv;
                    if (offset) w = w + offset[n * blocks + b];
                    lanes[j % 8] += w * xr[b * BLOCK + j];
                }
            }
            float sum = 0.0f;
            for (int l = 0; l < 8; l++) sum += lanes[l];
            y[i * N + n] = sum + (bias ? bias[n] : 0.0f);
        }
}

#endif

/* x: [M, K] float32; q: [N, K / 32 * q_block] bytes; scale, offset: [N, K / 32] float32
 * (offset may be NULL); bias: [N] or NULL; y: [M, N] float32. K is a multiple of 32. Rows go
 * MAX_ROWS at a time, columns to the threads in groups; a group's lane sums wait in carry
 * between spans. */
void swarm_quant_matmul(const float *x, int64_t M, int64_t K, const uint8_t *q, const float *scale,
                        const float *offset, int bits, int64_t N, const float *bias, float *y, int threads) {
    int64_t group = N / (4 * (int64_t)threads);
    group = group < 1 ? 1 : group > GROUP_COLUMNS ? GROUP_COLUMNS : group;
    for (int64_t r0 = 0; r0 < M; r0 += MAX_ROWS) {
        const int64_t rows = M - r0 < MAX_ROWS ? M - r0 : MAX_ROWS;
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t n0 = 0; n0 < N; n0 += group) {
            float carry[GROUP_COLUMNS * MAX_ROWS * 8];
            column_range(x + r0 * K, rows, K, q, scale, offset, bits, N, bias, y + r0 * N, n0,
                         n0 + group < N ? n0 + group : N, carry);
        }
    }
}
