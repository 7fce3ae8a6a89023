/* The decode matmul's machinery, shared by quant_matmul.c (float32 products) and quant_matmul_bf16.c (bfloat16
 * products): a weight's blocks expanded in registers (quant_chunks.h) a few columns at a time and multiplied by a
 * tile of x's rows, the K axis in spans that keep x in the L1 cache, the columns in groups that are the task pool's
 * tasks. A column's sums are 8 lanes; quant_matmul.c's top says which products each lane sums, in each precision.
 */
#ifndef SWARM_QUANT_COLUMNS_H
#define SWARM_QUANT_COLUMNS_H

#include <stdint.h>

#include "quant_blocks.h"
#include "task_pool.h"

#define ROW_TILE 8
#define MAX_ROWS 64          /* rows a pass (kernels/cpu/quant_matmul.py sends no more for decode) */
#define SPAN_VALUES 768      /* of the K axis at most: 8 rows x 768 floats of x, 24 KB, stay in a 32 KB L1 cache */
#define GROUP_COLUMNS 32     /* a thread's columns a task at most, their lane sums waiting in carry between spans */
#define PREFETCH_BYTES 4096  /* of a weight, ahead of the pass that reads it */

#if defined(__AVX2__) && defined(__FMA__)
#include "quant_chunks.h"

/* A pass takes VECTORS_A_PASS vectors of columns: a column's sum is one chain of dependent multiply-adds,
   and 1-2 rows leave too few chains side by side to hide their latency (1 row: 27.7 -> 19.5 us for
   SmolLM2's gate_proj with 8 columns a pass against 2, AVX-512); more rows fill the registers with
   accumulators (16 AVX2 registers, 32 AVX-512). Tiles are 1, 2, 4 or 8 rows: a few shapes to compile. */
#if COLUMNS_A_VECTOR == 2
#define VECTORS_A_PASS(tile) ((tile) <= 4 ? 4 : 2)
#else
#define VECTORS_A_PASS(tile) ((tile) <= 2 ? 4 : (tile) == 4 ? 2 : 1)
#endif
#define COLUMNS_AT_ONCE (4 * COLUMNS_A_VECTOR)

static inline float sum_lanes(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Block b of the columns PREFETCH_BYTES on (whole passes), once a cache line: hardware prefetching follows
   each column's row, not the jump to the next rows (a weight streaming from memory: 0.7-0.9 of the time
   without); a pass ahead is too near for a 1-row pass (SmolLM2's gate and up from memory, 1 row: 164 ->
   134 us with 4 passes ahead). */
INLINE void prefetch_ahead(int format, const uint8_t *const *col, int columns, int64_t ahead, int64_t b) {
    const int64_t bb = block_bytes(format), every = bb < 64 ? 64 / bb : 1;
    if (b % every) return;
    for (int c = 0; c < columns; c++)
        for (int64_t line = 0; line < bb; line += 64)
            _mm_prefetch((const char *)(col[c] + ahead + b * bb + line), _MM_HINT_T0);
}

#if defined(__AVX512BF16__) && COLUMNS_A_VECTOR == 2
/* chunks j and j + 1 of a vector's two columns (w0, w1) in bfloat16 pairs: the first column's 8 pairs in lanes
   0-7 (chunk j's, then j + 1's), the second's in lanes 8-15 */
INLINE __m512bh bf16_columns(vfloat w0, vfloat w1) {
    const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(w1, w0);
    return (__m512bh)_mm512_shuffle_i32x4(pairs, pairs, _MM_SHUFFLE(3, 1, 2, 0));
}

/* x's pairs for those chunks (8 pairs at `pairs`), in both halves */
INLINE __m512bh bf16_x(const float *pairs) {
    return (__m512bh)_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)pairs));
}

/* A Q4_0 or Q4_1 block of the vector's two columns (a, b: their blocks; d, m: their scales and offsets) as
   bfloat16 pairs, values 0-15 into w[0] and 16-31 into w[1] (bf16_columns' layout): a nibble codes 16 values, so
   each column's 16 are rounded to bfloat16 once and the codes index them (vpermw): about half the work of
   expanding four chunks, the same bits. */
INLINE void bf16_codes(int format, const uint8_t *a, const uint8_t *b, float da, float db, float ma, float mb,
                       __m512bh w[2]) {
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 values_a, values_b;   /* as chunk_of computes them */
    if (format == Q4_0) {
        const __m512 centred = _mm512_sub_ps(codes, _mm512_set1_ps(8.0f));
        values_a = _mm512_mul_ps(_mm512_set1_ps(da), centred), values_b = _mm512_mul_ps(_mm512_set1_ps(db), centred);
    } else {
        values_a = _mm512_fmadd_ps(_mm512_set1_ps(da), codes, _mm512_set1_ps(ma));
        values_b = _mm512_fmadd_ps(_mm512_set1_ps(db), codes, _mm512_set1_ps(mb));
    }
    const __m512i table = (__m512i)_mm512_cvtne2ps_pbh(values_b, values_a);   /* a's 16 words, then b's */
    const int at = format == Q4_0 ? 2 : 4;
    const __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a + at))),
                                                  _mm_loadu_si128((const __m128i *)(b + at)), 1);
    const __m512i words = _mm512_cvtepu8_epi16(bytes);
    const __m512i b_half = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1);
    w[0] = (__m512bh)_mm512_permutexvar_epi16(
        _mm512_or_si512(_mm512_and_si512(words, _mm512_set1_epi16(0x0F)), b_half), table);   /* values 0-15 */
    w[1] = (__m512bh)_mm512_permutexvar_epi16(
        _mm512_or_si512(_mm512_srli_epi16(words, 4), b_half), table);                        /* values 16-31 */
}

/* Sub-block s of block b (blocks[c]: column c's; d, m: their scales) against the tile's rows of x (xr: their
   bfloat16 pairs) in bfloat16 products: every vector's two columns as bfloat16 pairs first (values 0-15 and
   16-31), then each row's x for them read once into every vector's sums. Read for each vector in turn, the rows'
   x stayed live across the vectors beside the sums and gcc spilled them: 8 rows against a 4,096 x 4,096 weight
   took 1.35x this time in Q8_0, 1.5-1.7x in Q6_K, 1.03-1.1x in Q4_1 (Zen 4). Each sum takes its products in the
   same order either way. */
INLINE void bf16_sub_block_dot(int format, int tile, const uint8_t *const *blocks, const float *const *d,
                               const float *const *m, int s, const float *const *xr, int64_t k0, vfloat (*acc)[4]) {
    const int vectors = VECTORS_A_PASS(tile);
    __m512bh w[4][2];   /* [vector][values 0-15, 16-31] */
    for (int h = 0; h < vectors; h++) {
        const int a = 2 * h, z = a + 1;
        if (format == Q4_0 || format == Q4_1) {
            bf16_codes(format, blocks[a], blocks[z], d[a][s], d[z][s], m[a][s], m[z][s], w[h]);
            continue;
        }
        const sub_header head = sub_header_of(format, blocks[a], blocks[z], d[a], d[z], m[a], m[z], s);
        for (int j = 0; j < 4; j += 2)
            w[h][j / 2] = bf16_columns(chunk_of(format, blocks[a], blocks[z], s, j, head),
                                       chunk_of(format, blocks[a], blocks[z], s, j + 1, head));
    }
    const int64_t k = k0 + 32 * s;
    for (int i = 0; i < tile; i++) {
        const __m512bh low = bf16_x(xr[i] + k / 2), high = bf16_x(xr[i] + (k + 16) / 2);
        for (int h = 0; h < vectors; h++) {
            acc[i][h] = _mm512_dpbf16_ps(acc[i][h], w[h][0], low);
            acc[i][h] = _mm512_dpbf16_ps(acc[i][h], w[h][1], high);
        }
    }
}
#define BF16_SUB_BLOCKS 1

/* q4_k_pair_dot in bfloat16 products for a tile of 8 rows, as bf16_sub_block_dot: both vectors' columns for both
   sub-blocks first (the bytes they share widened once), then each row's x read once a sub-block into both vectors'
   sums. Smaller tiles take 4 vectors, whose 16 weights beside the sums would not fit the registers: they take
   q4_k_pair_dot's order of work (8 rows: 0.7-0.85 of the time; 4 rows this way: 1.06). */
INLINE void bf16_q4_k_pair_dot(int tile, const uint8_t *const *blocks, const float *const *d, const float *const *m,
                               int g, const float *const *xr, int64_t k0, vfloat (*acc)[4]) {
    __m512bh w[2][2][2];   /* [vector][sub-block 2 g + t][values 0-15, 16-31] */
    for (int h = 0; h < 2; h++) {
        const int a = 2 * h, z = a + 1;
        vint shared[4];   /* [chunk] */
        for (int j = 0; j < 4; j++) shared[j] = q4_k_pair_bytes(blocks[a], blocks[z], g, j);
        for (int t = 0; t < 2; t++) {
            const sub_header head = sub_header_of(Q4_K, blocks[a], blocks[z], d[a], d[z], m[a], m[z], 2 * g + t);
            for (int j = 0; j < 4; j += 2)
                w[h][t][j / 2] = bf16_columns(q4_k_pair_chunk(shared[j], t, head),
                                              q4_k_pair_chunk(shared[j + 1], t, head));
        }
    }
    for (int t = 0; t < 2; t++) {
        const int64_t k = k0 + 32 * (2 * g + t);
        for (int i = 0; i < tile; i++) {
            const __m512bh low = bf16_x(xr[i] + k / 2), high = bf16_x(xr[i] + (k + 16) / 2);
            for (int h = 0; h < 2; h++) {
                acc[i][h] = _mm512_dpbf16_ps(acc[i][h], w[h][t][0], low);
                acc[i][h] = _mm512_dpbf16_ps(acc[i][h], w[h][t][1], high);
            }
        }
    }
}

/* chunks j and j + 1 (w0, w1) of a vector's columns against each row's pairs of x there (k: their first column) */
#define BF16_DOT(w0, w1, k) do { \
        const __m512bh wb = bf16_columns(w0, w1); \
        for (int i = 0; i < tile; i++) acc[i][h] = _mm512_dpbf16_ps(acc[i][h], wb, bf16_x(xr[i] + (k) / 2)); \
    } while (0)
#else
#define BF16_DOT(w0, w1, k) do { } while (0)   /* quant_matmul_bf16.c takes bfloat16 products in these builds in C */
#endif

/* Sub-block s of block b (blocks[c]: column c's; d, m: their scales) against the tile's rows of x (xr),
   added to acc: a vector's columns at a time, each chunk expanded and then multiplied by every row's x
   (all the vectors' chunks first kept 4 x 4 of them live: gcc spilled them, 2.2x the time a row). bf16: xr holds
   the rows' bfloat16 pairs, and chunks go two at a time through vdpbf16ps. */
INLINE void sub_block_dot(int format, int tile, int bf16, const uint8_t *const *blocks, const float *const *d,
                          const float *const *m, int s, const float *const *xr, int64_t k0, vfloat (*acc)[4]) {
    const int vectors = VECTORS_A_PASS(tile);
#if defined(BF16_SUB_BLOCKS)
    if (bf16) {
        bf16_sub_block_dot(format, tile, blocks, d, m, s, xr, k0, acc);
        return;
    }
#endif
    for (int h = 0; h < vectors; h++) {   /* float32 products (bfloat16 ones: only in AVX512-BF16 builds, above) */
        const int a = h * COLUMNS_A_VECTOR, z = a + COLUMNS_A_VECTOR - 1;
        const sub_header head = sub_header_of(format, blocks[a], blocks[z], d[a], d[z], m[a], m[z], s);
        for (int j = 0; j < 4; j++) {
            const vfloat w = chunk_of(format, blocks[a], blocks[z], s, j, head);
            for (int i = 0; i < tile; i++) acc[i][h] = VF_FMADD(w, x_chunk(xr[i] + k0 + 32 * s + 8 * j), acc[i][h]);
        }
    }
}

/* Sub-blocks 2 g and 2 g + 1 of a Q4_K block, as two sub_block_dot (the same order of sums), the bytes they
   share widened once: gcc would load them again (char loads alias the stores between); 0.87-0.93 of the time. */
INLINE void q4_k_pair_dot(int tile, int bf16, const uint8_t *const *blocks, const float *const *d,
                            const float *const *m, int g, const float *const *xr, int64_t k0, vfloat (*acc)[4]) {
    const int vectors = VECTORS_A_PASS(tile);
#if defined(BF16_SUB_BLOCKS)
    if (bf16 && vectors == 2) {
        bf16_q4_k_pair_dot(tile, blocks, d, m, g, xr, k0, acc);
        return;
    }
#endif
    for (int h = 0; h < vectors; h++) {
        const int a = h * COLUMNS_A_VECTOR, z = a + COLUMNS_A_VECTOR - 1;
        vint shared[4];   /* [chunk] */
        for (int j = 0; j < 4; j++) shared[j] = q4_k_pair_bytes(blocks[a], blocks[z], g, j);
        for (int t = 0; t < 2; t++) {
            const sub_header head = sub_header_of(Q4_K, blocks[a], blocks[z], d[a], d[z], m[a], m[z], 2 * g + t);
            if (bf16) {
                for (int j = 0; j < 4; j += 2)
                    BF16_DOT(q4_k_pair_chunk(shared[j], t, head), q4_k_pair_chunk(shared[j + 1], t, head),
                             k0 + 32 * (2 * g + t) + 8 * j);
                continue;
            }
            for (int j = 0; j < 4; j++) {
                const vfloat w = q4_k_pair_chunk(shared[j], t, head);
                for (int i = 0; i < tile; i++)
                    acc[i][h] = VF_FMADD(w, x_chunk(xr[i] + k0 + 32 * (2 * g + t) + 8 * j), acc[i][h]);
            }
        }
    }
}

/* Block b of the pass's columns (col[c]: column c's row of blocks) into acc. */
INLINE void block_dot(int format, int tile, int bf16, const uint8_t *const *col, int64_t ahead, int64_t b,
                      const float *const *xr, vfloat (*acc)[4]) {
    const int columns = VECTORS_A_PASS(tile) * COLUMNS_A_VECTOR, bv = block_values(format);
    const int64_t bb = block_bytes(format);
    const uint8_t *blocks[COLUMNS_AT_ONCE];
    const float *d[COLUMNS_AT_ONCE], *m[COLUMNS_AT_ONCE];
    k_scales ks[COLUMNS_AT_ONCE];
    prefetch_ahead(format, col, columns, ahead, b);
    for (int c = 0; c < columns; c++) {
        blocks[c] = col[c] + b * bb;
        if (is_k_quant(format)) k_scales_of(format, blocks[c], &ks[c]), d[c] = ks[c].d, m[c] = ks[c].m;
        else d[c] = half_at(blocks[c]), m[c] = half_at(blocks[c] + 2);
    }
    const int group = subs_sharing_bytes(format);
    for (int g = 0; g < bv / 32 / group; g++) {
        if (format == Q4_K) {
            q4_k_pair_dot(tile, bf16, blocks, d, m, g, xr, b * bv, acc);
            continue;
        }
        #pragma GCC unroll 4
        for (int t = 0; t < group; t++)
            sub_block_dot(format, tile, bf16, blocks, d, m, g * group + t, xr, b * bv, acc);
    }
}

/* `rows` rows of x from row0 (a tile of `tile`: the rest repeat row0 and are dropped) against `count`
   columns from n (at most a pass's: lanes of the others repeat column n and are dropped), over blocks
   [first, last) of the K axis. The lane sums start from and go back to carry ([column][row][8], at column n
   and row0) between spans; the last span writes y. tile and format are constants after inlining, so the
   accumulators stay in registers. */
INLINE void tile_dot(const float *x, int64_t row0, int tile, int bf16, int rows, int64_t K, const uint8_t *q,
                     int64_t row_bytes, int format, int64_t first, int64_t last, float *carry, int64_t N, int64_t n,
                     int count, int64_t per_column, const float *bias, float *y) {
    const int vectors = VECTORS_A_PASS(tile);
    int at[COLUMNS_AT_ONCE];   /* each lane half's column, from n */
    const uint8_t *col[COLUMNS_AT_ONCE];
    for (int c = 0; c < COLUMNS_AT_ONCE; c++) at[c] = c < count ? c : 0, col[c] = q + at[c] * row_bytes;
    const float *xr[ROW_TILE];
    for (int i = 0; i < tile; i++) xr[i] = x + (row0 + (i < rows ? i : 0)) * (bf16 ? K / 2 : K);   /* bf16: pairs */
    vfloat acc[ROW_TILE][4];
    for (int i = 0; i < tile; i++)
        for (int h = 0; h < vectors; h++) {
            const int low = at[h * COLUMNS_A_VECTOR], high = at[h * COLUMNS_A_VECTOR + COLUMNS_A_VECTOR - 1];
            acc[i][h] = first == 0 || i >= rows ? VF_ZERO() : halves(carry + low * per_column + 8 * i,
                                                                     carry + high * per_column + 8 * i);
        }
    const int64_t pass = vectors * COLUMNS_A_VECTOR * row_bytes, ahead = (PREFETCH_BYTES + pass - 1) / pass * pass;
    for (int64_t b = first; b < last; b++) block_dot(format, tile, bf16, col, ahead, b, xr, acc);
    const int bv = block_values(format);
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < count; c++) {
            const __m256 lanes = half_of(acc[i][c / COLUMNS_A_VECTOR], c % COLUMNS_A_VECTOR);
            if (last * bv < K) _mm256_storeu_ps(carry + c * per_column + 8 * i, lanes);
            else y[(row0 + i) * N + n + c] = sum_lanes(lanes) + (bias ? bias[n + c] : 0.0f);
        }
}

/* `count` columns from n (at most COLUMNS_AT_ONCE) in passes of VECTORS_A_PASS(T) vectors */
#define TILE_DOT(T, R) \
    for (int c0 = 0, step = VECTORS_A_PASS(T) * COLUMNS_A_VECTOR; c0 < count; c0 += step) \
        tile_dot(x, row0, T, bf16, R, K, q + c0 * row_bytes, row_bytes, format, first, last, \
                 carry + c0 * per_column, N, n + c0, count - c0 < step ? count - c0 : step, per_column, bias, y)

INLINE void rows_dot(const float *x, int64_t M, int64_t K, int bf16, const uint8_t *q, int64_t row_bytes, int format,
                     int64_t first, int64_t last, float *carry, int64_t N, int64_t n, int count, int64_t per_column,
                     const float *bias, float *y) {
    for (int64_t row0 = 0; row0 < M; row0 += ROW_TILE, carry += 8 * ROW_TILE) {   /* one call site a tile: */
        const int rows = (int)(M - row0 < ROW_TILE ? M - row0 : ROW_TILE);          /* less code to compile */
        if (rows > 4) TILE_DOT(8, rows);
        else if (rows > 2) TILE_DOT(4, rows);
        else if (rows == 2) TILE_DOT(2, 2);
        else TILE_DOT(1, 1);
    }
}

/* columns [n0, n1), COLUMNS_AT_ONCE at a time, the K axis in equal spans of whole blocks, at most
   SPAN_VALUES, so that a span of x stays in the L1 cache while every column reads it; carry holds each
   column's lane sums between spans. */
INLINE void columns(const float *x, int64_t M, int64_t K, int bf16, const uint8_t *q, int format, int64_t N,
                    const float *bias, float *y, int64_t n0, int64_t n1, float *carry) {
    const int bv = block_values(format);
    const int64_t blocks = K / bv, row_bytes = blocks * block_bytes(format), per_column = 8 * M;
    const int64_t most = bv < SPAN_VALUES ? SPAN_VALUES / bv : 1, spans = (blocks + most - 1) / most;
    const int64_t span = (blocks + spans - 1) / spans;
    for (int64_t first = 0; first < blocks; first += span) {
        const int64_t last = first + span < blocks ? first + span : blocks;
        for (int64_t n = n0; n < n1; n += COLUMNS_AT_ONCE)
            rows_dot(x, M, K, bf16, q + n * row_bytes, row_bytes, format, first, last,
                     carry + (n - n0) * per_column, N, n, (int)(n1 - n < COLUMNS_AT_ONCE ? n1 - n : COLUMNS_AT_ONCE),
                     per_column, bias, y);
    }
}

#endif

/* each row's 8 lanes (lanes + 8 i) take a sub-block's 32 values w against the row's 32 values from k0 (rows: x's
   rows, as the caller's function reads them) */
typedef void (*lanes_add_fn)(float *lanes, int64_t M, const float *w, const void *rows, int64_t K, int64_t k0);

/* The columns in plain C, one lane at a time, for builds without the vector code: each sub-block's values
   expanded (sub_block_values), `add` taking them into the lanes, the lanes summed as the vector code sums them. */
static inline void plain_columns(lanes_add_fn add, const void *rows, int64_t M, int64_t K, const uint8_t *q,
                                 int format, int64_t N, const float *bias, float *y, int64_t n0, int64_t n1,
                                 float *lanes) {
    const int bv = block_values(format);
    const int64_t bb = block_bytes(format), row_bytes = K / bv * bb;
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t l = 0; l < 8 * M; l++) lanes[l] = 0.0f;
        for (int64_t b = 0; b < K / bv; b++)
            for (int s = 0; s < bv / 32; s++) {
                float w[32];
                sub_block_values(format, q + n * row_bytes + b * bb, s, w);
                add(lanes, M, w, rows, K, b * bv + 32 * s);
            }
        for (int64_t i = 0; i < M; i++) {
            const float *r = lanes + 8 * i;
            const float sum = ((r[0] + r[4]) + (r[2] + r[6])) + ((r[1] + r[5]) + (r[3] + r[7]));
            y[i * N + n] = sum + (bias ? bias[n] : 0.0f);
        }
    }
}

/* A weight's columns go to the threads in groups of at most GROUP_COLUMNS, about 4 groups a thread */
static int64_t group_of(int64_t N, int threads) {
    const int64_t group = N / (4 * (int64_t)threads);
    return group < 1 ? 1 : group > GROUP_COLUMNS ? GROUP_COLUMNS : group;
}

static int64_t groups_of(int64_t N, int threads) { return (N + group_of(N, threads) - 1) / group_of(N, threads); }

/* the weight of task `task` among the groups of every weight in turn, and its group's columns [n0, n1) */
static int64_t weight_of_task(int64_t task, const int64_t *N, int threads, int64_t *n0, int64_t *n1) {
    int64_t w = 0;
    for (; task >= groups_of(N[w], threads); w++) task -= groups_of(N[w], threads);
    const int64_t group = group_of(N[w], threads);
    *n0 = task * group;
    *n1 = *n0 + group < N[w] ? *n0 + group : N[w];
    return w;
}

/* columns [n0, n1) of one weight q for rows x (float32, or bfloat16 pairs: as the function reads them) */
typedef void (*column_range_fn)(const void *x, int64_t M, int64_t K, const uint8_t *q, int format, int64_t N,
                                const float *bias, float *y, int64_t n0, int64_t n1, float *carry);

typedef struct {
    column_range_fn range;
    const void *x;
    int64_t M, K;
    const uint8_t *const *q;
    const int *formats;
    const int64_t *N;
    const float *const *bias;
    float *const *y;
    int threads;
} Weights;

static void column_task(void *context, int64_t task, int slot) {
    (void)slot;
    const Weights *s = context;
    int64_t n0, n1;
    const int64_t w = weight_of_task(task, s->N, s->threads, &n0, &n1);
    float carry[GROUP_COLUMNS * MAX_ROWS * 8];
    s->range(s->x, s->M, s->K, s->q[w], s->formats[w], s->N[w], s->bias[w], s->y[w], n0, n1, carry);
}

/* x: [M, K] float32; for each of `count` weights w, q[w]: [N[w], K / block values * block bytes] its blocks in
 * formats[w] (a GGML type code of quant_blocks.h), bias[w]: [N[w]] or NULL, y[w]: [M, N[w]] float32, so that
 * y[w] = x @ W[w].T + bias[w]. K is a multiple of each format's block. Every weight's column groups are tasks
 * of one job of task_pool.c's threads (a decode step's q, k and v, or gate and up: one job instead of one for
 * each weight), and each column is computed as it would be alone, whichever thread takes it. Rows go MAX_ROWS
 * at a time; a group's lane sums wait in carry between spans. range: the columns' function, which reads x's rows
 * row_words 32-bit words apart. */
static void matmul_many(column_range_fn range, const void *x, int64_t row_words, int64_t M, int64_t K, int64_t count,
                        const uint8_t *const *q, const int *formats, const int64_t *N, const float *const *bias,
                        float *const *y, int threads) {
    int64_t tasks = 0;
    for (int64_t w = 0; w < count; w++) tasks += groups_of(N[w], threads);
    float *rows_y[count > 0 ? count : 1];
    for (int64_t r0 = 0; r0 < M; r0 += MAX_ROWS) {
        for (int64_t w = 0; w < count; w++) rows_y[w] = y[w] + r0 * N[w];
        Weights span = {range, (const uint32_t *)x + r0 * row_words, M - r0 < MAX_ROWS ? M - r0 : MAX_ROWS, K, q,
                        formats, N, bias, rows_y, threads};
        swarm_pool_run(column_task, &span, tasks, threads);
    }
}

#endif
