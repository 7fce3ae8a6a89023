/* The dense pieces of attention over a span of keys read in place from the KV cache: register-tiled products
 * and a column softmax, each with a portable-C twin, for kernels/cpu/csrc/rows_attention.c (prefill rows), whose
 * tiled products also give kernels/cpu/csrc/prefix_attention.c (decode rows over the shared trunk) its outputs;
 * a vector exp and the merge of chunks' partials, also for kernels/cpu/csrc/paged_decode.c.
 * Every sum runs in an order fixed by its operands' sizes, never by how rows are batched.
 */
#ifndef SWARM_ATTENTION_TILES_H
#define SWARM_ATTENTION_TILES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vector_exp.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* c[rows x 8 vecs] = a[rows x depth] b[depth x 8 vecs] * scale, where a's element (r, d) sits at
   a[r * row_step + d * depth_step] and b's rows are ldb apart; rows and vecs are constants after
   inlining, so the accumulators (at most 12) stay in registers. */
static inline __attribute__((always_inline)) void tile(const float *a, int64_t row_step, int64_t depth_step,
                                                       const float *b, int64_t ldb, int64_t depth, int rows,
                                                       int vecs, float *c, int64_t ldc, float scale) {
    __m256 acc[8][3];
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < vecs; i++) acc[r][i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < depth; d++) {
        __m256 bv[3];
        for (int i = 0; i < vecs; i++) {
            bv[i] = _mm256_loadu_ps(b + d * ldb + 8 * i);
            __asm__("" : "+x"(bv[i]));   /* keeps it in a register: GCC would reload it for every row */
        }
        for (int r = 0; r < rows; r++) {
            const __m256 x = _mm256_broadcast_ss(a + r * row_step + d * depth_step);
            for (int i = 0; i < vecs; i++) acc[r][i] = _mm256_fmadd_ps(x, bv[i], acc[r][i]);
        }
    }
    const __m256 s = _mm256_set1_ps(scale);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < vecs; i++) _mm256_storeu_ps(c + r * ldc + 8 * i, _mm256_mul_ps(acc[r][i], s));
}

#define TILE(R, V) tile(a + r * row_step, row_step, depth_step, b + j, ldb, depth, R, V, c + r * ldc + j, ldc, scale)

/* one strip of 24, 16 or 8 columns in 256-bit vectors, all rows, in tiles of 4, 6 or 8 rows (12 or 8 accumulators) */
static void strip8(const float *a, int64_t row_step, int64_t depth_step, const float *b, int64_t ldb, int64_t rows,
                  int64_t depth, int64_t j, int vecs, float *c, int64_t ldc, float scale) {
    const int step = vecs == 3 ? 4 : vecs == 2 ? 6 : 8;
    int64_t r = 0;
    for (; r + step <= rows; r += step) {
        if (vecs == 3) TILE(4, 3); else if (vecs == 2) TILE(6, 2); else TILE(8, 1);
    }
    switch ((rows - r) * 4 + vecs) {   /* the remainder: (rows left, vecs) */
        case 1 * 4 + 3: TILE(1, 3); break;
        case 2 * 4 + 3: TILE(2, 3); break;
        case 3 * 4 + 3: TILE(3, 3); break;
        case 1 * 4 + 2: TILE(1, 2); break;
        case 2 * 4 + 2: TILE(2, 2); break;
        case 3 * 4 + 2: TILE(3, 2); break;
        case 4 * 4 + 2: TILE(4, 2); break;
        case 5 * 4 + 2: TILE(5, 2); break;
        case 1 * 4 + 1: TILE(1, 1); break;
        case 2 * 4 + 1: TILE(2, 1); break;
        case 3 * 4 + 1: TILE(3, 1); break;
        case 4 * 4 + 1: TILE(4, 1); break;
        case 5 * 4 + 1: TILE(5, 1); break;
        case 6 * 4 + 1: TILE(6, 1); break;
        case 7 * 4 + 1: TILE(7, 1); break;
        default: break;
    }
}

#endif

#if defined(__AVX512F__)
#include <immintrin.h>

/* AVX-512: the steps of the AVX2 code below in 16 lanes, with the same operations lane for lane,
   so both builds give the same bits. A strip's last vector may hold 8 columns, masked. */

static inline __m512 exp16(__m512 x) {   /* exp8's steps; 2^n applied by vscalefps, exactly as exp8's exponent add */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* c[rows x vecs*16] = a b * scale as tile() below; the last vector's columns are those in `last` */
static inline __attribute__((always_inline)) void tile16(const float *a, int64_t row_step, int64_t depth_step,
                                                         const float *b, int64_t ldb, int64_t depth, int rows,
                                                         int vecs, __mmask16 last, float *c, int64_t ldc,
                                                         float scale) {
    __m512 acc[12][4];
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < vecs; i++) acc[r][i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < depth; d++) {
        __m512 bv[4];
        for (int i = 0; i < vecs; i++) {
            bv[i] = i == vecs - 1 ? _mm512_maskz_loadu_ps(last, b + d * ldb + 16 * i)
                                  : _mm512_loadu_ps(b + d * ldb + 16 * i);
            __asm__("" : "+v"(bv[i]));   /* keeps it in a register: GCC would reload it for every row */
        }
        for (int r = 0; r < rows; r++) {
            const __m512 x = _mm512_set1_ps(a[r * row_step + d * depth_step]);
            for (int i = 0; i < vecs; i++) acc[r][i] = _mm512_fmadd_ps(x, bv[i], acc[r][i]);
        }
    }
    const __m512 s = _mm512_set1_ps(scale);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < vecs; i++) {
            if (i == vecs - 1) _mm512_mask_storeu_ps(c + r * ldc + 16 * i, last, _mm512_mul_ps(acc[r][i], s));
            else _mm512_storeu_ps(c + r * ldc + 16 * i, _mm512_mul_ps(acc[r][i], s));
        }
}

#define TILE16(R, V) tile16(a + r * row_step, row_step, depth_step, b + j, ldb, depth, R, V, last, c + r * ldc + j, \
                            ldc, scale)
#define STRIP16(STEP, V) do { \
        for (; r + (STEP) <= rows; r += (STEP)) TILE16(STEP, V); \
        for (; r + 4 <= rows; r += 4) TILE16(4, V); \
        for (; r < rows; r++) TILE16(1, V); \
    } while (0)

/* one strip of 1 to 4 vectors (the last with columns `last`), all rows: tiles of 24 accumulators
   (12 for one vector), then of 4 rows and of 1 */
static void strip(const float *a, int64_t row_step, int64_t depth_step, const float *b, int64_t ldb, int64_t rows,
                  int64_t depth, int64_t j, int vecs, __mmask16 last, float *c, int64_t ldc, float scale) {
    int64_t r = 0;
    if (vecs == 4) STRIP16(6, 4);
    else if (vecs == 3) STRIP16(8, 3);
    else if (vecs == 2) STRIP16(12, 2);
    else STRIP16(12, 1);
}

/* c[rows x cols] = a @ b * scale; cols is a multiple of 8 */
static void matmul(const float *a, int64_t row_step, int64_t depth_step, const float *b, int64_t ldb,
                   int64_t rows, int64_t depth, int64_t cols, float *c, int64_t ldc, float scale) {
    int64_t j = 0;
    for (; j + 64 <= cols; j += 64) strip(a, row_step, depth_step, b, ldb, rows, depth, j, 4, 0xFFFF, c, ldc, scale);
    const int64_t whole = (cols - j) / 16;   /* then vectors of 16; 8 columns left take 256-bit vectors, where a
                                                half-masked 512-bit one costs a Zen 4 as much as a whole one */
    if (whole) strip(a, row_step, depth_step, b, ldb, rows, depth, j, (int)whole, 0xFFFF, c, ldc, scale);
    j += 16 * whole;
    if (j < cols) strip8(a, row_step, depth_step, b, ldb, rows, depth, j, 1, c, ldc, scale);
}

/* softmax_columns below, 16 columns at a time (the last 8 masked) */
static void softmax_columns(float *st, int64_t n, int64_t cols, float *top, float *total) {
    for (int64_t j = 0; j < cols; j += 16) {
        const __mmask16 lanes = cols - j >= 16 ? 0xFFFF : 0x00FF;
        __m512 m = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < n; t++) m = _mm512_max_ps(m, _mm512_maskz_loadu_ps(lanes, st + t * cols + j));
        for (int64_t t = 0; t < n; t++) {
            const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, st + t * cols + j), m));
            _mm512_mask_storeu_ps(st + t * cols + j, lanes, e);
            sum = _mm512_add_ps(sum, e);
        }
        _mm512_mask_storeu_ps(top + j, lanes, m);
        _mm512_mask_storeu_ps(total + j, lanes, sum);
    }
}

/* s[i] = exp(s[i] - top) for i < n, 16 at a time (the tail masked) */
static inline void exp_shifted(float *s, int64_t n, float top) {
    const __m512 shift = _mm512_set1_ps(top);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 lanes = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(s + i, lanes, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, s + i), shift)));
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* c[rows x cols] = a @ b * scale; cols is a multiple of 8 */
static void matmul(const float *a, int64_t row_step, int64_t depth_step, const float *b, int64_t ldb,
                   int64_t rows, int64_t depth, int64_t cols, float *c, int64_t ldc, float scale) {
    int64_t j = 0;
    for (; j + 24 <= cols; j += 24) strip8(a, row_step, depth_step, b, ldb, rows, depth, j, 3, c, ldc, scale);
    if (j + 16 <= cols) {
        strip8(a, row_step, depth_step, b, ldb, rows, depth, j, 2, c, ldc, scale);
        j += 16;
    }
    if (j < cols) strip8(a, row_step, depth_step, b, ldb, rows, depth, j, 1, c, ldc, scale);
}

/* each column of st [n x cols]: exp(value - column max) in place; the maxima and the columns'
   sums (added down the column: a fixed order) go to top and total. cols is a multiple of 8. */
static void softmax_columns(float *st, int64_t n, int64_t cols, float *top, float *total) {
    for (int64_t j = 0; j < cols; j += 8) {
        __m256 m = _mm256_set1_ps(-INFINITY), sum = _mm256_setzero_ps();
        for (int64_t t = 0; t < n; t++) m = _mm256_max_ps(m, _mm256_loadu_ps(st + t * cols + j));
        for (int64_t t = 0; t < n; t++) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(st + t * cols + j), m));
            _mm256_storeu_ps(st + t * cols + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        _mm256_storeu_ps(top + j, m);
        _mm256_storeu_ps(total + j, sum);
    }
}

/* s[i] = exp(s[i] - top) for i < n, 8 at a time (the tail through a padded copy) */
static inline void exp_shifted(float *s, int64_t n, float top) {
    const __m256 shift = _mm256_set1_ps(top);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), shift)));
    if (i < n) {
        float tail[8] = {0};
        memcpy(tail, s + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(tail, exp8(_mm256_sub_ps(_mm256_loadu_ps(tail), shift)));
        memcpy(s + i, tail, sizeof(float) * (size_t)(n - i));
    }
}

#else  /* portable C: the same steps, one lane at a time */

static void matmul(const float *a, int64_t row_step, int64_t depth_step, const float *b, int64_t ldb,
                   int64_t rows, int64_t depth, int64_t cols, float *c, int64_t ldc, float scale) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) {
            float s = 0.0f;
            for (int64_t d = 0; d < depth; d++) s += a[r * row_step + d * depth_step] * b[d * ldb + j];
            c[r * ldc + j] = s * scale;
        }
}

static void softmax_columns(float *st, int64_t n, int64_t cols, float *top, float *total) {
    for (int64_t j = 0; j < cols; j++) {
        float m = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < n; t++) m = st[t * cols + j] > m ? st[t * cols + j] : m;
        for (int64_t t = 0; t < n; t++) {
            st[t * cols + j] = expf(st[t * cols + j] - m);
            sum += st[t * cols + j];
        }
        top[j] = m;
        total[j] = sum;
    }
}

static inline void exp_shifted(float *s, int64_t n, float top) {
    for (int64_t i = 0; i < n; i++) s[i] = expf(s[i] - top);
}

#endif

/* After softmax_columns over a chunk's scores st [n x cols]: each of the first `rows` rows'
   partial = (max, sum, unnormalised output [dim]), its output P V with P read as st's transpose
   and V's rows `stride` floats apart. The kernels merge these partials by log-sum-exp. */
static inline void chunk_partial(const float *st, const float *sums, const float *v, int64_t stride, int64_t rows,
                                 int64_t cols, int64_t n, int64_t dim, float *partial) {
    for (int64_t r = 0; r < rows; r++) {
        partial[r * (dim + 2)] = sums[r];
        partial[r * (dim + 2) + 1] = sums[cols + r];
    }
    matmul(st, 1, cols, v, stride, rows, n, dim, partial + 2, dim + 2, 1.0f);
}

/* out and lse of one query row from its chunks' partials (max, sum, unnormalised output [dim]),
   `stride` floats apart, merged by log-sum-exp in chunk order; no chunks: out = 0, lse = -inf */
static inline void merge_chunks(const float *partials, int64_t chunks, int64_t stride, int64_t dim, float *out,
                                float *lse) {
    float top = -INFINITY, total = 0.0f;
    for (int64_t c = 0; c < chunks; c++) top = partials[c * stride] > top ? partials[c * stride] : top;
    memset(out, 0, sizeof(float) * (size_t)dim);
    if (chunks == 0) {
        *lse = -INFINITY;
        return;
    }
    for (int64_t c = 0; c < chunks; c++) {
        const float *part = partials + c * stride, weight = expf(part[0] - top);
        total += part[1] * weight;
        for (int64_t d = 0; d < dim; d++) out[d] += part[2 + d] * weight;
    }
    for (int64_t d = 0; d < dim; d++) out[d] /= total;
    *lse = top + logf(total);
}

#endif
