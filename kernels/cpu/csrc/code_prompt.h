/* What code_prompt.c exports to quant_matmul.c (a weight set in integer products calls it). */
#pragma once
#include <stdint.h>

/* y[w] = x @ W[w].T + bias[w] in integer products (code_prompt.c's top) for weights packed by swarm_code_pack,
   formats[w] their GGML type codes. Returns -1 (y untouched) when memory runs out. */
int swarm_code_prompt_many(const float *x, int64_t M, int64_t K, int64_t count, const uint8_t *const *panels,
                           const int *formats, const int64_t *N, const float *const *bias, float *const *y,
                           int threads);
