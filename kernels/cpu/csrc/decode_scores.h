/* The arithmetic of one chunk of decode attention's scores and softmax, shared by kernels/cpu/csrc/paged_decode.c
 * (each sequence over its own blocks) and kernels/cpu/csrc/prefix_attention.c (many rows over a shared trunk), so
 * that a chunk of a trunk gets the same bits from either: a row reads its trunk shared or alone, and its attention
 * is the same. Each dot product runs in 8 lanes over the dims and is then summed across them; a row's exponentials
 * are summed in 8 lanes over the keys, then across them. The outputs (each a chain of multiply-adds over the keys
 * in order) the kernels compute in their own ways, which give the same bits.
 */
#ifndef SWARM_DECODE_SCORES_H
#define SWARM_DECODE_SCORES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) || defined(__FMA__)
#include <immintrin.h>
#endif

#define DECODE_KEYS 8   /* keys scored at once: their sums side by side, then reduced together */
#define DECODE_CHUNK 256   /* keys a chunk: both kernels cut a context at its multiples, so their chunks agree */

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

/* a * b + c, fused where the machine has FMA (every build on it alike), else rounded twice */
static inline v8 fma8(v8 a, v8 b, v8 c) {
#if defined(__FMA__)
    return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

/* the sums of the 8 lanes of each of 8 vectors, as one vector: lanes paired, then pairs, then halves */
static inline v8 sums_of_8(const v8 *acc) {
#if defined(__AVX2__)
    const __m256 a = _mm256_hadd_ps((__m256)acc[0], (__m256)acc[1]), b = _mm256_hadd_ps((__m256)acc[2], (__m256)acc[3]);
    const __m256 c = _mm256_hadd_ps((__m256)acc[4], (__m256)acc[5]), d = _mm256_hadd_ps((__m256)acc[6], (__m256)acc[7]);
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    return (v8)_mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
#else
    v8 out;
    for (int i = 0; i < 8; i++) {
        const v8 x = acc[i];
        out[i] = (((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7])));
    }
    return out;
#endif
}

/* the largest of s[0 .. n), 8 lanes at a time and then across the lanes */
static inline float max_of(const float *s, int64_t n) {
    float top = -INFINITY;
    int64_t i = 0;
#if defined(__AVX2__)
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + i));
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++) top = lanes[l] > top ? lanes[l] : top;
#endif
    for (; i < n; i++) top = s[i] > top ? s[i] : top;
    return top;
}

/* the sum of s[0 .. n), in 8 lanes and then across them */
static inline float sum_of(const float *s, int64_t n) {
    v8 acc = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc += load8(s + i);
    float total = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; i < n; i++) total += s[i];
    return total;
}

/* scores[g * stride + i] = scale * (q[g] . key i) for DECODE_KEYS keys (keys[i]: key i's row of one KV head) and
   the head's query groups q; each dot product in 8 lanes, then the lanes of the keys summed together */
static inline void score_keys(const float *q, int64_t groups, const float *const *keys, int64_t dim, float scale,
                              float *scores, int64_t stride) {
    for (int64_t g = 0; g < groups; g++) {
        v8 acc[DECODE_KEYS] = {{0}};
        for (int64_t d = 0; d < dim; d += 8) {
            const v8 query = load8(q + g * dim + d);
            for (int i = 0; i < DECODE_KEYS; i++) acc[i] = fma8(load8(keys[i] + d), query, acc[i]);
        }
        store8(scores + g * stride, sums_of_8(acc) * scale);
    }
}

#endif
