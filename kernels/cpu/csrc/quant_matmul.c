/* y = x @ W.T + bias for a few rows of float32 x against a weight kept as its GGUF file's blocks
 * (quant_blocks.h: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), and the expansion of rows of such a
 * weight to float32 (the scratch that prefill multiplies with a GEMM).
 *
 * W[n, k] is exactly the float32 value gguf.quants.dequantize gives, and each output element is
 *     y[i, n] = ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) + bias[n],
 *     lr = the fused multiply-adds of W[n, k] * x[i, k] for k = r, r + 8, r + 16, ... in turn, from 0,
 * whatever the number of rows or threads and whichever build (AVX-512, AVX2, plain C) runs: a row's
 * result does not depend on what it is batched with.
 * A weight set in bfloat16 products (swarm_weight_set's bf16) goes to quant_matmul_bf16.c, whose top says its sums
 * (with panels, engine/packed_weights.py's, to its swarm_packed_matmul_many: swarm_bf16_matmul's sums; with
 * code panels, engine/code_panels.py's, to code_matmul.c); one in integer products (int8) to code_prompt.c;
 * its library is always the -march=native build, whichever build of this file kernels/cpu/build_choice.py picks.
 * Built by kernels/cpu/native.py; called through kernels/cpu/entry_points.py.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "quant_columns.h"
#include "code_matmul.h"
#include "code_prompt.h"
#include "quant_matmul.h"
#include "quant_matmul_bf16.h"   /* its library: kernels/cpu/native.py links the kernels whose headers a source names */
#include "task_pool.h"

#define ROWS_A_TASK 16       /* of the expansion: threads take rows 16 at a time */

#if defined(__AVX2__) && defined(__FMA__)
static void column_range(const void *rows, int64_t M, int64_t K, const uint8_t *q, int format, int64_t N,
                         const float *bias, float *y, int64_t n0, int64_t n1, float *carry) {
    const float *x = rows;
#define COLUMNS(F) columns(x, M, K, 0, q, F, N, bias, y, n0, n1, carry)
    EACH_FORMAT(format, COLUMNS)
#undef COLUMNS
}

/* rows [n0, n1) of the weight to float32, a vector's rows at a time (an odd last one twice, to itself) */
INLINE void expand_rows(const uint8_t *q, int format, int64_t K, int64_t n0, int64_t n1, float *out) {
    const int64_t blocks = K / block_values(format), row_bytes = blocks * block_bytes(format);
    for (int64_t n = n0; n < n1; n += COLUMNS_A_VECTOR) {
        const int pair = COLUMNS_A_VECTOR == 2 && n + 1 < n1;
        const uint8_t *col[2] = {q + n * row_bytes, q + (n + pair) * row_bytes};
        expand_blocks(format, col, 1, 0, blocks, out + n * K, 8, pair ? K : 0);
    }
}

#else  /* plain C: the same arithmetic, one lane at a time */

/* lane l % 8 of row i: the fused multiply-adds of w[l] x[i, k0 + l], in turn */
static void add_float32(float *lanes, int64_t M, const float *w, const void *rows, int64_t K, int64_t k0) {
    for (int64_t i = 0; i < M; i++) {
        const float *xs = (const float *)rows + i * K + k0;
        for (int l = 0; l < 32; l++) lanes[8 * i + l % 8] = fmaf(w[l], xs[l], lanes[8 * i + l % 8]);
    }
}

static void column_range(const void *rows, int64_t M, int64_t K, const uint8_t *q, int format, int64_t N,
                         const float *bias, float *y, int64_t n0, int64_t n1, float *lanes) {
    plain_columns(add_float32, rows, M, K, q, format, N, bias, y, n0, n1, lanes);
}

static void expand_rows(const uint8_t *q, int format, int64_t K, int64_t n0, int64_t n1, float *out) {
    const int bv = block_values(format);
    const int64_t bb = block_bytes(format), row_bytes = K / bv * bb;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t b = 0; b < K / bv; b++)
            for (int s = 0; s < bv / 32; s++)
                sub_block_values(format, q + n * row_bytes + b * bb, s, out + n * K + b * bv + 32 * s);
}

#endif

void swarm_quant_matmul_many(const float *x, int64_t M, int64_t K, int64_t count, const uint8_t *const *q,
                             const int *formats, const int64_t *N, const float *const *bias, float *const *y,
                             int threads) {
    matmul_many(column_range, x, K, M, K, count, q, formats, N, bias, y, threads);
}

int swarm_quant_matmul_set(const swarm_weight_set *set, const float *x, int64_t M, float *const *y, int threads) {
    if (set->int8 && set->code_panels)
        return swarm_code_prompt_many(x, M, set->K, set->count, set->code_panels, set->formats, set->N, set->bias, y,
                                      threads);
    if (set->bf16 && set->code_panels)
        return swarm_code_matmul_many(x, M, set->K, set->count, set->code_panels, set->formats, set->N, set->bias, y,
                                      threads);
    if (set->bf16 && set->panels)
        return swarm_packed_matmul_many(x, M, set->K, set->count, set->panels, set->N, set->bias, y, threads);
    if (set->bf16)
        return swarm_quant_matmul_many_bf16(x, M, set->K, set->count, set->q, set->formats, set->N, set->bias, y,
                                            threads);
    swarm_quant_matmul_many(x, M, set->K, set->count, set->q, set->formats, set->N, set->bias, y, threads);
    return 0;
}

/* swarm_quant_matmul_many for one weight */
void swarm_quant_matmul(const float *x, int64_t M, int64_t K, const uint8_t *q, int format, int64_t N,
                        const float *bias, float *y, int threads) {
    swarm_quant_matmul_many(x, M, K, 1, &q, &format, &N, &bias, &y, threads);
}

/* out: [N, K] float32, the values of q's N rows (as swarm_quant_matmul's q), the threads taking
 * ROWS_A_TASK rows at a time */
void swarm_quant_dequantize(const uint8_t *q, int format, int64_t N, int64_t K, float *out, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n0 = 0; n0 < N; n0 += ROWS_A_TASK) {
#define EXPAND(F) expand_rows(q, F, K, n0, n0 + ROWS_A_TASK < N ? n0 + ROWS_A_TASK : N, out)
        EACH_FORMAT(format, EXPAND)
#undef EXPAND
    }
}
