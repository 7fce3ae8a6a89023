/* What paged_decode.c exports to decode_stack.c. */
#pragma once
#include <stdint.h>

/* q: [batch, heads, dim]; k_cache, v_cache: [blocks, block_size, kv_heads, dim]; tables: [batch, width] block ids;
 * lengths: [batch]; given (or NULL): [batch, given_width, heads, dim + 2], partials of the chunks before each
 * table, given_chunks[b] of them for row b; bf16: the products in bfloat16 (decode_bf16.h); kv_bf16: the caches
 * hold bfloat16; out: [batch, heads, dim]; lse: [batch, heads]. Returns -1 when scratch memory runs out. */
int swarm_paged_decode(const float *q, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                       const void *k_cache, const void *v_cache, int64_t block_size, const int64_t *tables,
                       int64_t width, const int64_t *lengths, const float *given, const int64_t *given_chunks,
                       int64_t given_width, float scale, int bf16, int kv_bf16, float *out, float *lse, int threads);

/* new tokens' K and V [rows, kv_width] into the caches at their flat slots, rounded to bfloat16 where the caches
 * hold it (kv_bf16) */
void swarm_write_kv(void *k_cache, void *v_cache, const float *k, const float *v, const int64_t *slots, int64_t rows,
                    int64_t kv_width, int kv_bf16);
