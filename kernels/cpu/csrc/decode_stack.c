/* Every layer of a decode step in one call, for float32 rows against weights in GGUF blocks: each layer's three
 * calls (decode_layer.c) around its attention over the paged KV pool, that attention as the cascade backend
 * runs it (engine/attention/cascade.py: each shared trunk's chunks through prefix_attention.c, then each row's
 * private tail through paged_decode.c, which merges the trunk's chunks with its own), and silu(gate) * up
 * between (layer_rows.h). The Python
 * around those calls (the backend, checks, outputs) cost about 4 ms of a 19 ms SmolLM2 step.
 *
 * The same functions run in the same order on the same operands as the layer-by-layer path, so a row gets the
 * same bits either way. Built by kernels/cpu/native.py and linked against the libraries of the kernels whose
 * headers it includes; called through kernels/cpu/decode_stack.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode_layer.h"
#include "layer_rows.h"
#include "paged_decode.h"
#include "prefix_attention.h"

typedef struct {
    const swarm_decode_layer *layers;            /* count of them, in order */
    void *const *k_caches, *const *v_caches;     /* each layer's: [blocks, block_size, kv_heads, head_dim] */
    int64_t count, block_size;
    float scale;                                 /* the softmax scale */
    int bf16_attention;                          /* the attention's products in bfloat16 (decode_bf16.h) */
    int kv_bf16;                                 /* the caches hold bfloat16 (then bf16_attention too) */
} swarm_decode_stack;

typedef struct {                 /* a trunk some rows share (engine.attention.plan.SharedPrefix) */
    const int64_t *rows;         /* the batch rows that share it, count of them */
    const uint8_t *members;      /* per row of rows: 1 where it reads the trunk; NULL: every one does */
    const int64_t *blocks;       /* its block ids; NULL where they are first_block, first_block + 1, ... */
    int64_t count, first_block, num_blocks;
} swarm_step_prefix;

typedef struct {
    const float *cos, *sin;             /* [rows, head_dim] */
    const int64_t *slots;               /* [rows]: the flat KV slot of each row's new token */
    const int64_t *tables, *lengths;    /* each row's private tail: [rows, width] block ids, [rows] tokens */
    const swarm_step_prefix *prefixes;  /* prefix_count of them; a row is in at most one */
    int64_t rows, width, prefix_count;
} swarm_decode_batch;

typedef struct {   /* one step's buffers, carved from one allocation */
    float *scratch, *q, *k, *v, *attended, *lse, *h, *gate, *up, *next, *prefix_q, *given, *prefix_k, *prefix_v;
    int64_t *given_chunks, given_width;   /* [rows]: the trunk's chunks each row takes; the most of them */
} Buffers;

static int64_t prefix_rows(const swarm_decode_batch *b) {
    int64_t most = 0;
    for (int64_t p = 0; p < b->prefix_count; p++) most = b->prefixes[p].count > most ? b->prefixes[p].count : most;
    return most;
}

/* the chunks of trunk p's keys (prefix_attention.c's) */
static int64_t chunks_of(const swarm_decode_stack *s, const swarm_step_prefix *p) {
    const int64_t chunk = swarm_prefix_chunk();
    return (p->num_blocks * s->block_size + chunk - 1) / chunk;
}

/* the chunks of the longest trunk */
static int64_t given_width(const swarm_decode_stack *s, const swarm_decode_batch *b) {
    int64_t most = 0;
    for (int64_t p = 0; p < b->prefix_count; p++) {
        const int64_t chunks = chunks_of(s, b->prefixes + p);
        most = chunks > most ? chunks : most;
    }
    return most;
}

/* the floats a gathered copy of the largest scattered trunk needs, for K or V (0 where every one is in place) */
static int64_t gathered_floats(const swarm_decode_batch *b, int64_t block_floats) {
    int64_t most = 0;
    for (int64_t p = 0; p < b->prefix_count; p++)
        if (b->prefixes[p].blocks && b->prefixes[p].num_blocks * block_floats > most)
            most = b->prefixes[p].num_blocks * block_floats;
    return most;
}

static float *carve(float **next, int64_t floats) {
    float *start = *next;
    *next += floats;
    return start;
}

/* each row's count of its trunk's chunks: those of the trunk it reads, 0 for the others */
static void count_given(const swarm_decode_stack *s, const swarm_decode_batch *b, int64_t *given_chunks) {
    memset(given_chunks, 0, sizeof(int64_t) * (size_t)b->rows);
    for (int64_t p = 0; p < b->prefix_count; p++) {
        const swarm_step_prefix *prefix = b->prefixes + p;
        for (int64_t i = 0; i < prefix->count; i++)
            if (!prefix->members || prefix->members[i]) given_chunks[prefix->rows[i]] = chunks_of(s, prefix);
    }
}

static float *allocate(const swarm_decode_stack *s, const swarm_decode_batch *b, Buffers *f) {
    const swarm_decode_layer *l = s->layers;
    const int64_t rows = b->rows, hidden = l->hidden, q_width = l->heads * l->head_dim;
    const int64_t kv_width = l->kv_heads * l->head_dim, inter = l->gate_up->N[0], shared = prefix_rows(b);
    const int64_t gathered = gathered_floats(b, s->block_size * kv_width), width = given_width(s, b);
    const int64_t given = rows * width * l->heads * (l->head_dim + 2);
    const int64_t total = rows * (4 * hidden + 2 * q_width + 2 * kv_width + l->heads + 2 * inter + 2)
                          + shared * q_width + given + 2 * gathered;
    float *all = malloc(sizeof(float) * (size_t)(total + 1)), *next = all;
    if (!all) return NULL;
    f->given_chunks = (int64_t *)carve(&next, 2 * rows), f->given_width = width;   /* first: aligned for int64 */
    f->scratch = carve(&next, rows * hidden), f->h = carve(&next, rows * hidden);
    f->next = carve(&next, rows * hidden), f->q = carve(&next, rows * q_width);
    f->attended = carve(&next, rows * q_width), f->k = carve(&next, rows * kv_width);
    f->v = carve(&next, rows * kv_width), f->lse = carve(&next, rows * l->heads);
    f->gate = carve(&next, rows * inter), f->up = carve(&next, rows * inter);
    f->prefix_q = carve(&next, shared * q_width), f->given = carve(&next, given);
    f->prefix_k = carve(&next, gathered), f->prefix_v = carve(&next, gathered);
    count_given(s, b, f->given_chunks);
    return all;
}

/* a trunk's K or V, [num_blocks * block_size, kv_heads, head_dim]: in place, or its blocks copied into `into`;
   a block is block_bytes */
static const void *trunk_of(const void *cache, const swarm_step_prefix *p, int64_t block_bytes, float *into) {
    const char *blocks = cache;
    if (!p->blocks) return blocks + p->first_block * block_bytes;
    for (int64_t i = 0; i < p->num_blocks; i++)
        memcpy((char *)into + i * block_bytes, blocks + p->blocks[i] * block_bytes, (size_t)block_bytes);
    return into;
}

/* the chunks' partials of the trunk p's rows read, into each one's part of f->given */
static int trunk_chunks(const swarm_decode_stack *s, const swarm_decode_layer *l, int64_t layer,
                        const swarm_step_prefix *p, Buffers *f, int threads) {
    const int64_t q_width = l->heads * l->head_dim;
    const int64_t block_bytes = s->block_size * l->kv_heads * l->head_dim * (s->kv_bf16 ? 2 : 4);
    for (int64_t i = 0; i < p->count; i++)
        memcpy(f->prefix_q + i * q_width, f->q + p->rows[i] * q_width, sizeof(float) * (size_t)q_width);
    const void *k = trunk_of(s->k_caches[layer], p, block_bytes, f->prefix_k);
    const void *v = trunk_of(s->v_caches[layer], p, block_bytes, f->prefix_v);
    return swarm_prefix_partials(f->prefix_q, p->count, l->heads, l->kv_heads, l->head_dim, k, v,
                                 p->num_blocks * s->block_size, s->scale, s->bf16_attention, s->kv_bf16, f->given,
                                 p->rows, f->given_width, threads);
}

/* one layer: x [rows, hidden] -> f->next; its new K and V written */
static int layer_step(const swarm_decode_stack *s, int64_t layer, const swarm_decode_batch *b, const float *x,
                      Buffers *f, int threads) {
    const swarm_decode_layer *l = s->layers + layer;
    const int64_t rows = b->rows, kv_width = l->kv_heads * l->head_dim;
    if (swarm_decode_attention_in(l, x, rows, b->cos, b->sin, f->scratch, f->q, f->k, f->v, threads)) return -1;
    swarm_write_kv(s->k_caches[layer], s->v_caches[layer], f->k, f->v, b->slots, rows, kv_width, s->kv_bf16);
    for (int64_t p = 0; p < b->prefix_count; p++)
        if (trunk_chunks(s, l, layer, b->prefixes + p, f, threads)) return -1;
    if (swarm_paged_decode(f->q, rows, l->heads, l->kv_heads, l->head_dim, s->k_caches[layer], s->v_caches[layer],
                           s->block_size, b->tables, b->width, b->lengths, f->given, f->given_chunks, f->given_width,
                           s->scale, s->bf16_attention, s->kv_bf16, f->attended, f->lse, threads))
        return -1;
    if (swarm_decode_mlp_in(l, x, f->attended, rows, f->scratch, f->h, f->gate, f->up, threads)) return -1;
    silu_mul_run(f->gate, f->up, rows * l->gate_up->N[0], f->gate);
    return swarm_decode_mlp_out(l, f->h, f->gate, rows, f->next, threads);
}

/* x [rows, hidden]: the step's embedded tokens in, the last layer's output out. Returns -1 (x then undefined)
   when memory runs out or a layer's heads are wider than MAX_HEAD_DIM. */
int swarm_decode_stack_run(const swarm_decode_stack *s, const swarm_decode_batch *b, float *x, int threads) {
    Buffers f;
    float *all = allocate(s, b, &f);
    if (!all) return -1;
    const size_t bytes = sizeof(float) * (size_t)(b->rows * s->layers->hidden);
    int failed = 0;
    for (int64_t layer = 0; layer < s->count && !failed; layer++) {
        failed = layer_step(s, layer, b, x, &f, threads);
        memcpy(x, f.next, bytes);
    }
    free(all);
    return failed ? -1 : 0;
}
