/*
 * NumPy .npy files (format versions 1–3, C order, little-endian) for tensors going in and out of
 * `mtserve run` and the tests: reading validates the header strictly and never trusts a size it
 * has not checked against the file.
 */
#ifndef MTS_UTIL_NPY_H
#define MTS_UTIL_NPY_H

#include "util/tensor.h"
#include "util/status.h"

/* Reads path into t (data malloc'd; free with free(t->data)). */
int mts_npy_read(const char *path, mts_tensor *t /* OUT */, mts_err *err);
/* Parses an in-memory .npy image; data is copied. */
int mts_npy_parse(const void *buf, size_t len, const char *name, mts_tensor *t /* OUT */, mts_err *err);
int mts_npy_write(const char *path, const mts_tensor *t, mts_err *err);

#endif
