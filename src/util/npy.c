/*
 * .npy reader and writer. The header is a Python dict literal; we accept exactly the keys
 * numpy writes ('descr', 'fortran_order', 'shape') and the dtypes the engine computes with
 * ('<f4', '<f8', '<f2', '<i8', '<i4', '<i2', '<u8', '<u4', '<u2', '|u1', '|i1', '|b1'; numpy has no bfloat16), and check the payload size against the shape.
 */
#include "util/npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *descr;
    mts_dtype dtype;
} npy_types[] = {
    {"<f4", MTS_DTYPE_FLOAT}, {"<i8", MTS_DTYPE_INT64}, {"<i4", MTS_DTYPE_INT32},
    {"|u1", MTS_DTYPE_UINT8}, {"|i1", MTS_DTYPE_INT8},  {"|b1", MTS_DTYPE_BOOL},
    {"<f8", MTS_DTYPE_DOUBLE}, {"<f2", MTS_DTYPE_FLOAT16}, {"<i2", MTS_DTYPE_INT16},
    {"<u2", MTS_DTYPE_UINT16}, {"<u4", MTS_DTYPE_UINT32}, {"<u8", MTS_DTYPE_UINT64},
};

static const char *descr_of(mts_dtype t)
{
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].dtype == t) return npy_types[i].descr;
    return NULL;
}

int mts_npy_parse(const void *buf, size_t len, const char *name, mts_tensor *t, mts_err *err)
{
    const unsigned char *p = buf;
    memset(t, 0, sizeof *t);
    if (len < 10 || memcmp(p, "\x93NUMPY", 6) != 0)
        return mts_err_set(err, MTS_EINVAL, "%s: not a .npy file (bad magic)", name);
    int major = p[6];
    size_t hlen, hoff;
    if (major == 1) {
        hlen = (size_t)p[8] | ((size_t)p[9] << 8);
        hoff = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12) return mts_err_set(err, MTS_EINVAL, "%s: truncated .npy header", name);
        hlen = (size_t)p[8] | ((size_t)p[9] << 8) | ((size_t)p[10] << 16) | ((size_t)p[11] << 24);
        hoff = 12;
    } else {
        return mts_err_set(err, MTS_EINVAL, "%s: unsupported .npy version %d", name, major);
    }
    if (hlen > len - hoff || hlen > 65536) return mts_err_set(err, MTS_EINVAL, "%s: truncated .npy header", name);
    char hdr[65537];
    memcpy(hdr, p + hoff, hlen);
    hdr[hlen] = '\0';
    char *d = strstr(hdr, "'descr'");
    char *f = strstr(hdr, "'fortran_order'");
    char *s = strstr(hdr, "'shape'");
    if (!d || !f || !s) return mts_err_set(err, MTS_EINVAL, "%s: .npy header lacks descr, fortran_order or shape", name);
    char descr[16] = "";
    d = strchr(d + 7, '\'');
    if (!d || sscanf(d + 1, "%15[^']", descr) != 1) return mts_err_set(err, MTS_EINVAL, "%s: bad descr in .npy header", name);
    t->dtype = MTS_DTYPE_UNDEFINED;
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (!strcmp(descr, npy_types[i].descr) || (descr[0] == '=' && !strcmp(descr + 1, npy_types[i].descr + 1)))
            t->dtype = npy_types[i].dtype;
    if (!strcmp(descr, "<u1") || !strcmp(descr, "u1")) t->dtype = MTS_DTYPE_UINT8;
    if (t->dtype == MTS_DTYPE_UNDEFINED)
        return mts_err_set(err, MTS_EUNSUPPORTED, "%s: .npy dtype '%s' is not supported (use <f4, <f8, <f2, <i8, <i4, <i2, <u8, <u4, <u2, |u1, |i1, |b1)",
                           name, descr);
    const char *fv = strchr(f + 15, ':');
    if (!fv) return mts_err_set(err, MTS_EINVAL, "%s: bad fortran_order in .npy header", name);
    fv++;
    while (*fv == ' ') fv++;
    if (strncmp(fv, "False", 5) != 0)
        return mts_err_set(err, MTS_EUNSUPPORTED, "%s: Fortran-order .npy arrays are not supported", name);
    char *lp = strchr(s, '('), *rp = lp ? strchr(lp, ')') : NULL;
    if (!lp || !rp) return mts_err_set(err, MTS_EINVAL, "%s: bad shape in .npy header", name);
    t->rank = 0;
    for (char *q = lp + 1; q < rp;) {
        while (q < rp && (*q == ' ' || *q == ',')) q++;
        if (q >= rp) break;
        char *end;
        errno = 0;
        long long v = strtoll(q, &end, 10);
        if (end == q || errno || v < 0) return mts_err_set(err, MTS_EINVAL, "%s: bad dimension in .npy shape", name);
        if (t->rank >= MTS_MAX_RANK) return mts_err_set(err, MTS_EUNSUPPORTED, "%s: rank above %d", name, MTS_MAX_RANK);
        t->dims[t->rank++] = v;
        q = end;
    }
    int64_t nbytes = mts_tensor_nbytes(t);
    size_t off = hoff + hlen;
    if (nbytes < 0 || (uint64_t)nbytes != len - off)
        return mts_err_set(err, MTS_EINVAL, "%s: .npy payload is %zu bytes, the shape needs %lld", name, len - off,
                           (long long)nbytes);
    t->data = malloc(nbytes > 0 ? (size_t)nbytes : 1);
    if (!t->data) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    memcpy(t->data, p + off, (size_t)nbytes);
    return MTS_OK;
}

int mts_npy_read(const char *path, mts_tensor *t, mts_err *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return mts_err_set(err, MTS_EIO, "cannot open %s: %s", path, strerror(errno));
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        fclose(fp);
        return mts_err_set(err, MTS_EIO, "cannot read %s", path);
    }
    fclose(fp);
    int rc = mts_npy_parse(buf, (size_t)n, path, t, err);
    free(buf);
    return rc;
}

int mts_npy_write(const char *path, const mts_tensor *t, mts_err *err)
{
    const char *descr = descr_of(t->dtype);
    if (!descr) return mts_err_set(err, MTS_EUNSUPPORTED, "cannot write %s tensors to .npy", mts_dtype_name(t->dtype));
    char shape[256] = "";
    size_t o = 0;
    for (int i = 0; i < t->rank; i++)
        o += (size_t)snprintf(shape + o, sizeof shape - o, "%lld,%s", (long long)t->dims[i], i + 1 < t->rank ? " " : "");
    if (t->rank > 1) shape[o - 1] = '\0'; /* numpy writes a trailing comma only for 1-d */
    char hdr[512];
    int hl = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shape);
    int total = 10 + hl + 1;
    int pad = (64 - total % 64) % 64;
    FILE *fp = fopen(path, "wb");
    if (!fp) return mts_err_set(err, MTS_EIO, "cannot create %s: %s", path, strerror(errno));
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    int hdr_len = hl + pad + 1;
    pre[8] = (unsigned char)(hdr_len & 0xff);
    pre[9] = (unsigned char)(hdr_len >> 8);
    fwrite(pre, 1, 10, fp);
    fwrite(hdr, 1, (size_t)hl, fp);
    for (int i = 0; i < pad; i++) fputc(' ', fp);
    fputc('\n', fp);
    int64_t nbytes = mts_tensor_nbytes(t);
    size_t wr = nbytes > 0 ? fwrite(t->data, 1, (size_t)nbytes, fp) : 0;
    int bad = ferror(fp) | fclose(fp);
    if (bad || (int64_t)wr != (nbytes > 0 ? nbytes : 0)) return mts_err_set(err, MTS_EIO, "cannot write %s", path);
    return MTS_OK;
}
