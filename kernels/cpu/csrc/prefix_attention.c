/* Decode attention of many rows over one shared prefix (the trunk every agent reads), with the
 * log-sum-exp the cascade merge needs. Same contract as
 * kernels/reference/cascade_attention.py::prefix_attention (the oracle).
 *
 * The rows that read one KV head (every row's query heads of that group) are a small matrix Q;
 * the prefix is cut into chunks of keys, one task per chunk, every KV head in turn, where there are chunks for
 * each thread to take two (the chunk's keys and values then stream front to back: 8 rows over a 2,048-token
 * trunk from memory, 0.85-0.96 of the time of a task a head), else one per (KV head, chunk):
 *     S^T = K Q^T * scale, P^T = exp(S^T - column max), O = P V
 * in register tiles (kernels/cpu/csrc/attention_tiles.h), with K and V read in place from the cache. The tasks'
 * partial softmaxes are merged by log-sum-exp in a fixed chunk order, and every sum runs in an
 * order fixed by the prefix length alone: a row's result does not depend on which rows it is
 * batched with. SmolLM2, 8 rows over 2,048 tokens, 2 threads: 285 us a layer, against 520 us
 * for torch's fused (flash) kernel.
 * Built by kernels/cpu/native.py; called through ctypes from kernels/cpu/native_attention.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "prefix_attention.h"
#include "task_pool.h"

#define CHUNK 256     /* keys per task: 8 tasks per KV head at a 2,048-token trunk */

typedef struct {
    int64_t rows;         /* query rows for one KV head: batch * groups */
    int64_t padded_rows;  /* rows rounded up to 8 */
    int64_t dim;
    int64_t stride;   /* floats from one key's (or value's) row to the next's */
} Shape;

#include "attention_tiles.h"

/* One chunk of n keys for one KV head: partial[row] = (max, sum, unnormalised output [dim]).
   Scores are kept transposed, st [n x padded rows], so no operand needs transposing: keys and
   values are read in place, the queries come transposed (qt [dim x padded rows]). */
static void chunk_attention(const float *qt, const float *k, const float *v, Shape s, int64_t n, float scale,
                            float *st, float *sums, float *partial) {
    const int64_t cols = s.padded_rows;
    matmul(k, s.stride, 1, qt, cols, n, s.dim, cols, st, cols, scale);
    softmax_columns(st, n, cols, sums, sums + cols);
    chunk_partial(st, sums, v, s.stride, s.rows, cols, n, s.dim, partial);
}

typedef struct {
    const float *queries_t, *k, *v;
    Shape s;
    int64_t kv_heads, chunks, keys;
    int whole_chunks;              /* a task: a chunk, every KV head; else one KV head of one chunk */
    float scale;
    float *partials, *st, *sums;   /* st, sums: each thread's scratch */
} Chunks;

/* KV head h's part of chunk c */
static void head_of_chunk(const Chunks *t, int64_t h, int64_t c, int slot) {
    const Shape s = t->s;
    const int64_t first = c * CHUNK, n = t->keys - first < CHUNK ? t->keys - first : CHUNK;
    const int64_t at = first * s.stride + h * s.dim;
    chunk_attention(t->queries_t + h * s.dim * s.padded_rows, t->k + at, t->v + at, s, n, t->scale,
                    t->st + slot * CHUNK * s.padded_rows, t->sums + slot * 2 * s.padded_rows,
                    t->partials + (h * t->chunks + c) * s.rows * (s.dim + 2));
}

static void chunk_of(void *context, int64_t task, int slot) {
    const Chunks *t = context;
    if (t->whole_chunks)   /* every KV head of chunk `task`: the chunk's keys and values read front to back */
        for (int64_t h = 0; h < t->kv_heads; h++) head_of_chunk(t, h, task, slot);
    else
        head_of_chunk(t, task / t->chunks, task % t->chunks, slot);
}

/* every (KV head, chunk) task on the pool's threads; nonzero when scratch memory ran out */
static int run_chunks(const float *queries_t, const float *k, const float *v, Shape s, int64_t kv_heads,
                      int64_t keys, float scale, float *partials, int threads) {
    const int64_t chunks = (keys + CHUNK - 1) / CHUNK;
    if (threads < 1) threads = 1;
    float *st = malloc(sizeof(float) * (size_t)(threads * CHUNK * s.padded_rows));
    float *sums = malloc(sizeof(float) * (size_t)(threads * 2 * s.padded_rows));
    const int failed = !st || !sums;
    if (!failed) {
        const int whole = chunks >= 2 * threads;
        Chunks tasks = {queries_t, k, v, s, kv_heads, chunks, keys, whole, scale, partials, st, sums};
        swarm_pool_run(chunk_of, &tasks, whole ? chunks : kv_heads * chunks, threads);
    }
    free(st);
    free(sums);
    return failed;
}

/* q: [batch, heads, dim]; k, v: [keys, kv_heads, dim] (keys >= 1); out: [batch, heads, dim];
 * lse: [batch, heads]. dim is a multiple of 8. Returns -1 when scratch memory runs out. */
int swarm_prefix_attention(const float *q, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                           const float *k, const float *v, int64_t keys, float scale, float *out, float *lse,
                           int threads) {
    const int64_t groups = heads / kv_heads, chunks = (keys + CHUNK - 1) / CHUNK, rows = batch * groups;
    const Shape s = {rows, (rows + 7) / 8 * 8, dim, kv_heads * dim};
    float *queries_t = calloc((size_t)(kv_heads * dim * s.padded_rows), sizeof(float));
    float *partials = malloc(sizeof(float) * (size_t)(kv_heads * chunks * rows * (dim + 2)));
    int failed = !queries_t || !partials;
    for (int64_t h = 0; h < kv_heads && !failed; h++)     /* row (b, g) of head h: query head h * groups + g */
        for (int64_t row = 0; row < rows; row++) {
            const float *query = q + (row / groups * heads + h * groups + row % groups) * dim;
            for (int64_t d = 0; d < dim; d++) queries_t[(h * dim + d) * s.padded_rows + row] = query[d];
        }
    failed = failed || run_chunks(queries_t, k, v, s, kv_heads, keys, scale, partials, threads);
    for (int64_t h = 0; h < kv_heads && !failed; h++)
        for (int64_t row = 0; row < rows; row++) {
            const int64_t head = row / groups * heads + h * groups + row % groups;
            merge_chunks(partials + h * chunks * rows * (dim + 2) + row * (dim + 2), chunks, rows * (dim + 2), dim,
                         out + head * dim, lse + head);
        }
    free(queries_t);
    free(partials);
    return failed ? -1 : 0;
}

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
