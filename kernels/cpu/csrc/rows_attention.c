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
 *
 * In bfloat16 (`bf16`), both products take their operands (q, k, v, and the weights P) rounded to bfloat16,
 * multiplied pair by pair and summed in float32 as vdpbf16ps does (csrc/bf16_tiles.h: twice float32's rate on
 * AVX512-BF16); scores, softmax, sums and outputs stay float32. The span's keys and values are laid out for the
 * instruction once a call. The second product runs transposed, O_c^T = V_c^T P^T, so a task's partials are kept
 * a row of `cols` per quantity ([dim + 2][cols]). Without AVX512-BF16 the products run in plain C, with the
 * same bits (swarm_rows_attention_bf16_native says which build this is; the portable build's exp is libm's). Keys
 * and values kept in bfloat16 (a pool in bfloat16, `kv_bf16`) are laid out as they are, with the bits of float32
 * ones holding the same values; the float32 products read float32 ones only.
 * Built by kernels/cpu/native.py; called through ctypes from kernels/cpu/native_attention.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tiles.h"
#include "bf16_tiles.h"

#define CHUNK 256          /* keys */
#define BLOCK_ROWS 96      /* rows a task, at most: its scores, 96 KB, stay in the L2 cache */

typedef struct {
    int64_t tokens, heads, kv_heads, groups, dim, keys;
    int64_t first_position;    /* key position of token 0; tokens see keys <= their position */
    int causal;
    int64_t block_tokens;      /* tokens a block */
    int64_t stride;            /* floats from one key's row to the next's */
    const float *carry_in;     /* or NULL: each row's running state over keys before the span, continued here */
    float *carry_out;          /* or NULL: each row's running state after the span goes here, not out and lse */
    int kv_bf16;               /* the keys and values are bfloat16 (read by the bfloat16 products only) */
} Problem;

/* A row's running state (max, sum, unnormalised output [dim]): [tokens][heads][dim + 2] in carry_in and carry_out.
   Continuing a state folds the span's chunks into it as a span starting at the state's last key would: split at
   a multiple of CHUNK, a prompt's attention gets the same bits in two calls as in one. */
static inline int64_t head_of(const Problem *p, int64_t h, int64_t token0, int64_t r) {
    return (token0 + r / p->groups) * p->heads + h * p->groups + r % p->groups;
}

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
        const float *query = q + head_of(p, h, token0, r) * dim;
        for (int64_t d = 0; d < dim; d++) w.qt[d * cols + r] = query[d];
    }
    for (int64_t r = 0; p->carry_in && r < rows; r++)
        memcpy(w.running + r * (dim + 2), p->carry_in + head_of(p, h, token0, r) * (dim + 2),
               sizeof(float) * (size_t)(dim + 2));
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
        fold(w.running, w.partial, rows, dim, first == 0 && !p->carry_in);
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *run = w.running + r * (dim + 2);
        const int64_t head = head_of(p, h, token0, r);
        if (p->carry_out) {
            memcpy(p->carry_out + head * (dim + 2), run, sizeof(float) * (size_t)(dim + 2));
            continue;
        }
        for (int64_t d = 0; d < dim; d++) out[head * dim + d] = run[2 + d] / run[1];
        lse[head] = run[0] + logf(run[1]);
    }
}

/* The span's keys and values as the bfloat16 products read them, per KV head:
 *     keys    [kv_heads][keys][dim / 2]         key t's pairs of dims
 *     values  [kv_heads][chunks][dim][CHUNK / 2] dim d's pairs of consecutive keys of a chunk (0 past the span) */
typedef struct {
    uint32_t *keys, *values;
    int64_t chunks;
} Packed;

/* value i of the span as bfloat16 bits: float32 ones rounded, bfloat16 ones (kv_bf16) as they are */
static inline uint32_t bf16_value(const void *v, int64_t i, int kv_bf16) {
    return kv_bf16 ? ((const uint16_t *)v)[i] : bf16_bits(((const float *)v)[i]);
}

static void pack_values(const void *v, const Problem *p, int64_t h, int64_t chunk, uint32_t *out) {
    const int64_t pairs = CHUNK / 2, dim = p->dim;
    for (int64_t j = 0; j < pairs; j++) {
        const int64_t t = chunk * CHUNK + 2 * j, low = t * p->stride + h * dim, high = low + p->stride;
        for (int64_t d = 0; d < dim; d++)
            out[d * pairs + j] = (t < p->keys ? bf16_value(v, low + d, p->kv_bf16) : 0u)
                                 | (t + 1 < p->keys ? bf16_value(v, high + d, p->kv_bf16) : 0u) << 16;
    }
}

/* keys [first, stop) of KV head h as their pairs of dims, and the chunk's values */
static void pack_chunk(const void *k, const void *v, const Problem *p, int64_t h, int64_t chunk, int64_t first,
                       int64_t stop, Packed *packed) {
    const int64_t half = p->dim / 2;
    uint32_t *values = packed->values + (h * packed->chunks + chunk) * p->dim * (CHUNK / 2);
    for (int64_t t = first; t < stop; t++) {
        uint32_t *pairs = packed->keys + (h * p->keys + t) * half;
        if (p->kv_bf16)
            memcpy(pairs, (const uint16_t *)k + t * p->stride + h * p->dim, sizeof(uint32_t) * (size_t)half);
        else
            bf16_pairs_of_row((const float *)k + t * p->stride + h * p->dim, p->dim, pairs);
    }
    pack_values(v, p, h, chunk, values);
}

static int pack_span(const void *k, const void *v, const Problem *p, Packed *packed, int threads) {
    const int64_t half = p->dim / 2;
    packed->chunks = (p->keys + CHUNK - 1) / CHUNK;
    packed->keys = malloc(sizeof(uint32_t) * (size_t)(p->kv_heads * p->keys * half));
    packed->values = malloc(sizeof(uint32_t) * (size_t)(p->kv_heads * packed->chunks * p->dim * (CHUNK / 2)));
    if (!packed->keys || !packed->values) return -1;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t task = 0; task < p->kv_heads * packed->chunks; task++) {
        const int64_t h = task / packed->chunks, chunk = task % packed->chunks;
        const int64_t stop = (chunk + 1) * CHUNK < p->keys ? (chunk + 1) * CHUNK : p->keys;
        pack_chunk(k, v, p, h, chunk, chunk * CHUNK, stop, packed);
    }
    return 0;
}

/* P^T's pairs of consecutive keys for the second product: word (j, r) at j * cols + r; 0 past n keys */
static void pack_weights(const float *st, int64_t n, int64_t cols, uint32_t *out) {
    for (int64_t j = 0; 2 * j < n; j++) {
        const float *low = st + 2 * j * cols, *high = 2 * j + 1 < n ? low + cols : NULL;
        int64_t r = 0;
#if defined(__AVX512BF16__)
        for (; r + 16 <= cols; r += 16) {
            const __m512i lows = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(low + r)));
            const __m512i highs = high ? _mm512_slli_epi32(
                _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(high + r))), 16)
                                       : _mm512_setzero_si512();
            _mm512_storeu_si512(out + j * cols + r, _mm512_or_si512(lows, highs));
        }
#endif
        for (; r < cols; r++) out[j * cols + r] = bf16_pair(low[r], high ? high[r] : 0.0f);
    }
}

/* fold() for partials kept a row of `cols` per quantity: [max][sum][dim outputs] */
static void fold_columns(float *running, const float *partial, int64_t cols, int64_t dim, float *weights,
                         int first) {
    if (first) {
        memcpy(running, partial, sizeof(float) * (size_t)((dim + 2) * cols));
        return;
    }
    float *a = weights, *b = weights + cols;
    for (int64_t r = 0; r < cols; r++) {
        const float top = running[r] > partial[r] ? running[r] : partial[r];
        a[r] = expf(running[r] - top);
        b[r] = expf(partial[r] - top);
        running[r] = top;
    }
    for (int64_t i = 1; i < dim + 2; i++)
        for (int64_t r = 0; r < cols; r++)
            running[i * cols + r] = running[i * cols + r] * a[r] + partial[i * cols + r] * b[r];
}

/* Running states kept a row of `cols` per quantity ([dim + 2][cols]), as the bfloat16 and integer products keep
   them: each of the block's rows' carried in (the padding columns from 0s), where there are */
static void carried_in(const Problem *p, int64_t h, int64_t token0, int64_t rows, int64_t cols, float *running) {
    for (int64_t r = 0; p->carry_in && r < cols; r++)
        for (int64_t i = 0; i < p->dim + 2; i++)
            running[i * cols + r] = r < rows ? p->carry_in[head_of(p, h, token0, r) * (p->dim + 2) + i] : 0.0f;
}

/* each row's out and lse from its running state, or the state itself to carry_out */
static void finished(const Problem *p, int64_t h, int64_t token0, int64_t rows, int64_t cols, const float *running,
                     float *out, float *lse) {
    const int64_t dim = p->dim;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t head = head_of(p, h, token0, r);
        if (p->carry_out) {
            for (int64_t i = 0; i < dim + 2; i++) p->carry_out[head * (dim + 2) + i] = running[i * cols + r];
            continue;
        }
        for (int64_t d = 0; d < dim; d++) out[head * dim + d] = running[(2 + d) * cols + r] / running[cols + r];
        lse[head] = running[r] + logf(running[cols + r]);
    }
}

#include "rows_attention_i8.h"

typedef struct {
    uint32_t *queries, *weights;   /* Q's panels [cols / 16][dim / 2][16]; P^T's pairs [CHUNK / 2][cols] */
    float *st, *partial, *running, *fold;
} Scratch16;

/* block_attention in bfloat16 products */
static void block_attention_bf16(const float *q, const Packed *packed, const Problem *p, int64_t h, int64_t token0,
                                 float scale, Scratch16 w, float *out, float *lse) {
    const int64_t tokens = p->tokens - token0 < p->block_tokens ? p->tokens - token0 : p->block_tokens;
    const int64_t rows = tokens * p->groups, cols = (rows + 7) / 8 * 8, dim = p->dim, half = dim / 2;
    memset(w.queries, 0, sizeof(uint32_t) * (size_t)((cols + 15) / 16 * 16 * half));
    for (int64_t r = 0; r < rows; r++) {
        const float *query = q + head_of(p, h, token0, r) * dim;
        uint32_t *lane = w.queries + r / 16 * 16 * half + r % 16;
        for (int64_t j = 0; j < half; j++) lane[j * 16] = bf16_pair(query[2 * j], query[2 * j + 1]);
    }
    carried_in(p, h, token0, rows, cols, w.running);
    const int64_t last_position = p->causal ? p->first_position + token0 + tokens - 1 : p->keys - 1;
    const int64_t first_unmasked = p->causal ? p->first_position + token0 : p->keys;
    for (int64_t first = 0; first <= last_position; first += CHUNK) {
        const int64_t n = last_position + 1 - first < CHUNK ? last_position + 1 - first : CHUNK;
        const bf16_problem scores = {packed->keys + (h * p->keys + first) * half, half, half, w.queries, 16 * half,
                                     16, NULL, scale, w.st, cols};
        bf16_tile(&scores, n, cols);
        const int masked = first + n - 1 > first_unmasked;
        if (masked) mask(w.st, n, cols, first, p, token0, rows, MASKED);
        softmax_columns(w.st, n, cols, w.partial, w.partial + cols);
        if (masked) mask(w.st, n, cols, first, p, token0, rows, 0.0f);
        pack_weights(w.st, n, cols, w.weights);
        const uint32_t *values = packed->values + (h * packed->chunks + first / CHUNK) * dim * (CHUNK / 2);
        const bf16_problem output = {values, CHUNK / 2, (n + 1) / 2, w.weights, 16, cols, NULL, 1.0f,
                                     w.partial + 2 * cols, cols};
        bf16_tile(&output, dim, cols);
        fold_columns(w.running, w.partial, cols, dim, w.fold, first == 0 && !p->carry_in);
    }
    finished(p, h, token0, rows, cols, w.running, out, lse);
}

static size_t scratch_floats(int64_t cols, int64_t dim, int bf16) {
    if (!bf16) return (size_t)(cols * (dim + CHUNK + 2) + 2 * cols * (dim + 2));
    const int64_t panels = (cols + 15) / 16 * 16;
    /* the weights' pairs get 16 words of slack: a tile reads whole vectors past the last column */
    return (size_t)(panels * dim / 2 + CHUNK / 2 * cols + 16 + CHUNK * cols + 2 * (dim + 2) * cols + 2 * cols);
}

static Scratch scratch_of(float *memory, int64_t cols, int64_t dim) {
    return (Scratch){memory, memory + cols * dim, memory + cols * (dim + CHUNK), memory + cols * (dim + CHUNK + 2),
                     memory + cols * (dim + CHUNK + 2) + cols * (dim + 2)};
}

static Scratch16 scratch16_of(float *memory, int64_t cols, int64_t dim) {
    Scratch16 w;
    w.queries = (uint32_t *)memory;
    w.weights = w.queries + (cols + 15) / 16 * 16 * dim / 2;
    w.st = (float *)(w.weights + CHUNK / 2 * cols + 16);
    w.partial = w.st + CHUNK * cols;
    w.running = w.partial + (dim + 2) * cols;
    w.fold = w.running + (dim + 2) * cols;
    return w;
}

int64_t swarm_rows_attention_chunk(void) { return CHUNK; }

int swarm_rows_attention_bf16_native(void) {
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

/* 1 where the integer products run on AVX512-VNNI, 0 where they run the plain C code (same bits, far slower) */
int swarm_rows_attention_int8_native(void) {
#if defined(__AVX512VNNI__)
    return 1;
#else
    return 0;
#endif
}

enum { FLOAT32, BFLOAT16, INT8 };   /* the products' precision */

static size_t scratch_of_products(int64_t cols, int64_t dim, int products) {
    return products == INT8 ? scratch8_floats(cols, dim) : scratch_floats(cols, dim, products == BFLOAT16);
}

/* the span laid out for the products (none for float32); nonzero when memory runs out */
static int pack_for(const void *k, const void *v, const Problem *p, int products, Packed *packed, Packed8 *packed8,
                    int threads) {
    if (products == INT8) return pack_span8(k, v, p, packed8, threads);
    return products == BFLOAT16 ? pack_span(k, v, p, packed, threads) : 0;
}

/* q: [tokens, heads, dim]; k, v: [keys, kv_heads, dim] rows `stride` floats apart; out: [tokens,
 * heads, dim]; lse: [tokens, heads]. causal: token i sits at key position keys - tokens + i and
 * sees keys up to it (tokens <= keys); otherwise every token sees every key. dim is a multiple
 * of 8. products: 0 float32, 1 bfloat16 (above), 2 integer (rows_attention_i8.h; heads whose dim is no multiple
 * of 32, or over MAX_I8_DIM, take bfloat16). kv_bf16: k and v hold bfloat16 (the products are then bfloat16 or
 * integer). carry_in, carry_out: NULL, or running states (Problem). Returns -1 when scratch memory runs out. */
int swarm_rows_attention(const float *q, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim,
                         const void *k, const void *v, int64_t keys, int causal, int products, int kv_bf16,
                         float scale, float *out, float *lse, const float *carry_in, float *carry_out, int threads) {
    const int64_t groups = heads / kv_heads;
    const int64_t block_tokens = BLOCK_ROWS / groups > 0 ? BLOCK_ROWS / groups : 1;
    const Problem p = {tokens, heads, kv_heads, groups, dim, keys, keys - tokens, causal, block_tokens,
                       kv_heads * dim, carry_in, carry_out, kv_bf16};
    if (products == INT8 && !i8_takes(dim)) products = BFLOAT16;
    if (kv_bf16 && products == FLOAT32) products = BFLOAT16;
    const int64_t blocks = (tokens + block_tokens - 1) / block_tokens, cols = (block_tokens * groups + 7) / 8 * 8;
    Packed packed = {NULL, NULL, 0};
    Packed8 packed8 = {NULL, NULL, NULL, NULL, NULL, 0};
    int failed = pack_for(k, v, &p, products, &packed, &packed8, threads);
    #pragma omp parallel num_threads(threads) if (!failed)
    if (!failed) {   /* (the pragma's clause spares the threads' start where packing failed) */
        float *memory = malloc(sizeof(float) * scratch_of_products(cols, dim, products));
        if (!memory) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < kv_heads * blocks; task++) {
            if (!memory) continue;
            /* the longest (latest) blocks first: dynamic scheduling then ends evenly */
            const int64_t h = task % kv_heads, block = blocks - 1 - task / kv_heads;
            if (products == INT8)
                block_attention_i8(q, &packed8, &p, h, block * block_tokens, scale, scratch8_of(memory, cols, dim),
                                   out, lse);
            else if (products == BFLOAT16)
                block_attention_bf16(q, &packed, &p, h, block * block_tokens, scale, scratch16_of(memory, cols, dim),
                                     out, lse);
            else
                block_attention(q, (const float *)k, (const float *)v, &p, h, block * block_tokens, scale,
                                scratch_of(memory, cols, dim), out, lse);
        }
        free(memory);
    }
    free(packed.keys);
    free(packed.values);
    free_packed8(&packed8);
    return failed ? -1 : 0;
}
