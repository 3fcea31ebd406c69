/*
 * GGUF reader: parses the header, the metadata key/values and the tensor infos of a GGUF file
 * held in memory, checking every count, length, type, dimension and offset against the file's
 * size and fixed caps before allocating anything from it, and dequantizes F32 / F16 / BF16 /
 * Q8_0 tensors to float32. Layout (all little-endian): "GGUF", u32 version, u64 tensor count,
 * u64 key/value count, the key/values (string key, u32 type, value), the tensor infos (string
 * name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset), padding to the alignment, then the
 * data section; a string is a u64 length and that many bytes.
 */
#include "engine/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/tensor.h"

typedef struct rd {
    const uint8_t *p;
    size_t len, pos;
    const char *file;
    mts_err *err;
} rd;

static int fail(rd *r, size_t off, const char *what)
{
    return mts_err_set(r->err, MTS_EFORMAT, "%s: GGUF: %s at byte %zu", r->file, what, off);
}

static int need(rd *r, size_t n, const char *what)
{
    if (r->len - r->pos < n) {
        char m[200];
        snprintf(m, sizeof m, "truncated file: %s needs %zu bytes, %zu left", what, n, r->len - r->pos);
        return fail(r, r->pos, m);
    }
    return 0;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static int u32(rd *r, uint32_t *v, const char *what)
{
    if (need(r, 4, what)) return -1;
    *v = (uint32_t)le(r->p + r->pos, 4);
    r->pos += 4;
    return 0;
}

static int u64(rd *r, uint64_t *v, const char *what)
{
    if (need(r, 8, what)) return -1;
    *v = le(r->p + r->pos, 8);
    r->pos += 8;
    return 0;
}

/* A string: its bytes stay in the file; *s points at them. */
static int str(rd *r, const char **s, size_t *n, size_t max, const char *what)
{
    size_t at = r->pos;
    uint64_t len;
    if (u64(r, &len, what)) return -1;
    if (len > max || len > r->len - r->pos) {
        char m[200];
        snprintf(m, sizeof m, "%s of %llu bytes is longer than %s", what, (unsigned long long)len,
                 len > max ? "the limit" : "the rest of the file");
        return fail(r, at, m);
    }
    *s = (const char *)r->p + r->pos;
    *n = (size_t)len;
    r->pos += (size_t)len;
    return 0;
}

static int scalar_size(int t)
{
    switch (t) {
    case MTS_GGUF_U8: case MTS_GGUF_I8: case MTS_GGUF_BOOL: return 1;
    case MTS_GGUF_U16: case MTS_GGUF_I16: return 2;
    case MTS_GGUF_U32: case MTS_GGUF_I32: case MTS_GGUF_F32: return 4;
    case MTS_GGUF_U64: case MTS_GGUF_I64: case MTS_GGUF_F64: return 8;
    default: return 0;
    }
}

static void scalar_value(const uint8_t *p, int t, int64_t *i, double *f)
{
    uint64_t v = le(p, scalar_size(t));
    switch (t) {
    case MTS_GGUF_I8: *i = (int8_t)v; break;
    case MTS_GGUF_I16: *i = (int16_t)v; break;
    case MTS_GGUF_I32: *i = (int32_t)v; break;
    case MTS_GGUF_I64: *i = (int64_t)v; break;
    case MTS_GGUF_F32: {
        uint32_t b = (uint32_t)v;
        float x;
        memcpy(&x, &b, 4);
        *f = x;
        return;
    }
    case MTS_GGUF_F64: memcpy(f, &v, 8); return;
    case MTS_GGUF_U64: *i = v > INT64_MAX ? INT64_MAX : (int64_t)v; break;
    default: *i = (int64_t)v; break;
    }
    *f = (double)*i;
}

static int arena_put(mts_gguf *g, size_t *used, size_t *cap, const char *s, size_t n, size_t *at)
{
    if (*cap - *used < n + 1) {
        size_t c = *cap ? *cap : 4096;
        while (c - *used < n + 1) c *= 2;
        char *p = realloc(g->names, c);
        if (!p) return -1;
        g->names = p;
        *cap = c;
    }
    memcpy(g->names + *used, s, n);
    g->names[*used + n] = 0;
    *at = *used;
    *used += n + 1;
    return 0;
}

typedef struct named {
    const char *name;
    size_t off;
} named;

static int named_cmp(const void *a, const void *b)
{
    return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

/* Duplicate keys or tensor names (sorted, so hostile counts stay O(n log n)). */
static int dup_check(const mts_gguf *g, mts_err *err)
{
    int n = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors, rc = 0;
    named *v = malloc(((size_t)n + 1) * sizeof *v);
    if (!v) return mts_err_set(err, MTS_ENOMEM, "%s: GGUF: out of memory", g->file);
    for (int pass = 0; pass < 2 && !rc; pass++) {
        int m = pass ? g->n_tensors : g->n_kv;
        for (int i = 0; i < m; i++)
            v[i] = pass ? (named){g->tensors[i].name, g->tensors[i].info_off} : (named){g->kv[i].key, g->kv[i].off};
        qsort(v, (size_t)m, sizeof *v, named_cmp);
        for (int i = 1; i < m && !rc; i++)
            if (!strcmp(v[i].name, v[i - 1].name))
                rc = mts_err_set(err, MTS_EFORMAT, "%s: GGUF: duplicate %s '%.100s' at byte %zu", g->file,
                                 pass ? "tensor name" : "metadata key", v[i].name,
                                 v[i].off > v[i - 1].off ? v[i].off : v[i - 1].off);
    }
    free(v);
    return rc;
}

int mts_gguf_is(const void *bytes, size_t len)
{
    return len >= 4 && memcmp(bytes, "GGUF", 4) == 0;
}

static int type_block(int type, int *block, int *bytes)
{
    switch (type) {
    case MTS_GGML_F32: *block = 1, *bytes = 4; return 0;
    case MTS_GGML_F16: case MTS_GGML_BF16: *block = 1, *bytes = 2; return 0;
    case MTS_GGML_Q8_0: *block = 32, *bytes = 34; return 0;
    default: return -1;
    }
}

const char *mts_ggml_type_name(int type)
{
    static const char *const names[] = {"F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0",
                                        "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS",
                                        "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8",
                                        "I16", "I32", "I64", "F64", "IQ1_M", "BF16"};
    return type >= 0 && type < (int)(sizeof names / sizeof *names) ? names[type] : "unknown";
}

int mts_gguf_parse(mts_gguf *g, const void *bytes, size_t len, const char *file, mts_err *err)
{
    memset(g, 0, sizeof *g);
    g->bytes = bytes;
    g->len = len;
    g->file = file;
    rd r = {bytes, len, 0, file, err};
    if (len < 4 || memcmp(bytes, "GGUF", 4) != 0) return fail(&r, 0, "bad magic (not a GGUF file)");
    r.pos = 4;
    uint64_t n_t, n_kv;
    if (u32(&r, &g->version, "the version")) return MTS_EFORMAT;
    if (g->version != 2 && g->version != 3) {
        char m[160];
        snprintf(m, sizeof m, "version %u is not supported (2 and 3 are; a big-endian file reads as a huge "
                 "version)", g->version);
        return mts_err_set(err, MTS_EUNSUPPORTED, "%s: GGUF: %s at byte 4", file, m);
    }
    if (u64(&r, &n_t, "the tensor count") || u64(&r, &n_kv, "the key/value count")) return MTS_EFORMAT;
    /* each tensor info takes at least 8+4+8+4+8 bytes, each key/value 8+4+1 */
    if (n_t > MTS_GGUF_MAX_TENSORS || n_t > (len - r.pos) / 32) {
        char m[160];
        snprintf(m, sizeof m, "tensor count %llu is more than the file can hold or the limit of %d",
                 (unsigned long long)n_t, MTS_GGUF_MAX_TENSORS);
        return fail(&r, 8, m);
    }
    if (n_kv > MTS_GGUF_MAX_KV || n_kv > (len - r.pos) / 13) {
        char m[160];
        snprintf(m, sizeof m, "key/value count %llu is more than the file can hold or the limit of %d",
                 (unsigned long long)n_kv, MTS_GGUF_MAX_KV);
        return fail(&r, 16, m);
    }
    g->kv = calloc((size_t)n_kv + 1, sizeof *g->kv);
    g->tensors = calloc((size_t)n_t + 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        mts_gguf_free(g);
        return mts_err_set(err, MTS_ENOMEM, "%s: GGUF: out of memory", file);
    }
    /* keys and names are copied NUL-terminated into one arena that grows as they are read (their
     * total is bounded by the header's size); pointers are set once it stops moving */
    size_t arena = 0, arena_cap = 0;
    g->alignment = 32;
    for (uint64_t k = 0; k < n_kv; k++) {
        mts_gguf_kv *kv = &g->kv[k];
        size_t at = r.pos, kn;
        const char *key;
        uint32_t t;
        if (str(&r, &key, &kn, MTS_GGUF_MAX_KEY, "a metadata key")) goto bad;
        if (arena_put(g, &arena, &arena_cap, key, kn, &kv->key_at)) goto oom;
        kv->key = g->names + kv->key_at; /* valid until the arena grows again: used for messages below */
        if (memchr(key, 0, kn)) {
            fail(&r, at, "metadata key contains a NUL byte");
            goto bad;
        }
        size_t tat = r.pos;
        if (u32(&r, &t, "a metadata value type")) goto bad;
        kv->type = (int)t;
        kv->count = 1;
        kv->off = r.pos;
        if (t == MTS_GGUF_STRING) {
            if (str(&r, &kv->s, &kv->s_len, len, "a string value")) goto bad;
        } else if (t == MTS_GGUF_ARRAY) {
            uint32_t et;
            uint64_t cnt;
            size_t eat = r.pos;
            if (u32(&r, &et, "an array's element type") || u64(&r, &cnt, "an array's length")) goto bad;
            kv->arr_type = (int)et;
            kv->count = cnt;
            kv->off = r.pos;
            if (et == MTS_GGUF_ARRAY) {
                char m[200];
                snprintf(m, sizeof m, "'%.100s' is an array of arrays (not supported)", kv->key);
                fail(&r, eat, m);
                goto bad;
            }
            int es = et == MTS_GGUF_STRING ? 8 : scalar_size((int)et);
            if (!es) {
                char m[200];
                snprintf(m, sizeof m, "'%.100s': unknown array element type %u", kv->key, et);
                fail(&r, eat, m);
                goto bad;
            }
            if (cnt > (len - r.pos) / (uint64_t)es) {
                char m[200];
                snprintf(m, sizeof m, "'%.100s': array of %llu elements is longer than the rest of the file",
                         kv->key, (unsigned long long)cnt);
                fail(&r, eat + 4, m);
                goto bad;
            }
            if (et == MTS_GGUF_STRING) {
                for (uint64_t e = 0; e < cnt; e++) {
                    const char *s;
                    size_t n;
                    if (str(&r, &s, &n, len, "an array's string")) goto bad;
                }
            } else {
                r.pos += (size_t)cnt * (size_t)es;
            }
        } else {
            int sz = scalar_size((int)t);
            if (!sz) {
                char m[200];
                snprintf(m, sizeof m, "'%.100s': unknown metadata value type %u", kv->key, t);
                fail(&r, tat, m);
                goto bad;
            }
            if (need(&r, (size_t)sz, "a metadata value")) goto bad;
            scalar_value(r.p + r.pos, (int)t, &kv->i, &kv->f);
            r.pos += (size_t)sz;
        }
        g->n_kv++;
        if (!strcmp(kv->key, "general.alignment")) {
            if (t != MTS_GGUF_U32 || kv->i == 0 || (kv->i & (kv->i - 1)) || kv->i > 65536) {
                fail(&r, tat, "general.alignment must be a u32 power of two up to 65536");
                goto bad;
            }
            g->alignment = (uint32_t)kv->i;
        }
    }
    for (uint64_t k = 0; k < n_t; k++) {
        mts_gguf_tensor *t = &g->tensors[k];
        size_t at = r.pos, nn;
        const char *name;
        uint32_t nd, ty;
        t->info_off = at;
        if (str(&r, &name, &nn, MTS_GGUF_MAX_NAME, "a tensor name")) goto bad;
        if (arena_put(g, &arena, &arena_cap, name, nn, &t->name_at)) goto oom;
        t->name = g->names + t->name_at; /* valid until the arena grows again: used for messages below */
        if (memchr(name, 0, nn)) {
            fail(&r, at, "tensor name contains a NUL byte");
            goto bad;
        }
        size_t dat = r.pos;
        if (u32(&r, &nd, "a tensor's dimension count")) goto bad;
        if (nd < 1 || nd > MTS_GGUF_MAX_DIMS) {
            char m[200];
            snprintf(m, sizeof m, "tensor '%.100s' has %u dimensions (1 to %d allowed)", t->name, nd,
                     MTS_GGUF_MAX_DIMS);
            fail(&r, dat, m);
            goto bad;
        }
        t->n_dims = (int)nd;
        uint64_t numel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne;
            size_t nat = r.pos;
            if (u64(&r, &ne, "a tensor dimension")) goto bad;
            /* no tensor can have more elements than the file has bits (Q8_0: 8.5 bits each) */
            if (ne == 0 || ne > (uint64_t)len * 8 || numel > (uint64_t)len * 8 / ne) {
                char m[200];
                snprintf(m, sizeof m, "tensor '%.100s': dimension %u of %llu is zero or more than the file can hold",
                         t->name, d, (unsigned long long)ne);
                fail(&r, nat, m);
                goto bad;
            }
            t->ne[d] = (int64_t)ne;
            numel *= ne;
        }
        for (int d = (int)nd; d < MTS_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        t->numel = (int64_t)numel;
        size_t tat = r.pos;
        if (u32(&r, &ty, "a tensor type")) goto bad;
        t->type = (int)ty;
        int block, bb;
        if (type_block((int)ty, &block, &bb)) {
            char m[200];
            snprintf(m, sizeof m, "tensor '%.100s' has type %u (%s), not one of F32, F16, BF16, Q8_0", t->name, ty,
                     mts_ggml_type_name((int)ty));
            mts_err_set(err, MTS_EUNSUPPORTED, "%s: GGUF: %s at byte %zu", file, m, tat);
            goto bad_keep;
        }
        if (t->ne[0] % block) {
            char m[200];
            snprintf(m, sizeof m, "tensor '%.100s': first dimension %lld is not a multiple of the %s block of %d",
                     t->name, (long long)t->ne[0], mts_ggml_type_name((int)ty), block);
            fail(&r, dat + 4, m);
            goto bad;
        }
        t->bytes = (size_t)(numel / (uint64_t)block) * (size_t)bb;
        if (u64(&r, &t->offset, "a tensor offset")) goto bad;
    }
    g->n_tensors = (int)n_t;
    for (int k = 0; k < g->n_kv; k++) g->kv[k].key = g->names + g->kv[k].key_at;
    for (int k = 0; k < g->n_tensors; k++) g->tensors[k].name = g->names + g->tensors[k].name_at;
    if (dup_check(g, err)) goto bad_dup;
    size_t data = (r.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (n_t && data > len) {
        fail(&r, r.pos, "the data section starts past the end of the file");
        goto bad;
    }
    g->data_off = data;
    for (int k = 0; k < g->n_tensors; k++) {
        mts_gguf_tensor *t = &g->tensors[k];
        size_t room = len - data;
        if (t->offset % g->alignment || t->offset > room || t->bytes > room - t->offset) {
            char m[240];
            snprintf(m, sizeof m, "tensor '%.100s': data at offset %llu (%zu bytes) is %s", t->name,
                     (unsigned long long)t->offset, t->bytes,
                     t->offset % g->alignment ? "not aligned to general.alignment" : "past the end of the file");
            fail(&r, t->info_off, m);
            goto bad;
        }
        t->data = g->bytes + data + t->offset;
    }
    return MTS_OK;
bad:
    mts_gguf_free(g);
    return MTS_EFORMAT;
bad_keep:
    mts_gguf_free(g);
    return MTS_EUNSUPPORTED;
bad_dup:
    mts_gguf_free(g);
    return MTS_EFORMAT;
oom:
    mts_gguf_free(g);
    return mts_err_set(err, MTS_ENOMEM, "%s: GGUF: out of memory", file);
}

void mts_gguf_free(mts_gguf *g)
{
    free(g->kv);
    free(g->tensors);
    free(g->names);
    g->kv = NULL;
    g->tensors = NULL;
    g->names = NULL;
    g->n_kv = g->n_tensors = 0;
}

const mts_gguf_kv *mts_gguf_find(const mts_gguf *g, const char *key)
{
    for (int i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

int mts_gguf_get_int(const mts_gguf *g, const char *key, int64_t dflt, int64_t *out, mts_err *err)
{
    const mts_gguf_kv *kv = mts_gguf_find(g, key);
    *out = dflt;
    if (!kv) return 0;
    if (kv->type == MTS_GGUF_ARRAY || kv->type == MTS_GGUF_STRING || kv->type == MTS_GGUF_F32 ||
        kv->type == MTS_GGUF_F64)
        return mts_err_set(err, MTS_EFORMAT, "%s: GGUF: '%s' at byte %zu is not an integer", g->file, key, kv->off);
    *out = kv->i;
    return 0;
}

int mts_gguf_get_float(const mts_gguf *g, const char *key, double dflt, double *out, mts_err *err)
{
    const mts_gguf_kv *kv = mts_gguf_find(g, key);
    *out = dflt;
    if (!kv) return 0;
    if (kv->type == MTS_GGUF_ARRAY || kv->type == MTS_GGUF_STRING)
        return mts_err_set(err, MTS_EFORMAT, "%s: GGUF: '%s' at byte %zu is not a number", g->file, key, kv->off);
    *out = kv->f;
    return 0;
}

const char *mts_gguf_get_str(const mts_gguf *g, const char *key, size_t *len)
{
    const mts_gguf_kv *kv = mts_gguf_find(g, key);
    if (!kv || kv->type != MTS_GGUF_STRING) return NULL;
    *len = kv->s_len;
    return kv->s;
}

const char *mts_gguf_next_str(const mts_gguf *g, size_t *pos, size_t *n)
{
    uint64_t len = le(g->bytes + *pos, 8);
    const char *s = (const char *)g->bytes + *pos + 8;
    *n = (size_t)len;
    *pos += 8 + (size_t)len;
    return s;
}

int64_t mts_gguf_arr_int(const mts_gguf *g, const mts_gguf_kv *kv, uint64_t i, int64_t dflt)
{
    if (!kv || kv->type != MTS_GGUF_ARRAY || i >= kv->count) return dflt;
    int es = scalar_size(kv->arr_type);
    if (!es || kv->arr_type == MTS_GGUF_F32 || kv->arr_type == MTS_GGUF_F64) return dflt;
    int64_t v;
    double f;
    scalar_value(g->bytes + kv->off + (size_t)i * (size_t)es, kv->arr_type, &v, &f);
    return v;
}

const mts_gguf_tensor *mts_gguf_tensor_find(const mts_gguf *g, const char *name)
{
    for (int i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

float *mts_gguf_tensor_f32(const mts_gguf *g, const mts_gguf_tensor *t, mts_err *err)
{
    float *out = malloc((size_t)t->numel * sizeof(float) + 1);
    if (!out) {
        mts_err_set(err, MTS_ENOMEM, "%s: GGUF: out of memory for tensor '%s' (%lld elements)", g->file, t->name,
                    (long long)t->numel);
        return NULL;
    }
    const uint8_t *p = t->data;
    int64_t n = t->numel;
    switch (t->type) {
    case MTS_GGML_F32:
        memcpy(out, p, (size_t)n * 4); /* little-endian host (as the engine assumes throughout) */
        break;
    case MTS_GGML_F16:
        for (int64_t i = 0; i < n; i++) out[i] = mts_f16_to_f32((uint16_t)le(p + 2 * i, 2));
        break;
    case MTS_GGML_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = mts_bf16_to_f32((uint16_t)le(p + 2 * i, 2));
        break;
    case MTS_GGML_Q8_0:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = p + 34 * b;
            float d = mts_f16_to_f32((uint16_t)le(blk, 2));
            for (int j = 0; j < 32; j++) out[32 * b + j] = d * (float)(int8_t)blk[2 + j];
        }
        break;
    default:
        free(out);
        mts_err_set(err, MTS_EUNSUPPORTED, "%s: GGUF: tensor '%s' has unsupported type %s", g->file, t->name,
                    mts_ggml_type_name(t->type));
        return NULL;
    }
    return out;
}
