/* Matmuls from code panels (code_matmul.c's layout) in integer products, for prompt rows and decode rows, as
 * llama.cpp multiplies its quantized weights: x's rows quantized as GGUF's Q8_0 quantizes a tensor, then each
 * sub-block of 32 values multiplied code by code in int32 (AVX512-VNNI's vpdpbusd: 64 byte products a cycle, twice
 * vdpbf16ps's pairs).
 *
 * x's row r, sub-block s of 32 values: d = max |x| / 127, q = x / d rounded half away from zero (int8), and
 * dx = d rounded to float16 and back: gguf.quants.quantize(x, Q8_0) gives the same q and dx, so a value is
 * q * dx exactly as gguf.quants.dequantize reads it. With a weight's value a * code + c (code_matmul.c's top):
 *     sum over the sub-block of W[n, k] x[k] = dx * (a * S + c * Q),   S = sum code * q,  Q = sum q  (exact ints)
 * Each output element, for the sub-blocks s in turn, from acc = 0 (every product and sum rounded to float32):
 *     4-bit codes (Q4_0, Q4_1, Q4_K):  acc = fma(S, a * dx, acc);  acc = fma(c, dx * Q, acc)
 *     8-bit codes (Q8_0, c = 0):       acc = fma(S, a * dx, acc)
 * then y = acc + bias. vpdpbusd multiplies unsigned bytes by signed ones: 4-bit codes are unsigned already, a
 * Q8_0 code goes in as code + 128 and 128 Q comes off its S (exact). A row's bits depend on its own values only;
 * the plain-C code for CPUs without AVX512-VNNI takes the same steps. x's rounding to int8 is coarser than to
 * bfloat16 (to 1/254 of its sub-block's largest value, where bfloat16 keeps 2^-9 of each value), as llama.cpp's.
 *
 * A task is 64 outputs (4 panels) of one weight for up to ROWS_A_TASK rows. With more than CELL_ROWS rows (a
 * prompt) it lays its panels' codes out once, 4 codes of an output a 32-bit lane, then runs steps of 6 rows by 2
 * panels (12 int32 and 12 float32 sums in registers); with fewer (a decode step) each step expands the codes from
 * the cells in registers, for up to 8 rows at once (1-2 rows take 4 panels' chains, 3-4 two). Either way every
 * output takes the steps above, so a row's bits do not depend on how many rows come with it.
 * Built by kernels/cpu/native.py; called from kernels/cpu/code_prompt.py and quant_matmul.c's weight sets.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "code_matmul.h"
#include "q8_blocks.h"
#include "quant_blocks.h"
#include "task_pool.h"

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#define LANES CODE_LANES
#define PANELS_A_TASK 4
#define ROWS_A_TASK 96
#define STEP_ROWS 6                    /* rows a step from laid-out codes */
#define CELL_ROWS 8                    /* rows up to which a call expands the codes from the cells, all in one step */
#define QUADS 8                        /* 4-code groups a sub-block */
#define QUAD_BYTES (QUADS * 4 * LANES)  /* a panel's codes of one sub-block, laid out: 512 */
#define ROWS_A_QUANTIZE_TASK 32

typedef struct {   /* x quantized, rows in groups of G (a step's rows: STEP_ROWS, or CELL_ROWS) side by side, so a
                      step's operands lie a pointer apart: quads [M / G][K / 4][G] (4 int8 codes each; quad_at),
                      and per sub-block dx, dx * Q and 128 Q [M / G][K / 32][G] (sub_at) */
    int32_t *quads;
    float *dx, *dxq;
    int32_t *q128;
    int64_t group;   /* G */
} Rows;

typedef struct {
    const float *x;
    Rows rows;
    int64_t M, K;
    const uint8_t *const *panels;
    const int *formats;
    const int64_t *N;
    const float *const *bias;
    float *const *y;
    uint8_t *scratch;      /* each slot's laid-out codes: PANELS_A_TASK * K / 32 * QUAD_BYTES */
    int64_t *laid_out;     /* each slot's: the (weight, panel group) its scratch holds, or -1 */
    int64_t row_tiles;
} Work;

static inline int64_t quad_at(int64_t G, int64_t K, int64_t m, int64_t quad) {
    return ((m / G) * (K / 4) + quad) * G + m % G;
}

static inline int64_t sub_at(int64_t G, int64_t K, int64_t m, int64_t s) {
    return ((m / G) * (K / 32) + s) * G + m % G;
}

/* row m of x into the Rows */
static void quantize_row(const float *x, int64_t K, int64_t m, Rows rows) {
    for (int64_t s = 0; s < K / 32; s++) {
        int8_t q[32];
        const int64_t at = sub_at(rows.group, K, m, s);
        const int32_t sum = q8_block(x + 32 * s, q, rows.dx + at);
        for (int g = 0; g < QUADS; g++) memcpy(rows.quads + quad_at(rows.group, K, m, QUADS * s + g), q + 4 * g, 4);
        rows.dxq[at] = rows.dx[at] * (float)sum;
        rows.q128[at] = 128 * sum;
    }
}

static void quantize_task(void *context, int64_t task, int slot) {
    (void)slot;
    const Work *w = context;
    const int64_t stop = (task + 1) * ROWS_A_QUANTIZE_TASK < w->M ? (task + 1) * ROWS_A_QUANTIZE_TASK : w->M;
    for (int64_t m = task * ROWS_A_QUANTIZE_TASK; m < stop; m++) quantize_row(w->x + m * w->K, w->K, m, w->rows);
}

typedef struct {   /* one weight's task */
    const uint8_t *panels;
    int bits;
    int64_t cell_bytes, N, p0;
    const float *bias;
    float *y;
} Out;

static inline const uint8_t *cell_of(const Work *w, const Out *o, int64_t p, int64_t s) {
    return o->panels + (p * (w->K / 32) + s) * o->cell_bytes;
}

static inline const float *scales_of(const Work *w, const Out *o, int64_t p, int64_t s) {   /* a [16], c [16] */
    return (const float *)(cell_of(w, o, p, s) + o->cell_bytes - CODE_SCALE_BYTES);
}

#if defined(__AVX512VNNI__)
/* quad g of a cell's codes as vpdpbusd's unsigned operands: lane j holds output j's codes of values 4 g ... 4 g + 3
   (Q8_0's + 128) */
static inline __attribute__((always_inline)) __m512i laid_quad(const uint8_t *cell, int bits, int g) {
    if (bits == 4) {   /* bytes 2 j, 2 j + 1: the low nibbles values 4 g, 4 g + 1, the high ones 4 g + 2, 4 g + 3 */
        const __m512i words = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(cell + 32 * g)));
        return _mm512_ternarylogic_epi32(words, _mm512_slli_epi32(words, 12), _mm512_set1_epi32(0x0F0F0F0F),
                                         0xA8);   /* (a | b) & c */
    }
    const __m512i low = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(cell + 64 * g)));   /* pair 2 g */
    const __m512i high = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(cell + 64 * g + 32)));
    return _mm512_xor_si512(_mm512_or_si512(low, _mm512_slli_epi32(high, 16)), _mm512_set1_epi32((int)0x80808080u));
}

/* panel p's codes of sub-block s laid out for the steps of prompt rows: quad g at out + 64 g */
static void lay_out(const uint8_t *cell, int bits, uint8_t *out) {
    for (int g = 0; g < QUADS; g++) _mm512_storeu_si512(out + 64 * g, laid_quad(cell, bits, g));
}

/* rows [m0, m0 + R) x the task's panels [q0, q0 + P); their codes laid out (lay_out) or, with `in_cells`, expanded
   from the cells for these rows alone (a decode step's few rows: laying a weight out would cost more than its
   products) */
static inline __attribute__((always_inline)) void step(int bits, int in_cells, int R, int P, const Work *w,
                                                       const Out *o, const uint8_t *codes, int64_t m0, int64_t q0) {
    const int64_t subs = w->K / 32;
    const int G = in_cells ? CELL_ROWS : STEP_ROWS;   /* m0: a multiple of G */
    const int32_t *quads = w->rows.quads + quad_at(G, w->K, m0, 0);
    const float *dx = w->rows.dx + sub_at(G, w->K, m0, 0), *dxq = w->rows.dxq + sub_at(G, w->K, m0, 0);
    const int32_t *q128 = w->rows.q128 + sub_at(G, w->K, m0, 0);
    __m512 acc[CELL_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int q = 0; q < P; q++) acc[r][q] = _mm512_setzero_ps();
    for (int64_t s = 0; s < subs; s++) {
        __m512i sum[CELL_ROWS][4];
        for (int r = 0; r < R; r++)
            for (int q = 0; q < P; q++) sum[r][q] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < QUADS; g++) {
            __m512i weights[4];
            for (int q = 0; q < P; q++)
                weights[q] = in_cells ? laid_quad(cell_of(w, o, o->p0 + q0 + q, s), bits, g)
                                      : _mm512_loadu_si512(codes + ((q0 + q) * subs + s) * QUAD_BYTES + 64 * g);
            for (int r = 0; r < R; r++) {
                const __m512i xs = _mm512_set1_epi32(quads[(QUADS * s + g) * G + r]);
                for (int q = 0; q < P; q++) sum[r][q] = _mm512_dpbusd_epi32(sum[r][q], weights[q], xs);
            }
        }
        for (int q = 0; q < P; q++) {
            const float *ac = scales_of(w, o, o->p0 + q0 + q, s);
            const __m512 a = _mm512_loadu_ps(ac), c = _mm512_loadu_ps(ac + LANES);
            for (int r = 0; r < R; r++) {
                const int64_t at = s * G + r;
                __m512i S = sum[r][q];
                if (bits == 8) S = _mm512_sub_epi32(S, _mm512_set1_epi32(q128[at]));
                const __m512 scale = _mm512_mul_ps(a, _mm512_set1_ps(dx[at]));
                acc[r][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), scale, acc[r][q]);
                if (bits == 4) acc[r][q] = _mm512_fmadd_ps(c, _mm512_set1_ps(dxq[at]), acc[r][q]);
            }
        }
    }
    for (int q = 0; q < P; q++) {
        const int64_t n0 = LANES * (o->p0 + q0 + q), left = o->N - n0;
        const __mmask16 lanes = left >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        const __m512 bias = o->bias ? _mm512_maskz_loadu_ps(lanes, o->bias + n0) : _mm512_setzero_ps();
        for (int r = 0; r < R; r++)
            _mm512_mask_storeu_ps(o->y + (m0 + r) * o->N + n0, lanes,
                                  o->bias ? _mm512_add_ps(acc[r][q], bias) : acc[r][q]);
    }
}

/* each step shape its own function: inlined into one, GCC left their sums on the stack. Laid-out codes: 1-6 rows
   by 1 or 2 panels; from the cells: 1-8 rows by 1 panel, 1-4 by 2, 1-2 by 4 */
#define STEP_OF(B, C, R, P) \
    static void step_##B##_##C##_##R##_##P(const Work *w, const Out *o, const uint8_t *codes, int64_t m0, \
                                           int64_t q0) { \
        step(B, C, R, P, w, o, codes, m0, q0); \
    }
#define EACH_SHAPE(X) \
    X(4, 0, 1, 1) X(4, 0, 2, 1) X(4, 0, 3, 1) X(4, 0, 4, 1) X(4, 0, 5, 1) X(4, 0, 6, 1) X(4, 0, 1, 2) \
    X(4, 0, 2, 2) X(4, 0, 3, 2) X(4, 0, 4, 2) X(4, 0, 5, 2) X(4, 0, 6, 2) X(4, 1, 1, 1) X(4, 1, 2, 1) \
    X(4, 1, 3, 1) X(4, 1, 4, 1) X(4, 1, 5, 1) X(4, 1, 6, 1) X(4, 1, 7, 1) X(4, 1, 8, 1) X(4, 1, 1, 2) \
    X(4, 1, 2, 2) X(4, 1, 3, 2) X(4, 1, 4, 2) X(4, 1, 1, 4) X(4, 1, 2, 4) X(8, 0, 1, 1) X(8, 0, 2, 1) \
    X(8, 0, 3, 1) X(8, 0, 4, 1) X(8, 0, 5, 1) X(8, 0, 6, 1) X(8, 0, 1, 2) X(8, 0, 2, 2) X(8, 0, 3, 2) \
    X(8, 0, 4, 2) X(8, 0, 5, 2) X(8, 0, 6, 2) X(8, 1, 1, 1) X(8, 1, 2, 1) X(8, 1, 3, 1) X(8, 1, 4, 1) \
    X(8, 1, 5, 1) X(8, 1, 6, 1) X(8, 1, 7, 1) X(8, 1, 8, 1) X(8, 1, 1, 2) X(8, 1, 2, 2) X(8, 1, 3, 2) \
    X(8, 1, 4, 2) X(8, 1, 1, 4) X(8, 1, 2, 4)
EACH_SHAPE(STEP_OF)

#define SHAPE(B, C, R, P) ((((C) * 2 + ((B) == 8)) * 16 + (P)) * 16 + (R))
#define CASE(B, C, R, P) case SHAPE(B, C, R, P): step_##B##_##C##_##R##_##P(w, o, codes, m0, q0); return;

/* rows [m0, m0 + R) against the task's panels [q0, q0 + P) (a shape above); codes NULL: from the cells */
static void rows_step(int R, int P, const Work *w, const Out *o, const uint8_t *codes, int64_t m0, int64_t q0) {
    switch (SHAPE(o->bits, codes == NULL, R, P)) {
        EACH_SHAPE(CASE)
        default: return;
    }
}
#else   /* the same arithmetic one output at a time, for builds without AVX512-VNNI */

/* row j's code of value k of a cell as vpdpbusd's unsigned operand (Q8_0's + 128) */
static int32_t code_of(const uint8_t *cell, int bits, int j, int k) {
    if (bits == 4) return cell[32 * (k / 4) + 2 * j + k % 2] >> 4 * (k % 4 / 2) & 0x0F;
    return (uint8_t)(cell[32 * (k / 2) + 2 * j + k % 2] ^ 0x80);
}

static void rows_step(int R, int P, const Work *w, const Out *o, const uint8_t *codes, int64_t m0, int64_t q0) {
    (void)codes;
    const int64_t subs = w->K / 32;
    for (int r = 0; r < R; r++)
        for (int q = q0; q < q0 + P; q++)
            for (int j = 0; j < LANES && LANES * (o->p0 + q) + j < o->N; j++) {
                float acc = 0.0f;
                for (int64_t s = 0; s < subs; s++) {
                    const uint8_t *cell = cell_of(w, o, o->p0 + q, s);
                    const int64_t at = sub_at(w->rows.group, w->K, m0 + r, s);
                    int32_t S = 0;
                    for (int k = 0; k < 32; k++) {
                        const int64_t at_quad = quad_at(w->rows.group, w->K, m0 + r, QUADS * s + k / 4);
                        S += code_of(cell, o->bits, j, k) * ((const int8_t *)(w->rows.quads + at_quad))[k % 4];
                    }
                    if (o->bits == 8) S -= w->rows.q128[at];
                    const float *ac = scales_of(w, o, o->p0 + q, s);
                    const float scale = ac[j] * w->rows.dx[at];
                    acc = fmaf((float)S, scale, acc);
                    if (o->bits == 4) acc = fmaf(ac[LANES + j], w->rows.dxq[at], acc);
                }
                const int64_t n = LANES * (o->p0 + q) + j;
                o->y[(m0 + r) * o->N + n] = o->bias ? acc + o->bias[n] : acc;
            }
}
#endif

static int64_t panel_groups(int64_t N) { return (N + PANELS_A_TASK * LANES - 1) / (PANELS_A_TASK * LANES); }

/* task: (weight, panel group, row tile), row tiles innermost so a slot's next task mostly reuses its codes */
static void matmul_task(void *context, int64_t task, int slot) {
    const Work *w = context;
    const int64_t tile = task % w->row_tiles, subs = w->K / 32;
    int64_t group = task / w->row_tiles, k = 0, key = group;
    for (; group >= panel_groups(w->N[k]); k++) group -= panel_groups(w->N[k]);
    const int64_t panels = (w->N[k] + LANES - 1) / LANES, p0 = group * PANELS_A_TASK;
    const int64_t here = panels - p0 < PANELS_A_TASK ? panels - p0 : PANELS_A_TASK;
    const Out o = {w->panels[k], code_bits(w->formats[k]), swarm_code_cell_bytes(w->formats[k]), w->N[k], p0,
                   w->bias[k], w->y[k]};
    uint8_t *codes = NULL;
#if defined(__AVX512VNNI__)
    if (w->M > CELL_ROWS) {
        codes = w->scratch + (int64_t)slot * PANELS_A_TASK * subs * QUAD_BYTES;
        if (w->laid_out[slot] != key)
            for (int64_t q = 0; q < here; q++)
                for (int64_t s = 0; s < subs; s++)
                    lay_out(cell_of(w, &o, p0 + q, s), o.bits, codes + (q * subs + s) * QUAD_BYTES);
        w->laid_out[slot] = key;
    }
#else
    (void)key, (void)slot, (void)subs;
#endif
    const int64_t stop = (tile + 1) * ROWS_A_TASK < w->M ? (tile + 1) * ROWS_A_TASK : w->M;
    const int64_t G = w->rows.group, rows = stop - tile * ROWS_A_TASK;
    for (int64_t q0 = 0; q0 < here;) {
        const int64_t most = codes ? 2 : rows <= 2 ? 4 : rows <= 4 ? 2 : 1;   /* from the cells: chains enough */
        const int P = (int)(here - q0 >= most ? most : here - q0 >= 2 && most >= 2 ? 2 : 1);
        for (int64_t m0 = tile * ROWS_A_TASK; m0 < stop; m0 += G)
            rows_step(stop - m0 < G ? (int)(stop - m0) : (int)G, P, w, &o, codes, m0, q0);
        q0 += P;
    }
}

static void release(Work *w) {
    free(w->rows.quads);
    free(w->rows.dx);
    free(w->rows.dxq);
    free(w->rows.q128);
    free(w->scratch);
    free(w->laid_out);
}

/* y[w] = x @ W[w].T + bias[w] (bias[w] may be NULL) for weights packed by swarm_code_pack, formats[w] their GGML
   type codes (Q4_0, Q4_1, Q4_K, Q8_0); K a multiple of 32. Returns -1 (y untouched) when memory runs out. */
int swarm_code_prompt_many(const float *x, int64_t M, int64_t K, int64_t count, const uint8_t *const *panels,
                           const int *formats, const int64_t *N, const float *const *bias, float *const *y,
                           int threads) {
    if (threads < 1) threads = 1;
    const int64_t subs = K / 32;
    const int64_t group = M <= CELL_ROWS ? CELL_ROWS : STEP_ROWS, padded = (M + group - 1) / group * group;
    Work w = {x, {malloc((size_t)(padded * K) + 1), malloc(sizeof(float) * (size_t)(padded * subs + 1)),
                  malloc(sizeof(float) * (size_t)(padded * subs + 1)),
                  malloc(sizeof(int32_t) * (size_t)(padded * subs + 1)), group},
              M, K, panels, formats, N, bias, y,
              aligned_alloc(64, (size_t)(threads * PANELS_A_TASK * subs * QUAD_BYTES) + 64),
              malloc(sizeof(int64_t) * (size_t)threads), (M + ROWS_A_TASK - 1) / ROWS_A_TASK};
    if (!w.rows.quads || !w.rows.dx || !w.rows.dxq || !w.rows.q128 || !w.scratch || !w.laid_out) {
        release(&w);
        return -1;
    }
    for (int t = 0; t < threads; t++) w.laid_out[t] = -1;
    const int64_t quantize_tasks = (M + ROWS_A_QUANTIZE_TASK - 1) / ROWS_A_QUANTIZE_TASK;
    if (M <= CELL_ROWS)   /* a few rows: on this thread, sooner than waking the others */
        for (int64_t t = 0; t < quantize_tasks; t++) quantize_task(&w, t, 0);
    else
        swarm_pool_run(quantize_task, &w, quantize_tasks, threads);
    int64_t groups = 0;
    for (int64_t k = 0; k < count; k++) groups += panel_groups(N[k]);
    swarm_pool_run(matmul_task, &w, groups * w.row_tiles, threads);
    release(&w);
    return 0;
}

/* 1 where this build multiplies on AVX512-VNNI, 0 where it runs the plain C code (same bits, far slower) */
int swarm_code_prompt_native(void) {
#if defined(__AVX512VNNI__)
    return 1;
#else
    return 0;
#endif
}
