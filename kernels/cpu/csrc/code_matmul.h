/* What code_matmul.c exports to quant_matmul.c (a weight set kept as code panels calls it). */
#pragma once
#include <stdint.h>

#include "quant_blocks.h"

/* A cell's layout (code_matmul.c's top), for the kernels that read code panels (code_prompt.c too): 16 weight
   rows' codes of one sub-block, then their a [16] and c [16] in float32 */
#define CODE_LANES 16
#define CODE_SCALE_BYTES (2 * CODE_LANES * 4)

static inline int code_bits(int format) { return format == Q8_0 ? 8 : 4; }

static inline int64_t code_bytes(int bits) { return CODE_LANES * 32 * bits / 8; }

/* y[w] = x @ W[w].T + bias[w] for weights packed by swarm_code_pack (code_matmul.c's top), formats[w] their GGML
   type codes. Returns -1 (y untouched) when memory runs out. */
int swarm_code_matmul_many(const float *x, int64_t M, int64_t K, int64_t count, const uint8_t *const *panels,
                           const int *formats, const int64_t *N, const float *const *bias, float *const *y,
                           int threads);

/* the bytes of a cell (16 weight rows' codes of one sub-block, and their scales) of a weight in `format` */
int64_t swarm_code_cell_bytes(int format);
