/*
 * The portable extend attention body, instantiated once per element type by extend_portable.c
 * (define ELEM, SUFFIX, TO_F32, FROM_F32, then include). Float32 math in loops the compiler
 * vectorises for the target (AVX-512F, AVX2, NEON); exp through common.h's softmax_numerators.
 *
 * Same contract as extend_causal_bf16 (extend_attention.c): q [T, *] rows with H heads of D at
 * q + t * q_stride, k / v rows with Hkv heads at k + t * k_stride / v + t * v_stride; out [T, H, D]
 * contiguous; request r covers rows starts[r] .. starts[r] + lens[r] - 1 and, when prefix_lens is not
 * NULL, first attends to its positions 0 .. prefix_lens[r] - 1 read in place from k_pool / v_pool
 * [Hkv, N, D] at slots req_to_token[req_rows[r] * rt_stride + pos]. New token i sees positions
 * 0 .. prefix_lens[r] + i. Any D <= 256 and H % Hkv == 0 (else -1); -2 when memory runs out.
 *
 * Per task (request, KV head, block of QB queries): the keys the block can see are converted once to
 * float32, K transposed [D][n] so a query's scores are D axpys over contiguous keys, V row-major
 * [n][D] so P.V is L axpys over contiguous dims.
 */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

int CAT(extend_causal_, SUFFIX)(const ELEM *q, int64_t q_stride, const ELEM *k, int64_t k_stride, const ELEM *v,
                                int64_t v_stride, const int64_t *starts, const int64_t *lens, int64_t R, int64_t H,
                                int64_t Hkv, int64_t D, float scale, ELEM *out, const ELEM *k_pool,
                                const ELEM *v_pool, int64_t N, const int64_t *req_to_token, int64_t rt_stride,
                                const int64_t *req_rows, const int64_t *prefix_lens) {
    if (D > 256 || H % Hkv != 0) return -1;
    const int64_t G = H / Hkv, QB = 64;
    int64_t *task_off = extend_task_offsets(lens, R, Hkv, QB);
    if (!task_off) return -2;
    const int64_t n_tasks = task_off[R];
    int err = 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < n_tasks; task++) {
        const int64_t r = extend_task_request(task_off, R, task);
        const int64_t local = task - task_off[r], h = local % Hkv, i0 = local / Hkv * QB, s = starts[r];
        const int64_t i1 = i0 + QB < lens[r] ? i0 + QB : lens[r];
        const int64_t p = prefix_lens ? prefix_lens[r] : 0, n = p + i1; /* n: keys this block sees */
        const int64_t *slot = prefix_lens ? req_to_token + req_rows[r] * rt_stride : NULL;
        float *kt = (float *)malloc(sizeof(float) * (size_t)(D * n)); /* [D][n] */
        float *vf = (float *)malloc(sizeof(float) * (size_t)(n * D)); /* [n][D] */
        float *sc = (float *)malloc(sizeof(float) * (size_t)n);
        if (!kt || !vf || !sc) {
            err = -2;
            free(kt), free(vf), free(sc);
            continue;
        }
        for (int64_t l = 0; l < n; l++) {
            const ELEM *kr = l < p ? k_pool + (h * N + slot[l]) * D : k + (s + l - p) * k_stride + h * D;
            const ELEM *vr = l < p ? v_pool + (h * N + slot[l]) * D : v + (s + l - p) * v_stride + h * D;
            for (int64_t d = 0; d < D; d++) kt[d * n + l] = TO_F32(kr[d]);
            for (int64_t d = 0; d < D; d++) vf[l * D + d] = TO_F32(vr[d]);
        }
        for (int64_t i = i0; i < i1; i++) {
            const int64_t L = p + i + 1;
            for (int64_t g = 0; g < G; g++) {
                const ELEM *qr = q + (s + i) * q_stride + (h * G + g) * D;
                for (int64_t l = 0; l < L; l++) sc[l] = 0.f;
                for (int64_t d = 0; d < D; d++) {
                    const float qd = TO_F32(qr[d]) * scale;
                    const float *kd = kt + d * n;
#pragma omp simd
                    for (int64_t l = 0; l < L; l++) sc[l] += qd * kd[l];
                }
                const float inv = 1.f / softmax_numerators(sc, L);
                float acc[256];
                for (int64_t d = 0; d < D; d++) acc[d] = 0.f;
                for (int64_t l = 0; l < L; l++) {
                    const float pl = sc[l];
                    const float *vr = vf + l * D;
#pragma omp simd
                    for (int64_t d = 0; d < D; d++) acc[d] += pl * vr[d];
                }
                ELEM *o = out + ((s + i) * H + h * G + g) * D;
                for (int64_t d = 0; d < D; d++) o[d] = FROM_F32(acc[d] * inv);
            }
        }
        free(kt), free(vf), free(sc);
    }
    free(task_off);
    return err;
}
#undef CAT
#undef CAT_
