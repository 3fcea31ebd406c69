/*
 * The ONNX model editor and writer (onnx_write.h). Reading walks the wire format of ModelProto
 * -> GraphProto -> NodeProto / TensorProto / ValueInfoProto with every length checked against
 * the enclosing message (malformed input fails with the message name and byte offset, nothing
 * is read out of bounds); writing re-emits the ModelProto field by field, copying the bytes of
 * every field it does not edit. Field numbers (onnx.proto):
 *
 *   ModelProto     graph=7 opset_import=8 (OperatorSetId domain=1 version=2)
 *   GraphProto     node=1 initializer=5 input=11 output=12
 *   NodeProto      input=1 output=2 name=3 op_type=4 attribute=5 domain=7
 *   AttributeProto name=1 f=2 i=3 type=20
 *   TensorProto    dims=1 data_type=2 float_data=4 name=8 raw_data=9 data_location=14
 *   ValueInfoProto name=1 type=2 (TypeProto tensor_type=1, Tensor elem_type=1)
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/onnx_write.h"

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

/* ---- encoding ---- */

static void pbw_reserve(mts_pbw *w, size_t n)
{
    if (w->oom) return;
    if (w->len + n <= w->cap) return;
    size_t cap = w->cap ? w->cap : 4096;
    while (cap < w->len + n) {
        if (cap > SIZE_MAX / 2) {
            w->oom = 1;
            return;
        }
        cap *= 2;
    }
    uint8_t *p = realloc(w->p, cap);
    if (!p) {
        w->oom = 1;
        return;
    }
    w->p = p;
    w->cap = cap;
}

void mts_pbw_raw(mts_pbw *w, const void *data, size_t len)
{
    pbw_reserve(w, len);
    if (w->oom || !len) return;
    memcpy(w->p + w->len, data, len);
    w->len += len;
}

void mts_pbw_varint(mts_pbw *w, uint64_t v)
{
    uint8_t b[10];
    int n = 0;
    do {
        b[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    mts_pbw_raw(w, b, (size_t)n);
}

void mts_pbw_tag(mts_pbw *w, uint32_t field, uint32_t wt)
{
    mts_pbw_varint(w, ((uint64_t)field << 3) | wt);
}

void mts_pbw_bytes(mts_pbw *w, uint32_t field, const void *data, size_t len)
{
    mts_pbw_tag(w, field, WT_LEN);
    mts_pbw_varint(w, len);
    mts_pbw_raw(w, data, len);
}

void mts_pbw_str(mts_pbw *w, uint32_t field, const char *s)
{
    mts_pbw_bytes(w, field, s, strlen(s));
}

void mts_pbw_int(mts_pbw *w, uint32_t field, int64_t v)
{
    mts_pbw_tag(w, field, WT_VARINT);
    mts_pbw_varint(w, (uint64_t)v);
}

void mts_pbw_free(mts_pbw *w)
{
    free(w->p);
    memset(w, 0, sizeof *w);
}

/* ---- decoding ---- */

typedef struct rd {
    const uint8_t *p, *end;
} rd;

typedef struct fld {
    uint32_t num, wt;
    uint64_t v;
    rd sub;
    const uint8_t *at, *stop; /* the whole field's bytes */
} fld;

static int rd_varint(rd *b, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (b->p >= b->end) return -1;
        uint8_t c = *b->p++;
        r |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *v = r;
            return 0;
        }
    }
    return -1;
}

/* 1: a field was read; 0: end of message; < 0: malformed (err set). */
static int rd_next(const mts_onnx_doc *d, rd *b, fld *f, const char *what, mts_err *err)
{
    if (b->p >= b->end) return 0;
    f->at = b->p;
    uint64_t key;
    if (rd_varint(b, &key) || (key >> 3) == 0 || (key >> 3) > UINT32_MAX)
        return mts_err_set(err, MTS_EFORMAT, "%s: bad field key in %s at byte %zu", d->file, what,
                           (size_t)(f->at - d->bytes));
    f->num = (uint32_t)(key >> 3);
    f->wt = (uint32_t)(key & 7);
    f->v = 0;
    f->sub.p = f->sub.end = NULL;
    switch (f->wt) {
    case WT_VARINT:
        if (rd_varint(b, &f->v)) goto trunc;
        break;
    case WT_I64:
        if (b->end - b->p < 8) goto trunc;
        for (int i = 0; i < 8; i++) f->v |= (uint64_t)b->p[i] << (8 * i);
        b->p += 8;
        break;
    case WT_I32:
        if (b->end - b->p < 4) goto trunc;
        for (int i = 0; i < 4; i++) f->v |= (uint64_t)b->p[i] << (8 * i);
        b->p += 4;
        break;
    case WT_LEN: {
        uint64_t n;
        if (rd_varint(b, &n) || n > (uint64_t)(b->end - b->p)) goto trunc;
        f->sub.p = b->p;
        f->sub.end = b->p + n;
        b->p += n;
    } break;
    default:
        return mts_err_set(err, MTS_EFORMAT, "%s: unsupported wire type %u in %s at byte %zu", d->file, f->wt,
                           what, (size_t)(f->at - d->bytes));
    }
    f->stop = b->p;
    return 1;
trunc:
    return mts_err_set(err, MTS_EFORMAT, "%s: truncated field %u in %s at byte %zu", d->file, f->num, what,
                       (size_t)(f->at - d->bytes));
}

static const char *pstr(mts_onnx_doc *d, const rd *s)
{
    return mts_pool_strndup(&d->pool, (const char *)s->p, (size_t)(s->end - s->p));
}

const char *mts_onnx_str(mts_onnx_doc *d, const char *s)
{
    return mts_pool_strndup(&d->pool, s, strlen(s));
}

static int grow(mts_onnx_doc *d, void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap) return 0;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *na = mts_pool_calloc(&d->pool, (size_t)nc, elem);
    if (!na) return -1;
    if (*arr) memcpy(na, *arr, (size_t)*cap * elem);
    *arr = na;
    *cap = nc;
    return 0;
}

#define OOM(err) mts_err_set(err, MTS_ENOMEM, "out of memory")

/* Appends s to a pool array of strings (*arr of *n, *cap). */
static int push_str(mts_onnx_doc *d, const char ***arr, int *n, int *cap, const char *s)
{
    if (grow(d, (void **)arr, cap, *n + 1, sizeof(char *))) return -1;
    (*arr)[(*n)++] = s;
    return 0;
}

static int read_attr(mts_onnx_doc *d, rd b, mts_onnx_attr *a, mts_err *err)
{
    fld f;
    int rc;
    a->name = "";
    while ((rc = rd_next(d, &b, &f, "AttributeProto", err)) > 0) {
        if (f.num == 1 && f.wt == WT_LEN) {
            if (!(a->name = pstr(d, &f.sub))) return OOM(err);
        } else if (f.num == 2 && f.wt == WT_I32) {
            uint32_t u = (uint32_t)f.v;
            memcpy(&a->f, &u, 4);
        } else if (f.num == 3 && f.wt == WT_VARINT) {
            a->i = (int64_t)f.v;
        } else if (f.num == 20 && f.wt == WT_VARINT) {
            a->type = (int)f.v;
        }
    }
    return rc;
}

static int read_node(mts_onnx_doc *d, rd b, mts_onnx_node *n, mts_err *err)
{
    fld f;
    int rc, cin = 0, cout = 0, cattr = 0;
    n->op_type = n->domain = n->name = "";
    n->raw = b.p;
    n->raw_len = (size_t)(b.end - b.p);
    n->new_axis = INT64_MIN;
    while ((rc = rd_next(d, &b, &f, "NodeProto", err)) > 0) {
        if (f.wt != WT_LEN) continue;
        const char *s = NULL;
        if (f.num != 5 && !(s = pstr(d, &f.sub))) return OOM(err);
        if (f.num == 1) {
            if (push_str(d, &n->in, &n->n_in, &cin, s)) return OOM(err);
        } else if (f.num == 2) {
            if (push_str(d, &n->out, &n->n_out, &cout, s)) return OOM(err);
        } else if (f.num == 3) {
            n->name = s;
        } else if (f.num == 4) {
            n->op_type = s;
        } else if (f.num == 7) {
            n->domain = s;
        } else if (f.num == 5) {
            if (grow(d, (void **)&n->attrs, &cattr, n->n_attrs + 1, sizeof(mts_onnx_attr))) return OOM(err);
            if ((rc = read_attr(d, f.sub, &n->attrs[n->n_attrs++], err))) return rc;
        }
    }
    return rc;
}

static int read_init(mts_onnx_doc *d, rd b, mts_onnx_init *t, mts_err *err)
{
    fld f;
    int rc;
    t->name = "";
    t->raw = b.p;
    t->raw_len = (size_t)(b.end - b.p);
    while ((rc = rd_next(d, &b, &f, "TensorProto", err)) > 0) {
        if (f.num == 1) {
            if (f.wt == WT_VARINT) {
                if (t->rank >= MTS_MAX_RANK) goto rank;
                t->dims[t->rank++] = (int64_t)f.v;
            } else if (f.wt == WT_LEN) {
                rd pk = f.sub;
                uint64_t v;
                while (pk.p < pk.end) {
                    if (rd_varint(&pk, &v))
                        return mts_err_set(err, MTS_EFORMAT, "%s: bad packed dims in TensorProto at byte %zu",
                                           d->file, (size_t)(f.at - d->bytes));
                    if (t->rank >= MTS_MAX_RANK) goto rank;
                    t->dims[t->rank++] = (int64_t)v;
                }
            }
        } else if (f.num == 2 && f.wt == WT_VARINT) {
            t->dtype = (int)f.v;
        } else if (f.num == 8 && f.wt == WT_LEN) {
            if (!(t->name = pstr(d, &f.sub))) return OOM(err);
        } else if (f.num == 9 && f.wt == WT_LEN) {
            t->data = f.sub.p;
            t->data_len = (size_t)(f.sub.end - f.sub.p);
        } else if (f.num == 4 && f.wt == WT_LEN) {
            t->float_data = f.sub.p;
            t->float_data_len = (size_t)(f.sub.end - f.sub.p);
        } else if (f.num == 14 && f.wt == WT_VARINT && f.v == 1) {
            t->external = 1;
        }
    }
    return rc;
rank:
    return mts_err_set(err, MTS_EUNSUPPORTED, "%s: initializer '%s' has rank above %d", d->file, t->name,
                       MTS_MAX_RANK);
}

static int read_graph(mts_onnx_doc *d, rd g, mts_err *err)
{
    fld f;
    int rc, cin = 0;
    while ((rc = rd_next(d, &g, &f, "GraphProto", err)) > 0) {
        if (f.wt != WT_LEN) continue;
        if (f.num == 1) {
            if (grow(d, (void **)&d->nodes, &d->cap_nodes, d->n_nodes + 1, sizeof(mts_onnx_node))) return OOM(err);
            if ((rc = read_node(d, f.sub, &d->nodes[d->n_nodes++], err))) return rc;
        } else if (f.num == 5) {
            if (grow(d, (void **)&d->inits, &d->cap_inits, d->n_inits + 1, sizeof(mts_onnx_init))) return OOM(err);
            if ((rc = read_init(d, f.sub, &d->inits[d->n_inits++], err))) return rc;
        } else if (f.num == 11 || f.num == 12) {
            rd vb = f.sub;
            fld h;
            const char *name = "";
            while ((rc = rd_next(d, &vb, &h, "ValueInfoProto", err)) > 0)
                if (h.num == 1 && h.wt == WT_LEN && !(name = pstr(d, &h.sub))) return OOM(err);
            if (rc < 0) return rc;
            if (f.num == 11) {
                if (push_str(d, &d->inputs, &d->n_inputs, &cin, name)) return OOM(err);
            } else {
                int n = d->n_outputs, cap = d->cap_outputs;
                if (push_str(d, &d->outputs, &d->n_outputs, &d->cap_outputs, name)) return OOM(err);
                int c2 = cap, c3 = cap;
                if (grow(d, (void **)&d->out_raw, &c2, d->n_outputs, sizeof(uint8_t *)) ||
                    grow(d, (void **)&d->out_raw_len, &c3, d->n_outputs, sizeof(size_t)))
                    return OOM(err);
                d->out_raw[n] = f.sub.p;
                d->out_raw_len[n] = (size_t)(f.sub.end - f.sub.p);
                d->n_orig_outputs = d->n_outputs;
            }
        }
    }
    return rc;
}

int mts_onnx_doc_read(mts_onnx_doc *d, const void *bytes, size_t len, const char *file, mts_err *err)
{
    memset(d, 0, sizeof *d);
    d->bytes = bytes;
    d->len = len;
    d->file = file;
    rd b = {d->bytes, d->bytes + len};
    fld f;
    int rc, graphs = 0;
    while ((rc = rd_next(d, &b, &f, "ModelProto", err)) > 0) {
        if (f.num == 7 && f.wt == WT_LEN) {
            if (graphs++) return mts_err_set(err, MTS_EFORMAT, "%s: more than one graph", file);
            if ((rc = read_graph(d, f.sub, err))) return rc;
        } else if (f.num == 8 && f.wt == WT_LEN) {
            rd ob = f.sub;
            fld h;
            int64_t ver = 0;
            size_t dlen = 0;
            while ((rc = rd_next(d, &ob, &h, "OperatorSetId", err)) > 0) {
                if (h.num == 1 && h.wt == WT_LEN) dlen = (size_t)(h.sub.end - h.sub.p);
                if (h.num == 2 && h.wt == WT_VARINT) ver = (int64_t)h.v;
            }
            if (rc < 0) return rc;
            if (dlen == 0) d->opset = ver;
        }
    }
    if (rc < 0) return rc;
    if (!graphs) return mts_err_set(err, MTS_EFORMAT, "%s: no graph in the model", file);
    return MTS_OK;
}

void mts_onnx_doc_free(mts_onnx_doc *d)
{
    mts_pool_free(&d->pool);
    memset(d, 0, sizeof *d);
}

mts_onnx_node *mts_onnx_add_node(mts_onnx_doc *d, const char *op_type, const char *const *in, int n_in,
                                 const char *const *out, int n_out, int64_t axis)
{
    if (grow(d, (void **)&d->nodes, &d->cap_nodes, d->n_nodes + 1, sizeof(mts_onnx_node))) return NULL;
    mts_onnx_node *n = &d->nodes[d->n_nodes];
    memset(n, 0, sizeof *n);
    n->op_type = mts_onnx_str(d, op_type);
    n->domain = n->name = "";
    n->in = mts_pool_calloc(&d->pool, (size_t)n_in + 1, sizeof(char *));
    n->out = mts_pool_calloc(&d->pool, (size_t)n_out + 1, sizeof(char *));
    if (!n->op_type || !n->in || !n->out) return NULL;
    for (int i = 0; i < n_in; i++)
        if (!(n->in[i] = mts_onnx_str(d, in[i]))) return NULL;
    for (int i = 0; i < n_out; i++)
        if (!(n->out[i] = mts_onnx_str(d, out[i]))) return NULL;
    n->n_in = n_in;
    n->n_out = n_out;
    n->new_axis = axis;
    d->n_nodes++;
    return n;
}

mts_onnx_init *mts_onnx_add_init(mts_onnx_doc *d, const char *name, int dtype, int rank, const int64_t *dims,
                                 const void *data, size_t nbytes)
{
    if (rank > MTS_MAX_RANK || grow(d, (void **)&d->inits, &d->cap_inits, d->n_inits + 1, sizeof(mts_onnx_init)))
        return NULL;
    mts_onnx_init *t = &d->inits[d->n_inits];
    memset(t, 0, sizeof *t);
    void *copy = mts_pool_alloc(&d->pool, nbytes ? nbytes : 1);
    if (!(t->name = mts_onnx_str(d, name)) || !copy) return NULL;
    memcpy(copy, data, nbytes);
    t->dtype = dtype;
    t->rank = rank;
    for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
    t->data = copy;
    t->data_len = nbytes;
    d->n_inits++;
    return t;
}

int mts_onnx_add_output(mts_onnx_doc *d, const char *name)
{
    const char *s = mts_onnx_str(d, name);
    int n = d->n_outputs, cap = d->cap_outputs;
    if (!s || push_str(d, &d->outputs, &d->n_outputs, &d->cap_outputs, s)) return MTS_ENOMEM;
    int c2 = cap, c3 = cap;
    if (grow(d, (void **)&d->out_raw, &c2, d->n_outputs, sizeof(uint8_t *)) ||
        grow(d, (void **)&d->out_raw_len, &c3, d->n_outputs, sizeof(size_t)))
        return MTS_ENOMEM;
    d->out_raw[n] = NULL;
    d->out_raw_len[n] = 0;
    return MTS_OK;
}

float *mts_onnx_init_floats(const mts_onnx_init *t, int64_t *n)
{
    if (t->dtype != MTS_DTYPE_FLOAT || t->external) return NULL;
    int64_t ne = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->dims[i] < 0 || (t->dims[i] && ne > INT64_MAX / 4 / t->dims[i])) return NULL;
        ne *= t->dims[i];
    }
    const void *src = t->data ? t->data : t->float_data;
    size_t have = t->data ? t->data_len : t->float_data_len;
    if ((uint64_t)ne * 4 != have) return NULL;
    float *f = malloc(have ? have : 1);
    if (!f) return NULL;
    memcpy(f, src, have); /* little-endian host, as the engine assumes */
    *n = ne;
    return f;
}

const mts_onnx_attr *mts_onnx_attr_find(const mts_onnx_node *n, const char *name)
{
    for (int i = 0; i < n->n_attrs; i++)
        if (!strcmp(n->attrs[i].name, name)) return &n->attrs[i];
    return NULL;
}

/* ---- writing ---- */

static void put_sub(mts_pbw *w, uint32_t field, const mts_pbw *sub)
{
    mts_pbw_bytes(w, field, sub->p, sub->len);
}

/* Copies every field of the message raw[0..len) except those in skip (0-terminated). */
static int copy_fields(const mts_onnx_doc *d, mts_pbw *w, const uint8_t *raw, size_t len, const uint32_t *skip,
                       const char *what, mts_err *err)
{
    rd b = {raw, raw + len};
    fld f;
    int rc;
    while ((rc = rd_next(d, &b, &f, what, err)) > 0) {
        bool keep = true;
        for (const uint32_t *s = skip; *s; s++)
            if (f.num == *s) keep = false;
        if (keep) mts_pbw_raw(w, f.at, (size_t)(f.stop - f.at));
    }
    return rc;
}

static int write_node(const mts_onnx_doc *d, const mts_onnx_node *n, mts_pbw *w, mts_err *err)
{
    mts_pbw nb = {0};
    for (int i = 0; i < n->n_in; i++) mts_pbw_str(&nb, 1, n->in[i]);
    for (int i = 0; i < n->n_out; i++) mts_pbw_str(&nb, 2, n->out[i]);
    int rc = MTS_OK;
    if (n->raw) {
        static const uint32_t skip[] = {1, 2, 0};
        rc = copy_fields(d, &nb, n->raw, n->raw_len, skip, "NodeProto", err);
    } else {
        mts_pbw_str(&nb, 3, n->out[0]);
        mts_pbw_str(&nb, 4, n->op_type);
        if (n->new_axis != INT64_MIN) {
            mts_pbw ab = {0};
            mts_pbw_str(&ab, 1, "axis");
            mts_pbw_int(&ab, 3, n->new_axis);
            mts_pbw_int(&ab, 20, 2); /* INT */
            put_sub(&nb, 5, &ab);
            if (ab.oom) nb.oom = 1;
            mts_pbw_free(&ab);
        }
    }
    if (!rc) put_sub(w, 1, &nb);
    if (nb.oom) w->oom = 1;
    mts_pbw_free(&nb);
    return rc;
}

static void write_init(const mts_onnx_init *t, mts_pbw *w)
{
    if (t->raw) {
        mts_pbw_bytes(w, 5, t->raw, t->raw_len);
        return;
    }
    mts_pbw tb = {0};
    for (int i = 0; i < t->rank; i++) mts_pbw_int(&tb, 1, t->dims[i]);
    mts_pbw_int(&tb, 2, t->dtype);
    mts_pbw_str(&tb, 8, t->name);
    mts_pbw_bytes(&tb, 9, t->data, t->data_len);
    put_sub(w, 5, &tb);
    if (tb.oom) w->oom = 1;
    mts_pbw_free(&tb);
}

static void write_new_output(const char *name, mts_pbw *w)
{
    mts_pbw tt = {0}, ty = {0}, vi = {0};
    mts_pbw_int(&tt, 1, MTS_DTYPE_FLOAT);
    put_sub(&ty, 1, &tt);
    mts_pbw_str(&vi, 1, name);
    put_sub(&vi, 2, &ty);
    put_sub(w, 12, &vi);
    if (tt.oom || ty.oom || vi.oom) w->oom = 1;
    mts_pbw_free(&tt);
    mts_pbw_free(&ty);
    mts_pbw_free(&vi);
}

static int write_graph(const mts_onnx_doc *d, rd g, const int *order, int n_order, mts_pbw *w, mts_err *err)
{
    fld f;
    int rc;
    bool nodes_done = false, inits_done = false, outs_done = false;
    while ((rc = rd_next(d, &g, &f, "GraphProto", err)) > 0) {
        if (f.num == 1 && f.wt == WT_LEN) {
            if (nodes_done) continue;
            nodes_done = true;
            for (int i = 0; i < n_order; i++)
                if (!d->nodes[order[i]].dropped && (rc = write_node(d, &d->nodes[order[i]], w, err))) return rc;
        } else if (f.num == 5 && f.wt == WT_LEN) {
            if (inits_done) continue;
            inits_done = true;
            for (int i = 0; i < d->n_inits; i++)
                if (!d->inits[i].dropped) write_init(&d->inits[i], w);
        } else if (f.num == 12 && f.wt == WT_LEN) {
            if (outs_done) continue;
            outs_done = true;
            for (int i = 0; i < d->n_outputs; i++) {
                if (d->out_raw[i]) mts_pbw_bytes(w, 12, d->out_raw[i], d->out_raw_len[i]);
                else write_new_output(d->outputs[i], w);
            }
        } else {
            mts_pbw_raw(w, f.at, (size_t)(f.stop - f.at));
        }
    }
    if (rc < 0) return rc;
    if (!nodes_done)
        for (int i = 0; i < n_order; i++)
            if (!d->nodes[order[i]].dropped && (rc = write_node(d, &d->nodes[order[i]], w, err))) return rc;
    if (!inits_done)
        for (int i = 0; i < d->n_inits; i++)
            if (!d->inits[i].dropped) write_init(&d->inits[i], w);
    if (!outs_done)
        for (int i = 0; i < d->n_outputs; i++) write_new_output(d->outputs[i], w);
    return MTS_OK;
}

int mts_onnx_doc_write(const mts_onnx_doc *d, const int *order, int n_order, mts_pbw *out, mts_err *err)
{
    rd b = {d->bytes, d->bytes + d->len};
    fld f;
    int rc;
    for (int i = 0; i < n_order; i++)
        if (order[i] < 0 || order[i] >= d->n_nodes) return mts_err_set(err, MTS_EINVAL, "node order out of range");
    while ((rc = rd_next(d, &b, &f, "ModelProto", err)) > 0) {
        if (f.num == 7 && f.wt == WT_LEN) {
            mts_pbw gb = {0};
            rc = write_graph(d, f.sub, order, n_order, &gb, err);
            if (!rc) put_sub(out, 7, &gb);
            if (gb.oom) out->oom = 1;
            mts_pbw_free(&gb);
            if (rc) return rc;
        } else if (f.num == 8 && f.wt == WT_LEN && d->new_opset > d->opset) {
            /* the default domain's import gets the raised version; others are copied */
            rd ob = f.sub;
            fld h;
            bool dflt = true;
            while ((rc = rd_next(d, &ob, &h, "OperatorSetId", err)) > 0)
                if (h.num == 1 && h.wt == WT_LEN && h.sub.end > h.sub.p) dflt = false;
            if (rc < 0) return rc;
            if (!dflt) {
                mts_pbw_raw(out, f.at, (size_t)(f.stop - f.at));
                continue;
            }
            mts_pbw ob2 = {0};
            mts_pbw_str(&ob2, 1, "");
            mts_pbw_int(&ob2, 2, d->new_opset);
            put_sub(out, 8, &ob2);
            if (ob2.oom) out->oom = 1;
            mts_pbw_free(&ob2);
        } else {
            mts_pbw_raw(out, f.at, (size_t)(f.stop - f.at));
        }
    }
    if (rc < 0) return rc;
    if (out->oom) return mts_err_set(err, MTS_ENOMEM, "out of memory writing the model");
    return MTS_OK;
}
