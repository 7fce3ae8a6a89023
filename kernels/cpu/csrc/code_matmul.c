/* Decode matmuls from quantized weights repacked once as code panels, multiplied in bfloat16 products without
 * expanding a value to bfloat16. A value of a sub-block b of 32 is a * code + c, with an integer code and the
 * sub-block's (a, c), so
 *     sum_k W[n, k] x[k] = a * sum_k (B + code_k) x[k] + (c - B a) * sum_k x[k]
 * and B + code is a bfloat16 the vector units make from the code directly:
 *     4-bit codes (Q4_0, Q4_1, Q4_K), B = 128: 0x4300 | code, two ops for 64 codes
 *     8-bit codes (Q8_0: c = 0), B = 0: the signed byte widened and converted, five ops for 32
 * where expanding blocks to bfloat16 values (quant_columns.h) took about six for 32 and rounded every value. On
 * two Zen 4 cores, 8 rows against a 4,096 x 4,096 Q4_1 weight took 1.45x less time, one row 3.2x less.
 *
 * Each output element, x's rows rounded to bfloat16 (bf16_tiles.h), for the sub-blocks b in turn, from acc = 0:
 *     S = vdpbf16ps's sum of the pairs (k, k + 1) of the sub-block in order, from 0 (bf16_tiles.h's top), of
 *         x[k] and B + code_k
 *     acc = acc + S * a
 *     4-bit codes only: X = x[k] summed in float32 over the sub-block's 32 values in order, from 0, and
 *                       acc = acc + (c - 128 a) * X              (each product and sum rounded to float32)
 * then y = acc + bias. A row's bits depend on its own values only, never on the rows beside it; the plain-C code
 * for CPUs without AVX512-BF16 takes the same steps. Oracle: kernels/reference/code_matmul.py.
 *
 * Layout, a cell for each panel p of 16 weight rows and sub-block b, [ceil(N / 16)][K / 32][cell_bytes]:
 *     4-bit codes [8][32 bytes]  group g: byte 2 j + e holds row j's code of value 4 g + e in its low nibble and
 *                                of value 4 g + 2 + e in its high one (widened to 16-bit words, the low nibbles
 *                                are the pairs (4 g, 4 g + 1) of the 16 rows, the high ones (4 g + 2, 4 g + 3))
 *     8-bit codes [16][32 bytes] pair i: byte 2 j + e holds row j's code of value 2 i + e
 *     a [16], c [16]             float32, row j's
 * 1.2x the bytes of Q4_1's blocks, 1.1x Q8_0's. Built by kernels/cpu/native.py; called from
 * kernels/cpu/code_matmul.py and through quant_matmul.c's weight sets.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_tiles.h"
#include "code_matmul.h"
#include "quant_blocks.h"
#include "task_pool.h"

#define LANES CODE_LANES
#define MAX_ROWS 8           /* rows a step */
#define PANELS_A_TASK 4
#define NIBBLE_BIAS 128.0f   /* 0x4300 as bfloat16 */

int64_t swarm_code_cell_bytes(int format) { return code_bytes(code_bits(format)) + CODE_SCALE_BYTES; }

/* the codes and (a, c) of sub-block s of a block: value l = a * codes[l] + c, gguf's value */
static void sub_block_codes(int format, const uint8_t *block, int s, int codes[32], float *a, float *c) {
    const float d = half_to_float(block);
    if (format == Q4_K) {
        int sc, mn;
        k_scale_min(block + 4, s, &sc, &mn);
        *a = d * (float)sc;
        *c = -(half_to_float(block + 2) * (float)mn);
        for (int l = 0; l < 32; l++) codes[l] = block[16 + 32 * (s / 2) + l] >> 4 * (s & 1) & 0x0F;
        return;
    }
    *a = d;
    *c = format == Q4_1 ? half_to_float(block + 2) : format == Q4_0 ? -8.0f * d : 0.0f;   /* Q4_0: d * (q - 8) */
    for (int l = 0; l < 32; l++)
        codes[l] = format == Q8_0 ? (int8_t)block[2 + l] : nibble(block + (format == Q4_1 ? 4 : 2), l);
}

/* weight row n's sub-blocks into lane n % 16 of its panel's cells */
static void pack_row(const uint8_t *row, int format, int64_t K, int64_t n, uint8_t *panels) {
    const int64_t subs = K / 32, j = n % LANES, bytes = block_bytes(format), cell_bytes = swarm_code_cell_bytes(format);
    const int per_block = block_values(format) / 32, eight = code_bits(format) == 8;
    for (int64_t b = 0; b < subs; b++) {
        uint8_t *cell = panels + ((n / LANES) * subs + b) * cell_bytes, *scales = cell + code_bytes(eight ? 8 : 4);
        int codes[32];
        float a, c;
        sub_block_codes(format, row + (b / per_block) * bytes, (int)(b % per_block), codes, &a, &c);
        for (int g = 0; g < 16; g++)
            for (int e = 0; e < 2; e++) {
                if (eight)
                    cell[32 * g + 2 * j + e] = (uint8_t)(int8_t)codes[2 * g + e];
                else if (g < 8)
                    cell[32 * g + 2 * j + e] = (uint8_t)(codes[4 * g + e] | codes[4 * g + 2 + e] << 4);
            }
        memcpy(scales + 4 * j, &a, 4);
        memcpy(scales + 4 * (LANES + j), &c, 4);
    }
}

/* q: N rows of format's blocks (K values a row) -> panels [ceil(N / 16)][K / 32][cell bytes], lanes past N 0 */
void swarm_code_pack(const uint8_t *q, int format, int64_t N, int64_t K, uint8_t *panels, int threads) {
    const int64_t count = (N + LANES - 1) / LANES, row_bytes = K / block_values(format) * block_bytes(format);
    memset(panels, 0, (size_t)(count * (K / 32) * swarm_code_cell_bytes(format)));
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) pack_row(q + n * row_bytes, format, K, n, panels);
}

typedef struct {
    const uint32_t *pairs;   /* x's rows rounded, K / 2 words a row */
    const float *sums;       /* [M][K / 32]: X of each row's sub-blocks */
    int64_t M, K;
    const uint8_t *const *panels;
    const int *formats;
    const int64_t *N;
    const float *const *bias;
    float *const *y;
} Work;

typedef struct {   /* one weight's */
    const uint8_t *panels;
    int bits;
    int64_t cell_bytes, N;
    const float *bias;   /* or NULL */
    float *y;            /* [M][N] */
} Out;

static inline const uint8_t *cell_of(const Work *w, const Out *o, int64_t p, int64_t b) {
    return o->panels + (p * (w->K / 32) + b) * o->cell_bytes;
}

#if defined(__AVX512BF16__)
/* pair i's operands (B + code) of 16 weight rows from a cell's codes */
static inline __attribute__((always_inline)) __m512bh byte_pair(const uint8_t *codes, int i) {
    const __m128i low = _mm_loadu_si128((const __m128i *)(codes + 32 * i));
    const __m128i high = _mm_loadu_si128((const __m128i *)(codes + 32 * i + 16));
    return _mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(high)),
                               _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(low)));
}

/* rows [m0, m0 + R) x panels [p0, p0 + P) of one weight of `bits`-bit codes */
static inline __attribute__((always_inline)) void step(int bits, int R, int P, const Work *w, const Out *o,
                                                       int64_t m0, int64_t p0) {
    const int64_t subs = w->K / 32, half = w->K / 2;
    const __m512i low = _mm512_set1_epi16(0x0F), bias = _mm512_set1_epi16(0x4300);
    __m512 acc[MAX_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int q = 0; q < P; q++) acc[r][q] = _mm512_setzero_ps();
    for (int64_t b = 0; b < subs; b++) {
        __m512 sum[MAX_ROWS][4];
        for (int r = 0; r < R; r++)
            for (int q = 0; q < P; q++) sum[r][q] = _mm512_setzero_ps();
        for (int g = 0; g < 8; g++) {
            __m512bh even[4], odd[4];   /* the pairs 2 g and 2 g + 1 of the sub-block */
            for (int q = 0; q < P; q++) {
                const uint8_t *codes = cell_of(w, o, p0 + q, b);
                if (bits == 8) {
                    even[q] = byte_pair(codes, 2 * g);
                    odd[q] = byte_pair(codes, 2 * g + 1);
                    continue;
                }
                const __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(codes + 32 * g)));
                even[q] = (__m512bh)_mm512_ternarylogic_epi32(words, low, bias, 0xEA);   /* words & low | bias */
                odd[q] = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(words, 4), bias);
            }
            for (int r = 0; r < R; r++) {
                const uint32_t *x = w->pairs + (m0 + r) * half + 16 * b + 2 * g;
                const __m512bh x0 = (__m512bh)_mm512_set1_epi32((int)x[0]), x1 = (__m512bh)_mm512_set1_epi32((int)x[1]);
                for (int q = 0; q < P; q++) {
                    sum[r][q] = _mm512_dpbf16_ps(sum[r][q], even[q], x0);
                    sum[r][q] = _mm512_dpbf16_ps(sum[r][q], odd[q], x1);
                }
            }
        }
        for (int q = 0; q < P; q++) {
            const float *ac = (const float *)(cell_of(w, o, p0 + q, b) + code_bytes(bits));
            const __m512 a = _mm512_loadu_ps(ac);
            const __m512 offset = _mm512_sub_ps(_mm512_loadu_ps(ac + LANES), _mm512_mul_ps(a, _mm512_set1_ps(NIBBLE_BIAS)));
            for (int r = 0; r < R; r++) {
                acc[r][q] = _mm512_add_ps(acc[r][q], _mm512_mul_ps(sum[r][q], a));
                if (bits == 4)
                    acc[r][q] = _mm512_add_ps(acc[r][q],
                                              _mm512_mul_ps(offset, _mm512_set1_ps(w->sums[(m0 + r) * subs + b])));
            }
        }
    }
    for (int q = 0; q < P; q++) {
        const int64_t n0 = LANES * (p0 + q), left = o->N - n0;
        const __mmask16 lanes = left >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        const __m512 bias_n = o->bias ? _mm512_maskz_loadu_ps(lanes, o->bias + n0) : _mm512_setzero_ps();
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(o->y + (m0 + r) * o->N + n0, lanes,
                                  o->bias ? _mm512_add_ps(acc[r][q], bias_n) : acc[r][q]);
    }
}

#define STEP(R, P) (o->bits == 8 ? step(8, R, P, w, o, m0, p) : step(4, R, P, w, o, m0, p))

/* rows [m0, m0 + R) against panels [p, p + P) (P: 4 for 1-2 rows, 2 for 3-4, else 1: chains enough to hide
   vdpbf16ps's latency, sums that fit the registers) into the outputs; returns P */
static int64_t rows_step(int R, const Work *w, const Out *o, int64_t m0, int64_t p, int64_t stop) {
    if (R <= 2 && p + 4 <= stop) {
        if (R == 1) STEP(1, 4); else STEP(2, 4);
        return 4;
    }
    if (R <= 4 && p + 2 <= stop) {
        switch (R) { case 1: STEP(1, 2); break; case 2: STEP(2, 2); break; case 3: STEP(3, 2); break;
                     default: STEP(4, 2); }
        return 2;
    }
    switch (R) { case 1: STEP(1, 1); break; case 2: STEP(2, 1); break; case 3: STEP(3, 1); break;
                 case 4: STEP(4, 1); break; case 5: STEP(5, 1); break; case 6: STEP(6, 1); break;
                 case 7: STEP(7, 1); break; default: STEP(8, 1); }
    return 1;
}
#else   /* bf16_tiles.h's plain-C vdpbf16ps steps: bf16_widened, bf16_flushed */

/* B + the code of row j's value 2 i + e in a cell */
static float operand(const Out *o, const uint8_t *cell, int j, int i, int e) {
    if (o->bits == 8) return (float)(int8_t)cell[32 * i + 2 * j + e];
    return NIBBLE_BIAS + (float)(cell[32 * (i / 2) + 2 * j + e] >> 4 * (i % 2) & 0x0F);
}

/* the same arithmetic one lane at a time, for builds without AVX512-BF16 */
static int64_t rows_step(int R, const Work *w, const Out *o, int64_t m0, int64_t p, int64_t stop) {
    (void)stop;
    const int64_t subs = w->K / 32, half = w->K / 2;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < LANES && LANES * p + j < o->N; j++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < subs; b++) {
                const uint8_t *cell = cell_of(w, o, p, b);
                const uint32_t *x = w->pairs + (m0 + r) * half + 16 * b;
                float sum = 0.0f, a, c;
                for (int i = 0; i < 16; i++) {
                    sum = bf16_flushed(sum + bf16_widened(x[i] >> 16) * operand(o, cell, j, i, 1));
                    sum = bf16_flushed(sum + bf16_widened(x[i] & 0xffffu) * operand(o, cell, j, i, 0));
                }
                memcpy(&a, cell + code_bytes(o->bits) + 4 * j, 4);
                memcpy(&c, cell + code_bytes(o->bits) + 4 * (LANES + j), 4);
                acc = acc + sum * a;
                if (o->bits == 4) acc = acc + (c - a * NIBBLE_BIAS) * w->sums[(m0 + r) * subs + b];
            }
            const int64_t n = LANES * p + j;
            o->y[(m0 + r) * o->N + n] = o->bias ? acc + o->bias[n] : acc;
        }
    return 1;
}
#endif

static int64_t weight_tasks(int64_t N) { return (N + PANELS_A_TASK * LANES - 1) / (PANELS_A_TASK * LANES); }

/* one weight's PANELS_A_TASK panels for every row */
static void code_task(void *context, int64_t task, int slot) {
    (void)slot;
    const Work *w = context;
    int64_t k = 0;
    for (; task >= weight_tasks(w->N[k]); k++) task -= weight_tasks(w->N[k]);
    const Out o = {w->panels[k], code_bits(w->formats[k]), swarm_code_cell_bytes(w->formats[k]), w->N[k],
                   w->bias[k], w->y[k]};
    const int64_t p0 = task * PANELS_A_TASK, panels = (o.N + LANES - 1) / LANES;
    const int64_t stop = panels < p0 + PANELS_A_TASK ? panels : p0 + PANELS_A_TASK;
    for (int64_t m0 = 0; m0 < w->M; m0 += MAX_ROWS) {
        const int R = w->M - m0 < MAX_ROWS ? (int)(w->M - m0) : MAX_ROWS;
        for (int64_t p = p0; p < stop;) p += rows_step(R, w, &o, m0, p, stop);
    }
}

/* x's rows rounded to bfloat16 pairs, and each sub-block's X (the top); NULL when memory runs out */
static uint32_t *rows_and_sums(const float *x, int64_t M, int64_t K, float **sums) {
    uint32_t *pairs = malloc(sizeof(uint32_t) * (size_t)(M * K / 2 + 1));
    *sums = malloc(sizeof(float) * (size_t)(M * (K / 32) + 1));
    if (!pairs || !*sums) {
        free(pairs);
        free(*sums);
        return NULL;
    }
    for (int64_t r = 0; r < M; r++) {
        uint32_t *row = pairs + r * (K / 2);
        bf16_pairs_of_row(x + r * K, K, row);
        for (int64_t b = 0; b < K / 32; b++) {
            float X = 0.0f;
            for (int j = 0; j < 16; j++) {
                const uint32_t low = row[16 * b + j] << 16, high = row[16 * b + j] & 0xffff0000u;
                float value;
                memcpy(&value, &low, 4);
                X += value;
                memcpy(&value, &high, 4);
                X += value;
            }
            (*sums)[r * (K / 32) + b] = X;
        }
    }
    return pairs;
}

int swarm_code_matmul_many(const float *x, int64_t M, int64_t K, int64_t count, const uint8_t *const *panels,
                           const int *formats, const int64_t *N, const float *const *bias, float *const *y,
                           int threads) {
    float *sums;
    uint32_t *pairs = rows_and_sums(x, M, K, &sums);
    if (!pairs) return -1;
    int64_t tasks = 0;
    for (int64_t k = 0; k < count; k++) tasks += weight_tasks(N[k]);
    Work work = {pairs, sums, M, K, panels, formats, N, bias, y};
    swarm_pool_run(code_task, &work, tasks, threads);
    free(pairs);
    free(sums);
    return 0;
}

/* one weight: y [M, N] = x @ W.T + bias (or none) */
int swarm_code_matmul(const float *x, int64_t M, int64_t K, const uint8_t *panels, int format, int64_t N,
                      const float *bias, float *y, int threads) {
    return swarm_code_matmul_many(x, M, K, 1, &panels, &format, &N, &bias, &y, threads);
}

/* 1 where this build multiplies on AVX512-BF16, 0 where it runs the plain C code (same bits, far slower) */
int swarm_code_native(void) {
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}
