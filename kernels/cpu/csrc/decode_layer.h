/* What decode_layer.c exports to decode_stack.c: a layer's weights and norms, and its three calls. */
#pragma once
#include <stdint.h>

#include "quant_matmul.h"

#define MAX_HEAD_DIM 1024

typedef struct {
    const swarm_weight_set *qkv, *o, *gate_up, *down;
    const float *input_norm, *post_norm, *q_norm, *k_norm;   /* q_norm, k_norm: NULL where the model has none */
    float eps;
    int64_t hidden, heads, kv_heads, head_dim;
} swarm_decode_layer;

/* x [rows, hidden] -> q [rows, heads, head_dim], k and v [rows, kv_heads, head_dim]; scratch: [rows, hidden].
   Returns 1 (and does nothing) where head_dim is over MAX_HEAD_DIM, -1 when memory runs out. */
int swarm_decode_attention_in(const swarm_decode_layer *l, const float *x, int64_t rows, const float *cos_,
                              const float *sin_, float *scratch, float *q, float *k, float *v, int threads);

/* attended [rows, heads * head_dim] -> h = x + o_proj(attended) [rows, hidden], gate and up of RMSNorm(h)
   [rows, intermediate]; scratch: [rows, hidden]. Returns -1 when memory runs out. */
int swarm_decode_mlp_in(const swarm_decode_layer *l, const float *x, const float *attended, int64_t rows,
                        float *scratch, float *h, float *gate, float *up, int threads);

/* out = h + down_proj(act) [rows, hidden]. Returns -1 when memory runs out. */
int swarm_decode_mlp_out(const swarm_decode_layer *l, const float *h, const float *act, int64_t rows, float *out,
                         int threads);
