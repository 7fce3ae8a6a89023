/* Decode attention over each sequence's own KV blocks, read in place from the paged cache, with
 * the log-sum-exp the cascade merge needs. Same contract as
 * kernels/reference/cascade_attention.py::paged_decode_with_lse (the oracle).
 *
 * A sequence's context is cut into chunks of CHUNK tokens, one task per (sequence, chunk), every
 * KV head: each head's query groups are scored against KEYS keys at a time as they are read, so
 * grouped-query attention reads K and V once, and each group's partial softmax (max, sum,
 * unnormalised output) is kept. The partials are then merged by log-sum-exp in chunk order. Chunks follow from the
 * sequence's length alone, so its result does not depend on what it is batched with; and a long
 * context keeps every thread busy even for one sequence (SmolLM2, one agent at 2,112 tokens:
 * 3 tasks a layer for 2 threads before, 27 now).
 * Built by kernels/cpu/native.py; called through ctypes from kernels/cpu/native_attention.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "attention_tiles.h"
#include "paged_decode.h"
#include "task_pool.h"

#define CHUNK 256   /* tokens a task */
#define KEYS 8      /* tokens scored at once: their sums side by side, then reduced together */
#define VALUE_SPAN 4    /* tokens a pass of the values: fewer stores than one a token, and a small batch of
                           prefetches (a SmolLM2 layer streamed, 2,112 tokens: 1 -> 189 us, 4 -> 137, 32 -> 241) */
#define GROUP_TILE 4    /* query groups whose sums stay in registers */
#define AHEAD 2         /* groups of KEYS tokens: the keys prefetched, into L2 (L1: 0.8x the speed) */

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

/* a * b + c, fused where the machine has FMA (every build on it alike), else rounded twice */
static inline v8 fma8(v8 a, v8 b, v8 c) {
#if defined(__FMA__)
    return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

/* the sums of the 8 lanes of each of 8 vectors, as one vector: lanes paired, then pairs, then halves */
static inline v8 sums_of_8(const v8 *acc) {
#if defined(__AVX2__)
    const __m256 a = _mm256_hadd_ps((__m256)acc[0], (__m256)acc[1]), b = _mm256_hadd_ps((__m256)acc[2], (__m256)acc[3]);
    const __m256 c = _mm256_hadd_ps((__m256)acc[4], (__m256)acc[5]), d = _mm256_hadd_ps((__m256)acc[6], (__m256)acc[7]);
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    return (v8)_mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
#else
    v8 out;
    for (int i = 0; i < 8; i++) {
        const v8 x = acc[i];
        out[i] = (((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7])));
    }
    return out;
#endif
}

/* the largest of s[0 .. n), 8 lanes at a time and then across the lanes */
static inline float max_of(const float *s, int64_t n) {
    float top = -INFINITY;
    int64_t i = 0;
#if defined(__AVX2__)
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + i));
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    for (int l = 0; l < 8; l++) top = lanes[l] > top ? lanes[l] : top;
#endif
    for (; i < n; i++) top = s[i] > top ? s[i] : top;
    return top;
}

/* the sum of s[0 .. n), in 8 lanes and then across them */
static inline float sum_of(const float *s, int64_t n) {
    v8 acc = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc += load8(s + i);
    float total = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; i < n; i++) total += s[i];
    return total;
}

/* the tokens of sequence b's context: its length, at most what its table holds (as the oracle) */
static inline int64_t context_of(const int64_t *lengths, int64_t b, int64_t width, int64_t block_size) {
    return lengths[b] < width * block_size ? lengths[b] : width * block_size;
}

typedef struct {
    const float *q, *k_cache, *v_cache;
    const int64_t *tables;
    int64_t heads, kv_heads, groups, dim, block_size, width;
    float scale;
} Problem;

/* where the rows of tokens [first, first + n) of sequence b start in the caches (in floats), block by
   block: a block's tokens lie side by side */
static void token_rows(const Problem *p, int64_t b, int64_t first, int64_t n, int64_t *rows) {
    const int64_t *table = p->tables + b * p->width, row = p->kv_heads * p->dim;
    int64_t block = first / p->block_size, offset = first % p->block_size;
    for (int64_t i = 0; i < n; i++) {
        rows[i] = (table[block] * p->block_size + offset) * row;
        if (++offset == p->block_size) offset = 0, block++;
    }
}

/* the next KEYS tokens' key rows (every head), a line at a time: the blocks lie anywhere in the pool */
static inline void prefetch_rows(const float *cache, const int64_t *rows, int64_t count, int64_t row) {
    for (int64_t i = 0; i < count; i++)
        for (int64_t f = 0; f < row; f += 16) __builtin_prefetch(cache + rows[i] + f, 0, 2);
}

/* scores[g * CHUNK + i] = scale * (q[g] . key i) for KEYS keys (keys[i]: key i's row of one KV head) and the
   head's query groups q; each dot product in 8 lanes, then the lanes of the KEYS keys summed together */
static inline void score_keys(const float *q, int64_t groups, const float *const *keys, int64_t dim, float scale,
                              float *scores) {
    for (int64_t g = 0; g < groups; g++) {
        v8 acc[KEYS] = {{0}};
        for (int64_t d = 0; d < dim; d += 8) {
            const v8 query = load8(q + g * dim + d);
            for (int i = 0; i < KEYS; i++) acc[i] = fma8(load8(keys[i] + d), query, acc[i]);
        }
        store8(scores + g * CHUNK, sums_of_8(acc) * scale);
    }
}

/* out[g][d .. d + 8 W) += probs[g * CHUNK + t] * (token t's value row at v + rows[t])[d .. d + 8 W), for the
   tokens t < count in turn and G query groups (G, W constants after inlining), the sums held in registers
   over the tokens: one store a span instead of one a token (a SmolLM2 layer: 0.55 of the time) */
static inline __attribute__((always_inline)) void add_values_tile(int G, int W, float *out, int64_t stride,
                                                                  const float *probs, const float *v,
                                                                  const int64_t *rows, int64_t count) {
    v8 acc[GROUP_TILE][2];
    for (int g = 0; g < G; g++)
        for (int w = 0; w < W; w++) acc[g][w] = load8(out + g * stride + 8 * w);
    for (int64_t t = 0; t < count; t++) {
        v8 value[2];
        for (int w = 0; w < W; w++) value[w] = load8(v + rows[t] + 8 * w);
        for (int g = 0; g < G; g++) {
            const v8 zero = {0}, weight = zero + probs[g * CHUNK + t];
            for (int w = 0; w < W; w++) acc[g][w] = fma8(weight, value[w], acc[g][w]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int w = 0; w < W; w++) store8(out + g * stride + 8 * w, acc[g][w]);
}

#define VALUES_TILE(G) (wide ? add_values_tile(G, 2, o + d, stride, p, v + d, rows, count) \
                             : add_values_tile(G, 1, o + d, stride, p, v + d, rows, count))

/* add_values_tile for every query group of one KV head (v: its value rows), 16 dims at a time */
static void add_values(float *out, int64_t stride, const float *probs, int64_t groups, const float *v,
                       const int64_t *rows, int64_t count, int64_t dim) {
    for (int64_t g0 = 0; g0 < groups; g0 += GROUP_TILE) {
        const int64_t G = groups - g0 < GROUP_TILE ? groups - g0 : GROUP_TILE;
        float *o = out + g0 * stride;
        const float *p = probs + g0 * CHUNK;
        for (int64_t d = 0; d < dim; d += 16) {
            const int wide = d + 16 <= dim;
            if (G == 4) VALUES_TILE(4);
            else if (G == 3) VALUES_TILE(3);
            else if (G == 2) VALUES_TILE(2);
            else VALUES_TILE(1);
        }
    }
}

/* tokens [first, first + n) of sequence b, every KV head: partial[head of b] = (max, sum, sum of
   weight * v) for each of b's query heads; probs is scratch for heads x CHUNK scores and the chunk's
   rows. The keys go KEYS at a time (the last group repeating the chunk's last key); a token's rows for
   all KV heads lie side by side, so the chunk is read front to back. */
static void chunk_task(const Problem *p, int64_t b, int64_t first, int64_t n, float *probs, float *partial) {
    const int64_t dim = p->dim, row = p->kv_heads * dim, groups = p->groups, part = dim + 2;
    const float *q = p->q + b * p->heads * dim;
    int64_t rows[CHUNK + AHEAD * KEYS];
    token_rows(p, b, first, n, rows);
    for (int64_t i = n; i < CHUNK + AHEAD * KEYS; i++) rows[i] = rows[n - 1];
    for (int64_t t = 0; t < n; t += KEYS) {
        prefetch_rows(p->k_cache, rows + t + AHEAD * KEYS, t + AHEAD * KEYS < n ? KEYS : 0, row);
        for (int64_t h = 0; h < p->kv_heads; h++) {
            const float *keys[KEYS];
            for (int i = 0; i < KEYS; i++) keys[i] = p->k_cache + rows[t + i] + h * dim;
            score_keys(q + h * groups * dim, groups, keys, dim, p->scale, probs + h * groups * CHUNK + t);
        }
    }
    for (int64_t head = 0; head < p->heads; head++) {
        float *s = probs + head * CHUNK;
        const float top = max_of(s, n);
        exp_shifted(s, n, top);
        partial[head * part] = top;
        partial[head * part + 1] = sum_of(s, n);
        memset(partial + head * part + 2, 0, sizeof(float) * (size_t)dim);
    }
    for (int64_t t = 0; t < n; t += VALUE_SPAN) {
        const int64_t count = n - t < VALUE_SPAN ? n - t : VALUE_SPAN;
        prefetch_rows(p->v_cache, rows + t + VALUE_SPAN, t + VALUE_SPAN < n ? VALUE_SPAN : 0, row);
        for (int64_t h = 0; h < p->kv_heads; h++)
            add_values(partial + h * groups * part + 2, part, probs + h * groups * CHUNK + t, groups,
                       p->v_cache + h * dim, rows + t, count, dim);
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
