/*
 * Sequence and optional values as byte blobs (engine/seqval.h): validation and element views,
 * sizing and writing, and the parser of SequenceProto / OptionalProto test data.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/seqval.h"

#define SEQ_MAGIC ((int64_t)0x3151455353544dLL) /* "MTSSEQ1" */
#define HDR_BYTES 24
#define ENT_WORDS (MTS_MAX_RANK + 3)
#define ENT_BYTES (ENT_WORDS * 8)
#define ALIGN 64

static int64_t align_up(int64_t x)
{
    return (x + ALIGN - 1) / ALIGN * ALIGN;
}

mts_dtype mts_seq_dtype(int kind)
{
    return kind == MTS_SEQ_SEQ ? MTS_DTYPE_SEQUENCE : MTS_DTYPE_OPTIONAL;
}

int mts_seq_view(const mts_tensor *t, mts_seqv *v, mts_err *err)
{
    if (!mts_dtype_is_seq(t->dtype))
        return mts_err_set(err, MTS_EINVAL, "expected a sequence or optional value, got a %s tensor",
                           mts_dtype_name(t->dtype));
    if (t->rank != 1 || !t->data || t->dims[0] < HDR_BYTES)
        return mts_err_set(err, MTS_EINVAL, "malformed %s value (no header)", mts_dtype_name(t->dtype));
    int64_t size = t->dims[0];
    const uint8_t *b = t->data;
    int64_t magic, count;
    int32_t kind, elem;
    memcpy(&magic, b, 8);
    memcpy(&kind, b + 8, 4);
    memcpy(&elem, b + 12, 4);
    memcpy(&count, b + 16, 8);
    if (magic != SEQ_MAGIC || kind < MTS_SEQ_SEQ || kind > MTS_SEQ_OPT_NONE || mts_seq_dtype(kind) != t->dtype)
        return mts_err_set(err, MTS_EINVAL, "malformed %s value (bad header)", mts_dtype_name(t->dtype));
    if (count < 0 || count > MTS_SEQ_MAX_ITEMS || (kind == MTS_SEQ_OPT_TENSOR && count != 1) ||
        (kind == MTS_SEQ_OPT_NONE && count != 0) || HDR_BYTES + count * ENT_BYTES > size)
        return mts_err_set(err, MTS_EINVAL, "malformed %s value (bad element count %lld)", mts_dtype_name(t->dtype),
                           (long long)count);
    if (count > 0 && (!mts_dtype_supported((mts_dtype)elem) || mts_dtype_is_seq((mts_dtype)elem)))
        return mts_err_set(err, MTS_EUNSUPPORTED, "sequence elements of type %s are not supported",
                           mts_dtype_name((mts_dtype)elem));
    int64_t data_start = align_up(HDR_BYTES + count * ENT_BYTES);
    for (int64_t i = 0; i < count; i++) {
        int64_t e[ENT_WORDS];
        memcpy(e, b + HDR_BYTES + i * ENT_BYTES, sizeof e);
        mts_tensor x = {(mts_dtype)elem, (int)e[0], {0}, NULL};
        if (e[0] < 0 || e[0] > MTS_MAX_RANK)
            return mts_err_set(err, MTS_EINVAL, "malformed sequence (element %lld has rank %lld)", (long long)i,
                               (long long)e[0]);
        memcpy(x.dims, e + 1, sizeof x.dims);
        int64_t nb = mts_tensor_nbytes(&x), off = e[1 + MTS_MAX_RANK];
        if (nb < 0 || nb != e[2 + MTS_MAX_RANK] || off < data_start || off % ALIGN || off > size || nb > size - off)
            return mts_err_set(err, MTS_EINVAL, "malformed sequence (element %lld out of bounds)", (long long)i);
    }
    v->kind = kind;
    v->elem = (mts_dtype)elem;
    v->count = count;
    v->base = b;
    return MTS_OK;
}

void mts_seq_item(const mts_seqv *v, int64_t i, mts_tensor *out)
{
    int64_t e[ENT_WORDS];
    memcpy(e, v->base + HDR_BYTES + i * ENT_BYTES, sizeof e);
    memset(out, 0, sizeof *out);
    out->dtype = v->elem;
    out->rank = (int)e[0];
    memcpy(out->dims, e + 1, sizeof out->dims);
    out->data = (void *)(v->base + e[1 + MTS_MAX_RANK]);
}

int64_t mts_seq_bytes(int64_t count, const mts_tensor *const *items)
{
    if (count < 0 || count > MTS_SEQ_MAX_ITEMS) return -1;
    int64_t n = align_up(HDR_BYTES + count * ENT_BYTES);
    for (int64_t i = 0; i < count; i++) {
        int64_t b = mts_tensor_nbytes(items[i]);
        if (b < 0 || b > INT64_MAX / 2 - n) return -1;
        n += align_up(b);
    }
    return n;
}

void mts_seq_write(void *dst, int kind, mts_dtype elem, int64_t count, const mts_tensor *const *items)
{
    uint8_t *b = dst;
    int64_t magic = SEQ_MAGIC;
    int32_t k32 = kind, e32 = (int32_t)elem;
    memcpy(b, &magic, 8);
    memcpy(b + 8, &k32, 4);
    memcpy(b + 12, &e32, 4);
    memcpy(b + 16, &count, 8);
    int64_t off = align_up(HDR_BYTES + count * ENT_BYTES);
    memset(b + HDR_BYTES, 0, (size_t)(off - HDR_BYTES));
    for (int64_t i = 0; i < count; i++) {
        int64_t e[ENT_WORDS] = {0};
        int64_t nb = mts_tensor_nbytes(items[i]);
        e[0] = items[i]->rank;
        for (int d = 0; d < items[i]->rank; d++) e[1 + d] = items[i]->dims[d];
        e[1 + MTS_MAX_RANK] = off;
        e[2 + MTS_MAX_RANK] = nb;
        memcpy(b + HDR_BYTES + i * ENT_BYTES, e, sizeof e);
        if (nb > 0 && items[i]->data) memmove(b + off, items[i]->data, (size_t)nb);
        if (align_up(nb) > nb) memset(b + off + nb, 0, (size_t)(align_up(nb) - nb));
        off += align_up(nb);
    }
}

/* ---- SequenceProto / OptionalProto ---- */

typedef struct rd {
    const uint8_t *p, *end;
} rd;

static int rd_varint(rd *r, uint64_t *v)
{
    *v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (r->p >= r->end) return -1;
        uint8_t c = *r->p++;
        *v |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) return 0;
    }
    return -1;
}

/* Next field: number, wire type, varint value or length-delimited bytes. 1: a field, 0: end,
 * -1: malformed. */
static int rd_field(rd *r, uint32_t *num, uint32_t *wt, uint64_t *val, const uint8_t **sub, size_t *sublen)
{
    if (r->p >= r->end) return 0;
    uint64_t key;
    if (rd_varint(r, &key)) return -1;
    *num = (uint32_t)(key >> 3);
    *wt = (uint32_t)(key & 7);
    switch (*wt) {
    case 0: return rd_varint(r, val) ? -1 : 1;
    case 1: if (r->end - r->p < 8) return -1; r->p += 8; return 1;
    case 5: if (r->end - r->p < 4) return -1; r->p += 4; return 1;
    case 2: {
        uint64_t n;
        if (rd_varint(r, &n) || n > (uint64_t)(r->end - r->p)) return -1;
        *sub = r->p;
        *sublen = (size_t)n;
        r->p += n;
        return 1;
    }
    default: return -1;
    }
}

bool mts_blob_op_accepts(const char *domain, const char *op_type, mts_dtype dt)
{
    static const char *const seq_ok[] = {"Identity", "If", "Loop", "ConcatFromSequence", "Optional",
                                         "OptionalHasElement", "OptionalGetElement"};
    static const char *const str_ok[] = {"Identity", "If", "Loop", "Cast", "CastLike", "StringNormalizer"};
    if (domain && domain[0]) return false;
    if (dt == MTS_DTYPE_STRINGS) {
        for (size_t i = 0; i < sizeof str_ok / sizeof str_ok[0]; i++)
            if (!strcmp(op_type, str_ok[i])) return true;
        return false;
    }
    if (!strncmp(op_type, "Sequence", 8)) return true;
    for (size_t i = 0; i < sizeof seq_ok / sizeof seq_ok[0]; i++)
        if (!strcmp(op_type, seq_ok[i])) return true;
    return false;
}

/* ---- string tensors ---- */

#define STR_MAGIC ((int64_t)0x3152545353544dLL) /* "MTSSTR1" */
#define STR_HDR ((3 + MTS_MAX_RANK) * 8)

int64_t mts_str_bytes(int64_t count, int64_t total)
{
    if (count < 0 || total < 0 || count > (INT64_MAX / 4) / 8 || total > INT64_MAX / 4) return -1;
    return STR_HDR + (count + 1) * 8 + total;
}

int mts_str_view(const mts_tensor *t, mts_strv *v, mts_err *err)
{
    if (t->dtype != MTS_DTYPE_STRINGS)
        return mts_err_set(err, MTS_EINVAL, "expected a string tensor, got %s", mts_dtype_name(t->dtype));
    if (t->rank != 1 || !t->data || t->dims[0] < STR_HDR + 8)
        return mts_err_set(err, MTS_EINVAL, "malformed string tensor (no header)");
    const uint8_t *b = t->data;
    int64_t size = t->dims[0], h[3 + MTS_MAX_RANK];
    memcpy(h, b, sizeof h);
    if (h[0] != STR_MAGIC || h[1] < 0 || h[1] > MTS_MAX_RANK)
        return mts_err_set(err, MTS_EINVAL, "malformed string tensor (bad header)");
    mts_tensor shp = {MTS_DTYPE_UINT8, (int)h[1], {0}, NULL};
    memcpy(shp.dims, h + 2, sizeof shp.dims);
    int64_t count = h[2 + MTS_MAX_RANK];
    if (mts_tensor_numel(&shp) != count || count < 0 || count > (size - STR_HDR) / 8 - 1)
        return mts_err_set(err, MTS_EINVAL, "malformed string tensor (count does not match the shape)");
    const uint8_t *offs = b + STR_HDR;
    int64_t avail = size - STR_HDR - (count + 1) * 8, prev = 0, o;
    for (int64_t i = 0; i <= count; i++) {
        memcpy(&o, offs + i * 8, 8);
        if ((i == 0 && o != 0) || o < prev || o > avail)
            return mts_err_set(err, MTS_EINVAL, "malformed string tensor (offset %lld out of order)", (long long)i);
        prev = o;
    }
    if (prev != avail) return mts_err_set(err, MTS_EINVAL, "malformed string tensor (length mismatch)");
    v->rank = shp.rank;
    memcpy(v->dims, shp.dims, sizeof v->dims);
    v->count = count;
    v->base = b;
    return MTS_OK;
}

const char *mts_str_at(const mts_strv *v, int64_t i, int64_t *len)
{
    int64_t a, z;
    const uint8_t *offs = v->base + STR_HDR;
    memcpy(&a, offs + i * 8, 8);
    memcpy(&z, offs + (i + 1) * 8, 8);
    *len = z - a;
    return (const char *)offs + (v->count + 1) * 8 + a;
}

void mts_str_begin(void *dst, int rank, const int64_t *dims, int64_t count)
{
    int64_t h[3 + MTS_MAX_RANK] = {0};
    h[0] = STR_MAGIC;
    h[1] = rank;
    for (int d = 0; d < rank; d++) h[2 + d] = dims[d];
    h[2 + MTS_MAX_RANK] = count;
    memcpy(dst, h, sizeof h);
    int64_t zero = 0;
    memcpy((uint8_t *)dst + STR_HDR, &zero, 8);
}

char *mts_str_put(void *dst, int64_t count, int64_t i, int64_t len)
{
    uint8_t *offs = (uint8_t *)dst + STR_HDR;
    int64_t a;
    memcpy(&a, offs + i * 8, 8);
    int64_t z = a + len;
    memcpy(offs + (i + 1) * 8, &z, 8);
    return (char *)offs + (count + 1) * 8 + a;
}

void mts_str_write(void *dst, int rank, const int64_t *dims, int64_t count, const char *const *s, const int64_t *len)
{
    mts_str_begin(dst, rank, dims, count);
    for (int64_t i = 0; i < count; i++) {
        char *p = mts_str_put(dst, count, i, len[i]);
        if (len[i] > 0) memcpy(p, s[i], (size_t)len[i]);
    }
}

/* TensorProto of strings: dims (1), data_type (2), string_data (6). */
int mts_str_parse_pb(const void *data, size_t len, mts_tensor *t, mts_err *err)
{
    const uint8_t *p = data;
    int rank = 0;
    int64_t dims[MTS_MAX_RANK] = {0}, count = 0, total = 0;
    uint64_t dtype = 0;
    for (int pass = 0; pass < 2; pass++) {
        rd r = {p, p + len};
        uint32_t num, wt;
        uint64_t val = 0;
        const uint8_t *sub = NULL;
        size_t sl = 0;
        int f;
        int64_t i = 0;
        while ((f = rd_field(&r, &num, &wt, &val, &sub, &sl)) > 0) {
            if (pass == 0 && num == 1 && wt == 0) {
                if (rank >= MTS_MAX_RANK || val > (uint64_t)INT64_MAX)
                    return mts_err_set(err, MTS_EUNSUPPORTED, "string tensor of rank above %d", MTS_MAX_RANK);
                dims[rank++] = (int64_t)val;
            } else if (pass == 0 && num == 1 && wt == 2) {
                rd q = {sub, sub + sl};
                while (q.p < q.end) {
                    if (rd_varint(&q, &val) || rank >= MTS_MAX_RANK || val > (uint64_t)INT64_MAX)
                        return mts_err_set(err, MTS_EFORMAT, "malformed dims in a string TensorProto");
                    dims[rank++] = (int64_t)val;
                }
            } else if (pass == 0 && num == 2 && wt == 0) {
                dtype = val;
            } else if (num == 6 && wt == 2) {
                if (pass == 0) {
                    count++;
                    total += (int64_t)sl;
                } else {
                    char *dst = mts_str_put(t->data, count, i++, (int64_t)sl);
                    if (sl) memcpy(dst, sub, sl);
                }
            } else if (pass == 0 && (num == 9 || num == 13 || num == 14)) {
                return mts_err_set(err, MTS_EUNSUPPORTED, "string tensor with raw or external data");
            }
        }
        if (f < 0) return mts_err_set(err, MTS_EFORMAT, "malformed string TensorProto at byte %zu", (size_t)(r.p - p));
        if (pass == 1) break;
        mts_tensor shp = {MTS_DTYPE_UINT8, rank, {0}, NULL};
        memcpy(shp.dims, dims, sizeof dims);
        if (dtype != MTS_DTYPE_STRING) return mts_err_set(err, MTS_EINVAL, "tensor is not of type string");
        if (mts_tensor_numel(&shp) != count)
            return mts_err_set(err, MTS_EFORMAT, "string tensor holds %lld strings, its shape %lld", (long long)count,
                               (long long)mts_tensor_numel(&shp));
        int64_t nb = mts_str_bytes(count, total);
        if (nb < 0) return mts_err_set(err, MTS_ELIMIT, "string tensor too large");
        memset(t, 0, sizeof *t);
        t->dtype = MTS_DTYPE_STRINGS;
        t->rank = 1;
        t->dims[0] = nb;
        if (!(t->data = malloc((size_t)nb))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        mts_str_begin(t->data, rank, dims, count);
    }
    return MTS_OK;
}

typedef struct parsed {
    int kind;
    mts_dtype elem;
    int64_t n;
    mts_tensor *items;
} parsed;

static void parsed_free(parsed *q)
{
    for (int64_t i = 0; i < q->n; i++) free(q->items[i].data);
    free(q->items);
    q->items = NULL;
    q->n = 0;
}

static int add_tensor(parsed *q, const uint8_t *p, size_t len, mts_err *err)
{
    if (q->n >= MTS_SEQ_MAX_ITEMS)
        return mts_err_set(err, MTS_ELIMIT, "sequence has more than %d elements", MTS_SEQ_MAX_ITEMS);
    mts_tensor *t = realloc(q->items, sizeof *t * (size_t)(q->n + 1));
    if (!t) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    q->items = t;
    int rc = mts_tensor_parse_pb(p, len, &q->items[q->n], NULL, err);
    if (rc) return rc;
    if (q->n > 0 && q->items[q->n].dtype != q->items[0].dtype) {
        free(q->items[q->n].data);
        return mts_err_set(err, MTS_EINVAL, "sequence element %lld has type %s, element 0 %s", (long long)q->n,
                           mts_dtype_name(q->items[q->n].dtype), mts_dtype_name(q->items[0].dtype));
    }
    q->elem = q->items[0].dtype;
    q->n++;
    return MTS_OK;
}

/* A SequenceProto of tensors into q (kind SEQ). */
static int parse_seq(const uint8_t *p, size_t len, parsed *q, mts_err *err)
{
    rd r = {p, p + len};
    uint32_t num, wt;
    uint64_t val = 0;
    const uint8_t *sub = NULL;
    size_t sl = 0;
    int f, rc;
    while ((f = rd_field(&r, &num, &wt, &val, &sub, &sl)) > 0) {
        if (num == 2 && wt == 0 && val != 0 && val != 1)
            return mts_err_set(err, MTS_EUNSUPPORTED, "SequenceProto elem_type %llu (only tensors are supported)",
                               (unsigned long long)val);
        if (num >= 4 && num <= 7 && wt == 2)
            return mts_err_set(err, MTS_EUNSUPPORTED, "SequenceProto field %u (only sequences of tensors are "
                               "supported)", num);
        if (num == 3 && wt == 2 && (rc = add_tensor(q, sub, sl, err))) return rc;
    }
    if (f < 0) return mts_err_set(err, MTS_EFORMAT, "malformed SequenceProto at byte %zu", (size_t)(r.p - p));
    q->kind = MTS_SEQ_SEQ;
    return MTS_OK;
}

static int parse_opt(const uint8_t *p, size_t len, parsed *q, mts_err *err)
{
    rd r = {p, p + len};
    uint32_t num, wt;
    uint64_t val = 0;
    const uint8_t *sub = NULL;
    size_t sl = 0;
    int f, rc;
    q->kind = MTS_SEQ_OPT_NONE;
    while ((f = rd_field(&r, &num, &wt, &val, &sub, &sl)) > 0) {
        if (num == 2 && wt == 0 && val != 0 && val != 1 && val != 3)
            return mts_err_set(err, MTS_EUNSUPPORTED, "OptionalProto elem_type %llu (only tensors and sequences are "
                               "supported)", (unsigned long long)val);
        if ((num == 4 || num == 6 || num == 7) && wt == 2)
            return mts_err_set(err, MTS_EUNSUPPORTED, "OptionalProto field %u is not supported", num);
        if (num == 3 && wt == 2) {
            if (q->kind != MTS_SEQ_OPT_NONE) return mts_err_set(err, MTS_EFORMAT, "OptionalProto holds two values");
            if ((rc = add_tensor(q, sub, sl, err))) return rc;
            q->kind = MTS_SEQ_OPT_TENSOR;
        }
        if (num == 5 && wt == 2) {
            if (q->kind != MTS_SEQ_OPT_NONE) return mts_err_set(err, MTS_EFORMAT, "OptionalProto holds two values");
            if ((rc = parse_seq(sub, sl, q, err))) return rc;
            q->kind = MTS_SEQ_OPT_SEQ;
        }
    }
    if (f < 0) return mts_err_set(err, MTS_EFORMAT, "malformed OptionalProto at byte %zu", (size_t)(r.p - p));
    return MTS_OK;
}

int mts_seq_parse_pb(const void *data, size_t len, mts_dtype declared, mts_tensor *t, mts_err *err)
{
    parsed q = {0};
    int rc;
    if (declared == MTS_DTYPE_SEQUENCE) rc = parse_seq(data, len, &q, err);
    else if (declared == MTS_DTYPE_OPTIONAL) rc = parse_opt(data, len, &q, err);
    else rc = mts_err_set(err, MTS_EINVAL, "type %s is not a sequence or optional", mts_dtype_name(declared));
    const mts_tensor **items = rc ? NULL : calloc((size_t)q.n + 1, sizeof *items);
    if (!rc && !items) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
    for (int64_t i = 0; !rc && i < q.n; i++) items[i] = &q.items[i];
    int64_t nb = rc ? 0 : mts_seq_bytes(q.n, items);
    if (!rc && nb < 0) rc = mts_err_set(err, MTS_ELIMIT, "sequence too large");
    if (!rc) {
        memset(t, 0, sizeof *t);
        t->dtype = mts_seq_dtype(q.kind);
        t->rank = 1;
        t->dims[0] = nb;
        t->data = malloc((size_t)nb);
        if (!t->data) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        else mts_seq_write(t->data, q.kind, q.elem, q.n, items);
    }
    free(items);
    parsed_free(&q);
    return rc;
}
