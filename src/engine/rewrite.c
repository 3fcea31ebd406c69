/*
 * Graph-rewrite helpers of the plan optimizer, shared by optimize.c and the backends' rewrites
 * (declared in rewrite.h): use counting and reader redirection over a plan's steps, constant
 * scalar tests, the nearest-upsampling test, and plan-owned node copies.
 */
#include <string.h>

#include "engine/rewrite.h"

void mts__count_uses(mts__opt *o)
{
    mts__plan *p = o->p;
    for (int v = 0; v < o->nv; v++) o->nuse[v] = o->is_out[v], o->reader[v] = -1, o->prod[v] = -1;
    for (int s = 0; s < p->n_steps; s++) {
        if (o->removed[s]) continue;
        const mts__step *st = &p->steps[s];
        for (int j = 0; j < st->n_in; j++) {
            int v = st->in[j];
            if (v < 0) continue;
            bool again = false;
            for (int q = 0; q < j; q++)
                if (st->in[q] == v) again = true;
            if (again) {
                o->nuse[v] += 2; /* read twice by one step: never fusable */
                continue;
            }
            o->nuse[v]++;
            o->reader[v] = s;
        }
        for (int j = 0; j < st->n_out; j++)
            if (st->out[j] >= 0) o->prod[st->out[j]] = s;
    }
}

void mts__redirect(mts__opt *o, int from, int to)
{
    for (int s = 0; s < o->p->n_steps; s++) {
        mts__step *st = &o->p->steps[s];
        for (int j = 0; j < st->n_in; j++)
            if (st->in[j] == from) st->in[j] = to;
    }
}

bool mts__const_scalar(const mts__plan *p, int v, float *f)
{
    if (!const_value(p, v) || p->vals[v].dtype != MTS_DTYPE_FLOAT || mts_tensor_numel(&p->vals[v]) != 1) return false;
    *f = ((const float *)p->vals[v].data)[0];
    return true;
}

/* x * c for an elementwise step st (op "Mul" or "Div") reading x and a constant scalar: c (1/c for
 * Div), else 0. */
float mts__scaled_by(const mts__plan *p, const mts__step *st, int x)
{
    float f;
    if (st->dynamic || st->kind != MTS__S_KERNEL || st->n_in != 2 || st->n_out != 1) return 0;
    if (is_op(st, "Mul")) {
        int o = st->in[0] == x ? st->in[1] : st->in[0];
        return (st->in[0] == x || st->in[1] == x) && mts__const_scalar(p, o, &f) ? f : 0;
    }
    if (is_op(st, "Div") && st->in[0] == x && mts__const_scalar(p, st->in[1], &f) && f != 0) return 1.0f / f;
    return 0;
}

/* Resize that is a nearest-neighbour upsampling by integer factors on H and W: out[y] = in[y/s].
 * For integer s, asymmetric + floor and half_pixel + round_prefer_floor/ceil both pick y/s. */
bool mts__nearest_upsample(const mts__plan *p, const mts__step *st)
{
    const mts_node *n = st->nd;
    if (strcmp(mts_attr_string(n, "mode", "nearest"), "nearest")) return false;
    const char *ct = mts_attr_string(n, "coordinate_transformation_mode", "half_pixel");
    const char *nm = mts_attr_string(n, "nearest_mode", "round_prefer_floor");
    bool ok = (!strcmp(ct, "asymmetric") && !strcmp(nm, "floor")) ||
              (!strcmp(ct, "half_pixel") && (!strcmp(nm, "round_prefer_floor") || !strcmp(nm, "round_prefer_ceil")));
    if (!ok || mts_attr_int(n, "antialias", 0) || mts_node_attr(n, "axes")) return false;
    const mts_tensor *x = &p->vals[st->in[0]], *y = &p->vals[st->out[0]];
    if (x->rank != 4 || y->rank != 4 || x->dims[0] != y->dims[0] || x->dims[1] != y->dims[1]) return false;
    for (int a = 2; a < 4; a++)
        if (x->dims[a] < 1 || y->dims[a] % x->dims[a] != 0) return false;
    /* The planned output shape must come from exact factors: with scales, out = floor(in * s). */
    if (st->n_in > 2 && st->in[2] >= 0 && mts_tensor_numel(&p->vals[st->in[2]]) == 4) {
        const mts_tensor *sc = &p->vals[st->in[2]];
        if (sc->dtype != MTS_DTYPE_FLOAT) return false;
        const float *s = sc->data;
        if (s[0] != 1.0f || s[1] != 1.0f) return false;
        for (int a = 2; a < 4; a++)
            if (s[a] != (float)(y->dims[a] / x->dims[a])) return false;
    }
    return true;
}

/* A plan-owned copy of st->nd with op_type `op` (NULL: unchanged) and one more attribute. */
mts_node *mts__node_with_attr(mts__plan *p, const mts__step *st, const char *op, mts_attr extra)
{
    mts_node *n = mts_pool_alloc(&p->pool, sizeof *n);
    mts_attr *a = n ? mts_pool_alloc(&p->pool, sizeof *a * (size_t)(st->nd->n_attr + 1)) : NULL;
    if (!a) return NULL;
    *n = *st->nd;
    memcpy(a, st->nd->attrs, sizeof *a * (size_t)st->nd->n_attr);
    a[n->n_attr++] = extra;
    n->attrs = a;
    if (op) n->op_type = op;
    return n;
}

bool mts__step_set_int(mts__plan *p, mts__step *st, const char *name, int64_t v)
{
    mts_attr a = {0};
    a.name = name;
    a.type = MTS_ATTR_INT;
    a.i = v;
    mts_node *n = mts__node_with_attr(p, st, NULL, a);
    if (!n) return false;
    st->nd = n;
    return true;
}

int64_t *mts__pool_ints(mts__plan *p, const int64_t *v, int n)
{
    int64_t *d = mts_pool_alloc(&p->pool, sizeof(int64_t) * (size_t)n);
    if (d) memcpy(d, v, sizeof(int64_t) * (size_t)n);
    return d;
}
