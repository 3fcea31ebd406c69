/*
 * `mtserve quantize MODEL --calibration DIR|random:N -o OUT.onnx`: post-training static int8
 * quantization into a standard QDQ ONNX model (one that ONNX Runtime runs too).
 *
 *   - Weights: every Conv, ConvTranspose (group 1), MatMul and Gemm whose weight is a float
 *     initializer read by that node alone gets symmetric int8 weights per output channel (Conv
 *     axis 0, ConvTranspose axis 1, MatMul / Gemm per column of B) behind a DequantizeLinear
 *     that keeps the weight's name; a Conv's float bias becomes int32 with scale
 *     x_scale * w_scale[c] (zero point 0), so that integer runtimes can fold it.
 *   - Activations: the data input and the output of each of those nodes is calibrated and gets a
 *     QuantizeLinear -> DequantizeLinear pair (uint8, asymmetric; range [min(0, lo), max(0, hi)]
 *     of the values seen), its readers reading the dequantized copy. Graph outputs stay float.
 *   - Two exact rewrites first, as ONNX Runtime's quantizer does: a BatchNormalization that is a
 *     Conv's only reader is folded into the Conv's weights and bias, and a Relu that is the only
 *     reader of a quantized node's output is dropped (the QuantizeLinear after it has zero point
 *     0, so it clips at 0 by itself). This is what lets the engine fuse DequantizeLinear ->
 *     Conv -> QuantizeLinear into one integer convolution (kernels/quant_backend.c).
 *   - Everything else is copied unchanged (engine/onnx_write.c). Per-axis DequantizeLinear
 *     needs opset 13: a lower default-domain opset is raised when every op of the graph is one
 *     whose definition did not change between the two versions.
 *
 * Calibration runs the float model through the engine as a "calibration model": the same file
 * with every tensor to quantize appended as a graph output, so the executor materializes it.
 * Inputs: `DIR/NAME.npy` (one sample, any batch) or `DIR/NAME_0.npy`, `DIR/NAME_1.npy`, ... per
 * model input NAME (every input the same number of samples), or `random:N` for N seeded samples
 * of batch 1: floats uniform in [0, 1), int64 / int32 inputs 0 or 1 (as `mtserve run` draws
 * them), other symbolic dimensions from --dim (default 1).
 *
 * Accuracy controls (standard post-training methods): --calibrate picks the activation range
 * (min/max, a percentile, or the MSE-optimal range from a histogram collected in a second pass);
 * bias correction takes each Conv's expected output shift from its rounded weights, computed
 * from the calibrated per-channel input means, off its bias; --keep-fp32 leaves nodes float
 * (automatically the output head and a first Conv on raw pixels, the steps measured most
 * sensitive on the lip-sync models); --target-error measures every quantized node's sensitivity
 * (the output error with that node alone kept float) on the calibration set and keeps nodes in
 * float, most sensitive first, until the output's max abs error is within the target. The
 * search re-quantizes from the same cached ranges each time, so it costs one run of the QDQ
 * model on the calibration set per candidate.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "engine/onnx_write.h"
#include "util/npy.h"

#define QPFX "mtserve quantize: "

typedef struct actq {
    const char *name; /* the float tensor quantized (readers are redirected to its dequantized copy) */
    const char *src;  /* the tensor the QuantizeLinear reads: name, or a dropped Relu's input */
    double lo, hi;
    bool seen;
    /* per-channel means (channel axis 1) of the float tensor, for bias correction */
    double *csum;
    int64_t nch;
    double ccount;
    /* histogram over [min(0,lo), max(0,hi)] (second calibration pass), exact zeros apart */
    double *hist, zeros;
    char *own_name;   /* cached ranges: the name, owned */
    float scale;
    uint8_t zp;
    int q_node, dq_node;
    int after_node;   /* original node whose output src is; -1 for a graph input */
} actq;

enum { CAL_MINMAX, CAL_PERCENTILE, CAL_MSE };
#define HBINS 2048

typedef struct qstate {
    mts_onnx_doc *d;
    int method;            /* CAL_* */
    bool bias_correct;
    const char *keep;      /* --keep-fp32 list: node or output names, "auto", "none" */
    int n_kept, n_bias_corr;
    /* ranges cached from the first build (the search re-quantizes with other nodes kept) */
    actq *cache;
    int n_cache;
    bool borrowed;         /* acts' csum / hist point into the cache */
    bool make_cache;
    char **qnodes;         /* make_cache: output names of the quantized nodes */
    int n_qnodes;
    int64_t opset_out;
    int n_acts_out;
    actq *acts;
    int n_acts, cap_acts;
    int n_orig_nodes;
    int n_conv, n_convt, n_mm, n_bn, n_relu, n_bias;
} qstate;

static void usage(FILE *f)
{
    fprintf(f, "usage: mtserve quantize MODEL --calibration DIR|random:N -o OUT.onnx [--threads T] [--seed S]\n"
               "                [--dim NAME=V]\n"
               "                [--calibrate minmax|percentile|mse] [--bias-correction on|off]\n"
               "                [--keep-fp32 auto|none|NAME,...] [--target-error E]\n"
               "  Post-training static int8 quantization into a QDQ ONNX model: int8 per-channel\n"
               "  weights for Conv, ConvTranspose, MatMul and Gemm, uint8 activations calibrated on\n"
               "  DIR/NAME.npy or DIR/NAME_0.npy, DIR/NAME_1.npy, ... per model input NAME, or on N\n"
               "  seeded random inputs of batch 1 (floats in [0,1), integers 0 or 1, as mtserve run;\n"
               "  --dim NAME=V sets their other symbolic dimensions, default 1).\n"
               "  --calibrate        activation ranges: min/max seen (default), 99.99th percentile,\n"
               "                     or the range minimizing the expected squared error\n"
               "  --bias-correction  subtract the weights' rounding error times the calibrated input\n"
               "                     channel means from each Conv's bias (default on)\n"
               "  --keep-fp32        nodes (node or output names) left in float; auto (default) keeps\n"
               "                     the output head and a first Conv on raw pixels; none keeps nothing\n"
               "  --target-error E   measure each layer's sensitivity on the calibration set and keep\n"
               "                     the most sensitive layers in float until the outputs' max abs\n"
               "                     error against the float model is at most E\n");
}

static int find_init(const mts_onnx_doc *d, const char *name)
{
    for (int i = 0; i < d->n_inits; i++)
        if (!d->inits[i].dropped && !strcmp(d->inits[i].name, name)) return i;
    return -1;
}

static bool is_graph_input(const mts_onnx_doc *d, const char *name)
{
    for (int i = 0; i < d->n_inputs; i++)
        if (!strcmp(d->inputs[i], name)) return true;
    return false;
}

static bool is_graph_output(const mts_onnx_doc *d, const char *name)
{
    for (int i = 0; i < d->n_orig_outputs; i++)
        if (!strcmp(d->outputs[i], name)) return true;
    return false;
}

/* Live nodes reading name (counted once per input slot); *only: the last such node. */
static int readers(const mts_onnx_doc *d, const char *name, int *only)
{
    int n = 0;
    *only = -1;
    for (int i = 0; i < d->n_nodes; i++) {
        if (d->nodes[i].dropped) continue;
        for (int j = 0; j < d->nodes[i].n_in; j++)
            if (!strcmp(d->nodes[i].in[j], name)) {
                n++;
                *only = i;
            }
    }
    return n;
}

static bool plain_op(const mts_onnx_node *n, const char *op)
{
    return !n->dropped && !n->domain[0] && !strcmp(n->op_type, op);
}

static int64_t attr_int(const mts_onnx_node *n, const char *name, int64_t dflt)
{
    const mts_onnx_attr *a = mts_onnx_attr_find(n, name);
    return a ? a->i : dflt;
}

/* A float initializer that only this node reads and that is no graph input. */
static int own_weight(const mts_onnx_doc *d, int node, int slot)
{
    const mts_onnx_node *n = &d->nodes[node];
    if (slot >= n->n_in || !n->in[slot][0]) return -1;
    int t = find_init(d, n->in[slot]), only;
    if (t < 0 || d->inits[t].dtype != MTS_DTYPE_FLOAT || d->inits[t].external || is_graph_input(d, n->in[slot]))
        return -1;
    if (readers(d, n->in[slot], &only) != 1 || only != node) return -1;
    return t;
}

static char *cat2(mts_onnx_doc *d, const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = mts_pool_alloc(&d->pool, la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

/* Replaces initializer t's data with data (a new initializer of the same name and shape). */
static int replace_floats(mts_onnx_doc *d, int t, const float *data, int rank, const int64_t *dims)
{
    const char *name = d->inits[t].name;
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    d->inits[t].dropped = 1;
    return mts_onnx_add_init(d, name, MTS_DTYPE_FLOAT, rank, dims, data, (size_t)n * 4) ? MTS_OK : MTS_ENOMEM;
}

/* Conv -> BatchNormalization (the conv's only reader, constant parameters): scales the conv's
 * weights per output channel and makes the BN's shift its bias; the Conv writes the BN's output. */
static int fold_bn(qstate *q, int c, mts_err *err)
{
    mts_onnx_doc *d = q->d;
    mts_onnx_node *cn = &d->nodes[c];
    if (cn->n_out != 1 || is_graph_output(d, cn->out[0])) return MTS_OK;
    int bn_i;
    if (readers(d, cn->out[0], &bn_i) != 1 || !plain_op(&d->nodes[bn_i], "BatchNormalization")) return MTS_OK;
    mts_onnx_node *bn = &d->nodes[bn_i];
    if (bn->n_in != 5 || bn->n_out != 1 || attr_int(bn, "training_mode", 0)) return MTS_OK;
    int wt = own_weight(d, c, 1), bt = cn->n_in > 2 ? own_weight(d, c, 2) : -1;
    if (wt < 0 || (cn->n_in > 2 && cn->in[2][0] && bt < 0) || d->inits[wt].rank < 3) return MTS_OK;
    int64_t M = d->inits[wt].dims[0];
    float *p[4] = {0}, *w = NULL, *b = NULL;
    int rc = MTS_OK;
    for (int i = 0; i < 4; i++) {
        int t = find_init(d, bn->in[i + 1]);
        int64_t n = 0;
        if (t < 0 || !(p[i] = mts_onnx_init_floats(&d->inits[t], &n)) || n != M) goto out;
    }
    int64_t nw = 0, nb = 0;
    if (!(w = mts_onnx_init_floats(&d->inits[wt], &nw)) || M < 1 || nw % M) goto out;
    if (bt >= 0 && (!(b = mts_onnx_init_floats(&d->inits[bt], &nb)) || nb != M)) goto out;
    const mts_onnx_attr *ea = mts_onnx_attr_find(bn, "epsilon");
    double eps = ea ? ea->f : 1e-5;
    float *nbias = malloc((size_t)M * sizeof(float));
    if (!nbias) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    int64_t per = nw / M;
    for (int64_t m = 0; m < M; m++) {
        double s = p[0][m] / sqrt((double)p[3][m] + eps);
        for (int64_t k = 0; k < per; k++) w[m * per + k] = (float)(w[m * per + k] * s);
        nbias[m] = (float)(((b ? b[m] : 0.0) - p[2][m]) * s + p[1][m]);
    }
    int64_t bdims[1] = {M};
    const char *bname = bt >= 0 ? d->inits[bt].name : cat2(d, cn->in[1], "_bn_bias");
    if (!bname) rc = MTS_ENOMEM;
    if (!rc) rc = replace_floats(d, wt, w, d->inits[wt].rank, d->inits[wt].dims);
    if (!rc && bt >= 0) d->inits[bt].dropped = 1;
    if (!rc && !mts_onnx_add_init(d, bname, MTS_DTYPE_FLOAT, 1, bdims, nbias, (size_t)M * 4)) rc = MTS_ENOMEM;
    free(nbias);
    if (rc) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    if (cn->n_in < 3) {
        const char **in = mts_pool_calloc(&d->pool, 3, sizeof(char *));
        if (!in) {
            rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
            goto out;
        }
        in[0] = cn->in[0];
        in[1] = cn->in[1];
        cn->in = in;
        cn->n_in = 3;
    }
    cn->in[2] = bname;
    cn->out[0] = bn->out[0];
    bn->dropped = 1;
    for (int i = 1; i < 5; i++) { /* parameters nothing else reads go with the node */
        int t = find_init(d, bn->in[i]), r;
        if (t >= 0 && readers(d, bn->in[i], &r) == 0 && !is_graph_input(d, bn->in[i])) d->inits[t].dropped = 1;
    }
    q->n_bn++;
out:
    for (int i = 0; i < 4; i++) free(p[i]);
    free(w);
    free(b);
    return rc;
}

static int add_act(qstate *q, const char *name, const char *src, int after)
{
    for (int i = 0; i < q->n_acts; i++)
        if (!strcmp(q->acts[i].name, name)) return i;
    if (q->n_acts == q->cap_acts) {
        int nc = q->cap_acts ? q->cap_acts * 2 : 32;
        actq *na = realloc(q->acts, (size_t)nc * sizeof *na);
        if (!na) return -1;
        q->acts = na;
        q->cap_acts = nc;
    }
    actq *a = &q->acts[q->n_acts];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->src = src;
    a->after_node = after;
    a->lo = 0;
    a->hi = 0;
    return q->n_acts++;
}

static int producer(const mts_onnx_doc *d, const char *name, int limit)
{
    for (int i = 0; i < limit; i++)
        for (int j = 0; j < d->nodes[i].n_out; j++)
            if (!d->nodes[i].dropped && !strcmp(d->nodes[i].out[j], name)) return i;
    return -1;
}

/* The output head: a node whose output is a graph output, or reaches one through a chain of
 * single-reader, one-output activation / layout ops (the final Sigmoid's input). */
static bool is_head(const mts_onnx_doc *d, int node)
{
    static const char *const pass[] = {"Sigmoid", "Tanh", "HardSigmoid", "Softmax", "Clip", "Relu",
                                       "Identity", "Reshape", "Transpose", NULL};
    const char *name = d->nodes[node].out[0];
    for (int step = 0; step < 8; step++) {
        if (is_graph_output(d, name)) return true;
        int r;
        if (readers(d, name, &r) != 1 || d->nodes[r].n_out != 1 || d->nodes[r].domain[0]) return false;
        bool ok = false;
        for (int i = 0; pass[i]; i++) ok = ok || !strcmp(d->nodes[r].op_type, pass[i]);
        if (!ok) return false;
        name = d->nodes[r].out[0];
    }
    return false;
}

/* The first convolution on raw pixels: a Conv reading a 4-D graph input of at most 6 channels
 * (RGB / stacked RGB frames), whose integer rounding of the pixels and of its wide-range output
 * is the most sensitive step of the lip-sync models (docs/engine.md). */
static bool is_pixel_conv(const mts_onnx_doc *d, const mts_model *m, int node)
{
    const mts_onnx_node *n = &d->nodes[node];
    if (!plain_op(n, "Conv") || !is_graph_input(d, n->in[0])) return false;
    mts_model_info info;
    mts_model_get_info(m, &info);
    for (int i = 0; i < info.n_inputs; i++) {
        const mts_value *io = mts_model_input(m, i);
        if (strcmp(io->name, n->in[0])) continue;
        return io->rank == 4 && io->dims[1] >= 1 && io->dims[1] <= 6;
    }
    return false;
}

static bool list_has(const char *list, const char *name)
{
    size_t ln = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == ln && !strncmp(p, name, l)) return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

/* Whether node stays float (no weight quantization, no Q/DQ on its input or output). */
static bool keep_fp32(const qstate *q, const mts_model *m, int node)
{
    const mts_onnx_node *n = &q->d->nodes[node];
    if ((n->name && n->name[0] && list_has(q->keep, n->name)) || list_has(q->keep, n->out[0])) return true;
    if (!list_has(q->keep, "auto")) return false;
    return is_head(q->d, node) || is_pixel_conv(q->d, m, node);
}

/* Symmetric int8 per-channel quantization of weight initializer t along axis; adds the int8
 * tensor, its scales and zero points and a DequantizeLinear producing the weight's name.
 * Returns the scales (malloc'd, C of them) or NULL. */
static float *quant_weight(qstate *q, int t, int axis, int64_t *C_out, float **werr, mts_err *err)
{
    mts_onnx_doc *d = q->d;
    mts_onnx_init w0 = d->inits[t];
    int64_t n = 0;
    float *w = mts_onnx_init_floats(&w0, &n);
    if (!w) return NULL;
    int64_t C = w0.dims[axis], inner = 1, outer = 1;
    for (int i = axis + 1; i < w0.rank; i++) inner *= w0.dims[i];
    for (int i = 0; i < axis; i++) outer *= w0.dims[i];
    float *scale = calloc((size_t)(C ? C : 1), sizeof(float));
    int8_t *qw = malloc((size_t)(n ? n : 1));
    int8_t *zp = calloc((size_t)(C ? C : 1), 1);
    if (!scale || !qw || !zp) goto oom;
    for (int64_t c = 0; c < C; c++) {
        double amax = 0;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t k = 0; k < inner; k++) amax = fmax(amax, fabs(w[(o * C + c) * inner + k]));
        scale[c] = amax > 0 ? (float)(amax / 127.0) : 1.0f;
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t k = 0; k < inner; k++) {
                int64_t i = (o * C + c) * inner + k;
                float v = nearbyintf(w[i] / scale[c]);
                qw[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            }
    if (werr) { /* the dequantized weight's error, in place of the float weight */
        for (int64_t o = 0; o < outer; o++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t k = 0; k < inner; k++) {
                    int64_t i = (o * C + c) * inner + k;
                    w[i] = qw[i] * scale[c] - w[i];
                }
    }
    const char *qn = cat2(d, w0.name, "_quantized"), *sn = cat2(d, w0.name, "_scale"),
               *zn = cat2(d, w0.name, "_zero_point");
    int64_t cd[1] = {C};
    if (!qn || !sn || !zn || !mts_onnx_add_init(d, qn, MTS_DTYPE_INT8, w0.rank, w0.dims, qw, (size_t)n) ||
        !mts_onnx_add_init(d, sn, MTS_DTYPE_FLOAT, 1, cd, scale, (size_t)C * 4) ||
        !mts_onnx_add_init(d, zn, MTS_DTYPE_INT8, 1, cd, zp, (size_t)C))
        goto oom;
    const char *in[3] = {qn, sn, zn}, *out[1] = {w0.name};
    if (!mts_onnx_add_node(d, "DequantizeLinear", in, 3, out, 1, axis)) goto oom;
    d->inits[t].dropped = 1;
    if (werr) *werr = w;
    else free(w);
    free(qw);
    free(zp);
    *C_out = C;
    return scale;
oom:
    free(w);
    free(qw);
    free(zp);
    free(scale);
    mts_err_set(err, MTS_ENOMEM, "out of memory");
    return NULL;
}

/* ---- calibration ---- */

typedef struct calib_set {
    int n_samples;
    int n_inputs;
    mts_tensor *t; /* [sample * n_inputs + input] */
} calib_set;

static void calib_free(calib_set *c)
{
    if (c->t)
        for (int i = 0; i < c->n_samples * c->n_inputs; i++) free(c->t[i].data);
    free(c->t);
    memset(c, 0, sizeof *c);
}

static bool file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int calib_load(const mts_model *m, const char *spec, uint64_t seed, const mts_cli_dims *dims, calib_set *cs,
                      mts_err *err)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    cs->n_inputs = info.n_inputs;
    if (!strncmp(spec, "random:", 7)) {
        char *end;
        errno = 0;
        long n = strtol(spec + 7, &end, 10);
        if (errno || *end || n < 1 || n > 10000)
            return mts_err_set(err, MTS_EINVAL, "--calibration random:N wants N in 1..10000 (got '%s')", spec + 7);
        cs->n_samples = (int)n;
        if (!(cs->t = calloc((size_t)n * (size_t)info.n_inputs, sizeof(mts_tensor))))
            return mts_err_set(err, MTS_ENOMEM, "out of memory");
        uint64_t s = seed ? seed : 0x9e3779b97f4a7c15ull;
        for (int k = 0; k < cs->n_samples; k++)
            for (int i = 0; i < info.n_inputs; i++) {
                mts_tensor *t = &cs->t[k * info.n_inputs + i];
                int rc = mts_cli_input_shape(m, i, 1, dims, t, err);
                if (rc) return rc;
                mts_dtype dt = t->dtype;
                if (dt != MTS_DTYPE_FLOAT && dt != MTS_DTYPE_INT64 && dt != MTS_DTYPE_INT32)
                    return mts_err_set(err, MTS_EUNSUPPORTED,
                                       "input '%s' is %s: random calibration draws float, int64 and int32 inputs "
                                       "(give a calibration folder)",
                                       mts_model_input(m, i)->name, mts_dtype_name(dt));
                int64_t ne = mts_tensor_numel(t);
                size_t es = mts_dtype_size(dt);
                if (ne < 0 || ne > ((int64_t)1 << 30) || !(t->data = malloc((size_t)(ne ? ne : 1) * es)))
                    return mts_err_set(err, MTS_ENOMEM, "input '%s': cannot allocate %lld elements",
                                       mts_model_input(m, i)->name, (long long)ne);
                for (int64_t e = 0; e < ne; e++) {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    if (dt == MTS_DTYPE_FLOAT) ((float *)t->data)[e] = (float)((s >> 40) & 0xffffff) / 16777216.0f;
                    else if (dt == MTS_DTYPE_INT64) ((int64_t *)t->data)[e] = (int64_t)(s & 1);
                    else ((int32_t *)t->data)[e] = (int32_t)(s & 1);
                }
            }
        return MTS_OK;
    }
    /* DIR/NAME.npy or DIR/NAME_k.npy */
    int count = -1;
    char path[4096];
    for (int i = 0; i < info.n_inputs; i++) {
        const char *nm = mts_model_input(m, i)->name;
        int c = 0;
        snprintf(path, sizeof path, "%s/%s.npy", spec, nm);
        if (file_exists(path)) {
            c = 1;
        } else {
            for (c = 0; c < 100000; c++) {
                snprintf(path, sizeof path, "%s/%s_%d.npy", spec, nm, c);
                if (!file_exists(path)) break;
            }
        }
        if (c == 0)
            return mts_err_set(err, MTS_ENOTFOUND, "calibration: no %s/%s.npy nor %s/%s_0.npy for input '%s'", spec, nm,
                               spec, nm, nm);
        if (count >= 0 && c != count)
            return mts_err_set(err, MTS_EINVAL, "calibration: input '%s' has %d samples in %s, an earlier input %d", nm,
                               c, spec, count);
        count = c;
    }
    if (count < 1) return mts_err_set(err, MTS_EINVAL, "calibration: the model has no inputs");
    cs->n_samples = count;
    if (!(cs->t = calloc((size_t)count * (size_t)info.n_inputs, sizeof(mts_tensor))))
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    for (int k = 0; k < count; k++)
        for (int i = 0; i < info.n_inputs; i++) {
            const char *nm = mts_model_input(m, i)->name;
            snprintf(path, sizeof path, "%s/%s.npy", spec, nm);
            if (count > 1 || !file_exists(path)) snprintf(path, sizeof path, "%s/%s_%d.npy", spec, nm, k);
            int rc = mts_npy_read(path, &cs->t[k * info.n_inputs + i], err);
            if (rc) return rc;
        }
    return MTS_OK;
}

static void range_update(actq *a, const mts_tensor *t)
{
    int64_t n = mts_tensor_numel(t);
    if (t->dtype != MTS_DTYPE_FLOAT || n <= 0 || !t->data) return;
    const float *x = t->data;
    double lo = a->seen ? a->lo : x[0], hi = a->seen ? a->hi : x[0];
    for (int64_t i = 0; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    a->lo = lo;
    a->hi = hi;
    a->seen = true;
    /* per-channel sums along axis 1 (the same channel count in every sample, else none) */
    if (t->rank < 2 || t->dims[1] < 1 || (a->csum && a->nch != t->dims[1]) || a->nch < 0) {
        free(a->csum);
        a->csum = NULL;
        a->nch = -1;
        return;
    }
    int64_t C = t->dims[1], outer = t->dims[0], inner = outer > 0 && C > 0 ? n / outer / C : 0;
    if (!a->csum) {
        if (!(a->csum = calloc((size_t)C, sizeof(double)))) {
            a->nch = -1;
            return;
        }
        a->nch = C;
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t c = 0; c < C; c++) {
            const float *p = x + (o * C + c) * inner;
            double sum = 0;
            for (int64_t i = 0; i < inner; i++) sum += p[i];
            a->csum[c] += sum;
        }
    a->ccount += (double)(outer * inner);
}

/* Second pass: histogram of the values over the min/max range of the first. */
static void hist_update(actq *a, const mts_tensor *t)
{
    int64_t n = mts_tensor_numel(t);
    if (t->dtype != MTS_DTYPE_FLOAT || n <= 0 || !t->data || !a->seen) return;
    double L = fmin(0, a->lo), H = fmax(0, a->hi);
    if (!(H > L)) return;
    if (!a->hist && !(a->hist = calloc(HBINS, sizeof(double)))) return;
    const float *x = t->data;
    double k = HBINS / (H - L);
    for (int64_t i = 0; i < n; i++) {
        if (x[i] == 0.0f) {
            a->zeros += 1;
            continue;
        }
        int b = (int)((x[i] - L) * k);
        a->hist[b < 0 ? 0 : b >= HBINS ? HBINS - 1 : b] += 1;
    }
}

/* The activation range to quantize over: the calibrated min/max, or a narrower one chosen from
 * the histogram. percentile: 0.01 % of the values cut, half at either end (an end at 0 stays).
 * mse: the [lo, hi] from a grid of shrunk ends that minimizes the expected squared error, taken
 * as step^2/12 for every non-zero value inside the range (exact zeros are exact) plus the squared
 * distance to the range for the values clipped. */
static void choose_range(const qstate *q, const actq *a, double *lo_out, double *hi_out)
{
    double L = fmin(0, a->lo), H = fmax(0, a->hi);
    *lo_out = L;
    *hi_out = H;
    if (q->method == CAL_MINMAX || !a->hist || !(H > L)) return;
    double w = (H - L) / HBINS, total = 0;
    for (int b = 0; b < HBINS; b++) total += a->hist[b];
    if (total <= 0) return;
    if (q->method == CAL_PERCENTILE) {
        double cut = total * 5e-5, acc = 0;
        if (L < 0)
            for (int b = 0; b < HBINS; b++) {
                acc += a->hist[b];
                if (acc > cut) {
                    *lo_out = fmin(0, L + b * w);
                    break;
                }
            }
        acc = 0;
        if (H > 0)
            for (int b = HBINS - 1; b >= 0; b--) {
                acc += a->hist[b];
                if (acc > cut) {
                    *hi_out = fmax(0, L + (b + 1) * w);
                    break;
                }
            }
        return;
    }
    enum { G = 64 };
    double best = INFINITY;
    for (int i = G / 5; i <= G; i++) {
        double lo = L < 0 ? L * i / G : 0;
        for (int j = G / 5; j <= G; j++) {
            double hi = H > 0 ? H * j / G : 0;
            if (!(hi > lo)) continue;
            double step = (hi - lo) / 255.0, e = 0, in = 0;
            for (int b = 0; b < HBINS; b++) {
                double c = a->hist[b];
                if (c == 0) continue;
                double x = L + (b + 0.5) * w;
                if (x < lo) e += c * (lo - x) * (lo - x);
                else if (x > hi) e += c * (x - hi) * (x - hi);
                else in += c;
            }
            e += in * step * step / 12.0;
            if (e < best) {
                best = e;
                *lo_out = lo;
                *hi_out = hi;
            }
            if (H <= 0) break;
        }
        if (L >= 0) break;
    }
}

/* Runs the float model with every activation to quantize as an extra output. */
static int calibrate(qstate *q, const mts_model *m0, const calib_set *cs, int threads, mts_err *err)
{
    mts_onnx_doc cd;
    int rc = mts_onnx_doc_read(&cd, q->d->bytes, q->d->len, q->d->file, err);
    if (rc) return rc;
    int *order = NULL, *slot = calloc((size_t)q->n_acts + 1, sizeof(int));
    mts_pbw w = {0};
    mts_model *m = NULL;
    mts_ctx *c = NULL;
    const mts_tensor **outs = NULL;
    if (!slot) goto oom;
    for (int i = 0; i < q->n_acts; i++) {
        slot[i] = -1;
        if (is_graph_input(&cd, q->acts[i].name)) continue;
        for (int o = 0; o < cd.n_outputs; o++)
            if (!strcmp(cd.outputs[o], q->acts[i].name)) slot[i] = o;
        if (slot[i] < 0) {
            slot[i] = cd.n_outputs;
            if (mts_onnx_add_output(&cd, q->acts[i].name)) goto oom;
        }
    }
    if (!(order = malloc(sizeof(int) * (size_t)(cd.n_nodes + 1)))) goto oom;
    for (int i = 0; i < cd.n_nodes; i++) order[i] = i;
    if ((rc = mts_onnx_doc_write(&cd, order, cd.n_nodes, &w, err))) goto out;
    if ((rc = mts_model_load_buffer(w.p, w.len, "calibration model", NULL, &m, err))) goto out;
    mts_pbw_free(&w);
    if ((rc = mts_ctx_create(m, threads, &c, err))) goto out;
    mts_model_info info;
    mts_model_get_info(m, &info);
    if (!(outs = calloc((size_t)info.n_outputs, sizeof *outs))) goto oom;
    for (int pass = 0; pass < (q->method == CAL_MINMAX ? 1 : 2); pass++)
        for (int k = 0; k < cs->n_samples; k++) {
            const mts_tensor *in = &cs->t[k * cs->n_inputs];
            if ((rc = mts_ctx_run(c, in, cs->n_inputs, outs, err))) {
                mts_err_prefix(err, "calibration sample %d: ", k);
                goto out;
            }
            for (int i = 0; i < q->n_acts; i++) {
                const mts_tensor *t = NULL;
                if (slot[i] >= 0) t = outs[slot[i]];
                for (int j = 0; !t && j < cs->n_inputs; j++)
                    if (!strcmp(mts_model_input(m0, j)->name, q->acts[i].name)) t = &in[j];
                if (t && pass == 0) range_update(&q->acts[i], t);
                else if (t) hist_update(&q->acts[i], t);
            }
        }
    rc = MTS_OK;
    goto out;
oom:
    rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
out:
    free(outs);
    if (c) mts_ctx_free(c);
    if (m) mts_model_free(m);
    mts_pbw_free(&w);
    free(order);
    free(slot);
    mts_onnx_doc_free(&cd);
    return rc;
}

/* ops whose definition is the same in every opset from 7 to 13 (for raising the import) */
static bool opset_stable(const char *op)
{
    static const char *const ok[] = {"Conv", "ConvTranspose", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Add",
                                     "Sub", "Mul", "Div", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool",
                                     "GlobalMaxPool", "BatchNormalization", "Gemm", "MatMul", "Transpose",
                                     "Reshape", "Flatten", "Identity", "HardSigmoid", "PRelu", "Elu", "Abs", "Exp",
                                     NULL};
    for (int i = 0; ok[i]; i++)
        if (!strcmp(ok[i], op)) return true;
    return false;
}

static int quantize(qstate *q, const mts_model *m, const calib_set *cs, int threads, mts_err *err)
{
    mts_onnx_doc *d = q->d;
    int rc;
    q->n_orig_nodes = d->n_nodes;
    if (d->opset < 13) {
        if (d->opset < 7)
            return mts_err_set(err, MTS_EUNSUPPORTED, "%s: opset %lld is too old (per-axis QDQ needs 13)", d->file,
                               (long long)d->opset);
        for (int i = 0; i < d->n_nodes; i++)
            if (d->nodes[i].domain[0] || !opset_stable(d->nodes[i].op_type))
                return mts_err_set(err, MTS_EUNSUPPORTED,
                                   "%s: opset %lld, and node '%s' (%s) changed before opset 13, which per-axis "
                                   "quantization needs: re-export the model with opset >= 13",
                                   d->file, (long long)d->opset, d->nodes[i].name, d->nodes[i].op_type);
        d->new_opset = 13;
    }
    bool control_flow = false;
    for (int i = 0; i < d->n_nodes; i++)
        if (!strcmp(d->nodes[i].op_type, "If") || !strcmp(d->nodes[i].op_type, "Loop") ||
            !strcmp(d->nodes[i].op_type, "Scan"))
            control_flow = true;
    /* 1. BatchNormalization folding */
    for (int i = 0; i < q->n_orig_nodes; i++)
        if (plain_op(&d->nodes[i], "Conv") && (rc = fold_bn(q, i, err))) return rc;
    /* 2. which nodes are quantized, and their activations */
    int *wnode = calloc((size_t)(q->n_orig_nodes > 0 ? q->n_orig_nodes : 1), sizeof(int)); /* 1 + weight axis */
    if (!wnode) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    for (int i = 0; i < q->n_orig_nodes; i++) {
        mts_onnx_node *n = &d->nodes[i];
        int axis = -1;
        int t = own_weight(d, i, 1);
        if (t < 0 || n->n_out != 1 || !n->in[0][0] || find_init(d, n->in[0]) >= 0) continue;
        if (keep_fp32(q, m, i)) {
            q->n_kept++;
            continue;
        }
        int rank = d->inits[t].rank;
        if (plain_op(n, "Conv") && rank >= 3) axis = 0;
        else if (plain_op(n, "ConvTranspose") && rank >= 3 && attr_int(n, "group", 1) == 1) axis = 1;
        else if (plain_op(n, "MatMul") && rank == 2) axis = 1;
        else if (plain_op(n, "Gemm") && rank == 2 && !attr_int(n, "transA", 0)) axis = attr_int(n, "transB", 0) ? 0 : 1;
        if (axis < 0) continue;
        wnode[i] = 1 + axis;
        bool known = false;
        for (int a = 0; a < q->n_acts; a++)
            if (!strcmp(q->acts[a].name, n->in[0])) known = true;
        int pa = producer(d, n->in[0], q->n_orig_nodes);
        if (!known && !is_graph_output(d, n->in[0]) && (pa >= 0 || is_graph_input(d, n->in[0])) &&
            add_act(q, n->in[0], n->in[0], pa) < 0)
            goto oom;
        if (is_graph_output(d, n->out[0])) continue;
        int r;
        const char *name = n->out[0];
        if (!control_flow && readers(d, n->out[0], &r) == 1 && plain_op(&d->nodes[r], "Relu") &&
            d->nodes[r].n_out == 1 && !is_graph_output(d, d->nodes[r].out[0])) {
            d->nodes[r].dropped = 1;
            name = d->nodes[r].out[0];
            q->n_relu++;
        }
        if (add_act(q, name, n->out[0], i) < 0) goto oom;
    }
    /* 3. calibration ranges (from the cache when it has every activation) */
    bool cached = q->cache != NULL;
    for (int i = 0; cached && i < q->n_acts; i++) {
        int c = -1;
        for (int k = 0; k < q->n_cache && c < 0; k++)
            if (!strcmp(q->cache[k].own_name, q->acts[i].name)) c = k;
        if (c < 0) cached = false;
    }
    if (cached) {
        for (int i = 0; i < q->n_acts; i++)
            for (int k = 0; k < q->n_cache; k++)
                if (!strcmp(q->cache[k].own_name, q->acts[i].name)) {
                    actq *a = &q->acts[i];
                    const actq *c = &q->cache[k];
                    a->lo = c->lo;
                    a->hi = c->hi;
                    a->seen = c->seen;
                    a->csum = c->csum;
                    a->nch = c->nch;
                    a->ccount = c->ccount;
                    a->hist = c->hist;
                    a->zeros = c->zeros;
                    break;
                }
        q->borrowed = true;
    } else {
        q->borrowed = false;
        if ((rc = calibrate(q, m, cs, threads, err))) goto out;
    }
    if (q->make_cache) {
        for (int i = 0; i < q->n_orig_nodes; i++) {
            if (!wnode[i]) continue;
            char **nq = realloc(q->qnodes, sizeof(char *) * (size_t)(q->n_qnodes + 1));
            if (!nq) goto oom;
            q->qnodes = nq;
            if (!(q->qnodes[q->n_qnodes] = strdup(d->nodes[i].out[0]))) goto oom;
            q->n_qnodes++;
        }
    }
    for (int i = 0; i < q->n_acts; i++) {
        actq *a = &q->acts[i];
        double lo, hi;
        choose_range(q, a, &lo, &hi);
        double s = (hi - lo) / 255.0;
        if (!a->seen || !(s > 0) || !isfinite(s)) s = 1.0;
        a->scale = (float)s;
        double z = nearbyint(-lo / (double)a->scale);
        a->zp = (uint8_t)(z < 0 ? 0 : z > 255 ? 255 : z);
    }
    /* 4. weights and biases */
    for (int i = 0; i < q->n_orig_nodes; i++) {
        if (!wnode[i]) continue;
        mts_onnx_node *n = &d->nodes[i];
        int t = own_weight(d, i, 1);
        int64_t C = 0;
        float *werr = NULL;
        bool conv = plain_op(n, "Conv");
        float *ws = quant_weight(q, t, wnode[i] - 1, &C, conv && q->bias_correct ? &werr : NULL, err);
        n = &d->nodes[i]; /* the node array may have moved */
        if (!ws) {
            rc = err->code ? err->code : mts_err_set(err, MTS_EFORMAT, "weight '%s' has no float data", n->in[1]);
            goto out;
        }
        /* Bias correction: the expected output shift of the rounded weights, sum over the
         * kernel of (w_q - w) * E[x channel], is taken off the bias (a zero bias is added to a
         * Conv that has none). Per-channel means come from the calibration pass. */
        const actq *xa0 = NULL;
        for (int a = 0; a < q->n_acts; a++)
            if (!strcmp(q->acts[a].name, n->in[0])) xa0 = &q->acts[a];
        if (werr && xa0 && xa0->csum && xa0->ccount > 0 && C > 0) {
            int64_t group = attr_int(n, "group", 1), Cg = d->inits[t].dims[1], per = 1;
            for (int r = 1; r < d->inits[t].rank; r++) per *= d->inits[t].dims[r];
            int64_t ksz = Cg > 0 ? per / Cg : 0;
            double *delta = calloc((size_t)C, sizeof(double));
            bool ok = delta && group >= 1 && C % group == 0 && Cg * group == xa0->nch && ksz > 0;
            for (int64_t c = 0; ok && c < C; c++) {
                int64_t g = c / (C / group);
                for (int64_t ic = 0; ic < Cg; ic++) {
                    double mean = xa0->csum[g * Cg + ic] / xa0->ccount, sw = 0;
                    for (int64_t k = 0; k < ksz; k++) sw += werr[(c * Cg + ic) * ksz + k];
                    delta[c] += sw * mean;
                }
            }
            if (ok) {
                if (n->n_in < 3 || !n->in[2][0]) {
                    const char **in = mts_pool_calloc(&d->pool, 3, sizeof(char *));
                    const char *bname = cat2(d, n->in[1], "_bias");
                    float *zb = calloc((size_t)C, sizeof(float));
                    int64_t bd[1] = {C};
                    if (!in || !bname || !zb || !mts_onnx_add_init(d, bname, MTS_DTYPE_FLOAT, 1, bd, zb, (size_t)C * 4)) {
                        free(zb);
                        free(delta);
                        free(werr);
                        free(ws);
                        goto oom;
                    }
                    free(zb);
                    n = &d->nodes[i];
                    in[0] = n->in[0];
                    in[1] = n->in[1];
                    in[2] = bname;
                    n->in = (const char **)in;
                    n->n_in = 3;
                }
                int bt0 = own_weight(d, i, 2);
                int64_t nb0 = 0;
                float *b0 = bt0 >= 0 ? mts_onnx_init_floats(&d->inits[bt0], &nb0) : NULL;
                if (b0 && nb0 == C) {
                    for (int64_t c = 0; c < C; c++) b0[c] = (float)(b0[c] - delta[c]);
                    int64_t bd[1] = {C};
                    if (replace_floats(d, bt0, b0, 1, bd)) {
                        free(b0);
                        free(delta);
                        free(werr);
                        free(ws);
                        goto oom;
                    }
                    q->n_bias_corr++;
                }
                free(b0);
            }
            free(delta);
        }
        free(werr);
        if (plain_op(n, "Conv")) q->n_conv++;
        else if (plain_op(n, "ConvTranspose")) q->n_convt++;
        else q->n_mm++;
        int bt = plain_op(n, "Conv") && n->n_in > 2 ? own_weight(d, i, 2) : -1;
        const actq *xa = NULL;
        for (int a = 0; a < q->n_acts; a++)
            if (!strcmp(q->acts[a].name, n->in[0])) xa = &q->acts[a];
        int64_t nb = 0;
        float *b = bt >= 0 && xa ? mts_onnx_init_floats(&d->inits[bt], &nb) : NULL;
        if (b && nb == C) {
            int32_t *qb = malloc((size_t)C * 4), *zb = calloc((size_t)C, 4);
            float *bs = malloc((size_t)C * 4);
            const char *bn = d->inits[bt].name, *qn = cat2(d, bn, "_quantized"), *sn = cat2(d, bn, "_scale"),
                       *zn = cat2(d, bn, "_zero_point");
            int64_t cd[1] = {C};
            bool ok = qb && zb && bs && qn && sn && zn;
            for (int64_t c = 0; ok && c < C; c++) {
                bs[c] = xa->scale * ws[c];
                double v = nearbyint((double)b[c] / (double)bs[c]);
                qb[c] = (int32_t)(v > 2147483647.0 ? 2147483647.0 : v < -2147483647.0 ? -2147483647.0 : v);
            }
            const char *in[3] = {qn, sn, zn}, *out[1] = {bn};
            ok = ok && mts_onnx_add_init(d, qn, MTS_DTYPE_INT32, 1, cd, qb, (size_t)C * 4) &&
                 mts_onnx_add_init(d, sn, MTS_DTYPE_FLOAT, 1, cd, bs, (size_t)C * 4) &&
                 mts_onnx_add_init(d, zn, MTS_DTYPE_INT32, 1, cd, zb, (size_t)C * 4) &&
                 mts_onnx_add_node(d, "DequantizeLinear", in, 3, out, 1, 0);
            if (ok) {
                d->inits[bt].dropped = 1;
                q->n_bias++;
            }
            free(qb);
            free(zb);
            free(bs);
            if (!ok) {
                free(b);
                free(ws);
                goto oom;
            }
        }
        free(b);
        free(ws);
    }
    /* 5. activation QuantizeLinear / DequantizeLinear pairs; readers redirected */
    for (int i = 0; i < q->n_acts; i++) {
        actq *a = &q->acts[i];
        const char *qn = cat2(d, a->name, "_quantized"), *dqn = cat2(d, a->name, "_dequantized"),
                   *sn = cat2(d, a->name, "_scale"), *zn = cat2(d, a->name, "_zero_point");
        if (!qn || !dqn || !sn || !zn || !mts_onnx_add_init(d, sn, MTS_DTYPE_FLOAT, 0, NULL, &a->scale, 4) ||
            !mts_onnx_add_init(d, zn, MTS_DTYPE_UINT8, 0, NULL, &a->zp, 1))
            goto oom;
        for (int k = 0; k < q->n_orig_nodes; k++) {
            mts_onnx_node *n = &d->nodes[k];
            if (n->dropped) continue;
            for (int j = 0; j < n->n_in; j++)
                if (!strcmp(n->in[j], a->name)) n->in[j] = dqn;
        }
        const char *qin[3] = {a->src, sn, zn}, *qout[1] = {qn};
        const char *din[3] = {qn, sn, zn}, *dout[1] = {dqn};
        a->q_node = d->n_nodes;
        if (!mts_onnx_add_node(d, "QuantizeLinear", qin, 3, qout, 1, INT64_MIN)) goto oom;
        a->dq_node = d->n_nodes;
        if (!mts_onnx_add_node(d, "DequantizeLinear", din, 3, dout, 1, INT64_MIN)) goto oom;
    }
    rc = MTS_OK;
    goto out;
oom:
    rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
out:
    free(wnode);
    return rc;
}

/* Node order: weight and bias DequantizeLinear first, graph-input activations' pairs, then the
 * original nodes, each followed by the pairs of the activations it produces. */
static int *node_order(const qstate *q, int *n_order)
{
    const mts_onnx_doc *d = q->d;
    int *order = malloc(sizeof(int) * (size_t)(d->n_nodes + 1));
    if (!order) return NULL;
    int n = 0;
    bool *is_act = calloc((size_t)d->n_nodes + 1, 1);
    if (!is_act) {
        free(order);
        return NULL;
    }
    for (int i = 0; i < q->n_acts; i++) is_act[q->acts[i].q_node] = is_act[q->acts[i].dq_node] = true;
    for (int i = q->n_orig_nodes; i < d->n_nodes; i++)
        if (!is_act[i]) order[n++] = i;
    for (int i = 0; i < q->n_acts; i++)
        if (q->acts[i].after_node < 0) order[n++] = q->acts[i].q_node, order[n++] = q->acts[i].dq_node;
    for (int k = 0; k < q->n_orig_nodes; k++) {
        order[n++] = k;
        for (int i = 0; i < q->n_acts; i++)
            if (q->acts[i].after_node == k) order[n++] = q->acts[i].q_node, order[n++] = q->acts[i].dq_node;
    }
    free(is_act);
    *n_order = n;
    return order;
}

static void free_acts(qstate *q)
{
    for (int i = 0; i < q->n_acts; i++)
        if (!q->borrowed) {
            free(q->acts[i].csum);
            free(q->acts[i].hist);
        }
    free(q->acts);
    q->acts = NULL;
    q->n_acts = q->cap_acts = 0;
}

/* One quantization of the model in bytes with q's settings into w (freed first). With
 * q->make_cache, the calibrated ranges are kept in q->cache for the builds that follow. */
static int build(qstate *q, const mts_model *m, const calib_set *cs, int threads, const uint8_t *bytes, size_t len,
                 const char *file, mts_pbw *w, mts_err *err)
{
    mts_onnx_doc doc = {0};
    int *order = NULL, n_order = 0;
    free_acts(q);
    q->n_orig_nodes = q->n_conv = q->n_convt = q->n_mm = q->n_bn = q->n_relu = q->n_bias = 0;
    q->n_kept = q->n_bias_corr = 0;
    mts_pbw_free(w);
    memset(w, 0, sizeof *w);
    int rc = mts_onnx_doc_read(&doc, bytes, len, file, err);
    if (rc) goto out;
    q->d = &doc;
    if ((rc = quantize(q, m, cs, threads, err))) goto out;
    if (!(order = node_order(q, &n_order))) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = mts_onnx_doc_write(&doc, order, n_order, w, err))) goto out;
    q->opset_out = doc.new_opset > doc.opset ? doc.new_opset : doc.opset;
    q->n_acts_out = q->n_acts;
    if (q->make_cache && !q->borrowed) { /* the ranges move to the cache, names copied */
        for (int i = 0; i < q->n_acts; i++)
            if (!(q->acts[i].own_name = strdup(q->acts[i].name))) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                goto out;
            }
        q->cache = q->acts;
        q->n_cache = q->n_acts;
        q->acts = NULL;
        q->n_acts = q->cap_acts = 0;
        q->make_cache = false;
    }
out:
    free(order);
    q->d = NULL;
    mts_onnx_doc_free(&doc);
    return rc;
}

/* The float outputs of model m on every calibration sample (copies), [sample * n_out + o]. */
typedef struct out_set {
    int n_out, n_samples;
    float **v;
    int64_t *n;
} out_set;

static void outs_free(out_set *o)
{
    if (o->v)
        for (int i = 0; i < o->n_out * o->n_samples; i++) free(o->v[i]);
    free(o->v);
    free(o->n);
    memset(o, 0, sizeof *o);
}

static int run_outputs(mts_model *m, const calib_set *cs, int threads, out_set *o, mts_err *err)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    mts_ctx *c = NULL;
    const mts_tensor **outs = calloc((size_t)info.n_outputs + 1, sizeof *outs);
    int rc = MTS_OK;
    o->n_out = info.n_outputs;
    o->n_samples = cs->n_samples;
    o->v = calloc((size_t)(o->n_out * o->n_samples) + 1, sizeof(float *));
    o->n = calloc((size_t)(o->n_out * o->n_samples) + 1, sizeof(int64_t));
    if (!outs || !o->v || !o->n) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = mts_ctx_create(m, threads, &c, err))) goto out;
    for (int k = 0; k < cs->n_samples; k++) {
        if ((rc = mts_ctx_run(c, &cs->t[k * cs->n_inputs], cs->n_inputs, outs, err))) goto out;
        for (int j = 0; j < o->n_out; j++) {
            int64_t ne = mts_tensor_numel(outs[j]);
            if (outs[j]->dtype != MTS_DTYPE_FLOAT || ne <= 0 || !outs[j]->data) continue;
            float *cp = malloc((size_t)ne * sizeof(float));
            if (!cp) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                goto out;
            }
            memcpy(cp, outs[j]->data, (size_t)ne * sizeof(float));
            o->v[k * o->n_out + j] = cp;
            o->n[k * o->n_out + j] = ne;
        }
    }
out:
    if (c) mts_ctx_free(c);
    free(outs);
    return rc;
}

/* Max and mean abs difference of the quantized model in w from the float outputs ref. */
static int eval_error(const mts_pbw *w, const calib_set *cs, const out_set *ref, int threads, double *emax,
                      double *emean, mts_err *err)
{
    mts_model *m = NULL;
    out_set o = {0};
    int rc = mts_model_load_buffer(w->p, w->len, "quantized model", NULL, &m, err);
    if (!rc) rc = run_outputs(m, cs, threads, &o, err);
    double mx = 0, sum = 0, cnt = 0;
    for (int i = 0; !rc && i < ref->n_out * ref->n_samples && i < o.n_out * o.n_samples; i++) {
        if (!ref->v[i] || !o.v[i] || ref->n[i] != o.n[i]) continue;
        for (int64_t e = 0; e < o.n[i]; e++) {
            double dd = fabs((double)o.v[i][e] - ref->v[i][e]);
            if (!(dd <= mx)) mx = isnan(dd) ? INFINITY : dd;
            sum += dd;
        }
        cnt += (double)o.n[i];
    }
    *emax = mx;
    *emean = cnt > 0 ? sum / cnt : 0;
    outs_free(&o);
    if (m) mts_model_free(m);
    return rc;
}

typedef struct sens {
    const char *name;
    double emax, emean;
} sens;

static int sens_cmp(const void *a, const void *b)
{
    const sens *x = a, *y = b;
    return x->emean < y->emean ? -1 : x->emean > y->emean ? 1 : 0;
}

/* --target-error E: per-layer sensitivity on the calibration set (the output error with each
 * quantized node alone kept in float), then the most sensitive nodes kept in float one by one,
 * most sensitive first, until the max abs output error is at most E. Leaves the chosen model in
 * w and the keep list (owned) in *keep_out. */
static int search_keep(qstate *q, mts_model *m, const calib_set *cs, int threads, const uint8_t *bytes, size_t len,
                       const char *file, double target, mts_pbw *w, char **keep_out, double *emax, double *emean,
                       int *n_added, mts_err *err)
{
    out_set ref = {0};
    sens *sv = NULL;
    char *keep = NULL;
    const char *base = q->keep;
    int rc = run_outputs(m, cs, threads, &ref, err);
    *n_added = 0;
    q->make_cache = true;
    if (!rc) rc = build(q, m, cs, threads, bytes, len, file, w, err);
    if (!rc) rc = eval_error(w, cs, &ref, threads, emax, emean, err);
    if (rc || *emax <= target || q->n_qnodes == 0) goto out;
    size_t cap = strlen(base) + 2;
    for (int i = 0; i < q->n_qnodes; i++) cap += strlen(q->qnodes[i]) + 1;
    if (!(sv = calloc((size_t)q->n_qnodes, sizeof *sv)) || !(keep = malloc(cap))) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < q->n_qnodes; i++) {
        snprintf(keep, cap, "%s,%s", base, q->qnodes[i]);
        q->keep = keep;
        sv[i].name = q->qnodes[i];
        if ((rc = build(q, m, cs, threads, bytes, len, file, w, err)) ||
            (rc = eval_error(w, cs, &ref, threads, &sv[i].emax, &sv[i].emean, err)))
            goto out;
    }
    qsort(sv, (size_t)q->n_qnodes, sizeof *sv, sens_cmp);
    for (int i = 0; i < q->n_qnodes; i++)
        printf("sensitivity node=%s max_error_if_float=%g mean_error_if_float=%g (all quantized: %g, %g)\n",
               sv[i].name, sv[i].emax, sv[i].emean, *emax, *emean);
    snprintf(keep, cap, "%s", base);
    for (int i = 0; i < q->n_qnodes && *emax > target; i++) {
        size_t l = strlen(keep);
        snprintf(keep + l, cap - l, ",%s", sv[i].name);
        q->keep = keep;
        if ((rc = build(q, m, cs, threads, bytes, len, file, w, err)) ||
            (rc = eval_error(w, cs, &ref, threads, emax, emean, err)))
            goto out;
        ++*n_added;
    }
out:
    q->keep = base;
    outs_free(&ref);
    free(sv);
    if (!rc && keep) *keep_out = keep;
    else free(keep);
    return rc;
}

static int read_file(const char *path, uint8_t **buf, size_t *len, mts_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return mts_err_set(err, MTS_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        fclose(f);
        return mts_err_set(err, MTS_EIO, "%s: not a regular file", path);
    }
    *len = (size_t)st.st_size;
    *buf = malloc(*len ? *len : 1);
    if (!*buf) {
        fclose(f);
        return mts_err_set(err, MTS_ENOMEM, "%s: cannot hold %zu bytes", path, *len);
    }
    size_t got = fread(*buf, 1, *len, f);
    fclose(f);
    if (got != *len) return mts_err_set(err, MTS_EIO, "%s: short read", path);
    return MTS_OK;
}

int mts_cli_quantize(int argc, char **argv)
{
    const char *model = NULL, *calib = NULL, *outp = NULL;
    int threads = 2;
    uint64_t seed = 0;
    double target = -1;
    mts_cli_dims dims = {0};
    qstate q = {0};
    q.method = CAL_MINMAX;
    q.bias_correct = true;
    q.keep = "auto";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--calibration") && has) {
            calib = argv[++i];
        } else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has) {
            outp = argv[++i];
        } else if (!strcmp(a, "--threads") && has) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(a, "--calibrate") && has) {
            const char *v = argv[++i];
            if (!strcmp(v, "minmax")) q.method = CAL_MINMAX;
            else if (!strcmp(v, "percentile")) q.method = CAL_PERCENTILE;
            else if (!strcmp(v, "mse")) q.method = CAL_MSE;
            else {
                fprintf(stderr, QPFX "--calibrate wants minmax, percentile or mse (got '%s')\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--bias-correction") && has) {
            const char *v = argv[++i];
            if (strcmp(v, "on") && strcmp(v, "off")) {
                fprintf(stderr, QPFX "--bias-correction wants on or off (got '%s')\n", v);
                return 2;
            }
            q.bias_correct = !strcmp(v, "on");
        } else if (!strcmp(a, "--keep-fp32") && has) {
            q.keep = argv[++i];
            if (strlen(q.keep) > 65536) {
                fprintf(stderr, QPFX "--keep-fp32: list too long\n");
                return 2;
            }
        } else if (!strcmp(a, "--target-error") && has) {
            char *end;
            target = strtod(argv[++i], &end);
            if (*end || !(target >= 0) || !isfinite(target)) {
                fprintf(stderr, QPFX "--target-error wants a number >= 0 (got '%s')\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--seed") && has) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--dim") && has) {
            if (mts_cli_parse_dim(&dims, argv[++i])) {
                fprintf(stderr, QPFX "bad --dim '%s' (want NAME=VALUE)\n", argv[i]);
                mts_cli_dims_free(&dims);
                return 2;
            }
        } else if (a[0] != '-' && !model) {
            model = a;
        } else {
            fprintf(stderr, QPFX "unexpected argument '%s'\n", a);
            usage(stderr);
            mts_cli_dims_free(&dims);
            return 2;
        }
    }
    if (!model || !calib || !outp || threads < 1 || threads > 256) {
        usage(stderr);
        mts_cli_dims_free(&dims);
        return 2;
    }
    mts_err err = {0};
    mts_model *m = NULL;
    uint8_t *bytes = NULL;
    size_t len = 0;
    calib_set cs = {0};
    int rc, n_added = 0;
    char *keep_found = NULL;
    double emax = 0, emean = 0;
    mts_pbw w = {0};
    double t0 = mts_cli_now_ms();
    if ((rc = mts_model_load(model, NULL, &m, &err))) goto fail;
    if ((rc = read_file(model, &bytes, &len, &err))) goto fail;
    rc = calib_load(m, calib, seed, &dims, &cs, &err);
    mts_cli_dims_free(&dims);
    if (rc) goto fail;
    if (target >= 0) {
        if ((rc = search_keep(&q, m, &cs, threads, bytes, len, model, target, &w, &keep_found, &emax, &emean,
                              &n_added, &err)))
            goto fail;
    } else if ((rc = build(&q, m, &cs, threads, bytes, len, model, &w, &err))) {
        goto fail;
    }
    FILE *f = fopen(outp, "wb");
    if (!f || fwrite(w.p, 1, w.len, f) != w.len) {
        if (f) fclose(f);
        rc = mts_err_set(&err, MTS_EIO, "%s: %s", outp, strerror(errno));
        goto fail;
    }
    if (fclose(f)) {
        rc = mts_err_set(&err, MTS_EIO, "%s: %s", outp, strerror(errno));
        goto fail;
    }
    /* the result must load */
    mts_model *check = NULL;
    if ((rc = mts_model_load(outp, NULL, &check, &err))) {
        mts_err_prefix(&err, "the written model does not load: ");
        goto fail;
    }
    mts_model_free(check);
    if (target >= 0)
        printf("search target_error=%g max_error=%g mean_error=%g kept_fp32_added=%d keep=%s%s\n", target, emax,
               emean, n_added, keep_found ? keep_found : q.keep, emax > target ? " (target not reached)" : "");
    printf("quantized model=%s out=%s conv=%d conv_transpose=%d matmul_gemm=%d activations=%d int32_bias=%d "
           "bn_folded=%d relu_dropped=%d calibrate=%s bias_corrected=%d kept_fp32=%d calibration_samples=%d "
           "opset=%lld bytes=%zu ms=%.0f\n",
           model, outp, q.n_conv, q.n_convt, q.n_mm, q.n_acts_out, q.n_bias, q.n_bn, q.n_relu,
           q.method == CAL_MINMAX ? "minmax" : q.method == CAL_PERCENTILE ? "percentile" : "mse", q.n_bias_corr,
           q.n_kept, cs.n_samples,
           (long long)q.opset_out, w.len, mts_cli_now_ms() - t0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, QPFX "%s (%s)\n", err.msg, mts_status_name(rc));
    rc = 1;
done:
    mts_pbw_free(&w);
    free_acts(&q);
    for (int i = 0; i < q.n_cache; i++) {
        free(q.cache[i].csum);
        free(q.cache[i].hist);
        free(q.cache[i].own_name);
    }
    free(q.cache);
    for (int i = 0; i < q.n_qnodes; i++) free(q.qnodes[i]);
    free(q.qnodes);
    free(keep_found);
    calib_free(&cs);
    free(bytes);
    if (m) mts_model_free(m);
    return rc;
}
