/* What quant_matmul.c exports to the other kernels (decode_layer.c and bf16_matmul.c link against its library). */
#pragma once
#include <stdint.h>

/* Weights that take the same x (a layer's q, k and v; its gate and up; or one), as swarm_quant_matmul_many's
 * arguments, described once by kernels/cpu/weight_set.py: a decode step's call passes only x and the outputs
 * (ctypes spends about a microsecond an argument). */
typedef struct {
    int64_t count, K;
    const uint8_t *const *q;
    const int *formats;
    const int64_t *N;
    const float *const *bias;
    int64_t bf16;   /* 1: bfloat16 products summed in float32 (quant_matmul.c's top); 0: float32 */
    const uint32_t *const *panels;   /* bf16 only, or NULL: each weight packed once as bf16_matmul.c's panels
                                        (engine/packed_weights.py), multiplied as a prompt's rows are */
    const uint8_t *const *code_panels;   /* bf16 only, or NULL: each weight's code panels (code_matmul.c,
                                            engine/code_panels.py), ahead of panels */
    int64_t int8;   /* with code_panels: 1, integer products of x's rows quantized to int8 (code_prompt.c) */
} swarm_weight_set;

/* y[w] = x @ W[w].T + bias[w] for each weight w of the set; x: [M, K] float32, y[w]: [M, N[w]]. Returns -1 (y
   untouched) when memory runs out. */
int swarm_quant_matmul_set(const swarm_weight_set *set, const float *x, int64_t M, float *const *y, int threads);

/* out [N, K] float32 = rows [0, N) of the blocks q (format: GGML's type code), as gguf.quants.dequantize gives them */
void swarm_quant_dequantize(const uint8_t *q, int format, int64_t N, int64_t K, float *out, int threads);
