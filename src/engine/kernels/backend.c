/*
 * The reference backend: joins the op tables of the kernel files into one lookup by op_type.
 * Linear search over about 70 names happens once per node at plan time, never per run.
 */
#include <string.h>

#include "engine/kernels/kernel.h"

static const mts_op *const *ref_tables(void)
{
    static const mts_op *const tables[] = {mts_ref_ops_conv, mts_ref_ops_math, mts_ref_ops_shape, NULL};
    return tables;
}

static const mts_op *ref_lookup(const char *op_type)
{
    for (const mts_op *const *t = ref_tables(); *t; t++)
        for (const mts_op *op = *t; op->op_type; op++)
            if (strcmp(op->op_type, op_type) == 0) return op;
    return NULL;
}

const mts_backend *mts_backend_reference(void)
{
    static const mts_backend ref = {"reference", ref_lookup};
    return &ref;
}

const mts_op *mts_op_lookup(const char *op_type)
{
    return mts_backend_reference()->lookup(op_type);
}
