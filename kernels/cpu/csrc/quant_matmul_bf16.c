/* y = x @ W.T + bias for a few rows of float32 x against a weight kept as its GGUF file's blocks (as quant_matmul.c),
 * in bfloat16 products summed in float32: x and W rounded to bfloat16 as bf16_tiles.h rounds them (x once a call),
 * and each output element
 *     y[i, n] = ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) + bias[n],
 *     lr, r = 4 h + j, = vdpbf16ps's pairs (k, k + 1) for k = 32 s + 16 c + 8 h + 2 j, over the sub-blocks s of 32
 *     values and c = 0, 1 in turn, from 0:
 *         sum = flush(sum + W[n, k + 1] x[i, k + 1]);  sum = flush(sum + W[n, k] x[i, k])
 * whatever the number of rows or threads: a row's result does not depend on what it is batched with. On AVX512-BF16
 * it takes half the multiply-adds of float32 (quant_columns.h's machinery, two chunks a vdpbf16ps); other builds
 * take the same steps in plain C, slowly, for tests. Oracle: kernels/reference/bf16_matmul.py's lanes_matmul.
 * Built by kernels/cpu/native.py, always for this CPU (-march=native); called through quant_matmul.c's weight
 * sets and kernels/cpu/entry_points.py.
 */
#include <stdint.h>
#include <stdlib.h>

#include "bf16_tiles.h"
#include "quant_columns.h"
#include "quant_matmul_bf16.h"
#include "task_pool.h"          /* (quant_columns.h calls it: its library too) */

#if defined(__AVX512BF16__) && defined(__AVX2__) && defined(__FMA__) && COLUMNS_A_VECTOR == 2
/* the columns in bfloat16 products: pairs [M, K / 2], x's rows rounded */
static void column_range_bf16(const void *pairs, int64_t M, int64_t K, const uint8_t *q, int format, int64_t N,
                              const float *bias, float *y, int64_t n0, int64_t n1, float *carry) {
    const float *x = pairs;   /* read as 32-bit words, K / 2 a row */
#define COLUMNS(F) columns(x, M, K, 1, q, F, N, bias, y, n0, n1, carry)
    EACH_FORMAT(format, COLUMNS)
#undef COLUMNS
}
#define HAS_BF16_COLUMNS
#endif

#if !defined(HAS_BF16_COLUMNS)
/* the vdpbf16ps steps of one lane: pairs (k, k + 1) of the rounded x (pairs) and the weight's values w */
static inline float bf16_lane(float sum, uint32_t x, float w_low, float w_high) {
    sum = bf16_flushed(sum + bf16_widened(x >> 16) * bf16_widened(bf16_bits(w_high)));
    return bf16_flushed(sum + bf16_widened(x & 0xffffu) * bf16_widened(bf16_bits(w_low)));
}

/* lane (k % 16) / 2 of row i: the pairs (k, k + 1) of its rounded x and w, in turn */
static void add_bf16(float *lanes, int64_t M, const float *w, const void *rows, int64_t K, int64_t k0) {
    for (int64_t i = 0; i < M; i++) {
        const uint32_t *xs = (const uint32_t *)rows + i * (K / 2) + k0 / 2;
        for (int k = 0; k < 32; k += 2) {   /* k = 16 c + 8 h + 2 j: lane 4 h + j */
            float *lane = lanes + 8 * i + (k % 16) / 2;
            *lane = bf16_lane(*lane, xs[k / 2], w[k], w[k + 1]);
        }
    }
}

/* the bfloat16 products' arithmetic (see the top) one lane at a time, for builds without AVX512-BF16 */
static void column_range_bf16(const void *rows, int64_t M, int64_t K, const uint8_t *q, int format, int64_t N,
                              const float *bias, float *y, int64_t n0, int64_t n1, float *lanes) {
    plain_columns(add_bf16, rows, M, K, q, format, N, bias, y, n0, n1, lanes);
}
#endif

/* x's M rows of K floats rounded to bfloat16 pairs, K / 2 words a row, allocated; NULL when memory runs out */
static uint32_t *rounded_rows(const float *x, int64_t M, int64_t K) {
    uint32_t *pairs = malloc(sizeof(uint32_t) * (size_t)(M * K / 2 + 1));
    if (pairs)
        for (int64_t r = 0; r < M; r++) bf16_pairs_of_row(x + r * K, K, pairs + r * (K / 2));
    return pairs;
}

/* Weights packed once as bf16_matmul.c's panels: a task is one weight's 64 outputs (4 panels) for every row */
#define PACKED_OUTPUTS (BF16_PANELS * BF16_LANES)

typedef struct {
    const uint32_t *pairs;   /* x's rows rounded, K2 words a row */
    int64_t M, K2;
    const uint32_t *const *panels;
    const int64_t *N;
    const float *const *bias;
    float *const *y;
} PackedWeights;

static int64_t packed_tasks(int64_t N) { return (N + PACKED_OUTPUTS - 1) / PACKED_OUTPUTS; }

static void packed_task(void *context, int64_t task, int slot) {
    (void)slot;
    const PackedWeights *p = context;
    int64_t w = 0;
    for (; task >= packed_tasks(p->N[w]); w++) task -= packed_tasks(p->N[w]);
    const int64_t n0 = task * PACKED_OUTPUTS, N = p->N[w];
    const bf16_problem tile = {p->pairs, p->K2, p->K2, p->panels[w] + n0 / BF16_LANES * p->K2 * BF16_LANES,
                               p->K2 * BF16_LANES, BF16_LANES, p->bias[w] ? p->bias[w] + n0 : NULL, 1.0f,
                               p->y[w] + n0, N, NULL};
    bf16_tile(&tile, p->M, N - n0 < PACKED_OUTPUTS ? N - n0 : PACKED_OUTPUTS);
}

int swarm_packed_matmul_many(const float *x, int64_t M, int64_t K, int64_t count, const uint32_t *const *panels,
                             const int64_t *N, const float *const *bias, float *const *y, int threads) {
    uint32_t *pairs = rounded_rows(x, M, K);
    if (!pairs) return -1;
    int64_t tasks = 0;
    for (int64_t w = 0; w < count; w++) tasks += packed_tasks(N[w]);
    PackedWeights work = {pairs, M, K / 2, panels, N, bias, y};
    swarm_pool_run(packed_task, &work, tasks, threads);
    free(pairs);
    return 0;
}

/* 1 where this build takes bfloat16 products on AVX512-BF16, 0 where it takes them in plain C */
int swarm_quant_matmul_bf16_native(void) {
#if defined(HAS_BF16_COLUMNS)
    return 1;
#else
    return 0;
#endif
}

/* swarm_quant_matmul_many in bfloat16 products (see the top): x's rows rounded once. Returns -1 (y untouched)
   when memory runs out. */
int swarm_quant_matmul_many_bf16(const float *x, int64_t M, int64_t K, int64_t count, const uint8_t *const *q,
                                 const int *formats, const int64_t *N, const float *const *bias, float *const *y,
                                 int threads) {
    uint32_t *pairs = rounded_rows(x, M, K);
    if (!pairs) return -1;
    matmul_many(column_range_bf16, pairs, K / 2, M, K, count, q, formats, N, bias, y, threads);
    free(pairs);
    return 0;
}
