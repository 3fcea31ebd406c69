/*
 * The fast float kernels of the default backend (src/engine/kernels/fast.c) against the
 * reference kernels, called directly on random data of awkward shapes (lengths that are not
 * multiples of the vector width, unit dims, one-element rows), at 1 and 2 threads:
 * Reduce{Mean,Max,Sum} over every contiguous axis range (with NaN and inf in the data for
 * ReduceMax), LayerNormalization over trailing axes, Softmax over the last axis with and
 * without a folded input scale, elementwise chains with numpy broadcasting of every
 * operand (and the chain's own erf against erff on a dense grid), the batched MatMul on strided views (operands and result transposed), and the
 * channel mean/max pooling of spatial attention (with and without a channel scale, NaN in
 * the data), the one-pixel 1x1 Conv (matrix-vector products; cases it must hand back to
 * the reference kernel: padding, groups), and the direct one-output-channel Conv (kernel sizes
 * 1-7, asymmetric pads, NCHW and channels-last sources). The graph-level fusions that produce these steps are covered by
 * test_engine_backends.c.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/kernels/kernel.h"
#include "test_util.h"

/* TSan cannot see into OpenMP teams (libgomp is not instrumented): one thread there. */
#if defined(__SANITIZE_THREAD__)
#define MAX_THREADS 1
#else
#define MAX_THREADS 2
#endif

static unsigned seed = 12345;

static float frand(float lo, float hi)
{
    seed = seed * 1103515245u + 12345u;
    return lo + (hi - lo) * (float)((seed >> 8) & 0xffff) / 65536.0f;
}

static int irand(int n)
{
    seed = seed * 1103515245u + 12345u;
    return (int)((seed >> 8) % (unsigned)n);
}

static mts_tensor tens(int rank, const int64_t *dims)
{
    mts_tensor t = {MTS_DTYPE_FLOAT, rank, {0}, NULL};
    int64_t n = 1;
    for (int i = 0; i < rank; i++) t.dims[i] = dims[i], n *= dims[i];
    t.data = calloc((size_t)(n ? n : 1), sizeof(float));
    return t;
}

static void fill(mts_tensor *t, float lo, float hi)
{
    int64_t n = mts_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = frand(lo, hi);
}

/* Compares element by element: NaN must match NaN, the rest within rel (relative to max|ref|). */
static void expect_close(const mts_tensor *got, const mts_tensor *ref, double rel, const char *what)
{
    int64_t n = mts_tensor_numel(ref);
    assert_int_equal(mts_tensor_numel(got), n);
    double scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = ((const float *)ref->data)[i];
        if (isfinite(r) && fabs(r) > scale) scale = fabs(r);
    }
    for (int64_t i = 0; i < n; i++) {
        float g = ((const float *)got->data)[i], r = ((const float *)ref->data)[i];
        if (isnan(r) || isnan(g)) {
            if (!(isnan(r) && isnan(g))) fail_msg("%s: element %lld: got %g, reference %g", what, (long long)i, g, r);
            continue;
        }
        if (isinf(r) || isinf(g)) {
            if (g != r) fail_msg("%s: element %lld: got %g, reference %g", what, (long long)i, g, r);
            continue;
        }
        if (fabs((double)g - r) > rel * (scale > 1e-30 ? scale : 1.0))
            fail_msg("%s: element %lld: got %.8g, reference %.8g", what, (long long)i, g, r);
    }
}

typedef struct nodebuf {
    mts_node n;
    mts_attr a[8];
    int in[8], out[3];
} nodebuf;

static void mknode(nodebuf *b, const char *op, int n_in, int n_out, int opset)
{
    memset(b, 0, sizeof *b);
    b->n.name = "t";
    b->n.op_type = op;
    b->n.domain = "";
    b->n.opset = opset;
    b->n.n_in = n_in;
    b->n.n_out = n_out;
    for (int i = 0; i < 8; i++) b->in[i] = i;
    for (int i = 0; i < 3; i++) b->out[i] = 8 + i;
    b->n.in = b->in;
    b->n.out = b->out;
    b->n.attrs = b->a;
}

static mts_attr *attr(nodebuf *b, const char *name, mts_attr_type t)
{
    mts_attr *a = &b->a[b->n.n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = t;
    return a;
}

/* Runs op on the inputs into a fresh output of the inferred shape. */
static mts_tensor run_op(const mts_op *op, const mts_node *n, const mts_tensor **in, int n_in, int threads)
{
    mts_err err = {0};
    mts_tensor out = {0};
    mts_kctx k = {n, in, n_in, &out, 1, &err, threads, NULL};
    if (op->infer(&k)) fail_msg("%s infer: %s", n->op_type, err.msg);
    mts_tensor o = tens(out.rank, out.dims);
    k.out = &o;
    if (op->run(&k)) fail_msg("%s run: %s", n->op_type, err.msg);
    return o;
}

static void test_reduce(void **state)
{
    (void)state;
    static const char *const ops[] = {"ReduceMean", "ReduceMax", "ReduceSum"};
    for (int iter = 0; iter < 120; iter++) {
        int rank = 1 + irand(4);
        int64_t dims[4];
        int64_t total = 1;
        for (int i = 0; i < rank; i++) {
            static const int64_t pick[] = {1, 2, 3, 7, 16, 17, 33, 64};
            dims[i] = pick[irand(8)];
            total *= dims[i];
        }
        if (iter % 10 == 0 && rank == 4) dims[1] = 300, dims[2] = 130; /* large: threaded paths */
        int a0 = irand(rank), a1 = a0 + irand(rank - a0);
        mts_tensor x = tens(rank, dims);
        fill(&x, -3, 3);
        const char *opn = ops[iter % 3];
        if (!strcmp(opn, "ReduceMax") && iter % 2) {
            int64_t n = mts_tensor_numel(&x);
            ((float *)x.data)[irand((int)n)] = INFINITY;
            if (iter % 4 == 1) ((float *)x.data)[irand((int)n)] = NAN;
        }
        nodebuf nb;
        mknode(&nb, opn, 1, 1, 13);
        mts_attr *ax = attr(&nb, "axes", MTS_ATTR_INTS);
        int64_t axes[4];
        ax->n = a1 - a0 + 1;
        for (int i = a0; i <= a1; i++) axes[i - a0] = (i == a0 && iter % 5 == 0) ? i - rank : i; /* some negative */
        ax->ints = axes;
        attr(&nb, "keepdims", MTS_ATTR_INT)->i = iter % 2;
        const mts_tensor *in[1] = {&x};
        mts_tensor ref = run_op(mts_op_lookup(opn), &nb.n, in, 1, 1);
        for (int t = 1; t <= MAX_THREADS; t++) {
            mts_tensor got = run_op(&mts_fast_reduce, &nb.n, in, 1, t);
            char what[128];
            snprintf(what, sizeof what, "%s rank %d axes %d..%d threads %d", opn, rank, a0, a1, t);
            expect_close(&got, &ref, 1e-5, what);
            free(got.data);
        }
        free(ref.data);
        free(x.data);
        (void)total;
    }
}

static void test_layernorm(void **state)
{
    (void)state;
    static const int64_t ms[] = {1, 7, 16, 33, 128, 300};
    for (int iter = 0; iter < 24; iter++) {
        int64_t m = ms[iter % 6], rows = 1 + irand(40);
        bool split = iter % 4 == 3 && m % 2 == 0 && m > 2; /* normalized over two axes */
        int64_t d3[3] = {rows, split ? 2 : 1, split ? m / 2 : m};
        mts_tensor x = tens(3, d3);
        fill(&x, -5, 5);
        int64_t pd[2] = {d3[1], d3[2]};
        mts_tensor sc = tens(split ? 2 : 1, split ? pd : &m), bi = tens(split ? 2 : 1, split ? pd : &m);
        fill(&sc, 0.5f, 1.5f);
        fill(&bi, -1, 1);
        nodebuf nb;
        mknode(&nb, "LayerNormalization", 3, 1, 17);
        attr(&nb, "axis", MTS_ATTR_INT)->i = split ? 1 : -1;
        attr(&nb, "epsilon", MTS_ATTR_FLOAT)->f = 1e-5f;
        const mts_tensor *in[3] = {&x, &sc, iter % 5 == 0 ? NULL : &bi};
        int nin = iter % 5 == 0 ? 2 : 3;
        mts_tensor ref = run_op(mts_op_lookup("LayerNormalization"), &nb.n, in, nin, 1);
        mts_tensor got = run_op(&mts_fast_layernorm, &nb.n, in, nin, 1);
        expect_close(&got, &ref, 2e-6, "LayerNormalization");
        free(got.data);
        free(ref.data);
        free(x.data);
        free(sc.data);
        free(bi.data);
    }
}

static void test_softmax(void **state)
{
    (void)state;
    static const int64_t ns[] = {1, 5, 16, 17, 64, 100};
    static const float scales[] = {1.0f, 0.125f, -2.0f};
    for (int iter = 0; iter < 36; iter++) {
        int64_t d[3] = {1 + irand(3), 1 + irand(9), ns[iter % 6]};
        mts_tensor x = tens(3, d);
        fill(&x, -20, 20);
        float s = scales[(iter / 6) % 3];
        if (iter % 7 == 6) ((float *)x.data)[0] = -INFINITY;
        /* The reference on x * s. */
        mts_tensor xs = tens(3, d);
        for (int64_t i = 0; i < mts_tensor_numel(&x); i++) ((float *)xs.data)[i] = ((float *)x.data)[i] * s;
        nodebuf nb;
        mknode(&nb, "Softmax", 1, 1, iter % 2 ? 13 : 11);
        attr(&nb, "axis", MTS_ATTR_INT)->i = iter % 2 ? -1 : 2;
        const mts_tensor *rin[1] = {&xs}, *in[1] = {&x};
        mts_tensor ref = run_op(mts_op_lookup("Softmax"), &nb.n, rin, 1, 1);
        if (s != 1.0f) attr(&nb, "mts_scale", MTS_ATTR_FLOAT)->f = s;
        mts_tensor got = run_op(&mts_fast_softmax, &nb.n, in, 1, 1);
        expect_close(&got, &ref, 1e-6, "Softmax");
        free(got.data);
        free(ref.data);
        free(x.data);
        free(xs.data);
    }
}

/* A random output shape and, per operand, that shape with random dims set to 1 or dropped. */
static void test_chain(void **state)
{
    (void)state;
    static const char *const names[] = {"Add", "Sub", "Sub", "Mul", "Div", "Div", "Relu", "Sigmoid", "HardSwish", "Erf"};
    static const int codes[] = {MTS_CHAIN_ADD,  MTS_CHAIN_SUB,  MTS_CHAIN_RSUB,    MTS_CHAIN_MUL,
                                MTS_CHAIN_DIV,  MTS_CHAIN_RDIV, MTS_CHAIN_RELU,    MTS_CHAIN_SIGMOID,
                                MTS_CHAIN_HARDSWISH, MTS_CHAIN_ERF};
    for (int iter = 0; iter < 400; iter++) {
        int rank = 1 + irand(4);
        int64_t dims[4];
        for (int i = 0; i < rank; i++) {
            static const int64_t pick[] = {1, 2, 3, 5, 16, 19, 32};
            dims[i] = pick[irand(7)];
        }
        if (iter % 15 == 0) dims[0] = 1000; /* large: threaded path, blocks cut inside rows */
        int n_ops = 1 + irand(5);
        int64_t ops[6];
        mts_tensor ins[8];
        int n_in = 0;
        ins[n_in++] = tens(rank, dims);
        fill(&ins[0], -2, 2);
        for (int s = 0; s < n_ops; s++) {
            int c = irand(10);
            ops[s] = codes[c];
            if (c >= 6) continue;
            int64_t od[4];
            int orank = rank - (irand(3) == 0 ? irand(rank + 1) : 0);
            for (int i = 0; i < orank; i++) od[i] = irand(3) == 0 ? 1 : dims[rank - orank + i];
            ins[n_in] = tens(orank, od);
            /* divisors away from zero */
            fill(&ins[n_in], codes[c] >= MTS_CHAIN_DIV ? 0.5f : -2, 2);
            n_in++;
        }
        /* Divisions by the chain value: keep it away from zero by starting from a positive x. */
        bool rdiv = false;
        for (int s = 0; s < n_ops; s++) rdiv |= ops[s] == MTS_CHAIN_RDIV;
        if (rdiv) {
            fill(&ins[0], 0.5f, 2);
            for (int s = 0, q = 1; s < n_ops; s++) {
                if (mts_chain_unary(ops[s])) continue;
                fill(&ins[q++], 0.5f, 2);
                if (ops[s] == MTS_CHAIN_SUB || ops[s] == MTS_CHAIN_RSUB) ops[s] = MTS_CHAIN_ADD;
            }
        }
        /* The reference: one op at a time. */
        mts_tensor acc = ins[0];
        bool own = false;
        for (int s = 0, q = 1; s < n_ops; s++) {
            int c = 0;
            while (codes[c] != ops[s]) c++;
            nodebuf nb;
            mts_tensor r;
            if (mts_chain_unary(ops[s])) {
                mknode(&nb, names[c], 1, 1, 14);
                const mts_tensor *in[1] = {&acc};
                r = run_op(mts_op_lookup(names[c]), &nb.n, in, 1, 1);
            } else {
                mknode(&nb, names[c], 2, 1, 14);
                bool rev = ops[s] == MTS_CHAIN_RSUB || ops[s] == MTS_CHAIN_RDIV;
                const mts_tensor *in[2] = {rev ? &ins[q] : &acc, rev ? &acc : &ins[q]};
                r = run_op(mts_op_lookup(names[c]), &nb.n, in, 2, 1);
                q++;
            }
            if (own) free(acc.data);
            acc = r;
            own = true;
        }
        nodebuf nb;
        mknode(&nb, "MtsEltwiseChain", n_in, 1, 1);
        mts_attr *a = attr(&nb, "ops", MTS_ATTR_INTS);
        a->n = n_ops;
        a->ints = ops;
        const mts_tensor *in[8];
        for (int q = 0; q < n_in; q++) in[q] = &ins[q];
        for (int t = 1; t <= MAX_THREADS; t++) {
            mts_tensor got = run_op(&mts_fast_chain, &nb.n, in, n_in, t);
            assert_int_equal(got.rank, acc.rank);
            for (int i = 0; i < acc.rank; i++) assert_int_equal(got.dims[i], acc.dims[i]);
            char what[64];
            snprintf(what, sizeof what, "chain of %d ops, iteration %d, threads %d", n_ops, iter, t);
            expect_close(&got, &acc, 1e-5, what);
            free(got.data);
        }
        if (own) free(acc.data);
        for (int q = 0; q < n_in; q++) free(ins[q].data);
    }
}

/* The chain's Erf (a series near 0, a rational approximation times exp(-x^2) beyond) against
 * the reference kernel's erff on a dense grid over [-6, 6], the denormals, signed zeros,
 * infinities and NaN: absolute error at most 3e-7 everywhere and relative error at most 1e-6
 * where |x| < 1/2 (where erf is small and an absolute bound alone would say little). */
static void test_chain_erf(void **state)
{
    (void)state;
    int64_t n = 120000 + 7, dims[1] = {n};
    mts_tensor x = tens(1, dims);
    float *xv = x.data;
    for (int64_t i = 0; i < 120000; i++) xv[i] = -6.0f + 12.0f * (float)i / 120000.0f;
    const float special[7] = {0.0f, -0.0f, 1e-40f, -1e-30f, INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 7; i++) xv[120000 + i] = special[i];
    int64_t ops[1] = {MTS_CHAIN_ERF};
    nodebuf nb;
    mknode(&nb, "MtsEltwiseChain", 1, 1, 1);
    mts_attr *a = attr(&nb, "ops", MTS_ATTR_INTS);
    a->n = 1;
    a->ints = ops;
    const mts_tensor *in[1] = {&x};
    for (int t = 1; t <= MAX_THREADS; t++) {
        mts_tensor got = run_op(&mts_fast_chain, &nb.n, in, 1, t);
        const float *g = got.data;
        double worst_abs = 0, worst_rel = 0;
        for (int64_t i = 0; i < n; i++) {
            float r = erff(xv[i]);
            if (isnan(r) || isnan(g[i])) {
                if (!(isnan(r) && isnan(g[i]))) fail_msg("erf(%g): got %g, erff %g", xv[i], g[i], r);
                continue;
            }
            double e = fabs((double)g[i] - r);
            if (e > worst_abs) worst_abs = e;
            if (fabsf(xv[i]) < 0.5f && r != 0 && e / fabs(r) > worst_rel) worst_rel = e / fabs(r);
            if (e > 3e-7 || (fabsf(xv[i]) < 0.5f && e > 1e-6 * fabs(r)))
                fail_msg("erf(%.9g): got %.9g, erff %.9g", xv[i], g[i], r);
            if (xv[i] == 0 && signbit(g[i]) != signbit(r)) fail_msg("erf(%g): sign of zero lost", xv[i]);
        }
        if (t == 1) print_message("chain Erf vs erff: max abs error %.3g, max relative error below 1/2 %.3g\n", worst_abs, worst_rel);
        free(got.data);
    }
    free(x.data);
}

/* Squeeze-and-excitation on channels-last data: x [N,H,W,C] * s [N,1,1,C] (+ a [C] bias, then
 * Relu), the shape the chain runs several short rows at a time (tiled operand, redone per sample),
 * against the reference Mul / Add / Relu. */
static void test_chain_channel_scale(void **state)
{
    (void)state;
    static const int64_t shapes[][4] = {{1, 56, 56, 16}, {2, 9, 7, 24}, {3, 5, 3, 72}, {2, 3, 3, 128}, {1, 1, 1, 5},
                                        {4, 7, 1, 3}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t *d = shapes[i];
        int64_t sd[4] = {d[0], 1, 1, d[3]}, bd[1] = {d[3]};
        mts_tensor x = tens(4, d), sc = tens(4, sd), b = tens(1, bd);
        fill(&x, -2, 2), fill(&sc, -1, 1), fill(&b, -1, 1);
        nodebuf nm, na, nr;
        mknode(&nm, "Mul", 2, 1, 14), mknode(&na, "Add", 2, 1, 14), mknode(&nr, "Relu", 1, 1, 14);
        const mts_tensor *in_m[2] = {&x, &sc};
        mts_tensor r1 = run_op(mts_op_lookup("Mul"), &nm.n, in_m, 2, 1);
        const mts_tensor *in_a[2] = {&r1, &b};
        mts_tensor r2 = run_op(mts_op_lookup("Add"), &na.n, in_a, 2, 1);
        const mts_tensor *in_r[1] = {&r2};
        mts_tensor ref = run_op(mts_op_lookup("Relu"), &nr.n, in_r, 1, 1);
        nodebuf nb;
        mknode(&nb, "MtsEltwiseChain", 3, 1, 1);
        mts_attr *a = attr(&nb, "ops", MTS_ATTR_INTS);
        int64_t ops[3] = {MTS_CHAIN_MUL, MTS_CHAIN_ADD, MTS_CHAIN_RELU};
        a->n = 3;
        a->ints = ops;
        const mts_tensor *in[3] = {&x, &sc, &b};
        for (int t = 1; t <= MAX_THREADS; t++) {
            mts_tensor got = run_op(&mts_fast_chain, &nb.n, in, 3, t);
            char what[96];
            snprintf(what, sizeof what, "channel scale [%lld,%lld,%lld,%lld], threads %d", (long long)d[0],
                     (long long)d[1], (long long)d[2], (long long)d[3], t);
            expect_close(&got, &ref, 1e-6, what);
            free(got.data);
        }
        free(r1.data), free(r2.data), free(ref.data);
        free(x.data), free(sc.data), free(b.data);
    }
}

/* Y = A x B with A, B given as permuted views of contiguous buffers and Y written permuted. */
static void test_strided_matmul(void **state)
{
    (void)state;
    static const int64_t sizes[] = {1, 3, 16, 17, 64, 65};
    static const int64_t perms[4][4] = {{0, 1, 2, 3}, {0, 2, 1, 3}, {0, 2, 3, 1}, {1, 0, 2, 3}};
    for (int iter = 0; iter < 60; iter++) {
        int64_t B0 = 1 + irand(3), B1 = 1 + irand(3), M = sizes[irand(6)], N = sizes[irand(6)], K = sizes[irand(6)];
        if (iter % 10 == 0) B0 = 8, M = N = K = 64; /* attention-sized, threaded */
        int64_t ad[4] = {B0, B1, M, K}, bd[4] = {B0, B1, K, N}, yd[4] = {B0, B1, M, N};
        mts_tensor a = tens(4, ad), b = tens(4, bd);
        fill(&a, -1, 1);
        fill(&b, -1, 1);
        const mts_tensor *in[2] = {&a, &b};
        nodebuf nb;
        mknode(&nb, "MatMul", 2, 1, 13);
        mts_tensor ref = run_op(mts_op_lookup("MatMul"), &nb.n, in, 2, 1);
        /* Storage: each tensor stored as its transpose by a random permutation p (stored dims
         * sd[j] = d[p[j]]), so logical axis p[j] has the stored stride of j. */
        const int64_t *pa = perms[irand(4)], *pb = perms[irand(4)], *py = perms[irand(2)];
        mts_tensor *srcs[2] = {&a, &b};
        const int64_t *ps[2] = {pa, pb};
        mts_tensor stored[2];
        int64_t lstr[3][4];
        for (int q = 0; q < 2; q++) {
            int64_t sd[4], ss[4], s = 1;
            for (int j = 0; j < 4; j++) sd[j] = srcs[q]->dims[ps[q][j]];
            for (int j = 3; j >= 0; j--) ss[j] = s, s *= sd[j];
            stored[q] = tens(4, sd);
            for (int j = 0; j < 4; j++) lstr[q][ps[q][j]] = ss[j];
            const float *src = srcs[q]->data;
            float *dst = stored[q].data;
            int64_t d[4];
            for (d[0] = 0; d[0] < srcs[q]->dims[0]; d[0]++)
                for (d[1] = 0; d[1] < srcs[q]->dims[1]; d[1]++)
                    for (d[2] = 0; d[2] < srcs[q]->dims[2]; d[2]++)
                        for (d[3] = 0; d[3] < srcs[q]->dims[3]; d[3]++) {
                            int64_t li = ((d[0] * srcs[q]->dims[1] + d[1]) * srcs[q]->dims[2] + d[2]) * srcs[q]->dims[3] + d[3];
                            dst[d[0] * lstr[q][0] + d[1] * lstr[q][1] + d[2] * lstr[q][2] + d[3] * lstr[q][3]] = src[li];
                        }
        }
        int64_t ysd[4], yss[4], s = 1;
        for (int j = 0; j < 4; j++) ysd[j] = yd[py[j]];
        for (int j = 3; j >= 0; j--) yss[j] = s, s *= ysd[j];
        for (int j = 0; j < 4; j++) lstr[2][py[j]] = yss[j];
        int64_t dims[5] = {B0, B1, M, N, K};
        nodebuf fb;
        mknode(&fb, "MtsStridedMatMul", 2, 1, 1);
        mts_attr *at;
        at = attr(&fb, "dims", MTS_ATTR_INTS), at->n = 5, at->ints = dims;
        at = attr(&fb, "a_strides", MTS_ATTR_INTS), at->n = 4, at->ints = lstr[0];
        at = attr(&fb, "b_strides", MTS_ATTR_INTS), at->n = 4, at->ints = lstr[1];
        at = attr(&fb, "y_strides", MTS_ATTR_INTS), at->n = 4, at->ints = lstr[2];
        at = attr(&fb, "y_dims", MTS_ATTR_INTS), at->n = 4, at->ints = ysd;
        const mts_tensor *fin[2] = {&stored[0], &stored[1]};
        for (int t = 1; t <= MAX_THREADS; t++) {
            mts_tensor got = run_op(&mts_fast_bmm, &fb.n, fin, 2, t);
            /* back to logical order */
            mts_tensor lg = tens(4, yd);
            int64_t d[4];
            for (d[0] = 0; d[0] < B0; d[0]++)
                for (d[1] = 0; d[1] < B1; d[1]++)
                    for (d[2] = 0; d[2] < M; d[2]++)
                        for (d[3] = 0; d[3] < N; d[3]++)
                            ((float *)lg.data)[((d[0] * B1 + d[1]) * M + d[2]) * N + d[3]] =
                                ((float *)got.data)[d[0] * lstr[2][0] + d[1] * lstr[2][1] + d[2] * lstr[2][2] + d[3] * lstr[2][3]];
            char what[96];
            snprintf(what, sizeof what, "strided MatMul %lldx%lldx%lld batch %lldx%lld threads %d", (long long)M,
                     (long long)N, (long long)K, (long long)B0, (long long)B1, t);
            expect_close(&lg, &ref, 1e-5, what);
            free(lg.data);
            free(got.data);
        }
        free(ref.data);
        free(a.data);
        free(b.data);
        free(stored[0].data);
        free(stored[1].data);
    }
}

/* MtsChannelPool against ReduceMean/ReduceMax over the last axis of x * scale. */
static void test_channel_pool(void **state)
{
    (void)state;
    static const int64_t cs[] = {1, 2, 15, 16, 17, 32, 70};
    for (int iter = 0; iter < 28; iter++) {
        int64_t N = 1 + irand(3), H = 1 + irand(9), W = 1 + irand(40), C = cs[iter % 7];
        if (iter == 27) H = 64, W = 64; /* threaded */
        int64_t xd[4] = {N, H, W, C}, sd[4] = {iter % 3 == 0 ? 1 : N, 1, 1, C}, od[4] = {N, H, W, 2};
        mts_tensor x = tens(4, xd), sc = tens(4, sd);
        fill(&x, -3, 3);
        fill(&sc, 0, 1);
        if (iter % 4 == 1) ((float *)x.data)[irand((int)mts_tensor_numel(&x))] = NAN;
        bool scaled = iter % 2 == 0;
        /* reference: m = x * sc (broadcast), then the reductions over the last axis */
        mts_tensor m = tens(4, xd);
        for (int64_t i = 0; i < mts_tensor_numel(&x); i++) {
            int64_t n = i / (H * W * C), c = i % C;
            float f = scaled ? ((float *)sc.data)[(sd[0] == 1 ? 0 : n) * C + c] : 1.0f;
            ((float *)m.data)[i] = ((float *)x.data)[i] * f;
        }
        nodebuf nb;
        mknode(&nb, "ReduceMean", 1, 1, 13);
        mts_attr *ax = attr(&nb, "axes", MTS_ATTR_INTS);
        int64_t last = 3;
        ax->n = 1, ax->ints = &last;
        const mts_tensor *min[1] = {&m};
        mts_tensor mean = run_op(mts_op_lookup("ReduceMean"), &nb.n, min, 1, 1);
        nb.n.op_type = "ReduceMax";
        mts_tensor mx = run_op(mts_op_lookup("ReduceMax"), &nb.n, min, 1, 1);
        mts_tensor ref = tens(4, od);
        for (int64_t p = 0; p < N * H * W; p++) {
            ((float *)ref.data)[2 * p] = ((float *)mean.data)[p];
            ((float *)ref.data)[2 * p + 1] = ((float *)mx.data)[p];
        }
        nodebuf pb;
        mknode(&pb, "MtsChannelPool", scaled ? 2 : 1, 1, 1);
        const mts_tensor *in[2] = {&x, &sc};
        for (int t = 1; t <= MAX_THREADS; t++) {
            mts_err err = {0};
            mts_tensor got = tens(4, od);
            mts_kctx k = {&pb.n, in, scaled ? 2 : 1, &got, 1, &err, t, NULL};
            if (mts_fast_cpool.run(&k)) fail_msg("channel pool: %s", err.msg);
            char what[64];
            snprintf(what, sizeof what, "channel pool C %lld scaled %d threads %d", (long long)C, scaled, t);
            expect_close(&got, &ref, 1e-5, what);
            free(got.data);
        }
        free(x.data), free(sc.data), free(m.data), free(mean.data), free(mx.data), free(ref.data);
    }
}

static void test_conv1px(void **state)
{
    (void)state;
    static const int64_t cs[] = {1, 3, 16, 17, 100, 576};
    for (int iter = 0; iter < 24; iter++) {
        int64_t N = 1 + irand(3), C = cs[iter % 6], M = cs[(iter / 6 + iter) % 6];
        int64_t xd[4] = {N, C, 1, 1}, wd[4] = {M, C, 1, 1};
        bool padded = iter % 8 == 7, grouped = iter % 8 == 5 && C % 2 == 0 && M % 2 == 0;
        if (grouped) wd[1] = C / 2;
        mts_tensor x = tens(4, xd), w = tens(4, wd), b = tens(1, &M);
        fill(&x, -1, 1), fill(&w, -1, 1), fill(&b, -1, 1);
        nodebuf nb;
        mknode(&nb, "Conv", 3, 1, 13);
        int64_t pads[4] = {1, 1, 1, 1};
        if (padded) {
            mts_attr *a = attr(&nb, "pads", MTS_ATTR_INTS);
            a->n = 4, a->ints = pads;
        }
        if (grouped) attr(&nb, "group", MTS_ATTR_INT)->i = 2;
        const mts_tensor *in[3] = {&x, &w, &b};
        int nin = iter % 3 ? 3 : 2;
        mts_tensor ref = run_op(mts_op_lookup("Conv"), &nb.n, in, nin, 1);
        mts_tensor got = run_op(&mts_fast_conv1px, &nb.n, in, nin, 1);
        expect_close(&got, &ref, 1e-5, "one-pixel conv");
        free(got.data), free(ref.data), free(x.data), free(w.data), free(b.data);
    }
}

/* Stores the NCHW tensor t channels-last (same dims array order N,C,H,W given; bytes NHWC). */
static mts_tensor to_nhwc(const mts_tensor *t)
{
    int64_t N = t->dims[0], C = t->dims[1], HW = t->dims[2] * t->dims[3];
    int64_t vd[4] = {N, t->dims[2], t->dims[3], C};
    mts_tensor r = tens(4, vd);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < HW; i++)
                ((float *)r.data)[(n * HW + i) * C + c] = ((const float *)t->data)[(n * C + c) * HW + i];
    return r;
}

static void test_conv_small(void **state)
{
    (void)state;
    for (int iter = 0; iter < 60; iter++) {
        int64_t M = 1 + irand(4);
        int64_t N = 1 + irand(2), C = M == 1 ? 1 + irand(4) : 1 + irand(24), H = 1 + irand(40), W = 1 + irand(50),
                K = 1 + 2 * irand(4);
        if (M > 1 && K == 1) K = 3; /* 1x1 kernels with several outputs stay with oneDNN */
        if (iter == 39) N = 2, H = 200, W = 180, M = 1, C = 2; /* threaded, by images */
        if (iter == 59) N = 1, H = 120, W = 97, M = 3, C = 16, K = 3; /* a UNet head, threaded by rows */
        /* channel counts the channels-last source is transposed for 16 pixels at a time (powers
         * of two), with a tail of single pixels */
        if (iter == 58) N = 2, H = 9, W = 37, M = 3, C = 32, K = 3;
        if (iter == 57) N = 1, H = 11, W = 50, M = 2, C = 64, K = 3;
        if (iter == 56) N = 2, H = 7, W = 35, M = 3, C = 8, K = 3;
        if (iter == 55) N = 1, H = 6, W = 17, M = 4, C = 2, K = 5;
        /* rows wide enough for the three-wide kernels' blocks of 64 (48 with four outputs)
         * pixels, with a tail after them */
        if (iter == 54) N = 1, H = 5, W = 131, M = 4, C = 8, K = 3;
        if (iter == 53) N = 2, H = 4, W = 70, M = 1, C = 3, K = 3;
        if (iter == 52) N = 1, H = 6, W = 66, M = 2, C = 5, K = 3;
        if (iter == 51) N = 1, H = 3, W = 64, M = 3, C = 8, K = 3;
        if (H < K) H = K; /* the padded input must hold the kernel (pads may be 0) */
        if (W < K) W = K;
        int64_t xd[4] = {N, C, H, W}, wd[4] = {M, C, K, K}, bd[1] = {M};
        mts_tensor x = tens(4, xd), w = tens(4, wd), b = tens(1, bd);
        fill(&x, -1, 1), fill(&w, -1, 1), fill(&b, -1, 1);
        int64_t pads[4] = {irand((int)K), irand((int)K), irand((int)K), irand((int)K)};
        nodebuf nb;
        mknode(&nb, "Conv", 3, 1, 13);
        mts_attr *a = attr(&nb, "pads", MTS_ATTR_INTS);
        a->n = 4, a->ints = pads;
        const mts_tensor *in[3] = {&x, &w, &b};
        int nin = iter % 2 ? 3 : 2;
        mts_tensor ref = run_op(mts_op_lookup("Conv"), &nb.n, in, nin, 1);
        /* the reference on the source rounded to bfloat16, for the bfloat16 source below */
        mts_tensor xr = tens(4, xd);
        for (int64_t i = 0; i < mts_tensor_numel(&x); i++)
            ((float *)xr.data)[i] = mts_bf16_to_f32(mts_f32_to_bf16(((const float *)x.data)[i]));
        const mts_tensor *rin[3] = {&xr, &w, &b};
        mts_tensor refr = run_op(mts_op_lookup("Conv"), &nb.n, rin, nin, 1);
        char what[96];
        snprintf(what, sizeof what, "small conv %lld->%lld k%lld (NCHW)", (long long)C, (long long)M, (long long)K);
        for (int t = 1; t <= MAX_THREADS; t++) {
            mts_tensor got = run_op(&mts_fast_conv_small, &nb.n, in, nin, t);
            expect_close(&got, &ref, 1e-5, what);
            free(got.data);
        }
        /* As the context passes them in a channels-last step: [N,H,W,C] views of the 4-D inputs
         * (x and the weights); the source stored NHWC or NCHW, the output NCHW or NHWC. */
        mts_tensor xn = to_nhwc(&x), refn = to_nhwc(&ref), wv = w, xv = x;
        int64_t wvd[4] = {M, K, K, C}, xvd[4] = {N, H, W, C};
        memcpy(wv.dims, wvd, sizeof wvd);
        memcpy(xv.dims, xvd, sizeof xvd);
        attr(&nb, "mts_nhwc_views", MTS_ATTR_INT)->i = 1;
        mts_attr *asrc = attr(&nb, "mts_nhwc_src", MTS_ATTR_INT);
        mts_attr *adst = attr(&nb, "mts_nhwc_dst", MTS_ATTR_INT);
        for (int mode = 0; mode < 4; mode++) {
            bool src_nhwc = mode & 1, dst_nhwc = mode & 2;
            asrc->i = src_nhwc, adst->i = dst_nhwc;
            const mts_tensor *vin[3] = {src_nhwc ? &xn : &xv, &wv, &b};
            for (int t = 1; t <= MAX_THREADS; t++) {
                mts_err err = {0};
                int64_t od[4] = {N, ref.dims[2], ref.dims[3], M};
                mts_tensor got = tens(4, od);
                mts_kctx k = {&nb.n, vin, nin, &got, 1, &err, t, NULL};
                if (mts_fast_conv_small.run(&k)) fail_msg("%s: %s", what, err.msg);
                snprintf(what, sizeof what, "small conv %lld->%lld k%lld (src %s, dst %s)", (long long)C, (long long)M,
                         (long long)K, src_nhwc ? "NHWC" : "NCHW", dst_nhwc ? "NHWC" : "NCHW");
                if (!dst_nhwc) memcpy(got.dims, ref.dims, sizeof ref.dims);
                expect_close(&got, dst_nhwc ? &refn : &ref, 1e-5, what);
                free(got.data);
            }
        }
        /* A channels-last bfloat16 source (attribute mts_src_bf16, bf16 plans): the bits of
         * the rounded floats, widened as they are transposed (16-pixel blocks and the tail). */
        mts_tensor xrn = to_nhwc(&xr), refrn = to_nhwc(&refr);
        int64_t nx = mts_tensor_numel(&xrn);
        uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)nx);
        assert_non_null(xb);
        for (int64_t i = 0; i < nx; i++) xb[i] = mts_f32_to_bf16(((const float *)xrn.data)[i]);
        mts_tensor xbv = xv;
        xbv.data = xb; /* a float tensor whose bytes hold bfloat16, as the plan's hand-off buffers */
        asrc->i = 1;
        mts_attr *abf = attr(&nb, "mts_src_bf16", MTS_ATTR_INT);
        abf->i = 1;
        for (int dst_nhwc = 0; dst_nhwc < 2; dst_nhwc++) {
            adst->i = dst_nhwc;
            const mts_tensor *vin[3] = {&xbv, &wv, &b};
            for (int t = 1; t <= MAX_THREADS; t++) {
                mts_err err = {0};
                int64_t od[4] = {N, ref.dims[2], ref.dims[3], M};
                mts_tensor got = tens(4, od);
                mts_kctx k = {&nb.n, vin, nin, &got, 1, &err, t, NULL};
                snprintf(what, sizeof what, "small conv %lld->%lld k%lld (bf16 src NHWC, dst %s)", (long long)C,
                         (long long)M, (long long)K, dst_nhwc ? "NHWC" : "NCHW");
                if (mts_fast_conv_small.run(&k)) fail_msg("%s: %s", what, err.msg);
                if (!dst_nhwc) memcpy(got.dims, ref.dims, sizeof ref.dims);
                expect_close(&got, dst_nhwc ? &refrn : &refr, 1e-5, what);
                free(got.data);
            }
        }
        /* A float source rounded to bfloat16 values as it is read (mts_src_round: bf16 plans
         * with the hand-offs off): the same numbers, from either layout. */
        mts_attr *around = attr(&nb, "mts_src_round", MTS_ATTR_INT);
        for (int mode = 0; mode < 4; mode++) {
            bool src_nhwc = mode & 1, dst_nhwc = mode & 2;
            abf->i = 0;
            around->i = 1;
            asrc->i = src_nhwc, adst->i = dst_nhwc;
            const mts_tensor *vin[3] = {src_nhwc ? &xn : &xv, &wv, &b};
            mts_err err = {0};
            int64_t od[4] = {N, ref.dims[2], ref.dims[3], M};
            mts_tensor got = tens(4, od);
            mts_kctx k = {&nb.n, vin, nin, &got, 1, &err, MAX_THREADS, NULL};
            snprintf(what, sizeof what, "small conv %lld->%lld k%lld (rounded src %s, dst %s)", (long long)C,
                     (long long)M, (long long)K, src_nhwc ? "NHWC" : "NCHW", dst_nhwc ? "NHWC" : "NCHW");
            if (mts_fast_conv_small.run(&k)) fail_msg("%s: %s", what, err.msg);
            if (!dst_nhwc) memcpy(got.dims, ref.dims, sizeof ref.dims);
            expect_close(&got, dst_nhwc ? &refrn : &refr, 1e-5, what);
            free(got.data);
        }
        around->i = 0;
        abf->i = 1;
        /* a bfloat16 source stored NCHW is refused, not misread */
        {
            asrc->i = 0, adst->i = 0;
            const mts_tensor *vin[3] = {&xbv, &wv, &b};
            mts_err err = {0};
            mts_tensor got = tens(4, ref.dims);
            mts_kctx k = {&nb.n, vin, nin, &got, 1, &err, 1, NULL};
            assert_int_not_equal(mts_fast_conv_small.run(&k), MTS_OK);
            assert_non_null(strstr(err.msg, "bfloat16"));
            free(got.data);
        }
        free(xb), free(xr.data), free(xrn.data), free(refr.data), free(refrn.data);
        free(ref.data), free(refn.data), free(x.data), free(xn.data), free(w.data), free(b.data);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_chain_erf),
        cmocka_unit_test(test_chain_channel_scale),
        cmocka_unit_test(test_strided_matmul),
        cmocka_unit_test(test_channel_pool),
        cmocka_unit_test(test_conv1px),
        cmocka_unit_test(test_conv_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
