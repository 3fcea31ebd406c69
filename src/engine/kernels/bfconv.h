/*
 * The engine's bf16 3x3 convolution for few output channels (bfconv.c), one form of a
 * oneDNN-backend step (dnnl_conv.c) in bf16 plans on CPUs with AVX512-BF16 and without AMX.
 * Internal to the backend.
 */
#ifndef MTS_ENGINE_BFCONV_H
#define MTS_ENGINE_BFCONV_H

#include "engine/kernels/dnnl_ops.h"

typedef struct mts_bfconv mts_bfconv;

/* Whether s runs here: a bf16 2-D convolution, group 1, 3x3, stride 1, dilation 1, padding 1,
 * 8 output channels from at most 64 inputs, perhaps read through a nearest 2x upsampling;
 * source channels-last (bf16 or float) or channels-first float, destination in either layout;
 * post-ops Relu / LeakyRelu / Clip / scalar affine / a residual Add in the destination's
 * layout; the CPU has AVX512-BF16 and no AMX (there oneDNN's tiles win); MTS_NO_BFCONV unset. */
bool mts_bfconv_ok(const mts_dconv_spec *s);
/* Copies and packs the weights it needs. */
int mts_bfconv_create(const mts_dconv_spec *s, mts_bfconv **out, mts_err *err);
void mts_bfconv_free(mts_bfconv *k);
/* Scratch bytes one run on `threads` threads needs. */
size_t mts_bfconv_scratch(const mts_bfconv *k, int threads);
/* src, dst and the residuals (the ADD post-ops' tensors, in post-op order) as the spec said. */
void mts_bfconv_run(const mts_bfconv *k, int threads, const void *src, void *dst, const float *const *resid,
                    void *scratch);
/* Kernels created so far in this process (for tests). */
int64_t mts_bfconv_created(void);

#endif
