/* A decode step's transformer layer (Llama, Qwen2, Qwen3) in three calls around its attention, for float32 rows
 * against weights in GGUF blocks: ctypes and torch spent about 10 ms of a 28 ms SmolLM2 step on the dozen calls
 * of each of its 30 layers (checks, dispatch, outputs), against 17 ms in C.
 *
 *     swarm_decode_attention_in    x -> RMSNorm -> q, k, v projections -> q and k norms (Qwen3) -> rotary
 *     (attention, in Python: the KV pool's cascade, engine.attention)
 *     swarm_decode_mlp_in          attended -> o projection, + x = h -> RMSNorm -> gate and up projections
 *     (silu(gate) * up: fused_ops' silu_mul, which every float32 CPU MLP takes)
 *     swarm_decode_mlp_out         act -> down projection, + h
 *
 * Each piece is the very code the ops run one by one (layer_rows.h, quant_matmul.c's matmul, float adds), in
 * the same order, so a row gets the bits the layer's PyTorch path gives it. Built by kernels/cpu/native.py
 * and linked against quant_matmul's library; called through kernels/cpu/decode_layer.py, and by decode_stack.c,
 * which runs every layer of a step in one call.
 */
#include <stdint.h>
#include <string.h>

#include "decode_layer.h"
#include "layer_rows.h"
#include "quant_matmul.h"   /* its library: kernels/cpu/native.py links the kernels whose headers a source names */

/* each head_dim-wide head of x [rows, heads, head_dim] normed by weight (NULL: none), then turned by the row's
   cos and sin [rows, head_dim] */
static void norm_and_turn(float *x, int64_t rows, int64_t heads, int64_t dim, const float *weight, float eps,
                          const float *cos_, const float *sin_) {
    float head[MAX_HEAD_DIM];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++) {
            float *xh = x + (r * heads + h) * dim;
            if (weight) rms_norm_row(xh, weight, dim, eps, xh);
            memcpy(head, xh, (size_t)dim * sizeof(float));
            rotary_head(head, cos_ + r * dim, sin_ + r * dim, dim, xh);
        }
}

/* x [rows, hidden] -> q [rows, heads, head_dim], k and v [rows, kv_heads, head_dim]; scratch: [rows, hidden].
   Returns 1 (and does nothing) where head_dim is over MAX_HEAD_DIM, -1 when memory runs out. */
int swarm_decode_attention_in(const swarm_decode_layer *l, const float *x, int64_t rows, const float *cos_,
                              const float *sin_, float *scratch, float *q, float *k, float *v, int threads) {
    if (l->head_dim > MAX_HEAD_DIM) return 1;
    for (int64_t r = 0; r < rows; r++)
        rms_norm_row(x + r * l->hidden, l->input_norm, l->hidden, l->eps, scratch + r * l->hidden);
    float *const qkv[3] = {q, k, v};
    if (swarm_quant_matmul_set(l->qkv, scratch, rows, qkv, threads)) return -1;
    norm_and_turn(q, rows, l->heads, l->head_dim, l->q_norm, l->eps, cos_, sin_);
    norm_and_turn(k, rows, l->kv_heads, l->head_dim, l->k_norm, l->eps, cos_, sin_);
    return 0;
}

/* attended [rows, heads * head_dim] -> h = x + o_proj(attended) [rows, hidden], gate and up of RMSNorm(h)
   [rows, intermediate]; scratch: [rows, hidden]. Returns -1 when memory runs out. */
int swarm_decode_mlp_in(const swarm_decode_layer *l, const float *x, const float *attended, int64_t rows,
                        float *scratch, float *h, float *gate, float *up, int threads) {
    float *const o[1] = {scratch};
    if (swarm_quant_matmul_set(l->o, attended, rows, o, threads)) return -1;
    for (int64_t i = 0; i < rows * l->hidden; i++) h[i] = x[i] + scratch[i];
    for (int64_t r = 0; r < rows; r++)
        rms_norm_row(h + r * l->hidden, l->post_norm, l->hidden, l->eps, scratch + r * l->hidden);
    float *const gate_up[2] = {gate, up};
    return swarm_quant_matmul_set(l->gate_up, scratch, rows, gate_up, threads);
}

/* out = h + down_proj(act) [rows, hidden]. Returns -1 when memory runs out. */
int swarm_decode_mlp_out(const swarm_decode_layer *l, const float *h, const float *act, int64_t rows, float *out,
                         int threads) {
    float *const down[1] = {out};
    if (swarm_quant_matmul_set(l->down, act, rows, down, threads)) return -1;
    for (int64_t i = 0; i < rows * l->hidden; i++) out[i] = h[i] + out[i];
    return 0;
}
