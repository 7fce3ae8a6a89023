/* What prefix_attention.c exports to decode_stack.c. */
#pragma once
#include <stdint.h>

/* q: [batch, heads, dim]; k, v: [keys, kv_heads, dim]; out: [batch, heads, dim]; lse: [batch, heads].
 * Returns -1 when scratch memory runs out. */
int swarm_prefix_attention(const float *q, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                           const float *k, const float *v, int64_t keys, float scale, float *out, float *lse,
                           int threads);

/* The same over a trunk of whole chunks, each chunk's partials left for swarm_paged_decode's given: row b's go to
 * given[given_rows[b]] ([given_width, heads, dim + 2]); bf16: in bfloat16 products, as swarm_paged_decode's;
 * kv_bf16: k and v hold bfloat16. Returns -1 when scratch memory runs out. */
int swarm_prefix_partials(const float *q, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                          const void *k, const void *v, int64_t keys, float scale, int bf16, int kv_bf16, float *given,
                          const int64_t *given_rows, int64_t given_width, int threads);

/* the keys of a chunk */
int64_t swarm_prefix_chunk(void);

/* Two softmax pieces over disjoint keys combined: out, lse [pieces] from a and b ([pieces, dim], [pieces]). */
void swarm_merge_attention(const float *a, const float *lse_a, const float *b, const float *lse_b, int64_t pieces,
                           int64_t dim, float *out, float *lse);
