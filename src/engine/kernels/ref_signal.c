/*
 * stub
 */
#include "engine/kernels/kernel.h"
const mts_op mts_ref_ops_signal[] = {{NULL, NULL, NULL}};
