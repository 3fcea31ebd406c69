/*
 * The element-wise post-ops of the engine's own convolution kernels (dwsep.c, bfconv.c) on 16
 * floats at a time and on one: Relu / LeakyRelu, Clip and a scalar affine step (mts_dpost; the
 * residual Add is the kernels' own, it needs their layouts). GCC vector extensions; the callers
 * inline them into their AVX-512 / AVX2 clones or target functions.
 */
#ifndef MTS_ENGINE_DPOST16_H
#define MTS_ENGINE_DPOST16_H

#include "engine/kernels/dnnl_ops.h"
#include "engine/kernels/vec16.h"

/* max / min lane by lane: a vector compare and a bitwise select (per-lane loops were left
 * scalar by the vectorizer here). */
static inline __attribute__((always_inline)) v16f vsel16(v16i m, v16f a, v16f b)
{
    v16i ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    ai = (ai & m) | (bi & ~m);
    memcpy(&a, &ai, sizeof a);
    return a;
}

static inline __attribute__((always_inline)) v16f vmax16(v16f a, v16f b)
{
    return vsel16(b > a, b, a);
}

static inline __attribute__((always_inline)) v16f vmin16(v16f a, v16f b)
{
    return vsel16(b < a, b, a);
}

/* One post-op on 16 values (not MTS_DPOST_ADD). Relu with slope a: max(x, 0) + a min(x, 0). */
static inline __attribute__((always_inline)) v16f post16(v16f x, const mts_dpost *p)
{
    const v16f z = {0};
    if (p->kind == MTS_DPOST_RELU) return vmax16(x, z) + vmin16(x, z) * p->alpha;
    if (p->kind == MTS_DPOST_CLIP) return vmin16(vmax16(x, z + p->alpha), z + p->beta);
    if (p->kind == MTS_DPOST_LINEAR) return x * p->alpha + p->beta;
    return x;
}

static inline __attribute__((always_inline)) float post1(float x, const mts_dpost *p)
{
    switch (p->kind) {
    case MTS_DPOST_RELU: return x < 0.0f ? x * p->alpha : x;
    case MTS_DPOST_CLIP: return x < p->alpha ? p->alpha : x > p->beta ? p->beta : x;
    case MTS_DPOST_LINEAR: return x * p->alpha + p->beta;
    default: return x;
    }
}

#endif
