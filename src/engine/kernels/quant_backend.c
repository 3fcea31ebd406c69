/*
 * The quantized kernels' entry in the backend table: in plans of the default backend it
 * substitutes the packed integer-GEMM kernels (qgemm.h, AVX-512 VNNI where the CPU has it) for
 * the reference MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv steps (ref_quant.c);
 * both share their validation and requantization, so only the product differs. Plans of the
 * reference backend keep the reference kernels. MTS_NO_FAST=1 turns the substitution off for
 * comparisons, like the fast float kernels.
 */
#include <string.h>

#include "engine/rewrite.h"

extern const mts_op mts_quant_fast_matmulinteger, mts_quant_fast_qlinearmatmul, mts_quant_fast_convinteger,
    mts_quant_fast_qlinearconv;

static bool quant_enabled(int kind)
{
    return kind == MTS_BACKEND_DEFAULT && mts_fast_enabled();
}

static int quant_substitute(mts__opt *o, int self, mts__step *st, mts_err *err)
{
    (void)o, (void)self, (void)err;
    if (st->kind != MTS__S_KERNEL || st->nhwc) return MTS_OK;
    if (is_op(st, "MatMulInteger")) st->op = &mts_quant_fast_matmulinteger;
    else if (is_op(st, "QLinearMatMul")) st->op = &mts_quant_fast_qlinearmatmul;
    else if (is_op(st, "ConvInteger")) st->op = &mts_quant_fast_convinteger;
    else if (is_op(st, "QLinearConv")) st->op = &mts_quant_fast_qlinearconv;
    return MTS_OK;
}

const mts_backend mts_backend_quant = {
    .name = "quant",
    .enabled = quant_enabled,
    .substitute = quant_substitute,
};
