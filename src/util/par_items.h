/*
 * Running independent items (plan steps whose oneDNN primitives are compiled, for instance) on a
 * few short-lived threads: each thread takes the next item index from a shared counter until
 * none is left. For work that is not OpenMP's (the engine's own parallel loops use the OpenMP
 * team, kernels/dnnl_rt.h): JIT compilation and weight packing, where a team would sit idle.
 */
#ifndef MTS_UTIL_PAR_ITEMS_H
#define MTS_UTIL_PAR_ITEMS_H

/* Calls fn(ctx, i) once for every i in [0, n), on the calling thread and up to max_threads - 1
 * more (never more than the machine's CPUs, and one thread per min_per_thread items at most).
 * Returns when all calls have returned. fn must be safe to call concurrently. */
void mts_par_items(int n, int max_threads, int min_per_thread, void (*fn)(void *ctx, int i), void *ctx);

#endif
