/* Decode attention over each sequence's own KV blocks, read in place from the paged cache, with
 * the log-sum-exp the cascade merge needs. Same contract as
 * kernels/reference/cascade_attention.py::paged_decode_with_lse (the oracle).
 *
 * A sequence's context is cut into chunks of CHUNK tokens, one task per (sequence, KV head,
 * chunk): the head's query groups are scored against each key as it is read, so grouped-query
 * attention reads K and V once, and each group's partial softmax (max, sum, unnormalised output)
 * is kept. The partials are then merged by log-sum-exp in chunk order. Chunks follow from the
 * sequence's length alone, so its result does not depend on what it is batched with; and a long
 * context keeps every thread busy even for one sequence (SmolLM2, one agent at 2,112 tokens:
 * 3 tasks a layer for 2 threads before, 27 now).
 * Built by kernels/cpu/native.py; called through ctypes from kernels/cpu/native_attention.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tiles.h"
#include "task_pool.h"

#define CHUNK 256   /* tokens a task */
#define AHEAD 8     /* tokens */

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* scores[g * stride] = scale * (q[g] . k) for the `groups` query rows q of one KV head, four at a
   time so that their sums run side by side; each is summed in 8 lanes, then lane by lane */
static inline void group_dots(const float *q, int64_t groups, const float *k, int64_t dim, float scale, float *scores,
                              int64_t stride) {
    for (int64_t g0 = 0; g0 < groups; g0 += 4) {
        const int64_t count = groups - g0 < 4 ? groups - g0 : 4;
        v8 acc[4] = {{0}, {0}, {0}, {0}};
        for (int64_t i = 0; i < dim; i += 8) {
            const v8 key = load8(k + i);
            for (int64_t g = 0; g < count; g++) acc[g] += load8(q + (g0 + g) * dim + i) * key;
        }
        for (int64_t g = 0; g < count; g++) {
            float s = 0.0f;
            for (int l = 0; l < 8; l++) s += acc[g][l];
            scores[(g0 + g) * stride] = scale * s;
        }
    }
}

/* the tokens of sequence b's context: its length, at most what its table holds (as the oracle) */
static inline int64_t context_of(const int64_t *lengths, int64_t b, int64_t width, int64_t block_size) {
    return lengths[b] < width * block_size ? lengths[b] : width * block_size;
}

/* the flat cache slot of token t of sequence b */
static inline int64_t slot_of(const int64_t *tables, int64_t width, int64_t block_size, int64_t b, int64_t t) {
    return tables[b * width + t / block_size] * block_size + t % block_size;
}

/* a token's key and value rows, AHEAD tokens before they are scored: its blocks lie anywhere in
   the pool, and a head's row is a short strided run the hardware prefetcher does not foresee
   (one SmolLM2 layer, 8 sequences of 128 tokens: 217 -> 166 us) */
static inline void prefetch_token(const float *k_row, const float *v_row, int64_t dim) {
    for (int64_t i = 0; i < dim; i += 16) {
        __builtin_prefetch(k_row + i);
        __builtin_prefetch(v_row + i);
    }
}

static inline void add_scaled(float *out, float weight, const float *v, int64_t dim) {
    for (int64_t i = 0; i < dim; i += 8) {
        v8 o = load8(out + i) + weight * load8(v + i);
        memcpy(out + i, &o, sizeof o);
    }
}

typedef struct {
    const float *q, *k_cache, *v_cache;
    const int64_t *tables;
    int64_t heads, kv_heads, groups, dim, block_size, width;
    float scale;
} Problem;

/* tokens [first, first + n) of sequence b, every KV head: partial[head of b] = (max, sum, sum of
   weight * v) for each of b's query heads; probs is scratch for heads x CHUNK scores. A token's
   rows for all KV heads lie side by side, so the chunk is read front to back. */
static void chunk_task(const Problem *p, int64_t b, int64_t first, int64_t n, float *probs, float *partial) {
    const int64_t dim = p->dim, last = first + n, row = p->kv_heads * dim;
    const float *q = p->q + b * p->heads * dim;
    for (int64_t t = first; t < last; t++) {
        if (t + AHEAD < last) {
            const int64_t ahead = slot_of(p->tables, p->width, p->block_size, b, t + AHEAD) * row;
            prefetch_token(p->k_cache + ahead, p->v_cache + ahead, row);
        }
        const float *k = p->k_cache + slot_of(p->tables, p->width, p->block_size, b, t) * row;
        for (int64_t h = 0; h < p->kv_heads; h++)
            group_dots(q + h * p->groups * dim, p->groups, k + h * dim, dim, p->scale,
                       probs + h * p->groups * CHUNK + t - first, CHUNK);
    }
    for (int64_t head = 0; head < p->heads; head++) {
        float *s = probs + head * CHUNK, top = -INFINITY, total = 0.0f;
        for (int64_t i = 0; i < n; i++) top = s[i] > top ? s[i] : top;
        exp_shifted(s, n, top);
        for (int64_t i = 0; i < n; i++) total += s[i];
        partial[head * (dim + 2)] = top;
        partial[head * (dim + 2) + 1] = total;
        memset(partial + head * (dim + 2) + 2, 0, sizeof(float) * (size_t)dim);
    }
    for (int64_t t = first; t < last; t++) {
        const float *v = p->v_cache + slot_of(p->tables, p->width, p->block_size, b, t) * row;
        for (int64_t head = 0; head < p->heads; head++)
            add_scaled(partial + head * (dim + 2) + 2, probs[head * CHUNK + t - first], v + head / p->groups * dim,
                       dim);
    }
}

typedef struct {
    const Problem *p;
    const int64_t *lengths, *first_chunk, *owner;
    float *partials, *probs;   /* probs: heads x CHUNK scores for each thread */
} Chunks;

static void chunk_of(void *context, int64_t c, int slot) {
    const Chunks *t = context;
    const Problem *p = t->p;
    const int64_t b = t->owner[c], first = (c - t->first_chunk[b]) * CHUNK;
    const int64_t len = context_of(t->lengths, b, p->width, p->block_size);
    chunk_task(p, b, first, len - first < CHUNK ? len - first : CHUNK, t->probs + slot * p->heads * CHUNK,
               t->partials + c * p->heads * (p->dim + 2));
}

/* every chunk's task on the pool's threads, then every query head's merge (a few µs: not worth waking
   them again); nonzero when scratch memory ran out */
static int run_tasks(const Problem *p, int64_t batch, const int64_t *lengths, const int64_t *first_chunk,
                     const int64_t *owner, float *partials, float *out, float *lse, int threads) {
    const int64_t part = p->heads * (p->dim + 2), dim = p->dim;
    if (threads < 1) threads = 1;
    float *probs = malloc(sizeof(float) * (size_t)(threads * p->heads * CHUNK));
    if (!probs) return 1;
    Chunks tasks = {p, lengths, first_chunk, owner, partials, probs};
    swarm_pool_run(chunk_of, &tasks, first_chunk[batch], threads);
    free(probs);
    for (int64_t head = 0; head < batch * p->heads; head++) {
        const int64_t b = head / p->heads;
        merge_chunks(partials + first_chunk[b] * part + head % p->heads * (dim + 2),
                     first_chunk[b + 1] - first_chunk[b], part, dim, out + head * dim, lse + head);
    }
    return 0;
}

/* q: [batch, heads, dim]; k_cache, v_cache: [blocks, block_size, kv_heads, dim]; tables:
 * [batch, width] block ids; lengths: [batch]; out: [batch, heads, dim]; lse: [batch, heads].
 * dim is a multiple of 8. A sequence of length 0 gets out = 0 and lse = -inf. Returns -1 when
 * scratch memory runs out. */
int swarm_paged_decode(const float *q, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                       const float *k_cache, const float *v_cache, int64_t block_size, const int64_t *tables,
                       int64_t width, const int64_t *lengths, float scale, float *out, float *lse, int threads) {
    const Problem p = {q, k_cache, v_cache, tables, heads, kv_heads, heads / kv_heads, dim, block_size, width, scale};
    int64_t *first_chunk = malloc(sizeof(int64_t) * (size_t)(batch + 1));   /* each sequence's first chunk */
    if (!first_chunk) return -1;
    first_chunk[0] = 0;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = context_of(lengths, b, width, block_size);
        first_chunk[b + 1] = first_chunk[b] + (len > 0 ? (len + CHUNK - 1) / CHUNK : 0);
    }
    const int64_t chunks = first_chunk[batch];
    float *partials = malloc(sizeof(float) * (size_t)(chunks * heads * (dim + 2) + 1));
    int64_t *owner = malloc(sizeof(int64_t) * (size_t)(chunks + 1));    /* the sequence of each chunk */
    int failed = !partials || !owner;
    for (int64_t b = 0; b < batch && !failed; b++)
        for (int64_t c = first_chunk[b]; c < first_chunk[b + 1]; c++) owner[c] = b;
    failed = failed || run_tasks(&p, batch, lengths, first_chunk, owner, partials, out, lse, threads);
    free(first_chunk);
    free(partials);
    free(owner);
    return failed ? -1 : 0;
}
