/* GGUF blocks (and int8 rows) repacked into 4-row tiles: the layout gemv_q8.c (decode batches) and
 * gemm_kquant.c (many rows) read.
 *
 * quant_ops.gguf_q8_tiles packs them (the same bytes as the blocks, moved; gguf_q8_untiles gives the blocks back):
 * rows in groups of 4 (N padded with zero rows), blocks in pairs (K / 32 padded to even with zero blocks);
 * tile t, pair p is one step of STEP bytes at (t * pairs + p) * STEP:
 *   Q8_0 (272 B): dw fp16 [4 rows][2 blocks] | qw int8 [4 rows][64]                (a row's 2 blocks in order)
 *   Q4_1 (160 B): dw fp16 [4][2] | mw fp16 [4][2] | [4 rows][32 B], byte i = qw_b0[i] | qw_b1[i] << 4
 *   Q5_0 (176 B): dw fp16 [4][2] | qh uint32 [4 rows][2 blocks] | [4 rows][32 B] as Q4_1's (low 4 bits);
 *                 bit i of a row's 64 qh bits is the fifth bit of the pair's weight i (block 2p's 32
 *                 weights, then block 2p + 1's)
 *   Q4_K (160 B): d fp16 [4 rows] | dmin fp16 [4] | sc u8 [4][2] | m u8 [4][2] | [4 rows][32 B] as Q4_1's
 *                 (a pair is one 64-weight group of a super-block: the file's 32 bytes as they are)
 *   Q6_K (280 B): d fp16 [4 rows] | sc int8 [4 rows][4] | qw int8 [4 rows][64] (q - 32: the 6 bits unpacked)
 *   INT8 (256 B): qw int8 [4 rows][64]  (the row scales stay a float32 [N] vector, applied at the end)
 * so a thread reads one contiguous stream (the hardware prefetcher's case: on the file's layout, 4 rows
 * at once were 4 streams and ran well below the read bandwidth from DRAM), and the 8 scales of a step
 * are one 16-byte load (on the file's layout, building each row's scale vector took several shuffles a
 * pair).
 */
#ifndef RADIXLANG_GGUF_Q8_TILES_H
#define RADIXLANG_GGUF_Q8_TILES_H
#include "common.h"
#include "gguf_blocks.h"

#define Q8_ROWS 4 /* rows per tile */
#define FMT_Q4_1 2 /* ggml's type numbers */
#define FMT_Q5_0 6
#define FMT_Q4_K 12
#define FMT_Q6_K 14
#define FMT_Q8_0 8
#define FMT_INT8 -1 /* --quantization int8: int8 rows, one float32 scale per row (quant_linear.py) */

static inline int64_t step_bytes(int fmt) {
    return fmt == FMT_Q8_0 ? 272 : fmt == FMT_Q4_1 || fmt == FMT_Q4_K ? 160 : fmt == FMT_Q5_0 ? 176 : fmt == FMT_Q6_K ? 280 : 256;
}
/* Q8_0 and INT8 weights are signed (the xor / sign tricks below); INT8 tiles have no block scales */
static inline int signed_w(int fmt) { return fmt == FMT_Q8_0 || fmt == FMT_INT8 || fmt == FMT_Q6_K; }
/* Q6_K: a scale per 16 weights (the others: per block of 32) */
static inline float q6k_dw(const uint8_t *s, int r, int k) { return half_to_f32(s + 2 * r) * (float)(int8_t)s[8 + 4 * r + k]; }
/* the quants' offset in a step (Q4_1 / Q5_0: the nibbles) */
static inline int64_t w_offset(int fmt) {
    return fmt == FMT_Q8_0 ? 16 : fmt == FMT_Q4_1 || fmt == FMT_Q4_K ? 32 : fmt == FMT_Q5_0 ? 48 : fmt == FMT_Q6_K ? 24 : 0;
}
/* the GGUF formats held as tiles (INT8 tiles have their own entry point) */
static inline int q8_tile_format(int64_t fmt) {
    return fmt == FMT_Q4_1 || fmt == FMT_Q5_0 || fmt == FMT_Q8_0 || fmt == FMT_Q4_K || fmt == FMT_Q6_K;
}
/* the formats whose weights carry an offset (w = dw q + mw), read back as kq_chunk's o */
static inline int tile_mins(int fmt) { return fmt == FMT_Q4_1 || fmt == FMT_Q4_K; }
/* Q4_1 / Q5_0 / Q4_K: an offset term m sx per block (Q5_0's m = -16 dw: gemv_q8.c's unsigned quants) */
static inline int has_min(int fmt) { return fmt == FMT_Q4_1 || fmt == FMT_Q5_0 || fmt == FMT_Q4_K; }
/* row r's block j of a step: its scale dw and offset mw */
static inline float step_dw(const uint8_t *s, int fmt, int r, int j) {
    if (fmt == FMT_INT8 || fmt == FMT_Q6_K) return 1.f; /* Q6_K: q6k_dw, per 16 */
    if (fmt == FMT_Q4_K) return half_to_f32(s + 2 * r) * (float)s[16 + 2 * r + j];
    return half_to_f32(s + 2 * (2 * r + j));
}
static inline float step_mw(const uint8_t *s, int fmt, int r, int j) {
    if (fmt == FMT_Q4_K) return -(half_to_f32(s + 8 + 2 * r) * (float)s[24 + 2 * r + j]);
    return fmt == FMT_Q4_1 ? half_to_f32(s + 16 + 2 * (2 * r + j)) : -16.f * step_dw(s, fmt, r, j);
}

#if defined(__AVX512BW__)
/* row r's 64 quants of the step at st (a pair of blocks, in weight order) as int8: kq_read_chunk's q (Q5_0: q - 16) */
static inline __m512i q8_tile_pair_q(const uint8_t *st, int fmt, int r) {
    if (signed_w(fmt)) return _mm512_loadu_si512(st + w_offset(fmt) + r * 64);
    const __m256i y = _mm256_loadu_si256((const __m256i *)(st + w_offset(fmt) + r * 32));
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(kq_lo4x(y)), kq_hi4x(y), 1);
    if (fmt != FMT_Q5_0) return q;
    uint64_t qh; /* the fifth bits: (q | bit << 4) - 16, i.e. 16 subtracted where the bit is clear */
    memcpy(&qh, st + 16 + r * 8, 8);
    return _mm512_sub_epi8(q, _mm512_maskz_mov_epi8(~qh, _mm512_set1_epi8(16)));
}
#endif

/* row r's scale s and offset o of the step at st per sub-block of 16 (its 4; kq_read_chunk's s / o) */
static inline void q8_tile_pair_scales(const uint8_t *st, int fmt, int r, float s[4], float o[4]) {
    for (int b = 0; b < 2; b++) {
        const float dw = fmt == FMT_Q6_K ? 0.f : step_dw(st, fmt, r, b);
        const float mw = tile_mins(fmt) ? step_mw(st, fmt, r, b) : 0.f;
        for (int h = 0; h < 2; h++) s[2 * b + h] = fmt == FMT_Q6_K ? q6k_dw(st, r, 2 * b + h) : dw, o[2 * b + h] = mw;
    }
}

/* row n's chunk ci (weights 256 ci .. 256 ci + 255; 4 pairs) of rows of K weights held as tiles of format fmt
 * -> c: kq_read_chunk's values for the file's blocks (q, s, o per 16 weights; Q5_0's q - 16 signed, no offset
 * term), zeros past K */
static inline void q8_tile_read_chunk(const uint8_t *tiles, int fmt, int64_t K, int64_t n, int64_t ci, kq_chunk *c) {
    const int64_t nb = K / 32, pairs = (nb + 1) / 2, t = n / Q8_ROWS;
    const int r = (int)(n % Q8_ROWS);
    for (int j = 0; j < 4; j++) {
        const int64_t p = 4 * ci + j;
        int8_t *q = c->q + 64 * j;
        float *s = c->s + 4 * j, *o = c->o + 4 * j;
        if (p >= pairs) {
            memset(q, 0, 64);
            for (int k = 0; k < 4; k++) s[k] = o[k] = 0.f;
            continue;
        }
        const uint8_t *st = tiles + (t * pairs + p) * step_bytes(fmt);
        if (signed_w(fmt)) {
            memcpy(q, st + w_offset(fmt) + r * 64, 64);
        } else { /* nibbles: byte i's low 4 bits weight i of block 2p, its high 4 bits weight i of block 2p + 1 */
            const uint8_t *y = st + w_offset(fmt) + r * 32;
            uint64_t qh = 0;
            if (fmt == FMT_Q5_0) memcpy(&qh, st + 16 + r * 8, 8);
#if defined(__AVX2__)
            const __m256i v = _mm256_loadu_si256((const __m256i *)y);
            __m256i lo = kq_lo4x(v), hi = kq_hi4x(v);
            if (fmt == FMT_Q5_0) {
                const __m256i sixteen = _mm256_set1_epi8(16);
                lo = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(kq_bits32((uint32_t)qh), 4)), sixteen);
                hi = _mm256_sub_epi8(_mm256_or_si256(hi, _mm256_slli_epi16(kq_bits32((uint32_t)(qh >> 32)), 4)), sixteen);
            }
            _mm256_storeu_si256((__m256i *)q, lo);
            _mm256_storeu_si256((__m256i *)(q + 32), hi);
#else
            for (int i = 0; i < 64; i++) {
                const int v = ((y[i % 32] >> (4 * (i / 32))) & 15) | (int)((qh >> i) & 1) << 4;
                q[i] = (int8_t)(fmt == FMT_Q5_0 ? v - 16 : v);
            }
#endif
        }
        q8_tile_pair_scales(st, fmt, r, s, o);
        if (2 * p + 1 >= nb) { /* the padding block: sub-blocks 2, 3 */
            memset(q + 32, 0, 32);
            s[2] = s[3] = o[2] = o[3] = 0.f;
        }
    }
}
#endif
