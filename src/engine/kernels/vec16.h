/*
 * The 16-float vectors of the engine's own vector kernels (fast.c, fast_attn.c, fast_sgemm.c,
 * dwsep.c, ref_rnn.c), written in GCC's vector extensions: the types, unaligned loads and
 * stores, and MTS_VEC_CLONES, the attribute that builds a function's AVX-512, AVX2 and portable
 * variants, chosen when the program loads.
 *
 * The ASan build keeps the clones: it must run the code the release build runs. The TSan build
 * compiles the portable ("default") variant only: an ifunc resolver runs while the program is
 * relocated, before the TSan runtime is up, and its instrumented entry crashes there. That
 * variant is the same source; what TSan checks (data shared between threads) does not depend on
 * the vector width.
 */
#ifndef MTS_ENGINE_VEC16_H
#define MTS_ENGINE_VEC16_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define MTS_VEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MTS_VEC_CLONES
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) v16f ld16(const float *p)
{
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void st16(float *p, v16f v)
{
    memcpy(p, &v, sizeof v);
}

#endif
