/*
 * Run-time binding of oneDNN. libdnnl (Debian's build) runs on libgomp, and libgomp reads its
 * settings (OMP_WAIT_POLICY, GOMP_SPINCOUNT) once, when it is loaded. Linked normally it would
 * be loaded before main and its worker threads would spin for up to ~3 ms after every parallel
 * region (libgomp's default), fighting other contexts' threads on this 2-core machine. So the
 * engine loads libdnnl (and with it libgomp) with dlopen on first use, after setting
 * GOMP_SPINCOUNT=MTS_OMP_SPINCOUNT unless the environment already sets OMP_WAIT_POLICY or
 * GOMP_SPINCOUNT: a team thread polls for about 20 us after a region, which catches the next
 * step of the same run (waking a sleeping thread costs 10-50 us here, more than many steps of a
 * small network take), then sleeps; libgomp shortens the poll further when it manages more
 * threads than there are CPUs. Contexts that lose more than they gain from their team under
 * load run on one thread instead (engine/team.h). Calls go through the mts_dnnl function table;
 * the build still requires libdnnl-dev (headers and library). The setenv happens once, on the
 * first plan build of the default backend; a program that reads the environment from other
 * threads at that moment should set these itself before starting them.
 */
#define MTS_OMP_SPINCOUNT "2000"

#ifndef MTS_ENGINE_DNNL_RT_H
#define MTS_ENGINE_DNNL_RT_H

#include <stdbool.h>

#include <dnnl.h>

#define MTS_DNNL_FUNCS(X) \
    X(dnnl_dilated_convolution_forward_desc_init) \
    X(dnnl_dilated_deconvolution_forward_desc_init) \
    X(dnnl_engine_create) \
    X(dnnl_memory_create) \
    X(dnnl_memory_desc_equal) \
    X(dnnl_memory_desc_get_size) \
    X(dnnl_memory_desc_init_by_tag) \
    X(dnnl_memory_destroy) \
    X(dnnl_pooling_v2_forward_desc_init) \
    X(dnnl_matmul_desc_init) \
    X(dnnl_post_ops_append_binary) \
    X(dnnl_post_ops_append_sum) \
    X(dnnl_post_ops_append_eltwise) \
    X(dnnl_post_ops_create) \
    X(dnnl_post_ops_destroy) \
    X(dnnl_post_ops_len) \
    X(dnnl_primitive_attr_create) \
    X(dnnl_primitive_attr_destroy) \
    X(dnnl_primitive_attr_set_output_scales) \
    X(dnnl_primitive_attr_set_zero_points) \
    X(dnnl_primitive_attr_set_post_ops) \
    X(dnnl_primitive_attr_set_scratchpad_mode) \
    X(dnnl_primitive_create) \
    X(dnnl_primitive_desc_create) \
    X(dnnl_primitive_desc_destroy) \
    X(dnnl_primitive_desc_query) \
    X(dnnl_primitive_desc_query_md) \
    X(dnnl_primitive_destroy) \
    X(dnnl_primitive_execute) \
    X(dnnl_reorder_primitive_desc_create) \
    X(dnnl_set_primitive_cache_capacity) \
    X(dnnl_stream_create) \
    X(dnnl_stream_destroy) \
    X(dnnl_stream_wait)

typedef struct mts_dnnl_api {
#define MTS_DNNL_X(f) __typeof__(&f) f;
    MTS_DNNL_FUNCS(MTS_DNNL_X)
#undef MTS_DNNL_X
    void (*omp_set_num_threads)(int);
    int (*omp_get_max_threads)(void);
    int (*omp_get_thread_num)(void);
    int (*omp_get_num_threads)(void);
    void (*GOMP_parallel)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
} mts_dnnl_api;

extern mts_dnnl_api mts_dnnl;

/* Loads libdnnl once (thread-safe); false when it is not available (the reference kernels are
 * used then). */
bool mts_dnnl_load(void);

#endif
