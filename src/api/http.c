/*
 * The HTTP/1.1 server of http.h: I/O threads on epoll, an incremental request parser, response
 * queues and connection lifetime.
 *
 * Threads. Each I/O thread owns an epoll set, an eventfd and its connections; all connection
 * state is touched only by the owning thread. The listening threads each have a SO_REUSEPORT
 * listener. With light_io each listening thread has a partner, a light I/O thread that owns the
 * connections whose requests and answers are small (under admit_min, 64 KiB): on a listening
 * thread such a request would wait behind whatever that thread's other connections bring in the
 * same turn (under a flood of large uploads, tens to hundreds of ms of reading). New connections
 * start on the light partner; one whose request has a large, chunked or compressed body goes to
 * the listening thread before the body is read (and before its buffer is allocated), one whose
 * answer is large once it is out, and a small exchange brings it back. A connection moves only
 * while nothing is in flight on it: it leaves the owner's epoll set and list and is put in the
 * partner's inbox under the partner's queue mutex, the only thing the two threads share. Light
 * threads ask for real-time scheduling (util/rtprio.h) with light_realtime.
 * The one thing other threads do is mts_http_respond*: the response is formatted on the calling
 * thread and appended to the owning thread's completion queue (mutex; the eventfd is written,
 * after the mutex is released, only when the queue goes from empty to non-empty). Control (stop
 * accepting, stop) is a pair of atomic flags plus an eventfd write.
 *
 * Connections are registered edge-triggered, for IN|OUT|RDHUP (again on each move). The parser
 * works on one growable read buffer; every offset of the request being parsed is relative to its
 * start (req_start), so the buffer can be compacted or reallocated while a request head or body
 * is still arriving. A complete request is dispatched with pointers into the buffer and nothing more
 * is read until it is answered (at most one request in flight). Chunked bodies are decoded in
 * place; a gzip or deflate body (Content-Encoding) is then inflated into a buffer of its own,
 * bounded by max_body as it grows, which lives until the answer is dequeued. Output is a list of
 * chunks (a formatted head with an optional copied body, plus optional application-owned pieces)
 * written with sendmsg(MSG_NOSIGNAL) and gathered iovecs.
 *
 * Lifetime: a connection's memory is freed only on its I/O thread and only when its socket is
 * closed, no request is awaiting its answer and no function up the stack is using it (busy). So a
 * handle held by a worker stays valid until the worker's answer has been dequeued, even if the
 * client left long before (on_cancel tells the application once).
 */
#include "api/http.h"
#include "api/http_tls.h"
#include "api/http_internal.h"
#include "util/iobuf.h"
#include "util/rtprio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/filter.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define OUT_HIGH_WATER (64 * 1024) /* stop parsing pipelined requests above this much output */
#define RBUF_INIT 4096
#define RBUF_MIN_READ 2048          /* grow/compact the read buffer below this much free space */
#define RBUF_KEEP (64 * 1024)       /* an idle connection keeps at most this much buffer */
#define CHUNK_LINE_MAX 1024         /* chunk-size line incl. extensions */
#define LINGER_MS 2000              /* reading and discarding after an error response */
#define STOP_LINGER_MS 1000         /* at stop: longest wait for clients to close after their answers */
#define ACCEPT_BATCH 64
#define LISTEN_CLOSE_MS 50          /* a closing listener completes handshakes begun before for this long */
#define MAX_EVENTS 256
#define IOV_BATCH 64

#define ADDR_BUCKETS 1024           /* per-client-address connection counts */
#define ADDR_KEY 17                 /* address family + 16 address bytes (IPv4 in the first 4) */

enum { P_MORE, P_READY, P_ERROR };
enum { RS_HEAD, RS_BODY_CL, RS_BODY_CHUNKED, RS_READY, RS_PENDING, RS_CLOSING, RS_LINGER, RS_DISCARD };
enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER };
enum { ENC_IDENTITY, ENC_GZIP, ENC_DEFLATE }; /* request Content-Encoding */
enum { MOVE_NONE, MOVE_LIGHT, MOVE_REGULAR }; /* connection moves between I/O threads */
#define INFLATE_FIRST (256 * 1024) /* first size of a decoded body's buffer (it doubles as needed) */

typedef struct io_thread io_thread;

typedef struct out_chunk {
    struct out_chunk *next;
    mts_http_conn *conn;   /* while in a completion queue */
    int niov, iov_idx;
    bool close_after;      /* the head said "Connection: close" */
    bool fail;             /* no memory for the response: close the connection */
    bool heap;             /* malloc'ed (else a connection's embedded node) */
    size_t bytes;
    void (*done)(void *);
    void *done_arg;
    struct iovec *iov;
} out_chunk;

struct mts_http_conn {
    int fd;
    mts_tls *ssl;               /* TLS session (server with a certificate), else NULL */
    uint8_t addr[ADDR_KEY];     /* client address, when counted against max_per_client */
    bool addr_counted;
    io_thread *io;
    mts_http_conn *prev, *next; /* the I/O thread's list of open connections */
    int state;
    int busy;                   /* functions up the stack using the connection */
    bool pending;               /* dispatched and answer not yet dequeued */
    bool in_cb;                 /* inside handler/on_cancel: answers are taken inline */
    bool cancelled, peer_eof, rdhup, drained;
    bool served;                /* has dispatched a request (a fresh connection has not) */
    bool small_req;             /* the request in flight came with an uncompressed body under admit_min bytes */
    int move;                   /* MOVE_*: the I/O thread class this connection should go to */
    bool over_limit;            /* accepted beyond max_connections with nothing idle on the
                                 * accepting thread: its light partner closes one of its idle
                                 * connections for it, or refuses it */
    int encoding;               /* the request body's Content-Encoding (ENC_*) */
    size_t align_at;            /* body offset the application wants 64-byte aligned, or SIZE_MAX */
    size_t place_need, place_align; /* place_need > 0: the body's buffer is still to be placed
                                     * (rbuf_place's arguments), by the thread that reads it */
    char *inflated;             /* the decoded body of a compressed request (an I/O buffer), until
                                 * its answer is dequeued */
    size_t inflated_off, inflated_len;
    bool keep_alive, is_head, http10, chunked, expect_continue, path_root;
    size_t discard_left; /* RS_DISCARD: bytes of a refused body still to drop from the socket */
    atomic_int responded;
    out_chunk *inline_resp;

    char *rbuf;
    size_t rcap, rlen, req_start;
    /* per-request, relative to req_start */
    size_t scan, line_start, head_end, body_start, body_len, content_length, req_end;
    size_t cpos, chunk_left, trailer_start;
    int chunk_state;
    uint32_t m_off, p_off, q_off;
    int nh;
    uint32_t h_off[MTS_HTTP_MAX_HEADERS][2];

    out_chunk *out_head, *out_tail;
    size_t out_bytes;

    int64_t last_ms, head_start_ms, linger_until_ms;
    mts_http_req req;
    out_chunk fail_node;
};

struct io_thread {
    mts_http_server *srv;
    pthread_t tid;
    int epfd, evfd, lfd;
    bool listener_registered;
    int64_t accept_resume_ms;   /* accept paused (EMFILE) until then; 0 = not paused */
    int64_t listen_close_ms;    /* closing: new SYNs are dropped, the listener closes then */
    int64_t stop_deadline_ms;   /* stopping: connections still open then are closed at once */
    int64_t now_ms, next_scan_ms;
    mts_http_conn *conns;       /* open connections */
    mts_http_conn *graveyard;   /* freed at the end of the loop iteration (events may still name them) */
    int nconns;
    int npending;               /* dispatched requests whose answer has not been dequeued */
    bool drain_done, stop_done;
    char ev_tag, l_tag;         /* addresses used as epoll tags */

    pthread_mutex_t qmu;
    out_chunk *qhead, *qtail;
    bool qsignalled;
    atomic_int waking;          /* threads about to write evfd after leaving qmu */
    bool light;                 /* the light I/O thread: no listener, light connections only */
    mts_http_conn *inbox;       /* connections handed over by another I/O thread (qmu) */
    bool closed;                /* exited: takes no more connections (qmu) */
};

/* Open connections of one client address (max_per_client). */
typedef struct addr_count {
    struct addr_count *next;
    uint8_t key[ADDR_KEY];
    int n;
} addr_count;

struct mts_http_server {
    mts_http_opts o;
    size_t admit_min; /* bodies from this many bytes are asked about (MTS_HTTP_ADMIT_MIN) */
    /* connections per client address, shared by the I/O threads (a client's connections land
     * on any of them); only used with max_per_client */
    pthread_mutex_t addr_mu;
    addr_count *addr_tab[ADDR_BUCKETS];
    mts_tls_ctx *ssl_ctx; /* TLS: every connection speaks it; NULL: plaintext */
    int port;
    int nthreads;               /* I/O threads: nlisten listening ones, then nlight light ones */
    int nlisten, nlight;        /* nlight is nlisten with light_io, else 0 */
    io_thread *threads;
    atomic_int draining, stopping;
    atomic_int nconns;
    int listeners_open;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static _Thread_local io_thread *tls_io;

/* ------------------------------------------------------------------ small helpers */

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    }
    return "Unknown";
}

/* RFC 9110 tchar */
static const unsigned char tchar_tab[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1, ['*'] = 1, ['+'] = 1,
    ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['|'] = 1, ['~'] = 1,
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1,
    ['8'] = 1, ['9'] = 1,
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1,
    ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1,
    ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1,
    ['Y'] = 1, ['Z'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1,
    ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1,
    ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,
    ['y'] = 1, ['z'] = 1,
};

static bool is_token(const char *s, size_t n)
{
    if (!n) return false;
    for (size_t i = 0; i < n; i++)
        if (!tchar_tab[(unsigned char)s[i]]) return false;
    return true;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Case-insensitive comparison of [s, s+n) with the lowercase literal lit. */
static bool ieq(const char *s, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    return n == m && strncasecmp(s, lit, n) == 0;
}

/* JSON string body {"error":"msg"}; non-ASCII becomes '?'. Returns the length written (< cap). */
static size_t json_error(char *out, size_t cap, const char *msg)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    const char *pre = "{\"error\":\"";
    size_t pl = strlen(pre);
    memcpy(out, pre, pl);
    n = pl;
    for (const unsigned char *p = (const unsigned char *)msg; *p && n + 8 < cap; p++) {
        unsigned char ch = *p;
        if (ch == '"' || ch == '\\') {
            out[n++] = '\\';
            out[n++] = (char)ch;
        } else if (ch < 0x20) {
            out[n++] = '\\';
            out[n++] = 'u';
            out[n++] = '0';
            out[n++] = '0';
            out[n++] = hex[ch >> 4];
            out[n++] = hex[ch & 15];
        } else {
            out[n++] = ch < 0x7f ? (char)ch : '?';
        }
    }
    out[n++] = '"';
    out[n++] = '}';
    out[n] = '\0';
    return n;
}

static char *put(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

#define PUTLIT(p, lit) put((p), (lit), sizeof(lit) - 1)

static char *put_uint(char *p, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n) *p++ = tmp[--n];
    return p;
}

/* Upper bound of a formatted head's size (without the content type and extra headers). */
#define HEAD_FIXED_MAX 192

/* Formats the response head into p; returns its end. conn_hdr: 0 none, 1 close, 2 keep-alive. */
static char *format_head(char *p, int status, const char *ctype, size_t ctype_len,
                         const char *extra, size_t extra_len, bool send_cl, size_t clen,
                         int conn_hdr)
{
    if (status < 100 || status > 999) status = 500;
    p = PUTLIT(p, "HTTP/1.1 ");
    p = put_uint(p, (uint64_t)status);
    *p++ = ' ';
    const char *rs = reason(status);
    p = put(p, rs, strlen(rs));
    p = PUTLIT(p, "\r\n");
    if (ctype) {
        p = PUTLIT(p, "Content-Type: ");
        p = put(p, ctype, ctype_len);
        p = PUTLIT(p, "\r\n");
    }
    if (send_cl) {
        p = PUTLIT(p, "Content-Length: ");
        p = put_uint(p, clen);
        p = PUTLIT(p, "\r\n");
    }
    if (conn_hdr == 1) p = PUTLIT(p, "Connection: close\r\n");
    if (conn_hdr == 2) p = PUTLIT(p, "Connection: keep-alive\r\n");
    if (extra_len) {
        p = put(p, extra, extra_len);
        if (extra[extra_len - 1] != '\n') p = PUTLIT(p, "\r\n");
    }
    return PUTLIT(p, "\r\n");
}

/* ------------------------------------------------------------------ output chunks */

/* One allocation: chunk, n_app + 1 iovecs, then `data` bytes (the head, maybe a copied body). */
static out_chunk *chunk_alloc(int n_app, size_t data)
{
    size_t sz = sizeof(out_chunk) + (size_t)(n_app + 1) * sizeof(struct iovec) + data;
    out_chunk *ch = malloc(sz);
    if (!ch) return NULL;
    memset(ch, 0, sizeof *ch);
    ch->heap = true;
    ch->iov = (struct iovec *)(ch + 1);
    return ch;
}

static char *chunk_data(out_chunk *ch, int n_app)
{
    return (char *)(ch->iov + n_app + 1);
}

static void chunk_free(out_chunk *ch)
{
    if (ch->done) ch->done(ch->done_arg);
    if (ch->heap) free(ch);
}

/* ------------------------------------------------------------------ connections */

static void conn_flush(mts_http_conn *c);
static void conn_pump(mts_http_conn *c);

static size_t avail_bytes(const mts_http_conn *c)
{
    return c->rlen - c->req_start;
}

static void conn_free(mts_http_conn *c)
{
    mts_iobuf_free(c->inflated);
    while (c->out_head) {
        out_chunk *ch = c->out_head;
        c->out_head = ch->next;
        chunk_free(ch);
    }
    mts_iobuf_free(c->rbuf);
    free(c);
}

/* The memory goes once the socket is closed, the answer (if any) has been dequeued and nobody up
 * the stack uses it; the actual free waits for the end of the loop iteration because later
 * entries of the current epoll batch may still point at it. */
static void conn_maybe_free(mts_http_conn *c)
{
    if (c->fd < 0 && !c->pending && c->busy == 0) {
        c->busy = -1; /* queued once */
        c->next = c->io->graveyard;
        c->io->graveyard = c;
    }
}

static void free_graveyard(io_thread *io)
{
    while (io->graveyard) {
        mts_http_conn *c = io->graveyard;
        io->graveyard = c->next;
        conn_free(c);
    }
}

#define HOLD(c) ((c)->busy++)
#define RELEASE(c)                                     \
    do {                                               \
        if (--(c)->busy == 0) conn_maybe_free(c);      \
    } while (0)

/* ---- connections per client address ---- */

static void addr_key(const struct sockaddr_storage *ss, uint8_t key[ADDR_KEY])
{
    memset(key, 0, ADDR_KEY);
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ss;
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (!memcmp(a6->sin6_addr.s6_addr, v4mapped, 12)) { /* the same client as its IPv4 form */
            key[0] = AF_INET;
            memcpy(key + 1, a6->sin6_addr.s6_addr + 12, 4);
        } else {
            key[0] = AF_INET6;
            memcpy(key + 1, a6->sin6_addr.s6_addr, 16);
        }
    } else if (ss->ss_family == AF_INET) {
        key[0] = AF_INET;
        memcpy(key + 1, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    } else {
        key[0] = (uint8_t)ss->ss_family; /* unix sockets and the like: one shared count */
    }
}

static unsigned addr_hash(const uint8_t key[ADDR_KEY])
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < ADDR_KEY; i++) h = (h ^ key[i]) * 16777619u;
    return h % ADDR_BUCKETS;
}

/* Counts a new connection of `key`; false when the address already holds max_per_client. */
static bool addr_acquire(mts_http_server *s, const uint8_t key[ADDR_KEY])
{
    bool ok = true;
    pthread_mutex_lock(&s->addr_mu);
    addr_count **slot = &s->addr_tab[addr_hash(key)], *e = *slot;
    while (e && memcmp(e->key, key, ADDR_KEY)) e = e->next;
    if (!e) {
        e = calloc(1, sizeof *e);
        if (e) {
            memcpy(e->key, key, ADDR_KEY);
            e->next = *slot;
            *slot = e;
        }
    }
    if (!e || e->n >= s->o.max_per_client) ok = false;
    else e->n++;
    pthread_mutex_unlock(&s->addr_mu);
    return ok;
}

static void addr_release(mts_http_server *s, const uint8_t key[ADDR_KEY])
{
    pthread_mutex_lock(&s->addr_mu);
    addr_count **slot = &s->addr_tab[addr_hash(key)];
    while (*slot && memcmp((*slot)->key, key, ADDR_KEY)) slot = &(*slot)->next;
    if (*slot && --(*slot)->n <= 0) {
        addr_count *e = *slot;
        *slot = e->next;
        free(e);
    }
    pthread_mutex_unlock(&s->addr_mu);
}

static void list_remove(io_thread *io, mts_http_conn *c)
{
    if (c->prev) c->prev->next = c->next;
    else io->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = c->next = NULL;
    io->nconns--;
}

static void complete_response(mts_http_conn *c, out_chunk *ch);

/* Closes the socket at once. An unanswered request is cancelled (once); the memory stays until
 * the answer arrives. Output not yet written is dropped. */
static void conn_abort(mts_http_conn *c)
{
    if (c->fd < 0) return;
    io_thread *io = c->io;
    mts_tls_free(c->ssl);
    c->ssl = NULL;
    close(c->fd);
    c->fd = -1;
    list_remove(io, c);
    atomic_fetch_sub_explicit(&io->srv->nconns, 1, memory_order_relaxed);
    if (c->addr_counted) addr_release(io->srv, c->addr);
    c->addr_counted = false;
    while (c->out_head) {
        out_chunk *ch = c->out_head;
        c->out_head = ch->next;
        chunk_free(ch);
    }
    c->out_tail = NULL;
    c->out_bytes = 0;
    if (c->pending && !c->cancelled && io->srv->o.on_cancel &&
        !atomic_load_explicit(&c->responded, memory_order_acquire)) {
        c->cancelled = true;
        HOLD(c);
        c->in_cb = true;
        io->srv->o.on_cancel(io->srv->o.user, c, &c->req);
        c->in_cb = false;
        if (c->inline_resp) {
            out_chunk *ch = c->inline_resp;
            c->inline_resp = NULL;
            complete_response(c, ch);
        }
        RELEASE(c);
    }
}

static void out_append(mts_http_conn *c, out_chunk *ch)
{
    ch->next = NULL;
    if (c->out_tail) c->out_tail->next = ch;
    else c->out_head = ch;
    c->out_tail = ch;
    c->out_bytes += ch->bytes;
}

/* Best-effort immediate error (used where the connection is dropped right after). */
static void send_now(int fd, int status, const char *msg)
{
    char body[256], buf[512];
    size_t bl = json_error(body, sizeof body, msg);
    char *p = format_head(buf, status, "application/json", 16, NULL, 0, true, bl, 1);
    memcpy(p, body, bl);
    p += bl;
    ssize_t r = send(fd, buf, (size_t)(p - buf), MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)r;
}

/* An error answer generated by this layer: {"error": msg} as JSON, one more header line extra
 * (NULL: none), and with close "Connection: close" (the connection then closes once it is
 * written). NULL when out of memory. */
static out_chunk *error_chunk(int status, const char *extra, const char *msg, bool close)
{
    char body[1024];
    size_t bl = json_error(body, sizeof body, msg), el = extra ? strlen(extra) : 0;
    out_chunk *ch = chunk_alloc(0, HEAD_FIXED_MAX + 16 + el + 2 + bl);
    if (!ch) return NULL;
    char *d = chunk_data(ch, 0);
    char *p = format_head(d, status, "application/json", 16, extra, el, true, bl, close ? 1 : 0);
    memcpy(p, body, bl);
    p += bl;
    ch->niov = 1;
    ch->iov[0].iov_base = d;
    ch->iov[0].iov_len = (size_t)(p - d);
    ch->bytes = (size_t)(p - d);
    ch->close_after = close;
    return ch;
}

/* Queues an error response generated by this layer and stops reading requests (the connection
 * is closed once it is written). Returns P_ERROR. */
static int http_error_v(mts_http_conn *c, int status, const char *extra, const char *fmt, va_list ap)
{
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    out_chunk *ch = error_chunk(status, extra, msg, true);
    c->state = RS_CLOSING;
    if (ch) out_append(c, ch);
    return P_ERROR;
}

static int http_error(mts_http_conn *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int http_error(mts_http_conn *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = http_error_v(c, status, NULL, fmt, ap);
    va_end(ap);
    return rc;
}

/* The same with one more header line (extra, without its CRLF; NULL or "" for none). */
static int http_error_hdr(mts_http_conn *c, int status, const char *extra, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int http_error_hdr(mts_http_conn *c, int status, const char *extra, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = http_error_v(c, status, extra, fmt, ap);
    va_end(ap);
    return rc;
}

static void reset_request(mts_http_conn *c)
{
    mts_iobuf_free(c->inflated);
    c->inflated = NULL;
    c->inflated_off = c->inflated_len = 0;
    c->encoding = ENC_IDENTITY;
    c->align_at = SIZE_MAX;
    c->state = RS_HEAD;
    c->scan = c->line_start = c->head_end = c->body_start = c->body_len = 0;
    c->content_length = c->req_end = c->cpos = c->chunk_left = c->trailer_start = 0;
    c->chunk_state = CH_SIZE;
    c->nh = 0;
    c->chunked = c->expect_continue = c->path_root = false;
    c->place_need = 0;
    c->head_start_ms = 0;
}

/* The answer for the pending request arrived (on the I/O thread). */
static void complete_response(mts_http_conn *c, out_chunk *ch)
{
    io_thread *io = c->io;
    c->pending = false;
    io->npending--;
    if (c->fd < 0) {
        if (ch) chunk_free(ch);
        return;
    }
    if (!ch || ch->fail) {
        if (ch) chunk_free(ch);
        conn_abort(c);
        return;
    }
    out_append(c, ch);
    c->last_ms = io->now_ms;
    /* small request, small answer: the connection belongs on the light I/O thread; a large one
     * in either direction, on the listening one */
    if (io->srv->nlight) {
        bool light = c->small_req && ch->bytes < io->srv->admit_min;
        c->move = light == io->light ? MOVE_NONE : light ? MOVE_LIGHT : MOVE_REGULAR;
    }
    /* release the request's bytes */
    c->req_start += c->req_end;
    bool close_after = ch->close_after;
    reset_request(c);
    if (close_after) c->state = RS_CLOSING;
    if (c->req_start == c->rlen) {
        c->req_start = c->rlen = 0;
        if (c->rcap > RBUF_KEEP) {
            mts_iobuf_free(c->rbuf);
            c->rbuf = NULL;
            c->rcap = 0;
        }
    }
}

static ssize_t conn_recv(mts_http_conn *c, void *buf, size_t n)
{
    return c->ssl ? mts_tls_read(c->ssl, buf, n) : read(c->fd, buf, n);
}

/* Reads and drops what a closing connection's client still sends; aborts at EOF or an error. */
static void linger_read(mts_http_conn *c)
{
    char tmp[16384];
    for (;;) {
        /* plain TCP discards in the kernel (MSG_TRUNC), with no copy: a refused upload's body */
        ssize_t n = c->ssl ? conn_recv(c, tmp, sizeof tmp) : recv(c->fd, NULL, (size_t)1 << 20, MSG_TRUNC);
        if (n > 0) continue;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        conn_abort(c);
        return;
    }
}

/* Starts closing after the last response went out: half-close, then read and discard what the
 * client still sends (so its unread data does not turn our FIN into a RST that destroys the
 * response) until EOF or LINGER_MS. */
static void begin_close(mts_http_conn *c)
{
    if (c->peer_eof) {
        conn_abort(c);
        return;
    }
    if (c->ssl) mts_tls_close(c->ssl); /* close_notify before the FIN */
    shutdown(c->fd, SHUT_WR);
    c->state = RS_LINGER;
    c->linger_until_ms = c->io->now_ms + LINGER_MS;
    linger_read(c);
}

static void conn_flush(mts_http_conn *c)
{
    while (c->out_head && c->fd >= 0) {
        struct iovec iov[IOV_BATCH];
        int n = 0;
        for (out_chunk *ch = c->out_head; ch && n < IOV_BATCH; ch = ch->next)
            for (int i = ch->iov_idx; i < ch->niov && n < IOV_BATCH; i++) iov[n++] = ch->iov[i];
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = c->ssl ? mts_tls_writev(c->ssl, iov, n) : sendmsg(c->fd, &m, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            conn_abort(c);
            return;
        }
        c->last_ms = c->io->now_ms;
        c->out_bytes -= (size_t)w;
        size_t left = (size_t)w;
        while (c->out_head) {
            out_chunk *ch = c->out_head;
            while (ch->iov_idx < ch->niov && left >= ch->iov[ch->iov_idx].iov_len) {
                left -= ch->iov[ch->iov_idx].iov_len;
                ch->iov_idx++;
            }
            if (ch->iov_idx < ch->niov) {
                ch->iov[ch->iov_idx].iov_base = (char *)ch->iov[ch->iov_idx].iov_base + left;
                ch->iov[ch->iov_idx].iov_len -= left;
                break;
            }
            c->out_head = ch->next;
            if (!c->out_head) c->out_tail = NULL;
            chunk_free(ch);
        }
    }
    if (c->fd >= 0 && !c->out_head && c->state == RS_CLOSING) begin_close(c);
}

/* Makes at least RBUF_MIN_READ bytes of room after the buffered bytes: moves the current
 * request to the front, or grows the buffer. Returns false when out of memory. */
static bool rbuf_room(mts_http_conn *c)
{
    if (c->rcap - c->rlen < RBUF_MIN_READ) {
        if (c->req_start > 0) {
            memmove(c->rbuf, c->rbuf + c->req_start, c->rlen - c->req_start);
            c->rlen -= c->req_start;
            c->req_start = 0;
        }
        if (c->rcap - c->rlen < RBUF_MIN_READ) {
            size_t ncap = c->rcap ? c->rcap * 2 : RBUF_INIT;
            char *nb = mts_iobuf_grow(c->rbuf, c->rlen, ncap);
            if (!nb) return false;
            c->rbuf = nb;
            c->rcap = mts_iobuf_capacity(nb);
        }
    }
    return true;
}

/* Connections change threads only while the server runs normally: once it drains or stops,
 * each stays where it is (its thread answers it and closes it). */
static bool moves_open(const io_thread *io)
{
    return !io->stop_done && !atomic_load(&io->srv->draining);
}

/* The connection's request body is read on a listening thread, not this light one: it moves. */
static bool leaves_light(const mts_http_conn *c)
{
    return c->move == MOVE_REGULAR && c->io->light && moves_open(c->io);
}

/* Called once a request head with Content-Length is parsed: makes room for the whole request
 * (`need` bytes from its start, plus RBUF_MIN_READ) in one step instead of doubling the buffer as
 * the body arrives, and, when align_at is not SIZE_MAX, moves the request so that its byte
 * align_at lands on a 64-byte boundary (the buffer itself is 64-byte aligned): the application
 * can then use tensor bytes in the body where they are instead of copying them to realign. A
 * new buffer comes from the I/O buffer cache (iobuf.h: a large one is reused, or mapped with its
 * pages faulted in at once, milliseconds for megabytes). Returns false when out of memory. */
static bool rbuf_place(mts_http_conn *c, size_t need, size_t align_at)
{
    size_t have = c->rlen - c->req_start; /* this request's bytes so far, and any pipelined after */
    if (have > need) need = have;
    size_t start = align_at == SIZE_MAX ? c->req_start : (64 - align_at % 64) % 64;
    if (c->rbuf && c->rcap >= start + need + RBUF_MIN_READ) {
        if (start != c->req_start) memmove(c->rbuf + start, c->rbuf + c->req_start, have);
    } else {
        if (align_at == SIZE_MAX) start = 0;
        char *nb = mts_iobuf_alloc(start + need + RBUF_MIN_READ);
        if (!nb) return false;
        if (have) memcpy(nb + start, c->rbuf + c->req_start, have);
        mts_iobuf_free(c->rbuf);
        c->rbuf = nb;
        c->rcap = mts_iobuf_capacity(nb);
    }
    c->req_start = start;
    c->rlen = start + have;
    return true;
}

/* Places a parsed head's body buffer where parse_head left that to the reading thread. False:
 * out of memory, the connection aborted. */
static bool place_body(mts_http_conn *c)
{
    size_t need = c->place_need, align = c->place_align;
    c->place_need = 0;
    if (!need || rbuf_place(c, need, align)) return true;
    conn_abort(c);
    return false;
}

/* Reads once. Returns 1 (bytes arrived), 0 (EOF), -1 (nothing now), -2 (connection aborted). */
static int conn_read(mts_http_conn *c)
{
    if (!rbuf_room(c)) {
        conn_abort(c);
        return -2;
    }
    size_t space = c->rcap - c->rlen;
    for (;;) {
        ssize_t n = conn_recv(c, c->rbuf + c->rlen, space);
        if (n > 0) {
            c->rlen += (size_t)n;
            c->last_ms = c->io->now_ms;
            /* edge-triggered: a short read drained the socket; new data brings a new event.
             * After RDHUP keep reading until EOF is seen. A TLS read returns one record at a
             * time, so only EAGAIN says the socket is drained there. */
            if ((size_t)n < space && !c->rdhup && !c->ssl) c->drained = true;
            return 1;
        }
        if (n == 0) {
            c->peer_eof = true;
            return 0;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            c->drained = true;
            return -1;
        }
        conn_abort(c);
        return -2;
    }
}

/* ------------------------------------------------------------------ request parsing */

/* Answers a request refused from its head (status, extra header line, message) and drops its
 * Content-Length body of cl bytes unread: what the buffer holds of it at once, the rest from the
 * socket in the kernel (RS_DISCARD, MSG_TRUNC: no copy), after which the connection goes on with
 * the next request (or closes, if the client asked for that). Returns P_MORE. */
static int refuse_body(mts_http_conn *c, int status, const char *extra, const char *msg, size_t head_len, size_t cl)
{
    out_chunk *ch = error_chunk(status, extra, msg, !c->keep_alive);
    if (!ch) {
        conn_abort(c);
        return P_ERROR;
    }
    out_append(c, ch);
    size_t inbuf = avail_bytes(c) - head_len, have = inbuf < cl ? inbuf : cl;
    c->req_start += head_len + have;
    if (c->req_start == c->rlen) c->req_start = c->rlen = 0;
    reset_request(c); /* keep_alive stays: it is the connection's */
    c->discard_left = cl - have;
    if (!c->keep_alive) c->state = RS_CLOSING; /* the answer goes, then the lingering read drops the rest */
    else if (c->discard_left) c->state = RS_DISCARD;
    return P_MORE;
}

/* RS_DISCARD: drops the rest of a refused body from the socket. True once it is all gone (the
 * connection then reads its next request); false when the socket is drained for now or the
 * connection ended. */
static bool discard_body(mts_http_conn *c)
{
    while (c->discard_left) {
        size_t want = c->discard_left < ((size_t)1 << 20) ? c->discard_left : (size_t)1 << 20;
        ssize_t n = recv(c->fd, NULL, want, MSG_TRUNC | MSG_DONTWAIT);
        if (n > 0) {
            c->discard_left -= (size_t)n < c->discard_left ? (size_t)n : c->discard_left;
            c->last_ms = c->io->now_ms;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->drained = true;
            return false;
        }
        if (n == 0) c->peer_eof = true;
        c->state = RS_CLOSING; /* the client left, or the socket failed: the answer may still go */
        if (n < 0) conn_abort(c);
        return false;
    }
    c->state = RS_HEAD;
    return true;
}

static int parse_head(mts_http_conn *c)
{
    const mts_http_server *srv = c->io->srv;
    char *b = c->rbuf + c->req_start;
    size_t end = c->head_end;

    /* request line */
    char *eol = memchr(b, '\n', end);
    size_t ll = (size_t)(eol - b);
    if (ll && b[ll - 1] == '\r') ll--;
    char *sp1 = memchr(b, ' ', ll);
    if (!sp1 || !is_token(b, (size_t)(sp1 - b)))
        return http_error(c, 400, "malformed request line");
    char *t = sp1 + 1;
    char *le = b + ll;
    char *sp2 = memchr(t, ' ', (size_t)(le - t));
    if (!sp2 || sp2 == t) return http_error(c, 400, "malformed request line");
    for (char *p = t; p < sp2; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f) return http_error(c, 400, "malformed request line");
    char *v = sp2 + 1;
    size_t vl = (size_t)(le - v);
    if (vl == 8 && memcmp(v, "HTTP/1.", 7) == 0 && (v[7] == '0' || v[7] == '1')) {
        c->http10 = v[7] == '0';
    } else if (vl == 8 && memcmp(v, "HTTP/", 5) == 0 && v[5] >= '0' && v[5] <= '9' && v[6] == '.' &&
               v[7] >= '0' && v[7] <= '9') {
        return http_error(c, 505, "HTTP version %.8s is not supported (use HTTP/1.1)", v);
    } else {
        return http_error(c, 400, "malformed request line");
    }
    size_t ml = (size_t)(sp1 - b);
    char *path = t;
    c->path_root = false;
    if (*t == '/') {
        path = t;
    } else if (*t == '*' && sp2 == t + 1 && ieq(b, ml, "options")) {
        path = t;
    } else if ((size_t)(sp2 - t) > 8 && (strncasecmp(t, "http://", 7) == 0 || strncasecmp(t, "https://", 8) == 0)) {
        path = t + (t[4] == ':' ? 7 : 8); /* past "scheme://", then skip the authority */
        while (path < sp2 && *path != '/' && *path != '?') path++;
        if (path == sp2 || *path == '?') c->path_root = true; /* "http://host" or "http://host?q" */
    } else {
        return http_error(c, 400, "malformed request line");
    }
    char *q = memchr(path, '?', (size_t)(sp2 - path));
    *sp1 = '\0';
    *sp2 = '\0';
    c->m_off = 0;
    c->p_off = (uint32_t)(path - b);
    if (q) {
        *q = '\0';
        c->q_off = (uint32_t)(q + 1 - b);
    } else {
        c->q_off = (uint32_t)(sp2 - b);
    }
    c->is_head = ieq(b, ml, "head");

    /* header fields */
    bool have_cl = false, conn_close = false, conn_ka = false;
    int te_count = 0;
    bool te_bad = false;
    char te_val[64] = "";
    size_t cl = 0, align_at = SIZE_MAX; /* body offset the application wants 64-byte aligned */
    size_t pos = (size_t)(eol - b) + 1;
    while (pos < end) {
        char *ls = b + pos;
        char *nl = memchr(ls, '\n', end - pos);
        size_t len = (size_t)(nl - ls);
        pos += len + 1;
        if (len && ls[len - 1] == '\r') len--;
        if (len == 0) break;
        if (*ls == ' ' || *ls == '\t')
            return http_error(c, 400, "obsolete header line folding is not supported");
        char *colon = memchr(ls, ':', len);
        if (!colon || !is_token(ls, (size_t)(colon - ls)))
            return http_error(c, 400, "malformed header field");
        char *val = colon + 1, *ve = ls + len;
        while (val < ve && (*val == ' ' || *val == '\t')) val++;
        while (ve > val && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        for (char *p = val; p < ve; p++) {
            unsigned char ch = (unsigned char)*p;
            if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
                return http_error(c, 400, "invalid character in header field value");
        }
        if (c->nh == MTS_HTTP_MAX_HEADERS)
            return http_error(c, 431, "too many header fields (the limit is %d)", MTS_HTTP_MAX_HEADERS);
        size_t nl_ = (size_t)(colon - ls), vlen = (size_t)(ve - val);
        *colon = '\0';
        *ve = '\0';
        c->h_off[c->nh][0] = (uint32_t)(ls - b);
        c->h_off[c->nh][1] = (uint32_t)(val - b);
        c->nh++;

        if (ieq(ls, nl_, "content-length")) {
            /* a list of identical values ("5, 5") is allowed, like duplicates */
            const char *p = val, *e = val + vlen;
            while (p <= e) {
                const char *s = p;
                size_t x = 0;
                while (p < e && *p >= '0' && *p <= '9') {
                    if (x > (SIZE_MAX - 9) / 10) return http_error(c, 400, "invalid Content-Length");
                    x = x * 10 + (size_t)(*p - '0');
                    p++;
                }
                if (p == s) return http_error(c, 400, "invalid Content-Length");
                if (have_cl && x != cl) return http_error(c, 400, "conflicting Content-Length values");
                have_cl = true;
                cl = x;
                while (p < e && (*p == ' ' || *p == '\t')) p++;
                if (p == e) break;
                if (*p != ',') return http_error(c, 400, "invalid Content-Length");
                p++;
                while (p < e && (*p == ' ' || *p == '\t')) p++;
            }
        } else if (ieq(ls, nl_, "transfer-encoding")) {
            te_count++;
            if (!ieq(val, vlen, "chunked")) {
                te_bad = true;
                snprintf(te_val, sizeof te_val, "%.*s", (int)(vlen < 60 ? vlen : 60), val);
            }
        } else if (ieq(ls, nl_, "connection")) {
            const char *p = val, *e = val + vlen;
            while (p < e) {
                while (p < e && (*p == ' ' || *p == '\t' || *p == ',')) p++;
                const char *s = p;
                while (p < e && *p != ',' && *p != ' ' && *p != '\t') p++;
                if (ieq(s, (size_t)(p - s), "close")) conn_close = true;
                else if (ieq(s, (size_t)(p - s), "keep-alive")) conn_ka = true;
            }
        } else if (srv->o.align_header && ieq(ls, nl_, srv->o.align_header)) {
            size_t x = 0, k = 0;
            while (k < vlen && val[k] >= '0' && val[k] <= '9' && x < ((size_t)1 << 40))
                x = x * 10 + (size_t)(val[k++] - '0');
            if (k == vlen && k > 0) align_at = x; /* else the application reports the bad value */
        } else if (ieq(ls, nl_, "content-encoding")) {
            if (c->encoding != ENC_IDENTITY)
                return http_error(c, 415, "more than one Content-Encoding; one of gzip, deflate or identity is supported");
            if (ieq(val, vlen, "gzip") || ieq(val, vlen, "x-gzip")) c->encoding = ENC_GZIP;
            else if (ieq(val, vlen, "deflate")) c->encoding = ENC_DEFLATE;
            else if (!ieq(val, vlen, "identity"))
                return http_error(c, 415, "unsupported Content-Encoding \"%.60s\" (gzip, deflate and identity are "
                                          "supported)", val);
        } else if (ieq(ls, nl_, "expect")) {
            if (!ieq(val, vlen, "100-continue"))
                return http_error(c, 417, "unsupported Expect value \"%.60s\"", val);
            c->expect_continue = true;
        }
    }

    if (te_count) {
        if (te_bad || te_count > 1)
            return http_error(c, 501, "unsupported Transfer-Encoding \"%s\" (only chunked is supported)",
                              te_bad ? te_val : "chunked, chunked");
        if (have_cl) return http_error(c, 400, "both Content-Length and Transfer-Encoding are present");
        c->chunked = true;
    }
    c->keep_alive = c->http10 ? (conn_ka && !conn_close) : !conn_close;
    c->align_at = align_at;

    size_t need_more_body = 0;
    /* a large, chunked or compressed body is not read on the light I/O thread: the connection
     * moves first (a small compressed body may inflate to max_body: not short work) */
    if (srv->nlight && (c->chunked || cl >= srv->admit_min || c->encoding != ENC_IDENTITY))
        c->move = c->io->light ? MOVE_REGULAR : MOVE_NONE;
    if (c->chunked) {
        c->state = RS_BODY_CHUNKED;
        c->body_start = c->cpos = end;
        c->chunk_state = CH_SIZE;
        need_more_body = avail_bytes(c) == end;
    } else if (cl > srv->o.max_body) {
        return http_error(c, 413,
                          "request body of %zu bytes exceeds the limit of %zu bytes (max_message_size_mb)",
                          cl, srv->o.max_body);
    } else if (cl > 0) {
        if (srv->o.admit && cl >= srv->admit_min) {
            char msg[300] = "", hdr[40] = "";
            int retry = 0;
            int st = srv->o.admit(srv->o.user, b + c->m_off, c->path_root ? "/" : b + c->p_off, cl, msg, sizeof msg,
                                  &retry);
            if (st) {
                if (retry > 0) snprintf(hdr, sizeof hdr, "Retry-After: %d", retry);
                /* a client waiting for 100 Continue may or may not send the body now: close */
                if (c->expect_continue || c->ssl) return http_error_hdr(c, st, hdr, "%s", msg);
                return refuse_body(c, st, hdr, msg, end, cl);
            }
        }
        c->state = RS_BODY_CL;
        c->body_start = end;
        c->content_length = cl;
        need_more_body = avail_bytes(c) - end < cl;
        /* a compressed body is decoded into a buffer of its own, aligned there */
        bool align = align_at <= cl && c->encoding == ENC_IDENTITY;
        c->place_need = end + cl;
        c->place_align = align ? end + align_at : SIZE_MAX;
        /* a body the light thread leaves to a listening one gets its buffer there: allocating
         * it (megabytes, faulted in at once) would hold up the light connections */
        if (!leaves_light(c) && !place_body(c)) return P_ERROR;
    } else {
        c->state = RS_READY;
        c->body_start = end;
        c->req_end = end;
    }
    if (c->expect_continue && !c->http10 && need_more_body) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        out_chunk *ch = chunk_alloc(0, 0);
        if (ch) {
            ch->niov = 1;
            ch->iov[0].iov_base = (void *)cont;
            ch->iov[0].iov_len = sizeof cont - 1;
            ch->bytes = sizeof cont - 1;
            out_append(c, ch);
            conn_flush(c);
            if (c->fd < 0) return P_ERROR;
        }
    }
    return P_MORE;
}

static int parse_chunked(mts_http_conn *c)
{
    const mts_http_server *srv = c->io->srv;
    char *b = c->rbuf + c->req_start;
    size_t avail = avail_bytes(c);
    for (;;) {
        switch (c->chunk_state) {
        case CH_SIZE: {
            char *nl = memchr(b + c->cpos, '\n', avail - c->cpos);
            if (!nl) {
                if (avail - c->cpos > CHUNK_LINE_MAX) return http_error(c, 400, "chunk size line too long");
                return P_MORE;
            }
            if ((size_t)(nl - (b + c->cpos)) > CHUNK_LINE_MAX)
                return http_error(c, 400, "chunk size line too long");
            const char *p = b + c->cpos;
            size_t sz = 0;
            int nd = 0, hv;
            while ((hv = hexval(*p)) >= 0) {
                if (sz > (SIZE_MAX >> 4)) return http_error(c, 400, "chunk size too large");
                sz = sz * 16 + (size_t)hv;
                nd++;
                p++;
            }
            if (!nd) return http_error(c, 400, "malformed chunk size");
            while (*p == ' ' || *p == '\t') p++;
            if (*p == ';') {
                for (p++; p < nl; p++) /* chunk extensions: ignored, but no control bytes */
                    if ((unsigned char)*p < 0x20 && *p != '\t' && !(*p == '\r' && p + 1 == nl))
                        return http_error(c, 400, "malformed chunk extension");
            } else if (!(p == nl || (*p == '\r' && p + 1 == nl))) {
                return http_error(c, 400, "malformed chunk size");
            }
            if (sz > srv->o.max_body - c->body_len) {
                size_t total = c->body_len + sz < c->body_len ? SIZE_MAX : c->body_len + sz;
                return http_error(c, 413,
                                  "request body of %zu bytes exceeds the limit of %zu bytes (max_message_size_mb)",
                                  total, srv->o.max_body);
            }
            c->cpos = (size_t)(nl - b) + 1;
            if (sz == 0) {
                c->chunk_state = CH_TRAILER;
                c->trailer_start = c->cpos;
            } else {
                c->chunk_left = sz;
                c->chunk_state = CH_DATA;
            }
            break;
        }
        case CH_DATA: {
            size_t take = avail - c->cpos;
            if (take > c->chunk_left) take = c->chunk_left;
            if (take) {
                size_t dst = c->body_start + c->body_len;
                if (dst != c->cpos) memmove(b + dst, b + c->cpos, take);
                c->body_len += take;
                c->cpos += take;
                c->chunk_left -= take;
            }
            if (c->chunk_left) return P_MORE;
            c->chunk_state = CH_DATA_END;
            break;
        }
        case CH_DATA_END:
            if (c->cpos >= avail) return P_MORE;
            if (b[c->cpos] == '\n') {
                c->cpos++;
            } else if (b[c->cpos] == '\r') {
                if (c->cpos + 1 >= avail) return P_MORE;
                if (b[c->cpos + 1] != '\n') return http_error(c, 400, "malformed chunked body");
                c->cpos += 2;
            } else {
                return http_error(c, 400, "malformed chunked body");
            }
            c->chunk_state = CH_SIZE;
            break;
        case CH_TRAILER: {
            char *nl = memchr(b + c->cpos, '\n', avail - c->cpos);
            if (!nl) {
                if (avail - c->trailer_start > srv->o.max_header)
                    return http_error(c, 431, "chunked trailer section exceeds the limit of %zu bytes",
                                      srv->o.max_header);
                return P_MORE;
            }
            size_t len = (size_t)(nl - (b + c->cpos));
            if (len && b[c->cpos + len - 1] == '\r') len--;
            c->cpos = (size_t)(nl - b) + 1;
            if (c->cpos - c->trailer_start > srv->o.max_header)
                return http_error(c, 431, "chunked trailer section exceeds the limit of %zu bytes",
                                  srv->o.max_header);
            if (len == 0) {
                c->req_end = c->cpos;
                c->state = RS_READY;
                return P_READY;
            }
            break; /* trailer fields are ignored */
        }
        }
    }
}

/* Advances the request state machine over the buffered bytes (framing only; parse adds the
 * decoding of compressed bodies). */
static int parse_framing(mts_http_conn *c)
{
    const mts_http_server *srv = c->io->srv;
    for (;;) {
        switch (c->state) {
        case RS_HEAD: {
            if (c->scan == 0) { /* empty lines before a request are ignored (RFC 9112 2.2) */
                size_t k = c->req_start;
                while (k < c->rlen && (c->rbuf[k] == '\r' || c->rbuf[k] == '\n')) k++;
                c->req_start = k;
            }
            size_t avail = avail_bytes(c);
            if (!avail) return P_MORE;
            if (!c->head_start_ms) c->head_start_ms = c->io->now_ms;
            char *b = c->rbuf + c->req_start;
            bool found = false;
            while (c->scan < avail) {
                char *nl = memchr(b + c->scan, '\n', avail - c->scan);
                if (!nl) {
                    c->scan = avail;
                    break;
                }
                size_t i = (size_t)(nl - b), ls = c->line_start;
                if (i == ls || (i == ls + 1 && b[ls] == '\r')) {
                    c->head_end = i + 1;
                    found = true;
                    break;
                }
                c->line_start = c->scan = i + 1;
            }
            if (!found) {
                if (avail > srv->o.max_header)
                    return http_error(c, 431, "request header section exceeds the limit of %zu bytes",
                                      srv->o.max_header);
                return P_MORE;
            }
            if (c->head_end > srv->o.max_header)
                return http_error(c, 431, "request header section exceeds the limit of %zu bytes",
                                  srv->o.max_header);
            if (parse_head(c) == P_ERROR) return P_ERROR;
            break;
        }
        case RS_BODY_CL:
            if (avail_bytes(c) - c->body_start < c->content_length) return P_MORE;
            c->body_len = c->content_length;
            c->req_end = c->body_start + c->content_length;
            c->state = RS_READY;
            return P_READY;
        case RS_BODY_CHUNKED:
            return parse_chunked(c);
        case RS_READY:
            return P_READY;
        default:
            return P_MORE;
        }
    }
}

/* Decodes the complete body of a request sent with Content-Encoding gzip or deflate into
 * c->inflated (an I/O buffer, placed so that the application's aligned offset lands on 64
 * bytes), at most max_body bytes of it: a small body that inflates past the limit is refused
 * (413) before it is all decoded. "deflate" is the zlib format (RFC 9110); a raw deflate stream,
 * which some clients send under that name, is accepted too. Returns P_READY, or P_ERROR with the
 * error response queued (the connection closes after it). */
static int inflate_body(mts_http_conn *c)
{
    const mts_http_server *srv = c->io->srv;
    const unsigned char *in = (const unsigned char *)c->rbuf + c->req_start + c->body_start;
    size_t in_len = c->body_len;
    const char *name = c->encoding == ENC_GZIP ? "gzip" : "deflate";
    for (int attempt = 0; attempt < 2; attempt++) {
        /* gzip: a gzip header; deflate: a zlib header, else (second try) raw deflate */
        int wbits = c->encoding == ENC_GZIP ? 16 + MAX_WBITS : attempt == 0 ? MAX_WBITS : -MAX_WBITS;
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, wbits) != Z_OK) {
            conn_abort(c);
            return P_ERROR;
        }
        size_t lead = c->align_at == SIZE_MAX ? 0 : (64 - c->align_at % 64) % 64;
        size_t cap = INFLATE_FIRST, len = 0;
        char *buf = NULL;
        int zr = Z_OK;
        z.next_in = (unsigned char *)in;
        while (zr != Z_STREAM_END) {
            if (!buf || lead + len == cap) {
                size_t ncap = buf ? cap * 2 : cap;
                if (ncap > lead + srv->o.max_body + 1) ncap = lead + srv->o.max_body + 1; /* > lead + len */
                char *nb = mts_iobuf_alloc(ncap);
                if (!nb) {
                    inflateEnd(&z);
                    mts_iobuf_free(buf);
                    conn_abort(c);
                    return P_ERROR;
                }
                if (buf) memcpy(nb + lead, buf + lead, len);
                mts_iobuf_free(buf);
                buf = nb;
                cap = mts_iobuf_capacity(nb);
            }
            size_t room = cap - lead - len, limit_room = srv->o.max_body + 1 - len;
            if (room > limit_room) room = limit_room;
            if (room > UINT_MAX) room = UINT_MAX;
            size_t in_left = in_len - (size_t)(z.next_in - in);
            z.avail_in = in_left > UINT_MAX ? UINT_MAX : (unsigned)in_left;
            z.next_out = (unsigned char *)buf + lead + len;
            z.avail_out = (unsigned)room;
            zr = inflate(&z, Z_NO_FLUSH);
            len += room - z.avail_out;
            if (len > srv->o.max_body) break;
            if (zr == Z_STREAM_END) break;
            if (zr == Z_BUF_ERROR && z.avail_in == 0 && z.avail_out > 0) {
                zr = Z_DATA_ERROR; /* the input ended inside the stream */
                z.msg = (char *)"the compressed body is truncated";
                break;
            }
            if (zr != Z_OK && zr != Z_BUF_ERROR) break;
        }
        size_t at = (size_t)(z.next_in - in);
        char zmsg[160];
        snprintf(zmsg, sizeof zmsg, "%s", z.msg ? z.msg : "invalid data");
        inflateEnd(&z);
        if (len > srv->o.max_body) {
            mts_iobuf_free(buf);
            return http_error(c, 413, "the %s request body decodes to more than the limit of %zu bytes "
                                      "(max_message_size_mb)", name, srv->o.max_body);
        }
        if (zr == Z_STREAM_END && at != in_len) {
            mts_iobuf_free(buf);
            return http_error(c, 400, "the %s request body has %zu bytes after the end of its compressed "
                                      "stream", name, in_len - at);
        }
        if (zr != Z_STREAM_END) {
            mts_iobuf_free(buf);
            if (c->encoding == ENC_DEFLATE && attempt == 0 && at <= 2) continue; /* no zlib header: raw */
            return http_error(c, 400, "the request body is not valid %s data: %s (at compressed byte %zu of %zu)",
                              name, zmsg, at, in_len);
        }
        c->inflated = buf;
        c->inflated_off = lead;
        c->inflated_len = len;
        return P_READY;
    }
    return http_error(c, 400, "the request body is not valid deflate data");
}

/* The request state machine: framing, then a compressed body's decoding once it is complete.
 * P_READY when a request is ready to dispatch. */
static int parse(mts_http_conn *c)
{
    int r = parse_framing(c);
    if (r == P_READY && c->encoding != ENC_IDENTITY && !c->inflated) r = inflate_body(c);
    return r;
}

/* Fills c->req from the parsed offsets of a complete request. */
static void fill_request(mts_http_conn *c)
{
    char *b = c->rbuf + c->req_start;
    mts_http_req *r = &c->req;
    r->method = b + c->m_off;
    r->path = c->path_root ? "/" : b + c->p_off;
    r->query = b + c->q_off;
    r->body = c->inflated ? c->inflated + c->inflated_off : c->body_len ? b + c->body_start : "";
    r->body_len = c->inflated ? c->inflated_len : c->body_len;
    r->n_headers = c->nh;
    for (int i = 0; i < c->nh; i++) {
        r->headers[i].name = b + c->h_off[i][0];
        r->headers[i].value = b + c->h_off[i][1];
    }
    r->http_minor = c->http10 ? 0 : 1;
    r->keep_alive = c->keep_alive;
    r->user = NULL;
}

static void dispatch(mts_http_conn *c)
{
    io_thread *io = c->io;
    mts_http_req *r = &c->req;
    fill_request(c);
    c->state = RS_PENDING;
    c->pending = true;
    c->served = true;
    io->npending++;
    atomic_store_explicit(&c->responded, 0, memory_order_relaxed);
    c->small_req = r->body_len < io->srv->admit_min && !c->chunked && c->encoding == ENC_IDENTITY;
    c->in_cb = true;
    io->srv->o.handler(io->srv->o.user, c, r);
    c->in_cb = false;
    if (c->inline_resp) {
        out_chunk *ch = c->inline_resp;
        c->inline_resp = NULL;
        complete_response(c, ch);
    }
}

/* Parses and dispatches buffered requests and reads more, until a request is in flight, the
 * socket has nothing more, or output backs up; then writes. Caller holds the connection. */
static void conn_pump(mts_http_conn *c)
{
    for (;;) {
        if (c->fd < 0 || c->pending) break;
        if (c->state == RS_LINGER) {
            linger_read(c);
            return;
        }
        if (c->state == RS_CLOSING) break;
        if (c->state == RS_DISCARD) {
            if (discard_body(c)) continue;
            break;
        }
        if (c->out_bytes > OUT_HIGH_WATER) {
            /* Pipelined answers backed up: write them, and go on parsing if the socket took
             * them (no EPOLLOUT will come then); otherwise EPOLLOUT resumes this pump. */
            conn_flush(c);
            if (c->fd < 0 || c->out_bytes > OUT_HIGH_WATER) break;
            continue;
        }
        if (c->place_need && !leaves_light(c) && !place_body(c)) return;
        int r = parse(c);
        if (r == P_READY) {
            dispatch(c);
            continue;
        }
        if (leaves_light(c)) break; /* body read elsewhere */
        if (r == P_ERROR || c->state == RS_DISCARD) continue; /* a refused body: from the socket */
        if (c->fd < 0) break;
        bool idle = c->state == RS_HEAD && avail_bytes(c) == 0;
        if (c->peer_eof) {
            if (!idle) {
                conn_abort(c); /* the client left in the middle of a request */
                return;
            }
            c->state = RS_CLOSING;
            break;
        }
        if (c->drained) break;
        if (conn_read(c) == -2) return;
    }
    conn_flush(c);
}

/* Pumps, then cancels a request left in flight by a client that has already hung up (its FIN
 * was seen while reading, so no further event will report it). */
static void conn_run(mts_http_conn *c)
{
    if (c->fd >= 0 && !c->pending) conn_pump(c);
    if (c->fd >= 0 && c->pending && (c->rdhup || c->peer_eof)) conn_abort(c);
}

static void conn_event(mts_http_conn *c, uint32_t ev)
{
    HOLD(c);
    if (ev & (EPOLLERR | EPOLLHUP)) {
        conn_abort(c);
    } else {
        /* TLS: a read may wait for the socket to be writable (handshake) and a write for it to be
         * readable, so either event retries both */
        if ((ev & (EPOLLIN | EPOLLRDHUP)) || (c->ssl && (ev & EPOLLOUT))) c->drained = false;
        if (ev & EPOLLRDHUP) c->rdhup = true; /* half-close or close: treated as going away */
        if (((ev & EPOLLOUT) || (c->ssl && (ev & EPOLLIN))) && c->out_head) conn_flush(c);
        conn_run(c);
    }
    RELEASE(c);
}

/* ------------------------------------------------------------------ responses */

/* Wake-ups of an I/O thread by others, in two steps: wake_claim under its queue mutex (false
 * when a wake-up is already on its way), wake_send after releasing it. The eventfd is written
 * outside the mutex because the write wakes the thread, which takes that mutex first: written
 * inside, the woken thread may preempt the writer still holding it (the regular workers run at
 * a lower priority) and then wait for it to be scheduled again. `waking` counts the writers
 * between the two steps: once the I/O thread has dequeued what they handed over it may exit, so
 * free_server waits for them before closing the eventfd. */
static bool wake_claim(io_thread *io)
{
    if (io->qsignalled) return false;
    io->qsignalled = true;
    atomic_fetch_add(&io->waking, 1);
    return true;
}

static void wake_send(io_thread *io)
{
    uint64_t one = 1;
    ssize_t w = write(io->evfd, &one, sizeof one);
    (void)w;
    atomic_fetch_sub(&io->waking, 1);
}

static void submit(mts_http_conn *c, out_chunk *ch)
{
    io_thread *io = c->io;
    bool same = tls_io == io;
    atomic_store_explicit(&c->responded, 1, memory_order_release);
    if (same && c->in_cb) {
        c->inline_resp = ch;
        return;
    }
    ch->conn = c;
    ch->next = NULL;
    pthread_mutex_lock(&io->qmu);
    if (io->qtail) io->qtail->next = ch;
    else io->qhead = ch;
    io->qtail = ch;
    /* same-thread answers need no wake-up (the thread drains its queue before sleeping) */
    bool wake = !same && wake_claim(io);
    pthread_mutex_unlock(&io->qmu);
    if (wake) wake_send(io);
}

static void respond_fail(mts_http_conn *c)
{
    out_chunk *ch = &c->fail_node;
    memset(ch, 0, sizeof *ch);
    ch->fail = true;
    submit(c, ch);
}

void mts_http_respondv(mts_http_conn *c, int status, const char *content_type,
                       const char *extra_headers, const struct iovec *iov, int iovcnt,
                       void (*done)(void *arg), void *done_arg)
{
    const mts_http_server *srv = c->io->srv;
    size_t len = 0;
    int n_app = 0;
    for (int i = 0; i < iovcnt; i++) {
        len += iov[i].iov_len;
        if (iov[i].iov_len) n_app++;
    }
    bool no_body = status == 204 || status == 304 || (status >= 100 && status < 200);
    bool send_body = !no_body && !c->is_head;
    bool close_after = !c->keep_alive || atomic_load_explicit(&srv->draining, memory_order_relaxed);
    int conn_hdr = close_after ? 1 : (c->http10 ? 2 : 0);
    size_t ct_len = content_type ? strlen(content_type) : 0;
    size_t ex_len = extra_headers ? strlen(extra_headers) : 0;
    size_t head_max = HEAD_FIXED_MAX + ct_len + ex_len;
    bool zero_copy = done != NULL && send_body;
    size_t copy = send_body && !zero_copy ? len : 0;
    int slots = zero_copy ? n_app : 0;

    out_chunk *ch = chunk_alloc(slots, head_max + copy);
    if (!ch) {
        if (done) done(done_arg);
        respond_fail(c);
        return;
    }
    char *d = chunk_data(ch, slots);
    char *p = format_head(d, status, content_type, ct_len, extra_headers, ex_len, !no_body, len,
                          conn_hdr);
    if (copy)
        for (int i = 0; i < iovcnt; i++) p = put(p, iov[i].iov_base, iov[i].iov_len);
    ch->iov[0].iov_base = d;
    ch->iov[0].iov_len = (size_t)(p - d);
    ch->niov = 1;
    ch->bytes = (size_t)(p - d);
    if (zero_copy) {
        for (int i = 0; i < iovcnt; i++)
            if (iov[i].iov_len) ch->iov[ch->niov++] = iov[i];
        ch->bytes += len;
    }
    if (done) { /* also for zero-copy-less cases (HEAD, 204): called when the chunk is freed */
        if (zero_copy) {
            ch->done = done;
            ch->done_arg = done_arg;
        } else {
            done(done_arg);
        }
    }
    ch->close_after = close_after;
    submit(c, ch);
}

void mts_http_respond(mts_http_conn *c, int status, const char *content_type,
                      const char *extra_headers, const void *body, size_t len)
{
    struct iovec v = {.iov_base = (void *)body, .iov_len = body ? len : 0};
    mts_http_respondv(c, status, content_type, extra_headers, &v, 1, NULL, NULL);
}

void mts_http_respond_error(mts_http_conn *c, int status, const char *fmt, ...)
{
    char msg[1024], body[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t bl = json_error(body, sizeof body, msg);
    mts_http_respond(c, status, "application/json", NULL, body, bl);
}

void mts_http_respond_error_async(mts_http_conn *c, int status, const char *msg, char **body,
                                  void (*done)(void *arg), void *done_arg)
{
    static const char oom[] = "{\"error\":\"out of memory\"}";
    char tmp[2048];
    size_t bl = json_error(tmp, sizeof tmp, msg);
    free(*body);
    *body = malloc(bl);
    if (*body) memcpy(*body, tmp, bl);
    struct iovec iov = *body ? (struct iovec){*body, bl} : (struct iovec){(void *)oom, sizeof oom - 1};
    mts_http_respondv(c, status, "application/json", status == 429 ? "Retry-After: 1\r\n" : NULL, &iov, 1, done,
                      done_arg);
}

bool mts_http_query_param(const char *query, const char *key, char *out, size_t cap)
{
    size_t klen = strlen(key);
    const char *q = query;
    while (q && *q) {
        const char *amp = strchr(q, '&');
        size_t len = amp ? (size_t)(amp - q) : strlen(q);
        if (len > klen && !strncmp(q, key, klen) && q[klen] == '=') {
            snprintf(out, cap, "%.*s", (int)(len - klen - 1), q + klen + 1);
            return true;
        }
        q = amp ? amp + 1 : NULL;
    }
    return false;
}

mts_http_req *mts_http_conn_request(mts_http_conn *c)
{
    return &c->req;
}

const char *mts_http_header(const mts_http_req *r, const char *name)
{
    for (int i = 0; i < r->n_headers; i++)
        if (strcasecmp(r->headers[i].name, name) == 0) return r->headers[i].value;
    return NULL;
}

/* ------------------------------------------------------------------ I/O threads */

static bool close_oldest_idle(io_thread *io);

/* Turns away a connection just accepted and not yet registered anywhere: 503 (in plaintext; a
 * TLS connection has no session to say it in) and close. */
static void refuse_new(mts_http_server *s, mts_http_conn *c, const char *why)
{
    atomic_fetch_sub_explicit(&s->nconns, 1, memory_order_relaxed);
    if (c->addr_counted) addr_release(s, c->addr);
    if (!s->ssl_ctx) send_now(c->fd, 503, why);
    mts_tls_free(c->ssl);
    close(c->fd);
    free(c);
}

/* Listening thread i and light thread i are partners: connections move between the two. */
static io_thread *partner(io_thread *io)
{
    mts_http_server *s = io->srv;
    long i = io - s->threads;
    return &s->threads[i < s->nlisten ? i + s->nlisten : i - s->nlisten];
}

/* Puts c into another I/O thread's inbox; its queue mutex is held. True: wake_send(to) is due
 * once the mutex is released. */
static bool inbox_push(io_thread *to, mts_http_conn *c)
{
    c->next = to->inbox;
    to->inbox = c;
    return wake_claim(to);
}

/* Hands a connection flagged to move (c->move) to this thread's partner of that class, once
 * nothing is in flight on it and nothing up the stack uses it: it leaves this thread's epoll set
 * and list and lands in the partner's inbox (under the partner's queue mutex, the only thing the
 * two share), whose eventfd wakes it. After this the calling thread must not touch c. A connection
 * closing, or a server stopping, stays where it is. */
static void conn_settle(mts_http_conn *c)
{
    io_thread *from = c->io;
    if (c->move == MOVE_NONE || c->fd < 0 || c->pending || c->busy || c->state == RS_LINGER ||
        c->state == RS_CLOSING || !moves_open(from))
        return;
    io_thread *to = partner(from);
    bool wanted = c->move == MOVE_LIGHT ? to->light : !to->light;
    c->move = MOVE_NONE;
    if (!wanted) return;
    pthread_mutex_lock(&to->qmu);
    bool moved = !to->closed && epoll_ctl(from->epfd, EPOLL_CTL_DEL, c->fd, NULL) == 0, wake = false;
    if (moved) {
        list_remove(from, c);
        wake = inbox_push(to, c);
    }
    pthread_mutex_unlock(&to->qmu);
    if (wake) wake_send(to);
    if (!moved) { /* it stays: go on with what it stopped for (a body the light thread left) */
        HOLD(c);
        conn_run(c);
        RELEASE(c);
    }
}

/* Makes io the owner of connection c (just accepted, or handed over by another thread): its
 * list and its epoll set, edge-triggered. False when epoll refuses it: c is then closed (and
 * freed at the end of the loop turn). */
static bool conn_attach(io_thread *io, mts_http_conn *c)
{
    c->io = io;
    c->prev = NULL;
    c->next = io->conns;
    if (io->conns) io->conns->prev = c;
    io->conns = c;
    io->nconns++;
    c->last_ms = io->now_ms;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c};
    if (epoll_ctl(io->epfd, EPOLL_CTL_ADD, c->fd, &ev) == 0) return true;
    HOLD(c);
    conn_abort(c);
    RELEASE(c);
    return false;
}

/* Takes in the connections other threads handed over: registers each (edge-triggered; adding a
 * socket that already holds data reports it at once) and goes on with it where it stopped. */
static void adopt(io_thread *io, mts_http_conn *in)
{
    while (in) {
        mts_http_conn *c = in;
        in = c->next;
        if (c->over_limit) { /* the server is full: room from this thread's idle ones, or 503 */
            c->over_limit = false;
            if (!close_oldest_idle(io)) {
                refuse_new(io->srv, c, "too many connections");
                continue;
            }
        }
        if (!conn_attach(io, c)) continue;
        HOLD(c);
        c->drained = false;
        conn_run(c);
        RELEASE(c);
        conn_settle(c);
    }
}

static void drain_queue(io_thread *io)
{
    pthread_mutex_lock(&io->qmu);
    out_chunk *ch = io->qhead;
    io->qhead = io->qtail = NULL;
    io->qsignalled = false;
    mts_http_conn *in = io->inbox;
    io->inbox = NULL;
    pthread_mutex_unlock(&io->qmu);
    adopt(io, in);
    while (ch) {
        out_chunk *next = ch->next;
        mts_http_conn *c = ch->conn;
        HOLD(c);
        complete_response(c, ch);
        if (c->fd >= 0) {
            conn_flush(c);
            conn_run(c);
        }
        RELEASE(c);
        conn_settle(c);
        ch = next;
    }
}

static bool on_accept(io_thread *io);

/* Stops listening, in two steps, so that no client whose connection the kernel completed (and
 * who may have sent a request on it) is reset by the close. begin_listener_close attaches a
 * socket filter that drops SYNs without ACK (packets a TCP socket filter sees start at the TCP
 * header; byte 13 holds the flags): no new handshake starts, and those clients' retry finds the
 * port closed, a refusal before anything was sent. Handshakes already under way still complete
 * (their ACK passes), and the event loop keeps accepting them for LISTEN_CLOSE_MS, a round trip
 * on any network a server like this one serves; then close_listener accepts what the kernel
 * still holds and closes the socket. (A filter that dropped everything would also drop the ACK
 * of a handshake whose SYN-ACK was already out: its client believes it is connected, sends its
 * request, and is reset when the listener closes.) */
static void begin_listener_close(io_thread *io)
{
    if (io->lfd < 0 || io->listen_close_ms) return;
    struct sock_filter drop_syn[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 13),            /* TCP flags */
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0x12),         /* SYN | ACK */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x02, 0, 1),   /* SYN alone: a new handshake */
        BPF_STMT(BPF_RET | BPF_K, 0),                      /* drop */
        BPF_STMT(BPF_RET | BPF_K, 0xffffffffu),            /* keep */
    };
    struct sock_fprog prog = {.len = sizeof drop_syn / sizeof drop_syn[0], .filter = drop_syn};
    (void)setsockopt(io->lfd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog); /* best effort */
    io->listen_close_ms = io->now_ms + LISTEN_CLOSE_MS;
}

static void close_listener(io_thread *io)
{
    if (io->lfd < 0) return;
    begin_listener_close(io);
    while (io->accept_resume_ms == 0 && on_accept(io)) {
    }
    close(io->lfd);
    io->lfd = -1;
    io->listen_close_ms = 0;
    io->listener_registered = false;
    mts_http_server *s = io->srv;
    pthread_mutex_lock(&s->mu);
    s->listeners_open--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* A keep-alive connection between requests: nothing buffered, nothing in flight, nothing to
 * write. Closing it loses nothing the client has been answered for. */
static bool conn_idle(const mts_http_conn *c)
{
    return c->fd >= 0 && !c->pending && c->state == RS_HEAD && avail_bytes(c) == 0 && !c->out_head;
}

/* The server is full: closes this thread's keep-alive connection idle the longest to make room
 * for a new client. The count of connections drops by one; true when one was closed. */
static bool close_oldest_idle(io_thread *io)
{
    mts_http_conn *old = NULL;
    for (mts_http_conn *c = io->conns; c; c = c->next)
        if (conn_idle(c) && (!old || c->last_ms < old->last_ms)) old = c;
    if (!old) return false;
    HOLD(old);
    conn_abort(old); /* decrements nconns */
    RELEASE(old);
    return true;
}

/* Accepts up to ACCEPT_BATCH connections; true when more may be waiting. */
static bool on_accept(io_thread *io)
{
    mts_http_server *s = io->srv;
    for (int k = 0; k < ACCEPT_BATCH && io->lfd >= 0; k++) {
        struct sockaddr_storage peer;
        socklen_t plen = sizeof peer;
        int fd = accept4(io->lfd, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* out of descriptors: stop polling the listener for a moment instead of spinning */
                epoll_ctl(io->epfd, EPOLL_CTL_DEL, io->lfd, NULL);
                io->listener_registered = false;
                io->accept_resume_ms = io->now_ms + 100;
            }
            return false;
        }
        bool over = atomic_fetch_add_explicit(&s->nconns, 1, memory_order_relaxed) >= s->o.max_connections &&
                    !close_oldest_idle(io);
        if (over && !s->nlight) {
            atomic_fetch_sub_explicit(&s->nconns, 1, memory_order_relaxed);
            if (!s->ssl_ctx) send_now(fd, 503, "too many connections"); /* no TLS session to say it in */
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        mts_http_conn *c = calloc(1, sizeof *c);
        if (!c) {
            atomic_fetch_sub_explicit(&s->nconns, 1, memory_order_relaxed);
            close(fd);
            continue;
        }
        if (s->ssl_ctx && !(c->ssl = mts_tls_new(s->ssl_ctx, fd))) {
            atomic_fetch_sub_explicit(&s->nconns, 1, memory_order_relaxed);
            close(fd);
            free(c);
            continue;
        }
        if (s->o.max_per_client > 0) {
            addr_key(&peer, c->addr);
            if (!addr_acquire(s, c->addr)) {
                atomic_fetch_sub_explicit(&s->nconns, 1, memory_order_relaxed);
                if (!s->ssl_ctx) send_now(fd, 503, "too many connections from this address");
                mts_tls_free(c->ssl);
                close(fd);
                free(c);
                continue;
            }
            c->addr_counted = true;
        }
        c->fd = fd;
        reset_request(c);
        if (s->nlight) {
            /* a new connection's first request is read on the partner light I/O thread, which
             * sends it back before reading a large body: a light client's first request does not
             * wait behind this thread's uploads either */
            c->over_limit = over;
            io_thread *light = partner(io);
            pthread_mutex_lock(&light->qmu);
            bool taken = !light->closed, wake = taken && inbox_push(light, c);
            pthread_mutex_unlock(&light->qmu);
            if (wake) wake_send(light);
            if (taken) continue;
            if (over) {
                refuse_new(s, c, "too many connections");
                continue;
            }
        }
        conn_attach(io, c);
    }
    return io->lfd >= 0;
}

static void scan_timeouts(io_thread *io)
{
    int idle = io->srv->o.idle_timeout_ms;
    int64_t now = io->now_ms;
    for (mts_http_conn *c = io->conns, *next; c; c = next) {
        next = c->next;
        if (c->pending) continue;
        HOLD(c);
        if (c->state == RS_LINGER) {
            if (now >= c->linger_until_ms) conn_abort(c);
        } else if (idle >= 0) {
            if (c->out_head) {
                if (now - c->last_ms >= idle) conn_abort(c); /* client does not read */
            } else if (c->state == RS_HEAD && avail_bytes(c) == 0) {
                if (now - c->last_ms >= idle) conn_abort(c); /* idle keep-alive connection */
            } else if (c->state == RS_HEAD) {
                if (c->head_start_ms && now - c->head_start_ms >= io->srv->o.header_timeout_ms) {
                    if (!c->ssl) send_now(c->fd, 408, "request header not completed in time");
                    conn_abort(c);
                }
            } else if (c->state == RS_BODY_CL || c->state == RS_BODY_CHUNKED) {
                if (now - c->last_ms >= idle) {
                    if (!c->ssl) send_now(c->fd, 408, "request body stalled");
                    conn_abort(c);
                }
            } else if (c->state == RS_DISCARD) {
                if (now - c->last_ms >= idle) conn_abort(c); /* a refused body stalled: answered already */
            }
        }
        RELEASE(c);
    }
}

static int scan_interval(const mts_http_server *s)
{
    int idle = s->o.idle_timeout_ms;
    if (idle < 0) return 250; /* only lingering closes to time out */
    int iv = idle / 8;
    return iv < 10 ? 10 : iv > 1000 ? 1000 : iv;
}

static void *io_main(void *arg)
{
    io_thread *io = arg;
    mts_http_server *s = io->srv;
    tls_io = io;
    /* what a light thread does is short by construction (small reads and answers, lane batches) */
    if (io->light && s->o.light_realtime) mts_thread_realtime(true, "mts-http-light");
    struct epoll_event evs[MAX_EVENTS];
    io->now_ms = mono_ms();
    io->next_scan_ms = io->now_ms + scan_interval(s);
    for (;;) {
        int timeout = -1;
        if (io->nconns > 0) {
            int64_t d = io->next_scan_ms - io->now_ms;
            timeout = d < 0 ? 0 : (int)d;
        }
        if (io->accept_resume_ms) {
            int64_t d = io->accept_resume_ms - io->now_ms;
            if (d < 0) d = 0;
            if (timeout < 0 || d < timeout) timeout = (int)d;
        }
        if (io->listen_close_ms) {
            int64_t d = io->listen_close_ms - io->now_ms;
            if (d < 0) d = 0;
            if (timeout < 0 || d < timeout) timeout = (int)d;
        }
        if (io->stop_done && io->now_ms < io->stop_deadline_ms) { /* wake for the stop deadline */
            int64_t d = io->stop_deadline_ms - io->now_ms;
            d = d < 0 ? 0 : d > 20 ? 20 : d;
            if (timeout < 0 || d < timeout) timeout = (int)d;
        }
        int n = epoll_wait(io->epfd, evs, MAX_EVENTS, timeout);
        io->now_ms = mono_ms();
        for (int i = 0; i < n; i++) {
            void *tag = evs[i].data.ptr;
            if (tag == &io->ev_tag) {
                uint64_t v;
                ssize_t r = read(io->evfd, &v, sizeof v); /* the queue is drained below */
                (void)r;
            } else if (tag == &io->l_tag) {
                on_accept(io);
            } else {
                conn_event(tag, evs[i].events);
                conn_settle(tag);
            }
        }
        drain_queue(io);

        if (!io->drain_done && atomic_load(&s->draining)) {
            io->drain_done = true;
            io->accept_resume_ms = 0;
            begin_listener_close(io);
            /* Open connections stay: a request still arriving on one is answered (by a 503 with
             * Connection: close once the server stops taking work) instead of being cut off
             * in flight, which closing idle keep-alive connections here would risk. Every
             * answer from now on closes its connection; the rest close at stop. */
        }
        if (!io->stop_done && atomic_load(&s->stopping)) {
            /* The server behind has stopped: what clients sent by now is read and answered
             * (a 503 for new work), then each connection closes gracefully; the thread exits
             * when the answers are out and the clients have closed, or at STOP_LINGER_MS. */
            io->stop_done = true;
            io->accept_resume_ms = 0;
            begin_listener_close(io);
            io->stop_deadline_ms = io->now_ms + STOP_LINGER_MS;
            for (mts_http_conn *c = io->conns, *next; c; c = next) {
                next = c->next; /* conn_run may take c off the list, never another connection */
                HOLD(c);
                if (!c->pending && c->state != RS_LINGER) {
                    c->drained = false;
                    conn_run(c);
                    /* Close idle keep-alive connections (without a reset). A fresh one, just
                     * accepted (the listener's backlog is accepted when it closes), stays until
                     * its first request has been answered or the deadline: its client has sent
                     * or is sending that request, and closing now would lose it. */
                    if (conn_idle(c) && c->served) begin_close(c);
                }
                RELEASE(c);
            }
        }
        if (io->listen_close_ms && io->now_ms >= io->listen_close_ms) close_listener(io);
        free_graveyard(io);
        if (io->stop_done && io->conns && io->now_ms >= io->stop_deadline_ms) {
            while (io->conns) { /* cancels what is still in flight; its answer ends npending */
                mts_http_conn *c = io->conns;
                HOLD(c);
                conn_abort(c);
                RELEASE(c);
            }
            free_graveyard(io);
        }
        if (io->stop_done && io->npending == 0 && !io->conns && io->lfd < 0) {
            pthread_mutex_lock(&io->qmu); /* nothing handed over in the meantime: exit */
            bool empty = !io->inbox;
            io->closed = empty;
            pthread_mutex_unlock(&io->qmu);
            if (empty) break;
            continue;
        }
        if (io->accept_resume_ms && io->now_ms >= io->accept_resume_ms && io->lfd >= 0) {
            io->accept_resume_ms = 0;
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &io->l_tag};
            if (epoll_ctl(io->epfd, EPOLL_CTL_ADD, io->lfd, &ev) == 0) io->listener_registered = true;
        }
        if (io->now_ms >= io->next_scan_ms) {
            scan_timeouts(io);
            io->next_scan_ms = io->now_ms + scan_interval(s);
            free_graveyard(io);
        }
    }
    tls_io = NULL;
    return NULL;
}

/* ------------------------------------------------------------------ start / stop */

static int open_listener(const struct addrinfo *ai, int port, int *out_port, mts_err *err)
{
    struct sockaddr_storage ss;
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    if (ss.ss_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
    else ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return mts_err_set(err, MTS_EIO, "http: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) {
        int e = errno;
        close(fd);
        return mts_err_set(err, MTS_EIO, "http: SO_REUSEPORT: %s", strerror(e));
    }
    if (bind(fd, (struct sockaddr *)&ss, ai->ai_addrlen) < 0 || listen(fd, 1024) < 0) {
        int e = errno;
        close(fd);
        return mts_err_set(err, MTS_EIO, "http: cannot listen on port %d: %s", port, strerror(e));
    }
    struct sockaddr_storage got;
    socklen_t gl = sizeof got;
    getsockname(fd, (struct sockaddr *)&got, &gl);
    *out_port = ntohs(got.ss_family == AF_INET ? ((struct sockaddr_in *)&got)->sin_port
                                               : ((struct sockaddr_in6 *)&got)->sin6_port);
    return fd;
}

static void free_server(mts_http_server *s)
{
    for (int i = 0; i < s->nthreads; i++) {
        io_thread *io = &s->threads[i];
        while (atomic_load(&io->waking)) sched_yield(); /* a wake_send between its two steps */
        if (io->lfd >= 0) close(io->lfd);
        if (io->epfd >= 0) close(io->epfd);
        if (io->evfd >= 0) close(io->evfd);
        pthread_mutex_destroy(&io->qmu);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    for (int b = 0; b < ADDR_BUCKETS; b++)
        while (s->addr_tab[b]) {
            addr_count *e = s->addr_tab[b];
            s->addr_tab[b] = e->next;
            free(e);
        }
    pthread_mutex_destroy(&s->addr_mu);
    mts_tls_ctx_free(s->ssl_ctx);
    free(s->threads);
    free(s);
}

int mts_http_start(const mts_http_opts *o, mts_http_server **out, mts_err *err)
{
    *out = NULL;
    if (!o || !o->handler) return mts_err_set(err, MTS_EINVAL, "http: a handler is required");
    if (o->port < 0 || o->port > 65535) return mts_err_set(err, MTS_EINVAL, "http: invalid port %d", o->port);
    mts_http_server *s = calloc(1, sizeof *s);
    if (!s) return mts_err_set(err, MTS_ENOMEM, "http: out of memory");
    s->o = *o;
    s->admit_min = MTS_HTTP_ADMIT_MIN;
    if (!s->o.host) s->o.host = "0.0.0.0";
    if (s->o.io_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        s->o.io_threads = n < 1 ? 1 : n > 4 ? 4 : (int)n;
    }
    if (!s->o.max_body) s->o.max_body = (size_t)64 << 20;
    if (!s->o.max_header) s->o.max_header = 16 << 10;
    if (s->o.max_header < 64) s->o.max_header = 64;
    if (s->o.max_header > ((size_t)1 << 30)) s->o.max_header = (size_t)1 << 30; /* offsets are 32-bit */
    if (!s->o.idle_timeout_ms) s->o.idle_timeout_ms = 60000;
    if (s->o.max_connections <= 0) s->o.max_connections = 10000;
    if (s->o.header_timeout_ms <= 0) s->o.header_timeout_ms = 10000;
    if (s->o.idle_timeout_ms > 0 && s->o.header_timeout_ms > s->o.idle_timeout_ms)
        s->o.header_timeout_ms = s->o.idle_timeout_ms;
    if (o->tls_cert) {
        int trc = mts_tls_ctx_create(o->tls_cert, o->tls_key, o->tls_client_ca, &s->ssl_ctx, err);
        if (trc) {
            free(s);
            return trc;
        }
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->addr_mu, NULL);
    s->nlisten = s->o.io_threads;
    s->nlight = o->light_io ? s->nlisten : 0;
    s->nthreads = s->nlisten + s->nlight;
    s->threads = calloc((size_t)s->nthreads, sizeof *s->threads);
    if (!s->threads) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->addr_mu);
        mts_tls_ctx_free(s->ssl_ctx);
        free(s);
        return mts_err_set(err, MTS_ENOMEM, "http: out of memory");
    }
    for (int i = 0; i < s->nthreads; i++) {
        io_thread *io = &s->threads[i];
        io->srv = s;
        io->lfd = io->epfd = io->evfd = -1;
        pthread_mutex_init(&io->qmu, NULL);
    }
    for (int i = 0; i < s->nlight; i++) s->threads[s->nlisten + i].light = true;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(s->o.host, "0", &hints, &ai);
    if (gai != 0) {
        free_server(s);
        return mts_err_set(err, MTS_EINVAL, "http: cannot resolve host \"%s\": %s", o->host, gai_strerror(gai));
    }
    int rc = MTS_OK;
    s->port = o->port;
    if (o->port) {
        /* SO_REUSEPORT would let a second server (same user) silently share a busy port: probe
         * with a plain socket first so that case fails with EADDRINUSE as usual. */
        int probe = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (probe >= 0) {
            int one = 1;
            setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            struct sockaddr_storage ss;
            memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
            if (ss.ss_family == AF_INET) ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)o->port);
            else ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)o->port);
            if (bind(probe, (struct sockaddr *)&ss, ai->ai_addrlen) < 0)
                rc = mts_err_set(err, MTS_EIO, "http: cannot listen on %s:%d: %s", s->o.host, o->port,
                                 strerror(errno));
            close(probe);
        }
    }
    for (int i = 0; i < s->nthreads && rc == MTS_OK; i++) {
        io_thread *io = &s->threads[i];
        if (!io->light) {
            int port = s->port;
            int fd = open_listener(ai, port, &port, err);
            if (fd < 0) {
                rc = fd;
                break;
            }
            io->lfd = fd;
            s->port = port; /* with port 0, the others join the first one's port */
        }
        io->epfd = epoll_create1(EPOLL_CLOEXEC);
        io->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (io->epfd < 0 || io->evfd < 0) {
            rc = mts_err_set(err, MTS_EIO, "http: epoll/eventfd: %s", strerror(errno));
            break;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &io->ev_tag};
        struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &io->l_tag};
        if (epoll_ctl(io->epfd, EPOLL_CTL_ADD, io->evfd, &ev) < 0 ||
            (io->lfd >= 0 && epoll_ctl(io->epfd, EPOLL_CTL_ADD, io->lfd, &lev) < 0)) {
            rc = mts_err_set(err, MTS_EIO, "http: epoll_ctl: %s", strerror(errno));
            break;
        }
        io->listener_registered = io->lfd >= 0;
    }
    freeaddrinfo(ai);
    if (rc != MTS_OK) {
        free_server(s);
        return rc;
    }
    s->listeners_open = s->nlisten;
    int started = 0;
    for (; started < s->nthreads; started++) {
        if (pthread_create(&s->threads[started].tid, NULL, io_main, &s->threads[started]) != 0) break;
        pthread_setname_np(s->threads[started].tid, s->threads[started].light ? "mts-http-light" : "mts-http");
    }
    if (started < s->nthreads) {
        atomic_store(&s->stopping, 1);
        for (int i = 0; i < started; i++) {
            uint64_t one = 1;
            ssize_t w = write(s->threads[i].evfd, &one, sizeof one);
            (void)w;
            pthread_join(s->threads[i].tid, NULL);
        }
        free_server(s);
        return mts_err_set(err, MTS_EIO, "http: cannot start I/O threads");
    }
    *out = s;
    return MTS_OK;
}

int mts_http_port(const mts_http_server *s)
{
    return s->port;
}

static void wake_all(mts_http_server *s)
{
    for (int i = 0; i < s->nthreads; i++) {
        uint64_t one = 1;
        ssize_t w = write(s->threads[i].evfd, &one, sizeof one);
        (void)w;
    }
}

void mts_http_stop_accepting(mts_http_server *s)
{
    if (!s) return;
    atomic_store(&s->draining, 1);
    wake_all(s);
    if (tls_io && tls_io->srv == s) {
        close_listener(tls_io);
        return;
    }
    pthread_mutex_lock(&s->mu);
    while (s->listeners_open > 0) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void mts_http_stop(mts_http_server *s)
{
    if (!s) return;
    MTS_ASSERT(!(tls_io && tls_io->srv == s));
    atomic_store(&s->draining, 1); /* answers carry Connection: close from here on */
    atomic_store(&s->stopping, 1);
    wake_all(s);
    for (int i = 0; i < s->nthreads; i++) pthread_join(s->threads[i].tid, NULL);
    free_server(s);
}

/* ------------------------------------------------------------------ parser entry for tests */

/* A connected pair of non-blocking sockets for mts_http_parse_stream: a Unix socket pair, or with
 * tcp a loopback TCP connection (a refused body is dropped with recv(MSG_TRUNC), which Unix
 * stream sockets do not take), closed with a reset so no TIME_WAIT is left behind. */
static int stream_pair(int sv[2], bool tcp)
{
    if (!tcp) return socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), rc = -1;
    sv[0] = sv[1] = -1;
    if (l >= 0 && !bind(l, (struct sockaddr *)&a, sizeof a) && !listen(l, 1) &&
        !getsockname(l, (struct sockaddr *)&a, &al) && (sv[1] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0 &&
        !connect(sv[1], (struct sockaddr *)&a, sizeof a) && (sv[0] = accept4(l, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
        struct linger lg = {1, 0};
        for (int i = 0; i < 2; i++) {
            setsockopt(sv[i], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            fcntl(sv[i], F_SETFL, O_NONBLOCK);
        }
        rc = 0;
    }
    if (l >= 0) close(l);
    if (rc) {
        if (sv[0] >= 0) close(sv[0]);
        if (sv[1] >= 0) close(sv[1]);
    }
    return rc;
}

int mts_http_parse_stream(const void *data, size_t len, size_t read_size, size_t max_header, size_t max_body,
                          mts_http_admit_fn admit, void *admit_user, size_t admit_min, mts_http_parse_cb cb,
                          void *user, int *error_status)
{
    *error_status = 0;
    mts_http_server srv;
    memset(&srv, 0, sizeof srv);
    srv.o.max_header = max_header ? max_header : 16 * 1024;
    srv.o.max_body = max_body ? max_body : (size_t)64 << 20;
    srv.o.admit = admit;
    srv.o.user = admit_user;
    srv.admit_min = admit_min ? admit_min : MTS_HTTP_ADMIT_MIN;
    io_thread io;
    memset(&io, 0, sizeof io);
    io.srv = &srv;
    int sv[2];
    if (stream_pair(sv, admit != NULL)) return -1;
    mts_http_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    c->fd = sv[0];
    c->io = &io;
    io.conns = c;
    io.nconns = 1;
    atomic_store(&srv.nconns, 1);
    reset_request(c);
    const char *in = data;
    size_t off = 0;
    int n = 0;
    for (;;) {
        int r = parse(c);
        if (r == P_READY) {
            fill_request(c);
            n++;
            if (cb) cb(user, &c->req);
            /* as complete_response releases an answered request */
            bool keep = c->keep_alive;
            c->req_start += c->req_end;
            reset_request(c);
            if (c->req_start == c->rlen) c->req_start = c->rlen = 0;
            if (!keep) break;
            continue;
        }
        if (r == P_ERROR || c->fd < 0 || off == len) break;
        if (c->state == RS_DISCARD) {
            /* a refused body: the rest of it arrives on the socket, where the connection
             * drops it unread, and the bytes after it are the next request's */
            size_t take = c->discard_left;
            if (read_size && take > read_size) take = read_size;
            if (take > len - off) take = len - off;
            if (take > 4096) take = 4096; /* within the socket pair's buffer */
            ssize_t w = write(sv[1], in + off, take);
            if (w <= 0) break;
            off += (size_t)w;
            discard_body(c);
            if (c->state != RS_HEAD && c->state != RS_DISCARD) break;
            continue;
        }
        if (!rbuf_room(c)) break;
        size_t take = c->rcap - c->rlen;
        if (read_size && take > read_size) take = read_size;
        if (take > len - off) take = len - off;
        memcpy(c->rbuf + c->rlen, in + off, take);
        c->rlen += take;
        off += take;
        char tmp[512]; /* what this layer sent (100 Continue) */
        while (read(sv[1], tmp, sizeof tmp) > 0) {
        }
    }
    if (c->state == RS_CLOSING && c->out_tail && c->out_tail->niov > 0 && c->out_tail->iov[0].iov_len > 12) {
        const char *h = c->out_tail->iov[0].iov_base; /* "HTTP/1.1 NNN ..." */
        *error_status = (h[9] - '0') * 100 + (h[10] - '0') * 10 + (h[11] - '0');
    }
    while (c->out_head) {
        out_chunk *ch = c->out_head;
        c->out_head = ch->next;
        chunk_free(ch);
    }
    if (c->fd >= 0) close(c->fd);
    close(sv[1]);
    mts_iobuf_free(c->rbuf);
    mts_iobuf_free(c->inflated);
    free(c);
    return n;
}
