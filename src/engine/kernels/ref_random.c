/*
 * stub
 */
#include "engine/kernels/kernel.h"
const mts_op mts_ref_ops_random[] = {{NULL, NULL, NULL}};
