/*
 * mts_par_items: independent items on a few short-lived pthreads (see par_items.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "util/par_items.h"

#define PAR_ITEMS_MAX 8

typedef struct {
    int n;
    atomic_int next;
    void (*fn)(void *, int);
    void *ctx;
} par_items_job;

static void *par_items_main(void *arg)
{
    par_items_job *j = arg;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) j->fn(j->ctx, i);
    return NULL;
}

void mts_par_items(int n, int max_threads, int min_per_thread, void (*fn)(void *ctx, int i), void *ctx)
{
    par_items_job j = {n, 0, fn, ctx};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = max_threads < PAR_ITEMS_MAX ? max_threads : PAR_ITEMS_MAX;
    if (cpus >= 1 && nt > cpus) nt = (int)cpus;
    if (min_per_thread > 0 && nt > n / min_per_thread) nt = n / min_per_thread;
    if (nt < 1) nt = 1;
    pthread_t th[PAR_ITEMS_MAX];
    int started = 0;
    for (int t = 1; t < nt; t++)
        if (pthread_create(&th[started], NULL, par_items_main, &j) == 0) started++;
    par_items_main(&j);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
}
