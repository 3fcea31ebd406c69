/*
 * The plan optimizer's working state and the graph-rewrite helpers shared by the optimizer
 * (optimize.c) and the backends' own rewrites (kernels/dnnl_backend.c, kernels/fast_backend.c): use counts, the producer
 * and the sole reader of a value, redirection of readers, value-state tests and plan-owned node
 * copies. Internal to the engine.
 */
#ifndef MTS_ENGINE_REWRITE_H
#define MTS_ENGINE_REWRITE_H

#include <string.h>

#include "engine/model.h"

/* Room for inputs a claimed step may add to its node's (residual tensors of fused post-ops). */
#define MTS__STEP_EXTRA_IN 6

/* One optimization of one plan. Steps are never moved or deleted while it runs: a step folded
 * into another is marked removed, and the plan is compacted at the end. */
typedef struct mts__opt {
    mts_model *m;
    mts__plan *p;
    int nv, ns;
    int *nuse;       /* per value: readers among live steps (+1 when a graph output) */
    int *reader;     /* per value: one reading step */
    int *prod;       /* per value: producing step, -1 if none */
    uint8_t *is_out; /* per value: graph output */
    uint8_t *removed;/* per step */
    int *parent;     /* union-find over values (layout pass) */
    uint8_t *gbad, *gconv;
    uint8_t *anchor; /* per step: a layout anchor (layout pass) */
    bool enabled[MTS_MAX_BACKENDS]; /* per entry of mts_backends[]: takes part in this plan */
    void *bopt[MTS_MAX_BACKENDS];   /* per backend: its own state for this optimization */
} mts__opt;

static inline bool is_op(const mts__step *st, const char *name)
{
    return st->nd->domain[0] == 0 && !strcmp(st->nd->op_type, name);
}

static inline bool live_value(const mts__plan *p, int v)
{
    return v >= 0 && (p->state[v] == MTS__V_STATIC || p->state[v] == MTS__V_INPUT);
}

static inline bool const_value(const mts__plan *p, int v)
{
    return v >= 0 && p->state[v] == MTS__V_CONST;
}

static inline bool is_neutral(const mts_tensor *t)
{
    return t->rank == 4 && (t->dims[1] == 1 || t->dims[2] * t->dims[3] == 1);
}

static inline bool is_cand(const mts__opt *o, int v)
{
    return v >= 0 && o->p->state[v] == MTS__V_STATIC && o->p->vals[v].rank == 4 && !is_neutral(&o->p->vals[v]);
}

/* The only reader of v when v has exactly one and is not a graph output; else -1. */
static inline int sole_reader(const mts__opt *o, int v)
{
    return (v >= 0 && o->nuse[v] == 1 && !o->is_out[v]) ? o->reader[v] : -1;
}

static inline bool float_value(const mts__plan *p, int v)
{
    return v >= 0 && (live_value(p, v) || const_value(p, v)) && p->vals[v].dtype == MTS_DTYPE_FLOAT;
}

static inline bool plain_step(const mts__opt *o, int s, const char *op)
{
    return s >= 0 && !o->removed[s] && o->p->steps[s].kind == MTS__S_KERNEL && !o->p->steps[s].dynamic &&
           is_op(&o->p->steps[s], op) && o->p->steps[s].n_out == 1;
}

/* Recounts nuse, reader and prod over the steps not removed. */
void mts__count_uses(mts__opt *o);
/* Points every reader of value `from` at value `to`. */
void mts__redirect(mts__opt *o, int from, int to);
/* Whether v is a constant float scalar; its value in *f. */
bool mts__const_scalar(const mts__plan *p, int v, float *f);
/* x * c for an elementwise step st (op "Mul" or "Div") reading x and a constant scalar: c (1/c
 * for Div), else 0. */
float mts__scaled_by(const mts__plan *p, const mts__step *st, int x);
/* Resize step st is a nearest-neighbour upsampling by integer factors on H and W. */
bool mts__nearest_upsample(const mts__plan *p, const mts__step *st);
/* A plan-owned copy of st->nd with op_type `op` (NULL: unchanged) and one more attribute. */
mts_node *mts__node_with_attr(mts__plan *p, const mts__step *st, const char *op, mts_attr extra);
/* Gives step st a plan-owned copy of its node with integer attribute `name` = v added; false
 * (st unchanged) when out of memory. */
bool mts__step_set_int(mts__plan *p, mts__step *st, const char *name, int64_t v);

/* Whether step st is a Conv that the fast backend's direct small-channel kernel will run (one
 * to four output channels; kernels/fast_backend.c), in this plan. Such a step may read a
 * channels-last bfloat16 source (attribute mts_src_bf16), which the bf16 hand-offs of the
 * oneDNN backend use for a lip-sync UNet's 3-channel head. */
bool mts__fast_small_conv(const mts__opt *o, const mts__step *st);
/* A plan-owned copy of n int64 values. */
int64_t *mts__pool_ints(mts__plan *p, const int64_t *v, int n);

#endif
