/*
 * Per-model precision (mts_load_opts.precision) and the bf16 accuracy guard.
 *
 * "bf16" and "auto" (on a CPU that computes bf16 natively) mark the model so that the oneDNN
 * backend builds its convolutions and constant-weight products in bf16 (dnnl_conv.c). Before
 * the model is handed out, the guard loads a second, fp32 instance of the same file and runs
 * both on calibration inputs: the .npy files of a calibration/ folder beside the model (one
 * file per input, named after it; for a model with one input every .npy file is a batch of it),
 * else one seeded random batch of one sample with values in [0, 1) (integer inputs 0 or 1): the
 * guard costs a second load, two plans and two runs (lip-sync w32: seconds on a busy 2-core
 * machine), so it runs no more than that.
 * The worst relative L2 error over the float outputs must stay within max_error; otherwise the
 * fp32 instance replaces the bf16 one and the model reports why. A model on which oneDNN made no
 * bf16 step (a CPU without AVX-512, where oneDNN offers only reference bf16 kernels) also
 * stays fp32. "fp16" marks the model so that its few-row MatMul/Gemm products keep IEEE half
 * weights (kernels/fast_sgemm.c), under the same guard; a model where no product took them
 * (no AVX-512, or only products with many rows) stays fp32. "int8" keeps the quantized kernels
 * of a QDQ model; a float model runs in fp32.
 */
#include <cpuid.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "util/npy.h"

#define GUARD_MAX_FILES 16
#define GUARD_DEFAULT_MAX_ERROR 1e-2

const char *mts_cpu_bf16_native(void)
{
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return NULL;
    __cpuid_count(7, 0, a, b, c, d);
    if (d & (1u << 22)) return "amx_bf16";
    __cpuid_count(7, 1, a, b, c, d);
    if (a & (1u << 5)) return "avx512_bf16";
    return NULL;
}

static const char *const g_names[] = {"fp32", "bf16", "auto", "int8", "fp16"};

const char *mts_precision_check(const char *name)
{
    for (size_t i = 0; i < sizeof g_names / sizeof g_names[0]; i++)
        if (!strcmp(name, g_names[i])) return NULL;
    return "expected auto, fp32, bf16, fp16 or int8";
}

static const char *canon(const char *name)
{
    for (size_t i = 0; i < sizeof g_names / sizeof g_names[0]; i++)
        if (!strcmp(name, g_names[i])) return g_names[i];
    return g_names[0];
}

const mts_precision_info *mts_model_precision(const mts_model *m)
{
    while (m->root) m = m->root;
    return &m->prec;
}

static bool is_qdq(const mts_model *m)
{
    static const char *const q[] = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
                                    "MatMulInteger", "ConvInteger", "DynamicQuantizeLinear"};
    for (int i = 0; i < m->n_nodes; i++)
        for (size_t k = 0; k < sizeof q / sizeof q[0]; k++)
            if (!m->nodes[i].domain[0] && !strcmp(m->nodes[i].op_type, q[k])) return true;
    return false;
}

static void set(mts_model *m, const char *effective, const char *fmt, const char *a)
{
    m->prec.effective = effective;
    snprintf(m->prec_reason, sizeof m->prec_reason, fmt, a ? a : "");
    m->prec.reason = m->prec_reason;
}

/* One set of guard inputs (owned data). */
typedef struct gset {
    mts_tensor t[16];
    int n;
} gset;

static void gset_free(gset *s)
{
    for (int i = 0; i < s->n; i++) free(s->t[i].data);
    s->n = 0;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static int random_set(const mts_model *m, uint64_t seed, gset *s, mts_err *err)
{
    for (int i = 0; i < m->n_inputs; i++) {
        const mts_value *v = &m->values[m->inputs[i]];
        mts_tensor *t = &s->t[s->n];
        memset(t, 0, sizeof *t);
        if (v->rank < 0) return mts_err_set(err, MTS_EUNSUPPORTED, "input '%s' has no declared shape", v->name);
        t->dtype = v->dtype;
        t->rank = v->rank;
        for (int d = 0; d < v->rank; d++) t->dims[d] = v->dims[d] >= 0 ? v->dims[d] : 1;
        int64_t nb = mts_tensor_nbytes(t), n = mts_tensor_numel(t);
        if (nb < 0 || nb > ((int64_t)1 << 30))
            return mts_err_set(err, MTS_ELIMIT, "input '%s' is too large for a guard run", v->name);
        if (!(t->data = calloc(1, nb > 0 ? (size_t)nb : 1))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        s->n++;
        for (int64_t k = 0; k < n; k++) {
            uint64_t r = rnd(&seed);
            if (t->dtype == MTS_DTYPE_FLOAT) ((float *)t->data)[k] = (float)((r >> 40) * (1.0 / 16777216.0));
            else if (t->dtype == MTS_DTYPE_INT64) ((int64_t *)t->data)[k] = (int64_t)(r >> 63);
            else if (t->dtype == MTS_DTYPE_INT32) ((int32_t *)t->data)[k] = (int32_t)(r >> 63);
            else if (t->dtype == MTS_DTYPE_DOUBLE) ((double *)t->data)[k] = (double)(r >> 11) / 9007199254740992.0;
            /* other types: zeros */
        }
    }
    return MTS_OK;
}

static char *join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The calibration sets found in dir: *n_sets = 0 when there is none. */
static int calib_sets(const mts_model *m, const char *dir, gset *sets, int *n_sets, mts_err *err)
{
    *n_sets = 0;
    DIR *dp = opendir(dir);
    if (!dp) return MTS_OK;
    char *files[GUARD_MAX_FILES];
    int nf = 0;
    struct dirent *e;
    while ((e = readdir(dp)) && nf < GUARD_MAX_FILES) {
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".npy") && (files[nf] = strdup(e->d_name))) nf++;
    }
    closedir(dp);
    qsort(files, (size_t)nf, sizeof *files, by_name);
    int rc = MTS_OK;
    if (m->n_inputs == 1) { /* every file is a batch of the one input */
        for (int f = 0; f < nf && !rc; f++) {
            char *p = join(dir, files[f]);
            rc = p ? mts_npy_read(p, &sets[*n_sets].t[0], err) : mts_err_set(err, MTS_ENOMEM, "out of memory");
            free(p);
            if (!rc) sets[(*n_sets)++].n = 1;
        }
    } else if (nf > 0 && m->n_inputs <= 16) { /* NAME.npy per input */
        gset *s = &sets[0];
        for (int i = 0; i < m->n_inputs && !rc; i++) {
            const char *name = m->values[m->inputs[i]].name;
            char fn[512];
            snprintf(fn, sizeof fn, "%s.npy", name);
            char *p = join(dir, fn);
            rc = p ? mts_npy_read(p, &s->t[i], err) : mts_err_set(err, MTS_ENOMEM, "out of memory");
            free(p);
            if (!rc) s->n++;
        }
        if (!rc) *n_sets = 1;
        else gset_free(s);
    }
    for (int f = 0; f < nf; f++) free(files[f]);
    return rc;
}

/* Relative L2 error of b against a over float outputs. */
static double rel_l2(const mts_tensor *a, const mts_tensor *b)
{
    if (a->dtype != MTS_DTYPE_FLOAT || b->dtype != MTS_DTYPE_FLOAT) return 0;
    int64_t n = mts_tensor_numel(a);
    if (n != mts_tensor_numel(b)) return INFINITY;
    double num = 0, den = 0;
    const float *x = a->data, *y = b->data;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)y[i] - (double)x[i];
        num += d * d;
        den += (double)x[i] * (double)x[i];
    }
    if (!isfinite(num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Runs the sets through both models; *worst gets the largest error. */
static int guard_run(mts_model *bf, mts_model *fp, const gset *sets, int n_sets, double *worst, mts_err *err)
{
    mts_ctx *cb = NULL, *cf = NULL;
    int no = bf->n_outputs, rc;
    const mts_tensor **ob = calloc((size_t)no + 1, sizeof *ob), **of = calloc((size_t)no + 1, sizeof *of);
    mts_tensor *keep = calloc((size_t)no + 1, sizeof *keep);
    *worst = 0;
    if (!ob || !of || !keep) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = mts_ctx_create(bf, 1, &cb, err)) || (rc = mts_ctx_create(fp, 1, &cf, err))) goto out;
    for (int s = 0; s < n_sets; s++) {
        if ((rc = mts_ctx_run(cf, sets[s].t, sets[s].n, of, err))) goto out;
        for (int o = 0; o < no; o++) { /* the context's views are valid until its next run only */
            int64_t nb = mts_tensor_nbytes(of[o]);
            keep[o] = *of[o];
            keep[o].data = malloc(nb > 0 ? (size_t)nb : 1);
            if (!keep[o].data) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                goto out;
            }
            if (nb > 0) memcpy(keep[o].data, of[o]->data, (size_t)nb);
        }
        if ((rc = mts_ctx_run(cb, sets[s].t, sets[s].n, ob, err))) goto out;
        for (int o = 0; o < no; o++) {
            double e = rel_l2(&keep[o], ob[o]);
            if (!(e <= *worst)) *worst = e;
            free(keep[o].data);
            keep[o].data = NULL;
        }
    }
out:
    if (keep)
        for (int o = 0; o < no; o++) free(keep[o].data);
    free(keep), free(ob), free(of);
    mts_ctx_free(cb);
    mts_ctx_free(cf);
    return rc;
}

/* Steps of the reduced form in m's plans (the most of any one plan, subgraphs' added): bf16
 * steps, or with half the products on half weights. */
static int reduced_steps(mts_model *m, bool half)
{
    int n = 0;
    pthread_mutex_lock(&m->plan_lock);
    for (const mts__plan *p = m->plans; p; p = p->next) {
        int k = half ? p->n_f16w : p->n_bf16;
        n = k > n ? k : n;
    }
    pthread_mutex_unlock(&m->plan_lock);
    for (int i = 0; i < m->n_subs; i++) n += reduced_steps(m->subs[i], half);
    return n;
}

static int bf16_steps(mts_model *m)
{
    return reduced_steps(m, false);
}

static int half_steps(mts_model *m)
{
    return reduced_steps(m, true);
}

int mts_model_bf16_steps(const mts_model *m)
{
    while (m->root) m = m->root;
    return bf16_steps((mts_model *)m); /* takes the plan locks only */
}

int mts_model_half_steps(const mts_model *m)
{
    while (m->root) m = m->root;
    return half_steps((mts_model *)m);
}

int mts__apply_precision(mts_model **pm, const mts_load_opts *opts, mts__reload_fn load, void *arg, mts_err *err)
{
    mts_model *m = *pm;
    const char *req = opts && opts->precision && *opts->precision ? opts->precision : getenv("MTS_PRECISION");
    if (!req || !*req) req = "fp32";
    if (mts_precision_check(req))
        return mts_err_set(err, MTS_EINVAL, "unknown precision '%s' (%s)", req, mts_precision_check(req));
    m->prec.requested = req = canon(req);
    m->prec.max_error = opts && opts->max_error > 0 ? opts->max_error : GUARD_DEFAULT_MAX_ERROR;
    m->prec.guard_error = -1;
    bool qdq = is_qdq(m);
    if (!strcmp(req, "fp32")) {
        if (qdq) set(m, "int8", "QDQ model: quantized kernels", NULL);
        else set(m, "fp32", "requested", NULL);
        return MTS_OK;
    }
    if (!strcmp(req, "int8")) {
        if (qdq) set(m, "int8", "requested", NULL);
        else set(m, "fp32", "int8 needs a QDQ-quantized model; this one is float", NULL);
        return MTS_OK;
    }
    const char *native = mts_cpu_bf16_native();
    if (m->backend == MTS_BACKEND_REFERENCE) {
        set(m, "fp32", "the reference backend computes in fp32", NULL);
        return MTS_OK;
    }
    if (!strcmp(req, "auto") && !native) {
        set(m, "fp32", "auto: cpu lacks native bf16", NULL);
        return MTS_OK;
    }
    /* The reduced form: fp16 (half weights) when asked for, else bf16 (asked for, or auto on a
     * native CPU). Guard it, unless an earlier load did. */
    bool f16 = !strcmp(req, "fp16");
    const char *red = f16 ? "fp16" : "bf16";
    if (opts && opts->guard_verdict && *opts->guard_verdict) {
        bool ok = !strcmp(opts->guard_verdict, red);
        m->prec.guard_error = opts->guard_error;
        m->prec.guard_inputs = "remembered";
        m->bf16 = ok && !f16;
        m->f16w = ok && f16;
        if (!ok) set(m, "fp32", "guard failed (at an earlier load of this file)", NULL);
        else if (f16) set(m, "fp16", "requested, guard passed (at an earlier load)", NULL);
        else if (!strcmp(req, "auto")) set(m, "bf16", "auto: cpu has %s, guard passed (at an earlier load)", native);
        else set(m, "bf16", native ? "requested, guard passed (at an earlier load)"
                                   : "requested (cpu emulates bf16), guard passed (at an earlier load)", NULL);
        return MTS_OK;
    }
    mts_load_opts fo = opts ? *opts : (mts_load_opts){0};
    fo.precision = "fp32";
    mts_model *fp = NULL;
    mts_err e2 = {0};
    int rc = load(arg, &fo, &fp, err);
    if (rc) return rc;
    fp->prec = m->prec;
    m->bf16 = !f16;
    m->f16w = f16;
    gset sets[GUARD_MAX_FILES];
    memset(sets, 0, sizeof sets);
    int n_sets = 0;
    char *dir = NULL;
    if (opts && opts->calibration_dir && *opts->calibration_dir) {
        dir = strdup(opts->calibration_dir);
    } else {
        const char *slash = strrchr(m->path, '/');
        size_t dl = slash ? (size_t)(slash - m->path) : 1;
        if ((dir = malloc(dl + 16))) snprintf(dir, dl + 16, "%.*s/calibration", (int)dl, slash ? m->path : ".");
    }
    if (!dir) rc = mts_err_set(&e2, MTS_ENOMEM, "out of memory");
    else rc = calib_sets(m, dir, sets, &n_sets, &e2);
    free(dir);
    m->prec.guard_inputs = n_sets ? "calibration" : "random";
    if (!rc && n_sets == 0 && !(rc = random_set(m, 0x9e3779b97f4a7c15ull, &sets[0], &e2))) n_sets = 1;
    double worst = 0;
    if (!rc) rc = guard_run(m, fp, sets, n_sets, &worst, &e2);
    for (int s = 0; s < GUARD_MAX_FILES; s++) gset_free(&sets[s]);
    m->prec.guard_runs = rc ? 0 : n_sets;
    m->prec.guard_error = rc ? -1 : worst;
    bool keep = false;
    if (rc) {
        set(m, "fp32", "guard could not run: %s", e2.msg);
    } else if (!(worst <= m->prec.max_error)) {
        set(m, "fp32", "guard failed", NULL);
    } else if (f16 && half_steps(m) == 0) {
        set(m, "fp32", "no few-row products with constant weights to keep in half (or no AVX-512)", NULL);
    } else if (!f16 && bf16_steps(m) == 0) {
        set(m, "fp32", "no bf16 kernels for this model on this cpu", NULL);
    } else {
        keep = true;
        if (f16) set(m, "fp16", "requested, guard passed", NULL);
        else if (!strcmp(req, "auto")) set(m, "bf16", "auto: cpu has %s, guard passed", native);
        else set(m, "bf16", native ? "requested, guard passed" : "requested (cpu emulates bf16), guard passed", NULL);
    }
    if (keep) {
        mts_model_free(fp);
        return MTS_OK;
    }
    fp->prec = m->prec;
    snprintf(fp->prec_reason, sizeof fp->prec_reason, "%s", m->prec_reason);
    fp->prec.reason = fp->prec_reason;
    mts_model_free(m);
    *pm = fp;
    return MTS_OK;
}
