/*
 * The work queue (workq.h): a mutex-protected singly linked FIFO and N threads that pop
 * and run jobs. destroy() lets the threads drain the queue before they exit, so every job
 * queued before shutdown runs (each one answers its client).
 */
#include "util/workq.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct job {
    mts_work_fn fn;
    void *arg;
    struct job *next;
} job;

struct mts_workq {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    job *head, *tail;
    int pending;
    bool stop;
    int n, nice;
    pthread_t *threads;
};

static void *worker(void *arg)
{
    mts_workq *q = arg;
    if (q->nice) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), q->nice); /* per-thread on Linux */
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->lock);
        job *j = q->head;
        if (!j) break; /* stop and drained */
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        pthread_mutex_unlock(&q->lock);
        j->fn(j->arg);
        free(j);
        pthread_mutex_lock(&q->lock);
        q->pending--;
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

int mts_workq_create(int threads, int nice, const char *name, mts_workq **out, mts_err *err)
{
    mts_workq *q = calloc(1, sizeof *q);
    if (!q) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    q->n = threads < 1 ? 1 : threads;
    q->nice = nice;
    q->threads = calloc((size_t)q->n, sizeof *q->threads);
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (!q->threads) {
        free(q);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    for (int i = 0; i < q->n; i++) {
        if (pthread_create(&q->threads[i], NULL, worker, q)) {
            q->n = i;
            mts_workq_destroy(q);
            return mts_err_set(err, MTS_ENOMEM, "cannot start media threads");
        }
        if (name) pthread_setname_np(q->threads[i], name);
    }
    *out = q;
    return MTS_OK;
}

int mts_workq_submit(mts_workq *q, mts_work_fn fn, void *arg)
{
    job *j = malloc(sizeof *j);
    if (!j) return MTS_ENOMEM;
    j->fn = fn;
    j->arg = arg;
    j->next = NULL;
    pthread_mutex_lock(&q->lock);
    if (q->stop) {
        pthread_mutex_unlock(&q->lock);
        free(j);
        return MTS_EUNAVAILABLE;
    }
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
    q->pending++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->lock);
    return MTS_OK;
}

int mts_workq_pending(mts_workq *q)
{
    pthread_mutex_lock(&q->lock);
    int n = q->pending;
    pthread_mutex_unlock(&q->lock);
    return n;
}

void mts_workq_destroy(mts_workq *q)
{
    if (!q) return;
    pthread_mutex_lock(&q->lock);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->lock);
    for (int i = 0; i < q->n; i++) pthread_join(q->threads[i], NULL);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->cv);
    free(q->threads);
    free(q);
}
