/*
 * ONNX protobuf wire-format parsing, straight from the mmap'd file.
 *
 * We walk the wire format ourselves instead of unpacking a ModelProto with a generated parser:
 * a generated parser copies every `bytes` field, duplicating all weights, whereas here a
 * TensorProto's raw_data stays a pointer into the mapping (copied only when misaligned). Every
 * length is checked against the enclosing message before use, so truncated or hostile files
 * produce an error naming the message and byte offset, never an out-of-bounds read; every
 * allocation is bounded by bytes actually present in the file.
 *
 * Messages read (field numbers from onnx.proto):
 *   ModelProto      ir_version=1 producer_name=2 graph=7 opset_import=8
 *   OperatorSetId   domain=1 version=2
 *   GraphProto      node=1 initializer=5 input=11 output=12 value_info=13 sparse_initializer=15
 *   NodeProto       input=1 output=2 name=3 op_type=4 attribute=5 domain=7
 *   AttributeProto  name=1 f=2 i=3 s=4 t=5 g=6 floats=7 ints=8 strings=9 tensors=10 graphs=11
 *                   type=20 ref_attr_name=21
 *   ValueInfoProto  name=1 type=2; TypeProto tensor_type=1; Tensor elem_type=1 shape=2;
 *                   TensorShapeProto dim=1; Dimension dim_value=1 dim_param=2
 *   TensorProto     dims=1 data_type=2 segment=3 float_data=4 int32_data=5 string_data=6
 *                   int64_data=7 name=8 raw_data=9 double_data=10 uint64_data=11
 *                   external_data=13 data_location=14
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model.h"
#include "engine/seqval.h"
#include "engine/weights.h"

typedef struct pb {
    const uint8_t *p, *end;
} pb;

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

typedef struct pb_field {
    uint32_t num, wt;
    uint64_t v;        /* varint / fixed value */
    pb sub;            /* LEN payload */
    const uint8_t *at; /* start of the field (for messages) */
} pb_field;

static size_t off_of(const mts__pb_src *s, const uint8_t *p)
{
    return (size_t)(p - s->base);
}

static int pb_varint(pb *b, uint64_t *v)
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

/* Reads the next field of b. Returns 1 when one was read, 0 at the end, negative on error
 * (message set). `what` names the enclosing message for errors. */
static int pb_next(const mts__pb_src *s, pb *b, pb_field *f, const char *what, mts_err *err)
{
    if (b->p >= b->end) return 0;
    f->at = b->p;
    uint64_t key;
    if (pb_varint(b, &key))
        return mts_err_set(err, MTS_EFORMAT, "%s: truncated field key in %s at byte %zu", s->file, what,
                           off_of(s, f->at));
    f->num = (uint32_t)(key >> 3);
    f->wt = (uint32_t)(key & 7);
    if (f->num == 0)
        return mts_err_set(err, MTS_EFORMAT, "%s: invalid field number 0 in %s at byte %zu", s->file, what,
                           off_of(s, f->at));
    switch (f->wt) {
    case WT_VARINT:
        if (pb_varint(b, &f->v))
            return mts_err_set(err, MTS_EFORMAT, "%s: truncated varint (field %u) in %s at byte %zu", s->file,
                               f->num, what, off_of(s, f->at));
        return 1;
    case WT_I64:
        if (b->end - b->p < 8)
            return mts_err_set(err, MTS_EFORMAT, "%s: truncated 64-bit field %u in %s at byte %zu", s->file,
                               f->num, what, off_of(s, f->at));
        memcpy(&f->v, b->p, 8);
        b->p += 8;
        return 1;
    case WT_I32: {
        if (b->end - b->p < 4)
            return mts_err_set(err, MTS_EFORMAT, "%s: truncated 32-bit field %u in %s at byte %zu", s->file,
                               f->num, what, off_of(s, f->at));
        uint32_t v;
        memcpy(&v, b->p, 4);
        f->v = v;
        b->p += 4;
        return 1;
    }
    case WT_LEN: {
        uint64_t len;
        if (pb_varint(b, &len))
            return mts_err_set(err, MTS_EFORMAT, "%s: truncated length (field %u) in %s at byte %zu", s->file,
                               f->num, what, off_of(s, f->at));
        if (len > (uint64_t)(b->end - b->p))
            return mts_err_set(err, MTS_EFORMAT,
                               "%s: field %u of %s at byte %zu claims %llu bytes but only %zu remain "
                               "(truncated or corrupt file)",
                               s->file, f->num, what, off_of(s, f->at), (unsigned long long)len,
                               (size_t)(b->end - b->p));
        f->sub.p = b->p;
        f->sub.end = b->p + len;
        b->p += len;
        return 1;
    }
    default:
        return mts_err_set(err, MTS_EFORMAT, "%s: unsupported wire type %u (field %u) in %s at byte %zu",
                           s->file, f->wt, f->num, what, off_of(s, f->at));
    }
}

static int want_wt(const mts__pb_src *s, const pb_field *f, uint32_t wt, const char *what, mts_err *err)
{
    if (f->wt == wt) return 0;
    return mts_err_set(err, MTS_EFORMAT, "%s: field %u of %s at byte %zu has wire type %u, expected %u", s->file,
                       f->num, what, off_of(s, f->at), f->wt, wt);
}

static char *pool_str(mts_pool *pool, const pb *sub)
{
    return mts_pool_strndup(pool, (const char *)sub->p, (size_t)(sub->end - sub->p));
}

/* ---- repeated numeric fields (packed or not) ---- */

/* Counts elements of a repeated varint field occurrence (packed LEN or single varint). */
static int count_varints(const pb_field *f, int64_t *n)
{
    if (f->wt == WT_VARINT) {
        (*n)++;
        return 0;
    }
    if (f->wt != WT_LEN) return -1;
    pb b = f->sub;
    uint64_t v;
    while (b.p < b.end) {
        if (pb_varint(&b, &v)) return -1;
        (*n)++;
    }
    return 0;
}

static int count_fixed(const pb_field *f, uint32_t single_wt, size_t width, int64_t *n)
{
    if (f->wt == single_wt) {
        (*n)++;
        return 0;
    }
    if (f->wt != WT_LEN || (size_t)(f->sub.end - f->sub.p) % width) return -1;
    *n += (int64_t)((size_t)(f->sub.end - f->sub.p) / width);
    return 0;
}

/* Appends the values of a repeated varint field occurrence to out[*i...] (bounded by cap). */
static void read_varints(const pb_field *f, int64_t *out, int64_t *i, int64_t cap)
{
    if (f->wt == WT_VARINT) {
        if (*i < cap) out[(*i)++] = (int64_t)f->v;
        return;
    }
    pb b = f->sub;
    uint64_t v;
    while (b.p < b.end && *i < cap && !pb_varint(&b, &v)) out[(*i)++] = (int64_t)v;
}

/* ---- TensorProto ---- */

static int map_external(const mts__pb_src *s, const char *location, const uint8_t **base, size_t *len,
                        mts_err *err)
{
    mts_model *m = s->model;
    if (!m || !s->dir)
        return mts_err_set(err, MTS_EUNSUPPORTED, "%s: external data '%s' needs a model file on disk", s->file,
                           location);
    for (int i = 0; i < m->n_maps; i++)
        if (strcmp(m->maps[i].location, location) == 0) {
            *base = m->maps[i].addr;
            *len = m->maps[i].len;
            return MTS_OK;
        }
    if (location[0] == '/' || strstr(location, ".."))
        return mts_err_set(err, MTS_EFORMAT,
                           "%s: external data location '%s' must be a relative path inside the model's folder",
                           s->file, location);
    if (m->n_maps >= 64)
        return mts_err_set(err, MTS_ELIMIT, "%s: more than 64 external data files", s->file);
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", s->dir, location) >= (int)sizeof path)
        return mts_err_set(err, MTS_EINVAL, "%s: external data path too long", s->file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mts_err_set(err, MTS_EIO, "%s: cannot open external data %s: %s", s->file, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return mts_err_set(err, MTS_EIO, "%s: external data %s is not a regular file", s->file, path);
    }
    void *addr = NULL;
    if (st.st_size > 0) {
        addr = mts__map_file(fd, (size_t)st.st_size);
        if (!addr) {
            int e = errno;
            close(fd);
            return mts_err_set(err, MTS_EIO, "%s: cannot map %s: %s", s->file, path, strerror(e));
        }
    }
    close(fd);
    mts__mapping *maps = realloc(m->maps, sizeof *maps * (size_t)(m->n_maps + 1));
    if (!maps) {
        mts__unmap_file(addr, (size_t)st.st_size);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    m->maps = maps;
    maps[m->n_maps].location = strdup(location);
    maps[m->n_maps].addr = addr;
    maps[m->n_maps].len = (size_t)st.st_size;
    m->n_maps++;
    *base = addr;
    *len = (size_t)st.st_size;
    return MTS_OK;
}

int mts__parse_tensor(const mts__pb_src *s, const uint8_t *p, size_t len, mts_pool *pool, mts_tensor *t,
                      const char **name_out, mts_err *err)
{
    pb b = {p, p + len};
    pb_field f;
    int rc;
    const char *what = "TensorProto";
    int64_t dims[MTS_MAX_RANK];
    int64_t n_dims = 0, n_typed = 0;
    uint64_t dtype = 0, location = 0;
    const uint8_t *raw = NULL;
    size_t raw_len = 0;
    bool has_raw = false;
    const char *name = "";
    const char *ext_loc = NULL;
    int64_t ext_off = 0, ext_len = -1;
    uint32_t typed_field = 0;

    memset(t, 0, sizeof *t);
    /* Pass 1: dims, type, name, raw_data, external data, and element counts of typed fields. */
    while ((rc = pb_next(s, &b, &f, what, err)) > 0) {
        switch (f.num) {
        case 1: {
            int64_t before = n_dims, cnt = 0;
            if (count_varints(&f, &cnt))
                return mts_err_set(err, MTS_EFORMAT, "%s: bad dims in TensorProto at byte %zu", s->file,
                                   off_of(s, f.at));
            if (before + cnt > MTS_MAX_RANK)
                return mts_err_set(err, MTS_EUNSUPPORTED, "%s: tensor at byte %zu has more than %d dims", s->file,
                                   off_of(s, f.at), MTS_MAX_RANK);
            read_varints(&f, dims, &n_dims, MTS_MAX_RANK);
            break;
        }
        case 2:
            if ((rc = want_wt(s, &f, WT_VARINT, what, err))) return rc;
            dtype = f.v;
            break;
        case 3:
            return mts_err_set(err, MTS_EUNSUPPORTED, "%s: segmented tensors are not supported (byte %zu)", s->file,
                               off_of(s, f.at));
        case 8:
            if ((rc = want_wt(s, &f, WT_LEN, what, err))) return rc;
            if (!(name = pool_str(pool, &f.sub))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
            break;
        case 9:
            if ((rc = want_wt(s, &f, WT_LEN, what, err))) return rc;
            raw = f.sub.p;
            raw_len = (size_t)(f.sub.end - f.sub.p);
            has_raw = true;
            break;
        case 4: case 10:
            if (count_fixed(&f, f.num == 4 ? WT_I32 : WT_I64, f.num == 4 ? 4 : 8, &n_typed))
                return mts_err_set(err, MTS_EFORMAT, "%s: bad packed field %u in TensorProto at byte %zu", s->file,
                                   f.num, off_of(s, f.at));
            typed_field = f.num;
            break;
        case 5: case 7: case 11:
            if (count_varints(&f, &n_typed))
                return mts_err_set(err, MTS_EFORMAT, "%s: bad packed field %u in TensorProto at byte %zu", s->file,
                                   f.num, off_of(s, f.at));
            typed_field = f.num;
            break;
        case 6:
            typed_field = 6;
            n_typed++;
            break;
        case 13: {
            if ((rc = want_wt(s, &f, WT_LEN, what, err))) return rc;
            pb e = f.sub;
            pb_field g;
            const char *key = NULL, *val = NULL;
            while ((rc = pb_next(s, &e, &g, "StringStringEntryProto", err)) > 0) {
                if (g.wt != WT_LEN) continue;
                char *str = pool_str(pool, &g.sub);
                if (!str) return mts_err_set(err, MTS_ENOMEM, "out of memory");
                if (g.num == 1) key = str;
                else if (g.num == 2) val = str;
            }
            if (rc < 0) return rc;
            if (!key || !val) break;
            if (strcmp(key, "location") == 0) ext_loc = val;
            else if (strcmp(key, "offset") == 0) ext_off = strtoll(val, NULL, 10);
            else if (strcmp(key, "length") == 0) ext_len = strtoll(val, NULL, 10);
            break;
        }
        case 14:
            if ((rc = want_wt(s, &f, WT_VARINT, what, err))) return rc;
            location = f.v;
            break;
        default:
            break; /* doc_string and unknown fields are skipped */
        }
    }
    if (rc < 0) return rc;
    if (name_out) *name_out = name;

    t->dtype = (mts_dtype)dtype;
    t->rank = (int)n_dims;
    for (int i = 0; i < t->rank; i++) {
        if (dims[i] < 0)
            return mts_err_set(err, MTS_EFORMAT, "%s: tensor '%s' has negative dimension %lld", s->file, name,
                               (long long)dims[i]);
        t->dims[i] = dims[i];
    }
    if (!mts_dtype_supported(t->dtype) || mts_dtype_is_blob(t->dtype))
        return mts_err_set(err, MTS_EUNSUPPORTED, "%s: tensor '%s' has element type %s, which mtserve does not support",
                           s->file, name, mts_dtype_name(t->dtype));
    int64_t numel = mts_tensor_numel(t), nbytes = mts_tensor_nbytes(t);
    char shp[128];
    if (numel < 0 || nbytes < 0)
        return mts_err_set(err, MTS_EFORMAT, "%s: tensor '%s' shape %s overflows", s->file, name,
                           mts_shape_str(t, shp, sizeof shp));
    size_t es = mts_dtype_size(t->dtype);

    if (location == 1 || ext_loc) {
        if (!ext_loc)
            return mts_err_set(err, MTS_EFORMAT, "%s: tensor '%s' is marked external but has no location", s->file,
                               name);
        const uint8_t *base;
        size_t flen;
        if ((rc = map_external(s, ext_loc, &base, &flen, err))) return rc;
        if (ext_len < 0) ext_len = (int64_t)flen - ext_off;
        if (ext_off < 0 || ext_off > (int64_t)flen || ext_len > (int64_t)flen - ext_off)
            return mts_err_set(err, MTS_EFORMAT,
                               "%s: tensor '%s': external range offset %lld length %lld is outside %s (%zu bytes)",
                               s->file, name, (long long)ext_off, (long long)ext_len, ext_loc, flen);
        raw = base + ext_off;
        raw_len = (size_t)ext_len;
        has_raw = true;
    }
    if (has_raw) {
        if ((int64_t)raw_len != nbytes)
            return mts_err_set(err, MTS_EFORMAT, "%s: tensor '%s' has %zu bytes of data, expected %lld for %s %s",
                               s->file, name, raw_len, (long long)nbytes, mts_dtype_name(t->dtype),
                               mts_shape_str(t, shp, sizeof shp));
        /* Kernels read elements through typed pointers, so a misaligned view would be
         * undefined behaviour: those tensors are copied. Stand-alone tensors (no model) are
         * copied by the caller anyway. */
        if (((uintptr_t)raw % es) == 0) {
            t->data = (void *)raw; /* zero-copy view of the mapping */
            if (s->model) s->model->mapped_bytes += (int64_t)raw_len;
        } else if (s->model) {
            /* Tracked, so that a copy of weights packed for oneDNN can be dropped and remade from
             * the mapping when needed again (mts__release_weights). */
            mts__copy *c = mts__add_copy(s->model, raw, raw_len);
            if (!c) return mts_err_set(err, MTS_ENOMEM, "out of memory copying tensor '%s'", name);
            t->data = c->data;
        } else {
            void *copy = mts_pool_alloc(pool, raw_len ? raw_len : 1);
            if (!copy) return mts_err_set(err, MTS_ENOMEM, "out of memory copying tensor '%s'", name);
            if (raw_len) memcpy(copy, raw, raw_len);
            t->data = copy;
        }
        return MTS_OK;
    }
    if (typed_field == 6)
        return mts_err_set(err, MTS_EUNSUPPORTED, "%s: tensor '%s' holds strings", s->file, name);
    if (n_typed != numel)
        return mts_err_set(err, MTS_EFORMAT, "%s: tensor '%s' has %lld elements of data, expected %lld for %s",
                           s->file, name, (long long)n_typed, (long long)numel, mts_shape_str(t, shp, sizeof shp));
    void *data = mts_pool_alloc(pool, nbytes ? (size_t)nbytes : 1);
    if (!data) return mts_err_set(err, MTS_ENOMEM, "out of memory for tensor '%s'", name);
    t->data = data;
    if (numel == 0) return MTS_OK;
    /* Pass 2: decode typed fields into the buffer. */
    b.p = p;
    int64_t idx = 0;
    while ((rc = pb_next(s, &b, &f, what, err)) > 0) {
        if ((f.num == 4 && t->dtype == MTS_DTYPE_FLOAT) || (f.num == 10 && t->dtype == MTS_DTYPE_DOUBLE)) {
            size_t w = f.num == 4 ? 4 : 8; /* float_data / double_data: little-endian fixed width */
            if (f.wt == WT_I32 || f.wt == WT_I64) {
                uint32_t v32 = (uint32_t)f.v;
                uint64_t v64 = (uint64_t)f.v;
                if (idx < numel) memcpy((char *)data + w * (size_t)idx++, w == 4 ? (void *)&v32 : (void *)&v64, w);
            } else {
                size_t cnt = (size_t)(f.sub.end - f.sub.p) / w;
                if ((int64_t)cnt > numel - idx) cnt = (size_t)(numel - idx);
                memcpy((char *)data + w * (size_t)idx, f.sub.p, cnt * w);
                idx += (int64_t)cnt;
            }
        } else if (f.num == 5 || f.num == 7 || f.num == 11) {
            int64_t tmp[64];
            pb_field g = f;
            /* decode in chunks to stay allocation-free */
            if (g.wt == WT_VARINT) {
                tmp[0] = (int64_t)g.v;
                if (idx < numel) {
                    int64_t v = tmp[0];
                    switch (es) {
                    case 1: ((uint8_t *)data)[idx] = (uint8_t)v; break;
                    case 2: ((uint16_t *)data)[idx] = (uint16_t)v; break;
                    case 4: ((int32_t *)data)[idx] = (int32_t)v; break;
                    case 8: ((int64_t *)data)[idx] = v; break;
                    default: break;
                    }
                    idx++;
                }
                continue;
            }
            pb sb = g.sub;
            uint64_t v;
            while (sb.p < sb.end && idx < numel && !pb_varint(&sb, &v)) {
                switch (es) {
                case 1: ((uint8_t *)data)[idx] = (uint8_t)v; break;
                case 2: ((uint16_t *)data)[idx] = (uint16_t)v; break; /* int16/uint16, float16/bfloat16 bits */
                case 4:
                    if (t->dtype == MTS_DTYPE_FLOAT) {
                        uint32_t u = (uint32_t)v;
                        memcpy((float *)data + idx, &u, 4);
                    } else {
                        ((int32_t *)data)[idx] = (int32_t)v;
                    }
                    break;
                case 8: ((int64_t *)data)[idx] = (int64_t)v; break;
                default: break;
                }
                idx++;
            }
        } else if (f.num == 4 || f.num == 10) {
            return mts_err_set(err, MTS_EFORMAT, "%s: tensor '%s' of type %s stores data in field %u", s->file, name,
                               mts_dtype_name(t->dtype), f.num);
        }
    }
    if (rc < 0) return rc;
    return MTS_OK;
}

/* ---- ValueInfoProto ---- */

static int parse_value_info(const mts__pb_src *s, pb b, mts_pool *pool, mts_value *v, mts_err *err)
{
    pb_field f;
    int rc;
    v->rank = -1;
    v->name = "";
    while ((rc = pb_next(s, &b, &f, "ValueInfoProto", err)) > 0) {
        if (f.num == 1 && f.wt == WT_LEN) {
            if (!(v->name = pool_str(pool, &f.sub))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        } else if (f.num == 2 && f.wt == WT_LEN) {
            pb tb = f.sub;
            pb_field g;
            while ((rc = pb_next(s, &tb, &g, "TypeProto", err)) > 0) {
                if (g.num != 1) {
                    /* sequence and optional values are blobs (engine/seqval.h); map/sparse: declined */
                    if (g.wt == WT_LEN && g.num == 4) v->dtype = MTS_DTYPE_SEQUENCE;
                    else if (g.wt == WT_LEN && g.num == 9) v->dtype = MTS_DTYPE_OPTIONAL;
                    else if (g.wt == WT_LEN && (g.num == 5 || g.num == 8)) v->dtype = (mts_dtype)-1;
                    continue;
                }
                if (g.wt != WT_LEN) continue;
                pb tt = g.sub;
                pb_field h;
                while ((rc = pb_next(s, &tt, &h, "TypeProto.Tensor", err)) > 0) {
                    if (h.num == 1 && h.wt == WT_VARINT)
                        v->dtype = h.v == MTS_DTYPE_STRING ? MTS_DTYPE_STRINGS : (mts_dtype)h.v; /* strings: blobs */
                    if (h.num == 2 && h.wt == WT_LEN) {
                        pb sh = h.sub;
                        pb_field d;
                        v->rank = 0;
                        while ((rc = pb_next(s, &sh, &d, "TensorShapeProto", err)) > 0) {
                            if (d.num != 1 || d.wt != WT_LEN) continue;
                            if (v->rank >= MTS_MAX_RANK)
                                return mts_err_set(err, MTS_EUNSUPPORTED, "%s: value '%s' has rank above %d", s->file,
                                                   v->name, MTS_MAX_RANK);
                            int r = v->rank++;
                            v->dims[r] = -1;
                            pb db = d.sub;
                            pb_field e;
                            while ((rc = pb_next(s, &db, &e, "Dimension", err)) > 0) {
                                if (e.num == 1 && e.wt == WT_VARINT) v->dims[r] = (int64_t)e.v;
                                if (e.num == 2 && e.wt == WT_LEN &&
                                    !(v->dim_params[r] = pool_str(pool, &e.sub)))
                                    return mts_err_set(err, MTS_ENOMEM, "out of memory");
                            }
                            if (rc < 0) return rc;
                        }
                        if (rc < 0) return rc;
                    }
                }
                if (rc < 0) return rc;
            }
            if (rc < 0) return rc;
        }
    }
    return rc;
}

/* ---- AttributeProto ---- */

/* A GRAPH attribute's GraphProto is returned in *graph (parsed later, once the enclosing graph's
 * names are known, so that the subgraph can resolve outer-scope references). */
static int parse_attr(const mts__pb_src *s, pb b, mts_pool *pool, const char *node, mts_attr *a, pb *graph,
                      mts_err *err)
{
    pb_field f;
    int rc;
    pb start = b;
    int64_t n_floats = 0, n_ints = 0, n_strings = 0;
    int seen_type = 0;
    a->name = "";
    while ((rc = pb_next(s, &b, &f, "AttributeProto", err)) > 0) {
        switch (f.num) {
        case 1:
            if (f.wt == WT_LEN && !(a->name = pool_str(pool, &f.sub)))
                return mts_err_set(err, MTS_ENOMEM, "out of memory");
            break;
        case 2: if (f.wt == WT_I32) { uint32_t u = (uint32_t)f.v; memcpy(&a->f, &u, 4); seen_type = seen_type ? seen_type : MTS_ATTR_FLOAT; } break;
        case 3: if (f.wt == WT_VARINT) { a->i = (int64_t)f.v; seen_type = seen_type ? seen_type : MTS_ATTR_INT; } break;
        case 4:
            if (f.wt == WT_LEN) {
                if (!(a->s = pool_str(pool, &f.sub))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
                seen_type = MTS_ATTR_STRING;
            }
            break;
        case 5:
            if (f.wt == WT_LEN) {
                mts_tensor *t = mts_pool_alloc(pool, sizeof *t);
                if (!t) return mts_err_set(err, MTS_ENOMEM, "out of memory");
                if ((rc = mts__parse_tensor(s, f.sub.p, (size_t)(f.sub.end - f.sub.p), pool, t, NULL, err)))
                    return rc;
                a->t = t;
                seen_type = MTS_ATTR_TENSOR;
            }
            break;
        case 6:
            if ((rc = want_wt(s, &f, WT_LEN, "AttributeProto", err))) return rc;
            *graph = f.sub;
            seen_type = MTS_ATTR_GRAPH;
            break;
        case 11:
            return mts_err_set(err, MTS_EUNSUPPORTED, "%s: node '%s': GRAPHS (list of graphs) attributes are not supported",
                               s->file, node);
        case 7:
            if (count_fixed(&f, WT_I32, 4, &n_floats))
                return mts_err_set(err, MTS_EFORMAT, "%s: node '%s': bad floats attribute at byte %zu", s->file, node,
                                   off_of(s, f.at));
            seen_type = MTS_ATTR_FLOATS;
            break;
        case 8:
            if (count_varints(&f, &n_ints))
                return mts_err_set(err, MTS_EFORMAT, "%s: node '%s': bad ints attribute at byte %zu", s->file, node,
                                   off_of(s, f.at));
            seen_type = MTS_ATTR_INTS;
            break;
        case 9:
            if (f.wt == WT_LEN) n_strings++;
            seen_type = MTS_ATTR_STRINGS;
            break;
        case 10: seen_type = 9; break; /* TENSORS */
        case 20: if (f.wt == WT_VARINT) a->type = (mts_attr_type)f.v; break;
        case 21:
            return mts_err_set(err, MTS_EUNSUPPORTED, "%s: node '%s': attribute references (ref_attr_name) are not supported",
                               s->file, node);
        default: break;
        }
    }
    if (rc < 0) return rc;
    if (a->type == MTS_ATTR_UNDEFINED) a->type = (mts_attr_type)seen_type;
    /* declared a string without one (field 4 absent, or its value sent in another field):
     * the empty string, so that readers of a STRING attribute always get a string */
    if (a->type == MTS_ATTR_STRING && !a->s) a->s = "";
    if (n_floats > 0 || a->type == MTS_ATTR_FLOATS) {
        float *fl = mts_pool_calloc(pool, (size_t)(n_floats ? n_floats : 1), sizeof(float));
        if (!fl) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        int64_t i = 0;
        b = start;
        while ((rc = pb_next(s, &b, &f, "AttributeProto", err)) > 0) {
            if (f.num != 7) continue;
            if (f.wt == WT_I32) {
                uint32_t u = (uint32_t)f.v;
                if (i < n_floats) memcpy(&fl[i++], &u, 4);
            } else {
                size_t cnt = (size_t)(f.sub.end - f.sub.p) / 4;
                if ((int64_t)cnt > n_floats - i) cnt = (size_t)(n_floats - i);
                memcpy(&fl[i], f.sub.p, cnt * 4);
                i += (int64_t)cnt;
            }
        }
        a->floats = fl;
        a->n = (int)n_floats;
    }
    if (n_ints > 0 || a->type == MTS_ATTR_INTS) {
        int64_t *iv = mts_pool_calloc(pool, (size_t)(n_ints ? n_ints : 1), sizeof(int64_t));
        if (!iv) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        int64_t i = 0;
        b = start;
        while ((rc = pb_next(s, &b, &f, "AttributeProto", err)) > 0)
            if (f.num == 8) read_varints(&f, iv, &i, n_ints);
        a->ints = iv;
        a->n = (int)n_ints;
    }
    if (n_strings > 0 && n_floats == 0 && n_ints == 0) {
        /* each string was counted from bytes present, so the array is bounded by the file */
        const char **sv = mts_pool_calloc(pool, (size_t)n_strings, sizeof(char *));
        if (!sv) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        int64_t i = 0;
        b = start;
        while ((rc = pb_next(s, &b, &f, "AttributeProto", err)) > 0)
            if (f.num == 9 && f.wt == WT_LEN && i < n_strings && !(sv[i++] = pool_str(pool, &f.sub)))
                return mts_err_set(err, MTS_ENOMEM, "out of memory");
        if (rc < 0) return rc;
        a->strings = sv;
        a->n = (int)n_strings;
    }
    if (n_floats > INT32_MAX || n_ints > INT32_MAX || n_strings > INT32_MAX)
        return mts_err_set(err, MTS_ELIMIT, "%s: node '%s': attribute too long", s->file, node);
    return rc < 0 ? rc : MTS_OK;
}

/* ---- NodeProto ---- */

typedef struct raw_node {
    const char **in, **out;
    pb *graphs; /* per attribute: its GraphProto (p NULL when not a graph) */
} raw_node;

static int parse_node(const mts__pb_src *s, pb b, mts_pool *pool, mts_node *n, raw_node *r, int index,
                      mts_err *err)
{
    pb_field f;
    int rc;
    pb start = b;
    int n_in = 0, n_out = 0, n_attr = 0;
    n->name = "";
    n->op_type = "";
    n->domain = "";
    while ((rc = pb_next(s, &b, &f, "NodeProto", err)) > 0) {
        if (f.wt != WT_LEN) continue;
        if (f.num == 1) n_in++;
        else if (f.num == 2) n_out++;
        else if (f.num == 5) n_attr++;
        else if (f.num == 3 && !(n->name = pool_str(pool, &f.sub))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        else if (f.num == 4 && !(n->op_type = pool_str(pool, &f.sub))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        else if (f.num == 7 && !(n->domain = pool_str(pool, &f.sub))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    if (rc < 0) return rc;
    if (!n->op_type[0])
        return mts_err_set(err, MTS_EFORMAT, "%s: node #%d ('%s') has no op_type", s->file, index, n->name);
    r->in = mts_pool_calloc(pool, (size_t)n_in + 1, sizeof(char *));
    r->out = mts_pool_calloc(pool, (size_t)n_out + 1, sizeof(char *));
    n->in = mts_pool_calloc(pool, (size_t)n_in + 1, sizeof(int));
    n->out = mts_pool_calloc(pool, (size_t)n_out + 1, sizeof(int));
    n->attrs = mts_pool_calloc(pool, (size_t)n_attr + 1, sizeof(mts_attr));
    r->graphs = mts_pool_calloc(pool, (size_t)n_attr + 1, sizeof(pb));
    if (!r->in || !r->out || !n->in || !n->out || !n->attrs || !r->graphs) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    b = start;
    while ((rc = pb_next(s, &b, &f, "NodeProto", err)) > 0) {
        if (f.wt != WT_LEN) continue;
        if (f.num == 1 || f.num == 2) {
            char *str = pool_str(pool, &f.sub);
            if (!str) return mts_err_set(err, MTS_ENOMEM, "out of memory");
            if (f.num == 1) r->in[n->n_in++] = str;
            else r->out[n->n_out++] = str;
        } else if (f.num == 5) {
            if ((rc = parse_attr(s, f.sub, pool, n->name, &n->attrs[n->n_attr], &r->graphs[n->n_attr], err)))
                return rc;
            if (n->attrs[n->n_attr].type == MTS_ATTR_GRAPH && !r->graphs[n->n_attr].p)
                return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (#%d, %s): graph attribute '%s' has no graph",
                                   s->file, n->name, index, n->op_type, n->attrs[n->n_attr].name);
            n->n_attr++;
        }
    }
    /* Trailing omitted optional outputs carry no meaning: drop them. */
    while (n->n_out > 0 && r->out[n->n_out - 1][0] == '\0') n->n_out--;
    while (n->n_in > 0 && r->in[n->n_in - 1][0] == '\0') n->n_in--;
    return rc < 0 ? rc : MTS_OK;
}

/* ---- name → value index (open addressing), per graph scope ---- */

/* Subgraphs nested deeper than this are refused (a hostile file could nest without end). */
#define MTS__MAX_SUBGRAPH_DEPTH 16

typedef struct name_map {
    int *slots;
    size_t cap, count;
} name_map;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

/* The graph being built: its values and inputs grow while subgraphs capture outer values, so
 * they live in heap arrays here and move into the model's pool when the graph is done. */
typedef struct scope {
    struct scope *parent;  /* enclosing graph, NULL at the top level */
    mts_model *m;
    const mts__pb_src *s;
    name_map nm;
    mts_value *vals;
    int nv, cap;
    int *inputs;
    int n_inputs, cap_inputs;
    int *cap_outer;        /* per captured value: its index in the parent scope */
    int n_caps, cap_caps;
} scope;

static int map_find(const scope *sc, const char *name)
{
    const name_map *nm = &sc->nm;
    if (nm->cap == 0) return -1;
    size_t i = hash_str(name) & (nm->cap - 1);
    while (nm->slots[i] >= 0) {
        if (strcmp(sc->vals[nm->slots[i]].name, name) == 0) return nm->slots[i];
        i = (i + 1) & (nm->cap - 1);
    }
    return -1;
}

static void map_insert(name_map *nm, const mts_value *vals, int idx)
{
    size_t i = hash_str(vals[idx].name) & (nm->cap - 1);
    while (nm->slots[i] >= 0) i = (i + 1) & (nm->cap - 1);
    nm->slots[i] = idx;
    nm->count++;
}

static int map_put(scope *sc, int idx, mts_err *err)
{
    name_map *nm = &sc->nm;
    if ((nm->count + 1) * 2 > nm->cap) {
        size_t cap = nm->cap ? nm->cap * 2 : 64;
        int *old = nm->slots;
        size_t old_cap = nm->cap;
        nm->slots = malloc(cap * sizeof(int));
        if (!nm->slots) {
            nm->slots = old;
            return mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        memset(nm->slots, 0xff, cap * sizeof(int));
        nm->cap = cap;
        nm->count = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i] >= 0) map_insert(nm, sc->vals, old[i]);
        free(old);
    }
    map_insert(nm, sc->vals, idx);
    return MTS_OK;
}

static int grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *a = realloc(*arr, (size_t)c * elem);
    if (!a) return -1;
    memset((char *)a + (size_t)*cap * elem, 0, (size_t)(c - *cap) * elem);
    *arr = a;
    *cap = c;
    return 0;
}

/* Appends a zeroed value; returns its index or a negative status. */
static int scope_new_value(scope *sc, mts_err *err)
{
    if (sc->nv >= (1 << 24)) return mts_err_set(err, MTS_ELIMIT, "%s: graph too large", sc->s->file);
    if (grow((void **)&sc->vals, &sc->cap, sc->nv + 1, sizeof(mts_value)))
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    memset(&sc->vals[sc->nv], 0, sizeof(mts_value));
    sc->vals[sc->nv].producer = -1;
    sc->vals[sc->nv].rank = -1;
    return sc->nv++;
}

static int scope_add_input(scope *sc, int v, mts_err *err)
{
    if (grow((void **)&sc->inputs, &sc->cap_inputs, sc->n_inputs + 1, sizeof(int)))
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    sc->inputs[sc->n_inputs++] = v;
    return MTS_OK;
}

/* Resolves name in sc, then in the enclosing scopes: a name found outside becomes a captured
 * value of every scope between (an extra input of the subgraph). *idx = -1 when unknown. */
static int scope_lookup(scope *sc, const char *name, int *idx, mts_err *err)
{
    *idx = map_find(sc, name);
    if (*idx >= 0 || !sc->parent) return MTS_OK;
    int outer, rc;
    if ((rc = scope_lookup(sc->parent, name, &outer, err))) return rc;
    if (outer < 0) return MTS_OK;
    int v = scope_new_value(sc, err);
    if (v < 0) return v;
    sc->vals[v].name = sc->parent->vals[outer].name;
    sc->vals[v].kind = MTS_VALUE_INPUT;
    if ((rc = map_put(sc, v, err)) || (rc = scope_add_input(sc, v, err))) return rc;
    if (grow((void **)&sc->cap_outer, &sc->cap_caps, sc->n_caps + 1, sizeof(int)))
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    sc->cap_outer[sc->n_caps++] = outer;
    *idx = v;
    return MTS_OK;
}

static void scope_free(scope *sc)
{
    free(sc->nm.slots);
    free(sc->vals);
    free(sc->inputs);
    free(sc->cap_outer);
}

/* ---- GraphProto → IR ---- */

static int parse_graph(const mts__pb_src *s, pb g, scope *sc, mts_err *err);

/* A new subgraph model registered with the root (which frees it), for attribute a of node n. */
static mts_model *new_subgraph(const mts__pb_src *s, mts_model *parent, const mts_node *n, const mts_attr *a,
                               mts_err *err)
{
    mts_model *root = s->model;
    if (root->n_subs == root->cap_subs) {
        int cap = root->cap_subs ? root->cap_subs * 2 : 8;
        mts_model **subs = realloc(root->subs, sizeof *subs * (size_t)cap);
        if (!subs) {
            mts_err_set(err, MTS_ENOMEM, "out of memory");
            return NULL;
        }
        root->subs = subs;
        root->cap_subs = cap;
    }
    mts_model *sub = calloc(1, sizeof *sub);
    size_t len = strlen(s->file) + strlen(n->name) + strlen(n->op_type) + strlen(a->name) + 64;
    char *path = malloc(len);
    if (!sub || !path) {
        free(sub);
        free(path);
        mts_err_set(err, MTS_ENOMEM, "out of memory");
        return NULL;
    }
    if (parent->depth == 0)
        snprintf(path, len, "%s: subgraph '%s' of node '%s' (%s)", s->file, a->name, n->name, n->op_type);
    else /* nested: the parent's description, then this level */
        snprintf(path, len, "%s > '%s' of '%s' (%s)", s->file, a->name, n->name, n->op_type);
    pthread_mutex_init(&sub->plan_lock, NULL);
    sub->path = path;
    sub->root = root;
    sub->depth = parent->depth + 1;
    sub->ir_version = root->ir_version;
    sub->opset = root->opset;
    sub->producer = root->producer;
    sub->backend = root->backend;
    sub->max_tensor_bytes = root->max_tensor_bytes;
    root->subs[root->n_subs++] = sub;
    return sub;
}

/* Parses the GRAPH attributes of node n of scope sc and lists the outer values they capture as
 * the node's implicit inputs. */
static int parse_node_subgraphs(const mts__pb_src *s, scope *sc, mts_node *n, const raw_node *r, mts_err *err)
{
    mts_pool *pool = &s->model->pool;
    int *imp = NULL, n_imp = 0, cap_imp = 0;
    int rc = MTS_OK;
    for (int a = 0; a < n->n_attr && !rc; a++) {
        if (n->attrs[a].type != MTS_ATTR_GRAPH || !r->graphs[a].p) continue;
        if (sc->m->depth + 1 > MTS__MAX_SUBGRAPH_DEPTH) {
            rc = mts_err_set(err, MTS_ELIMIT, "%s: node '%s' (%s): subgraphs are nested more than %d levels deep",
                             s->model->path ? s->model->path : s->file, n->name, n->op_type, MTS__MAX_SUBGRAPH_DEPTH);
            break;
        }
        mts_model *sub = new_subgraph(s, sc->m, n, &n->attrs[a], err);
        if (!sub) {
            rc = err->code;
            break;
        }
        n->attrs[a].g = sub;
        mts__pb_src ss = *s;
        ss.file = sub->path;
        scope child = {.parent = sc, .m = sub, .s = &ss};
        rc = parse_graph(&ss, r->graphs[a], &child, err);
        if (!rc) {
            sub->cap_slot = mts_pool_calloc(pool, (size_t)child.n_caps + 1, sizeof(int));
            if (!sub->cap_slot) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        for (int c = 0; !rc && c < child.n_caps; c++) {
            int o = child.cap_outer[c], j = 0;
            while (j < n_imp && imp[j] != o) j++;
            if (j == n_imp) {
                if (grow((void **)&imp, &cap_imp, n_imp + 1, sizeof(int))) {
                    rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                    break;
                }
                imp[n_imp++] = o;
            }
            sub->cap_slot[c] = n->n_in + j;
        }
        scope_free(&child);
    }
    if (!rc && n_imp > 0) {
        int *in = mts_pool_calloc(pool, (size_t)(n->n_in + n_imp) + 1, sizeof(int));
        if (!in) {
            rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        } else {
            memcpy(in, n->in, sizeof(int) * (size_t)n->n_in);
            memcpy(in + n->n_in, imp, sizeof(int) * (size_t)n_imp);
            n->in = in;
            n->n_in += n_imp;
            n->n_implicit = n_imp;
        }
    }
    free(imp);
    return rc;
}

static int parse_graph(const mts__pb_src *s, pb g, scope *sc, mts_err *err)
{
    mts_model *m = sc->m;
    mts_pool *pool = &s->model->pool;
    bool is_sub = sc->parent != NULL;
    pb_field f;
    int rc;
    int64_t n_node = 0, n_init = 0, n_input = 0, n_output = 0, n_vi = 0;
    pb b = g;
    while ((rc = pb_next(s, &b, &f, "GraphProto", err)) > 0) {
        if (f.wt != WT_LEN) continue;
        switch (f.num) {
        case 1: n_node++; break;
        case 5: n_init++; break;
        case 11: n_input++; break;
        case 12: n_output++; break;
        case 13: n_vi++; break;
        case 15:
            return mts_err_set(err, MTS_EUNSUPPORTED, "%s: sparse initializers are not supported", s->file);
        default: break;
        }
    }
    if (rc < 0) return rc;
    if (n_node > (1 << 22) || n_init > (1 << 22))
        return mts_err_set(err, MTS_ELIMIT, "%s: graph too large", s->file);

    mts_node *nodes = mts_pool_calloc(pool, (size_t)n_node + 1, sizeof *nodes);
    raw_node *raw = calloc((size_t)n_node + 1, sizeof *raw);
    mts_value *vi = calloc((size_t)(n_input + n_output + n_vi) + 1, sizeof *vi);
    int *outs = calloc((size_t)n_output + 1, sizeof(int));
    if (!nodes || !raw || !vi || !outs) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    int64_t i_node = 0, i_vi = 0;
    int n_outs = 0;
    /* Pass 2a: nodes and value infos. */
    b = g;
    while ((rc = pb_next(s, &b, &f, "GraphProto", err)) > 0) {
        if (f.wt != WT_LEN) continue;
        if (f.num == 1) {
            if ((rc = parse_node(s, f.sub, pool, &nodes[i_node], &raw[i_node], (int)i_node, err))) goto out;
            i_node++;
        } else if (f.num == 11 || f.num == 12 || f.num == 13) {
            if ((rc = parse_value_info(s, f.sub, pool, &vi[i_vi], err))) goto out;
            vi[i_vi].kind = (mts_value_kind)(f.num == 11 ? 1 : f.num == 12 ? 2 : 3); /* tag: input/output/info */
            i_vi++;
        }
    }
    if (rc < 0) goto out;

    /* Initializers. */
    b = g;
    while ((rc = pb_next(s, &b, &f, "GraphProto", err)) > 0) {
        if (f.num != 5 || f.wt != WT_LEN) continue;
        int nv = scope_new_value(sc, err);
        if (nv < 0) {
            rc = nv;
            goto out;
        }
        mts_value *v = &sc->vals[nv];
        const char *name;
        if ((rc = mts__parse_tensor(s, f.sub.p, (size_t)(f.sub.end - f.sub.p), pool, &v->init, &name, err))) {
            mts_err_prefix(err, "initializer #%d: ", nv);
            goto out;
        }
        if (!name[0]) {
            rc = mts_err_set(err, MTS_EFORMAT, "%s: initializer #%d has no name", s->file, nv);
            goto out;
        }
        if (map_find(sc, name) >= 0) {
            rc = mts_err_set(err, MTS_EFORMAT, "%s: initializer '%s' is defined twice", s->file, name);
            goto out;
        }
        if (!is_sub && m->n_copies > 0 && m->copies[m->n_copies - 1].data == v->init.data)
            m->copies[m->n_copies - 1].value = nv;
        v->name = name;
        v->kind = MTS_VALUE_INITIALIZER;
        v->dtype = v->init.dtype;
        v->rank = v->init.rank;
        memcpy(v->dims, v->init.dims, sizeof v->dims);
        v->producer = -1;
        s->model->param_bytes += mts_tensor_nbytes(&v->init);
        if ((rc = map_put(sc, nv, err))) goto out;
    }
    if (rc < 0) goto out;

    /* Graph inputs (those that are also initializers are initializers with a default). A
     * subgraph's formal inputs take their types from the values bound to them at run time. */
    for (int64_t i = 0; i < i_vi; i++) {
        if (vi[i].kind != 1) continue;
        if (!vi[i].name[0]) {
            rc = mts_err_set(err, MTS_EFORMAT, "%s: graph input #%lld has no name", s->file, (long long)i);
            goto out;
        }
        if (map_find(sc, vi[i].name) >= 0) {
            if (is_sub) {
                rc = mts_err_set(err, MTS_EFORMAT, "%s: subgraph input '%s' is defined twice", s->file, vi[i].name);
                goto out;
            }
            continue;
        }
        int nv = scope_new_value(sc, err);
        if (nv < 0) {
            rc = nv;
            goto out;
        }
        mts_value *v = &sc->vals[nv];
        *v = vi[i];
        v->kind = MTS_VALUE_INPUT;
        v->producer = -1;
        if ((int)v->dtype == -1 || (!is_sub && !mts_dtype_supported(v->dtype))) {
            rc = mts_err_set(err, MTS_EUNSUPPORTED, "%s: graph input '%s' has type %s, which mtserve does not support",
                             s->file, v->name, (int)v->dtype == -1 ? "non-tensor" : mts_dtype_name(v->dtype));
            goto out;
        }
        if (is_sub) {
            v->dtype = MTS_DTYPE_UNDEFINED;
            v->rank = -1;
        }
        if ((rc = scope_add_input(sc, nv, err)) || (rc = map_put(sc, nv, err))) goto out;
    }
    m->n_formal = sc->n_inputs;
    /* Node outputs. */
    for (int64_t n = 0; n < i_node; n++) {
        for (int j = 0; j < nodes[n].n_out; j++) {
            const char *name = raw[n].out[j];
            int nv;
            if (!name[0]) { /* interior omitted output: an anonymous value */
                if ((nv = scope_new_value(sc, err)) < 0) {
                    rc = nv;
                    goto out;
                }
                sc->vals[nv].name = "";
                sc->vals[nv].producer = (int)n;
                nodes[n].out[j] = nv;
                continue;
            }
            int prev = map_find(sc, name);
            if (prev >= 0) {
                rc = mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (#%lld, %s) output '%s' is already defined%s",
                                 s->file, nodes[n].name, (long long)n, nodes[n].op_type, name,
                                 sc->vals[prev].producer >= 0 ? " by another node" : " as an input or initializer");
                goto out;
            }
            if ((nv = scope_new_value(sc, err)) < 0) {
                rc = nv;
                goto out;
            }
            mts_value *v = &sc->vals[nv];
            v->name = name;
            v->kind = MTS_VALUE_INTERMEDIATE;
            v->producer = (int)n;
            nodes[n].out[j] = nv;
            if ((rc = map_put(sc, nv, err))) goto out;
        }
    }
    /* Node inputs: names not defined here resolve in the enclosing graphs (captured values). */
    for (int64_t n = 0; n < i_node; n++) {
        for (int j = 0; j < nodes[n].n_in; j++) {
            const char *name = raw[n].in[j];
            if (!name[0]) {
                nodes[n].in[j] = -1;
                continue;
            }
            int idx;
            if ((rc = scope_lookup(sc, name, &idx, err))) goto out;
            if (idx < 0) {
                rc = mts_err_set(err, MTS_EFORMAT,
                                 "%s: node '%s' (#%lld, %s) input '%s' is not a graph input, an initializer, "
                                 "the output of any node%s",
                                 s->file, nodes[n].name, (long long)n, nodes[n].op_type, name,
                                 is_sub ? " or a value of an enclosing graph" : "");
                goto out;
            }
            nodes[n].in[j] = idx;
        }
    }
    /* Subgraphs of the nodes (which may capture further outer values through this scope). */
    for (int64_t n = 0; n < i_node; n++)
        if ((rc = parse_node_subgraphs(s, sc, &nodes[n], &raw[n], err))) goto out;
    /* Graph outputs and declared shapes of intermediates. */
    for (int64_t i = 0; i < i_vi; i++) {
        int idx;
        if (vi[i].kind == 2) {
            if ((rc = scope_lookup(sc, vi[i].name, &idx, err))) goto out;
            if (idx < 0) {
                rc = mts_err_set(err, MTS_EFORMAT, "%s: graph output '%s' is not produced by any node", s->file,
                                 vi[i].name);
                goto out;
            }
            outs[n_outs++] = idx;
        } else {
            idx = map_find(sc, vi[i].name);
        }
        if (!is_sub && idx >= 0 && sc->vals[idx].kind == MTS_VALUE_INTERMEDIATE && (int)vi[i].dtype > 0)
            sc->vals[idx].dtype = vi[i].dtype; /* declared type, also without a shape */
        if (!is_sub && idx >= 0 && sc->vals[idx].kind == MTS_VALUE_INTERMEDIATE && vi[i].rank >= 0) {
            sc->vals[idx].dtype = vi[i].dtype;
            sc->vals[idx].rank = vi[i].rank;
            memcpy(sc->vals[idx].dims, vi[i].dims, sizeof vi[i].dims);
            memcpy(sc->vals[idx].dim_params, vi[i].dim_params, sizeof vi[i].dim_params);
        }
    }
    if (n_outs == 0) {
        rc = mts_err_set(err, MTS_EFORMAT, "%s: graph has no outputs", s->file);
        goto out;
    }
    m->values = mts_pool_calloc(pool, (size_t)sc->nv + 1, sizeof(mts_value));
    m->inputs = mts_pool_calloc(pool, (size_t)sc->n_inputs + 1, sizeof(int));
    m->outputs = mts_pool_calloc(pool, (size_t)n_outs + 1, sizeof(int));
    if (!m->values || !m->inputs || !m->outputs) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    if (sc->nv) memcpy(m->values, sc->vals, sizeof(mts_value) * (size_t)sc->nv);
    if (sc->n_inputs) memcpy(m->inputs, sc->inputs, sizeof(int) * (size_t)sc->n_inputs);
    memcpy(m->outputs, outs, sizeof(int) * (size_t)n_outs);
    m->n_values = sc->nv;
    m->n_inputs = sc->n_inputs;
    m->n_outputs = n_outs;
    m->nodes = nodes;
    m->n_nodes = (int)i_node;
    rc = MTS_OK;
out:
    free(raw);
    free(vi);
    free(outs);
    return rc;
}

int mts__parse_model(const mts__pb_src *s, mts_model *m, mts_err *err)
{
    pb b = {s->base, s->base + s->base_len};
    pb_field f;
    int rc;
    pb graph = {NULL, NULL};
    bool have_graph = false, have_opset = false;
    m->opset = 0;
    m->producer = "";
    while ((rc = pb_next(s, &b, &f, "ModelProto", err)) > 0) {
        switch (f.num) {
        case 1:
            if ((rc = want_wt(s, &f, WT_VARINT, "ModelProto", err))) return rc;
            m->ir_version = f.v > 1000 ? 1000 : (int)f.v;
            break;
        case 2:
            if (f.wt == WT_LEN && !(m->producer = pool_str(&m->pool, &f.sub)))
                return mts_err_set(err, MTS_ENOMEM, "out of memory");
            break;
        case 7:
            if ((rc = want_wt(s, &f, WT_LEN, "ModelProto", err))) return rc;
            graph = f.sub;
            have_graph = true;
            break;
        case 8: {
            if ((rc = want_wt(s, &f, WT_LEN, "ModelProto", err))) return rc;
            pb o = f.sub;
            pb_field g;
            bool default_domain = true;
            int64_t version = 0;
            while ((rc = pb_next(s, &o, &g, "OperatorSetIdProto", err)) > 0) {
                if (g.num == 1 && g.wt == WT_LEN) {
                    size_t l = (size_t)(g.sub.end - g.sub.p);
                    default_domain = l == 0 || (l == 7 && memcmp(g.sub.p, "ai.onnx", 7) == 0);
                }
                if (g.num == 2 && g.wt == WT_VARINT) version = (int64_t)g.v;
            }
            if (rc < 0) return rc;
            if (default_domain) {
                m->opset = version > 1000 ? 1000 : (int)version;
                have_opset = true;
            }
            break;
        }
        default:
            break;
        }
    }
    if (rc < 0) {
        /* The top level did not parse as a ModelProto: say so first, keep the detail. */
        if (err) {
            char detail[MTS_ERR_MSG_MAX];
            size_t fl = strlen(s->file);
            const char *d = err->msg;
            if (!strncmp(d, s->file, fl) && !strncmp(d + fl, ": ", 2)) d += fl + 2;
            snprintf(detail, sizeof detail, "%s", d);
            mts_err_set(err, rc, "%s is not an ONNX model: %s", s->file, detail);
        }
        return rc;
    }
    if (!have_graph)
        return mts_err_set(err, MTS_EFORMAT, "%s is not an ONNX model: it has no graph (%zu bytes)", s->file,
                           s->base_len);
    if (m->ir_version < 3 || m->ir_version > 10)
        return mts_err_set(err, MTS_EUNSUPPORTED, "%s: IR version %d is not supported (3 to 10 are)", s->file,
                           m->ir_version);
    if (!have_opset) m->opset = 0; /* only an error if a node uses the default domain (loader.c) */
    else if (m->opset < 1 || m->opset > 18)
        return mts_err_set(err, MTS_EUNSUPPORTED, "%s: opset %d is not supported (1 to 18 are)", s->file, m->opset);
    scope top = {.m = m, .s = s};
    rc = parse_graph(s, graph, &top, err);
    scope_free(&top);
    return rc;
}
