/*
 * Loads libdnnl with dlopen on first use, after making OpenMP workers wait passively (see
 * dnnl_rt.h), and fills the mts_dnnl function table.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "engine/kernels/dnnl_rt.h"

mts_dnnl_api mts_dnnl;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_ok;

static void load(void)
{
    /* Before libgomp is loaded: it reads these once. A value already in the environment wins. */
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
#define MTS_DNNL_X(f) \
    if (!(*(void **)&mts_dnnl.f = dlsym(h, #f))) return;
    MTS_DNNL_FUNCS(MTS_DNNL_X)
#undef MTS_DNNL_X
    void *g = dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!g || !(*(void **)&mts_dnnl.omp_set_num_threads = dlsym(g, "omp_set_num_threads")) ||
        !(*(void **)&mts_dnnl.omp_get_max_threads = dlsym(g, "omp_get_max_threads")))
        return;
    g_ok = true;
}

bool mts_dnnl_load(void)
{
    pthread_once(&g_once, load);
    return g_ok;
}
