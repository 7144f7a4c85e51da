/*
 * Extend attention for any CPU: the portable body (extend_impl.h) for bf16 (used where AVX512-BF16
 * is missing: extend_causal_portable_bf16) and float32 (extend_causal_f32, every CPU).
 */
#include <stdlib.h>

#include "common.h"
#include "kernels.h"

static inline float f32_same(float x) { return x; }

#define ELEM uint16_t
#define SUFFIX portable_bf16
#define TO_F32 bf16_to_f32
#define FROM_F32 f32_to_bf16
#include "extend_impl.h"
#undef ELEM
#undef SUFFIX
#undef TO_F32
#undef FROM_F32

#define ELEM float
#define SUFFIX f32
#define TO_F32 f32_same
#define FROM_F32 f32_same
#include "extend_impl.h"
