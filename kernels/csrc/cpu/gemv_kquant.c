/*
 * Linears on a GGUF file's own rows of blocks for decode-sized batches (every type of gguf_blocks.h),
 * with int8 activations as llama.cpp's vec_dot_*_q8_K / q8_0:
 *
 *   x [M, K] (bf16 or float32) -> per block of QX activations (QX = 256 for the K-quants and IQ4_XS,
 *   q8_K's; 32 for the legacy types and IQ4_NL, q8_0's): dx = max|x| / 127, qx = round(x / dx);
 *   per sub-block of 16: sx = sum(x) (float32, from x itself);
 *   W [N, K]: N rows of K / QK blocks, as the file stores them (no repacking: resident bytes = file bytes);
 *   out[m, n] = sum over chunks of 256, over sub-blocks k: s_k dx sum_16(q qx) + o_k sx_k.
 *
 * Precision: sum_16(q qx) is an exact integer on every path (|q| <= 128, |qx| <= 127), so the only error
 * against dequantize-then-matmul is the activations' rounding |x - dx qx| <= dx / 2:
 * |out - exact| <= sum_j dx_j / 2 |w_j| (+ float32 summation); kernels/tests/test_gguf_kernels.py checks it.
 *
 * Each chunk of 256 weights of a row is read once into gguf_blocks.h's kq_chunk (int8 q, per-16 s / o)
 * and then dotted with every input row of the batch (up to KQ_MAX_ROWS), so the unpacking is shared by
 * the batch: a batch of many decode rows reads each weight once per call, as one row does. Each row keeps
 * a vector of partial sums across the chunks (one horizontal sum per output), and a row's short last
 * chunk (K = 576: 64 weights) stops at its last 64 weights. Integer dots by what the build has (cpu_caps.kernel_cflags):
 *   AVX512-VNNI  VPDPBUSD on |q| (u8) x qx with q's sign, 4 sub-blocks a 64-byte step;
 *   AVX512BW     VPMADDUBSW + VPMADDWD on the same operands;
 *   AVX2         VPSIGNB / VPMADDUBSW / VPMADDWD, 2 sub-blocks a 32-byte step;
 *   plain C      int32 sums.
 * Work split: output rows over the OpenMP threads (static ranges).
 */
#include "common.h"
#include "gguf_blocks.h"
#include "gguf_q8_act.h"
#include "kernels.h"

#define KQ_MAX_ROWS 256 /* rows of x per call */

/* the chunk's dots with one quantized input row qx [256], dx / sx [16], over the chunk's first `ng` groups
 * of 64 weights (4 sub-blocks each; a short last chunk has fewer), added to the row's partial sums */
#if defined(__AVX512BW__)
typedef __m512 kq_acc;
static inline kq_acc kq_acc_zero(void) { return _mm512_setzero_ps(); }
static inline float kq_acc_sum(kq_acc a) { return _mm512_reduce_add_ps(a); }

/* the chunk's weights as the dots take them, once per chunk for every input row: |q| (u8), q's signs, and
 * the per-16 scales spread over the 4 int32 lanes of their sub-block */
typedef struct {
    __m512i wa[4];
    __mmask64 neg[4];
    __m512 s[4], o;
} kq_prep;

static inline void kq_prepare(const kq_chunk *c, int ng, kq_prep *p) {
    const __m512 s = _mm512_loadu_ps(c->s);
    p->o = _mm512_loadu_ps(c->o);
    for (int i = 0; i < ng; i++) {
        const __m512i w = _mm512_loadu_si512(c->q + 64 * i);
        const __m512i idx = _mm512_set_epi32(4 * i + 3, 4 * i + 3, 4 * i + 3, 4 * i + 3, 4 * i + 2, 4 * i + 2, 4 * i + 2,
                                             4 * i + 2, 4 * i + 1, 4 * i + 1, 4 * i + 1, 4 * i + 1, 4 * i, 4 * i, 4 * i, 4 * i);
        p->wa[i] = _mm512_abs_epi8(w);
        p->neg[i] = _mm512_movepi8_mask(w);
        p->s[i] = _mm512_permutexvar_ps(idx, s);
    }
}

static inline kq_acc kq_dot(const kq_prep *p, const int8_t *qx, const float *dx, const float *sx, int ng, kq_acc acc) {
    const __m512 d = _mm512_loadu_ps(dx);
    acc = _mm512_fmadd_ps(p->o, _mm512_loadu_ps(sx), acc);
    for (int i = 0; i < ng; i++) { /* sub-blocks 4i .. 4i + 3: lanes 4 (k - 4i) .. */
        const __m512i y = _mm512_loadu_si512(qx + 64 * i);
        const __m512i ys = _mm512_mask_sub_epi8(y, p->neg[i], _mm512_setzero_si512(), y);
#if defined(__AVX512VNNI__)
        const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), p->wa[i], ys);
#else
        const __m512i isum = _mm512_madd_epi16(_mm512_maddubs_epi16(p->wa[i], ys), _mm512_set1_epi16(1));
#endif
        const __m512i idx = _mm512_set_epi32(4 * i + 3, 4 * i + 3, 4 * i + 3, 4 * i + 3, 4 * i + 2, 4 * i + 2, 4 * i + 2,
                                             4 * i + 2, 4 * i + 1, 4 * i + 1, 4 * i + 1, 4 * i + 1, 4 * i, 4 * i, 4 * i, 4 * i);
        const __m512 sc = _mm512_mul_ps(p->s[i], _mm512_permutexvar_ps(idx, d));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc);
    }
    return acc;
}
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 kq_acc;
typedef struct { const kq_chunk *c; } kq_prep;
static inline kq_acc kq_acc_zero(void) { return _mm256_setzero_ps(); }
static inline float kq_acc_sum(kq_acc a) { return hsum256(a); }
static inline void kq_prepare(const kq_chunk *c, int ng, kq_prep *p) { (void)ng; p->c = c; }

static inline kq_acc kq_dot(const kq_prep *p, const int8_t *qx, const float *dx, const float *sx, int ng, kq_acc acc) {
    const kq_chunk *c = p->c;
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(c->o), _mm256_loadu_ps(sx), acc);
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(c->o + 8), _mm256_loadu_ps(sx + 8), acc);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < 2 * ng; i++) { /* sub-blocks 2i (lanes 0-3), 2i + 1 (lanes 4-7) */
        const __m256i w = _mm256_loadu_si256((const __m256i *)(c->q + 32 * i));
        const __m256i y = _mm256_loadu_si256((const __m256i *)(qx + 32 * i));
        const __m256i isum = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(y, w)), ones);
        const __m256 sc = _mm256_set_m128(_mm_set1_ps(c->s[2 * i + 1] * dx[2 * i + 1]), _mm_set1_ps(c->s[2 * i] * dx[2 * i]));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), sc, acc);
    }
    return acc;
}
#else
typedef float kq_acc;
typedef struct { const kq_chunk *c; } kq_prep;
static inline kq_acc kq_acc_zero(void) { return 0.f; }
static inline float kq_acc_sum(kq_acc a) { return a; }
static inline void kq_prepare(const kq_chunk *c, int ng, kq_prep *p) { (void)ng; p->c = c; }

static inline kq_acc kq_dot(const kq_prep *p, const int8_t *qx, const float *dx, const float *sx, int ng, kq_acc acc) {
    const kq_chunk *c = p->c;
    for (int k = 0; k < 4 * ng; k++) {
        int32_t isum = 0;
        for (int j = 16 * k; j < 16 * k + 16; j++) isum += (int32_t)c->q[j] * qx[j];
        acc += (float)isum * (c->s[k] * dx[k]) + c->o[k] * sx[k];
    }
    return acc;
}
#endif

/* out [M, N] (bf16 when out_bf16, else float32) = x [M, K] (bf16 when x_bf16) @ W.T, W: N rows of GGUF blocks
 * of ggml type `type` (gguf_blocks.h), each K / QK * bytes long. -1: refused (a type not read here, K not
 * a multiple of the block length, M outside 1 .. KQ_MAX_ROWS); -2: out of memory. */
int gguf_kq_gemv(const void *x, int x_bf16, const uint8_t *w, int64_t type, void *out, int out_bf16, int64_t M,
                 int64_t K, int64_t N) {
    const int qk = gguf_block_len(type);
    if (!qk || K < qk || K % qk || M < 1 || M > KQ_MAX_ROWS || N < 1) return -1;
    kq_act a;
    if (kq_quantize(x, x_bf16, M, K, qk == KQ_CHUNK ? KQ_CHUNK : 32, gguf_has_mins(type), &a)) return -2;
    const int64_t row_bytes = K / qk * gguf_block_bytes(type), nc = a.kp / KQ_CHUNK;
    int rc = 0;
#pragma omp parallel
    {
        kq_acc *acc = (kq_acc *)aligned_alloc(64, ((size_t)M * sizeof(kq_acc) + 63) / 64 * 64);
        if (!acc) {
#pragma omp atomic write
            rc = -2;
        }
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            if (!acc) continue;
            kq_chunk c;
            kq_prep p;
            const uint8_t *row = w + n * row_bytes;
            for (int64_t m = 0; m < M; m++) acc[m] = kq_acc_zero();
            for (int64_t ci = 0; ci < nc; ci++) {
                const int64_t left = K - ci * KQ_CHUNK;
                const int ng = left >= KQ_CHUNK ? 4 : (int)((left + 63) / 64);
                kq_read_chunk(row, type, K, ci, &c);
                kq_prepare(&c, ng, &p);
                for (int64_t m = 0; m < M; m++) {
                    const int64_t o = m * a.kp + ci * KQ_CHUNK;
                    acc[m] = kq_dot(&p, a.qx + o, a.dx + o / 16, a.sx + o / 16, ng, acc[m]);
                }
            }
            for (int64_t m = 0; m < M; m++) {
                const float v = kq_acc_sum(acc[m]);
                if (out_bf16)
                    ((uint16_t *)out)[m * N + n] = f32_to_bf16(v);
                else
                    ((float *)out)[m * N + n] = v;
            }
        }
        free(acc);
    }
    free(a.qx);
    return rc;
}
