/*
 * The depthwise-separable block kernel (dwsep.c), one form of a oneDNN-backend step
 * (dnnl_conv.c): a depthwise 3x3 convolution and the 1x1 convolution that alone reads it, with
 * both convolutions' post-ops, in one pass over channels-last tensors. Internal to the backend.
 */
#ifndef MTS_ENGINE_DWSEP_H
#define MTS_ENGINE_DWSEP_H

#include "engine/kernels/dnnl_ops.h"

typedef struct mts_dwsep mts_dwsep;

/* s: a spec with pw_M > 0 that passes mts_dconv_dwsep_ok. Copies the weights it needs. */
int mts_dwsep_create(const mts_dconv_spec *s, mts_dwsep **out, mts_err *err);
void mts_dwsep_free(mts_dwsep *k);
/* Scratch bytes one run on `threads` threads needs. */
size_t mts_dwsep_scratch(const mts_dwsep *k, int threads);
/* src, dst and the residuals (the ADD post-ops' tensors, in post-op order) are channels-last;
 * each holds float or bf16 values as the spec said. */
void mts_dwsep_run(const mts_dwsep *k, int threads, const void *src, void *dst, const float *const *resid,
                   void *scratch);
/* "mts:dw3x3+pw1x1" and the like, for describe. */
const char *mts_dwsep_impl(const mts_dwsep *k);

#endif
