/* One row of an RMSNorm and one head of a rotary embedding, float32, shared by fused_ops.c (the ops) and
 * decode_layer.c (a decode step's layer in three calls), so that both give the same bits. */
#pragma once
#include <math.h>
#include <stdint.h>

/* out = weight * (x / sqrt(mean(x^2) + eps)); out may be x */
static inline void rms_norm_row(const float *x, const float *weight, int64_t dim, float eps, float *out) {
    float lanes[8] = {0};
    for (int64_t i = 0; i < dim; i++) lanes[i % 8] += x[i] * x[i];
    float total = 0.0f;
    for (int l = 0; l < 8; l++) total += lanes[l];
    const float inverse = 1.0f / sqrtf(total / (float)dim + eps);
    for (int64_t i = 0; i < dim; i++) out[i] = weight[i] * (x[i] * inverse);
}

/* out = x * c + cat(-x[half:], x[:half]) * s, the same three roundings as the torch code; out is not x */
static inline void rotary_head(const float *x, const float *c, const float *s, int64_t dim, float *out) {
    const int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) out[i] = x[i] * c[i] + (-x[i + half]) * s[i];
    for (int64_t i = half; i < dim; i++) out[i] = x[i] * c[i] + x[i - half] * s[i];
}
