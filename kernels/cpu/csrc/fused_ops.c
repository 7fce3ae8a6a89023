/* The element-wise pieces of a transformer layer in one pass each, for float32 on a CPU: a
 * decode step spends more time dispatching the half-dozen torch ops of an RMSNorm or a rotary
 * embedding than computing them. Tested against transformers' LlamaRMSNorm and apply_rotary_pos_emb.
 * Built by kernels/cpu/native.py; called through ctypes from kernels/cpu/fused_ops.py.
 */
#include <math.h>
#include <stdint.h>

/* out[r] = weight * (x[r] / sqrt(mean(x[r]^2) + eps)) */
void swarm_rms_norm(const float *x, const float *weight, int64_t rows, int64_t dim, float eps, float *out,
                    int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (rows * dim > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float lanes[8] = {0};
        for (int64_t i = 0; i < dim; i++) lanes[i % 8] += xr[i] * xr[i];
        float total = 0.0f;
        for (int l = 0; l < 8; l++) total += lanes[l];
        const float inverse = 1.0f / sqrtf(total / (float)dim + eps);
        float *o = out + r * dim;
        for (int64_t i = 0; i < dim; i++) o[i] = weight[i] * (xr[i] * inverse);
    }
}

/* Rotate-half rotary embedding of x [tokens, heads, dim] with cos, sin [tokens, dim]:
 * out = x * cos + cat(-x[half:], x[:half]) * sin, the same three roundings as the torch code. */
void swarm_rotary(const float *x, int64_t tokens, int64_t heads, int64_t dim, const float *cos_, const float *sin_,
                  float *out, int threads) {
    const int64_t half = dim / 2;
    #pragma omp parallel for schedule(static) num_threads(threads) if (tokens * heads * dim > 65536)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_ + t * dim, *s = sin_ + t * dim;
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + (t * heads + h) * dim;
            float *o = out + (t * heads + h) * dim;
            for (int64_t i = 0; i < half; i++) o[i] = xh[i] * c[i] + (-xh[i + half]) * s[i];
            for (int64_t i = half; i < dim; i++) o[i] = xh[i] * c[i] + xh[i - half] * s[i];
        }
    }
}
