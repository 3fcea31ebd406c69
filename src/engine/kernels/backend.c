/*
 * The backend table, and the reference backend: the op tables of the reference kernel files
 * joined into one lookup by op_type. Linear search over about 70 names happens once per node at
 * load time, never per run. The reference backend claims nothing; plans of a model loaded with
 * MTS_BACKEND=reference run its kernels node by node, as the oracle.
 */
#include <string.h>

#include "engine/kernels/kernel.h"

static const mts_op *const *ref_tables(void)
{
    static const mts_op *const tables[] = {mts_ref_ops_conv,   mts_ref_ops_math,   mts_ref_ops_shape,
                                           mts_ref_ops_math2,  mts_ref_ops_signal, mts_ref_ops_random,
                                           mts_ref_ops_quant,  mts_ref_ops_index,  mts_ref_ops_control,
                                           mts_ref_ops_rnn,    mts_ref_ops_loss,   mts_ref_ops_text,   mts_ref_ops_seq,    mts_ref_ops_string, NULL};
    return tables;
}

static const mts_op *ref_lookup(const char *op_type)
{
    for (const mts_op *const *t = ref_tables(); *t; t++)
        for (const mts_op *op = *t; op->op_type; op++)
            if (strcmp(op->op_type, op_type) == 0) return op;
    return NULL;
}

const mts_backend mts_backend_reference = {.name = "reference", .lookup = ref_lookup};

/* The quant entry stands first: its QDQ fusion must see float convolutions before oneDNN
 * claims them. */
const mts_backend *const mts_backends[] = {&mts_backend_quant, &mts_backend_dnnl, &mts_backend_fast,
                                           &mts_backend_reference, NULL};

const mts_op *mts_op_lookup(const char *op_type)
{
    for (int b = 0; mts_backends[b]; b++) {
        const mts_op *op = mts_backends[b]->lookup ? mts_backends[b]->lookup(op_type) : NULL;
        if (op) return op;
    }
    return NULL;
}
