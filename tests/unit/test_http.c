/*
 * Tests of the HTTP/1.1 server (src/api/http.c) over real sockets on 127.0.0.1 with ephemeral
 * ports: keep-alive, bodies (Content-Length, chunked, 100-continue), pipelining, the limits and
 * their error responses, large bodies refused from their head by the admission hook, timeouts, asynchronous answers from worker threads, cancellation when
 * the client leaves, zero-copy answers, many concurrent connections, and shutdown with
 * connections open (meant to be run under ASan and TSan as well).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "api/http.h"
#include "api/http_internal.h"

/* ------------------------------------------------------------------ application side */

typedef struct job {
    struct job *next;
    mts_http_conn *c;
    int delay_ms;
} job;

typedef struct app {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *jhead, *jtail;
    bool jstop;
    pthread_t workers[4];
    mts_http_conn *held;      /* a /hold request left unanswered */
    int held_count;
    int cancel_count;
    mts_http_conn *cancelled;
    bool respond_in_cancel;   /* answer /hold requests from on_cancel */
    atomic_int zc_done;
    atomic_int requests;
    mts_http_server *srv;
} app;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *worker_main(void *arg)
{
    app *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->jhead && !a->jstop) pthread_cond_wait(&a->cv, &a->mu);
        if (!a->jhead) break;
        job *j = a->jhead;
        a->jhead = j->next;
        if (!a->jhead) a->jtail = NULL;
        pthread_mutex_unlock(&a->mu);
        if (j->delay_ms) sleep_ms(j->delay_ms);
        mts_http_req *r = mts_http_conn_request(j->c);
        char body[64];
        int n = snprintf(body, sizeof body, "async %s", r->query);
        mts_http_respond(j->c, 200, "text/plain", NULL, body, (size_t)n);
        free(j);
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static void zc_done(void *arg)
{
    atomic_fetch_add(&((app *)arg)->zc_done, 1);
}

static char zc_payload[100000];

static void handler(void *user, mts_http_conn *c, mts_http_req *r)
{
    app *a = user;
    atomic_fetch_add(&a->requests, 1);
    if (strcmp(r->path, "/hello") == 0) {
        mts_http_respond(c, 200, "text/plain", NULL, "hello", 5);
    } else if (strcmp(r->path, "/name") == 0) { /* the name of the I/O thread that read it */
        char name[32] = "";
        pthread_getname_np(pthread_self(), name, sizeof name);
        mts_http_respond(c, 200, "text/plain", NULL, name, strlen(name));
    } else if (strcmp(r->path, "/echo") == 0) {
        char extra[256], name[32] = "";
        pthread_getname_np(pthread_self(), name, sizeof name);
        const char *xt = mts_http_header(r, "x-test");
        snprintf(extra, sizeof extra, "X-Method: %s\r\nX-Query: %s\r\nX-Test: %s\r\nX-Thread: %s\r\n", r->method,
                 r->query, xt ? xt : "-", name);
        mts_http_respond(c, 200, "application/octet-stream", extra, r->body, r->body_len);
    } else if (strcmp(r->path, "/async") == 0) {
        job *j = calloc(1, sizeof *j);
        j->c = c;
        j->delay_ms = atoi(r->query[0] ? r->query + 3 : "0"); /* ?ms=N */
        pthread_mutex_lock(&a->mu);
        if (a->jtail) a->jtail->next = j;
        else a->jhead = j;
        a->jtail = j;
        pthread_cond_signal(&a->cv);
        pthread_mutex_unlock(&a->mu);
    } else if (strcmp(r->path, "/hold") == 0) {
        pthread_mutex_lock(&a->mu);
        a->held = c;
        a->held_count++;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
    } else if (strcmp(r->path, "/zc") == 0) {
        struct iovec v[3] = {{zc_payload, 40000}, {zc_payload + 40000, 0}, {zc_payload + 40000, 60000}};
        mts_http_respondv(c, 200, "application/octet-stream", NULL, v, 3, zc_done, a);
    } else if (strcmp(r->path, "/nocontent") == 0) {
        mts_http_respond(c, 204, NULL, NULL, "ignored", 7);
    } else {
        mts_http_respond_error(c, 404, "no route for \"%s\"", r->path);
    }
}

static void on_cancel(void *user, mts_http_conn *c, mts_http_req *r)
{
    app *a = user;
    pthread_mutex_lock(&a->mu);
    a->cancel_count++;
    a->cancelled = c;
    bool answer = a->respond_in_cancel && strcmp(r->path, "/hold") == 0;
    if (answer && a->held == c) a->held = NULL;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (answer) mts_http_respond(c, 499, NULL, NULL, NULL, 0);
}

static app *app_start(mts_http_opts *o)
{
    app *a = calloc(1, sizeof *a);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    for (int i = 0; i < 4; i++) pthread_create(&a->workers[i], NULL, worker_main, a);
    o->host = "127.0.0.1";
    o->handler = handler;
    o->on_cancel = on_cancel;
    o->user = a;
    mts_err err = {0};
    int rc = mts_http_start(o, &a->srv, &err);
    if (rc) fprintf(stderr, "start: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_true(mts_http_port(a->srv) > 0);
    return a;
}

static void app_stop(app *a)
{
    mts_http_stop(a->srv);
    pthread_mutex_lock(&a->mu);
    a->jstop = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < 4; i++) pthread_join(a->workers[i], NULL);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

/* Waits (up to ms) until *counter (under a->mu) reaches want. */
static bool app_wait(app *a, int *counter, int want, int ms)
{
    int64_t end = now_ms() + ms;
    pthread_mutex_lock(&a->mu);
    while (*counter < want) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&a->cv, &a->mu, &ts);
        if (now_ms() > end) break;
    }
    bool ok = *counter >= want;
    pthread_mutex_unlock(&a->mu);
    return ok;
}

/* ------------------------------------------------------------------ client side */

typedef struct client {
    int fd;
    char *buf;
    size_t len, cap;
    bool next_is_head; /* set before reading the answer to a HEAD request (no body follows) */
} client;

typedef struct resp {
    int status;
    char head[4096];
    char *body;
    size_t body_len;
} resp;

static client *cli_open(int port)
{
    client *k = calloc(1, sizeof *k);
    k->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(k->fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(k->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {5, 0};
    setsockopt(k->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(k->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    k->cap = 1 << 16;
    k->buf = malloc(k->cap);
    return k;
}

static void cli_close(client *k)
{
    if (k->fd >= 0) close(k->fd);
    free(k->buf);
    free(k);
}

static void cli_sendn(client *k, const void *p, size_t n)
{
    const char *s = p;
    while (n) {
        ssize_t w = send(k->fd, s, n, MSG_NOSIGNAL);
        assert_true(w > 0);
        s += w;
        n -= (size_t)w;
    }
}

static void cli_send(client *k, const char *s)
{
    cli_sendn(k, s, strlen(s));
}

/* Reads more bytes; returns bytes read, 0 on EOF/reset, -1 on timeout. */
static ssize_t cli_fill(client *k)
{
    if (k->cap - k->len < 65536) {
        k->cap *= 2;
        k->buf = realloc(k->buf, k->cap);
    }
    ssize_t n = recv(k->fd, k->buf + k->len, k->cap - k->len, 0);
    if (n > 0) k->len += (size_t)n;
    if (n < 0 && (errno == ECONNRESET || errno == EPIPE)) return 0;
    return n;
}

/* Reads one response (status, headers, Content-Length body). Returns false on EOF/timeout. */
static bool cli_read(client *k, resp *r)
{
    memset(r, 0, sizeof *r);
    char *e;
    for (;;) {
        e = k->len ? memmem(k->buf, k->len, "\r\n\r\n", 4) : NULL;
        if (e) break;
        if (cli_fill(k) <= 0) return false;
    }
    size_t hl = (size_t)(e - k->buf) + 4;
    assert_true(hl < sizeof r->head);
    memcpy(r->head, k->buf, hl);
    r->head[hl] = '\0';
    assert_int_equal(sscanf(r->head, "HTTP/1.1 %d", &r->status), 1);
    size_t cl = 0;
    const char *p = strcasestr(r->head, "\r\nContent-Length:");
    if (p) cl = strtoull(p + 17, NULL, 10);
    bool no_body = r->status == 204 || r->status == 304 || r->status < 200;
    bool head_req = k->next_is_head;
    k->next_is_head = false;
    if (no_body || head_req) cl = 0;
    while (k->len < hl + cl)
        if (cli_fill(k) <= 0) return false;
    r->body = malloc(cl + 1);
    memcpy(r->body, k->buf + hl, cl);
    r->body[cl] = '\0';
    r->body_len = cl;
    memmove(k->buf, k->buf + hl + cl, k->len - hl - cl);
    k->len -= hl + cl;
    return true;
}

static void resp_free(resp *r)
{
    free(r->body);
    r->body = NULL;
}

/* True if the server closed the connection (EOF or reset) with nothing more to read. */
static bool cli_eof(client *k)
{
    if (k->len) return false;
    return cli_fill(k) == 0;
}

static bool has_header(const resp *r, const char *line)
{
    return strcasestr(r->head, line) != NULL;
}

/* One request, one response, status and body checked. */
static void roundtrip(client *k, const char *req, int status, const char *body)
{
    cli_send(k, req);
    resp r;
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, status);
    if (body) assert_string_equal(r.body, body);
    resp_free(&r);
}

/* ------------------------------------------------------------------ tests */

static void test_keepalive_get(void **state)
{
    mts_http_opts o = {.io_threads = 2};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    for (int i = 0; i < 5; i++) {
        cli_send(k, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
        resp r;
        assert_true(cli_read(k, &r));
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, "hello");
        assert_true(has_header(&r, "Content-Type: text/plain\r\n"));
        assert_true(has_header(&r, "Content-Length: 5\r\n"));
        assert_false(has_header(&r, "Connection: close"));
        resp_free(&r);
    }
    /* unknown route: JSON error from the application helper */
    cli_send(k, "GET /nope?x=1 HTTP/1.1\r\n\r\n");
    resp r;
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 404);
    assert_string_equal(r.body, "{\"error\":\"no route for \\\"/nope\\\"\"}");
    resp_free(&r);
    /* Connection: close is honoured */
    cli_send(k, "GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert_true(cli_read(k, &r));
    assert_true(has_header(&r, "Connection: close\r\n"));
    resp_free(&r);
    assert_true(cli_eof(k));
    cli_close(k);
    assert_int_equal(atomic_load(&a->requests), 7);
    app_stop(a);
}

static void test_post_body(void **state)
{
    mts_http_opts o = {.io_threads = 1};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    char body[3000];
    for (size_t i = 0; i < sizeof body; i++) body[i] = (char)('a' + i % 26);
    char head[256];
    snprintf(head, sizeof head,
             "POST /echo?a=b&c HTTP/1.1\r\nHost: x\r\nx-TEST:  spaced value \t\r\nContent-Length: %zu\r\n\r\n",
             sizeof body);
    cli_send(k, head);
    cli_sendn(k, body, sizeof body);
    resp r;
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, sizeof body);
    assert_memory_equal(r.body, body, sizeof body);
    assert_true(has_header(&r, "X-Method: POST\r\n"));
    assert_true(has_header(&r, "X-Query: a=b&c\r\n"));
    assert_true(has_header(&r, "X-Test: spaced value\r\n"));
    resp_free(&r);
    /* a 4 MiB body: buffer growth, and a response larger than the socket buffer (EAGAIN) */
    size_t big = 4u << 20;
    char *bb = malloc(big);
    for (size_t i = 0; i < big; i++) bb[i] = (char)(i * 7);
    snprintf(head, sizeof head, "POST /echo HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", big);
    cli_send(k, head);
    cli_sendn(k, bb, big);
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, big);
    assert_memory_equal(r.body, bb, big);
    resp_free(&r);
    free(bb);
    /* the same connection still works */
    roundtrip(k, "GET /hello HTTP/1.1\r\n\r\n", 200, "hello");
    cli_close(k);
    app_stop(a);
}

static void test_pipelined(void **state)
{
    mts_http_opts o = {.io_threads = 1};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    cli_send(k, "GET /hello HTTP/1.1\r\n\r\nPOST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                "GET /async?ms=20 HTTP/1.1\r\n\r\nGET /echo?last HTTP/1.1\r\n\r\n");
    resp r;
    assert_true(cli_read(k, &r));
    assert_string_equal(r.body, "hello");
    resp_free(&r);
    assert_true(cli_read(k, &r));
    assert_string_equal(r.body, "abc");
    resp_free(&r);
    assert_true(cli_read(k, &r));
    assert_string_equal(r.body, "async ms=20");
    resp_free(&r);
    assert_true(cli_read(k, &r));
    assert_true(has_header(&r, "X-Query: last\r\n"));
    resp_free(&r);
    /* 200 pipelined requests in one write */
    char *many = malloc(200 * 40);
    size_t n = 0;
    for (int i = 0; i < 200; i++) n += (size_t)sprintf(many + n, "GET /hello HTTP/1.1\r\n\r\n");
    cli_sendn(k, many, n);
    free(many);
    for (int i = 0; i < 200; i++) {
        assert_true(cli_read(k, &r));
        assert_string_equal(r.body, "hello");
        resp_free(&r);
    }
    cli_close(k);
    app_stop(a);
}

static void test_chunked(void **state)
{
    mts_http_opts o = {.io_threads = 1, .max_body = 100};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    cli_send(k, "POST /echo HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n");
    sleep_ms(10);
    cli_send(k, "5\r\nhel");
    sleep_ms(10);
    cli_send(k, "lo\r\n6;name=val\r\n wor");
    sleep_ms(10);
    cli_send(k, "ld\r\n0\r\nX-Trailer: y\r\n");
    sleep_ms(10);
    cli_send(k, "\r\n");
    resp r;
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello world");
    resp_free(&r);
    /* in one piece, bare LF line ends, pipelined with a following request */
    cli_send(k, "POST /echo HTTP/1.1\nTransfer-Encoding: chunked\n\n3\nabc\nA\n0123456789\n0\n\n"
                "GET /hello HTTP/1.1\r\n\r\n");
    assert_true(cli_read(k, &r));
    assert_string_equal(r.body, "abc0123456789");
    resp_free(&r);
    assert_true(cli_read(k, &r));
    assert_string_equal(r.body, "hello");
    resp_free(&r);
    /* decoded size over max_body (100) */
    cli_send(k, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n");
    char data[64];
    memset(data, 'x', sizeof data);
    cli_sendn(k, data, sizeof data);
    cli_send(k, "\r\n40\r\n");
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 413);
    assert_string_equal(r.body, "{\"error\":\"request body of 128 bytes exceeds the limit of 100 bytes "
                                "(max_message_size_mb)\"}");
    resp_free(&r);
    assert_true(cli_eof(k));
    cli_close(k);
    /* malformed chunk size */
    k = cli_open(mts_http_port(a->srv));
    cli_send(k, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "chunk size"));
    resp_free(&r);
    assert_true(cli_eof(k));
    cli_close(k);
    app_stop(a);
}

static void test_oversize_body_413(void **state)
{
    mts_http_opts o = {.io_threads = 1, .max_body = 1024};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    /* exactly at the limit is fine */
    char *body = calloc(1, 1025);
    memset(body, 'b', 1024);
    cli_send(k, "POST /echo HTTP/1.1\r\nContent-Length: 1024\r\n\r\n");
    cli_sendn(k, body, 1024);
    resp r;
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 1024);
    resp_free(&r);
    /* one byte over: 413 before the body is read, then the connection closes */
    cli_send(k, "POST /echo HTTP/1.1\r\nContent-Length: 1025\r\n\r\n");
    cli_sendn(k, body, 1024);
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 413);
    assert_true(has_header(&r, "Content-Type: application/json\r\n"));
    assert_true(has_header(&r, "Connection: close\r\n"));
    assert_string_equal(r.body, "{\"error\":\"request body of 1025 bytes exceeds the limit of 1024 bytes "
                                "(max_message_size_mb)\"}");
    resp_free(&r);
    assert_true(cli_eof(k));
    cli_close(k);
    free(body);
    /* Expect: 100-continue with a too large body: 413 without 100 Continue */
    k = cli_open(mts_http_port(a->srv));
    cli_send(k, "PUT /echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 999999999999\r\n\r\n");
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 413);
    resp_free(&r);
    assert_true(cli_eof(k));
    cli_close(k);
    app_stop(a);
}

/* The admission hook: refuses "/full" (429, Retry-After 3), lets everything else through. */
static atomic_int admit_calls;
static int admit_full(void *user, const char *method, const char *path, size_t content_length, char *msg, size_t cap,
                      int *retry_after_s)
{
    (void)user;
    atomic_fetch_add(&admit_calls, 1);
    if (strcmp(path, "/full")) return 0;
    snprintf(msg, cap, "%s %s of %zu bytes: the queue is full", method, path, content_length);
    *retry_after_s = 3;
    return 429;
}

/* A large body is offered to the admission hook once its head is read. A refusal is answered
 * before any of the body is sent (429 with Retry-After); the body is then dropped unread and the
 * connection serves its next request, whether the body came after the answer or pipelined with
 * the next request. A client that asked to close, or waits for 100 Continue, gets the answer and
 * the close. An admitted large body and a small one (never offered) are read as usual. */
static void test_admit_refusal(void **state)
{
    mts_http_opts o = {.io_threads = 1, .admit = admit_full};
    app *a = app_start(&o);
    atomic_store(&admit_calls, 0);
    size_t big = MTS_HTTP_ADMIT_MIN;
    char *body = calloc(1, big);
    memset(body, 'b', big);
    char head[200], want[160];
    snprintf(want, sizeof want, "{\"error\":\"POST /full of %zu bytes: the queue is full\"}", big);
    resp r;
    /* refused from the head alone; the body sent after the answer is dropped */
    client *k = cli_open(mts_http_port(a->srv));
    snprintf(head, sizeof head, "POST /full HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", big);
    cli_send(k, head);
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 429);
    assert_true(has_header(&r, "Retry-After: 3\r\n"));
    assert_false(has_header(&r, "Connection: close\r\n"));
    assert_string_equal(r.body, want);
    resp_free(&r);
    cli_sendn(k, body, big);
    cli_send(k, "GET /hello HTTP/1.1\r\n\r\n"); /* the same connection goes on */
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello");
    resp_free(&r);
    /* head, body and the next request in one write */
    size_t hl = (size_t)snprintf(head, sizeof head, "POST /full HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", big);
    static const char next[] = "POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
    char *all = malloc(hl + big + sizeof next);
    memcpy(all, head, hl);
    memcpy(all + hl, body, big);
    memcpy(all + hl + big, next, sizeof next - 1);
    cli_sendn(k, all, hl + big + sizeof next - 1);
    free(all);
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 429);
    resp_free(&r);
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 3);
    assert_memory_equal(r.body, "abc", 3);
    resp_free(&r);
    assert_int_equal(atomic_load(&admit_calls), 2);
    /* small bodies are not offered: read and handed to the handler (which has no such route) */
    cli_send(k, "POST /full HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 404);
    resp_free(&r);
    assert_int_equal(atomic_load(&admit_calls), 2);
    /* an admitted large body: read whole and echoed */
    snprintf(head, sizeof head, "POST /echo HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", big);
    cli_send(k, head);
    cli_sendn(k, body, big);
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, big);
    resp_free(&r);
    assert_int_equal(atomic_load(&admit_calls), 3);
    cli_close(k);
    /* Connection: close, and Expect: 100-continue: the answer, then the connection closes */
    static const char *const heads[] = {"POST /full HTTP/1.1\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n",
                                        "POST /full HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: %zu\r\n\r\n"};
    for (int i = 0; i < 2; i++) {
        k = cli_open(mts_http_port(a->srv));
        snprintf(head, sizeof head, heads[i], big);
        cli_send(k, head);
        assert_true(cli_read(k, &r));
        assert_int_equal(r.status, 429);
        assert_true(has_header(&r, "Connection: close\r\n"));
        resp_free(&r);
        assert_true(cli_eof(k));
        cli_close(k);
    }
    free(body);
    app_stop(a);
}

static void test_expect_continue(void **state)
{
    mts_http_opts o = {.io_threads = 1};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    cli_send(k, "POST /echo HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 5\r\n\r\n");
    resp r;
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 100);
    resp_free(&r);
    cli_send(k, "12345");
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "12345");
    resp_free(&r);
    /* body sent along with the head: no 100 needed */
    cli_send(k, "POST /echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok");
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ok");
    resp_free(&r);
    /* unknown expectation */
    cli_send(k, "POST /echo HTTP/1.1\r\nExpect: magic\r\nContent-Length: 2\r\n\r\nok");
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 417);
    resp_free(&r);
    assert_true(cli_eof(k));
    cli_close(k);
    app_stop(a);
}

static void test_oversize_headers(void **state)
{
    mts_http_opts o = {.io_threads = 1, .max_header = 1024};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    char big[2048];
    memset(big, 'v', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cli_send(k, "GET /hello HTTP/1.1\r\nX-Big: ");
    cli_send(k, big);
    resp r;
    assert_true(cli_read(k, &r)); /* 431 before the head is even complete */
    assert_int_equal(r.status, 431);
    assert_string_equal(r.body, "{\"error\":\"request header section exceeds the limit of 1024 bytes\"}");
    resp_free(&r);
    assert_true(cli_eof(k));
    cli_close(k);
    /* too many header fields */
    k = cli_open(mts_http_port(a->srv));
    o.max_header = 1 << 16;
    char *many = malloc(8192);
    size_t n = (size_t)sprintf(many, "GET /hello HTTP/1.1\r\n");
    for (int i = 0; i < 65; i++) n += (size_t)sprintf(many + n, "h%d: v\r\n", i);
    sprintf(many + n, "\r\n");
    app_stop(a);
    a = app_start(&o);
    cli_close(k);
    k = cli_open(mts_http_port(a->srv));
    cli_send(k, many);
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 431);
    assert_non_null(strstr(r.body, "too many header fields"));
    resp_free(&r);
    assert_true(cli_eof(k));
    cli_close(k);
    /* exactly 64 is fine */
    n = (size_t)sprintf(many, "GET /hello HTTP/1.1\r\n");
    for (int i = 0; i < 64; i++) n += (size_t)sprintf(many + n, "h%d: v\r\n", i);
    sprintf(many + n, "\r\n");
    k = cli_open(mts_http_port(a->srv));
    roundtrip(k, many, 200, "hello");
    cli_close(k);
    free(many);
    app_stop(a);
}

/* Sends one bad request on a fresh connection; expects status, a body containing `frag`, close. */
static void bad(app *a, const char *req, int status, const char *frag)
{
    client *k = cli_open(mts_http_port(a->srv));
    cli_send(k, req);
    resp r;
    assert_true(cli_read(k, &r));
    if (r.status != status || (frag && !strstr(r.body, frag)))
        fprintf(stderr, "request %s -> %d %s\n", req, r.status, r.body);
    assert_int_equal(r.status, status);
    if (frag) assert_non_null(strstr(r.body, frag));
    assert_true(has_header(&r, "Connection: close\r\n"));
    assert_true(has_header(&r, "Content-Type: application/json\r\n"));
    resp_free(&r);
    assert_true(cli_eof(k));
    cli_close(k);
}

static void test_malformed(void **state)
{
    mts_http_opts o = {.io_threads = 1};
    app *a = app_start(&o);
    bad(a, "GARBAGE\r\n\r\n", 400, "{\"error\":\"malformed request line\"}");
    bad(a, "GET /x\r\n\r\n", 400, "malformed request line");
    bad(a, "GET  /x HTTP/1.1\r\n\r\n", 400, "malformed request line");
    bad(a, "GET /x HTTP/1.1 extra\r\n\r\n", 400, "malformed request line");
    bad(a, "GET x HTTP/1.1\r\n\r\n", 400, "malformed request line");
    bad(a, "G(T /x HTTP/1.1\r\n\r\n", 400, "malformed request line");
    bad(a, "GET /x HTTP/1.1\rX\r\n\r\n", 400, "malformed request line");
    bad(a, "GET /x FTP/1.0\r\n\r\n", 400, "malformed request line");
    bad(a, "GET /x HTTP/2.0\r\n\r\n", 505, "not supported");
    bad(a, "GET /x HTTP/1.1\r\nNo colon\r\n\r\n", 400, "malformed header field");
    bad(a, "GET /x HTTP/1.1\r\nName : v\r\n\r\n", 400, "malformed header field");
    bad(a, "GET /x HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400, "folding");
    bad(a, "GET /x HTTP/1.1\r\nA: b\rc\r\n\r\n", 400, "invalid character");
    bad(a, "POST /echo HTTP/1.1\r\nContent-Length: 12a\r\n\r\n", 400, "invalid Content-Length");
    bad(a, "POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "invalid Content-Length");
    bad(a, "POST /echo HTTP/1.1\r\nContent-Length: \r\n\r\n", 400, "invalid Content-Length");
    bad(a, "POST /echo HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400,
        "invalid Content-Length");
    bad(a, "POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400, "conflicting");
    bad(a, "POST /echo HTTP/1.1\r\nContent-Length: 3, 4\r\n\r\nabcd", 400, "conflicting");
    bad(a, "POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "unsupported Transfer-Encoding \\\"gzip\\\"");
    bad(a, "POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "unsupported");
    bad(a, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501,
        "unsupported");
    bad(a, "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400,
        "both Content-Length and Transfer-Encoding");

    /* tolerated: duplicate identical Content-Length, bare LF, leading empty lines, absolute form */
    client *k = cli_open(mts_http_port(a->srv));
    roundtrip(k, "POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-length: 3, 3\r\n\r\nabc", 200, "abc");
    roundtrip(k, "GET /hello HTTP/1.1\nHost: x\n\n", 200, "hello");
    roundtrip(k, "\r\n\r\nGET /hello HTTP/1.1\r\n\r\n", 200, "hello");
    roundtrip(k, "GET http://example.com/hello HTTP/1.1\r\n\r\n", 200, "hello");
    roundtrip(k, "GET /hello%20x HTTP/1.1\r\n\r\n", 404, "{\"error\":\"no route for \\\"/hello%20x\\\"\"}");
    roundtrip(k, "GET /nocontent HTTP/1.1\r\n\r\n", 204, "");
    roundtrip(k, "GET /hello HTTP/1.1\r\n\r\n", 200, "hello");
    cli_close(k);
    app_stop(a);
}

static void test_http10_and_head(void **state)
{
    mts_http_opts o = {.io_threads = 1};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    resp r;
    cli_send(k, "GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_true(cli_read(k, &r));
    assert_string_equal(r.body, "hello");
    assert_true(has_header(&r, "Connection: keep-alive\r\n"));
    resp_free(&r);
    /* HEAD: the headers of the GET, no body; the next response parses cleanly */
    cli_send(k, "HEAD /echo HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 4\r\n\r\nabcd");
    k->next_is_head = true;
    assert_true(cli_read(k, &r));
    assert_true(has_header(&r, "Content-Length: 4\r\n"));
    assert_int_equal(r.body_len, 0);
    resp_free(&r);
    cli_send(k, "GET /hello HTTP/1.0\r\n\r\n");
    assert_true(cli_read(k, &r));
    assert_string_equal(r.body, "hello");
    assert_true(has_header(&r, "Connection: close\r\n"));
    resp_free(&r);
    assert_true(cli_eof(k));
    cli_close(k);
    app_stop(a);
}

static void test_byte_by_byte(void **state)
{
    mts_http_opts o = {.io_threads = 1};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    const char *req = "POST /echo?q HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nwxyz";
    for (const char *p = req; *p; p++) {
        cli_sendn(k, p, 1);
        if ((p - req) % 8 == 0) sleep_ms(1);
    }
    resp r;
    assert_true(cli_read(k, &r));
    assert_string_equal(r.body, "wxyz");
    resp_free(&r);
    cli_close(k);
    app_stop(a);
}

static void test_async(void **state)
{
    mts_http_opts o = {.io_threads = 2};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    for (int i = 0; i < 3; i++) {
        int64_t t0 = now_ms();
        cli_send(k, "GET /async?ms=50 HTTP/1.1\r\n\r\n");
        resp r;
        assert_true(cli_read(k, &r));
        int64_t dt = now_ms() - t0;
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, "async ms=50");
        assert_true(dt >= 45);
        resp_free(&r);
    }
    cli_close(k);
    app_stop(a);
}

static void test_cancel(void **state)
{
    mts_http_opts o = {.io_threads = 2};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    cli_send(k, "GET /hold HTTP/1.1\r\n\r\n");
    assert_true(app_wait(a, &a->held_count, 1, 2000));
    cli_close(k); /* client leaves while the answer is pending */
    assert_true(app_wait(a, &a->cancel_count, 1, 2000));
    pthread_mutex_lock(&a->mu);
    assert_ptr_equal(a->cancelled, a->held);
    mts_http_conn *c = a->held;
    a->held = NULL;
    pthread_mutex_unlock(&a->mu);
    mts_http_respond(c, 200, "text/plain", NULL, "late", 4); /* harmless; frees */

    /* half-close: also treated as going away */
    k = cli_open(mts_http_port(a->srv));
    cli_send(k, "GET /hold HTTP/1.1\r\n\r\n");
    shutdown(k->fd, SHUT_WR);
    assert_true(app_wait(a, &a->held_count, 2, 2000));
    assert_true(app_wait(a, &a->cancel_count, 2, 2000));
    pthread_mutex_lock(&a->mu);
    c = a->held;
    a->held = NULL;
    pthread_mutex_unlock(&a->mu);
    mts_http_respond(c, 200, "text/plain", NULL, "late", 4);
    cli_close(k);

    /* answered before the client leaves: no cancel */
    k = cli_open(mts_http_port(a->srv));
    roundtrip(k, "GET /async?ms=5 HTTP/1.1\r\n\r\n", 200, "async ms=5");
    cli_close(k);
    sleep_ms(50);
    pthread_mutex_lock(&a->mu);
    assert_int_equal(a->cancel_count, 2);
    pthread_mutex_unlock(&a->mu);
    app_stop(a);
}

typedef struct cthread {
    int port, id, failures;
    pthread_t t;
    client *keep; /* a connection left open */
} cthread;

static void *conc_client(void *arg)
{
    cthread *ct = arg;
    client *k = cli_open(ct->port);
    for (int i = 0; i < 20; i++) {
        char req[256], want[64];
        int kind = (ct->id + i) % 3;
        if (kind == 0) {
            snprintf(req, sizeof req, "GET /hello HTTP/1.1\r\n\r\n");
            snprintf(want, sizeof want, "hello");
        } else if (kind == 1) {
            snprintf(want, sizeof want, "c%d-r%d", ct->id, i);
            snprintf(req, sizeof req, "POST /echo HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s", strlen(want), want);
        } else {
            snprintf(req, sizeof req, "GET /async?ms=%d HTTP/1.1\r\n\r\n", i % 3);
            snprintf(want, sizeof want, "async ms=%d", i % 3);
        }
        cli_send(k, req);
        resp r;
        if (!cli_read(k, &r)) {
            ct->failures++;
            break;
        }
        if (r.status != 200 || strcmp(r.body, want) != 0) ct->failures++;
        resp_free(&r);
    }
    cli_close(k);
    return NULL;
}

static void test_concurrent(void **state)
{
    mts_http_opts o = {.io_threads = 2};
    app *a = app_start(&o);
    cthread ct[100];
    for (int i = 0; i < 100; i++) {
        ct[i] = (cthread){.port = mts_http_port(a->srv), .id = i};
        pthread_create(&ct[i].t, NULL, conc_client, &ct[i]);
    }
    int failures = 0;
    for (int i = 0; i < 100; i++) {
        pthread_join(ct[i].t, NULL);
        failures += ct[i].failures;
    }
    assert_int_equal(failures, 0);
    assert_int_equal(atomic_load(&a->requests), 2000);
    app_stop(a);
}

/* light_io: a new connection's requests are read on the light I/O thread; a small request with
 * a small answer keeps the connection there, one with a large answer sends it to the listening
 * thread once the answer is out, a large body is read on the listening thread, and a small
 * exchange brings the connection back; a small answer from another thread keeps it where it is. */
static void test_light_io(void **state)
{
    mts_http_opts o = {.io_threads = 2, .light_io = true};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    const char *name = "GET /name HTTP/1.1\r\n\r\n";
    roundtrip(k, name, 200, "mts-http-light");
    roundtrip(k, name, 200, "mts-http-light");
    /* an answer of 100 KB: read on the light thread, then the connection moves */
    cli_send(k, "GET /zc HTTP/1.1\r\n\r\n");
    resp r;
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 100000);
    assert_memory_equal(r.body, zc_payload, 100000);
    resp_free(&r);
    roundtrip(k, name, 200, "mts-http"); /* small again: moves after its answer */
    roundtrip(k, name, 200, "mts-http-light");

    /* a large body is not read on the light thread */
    size_t big = 100000;
    char *body = malloc(big);
    for (size_t i = 0; i < big; i++) body[i] = (char)('a' + i % 26);
    char head[128];
    snprintf(head, sizeof head, "POST /echo HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", big);
    cli_send(k, head);
    cli_sendn(k, body, big);
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_true(has_header(&r, "X-Thread: mts-http\r\n"));
    assert_int_equal(r.body_len, big);
    assert_memory_equal(r.body, body, big);
    resp_free(&r);
    roundtrip(k, name, 200, "mts-http");
    roundtrip(k, name, 200, "mts-http-light");

    /* small answers from worker threads: the connection stays on the light thread */
    roundtrip(k, "GET /async?ms=2 HTTP/1.1\r\n\r\n", 200, "async ms=2");
    roundtrip(k, name, 200, "mts-http-light");

    /* pipelined requests, the connection moving in between */
    cli_send(k, "GET /name HTTP/1.1\r\n\r\nGET /zc HTTP/1.1\r\n\r\nGET /async?ms=1 HTTP/1.1\r\n\r\n"
                "GET /name HTTP/1.1\r\n\r\n");
    for (int i = 0; i < 4; i++) {
        assert_true(cli_read(k, &r));
        assert_int_equal(r.status, 200);
        if (i == 0) assert_string_equal(r.body, "mts-http-light");
        if (i == 1) assert_int_equal(r.body_len, 100000);
        if (i == 2) assert_string_equal(r.body, "async ms=1");
        if (i == 3) assert_true(!strncmp(r.body, "mts-http", 8));
        resp_free(&r);
    }
    free(body);
    cli_close(k);

    /* without light_io there is no such thread */
    app_stop(a);
    mts_http_opts o2 = {.io_threads = 2};
    a = app_start(&o2);
    k = cli_open(mts_http_port(a->srv));
    roundtrip(k, name, 200, "mts-http");
    roundtrip(k, name, 200, "mts-http");
    cli_close(k);
    app_stop(a);
}

/* Draining: connections stay on their threads, and a large body that arrives on the light thread
 * is read there and answered (with the close every answer now carries). */
static void test_light_io_draining(void **state)
{
    mts_http_opts o = {.io_threads = 2, .light_io = true};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    roundtrip(k, "GET /name HTTP/1.1\r\n\r\n", 200, "mts-http-light");
    mts_http_stop_accepting(a->srv);
    size_t big = 80000;
    char *body = malloc(big);
    memset(body, 'z', big);
    char head[128];
    snprintf(head, sizeof head, "POST /echo HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", big);
    cli_send(k, head);
    cli_sendn(k, body, big);
    resp r;
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 200);
    assert_true(has_header(&r, "X-Thread: mts-http-light\r\n"));
    assert_true(has_header(&r, "Connection: close\r\n"));
    assert_int_equal(r.body_len, big);
    assert_memory_equal(r.body, body, big);
    resp_free(&r);
    assert_true(cli_eof(k));
    free(body);
    cli_close(k);
    app_stop(a);
}

/* Connections moving between the threads all the time, from many clients at once: small
 * exchanges, large answers, answers from worker threads, large bodies; every answer right (run under
 * TSan and ASan in make test). Connections are still open, some on the light thread, at stop. */
static void *light_client(void *arg)
{
    cthread *ct = arg;
    client *k = cli_open(ct->port);
    size_t big = 70000 + (size_t)ct->id * 13;
    char *body = malloc(big + 1);
    for (size_t i = 0; i < big; i++) body[i] = (char)('A' + (i + (size_t)ct->id) % 26);
    for (int i = 0; i < 30; i++) {
        char req[256];
        const char *want = NULL;
        int kind = (ct->id * 7 + i) % 5;
        if (kind == 0 || kind == 1) {
            snprintf(req, sizeof req, "GET /name HTTP/1.1\r\n\r\n");
        } else if (kind == 2) {
            snprintf(req, sizeof req, "GET /zc HTTP/1.1\r\n\r\n");
        } else if (kind == 3) {
            snprintf(req, sizeof req, "GET /async?ms=%d HTTP/1.1\r\n\r\n", i % 2);
            want = i % 2 ? "async ms=1" : "async ms=0";
        } else {
            snprintf(req, sizeof req, "POST /echo HTTP/1.1\r\nContent-Length: %zu\r\n\r\n", big);
        }
        cli_send(k, req);
        if (kind == 4) cli_sendn(k, body, big);
        resp r;
        if (!cli_read(k, &r)) {
            ct->failures++;
            break;
        }
        bool ok = r.status == 200;
        if (kind == 4) ok = ok && r.body_len == big && !memcmp(r.body, body, big);
        else if (kind == 2) ok = ok && r.body_len == 100000 && !memcmp(r.body, zc_payload, 100000);
        else if (want) ok = ok && !strcmp(r.body, want);
        else ok = ok && !strncmp(r.body, "mts-http", 8);
        if (!ok) ct->failures++;
        resp_free(&r);
    }
    free(body);
    if (ct->id % 4) cli_close(k);
    else ct->keep = k; /* left open until the server has stopped */
    return NULL;
}

static void test_light_io_concurrent(void **state)
{
    mts_http_opts o = {.io_threads = 2, .light_io = true};
    app *a = app_start(&o);
    enum { N = 24 };
    cthread ct[N];
    for (int i = 0; i < N; i++) {
        ct[i] = (cthread){.port = mts_http_port(a->srv), .id = i};
        pthread_create(&ct[i].t, NULL, light_client, &ct[i]);
    }
    int failures = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(ct[i].t, NULL);
        failures += ct[i].failures;
    }
    assert_int_equal(failures, 0);
    assert_int_equal(atomic_load(&a->requests), N * 30);
    app_stop(a);
    for (int i = 0; i < N; i++)
        if (ct[i].keep) cli_close(ct[i].keep);
}

static void test_zero_copy(void **state)
{
    mts_http_opts o = {.io_threads = 1};
    app *a = app_start(&o);
    for (size_t i = 0; i < sizeof zc_payload; i++) zc_payload[i] = (char)(i * 13 + 1);
    client *k = cli_open(mts_http_port(a->srv));
    for (int i = 0; i < 3; i++) {
        cli_send(k, "GET /zc HTTP/1.1\r\n\r\n");
        resp r;
        assert_true(cli_read(k, &r));
        assert_int_equal(r.body_len, sizeof zc_payload);
        assert_memory_equal(r.body, zc_payload, sizeof zc_payload);
        resp_free(&r);
    }
    cli_close(k);
    app_stop(a);
}

static void test_zero_copy_done(void **state)
{
    mts_http_opts o = {.io_threads = 1};
    app *a = app_start(&o);
    client *k = cli_open(mts_http_port(a->srv));
    roundtrip(k, "GET /zc HTTP/1.1\r\n\r\n", 200, NULL);
    k->next_is_head = true;
    roundtrip(k, "HEAD /zc HTTP/1.1\r\n\r\n", 200, NULL);
    /* a zero-copy answer whose client is gone: done still runs (at close) */
    cli_send(k, "GET /zc HTTP/1.1\r\n\r\n");
    cli_close(k);
    int64_t end = now_ms() + 2000;
    while (atomic_load(&a->zc_done) < 3 && now_ms() < end) sleep_ms(5);
    mts_http_stop(a->srv);
    assert_int_equal(atomic_load(&a->zc_done), 3);
    a->srv = NULL;
    app_stop(a);
}

static void test_timeouts(void **state)
{
    mts_http_opts o = {.io_threads = 1, .idle_timeout_ms = 200};
    app *a = app_start(&o);
    /* idle keep-alive connection closes */
    client *k = cli_open(mts_http_port(a->srv));
    roundtrip(k, "GET /hello HTTP/1.1\r\n\r\n", 200, "hello");
    int64_t t0 = now_ms();
    assert_true(cli_eof(k));
    int64_t dt = now_ms() - t0;
    assert_true(dt >= 150 && dt < 2000);
    cli_close(k);
    /* slowloris: a byte every 40 ms keeps the connection active but the head never completes */
    k = cli_open(mts_http_port(a->srv));
    const char *slow = "GET /hello HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    t0 = now_ms();
    bool got = false;
    for (const char *p = slow; *p; p++) {
        if (send(k->fd, p, 1, MSG_NOSIGNAL) != 1) break;
        sleep_ms(40);
        struct pollfd pf = {k->fd, POLLIN, 0};
        if (poll(&pf, 1, 0) == 1) {
            got = true;
            break;
        }
    }
    assert_true(got);
    resp r;
    assert_true(cli_read(k, &r));
    assert_int_equal(r.status, 408);
    resp_free(&r);
    assert_true(cli_eof(k));
    dt = now_ms() - t0;
    assert_true(dt >= 150 && dt < 1500);
    cli_close(k);
    /* a pending request is not timed out */
    k = cli_open(mts_http_port(a->srv));
    roundtrip(k, "GET /async?ms=400 HTTP/1.1\r\n\r\n", 200, "async ms=400");
    cli_close(k);
    app_stop(a);
}

static void test_stop_accepting(void **state)
{
    mts_http_opts o = {.io_threads = 2};
    app *a = app_start(&o);
    int port = mts_http_port(a->srv);
    client *idle = cli_open(port);
    roundtrip(idle, "GET /hello HTTP/1.1\r\n\r\n", 200, "hello");
    client *busy = cli_open(port);
    cli_send(busy, "GET /async?ms=100 HTTP/1.1\r\n\r\n");
    for (int64_t end = now_ms() + 3000; atomic_load(&a->requests) < 2 && now_ms() < end;) sleep_ms(2);
    assert_int_equal(atomic_load(&a->requests), 2); /* in flight before draining starts */
    mts_http_stop_accepting(a->srv);
    /* new connections are refused */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_not_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd);
    /* the busy connection gets its answer with close; the idle keep-alive one stays open, so
     * that a request its client is sending at this moment is answered rather than cut off,
     * and its next answer closes it */
    resp r;
    assert_true(cli_read(busy, &r));
    assert_int_equal(r.status, 200);
    assert_true(has_header(&r, "Connection: close\r\n"));
    resp_free(&r);
    assert_true(cli_eof(busy));
    cli_send(idle, "GET /hello HTTP/1.1\r\n\r\n");
    assert_true(cli_read(idle, &r));
    assert_int_equal(r.status, 200);
    assert_true(has_header(&r, "Connection: close\r\n"));
    resp_free(&r);
    assert_true(cli_eof(idle));
    cli_close(idle);
    cli_close(busy);
    mts_http_stop_accepting(a->srv); /* idempotent */
    app_stop(a);
}

/* Clients that connect, send one request and read its answer, in tight loops, while the server
 * stops accepting: each connection either is refused or gets its answer; none that connected is
 * reset or closed unanswered (a handshake under way when the listener starts closing completes
 * and is accepted, not dropped and then reset by the close). */
typedef struct storm {
    int port;
    atomic_int answered, refused, lost, other;
} storm;

static void *storm_client(void *arg)
{
    storm *st = arg;
    static const char req[] = "GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n";
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct timeval tv = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)st->port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            atomic_fetch_add(errno == ECONNREFUSED ? &st->refused : &st->other, 1);
            close(fd);
            return NULL;
        }
        bool ok = send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof req - 1);
        char buf[512];
        size_t len = 0;
        while (ok && len < 12) { /* "HTTP/1.1 200" */
            ssize_t n = recv(fd, buf + len, sizeof buf - len, 0);
            if (n <= 0) ok = false;
            else len += (size_t)n;
        }
        close(fd);
        if (!ok || memcmp(buf, "HTTP/1.1 200", 12)) {
            atomic_fetch_add(&st->lost, 1);
            return NULL;
        }
        atomic_fetch_add(&st->answered, 1);
    }
}

static void test_stop_accepting_under_connect_storm(void **state)
{
    (void)state;
    mts_http_opts o = {.io_threads = 2};
    app *a = app_start(&o);
    storm st = {.port = mts_http_port(a->srv)};
    enum { N = 6 };
    pthread_t t[N];
    for (int i = 0; i < N; i++) assert_int_equal(pthread_create(&t[i], NULL, storm_client, &st), 0);
    for (int64_t end = now_ms() + 3000; atomic_load(&st.answered) < 200 && now_ms() < end;) sleep_ms(1);
    mts_http_stop_accepting(a->srv);
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    printf("connect storm across stop_accepting: %d answered, %d refused, %d lost, %d other errors\n",
           atomic_load(&st.answered), atomic_load(&st.refused), atomic_load(&st.lost), atomic_load(&st.other));
    assert_true(atomic_load(&st.answered) >= 200);
    assert_int_equal(atomic_load(&st.lost), 0);
    assert_int_equal(atomic_load(&st.other), 0);
    assert_int_equal(atomic_load(&st.refused), N);
    app_stop(a);
}

/* With light_io, light connections stay on the light thread: the listening thread that accepts
 * finds none of them idle, and the light thread makes the room (or refuses). */
static void max_connections(bool light_io)
{
    mts_http_opts o = {.io_threads = 1, .max_connections = 2, .light_io = light_io};
    app *a = app_start(&o);
    int port = mts_http_port(a->srv);
    const char *req = light_io ? "GET /name HTTP/1.1\r\n\r\n" : "GET /hello HTTP/1.1\r\n\r\n";
    const char *want = light_io ? "mts-http-light" : "hello";
    client *k1 = cli_open(port), *k2 = cli_open(port);
    roundtrip(k1, req, 200, want);
    sleep_ms(20);
    roundtrip(k2, req, 200, want);
    /* full with two idle keep-alive connections: a new client is admitted by closing the one
     * idle the longest (k1), not refused */
    client *k3 = cli_open(port);
    roundtrip(k3, req, 200, want);
    assert_true(cli_eof(k1));
    cli_close(k1);
    /* full with nothing idle (k2 and k3 each wait for an answer): 503 and close */
    cli_send(k2, "GET /async?ms=400 HTTP/1.1\r\n\r\n");
    cli_send(k3, "GET /async?ms=400 HTTP/1.1\r\n\r\n");
    for (int64_t end = now_ms() + 3000; atomic_load(&a->requests) < 5 && now_ms() < end;) sleep_ms(2);
    client *k4 = cli_open(port);
    resp r;
    assert_true(cli_read(k4, &r));
    assert_int_equal(r.status, 503);
    resp_free(&r);
    assert_true(cli_eof(k4));
    cli_close(k4);
    assert_true(cli_read(k2, &r));
    assert_int_equal(r.status, 200);
    resp_free(&r);
    assert_true(cli_read(k3, &r));
    assert_int_equal(r.status, 200);
    resp_free(&r);
    cli_close(k3);
    cli_close(k2);
    app_stop(a);
}

static void test_max_connections(void **state)
{
    max_connections(false);
    max_connections(true);
}

static void test_stop_with_open_connections(void **state)
{
    mts_http_opts o = {.io_threads = 2};
    app *a = app_start(&o);
    a->respond_in_cancel = true;
    int port = mts_http_port(a->srv);
    client *ks[6];
    for (int i = 0; i < 6; i++) ks[i] = cli_open(port);
    roundtrip(ks[0], "GET /hello HTTP/1.1\r\n\r\n", 200, "hello");                   /* idle */
    cli_send(ks[1], "GET /hello HTTP/1.1\r\nHost: partial");                        /* half a head */
    cli_send(ks[2], "POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\nhalf a body"); /* half a body */
    cli_send(ks[3], "GET /hold HTTP/1.1\r\n\r\n");                                  /* pending */
    cli_send(ks[4], "GET /async?ms=30 HTTP/1.1\r\n\r\n");                           /* worker */
    assert_true(app_wait(a, &a->held_count, 1, 2000));
    sleep_ms(10);
    /* ks[5]: connected, nothing sent */
    mts_http_stop(a->srv); /* cancels /hold (answered in on_cancel), waits for the worker */
    a->srv = NULL;
    pthread_mutex_lock(&a->mu);
    assert_true(a->cancel_count >= 1);
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < 6; i++) cli_close(ks[i]);
    app_stop(a);
}

/* The parser driven through mts_http_parse_stream (the fuzz target's path): a body refused from
 * its head is dropped from the socket whatever the read size, and the requests after it on the
 * connection are parsed; a path the hook admits is read as usual. */
static int refuse_infer(void *user, const char *method, const char *path, size_t content_length, char *msg,
                        size_t cap, int *retry_after_s)
{
    (*(int *)user)++;
    if (strcmp(method, "POST") || !strstr(path, "infer")) return 0;
    snprintf(msg, cap, "{\"error\":\"queue full (%zu bytes)\"}", content_length);
    *retry_after_s = 2;
    return 503;
}

static void collect_paths(void *user, const mts_http_req *r)
{
    char *paths = user;
    strcat(paths, r->path);
    strcat(paths, ";");
}

static void test_parse_stream_admission(void **state)
{
    (void)state;
    char body[200];
    memset(body, 'x', sizeof body);
    char stream[1024];
    snprintf(stream, sizeof stream,
             "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 200\r\n\r\n%.200s"
             "POST /upload HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
             "GET /v2/health/ready HTTP/1.1\r\nConnection: close\r\n\r\n",
             body);
    static const size_t reads[] = {0, 1, 3, 7, 64, 150, 4096};
    for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++) {
        char paths[256] = "";
        int asked = 0, status = -1;
        int n = mts_http_parse_stream(stream, strlen(stream), reads[i], 0, 0, refuse_infer, &asked, 4, collect_paths,
                                      paths, &status);
        assert_int_equal(asked, 2); /* the two bodies of at least 4 bytes */
        assert_int_equal(n, 2);
        assert_string_equal(paths, "/upload;/v2/health/ready;");
        assert_int_equal(status, 0);
    }
    /* below the hook's size the body is read, and the refused request is answered, not parsed */
    char paths[256] = "";
    int asked = 0, status = -1;
    int n = mts_http_parse_stream(stream, strlen(stream), 0, 0, 0, refuse_infer, &asked, 1000, collect_paths, paths,
                                  &status);
    assert_int_equal(asked, 0);
    assert_int_equal(n, 3);
    assert_string_equal(paths, "/v2/models/m/infer;/upload;/v2/health/ready;");
}

static void test_start_errors(void **state)
{
    mts_http_server *s;
    mts_err err = {0};
    mts_http_opts o = {0};
    assert_int_equal(mts_http_start(&o, &s, &err), MTS_EINVAL);
    o.handler = handler;
    o.host = "no such host.invalid";
    assert_int_not_equal(mts_http_start(&o, &s, &err), 0);
    o.host = "127.0.0.1";
    o.port = 70000;
    assert_int_equal(mts_http_start(&o, &s, &err), MTS_EINVAL);
    mts_http_stop(NULL);
    /* a port already served (SO_REUSEPORT must not let a second server share it) */
    mts_http_opts o2 = {.io_threads = 2};
    app *a = app_start(&o2);
    o.port = mts_http_port(a->srv);
    assert_int_equal(mts_http_start(&o, &s, &err), MTS_EIO);
    assert_non_null(strstr(err.msg, "in use"));
    app_stop(a);
    /* ... and is free again after stop */
    o.io_threads = 2;
    assert_int_equal(mts_http_start(&o, &s, &err), 0);
    assert_int_equal(mts_http_port(s), o.port);
    mts_http_stop(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keepalive_get),
        cmocka_unit_test(test_post_body),
        cmocka_unit_test(test_pipelined),
        cmocka_unit_test(test_chunked),
        cmocka_unit_test(test_oversize_body_413),
        cmocka_unit_test(test_admit_refusal),
        cmocka_unit_test(test_expect_continue),
        cmocka_unit_test(test_oversize_headers),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_http10_and_head),
        cmocka_unit_test(test_byte_by_byte),
        cmocka_unit_test(test_async),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_light_io),
        cmocka_unit_test(test_light_io_concurrent),
        cmocka_unit_test(test_light_io_draining),
        cmocka_unit_test(test_zero_copy),
        cmocka_unit_test(test_zero_copy_done),
        cmocka_unit_test(test_timeouts),
        cmocka_unit_test(test_stop_accepting),
        cmocka_unit_test(test_stop_accepting_under_connect_storm),
        cmocka_unit_test(test_max_connections),
        cmocka_unit_test(test_stop_with_open_connections),
        cmocka_unit_test(test_start_errors),
        cmocka_unit_test(test_parse_stream_admission),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
