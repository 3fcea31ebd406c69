/*
 * Loads libdnnl with dlopen on first use, after making OpenMP workers wait passively (see
 * dnnl_rt.h), and fills the mts_dnnl function table. Also mts_parallel: a parallel loop on the
 * same OpenMP team, for the engine's own kernels.
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
    if (!getenv("OMP_WAIT_POLICY")) setenv("GOMP_SPINCOUNT", MTS_OMP_SPINCOUNT, 0);
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
#define MTS_DNNL_X(f) \
    if (!(*(void **)&mts_dnnl.f = dlsym(h, #f))) return;
    MTS_DNNL_FUNCS(MTS_DNNL_X)
#undef MTS_DNNL_X
    void *g = dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!g || !(*(void **)&mts_dnnl.omp_set_num_threads = dlsym(g, "omp_set_num_threads")) ||
        !(*(void **)&mts_dnnl.omp_get_max_threads = dlsym(g, "omp_get_max_threads")) ||
        !(*(void **)&mts_dnnl.omp_get_thread_num = dlsym(g, "omp_get_thread_num")) ||
        !(*(void **)&mts_dnnl.omp_get_num_threads = dlsym(g, "omp_get_num_threads")) ||
        !(*(void **)&mts_dnnl.GOMP_parallel = dlsym(g, "GOMP_parallel")))
        return;
    g_ok = true;
}

bool mts_dnnl_load(void)
{
    pthread_once(&g_once, load);
    return g_ok;
}

typedef struct par_job {
    void (*fn)(void *ctx, int ithr, int nthr);
    void *ctx;
    int nthr;
} par_job;

static void par_body(void *arg)
{
    const par_job *j = arg;
    /* The team may be smaller than asked for: every part still runs. */
    int n = mts_dnnl.omp_get_num_threads();
    for (int i = mts_dnnl.omp_get_thread_num(); i < j->nthr; i += n > 0 ? n : 1) j->fn(j->ctx, i, j->nthr);
}

void mts_parallel(int threads, void (*fn)(void *ctx, int ithr, int nthr), void *ctx)
{
    if (threads <= 1 || !mts_dnnl_load()) {
        fn(ctx, 0, 1);
        return;
    }
    par_job j = {fn, ctx, threads};
    mts_dnnl.GOMP_parallel(par_body, &j, (unsigned)threads, 0);
}
