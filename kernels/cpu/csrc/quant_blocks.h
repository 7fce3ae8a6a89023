/* The GGUF block formats the quantized kernels read (ggml-common.h's layouts), and how each expands to
 * exactly the float32 values gguf.quants.dequantize gives: the same float32 operations in the same order,
 * a product and a sum never fused (every product below is exact in float32; each sum rounds once, as
 * gguf's does).
 *
 *   format  block bytes  one value (q: the unsigned code of its bits)
 *   Q8_0    32     34    d * q, q signed 8 bits                        [d][q x 32]
 *   Q4_0    32     18    d * (q - 8)                                   [d][low nibbles: 0-15, high: 16-31]
 *   Q4_1    32     20    d * q + m                                     [d][m][nibbles]
 *   Q5_0    32     22    d * ((q | h << 4) - 16), h bit j of a word    [d][h x 32 bits][nibbles]
 *   Q5_1    32     24    d * (q | h << 4) + m                          [d][m][h][nibbles]
 *   Q4_K    256   144    (d * sc) * q - (dmin * mn), 8 sub-blocks      [d][dmin][12 bytes: 6-bit sc, mn][q]
 *   Q5_K    256   176    (d * sc) * (q | h << 4) - (dmin * mn)         [d][dmin][sc, mn][h x 32 bytes][q]
 *   Q6_K    256   210    (d * sc) * ((q | h << 4) - 32), sc per 16     [low nibbles][2-bit highs][sc x 16][d]
 *
 * d, m, dmin are fp16. A sub-block is 32 values; a 32-value format's block is one sub-block. The SIMD
 * code expands a sub-block 8 values (a chunk) at a time; the plain C code a sub-block at a time.
 */
#ifndef SWARM_QUANT_BLOCKS_H
#define SWARM_QUANT_BLOCKS_H

#include <stdint.h>

#define INLINE static inline __attribute__((always_inline))

enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };   /* GGML type codes */

#define EACH_FORMAT(format, CALL) switch (format) { \
    case Q4_0: CALL(Q4_0); break; case Q4_1: CALL(Q4_1); break; case Q5_0: CALL(Q5_0); break; \
    case Q5_1: CALL(Q5_1); break; case Q8_0: CALL(Q8_0); break; case Q4_K: CALL(Q4_K); break; \
    case Q5_K: CALL(Q5_K); break; case Q6_K: CALL(Q6_K); break; default: break; }

INLINE int block_values(int format) { return format >= Q4_K ? 256 : 32; }

INLINE int64_t block_bytes(int format) {
    switch (format) {
        case Q4_0: return 18;
        case Q4_1: return 20;
        case Q5_0: return 22;
        case Q5_1: return 24;
        case Q8_0: return 34;
        case Q4_K: return 144;
        case Q5_K: return 176;
        default: return 210;   /* Q6_K */
    }
}

INLINE uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#if defined(__F16C__)
#include <immintrin.h>
INLINE float half_to_float(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }
#else
INLINE float half_to_float(const uint8_t *p) {
    const uint32_t h = (uint32_t)(p[0] | p[1] << 8), sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1F;
    const uint32_t mantissa = h & 0x3FF;
    union { uint32_t u; float f; } v;
    if (exponent == 0x1F) v.u = sign | 0x7F800000u | mantissa << 13;           /* inf, nan */
    else if (exponent) v.u = sign | (exponent + 112) << 23 | mantissa << 13;
    else {                                                                    /* zero, subnormal */
        v.f = (float)mantissa * 5.9604644775390625e-8f;                       /* exact: mantissa * 2^-24 */
        v.u |= sign;
    }
    return v.f;
}
#endif

/* the 6-bit scale and min of sub-block s of a Q4_K or Q5_K super-block, from its 12 scale bytes */
INLINE void k_scale_min(const uint8_t *scales, int s, int *sc, int *mn) {
    if (s < 4) {
        *sc = scales[s] & 63;
        *mn = scales[s + 4] & 63;
    } else {
        *sc = (scales[s + 4] & 0x0F) | (scales[s - 4] >> 6) << 4;
        *mn = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4;
    }
}

/* value l of a 32-value block's 16 nibble bytes: l < 16 in the low nibbles, l >= 16 in the high ones */
INLINE int nibble(const uint8_t *qs, int l) { return l < 16 ? qs[l] & 0x0F : qs[l - 16] >> 4; }

/* values [32 s, 32 s + 32) of `block` (s = 0 for the 32-value formats) */
static inline void sub_block_values(int format, const uint8_t *block, int s, float *out) {
    const float d = half_to_float(format == Q6_K ? block + 208 : block);
    float m = format == Q4_1 || format == Q5_1 ? half_to_float(block + 2) : 0.0f, dsc = d;
    if (format == Q4_K || format == Q5_K) {
        int sc, mn;
        k_scale_min(block + 4, s, &sc, &mn);
        dsc = d * (float)sc;
        m = half_to_float(block + 2) * (float)mn;
    }
    const uint32_t qh = format == Q5_0 ? le32(block + 2) : format == Q5_1 ? le32(block + 4) : 0;
    const uint8_t *qs = block + 32 * (s / 2);   /* K-quants' nibbles: two sub-blocks to 32 bytes */
    for (int l = 0; l < 32; l++) {
        switch (format) {
            case Q8_0: out[l] = (float)(int8_t)block[2 + l] * d; break;
            case Q4_0: out[l] = d * (float)(nibble(block + 2, l) - 8); break;
            case Q4_1: out[l] = d * (float)nibble(block + 4, l) + m; break;
            case Q5_0: out[l] = d * (float)((nibble(block + 6, l) | (int)((qh >> l) & 1) << 4) - 16); break;
            case Q5_1: out[l] = d * (float)(nibble(block + 8, l) | (int)((qh >> l) & 1) << 4) + m; break;
            case Q4_K: out[l] = dsc * (float)(qs[16 + l] >> 4 * (s & 1) & 0x0F) - m; break;
            case Q5_K: out[l] = dsc * (float)((qs[48 + l] >> 4 * (s & 1) & 0x0F) | (block[16 + l] >> s & 1) << 4) - m;
                       break;
            default: {   /* Q6_K: bytes 64 h + l hold sub-blocks 4 h + {0, 2} (+1 at l >= 32), 2 bits of 4 in each high */
                const int low = block[64 * (s / 4) + 32 * (s & 1) + l] >> 4 * (s / 2 & 1) & 0x0F;
                const int high = block[128 + 32 * (s / 4) + l] >> 2 * (s & 3) & 3;
                out[l] = (d * (float)(int8_t)block[192 + 2 * s + l / 16]) * (float)((low | high << 4) - 32);
            }
        }
    }
}

#endif
