/* Prefill attention in integer products (rows_attention.c's `products` 2), on AVX512-VNNI's vpdpbusd
 * (i8_tiles.h: 64 byte products an instruction, 1.47x bfloat16's products a second on a Zen 4). Codes are
 * quantized as GGUF's Q8_0 quantizes (q8_blocks.h: d = max |x| / 127, codes rounded half away from zero, d to
 * float16), each from what the span holds (float32, or a pool's bfloat16):
 *     q, k   each query row's and key's head in sub-blocks of scores_block(dim): 64 dims, or 32 where the heads
 *            are no multiple of 64
 *     v      each key's head in sub-blocks of 32 dims
 * (k and v rounded to bfloat16 first, as the bfloat16 products read them: a pool in either dtype gives the same bits)
 *     S^T = K Q^T * scale        i8_tiles.h: per sub-block, the codes' int32 sum scaled by dk * dq
 *     P^T = exp(S^T - column max)                     float32, masked as rows_attention.c masks, sums unrounded
 *     O_c = P V_c                per sub-block g of 32 dims of v: P'_g = P * dv_g (each key's scale of that
 *                                sub-block) as unsigned codes of step d = (the largest dv_g of the keys the row sees
 *                                in the chunk) / 255, to nearest, ties to even; then times V's codes, scaled by d
 * folded chunk by chunk as the other precisions fold. A key's codes never depend on the keys beside it, and a row's
 * codes of P' on the keys it sees only: a row's result depends on its query, the keys it sees and their values,
 * never on the rows or keys beyond it, so a prompt split at a multiple of CHUNK keeps its bits. Rounding to int8
 * is coarser than to bfloat16 (a value to 1/254 of its sub-block's largest), as llama.cpp's q8_0 KV cache rounds
 * it. The plain-C build multiplies with the same bits. The includer defines Problem, CHUNK, MASKED, head_of, mask,
 * fold_columns, carried_in and finished (rows_attention.c) and includes attention_tiles.h.
 */
#ifndef SWARM_ROWS_ATTENTION_I8_H
#define SWARM_ROWS_ATTENTION_I8_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "i8_tiles.h"
#include "q8_blocks.h"

#define MAX_I8_DIM 256   /* the widest heads this path takes (a multiple of 32) */

/* whether heads of `dim` take the integer products (others take the bfloat16 ones) */
static inline int i8_takes(int64_t dim) { return dim % Q8_BLOCK == 0 && dim <= MAX_I8_DIM; }

/* the dims of a sub-block of q and k: 64 where the heads are a multiple of it (one sum a score: the products'
   scaling costs a Zen 4 a tenth of the attention a sub-block), else 32 */
static inline int64_t scores_block(int64_t dim) { return dim % 64 == 0 ? 64 : Q8_BLOCK; }

/* the quads the products take for n keys: whole sub-blocks of 32 */
static inline int64_t weight_quads(int64_t n) { return (n + Q8_BLOCK - 1) / Q8_BLOCK * I8_QUADS; }

/* The span's keys and values as the integer products read them, per KV head:
 *     keys          [kv_heads][keys][dim / 4]            key t's codes, 4 dims a word (signed)
 *     key_scales    [kv_heads][keys][dim / scores_block(dim)] and key_offsets: 128 x the sub-block's codes' sum
 *     values        [kv_heads][chunks][dim][CHUNK / 4]   dim d's codes of 4 consecutive keys a word (0 past the
 *                                                        span)
 *     value_scales  [kv_heads][keys][dim / 32] */
typedef struct {
    uint32_t *keys, *values;
    float *key_scales, *value_scales;
    int32_t *key_offsets;
    int64_t chunks;
} Packed8;

static void free_packed8(Packed8 *packed) {
    free(packed->keys);
    free(packed->values);
    free(packed->key_scales);
    free(packed->value_scales);
    free(packed->key_offsets);
}

/* row t of KV head h of the span (k or v) rounded to bfloat16 (bf16_bits), as the bfloat16 products read it: the
   same codes from a float32 pool as from one in bfloat16 (engine.attention.select.pool_dtype) */
static void span_row(const void *span, const Problem *p, int64_t t, int64_t h, float *row) {
    const int64_t at = t * p->stride + h * p->dim;
    for (int64_t d = 0; d < p->dim; d++) {
        const uint32_t bits = (p->kv_bf16 ? ((const uint16_t *)span)[at + d]
                                          : bf16_bits(((const float *)span)[at + d])) << 16;
        memcpy(row + d, &bits, 4);
    }
}

/* the keys and values of chunk `chunk` of KV head h */
static void pack_chunk8(const void *k, const void *v, const Problem *p, int64_t h, int64_t chunk, Packed8 *packed) {
    const int64_t dim = p->dim, block = scores_block(dim), words = CHUNK / 4;
    uint8_t *values = (uint8_t *)(packed->values + (h * packed->chunks + chunk) * dim * words);
    memset(values, 0, sizeof(uint32_t) * (size_t)(dim * words));
    float row[MAX_I8_DIM];
    int8_t codes[MAX_I8_DIM];
    for (int64_t t = chunk * CHUNK; t < (chunk + 1) * CHUNK && t < p->keys; t++) {
        const int64_t at = (h * p->keys + t) * (dim / block);
        span_row(k, p, t, h, row);
        for (int64_t s = 0; s < dim / block; s++)
            packed->key_offsets[at + s] = 128 * q8_values(row + block * s, (int)block, codes + block * s,
                                                          packed->key_scales + at + s);
        memcpy(packed->keys + (h * p->keys + t) * (dim / 4), codes, (size_t)dim);
        span_row(v, p, t, h, row);
        for (int64_t s = 0; s < dim / Q8_BLOCK; s++)
            q8_block(row + Q8_BLOCK * s, codes + Q8_BLOCK * s,
                     packed->value_scales + (h * p->keys + t) * (dim / Q8_BLOCK) + s);
        for (int64_t d = 0; d < dim; d++) values[d * CHUNK + t % CHUNK] = (uint8_t)codes[d];
    }
}

static int pack_span8(const void *k, const void *v, const Problem *p, Packed8 *packed, int threads) {
    const int64_t key_subs = p->dim / scores_block(p->dim), value_subs = p->dim / Q8_BLOCK;
    packed->chunks = (p->keys + CHUNK - 1) / CHUNK;
    packed->keys = malloc(sizeof(uint32_t) * (size_t)(p->kv_heads * p->keys * p->dim / 4));
    packed->values = malloc(sizeof(uint32_t) * (size_t)(p->kv_heads * packed->chunks * p->dim * CHUNK / 4));
    packed->key_scales = malloc(sizeof(float) * (size_t)(p->kv_heads * p->keys * key_subs));
    packed->key_offsets = malloc(sizeof(int32_t) * (size_t)(p->kv_heads * p->keys * key_subs));
    packed->value_scales = malloc(sizeof(float) * (size_t)(p->kv_heads * p->keys * value_subs));
    if (!packed->keys || !packed->values || !packed->key_scales || !packed->value_scales || !packed->key_offsets)
        return -1;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t task = 0; task < p->kv_heads * packed->chunks; task++)
        pack_chunk8(k, v, p, task / packed->chunks, task % packed->chunks, packed);
    return 0;
}

typedef struct {
    uint32_t *queries;    /* Q's panels [cols / 16][dim / 4][16], codes + 128 */
    float *query_scales;  /* [cols / 16][dim / scores_block(dim)][16] */
    uint32_t *weights;    /* [dim / 32][CHUNK / 4][cols] P'_g's codes (+ 16 words of slack: steps read whole
                             vectors) */
    float *weight_scales; /* [dim / 32][cols rounded up to 16] each row's step d */
    float *st, *partial, *running, *fold;
} Scratch8;

static size_t scratch8_floats(int64_t cols, int64_t dim) {
    const int64_t panels = (cols + 15) / 16 * 16, groups = dim / Q8_BLOCK;
    return (size_t)(panels * dim / 4 + panels * dim / Q8_BLOCK + groups * (CHUNK / 4 * cols + 16) + groups * panels
                    + CHUNK * cols + 2 * (dim + 2) * cols + 2 * cols);
}

static Scratch8 scratch8_of(float *memory, int64_t cols, int64_t dim) {
    const int64_t panels = (cols + 15) / 16 * 16, groups = dim / Q8_BLOCK;
    Scratch8 w;
    w.queries = (uint32_t *)memory;
    w.query_scales = (float *)(w.queries + panels * dim / 4);
    w.weights = (uint32_t *)(w.query_scales + panels * dim / Q8_BLOCK);
    w.weight_scales = (float *)(w.weights + groups * (CHUNK / 4 * cols + 16));
    w.st = w.weight_scales + groups * panels;
    w.partial = w.st + CHUNK * cols;
    w.running = w.partial + (dim + 2) * cols;
    w.fold = w.running + (dim + 2) * cols;
    return w;
}

/* the block's query rows into their panels: row r in lane r % 16 of panel r / 16; padding lanes code 0, scale 0 */
static void pack_queries8(const float *q, const Problem *p, int64_t h, int64_t token0, int64_t rows, int64_t cols,
                          Scratch8 w) {
    const int64_t quads = p->dim / 4, block = scores_block(p->dim), subs = p->dim / block;
    const int64_t panels = (cols + 15) / 16;
    memset(w.queries, 0x80, sizeof(uint32_t) * (size_t)(panels * 16 * quads));
    memset(w.query_scales, 0, sizeof(float) * (size_t)(panels * 16 * subs));
    for (int64_t r = 0; r < rows; r++) {
        const float *query = q + head_of(p, h, token0, r) * p->dim;
        int8_t codes[MAX_I8_DIM];
        for (int64_t s = 0; s < subs; s++)
            q8_values(query + block * s, (int)block, codes + block * s,
                      w.query_scales + (r / 16 * subs + s) * 16 + r % 16);
        uint32_t *lane = w.queries + r / 16 * 16 * quads + r % 16;
        for (int64_t j = 0; j < quads; j++) {
            uint32_t word;
            memcpy(&word, codes + 4 * j, 4);
            lane[j * 16] = word ^ 0x80808080u;   /* each code + 128, as an unsigned byte */
        }
    }
}

/* each row's step d of P'_g for the chunk's n keys from `first`: the largest dv_g of the keys it sees, / 255 */
static void weight_steps(const Problem *p, int64_t token0, int64_t rows, int64_t cols, int64_t first, int64_t n,
                         const float *dv, int64_t dv_step, float *steps) {
    float bound[CHUNK], most = 0.0f;   /* the largest dv_g of the chunk's keys up to each */
    for (int64_t t = 0; t < n; t++) {
        most = dv[t * dv_step] > most ? dv[t * dv_step] : most;
        bound[t] = most;
    }
    for (int64_t r = 0; r < cols; r++) {
        int64_t last = n - 1;   /* the last key of the chunk the row sees; padding rows: any */
        if (p->causal && r < rows) {
            const int64_t seen = p->first_position + token0 + r / p->groups - first;
            last = seen < last ? seen : last;
        }
        steps[r] = last < 0 ? 0.0f : bound[last] / 255.0f;
    }
}

#if defined(__AVX512F__)
/* key t's e of the lanes, its codes (times dv_g[t] / step) or'ed into byte k of word[g] */
static inline __attribute__((always_inline)) void key_codes(int G, const float *score_row, __mmask16 lanes, __m512 m,
                                                            const float *dv, const __m512 *inverse, int k,
                                                            __m512 *sum, __m512i *word) {
    const __m512 score = _mm512_maskz_loadu_ps(lanes, score_row);
    const __mmask16 seen = _mm512_cmp_ps_mask(score, _mm512_set1_ps(MASKED), _CMP_NEQ_OQ) & lanes;
    const __m512 e = _mm512_maskz_mov_ps(seen, exp16(_mm512_sub_ps(score, m)));
    *sum = _mm512_add_ps(*sum, e);
    for (int g = 0; g < G; g++) {
        const __m512 weighed = _mm512_mul_ps(e, _mm512_set1_ps(dv[g]));
        const __m512i code = _mm512_cvtps_epi32(_mm512_mul_ps(weighed, inverse[g]));   /* to nearest, even */
        word[g] = _mm512_or_si512(word[g], _mm512_slli_epi32(code, 8 * k));
    }
}

/* softmax_codes for the 16 rows from r (the lanes of `lanes`), G sub-blocks of v */
static inline __attribute__((always_inline)) void softmax_codes16(int G, const float *st, int64_t n, int64_t cols,
                                                                  int64_t r, __mmask16 lanes, const float *dv,
                                                                  const float *const *steps,
                                                                  uint32_t *const *weights, float *top, float *total) {
    __m512 m = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps(), inverse[MAX_I8_DIM / Q8_BLOCK];
    for (int64_t t = 0; t < n; t++) m = _mm512_max_ps(m, _mm512_maskz_loadu_ps(lanes, st + t * cols + r));
    for (int g = 0; g < G; g++) {
        const __m512 step = _mm512_maskz_loadu_ps(lanes, steps[g] + r);
        inverse[g] = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(step, _mm512_setzero_ps(), _CMP_GT_OQ),
                                         _mm512_set1_ps(1.0f), step);
    }
    for (int64_t t0 = 0; t0 < 4 * weight_quads(n); t0 += 4) {
        __m512i word[MAX_I8_DIM / Q8_BLOCK];
        for (int g = 0; g < G; g++) word[g] = _mm512_setzero_si512();
        if (t0 + 4 <= n) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
                key_codes(G, st + (t0 + k) * cols + r, lanes, m, dv + (t0 + k) * G, inverse, k, &sum, word);
        } else {
            for (int k = 0; k < 4 && t0 + k < n; k++)
                key_codes(G, st + (t0 + k) * cols + r, lanes, m, dv + (t0 + k) * G, inverse, k, &sum, word);
        }
        for (int g = 0; g < G; g++) _mm512_mask_storeu_epi32(weights[g] + t0 / 4 * cols + r, lanes, word[g]);
    }
    _mm512_mask_storeu_ps(top + r, lanes, m);
    _mm512_mask_storeu_ps(total + r, lanes, sum);
}

#define SOFTMAX_CODES(G) static void softmax_codes16_##G(const float *st, int64_t n, int64_t cols, int64_t r,       \
        __mmask16 lanes, const float *dv, const float *const *steps, uint32_t *const *weights, float *top,         \
        float *total) { softmax_codes16(G, st, n, cols, r, lanes, dv, steps, weights, top, total); }
SOFTMAX_CODES(1) SOFTMAX_CODES(2) SOFTMAX_CODES(4) SOFTMAX_CODES(8)
#endif

/* The chunk's softmax over its n keys (scores st [n x cols], masked keys MASKED), straight into P'_g's codes for
   each sub-block g of v: word (quad j, row r) of weights[g] holds keys 4 j .. 4 j + 3 of row r (0 past n), each
   round(e * dv_g[t] / step_g[r]), e = exp(score - row max), exactly 0 for a masked key. Each row's max and sum
   (of the unrounded e) go to top and total, as softmax_columns gives them. */
static void softmax_codes(const float *st, int64_t n, int64_t cols, const float *dv, int64_t groups,
                          const float *const *steps, uint32_t *const *weights, float *top, float *total) {
    int64_t r = 0;
#if defined(__AVX512F__)
    typedef void (*codes16)(const float *, int64_t, int64_t, int64_t, __mmask16, const float *, const float *const *,
                            uint32_t *const *, float *, float *);
    const codes16 each = groups == 1 ? softmax_codes16_1 : groups == 2 ? softmax_codes16_2
                       : groups == 4 ? softmax_codes16_4 : groups == 8 ? softmax_codes16_8 : NULL;
    for (; each && r < cols; r += 16) each(st, n, cols, r, cols - r >= 16 ? 0xFFFF : 0x00FF, dv, steps, weights, top,
                                           total);
#endif
    for (; r < cols; r++) {   /* the same steps a row at a time (exp: libm's) */
        float m = -INFINITY, sum = 0.0f, inverse[MAX_I8_DIM / Q8_BLOCK];
        for (int64_t t = 0; t < n; t++) m = st[t * cols + r] > m ? st[t * cols + r] : m;
        for (int64_t g = 0; g < groups; g++) {
            inverse[g] = steps[g][r] > 0.0f ? 1.0f / steps[g][r] : 0.0f;
            for (int64_t t0 = 0; t0 < 4 * weight_quads(n); t0 += 4) weights[g][t0 / 4 * cols + r] = 0;
        }
        for (int64_t t = 0; t < n; t++) {
            const float score = st[t * cols + r], e = score != MASKED ? expf(score - m) : 0.0f;
            sum += e;
            for (int64_t g = 0; g < groups; g++) {
                const uint32_t code = (uint32_t)nearbyintf(e * dv[t * groups + g] * inverse[g]);
                weights[g][t / 4 * cols + r] |= code << 8 * (t % 4);
            }
        }
        top[r] = m;
        total[r] = sum;
    }
}

/* partial's max, sum and outputs of the chunk of n keys from `first` (its scores in w.st): per sub-block g of v's
   dims, P'_g's codes times the values' */
static void chunk_outputs8(const Packed8 *packed, const Problem *p, int64_t h, int64_t token0, int64_t rows,
                           int64_t cols, int64_t first, int64_t n, Scratch8 w) {
    const int64_t dim = p->dim, groups = dim / Q8_BLOCK, panels = (cols + 15) / 16 * 16;
    const uint32_t *values = packed->values + (h * packed->chunks + first / CHUNK) * dim * (CHUNK / 4);
    const float *dv = packed->value_scales + (h * p->keys + first) * groups;
    float *steps[MAX_I8_DIM / Q8_BLOCK];
    uint32_t *weights[MAX_I8_DIM / Q8_BLOCK];
    for (int64_t g = 0; g < groups; g++) {
        weights[g] = w.weights + g * (CHUNK / 4 * cols + 16);
        steps[g] = w.weight_scales + g * panels;
        weight_steps(p, token0, rows, cols, first, n, dv + g, groups, steps[g]);
    }
    softmax_codes(w.st, n, cols, dv, groups, (const float *const *)steps, weights, w.partial, w.partial + cols);
    for (int64_t g = 0; g < groups; g++) {
        const i8_problem output = {values + Q8_BLOCK * g * (CHUNK / 4), CHUNK / 4, weight_quads(n), weight_quads(n),
                                   weights[g], 16, cols, NULL, NULL, 0, steps[g], 16, 1.0f,
                                   w.partial + (2 + Q8_BLOCK * g) * cols, cols};
        i8_tile(&output, Q8_BLOCK, cols);
    }
}

/* block_attention in integer products */
static void block_attention_i8(const float *q, const Packed8 *packed, const Problem *p, int64_t h, int64_t token0,
                               float scale, Scratch8 w, float *out, float *lse) {
    const int64_t tokens = p->tokens - token0 < p->block_tokens ? p->tokens - token0 : p->block_tokens;
    const int64_t rows = tokens * p->groups, cols = (rows + 7) / 8 * 8, dim = p->dim;
    const int64_t block = scores_block(dim), subs = dim / block;
    pack_queries8(q, p, h, token0, rows, cols, w);
    carried_in(p, h, token0, rows, cols, w.running);
    const int64_t last_position = p->causal ? p->first_position + token0 + tokens - 1 : p->keys - 1;
    const int64_t first_unmasked = p->causal ? p->first_position + token0 : p->keys;
    for (int64_t first = 0; first <= last_position; first += CHUNK) {
        const int64_t n = last_position + 1 - first < CHUNK ? last_position + 1 - first : CHUNK;
        const int64_t at = (h * p->keys + first) * subs;
        const i8_problem scores = {packed->keys + (h * p->keys + first) * dim / 4, dim / 4, dim / 4, block / 4,
                                   w.queries, 16 * dim / 4, 16, packed->key_scales + at,
                                   packed->key_offsets + at, subs, w.query_scales, 16 * subs, scale, w.st, cols};
        i8_tile(&scores, n, cols);
        if (first + n - 1 > first_unmasked) mask(w.st, n, cols, first, p, token0, rows, MASKED);
        chunk_outputs8(packed, p, h, token0, rows, cols, first, n, w);
        fold_columns(w.running, w.partial, cols, dim, w.fold, first == 0 && !p->carry_in);
    }
    finished(p, h, token0, rows, cols, w.running, out, lse);
}

#endif
