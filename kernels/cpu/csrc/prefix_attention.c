/* Decode attention of many rows over one shared prefix (the trunk every agent reads), with the
 * log-sum-exp the cascade merge needs. Same contract as
 * kernels/reference/cascade_attention.py::prefix_attention (the oracle).
 *
 * The rows that read one KV head (every row's query heads of that group) are a small matrix Q;
 * the prefix is cut into chunks of keys, one task per chunk, every KV head in turn, where there are chunks for
 * each thread to take two (the chunk's keys and values then stream front to back: 8 rows over a 2,048-token
 * trunk from memory, 0.85-0.96 of the time of a task a head), else one per (KV head, chunk):
 *     S = Q K^T * scale, P = exp(S - row max), O = P V
 * the scores and softmax as paged_decode.c computes them (decode_scores.h: 8 keys at a time, each row's dot
 * products in 8 lanes over the dims), the outputs in register tiles (attention_tiles.h), with K and V read in
 * place from the cache. So a chunk of the trunk gets the bits paged_decode.c gives it, and a row that reads the
 * trunk shared gets those of its whole context read alone (swarm_prefix_partials). The tasks' partial softmaxes
 * are merged by log-sum-exp in a fixed chunk order, and every sum runs in an order fixed by the prefix length
 * alone: a row's result does not depend on which rows it is batched with.
 * Built by kernels/cpu/native.py; called through ctypes from kernels/cpu/native_attention.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "prefix_attention.h"
#include "task_pool.h"

typedef struct {
    int64_t rows;     /* query rows for one KV head: batch * groups */
    int64_t dim;
    int64_t stride;   /* floats from one key's (or value's) row to the next's */
} Shape;

#include "attention_tiles.h"
#include "decode_bf16.h"
#include "decode_scores.h"

#define CHUNK DECODE_CHUNK   /* keys per task: 8 tasks per KV head at a 2,048-token trunk */

/* One chunk of n keys for one KV head: partial[row] = (max, sum, unnormalised output [dim]) of the rows' queries
   q [rows x dim]; scores is scratch for rows x CHUNK. */
static void chunk_attention(const float *q, const float *k, const float *v, Shape s, int64_t n, float scale,
                            float *scores, float *partial) {
    for (int64_t t = 0; t < n; t += DECODE_KEYS) {   /* past n, the last key again (as paged_decode.c) */
        const float *keys[DECODE_KEYS];
        for (int i = 0; i < DECODE_KEYS; i++) keys[i] = k + (t + i < n ? t + i : n - 1) * s.stride;
        score_keys(q, s.rows, keys, s.dim, scale, scores + t, CHUNK);
    }
    for (int64_t r = 0; r < s.rows; r++) {
        float *row = scores + r * CHUNK;
        const float top = max_of(row, n);
        exp_shifted(row, n, top);
        partial[r * (s.dim + 2)] = top;
        partial[r * (s.dim + 2) + 1] = sum_of(row, n);
    }
    matmul(scores, CHUNK, 1, v, s.stride, s.rows, n, s.dim, partial + 2, s.dim + 2, 1.0f);
}

typedef struct {
    const float *queries;           /* [kv_heads, rows, dim] */
    kv_elements k, v;               /* float32, or bfloat16 (then bf16 too) */
    Shape s;
    int64_t kv_heads, chunks, keys;
    int whole_chunks;               /* a task: a chunk, every KV head; else one KV head of one chunk */
    int bf16;                       /* the products in bfloat16 (decode_bf16.h) */
    float scale;
    float *partials, *scores;       /* scores: each thread's scratch, `scratch` floats */
    int64_t scratch;
} Chunks;

/* KV head h's part of chunk c */
static void head_of_chunk(const Chunks *t, int64_t h, int64_t c, int slot) {
    const Shape s = t->s;
    const int64_t first = c * CHUNK, n = t->keys - first < CHUNK ? t->keys - first : CHUNK;
    const int64_t at = first * s.stride + h * s.dim;
    chunk_attention(t->queries + h * s.rows * s.dim, (const float *)t->k.base + at, (const float *)t->v.base + at, s,
                    n, t->scale,
                    t->scores + slot * t->scratch, t->partials + (h * t->chunks + c) * s.rows * (s.dim + 2));
}

/* the keys and values of the chunk a thread likely takes after chunk c (the pool's caller takes tasks from the
   front, its threads from the back), to prefetch while it computes c: from memory, a chunk's wait for them was
   about as long as its arithmetic */
static bf16_ahead next_chunk(const Chunks *t, int64_t c, int slot) {
    const int64_t next = slot == 0 ? c + 1 : c - 1;
    if (next < 0 || next >= t->chunks) return (bf16_ahead){NULL, NULL, 0, 0};
    const int64_t first = next * CHUNK, n = t->keys - first < CHUNK ? t->keys - first : CHUNK;
    return (bf16_ahead){kv_from(t->k, first * t->s.stride).base, kv_from(t->v, first * t->s.stride).base,
                        kv_bytes(t->k, n * t->s.stride) / 64, 0};
}

/* KV heads [h0, h1) of chunk c in bfloat16 products (decode_bf16.h): the chunk's keys and values packed, then each
   head's rows over them */
static void heads_of_chunk_bf16(const Chunks *t, int64_t h0, int64_t h1, int64_t c, int slot) {
    const Shape s = t->s;
    const int64_t first = c * CHUNK, n = t->keys - first < CHUNK ? t->keys - first : CHUNK;
    const DecodeBf16Scratch w = decode_bf16_scratch((uint32_t *)(t->scores + slot * t->scratch), t->kv_heads, s.rows,
                                                    s.dim);
    int64_t rows[CHUNK];
    for (int64_t i = 0; i < n; i++) rows[i] = i * s.stride;
    pack_decode_chunk(kv_from(t->k, first * s.stride), kv_from(t->v, first * s.stride), rows, n, t->kv_heads, h0, h1,
                      s.dim, t->whole_chunks, w.packed);   /* whole chunks: this chunk was prefetched (next_chunk) */
    bf16_ahead ahead = next_chunk(t, c, slot);
    for (int64_t h = h0; h < h1; h++)
        decode_chunk_bf16(t->queries + h * s.rows * s.dim, s.rows, s.dim, t->kv_heads, h, n, s.dim, t->scale, w,
                          t->partials + (h * t->chunks + c) * s.rows * (s.dim + 2), s.dim + 2,
                          t->whole_chunks ? &ahead : NULL);
}

static void chunk_of(void *context, int64_t task, int slot) {
    const Chunks *t = context;
    if (t->whole_chunks && t->bf16)
        heads_of_chunk_bf16(t, 0, t->kv_heads, task, slot);
    else if (t->whole_chunks)   /* every KV head of chunk `task`: the chunk's keys and values read front to back */
        for (int64_t h = 0; h < t->kv_heads; h++) head_of_chunk(t, h, task, slot);
    else if (t->bf16)
        heads_of_chunk_bf16(t, task / t->chunks, task / t->chunks + 1, task % t->chunks, slot);
    else
        head_of_chunk(t, task / t->chunks, task % t->chunks, slot);
}

/* every (KV head, chunk) task on the pool's threads; nonzero when scratch memory ran out */
static int run_chunks(const float *queries, kv_elements k, kv_elements v, Shape s, int64_t kv_heads,
                      int64_t keys, int bf16, float scale, float *partials, int threads) {
    const int64_t chunks = (keys + CHUNK - 1) / CHUNK;
    if (threads < 1) threads = 1;
    const int64_t scratch = bf16 ? decode_bf16_words(kv_heads, s.rows, s.dim) : s.rows * CHUNK;
    float *scores = malloc(sizeof(float) * (size_t)(threads * scratch));
    if (!scores) return 1;
    const int whole = chunks >= 2 * threads;
    Chunks tasks = {queries, k, v, s, kv_heads, chunks, keys, whole, bf16, scale, partials, scores, scratch};
    swarm_pool_run(chunk_of, &tasks, whole ? chunks : kv_heads * chunks, threads);
    free(scores);
    return 0;
}

/* every KV head's chunks' partials for q's rows: [kv_heads, chunks, batch * groups, dim + 2] (row (b, g) of head h:
   query head h * groups + g of row b), allocated; NULL when memory runs out */
static float *trunk_partials(const float *q, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                             kv_elements k, kv_elements v, int64_t keys, int bf16, float scale, int threads) {
    const int64_t groups = heads / kv_heads, chunks = (keys + CHUNK - 1) / CHUNK, rows = batch * groups;
    const Shape s = {rows, dim, kv_heads * dim};
    float *queries = malloc(sizeof(float) * (size_t)(kv_heads * rows * dim));
    float *partials = malloc(sizeof(float) * (size_t)(kv_heads * chunks * rows * (dim + 2)));
    int failed = !queries || !partials;
    for (int64_t h = 0; h < kv_heads && !failed; h++)     /* row (b, g) of head h: query head h * groups + g */
        for (int64_t row = 0; row < rows; row++)
            memcpy(queries + (h * rows + row) * dim, q + (row / groups * heads + h * groups + row % groups) * dim,
                   sizeof(float) * (size_t)dim);
    failed = failed || run_chunks(queries, k, v, s, kv_heads, keys, bf16, scale, partials, threads);
    free(queries);
    if (failed) free(partials);
    return failed ? NULL : partials;
}

/* q: [batch, heads, dim]; k, v: [keys, kv_heads, dim] (keys >= 1); out: [batch, heads, dim];
 * lse: [batch, heads]. dim is a multiple of 8. Returns -1 when scratch memory runs out. */
int swarm_prefix_attention(const float *q, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                           const float *k, const float *v, int64_t keys, float scale, float *out, float *lse,
                           int threads) {
    const int64_t groups = heads / kv_heads, chunks = (keys + CHUNK - 1) / CHUNK, rows = batch * groups;
    float *partials = trunk_partials(q, batch, heads, kv_heads, dim, (kv_elements){k, 0}, (kv_elements){v, 0}, keys,
                                     0, scale, threads);
    if (!partials) return -1;
    for (int64_t h = 0; h < kv_heads; h++)
        for (int64_t row = 0; row < rows; row++) {
            const int64_t head = row / groups * heads + h * groups + row % groups;
            merge_chunks(partials + h * chunks * rows * (dim + 2) + row * (dim + 2), chunks, rows * (dim + 2), dim,
                         out + head * dim, lse + head);
        }
    free(partials);
    return 0;
}

/* The same rows' attention over the trunk, left as each chunk's partial (max, sum, unnormalised output) for
 * swarm_paged_decode's `given`: row b's go to given[given_rows[b]] ([given_width, heads, dim + 2], chunk by chunk).
 * With keys a multiple of swarm_prefix_chunk(), a row gets the bits of its whole context read by
 * swarm_paged_decode alone, in the same precision of products (bf16: bfloat16, decode_bf16.h). kv_bf16: k and v
 * hold bfloat16 (then the products are bfloat16). Returns -1 when memory runs out. */
int swarm_prefix_partials(const float *q, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                          const void *k, const void *v, int64_t keys, float scale, int bf16, int kv_bf16, float *given,
                          const int64_t *given_rows, int64_t given_width, int threads) {
    const int64_t groups = heads / kv_heads, chunks = (keys + CHUNK - 1) / CHUNK, rows = batch * groups;
    const int64_t part = dim + 2;
    float *partials = trunk_partials(q, batch, heads, kv_heads, dim, (kv_elements){k, kv_bf16},
                                     (kv_elements){v, kv_bf16}, keys, bf16 || kv_bf16, scale, threads);
    if (!partials) return -1;
    for (int64_t h = 0; h < kv_heads; h++)
        for (int64_t c = 0; c < chunks; c++)
            for (int64_t row = 0; row < rows; row++) {
                const int64_t b = row / groups, head = h * groups + row % groups;
                memcpy(given + ((given_rows[b] * given_width + c) * heads + head) * part,
                       partials + ((h * chunks + c) * rows + row) * part, sizeof(float) * (size_t)part);
            }
    free(partials);
    return 0;
}

/* the keys of a chunk */
int64_t swarm_prefix_chunk(void) { return CHUNK; }

/* Two softmax pieces over disjoint keys, combined: out, lse [pieces] from a and b ([pieces, dim] and
 * [pieces] each), as kernels/reference/cascade_attention.py::merge_attention. out may be a or b. */
void swarm_merge_attention(const float *a, const float *lse_a, const float *b, const float *lse_b, int64_t pieces,
                           int64_t dim, float *out, float *lse) {
    for (int64_t i = 0; i < pieces; i++) {
        const float top = lse_a[i] > lse_b[i] ? lse_a[i] : lse_b[i];
        if (top == -INFINITY) {   /* both empty */
            memset(out + i * dim, 0, sizeof(float) * (size_t)dim);
            lse[i] = -INFINITY;
            continue;
        }
        const float weight_a = expf(lse_a[i] - top), weight_b = expf(lse_b[i] - top), total = weight_a + weight_b;
        for (int64_t d = 0; d < dim; d++)
            out[i * dim + d] = (a[i * dim + d] * weight_a + b[i * dim + d] * weight_b) / total;
        lse[i] = top + logf(total);
    }
}
