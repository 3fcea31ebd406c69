/*
 * oneDNN convolutions: Conv and ConvTranspose primitives with fused post-ops, built once per
 * plan and run by any number of contexts at once; also int8 convolutions (spec.q8: u8/s8
 * source and destination, s8 weights, int32 bias, per-channel output scales, run-time zero
 * points).
 *
 * Source and destination use the plain layouts the planner chose (NCHW or NHWC; 1-D convs run
 * as 2-D with H = 1, 3-D convs are NCDHW only); the weights use format_tag::any so oneDNN picks
 * its blocked layout, and are reordered into it once per model (the packed copy is kept in a
 * model-level cache keyed by node and layout, so plans for other batch sizes share it). When
 * oneDNN's choice for the requested source layout is a slow generic implementation, the
 * source is converted to NHWC inside the step (into the context's scratch memory) first.
 * Scratchpads are user-managed: the context supplies the memory, so a primitive never
 * allocates at run time and concurrent executions never share state.
 *
 * Threading: libdnnl in Debian runs on OpenMP (loaded at run time with passive waiting, see
 * dnnl_rt.h). oneDNN fixes a primitive's team size when it is created, so a conv keeps one
 * primitive per intra-op thread count (made on first use); mts_dnnl_set_threads sets the calling
 * thread's own team size (omp_set_num_threads affects only the calling thread's ICVs). Contexts
 * of one thread never start an OpenMP team.
 */
#include <limits.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "engine/kernels/dnnl_ops.h"
#include "engine/kernels/dnnl_rt.h"
#include "engine/kernels/bfconv.h"
#include "engine/kernels/dwsep.h"
#include "engine/kernels/fast_sgemm.h"

#define MTS_EINTERNAL MTS_EUNAVAILABLE
#define N_EDGES (2 + MTS_DPOST_MAX)

static dnnl_engine_t g_eng;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void eng_init(void)
{
    if (!mts_dnnl_load()) return;
    if (mts_dnnl.dnnl_engine_create(&g_eng, dnnl_cpu, 0) != dnnl_success) g_eng = NULL;
    mts_dnnl.dnnl_set_primitive_cache_capacity(0); /* primitives live in plans; no global cache needed */
}

static dnnl_engine_t eng(void)
{
    pthread_once(&g_once, eng_init);
    return g_eng;
}

void mts_dnnl_set_threads(int threads)
{
    if (eng()) mts_dnnl.omp_set_num_threads(threads > 0 ? threads : 1);
}

/* ------------------------------------------------------------------------------------------ */
/* Packed-weight cache                                                                          */

typedef struct wcache {
    struct wcache *next;
    int key;
    bool transpose;
    dnnl_memory_desc_t md;
    void *data;
    size_t bytes;
} wcache;

void mts_dnnl_cache_free(void *cache)
{
    wcache *e = cache;
    while (e) {
        wcache *n = e->next;
        free(e->data);
        free(e);
        e = n;
    }
}

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* the weight caches */

int64_t mts_dnnl_cache_bytes(const void *cache)
{
    int64_t b = 0;
    pthread_mutex_lock(&g_lock); /* variants add to the cache at run time */
    for (const wcache *e = cache; e; e = e->next) b += (int64_t)e->bytes + (int64_t)sizeof *e;
    pthread_mutex_unlock(&g_lock);
    return b;
}

/* What a primitive holds beyond the bytes anyone reports: oneDNN's JIT code, the primitive and
 * its descriptor, the kernel's tables. oneDNN has no query for it (scratchpads are queried and
 * supplied by the contexts, packed weights are in this cache), so it is charged as a constant
 * per primitive kept, measured as the growth of anonymous RSS beyond the accounted bytes when
 * models with many primitives are loaded and run once (scripts/bench-memory.py --probe:
 * mobilenetv3, 130 primitives). MTS_DNNL_PRIM_BYTES overrides it. */
#define PRIM_KEY INT_MIN /* never a node key: those are >= 0, phases -(16 key + i) - 1 */
#define PRIM_BYTES_DEFAULT ((size_t)64 << 10)

static size_t g_prim_bytes = PRIM_BYTES_DEFAULT;
static pthread_once_t g_prim_once = PTHREAD_ONCE_INIT;

static void prim_bytes_init(void)
{
    const char *e = getenv("MTS_DNNL_PRIM_BYTES");
    char *end;
    long long n = e ? strtoll(e, &end, 10) : -1;
    if (e && *e && !*end && n >= 0 && n < (1LL << 30)) g_prim_bytes = (size_t)n;
}

static size_t prim_bytes(void)
{
    pthread_once(&g_prim_once, prim_bytes_init);
    return g_prim_bytes;
}

/* Charges n more primitives to the model whose cache this is (g_lock held): one node with key
 * PRIM_KEY and no data carries the charge, so the model's bytes (mts_dnnl_cache_bytes) and the
 * server's budget see it. Charges stay until the model is freed (plans live as long). */
static void charge_prims(void **cache, int n)
{
    wcache *q = *(wcache **)cache;
    while (q && q->key != PRIM_KEY) q = q->next;
    if (!q) {
        if (!(q = calloc(1, sizeof *q))) return;
        q->key = PRIM_KEY;
        q->next = *(wcache **)cache;
        *(wcache **)cache = q;
    }
    q->bytes += (size_t)n * prim_bytes();
}

/* ------------------------------------------------------------------------------------------ */

static int dnnl_err(mts_err *err, dnnl_status_t st, const char *what)
{
    return mts_err_set(err, st == dnnl_unimplemented ? MTS_EUNSUPPORTED : MTS_EINTERNAL, "oneDNN %s failed (status %d)",
                       what, (int)st);
}

#define DN(call, what)                                                                                                \
    do {                                                                                                              \
        dnnl_status_t st_ = (call);                                                                                   \
        if (st_ != dnnl_success) {                                                                                    \
            rc = dnnl_err(err, st_, what);                                                                            \
            goto done;                                                                                                \
        }                                                                                                             \
    } while (0)

static atomic_llong g_q8_created, g_q8_act_created, g_wino_created;

int64_t mts_dconv_wino_created(void)
{
    return (int64_t)atomic_load(&g_wino_created);
}

int64_t mts_dconv_q8_created(void)
{
    return (int64_t)atomic_load(&g_q8_created);
}

int64_t mts_dconv_q8_act_created(void)
{
    return (int64_t)atomic_load(&g_q8_act_created);
}

/* oneDNN's type for an int8 convolution's tensor of element type t (undef: none). */
static dnnl_data_type_t q8_dt(mts_dtype t)
{
    return t == MTS_DTYPE_UINT8 ? dnnl_u8 : t == MTS_DTYPE_INT8 ? dnnl_s8 : t == MTS_DTYPE_INT32 ? dnnl_s32
                                                                                             : dnnl_data_type_undef;
}

static bool good_impl(const char *s)
{
    return strstr(s, "ref") == NULL && strstr(s, "gemm") == NULL;
}

static void act_md(dnnl_memory_desc_t *md, const mts_conv_geom *g, int64_t ch, const int64_t *sp, bool nhwc,
                   dnnl_data_type_t dt)
{
    if (g->nsp == 0) { /* matmul: [rows, ch] */
        dnnl_dims_t d = {g->N, ch};
        mts_dnnl.dnnl_memory_desc_init_by_tag(md, 2, d, dt, dnnl_ab);
        return;
    }
    if (g->nsp == 3) {
        dnnl_dims_t d = {g->N, ch, sp[0], sp[1], sp[2]};
        mts_dnnl.dnnl_memory_desc_init_by_tag(md, 5, d, dt, nhwc ? dnnl_ndhwc : dnnl_ncdhw);
    } else {
        dnnl_dims_t d = {g->N, ch, sp[1], sp[2]};
        mts_dnnl.dnnl_memory_desc_init_by_tag(md, 4, d, dt, nhwc ? dnnl_nhwc : dnnl_nchw);
    }
}

/* Builds the (de)convolution primitive descriptor for a given source layout. */
static dnnl_status_t make_pd(const mts_dconv_spec *s, bool wino, dnnl_primitive_attr_t attr, dnnl_primitive_desc_t *pd,
                             dnnl_memory_desc_t *src_md, dnnl_memory_desc_t *dst_md)
{
    const mts_conv_geom *g = &s->g;
    const void *bias = s->q8 ? (const void *)s->qbias : (const void *)s->b;
    dnnl_data_type_t wdt = s->q8 ? dnnl_s8 : s->bf16 ? dnnl_bf16 : dnnl_f32, bdt = s->q8 ? dnnl_s32 : dnnl_f32;
    if (s->kind == MTS_DPRIM_MATMUL) {
        dnnl_memory_desc_t w_md, b_md;
        dnnl_dims_t wd = {g->C, g->M}, bd = {1, g->M};
        mts_dnnl.dnnl_memory_desc_init_by_tag(&w_md, 2, wd, s->bf16 ? dnnl_bf16 : dnnl_f32, dnnl_format_tag_any);
        mts_dnnl.dnnl_memory_desc_init_by_tag(&b_md, 2, bd, dnnl_f32, dnnl_ab);
        dnnl_matmul_desc_t md;
        dnnl_status_t st = mts_dnnl.dnnl_matmul_desc_init(&md, src_md, &w_md, s->b ? &b_md : NULL, dst_md);
        if (st != dnnl_success) return st;
        return mts_dnnl.dnnl_primitive_desc_create(pd, &md, attr, eng(), NULL);
    }
    int sd = g->nsp == 3 ? 3 : 2, o = 3 - sd; /* first used index in the normalized arrays */
    dnnl_memory_desc_t w_md, b_md;
    dnnl_dims_t wd, strides, dil, pl, pr;
    int wn;
    if (g->group == 1) {
        wn = 2 + sd;
        wd[0] = g->M, wd[1] = g->C;
        for (int i = 0; i < sd; i++) wd[2 + i] = g->k[o + i];
    } else {
        wn = 3 + sd;
        wd[0] = g->group, wd[1] = g->M / g->group, wd[2] = g->C / g->group;
        for (int i = 0; i < sd; i++) wd[3 + i] = g->k[o + i];
    }
    mts_dnnl.dnnl_memory_desc_init_by_tag(&w_md, wn, wd, wdt, dnnl_format_tag_any);
    dnnl_dims_t bd = {g->M};
    mts_dnnl.dnnl_memory_desc_init_by_tag(&b_md, 1, bd, bdt, dnnl_x);
    for (int i = 0; i < sd; i++) {
        strides[i] = g->s[o + i];
        dil[i] = g->d[o + i] - 1;
        pl[i] = g->pb[o + i];
        if (!s->transpose) {
            pr[i] = g->pe[o + i];
        } else {
            int64_t ek = (g->k[o + i] - 1) * g->d[o + i] + 1;
            pr[i] = (g->in[o + i] - 1) * g->s[o + i] + ek - g->pb[o + i] - g->out[o + i];
        }
    }
    dnnl_memory_desc_t any_src = *src_md, any_dst = *dst_md;
    union {
        dnnl_convolution_desc_t c;
        dnnl_deconvolution_desc_t d;
        dnnl_pooling_v2_desc_t p;
    } desc;
    dnnl_status_t st;
    if (mts_dprim_is_pool(s->kind)) {
        dnnl_dims_t kern;
        for (int i = 0; i < sd; i++) {
            kern[i] = g->k[o + i];
            int64_t ek = (g->k[o + i] - 1) * g->d[o + i] + 1;
            pr[i] = (g->out[o + i] - 1) * g->s[o + i] + ek - g->in[o + i] - g->pb[o + i];
        }
        dnnl_alg_kind_t alg = s->kind == MTS_DPRIM_POOL_MAX           ? dnnl_pooling_max
                              : s->kind == MTS_DPRIM_POOL_AVG_INCLUDE ? dnnl_pooling_avg_include_padding
                                                                      : dnnl_pooling_avg_exclude_padding;
        st = mts_dnnl.dnnl_pooling_v2_forward_desc_init(&desc.p, dnnl_forward_inference, alg, &any_src, &any_dst,
                                                        strides, kern, dil, pl, pr);
    } else if (!s->transpose)
        st = mts_dnnl.dnnl_dilated_convolution_forward_desc_init(&desc.c, dnnl_forward_inference,
                                                        wino ? dnnl_convolution_winograd : dnnl_convolution_direct,
                                                        &any_src, &w_md, bias ? &b_md : NULL, &any_dst, strides, dil,
                                                        pl, pr);
    else
        st = mts_dnnl.dnnl_dilated_deconvolution_forward_desc_init(&desc.d, dnnl_forward_inference,
                                                          dnnl_deconvolution_direct, &any_src, &w_md,
                                                          s->b ? &b_md : NULL, &any_dst, strides, dil, pl, pr);
    if (st != dnnl_success) return st;
    return mts_dnnl.dnnl_primitive_desc_create(pd, &desc, attr, eng(), NULL);
}

/* Reorders src (md from) into a new buffer of md to. */
static dnnl_status_t reorder_once(const dnnl_memory_desc_t *from, const void *src, const dnnl_memory_desc_t *to,
                                  void *dst)
{
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    dnnl_memory_t a = NULL, b = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_status_t st = mts_dnnl.dnnl_reorder_primitive_desc_create(&rpd, from, eng(), to, eng(), NULL);
    if (st == dnnl_success) st = mts_dnnl.dnnl_primitive_create(&r, rpd);
    if (st == dnnl_success) st = mts_dnnl.dnnl_memory_create(&a, from, eng(), (void *)src);
    if (st == dnnl_success) st = mts_dnnl.dnnl_memory_create(&b, to, eng(), dst);
    if (st == dnnl_success) st = mts_dnnl.dnnl_stream_create(&stream, eng(), dnnl_stream_default_flags);
    if (st == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}};
        st = mts_dnnl.dnnl_primitive_execute(r, stream, 2, args);
        if (st == dnnl_success) st = mts_dnnl.dnnl_stream_wait(stream);
    }
    if (stream) mts_dnnl.dnnl_stream_destroy(stream);
    if (a) mts_dnnl.dnnl_memory_destroy(a);
    if (b) mts_dnnl.dnnl_memory_destroy(b);
    if (r) mts_dnnl.dnnl_primitive_destroy(r);
    if (rpd) mts_dnnl.dnnl_primitive_desc_destroy(rpd);
    return st;
}

/* One thread count's primitive: oneDNN fixes the team size (and the scratchpad size) when a
 * primitive descriptor is created, so each intra-op thread count gets its own, made on first
 * use and kept for the plan's lifetime. */
typedef struct variant {
    dnnl_primitive_t prim;
    dnnl_primitive_t reorder[N_EDGES]; /* per edge: NULL when the user's layout is the primitive's */
    size_t off[N_EDGES];               /* per edge: offset of the converted copy in the scratch memory */
    dnnl_memory_t wmem;                /* packed weights for this primitive's weight layout (shared) */
    dnnl_memory_desc_t scratch_md;
    size_t scratch_bytes, total_scratch;
} variant;

struct mts_dconv {
    mts_dconv_spec spec;               /* w is NULL after creation; b points at model/plan data */
    dnnl_primitive_attr_t attr;
    /* Edges: 0 source, 1 destination, 2.. residuals; user_md: the planner's layout, md: the
     * primitive's (channels-last). */
    dnnl_memory_desc_t user_md[N_EDGES], md[N_EDGES];
    int n_edges;
    int resid_po[MTS_DPOST_MAX];       /* post-op index of each residual */
    dnnl_memory_t bmem;
    wcache *base;                      /* weights packed at creation */
    variant *_Atomic var[MTS_DNNL_MAX_THREADS + 1];
    char impl[64];
    bool bf16;                         /* computes in bf16 (spec.bf16 and a fast bf16 implementation) */
    bool wino;                         /* Winograd algorithm on nChw16c edges (spec.wino) */
    bool sum_resid;                    /* the residual (edge 2) is converted into the destination,
                                        * which a sum post-op adds to (wino_attr) */
    /* ConvTranspose with kernel == stride and no padding: a 1x1 convolution to k*k*M channels
     * (inner, into scratch) followed by a depth-to-space scatter into the destination. */
    struct mts_dconv *inner;
    float *s2d_bias;                   /* owned bias (the 1x1 one for depth-to-space) */
    int32_t *qbias;                    /* owned int32 bias (int8 convolutions) */
    float q8_div;                      /* spec.q8_act: the divisor of the post-op ... */
    int q8_div_po;                     /* ... binary division, at this post-op index */
    int64_t s2d_k[2];
    size_t s2d_tmp;
    /* Nearest upsampling + convolution: one convolution per output phase on the low-resolution
     * source (phase[0..n_phase), each into scratch), then an interleaving scatter. */
    struct mts_dconv *phase[16];
    int n_phase;
    size_t phase_tmp;                  /* bytes of one phase's output */
    /* A MatMul/Gemm with few rows: no primitive, the small-M GEMM (fast_sgemm.c) on weights
     * packed for it in the model's cache. */
    const void *small;
    bool small_half;                   /* small holds IEEE half weights */
    /* A depthwise-separable pair (spec.pw_M > 0): no primitive, the engine's kernel (dwsep.c). */
    mts_dwsep *dwsep;
    /* A bf16 3x3 convolution to 8 channels (mts_bfconv_ok): no primitive, bfconv.c. */
    mts_bfconv *bfc;
};

/* Variant creation for one thread count of a convolution already in use (mts_dconv_prepare): one
 * of a few striped locks, by address, so that contexts preparing different steps (or a plan's
 * steps created in parallel) do not wait for each other's JIT compilation. */
#define VAR_LOCKS 16
static pthread_mutex_t g_var_lock[VAR_LOCKS] = {
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static pthread_mutex_t *var_lock(const void *c)
{
    return &g_var_lock[((uintptr_t)c >> 6) % VAR_LOCKS];
}

static void variant_free(variant *v)
{
    if (!v) return;
    if (v->prim) mts_dnnl.dnnl_primitive_destroy(v->prim);
    for (int i = 0; i < N_EDGES; i++)
        if (v->reorder[i]) mts_dnnl.dnnl_primitive_destroy(v->reorder[i]);
    if (v->wmem) mts_dnnl.dnnl_memory_destroy(v->wmem);
    free(v);
}

/* Packed weights of layout wmd: the creation-time copy, a cached one, or a new reorder of either
 * the user's weights (w != NULL) or the base copy. Caller holds g_lock (the cache is the
 * model's, shared by all its convolutions). */
static int packed_weights(mts_dconv *c, const dnnl_memory_desc_t *wmd, const void *w, wcache **out, mts_err *err)
{
    const mts_dconv_spec *s = &c->spec;
    for (wcache *q = *(wcache **)s->cache; q; q = q->next)
        if (q->key == s->key && q->transpose == s->transpose && mts_dnnl.dnnl_memory_desc_equal(&q->md, wmd)) {
            *out = q;
            return MTS_OK;
        }
    wcache *e = calloc(1, sizeof *e);
    if (!e) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    e->key = s->key;
    e->transpose = s->transpose;
    e->md = *wmd;
    e->bytes = mts_dnnl.dnnl_memory_desc_get_size(wmd);
    e->data = aligned_alloc(64, (e->bytes + 63) / 64 * 64);
    dnnl_memory_desc_t from;
    const void *src;
    if (w) {
        const mts_conv_geom *g = &s->g;
        int wn = wmd->ndims;
        dnnl_format_tag_t tag;
        if (s->kind == MTS_DPRIM_MATMUL)
            tag = s->transpose ? dnnl_ba : dnnl_ab;
        else if (!s->transpose)
            tag = g->group == 1 ? (wn == 4 ? dnnl_oihw : dnnl_oidhw) : (wn == 5 ? dnnl_goihw : dnnl_goidhw);
        else
            tag = g->group == 1 ? (wn == 4 ? dnnl_iohw : dnnl_iodhw) : (wn == 5 ? dnnl_giohw : dnnl_giodhw);
        mts_dnnl.dnnl_memory_desc_init_by_tag(&from, wn, wmd->dims, s->q8 ? dnnl_s8 : dnnl_f32, tag);
        src = w;
    } else {
        from = c->base->md;
        src = c->base->data;
    }
    dnnl_status_t st = dnnl_success;
    if (!e->data || (st = reorder_once(&from, src, wmd, e->data)) != dnnl_success) {
        int rc = e->data ? dnnl_err(err, st, "weight reorder") : mts_err_set(err, MTS_ENOMEM, "out of memory");
        free(e->data);
        free(e);
        return rc;
    }
    e->next = *(wcache **)s->cache;
    *(wcache **)s->cache = e;
    *out = e;
    return MTS_OK;
}

/* Creates the variant for `threads` (the caller excludes other creations for the same c: it is
 * either creating c or holds var_lock(c)). w: the user's weights at creation. */
static int variant_create(mts_dconv *c, int threads, const void *w, variant **out, mts_err *err)
{
    int rc = MTS_OK;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_desc_t src_md, dst_md;
    int saved = mts_dnnl.omp_get_max_threads();
    mts_dnnl.omp_set_num_threads(threads);
    variant *v = calloc(1, sizeof *v);
    if (!v) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto done;
    }
    src_md = c->md[0];
    dst_md = c->md[1];
    dnnl_status_t st = make_pd(&c->spec, c->wino, c->attr, &pd, &src_md, &dst_md);
    const char *impl = "";
    if (st == dnnl_success) mts_dnnl.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    DN(st, mts_dprim_is_pool(c->spec.kind)           ? "pooling"
           : c->spec.kind == MTS_DPRIM_MATMUL        ? "matmul"
           : c->spec.kind == MTS_DPRIM_DECONV        ? "deconvolution"
                                                     : "convolution");
    if (!good_impl(impl) || (c->spec.q8 && !strstr(impl, "vnni") && !strstr(impl, "amx"))) {
        /* int8 without VNNI / AMX: oneDNN's u8 x s8 pairs may saturate 16-bit sums */
        rc = mts_err_set(err, MTS_EUNSUPPORTED, "no fast oneDNN implementation (%s)", impl);
        goto done;
    }
    if (!c->impl[0]) snprintf(c->impl, sizeof c->impl, "%s", impl);
    if (!mts_dprim_is_pool(c->spec.kind)) {
        const dnnl_memory_desc_t *wmd = mts_dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        wcache *wc = NULL;
        pthread_mutex_lock(&g_lock);
        rc = packed_weights(c, wmd, w, &wc, err);
        pthread_mutex_unlock(&g_lock);
        if (rc) goto done;
        if (!c->base) c->base = wc;
        DN(mts_dnnl.dnnl_memory_create(&v->wmem, &wc->md, eng(), wc->data), "weights memory");
    }
    const void *bias = c->spec.q8 ? (const void *)c->spec.qbias : (const void *)c->spec.b;
    if (bias && !c->bmem) {
        const dnnl_memory_desc_t *bmd = mts_dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1);
        DN(mts_dnnl.dnnl_memory_create(&c->bmem, bmd, eng(), (void *)bias), "bias memory");
    }
    const dnnl_memory_desc_t *smd = mts_dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    v->scratch_md = *smd;
    v->scratch_bytes = mts_dnnl.dnnl_memory_desc_get_size(smd);
    v->total_scratch = (v->scratch_bytes + 63) / 64 * 64;
    for (int i = 0; i < c->n_edges; i++) {
        if (mts_dnnl.dnnl_memory_desc_equal(&c->user_md[i], &c->md[i])) continue;
        dnnl_primitive_desc_t rpd;
        bool out_edge = i == 1, into_dst = i >= 2 && c->sum_resid;
        DN(mts_dnnl.dnnl_reorder_primitive_desc_create(&rpd, out_edge ? &c->md[i] : &c->user_md[i], eng(),
                                              out_edge ? &c->user_md[i] : into_dst ? &c->md[1] : &c->md[i], eng(), NULL),
           "layout reorder");
        st = mts_dnnl.dnnl_primitive_create(&v->reorder[i], rpd);
        mts_dnnl.dnnl_primitive_desc_destroy(rpd);
        DN(st, "layout reorder");
        if (into_dst) continue; /* into the destination's buffer */
        v->off[i] = v->total_scratch;
        v->total_scratch += (mts_dnnl.dnnl_memory_desc_get_size(&c->md[i]) + 63) / 64 * 64;
    }
    DN(mts_dnnl.dnnl_primitive_create(&v->prim, pd), "primitive");
    {
        int n = 1;
        for (int i = 0; i < N_EDGES; i++) n += v->reorder[i] != NULL;
        pthread_mutex_lock(&g_lock);
        charge_prims(c->spec.cache, n);
        pthread_mutex_unlock(&g_lock);
    }
done:
    mts_dnnl.omp_set_num_threads(saved);
    if (pd) mts_dnnl.dnnl_primitive_desc_destroy(pd);
    if (rc) {
        variant_free(v);
        return rc;
    }
    *out = v;
    return MTS_OK;
}

static bool s2d_eligible(const mts_dconv_spec *s)
{
    const mts_conv_geom *g = &s->g;
    if (g->group != 1 || g->nsp > 2) return false;
    for (int i = 0; i < s->n_post; i++)
        if (s->post[i].kind == MTS_DPOST_ADD) return false;
    for (int i = 0; i < 3; i++)
        if (g->k[i] != g->s[i] || g->d[i] != 1 || g->pb[i] || g->pe[i] || g->out[i] != g->in[i] * g->s[i])
            return false;
    return g->k[1] * g->k[2] > 1;
}

static int s2d_create(const mts_dconv_spec *s, mts_dconv **out, mts_err *err)
{
    const mts_conv_geom *g = &s->g;
    int64_t kh = g->k[1], kw = g->k[2], kk = kh * kw, C = g->C, M = g->M;
    mts_dconv *c = calloc(1, sizeof *c);
    float *w = malloc(sizeof(float) * (size_t)(kk * M * C));
    float *b = malloc(sizeof(float) * (size_t)(kk * M));
    if (!c || !w || !b) {
        free(c), free(w), free(b);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    /* Inner weights [(i, j, m), c] from ConvTranspose W[c][m][i][j]; bias repeated per tap. */
    for (int64_t ci = 0; ci < C; ci++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t t = 0; t < kk; t++) w[(t * M + m) * C + ci] = s->w[(ci * M + m) * kk + t];
    for (int64_t t = 0; t < kk; t++)
        for (int64_t m = 0; m < M; m++) b[t * M + m] = s->b ? s->b[m] : 0.0f;
    mts_dconv_spec in = *s;
    in.kind = MTS_DPRIM_CONV;
    in.transpose = false;
    in.w = w;
    in.b = b;
    in.dst_nhwc = true;
    in.dst_bf16 = false; /* into fp32 scratch, scattered as floats */
    in.g.M = kk * M;
    for (int i = 0; i < 3; i++) in.g.k[i] = in.g.s[i] = 1, in.g.out[i] = g->in[i];
    int rc = mts_dconv_create(&in, &c->inner, err);
    free(w);
    if (rc) {
        free(b), free(c);
        return rc;
    }
    c->spec = *s;
    c->spec.w = NULL;
    c->s2d_bias = b;
    c->s2d_k[0] = kh, c->s2d_k[1] = kw;
    c->s2d_tmp = (size_t)(g->N * g->in[0] * g->in[1] * g->in[2] * kk * M) * sizeof(float);
    c->bf16 = c->inner->bf16;
    snprintf(c->impl, sizeof c->impl, "%s+d2s", c->inner->impl);
    *out = c;
    return MTS_OK;
}

/* Scatters tmp [N, H, W, (i, j, m)] into dst [N, H*kh, W*kw, M] (NHWC) or [N, M, H*kh, W*kw]. */
static void s2d_scatter(const mts_dconv *c, const float *tmp, float *dst)
{
    const mts_conv_geom *g = &c->spec.g;
    int64_t N = g->N, H = g->in[0] * g->in[1], W = g->in[2], M = g->M, kh = c->s2d_k[0], kw = c->s2d_k[1];
    int64_t OH = H * kh, OW = W * kw;
    if (c->spec.dst_nhwc) {
        for (int64_t n = 0; n < N; n++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t w = 0; w < W; w++) {
                    const float *t = tmp + ((n * H + h) * W + w) * kh * kw * M;
                    for (int64_t i = 0; i < kh; i++)
                        memcpy(dst + ((n * OH + h * kh + i) * OW + w * kw) * M, t + i * kw * M,
                               sizeof(float) * (size_t)(kw * M));
                }
        return;
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++) {
                const float *t = tmp + ((n * H + h) * W + w) * kh * kw * M;
                for (int64_t i = 0; i < kh; i++)
                    for (int64_t j = 0; j < kw; j++)
                        for (int64_t m = 0; m < M; m++)
                            dst[((n * M + m) * OH + h * kh + i) * OW + w * kw + j] = t[(i * kw + j) * M + m];
            }
}

/* Per spatial dim i (1: H, 2: W) and phase p: the first and last source offset d the taps
 * read, d = floor((p + k - pad) / s) for k in [0, K). */
static void up_range(const mts_dconv_spec *s, int i, int64_t p, int64_t *dmin, int64_t *dmax)
{
    int64_t f = s->up[i - 1], K = s->g.k[i];
    int64_t a = p - s->g.pb[i], b = p + K - 1 - s->g.pb[i];
    *dmin = a >= 0 ? a / f : -((-a + f - 1) / f);
    *dmax = b >= 0 ? b / f : -((-b + f - 1) / f);
}

bool mts_dconv_up_ok(const mts_dconv_spec *s)
{
    const mts_conv_geom *g = &s->g;
    if (s->kind != MTS_DPRIM_CONV || s->transpose || g->nsp != 2 || g->group != 1 || s->up[0] < 1 || s->up[1] < 1 ||
        s->up[0] * s->up[1] < 2 || s->up[0] * s->up[1] > 16)
        return false;
    for (int i = 0; i < s->n_post; i++)
        if (s->post[i].kind == MTS_DPOST_ADD) return false;
    for (int i = 1; i < 3; i++) {
        if (g->s[i] != 1 || g->d[i] != 1 || g->out[i] != g->in[i] || g->in[i] % s->up[i - 1]) return false;
        for (int64_t p = 0; p < s->up[i - 1]; p++) {
            int64_t a, b;
            up_range(s, i, p, &a, &b);
            if (a > 0 || b < 0) return false;
        }
    }
    return true;
}

int64_t mts_dconv_up_extra_bytes(const mts_dconv_spec *s)
{
    int64_t taps = 0;
    for (int64_t py = 0; py < s->up[0]; py++)
        for (int64_t px = 0; px < s->up[1]; px++) {
            int64_t h0, h1, w0, w1;
            up_range(s, 1, py, &h0, &h1);
            up_range(s, 2, px, &w0, &w1);
            taps += (h1 - h0 + 1) * (w1 - w0 + 1);
        }
    return (taps - s->g.k[1] * s->g.k[2]) * s->g.M * s->g.C * (int64_t)sizeof(float);
}

static int up_create(const mts_dconv_spec *s, mts_dconv **out, mts_err *err)
{
    const mts_conv_geom *g = &s->g;
    int64_t fh = s->up[0], fw = s->up[1], M = g->M, C = g->C, KH = g->k[1], KW = g->k[2];
    int64_t H = g->in[1] / fh, W = g->in[2] / fw;
    mts_dconv *c = calloc(1, sizeof *c);
    float *w = malloc(sizeof(float) * (size_t)(M * C * KH * KW));
    if (!c || !w) {
        free(c), free(w);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    c->spec = *s;
    c->spec.w = NULL;
    int rc = MTS_OK;
    for (int64_t py = 0; py < fh && !rc; py++)
        for (int64_t px = 0; px < fw && !rc; px++) {
            int64_t h0, h1, w0, w1;
            up_range(s, 1, py, &h0, &h1);
            up_range(s, 2, px, &w0, &w1);
            int64_t th = h1 - h0 + 1, tw = w1 - w0 + 1;
            /* phase weights: the taps that read the same source pixel, summed */
            memset(w, 0, sizeof(float) * (size_t)(M * C * th * tw));
            for (int64_t m = 0; m < M; m++)
                for (int64_t ci = 0; ci < C; ci++)
                    for (int64_t ky = 0; ky < KH; ky++) {
                        int64_t a = py + ky - g->pb[1], dy = (a >= 0 ? a / fh : -((-a + fh - 1) / fh)) - h0;
                        for (int64_t kx = 0; kx < KW; kx++) {
                            int64_t b = px + kx - g->pb[2], dx = (b >= 0 ? b / fw : -((-b + fw - 1) / fw)) - w0;
                            w[((m * C + ci) * th + dy) * tw + dx] += s->w[((m * C + ci) * KH + ky) * KW + kx];
                        }
                    }
            mts_dconv_spec ps = *s;
            ps.up[0] = ps.up[1] = 0;
            ps.w = w;
            ps.dst_nhwc = true;
            /* into scratch, interleaved as floats, or as bf16 when the planner keeps the
             * (channels-last) destination in bf16 for bf16 readers */
            ps.dst_bf16 = s->dst_bf16 && s->dst_nhwc;
            ps.key = -(s->key * 16 + (int)(py * fw + px)) - 1; /* its own packed weights */
            ps.g.in[1] = H, ps.g.in[2] = W;
            ps.g.out[1] = H, ps.g.out[2] = W;
            ps.g.k[1] = th, ps.g.k[2] = tw;
            ps.g.pb[1] = -h0, ps.g.pe[1] = h1;
            ps.g.pb[2] = -w0, ps.g.pe[2] = w1;
            rc = mts_dconv_create(&ps, &c->phase[c->n_phase], err);
            if (!rc) c->n_phase++;
        }
    free(w);
    if (rc) {
        mts_dconv_free(c);
        return rc;
    }
    c->phase_tmp = ((size_t)(g->N * H * W * M) * sizeof(float) + 63) / 64 * 64;
    c->bf16 = c->phase[0]->bf16;
    snprintf(c->impl, sizeof c->impl, "%s+up%lldx%lld", c->phase[0]->impl, (long long)fh, (long long)fw);
    *out = c;
    return MTS_OK;
}

typedef struct up_scatter_job {
    const mts_dconv *c;
    const void *tmp; /* n_phase x [N, H, W, M], each phase at a multiple of phase_tmp bytes */
    void *dst;
} up_scatter_job;

/* Interleaves the phase outputs into dst ([N, H*fh, W*fw, M] or NCHW), by low-res rows. A bf16
 * destination (channels-last only) comes from phases that wrote bf16. */
static void up_scatter_part(void *arg, int ithr, int nthr)
{
    const up_scatter_job *j = arg;
    const mts_dconv *c = j->c;
    const mts_conv_geom *g = &c->spec.g;
    int64_t fh = c->spec.up[0], fw = c->spec.up[1], M = g->M, OH = g->out[1], OW = g->out[2];
    int64_t H = OH / fh, W = OW / fw, rows = g->N * H;
    int64_t lo = rows * ithr / nthr, hi = rows * (ithr + 1) / nthr;
    size_t es = c->spec.dst_bf16 && c->spec.dst_nhwc ? 2 : sizeof(float), px_bytes = (size_t)M * es;
    for (int64_t r = lo; r < hi; r++) {
        int64_t n = r / H, i = r % H;
        for (int64_t py = 0; py < fh; py++)
            for (int64_t px = 0; px < fw; px++) {
                const char *t = (const char *)j->tmp + (size_t)(py * fw + px) * c->phase_tmp + (size_t)(r * W) * px_bytes;
                if (c->spec.dst_nhwc) {
                    char *d = (char *)j->dst + (size_t)((n * OH + i * fh + py) * OW + px) * px_bytes;
                    for (int64_t x = 0; x < W; x++) memcpy(d + (size_t)(x * fw) * px_bytes, t + (size_t)x * px_bytes, px_bytes);
                } else {
                    const float *tf = (const float *)t;
                    for (int64_t m = 0; m < M; m++) {
                        float *d = (float *)j->dst + ((n * M + m) * OH + i * fh + py) * OW + px;
                        for (int64_t x = 0; x < W; x++) d[x * fw] = tf[x * M + m];
                    }
                }
            }
    }
}

/* A fp32 MatMul/Gemm whose source has few rows and whose fused operations the small-M GEMM's
 * epilogue applies runs there (fast_sgemm.c; MTS_NO_FAST=1 keeps it in oneDNN): its weights
 * are packed for it once per model, in the cache beside oneDNN's (a plan at a larger batch
 * size packs its own oneDNN copy). c->small stays NULL when the step does not qualify. */
static int small_create(mts_dconv *c, const mts_dconv_spec *s, mts_err *err)
{
    const mts_conv_geom *g = &s->g;
    if (s->kind != MTS_DPRIM_MATMUL || s->bf16 || s->src_bf16 || s->dst_bf16 || s->src_nhwc || s->dst_nhwc ||
        !s->w || !mts_fast_enabled() || !mts_small_gemm_ok(g->N, g->C, g->M) ||
        !mts_small_gemm_posts_ok(s->post, s->n_post))
        return MTS_OK;
    bool half = s->half_weights && g->N <= MTS_SMALL_GEMM_HALF_ROWS;
    dnnl_memory_desc_t md;
    dnnl_dims_t d = {g->M / 32, g->C, 32};
    /* (tells this copy from oneDNN's, and a half copy from a float one) */
    mts_dnnl.dnnl_memory_desc_init_by_tag(&md, 3, d, half ? dnnl_f16 : dnnl_f32, dnnl_abc);
    int rc = MTS_OK;
    pthread_mutex_lock(&g_lock);
    wcache *q = *(wcache **)s->cache;
    while (q && !(q->key == s->key && q->transpose == s->transpose && mts_dnnl.dnnl_memory_desc_equal(&q->md, &md)))
        q = q->next;
    if (!q) {
        bool fits = true;
        void *data = NULL;
        if (half) data = mts_small_gemm_pack_half(s->w, s->transpose, g->C, g->M, &fits);
        else data = mts_small_gemm_pack(s->w, s->transpose, g->C, g->M);
        if (data && (q = calloc(1, sizeof *q))) {
            q->data = data;
            q->key = s->key;
            q->transpose = s->transpose;
            q->md = md;
            q->bytes = (half ? sizeof(uint16_t) : sizeof(float)) * (size_t)(g->C * g->M);
            q->next = *(wcache **)s->cache;
            *(wcache **)s->cache = q;
        } else if (!fits) {
            half = false; /* a weight beyond half's range: this step keeps float weights */
        } else {
            free(data);
            rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (rc) return rc;
    if (!q) { /* (retry in float) */
        mts_dconv_spec f = *s;
        f.half_weights = false;
        return small_create(c, &f, err);
    }
    c->small = q->data;
    c->small_half = half;
    c->spec.w = NULL;
    snprintf(c->impl, sizeof c->impl, half ? "mts:small_gemm_f16w" : "mts:small_gemm");
    return MTS_OK;
}

/* Appends post-op p (any kind but MTS_DPOST_ADD) as oneDNN eltwise post-ops. */
static dnnl_status_t append_eltwise(dnnl_post_ops_t po, const mts_dpost *p)
{
    dnnl_status_t st;
    switch (p->kind) {
    case MTS_DPOST_RELU: return mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, p->alpha, 0);
    case MTS_DPOST_CLIP: return mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip_v2, p->alpha, p->beta);
    case MTS_DPOST_SIGMOID: return mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_logistic, 0, 0);
    case MTS_DPOST_TANH: return mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_tanh, 0, 0);
    case MTS_DPOST_HARDSWISH: return mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_hardswish, 0, 0);
    case MTS_DPOST_GELU: return mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_gelu_erf, 0, 0);
    case MTS_DPOST_HARDSIGMOID:
        st = mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, p->alpha, p->beta);
        return st != dnnl_success ? st : mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip_v2, 0.0f, 1.0f);
    case MTS_DPOST_LINEAR: return mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, p->alpha, p->beta);
    default: return dnnl_unimplemented;
    }
}

/* The attributes of a Winograd convolution: its kernels take eltwise and sum post-ops but no
 * binary ones, so a residual Add becomes a sum into the destination, which the step fills with
 * the residual first (mts_dconv.sum_resid). At most one residual. */
static dnnl_status_t wino_attr(const mts_dconv_spec *s, dnnl_primitive_attr_t *out)
{
    dnnl_primitive_attr_t a = NULL;
    dnnl_post_ops_t po = NULL;
    int n_add = 0;
    dnnl_status_t st = mts_dnnl.dnnl_primitive_attr_create(&a);
    if (st == dnnl_success) st = mts_dnnl.dnnl_primitive_attr_set_scratchpad_mode(a, dnnl_scratchpad_mode_user);
    if (st == dnnl_success) st = mts_dnnl.dnnl_post_ops_create(&po);
    for (int i = 0; st == dnnl_success && i < s->n_post; i++) {
        if (s->post[i].kind != MTS_DPOST_ADD) st = append_eltwise(po, &s->post[i]);
        else st = ++n_add > 1 ? dnnl_unimplemented : mts_dnnl.dnnl_post_ops_append_sum(po, 1.0f);
    }
    if (st == dnnl_success) st = mts_dnnl.dnnl_primitive_attr_set_post_ops(a, po);
    if (po) mts_dnnl.dnnl_post_ops_destroy(po);
    if (st != dnnl_success && a) {
        mts_dnnl.dnnl_primitive_attr_destroy(a);
        a = NULL;
    }
    *out = a;
    return st;
}

/* Whether a convolution may run as Winograd (oneDNN's F(2x2,3x3) / F(4x4,3x3) kernels on
 * AVX-512): fp32, 2-D, 3x3, stride 1, no dilation, padding at most 1, one group, at least 32
 * channels in and out (channel counts multiples of 16, as the kernels need). Those kernels read
 * and write the 16-channel blocked layout, so the step's edges convert to and from it in scratch
 * memory; measured on AVX-512 with the conversions included (2 threads), 1.7-2.6x faster than
 * the direct kernel from 32 channels and 20x20 pixels up, a wash below. Its rounding differs
 * from the direct kernel's (relative L2 about 1e-6 against a double-precision reference, direct
 * 2e-7). The transformed weights take up to 4x the kernel's bytes, so the planner chooses which
 * convs get it within a memory budget (kernels/dnnl_backend.c), and the transformed tiles need
 * scratch memory (bounded below). MTS_NO_WINOGRAD=1 keeps every convolution direct. */
bool mts_dconv_wino_ok(const mts_dconv_spec *s)
{
    static int off_flag = -1;
    int off = __atomic_load_n(&off_flag, __ATOMIC_RELAXED);
    if (off < 0) {
        off = getenv("MTS_NO_WINOGRAD") != NULL;
        __atomic_store_n(&off_flag, off, __ATOMIC_RELAXED);
    }
    const mts_conv_geom *g = &s->g;
    if (off || s->kind != MTS_DPRIM_CONV || s->q8 || s->bf16 || s->src_bf16 || s->dst_bf16 || g->nsp != 2 ||
        g->group != 1 || s->up[0] * s->up[1] > 1)
        return false;
    if (g->C < 32 || g->M < 32 || g->C % 16 || g->M % 16 || g->out[1] * g->out[2] < 64) return false;
    /* the transformed tiles live in the context's scratch: about 36/16 of the source and
     * destination for F(4x4,3x3); above 16 MB a run (high resolution, large batches) the conv
     * stays direct, so contexts do not grow by more than that */
    double tiles = 2.25 * (double)(g->C + g->M) * (double)(g->out[1] * g->out[2]) * (double)g->N * sizeof(float);
    if (tiles > 16e6) return false;
    for (int i = 1; i < 3; i++)
        if (g->k[i] != 3 || g->s[i] != 1 || g->d[i] != 1 || g->pb[i] > 1 || g->pe[i] > 1) return false;
    for (int i = 0; i < s->n_post; i++)
        if (s->post[i].kind == MTS_DPOST_ADD && s->post[i].bf16) return false;
    return true;
}

int64_t mts_dconv_wino_extra_bytes(const mts_dconv_spec *s)
{
    return 4 * s->g.M * s->g.C * 9 * (int64_t)sizeof(float);
}

/* " <bf16" / " >bf16" after the implementation's name: tensors handed on in bf16
 * (MTS_PLAN_VERBOSE). */
static void mark_handoffs(mts_dconv *c, const mts_dconv_spec *s)
{
    size_t l = strlen(c->impl);
    snprintf(c->impl + l, sizeof c->impl - l, "%s%s", s->src_bf16 ? " <bf16" : "", s->dst_bf16 ? " >bf16" : "");
}

/* The depthwise-separable form: the engine's own kernel on a copy of the weights. */
static int dwsep_create(const mts_dconv_spec *s, mts_dconv **out, mts_err *err)
{
    mts_dconv *c = calloc(1, sizeof *c);
    if (!c) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    int rc = mts_dwsep_create(s, &c->dwsep, err);
    if (rc) {
        free(c);
        return rc;
    }
    c->spec = *s;
    c->spec.w = c->spec.b = c->spec.pw_w = c->spec.pw_b = NULL; /* (copied) */
    c->bf16 = s->bf16;
    snprintf(c->impl, sizeof c->impl, "%s", mts_dwsep_impl(c->dwsep));
    mark_handoffs(c, s);
    *out = c;
    return MTS_OK;
}

/* The bf16 small-output form: the engine's own kernel (bfconv.c) on its packed weight pairs. */
static int bfc_create(const mts_dconv_spec *s, mts_dconv **out, mts_err *err)
{
    mts_dconv *c = calloc(1, sizeof *c);
    if (!c) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    int rc = mts_bfconv_create(s, &c->bfc, err);
    if (rc) {
        free(c);
        return rc;
    }
    c->spec = *s;
    c->spec.w = c->spec.b = NULL; /* (packed) */
    c->bf16 = true;
    snprintf(c->impl, sizeof c->impl, "mts:bf16conv3x3%s%s", s->cat_C2 ? "+concat" : "", s->head_M ? "+head" : "");
    mark_handoffs(c, s);
    if (s->up[0] * s->up[1] > 1) {
        size_t l = strlen(c->impl);
        snprintf(c->impl + l, sizeof c->impl - l, "+up%lldx%lld", (long long)s->up[0], (long long)s->up[1]);
    }
    *out = c;
    return MTS_OK;
}

static int create_one(const mts_dconv_spec *s, mts_dconv **out, mts_err *err)
{
    int rc = MTS_OK;
    dnnl_post_ops_t po = NULL;
    mts_dconv *c = NULL;
    const mts_conv_geom *g = &s->g;
    if (!eng()) return mts_err_set(err, MTS_EUNSUPPORTED, "oneDNN has no CPU engine");
    if ((g->nsp < 1 && s->kind != MTS_DPRIM_MATMUL) || g->nsp > 3)
        return mts_err_set(err, MTS_EUNSUPPORTED, "spatial rank %d", g->nsp);
    if (s->kind == MTS_DPRIM_DECONV) {
        int o = g->nsp == 3 ? 0 : 1;
        for (int i = o; i < 3; i++) {
            int64_t ek = (g->k[i] - 1) * g->d[i] + 1;
            if (g->pe[i] < 0 || (g->in[i] - 1) * g->s[i] + ek - g->pb[i] - g->out[i] < 0)
                return mts_err_set(err, MTS_EUNSUPPORTED, "output extends past the last input tap");
        }
    }
    if (s->pw_M > 0) return dwsep_create(s, out, err);
    if (mts_bfconv_ok(s)) return bfc_create(s, out, err);
    if (s->kind == MTS_DPRIM_DECONV && s2d_eligible(s)) return s2d_create(s, out, err);
    if (s->up[0] * s->up[1] > 1) {
        if (!mts_dconv_up_ok(s)) return mts_err_set(err, MTS_EUNSUPPORTED, "upsampled source geometry");
        return up_create(s, out, err);
    }
    if (mts_dprim_is_pool(s->kind)) {
        if (s->n_post) return mts_err_set(err, MTS_EUNSUPPORTED, "post-ops on pooling");
        for (int i = 0; i < 3; i++) {
            int64_t ek = (g->k[i] - 1) * g->d[i] + 1;
            int64_t pr = (g->out[i] - 1) * g->s[i] + ek - g->in[i] - g->pb[i];
            if (pr < 0 || g->pb[i] >= ek || (s->kind == MTS_DPRIM_POOL_AVG_INCLUDE && pr != g->pe[i]))
                return mts_err_set(err, MTS_EUNSUPPORTED, "pooling window geometry");
        }
    }
    if (s->q8 && (s->kind != MTS_DPRIM_CONV || s->n_post || g->nsp > 2 || !s->qw))
        return mts_err_set(err, MTS_EUNSUPPORTED, "int8 convolution form");
    c = calloc(1, sizeof *c);
    if (!c) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    c->spec = *s;
    if (s->q8 && s->qbias) { /* own copy, like the float bias */
        if (!(c->qbias = malloc(sizeof(int32_t) * (size_t)g->M))) {
            free(c);
            return mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        memcpy(c->qbias, s->qbias, sizeof(int32_t) * (size_t)g->M);
        c->spec.qbias = c->qbias;
    }
    c->spec.qscale = NULL; /* copied into the attributes below */
    if (!s->q8 && s->b) { /* own copy: the model's may be in the file mapping, which is let go after planning */
        if (!(c->s2d_bias = malloc(sizeof(float) * (size_t)g->M))) {
            free(c);
            return mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        memcpy(c->s2d_bias, s->b, sizeof(float) * (size_t)g->M);
        c->spec.b = c->s2d_bias;
    }
    if ((rc = small_create(c, s, err)) || c->small) goto done;
    /* bf16: the primitive reads bf16 (the source edge's reorder converts an fp32 source) and
     * writes fp32 unless the planner keeps the destination in bf16 for bf16 readers. */
    bool bf = s->bf16 && !mts_dprim_is_pool(s->kind) && !s->q8;
    c->spec.bf16 = c->bf16 = bf;
    dnnl_data_type_t src_dt = bf ? dnnl_bf16 : dnnl_f32, dst_dt = bf && s->dst_bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_data_type_t usrc_dt = s->src_bf16 ? dnnl_bf16 : dnnl_f32, udst_dt = s->dst_bf16 ? dnnl_bf16 : dnnl_f32;
    if (s->q8) {
        usrc_dt = src_dt = q8_dt(s->q8_src);
        udst_dt = dst_dt = q8_dt(s->q8_dst);
        if (src_dt == dnnl_data_type_undef || dst_dt == dnnl_data_type_undef || (dst_dt == dnnl_s32) != !s->qscale) {
            rc = mts_err_set(err, MTS_EUNSUPPORTED, "int8 convolution types");
            goto done;
        }
    }
    act_md(&c->md[0], g, g->C, g->in, true, src_dt);
    act_md(&c->user_md[0], g, g->C, g->in, s->src_nhwc && g->nsp != 3, usrc_dt);
    act_md(&c->md[1], g, g->M, g->out, true, dst_dt);
    act_md(&c->user_md[1], g, g->M, g->out, s->dst_nhwc && g->nsp != 3, udst_dt);
    c->n_edges = 2;
    DN(mts_dnnl.dnnl_primitive_attr_create(&c->attr), "attr");
    DN(mts_dnnl.dnnl_primitive_attr_set_scratchpad_mode(c->attr, dnnl_scratchpad_mode_user), "scratchpad mode");
    if (s->q8) {
        /* The zero points are run-time arguments (a ConvInteger's may be computed); the
         * output scales constants, per output channel (mask: dimension 1) or common. */
        const int32_t rt = DNNL_RUNTIME_S32_VAL;
        DN(mts_dnnl.dnnl_primitive_attr_set_zero_points(c->attr, DNNL_ARG_SRC, 1, 0, &rt), "source zero point");
        if (s->qscale) {
            DN(mts_dnnl.dnnl_primitive_attr_set_zero_points(c->attr, DNNL_ARG_DST, 1, 0, &rt), "zero point");
            bool per = s->q8_nscale > 1;
            DN(mts_dnnl.dnnl_primitive_attr_set_output_scales(c->attr, per ? g->M : 1, per ? 1 << 1 : 0, s->qscale),
               "output scales");
        }
    }
    DN(mts_dnnl.dnnl_post_ops_create(&po), "post-ops");
    if (s->q8_act) {
        /* The unfused steps' arithmetic, operation by operation (dnnl_ops.h): q - zp of the
         * requantized output is round_half_even(v) saturated to the type's range shifted by
         * -zp (the activation dequantizes with the same zero point), then times its scale.
         * At most one post-op of each kind: with two eltwise_linear post-ops, oneDNN 2.6's
         * brgemm convolutions were seen computing the second with the first's parameters. */
        bool ms = s->q8_mid == MTS_DTYPE_INT8;
        float zm = (float)s->q8_mid_zp;
        static const dnnl_dims_t one = {1, 1, 1, 1};
        dnnl_memory_desc_t dmd;
        mts_dnnl.dnnl_memory_desc_init_by_tag(&dmd, 4, one, dnnl_f32, dnnl_nchw);
        DN(mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_round, 0, 0), "post-op");
        DN(mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip_v2, (ms ? -128.0f : 0.0f) - zm,
                                                 (ms ? 127.0f : 255.0f) - zm),
           "post-op");
        DN(mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, s->q8_act_xs, 0.0f), "post-op");
        DN(mts_dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, s->q8_act_alpha, 0.0f), "post-op");
        c->q8_div_po = mts_dnnl.dnnl_post_ops_len(po);
        c->q8_div = s->q8_act_ys;
        DN(mts_dnnl.dnnl_post_ops_append_binary(po, dnnl_binary_div, &dmd), "post-op");
    }
    for (int i = 0; i < s->n_post; i++) {
        const mts_dpost *p = &s->post[i];
        if (p->kind == MTS_DPOST_ADD) {
            int e = c->n_edges++;
            act_md(&c->md[e], g, g->M, g->out, true, dnnl_f32);
            act_md(&c->user_md[e], g, g->M, g->out, p->nhwc && g->nsp != 3, p->bf16 ? dnnl_bf16 : dnnl_f32);
            c->resid_po[e - 2] = mts_dnnl.dnnl_post_ops_len(po);
            DN(mts_dnnl.dnnl_post_ops_append_binary(po, dnnl_binary_add, &c->md[e]), "add post-op");
        } else {
            DN(append_eltwise(po, p), "post-op");
        }
    }
    DN(mts_dnnl.dnnl_primitive_attr_set_post_ops(c->attr, po), "set post-ops");
    {
        variant *v = NULL;
        /* A first layer (few input channels) reads NCHW directly when oneDNN has a fast kernel
         * for it, saving the conversion of the input. */
        bool direct = s->kind == MTS_DPRIM_CONV && !s->q8 && !s->src_nhwc && g->nsp < 3 && g->C <= 8 && g->group == 1 &&
                      c->md[0].data_type == c->user_md[0].data_type;
        if (direct) {
            c->md[0] = c->user_md[0];
            mts_err e2 = {0};
            if (variant_create(c, 1, s->w, &v, &e2) != MTS_OK) {
                act_md(&c->md[0], g, g->C, g->in, true, src_dt);
                direct = false;
            }
        }
        if (!direct && s->wino && mts_dconv_wino_ok(s)) {
            /* the blocked layout on every edge; back to channels-last when oneDNN declines (a
             * post-op it does not take) */
            dnnl_memory_desc_t keep[N_EDGES];
            memcpy(keep, c->md, sizeof keep);
            for (int e = 0; e < c->n_edges; e++) {
                dnnl_dims_t d = {g->N, e ? g->M : g->C, (e ? g->out : g->in)[1], (e ? g->out : g->in)[2]};
                mts_dnnl.dnnl_memory_desc_init_by_tag(&c->md[e], 4, d, dnnl_f32, dnnl_nChw16c);
            }
            /* The base copy of the weights stays plain: other thread counts' primitives may
             * want another Winograd weight layout, and oneDNN converts only from plain ones. */
            mts_err e2 = {0};
            dnnl_memory_desc_t plain;
            dnnl_dims_t wd = {g->M, g->C, 3, 3};
            mts_dnnl.dnnl_memory_desc_init_by_tag(&plain, 4, wd, dnnl_f32, dnnl_oihw);
            wcache *wc = NULL;
            pthread_mutex_lock(&g_lock);
            int rb = packed_weights(c, &plain, s->w, &wc, &e2);
            pthread_mutex_unlock(&g_lock);
            dnnl_primitive_attr_t wa = NULL, keep_attr = c->attr;
            if (rb == MTS_OK && wino_attr(s, &wa) == dnnl_success) {
                c->base = wc, c->wino = true, c->attr = wa;
                c->sum_resid = c->n_edges > 2;
            }
            if (c->wino && variant_create(c, 1, s->w, &v, &e2) == MTS_OK && strstr(c->impl, "wino")) {
                direct = true; /* made */
                mts_dnnl.dnnl_primitive_attr_destroy(keep_attr);
                atomic_fetch_add(&g_wino_created, 1);
            } else {
                if (v) variant_free(v);
                v = NULL;
                if (wa) mts_dnnl.dnnl_primitive_attr_destroy(wa);
                c->attr = keep_attr;
                c->wino = c->sum_resid = false;
                c->impl[0] = 0;
                memcpy(c->md, keep, sizeof keep);
            }
        }
        rc = direct ? MTS_OK : variant_create(c, 1, s->q8 ? (const void *)s->qw : (const void *)s->w, &v, err);
        if (rc) goto done;
        atomic_store(&c->var[1], v);
        if (s->q8) atomic_fetch_add(&g_q8_created, 1);
        if (s->q8_act) atomic_fetch_add(&g_q8_act_created, 1);
    }
    c->spec.w = NULL;
    c->spec.qw = NULL;
    mark_handoffs(c, s);
done:
    if (po) mts_dnnl.dnnl_post_ops_destroy(po);
    if (rc) {
        mts_dconv_free(c);
        return rc;
    }
    *out = c;
    return MTS_OK;
}

/* bf16 first when asked for; fp32 when oneDNN has no fast bf16 implementation for the step
 * (a CPU without AVX-512: oneDNN 2.x then offers only reference bf16 kernels). The step's
 * tensors keep the dtypes the planner gave them either way (the edges' reorders convert). */
int mts_dconv_create(const mts_dconv_spec *s, mts_dconv **out, mts_err *err)
{
    if (!s->bf16 || mts_dprim_is_pool(s->kind)) return create_one(s, out, err);
    mts_err e2 = {0};
    if (create_one(s, out, &e2) == MTS_OK) return MTS_OK;
    mts_dconv_spec f = *s;
    f.bf16 = false;
    return create_one(&f, out, err);
}

void mts_dconv_free(mts_dconv *c)
{
    if (!c) return;
    mts_dconv_free(c->inner);
    mts_dwsep_free(c->dwsep);
    mts_bfconv_free(c->bfc);
    for (int i = 0; i < c->n_phase; i++) mts_dconv_free(c->phase[i]);
    free(c->s2d_bias);
    free(c->qbias);
    for (int i = 0; i <= MTS_DNNL_MAX_THREADS; i++) variant_free(atomic_load(&c->var[i]));
    if (c->bmem) mts_dnnl.dnnl_memory_destroy(c->bmem);
    if (c->attr) mts_dnnl.dnnl_primitive_attr_destroy(c->attr);
    free(c);
}

static int clamp_threads(int t)
{
    return t < 1 ? 1 : t > MTS_DNNL_MAX_THREADS ? MTS_DNNL_MAX_THREADS : t;
}

/* Threads worth using: a step gets one more thread per 100k multiply-adds (about 4 us of work),
 * so the smallest steps (late layers of small networks at batch 1) run on the calling thread
 * alone. Cheap enough because the team's threads spin briefly before they sleep (dnnl_rt.h);
 * measured on mobilenetv3 at batch 1, 2 threads: 1e5 620 samples/s, 1e6 540, 5e4 490-580. */
static int work_threads(const mts_dconv *c, int threads)
{
    const mts_conv_geom *g = &c->spec.g;
    double outv = (double)(g->out[0] * g->out[1] * g->out[2]), k = (double)(g->k[0] * g->k[1] * g->k[2]), macs;
    if (c->spec.kind == MTS_DPRIM_MATMUL) macs = (double)g->N * (double)g->C * (double)g->M;
    else if (mts_dprim_is_pool(c->spec.kind)) macs = (double)g->N * (double)g->C * outv * k;
    else if (c->spec.kind == MTS_DPRIM_DECONV)
        macs = (double)g->N * (double)g->C * (double)(g->M / g->group) * k * (double)(g->in[0] * g->in[1] * g->in[2]);
    else macs = (double)g->N * (double)g->M * (double)(g->C / g->group) * k * outv;
    return clamp_threads(mts_dconv_threads_for(macs, threads));
}

/* The largest oneDNN scratch any phase convolution of c needs at `threads` (preparing them). */
static int phase_scratch(const mts_dconv *c, int threads, size_t *most, mts_err *err)
{
    for (int i = 0; i < c->n_phase; i++) {
        size_t b = 0;
        int rc = mts_dconv_prepare(c->phase[i], threads, &b, err);
        if (rc) return rc;
        if (b > *most) *most = b;
    }
    return MTS_OK;
}

int mts_dconv_prepare(const mts_dconv *cc, int threads, size_t *scratch, mts_err *err)
{
    mts_dconv *c = (mts_dconv *)cc; /* variants are created once, under var_lock(c), and published atomically */
    int rc = MTS_OK;
    if (c->inner) {
        size_t b = 0;
        if ((rc = mts_dconv_prepare(c->inner, threads, &b, err))) return rc;
        *scratch = (b + 63) / 64 * 64 + c->s2d_tmp;
        return MTS_OK;
    }
    if (c->n_phase) {
        size_t most = 0;
        if ((rc = phase_scratch(c, threads, &most, err))) return rc;
        *scratch = (most + 63) / 64 * 64 + (size_t)c->n_phase * c->phase_tmp;
        return MTS_OK;
    }
    if (c->small) {
        *scratch = 0;
        return MTS_OK;
    }
    if (c->dwsep) {
        *scratch = mts_dwsep_scratch(c->dwsep, threads);
        return MTS_OK;
    }
    if (c->bfc) {
        *scratch = mts_bfconv_scratch(c->bfc, threads);
        return MTS_OK;
    }
    int t = work_threads(c, threads);
    variant *v = atomic_load(&c->var[t]);
    if (!v) {
        pthread_mutex_lock(var_lock(c));
        v = atomic_load(&c->var[t]);
        if (!v && (rc = variant_create(c, t, NULL, &v, err)) == MTS_OK) atomic_store(&c->var[t], v);
        pthread_mutex_unlock(var_lock(c));
        if (rc) return rc;
    }
    *scratch = v->total_scratch;
    return MTS_OK;
}

bool mts_dconv_ready(const mts_dconv *c, int threads)
{
    if (c->inner) return mts_dconv_ready(c->inner, threads);
    for (int i = 0; i < c->n_phase; i++)
        if (!mts_dconv_ready(c->phase[i], threads)) return false;
    if (c->n_phase || c->small || c->dwsep || c->bfc) return true;
    return atomic_load(&((mts_dconv *)c)->var[work_threads(c, threads)]) != NULL;
}

const char *mts_dconv_impl(const mts_dconv *c)
{
    return c->impl;
}

bool mts_dconv_q8(const mts_dconv *c)
{
    return c->spec.q8;
}

bool mts_dconv_half(const mts_dconv *c)
{
    return c->small && c->small_half;
}

bool mts_dconv_bf16(const mts_dconv *c)
{
    return c->bf16;
}

void *mts_dnnl_stream_create(void)
{
    dnnl_stream_t s = NULL;
    if (!eng() || mts_dnnl.dnnl_stream_create(&s, eng(), dnnl_stream_default_flags) != dnnl_success) return NULL;
    return s;
}

void mts_dnnl_stream_free(void *stream)
{
    if (stream) mts_dnnl.dnnl_stream_destroy(stream);
}

/* Runs reorder r from a (md ma) to b (md mb). */
static dnnl_status_t run_reorder(dnnl_primitive_t r, void *stream, const dnnl_memory_desc_t *ma, const void *a,
                                 const dnnl_memory_desc_t *mb, void *b)
{
    dnnl_memory_t x = NULL, y = NULL;
    dnnl_status_t st = mts_dnnl.dnnl_memory_create(&x, ma, eng(), (void *)a);
    if (st == dnnl_success) st = mts_dnnl.dnnl_memory_create(&y, mb, eng(), b);
    if (st == dnnl_success) {
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, x}, {DNNL_ARG_TO, y}};
        st = mts_dnnl.dnnl_primitive_execute(r, stream, 2, ra);
    }
    if (x) mts_dnnl.dnnl_memory_destroy(x);
    if (y) mts_dnnl.dnnl_memory_destroy(y);
    return st;
}

typedef struct to_nchw_job {
    const float *src; /* [N, P, C] */
    float *dst;       /* [N, C, P] */
    int64_t N, P, C;
} to_nchw_job;

static void to_nchw_part(void *arg, int ithr, int nthr)
{
    const to_nchw_job *j = arg;
    int64_t p0 = j->P * ithr / nthr, p1 = j->P * (ithr + 1) / nthr;
    for (int64_t n = 0; n < j->N; n++)
        for (int64_t c = 0; c < j->C; c++) {
            const float *s = j->src + n * j->P * j->C + c;
            float *d = j->dst + (n * j->C + c) * j->P;
            for (int64_t p = p0; p < p1; p++) d[p] = s[p * j->C];
        }
}

bool mts_dconv_run_rows(const mts_dconv *c, int threads, const void *src, void *dst, const float *const *resid,
                        const mts_rows *rows)
{
    const mts_conv_geom *g = &c->spec.g;
    if (!c->small || c->inner || c->n_phase || !rows || g->N != rows->B * rows->S) return false;
    mts_small_gemm_run_map(src, rows->map, rows->n, g->C, g->M, c->small, c->small_half, c->spec.b, c->spec.post,
                           c->spec.n_post, resid, dst, work_threads(c, threads));
    float *d = dst;
    for (int64_t b = 0; b < rows->B; b++)
        if (rows->len[b] < rows->S)
            memset(d + (b * rows->S + rows->len[b]) * g->M, 0,
                   sizeof(float) * (size_t)((rows->S - rows->len[b]) * g->M));
    return true;
}

int mts_dconv_run(const mts_dconv *c, int threads, void *stream, const void *src, void *dst,
                  const float *const *resid, const mts_tensor *src_zp, void *scratch, mts_err *err)
{
    int rc = MTS_OK;
    if (c->inner) {
        size_t b = 0;
        if ((rc = mts_dconv_prepare(c->inner, threads, &b, err))) return rc;
        float *tmp = (float *)((char *)scratch + (b + 63) / 64 * 64);
        if ((rc = mts_dconv_run(c->inner, threads, stream, src, tmp, resid, NULL, scratch, err))) return rc;
        s2d_scatter(c, tmp, dst);
        return MTS_OK;
    }
    if (c->n_phase) {
        size_t most = 0;
        if ((rc = phase_scratch(c, threads, &most, err))) return rc;
        float *tmp = (float *)((char *)scratch + (most + 63) / 64 * 64);
        for (int i = 0; i < c->n_phase; i++)
            if ((rc = mts_dconv_run(c->phase[i], threads, stream, src, tmp + (size_t)i * (c->phase_tmp / sizeof(float)),
                                    resid, NULL, scratch, err)))
                return rc;
        up_scatter_job j = {c, tmp, dst};
        int64_t bytes = (int64_t)c->n_phase * (int64_t)c->phase_tmp;
        int t = (int)(bytes / (256 << 10));
        mts_parallel(t < 1 ? 1 : t < threads ? t : threads, up_scatter_part, &j);
        return MTS_OK;
    }
    if (c->dwsep) {
        mts_dwsep_run(c->dwsep, threads, src, dst, resid, scratch);
        return MTS_OK;
    }
    if (c->bfc) {
        mts_bfconv_run(c->bfc, threads, src, dst, resid, scratch);
        return MTS_OK;
    }
    threads = work_threads(c, threads);
    if (c->small) {
        const mts_conv_geom *g = &c->spec.g;
        mts_small_gemm_run(src, g->N, g->C, g->M, c->small, c->small_half, c->spec.b, c->spec.post, c->spec.n_post, resid,
                           dst, threads);
        return MTS_OK;
    }
    const variant *v = atomic_load(&((mts_dconv *)c)->var[threads]);
    if (!v) return mts_err_set(err, MTS_EINTERNAL, "oneDNN primitive for %d threads not prepared", threads);
    dnnl_memory_t mem[6 + MTS_DPOST_MAX] = {0};
    int nm = 0;
    dnnl_exec_arg_t args[8 + MTS_DPOST_MAX];
    int na = 0;
    char *sc = scratch;
    const void *conv_src = src;
    void *conv_dst = dst;
    if (v->reorder[0]) {
        conv_src = sc + v->off[0];
        DN(run_reorder(v->reorder[0], stream, &c->user_md[0], src, &c->md[0], (void *)conv_src), "source reorder");
    }
    if (v->reorder[1]) conv_dst = sc + v->off[1];
    dnnl_memory_t ms, md;
    DN(mts_dnnl.dnnl_memory_create(&ms, &c->md[0], eng(), (void *)conv_src), "memory");
    mem[nm++] = ms;
    DN(mts_dnnl.dnnl_memory_create(&md, &c->md[1], eng(), conv_dst), "memory");
    mem[nm++] = md;
    args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, ms};
    args[na++] = (dnnl_exec_arg_t){DNNL_ARG_DST, md};
    if (v->wmem) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, v->wmem};
    if (c->bmem) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, c->bmem};
    if (v->scratch_bytes) {
        dnnl_memory_t mp;
        DN(mts_dnnl.dnnl_memory_create(&mp, &v->scratch_md, eng(), sc), "memory");
        mem[nm++] = mp;
        args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mp};
    }
    int32_t zp[2] = {c->spec.q8_zp[0], c->spec.q8_zp[1]};
    if (c->spec.q8) {
        if (src_zp) { /* computed at run time (DynamicQuantizeLinear): a uint8 / int8 scalar */
            if (mts_tensor_numel(src_zp) != 1 || src_zp->rank > 1 || src_zp->dtype != c->spec.q8_src) {
                rc = mts_err_set(err, MTS_EINVAL, "x's zero point must be a scalar of x's type");
                goto done;
            }
            zp[0] = src_zp->dtype == MTS_DTYPE_INT8 ? *(const int8_t *)src_zp->data : *(const uint8_t *)src_zp->data;
        }
        static const dnnl_dims_t one = {1};
        dnnl_memory_desc_t zmd;
        mts_dnnl.dnnl_memory_desc_init_by_tag(&zmd, 1, one, dnnl_s32, dnnl_x);
        for (int i = 0; i < (c->md[1].data_type != dnnl_s32 ? 2 : 1); i++) {
            dnnl_memory_t mz;
            DN(mts_dnnl.dnnl_memory_create(&mz, &zmd, eng(), (void *)(zp + i)), "memory");
            mem[nm++] = mz;
            args[na++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_ZERO_POINTS | (i ? DNNL_ARG_DST : DNNL_ARG_SRC), mz};
        }
        if (c->spec.q8_act) {
            static const dnnl_dims_t one4 = {1, 1, 1, 1};
            dnnl_memory_desc_t dmd;
            dnnl_memory_t mdv;
            mts_dnnl.dnnl_memory_desc_init_by_tag(&dmd, 4, one4, dnnl_f32, dnnl_nchw);
            DN(mts_dnnl.dnnl_memory_create(&mdv, &dmd, eng(), (void *)&c->q8_div), "memory");
            mem[nm++] = mdv;
            args[na++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(c->q8_div_po) | DNNL_ARG_SRC_1, mdv};
        }
    }
    if (c->sum_resid) { /* the residual into the destination, which the sum post-op adds to */
        if (!v->reorder[1] || !v->reorder[2]) {
            rc = mts_err_set(err, MTS_EINTERNAL, "Winograd residual without its conversions");
            goto done;
        }
        DN(run_reorder(v->reorder[2], stream, &c->user_md[2], resid[0], &c->md[1], conv_dst), "residual reorder");
    }
    for (int e = 2; e < c->n_edges && !c->sum_resid; e++) {
        const void *rp = resid[e - 2];
        if (v->reorder[e]) {
            DN(run_reorder(v->reorder[e], stream, &c->user_md[e], rp, &c->md[e], sc + v->off[e]), "residual reorder");
            rp = sc + v->off[e];
        }
        dnnl_memory_t mr;
        DN(mts_dnnl.dnnl_memory_create(&mr, &c->md[e], eng(), (void *)rp), "memory");
        mem[nm++] = mr;
        args[na++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(c->resid_po[e - 2]) | DNNL_ARG_SRC_1, mr};
    }
    DN(mts_dnnl.dnnl_primitive_execute(v->prim, stream, na, args), "execute");
    if (v->reorder[1] && c->spec.g.nsp < 3 && c->spec.g.M <= 16 && c->md[1].data_type == dnnl_f32 &&
        c->user_md[1].data_type == dnnl_f32) {
        /* Few channels to NCHW (a network's output layer): oneDNN's generic reorder is slow for
         * this shape; a plain transpose over the context's threads is not. */
        DN(mts_dnnl.dnnl_stream_wait(stream), "wait");
        to_nchw_job j = {conv_dst, dst, c->spec.g.N, c->spec.g.out[1] * c->spec.g.out[2], c->spec.g.M};
        int t = (int)(j.N * j.P * j.C / (64 << 10));
        mts_parallel(t < 1 ? 1 : t < threads ? t : threads, to_nchw_part, &j);
    } else if (v->reorder[1]) {
        DN(run_reorder(v->reorder[1], stream, &c->md[1], conv_dst, &c->user_md[1], dst), "destination reorder");
    }
    DN(mts_dnnl.dnnl_stream_wait(stream), "wait");
done:
    for (int i = 0; i < nm; i++) mts_dnnl.dnnl_memory_destroy(mem[i]);
    return rc;
}
