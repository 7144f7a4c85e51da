/*
 * Paged decode attention for CPU, reading K/V straight from the pool, in bf16 and float32.
 *
 * The torch path gathers every request's K/V into a padded block (a full copy of the cache each
 * layer) and then runs SDPA over it; this kernel reads each cached row once, in place. The body is
 * decode_impl.h, instantiated here for bf16 (paged_decode_bf16: VDPBF16PS dots with AVX512-BF16,
 * else bf16 -> float32 FMAs) and float32 (paged_decode_f32). Shapes and limits: decode_impl.h.
 */
#include <stdlib.h>

#include "common.h"
#include "kernels.h"

static inline float f32_id(float x) { return x; }

#define ELEM uint16_t
#define SUFFIX bf16
#define TO_F32 bf16_to_f32
#define FROM_F32 f32_to_bf16
#define LOAD16 load16_bf16
#define ELEM_IS_BF16 1
#include "decode_impl.h"
#undef ELEM
#undef SUFFIX
#undef TO_F32
#undef FROM_F32
#undef LOAD16
#undef ELEM_IS_BF16

#define ELEM float
#define SUFFIX f32
#define TO_F32 f32_id
#define FROM_F32 f32_id
#define LOAD16 _mm512_loadu_ps
#define ELEM_IS_BF16 0
#include "decode_impl.h"
