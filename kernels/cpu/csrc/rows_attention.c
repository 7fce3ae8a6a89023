/* Prefill attention: many query tokens over one span of keys read in place, causal or not, with
 * the log-sum-exp. Same contract as kernels/cpu/sdpa_attention.py's prefix_attention (not causal)
 * and causal_tail_with_lse (causal: the tokens are the span's last ones, token i at key
 * position keys - tokens + i).
 *
 * Each KV head's rows (every token's query heads of that group) go in blocks of about 96; one
 * task per (KV head, block) walks the key chunks the block can see:
 *     S^T = K_c Q_block^T * scale, masked past each row's position, P^T = exp(S^T - column max),
 *     O_c = P V_c, folded into the block's running (max, sum, output) in chunk order
 * with the tiles of kernels/cpu/csrc/attention_tiles.h. Chunks wholly past a block are never computed,
 * so a causal prompt costs about half its square. A row's result depends on its own query and
 * position only, never on the other rows it is batched with.
 * Built by kernels/cpu/native.py; called through ctypes from kernels/cpu/native_attention.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tiles.h"

#define CHUNK 256          /* keys */
#define BLOCK_ROWS 96      /* rows a task, at most: its scores, 96 KB, stay in the L2 cache */

typedef struct {
    int64_t tokens, heads, kv_heads, groups, dim, keys;
    int64_t first_position;    /* key position of token 0; tokens see keys <= their position */
    int causal;
    int64_t block_tokens;      /* tokens a block */
    int64_t stride;            /* floats from one key's row to the next's */
} Problem;

typedef struct {
    float *qt, *st, *sums, *partial, *running;
} Scratch;

/* A key a row may not see scores MASKED before the softmax, and weighs exactly 0 after it (as if
   the row had been computed alone, on the keys it sees). A row that sees none of a chunk (a block
   straddling the chunk's start) gets a chunk maximum of MASKED, which fold() weighs by exactly 0:
   every row sees key 0, so its running maximum is a real score by then. */
#define MASKED (-1e30f)

static void mask(float *st, int64_t n, int64_t cols, int64_t first_key, const Problem *p, int64_t token0,
                 int64_t rows, float value) {
    for (int64_t r = 0; r < rows; r++) {
        const int64_t position = p->first_position + token0 + r / p->groups;
        for (int64_t t = position + 1 - first_key > 0 ? position + 1 - first_key : 0; t < n; t++)
            st[t * cols + r] = value;
    }
}

/* fold a chunk's partial (max, sum, output) of each row into the running one, in chunk order */
static void fold(float *running, const float *partial, int64_t rows, int64_t dim, int first) {
    for (int64_t r = 0; r < rows; r++) {
        float *run = running + r * (dim + 2);
        const float *part = partial + r * (dim + 2);
        if (first) {
            memcpy(run, part, sizeof(float) * (size_t)(dim + 2));
            continue;
        }
        const float top = run[0] > part[0] ? run[0] : part[0];
        const float a = expf(run[0] - top), b = expf(part[0] - top);
        run[0] = top;
        run[1] = run[1] * a + part[1] * b;
        for (int64_t d = 0; d < dim; d++) run[2 + d] = run[2 + d] * a + part[2 + d] * b;
    }
}

/* rows [token0 * groups, ...) of KV head h: out and lse for each */
static void block_attention(const float *q, const float *k, const float *v, const Problem *p, int64_t h,
                            int64_t token0, float scale, Scratch w, float *out, float *lse) {
    const int64_t tokens = p->tokens - token0 < p->block_tokens ? p->tokens - token0 : p->block_tokens;
    const int64_t rows = tokens * p->groups, cols = (rows + 7) / 8 * 8, dim = p->dim;
    memset(w.qt, 0, sizeof(float) * (size_t)(dim * cols));
    for (int64_t r = 0; r < rows; r++) {
        const float *query = q + ((token0 + r / p->groups) * p->heads + h * p->groups + r % p->groups) * dim;
        for (int64_t d = 0; d < dim; d++) w.qt[d * cols + r] = query[d];
    }
    const int64_t last_position = p->causal ? p->first_position + token0 + tokens - 1 : p->keys - 1;
    const int64_t first_unmasked = p->causal ? p->first_position + token0 : p->keys;
    for (int64_t first = 0; first <= last_position; first += CHUNK) {
        const int64_t n = last_position + 1 - first < CHUNK ? last_position + 1 - first : CHUNK;
        const float *kc = k + first * p->stride + h * dim, *vc = v + first * p->stride + h * dim;
        matmul(kc, p->stride, 1, w.qt, cols, n, dim, cols, w.st, cols, scale);
        const int masked = first + n - 1 > first_unmasked;
        if (masked) mask(w.st, n, cols, first, p, token0, rows, MASKED);
        softmax_columns(w.st, n, cols, w.sums, w.sums + cols);
        if (masked) mask(w.st, n, cols, first, p, token0, rows, 0.0f);
        chunk_partial(w.st, w.sums, vc, p->stride, rows, cols, n, dim, w.partial);
        fold(w.running, w.partial, rows, dim, first == 0);
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *run = w.running + r * (dim + 2);
        const int64_t head = (token0 + r / p->groups) * p->heads + h * p->groups + r % p->groups;
        for (int64_t d = 0; d < dim; d++) out[head * dim + d] = run[2 + d] / run[1];
        lse[head] = run[0] + logf(run[1]);
    }
}

/* q: [tokens, heads, dim]; k, v: [keys, kv_heads, dim] rows `stride` floats apart; out: [tokens,
 * heads, dim]; lse: [tokens, heads]. causal: token i sits at key position keys - tokens + i and
 * sees keys up to it (tokens <= keys); otherwise every token sees every key. dim is a multiple
 * of 8. Returns -1 when scratch memory runs out. */
int swarm_rows_attention(const float *q, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim,
                         const float *k, const float *v, int64_t keys, int causal, float scale, float *out,
                         float *lse, int threads) {
    const int64_t groups = heads / kv_heads;
    const int64_t block_tokens = BLOCK_ROWS / groups > 0 ? BLOCK_ROWS / groups : 1;
    const Problem p = {tokens, heads, kv_heads, groups, dim, keys, keys - tokens, causal, block_tokens,
                       kv_heads * dim};
    const int64_t blocks = (tokens + block_tokens - 1) / block_tokens, cols = (block_tokens * groups + 7) / 8 * 8;
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        float *memory = malloc(sizeof(float) * (size_t)(cols * (dim + CHUNK + 2) + 2 * cols * (dim + 2)));
        Scratch w = {memory, memory + cols * dim, memory + cols * (dim + CHUNK), memory + cols * (dim + CHUNK + 2),
                     memory + cols * (dim + CHUNK + 2) + cols * (dim + 2)};
        if (!memory) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < kv_heads * blocks; task++) {
            if (!memory) continue;
            /* the longest (latest) blocks first: dynamic scheduling then ends evenly */
            const int64_t h = task % kv_heads, block = blocks - 1 - task / kv_heads;
            block_attention(q, k, v, &p, h, block * block_tokens, scale, w, out, lse);
        }
        free(memory);
    }
    return failed ? -1 : 0;
}
