/* One row of an RMSNorm, one head of a rotary embedding and a run of silu(gate) * up, float32, shared by
 * fused_ops.c (the ops), decode_layer.c (a decode step's layer) and decode_stack.c (a decode step's layers),
 * so that all give the same bits. */
#pragma once
#include <math.h>
#include <string.h>
#include <stdint.h>

#include "vector_exp.h"

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

/* silu(g) = g * sigmoid(g), with sigmoid from e = exp(-|g|) (never overflows; exp8 stops at -87, so e = 0
   past it): 1 / (1 + e) for g >= 0, e / (1 + e) below */
static inline float silu_of(float g, float e) { return g * ((g >= 0.0f ? 1.0f : e) / (1.0f + e)); }

/* out[i] = silu(gate[i]) * up[i] for i < n; out may be gate or up */
static inline void silu_mul_run(const float *gate, const float *up, int64_t n, float *out) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
        const __m256 minus = _mm256_sub_ps(zero, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g));
        const __m256 e = _mm256_and_ps(exp8(minus), _mm256_cmp_ps(minus, _mm256_set1_ps(-87.0f), _CMP_GE_OQ));
        const __m256 top = _mm256_blendv_ps(e, one, _mm256_cmp_ps(g, zero, _CMP_GE_OQ));
        const __m256 silu = _mm256_mul_ps(g, _mm256_div_ps(top, _mm256_add_ps(one, e)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, u));
    }
    float g[8] = {0}, u[8] = {0}, e[8];   /* the tail through a padded copy: the same lanes' arithmetic */
    const int64_t tail = n - i;
    memcpy(g, gate + i, sizeof(float) * (size_t)tail);
    memcpy(u, up + i, sizeof(float) * (size_t)tail);
    for (int l = 0; l < 8; l++) e[l] = -fabsf(g[l]);
    _mm256_storeu_ps(e, exp8(_mm256_loadu_ps(e)));
    for (int64_t l = 0; l < tail; l++) out[i + l] = silu_of(g[l], -fabsf(g[l]) >= -87.0f ? e[l] : 0.0f) * u[l];
#else
    for (; i < n; i++) out[i] = silu_of(gate[i], expf(-fabsf(gate[i]))) * up[i];
#endif
}
