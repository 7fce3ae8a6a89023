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
 * by 64 outputs a step in 24 registers. Built by kernels/cpu/native.py; called from kernels/cpu/bf16_matmul.py.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_matmul.h"

#define LANES 16
#define PANELS 4            /* panels (of 16 outputs) a step */
#define ROWS 6              /* rows a step: ROWS x PANELS sums in registers */
#define ROWS_A_TILE 96
#define SMALL (1 << 16)     /* values: fewer are rounded on one thread, sooner than waking the others */

static uint32_t bf16_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (bits >> 16) | 0x40u;                      /* NaN stays NaN */
    if ((bits & 0x7f800000u) == 0)
        return (bits >> 16) & 0x8000u;                    /* below 2^-126: zero, its sign kept */
    return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  /* to nearest, ties to even */
}

static uint32_t pair_of(const float *row, int64_t K, int64_t pair) {
    int64_t k = 2 * pair;
    uint32_t high = k + 1 < K ? bf16_bits(row[k + 1]) : 0;
    return bf16_bits(row[k]) | high << 16;
}

void swarm_bf16_round_rows(const float *x, int64_t M, int64_t K, uint32_t *pairs, int threads) {
    int64_t K2 = (K + 1) / 2;
    #pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= SMALL)
    for (int64_t m = 0; m < M; m++) {
        int64_t j = 0;
#if defined(__AVX512BF16__)
        for (; 2 * j + 32 <= K; j += 16) {   /* vcvtne2ps2bf16 rounds as bf16_bits does */
            const float *row = x + m * K + 2 * j;
            __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + 16), _mm512_loadu_ps(row));
            _mm512_storeu_si512(pairs + m * K2 + j, (__m512i)both);
        }
#endif
        for (; j < K2; j++)
            pairs[m * K2 + j] = pair_of(x + m * K, K, j);
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

static float widened(uint32_t half) {
    uint32_t bits = half << 16;
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

static float flushed(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    if ((bits & 0x7f800000u) == 0)
        bits &= 0x80000000u;
    memcpy(&value, &bits, 4);
    return value;
}

#if defined(__AVX512BF16__)
/* rows x panels outputs over all K2 pairs; rows and panels are constants where inlined */
static inline __attribute__((always_inline)) void step(int rows, int panels, const uint32_t *x, int64_t K2,
                                                       const uint32_t *panel, const float *bias, float *y,
                                                       int64_t y_stride, int64_t outputs) {
    __m512 sum[ROWS][PANELS];
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < panels; p++)
            sum[r][p] = _mm512_setzero_ps();
    for (int64_t j = 0; j < K2; j++) {
        __m512bh w[PANELS];
        for (int p = 0; p < panels; p++)
            w[p] = (__m512bh)_mm512_loadu_si512(panel + (p * K2 + j) * LANES);
        for (int r = 0; r < rows; r++) {
            __m512bh xr = (__m512bh)_mm512_set1_epi32((int)x[r * K2 + j]);
            for (int p = 0; p < panels; p++)
                sum[r][p] = _mm512_dpbf16_ps(sum[r][p], w[p], xr);
        }
    }
    for (int p = 0; p < panels; p++) {
        int64_t left = outputs - p * LANES;
        __mmask16 mask = left >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + p * LANES) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++)
            _mm512_mask_storeu_ps(y + r * y_stride + p * LANES, mask, _mm512_add_ps(sum[r][p], b));
    }
}

#define STEP_PANELS(R) switch (panels) { case 1: step(R, 1, x, K2, panel, bias, y, y_stride, outputs); break; \
    case 2: step(R, 2, x, K2, panel, bias, y, y_stride, outputs); break;                                     \
    case 3: step(R, 3, x, K2, panel, bias, y, y_stride, outputs); break;                                     \
    default: step(R, 4, x, K2, panel, bias, y, y_stride, outputs); }

static void outputs_of(int rows, int panels, const uint32_t *x, int64_t K2, const uint32_t *panel,
                       const float *bias, float *y, int64_t y_stride, int64_t outputs) {
    switch (rows) {
        case 1: STEP_PANELS(1) break;
        case 2: STEP_PANELS(2) break;
        case 3: STEP_PANELS(3) break;
        case 4: STEP_PANELS(4) break;
        case 5: STEP_PANELS(5) break;
        default: STEP_PANELS(6)
    }
}
#else
static void outputs_of(int rows, int panels, const uint32_t *x, int64_t K2, const uint32_t *panel,
                       const float *bias, float *y, int64_t y_stride, int64_t outputs) {
    int64_t width = outputs < panels * LANES ? outputs : panels * LANES;
    for (int r = 0; r < rows; r++)
        for (int64_t o = 0; o < width; o++) {
            const uint32_t *w = panel + (o / LANES) * K2 * LANES + o % LANES;
            float sum = 0.0f;
            for (int64_t j = 0; j < K2; j++) {
                uint32_t a = x[r * K2 + j], b = w[j * LANES];
                sum = flushed(sum + widened(a >> 16) * widened(b >> 16));
                sum = flushed(sum + widened(a & 0xffffu) * widened(b & 0xffffu));
            }
            y[r * y_stride + o] = bias ? sum + bias[o] : sum;
        }
}
#endif

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
            int64_t n0 = c * PANELS * LANES, outputs = N - n0;
            int width = outputs >= PANELS * LANES ? PANELS : (int)((outputs + LANES - 1) / LANES);
            const uint32_t *panel = panels + (n0 / LANES) * K2 * LANES;
            int64_t last = (t + 1) * ROWS_A_TILE < M ? (t + 1) * ROWS_A_TILE : M;
            for (int64_t m = t * ROWS_A_TILE; m < last; m += ROWS) {
                int rows = last - m >= ROWS ? ROWS : (int)(last - m);
                outputs_of(rows, width, pairs + m * K2, K2, panel, bias ? bias + n0 : NULL,
                           y + m * y_stride + n0, y_stride, outputs);
            }
        }
}
