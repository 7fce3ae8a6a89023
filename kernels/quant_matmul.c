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
 * Built by kernels/native.py; called through ctypes from kernels/quant_matmul.py.
 */
#include <stddef.h>
#include <stdint.h>

#define BLOCK 32
#define ROW_TILE 8

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline void dequant_block(const uint8_t *q, int bits, float scale, const float *offset, __m256 w[4]) {
    __m256i parts[4];
    if (bits == 4) {
        const __m128i mask = _mm_set1_epi8(0x0F);
        __m128i raw = _mm_loadu_si128((const __m128i *)q);
        __m128i lo = _mm_and_si128(raw, mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
        parts[0] = _mm256_cvtepu8_epi32(lo);
        parts[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8));
        parts[2] = _mm256_cvtepu8_epi32(hi);
        parts[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8));
    } else {
        for (int i = 0; i < 4; i++)
            parts[i] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * i)));
    }
    const __m256 d = _mm256_set1_ps(scale);
    for (int i = 0; i < 4; i++) {
        w[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(parts[i]));
        if (offset) w[i] = _mm256_add_ps(w[i], _mm256_set1_ps(*offset));
    }
}

static inline float sum_lanes(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* rows [row0, row0 + tile) of x against output column n; tile is a constant after inlining,
   so the accumulators stay in registers. Larger batches redo the dequantization per tile of
   rows, which measured faster than accumulating many rows in memory. */
static inline __attribute__((always_inline)) void tile_dot(
        const float *x, int64_t row0, int tile, int64_t K, int64_t N, const uint8_t *q, int64_t q_block,
        const float *scale, const float *offset, int bits, int64_t n, const float *bias, float *y) {
    __m256 acc[ROW_TILE];
    for (int i = 0; i < tile; i++) acc[i] = _mm256_setzero_ps();
    const int64_t blocks = K / BLOCK;
    for (int64_t b = 0; b < blocks; b++) {
        __m256 w[4];
        dequant_block(q + b * q_block, bits, scale[b], offset ? offset + b : NULL, w);
        const float *xb = x + row0 * K + b * BLOCK;
        for (int i = 0; i < tile; i++) {
            const float *xr = xb + i * K;
            acc[i] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xr), acc[i]);
            acc[i] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xr + 8), acc[i]);
            acc[i] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xr + 16), acc[i]);
            acc[i] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xr + 24), acc[i]);
        }
    }
    for (int i = 0; i < tile; i++)
        y[(row0 + i) * N + n] = sum_lanes(acc[i]) + (bias ? bias[n] : 0.0f);
}

static void column_dot(const float *x, int64_t M, int64_t K, int64_t N, const uint8_t *q, int64_t q_block,
                       const float *scale, const float *offset, int bits, int64_t n, const float *bias, float *y) {
    int64_t row0 = 0;
    for (; row0 + ROW_TILE <= M; row0 += ROW_TILE)
        tile_dot(x, row0, ROW_TILE, K, N, q, q_block, scale, offset, bits, n, bias, y);
    switch (M - row0) {
        case 7: tile_dot(x, row0, 7, K, N, q, q_block, scale, offset, bits, n, bias, y); break;
        case 6: tile_dot(x, row0, 6, K, N, q, q_block, scale, offset, bits, n, bias, y); break;
        case 5: tile_dot(x, row0, 5, K, N, q, q_block, scale, offset, bits, n, bias, y); break;
        case 4: tile_dot(x, row0, 4, K, N, q, q_block, scale, offset, bits, n, bias, y); break;
        case 3: tile_dot(x, row0, 3, K, N, q, q_block, scale, offset, bits, n, bias, y); break;
        case 2: tile_dot(x, row0, 2, K, N, q, q_block, scale, offset, bits, n, bias, y); break;
        case 1: tile_dot(x, row0, 1, K, N, q, q_block, scale, offset, bits, n, bias, y); break;
        default: break;
    }
}

#else  /* portable C: the same arithmetic, one lane at a time */

static void column_dot(const float *x, int64_t M, int64_t K, int64_t N, const uint8_t *q, int64_t q_block,
                       const float *scale, const float *offset, int bits, int64_t n, const float *bias, float *y) {
    for (int64_t i = 0; i < M; i++) {
        const float *xr = x + i * K;
        float lanes[8] = {0};
        for (int64_t b = 0; b < K / BLOCK; b++) {
            const uint8_t *qb = q + b * q_block;
            for (int j = 0; j < BLOCK; j++) {
                float qv = bits == 4 ? (float)((j < 16 ? qb[j] : qb[j - 16] >> 4) & 0x0F) : (float)(int8_t)qb[j];
                float w = scale[b] * qv;
                if (offset) w = w + offset[b];
                lanes[j % 8] += w * xr[b * BLOCK + j];
            }
        }
        float s = 0.0f;
        for (int l = 0; l < 8; l++) s += lanes[l];
        y[i * N + n] = s + (bias ? bias[n] : 0.0f);
    }
}

#endif

/* x: [M, K] float32; q: [N, K / 32 * q_block] bytes; scale, offset: [N, K / 32] float32
 * (offset may be NULL); bias: [N] or NULL; y: [M, N] float32. K is a multiple of 32. */
void swarm_quant_matmul(const float *x, int64_t M, int64_t K, const uint8_t *q, const float *scale,
                        const float *offset, int bits, int64_t N, const float *bias, float *y, int threads) {
    const int64_t blocks = K / BLOCK, q_block = bits == 4 ? BLOCK / 2 : BLOCK;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++)
        column_dot(x, M, K, N, q + n * blocks * q_block, q_block, scale + n * blocks,
                   offset ? offset + n * blocks : NULL, bits, n, bias, y);
}
