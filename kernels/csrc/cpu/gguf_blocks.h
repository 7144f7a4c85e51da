/* GGUF block layouts (ggml-quants.c's block_q4_0 ... block_iq4_xs) read into one form, a chunk of 256
 * weights in sub-blocks of 16:
 *
 *   w[16 k + i] = s[k] * q[16 k + i] + o[k]      q int8 (|q| <= 128), s / o float32, k < 16
 *
 * so one integer dot (gemv_kquant.c) and one dequantizer (gguf_dequant.c) serve every type. A row is
 * K weights = K / QK blocks of `bytes` each (QK = 32 for the legacy types and IQ4_NL, 256 for the
 * K-quants and IQ4_XS); legacy rows are read 8 blocks a chunk, the last chunk of a row may be short
 * (its missing weights read as q = 0, s = o = 0).
 *
 * Per type (d, dmin, m: fp16; sc / mn: the sub-block's integer scale / min; q as stored):
 *   Q4_0  w = d (q - 8)              Q4_1  w = d q + m          Q5_0  w = d (q - 16)     Q5_1  w = d q + m
 *   Q8_0  w = d q                    IQ4_NL w = d kv[q]
 *   Q2_K  w = (d sc) q - (dmin mn)   (16 sub-blocks of 16; 4-bit sc / mn)
 *   Q3_K  w = (d (sc - 32)) (q - 4 [high bit clear])     (16 of 16; 6-bit sc)
 *   Q4_K / Q5_K  w = (d sc) q - (dmin mn)                 (8 of 32; 6-bit sc / mn)
 *   Q6_K  w = (d sc) (q - 32)        (16 of 16; int8 sc)
 *   IQ4_XS w = (d (sc - 32)) kv[q]   (8 of 32; 6-bit sc)
 * s and o are the float32 products in these parentheses, so s q + o (no fused multiply-add) is exactly
 * the value gguf.quants.dequantize gives (numpy's float32 operations in the same order).
 */
#ifndef RADIXLANG_GGUF_BLOCKS_H
#define RADIXLANG_GGUF_BLOCKS_H
#include "common.h"

/* ggml's type numbers */
#define GGML_Q4_0 2
#define GGML_Q4_1 3
#define GGML_Q5_0 6
#define GGML_Q5_1 7
#define GGML_Q8_0 8
#define GGML_Q2_K 10
#define GGML_Q3_K 11
#define GGML_Q4_K 12
#define GGML_Q5_K 13
#define GGML_Q6_K 14
#define GGML_IQ4_NL 20
#define GGML_IQ4_XS 23

#define KQ_CHUNK 256

typedef struct {
    int8_t q[KQ_CHUNK];
    float s[16];
    float o[16];
} kq_chunk;

/* weights per block (0: not a type read here) and bytes per block */
static inline int gguf_block_len(int64_t t) {
    switch (t) {
        case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_Q8_0: case GGML_IQ4_NL: return 32;
        case GGML_Q2_K: case GGML_Q3_K: case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: case GGML_IQ4_XS: return 256;
        default: return 0;
    }
}

/* the types whose weights carry an offset o per sub-block (w = s q + o): their dots need sum(x) */
static inline int gguf_has_mins(int64_t t) {
    return t == GGML_Q4_1 || t == GGML_Q5_1 || t == GGML_Q2_K || t == GGML_Q4_K || t == GGML_Q5_K;
}

/* weights per scale: 32 for the legacy types, Q4_K / Q5_K and the IQ4 types, 16 for Q2_K, Q3_K and Q6_K */
static inline int gguf_scale_len(int64_t t) { return t == GGML_Q2_K || t == GGML_Q3_K || t == GGML_Q6_K ? 16 : 32; }

static inline int64_t gguf_block_bytes(int64_t t) {
    switch (t) {
        case GGML_Q4_0: case GGML_IQ4_NL: return 18;
        case GGML_Q4_1: return 20;
        case GGML_Q5_0: return 22;
        case GGML_Q5_1: return 24;
        case GGML_Q8_0: return 34;
        case GGML_Q2_K: return 84;
        case GGML_Q3_K: return 110;
        case GGML_Q4_K: return 144;
        case GGML_Q5_K: return 176;
        case GGML_Q6_K: return 210;
        case GGML_IQ4_XS: return 136;
        default: return 0;
    }
}

static const int8_t kq_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

#if defined(__AVX2__)
/* AVX2 unpacking (also in AVX-512 builds); the scalar loops below are the reference for each */
static inline __m128i kq_lo4(__m128i v) { return _mm_and_si128(v, _mm_set1_epi8(15)); }
static inline __m128i kq_hi4(__m128i v) { return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15)); }
static inline __m256i kq_lo4x(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }
static inline __m256i kq_hi4x(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15)); }
/* byte i of v's bytes shifted right by `sh` (0..7), masked to `mask` */
static inline __m256i kq_bits(__m256i v, int sh, int mask) {
    return _mm256_and_si256(_mm256_srli_epi16(v, sh), _mm256_set1_epi8((char)mask));
}
/* byte j (j < 32) = bit j of `bits` */
static inline __m256i kq_bits32(uint32_t bits) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                          3, 3, 3, 3, 3);
    const __m256i mask = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf), mask);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, mask), _mm256_set1_epi8(1));
}
#endif

/* one legacy block (32 weights) -> q[0..31], s[0..1], o[0..1] */
static inline void kq_legacy_block(const uint8_t *b, int64_t t, int8_t *q, float *s, float *o) {
    const float d = half_to_f32(b);
    float m = 0.f;
    const uint8_t *qs;
    uint32_t qh = 0;
#if defined(__AVX2__)
    if (t != GGML_Q8_0) {
        const int off = t == GGML_Q4_0 || t == GGML_IQ4_NL ? 2 : t == GGML_Q4_1 || t == GGML_Q5_0 ? 4 + 2 * (t == GGML_Q5_0) : 8;
        if (t == GGML_Q4_1 || t == GGML_Q5_1) m = half_to_f32(b + 2);
        const __m128i v = _mm_loadu_si128((const __m128i *)(b + off));
        __m128i lo = kq_lo4(v), hi = kq_hi4(v);
        if (t == GGML_IQ4_NL) {
            const __m128i tab = _mm_loadu_si128((const __m128i *)kq_iq4_values);
            lo = _mm_shuffle_epi8(tab, lo), hi = _mm_shuffle_epi8(tab, hi);
        }
        __m256i y = _mm256_set_m128i(hi, lo);
        if (t == GGML_Q5_0 || t == GGML_Q5_1) {
            memcpy(&qh, b + off - 4, 4);
            y = _mm256_or_si256(y, _mm256_slli_epi16(kq_bits32(qh), 4));
        }
        if (t == GGML_Q4_0 || t == GGML_Q5_0) y = _mm256_sub_epi8(y, _mm256_set1_epi8(t == GGML_Q4_0 ? 8 : 16));
        _mm256_storeu_si256((__m256i *)q, y);
        s[0] = s[1] = d;
        o[0] = o[1] = m;
        return;
    }
#endif
    switch (t) {
        case GGML_Q8_0:
            memcpy(q, b + 2, 32);
            break;
        case GGML_Q4_0: case GGML_IQ4_NL:
            qs = b + 2;
            for (int j = 0; j < 16; j++) q[j] = (int8_t)(qs[j] & 15), q[j + 16] = (int8_t)(qs[j] >> 4);
            for (int j = 0; j < 32; j++) q[j] = t == GGML_Q4_0 ? (int8_t)(q[j] - 8) : kq_iq4_values[q[j]];
            break;
        case GGML_Q4_1:
            m = half_to_f32(b + 2), qs = b + 4;
            for (int j = 0; j < 16; j++) q[j] = (int8_t)(qs[j] & 15), q[j + 16] = (int8_t)(qs[j] >> 4);
            break;
        default: /* Q5_0 / Q5_1: the fifth bits in a little-endian uint32 */
            if (t == GGML_Q5_1) m = half_to_f32(b + 2);
            memcpy(&qh, b + (t == GGML_Q5_1 ? 4 : 2), 4);
            qs = b + (t == GGML_Q5_1 ? 8 : 6);
            for (int j = 0; j < 16; j++) {
                q[j] = (int8_t)((qs[j] & 15) | ((qh >> j) & 1) << 4);
                q[j + 16] = (int8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
            }
            if (t == GGML_Q5_0)
                for (int j = 0; j < 32; j++) q[j] = (int8_t)(q[j] - 16);
    }
    s[0] = s[1] = d;
    o[0] = o[1] = m;
}

/* Q4_K / Q5_K's 12 bytes of 6-bit scales and mins -> sc[8], mn[8] */
static inline void kq_scale_min(const uint8_t *p, int *sc, int *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = p[j] & 63, mn[j] = p[j + 4] & 63;
        sc[j + 4] = (p[j + 8] & 15) | ((p[j] >> 2) & 0x30);
        mn[j + 4] = (p[j + 8] >> 4) | ((p[j + 4] >> 2) & 0x30);
    }
}

/* one K-quant / IQ4_XS block (256 weights) -> c */
static inline void kq_super_block(const uint8_t *b, int64_t t, kq_chunk *c) {
    int sc[16], mn[16];
    switch (t) {
        case GGML_Q2_K: { /* scales[16] | qs[64] | d | dmin */
            const float d = half_to_f32(b + 80), dmin = half_to_f32(b + 82);
            for (int k = 0; k < 16; k++) c->s[k] = d * (float)(b[k] & 15), c->o[k] = -(dmin * (float)(b[k] >> 4));
#if defined(__AVX2__)
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + h * 32));
                for (int sh = 0; sh < 4; sh++) _mm256_storeu_si256((__m256i *)(c->q + h * 128 + sh * 32), kq_bits(v, 2 * sh, 3));
            }
            break;
#endif
            for (int h = 0; h < 2; h++)
                for (int sh = 0; sh < 4; sh++)
                    for (int l = 0; l < 32; l++) c->q[h * 128 + sh * 32 + l] = (int8_t)((b[16 + h * 32 + l] >> (2 * sh)) & 3);
            break;
        }
        case GGML_Q3_K: { /* hmask[32] | qs[64] | scales[12] | d */
            const uint8_t *hm = b, *qs = b + 32, *p = b + 96;
            const float d = half_to_f32(b + 108);
            for (int k = 0; k < 16; k++) {
                const int lo = k < 8 ? p[k] & 15 : p[k - 8] >> 4, hi = (p[8 + k % 4] >> (2 * (k / 4))) & 3;
                c->s[k] = d * (float)((lo | hi << 4) - 32), c->o[k] = 0.f;
            }
#if defined(__AVX2__)
            const __m256i hv = _mm256_loadu_si256((const __m256i *)hm);
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + h * 32));
                for (int sh = 0; sh < 4; sh++) {
                    const __m256i y = _mm256_or_si256(kq_bits(v, 2 * sh, 3), _mm256_slli_epi16(kq_bits(hv, h * 4 + sh, 1), 2));
                    _mm256_storeu_si256((__m256i *)(c->q + h * 128 + sh * 32), _mm256_sub_epi8(y, _mm256_set1_epi8(4)));
                }
            }
            break;
#endif
            for (int h = 0; h < 2; h++)
                for (int sh = 0; sh < 4; sh++)
                    for (int l = 0; l < 32; l++) {
                        const int e = h * 128 + sh * 32 + l, bit = (hm[l] >> (h * 4 + sh)) & 1;
                        c->q[e] = (int8_t)(((qs[h * 32 + l] >> (2 * sh)) & 3) - (bit ? 0 : 4));
                    }
            break;
        }
        case GGML_Q4_K: case GGML_Q5_K: { /* d | dmin | scales[12] | (Q5_K: qh[32]) | qs[128] */
            const float d = half_to_f32(b), dmin = half_to_f32(b + 2);
            kq_scale_min(b + 4, sc, mn);
            for (int k = 0; k < 16; k++) c->s[k] = d * (float)sc[k / 2], c->o[k] = -(dmin * (float)mn[k / 2]);
            const uint8_t *qh = b + 16, *qs = b + (t == GGML_Q5_K ? 48 : 16);
#if defined(__AVX2__)
            const __m256i hv = _mm256_loadu_si256((const __m256i *)qh);
            for (int g = 0; g < 4; g++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + g * 32));
                __m256i lo = kq_lo4x(v), hi = kq_hi4x(v);
                if (t == GGML_Q5_K) {
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(kq_bits(hv, 2 * g, 1), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(kq_bits(hv, 2 * g + 1, 1), 4));
                }
                _mm256_storeu_si256((__m256i *)(c->q + g * 64), lo);
                _mm256_storeu_si256((__m256i *)(c->q + g * 64 + 32), hi);
            }
            break;
#endif
            for (int g = 0; g < 4; g++)
                for (int l = 0; l < 32; l++) {
                    c->q[g * 64 + l] = (int8_t)(qs[g * 32 + l] & 15);
                    c->q[g * 64 + 32 + l] = (int8_t)(qs[g * 32 + l] >> 4);
                }
            if (t == GGML_Q5_K)
                for (int i = 0; i < 8; i++)
                    for (int l = 0; l < 32; l++) c->q[i * 32 + l] = (int8_t)(c->q[i * 32 + l] | ((qh[l] >> i) & 1) << 4);
            break;
        }
        case GGML_Q6_K: { /* ql[128] | qh[64] | scales[16] int8 | d */
            const uint8_t *ql = b, *qh = b + 128;
            const float d = half_to_f32(b + 208);
            for (int k = 0; k < 16; k++) c->s[k] = d * (float)(int8_t)b[192 + k], c->o[k] = 0.f;
#if defined(__AVX2__)
            for (int h = 0; h < 2; h++) {
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + h * 64));
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + h * 64 + 32));
                const __m256i hv = _mm256_loadu_si256((const __m256i *)(qh + h * 32));
                const __m256i lo[4] = {kq_lo4x(l0), kq_lo4x(l1), kq_hi4x(l0), kq_hi4x(l1)};
                for (int i = 0; i < 4; i++) {
                    const __m256i y = _mm256_or_si256(lo[i], _mm256_slli_epi16(kq_bits(hv, 2 * i, 3), 4));
                    _mm256_storeu_si256((__m256i *)(c->q + h * 128 + i * 32), _mm256_sub_epi8(y, _mm256_set1_epi8(32)));
                }
            }
            break;
#endif
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < 4; i++)
                    for (int l = 0; l < 32; l++) {
                        const int lo = (ql[h * 64 + (i & 1) * 32 + l] >> (4 * (i >> 1))) & 15;
                        const int hi = (qh[h * 32 + l] >> (2 * i)) & 3;
                        c->q[h * 128 + i * 32 + l] = (int8_t)((lo | hi << 4) - 32);
                    }
            break;
        }
        default: { /* IQ4_XS: d | scales_h uint16 | scales_l[4] | qs[128] */
            const float d = half_to_f32(b);
            const int sh = b[2] | b[3] << 8;
            for (int j = 0; j < 8; j++) {
                const int ls = (((b[4 + j / 2] >> (4 * (j % 2))) & 15) | ((sh >> (2 * j)) & 3) << 4) - 32;
                c->s[2 * j] = c->s[2 * j + 1] = d * (float)ls;
                c->o[2 * j] = c->o[2 * j + 1] = 0.f;
#if defined(__AVX2__)
                const __m128i tab = _mm_loadu_si128((const __m128i *)kq_iq4_values);
                const __m128i v = _mm_loadu_si128((const __m128i *)(b + 8 + j * 16));
                _mm_storeu_si128((__m128i *)(c->q + j * 32), _mm_shuffle_epi8(tab, kq_lo4(v)));
                _mm_storeu_si128((__m128i *)(c->q + j * 32 + 16), _mm_shuffle_epi8(tab, kq_hi4(v)));
                continue;
#endif
                for (int l = 0; l < 16; l++) {
                    c->q[j * 32 + l] = kq_iq4_values[b[8 + j * 16 + l] & 15];
                    c->q[j * 32 + 16 + l] = kq_iq4_values[b[8 + j * 16 + l] >> 4];
                }
            }
        }
    }
}

/* chunk `ci` (weights 256 ci ..) of a row of K weights of type t -> c */
static inline void kq_read_chunk(const uint8_t *row, int64_t t, int64_t K, int64_t ci, kq_chunk *c) {
    const int qk = gguf_block_len(t);
    const int64_t bytes = gguf_block_bytes(t);
    if (qk == KQ_CHUNK) {
        kq_super_block(row + ci * bytes, t, c);
        return;
    }
    const int64_t b0 = ci * (KQ_CHUNK / 32), nb = K / 32;
    for (int j = 0; j < KQ_CHUNK / 32; j++) {
        if (b0 + j < nb) {
            kq_legacy_block(row + (b0 + j) * bytes, t, c->q + 32 * j, c->s + 2 * j, c->o + 2 * j);
        } else {
            memset(c->q + 32 * j, 0, 32);
            c->s[2 * j] = c->s[2 * j + 1] = c->o[2 * j] = c->o[2 * j + 1] = 0.f;
        }
    }
}
#endif
