/*
 * Execution contexts: one caller's run state for a shared, immutable model.
 *
 * A context binds to the plan of the current input signature: it allocates the plan's buffer
 * slots (reused across runs while the signature stays the same; when the signature changes, as
 * dynamic batching changes the batch size, the new slots take the old buffers that are large
 * enough, best fit, so alternating batch sizes costs no allocation and no page faults), points constant values at the
 * plan's or model's data and graph inputs at the caller's buffers (no copy), then runs the
 * plan's steps. Dynamic nodes infer their shapes with real values and get per-value buffers
 * that grow as needed. Nothing here takes a lock except the plan lookup.
 */
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "engine/model.h"
#include "engine/seqval.h"
#include "engine/team.h"
#include "util/par_items.h"

#define TEAM_ARMS 8 /* plans (input signatures) whose team-size estimates a context keeps */

struct mts_ctx {
    mts_model *m;
    int threads;
    const mts__plan *plan;
    mts_tensor *vals;
    void **slots;
    int64_t *slot_cap;  /* bytes allocated for each slot (>= the plan's need) */
    int n_slots;
    void **dyn;        /* per value: buffer of a dynamic value */
    int64_t *dyn_cap;
    const mts_tensor **kin;
    mts_tensor *kout;
    mts_tensor *kview;  /* channels-last views of a step's inputs */
    int max_io;
    void *bstate[MTS_MAX_BACKENDS]; /* per backend: its per-context state (a oneDNN stream) */
    void *scratch;      /* scratch memory of backend steps */
    int64_t scratch_cap;
    const mts__plan *prep_plan; /* plan the scratch was sized for, */
    unsigned prep_mask;         /* ... at one thread (bit 0) and at `threads` (bit 1) */
    int run_threads;    /* threads of the run in progress: `threads`, or 1 (see team.h) */
    int fixed_threads;  /* > 0: every run uses this many (a subgraph's context; no adapting) */
    mts_team_arm arms[TEAM_ARMS];
    int next_arm;
    int64_t runs, one_thread_runs;
    /* float16/bfloat16 graph inputs and outputs (half.c): the float inputs a run uses, the
     * declared-type outputs it returns, and their buffers (inputs first, then outputs). */
    mts_tensor *hin, *hout;
    mts_tensor *odst;   /* per graph output: the caller's buffer of an owned-output run */
    void **hbuf;
    int64_t *hcap;
    void *cf;           /* control-flow kernels' subgraph contexts and node states (subgraph.c) */
    mts_step_hook hook; /* called between steps (the scheduler's preemption point) */
    void *hook_arg;
    /* Padding-free runs (padfree.c): the input holding the padding mask (-1: none), the rows
     * of the run in progress (NULL: whole), their buffer, and the rows its runs skipped. */
    int pad_input;
    const mts_rows *rows, *step_rows;
    mts_rows rows_buf;
    int32_t *rows_mem;
    int64_t rows_cap, rows_skipped;
};

void **mts__ctx_cf_slot(mts_ctx *c)
{
    return &c->cf;
}

/* MTS_TEAM_ADAPT=0 turns the adaptive team size off (every run uses the whole team). */
static int team_adapt_flag = -1;
static pthread_once_t team_adapt_once = PTHREAD_ONCE_INIT;
static void team_adapt_init(void)
{
    const char *e = getenv("MTS_TEAM_ADAPT");
    team_adapt_flag = !(e && strcmp(e, "0") == 0);
}
static int team_adapt(void)
{
    pthread_once(&team_adapt_once, team_adapt_init);
    return team_adapt_flag;
}

/* ThreadSanitizer cannot see into OpenMP teams (libgomp is not instrumented), so the TSan build
 * runs every context on one thread: the kernels are the production ones, and what TSan checks
 * is the sharing between contexts (the server's workers on one model). */
static int ctx_threads(int threads)
{
#if defined(__SANITIZE_THREAD__)
    (void)threads;
    return 1;
#else
    return threads > 0 ? threads : 1;
#endif
}

int mts_ctx_create(mts_model *m, int threads, mts_ctx **out, mts_err *err)
{
    mts_ctx *c = calloc(1, sizeof *c);
    if (!c) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    c->m = m;
    c->threads = ctx_threads(threads);
    c->pad_input = -1;
    size_t nv = (size_t)m->n_values + 1;
    c->vals = calloc(nv, sizeof *c->vals);
    c->dyn = calloc(nv, sizeof *c->dyn);
    c->dyn_cap = calloc(nv, sizeof *c->dyn_cap);
    c->odst = calloc((size_t)m->n_outputs + 1, sizeof *c->odst);
    if (!c->vals || !c->dyn || !c->dyn_cap || !c->odst) {
        mts_ctx_free(c);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    *out = c;
    return MTS_OK;
}

void mts_ctx_set_threads(mts_ctx *c, int threads)
{
    c->threads = ctx_threads(threads);
    memset(c->arms, 0, sizeof c->arms); /* the estimates were for the old team */
    c->prep_mask &= 1u;                 /* the team's primitives are for the old count */
}

void mts__ctx_set_run_threads(mts_ctx *c, int threads)
{
    c->fixed_threads = threads > 0 ? (threads < c->threads ? threads : c->threads) : 0;
}

void mts_ctx_set_step_hook(mts_ctx *c, mts_step_hook fn, void *arg)
{
    c->hook = fn;
    c->hook_arg = arg;
}

void mts_ctx_set_padding_mask(mts_ctx *c, int input)
{
    c->pad_input = input >= 0 && input < c->m->n_inputs ? input : -1;
}

const mts_rows *mts_kctx_rows(const mts_kctx *k)
{
    return k->ctx ? k->ctx->step_rows : NULL;
}

int64_t mts_ctx_rows_skipped(const mts_ctx *c)
{
    return c->rows_skipped;
}

/* MTS_NO_PADFREE=1: every run whole (for comparisons). */
static int padfree_off;
static pthread_once_t padfree_once = PTHREAD_ONCE_INIT;
static void padfree_init(void)
{
    const char *e = getenv("MTS_NO_PADFREE");
    padfree_off = e && strcmp(e, "1") == 0;
}

/* The valid rows of this run from the padding mask input, when the plan allows skipping and
 * every row of the mask is ones then zeros (at least one one); NULL (run whole) otherwise. */
static const mts_rows *padding_rows(mts_ctx *c, const mts__plan *p, const mts_tensor *inputs, int n_inputs)
{
    pthread_once(&padfree_once, padfree_init);
    if (padfree_off || c->pad_input < 0 || c->pad_input >= n_inputs || !p->rows_ok) return NULL;
    const mts_tensor *t = &inputs[c->pad_input];
    int64_t B = p->tok_B, S = p->tok_S;
    if (t->rank != 2 || t->dims[0] != B || t->dims[1] != S || !t->data) return NULL;
    if (t->dtype != MTS_DTYPE_INT64 && t->dtype != MTS_DTYPE_INT32 && t->dtype != MTS_DTYPE_BOOL) return NULL;
    if (B * S + B > c->rows_cap) {
        int32_t *nm = realloc(c->rows_mem, sizeof(int32_t) * (size_t)(B * S + B));
        if (!nm) return NULL;
        c->rows_mem = nm;
        c->rows_cap = B * S + B;
    }
    int32_t *len = c->rows_mem, *map = c->rows_mem + B;
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t l = 0;
        for (int64_t s = 0; s < S; s++) {
            int64_t i = b * S + s;
            bool one = t->dtype == MTS_DTYPE_INT64   ? ((const int64_t *)t->data)[i] != 0
                       : t->dtype == MTS_DTYPE_INT32 ? ((const int32_t *)t->data)[i] != 0
                                                     : ((const uint8_t *)t->data)[i] != 0;
            if (one && l != s) return NULL; /* a one after a zero: not a right-padded row */
            if (one) map[n++] = (int32_t)i, l++;
        }
        if (l == 0) return NULL;
        len[b] = (int32_t)l;
    }
    if (n == B * S) return NULL; /* no padding */
    c->rows_buf = (mts_rows){B, S, n, len, map};
    return &c->rows_buf;
}

void mts_ctx_team_stats(const mts_ctx *c, int64_t *runs, int64_t *one_thread_runs)
{
    *runs = c->runs;
    *one_thread_runs = c->one_thread_runs;
}

int64_t mts_ctx_bytes(const mts_ctx *c)
{
    int64_t b = 0;
    for (int i = 0; i < c->n_slots; i++) b += c->slot_cap[i];
    for (int v = 0; v < c->m->n_values; v++) b += c->dyn_cap[v];
    if (c->hcap)
        for (int i = 0; i < c->m->n_inputs + c->m->n_outputs; i++) b += c->hcap[i];
    return b + c->scratch_cap + mts__cf_bytes(c->cf);
}

static void unbind(mts_ctx *c)
{
    mts__plan_release(c->m, c->plan);
    for (int i = 0; i < c->n_slots; i++) free(c->slots[i]);
    free(c->slots);
    free(c->slot_cap);
    c->slots = NULL;
    c->slot_cap = NULL;
    c->n_slots = 0;
    c->plan = NULL;
}

void mts_ctx_free(mts_ctx *c)
{
    if (!c) return;
    mts__cf_free(c->cf);
    unbind(c);
    if (c->dyn)
        for (int v = 0; v < c->m->n_values; v++) free(c->dyn[v]);
    free(c->dyn);
    free(c->dyn_cap);
    free(c->vals);
    if (c->hbuf)
        for (int i = 0; i < c->m->n_inputs + c->m->n_outputs; i++) free(c->hbuf[i]);
    free(c->hbuf);
    free(c->hcap);
    free(c->hin);
    free(c->hout);
    free(c->odst);
    free(c->kin);
    free(c->kout);
    free(c->kview);
    free(c->rows_mem);
    free(c->scratch);
    for (int b = 0; mts_backends[b]; b++)
        if (c->bstate[b] && mts_backends[b]->ctx_free) mts_backends[b]->ctx_free(c->bstate[b]);
    free(c);
}

/* MTS_PROFILE=1: per-step wall times on stderr (a debugging aid; racy flag read is benign). */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *alloc_buf(int64_t bytes)
{
    size_t n = (size_t)(bytes > 0 ? bytes : 1);
    n = (n + 63) / 64 * 64;
    return aligned_alloc(64, n);
}

static int bind(mts_ctx *c, const mts__plan *p, mts_err *err)
{
    /* The previous plan's buffers become spares; each new slot, largest first, takes the smallest
     * spare that holds it; what no slot takes is freed. */
    void **old = c->slots;
    int64_t *old_cap = c->slot_cap;
    int n_old = c->n_slots;
    c->slots = NULL;
    c->slot_cap = NULL;
    c->n_slots = 0;
    c->plan = NULL;
    void **slots = calloc((size_t)p->n_slots + 1, sizeof(void *));
    int64_t *cap = calloc((size_t)p->n_slots + 1, sizeof(int64_t));
    int *order = malloc(sizeof(int) * ((size_t)p->n_slots + 1));
    int rc = slots && cap && order ? MTS_OK : mts_err_set(err, MTS_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < p->n_slots; i++) { /* slots by decreasing size (insertion sort) */
        int j = i;
        while (j > 0 && p->slot_bytes[order[j - 1]] < p->slot_bytes[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    for (int k = 0; !rc && k < p->n_slots; k++) {
        int i = order[k], best = -1;
        int64_t need = p->slot_bytes[i] > 0 ? p->slot_bytes[i] : 1;
        for (int o = 0; o < n_old; o++)
            if (old[o] && old_cap[o] >= need && (best < 0 || old_cap[o] < old_cap[best])) best = o;
        if (best >= 0) {
            slots[i] = old[best];
            cap[i] = old_cap[best];
            old[best] = NULL;
        } else if ((slots[i] = alloc_buf(need))) {
            cap[i] = (need + 63) / 64 * 64;
        } else {
            rc = mts_err_set(err, MTS_ENOMEM, "out of memory for activations (%lld bytes)", (long long)need);
        }
    }
    for (int o = 0; o < n_old; o++) free(old[o]);
    free(old);
    free(old_cap);
    free(order);
    if (rc) {
        for (int i = 0; slots && i < p->n_slots; i++) free(slots[i]);
        free(slots);
        free(cap);
        return rc;
    }
    c->slots = slots;
    c->slot_cap = cap;
    c->n_slots = p->n_slots;
    c->prep_plan = NULL;
    if (p->max_io > c->max_io) {
        free(c->kin);
        free(c->kout);
        free(c->kview);
        c->kin = calloc((size_t)p->max_io, sizeof *c->kin);
        c->kout = calloc((size_t)p->max_io, sizeof *c->kout);
        c->kview = calloc((size_t)p->max_io, sizeof *c->kview);
        if (!c->kin || !c->kout || !c->kview) {
            c->max_io = 0;
            unbind(c);
            return mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        c->max_io = p->max_io;
    }
    for (int v = 0; v < c->m->n_values; v++) {
        c->vals[v] = p->vals[v];
        if (p->state[v] == MTS__V_STATIC && p->slot_of[v] >= 0) c->vals[v].data = c->slots[p->slot_of[v]];
    }
    c->plan = p;
    return MTS_OK;
}

/* An elementwise-like kernel on slices of one outer axis (st->split_axis, chosen at plan time),
 * one slice per thread of the context's OpenMP team. */
#define SPLIT_MAX_IN 8
#define SPLIT_MAX_THREADS 16

typedef struct split_job {
    const mts__step *st;
    const mts_kctx *k;
    int64_t extent;
    int rc[SPLIT_MAX_THREADS];
    mts_err err[SPLIT_MAX_THREADS];
} split_job;

static void slice(mts_tensor *t, int axis, int64_t extent, int64_t lo, int64_t hi)
{
    if (axis < 0 || axis >= t->rank || t->dims[axis] != extent) return; /* broadcast: whole */
    int64_t inner = 1;
    for (int i = axis + 1; i < t->rank; i++) inner *= t->dims[i];
    t->data = (char *)t->data + (size_t)(lo * inner) * mts_dtype_size(t->dtype);
    t->dims[axis] = hi - lo;
}

static void split_part(void *arg, int ithr, int nthr)
{
    split_job *j = arg;
    const mts_kctx *k = j->k;
    int64_t lo = j->extent * ithr / nthr, hi = j->extent * (ithr + 1) / nthr;
    if (hi <= lo) return;
    mts_tensor in[SPLIT_MAX_IN], out = k->out[0];
    const mts_tensor *inp[SPLIT_MAX_IN];
    int a = j->st->split_axis;
    for (int i = 0; i < k->n_in; i++) {
        inp[i] = NULL;
        if (!k->in[i]) continue;
        in[i] = *k->in[i];
        slice(&in[i], a - (out.rank - in[i].rank), j->extent, lo, hi);
        inp[i] = &in[i];
    }
    slice(&out, a, j->extent, lo, hi);
    mts_kctx kk = {k->node, inp, k->n_in, &out, 1, &j->err[ithr], 1, NULL};
    j->rc[ithr] = j->st->op->run(&kk);
}

static int run_split(mts_ctx *c, const mts__step *st, mts_kctx *k)
{
    split_job *j = calloc(1, sizeof *j);
    if (!j) return st->op->run(k);
    j->st = st;
    j->k = k;
    j->extent = k->out[0].dims[st->split_axis];
    int t = c->run_threads < SPLIT_MAX_THREADS ? c->run_threads : SPLIT_MAX_THREADS;
    if (t > j->extent) t = (int)j->extent;
    mts_parallel(t, split_part, j);
    int rc = MTS_OK;
    for (int i = 0; i < t && !rc; i++)
        if ((rc = j->rc[i])) *k->err = j->err[i];
    free(j);
    return rc;
}

/* Prepares the backends plan p uses for `threads` (a backend creates what it lacks for that
 * count on first use; an adaptive context prepares its one-thread state only when it first
 * tries one thread) and sizes the scratch memory for their steps. */
static int prepare_backends(mts_ctx *c, const mts__plan *p, int threads, mts_err *err)
{
    int64_t need = 64;
    for (int b = 0; mts_backends[b]; b++) {
        if (!(p->backends & (1u << b)) || !mts_backends[b]->prepare) continue;
        int rc = mts_backends[b]->prepare(p, b, threads, &c->bstate[b], &need, err);
        if (rc) return rc;
    }
    if (need > c->scratch_cap) {
        free(c->scratch);
        c->scratch = alloc_buf(need);
        c->scratch_cap = c->scratch ? need : 0;
        if (!c->scratch) return mts_err_set(err, MTS_ENOMEM, "out of memory for scratch (%lld bytes)", (long long)need);
    }
    if (p != c->prep_plan) c->prep_plan = p, c->prep_mask = 0;
    c->prep_mask |= threads == 1 ? 1u : 2u;
    return MTS_OK;
}

/* MTS_PROFILE=1 prints per-step times; read once, thread-safely. */
static int profile_flag;
static pthread_once_t profile_once = PTHREAD_ONCE_INIT;
static void profile_init(void)
{
    profile_flag = getenv("MTS_PROFILE") != NULL;
}
static int mts__profile_enabled(void)
{
    pthread_once(&profile_once, profile_init);
    return profile_flag;
}

/* The team-size estimates of plan p (a free or the oldest slot when p has none yet). */
static mts_team_arm *team_arm(mts_ctx *c, const mts__plan *p)
{
    for (int i = 0; i < TEAM_ARMS; i++)
        if (c->arms[i].key == (const void *)(uintptr_t)p->id) return &c->arms[i];
    mts_team_arm *a = &c->arms[c->next_arm];
    c->next_arm = (c->next_arm + 1) % TEAM_ARMS;
    memset(a, 0, sizeof *a);
    a->key = (const void *)(uintptr_t)p->id; /* the plan's id: a freed plan's memory may be reused */
    return a;
}

static int run_steps(mts_ctx *c, const mts__plan *p, const mts_tensor **outputs, mts_err *err);

/* Buffer i of the float16/bfloat16 conversions, at least `bytes` long (arrays made on first use). */
static void *half_buf(mts_ctx *c, int i, int64_t bytes, mts_err *err)
{
    mts_model *m = c->m;
    if (!c->hbuf) {
        size_t n = (size_t)(m->n_inputs + m->n_outputs) + 1;
        c->hbuf = calloc(n, sizeof *c->hbuf);
        c->hcap = calloc(n, sizeof *c->hcap);
        c->hin = calloc(n, sizeof *c->hin);
        c->hout = calloc(n, sizeof *c->hout);
        if (!c->hbuf || !c->hcap || !c->hin || !c->hout) {
            mts_err_set(err, MTS_ENOMEM, "out of memory");
            return NULL;
        }
    }
    if (bytes < 1) bytes = 1;
    if (c->hcap[i] < bytes) {
        free(c->hbuf[i]);
        c->hbuf[i] = malloc((size_t)bytes);
        c->hcap[i] = c->hbuf[i] ? bytes : 0;
        if (!c->hbuf[i]) mts_err_set(err, MTS_ENOMEM, "out of memory (%lld bytes)", (long long)bytes);
    }
    return c->hbuf[i];
}

/* Converts the float16/bfloat16 graph inputs to float; *use gets the inputs the run takes. */
static int half_inputs(mts_ctx *c, const mts_tensor *inputs, int n, const mts_tensor **use, mts_err *err)
{
    mts_model *m = c->m;
    *use = inputs;
    if (n != m->n_inputs) return MTS_OK; /* the plan's input check reports it */
    bool any = false;
    for (int i = 0; i < n && !any; i++) any = mts_dtype_is_half(m->values[m->inputs[i]].dtype);
    if (!any) return MTS_OK;
    if (!half_buf(c, 0, 0, err)) return MTS_ENOMEM;
    for (int i = 0; i < n; i++) {
        const mts_value *v = &m->values[m->inputs[i]];
        c->hin[i] = inputs[i];
        if (!mts_dtype_is_half(v->dtype)) continue;
        if (inputs[i].dtype != v->dtype)
            return mts_err_set(err, MTS_EINVAL, "input '%s' has type %s, the model expects %s", v->name,
                               mts_dtype_name(inputs[i].dtype), mts_dtype_name(v->dtype));
        int64_t ne = inputs[i].rank >= 0 && inputs[i].rank <= MTS_MAX_RANK ? mts_tensor_numel(&inputs[i]) : -1;
        if (ne < 0 || ne > m->max_tensor_bytes / 4)
            return mts_err_set(err, MTS_ESHAPE, "input '%s' has an invalid shape", v->name);
        float *f = half_buf(c, i, ne * 4, err);
        if (!f) return MTS_ENOMEM;
        if (ne) mts__half_to_f32(v->dtype, inputs[i].data, f, ne);
        c->hin[i].dtype = MTS_DTYPE_FLOAT;
        c->hin[i].data = f;
    }
    *use = c->hin;
    return MTS_OK;
}

/* Converts the float results of float16/bfloat16 graph outputs to their declared type. */
static int half_outputs(mts_ctx *c, const mts_tensor **outputs, mts_err *err)
{
    mts_model *m = c->m;
    for (int i = 0; i < m->n_outputs; i++) {
        mts_dtype dt = m->values[m->outputs[i]].dtype;
        if (!mts_dtype_is_half(dt) || outputs[i]->dtype != MTS_DTYPE_FLOAT) continue;
        int64_t ne = mts_tensor_numel(outputs[i]);
        uint16_t *h = half_buf(c, m->n_inputs + i, ne * 2, err);
        if (!h) return MTS_ENOMEM;
        if (ne) mts__f32_to_half(dt, outputs[i]->data, h, ne);
        c->hout[i] = *outputs[i];
        c->hout[i].dtype = dt;
        c->hout[i].data = h;
        outputs[i] = &c->hout[i];
    }
    return MTS_OK;
}

/* Whether graph output i of plan p may be computed into a caller's buffer: a static value in
 * a slot, not channels-last, not listed twice among the outputs. */
static bool output_placeable(const mts_model *m, const mts__plan *p, int i)
{
    int v = m->outputs[i];
    if (p->state[v] != MTS__V_STATIC || p->slot_of[v] < 0 || p->nhwc[v]) return false;
    for (int q = 0; q < m->n_outputs; q++)
        if (q != i && m->outputs[q] == v) return false;
    return true;
}

/* Points each static graph output of plan p at dst[i].data when that buffer is given with the
 * output's exact type and shape (the caller's buffer: the step computing the output writes
 * there, no copy after), else at the output's own slot. Outputs listed twice and channels-last
 * ones keep their slot. Every run sets this anew. */
static void place_outputs(mts_ctx *c, const mts__plan *p, const mts_tensor *dst)
{
    mts_model *m = c->m;
    for (int i = 0; i < m->n_outputs; i++) {
        int v = m->outputs[i];
        if (p->state[v] != MTS__V_STATIC || p->slot_of[v] < 0) continue;
        bool given = dst && dst[i].data && dst[i].dtype == p->vals[v].dtype && mts_shape_equal(&dst[i], &p->vals[v]);
        c->vals[v].data = given && output_placeable(m, p, i) ? dst[i].data : c->slots[p->slot_of[v]];
    }
}

static int ctx_run(mts_ctx *c, const mts_tensor *inputs, int n_inputs, const mts_tensor *dst,
                   const mts_out_alloc *oa, void **owned, const mts_tensor **outputs, mts_err *err);

int mts_ctx_run(mts_ctx *c, const mts_tensor *inputs, int n_inputs, const mts_tensor **outputs, mts_err *err)
{
    return ctx_run(c, inputs, n_inputs, NULL, NULL, NULL, outputs, err);
}

int mts__ctx_run_into(mts_ctx *c, const mts_tensor *inputs, int n_inputs, const mts_tensor *dst,
                      const mts_tensor **outputs, mts_err *err)
{
    return ctx_run(c, inputs, n_inputs, dst, NULL, NULL, outputs, err);
}

int mts_ctx_run_owned(mts_ctx *c, const mts_tensor *inputs, int n_inputs, const mts_out_alloc *oa, void **owned,
                      const mts_tensor **outputs, mts_err *err)
{
    for (int i = 0; i < c->m->n_outputs; i++) owned[i] = NULL;
    return ctx_run(c, inputs, n_inputs, NULL, oa, owned, outputs, err);
}

/* The buffers of an owned-output run: one from oa->alloc for each output of plan p that
 * place_outputs points at a caller's buffer (output_placeable) and that a run returns as
 * computed (not a float16/bfloat16 output, which half_outputs converts into the context's own
 * buffer). c->odst describes them. */
static int alloc_owned(mts_ctx *c, const mts__plan *p, const mts_out_alloc *oa, void **owned, mts_err *err)
{
    mts_model *m = c->m;
    for (int i = 0; i < m->n_outputs; i++) {
        int v = m->outputs[i];
        c->odst[i].data = NULL;
        if (!output_placeable(m, p, i) || mts_dtype_is_half(m->values[v].dtype)) continue;
        int64_t b = mts_tensor_nbytes(&p->vals[v]);
        c->odst[i] = p->vals[v];
        if (!(owned[i] = c->odst[i].data = oa->alloc(b > 0 ? (size_t)b : 1))) {
            for (int q = 0; q <= i; q++)
                if (owned[q]) oa->free(owned[q]), owned[q] = NULL;
            return mts_err_set(err, MTS_ENOMEM, "out of memory for output '%s' (%lld bytes)", m->values[v].name,
                               (long long)b);
        }
    }
    return MTS_OK;
}

static int ctx_run(mts_ctx *c, const mts_tensor *inputs, int n_inputs, const mts_tensor *dst,
                   const mts_out_alloc *oa, void **owned, const mts_tensor **outputs, mts_err *err)
{
    mts_model *m = c->m;
    const mts__plan *p;
    int rc;
    for (int i = 0; i < n_inputs && i < m->n_inputs; i++)
        if (!inputs[i].data && mts_tensor_numel(&inputs[i]) != 0)
            return mts_err_set(err, MTS_EINVAL, "input '%s' has no data", m->values[m->inputs[i]].name);
    if ((rc = half_inputs(c, inputs, n_inputs, &inputs, err))) return rc;
    /* The signature of the bound plan again (every run of a fixed-shape model, every call of
     * an If branch or Loop body): no lookup under the model's lock. */
    if (c->plan && mts__plan_same_shapes(c->plan, inputs, n_inputs)) {
        p = c->plan;
    } else {
        if ((rc = mts__plan_get(m, inputs, n_inputs, &p, err))) return rc;
        if (p == c->plan) mts__plan_release(m, p); /* held already, as the bound plan */
    }
    if (p != c->plan) { /* the context holds the plan it is bound to, and only that one */
        const mts__plan *old = c->plan;
        rc = bind(c, p, err);
        mts__plan_release(m, old);
        if (rc) {
            mts__plan_release(m, p);
            return rc;
        }
    }
    if (oa) {
        if ((rc = alloc_owned(c, p, oa, owned, err))) return rc;
        dst = c->odst;
    }
    for (int i = 0; i < n_inputs; i++) c->vals[m->inputs[i]] = inputs[i];
    place_outputs(c, p, dst);
    mts_team_arm *arm = c->threads > 1 && !c->fixed_threads && team_adapt() ? team_arm(c, p) : NULL;
    int mode = arm ? mts_team_pick(arm) : MTS_TEAM_FULL;
    c->run_threads = c->fixed_threads ? c->fixed_threads : mode == MTS_TEAM_ONE ? 1 : c->threads;
    if (p->scratch_bytes) {
        unsigned bit = c->run_threads == 1 ? 1u : 2u;
        if ((p != c->prep_plan || !(c->prep_mask & bit)) && (rc = prepare_backends(c, p, c->run_threads, err)))
            goto done;
        for (int b = 0; mts_backends[b]; b++)
            if ((p->backends & (1u << b)) && mts_backends[b]->set_threads) mts_backends[b]->set_threads(c->run_threads);
    }
    double t0 = arm ? now_ms() : 0;
    c->rows = padding_rows(c, p, inputs, n_inputs);
    rc = run_steps(c, p, outputs, err);
    c->rows_skipped += c->rows ? c->rows->B * c->rows->S - c->rows->n : 0;
    c->rows = c->step_rows = NULL;
    if (arm && !rc) mts_team_record(arm, mode, now_ms() - t0);
    c->runs++;
    c->one_thread_runs += c->run_threads == 1;
done:
    /* an owned buffer the run's result does not lie in (or any, after a failure) goes back */
    for (int i = 0; oa && i < m->n_outputs; i++)
        if (owned[i] && (rc || outputs[i]->data != owned[i])) oa->free(owned[i]), owned[i] = NULL;
    return rc;
}

/* Runs plan p's steps on c->run_threads threads (inputs bound, backends prepared). */
static int run_steps(mts_ctx *c, const mts__plan *p, const mts_tensor **outputs, mts_err *err)
{
    mts_model *m = c->m;
    int rc;
    int profile = mts__profile_enabled();
    double t_step = profile ? now_ms() : 0;
    for (int s = 0; s < p->n_steps; s++) {
        const mts__step *st = &p->steps[s];
        /* A preemption point: the hook may run other work on this thread. That work sets the
         * thread's own team sizes, so the backends' are set again for this run. */
        if (s > 0 && c->hook && c->hook(c->hook_arg) && p->scratch_bytes)
            for (int b = 0; mts_backends[b]; b++)
                if ((p->backends & (1u << b)) && mts_backends[b]->set_threads) mts_backends[b]->set_threads(c->run_threads);
        if (profile && s > 0) {
            double t = now_ms();
            fprintf(stderr, "step %3d %-14s %-24s %8.3f ms\n", s - 1, m->nodes[p->steps[s - 1].node].op_type,
                    m->nodes[p->steps[s - 1].node].name, t - t_step);
            t_step = t;
        }
        int ni = st->node;
        const mts_node *n = st->nd;
        if (st->kind == MTS__S_BACKEND) {
            const mts_backend *be = mts_backends[st->backend];
            if ((rc = be->run(st, c->bstate[st->backend], c->vals, c->scratch, c->run_threads, st->rows ? c->rows : NULL,
                              err)))
                goto node_fail;
            continue;
        }
        for (int j = 0; j < st->n_in; j++) {
            const mts_tensor *t = st->in[j] >= 0 ? &c->vals[st->in[j]] : NULL;
            if (st->cin && st->cin[j]) t = st->cin[j];
            if (st->nhwc && t && t->rank == 4) {
                mts_tensor *v = &c->kview[j];
                *v = *t;
                v->dims[1] = t->dims[2], v->dims[2] = t->dims[3], v->dims[3] = t->dims[1];
                t = v;
            }
            if (t && mts_dtype_is_blob(t->dtype) && !mts_blob_op_accepts(n->domain, n->op_type, t->dtype)) {
                rc = mts_err_set(err, MTS_EUNSUPPORTED, "input %d is a %s, which this op does not take", j,
                                 mts_dtype_name(t->dtype));
                goto node_fail;
            }
            c->kin[j] = t;
        }
        mts_kctx k = {n, c->kin, st->n_in, c->kout, st->n_out, err, c->run_threads, c};
        c->step_rows = st->rows ? c->rows : NULL;
        if (st->dynamic) {
            memset(c->kout, 0, sizeof *c->kout * (size_t)st->n_out);
            if ((rc = st->op->infer(&k))) goto node_fail;
            for (int j = 0; j < st->n_out; j++) {
                int v = st->out[j];
                int64_t b = mts_tensor_nbytes(&c->kout[j]);
                if (c->kout[j].rank < 0 || c->kout[j].rank > MTS_MAX_RANK || b < 0 ||
                    !mts_dtype_supported(c->kout[j].dtype)) {
                    rc = mts_err_set(err, MTS_EUNSUPPORTED, "output %d has an unsupported type or shape", j);
                    goto node_fail;
                }
                if (b > m->max_tensor_bytes) {
                    rc = mts_err_set(err, MTS_ELIMIT, "output '%s' would need %lld bytes, above the limit of %lld",
                                     m->values[v].name, (long long)b, (long long)m->max_tensor_bytes);
                    goto node_fail;
                }
                if (b > c->dyn_cap[v] || !c->dyn[v]) {
                    free(c->dyn[v]);
                    c->dyn[v] = alloc_buf(b);
                    c->dyn_cap[v] = c->dyn[v] ? b : 0;
                    if (!c->dyn[v]) {
                        rc = mts_err_set(err, MTS_ENOMEM, "out of memory (%lld bytes)", (long long)b);
                        goto node_fail;
                    }
                }
                c->kout[j].data = c->dyn[v];
                c->vals[v] = c->kout[j];
            }
        } else {
            for (int j = 0; j < st->n_out; j++) {
                c->kout[j] = c->vals[st->out[j]];
                if (st->nhwc && c->kout[j].rank == 4) {
                    mts_tensor *t = &c->kout[j];
                    int64_t C = t->dims[1];
                    t->dims[1] = t->dims[2], t->dims[2] = t->dims[3], t->dims[3] = C;
                }
            }
        }
        if (st->split_axis >= 0 && c->run_threads > 1 && !st->dynamic) rc = run_split(c, st, &k);
        else rc = st->op->run(&k);
        if (rc) goto node_fail;
        continue;
    node_fail:
        mts_err_prefix(err, "node '%s' (#%d, %s): ", m->nodes[ni].name, ni, m->nodes[ni].op_type);
        return rc;
    }
    if (profile && p->n_steps > 0)
        fprintf(stderr, "step %3d %-14s %-24s %8.3f ms\n", p->n_steps - 1, m->nodes[p->steps[p->n_steps - 1].node].op_type,
                m->nodes[p->steps[p->n_steps - 1].node].name, now_ms() - t_step);
    for (int i = 0; i < m->n_outputs; i++) outputs[i] = &c->vals[m->outputs[i]];
    return half_outputs(c, outputs, err);
}
