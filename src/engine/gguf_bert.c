/*
 * A BERT-architecture GGUF file as an ONNX model: reads the hyperparameters (bert.block_count,
 * bert.embedding_length, bert.attention.head_count, bert.attention.layer_norm_epsilon) and the
 * tensors llama.cpp's converter writes (token_embd, token_types, position_embd,
 * token_embd_norm, blk.N.attn_{q,k,v}, attn_output, attn_output_norm, ffn_up, ffn_down,
 * layer_output_norm), checks every shape against them, dequantizes the weights to float32 and
 * writes a ModelProto with the op pattern of a Hugging Face BERT export (the one
 * models/gen/minilm_like.py emits): Gather embeddings, LayerNormalization, MatMul + Add
 * projections, Reshape/Transpose into heads, Softmax attention with the (1 - mask) * -10000
 * bias, Erf GELU. The result goes through the ordinary loader (loader.c), so the optimizer,
 * planning, batching and bf16 precision apply to it as to any ONNX model.
 *
 * ggml stores a tensor with ne[0] as its fastest dimension: a linear layer's weight is
 * ne = [in, out], i.e. PyTorch's row-major [out][in]; MatMul wants [in][out], so projection
 * weights are transposed here. Embedding tables (ne = [H, rows]) are already Gather's [rows][H].
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"

#define MAX_LAYERS 256
#define MAX_HIDDEN 65536

enum { A_INT = 2, A_FLOAT = 1, A_INTS = 7 }; /* AttributeProto.AttributeType */

typedef struct attr {
    const char *name;
    int type;
    int64_t i;
    float f;
    const int64_t *ints;
    int n_ints;
} attr;

typedef struct gb {
    mts_pbw g;             /* GraphProto fields */
    mts_gguf *gg;
    mts_err *err;
    int n_tmp;
} gb;

static void node(gb *b, const char *op, const char *name, const char *const *in, int n_in, const char *out,
                 const attr *attrs, int n_attrs)
{
    mts_pbw n = {0}, a = {0};
    for (int i = 0; i < n_in; i++) mts_pbw_str(&n, 1, in[i]);
    mts_pbw_str(&n, 2, out);
    mts_pbw_str(&n, 3, name);
    mts_pbw_str(&n, 4, op);
    for (int i = 0; i < n_attrs; i++) {
        a.len = 0;
        mts_pbw_str(&a, 1, attrs[i].name);
        if (attrs[i].type == A_FLOAT) {
            uint32_t bits;
            memcpy(&bits, &attrs[i].f, 4);
            uint8_t le4[4] = {(uint8_t)bits, (uint8_t)(bits >> 8), (uint8_t)(bits >> 16), (uint8_t)(bits >> 24)};
            mts_pbw_tag(&a, 2, 5);
            mts_pbw_raw(&a, le4, 4);
        } else if (attrs[i].type == A_INT) {
            mts_pbw_int(&a, 3, attrs[i].i);
        } else {
            for (int k = 0; k < attrs[i].n_ints; k++) mts_pbw_int(&a, 8, attrs[i].ints[k]);
        }
        mts_pbw_int(&a, 20, attrs[i].type);
        mts_pbw_bytes(&n, 5, a.p, a.len);
        if (a.oom) n.oom = 1;
    }
    mts_pbw_bytes(&b->g, 1, n.p, n.len);
    if (n.oom) b->g.oom = 1;
    mts_pbw_free(&n);
    mts_pbw_free(&a);
}

static int varint_size(uint64_t v)
{
    int k = 1;
    while (v >= 0x80) v >>= 7, k++;
    return k;
}

/* An initializer: dtype 1 float / 7 int64, data little-endian. */
static void init(gb *b, const char *name, int dtype, int rank, const int64_t *dims, const void *data, size_t nbytes)
{
    mts_pbw h = {0};
    for (int i = 0; i < rank; i++) mts_pbw_int(&h, 1, dims[i]);
    mts_pbw_int(&h, 2, dtype);
    mts_pbw_str(&h, 8, name);
    size_t total = h.len + 1 + (size_t)varint_size(nbytes) + nbytes;
    mts_pbw_tag(&b->g, 5, 2);
    mts_pbw_varint(&b->g, total);
    mts_pbw_raw(&b->g, h.p, h.len);
    mts_pbw_bytes(&b->g, 9, data, nbytes);
    if (h.oom) b->g.oom = 1;
    mts_pbw_free(&h);
}

static void const_i(gb *b, const char *name, int rank, const int64_t *v, int n)
{
    int64_t dims[1] = {n};
    init(b, name, 7, rank, dims, v, (size_t)n * 8);
}

static void const_f(gb *b, const char *name, float v)
{
    init(b, name, 1, 0, NULL, &v, 4);
}

/* A graph input or output: ValueInfoProto with a tensor type of symbolic/fixed dims. */
static void value_info(gb *b, int field, const char *name, int elem, int rank, const char *const *syms,
                       const int64_t *dims)
{
    mts_pbw shape = {0}, dim = {0}, tt = {0}, tp = {0}, vi = {0};
    for (int i = 0; i < rank; i++) {
        dim.len = 0;
        if (syms[i]) mts_pbw_str(&dim, 2, syms[i]);
        else mts_pbw_int(&dim, 1, dims[i]);
        mts_pbw_bytes(&shape, 1, dim.p, dim.len);
    }
    mts_pbw_int(&tt, 1, elem);
    mts_pbw_bytes(&tt, 2, shape.p, shape.len);
    mts_pbw_bytes(&tp, 1, tt.p, tt.len);
    mts_pbw_str(&vi, 1, name);
    mts_pbw_bytes(&vi, 2, tp.p, tp.len);
    mts_pbw_bytes(&b->g, (uint32_t)field, vi.p, vi.len);
    if (shape.oom || dim.oom || tt.oom || tp.oom || vi.oom) b->g.oom = 1;
    mts_pbw_free(&shape);
    mts_pbw_free(&dim);
    mts_pbw_free(&tt);
    mts_pbw_free(&tp);
    mts_pbw_free(&vi);
}

/* Tensor `name` of the file, checked to have exactly the ggml shape ne[0..nd), dequantized; with
 * transpose (nd == 2) written as the [ne0][ne1] matrix MatMul wants, else as [ne[nd-1]]...[ne0].
 * Written as initializer `as`. optional: a missing tensor is not an error (returns 1). */
static int weight(gb *b, const char *name, int nd, const int64_t *ne, int transpose, const char *as, int optional)
{
    const mts_gguf_tensor *t = mts_gguf_tensor_find(b->gg, name);
    if (!t) {
        if (optional) return 1;
        return mts_err_set(b->err, MTS_EFORMAT, "%s: GGUF: BERT tensor '%s' is missing", b->gg->file, name);
    }
    int ok = t->n_dims <= nd || (t->n_dims > nd && t->ne[nd] == 1);
    for (int d = 0; d < nd; d++) ok = ok && t->ne[d] == ne[d];
    for (int d = nd; d < MTS_GGUF_MAX_DIMS; d++) ok = ok && t->ne[d] == 1;
    if (!ok) {
        char want[96], got[96];
        int k = snprintf(want, sizeof want, "[");
        for (int d = 0; d < nd; d++)
            k += snprintf(want + k, sizeof want - (size_t)k, d ? ", %lld" : "%lld", (long long)ne[d]);
        snprintf(want + k, sizeof want - (size_t)k, "]");
        k = snprintf(got, sizeof got, "[");
        for (int d = 0; d < t->n_dims; d++)
            k += snprintf(got + k, sizeof got - (size_t)k, d ? ", %lld" : "%lld", (long long)t->ne[d]);
        snprintf(got + k, sizeof got - (size_t)k, "]");
        return mts_err_set(b->err, MTS_ESHAPE, "%s: GGUF: tensor '%s' (info at byte %zu) has shape ne=%s, expected %s "
                           "from the hyperparameters", b->gg->file, name, t->info_off, got, want);
    }
    float *v = mts_gguf_tensor_f32(b->gg, t, b->err);
    if (!v) return -1;
    int64_t dims[MTS_GGUF_MAX_DIMS];
    for (int d = 0; d < nd; d++) dims[d] = ne[nd - 1 - d];
    if (transpose && nd == 2) {
        float *w = malloc((size_t)t->numel * sizeof(float) + 1);
        if (!w) {
            free(v);
            return mts_err_set(b->err, MTS_ENOMEM, "%s: GGUF: out of memory", b->gg->file);
        }
        int64_t in = ne[0], out = ne[1];
        for (int64_t o = 0; o < out; o++)
            for (int64_t i = 0; i < in; i++) w[i * out + o] = v[o * in + i];
        free(v);
        v = w;
        dims[0] = in;
        dims[1] = out;
    }
    init(b, as, 1, nd, dims, v, (size_t)t->numel * sizeof(float));
    free(v);
    return 0;
}

static int linear(gb *b, const char *x, const char *gname, int64_t din, int64_t dout, const char *pre, char *out)
{
    char wn[160], bn[160], win[160], bin[160], mm[160];
    int64_t ne_w[2] = {din, dout}, ne_b[1] = {dout};
    snprintf(wn, sizeof wn, "%s.weight", gname);
    snprintf(bn, sizeof bn, "%s.bias", gname);
    snprintf(win, sizeof win, "%s.weight", pre);
    snprintf(bin, sizeof bin, "%s.bias", pre);
    int rc;
    if ((rc = weight(b, wn, 2, ne_w, 1, win, 0)) || (rc = weight(b, bn, 1, ne_b, 0, bin, 0))) return rc;
    snprintf(mm, sizeof mm, "%s.matmul", pre);
    node(b, "MatMul", mm, (const char *[]){x, win}, 2, mm, NULL, 0);
    snprintf(out, 160, "%s.add", pre);
    node(b, "Add", out, (const char *[]){mm, bin}, 2, out, NULL, 0);
    return 0;
}

static int layer_norm(gb *b, const char *x, const char *gname, int64_t h, float eps, const char *pre, const char *out)
{
    char wn[160], bn[160], sn[160], on[160];
    int64_t ne[1] = {h};
    snprintf(wn, sizeof wn, "%s.weight", gname);
    snprintf(bn, sizeof bn, "%s.bias", gname);
    snprintf(sn, sizeof sn, "%s.weight", pre);
    snprintf(on, sizeof on, "%s.bias", pre);
    int rc;
    if ((rc = weight(b, wn, 1, ne, 0, sn, 0)) || (rc = weight(b, bn, 1, ne, 0, on, 0))) return rc;
    attr a[2] = {{"axis", A_INT, -1, 0, NULL, 0}, {"epsilon", A_FLOAT, 0, eps, NULL, 0}};
    node(b, "LayerNormalization", pre, (const char *[]){x, sn, on}, 3, out, a, 2);
    return 0;
}

static int build(gb *b)
{
    mts_gguf *g = b->gg;
    mts_err *err = b->err;
    size_t alen = 0;
    const char *arch = mts_gguf_get_str(g, "general.architecture", &alen);
    if (!arch)
        return mts_err_set(err, MTS_EFORMAT, "%s: GGUF: no general.architecture (string) in the metadata", g->file);
    if (alen != 4 || memcmp(arch, "bert", 4) != 0)
        return mts_err_set(err, MTS_EUNSUPPORTED, "%s: GGUF: architecture '%.*s' is not supported (only 'bert' "
                           "encoders are read)", g->file, (int)(alen > 40 ? 40 : alen), arch);
    int64_t L, H, heads, ffn_meta;
    double eps;
    if (mts_gguf_get_int(g, "bert.block_count", -1, &L, err) ||
        mts_gguf_get_int(g, "bert.embedding_length", -1, &H, err) ||
        mts_gguf_get_int(g, "bert.attention.head_count", -1, &heads, err) ||
        mts_gguf_get_int(g, "bert.feed_forward_length", -1, &ffn_meta, err) ||
        mts_gguf_get_float(g, "bert.attention.layer_norm_epsilon", 1e-12, &eps, err))
        return MTS_EFORMAT;
    if (L < 1 || L > MAX_LAYERS)
        return mts_err_set(err, MTS_EFORMAT, "%s: GGUF: bert.block_count %lld is missing or out of range (1 to %d)",
                           g->file, (long long)L, MAX_LAYERS);
    if (H < 1 || H > MAX_HIDDEN)
        return mts_err_set(err, MTS_EFORMAT,
                           "%s: GGUF: bert.embedding_length %lld is missing or out of range (1 to %d)",
                           g->file, (long long)H, MAX_HIDDEN);
    if (heads < 1 || H % heads)
        return mts_err_set(err, MTS_EFORMAT, "%s: GGUF: bert.attention.head_count %lld is missing or does not divide "
                           "the embedding length %lld", g->file, (long long)heads, (long long)H);
    if (!(eps > 0 && eps < 1))
        return mts_err_set(err, MTS_EFORMAT, "%s: GGUF: bert.attention.layer_norm_epsilon %g is out of range",
                           g->file, eps);
    const mts_gguf_tensor *te = mts_gguf_tensor_find(g, "token_embd.weight");
    const mts_gguf_tensor *pe = mts_gguf_tensor_find(g, "position_embd.weight");
    const mts_gguf_tensor *tt = mts_gguf_tensor_find(g, "token_types.weight");
    const mts_gguf_tensor *up = mts_gguf_tensor_find(g, "blk.0.ffn_up.weight");
    if (!te || !pe || !up)
        return mts_err_set(err, MTS_EFORMAT, "%s: GGUF: BERT tensor '%s' is missing", g->file,
                           !te ? "token_embd.weight" : !pe ? "position_embd.weight" : "blk.0.ffn_up.weight");
    int64_t V = te->ne[1], P = pe->ne[1], T = tt ? tt->ne[1] : 0, F = up->ne[1];
    if (ffn_meta > 0 && F != ffn_meta)
        return mts_err_set(err, MTS_ESHAPE, "%s: GGUF: blk.0.ffn_up.weight has %lld outputs, bert.feed_forward_length "
                           "says %lld", g->file, (long long)F, (long long)ffn_meta);
    int64_t hd = H / heads;
    int rc;
    char x[160], y[160], name[160];

    /* shapes and the attention-mask bias, as the export computes them */
    const_i(b, "const_0", 0, (int64_t[]){0}, 1);
    const_i(b, "const_1", 0, (int64_t[]){1}, 1);
    const_i(b, "axes_0", 1, (int64_t[]){0}, 1);
    const_i(b, "const_heads", 1, (int64_t[]){heads}, 1);
    const_i(b, "const_head_dim", 1, (int64_t[]){hd}, 1);
    const_i(b, "const_hidden", 1, (int64_t[]){H}, 1);
    node(b, "Shape", "ids.shape", (const char *[]){"input_ids"}, 1, "ids.shape", NULL, 0);
    attr ax0 = {"axis", A_INT, 0, 0, NULL, 0};
    node(b, "Gather", "dims.n", (const char *[]){"ids.shape", "const_0"}, 2, "dims.n", &ax0, 1);
    node(b, "Gather", "dims.s", (const char *[]){"ids.shape", "const_1"}, 2, "dims.s", &ax0, 1);
    node(b, "Unsqueeze", "dims.n_1d", (const char *[]){"dims.n", "axes_0"}, 2, "dims.n_1d", NULL, 0);
    node(b, "Unsqueeze", "dims.s_1d", (const char *[]){"dims.s", "axes_0"}, 2, "dims.s_1d", NULL, 0);
    node(b, "Concat", "dims.heads_shape", (const char *[]){"dims.n_1d", "dims.s_1d", "const_heads", "const_head_dim"},
         4, "dims.heads_shape", &ax0, 1);
    node(b, "Concat", "dims.merge_shape", (const char *[]){"dims.n_1d", "dims.s_1d", "const_hidden"}, 3,
         "dims.merge_shape", &ax0, 1);
    attr to_f = {"to", A_INT, 1, 0, NULL, 0};
    node(b, "Cast", "mask.cast", (const char *[]){"attention_mask"}, 1, "mask.cast", &to_f, 1);
    const_i(b, "mask.axes", 1, (int64_t[]){1, 2}, 2);
    node(b, "Unsqueeze", "mask.unsqueeze", (const char *[]){"mask.cast", "mask.axes"}, 2, "mask.unsqueeze", NULL, 0);
    const_f(b, "mask.one", 1.0f);
    const_f(b, "mask.neg", -10000.0f);
    node(b, "Sub", "mask.invert", (const char *[]){"mask.one", "mask.unsqueeze"}, 2, "mask.invert", NULL, 0);
    node(b, "Mul", "mask.bias", (const char *[]){"mask.invert", "mask.neg"}, 2, "mask.bias", NULL, 0);

    /* embeddings */
    if ((rc = weight(b, "token_embd.weight", 2, (int64_t[]){H, V}, 0, "embeddings.word_embeddings.weight", 0)) ||
        (rc = weight(b, "position_embd.weight", 2, (int64_t[]){H, P}, 0, "embeddings.position_embeddings.weight", 0)))
        return rc;
    if (tt && (rc = weight(b, "token_types.weight", 2, (int64_t[]){H, T}, 0,
                           "embeddings.token_type_embeddings.weight", 0)))
        return rc;
    int64_t *pos = malloc((size_t)P * sizeof *pos);
    if (!pos) return mts_err_set(err, MTS_ENOMEM, "%s: GGUF: out of memory", g->file);
    for (int64_t i = 0; i < P; i++) pos[i] = i;
    int64_t pdims[2] = {1, P};
    init(b, "embeddings.position_ids", 7, 2, pdims, pos, (size_t)P * 8);
    free(pos);
    const_i(b, "slice_starts", 1, (int64_t[]){0}, 1);
    const_i(b, "slice_axes", 1, (int64_t[]){1}, 1);
    node(b, "Gather", "embeddings.word", (const char *[]){"embeddings.word_embeddings.weight", "input_ids"}, 2,
         "embeddings.word", &ax0, 1);
    node(b, "Slice", "embeddings.position_ids_slice",
         (const char *[]){"embeddings.position_ids", "slice_starts", "dims.s_1d", "slice_axes"}, 4,
         "embeddings.position_ids_slice", NULL, 0);
    node(b, "Gather", "embeddings.position",
         (const char *[]){"embeddings.position_embeddings.weight", "embeddings.position_ids_slice"}, 2,
         "embeddings.position", &ax0, 1);
    const char *emb = "embeddings.word";
    if (tt) {
        node(b, "Gather", "embeddings.token_type",
             (const char *[]){"embeddings.token_type_embeddings.weight", "token_type_ids"}, 2, "embeddings.token_type",
             &ax0, 1);
        node(b, "Add", "embeddings.add_type", (const char *[]){"embeddings.word", "embeddings.token_type"}, 2,
             "embeddings.add_type", NULL, 0);
        emb = "embeddings.add_type";
    }
    node(b, "Add", "embeddings.add", (const char *[]){emb, "embeddings.position"}, 2, "embeddings.add", NULL, 0);
    if ((rc = layer_norm(b, "embeddings.add", "token_embd_norm", H, (float)eps, "embeddings.LayerNorm",
                         "embeddings.LayerNorm")))
        return rc;
    snprintf(x, sizeof x, "embeddings.LayerNorm");

    const_f(b, "attention.scale", (float)sqrt((double)hd));
    const_f(b, "gelu.half", 0.5f);
    const_f(b, "gelu.one", 1.0f);
    const_f(b, "gelu.sqrt2", (float)sqrt(2.0));
    for (int64_t l = 0; l < L; l++) {
        char pre[64], gp[64], q[160], k[160], v[160], t1[160], t2[160], gn[96], pn[160];
        snprintf(pre, sizeof pre, "encoder.layer.%lld", (long long)l);
        snprintf(gp, sizeof gp, "blk.%lld", (long long)l);
#define GN(s) (snprintf(gn, sizeof gn, "%s.%s", gp, s), gn)
#define PN(s) (snprintf(pn, sizeof pn, "%s.%s", pre, s), pn)
        if ((rc = linear(b, x, GN("attn_q"), H, H, PN("attention.self.query"), q)) ||
            (rc = linear(b, x, GN("attn_k"), H, H, PN("attention.self.key"), k)) ||
            (rc = linear(b, x, GN("attn_v"), H, H, PN("attention.self.value"), v)))
            return rc;
        static const int64_t p0213[4] = {0, 2, 1, 3}, p0231[4] = {0, 2, 3, 1};
        attr tq = {"perm", A_INTS, 0, 0, p0213, 4}, tk = {"perm", A_INTS, 0, 0, p0231, 4};
        const char *qkv[3] = {q, k, v}, *tag[3] = {"q", "k", "v"};
        char heads_out[3][160];
        for (int j = 0; j < 3; j++) {
            snprintf(t1, sizeof t1, "%s.%s.reshape", pre, tag[j]);
            node(b, "Reshape", t1, (const char *[]){qkv[j], "dims.heads_shape"}, 2, t1, NULL, 0);
            snprintf(heads_out[j], 160, "%s.%s.transpose", pre, tag[j]);
            node(b, "Transpose", heads_out[j], (const char *[]){t1}, 1, heads_out[j], j == 1 ? &tk : &tq, 1);
        }
        snprintf(t1, sizeof t1, "%s.scores", pre);
        node(b, "MatMul", t1, (const char *[]){heads_out[0], heads_out[1]}, 2, t1, NULL, 0);
        snprintf(t2, sizeof t2, "%s.scores.div", pre);
        node(b, "Div", t2, (const char *[]){t1, "attention.scale"}, 2, t2, NULL, 0);
        snprintf(t1, sizeof t1, "%s.scores.mask", pre);
        node(b, "Add", t1, (const char *[]){t2, "mask.bias"}, 2, t1, NULL, 0);
        attr sm = {"axis", A_INT, -1, 0, NULL, 0};
        snprintf(t2, sizeof t2, "%s.softmax", pre);
        node(b, "Softmax", t2, (const char *[]){t1}, 1, t2, &sm, 1);
        snprintf(t1, sizeof t1, "%s.context", pre);
        node(b, "MatMul", t1, (const char *[]){t2, heads_out[2]}, 2, t1, NULL, 0);
        snprintf(t2, sizeof t2, "%s.context.transpose", pre);
        node(b, "Transpose", t2, (const char *[]){t1}, 1, t2, &tq, 1);
        snprintf(t1, sizeof t1, "%s.context.reshape", pre);
        node(b, "Reshape", t1, (const char *[]){t2, "dims.merge_shape"}, 2, t1, NULL, 0);
        if ((rc = linear(b, t1, GN("attn_output"), H, H, PN("attention.output.dense"), y))) return rc;
        snprintf(t2, sizeof t2, "%s.attention.output.residual", pre);
        node(b, "Add", t2, (const char *[]){y, x}, 2, t2, NULL, 0);
        snprintf(name, sizeof name, "%s.attention.output.LayerNorm", pre);
        if ((rc = layer_norm(b, t2, GN("attn_output_norm"), H, (float)eps, name, name))) return rc;
        snprintf(x, sizeof x, "%s", name);
        char h[160];
        if ((rc = linear(b, x, GN("ffn_up"), H, F, PN("intermediate.dense"), h))) return rc;
        snprintf(t1, sizeof t1, "%s.gelu.div", pre);
        node(b, "Div", t1, (const char *[]){h, "gelu.sqrt2"}, 2, t1, NULL, 0);
        snprintf(t2, sizeof t2, "%s.gelu.erf", pre);
        node(b, "Erf", t2, (const char *[]){t1}, 1, t2, NULL, 0);
        snprintf(t1, sizeof t1, "%s.gelu.add", pre);
        node(b, "Add", t1, (const char *[]){t2, "gelu.one"}, 2, t1, NULL, 0);
        snprintf(t2, sizeof t2, "%s.gelu.mul", pre);
        node(b, "Mul", t2, (const char *[]){h, t1}, 2, t2, NULL, 0);
        snprintf(t1, sizeof t1, "%s.gelu.mul_half", pre);
        node(b, "Mul", t1, (const char *[]){t2, "gelu.half"}, 2, t1, NULL, 0);
        if ((rc = linear(b, t1, GN("ffn_down"), F, H, PN("output.dense"), y))) return rc;
        snprintf(t2, sizeof t2, "%s.output.residual", pre);
        node(b, "Add", t2, (const char *[]){y, x}, 2, t2, NULL, 0);
        snprintf(name, sizeof name, "%s.output.LayerNorm", pre);
        if ((rc = layer_norm(b, t2, GN("layer_output_norm"), H, (float)eps, name,
                             l == L - 1 ? "last_hidden_state" : name)))
            return rc;
        snprintf(x, sizeof x, "%s", name);
#undef GN
#undef PN
    }
    static const char *const ns[2] = {"N", "S"};
    static const char *const nsh[3] = {"N", "S", NULL};
    int64_t hdim[3] = {0, 0, H};
    value_info(b, 11, "input_ids", 7, 2, ns, NULL);
    value_info(b, 11, "attention_mask", 7, 2, ns, NULL);
    value_info(b, 11, "token_type_ids", 7, 2, ns, NULL);
    value_info(b, 12, "last_hidden_state", 1, 3, nsh, hdim);
    mts_pbw_str(&b->g, 2, "gguf_bert");
    return 0;
}

int mts_gguf_to_onnx(const void *bytes, size_t len, const char *file, mts_pbw *out, mts_err *err)
{
    mts_gguf g;
    int rc = mts_gguf_parse(&g, bytes, len, file, err);
    if (rc) return rc;
    gb b = {.gg = &g, .err = err};
    rc = build(&b);
    if (!rc && b.g.oom) rc = mts_err_set(err, MTS_ENOMEM, "%s: GGUF: out of memory building the model", file);
    if (!rc) {
        mts_pbw op = {0};
        mts_pbw_str(&op, 1, "");
        mts_pbw_int(&op, 2, 17);
        mts_pbw_int(out, 1, 8);
        mts_pbw_str(out, 2, "mtserve-gguf");
        mts_pbw_bytes(out, 8, op.p, op.len);
        mts_pbw_bytes(out, 7, b.g.p, b.g.len);
        if (op.oom || out->oom) rc = mts_err_set(err, MTS_ENOMEM, "%s: GGUF: out of memory building the model", file);
        mts_pbw_free(&op);
    }
    mts_pbw_free(&b.g);
    mts_gguf_free(&g);
    return rc;
}

int mts_gguf_embed_defaults(const char *path, int *pooling_out, int64_t *context_out)
{
    *pooling_out = 0;
    *context_out = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size < 24) {
        fclose(f);
        return -1;
    }
    /* The metadata comes first: read 1 MiB of the file, then twice as much while the key/values
     * run past what was read, up to 64 MiB (a BERT vocabulary is well under 1 MiB). */
    int pooling = -1;
    for (size_t cap = 1u << 20;; cap *= 2) {
        size_t want = (size_t)size < cap ? (size_t)size : cap;
        uint8_t *buf = malloc(want);
        size_t len = buf && fseek(f, 0, SEEK_SET) == 0 ? fread(buf, 1, want, f) : 0;
        mts_gguf g;
        mts_err err = {0};
        int rc = -1;
        if (len >= 24 && mts_gguf_is(buf, len)) {
            memset(buf + 8, 0, 8); /* the key/values only: the tensor infos may lie past what was read */
            if ((rc = mts_gguf_parse(&g, buf, len, path, &err)) == 0) {
                int64_t p = 0, c = 0;
                pooling = mts_gguf_get_int(&g, "bert.pooling_type", 0, &p, &err) == 0 && p >= 0 && p <= 3 ? (int)p : 0;
                if (mts_gguf_get_int(&g, "bert.context_length", 0, &c, &err) == 0 && c > 0) *context_out = c;
                mts_gguf_free(&g);
            }
        }
        int got = buf != NULL;
        free(buf);
        if (rc == 0 || !got || len < want || want == (size_t)size || cap >= (64u << 20)) break;
    }
    fclose(f);
    *pooling_out = pooling < 0 ? 0 : pooling;
    return pooling < 0 ? -1 : 0;
}
