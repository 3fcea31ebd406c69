/*
 * Unit tests of control flow (If, Loop, Scan subgraphs): models are written in the ONNX wire
 * format by a small protobuf writer here, then loaded from memory. Covered: If branches reading
 * outer-scope values and their own initializers (both branches, both backends, the captured
 * values listed as the node's implicit inputs), branches whose outputs are outer values, a
 * dynamic If (branches of different shapes, one known only by running it), Ifs
 * decided at load and inlined (constant conditions, shapes of fixed-shape inputs, a fixed dim
 * of an input with a symbolic one, nested Ifs and Ifs inside a kept If's branch; with inlining
 * off the outputs are the same) while a condition on a symbolic dim stays an If, conditions on
 * absurd shapes from a hostile file (left undecided, no overflow, the planner's error), a Loop
 * carrying state with a scan output run
 * repeatedly on one context with different trip counts, and load errors for malformed
 * subgraphs (mismatched branch outputs, unknown names, too deep nesting, a Loop body with the
 * wrong inputs, a subgraph without outputs, every truncation of a file).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* ---- a minimal protobuf writer ---- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void varint(buf *b, uint64_t v)
{
    do {
        uint8_t c = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) c |= 0x80;
        put(b, &c, 1);
    } while (v);
}

static void fint(buf *b, int f, uint64_t v)
{
    varint(b, (uint64_t)f << 3);
    varint(b, v);
}

static void fbytes(buf *b, int f, const void *d, size_t n)
{
    varint(b, (uint64_t)f << 3 | 2);
    varint(b, n);
    put(b, d, n);
}

static void fstr(buf *b, int f, const char *s)
{
    fbytes(b, f, s, strlen(s));
}

/* Appends sub as message field f and frees it. */
static void fmsg(buf *b, int f, buf *sub)
{
    fbytes(b, f, sub->p, sub->n);
    free(sub->p);
    memset(sub, 0, sizeof *sub);
}

enum { T_FLOAT = 1, T_INT64 = 7, T_BOOL = 9 };

/* ValueInfoProto field f of graph g: name, element type, rank (-1: no shape) and dims. */
static void value_info(buf *g, int f, const char *name, int elem, int rank, const int64_t *dims)
{
    buf vi = {0}, tp = {0}, tt = {0}, sh = {0};
    fstr(&vi, 1, name);
    fint(&tt, 1, (uint64_t)elem);
    if (rank >= 0) {
        for (int i = 0; i < rank; i++) {
            buf d = {0};
            fint(&d, 1, (uint64_t)dims[i]);
            fmsg(&sh, 1, &d);
        }
        if (!sh.p) put(&sh, "", 0);
        fmsg(&tt, 2, &sh);
    }
    fmsg(&tp, 1, &tt);
    fmsg(&vi, 2, &tp);
    fmsg(g, f, &vi);
}

static void init_f32(buf *g, const char *name, int rank, const int64_t *dims, const float *v, int n)
{
    buf t = {0};
    for (int i = 0; i < rank; i++) fint(&t, 1, (uint64_t)dims[i]);
    fint(&t, 2, T_FLOAT);
    fstr(&t, 8, name);
    fbytes(&t, 9, v, sizeof(float) * (size_t)n);
    fmsg(g, 5, &t);
}

/* A scalar TensorProto (bool or int64) named name (NULL: unnamed) in *t. */
static void scalar(buf *t, const char *name, int elem, int64_t v)
{
    uint8_t b = (uint8_t)v;
    fint(t, 2, (uint64_t)elem);
    if (name) fstr(t, 8, name);
    if (elem == T_BOOL) fbytes(t, 9, &b, 1);
    else fbytes(t, 9, &v, sizeof v);
}

static void init_scalar(buf *g, const char *name, int elem, int64_t v)
{
    buf t = {0};
    scalar(&t, name, elem, v);
    fmsg(g, 5, &t);
}

typedef struct attr {
    const char *name;
    buf *graph;  /* GRAPH attribute when set, */
    int64_t i;   /* else INT, */
    buf *tensor; /* or TENSOR when this is set */
} attr;

/* NodeProto in graph g; ins/outs NULL-terminated ("" for an omitted input). */
static void node(buf *g, const char *op, const char *const *ins, const char *const *outs, attr *attrs, int n_attr)
{
    buf nd = {0};
    for (int i = 0; ins[i]; i++) fstr(&nd, 1, ins[i]);
    for (int i = 0; outs[i]; i++) fstr(&nd, 2, outs[i]);
    fstr(&nd, 4, op);
    for (int a = 0; a < n_attr; a++) {
        buf at = {0};
        fstr(&at, 1, attrs[a].name);
        if (attrs[a].graph) {
            fmsg(&at, 6, attrs[a].graph);
            fint(&at, 20, 5);
        } else if (attrs[a].tensor) {
            fmsg(&at, 5, attrs[a].tensor);
            fint(&at, 20, 4);
        } else {
            fint(&at, 3, (uint64_t)attrs[a].i);
            fint(&at, 20, 2);
        }
        fmsg(&nd, 5, &at);
    }
    fmsg(g, 1, &nd);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ModelProto around graph g (freed); returns the bytes in *m. */
static void model(buf *m, buf *g)
{
    buf op = {0};
    fint(m, 1, 8);
    fstr(g, 2, "g");
    fmsg(m, 7, g);
    fint(&op, 2, 17);
    fmsg(m, 8, &op);
}

static int load(const buf *b, const char *backend, mts_model **m, mts_err *err)
{
    mts_load_opts o = {0};
    o.backend = backend;
    return mts_model_load_buffer(b->p, b->n, "cf", &o, m, err);
}

/* ---- If reading outer-scope values ---- */

static void make_if(buf *out)
{
    const int64_t d3[] = {3};
    const float W[] = {10, 20, 30}, K[] = {2, 2, 2};
    buf then_g = {0}, else_g = {0}, g = {0};
    node(&then_g, "Add", L("x", "W"), L("ty"), NULL, 0);
    value_info(&then_g, 12, "ty", T_FLOAT, -1, NULL);
    node(&else_g, "Mul", L("x", "K"), L("ey"), NULL, 0);
    init_f32(&else_g, "K", 1, d3, K, 3);
    value_info(&else_g, 12, "ey", T_FLOAT, -1, NULL);
    attr at[] = {{"then_branch", &then_g, 0, NULL}, {"else_branch", &else_g, 0, NULL}};
    node(&g, "If", L("c"), L("y"), at, 2);
    node(&g, "Neg", L("y"), L("out"), NULL, 0);
    init_f32(&g, "W", 1, d3, W, 3);
    value_info(&g, 11, "c", T_BOOL, 0, NULL);
    value_info(&g, 11, "x", T_FLOAT, 1, d3);
    value_info(&g, 12, "out", T_FLOAT, 1, d3);
    model(out, &g);
}

static void test_if_outer_scope(void **state)
{
    (void)state;
    buf b = {0};
    make_if(&b);
    const char *backends[] = {"reference", "default"};
    for (int be = 0; be < 2; be++) {
        mts_model *m = NULL;
        mts_err err = {0};
        int rc = load(&b, backends[be], &m, &err);
        if (rc) fail_msg("load: %s", err.msg);
        const mts_node *n = mts_model_node(m, 0);
        assert_string_equal(n->op_type, "If");
        assert_int_equal(n->n_implicit, 2); /* x and W */
        assert_int_equal(n->n_in, 3);
        mts_ctx *c = NULL;
        assert_int_equal(mts_ctx_create(m, 2, &c, &err), 0);
        for (int rep = 0; rep < 3; rep++)
            for (int cond = 1; cond >= 0; cond--) {
                uint8_t cv = (uint8_t)cond;
                float x[] = {1, 2, 3};
                mts_tensor in[2] = {{MTS_DTYPE_BOOL, 0, {0}, &cv}, {MTS_DTYPE_FLOAT, 1, {3}, x}};
                const mts_tensor *out[1];
                rc = mts_ctx_run(c, in, 2, out, &err);
                if (rc) fail_msg("run: %s", err.msg);
                const float *y = out[0]->data;
                for (int i = 0; i < 3; i++) {
                    float want = cond ? -(x[i] + 10.0f * (float)(i + 1)) : -(x[i] * 2);
                    assert_true(y[i] == want);
                }
            }
        mts_ctx_free(c);
        mts_model_free(m);
    }
    free(b.p);
}

/* Branch outputs that are outer values themselves (no node in the branch). */
static void test_if_passthrough(void **state)
{
    (void)state;
    const int64_t d3[] = {3};
    const float W[] = {7, 8, 9};
    buf t = {0}, e = {0}, g = {0}, b = {0};
    node(&t, "Identity", L("x"), L("unused"), NULL, 0);
    value_info(&t, 12, "W", T_FLOAT, -1, NULL);
    node(&e, "Identity", L("W"), L("unused2"), NULL, 0);
    value_info(&e, 12, "x", T_FLOAT, -1, NULL);
    attr at[] = {{"then_branch", &t, 0, NULL}, {"else_branch", &e, 0, NULL}};
    node(&g, "If", L("c"), L("y"), at, 2);
    init_f32(&g, "W", 1, d3, W, 3);
    value_info(&g, 11, "c", T_BOOL, 0, NULL);
    value_info(&g, 11, "x", T_FLOAT, 1, d3);
    value_info(&g, 12, "y", T_FLOAT, 1, d3);
    model(&b, &g);
    mts_model *m = NULL;
    mts_err err = {0};
    int rc = load(&b, NULL, &m, &err);
    if (rc) fail_msg("load: %s", err.msg);
    mts_ctx *c = NULL;
    assert_int_equal(mts_ctx_create(m, 1, &c, &err), 0);
    for (int cond = 0; cond < 2; cond++) {
        uint8_t cv = (uint8_t)cond;
        float x[] = {1, 2, 3};
        mts_tensor in[2] = {{MTS_DTYPE_BOOL, 0, {0}, &cv}, {MTS_DTYPE_FLOAT, 1, {3}, x}};
        const mts_tensor *out[1];
        rc = mts_ctx_run(c, in, 2, out, &err);
        if (rc) fail_msg("run: %s", err.msg);
        const float *y = out[0]->data;
        for (int i = 0; i < 3; i++) assert_true(y[i] == (cond ? W[i] : x[i]));
    }
    mts_ctx_free(c);
    mts_model_free(m);
    free(b.p);
}

/* ---- If with a condition known at load: inlined ---- */

/* Four Ifs whose conditions are known at load: an initializer (a branch adding a captured
 * initializer), a Constant (a branch passing an outer initializer through), and
 * Shape(x)[0] == 3 of a fixed-shape input (a branch holding a nested If on a captured
 * constant, and an initializer of its own as a second output). When x is declared with a
 * symbolic dim instead (sym), the third condition is known only at plan time and stays an If. */
static void make_const_ifs(buf *out, bool sym)
{
    const int64_t d3[] = {3};
    const float W[] = {10, 20, 30}, K[] = {2, 2, 2}, B[] = {5, 6, 7};
    buf t1 = {0}, e1 = {0}, t2 = {0}, e2 = {0}, t3 = {0}, e3 = {0}, t4 = {0}, e4 = {0}, g = {0}, cv = {0};
    node(&t1, "Add", L("x", "ten"), L("t1y"), NULL, 0);
    value_info(&t1, 12, "t1y", T_FLOAT, -1, NULL);
    node(&e1, "Mul", L("x", "K"), L("e1y"), NULL, 0);
    init_f32(&e1, "K", 1, d3, K, 3);
    value_info(&e1, 12, "e1y", T_FLOAT, -1, NULL);
    node(&t2, "Neg", L("x"), L("t2y"), NULL, 0);
    value_info(&t2, 12, "t2y", T_FLOAT, -1, NULL);
    node(&e2, "Identity", L("x"), L("unused"), NULL, 0);
    value_info(&e2, 12, "W", T_FLOAT, -1, NULL);
    node(&t4, "Neg", L("x"), L("t4y"), NULL, 0);
    value_info(&t4, 12, "t4y", T_FLOAT, -1, NULL);
    node(&e4, "Abs", L("x"), L("e4y"), NULL, 0);
    value_info(&e4, 12, "e4y", T_FLOAT, -1, NULL);
    attr a4[] = {{"then_branch", &t4, 0, NULL}, {"else_branch", &e4, 0, NULL}};
    node(&t3, "If", L("ct"), L("n4"), a4, 2);
    init_f32(&t3, "B", 1, d3, B, 3);
    value_info(&t3, 12, "n4", T_FLOAT, -1, NULL);
    value_info(&t3, 12, "B", T_FLOAT, -1, NULL);
    node(&e3, "Identity", L("x"), L("e3a"), NULL, 0);
    node(&e3, "Identity", L("W"), L("e3b"), NULL, 0);
    value_info(&e3, 12, "e3a", T_FLOAT, -1, NULL);
    value_info(&e3, 12, "e3b", T_FLOAT, -1, NULL);
    attr a1[] = {{"then_branch", &t1, 0, NULL}, {"else_branch", &e1, 0, NULL}};
    node(&g, "If", L("ct"), L("y1"), a1, 2);
    scalar(&cv, NULL, T_BOOL, 0);
    attr ac[] = {{"value", NULL, 0, &cv}};
    node(&g, "Constant", L(NULL), L("cf"), ac, 1);
    attr a2[] = {{"then_branch", &t2, 0, NULL}, {"else_branch", &e2, 0, NULL}};
    node(&g, "If", L("cf"), L("y2"), a2, 2);
    node(&g, "Shape", L("x"), L("shp"), NULL, 0);
    node(&g, "Gather", L("shp", "zero"), L("n"), NULL, 0);
    node(&g, "Equal", L("n", "three"), L("c3"), NULL, 0);
    attr a3[] = {{"then_branch", &t3, 0, NULL}, {"else_branch", &e3, 0, NULL}};
    node(&g, "If", L("c3"), L("y3", "y4"), a3, 2);
    init_f32(&g, "W", 1, d3, W, 3);
    init_f32(&g, "ten", 0, NULL, W, 1);
    init_scalar(&g, "ct", T_BOOL, 1);
    init_scalar(&g, "zero", T_INT64, 0);
    init_scalar(&g, "three", T_INT64, 3);
    if (sym) {
        buf vi = {0}, tp = {0}, tt = {0}, sh = {0}, d = {0};
        fstr(&vi, 1, "x");
        fint(&tt, 1, T_FLOAT);
        fstr(&d, 2, "N");
        fmsg(&sh, 1, &d);
        fmsg(&tt, 2, &sh);
        fmsg(&tp, 1, &tt);
        fmsg(&vi, 2, &tp);
        fmsg(&g, 11, &vi);
    } else {
        value_info(&g, 11, "x", T_FLOAT, 1, d3);
    }
    value_info(&g, 12, "y1", T_FLOAT, -1, NULL);
    value_info(&g, 12, "y2", T_FLOAT, -1, NULL);
    value_info(&g, 12, "y3", T_FLOAT, -1, NULL);
    value_info(&g, 12, "y4", T_FLOAT, -1, NULL);
    model(out, &g);
}

static int count_ifs(const mts_model *m)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    int n = 0;
    for (int i = 0; i < info.n_nodes; i++) n += !strcmp(mts_model_node(m, i)->op_type, "If");
    return n;
}

static void check_const_ifs(const mts_model *m, int64_t len)
{
    mts_ctx *c = NULL;
    mts_err err = {0};
    assert_int_equal(mts_ctx_create((mts_model *)m, 2, &c, &err), 0);
    for (int rep = 0; rep < 3; rep++) {
        float x[] = {1, -2, 3};
        mts_tensor in[1] = {{MTS_DTYPE_FLOAT, 1, {len}, x}};
        const mts_tensor *out[4];
        int rc = mts_ctx_run(c, in, 1, out, &err);
        if (rc) fail_msg("run: %s", err.msg);
        for (int j = 0; j < 4; j++) assert_int_equal(out[j]->dims[0], j == 1 || j == 3 ? 3 : len);
        for (int i = 0; i < len; i++) {
            const float W[] = {10, 20, 30}, B[] = {5, 6, 7};
            assert_true(((const float *)out[0]->data)[i] == x[i] + 10);
            assert_true(((const float *)out[1]->data)[i] == W[i]);
            if (len == 3) {
                assert_true(((const float *)out[2]->data)[i] == -x[i]);
                assert_true(((const float *)out[3]->data)[i] == B[i]);
            } else { /* Shape(x)[0] != 3: the else branch */
                assert_true(((const float *)out[2]->data)[i] == x[i]);
            }
        }
        if (len != 3)
            for (int i = 0; i < 3; i++) assert_true(((const float *)out[3]->data)[i] == (float)(10 * (i + 1)));
    }
    mts_ctx_free(c);
}

static void test_if_const_inlined(void **state)
{
    (void)state;
    buf b = {0};
    make_const_ifs(&b, false);
    const char *backends[] = {"reference", "default"};
    for (int be = 0; be < 2; be++)
        for (int inl = 1; inl >= 0; inl--) {
            setenv("MTS_IF_INLINE", inl ? "1" : "0", 1);
            mts_model *m = NULL;
            mts_err err = {0};
            int rc = load(&b, backends[be], &m, &err);
            if (rc) fail_msg("load: %s", err.msg);
            /* inlined: no If left (the nested one too); kept: the three top-level Ifs */
            assert_int_equal(count_ifs(m), inl ? 0 : 3);
            check_const_ifs(m, 3);
            mts_model_free(m);
        }
    unsetenv("MTS_IF_INLINE");
    free(b.p);
}

/* A condition on a symbolic dim is decided per input shape at plan time: the If stays, and
 * both branches run right. */
static void test_if_shape_cond_kept(void **state)
{
    (void)state;
    buf b = {0};
    make_const_ifs(&b, true);
    mts_model *m = NULL;
    mts_err err = {0};
    int rc = load(&b, NULL, &m, &err);
    if (rc) fail_msg("load: %s", err.msg);
    assert_int_equal(count_ifs(m), 1);
    check_const_ifs(m, 3);
    check_const_ifs(m, 2);
    mts_model_free(m);
    free(b.p);
}

/* Conditions on the fixed dim of an input with a symbolic one, [N, 3]: Shape(x)[1] == 3 at the
 * top level, and Shape(Transpose(x))[0] == 3 inside the then branch of an If on a run-time
 * condition (x captured). Both are decided at load; the run-time If stays. */
static void test_if_partial_shape_inlined(void **state)
{
    (void)state;
    buf ta = {0}, ea = {0}, tb = {0}, eb = {0}, tc = {0}, ec = {0}, g = {0}, b = {0};
    node(&ta, "Neg", L("x"), L("tay"), NULL, 0);
    value_info(&ta, 12, "tay", T_FLOAT, -1, NULL);
    node(&ea, "Abs", L("x"), L("eay"), NULL, 0);
    value_info(&ea, 12, "eay", T_FLOAT, -1, NULL);
    node(&tc, "Identity", L("x"), L("tcy"), NULL, 0);
    value_info(&tc, 12, "tcy", T_FLOAT, -1, NULL);
    node(&ec, "Neg", L("x"), L("ecy"), NULL, 0);
    value_info(&ec, 12, "ecy", T_FLOAT, -1, NULL);
    node(&tb, "Transpose", L("x"), L("xt"), NULL, 0);
    node(&tb, "Shape", L("xt"), L("st"), NULL, 0);
    node(&tb, "Gather", L("st", "zero"), L("d0"), NULL, 0);
    node(&tb, "Equal", L("d0", "three"), L("cc"), NULL, 0);
    attr ac[] = {{"then_branch", &tc, 0, NULL}, {"else_branch", &ec, 0, NULL}};
    node(&tb, "If", L("cc"), L("tby"), ac, 2);
    value_info(&tb, 12, "tby", T_FLOAT, -1, NULL);
    node(&eb, "Abs", L("x"), L("eby"), NULL, 0);
    value_info(&eb, 12, "eby", T_FLOAT, -1, NULL);
    node(&g, "Shape", L("x"), L("s"), NULL, 0);
    node(&g, "Gather", L("s", "one"), L("d1"), NULL, 0);
    node(&g, "Equal", L("d1", "three"), L("ca"), NULL, 0);
    attr aa[] = {{"then_branch", &ta, 0, NULL}, {"else_branch", &ea, 0, NULL}};
    node(&g, "If", L("ca"), L("ya"), aa, 2);
    attr ab[] = {{"then_branch", &tb, 0, NULL}, {"else_branch", &eb, 0, NULL}};
    node(&g, "If", L("c"), L("yb"), ab, 2);
    init_scalar(&g, "zero", T_INT64, 0);
    init_scalar(&g, "one", T_INT64, 1);
    init_scalar(&g, "three", T_INT64, 3);
    {
        buf vi = {0}, tp = {0}, tt = {0}, sh = {0}, d0 = {0}, d1 = {0};
        fstr(&vi, 1, "x");
        fint(&tt, 1, T_FLOAT);
        fstr(&d0, 2, "N");
        fmsg(&sh, 1, &d0);
        fint(&d1, 1, 3);
        fmsg(&sh, 1, &d1);
        fmsg(&tt, 2, &sh);
        fmsg(&tp, 1, &tt);
        fmsg(&vi, 2, &tp);
        fmsg(&g, 11, &vi);
    }
    value_info(&g, 11, "c", T_BOOL, 0, NULL);
    value_info(&g, 12, "ya", T_FLOAT, -1, NULL);
    value_info(&g, 12, "yb", T_FLOAT, -1, NULL);
    model(&b, &g);
    const char *backends[] = {"reference", "default"};
    for (int be = 0; be < 2; be++) {
        mts_model *m = NULL;
        mts_err err = {0};
        int rc = load(&b, backends[be], &m, &err);
        if (rc) fail_msg("load: %s", err.msg);
        assert_int_equal(count_ifs(m), 1); /* the run-time one */
        mts_model_info info;
        mts_model_get_info(m, &info);
        const mts_node *ifb = NULL;
        for (int i = 0; i < info.n_nodes; i++)
            if (!strcmp(mts_model_node(m, i)->op_type, "If")) ifb = mts_model_node(m, i);
        assert_non_null(ifb);
        for (int a = 0; a < ifb->n_attr; a++)
            if (!strcmp(ifb->attrs[a].name, "then_branch")) assert_int_equal(count_ifs(ifb->attrs[a].g), 0);
        mts_ctx *c = NULL;
        assert_int_equal(mts_ctx_create(m, 2, &c, &err), 0);
        for (int rows = 1; rows <= 3; rows++)
            for (int cond = 0; cond < 2; cond++) {
                float x[9] = {1, -2, 3, -4, 5, -6, 7, -8, 9};
                uint8_t cv = (uint8_t)cond;
                mts_tensor in[2] = {{MTS_DTYPE_FLOAT, 2, {rows, 3}, x}, {MTS_DTYPE_BOOL, 0, {0}, &cv}};
                const mts_tensor *out[2];
                rc = mts_ctx_run(c, in, 2, out, &err);
                if (rc) fail_msg("run: %s", err.msg);
                for (int i = 0; i < rows * 3; i++) {
                    assert_true(((const float *)out[0]->data)[i] == -x[i]);
                    assert_true(((const float *)out[1]->data)[i] == (cond ? x[i] : (x[i] < 0 ? -x[i] : x[i])));
                }
            }
        mts_ctx_free(c);
        mts_model_free(m);
    }
    free(b.p);
}

/* Branches of different output shapes on a run-time condition, one of them of a shape only its
 * run gives (Tile by a run-time count): the If is a dynamic step that runs that branch during
 * inference and hands its outputs over in run; alternating branches on one context, both
 * backends. */
static void test_if_dynamic_shapes(void **state)
{
    (void)state;
    const int64_t d3[] = {3};
    buf t = {0}, e = {0}, g = {0}, b = {0};
    node(&t, "Tile", L("x", "reps"), L("ty"), NULL, 0); /* its shape depends on a run-time value */
    value_info(&t, 12, "ty", T_FLOAT, -1, NULL);
    node(&e, "Neg", L("x"), L("ey"), NULL, 0);
    value_info(&e, 12, "ey", T_FLOAT, -1, NULL);
    attr at[] = {{"then_branch", &t, 0, NULL}, {"else_branch", &e, 0, NULL}};
    node(&g, "If", L("c"), L("y"), at, 2);
    node(&g, "Abs", L("y"), L("out"), NULL, 0);
    value_info(&g, 11, "c", T_BOOL, 0, NULL);
    value_info(&g, 11, "x", T_FLOAT, 1, d3);
    const int64_t d1[] = {1};
    value_info(&g, 11, "reps", T_INT64, 1, d1);
    value_info(&g, 12, "out", T_FLOAT, -1, NULL);
    model(&b, &g);
    const char *backends[] = {"reference", "default"};
    for (int be = 0; be < 2; be++) {
        mts_model *m = NULL;
        mts_err err = {0};
        int rc = load(&b, backends[be], &m, &err);
        if (rc) fail_msg("load: %s", err.msg);
        mts_ctx *c = NULL;
        assert_int_equal(mts_ctx_create(m, 2, &c, &err), 0);
        for (int rep = 0; rep < 6; rep++) {
            uint8_t cv = (uint8_t)(rep % 3 != 1);
            float x[] = {1, -2, (float)rep};
            int64_t reps = 2;
            mts_tensor in[3] = {{MTS_DTYPE_BOOL, 0, {0}, &cv}, {MTS_DTYPE_FLOAT, 1, {3}, x},
                                {MTS_DTYPE_INT64, 1, {1}, &reps}};
            const mts_tensor *out[1];
            rc = mts_ctx_run(c, in, 3, out, &err);
            if (rc) fail_msg("run: %s", err.msg);
            assert_int_equal(out[0]->dims[0], cv ? 6 : 3);
            const float *y = out[0]->data;
            for (int i = 0; i < (cv ? 6 : 3); i++) assert_true(y[i] == (x[i % 3] < 0 ? -x[i % 3] : x[i % 3]));
        }
        mts_ctx_free(c);
        mts_model_free(m);
    }
    free(b.p);
}

static void init_i64(buf *g, const char *name, int n, const int64_t *v)
{
    buf t = {0};
    int64_t d = n;
    fint(&t, 1, (uint64_t)d);
    fint(&t, 2, T_INT64);
    fstr(&t, 8, name);
    fbytes(&t, 9, v, sizeof(int64_t) * (size_t)n);
    fmsg(g, 5, &t);
}

/* Conditions on shapes a hostile file makes absurd (pads of 2^62, an index out of range, an
 * axis out of range): nothing is decided at load, nothing overflows (ASan+UBSan build), and the
 * planner reports the bad node as before. */
static void test_if_hostile_shape_chains(void **state)
{
    (void)state;
    const int64_t pads[] = {0, INT64_C(1) << 62, 0, INT64_C(1) << 62}, big[] = {100}, ax[] = {9}, one[] = {1};
    const char *ops[] = {"Pad", "Gather", "Unsqueeze"};
    const char *needle[] = {"(#0, Pad)", "(#1, Gather)", "(#0, Unsqueeze)"};
    for (int k = 0; k < 3; k++) {
        buf t = {0}, e = {0}, g = {0}, b = {0};
        node(&t, "Neg", L("x"), L("ty"), NULL, 0);
        value_info(&t, 12, "ty", T_FLOAT, -1, NULL);
        node(&e, "Abs", L("x"), L("ey"), NULL, 0);
        value_info(&e, 12, "ey", T_FLOAT, -1, NULL);
        if (k == 0) {
            node(&g, "Pad", L("x", "pads"), L("p"), NULL, 0);
            node(&g, "Shape", L("p"), L("s"), NULL, 0);
            node(&g, "Gather", L("s", "i"), L("d"), NULL, 0);
        } else if (k == 1) {
            node(&g, "Shape", L("x"), L("s"), NULL, 0);
            node(&g, "Gather", L("s", "big"), L("d"), NULL, 0);
        } else {
            node(&g, "Unsqueeze", L("x", "ax"), L("u"), NULL, 0);
            node(&g, "Shape", L("u"), L("s"), NULL, 0);
            node(&g, "Gather", L("s", "i"), L("d"), NULL, 0);
        }
        node(&g, "Equal", L("d", "one"), L("c"), NULL, 0);
        attr at[] = {{"then_branch", &t, 0, NULL}, {"else_branch", &e, 0, NULL}};
        node(&g, "If", L("c"), L("y"), at, 2);
        init_i64(&g, "pads", 4, pads);
        init_i64(&g, "big", 1, big);
        init_i64(&g, "ax", 1, ax);
        init_i64(&g, "one", 1, one);
        init_scalar(&g, "i", T_INT64, 1);
        {
            buf vi = {0}, tp = {0}, tt = {0}, sh = {0}, d0 = {0}, d1 = {0};
            fstr(&vi, 1, "x");
            fint(&tt, 1, T_FLOAT);
            fstr(&d0, 2, "N");
            fmsg(&sh, 1, &d0);
            fint(&d1, 1, 3);
            fmsg(&sh, 1, &d1);
            fmsg(&tt, 2, &sh);
            fmsg(&tp, 1, &tt);
            fmsg(&vi, 2, &tp);
            fmsg(&g, 11, &vi);
        }
        value_info(&g, 12, "y", T_FLOAT, -1, NULL);
        model(&b, &g);
        mts_model *m = NULL;
        mts_err err = {0};
        int rc = load(&b, NULL, &m, &err);
        if (rc) fail_msg("%s: load: %s", ops[k], err.msg);
        assert_int_equal(count_ifs(m), 1);
        mts_ctx *c = NULL;
        assert_int_equal(mts_ctx_create(m, 1, &c, &err), 0);
        float x[6] = {0};
        mts_tensor in[1] = {{MTS_DTYPE_FLOAT, 2, {2, 3}, x}};
        const mts_tensor *out[1];
        rc = mts_ctx_run(c, in, 1, out, &err);
        assert_true(rc != 0);
        if (!strstr(err.msg, needle[k])) fail_msg("%s: message '%s' lacks '%s'", ops[k], err.msg, needle[k]);
        mts_ctx_free(c);
        mts_model_free(m);
        free(b.p);
    }
}

/* ---- Loop: loop-carried state and a scan output ---- */

static void test_loop_state_and_scan(void **state)
{
    (void)state;
    const int64_t d2[] = {2};
    const float two[] = {2};
    buf body = {0}, g = {0}, b = {0};
    node(&body, "Add", L("s", "x"), L("s_out"), NULL, 0);
    node(&body, "Mul", L("s_out", "two"), L("scan"), NULL, 0);
    node(&body, "Identity", L("cond"), L("cond_out"), NULL, 0);
    init_f32(&body, "two", 0, NULL, two, 1);
    value_info(&body, 11, "i", T_INT64, 0, NULL);
    value_info(&body, 11, "cond", T_BOOL, 0, NULL);
    value_info(&body, 11, "s", T_FLOAT, -1, NULL);
    value_info(&body, 12, "cond_out", T_BOOL, 0, NULL);
    value_info(&body, 12, "s_out", T_FLOAT, -1, NULL);
    value_info(&body, 12, "scan", T_FLOAT, -1, NULL);
    attr at[] = {{"body", &body, 0, NULL}};
    node(&g, "Loop", L("M", "", "x"), L("final", "scans"), at, 1);
    value_info(&g, 11, "M", T_INT64, 0, NULL);
    value_info(&g, 11, "x", T_FLOAT, 1, d2);
    value_info(&g, 12, "final", T_FLOAT, -1, NULL);
    value_info(&g, 12, "scans", T_FLOAT, -1, NULL);
    model(&b, &g);

    mts_model *m = NULL;
    mts_err err = {0};
    int rc = load(&b, NULL, &m, &err);
    if (rc) fail_msg("load: %s", err.msg);
    assert_int_equal(mts_model_node(m, 0)->n_implicit, 1); /* x, read by the body */
    mts_ctx *c = NULL;
    assert_int_equal(mts_ctx_create(m, 1, &c, &err), 0);
    const int64_t trips[] = {3, 5, 0, 3};
    for (int r = 0; r < 4; r++) {
        int64_t M = trips[r];
        float x[] = {1, 2};
        mts_tensor in[2] = {{MTS_DTYPE_INT64, 0, {0}, &M}, {MTS_DTYPE_FLOAT, 1, {2}, x}};
        const mts_tensor *out[2];
        rc = mts_ctx_run(c, in, 2, out, &err);
        if (rc) fail_msg("run: %s", err.msg);
        const float *f = out[0]->data;
        assert_true(f[0] == (float)(M + 1) * 1 && f[1] == (float)(M + 1) * 2);
        assert_int_equal(out[1]->dims[0], M);
        if (M > 0) {
            assert_int_equal(out[1]->rank, 2);
            assert_int_equal(out[1]->dims[1], 2);
            const float *s = out[1]->data;
            for (int64_t it = 0; it < M; it++)
                for (int j = 0; j < 2; j++) assert_true(s[it * 2 + j] == 2.0f * (float)(it + 2) * x[j]);
        }
    }
    mts_ctx_free(c);
    mts_model_free(m);
    free(b.p);
}

/* ---- malformed subgraphs ---- */

static void expect_load_error(buf *b, int code, const char *needle)
{
    mts_model *m = NULL;
    mts_err err = {0};
    int rc = load(b, "reference", &m, &err);
    if (rc == 0) {
        mts_model_free(m);
        fail_msg("loaded, expected an error containing '%s'", needle);
    }
    assert_int_equal(rc, code);
    if (!strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
    free(b->p);
    memset(b, 0, sizeof *b);
}

static void test_malformed(void **state)
{
    (void)state;
    const int64_t d3[] = {3};
    buf b = {0};
    { /* branches with different output counts */
        buf t = {0}, e = {0}, g = {0};
        node(&t, "Identity", L("x"), L("a"), NULL, 0);
        value_info(&t, 12, "a", T_FLOAT, -1, NULL);
        node(&e, "Identity", L("x"), L("a2"), NULL, 0);
        node(&e, "Identity", L("x"), L("b2"), NULL, 0);
        value_info(&e, 12, "a2", T_FLOAT, -1, NULL);
        value_info(&e, 12, "b2", T_FLOAT, -1, NULL);
        attr at[] = {{"then_branch", &t, 0, NULL}, {"else_branch", &e, 0, NULL}};
        node(&g, "If", L("c"), L("y"), at, 2);
        value_info(&g, 11, "c", T_BOOL, 0, NULL);
        value_info(&g, 11, "x", T_FLOAT, 1, d3);
        value_info(&g, 12, "y", T_FLOAT, 1, d3);
        model(&b, &g);
        expect_load_error(&b, MTS_EFORMAT, "then_branch has 1 outputs, else_branch 2");
    }
    { /* a name defined nowhere */
        buf t = {0}, e = {0}, g = {0};
        node(&t, "Identity", L("nope"), L("a"), NULL, 0);
        value_info(&t, 12, "a", T_FLOAT, -1, NULL);
        node(&e, "Identity", L("x"), L("b"), NULL, 0);
        value_info(&e, 12, "b", T_FLOAT, -1, NULL);
        attr at[] = {{"then_branch", &t, 0, NULL}, {"else_branch", &e, 0, NULL}};
        node(&g, "If", L("c"), L("y"), at, 2);
        value_info(&g, 11, "c", T_BOOL, 0, NULL);
        value_info(&g, 11, "x", T_FLOAT, 1, d3);
        value_info(&g, 12, "y", T_FLOAT, 1, d3);
        model(&b, &g);
        expect_load_error(&b, MTS_EFORMAT, "input 'nope' is not a graph input");
    }
    { /* 20 levels of If inside If */
        buf inner = {0};
        node(&inner, "Identity", L("x"), L("y0"), NULL, 0);
        value_info(&inner, 12, "y0", T_FLOAT, -1, NULL);
        for (int lvl = 1; lvl <= 20; lvl++) {
            buf other = {0}, outer = {0};
            char prev[16], name[16];
            snprintf(prev, sizeof prev, "y%d", lvl - 1);
            snprintf(name, sizeof name, "y%d", lvl);
            node(&other, "Identity", L("x"), L(prev), NULL, 0);
            value_info(&other, 12, prev, T_FLOAT, -1, NULL);
            attr at[] = {{"then_branch", &inner, 0, NULL}, {"else_branch", &other, 0, NULL}};
            node(&outer, "If", L("c"), L(name), at, 2);
            value_info(&outer, 12, name, T_FLOAT, -1, NULL);
            inner = outer;
        }
        /* inner is now a graph whose node is the outermost If: make it the model's graph */
        value_info(&inner, 11, "c", T_BOOL, 0, NULL);
        value_info(&inner, 11, "x", T_FLOAT, 1, d3);
        model(&b, &inner);
        expect_load_error(&b, MTS_ELIMIT, "nested more than 16 levels");
    }
    { /* Loop body without the condition input */
        buf body = {0}, g = {0};
        node(&body, "Identity", L("s"), L("s_out"), NULL, 0);
        node(&body, "Identity", L("cond"), L("cond_out"), NULL, 0);
        value_info(&body, 11, "cond", T_BOOL, 0, NULL);
        value_info(&body, 11, "s", T_FLOAT, -1, NULL);
        value_info(&body, 12, "cond_out", T_BOOL, 0, NULL);
        value_info(&body, 12, "s_out", T_FLOAT, -1, NULL);
        attr at[] = {{"body", &body, 0, NULL}};
        node(&g, "Loop", L("M", "", "x"), L("final"), at, 1);
        value_info(&g, 11, "M", T_INT64, 0, NULL);
        value_info(&g, 11, "x", T_FLOAT, 1, d3);
        value_info(&g, 12, "final", T_FLOAT, -1, NULL);
        model(&b, &g);
        expect_load_error(&b, MTS_EFORMAT, "the body takes 2 inputs, expected 3");
    }
    { /* a branch without outputs */
        buf t = {0}, e = {0}, g = {0};
        node(&t, "Identity", L("x"), L("a"), NULL, 0);
        node(&e, "Identity", L("x"), L("b"), NULL, 0);
        value_info(&e, 12, "b", T_FLOAT, -1, NULL);
        attr at[] = {{"then_branch", &t, 0, NULL}, {"else_branch", &e, 0, NULL}};
        node(&g, "If", L("c"), L("y"), at, 2);
        value_info(&g, 11, "c", T_BOOL, 0, NULL);
        value_info(&g, 11, "x", T_FLOAT, 1, d3);
        value_info(&g, 12, "y", T_FLOAT, 1, d3);
        model(&b, &g);
        expect_load_error(&b, MTS_EFORMAT, "subgraph 'then_branch' of node '' (If): graph has no outputs");
    }
}

static void test_truncations(void **state)
{
    (void)state;
    buf b = {0};
    make_if(&b);
    for (size_t n = 1; n < b.n; n++) {
        mts_model *m = NULL;
        mts_err err = {0};
        mts_load_opts o = {0};
        o.backend = "reference";
        if (mts_model_load_buffer(b.p, n, "cut", &o, &m, &err) == 0) mts_model_free(m);
        else assert_true(err.msg[0] != '\0');
    }
    free(b.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_if_outer_scope),
        cmocka_unit_test(test_if_passthrough),
        cmocka_unit_test(test_if_dynamic_shapes),
        cmocka_unit_test(test_if_const_inlined),
        cmocka_unit_test(test_if_shape_cond_kept),
        cmocka_unit_test(test_if_partial_shape_inlined),
        cmocka_unit_test(test_if_hostile_shape_chains),
        cmocka_unit_test(test_loop_state_and_scan),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_truncations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
