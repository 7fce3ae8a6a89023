/* One chunk of decode attention in bfloat16 products, shared by kernels/cpu/csrc/paged_decode.c (a sequence's own
 * blocks) and kernels/cpu/csrc/prefix_attention.c (many rows over a shared trunk), so that a chunk of a trunk gets
 * the same bits from either, as decode_scores.h gives them in float32.
 *
 * Both products take their operands rounded to bfloat16 and sum them as vdpbf16ps does (bf16_tiles.h: twice
 * float32's rate on AVX512-BF16):
 *     S = Q K^T * scale           each score over the pairs of dims in order
 *     P = exp(S - row max)        float32, as decode_scores.h; the row's sum from the unrounded P
 *     O = P V                     each output over the pairs of keys in order
 * The keys and values lie in the lanes (16 keys, or 16 dims, a vector), so one row costs what it needs: a
 * sequence's few query groups fill no lane with padding. A chunk's rows are first read front to back and rounded
 * (stage_rows), then laid out: packed straight from a float32 cache, a lone sequence's chunk took 1.2-1.5x
 * float32's time from memory. A pool kept in bfloat16 (engine.attention.select.pool_dtype) holds them rounded
 * already: they are copied, or read in place where they lie one after another (rows_of). Each row's arithmetic is
 * the same whatever rows it is computed with, and whichever dtype its pool keeps; the plain-C products of CPUs
 * without AVX512-BF16 take the same steps (bf16_tiles.h).
 * The includer includes attention_tiles.h first (exp_shifted).
 */
#ifndef SWARM_DECODE_BF16_H
#define SWARM_DECODE_BF16_H

#include <stdint.h>
#include <string.h>

#include "bf16_tiles.h"
#include "decode_scores.h"

/* A chunk's keys and values packed for the products, one KV head's after another, then the rows staged for them:
 *     keys   [kv_heads][DECODE_CHUNK / 16][dim / 2][16]       pair j of dims of a panel of 16 keys (0 past n keys)
 *     values [kv_heads][ceil(dim / 16)][DECODE_CHUNK / 2][16] pair (2 i, 2 i + 1) of keys of 16 dims (0 past)
 *     stage  [DECODE_CHUNK][kv_heads * dim / 2]               a token's row of keys, then of values, in pairs */
static inline int64_t decode_bf16_panels(int64_t dim) { return (dim + BF16_LANES - 1) / BF16_LANES; }

static inline int64_t decode_keys_words(int64_t dim) { return DECODE_CHUNK * dim / 2; }

static inline int64_t decode_values_words(int64_t dim) {
    return decode_bf16_panels(dim) * BF16_LANES * DECODE_CHUNK / 2;
}

/* the 32-bit words of a chunk's packed keys and values, every KV head, and of the rows staged for them */
static inline int64_t decode_packed_words(int64_t kv_heads, int64_t dim) {
    return kv_heads * (decode_keys_words(dim) + decode_values_words(dim)) + DECODE_CHUNK * kv_heads * dim / 2;
}

typedef struct {   /* one thread's scratch: a chunk of kv_heads KV heads, `rows` query rows a KV head */
    uint32_t *packed;    /* decode_packed_words(kv_heads, dim): the chunk's keys and values (above) */
    uint32_t *queries;   /* [rows][dim / 2] */
    uint32_t *weights;   /* [rows][DECODE_CHUNK / 2]: P's pairs of consecutive keys */
    float *probs;        /* [rows][DECODE_CHUNK] */
} DecodeBf16Scratch;

/* the 32-bit words of that scratch */
static inline int64_t decode_bf16_words(int64_t kv_heads, int64_t rows, int64_t dim) {
    return decode_packed_words(kv_heads, dim) + rows * dim / 2 + rows * DECODE_CHUNK / 2 + rows * DECODE_CHUNK;
}

static inline DecodeBf16Scratch decode_bf16_scratch(uint32_t *memory, int64_t kv_heads, int64_t rows, int64_t dim) {
    DecodeBf16Scratch w;
    w.packed = memory;
    w.queries = w.packed + decode_packed_words(kv_heads, dim);
    w.weights = w.queries + rows * dim / 2;
    w.probs = (float *)(w.weights + rows * DECODE_CHUNK / 2);
    return w;
}

#if defined(__AVX512BF16__)
/* r[i] = column i of the 16 x 16 words r held as rows */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* r[4 b + c] now holds column c + 4 lane of rows 4 b .. 4 b + 3 in its 128-bit lane `lane` */
    for (int c = 0; c < 4; c++) {
        const __m512i a = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), b = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
        const __m512i e = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
        const __m512i f = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
        t[c] = _mm512_shuffle_i32x4(a, e, 0x88);
        t[8 + c] = _mm512_shuffle_i32x4(a, e, 0xdd);
        t[4 + c] = _mm512_shuffle_i32x4(b, f, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(b, f, 0xdd);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* keys [first, first + 16) (rows past n: zero) of a panel whose pairs of dims are a multiple of 16, from their
   staged words (key t's at stage + t * width) */
static inline void pack_key_panel(const uint32_t *stage, int64_t width, int64_t first, int64_t n, int64_t half,
                                  uint32_t *panel) {
    for (int64_t j0 = 0; j0 < half; j0 += 16) {
        __m512i words[16];
        for (int i = 0; i < 16; i++)
            words[i] = first + i < n ? _mm512_loadu_si512(stage + (first + i) * width + j0) : _mm512_setzero_si512();
        transpose16(words);
        for (int j = 0; j < 16; j++) _mm512_storeu_si512(panel + (j0 + j) * 16, words[j]);
    }
}
#endif

/* keys 16 p .. 16 p + 15 of a KV head (key t's pairs of dims at stage + t * width) into their panel (0 past n) */
static void pack_key_panel_of(const uint32_t *stage, int64_t width, int64_t p, int64_t n, int64_t dim,
                              uint32_t *panel) {
    const int64_t half = dim / 2, first = 16 * p;
#if defined(__AVX512BF16__)
    if (half % 16 == 0) {
        pack_key_panel(stage, width, first, n, half, panel);
        return;
    }
#endif
    for (int64_t l = 0; l < 16; l++)
        for (int64_t j = 0; j < half; j++) panel[j * 16 + l] = first + l < n ? stage[(first + l) * width + j] : 0;
}

/* keys 2 i and 2 i + 1 of a KV head (key t's values at stage + t * width, bfloat16; the second past n keys: 0)
   into `words`, 16 a panel of dims, panels `panel_pairs` pairs of words apart */
static void pack_value_pair_into(const uint16_t *stage, int64_t width, int64_t i, int64_t n, int64_t dim,
                                 uint32_t *words0, int64_t panel_pairs) {
    const uint16_t *low = stage + 2 * i * width, *high = 2 * i + 1 < n ? low + width : NULL;
    for (int64_t p = 0; p < decode_bf16_panels(dim); p++) {
        uint32_t *words = words0 + p * panel_pairs * 16;
#if defined(__AVX512BF16__)
        if (16 * p + 16 <= dim) {
            const __m512i lows = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(low + 16 * p)));
            const __m512i highs = high ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(high + 16 * p)))
                                       : _mm512_setzero_si512();
            _mm512_storeu_si512(words, _mm512_or_si512(lows, _mm512_slli_epi32(highs, 16)));
            continue;
        }
#endif
        for (int64_t l = 0; l < 16; l++) {
            const int64_t d = 16 * p + l;
            words[l] = d < dim ? (uint32_t)low[d] | (uint32_t)(high ? high[d] : 0) << 16 : 0;
        }
    }
}

/* a KV cache's elements from `base`: float32, or bfloat16 where `bf16` (the pool engine.kv.cache keeps in bfloat16
   where every attention reading it rounds its keys and values to bfloat16 first) */
typedef struct {
    const void *base;
    int bf16;
} kv_elements;

static inline int64_t kv_bytes(kv_elements cache, int64_t elements) { return elements * (cache.bf16 ? 2 : 4); }

static inline kv_elements kv_from(kv_elements cache, int64_t elements) {
    return (kv_elements){(const char *)cache.base + kv_bytes(cache, elements), cache.bf16};
}

/* n rows of `count` elements (at cache + rows[t]) as bfloat16 pairs, row t's at stage + t * count / 2: read front
   to back, as the hardware prefetches them; float32 rows are rounded, bfloat16 ones copied */
static void stage_rows(kv_elements cache, const int64_t *rows, int64_t n, int64_t count, uint32_t *stage) {
    for (int64_t t = 0; t < n; t++) {
        if (cache.bf16)
            memcpy(stage + t * count / 2, (const uint16_t *)cache.base + rows[t], 2 * (size_t)count);
        else
            bf16_pairs_of_row((const float *)cache.base + rows[t], count, stage + t * count / 2);
    }
}

/* whether the n rows lie one after another, `row` elements apart */
static int consecutive(const int64_t *rows, int64_t n, int64_t row) {
    for (int64_t t = 1; t < n; t++)
        if (rows[t] != rows[0] + t * row) return 0;
    return 1;
}

/* the n rows' elements of KV heads [h0, h1) as bfloat16 pairs, `width` words from a row's to the next's: staged,
   or, where the caller prefetched them (`prefetched`: the trunk's kernel), a bfloat16 cache's own rows where they
   lie one after another (nothing copied; 8 rows over a SmolLM2 layer's 8,192-token trunk from memory, 0.91-0.94x
   the time of staging them; unprefetched, a lone sequence's chunk read in place waited on memory for each pair of
   value rows: staging reads it front to back, as the hardware prefetches) */
static const uint32_t *rows_of(kv_elements cache, const int64_t *rows, int64_t n, int64_t kv_heads, int64_t h0,
                               int64_t h1, int64_t dim, int prefetched, uint32_t *stage, int64_t *width) {
    if (prefetched && cache.bf16 && consecutive(rows, n, kv_heads * dim)) {
        *width = kv_heads * dim / 2;
        return (const uint32_t *)kv_from(cache, rows[0] + h0 * dim).base;
    }
    *width = (h1 - h0) * dim / 2;
    stage_rows(kv_from(cache, h0 * dim), rows, n, (h1 - h0) * dim, stage);
    return stage;
}

/* n keys' rows (every KV head's side by side, token t's at offset rows[t] of each cache) into `packed`, for KV
   heads [h0, h1): the keys' rows in bfloat16 (rows_of; prefetched: the caller prefetched them), laid out for the
   products, then the values' */
static void pack_decode_chunk(kv_elements k_cache, kv_elements v_cache, const int64_t *rows, int64_t n,
                              int64_t kv_heads, int64_t h0, int64_t h1, int64_t dim, int prefetched,
                              uint32_t *packed) {
    uint32_t *keys = packed, *values = packed + kv_heads * decode_keys_words(dim);
    uint32_t *stage = values + kv_heads * decode_values_words(dim);
    int64_t width;   /* words from a row's to the next's */
    const uint32_t *k_rows = rows_of(k_cache, rows, n, kv_heads, h0, h1, dim, prefetched, stage, &width);
    for (int64_t h = h0; h < h1; h++)
        for (int64_t p = 0; 16 * p < n; p++)
            pack_key_panel_of(k_rows + (h - h0) * dim / 2, width, p, n, dim,
                              keys + h * decode_keys_words(dim) + p * dim * 8);
    const uint16_t *v_rows = (const uint16_t *)rows_of(v_cache, rows, n, kv_heads, h0, h1, dim, prefetched, stage,
                                                       &width);
    for (int64_t h = h0; h < h1; h++)
        for (int64_t i = 0; 2 * i < n; i++)
            pack_value_pair_into(v_rows + (h - h0) * dim, 2 * width, i, n, dim,
                                 values + h * decode_values_words(dim) + i * 16, DECODE_CHUNK / 2);
}

/* KV head h of a chunk of n keys (1 <= n <= DECODE_CHUNK) packed by pack_decode_chunk into w.packed, for `rows`
   query rows q (row r at q + r * q_step, dim floats): partial[r * part_step] = (max, sum, unnormalised output
   [dim]); ahead (or NULL): memory the thread reads next, prefetched as the products run */
static void decode_chunk_bf16(const float *q, int64_t rows, int64_t q_step, int64_t kv_heads, int64_t h, int64_t n,
                              int64_t dim, float scale, DecodeBf16Scratch w, float *partial, int64_t part_step,
                              bf16_ahead *ahead) {
    const int64_t half = dim / 2, pair_count = (n + 1) / 2;
    const uint32_t *keys = w.packed + h * decode_keys_words(dim);
    const uint32_t *values = w.packed + kv_heads * decode_keys_words(dim) + h * decode_values_words(dim);
    for (int64_t r = 0; r < rows; r++) bf16_pairs_of_row(q + r * q_step, dim, w.queries + r * half);
    const bf16_problem scores = {w.queries, half, half, keys, half * 16, 16, NULL, scale, w.probs, DECODE_CHUNK,
                                 ahead};
    bf16_tile(&scores, rows, n);
    for (int64_t r = 0; r < rows; r++) {
        float *s = w.probs + r * DECODE_CHUNK;
        const float top = max_of(s, n);
        exp_shifted(s, n, top);
        partial[r * part_step] = top;
        partial[r * part_step + 1] = sum_of(s, n);
        if (n % 2) s[n] = 0.0f;   /* the last pair's second key */
        bf16_pairs_of_row(s, 2 * pair_count, w.weights + r * DECODE_CHUNK / 2);
    }
    const bf16_problem outputs = {w.weights, DECODE_CHUNK / 2, pair_count, values, DECODE_CHUNK / 2 * 16, 16, NULL,
                                  1.0f, partial + 2, part_step, ahead};
    bf16_tile(&outputs, rows, dim);
}

#endif
