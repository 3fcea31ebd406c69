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
 * of batch 1 uniform in [0, 1).
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
    float scale;
    uint8_t zp;
    int q_node, dq_node;
    int after_node;   /* original node whose output src is; -1 for a graph input */
} actq;

typedef struct qstate {
    mts_onnx_doc *d;
    actq *acts;
    int n_acts, cap_acts;
    int n_orig_nodes;
    int n_conv, n_convt, n_mm, n_bn, n_relu, n_bias;
} qstate;

static void usage(FILE *f)
{
    fprintf(f, "usage: mtserve quantize MODEL --calibration DIR|random:N -o OUT.onnx [--threads T] [--seed S]\n"
               "  Post-training static int8 quantization into a QDQ ONNX model: int8 per-channel\n"
               "  weights for Conv, ConvTranspose, MatMul and Gemm, uint8 activations calibrated on\n"
               "  DIR/NAME.npy or DIR/NAME_0.npy, DIR/NAME_1.npy, ... per model input NAME, or on N\n"
               "  seeded random inputs in [0,1) of batch 1.\n");
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

/* Symmetric int8 per-channel quantization of weight initializer t along axis; adds the int8
 * tensor, its scales and zero points and a DequantizeLinear producing the weight's name.
 * Returns the scales (malloc'd, C of them) or NULL. */
static float *quant_weight(qstate *q, int t, int axis, int64_t *C_out, mts_err *err)
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
    free(w);
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

static int calib_load(const mts_model *m, const char *spec, uint64_t seed, calib_set *cs, mts_err *err)
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
        mts_cli_dims dims = {0};
        for (int k = 0; k < cs->n_samples; k++)
            for (int i = 0; i < info.n_inputs; i++) {
                mts_tensor *t = &cs->t[k * info.n_inputs + i];
                int rc = mts_cli_input_shape(m, i, 1, &dims, t, err);
                if (rc) return rc;
                if (t->dtype != MTS_DTYPE_FLOAT)
                    return mts_err_set(err, MTS_EUNSUPPORTED, "input '%s' is %s: random calibration is for float inputs",
                                       mts_model_input(m, i)->name, mts_dtype_name(t->dtype));
                int64_t ne = mts_tensor_numel(t);
                if (ne < 0 || ne > ((int64_t)1 << 30) || !(t->data = malloc((size_t)(ne ? ne : 1) * 4)))
                    return mts_err_set(err, MTS_ENOMEM, "input '%s': cannot allocate %lld elements",
                                       mts_model_input(m, i)->name, (long long)ne);
                for (int64_t e = 0; e < ne; e++) {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    ((float *)t->data)[e] = (float)((s >> 40) & 0xffffff) / 16777216.0f;
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
    for (int k = 0; k < cs->n_samples; k++) {
        const mts_tensor *in = &cs->t[k * cs->n_inputs];
        if ((rc = mts_ctx_run(c, in, cs->n_inputs, outs, err))) {
            mts_err_prefix(err, "calibration sample %d: ", k);
            goto out;
        }
        for (int i = 0; i < q->n_acts; i++) {
            if (slot[i] >= 0) {
                range_update(&q->acts[i], outs[slot[i]]);
                continue;
            }
            for (int j = 0; j < cs->n_inputs; j++)
                if (!strcmp(mts_model_input(m0, j)->name, q->acts[i].name)) range_update(&q->acts[i], &in[j]);
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
    /* 3. calibration ranges */
    if ((rc = calibrate(q, m, cs, threads, err))) goto out;
    for (int i = 0; i < q->n_acts; i++) {
        actq *a = &q->acts[i];
        double lo = fmin(0, a->lo), hi = fmax(0, a->hi);
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
        float *ws = quant_weight(q, t, wnode[i] - 1, &C, err);
        n = &d->nodes[i]; /* the node array may have moved */
        if (!ws) {
            rc = err->code ? err->code : mts_err_set(err, MTS_EFORMAT, "weight '%s' has no float data", n->in[1]);
            goto out;
        }
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
        } else if (!strcmp(a, "--seed") && has) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (a[0] != '-' && !model) {
            model = a;
        } else {
            fprintf(stderr, QPFX "unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || !calib || !outp || threads < 1 || threads > 256) {
        usage(stderr);
        return 2;
    }
    mts_err err = {0};
    mts_model *m = NULL;
    uint8_t *bytes = NULL;
    size_t len = 0;
    mts_onnx_doc doc = {0};
    calib_set cs = {0};
    qstate q = {0};
    int *order = NULL, rc;
    mts_pbw w = {0};
    double t0 = mts_cli_now_ms();
    if ((rc = mts_model_load(model, NULL, &m, &err))) goto fail;
    if ((rc = read_file(model, &bytes, &len, &err))) goto fail;
    if ((rc = mts_onnx_doc_read(&doc, bytes, len, model, &err))) goto fail;
    if ((rc = calib_load(m, calib, seed, &cs, &err))) goto fail;
    q.d = &doc;
    if ((rc = quantize(&q, m, &cs, threads, &err))) goto fail;
    int n_order = 0;
    if (!(order = node_order(&q, &n_order))) {
        rc = mts_err_set(&err, MTS_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = mts_onnx_doc_write(&doc, order, n_order, &w, &err))) goto fail;
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
    printf("quantized model=%s out=%s conv=%d conv_transpose=%d matmul_gemm=%d activations=%d int32_bias=%d "
           "bn_folded=%d relu_dropped=%d calibration_samples=%d opset=%lld bytes=%zu ms=%.0f\n",
           model, outp, q.n_conv, q.n_convt, q.n_mm, q.n_acts, q.n_bias, q.n_bn, q.n_relu, cs.n_samples,
           (long long)(doc.new_opset > doc.opset ? doc.new_opset : doc.opset), w.len, mts_cli_now_ms() - t0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, QPFX "%s (%s)\n", err.msg, mts_status_name(rc));
    rc = 1;
done:
    mts_pbw_free(&w);
    free(order);
    free(q.acts);
    calib_free(&cs);
    mts_onnx_doc_free(&doc);
    free(bytes);
    if (m) mts_model_free(m);
    return rc;
}
