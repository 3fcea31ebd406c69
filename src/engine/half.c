/*
 * float16 / bfloat16 models computed in float32. Right after parsing, mts__lower_half rewrites
 * a model so that no kernel ever sees a 16-bit float: initializers and tensor attributes
 * (Constant, ConstantOfShape) of those types are stored as float, and a CastLike whose `like`
 * input is declared float16/bfloat16 becomes a Cast to that type. Cast to float16/bfloat16
 * (kernels/ref_math.c) produces float values rounded to the narrow type's precision, so every
 * intermediate a model declares float16 is a float holding a float16 value. Graph inputs and
 * outputs keep their declared types (what `mtserve inspect` and the KServe metadata report):
 * mts_ctx_run converts 16-bit inputs to float on entry and float results back to the declared
 * type on exit with the conversions below.
 */
#include <string.h>

#include "engine/model.h"

/* Converts n 16-bit values of type dt into floats. */
void mts__half_to_f32(mts_dtype dt, const uint16_t *src, float *dst, int64_t n)
{
    if (dt == MTS_DTYPE_BFLOAT16)
        for (int64_t i = 0; i < n; i++) dst[i] = mts_bf16_to_f32(src[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = mts_f16_to_f32(src[i]);
}

/* Converts n floats into 16-bit values of type dt (round to nearest even). */
void mts__f32_to_half(mts_dtype dt, const float *src, uint16_t *dst, int64_t n)
{
    if (dt == MTS_DTYPE_BFLOAT16) mts_f32_to_bf16_n(src, dst, n);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = mts_f32_to_f16(src[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

__attribute__((target("avx512f"))) static int64_t round_f16_avx512(const float *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
    }
    return i;
}

__attribute__((target("avx,f16c"))) static int64_t round_f16_f16c(const float *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    return i;
}

/* The widest conversion instructions this CPU has: 2 AVX-512, 1 F16C, 0 none. */
static int f16_isa(void)
{
    static int isa = -1;
    int v = __atomic_load_n(&isa, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        /* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c" */
        unsigned a = 0, b = 0, c = 0, d = 0;
        bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
        v = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx") && f16c ? 1 : 0;
        __atomic_store_n(&isa, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

/* Rounds n floats to float16 / bfloat16 precision (the values a Cast to that type holds). The
 * hardware conversions round to nearest even and keep infinities and NaNs (quieted, top payload
 * bits kept) exactly as mts_f32_to_f16 does. */
void mts_round_half(mts_dtype dt, const float *src, float *dst, int64_t n)
{
    int64_t i = 0;
    if (dt == MTS_DTYPE_BFLOAT16) {
        for (; i < n; i++) dst[i] = mts_bf16_to_f32(mts_f32_to_bf16(src[i]));
        return;
    }
#if defined(__x86_64__) && defined(__GNUC__)
    int isa = f16_isa();
    if (isa == 2) i = round_f16_avx512(src, dst, n);
    else if (isa == 1) i = round_f16_f16c(src, dst, n);
#endif
    for (; i < n; i++) dst[i] = mts_f16_to_f32(mts_f32_to_f16(src[i]));
}

/* Replaces *t (a 16-bit float tensor) by a float copy allocated from the model's pool. */
static int widen(mts_model *m, const char *file, mts_tensor *t, const char *what, mts_err *err)
{
    int64_t n = mts_tensor_numel(t);
    if (n < 0) return mts_err_set(err, MTS_EFORMAT, "%s: tensor '%s' has an invalid shape", file, what);
    if (n > (int64_t)(SIZE_MAX / 8)) return mts_err_set(err, MTS_ELIMIT, "%s: tensor '%s' is too large", file, what);
    float *f = mts_pool_alloc(&m->pool, (size_t)(n ? n : 1) * sizeof(float));
    if (!f) return mts_err_set(err, MTS_ENOMEM, "out of memory widening tensor '%s' to float", what);
    if (n) mts__half_to_f32(t->dtype, t->data, f, n);
    t->data = f;
    t->dtype = MTS_DTYPE_FLOAT;
    return MTS_OK;
}

int mts__lower_half(mts_model *m, const char *file, mts_err *err)
{
    int rc;
    /* CastLike first, while initializers still carry their declared type. */
    for (int i = 0; i < m->n_nodes; i++) {
        mts_node *n = &m->nodes[i];
        if (n->domain[0] || strcmp(n->op_type, "CastLike") != 0 || n->n_in != 2 || n->in[1] < 0) continue;
        mts_dtype like = m->values[n->in[1]].dtype;
        if (!mts_dtype_is_half(like)) continue;
        mts_attr *a = mts_pool_calloc(&m->pool, (size_t)n->n_attr + 2, sizeof *a);
        if (!a) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        if (n->n_attr) memcpy(a, n->attrs, sizeof *a * (size_t)n->n_attr);
        a[n->n_attr].name = "to";
        a[n->n_attr].type = MTS_ATTR_INT;
        a[n->n_attr].i = like;
        n->attrs = a;
        n->n_attr++;
        n->op_type = "Cast";
        n->n_in = 1;
    }
    for (int v = 0; v < m->n_values; v++) {
        mts_value *val = &m->values[v];
        if (val->kind != MTS_VALUE_INITIALIZER || !mts_dtype_is_half(val->init.dtype)) continue;
        const void *old = val->init.data;
        if ((rc = widen(m, file, &val->init, val->name, err))) return rc;
        val->dtype = MTS_DTYPE_FLOAT;
        /* A misaligned initializer was copied out of the mapping; the float copy replaces it,
         * so the copy is no longer the value's data to release and restore. */
        for (int c = 0; c < m->n_copies; c++)
            if (m->copies[c].value == v && m->copies[c].data == old) m->copies[c].value = -1;
    }
    for (int i = 0; i < m->n_nodes; i++) {
        mts_node *n = &m->nodes[i];
        for (int a = 0; a < n->n_attr; a++) {
            mts_attr *at = &n->attrs[a];
            if (at->type != MTS_ATTR_TENSOR || !at->t || !mts_dtype_is_half(at->t->dtype)) continue;
            mts_tensor *t = mts_pool_alloc(&m->pool, sizeof *t);
            if (!t) return mts_err_set(err, MTS_ENOMEM, "out of memory");
            *t = *at->t;
            if ((rc = widen(m, file, t, at->name, err))) return rc;
            at->t = t;
        }
    }
    return MTS_OK;
}
