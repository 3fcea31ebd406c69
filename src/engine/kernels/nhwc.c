/*
 * Channels-last kernels the optimizer substitutes for reference kernels on [N,H,W,C] views
 * (memory-bound copies, split over the context's threads with mts_parallel):
 *   - nearest-neighbour upsampling by integer factors (Resize in UNet decoders): one copy of C
 *     contiguous values per output pixel, one copy per repeated output row;
 *   - Concat along channels: per pixel, one copy per input. An input may be read through a
 *     nearest upsampling by integer factors (INTS attribute "mts_up": sh, sw per input, set when
 *     the optimizer folds a Resize read only by the Concat), so UNet decoders write the
 *     upsampled tensor once, into its channel slice, instead of writing it and copying it;
 *     with attribute "mts_out_bf16" (bf16 plans: every reader is a bf16 convolution) the
 *     float inputs are converted to bfloat16 as they are copied, except those marked in the
 *     bit mask "mts_in_bf16", which a bf16 convolution wrote as bfloat16 and are copied as
 *     they are;
 *   - a Transpose between NCHW and NHWC order whose NCHW side is stored channels-last: a copy;
 *   - a graph output copied (Identity, no-op Cast) from channels-last data: a transpose.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "engine/kernels/kernel.h"

/* Copies n runs of px bytes from src (stride ss) to dst (stride ds). Common small run sizes get
 * fixed-size copies the compiler inlines (a libc call per pixel costs more than the copy). */
static void copy_runs(char *dst, size_t ds, const char *src, size_t ss, size_t px, int64_t n)
{
#define RUNS(B)                                                                                 \
    case B:                                                                                     \
        for (int64_t r = 0; r < n; r++, dst += ds, src += ss) memcpy(dst, src, B);             \
        return;
    switch (px) {
        RUNS(4) RUNS(8) RUNS(12) RUNS(16) RUNS(32) RUNS(48) RUNS(64) RUNS(128) RUNS(256)
    default:
        for (int64_t r = 0; r < n; r++, dst += ds, src += ss) memcpy(dst, src, px);
    }
#undef RUNS
}

/* As copy_runs from n runs of c contiguous floats, converting them to bfloat16
 * (mts_f32_to_bf16_n, bit for bit mts_f32_to_bf16: round to nearest even, NaN kept quiet, which
 * is oneDNN's conversion), and writing each run rep times, copy s at dst + s * rs. Runs are
 * converted a few thousand values at a time into a buffer that stays in L1, then copied out
 * as copy_runs does: one vector conversion over many runs instead of a scalar loop per run
 * (runs are often 8 or 16 channels), and an upsampled input is converted once, not per copy. */
#define CVT_BUF 4096
static void cvt_runs(char *dst, size_t ds, int64_t rep, size_t rs, const float *src, int64_t c, int64_t n)
{
    uint16_t buf[CVT_BUF];
    size_t run = (size_t)c * sizeof(uint16_t);
    if (c > CVT_BUF) { /* long runs: straight into place */
        for (int64_t r = 0; r < n; r++)
            for (int64_t s = 0; s < rep; s++) mts_f32_to_bf16_n(src + r * c, (void *)(dst + (size_t)s * rs + (size_t)r * ds), c);
        return;
    }
    int64_t per = CVT_BUF / c;
    for (int64_t r0 = 0; r0 < n; r0 += per) {
        int64_t k = n - r0 < per ? n - r0 : per;
        mts_f32_to_bf16_n(src + r0 * c, buf, k * c);
        for (int64_t s = 0; s < rep; s++) copy_runs(dst + (size_t)s * rs + (size_t)r0 * ds, ds, (const char *)buf, run, run, k);
    }
}

static void split(int64_t n, int ithr, int nthr, int64_t *lo, int64_t *hi)
{
    *lo = n * ithr / nthr;
    *hi = n * (ithr + 1) / nthr;
}

/* Threads worth using for a copy of `bytes`: about 256 KB each. */
static int copy_threads(const mts_kctx *k, int64_t bytes)
{
    int64_t t = bytes / (256 << 10);
    return t < 1 ? 1 : t < k->threads ? (int)t : k->threads;
}

/* in [N,H,W,C] -> out [N,H*sh,W*sw,C], out[n,y,x] = in[n, y/sh, x/sw]. Shapes were checked by the
 * planner (integer factors; N and C equal). */
typedef struct up_job {
    const mts_tensor *x;
    mts_tensor *y;
} up_job;

static void up_part(void *arg, int ithr, int nthr)
{
    const up_job *j = arg;
    const mts_tensor *x = j->x;
    size_t es = mts_dtype_size(x->dtype);
    int64_t N = x->dims[0], H = x->dims[1], W = x->dims[2], C = x->dims[3];
    int64_t OH = j->y->dims[1], OW = j->y->dims[2], sh = OH / H, sw = OW / W;
    size_t px = (size_t)C * es, row = (size_t)OW * px;
    const char *src = x->data;
    char *dst = j->y->data;
    int64_t lo, hi;
    split(N * H, ithr, nthr, &lo, &hi);
    for (int64_t nh = lo; nh < hi; nh++) {
        int64_t n = nh / H, h = nh % H;
        const char *in = src + (size_t)(nh * W) * px;
        char *out = dst + (size_t)((n * OH + h * sh) * OW) * px;
        for (int64_t s = 0; s < sw; s++) copy_runs(out + (size_t)s * px, (size_t)sw * px, in, px, px, W);
        for (int64_t i = 1; i < sh; i++) memcpy(out + (size_t)i * row, out, row);
    }
}

static int up_nearest_run(mts_kctx *k)
{
    up_job j = {k->in[0], &k->out[0]};
    mts_parallel(copy_threads(k, mts_tensor_nbytes(&k->out[0])), up_part, &j);
    return MTS_OK;
}

typedef struct cat_job {
    const mts_kctx *k;
    bool bf16;       /* attribute mts_out_bf16: float inputs, the output written as bfloat16 */
    int64_t in_bf16; /* attribute mts_in_bf16: bit i, input i holds bfloat16 already */
} cat_job;

/* Bytes per element of input i as the Concat reads it. */
static size_t cat_in_size(const cat_job *j, int i)
{
    return j->bf16 && i < MTS_CAT_BF16_INPUTS && (j->in_bf16 >> i & 1) ? 2 : mts_dtype_size(j->k->in[i]->dtype);
}

/* Pixels per block: every input's channels for a block of output pixels are written before
 * the next block, so each output cache line is completed while it is in L1 (input by input
 * over the whole range, each line was filled in pieces, one pass per input, and fetched from
 * memory again for each). */
#define CAT_BLOCK_BYTES (32 << 10)

static void cat_part(void *arg, int ithr, int nthr)
{
    const cat_job *j = arg;
    const mts_kctx *k = j->k;
    const mts_tensor *y = &k->out[0];
    size_t es = mts_dtype_size(y->dtype), oes = j->bf16 ? 2 : es, opx = (size_t)y->dims[3] * oes;
    int64_t rows = y->dims[0] * y->dims[1] * y->dims[2], lo, hi;
    split(rows, ithr, nthr, &lo, &hi);
    int64_t block = opx < CAT_BLOCK_BYTES ? (int64_t)(CAT_BLOCK_BYTES / opx) : 1;
    for (int64_t b0 = lo; b0 < hi; b0 += block) {
        int64_t nb = hi - b0 < block ? hi - b0 : block;
        size_t off = 0;
        for (int i = 0; i < k->n_in; i++) {
            const mts_tensor *x = k->in[i];
            size_t ies = cat_in_size(j, i), px = (size_t)x->dims[3] * ies;
            char *dst = (char *)y->data + (size_t)b0 * opx + off;
            const char *src = (const char *)x->data + (size_t)b0 * px;
            if (j->bf16 && ies == 4) cvt_runs(dst, opx, 1, 0, (const float *)src, x->dims[3], nb);
            else copy_runs(dst, opx, src, px, px, nb);
            off += (size_t)x->dims[3] * oes;
        }
    }
}

/* With upsampled inputs: by output rows [n, y]; input i's row is y / sh_i, pixel x / sw_i. */
static void cat_up_part(void *arg, int ithr, int nthr)
{
    const cat_job *j = arg;
    const mts_kctx *k = j->k;
    int n_up = 0;
    const int64_t *up = mts_attr_ints(k->node, "mts_up", &n_up);
    const mts_tensor *y = &k->out[0];
    size_t es = mts_dtype_size(y->dtype), oes = j->bf16 ? 2 : es, opx = (size_t)y->dims[3] * oes;
    int64_t OH = y->dims[1], OW = y->dims[2], lo, hi;
    split(y->dims[0] * OH, ithr, nthr, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t n = r / OH, oy = r % OH;
        char *dst = (char *)y->data + (size_t)(r * OW) * opx;
        size_t off = 0;
        for (int i = 0; i < k->n_in; i++) {
            const mts_tensor *x = k->in[i];
            size_t ies = cat_in_size(j, i), px = (size_t)x->dims[3] * ies;
            int64_t sh = up[2 * i], sw = up[2 * i + 1], IH = x->dims[1], IW = x->dims[2];
            const char *src = (const char *)x->data + (size_t)((n * IH + oy / sh) * IW) * px;
            if (j->bf16 && ies == 4) cvt_runs(dst + off, (size_t)sw * opx, sw, opx, (const float *)src, x->dims[3], IW);
            else
                for (int64_t s = 0; s < sw; s++) copy_runs(dst + off + (size_t)s * opx, (size_t)sw * opx, src, px, px, IW);
            off += (size_t)x->dims[3] * oes;
        }
    }
}

static int concat_run(mts_kctx *k)
{
    cat_job j = {k, mts_attr_int(k->node, "mts_out_bf16", 0) != 0, mts_attr_int(k->node, "mts_in_bf16", 0)};
    for (int i = 0; j.bf16 && i < k->n_in; i++)
        if (k->in[i]->dtype != MTS_DTYPE_FLOAT || k->out[0].dtype != MTS_DTYPE_FLOAT)
            return mts_err_set(k->err, MTS_EINVAL, "bf16-writing Concat needs float tensors");
    int n_up = 0;
    const int64_t *up = mts_attr_ints(k->node, "mts_up", &n_up);
    bool scaled = false;
    for (int i = 0; up && i < n_up; i++) scaled |= up[i] != 1;
    if (scaled && n_up == 2 * k->n_in) {
        for (int i = 0; i < k->n_in; i++)
            if (k->in[i]->dims[1] * up[2 * i] != k->out[0].dims[1] || k->in[i]->dims[2] * up[2 * i + 1] != k->out[0].dims[2] ||
                k->in[i]->dims[0] != k->out[0].dims[0])
                return mts_err_set(k->err, MTS_ESHAPE, "Concat input %d does not upsample to the output", i);
        mts_parallel(copy_threads(k, mts_tensor_nbytes(&k->out[0])), cat_up_part, &j);
        return MTS_OK;
    }
    mts_parallel(copy_threads(k, mts_tensor_nbytes(&k->out[0])), cat_part, &j);
    return MTS_OK;
}

static int static_only_infer(mts_kctx *k)
{
    return mts_err_set(k->err, MTS_EUNSUPPORTED, "channels-last kernels run only in static plans");
}

/* A Transpose between NCHW and NHWC order whose NCHW side is stored channels-last: the bytes
 * are the same on both sides. */
typedef struct copy_job {
    const char *src;
    char *dst;
    int64_t bytes;
} copy_job;

static void copy_part(void *arg, int ithr, int nthr)
{
    const copy_job *j = arg;
    int64_t lo, hi;
    split(j->bytes / 64, ithr, nthr, &lo, &hi);
    lo *= 64, hi = ithr == nthr - 1 ? j->bytes : hi * 64;
    if (hi > lo) memcpy(j->dst + lo, j->src + lo, (size_t)(hi - lo));
}

static int copy_run(mts_kctx *k)
{
    int64_t b = mts_tensor_nbytes(k->in[0]);
    if (b != mts_tensor_nbytes(&k->out[0]))
        return mts_err_set(k->err, MTS_ESHAPE, "layout copy of %lld bytes into %lld", (long long)b,
                           (long long)mts_tensor_nbytes(&k->out[0]));
    copy_job j = {k->in[0]->data, k->out[0].data, b};
    mts_parallel(copy_threads(k, b), copy_part, &j);
    return MTS_OK;
}

const mts_op mts_nhwc_copy = {"Transpose", static_only_infer, copy_run};

/* A graph output copied from channels-last data: in[0] holds [N,H,W,C] data under NCHW dims,
 * out[0] gets it as [N,C,H,W]. Tiles of 16 channels x 64 pixels keep both sides' accesses
 * within a few cache lines. */
typedef struct t_job {
    const float *src;
    float *dst;
    int64_t N, C, P;
} t_job;

static void to_nchw_part(void *arg, int ithr, int nthr)
{
    const t_job *j = arg;
    int64_t tiles = j->N * ((j->P + 63) / 64), lo, hi;
    split(tiles, ithr, nthr, &lo, &hi);
    int64_t pt = (j->P + 63) / 64;
    for (int64_t t = lo; t < hi; t++) {
        int64_t n = t / pt, p0 = (t % pt) * 64, p1 = p0 + 64 < j->P ? p0 + 64 : j->P;
        const float *s = j->src + n * j->P * j->C;
        float *d = j->dst + n * j->C * j->P;
        for (int64_t c0 = 0; c0 < j->C; c0 += 16) {
            int64_t c1 = c0 + 16 < j->C ? c0 + 16 : j->C;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t p = p0; p < p1; p++) d[c * j->P + p] = s[p * j->C + c];
        }
    }
}

static int to_nchw_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    if (x->rank != 4 || x->dtype != MTS_DTYPE_FLOAT || !mts_shape_equal(x, &k->out[0]))
        return mts_err_set(k->err, MTS_ESHAPE, "channels-last output copy needs equal 4-D float shapes");
    t_job j = {x->data, k->out[0].data, x->dims[0], x->dims[1], x->dims[2] * x->dims[3]};
    mts_parallel(copy_threads(k, mts_tensor_nbytes(x)), to_nchw_part, &j);
    return MTS_OK;
}

const mts_op mts_nhwc_to_nchw = {"Identity", static_only_infer, to_nchw_run};
const mts_op mts_nhwc_upsample_nearest = {"Resize", static_only_infer, up_nearest_run};
const mts_op mts_nhwc_concat = {"Concat", static_only_infer, concat_run};
