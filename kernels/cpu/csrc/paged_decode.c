/* Decode attention over each sequence's own KV blocks, read in place from the paged cache, with
 * the log-sum-exp the cascade merge needs. Same contract as
 * kernels/reference/cascade_attention.py::paged_decode_with_lse (the oracle).
 *
 * A sequence's context is cut into chunks of CHUNK tokens, one task per (sequence, chunk), every
 * KV head: each head's query groups are scored against KEYS keys at a time as they are read, so
 * grouped-query attention reads K and V once, and each group's partial softmax (max, sum,
 * unnormalised output) is kept, in decode_scores.h's arithmetic. The partials are then merged by log-sum-exp in
 * chunk order, after those of a shared trunk's chunks where they are given (prefix_attention.c computes them in
 * the same arithmetic): a row gets the same bits with its trunk shared or read here. Chunks follow from the
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
#include "decode_bf16.h"
#include "decode_scores.h"
#include "paged_decode.h"
#include "task_pool.h"

#define CHUNK DECODE_CHUNK   /* tokens a task */
#define KEYS DECODE_KEYS
#define VALUE_SPAN 4    /* tokens a pass of the values: fewer stores than one a token, and a small batch of
                           prefetches (a SmolLM2 layer streamed, 2,112 tokens: 1 -> 189 us, 4 -> 137, 32 -> 241) */
#define GROUP_TILE 4    /* query groups whose sums stay in registers */
#define AHEAD 2         /* groups of KEYS tokens: the keys prefetched, into L2 (L1: 0.8x the speed) */

/* the tokens of sequence b's context: its length, at most what its table holds (as the oracle) */
static inline int64_t context_of(const int64_t *lengths, int64_t b, int64_t width, int64_t block_size) {
    return lengths[b] < width * block_size ? lengths[b] : width * block_size;
}

typedef struct {
    const float *q;
    const void *k_cache, *v_cache;   /* float32, or bfloat16 where kv_bf16 (then bf16 too) */
    const int64_t *tables;
    int64_t heads, kv_heads, groups, dim, block_size, width;
    float scale;
    int bf16;      /* the products in bfloat16 (decode_bf16.h) */
    int kv_bf16;
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
    const float *q = p->q + b * p->heads * dim, *k_cache = p->k_cache, *v_cache = p->v_cache;
    int64_t rows[CHUNK + AHEAD * KEYS];
    token_rows(p, b, first, n, rows);
    for (int64_t i = n; i < CHUNK + AHEAD * KEYS; i++) rows[i] = rows[n - 1];
    for (int64_t t = 0; t < n; t += KEYS) {
        prefetch_rows(k_cache, rows + t + AHEAD * KEYS, t + AHEAD * KEYS < n ? KEYS : 0, row);
        for (int64_t h = 0; h < p->kv_heads; h++) {
            const float *keys[KEYS];
            for (int i = 0; i < KEYS; i++) keys[i] = k_cache + rows[t + i] + h * dim;
            score_keys(q + h * groups * dim, groups, keys, dim, p->scale, probs + h * groups * CHUNK + t, CHUNK);
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
        prefetch_rows(v_cache, rows + t + VALUE_SPAN, t + VALUE_SPAN < n ? VALUE_SPAN : 0, row);
        for (int64_t h = 0; h < p->kv_heads; h++)
            add_values(partial + h * groups * part + 2, part, probs + h * groups * CHUNK + t, groups,
                       v_cache + h * dim, rows + t, count, dim);
    }
}

/* chunk_task in bfloat16 products (decode_bf16.h): the chunk packed, then each KV head's rows over it; scratch:
   decode_bf16_words(kv_heads, groups, dim). Unlike the trunk's kernel, it prefetches no next chunk: beside a
   decode step's weights streaming, that cost a lone sequence's attention a fifth more time. */
static void chunk_task_bf16(const Problem *p, int64_t b, int64_t first, int64_t n, uint32_t *scratch,
                            float *partial) {
    const int64_t dim = p->dim, groups = p->groups, part = dim + 2;
    int64_t rows[CHUNK];
    token_rows(p, b, first, n, rows);
    const DecodeBf16Scratch w = decode_bf16_scratch(scratch, p->kv_heads, groups, dim);
    pack_decode_chunk((kv_elements){p->k_cache, p->kv_bf16}, (kv_elements){p->v_cache, p->kv_bf16}, rows, n,
                      p->kv_heads, 0, p->kv_heads, dim, 0, w.packed);   /* staged: 0.75x the time of in place */
    for (int64_t h = 0; h < p->kv_heads; h++)
        decode_chunk_bf16(p->q + (b * p->heads + h * groups) * dim, groups, dim, p->kv_heads, h, n, dim, p->scale,
                          w, partial + h * groups * part, part, NULL);
}

typedef struct {
    const Problem *p;
    const int64_t *lengths, *owner, *first, *slot;   /* each task's sequence, first token and slot in partials */
    float *partials, *probs;                          /* probs: each thread's chunk_task scratch */
    int64_t scratch;                                  /* its floats */
} Chunks;

static void chunk_of(void *context, int64_t task, int slot) {
    const Chunks *t = context;
    const Problem *p = t->p;
    const int64_t b = t->owner[task], first = t->first[task], len = context_of(t->lengths, b, p->width, p->block_size);
    const int64_t n = len - first < CHUNK ? len - first : CHUNK;
    float *scratch = t->probs + slot * t->scratch, *partial = t->partials + t->slot[task] * p->heads * (p->dim + 2);
    if (p->bf16)
        chunk_task_bf16(p, b, first, n, (uint32_t *)scratch, partial);
    else
        chunk_task(p, b, first, n, scratch, partial);
}

typedef struct {      /* where each sequence's chunks go */
    int64_t *first_slot;               /* [batch + 1]: sequence b's partials are slots first_slot[b] .. [b + 1] */
    int64_t *owner, *first, *slot;     /* per task (a chunk of a sequence's own tokens) */
    int64_t tasks;
} Layout;

static int lay_out(Layout *l, int64_t batch, const int64_t *lengths, const int64_t *given_chunks, int64_t width,
                   int64_t block_size) {
    l->first_slot = malloc(sizeof(int64_t) * (size_t)(batch + 1));
    l->tasks = 0;
    if (!l->first_slot) return -1;
    l->first_slot[0] = 0;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t len = context_of(lengths, b, width, block_size), own = len > 0 ? (len + CHUNK - 1) / CHUNK : 0;
        l->first_slot[b + 1] = l->first_slot[b] + (given_chunks ? given_chunks[b] : 0) + own;
        l->tasks += own;
    }
    l->owner = malloc(sizeof(int64_t) * (size_t)(3 * l->tasks + 1));
    if (!l->owner) return -1;
    l->first = l->owner + l->tasks, l->slot = l->first + l->tasks;
    int64_t task = 0;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t s = l->first_slot[b] + (given_chunks ? given_chunks[b] : 0), i = 0; s < l->first_slot[b + 1];
             s++, i++, task++)
            l->owner[task] = b, l->first[task] = i * CHUNK, l->slot[task] = s;
    return 0;
}

/* each sequence's given partials into its first slots */
static void copy_given(const Layout *l, int64_t batch, const float *given, const int64_t *given_chunks,
                       int64_t given_width, int64_t part, float *partials) {
    for (int64_t b = 0; b < batch && given; b++)
        memcpy(partials + l->first_slot[b] * part, given + b * given_width * part,
               sizeof(float) * (size_t)(given_chunks[b] * part));
}

/* every chunk's task on the pool's threads, then every query head's merge of all its chunks in order (a few
   µs: not worth waking them again); nonzero when scratch memory ran out */
static int run_tasks(const Problem *p, int64_t batch, const int64_t *lengths, const Layout *l, float *partials,
                     float *out, float *lse, int threads) {
    const int64_t part = p->heads * (p->dim + 2), dim = p->dim;
    if (threads < 1) threads = 1;
    const int64_t scratch = p->bf16 ? decode_bf16_words(p->kv_heads, p->groups, dim) : p->heads * CHUNK;
    float *probs = malloc(sizeof(float) * (size_t)(threads * scratch));
    if (!probs) return 1;
    Chunks tasks = {p, lengths, l->owner, l->first, l->slot, partials, probs, scratch};
    swarm_pool_run(chunk_of, &tasks, l->tasks, threads);
    free(probs);
    for (int64_t head = 0; head < batch * p->heads; head++) {
        const int64_t b = head / p->heads;
        merge_chunks(partials + l->first_slot[b] * part + head % p->heads * (dim + 2),
                     l->first_slot[b + 1] - l->first_slot[b], part, dim, out + head * dim, lse + head);
    }
    return 0;
}

/* q: [batch, heads, dim]; k_cache, v_cache: [blocks, block_size, kv_heads, dim]; tables:
 * [batch, width] block ids; lengths: [batch]; out: [batch, heads, dim]; lse: [batch, heads].
 * given (or NULL): [batch, given_width, heads, dim + 2], the partials (max, sum, unnormalised output) of whole
 * chunks before each table's first token, computed elsewhere (swarm_prefix_partials, for a shared trunk):
 * sequence b's first given_chunks[b] are merged with its own, before them, as if its table held their tokens.
 * bf16: the products in bfloat16 (decode_bf16.h); given partials then come from swarm_prefix_partials in bf16.
 * kv_bf16: the caches hold bfloat16 (then bf16 is set too). dim is a multiple of 8. A sequence with no tokens
 * gets out = 0 and lse = -inf. Returns -1 when scratch memory runs out. */
int swarm_paged_decode(const float *q, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                       const void *k_cache, const void *v_cache, int64_t block_size, const int64_t *tables,
                       int64_t width, const int64_t *lengths, const float *given, const int64_t *given_chunks,
                       int64_t given_width, float scale, int bf16, int kv_bf16, float *out, float *lse, int threads) {
    const Problem p = {q, k_cache, v_cache, tables, heads, kv_heads, heads / kv_heads, dim, block_size, width, scale,
                       bf16 || kv_bf16, kv_bf16};
    const int64_t part = heads * (dim + 2);
    Layout l = {0};
    int failed = lay_out(&l, batch, lengths, given ? given_chunks : NULL, width, block_size);
    float *partials = failed ? NULL : malloc(sizeof(float) * (size_t)(l.first_slot[batch] * part + 1));
    failed = failed || !partials;
    if (!failed) copy_given(&l, batch, given, given_chunks, given_width, part, partials);
    failed = failed || run_tasks(&p, batch, lengths, &l, partials, out, lse, threads);
    free(l.first_slot);
    free(l.owner);
    free(partials);
    return failed ? -1 : 0;
}

/* rows new tokens' K and V ([rows, kv_width] float32) into the caches at their flat slots: copied into float32
 * caches, rounded to bfloat16 (as bf16_bits, which the bfloat16 products round them with) into bfloat16 ones
 * (kv_bf16). kv_width is even. */
void swarm_write_kv(void *k_cache, void *v_cache, const float *k, const float *v, const int64_t *slots, int64_t rows,
                    int64_t kv_width, int kv_bf16) {
    for (int64_t r = 0; r < rows; r++) {
        const int64_t at = slots[r] * kv_width;
        if (kv_bf16) {
            bf16_pairs_of_row(k + r * kv_width, kv_width, (uint32_t *)((uint16_t *)k_cache + at));
            bf16_pairs_of_row(v + r * kv_width, kv_width, (uint32_t *)((uint16_t *)v_cache + at));
            continue;
        }
        memcpy((float *)k_cache + at, k + r * kv_width, sizeof(float) * (size_t)kv_width);
        memcpy((float *)v_cache + at, v + r * kv_width, sizeof(float) * (size_t)kv_width);
    }
}
