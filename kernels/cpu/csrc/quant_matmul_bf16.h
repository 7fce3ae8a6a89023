/* What quant_matmul_bf16.c exports to quant_matmul.c (a weight set in bfloat16 products calls it). */
#pragma once
#include <stdint.h>

/* swarm_quant_matmul_many's y[w] = x @ W[w].T + bias[w] in bfloat16 products summed in float32 (quant_matmul_bf16.c's
   top). Returns -1 (y untouched) when memory runs out. */
int swarm_quant_matmul_many_bf16(const float *x, int64_t M, int64_t K, int64_t count, const uint8_t *const *q,
                                 const int *formats, const int64_t *N, const float *const *bias, float *const *y,
                                 int threads);

/* the same products for weights packed as bf16_matmul.c's panels (panels[w]: [ceil(N[w] / 16), K / 2, 16]), each
   output summed as swarm_bf16_matmul sums it: a decode row gets the bits a prompt row gets. Returns -1 (y
   untouched) when memory runs out. */
int swarm_packed_matmul_many(const float *x, int64_t M, int64_t K, int64_t count, const uint32_t *const *panels,
                             const int64_t *N, const float *const *bias, float *const *y, int threads);

/* 1 where the build multiplies on AVX512-BF16, 0 where in plain C */
int swarm_quant_matmul_bf16_native(void);
