/*
 * Throughput probe for the HTTP layer (src/api/http.c): a server whose handler answers every
 * request at once with a 16-byte text body, to be loaded with wrk over loopback. Not built by
 * CMake/ctest. Build and run:
 *
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Isrc tests/perf/http_hello.c src/api/http.c src/util/status.c \
 *       -o /tmp/http_hello -lpthread
 *   /tmp/http_hello [port=8080] [io_threads=2] [seconds=0 (until SIGINT/SIGTERM)] &
 *   wrk -t2 -c64 -d5s http://127.0.0.1:8080/
 *
 * Path "/async" answers the same body from a second thread instead (measures the cross-thread
 * completion queue and eventfd wake-up).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/http.h"

static const char BODY[] = "Hello, mtserve!\n"; /* 16 bytes */

static volatile sig_atomic_t quit;
static atomic_long served;

/* A single hand-off slot ring for the /async path. */
#define RING 4096
static mts_http_conn *ring[RING];
static unsigned head, tail;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int stop_worker;

static void *worker(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (head == tail && !stop_worker) pthread_cond_wait(&cv, &mu);
        if (head == tail) break;
        mts_http_conn *c = ring[tail++ % RING];
        pthread_mutex_unlock(&mu);
        mts_http_respond(c, 200, "text/plain", NULL, BODY, sizeof BODY - 1);
        pthread_mutex_lock(&mu);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

static void handler(void *user, mts_http_conn *c, mts_http_req *req)
{
    (void)user;
    atomic_fetch_add_explicit(&served, 1, memory_order_relaxed);
    if (strcmp(req->path, "/async") == 0) {
        pthread_mutex_lock(&mu);
        if (head - tail < RING) {
            ring[head++ % RING] = c;
            pthread_cond_signal(&cv);
            pthread_mutex_unlock(&mu);
            return;
        }
        pthread_mutex_unlock(&mu);
    }
    mts_http_respond(c, 200, "text/plain", NULL, BODY, sizeof BODY - 1);
}

static void on_signal(int sig)
{
    (void)sig;
    quit = 1;
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 8080;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    int seconds = argc > 3 ? atoi(argv[3]) : 0;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    pthread_t w;
    pthread_create(&w, NULL, worker, NULL);
    mts_http_opts o = {.host = "127.0.0.1", .port = port, .io_threads = threads, .handler = handler};
    mts_http_server *s;
    mts_err err = {0};
    if (mts_http_start(&o, &s, &err)) {
        fprintf(stderr, "http_hello: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "http_hello: listening on 127.0.0.1:%d with %d I/O threads\n", mts_http_port(s), threads);
    for (int t = 0; !quit && (seconds <= 0 || t < seconds * 10); t++) usleep(100000);
    mts_http_stop_accepting(s);
    mts_http_stop(s);
    pthread_mutex_lock(&mu);
    stop_worker = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(w, NULL);
    fprintf(stderr, "http_hello: served %ld requests\n", atomic_load(&served));
    return 0;
}
