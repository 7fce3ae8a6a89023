/* bfloat16 products summed in float32, as AVX512-BF16's vdpbf16ps computes them (csrc/bf16_matmul.c's prompt
 * matmuls). Operands are 32-bit words, each a pair of
 * bfloat16 values of consecutive depths (the lower depth in the low half). For each output, over the pairs in
 * order, from sum = 0:
 *     sum = flush(sum + a[k + 1] * b[k + 1]);  sum = flush(sum + a[k] * b[k])
 * each product exact in float32, each sum rounded, values below 2^-126 flushed to zero as the instruction does
 * (bf16_bits flushes the inputs); then y = sum * scale (+ bias). The plain-C code for CPUs without AVX512-BF16
 * takes the same steps, so both give the same bits, and a row's never depend on the rows beside it.
 *
 * b is laid out in panels of 16 outputs: the pair j of panel p's 16 outputs are 16 consecutive words at
 * b + p * panel_step + j * pair_step. a's row r, pair j is a[r * a_step + j].
 */
#ifndef SWARM_BF16_TILES_H
#define SWARM_BF16_TILES_H

#include <stdint.h>
#include <string.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#define BF16_LANES 16
#define BF16_PANELS 4      /* panels (of 16 outputs) a step */
#define BF16_ROWS 6        /* rows a step: BF16_ROWS x BF16_PANELS sums in registers */

static inline uint32_t bf16_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (bits >> 16) | 0x40u;                      /* NaN stays NaN */
    if ((bits & 0x7f800000u) == 0)
        return (bits >> 16) & 0x8000u;                    /* below 2^-126: zero, its sign kept */
    return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  /* to nearest, ties to even */
}

static inline uint32_t bf16_pair(float low, float high) {
    return bf16_bits(low) | bf16_bits(high) << 16;
}

/* count floats of a row (count even) as count / 2 pairs; vcvtne2ps2bf16 rounds as bf16_bits does */
static inline void bf16_pairs_of_row(const float *row, int64_t count, uint32_t *pairs) {
    int64_t j = 0;
#if defined(__AVX512BF16__)
    for (; 2 * j + 32 <= count; j += 16) {
        const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + 2 * j + 16), _mm512_loadu_ps(row + 2 * j));
        _mm512_storeu_si512(pairs + j, (__m512i)both);
    }
#endif
    for (; 2 * j < count; j++)
        pairs[j] = bf16_pair(row[2 * j], row[2 * j + 1]);
}

typedef struct {   /* two stretches of `lines` cache lines read next (a chunk's keys and values), prefetched a line
                      of each a pair of a product's step */
    const char *first, *second;
    int64_t lines, next;
} bf16_ahead;

static inline void bf16_prefetch_next(bf16_ahead *ahead) {
    if (ahead->next < ahead->lines) {
        __builtin_prefetch(ahead->first + 64 * ahead->next, 0, 3);
        __builtin_prefetch(ahead->second + 64 * ahead->next, 0, 3);
        ahead->next++;
    }
}

typedef struct {
    const uint32_t *a;
    int64_t a_step, pairs;
    const uint32_t *b;
    int64_t panel_step, pair_step;
    const float *bias;    /* or NULL */
    float scale;
    float *y;
    int64_t y_step;
    bf16_ahead *ahead;    /* or NULL: memory to prefetch as the products run (the decode attention's next chunk) */
} bf16_problem;

#if defined(__AVX512BF16__)
/* rows x panels outputs (the last panel's first `last` lanes) from row 0 and panel 0 of the problem's pointers */
static inline __attribute__((always_inline)) void bf16_step(int rows, int panels, const bf16_problem *p,
                                                            int64_t last) {
    __m512 sum[BF16_ROWS][BF16_PANELS];
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < panels; q++)
            sum[r][q] = _mm512_setzero_ps();
    bf16_ahead ahead;   /* a copy the loop keeps in registers, its place written back after */
    if (p->ahead) ahead = *p->ahead;
    for (int64_t j = 0; j < p->pairs; j++) {
        if (p->ahead) bf16_prefetch_next(&ahead);
        __m512bh b[BF16_PANELS];
        for (int q = 0; q < panels; q++)
            b[q] = (__m512bh)_mm512_loadu_si512(p->b + q * p->panel_step + j * p->pair_step);
        for (int r = 0; r < rows; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)p->a[r * p->a_step + j]);
            for (int q = 0; q < panels; q++)
                sum[r][q] = _mm512_dpbf16_ps(sum[r][q], b[q], a);
        }
    }
    if (p->ahead) p->ahead->next = ahead.next;
    const __m512 scale = _mm512_set1_ps(p->scale);
    for (int q = 0; q < panels; q++) {
        const __mmask16 lanes = q < panels - 1 || last >= BF16_LANES ? (__mmask16)0xffff
                                                                    : (__mmask16)((1u << last) - 1);
        const __m512 bias = p->bias ? _mm512_maskz_loadu_ps(lanes, p->bias + q * BF16_LANES) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++) {
            __m512 y = _mm512_mul_ps(sum[r][q], scale);
            if (p->bias) y = _mm512_add_ps(y, bias);
            _mm512_mask_storeu_ps(p->y + r * p->y_step + q * BF16_LANES, lanes, y);
        }
    }
}

#define BF16_STEP_PANELS(R) switch (panels) { case 1: bf16_step(R, 1, p, last); break; \
    case 2: bf16_step(R, 2, p, last); break; case 3: bf16_step(R, 3, p, last); break;  \
    default: bf16_step(R, 4, p, last); }

static void bf16_outputs(int rows, int panels, const bf16_problem *p, int64_t last) {
    switch (rows) {
        case 1: BF16_STEP_PANELS(1) break;
        case 2: BF16_STEP_PANELS(2) break;
        case 3: BF16_STEP_PANELS(3) break;
        case 4: BF16_STEP_PANELS(4) break;
        case 5: BF16_STEP_PANELS(5) break;
        default: BF16_STEP_PANELS(6)
    }
}
#else
static inline float bf16_widened(uint32_t half) {
    uint32_t bits = half << 16;
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

static inline float bf16_flushed(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    if ((bits & 0x7f800000u) == 0)
        bits &= 0x80000000u;
    memcpy(&value, &bits, 4);
    return value;
}

static void bf16_outputs(int rows, int panels, const bf16_problem *p, int64_t last) {
    const int64_t width = (panels - 1) * BF16_LANES + (last < BF16_LANES ? last : BF16_LANES);
    for (int r = 0; r < rows; r++)
        for (int64_t o = 0; o < width; o++) {
            const uint32_t *b = p->b + (o / BF16_LANES) * p->panel_step + o % BF16_LANES;
            float sum = 0.0f;
            for (int64_t j = 0; j < p->pairs; j++) {
                const uint32_t x = p->a[r * p->a_step + j], w = b[j * p->pair_step];
                sum = bf16_flushed(sum + bf16_widened(x >> 16) * bf16_widened(w >> 16));
                sum = bf16_flushed(sum + bf16_widened(x & 0xffffu) * bf16_widened(w & 0xffffu));
            }
            const float y = sum * p->scale;
            p->y[r * p->y_step + o] = p->bias ? y + p->bias[o] : y;
        }
}
#endif

/* rows a-rows x outputs b-outputs of the problem, from its pointers on, a step of BF16_ROWS x 64 at a time */
static inline void bf16_tile(const bf16_problem *problem, int64_t rows, int64_t outputs) {
    const int64_t span = BF16_PANELS * BF16_LANES;
    for (int64_t n0 = 0; n0 < outputs; n0 += span) {
        const int64_t left = outputs - n0 < span ? outputs - n0 : span;
        const int panels = (int)((left + BF16_LANES - 1) / BF16_LANES);
        for (int64_t m = 0; m < rows; m += BF16_ROWS) {
            bf16_problem p = *problem;
            p.a += m * p.a_step;
            p.b += n0 / BF16_LANES * p.panel_step;
            p.bias = p.bias ? p.bias + n0 : NULL;
            p.y += m * p.y_step + n0;
            bf16_outputs(rows - m < BF16_ROWS ? (int)(rows - m) : BF16_ROWS, panels, &p,
                         left - (panels - 1) * BF16_LANES);
        }
    }
}

#endif
