/* The element-wise pieces of a transformer layer in one pass each, for float32 on a CPU: a
 * decode step spends more time dispatching the half-dozen torch ops of an RMSNorm or a rotary
 * embedding than computing them (silu(gate) * up: one op for torch's two). Tested against transformers'
 * LlamaRMSNorm and apply_rotary_pos_emb, and torch's silu.
 * Built by kernels/cpu/native.py; called through ctypes from kernels/cpu/fused_ops.py.
 */
#include <stdint.h>

#include "layer_rows.h"

/* out[r] = weight * (x[r] / sqrt(mean(x[r]^2) + eps)) */
void swarm_rms_norm(const float *x, const float *weight, int64_t rows, int64_t dim, float eps, float *out,
                    int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (rows * dim > 65536)
    for (int64_t r = 0; r < rows; r++) rms_norm_row(x + r * dim, weight, dim, eps, out + r * dim);
}

/* Rotate-half rotary embedding of x [tokens, heads, dim] with cos, sin [tokens, dim] */
void swarm_rotary(const float *x, int64_t tokens, int64_t heads, int64_t dim, const float *cos_, const float *sin_,
                  float *out, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (tokens * heads * dim > 65536)
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++)
            rotary_head(x + (t * heads + h) * dim, cos_ + t * dim, sin_ + t * dim, dim, out + (t * heads + h) * dim);
}

/* out[i] = silu(gate[i]) * up[i] for i < n; out may be gate or up */
void swarm_silu_mul(const float *gate, const float *up, int64_t n, float *out, int threads) {
    const int64_t span = 4096, spans = (n + span - 1) / span;
    #pragma omp parallel for schedule(static) num_threads(threads) if (n > 65536)
    for (int64_t s = 0; s < spans; s++) {
        const int64_t first = s * span, count = n - first < span ? n - first : span;
        silu_mul_run(gate + first, up + first, count, out + first);
    }
}
