/* A sub-block of 32 float32 values quantized as GGUF's Q8_0 quantizes a tensor: d = max |v| / 127, each code
 * v / d rounded half away from zero (int8), the scale d rounded to float16 and back. gguf.quants.quantize(v, Q8_0)
 * gives the same codes and scale, so a value reads back as code * scale exactly as gguf.quants.dequantize reads
 * it. Shared by code_prompt.c (prompt rows of the integer matmuls) and rows_attention.c (the attention's integer
 * products); the plain-C steps give the AVX-512 ones' bits.
 */
#ifndef SWARM_Q8_BLOCKS_H
#define SWARM_Q8_BLOCKS_H

#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#define Q8_BLOCK 32   /* values a sub-block */

/* value rounded to float16 and back: to nearest, ties to even, as NumPy's astype(float16) (d >= 0 here) */
static inline float half_rounded(float value) {
#if defined(__F16C__)
    return _cvtsh_ss(_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT));
#else
    if (!(value > 0.0f) || value == INFINITY) return value;
    int exponent;
    frexpf(value, &exponent);   /* value = m 2^exponent, 1/2 <= m < 1: 11 bits kept, or float16's subnormal step */
    const float step = ldexpf(1.0f, (exponent > -13 ? exponent : -13) - 11);
    const float rounded = nearbyintf(value / step) * step;
    return rounded > 65504.0f ? INFINITY : rounded;
#endif
}

/* gguf's np_roundf: half away from zero, exactly */
static inline float round_away(float v) {
    const float a = fabsf(v), floored = floorf(a);
    return copysignf(floored + floorf(2.0f * (a - floored)), v);
}

#if defined(__AVX512F__)
/* 16 of a sub-block's values over `inverse` as round_away rounds them, to int8; returns their sum */
static inline int32_t quantize16(const float *v, float inverse, int8_t *q) {
    const __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(v), _mm512_set1_ps(inverse));
    const __m512 a = _mm512_abs_ps(scaled), floored = _mm512_floor_ps(a);
    const __m512 away = _mm512_add_ps(floored, _mm512_floor_ps(_mm512_add_ps(_mm512_sub_ps(a, floored),
                                                                             _mm512_sub_ps(a, floored))));
    const __m512i codes = _mm512_cvttps_epi32(_mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(away), _mm512_and_si512(_mm512_castps_si512(scaled), _mm512_set1_epi32(INT32_MIN)))));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(codes));
    return _mm512_reduce_add_epi32(codes);
}
#endif

/* n values v (n: 32 or 64) quantized alike, as one sub-block, to codes q [n] and *scale; returns the codes' sum */
static inline int32_t q8_values(const float *v, int n, int8_t *q, float *scale) {
    float top = 0.0f;
#if defined(__AVX512F__)
    __m512 most = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) most = _mm512_max_ps(most, _mm512_abs_ps(_mm512_loadu_ps(v + i)));
    top = _mm512_reduce_max_ps(most);
#else
    for (int i = 0; i < n; i++) top = fabsf(v[i]) > top ? fabsf(v[i]) : top;
#endif
    const float d = top / 127.0f, inverse = d == 0.0f ? 0.0f : 1.0f / d;
    int32_t sum = 0;
#if defined(__AVX512F__)
    for (int i = 0; i < n; i += 16) sum += quantize16(v + i, inverse, q + i);
#else
    for (int i = 0; i < n; i++) {
        q[i] = (int8_t)round_away(v[i] * inverse);
        sum += q[i];
    }
#endif
    *scale = half_rounded(d);
    return sum;
}

/* the sub-block v [32] as codes q [32] and *scale; returns the codes' sum */
static inline int32_t q8_block(const float *v, int8_t *q, float *scale) { return q8_values(v, Q8_BLOCK, q, scale); }

#endif
