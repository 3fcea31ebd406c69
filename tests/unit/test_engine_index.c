/*
 * The indexing kernels (src/engine/kernels/ref_index.c) on hostile and edge-case input, called
 * directly: indices out of range (ScatterND, ScatterElements, GatherND, MaxUnpool, RoiAlign's
 * batch indices, ReverseSequence's lengths) are refused with MTS_EINVAL and never read or
 * written; value-dependent shapes (NonZero, Compress, TopK's K, OneHot's depth) answer
 * MTS_EDYNAMIC while the data is unknown and refuse bad values; malformed Einsum equations are
 * refused; NaN and huge coordinates in GridSample, RoiAlign and NonMaxSuppression run without
 * crashing. Also checks Einsum's GEMM path against a direct evaluation.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/kernels/kernel.h"
#include "test_util.h"

typedef struct nodebuf {
    mts_node n;
    mts_attr a[6];
    int in[8], out[4];
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
    for (int i = 0; i < 4; i++) b->out[i] = 8 + i;
    b->n.in = b->in;
    b->n.out = b->out;
    b->n.attrs = b->a;
}

static void attr_int(nodebuf *b, const char *name, int64_t v)
{
    mts_attr *a = &b->a[b->n.n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = MTS_ATTR_INT;
    a->i = v;
}

static void attr_str(nodebuf *b, const char *name, const char *s)
{
    mts_attr *a = &b->a[b->n.n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = MTS_ATTR_STRING;
    a->s = s;
}

static mts_tensor tens(mts_dtype dt, int rank, const int64_t *dims, const void *data)
{
    mts_tensor t = {dt, rank, {0}, (void *)data};
    for (int i = 0; i < rank; i++) t.dims[i] = dims[i];
    return t;
}

/* Runs infer and, when it succeeds, run with freshly allocated outputs. Returns the first
 * failing status (0 when both succeed); outputs are copied into out (may be NULL). */
static int run_node(const mts_node *n, const mts_tensor **in, int n_in, int n_out, mts_tensor *out, char *msg)
{
    const mts_op *op = mts_op_lookup(n->op_type);
    assert_non_null(op);
    mts_err err = {0};
    mts_tensor o[4];
    memset(o, 0, sizeof o);
    mts_kctx k = {n, in, n_in, o, n_out, &err, 2, NULL};
    int rc = op->infer(&k);
    if (rc) {
        if (msg) snprintf(msg, 256, "%s", err.msg);
        return rc;
    }
    for (int j = 0; j < n_out; j++) {
        int64_t nb = mts_tensor_nbytes(&o[j]);
        assert_true(nb >= 0);
        o[j].data = calloc(1, nb > 0 ? (size_t)nb : 1);
    }
    rc = op->run(&k);
    if (msg) snprintf(msg, 256, "%s", err.msg);
    for (int j = 0; j < n_out; j++) {
        if (out && !rc)
            out[j] = o[j];
        else
            free(o[j].data);
    }
    return rc;
}

static void test_scatter_gather_ranges(void **state)
{
    (void)state;
    char msg[256];
    float data[12] = {0}, upd[4] = {1, 2, 3, 4};
    int64_t dd[2] = {3, 4};
    mts_tensor x = tens(MTS_DTYPE_FLOAT, 2, dd, data);

    /* ScatterND: index 3 on an axis of 3 */
    int64_t bad[2] = {1, 3}, idims[2] = {1, 1}, udims[2] = {1, 4};
    mts_tensor ind = tens(MTS_DTYPE_INT64, 2, idims, &bad[1]), u = tens(MTS_DTYPE_FLOAT, 2, udims, upd);
    nodebuf nb;
    mknode(&nb, "ScatterND", 3, 1, 16);
    const mts_tensor *in[3] = {&x, &ind, &u};
    assert_int_equal(run_node(&nb.n, in, 3, 1, NULL, msg), MTS_EINVAL);
    assert_non_null(strstr(msg, "out of range"));
    /* -3 wraps to 0 */
    int64_t neg = -3;
    ind.data = &neg;
    mts_tensor out[4];
    assert_int_equal(run_node(&nb.n, in, 3, 1, out, msg), 0);
    assert_true(((float *)out[0].data)[3] == 4.0f);
    free(out[0].data);
    /* updates of the wrong shape */
    int64_t ubad[2] = {1, 3};
    mts_tensor u2 = tens(MTS_DTYPE_FLOAT, 2, ubad, upd);
    in[2] = &u2;
    assert_int_equal(run_node(&nb.n, in, 3, 1, NULL, msg), MTS_ESHAPE);
    in[2] = &u;

    /* ScatterElements: index -5 on an axis of 4 */
    int64_t ie[2] = {0, -5}, iedims[2] = {1, 2};
    mts_tensor ind2 = tens(MTS_DTYPE_INT64, 2, iedims, ie), u3 = tens(MTS_DTYPE_FLOAT, 2, iedims, upd);
    mknode(&nb, "ScatterElements", 3, 1, 13);
    attr_int(&nb, "axis", 1);
    const mts_tensor *in2[3] = {&x, &ind2, &u3};
    assert_int_equal(run_node(&nb.n, in2, 3, 1, NULL, msg), MTS_EINVAL);
    /* reduction max before opset 18 */
    mknode(&nb, "ScatterElements", 3, 1, 16);
    attr_str(&nb, "reduction", "max");
    assert_int_equal(run_node(&nb.n, in2, 3, 1, NULL, msg), MTS_EINVAL);

    /* GatherND: last index dim larger than the rank; index out of range */
    int64_t g3[3] = {0, 0, 0}, gd3[2] = {1, 3};
    mts_tensor gi = tens(MTS_DTYPE_INT64, 2, gd3, g3);
    mknode(&nb, "GatherND", 2, 1, 13);
    const mts_tensor *in3[2] = {&x, &gi};
    assert_int_equal(run_node(&nb.n, in3, 2, 1, NULL, msg), MTS_ESHAPE);
    int64_t g2[2] = {2, 4}, gd2[2] = {1, 2};
    mts_tensor gi2 = tens(MTS_DTYPE_INT64, 2, gd2, g2);
    in3[1] = &gi2;
    assert_int_equal(run_node(&nb.n, in3, 2, 1, NULL, msg), MTS_EINVAL);
    g2[1] = -4;
    assert_int_equal(run_node(&nb.n, in3, 2, 1, out, msg), 0);
    free(out[0].data);
    /* batch_dims as large as the rank */
    attr_int(&nb, "batch_dims", 2);
    assert_int_equal(run_node(&nb.n, in3, 2, 1, NULL, msg), MTS_EINVAL);

    /* MaxUnpool: an index beyond the unpooled tensor */
    float xv[4] = {1, 2, 3, 4};
    int64_t iv[4] = {0, 3, 8, 16}, xd[4] = {1, 1, 2, 2}, ks[2] = {2, 2};
    mts_tensor mx = tens(MTS_DTYPE_FLOAT, 4, xd, xv), mi = tens(MTS_DTYPE_INT64, 4, xd, iv);
    mknode(&nb, "MaxUnpool", 2, 1, 11);
    mts_attr *a = &nb.a[nb.n.n_attr++];
    memset(a, 0, sizeof *a);
    a->name = "kernel_shape";
    a->type = MTS_ATTR_INTS;
    a->ints = ks;
    a->n = 2;
    a = &nb.a[nb.n.n_attr++];
    *a = nb.a[0];
    a->name = "strides";
    const mts_tensor *in4[2] = {&mx, &mi};
    assert_int_equal(run_node(&nb.n, in4, 2, 1, NULL, msg), MTS_EINVAL);
    iv[3] = 15;
    assert_int_equal(run_node(&nb.n, in4, 2, 1, out, msg), 0);
    assert_true(((float *)out[0].data)[15] == 4.0f);
    free(out[0].data);

    /* ReverseSequence: a length beyond the time axis */
    int64_t sl[4] = {1, 2, 4, 1}, sld[1] = {4};
    mts_tensor slt = tens(MTS_DTYPE_INT64, 1, sld, sl);
    mknode(&nb, "ReverseSequence", 2, 1, 10);
    attr_int(&nb, "batch_axis", 1);
    attr_int(&nb, "time_axis", 0);
    const mts_tensor *in5[2] = {&x, &slt};
    assert_int_equal(run_node(&nb.n, in5, 2, 1, NULL, msg), MTS_EINVAL);
    sl[2] = 3;
    assert_int_equal(run_node(&nb.n, in5, 2, 1, out, msg), 0);
    free(out[0].data);
}

static void test_dynamic_shapes(void **state)
{
    (void)state;
    char msg[256];
    nodebuf nb;
    float data[6] = {0, 1, 0, 2, -0.0f, 3};
    int64_t d2[2] = {2, 3};
    mts_tensor x = tens(MTS_DTYPE_FLOAT, 2, d2, NULL);
    const mts_tensor *in[3] = {&x, NULL, NULL};
    mts_tensor out[4];

    /* NonZero: unknown data, then 3 nonzero entries (-0.0 is zero) */
    mknode(&nb, "NonZero", 1, 1, 13);
    assert_int_equal(run_node(&nb.n, in, 1, 1, NULL, msg), MTS_EDYNAMIC);
    x.data = data;
    assert_int_equal(run_node(&nb.n, in, 1, 1, out, msg), 0);
    assert_int_equal(out[0].dims[0], 2);
    assert_int_equal(out[0].dims[1], 3);
    free(out[0].data);

    /* Compress: unknown condition */
    uint8_t cond[3] = {1, 0, 1};
    int64_t cd[1] = {3};
    mts_tensor c = tens(MTS_DTYPE_BOOL, 1, cd, NULL);
    mknode(&nb, "Compress", 2, 1, 11);
    attr_int(&nb, "axis", 1);
    in[1] = &c;
    assert_int_equal(run_node(&nb.n, in, 2, 1, NULL, msg), MTS_EDYNAMIC);
    c.data = cond;
    assert_int_equal(run_node(&nb.n, in, 2, 1, out, msg), 0);
    assert_int_equal(out[0].dims[1], 2);
    free(out[0].data);

    /* TopK: unknown K, then K beyond the axis, then K negative */
    int64_t kv = 4, kd[1] = {1};
    mts_tensor kt = tens(MTS_DTYPE_INT64, 1, kd, NULL);
    mknode(&nb, "TopK", 2, 2, 11);
    in[1] = &kt;
    assert_int_equal(run_node(&nb.n, in, 2, 2, NULL, msg), MTS_EDYNAMIC);
    kt.data = &kv;
    assert_int_equal(run_node(&nb.n, in, 2, 2, NULL, msg), MTS_EINVAL);
    kv = -1;
    assert_int_equal(run_node(&nb.n, in, 2, 2, NULL, msg), MTS_EINVAL);
    kv = 2;
    assert_int_equal(run_node(&nb.n, in, 2, 2, out, msg), 0);
    assert_true(((float *)out[0].data)[0] == 1.0f && ((int64_t *)out[1].data)[0] == 1);
    assert_true(((float *)out[0].data)[2] == 3.0f && ((int64_t *)out[1].data)[2] == 2);
    free(out[0].data);
    free(out[1].data);

    /* OneHot: unknown depth, depth 0, NaN, a depth whose output overflows */
    int64_t iv[2] = {0, 5}, id[1] = {2}, vd[1] = {2};
    float depth = 0, vals[2] = {0, 1};
    mts_tensor ind = tens(MTS_DTYPE_INT64, 1, id, iv), dep = tens(MTS_DTYPE_FLOAT, 0, NULL, NULL);
    mts_tensor val = tens(MTS_DTYPE_FLOAT, 1, vd, vals);
    const mts_tensor *oin[3] = {&ind, &dep, &val};
    mknode(&nb, "OneHot", 3, 1, 11);
    assert_int_equal(run_node(&nb.n, oin, 3, 1, NULL, msg), MTS_EDYNAMIC);
    dep.data = &depth;
    assert_int_equal(run_node(&nb.n, oin, 3, 1, NULL, msg), MTS_EINVAL);
    depth = NAN;
    assert_int_equal(run_node(&nb.n, oin, 3, 1, NULL, msg), MTS_EINVAL);
    depth = 4.0e18f;
    assert_int_equal(run_node(&nb.n, oin, 3, 1, NULL, msg), MTS_EINVAL);
    depth = 3; /* index 5 is out of range: a row of off values */
    assert_int_equal(run_node(&nb.n, oin, 3, 1, out, msg), 0);
    float *o = out[0].data;
    assert_true(o[0] == 1 && o[1] == 0 && o[3] == 0 && o[4] == 0 && o[5] == 0);
    free(out[0].data);
}

static void test_einsum(void **state)
{
    (void)state;
    char msg[256];
    nodebuf nb;
    float a[2 * 3 * 4], b[2 * 4 * 5];
    for (int i = 0; i < 24; i++) a[i] = (float)((i * 7) % 11) - 5;
    for (int i = 0; i < 40; i++) b[i] = (float)((i * 5) % 13) - 6;
    int64_t ad[3] = {2, 3, 4}, bd[3] = {2, 4, 5};
    mts_tensor ta = tens(MTS_DTYPE_FLOAT, 3, ad, a), tb = tens(MTS_DTYPE_FLOAT, 3, bd, b);
    const mts_tensor *in[2] = {&ta, &tb};
    static const char *const bad[] = {"bij,bjj->bi", "bij,bjk,k->b", "b.ij,bjk", "bij,bj#->bik", "bij,bjk->bii",
                                      "bij,bjk->bz", "bij,bjk->b...k...", "bi,bjk", "bij->bik->b"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mknode(&nb, "Einsum", 2, 1, 12);
        attr_str(&nb, "equation", bad[i]);
        int rc = run_node(&nb.n, in, 2, 1, NULL, msg);
        if (rc != MTS_EINVAL && rc != MTS_ESHAPE) fail_msg("equation '%s' gave %d (%s)", bad[i], rc, msg);
    }
    /* GEMM path (a plain contraction with a transposed output) against a direct loop */
    mknode(&nb, "Einsum", 2, 1, 12);
    attr_str(&nb, "equation", "bij, bjk -> kbi");
    mts_tensor out[4];
    assert_int_equal(run_node(&nb.n, in, 2, 1, out, msg), 0);
    assert_int_equal(out[0].rank, 3);
    assert_int_equal(out[0].dims[0], 5);
    const float *y = out[0].data;
    for (int bb = 0; bb < 2; bb++)
        for (int i = 0; i < 3; i++)
            for (int kk = 0; kk < 5; kk++) {
                float s = 0;
                for (int j = 0; j < 4; j++) s += a[(bb * 3 + i) * 4 + j] * b[(bb * 4 + j) * 5 + kk];
                assert_true(fabsf(y[(kk * 2 + bb) * 3 + i] - s) < 1e-4f);
            }
    free(out[0].data);
    /* a diagonal and a sum within one operand go the direct way: trace of each batch */
    int64_t sd[3] = {2, 3, 3};
    mts_tensor sq = tens(MTS_DTYPE_FLOAT, 3, sd, a);
    const mts_tensor *in1[1] = {&sq};
    mknode(&nb, "Einsum", 1, 1, 12);
    attr_str(&nb, "equation", "...ii");
    assert_int_equal(run_node(&nb.n, in1, 1, 1, out, msg), 0);
    assert_int_equal(out[0].rank, 1);
    assert_true(((float *)out[0].data)[0] == a[0] + a[4] + a[8]);
    free(out[0].data);
}

static void test_nan_coordinates(void **state)
{
    (void)state;
    char msg[256];
    nodebuf nb;
    mts_tensor out[4];
    float img[2 * 3 * 3];
    for (int i = 0; i < 18; i++) img[i] = (float)i;
    int64_t xd[4] = {1, 2, 3, 3}, gd[4] = {1, 2, 3, 2};
    float grid[12] = {NAN, 0, INFINITY, -INFINITY, 1e30f, -1e30f, 0.5f, NAN, -3e9f, 2e9f, 0.1f, 0.2f};
    mts_tensor x = tens(MTS_DTYPE_FLOAT, 4, xd, img), g = tens(MTS_DTYPE_FLOAT, 4, gd, grid);
    const mts_tensor *in[2] = {&x, &g};
    static const char *const modes[] = {"bilinear", "nearest", "bicubic"};
    static const char *const pads[] = {"zeros", "border", "reflection"};
    for (int m = 0; m < 3; m++)
        for (int p = 0; p < 3; p++)
            for (int al = 0; al < 2; al++) {
                mknode(&nb, "GridSample", 2, 1, 16);
                attr_str(&nb, "mode", modes[m]);
                attr_str(&nb, "padding_mode", pads[p]);
                attr_int(&nb, "align_corners", al);
                assert_int_equal(run_node(&nb.n, in, 2, 1, out, msg), 0);
                assert_true(((float *)out[0].data)[5] == ((float *)out[0].data)[5]); /* the finite point */
                free(out[0].data);
            }

    /* RoiAlign: a batch index out of range, NaN coordinates, a roi needing a huge grid */
    float rois[4] = {0, 0, 2, 2};
    int64_t rd[2] = {1, 4}, bd[1] = {1}, bi = 1;
    mts_tensor r = tens(MTS_DTYPE_FLOAT, 2, rd, rois), b = tens(MTS_DTYPE_INT64, 1, bd, &bi);
    const mts_tensor *rin[3] = {&x, &r, &b};
    mknode(&nb, "RoiAlign", 3, 1, 16);
    assert_int_equal(run_node(&nb.n, rin, 3, 1, NULL, msg), MTS_EINVAL);
    bi = 0;
    rois[1] = NAN;
    assert_int_equal(run_node(&nb.n, rin, 3, 1, NULL, msg), MTS_EINVAL);
    rois[1] = 0;
    rois[2] = 1e30f;
    assert_int_equal(run_node(&nb.n, rin, 3, 1, NULL, msg), MTS_EUNSUPPORTED);
    rois[2] = 2;
    assert_int_equal(run_node(&nb.n, rin, 3, 1, out, msg), 0);
    free(out[0].data);

    /* NonMaxSuppression: NaN boxes and scores select without crashing; iou_threshold > 1 fails */
    float boxes[12] = {0, 0, 1, 1, NAN, 0, 1, 1, 0, 0, 1, 1}, scores[3] = {0.5f, NAN, 0.9f}, iou = 0.5f;
    int64_t bxd[3] = {1, 3, 4}, scd[3] = {1, 1, 3}, one[1] = {1}, maxo = 3;
    mts_tensor tb = tens(MTS_DTYPE_FLOAT, 3, bxd, boxes), ts = tens(MTS_DTYPE_FLOAT, 3, scd, scores);
    mts_tensor tm = tens(MTS_DTYPE_INT64, 1, one, &maxo), ti = tens(MTS_DTYPE_FLOAT, 1, one, &iou);
    const mts_tensor *nin[4] = {&tb, &ts, &tm, &ti};
    mknode(&nb, "NonMaxSuppression", 4, 1, 11);
    assert_int_equal(run_node(&nb.n, nin, 4, 1, out, msg), 0);
    assert_true(out[0].dims[0] >= 1 && out[0].dims[0] <= 3);
    free(out[0].data);
    iou = 2;
    assert_int_equal(run_node(&nb.n, nin, 4, 1, NULL, msg), MTS_EINVAL);

    /* Unique with NaNs */
    float u[6] = {NAN, 1, NAN, 0, 1, -0.0f};
    int64_t ud[1] = {6};
    mts_tensor tu = tens(MTS_DTYPE_FLOAT, 1, ud, u);
    const mts_tensor *uin[1] = {&tu};
    mknode(&nb, "Unique", 1, 4, 11);
    assert_int_equal(run_node(&nb.n, uin, 1, 4, out, msg), 0);
    assert_int_equal(out[0].dims[0], 3);
    for (int j = 0; j < 4; j++) free(out[j].data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scatter_gather_ranges),
        cmocka_unit_test(test_dynamic_shapes),
        cmocka_unit_test(test_einsum),
        cmocka_unit_test(test_nan_coordinates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
