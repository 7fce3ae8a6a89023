/* Integer products of byte codes with a scale for each sub-block of depths, summed as AVX512-VNNI's vpdpbusd sums
 * them (64 byte products an instruction): the prompt attention's products in integers (rows_attention_i8.h), with
 * codes quantized as GGUF's Q8_0 quantizes (q8_blocks.h).
 *
 * a's bytes are signed codes, b's unsigned ones. Operands are 32-bit words, each 4 codes of consecutive depths
 * (a quad); a sub-block is block_quads quads. For each output (row r of a, output o of b), for the sub-blocks s in
 * turn, from acc = 0:
 *     S = the sub-block's code products summed (int32, exact) - offset[r, s]
 *     acc = fma(S, a_scale[r, s] * b_scale[o, s], acc)          (the scales' product rounded to float32)
 * then y = acc * scale. The offset takes off what b's codes carry where they are signed codes + 128 (128 times the
 * sum of a's codes, exact); a missing offset is 0, a missing scale 1. The plain-C code for CPUs without
 * AVX512-VNNI takes the same steps, so both give the same bits, and a row's never depend on the rows beside it.
 *
 * b is laid out in panels of 16 outputs: quad j of panel p's outputs is 16 consecutive words at
 * b + p * panel_step + j * quad_step; its scales of sub-block s, 16 floats at b_scales + p * scales_step + 16 s.
 * a's row r, quad j is a[r * a_step + j]; its scale of sub-block s a_scales[r * a_scales_step + s], its offset
 * a_offsets[r * a_scales_step + s].
 */
#ifndef SWARM_I8_TILES_H
#define SWARM_I8_TILES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512VNNI__)
#include <immintrin.h>
#endif

#define I8_LANES 16
#define I8_QUADS 8         /* quads a step's loop takes at once: block_quads is a multiple of it */
#define I8_PANELS 4        /* panels (of 16 outputs) a step */
#define I8_ROWS 4          /* rows a step: I8_ROWS x I8_PANELS int32 sums in registers (6 x 4 spilled) */

typedef struct {
    const uint32_t *a;
    int64_t a_step, quads;      /* quads: the depth / 4, a multiple of block_quads */
    int64_t block_quads;        /* a sub-block's quads: a multiple of I8_QUADS */
    const uint32_t *b;
    int64_t panel_step, quad_step;
    const float *a_scales;      /* or NULL */
    const int32_t *a_offsets;   /* or NULL */
    int64_t a_scales_step;
    const float *b_scales;      /* or NULL */
    int64_t scales_step;
    float scale;
    float *y;
    int64_t y_step;
} i8_problem;

#if defined(__AVX512VNNI__)
/* rows x panels outputs (the last panel's first `last` lanes) from row 0 and panel 0 of the problem's pointers: each
   sub-block's int32 sums in registers, the float32 ones in y until the last sub-block scales them */
static inline __attribute__((always_inline)) void i8_step(int rows, int panels, const i8_problem *p, int64_t last) {
    const __mmask16 tail = last >= I8_LANES ? (__mmask16)0xffff : (__mmask16)((1u << last) - 1);
    const int64_t subs = p->quads / p->block_quads;
    for (int64_t s = 0; s < subs; s++) {
        __m512i sum[I8_ROWS][I8_PANELS];
        for (int r = 0; r < rows; r++)
            for (int q = 0; q < panels; q++) sum[r][q] = _mm512_setzero_si512();
        for (int64_t j0 = s * p->block_quads; j0 < (s + 1) * p->block_quads; j0 += I8_QUADS)
#pragma GCC unroll 8
            for (int g = 0; g < I8_QUADS; g++) {   /* unrolled: GCC keeps the sums in registers */
                const int64_t j = j0 + g;
                __m512i b[I8_PANELS];
                for (int q = 0; q < panels; q++) {
                    b[q] = _mm512_loadu_si512(p->b + q * p->panel_step + j * p->quad_step);
                    __asm__("" : "+v"(b[q]));   /* keeps it in a register: GCC would load it again for every row */
                }
                for (int r = 0; r < rows; r++) {
                    const __m512i a = _mm512_set1_epi32((int)p->a[r * p->a_step + j]);
                    for (int q = 0; q < panels; q++) sum[r][q] = _mm512_dpbusd_epi32(sum[r][q], b[q], a);
                }
            }
        for (int q = 0; q < panels; q++) {
            const __mmask16 lanes = q < panels - 1 ? (__mmask16)0xffff : tail;
            const __m512 b_scale = p->b_scales ? _mm512_loadu_ps(p->b_scales + q * p->scales_step + I8_LANES * s)
                                               : _mm512_set1_ps(1.0f);
            for (int r = 0; r < rows; r++) {
                const __m512 a_scale = _mm512_set1_ps(p->a_scales ? p->a_scales[r * p->a_scales_step + s] : 1.0f);
                const __m512i offset = _mm512_set1_epi32(p->a_offsets ? p->a_offsets[r * p->a_scales_step + s] : 0);
                float *y = p->y + r * p->y_step + q * I8_LANES;
                const __m512 acc = s == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lanes, y);
                __m512 sum_s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum[r][q], offset)),
                                               _mm512_mul_ps(a_scale, b_scale), acc);
                if (s == subs - 1) sum_s = _mm512_mul_ps(sum_s, _mm512_set1_ps(p->scale));
                _mm512_mask_storeu_ps(y, lanes, sum_s);
            }
        }
    }
}

/* each shape of step its own function: inlined into one, GCC left their sums on the stack */
#define I8_SHAPE(R, P) \
    static __attribute__((noinline)) void i8_step_##R##_##P(const i8_problem *p, int64_t last) { \
        i8_step(R, P, p, last);                                                              \
    }
#define I8_SHAPES(P) I8_SHAPE(1, P) I8_SHAPE(2, P) I8_SHAPE(3, P) I8_SHAPE(4, P)
I8_SHAPES(1) I8_SHAPES(2) I8_SHAPES(3) I8_SHAPES(4)
#define I8_ROW_STEPS(P) { i8_step_1_##P, i8_step_2_##P, i8_step_3_##P, i8_step_4_##P }

static void i8_outputs(int rows, int panels, const i8_problem *p, int64_t last) {
    typedef void (*step_fn)(const i8_problem *, int64_t);
    static const step_fn steps[I8_PANELS][I8_ROWS] = {I8_ROW_STEPS(1), I8_ROW_STEPS(2), I8_ROW_STEPS(3),
                                                      I8_ROW_STEPS(4)};
    steps[panels - 1][rows - 1](p, last);
}
#else
static void i8_outputs(int rows, int panels, const i8_problem *p, int64_t last) {
    const int64_t width = (panels - 1) * I8_LANES + (last < I8_LANES ? last : I8_LANES);
    for (int r = 0; r < rows; r++)
        for (int64_t o = 0; o < width; o++) {
            const uint32_t *b = p->b + (o / I8_LANES) * p->panel_step + o % I8_LANES;
            float acc = 0.0f;
            for (int64_t s = 0; s < p->quads / p->block_quads; s++) {
                int32_t sum = 0;
                for (int64_t j = s * p->block_quads; j < (s + 1) * p->block_quads; j++)
                    for (int k = 0; k < 4; k++)
                        sum += (int32_t)(int8_t)(uint8_t)(p->a[r * p->a_step + j] >> 8 * k)
                               * (int32_t)(uint8_t)(b[j * p->quad_step] >> 8 * k);
                if (p->a_offsets) sum -= p->a_offsets[r * p->a_scales_step + s];
                const float a_scale = p->a_scales ? p->a_scales[r * p->a_scales_step + s] : 1.0f;
                const float b_scale = p->b_scales ? p->b_scales[(o / I8_LANES) * p->scales_step + I8_LANES * s
                                                                + o % I8_LANES]
                                                  : 1.0f;
                acc = fmaf((float)sum, a_scale * b_scale, acc);
            }
            p->y[r * p->y_step + o] = acc * p->scale;
        }
}
#endif

/* rows a-rows x outputs b-outputs of the problem, from its pointers on, a step of I8_ROWS x 64 at a time */
static inline void i8_tile(const i8_problem *problem, int64_t rows, int64_t outputs) {
    const int64_t span = I8_PANELS * I8_LANES;
    for (int64_t n0 = 0; n0 < outputs; n0 += span) {
        const int64_t left = outputs - n0 < span ? outputs - n0 : span;
        const int panels = (int)((left + I8_LANES - 1) / I8_LANES);
        for (int64_t m = 0; m < rows; m += I8_ROWS) {
            i8_problem p = *problem;
            p.a += m * p.a_step;
            p.a_scales = p.a_scales ? p.a_scales + m * p.a_scales_step : NULL;
            p.a_offsets = p.a_offsets ? p.a_offsets + m * p.a_scales_step : NULL;
            p.b += n0 / I8_LANES * p.panel_step;
            p.b_scales = p.b_scales ? p.b_scales + n0 / I8_LANES * p.scales_step : NULL;
            p.y += m * p.y_step + n0;
            i8_outputs(rows - m < I8_ROWS ? (int)(rows - m) : I8_ROWS, panels, &p, left - (panels - 1) * I8_LANES);
        }
    }
}

#endif
