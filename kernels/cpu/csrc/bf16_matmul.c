/* Prompt matmuls in bfloat16 products summed in float32: y = x @ W.T + bias, x [M, K] and W [N, K] float32,
 * both rounded to bfloat16 (to nearest, ties to even) and multiplied pair by pair as AVX512-BF16's vdpbf16ps
 * does it. For each output, over the pairs (k, k + 1) of columns in order, from sum = 0:
 *     sum += x[k + 1] * w[k + 1];  sum += x[k] * w[k]      (each product exact in float32, each sum rounded)
 * and then y = sum + bias. So a row's bits depend on its own values only, never on the rows it is batched
 * with, nor on how the work is cut in tiles. As the instructions do, values below 2^-126 (inputs and sums) are
 * flushed to zero; the code for CPUs without AVX512-BF16 does the same, so both give the same bits.
 *
 * The operands are laid out for the instruction first:
 *     swarm_bf16_round_rows     x -> pairs [M, K2]: K2 = ceil(K / 2) 32-bit words, column k in the low half
 *     swarm_bf16_pack_weight    W -> panels [ceil(N / 16), K2, 16]: the pairs of 16 weight rows side by side
 *     swarm_bf16_pack_quant     the same from a weight's GGUF blocks, expanded (quant_matmul.c) 64 rows at a
 *                               time into a buffer the cache holds
 * and then swarm_bf16_matmul multiplies tiles of ROWS_A_TILE rows by 64 weight rows, one task a tile, 6 rows
 * by 64 outputs a step in 24 registers (csrc/bf16_tiles.h). Built by kernels/cpu/native.py; called from
 * kernels/cpu/bf16_matmul.py.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_tiles.h"
#include "quant_matmul.h"

#define LANES BF16_LANES
#define PANELS BF16_PANELS
#define ROWS_A_TILE 96
#define SMALL (1 << 16)     /* values: fewer are rounded on one thread, sooner than waking the others */

static uint32_t pair_of(const float *row, int64_t K, int64_t pair) {
    int64_t k = 2 * pair;
    return bf16_pair(row[k], k + 1 < K ? row[k + 1] : 0.0f);
}

void swarm_bf16_round_rows(const float *x, int64_t M, int64_t K, uint32_t *pairs, int threads) {
    int64_t K2 = (K + 1) / 2;
    #pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= SMALL)
    for (int64_t m = 0; m < M; m++) {
        bf16_pairs_of_row(x + m * K, K / 2 * 2, pairs + m * K2);
        if (K % 2)
            pairs[m * K2 + K2 - 1] = pair_of(x + m * K, K, K2 - 1);
    }
}

/* One weight row's pairs into its lane of a panel: vcvtne2ps2bf16 rounds as bf16_bits does, a scatter puts each
   pair LANES words after the one before. */
static void pack_row(const float *row, int64_t K, uint32_t *lane_of_panel) {
    int64_t K2 = (K + 1) / 2, j = 0;
#if defined(__AVX512BF16__)
    const __m512i apart = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(LANES));
    for (; 2 * j + 32 <= K; j += 16) {
        __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + 2 * j + 16), _mm512_loadu_ps(row + 2 * j));
        _mm512_i32scatter_epi32(lane_of_panel + j * LANES, apart, (__m512i)both, 4);
    }
#endif
    for (; j < K2; j++)
        lane_of_panel[j * LANES] = pair_of(row, K, j);
}

/* count rows of K floats into the panels from `first` on, the last panel's lanes past them zero */
static void pack_rows(const float *rows, int64_t count, int64_t K, uint32_t *first) {
    int64_t K2 = (K + 1) / 2;
    for (int64_t i = 0; i < (count + LANES - 1) / LANES * LANES; i++) {
        uint32_t *lane = first + (i / LANES) * K2 * LANES + i % LANES;
        if (i < count) {
            pack_row(rows + i * K, K, lane);
        } else {
            for (int64_t j = 0; j < K2; j++)
                lane[j * LANES] = 0;
        }
    }
}

void swarm_bf16_pack_weight(const float *w, int64_t N, int64_t K, uint32_t *panels, int threads) {
    int64_t K2 = (K + 1) / 2, count = (N + LANES - 1) / LANES;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < count; p++)
        pack_rows(w + p * LANES * K, N - p * LANES < LANES ? N - p * LANES : LANES, K, panels + p * K2 * LANES);
}

/* 64 rows a task: their float32 values (at most 64 x K x 4 bytes) stay in the L2 cache until packed */
void swarm_bf16_pack_quant(const uint8_t *q, int format, int64_t row_bytes, int64_t N, int64_t K, uint32_t *panels,
                           int threads) {
    int64_t K2 = (K + 1) / 2, tasks = (N + PANELS * LANES - 1) / (PANELS * LANES);
    #pragma omp parallel num_threads(threads)
    {
        float *rows = malloc(sizeof(float) * PANELS * LANES * K);
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t n0 = t * PANELS * LANES, count = N - n0 < PANELS * LANES ? N - n0 : PANELS * LANES;
            swarm_quant_dequantize(q + n0 * row_bytes, format, count, K, rows, 1);
            pack_rows(rows, count, K, panels + n0 / LANES * K2 * LANES);
        }
        free(rows);
    }
}

/* 1 where this build multiplies on AVX512-BF16, 0 where it runs the plain C code (same bits, far slower) */
int swarm_bf16_native(void) {
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

/* y [M, N] (rows y_stride floats apart) = the pairs' rows @ the panels' weight rows .T + bias (or none) */
void swarm_bf16_matmul(const uint32_t *pairs, int64_t M, int64_t K2, const uint32_t *panels, int64_t N,
                       const float *bias, float *y, int64_t y_stride, int threads) {
    int64_t column_tiles = (N + PANELS * LANES - 1) / (PANELS * LANES);
    int64_t row_tiles = (M + ROWS_A_TILE - 1) / ROWS_A_TILE;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t c = 0; c < column_tiles; c++)
        for (int64_t t = 0; t < row_tiles; t++) {
            int64_t n0 = c * PANELS * LANES, m0 = t * ROWS_A_TILE;
            const bf16_problem tile = {pairs + m0 * K2, K2, K2, panels + n0 / LANES * K2 * LANES, K2 * LANES, LANES,
                                       bias ? bias + n0 : NULL, 1.0f, y + m0 * y_stride + n0, y_stride};
            bf16_tile(&tile, M - m0 < ROWS_A_TILE ? M - m0 : ROWS_A_TILE,
                      N - n0 < PANELS * LANES ? N - n0 : PANELS * LANES);
        }
}
