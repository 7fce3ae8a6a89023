/* What nibble_matmul.c exports to quant_matmul.c (a weight set kept as nibble panels calls it). */
#pragma once
#include <stdint.h>

/* y[w] = x @ W[w].T + bias[w] for weights packed by swarm_nibble_pack (nibble_matmul.c's top). Returns -1 (y
   untouched) when memory runs out. */
int swarm_nibble_matmul_many(const float *x, int64_t M, int64_t K, int64_t count, const uint8_t *const *panels,
                             const int64_t *N, const float *const *bias, float *const *y, int threads);
