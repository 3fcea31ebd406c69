/*
 * The gRPC front end's native transport: gRPC over plaintext HTTP/2 (prior knowledge, as gRPC
 * clients speak it) on mtserve's own threads, with libnghttp2 (Debian) doing the framing, HPACK
 * and flow-control bookkeeping. It serves the same methods through the same call framework as
 * the gRPC core transport (grpc_server.c); the service files cannot tell the two apart.
 *
 * Why it exists: gRPC core reads every connection in one process-wide set of polling threads, so
 * a light tenant's small call waits behind whatever those threads are reading for a flood of
 * large messages. Here every connection has a thread of its own (reading, writing, running the
 * handlers of its calls), and the kernel schedules a light client's thread beside a flooding
 * one's instead of behind it. And a unary inference message is admitted before its body is read:
 * each stream starts with HTTP/2's default 64 KiB window, the model named in field 1 of the first
 * bytes is checked (mts_server_admit), and only then is the stream's window opened to the whole
 * message; a refused call gets RESOURCE_EXHAUSTED and RST_STREAM(NO_ERROR), so a flood of a full
 * model costs at most its first 64 KiB per message instead of all of it (read into a buffer of
 * that size: the message's full-size buffer comes with the admission).
 *
 * Threads. One accepting thread; one thread per connection, which alone touches the nghttp2
 * session and the streams. Other threads (workers finishing calls) reach a stream through the
 * framework, which posts an operation (finish, send, read, watch) to the connection's inbox under
 * the connection's mutex and wakes its thread with an eventfd; operations hold a reference to
 * their call, dropped on the connection's thread. A connection holds a reference per call made on
 * it; its thread frees it only when the socket is closed and no call refers to it any more. A
 * connection whose request messages are small has its thread run real-time (note_size).
 *
 * Compressed request messages (grpc-encoding gzip or deflate) are decompressed whole, bounded by
 * the message limit; responses go uncompressed. Not covered (gRPC core, which serves TLS, has
 * them): server-initiated keepalive pings (clients' pings are answered); binary (-bin) metadata
 * reaches the handlers still base64-encoded (none of them reads any).
 */
#include "api/grpc_internal.h"
#include "util/clock.h"
#include "util/iobuf.h"
#include "util/log.h"
#include "util/rtprio.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <zlib.h>

#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <nghttp2/nghttp2.h>

#define H2_MAX_CONNS 1024
#define H2_RBUF (256 * 1024)         /* one read from the socket */
#define H2_READS_PER_TURN 4          /* reads before the thread looks at its inbox again */
#define H2_WBUF_MAX (256 * 1024)     /* output gathered before the socket is written */
#define H2_MSG_FIRST ((size_t)4 << 20) /* a message's first buffer; it doubles as bytes arrive */
#define H2_CONN_WINDOW (64 << 20)    /* connection-level receive window */
#define H2_FIRST_WINDOW 65535        /* a stream's window until its message is admitted */
#define H2_MAX_STREAMS 1000          /* concurrent streams per connection */
#define H2_MAX_HEADER_BYTES (64 * 1024)
#define H2_STACK (1 << 20)
#define H2_LIGHT_MAX (64 * 1024)     /* a message below this many bytes is small */
#define H2_LIGHT_AFTER 2             /* small messages in a row before the thread turns real-time */

enum { OP_FINISH, OP_SEND, OP_READ, OP_WATCH };

typedef struct h2_op {
    int kind;
    mts__grpc_call *c;    /* a reference held */
    grpc_byte_buffer *bb; /* OP_FINISH (reply, may be NULL) and OP_SEND */
    int code;
    char *msg;
    struct h2_op *next;
} h2_op;

/* One response message: the 5-byte gRPC prefix, then the bytes of bb's slices. */
typedef struct out_msg {
    uint8_t prefix[5];
    grpc_byte_buffer *bb; /* NULL: an empty message */
    size_t prefix_sent;
    size_t slice, slice_off;
    struct out_msg *next;
} out_msg;

typedef struct in_msg {
    grpc_slice s;
    size_t wire; /* its bytes on the stream (prefix included): window given back on delivery */
    struct in_msg *next;
} in_msg;

typedef struct mts__h2_stream {
    int32_t id;
    struct mts__h2_stream *prev, *next;
    const mts__grpc_method *method;
    char path[256];
    size_t path_len;
    bool post, ct_ok, too_big;
    char encoding[32];
    int64_t deadline_ns; /* CLOCK_MONOTONIC; 0: none */
    gpr_timespec deadline;
    grpc_metadata_array md; /* handed to the call */
    size_t hdr_bytes;
    /* the request message being read */
    uint8_t pfx[5];
    size_t pfx_have;
    uint8_t *buf;
    size_t len, have, cap; /* declared length, bytes read, buffer size */
    bool compressed; /* the message's flag: gzip or deflate per grpc-encoding */
    bool admitted; /* its window is open to the whole message */
    size_t held;   /* bytes read before admission, not yet given back to the stream's window */
    int n_msgs;
    in_msg *in_head, *in_tail; /* streaming: read, not yet asked for */
    bool remote_done, eof_delivered;
    /* the call */
    mts__grpc_call *call; /* a reference held while the stream lives */
    bool want_read, watching;
    /* the response */
    bool responded; /* final status decided: nothing more is added */
    bool rst_after; /* answered before the request ended: reset once the status is sent */
    bool headers_sent, deferred, finish_pending;
    int code;
    char *msg;
    out_msg *out_head, *out_tail;
} h2_stream;

typedef struct mts__h2_conn {
    mts__h2 *h;
    int fd, efd;
    nghttp2_session *sess;
    _Atomic int refs; /* its thread's, one per call */
    pthread_mutex_t lock;
    h2_op *in_head, *in_tail; /* under lock */
    bool goaway, kill;       /* under lock */
    bool goaway_sent;
    bool open;               /* the socket */
    h2_stream *streams;
    uint8_t *rbuf;
    uint8_t *wbuf;
    size_t wlen, woff;
    struct mts__h2_conn *lprev, *lnext; /* the listener's list, under h->lock */
    int small_run;           /* small request messages in a row (at most H2_LIGHT_AFTER) */
    bool rt;                 /* its thread runs real-time (note_size) */
} h2_conn;

struct mts__h2 {
    mts_grpc *g;
    mts_server *srv;
    size_t max_msg;
    bool realtime; /* connection threads may turn real-time (note_size) */
    int lfd, efd;
    pthread_t accepter;
    bool accepter_started;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    h2_conn *conns;
    int n_conns; /* connection threads alive */
    bool stopping;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The connection whose thread this is (NULL on other threads). An operation posted, or a last
 * call reference dropped, by the connection's own thread (a handler run inline, a stream freed)
 * needs no wake-up: the thread looks at its inbox before it waits again. Skipping the eventfd
 * saves an unary call answered inline four system calls (two writes, a read, a poll). */
static _Thread_local h2_conn *this_conn;

static void wake(int efd)
{
    uint64_t one = 1;
    ssize_t r = write(efd, &one, sizeof one);
    (void)r;
}

/* ---- connection references ---- */

static void conn_ref(h2_conn *conn)
{
    atomic_fetch_add(&conn->refs, 1);
}

void mts__h2_conn_unref(h2_conn *conn)
{
    /* the thread's own reference is the last: when only it is left, it may be waiting for that */
    if (atomic_fetch_sub(&conn->refs, 1) == 2 && this_conn != conn) wake(conn->efd);
}

/* ---- the framework's operations (any thread, under c->lock) ---- */

static void post(mts__grpc_call *c, int kind, grpc_byte_buffer *bb, int code, const char *msg)
{
    h2_conn *conn = c->h2c;
    h2_op *op = calloc(1, sizeof *op);
    char *m = msg ? strdup(msg) : NULL;
    if (!op || (msg && !m)) { /* out of memory: the call's stream is left to its deadline or client */
        MTS_WARN("grpc: out of memory queueing an operation on a native call");
        free(op);
        free(m);
        if (bb) grpc_byte_buffer_destroy(bb);
        return;
    }
    mts__grpc_call_ref(c);
    *op = (h2_op){kind, c, bb, code, m, NULL};
    pthread_mutex_lock(&conn->lock);
    bool was_empty = !conn->in_head;
    if (conn->in_tail) conn->in_tail->next = op;
    else conn->in_head = op;
    conn->in_tail = op;
    pthread_mutex_unlock(&conn->lock);
    if (was_empty && this_conn != conn) wake(conn->efd);
}

void mts__h2_finish(mts__grpc_call *c, grpc_byte_buffer *reply, int code, const char *msg)
{
    post(c, OP_FINISH, reply, code, msg ? msg : "");
}

void mts__h2_send(mts__grpc_call *c, grpc_byte_buffer *bb)
{
    post(c, OP_SEND, bb, 0, NULL);
}

void mts__h2_read(mts__grpc_call *c)
{
    post(c, OP_READ, NULL, 0, NULL);
}

void mts__h2_watch(mts__grpc_call *c)
{
    post(c, OP_WATCH, NULL, 0, NULL);
}

/* ---- output ---- */

static void out_free(out_msg *o)
{
    if (o->bb) grpc_byte_buffer_destroy(o->bb);
    free(o);
}

/* Percent-encodes a grpc-message value (bytes outside 0x20..0x7e, and '%'). */
static size_t percent_encode(const char *in, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && n + 4 < cap; p++) {
        if (*p >= 0x20 && *p <= 0x7e && *p != '%') {
            out[n++] = (char)*p;
        } else {
            out[n++] = '%';
            out[n++] = hex[*p >> 4];
            out[n++] = hex[*p & 15];
        }
    }
    out[n] = 0;
    return n;
}

#define NV(n, v, vl) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vl), NGHTTP2_NV_FLAG_NONE}

/* Submits the status: as trailers after the response, or as a Trailers-Only response with
 * HTTP status `http` when nothing was sent yet. */
static void submit_status(h2_conn *conn, h2_stream *s, int http, int code, const char *msg)
{
    char status[16], hs[8], enc[1024];
    int sl = snprintf(status, sizeof status, "%d", code);
    int hl = snprintf(hs, sizeof hs, "%d", http);
    size_t el = percent_encode(msg ? msg : "", enc, sizeof enc);
    nghttp2_nv nv[5];
    size_t n = 0;
    if (!s->headers_sent) {
        nv[n++] = (nghttp2_nv)NV(":status", hs, (size_t)hl);
        nv[n++] = (nghttp2_nv)NV("content-type", "application/grpc", 16);
    }
    nv[n++] = (nghttp2_nv)NV("grpc-status", status, (size_t)sl);
    if (el) nv[n++] = (nghttp2_nv)NV("grpc-message", enc, el);
    if (!s->headers_sent) {
        s->headers_sent = true;
        nghttp2_submit_response(conn->sess, s->id, nv, n, NULL);
    } else {
        nghttp2_submit_trailer(conn->sess, s->id, nv, n);
    }
}

/* Frees the messages at the head of the stream's output whose bytes are all out. */
static void drop_sent(h2_stream *s)
{
    for (out_msg *o; (o = s->out_head) && o->prefix_sent == 5 &&
                     (!o->bb || o->slice >= o->bb->data.raw.slice_buffer.count);) {
        s->out_head = o->next;
        if (!s->out_head) s->out_tail = NULL;
        out_free(o);
    }
}

static ssize_t read_out(nghttp2_session *sess, int32_t id, uint8_t *buf, size_t length, uint32_t *flags,
                        nghttp2_data_source *source, void *user)
{
    (void)sess;
    (void)id;
    h2_conn *conn = user;
    h2_stream *s = source->ptr;
    size_t n = 0;
    for (drop_sent(s); n < length && s->out_head; drop_sent(s)) {
        out_msg *o = s->out_head;
        if (o->prefix_sent < 5) {
            size_t k = 5 - o->prefix_sent < length - n ? 5 - o->prefix_sent : length - n;
            memcpy(buf + n, o->prefix + o->prefix_sent, k);
            o->prefix_sent += k;
            n += k;
            continue;
        }
        grpc_slice sl = o->bb->data.raw.slice_buffer.slices[o->slice]; /* (drop_sent: one is left) */
        size_t avail = GRPC_SLICE_LENGTH(sl) - o->slice_off;
        size_t k = avail < length - n ? avail : length - n;
        memcpy(buf + n, GRPC_SLICE_START_PTR(sl) + o->slice_off, k);
        o->slice_off += k;
        n += k;
        if (o->slice_off == GRPC_SLICE_LENGTH(sl)) {
            o->slice++;
            o->slice_off = 0;
        }
    }
    if (!s->out_head && s->finish_pending) {
        s->finish_pending = false;
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        submit_status(conn, s, 200, s->code, s->msg);
        return (ssize_t)n;
    }
    if (!n) {
        s->deferred = true;
        return NGHTTP2_ERR_DEFERRED;
    }
    return (ssize_t)n;
}

/* Starts (or resumes) the stream's response after output or the final status was added. */
static void start_output(h2_conn *conn, h2_stream *s)
{
    if (!s->headers_sent) {
        if (!s->out_head && s->finish_pending) {
            s->finish_pending = false;
            submit_status(conn, s, 200, s->code, s->msg);
            return;
        }
        nghttp2_nv nv[] = {NV(":status", "200", 3), NV("content-type", "application/grpc", 16),
                           NV("grpc-accept-encoding", "identity,deflate,gzip", 21)};
        nghttp2_data_provider prd = {.source.ptr = s, .read_callback = read_out};
        s->headers_sent = true;
        nghttp2_submit_response(conn->sess, s->id, nv, sizeof nv / sizeof nv[0], &prd);
    } else if (s->deferred) {
        s->deferred = false;
        nghttp2_session_resume_data(conn->sess, s->id);
    }
}

/* A connection's thread runs real-time (util/rtprio.h) while its traffic is small: from its
 * H2_LIGHT_AFTER-th small request message in a row until the first large message in either
 * direction. A light client's connection turns on its second call and from then on is not kept
 * waiting for a core by the flood's threads or the workers; a flood's connection (large uploads)
 * never turns, and one whose calls grow turns back before it reads or writes a large message. */
static void note_size(h2_conn *conn, size_t len, bool in)
{
    if (!conn->h->realtime) return;
    if (len >= H2_LIGHT_MAX) {
        conn->small_run = 0;
        if (conn->rt) conn->rt = mts_thread_realtime(false, "mts-grpc-conn");
    } else if (in && conn->small_run < H2_LIGHT_AFTER && ++conn->small_run == H2_LIGHT_AFTER && !conn->rt) {
        conn->rt = mts_thread_realtime(true, "mts-grpc-conn");
    }
}

static void queue_out(h2_conn *conn, h2_stream *s, grpc_byte_buffer *bb)
{
    out_msg *o = calloc(1, sizeof *o);
    if (!o) {
        grpc_byte_buffer_destroy(bb);
        return;
    }
    size_t len = bb ? grpc_byte_buffer_length(bb) : 0;
    note_size(conn, len, false);
    o->prefix[0] = 0;
    o->prefix[1] = (uint8_t)(len >> 24);
    o->prefix[2] = (uint8_t)(len >> 16);
    o->prefix[3] = (uint8_t)(len >> 8);
    o->prefix[4] = (uint8_t)len;
    o->bb = bb;
    if (s->out_tail) s->out_tail->next = o;
    else s->out_head = o;
    s->out_tail = o;
}

/* Answers the stream from the transport (the call, if any, learns it was cancelled): the status,
 * then RST_STREAM(NO_ERROR) when the client is still sending, so it stops. */
static void respond(h2_conn *conn, h2_stream *s, int http, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void respond(h2_conn *conn, h2_stream *s, int http, int code, const char *fmt, ...)
{
    if (s->responded) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->responded = true;
    bool had_headers = s->headers_sent;
    /* queued messages are dropped, but one already partly sent is finished: the client must not
     * see the status inside a message */
    out_msg *keep = s->out_head && s->out_head->prefix_sent ? s->out_head : NULL;
    for (out_msg *o = keep ? keep->next : s->out_head, *n; o; o = n) {
        n = o->next;
        out_free(o);
    }
    if (keep) keep->next = NULL;
    s->out_head = s->out_tail = keep;
    if (!s->headers_sent) {
        s->finish_pending = false;
        submit_status(conn, s, http, code, msg);
    } else { /* the data provider ends with these trailers (resumed if it was waiting) */
        s->finish_pending = true;
        s->code = code;
        free(s->msg);
        s->msg = strdup(msg);
        if (s->deferred) {
            s->deferred = false;
            nghttp2_session_resume_data(conn->sess, s->id);
        }
    }
    s->rst_after = !had_headers; /* RST_STREAM(NO_ERROR) once the status is out (on_frame_sent) */
    mts_iobuf_free(s->buf);
    s->buf = NULL;
    if (s->call) mts__grpc_native_closed(s->call, code == MTS_GRPC_DEADLINE_EXCEEDED);
}

/* ---- input ---- */

static void iobuf_release(void *p)
{
    mts_iobuf_free(p);
}

/* Streaming: hands the next read message, or the end of input, to a call that asked for it. */
static void try_deliver(h2_conn *conn, h2_stream *s)
{
    if (!s->want_read || !s->call) return;
    if (s->in_head) {
        in_msg *m = s->in_head;
        s->in_head = m->next;
        if (!s->in_head) s->in_tail = NULL;
        s->want_read = false;
        grpc_slice sl = m->s;
        nghttp2_session_consume_stream(conn->sess, s->id, m->wire);
        free(m);
        mts__grpc_native_message(s->call, &sl);
    } else if (s->remote_done && !s->eof_delivered) {
        s->eof_delivered = true;
        s->want_read = false;
        mts__grpc_native_message(s->call, NULL);
    }
}

/* Makes the stream's call (the request's headers are complete, or its unary message is). */
static bool make_call(h2_conn *conn, h2_stream *s)
{
    mts__grpc_call *c =
        mts__grpc_native_call(conn->h->g, s->method, s->path, s->path_len, &s->md, s->deadline);
    if (!c) {
        respond(conn, s, 200, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    conn_ref(conn);
    c->h2c = conn;
    c->h2s = s;
    mts__grpc_call_ref(c); /* the stream's */
    s->call = c;
    return mts__grpc_native_begin(c);
}

/* in[0..len) decompressed (gzip, or deflate in its zlib wrapper) into a block of its own of at
 * most max bytes; NULL with msg set (and *code) when it is not such data or comes out larger. */
static uint8_t *inflate_message(const uint8_t *in, size_t len, size_t max, size_t *out_len, int *code, char *msg,
                                size_t msglen)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    *code = MTS_GRPC_RESOURCE_EXHAUSTED;
    if (inflateInit2(&z, 15 + 32) != Z_OK) {
        snprintf(msg, msglen, "out of memory decompressing the request message");
        return NULL;
    }
    size_t cap = len < 16384 ? 65536 : len * 4, have = 0;
    if (cap > max) cap = max ? max : 1;
    uint8_t *out = mts_iobuf_alloc(cap);
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)len;
    while (out) {
        z.next_out = out + have;
        z.avail_out = (uInt)(cap - have);
        int rc = inflate(&z, Z_NO_FLUSH);
        have = cap - z.avail_out;
        if (rc == Z_STREAM_END) {
            if (z.avail_in) {
                *code = MTS_GRPC_INTERNAL;
                snprintf(msg, msglen, "%u bytes after the end of the compressed request message", z.avail_in);
                break;
            }
            inflateEnd(&z);
            *out_len = have;
            return out;
        }
        if (rc != Z_OK && !(rc == Z_BUF_ERROR && z.avail_in && !z.avail_out)) {
            *code = MTS_GRPC_INTERNAL;
            snprintf(msg, msglen, "cannot decompress the request message (grpc-encoding): %s",
                     rc == Z_BUF_ERROR ? "it is cut short" : z.msg ? z.msg : "invalid data");
            break;
        }
        if (!z.avail_out) {
            if (cap >= max) {
                snprintf(msg, msglen, "Received message larger than max (decompressed beyond %zu bytes)", max);
                break;
            }
            size_t want = cap * 2 < max ? cap * 2 : max;
            uint8_t *nb = mts_iobuf_grow(out, have, want);
            if (!nb) {
                snprintf(msg, msglen, "out of memory decompressing the request message");
                break;
            }
            out = nb;
            cap = want;
        }
    }
    if (!out) snprintf(msg, msglen, "out of memory decompressing the request message");
    inflateEnd(&z);
    mts_iobuf_free(out);
    return NULL;
}

/* A whole request message has been read into s->buf. */
static void message_done(h2_conn *conn, h2_stream *s)
{
    size_t len = s->len;
    if (s->compressed) {
        char why[256];
        int code;
        uint8_t *plain = inflate_message(s->buf, s->len, conn->h->max_msg, &len, &code, why, sizeof why);
        mts_iobuf_free(s->buf);
        s->buf = plain;
        if (!plain) {
            respond(conn, s, 200, code, "%s", why);
            return;
        }
    }
    grpc_slice sl = grpc_slice_new_with_user_data(s->buf, len, iobuf_release, s->buf);
    s->buf = NULL;
    s->pfx_have = 0;
    s->admitted = false;
    if (!s->method->streaming) {
        if (s->n_msgs++ || s->call) { /* a second message on a unary call */
            grpc_slice_unref(sl);
            respond(conn, s, 200, MTS_GRPC_INTERNAL, "more than one request message for a unary method");
            return;
        }
        if (make_call(conn, s)) mts__grpc_native_message(s->call, &sl);
        else grpc_slice_unref(sl);
        return;
    }
    in_msg *m = malloc(sizeof *m);
    if (!m) {
        grpc_slice_unref(sl);
        respond(conn, s, 200, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    m->s = sl;
    m->wire = s->len + 5; /* as sent (compressed, when it was) */
    m->next = NULL;
    if (s->in_tail) s->in_tail->next = m;
    else s->in_head = m;
    s->in_tail = m;
    try_deliver(conn, s);
}

/* A unary inference message waits for admission by its model (admit_early) before its body. */
static bool admits_early(const h2_stream *s)
{
    return !s->method->streaming && s->method->model_field && !s->n_msgs;
}

/* A message's first buffer for its declared length: the rest grows with the bytes that arrive. */
static size_t first_cap(size_t len)
{
    return len < H2_MSG_FIRST ? len : H2_MSG_FIRST;
}

/* Opens the stream's window to the whole message being read, and gives a message that waited
 * in its first window's buffer its first buffer. */
static void admit(h2_conn *conn, h2_stream *s)
{
    s->admitted = true;
    size_t first = first_cap(s->len);
    if (s->buf && s->cap < first) {
        uint8_t *nb = mts_iobuf_grow(s->buf, s->have, first);
        if (nb) { /* else it grows as bytes arrive, and answers there when memory is short */
            s->buf = nb;
            s->cap = first;
        }
    }
    if (s->held && !s->method->streaming) nghttp2_session_consume_stream(conn->sess, s->id, s->held);
    s->held = 0;
    uint64_t want = (uint64_t)s->len + 5;
    if (want > H2_FIRST_WINDOW)
        nghttp2_session_set_local_window_size(conn->sess, NGHTTP2_FLAG_NONE, s->id,
                                              (int32_t)(want > INT32_MAX ? INT32_MAX : want));
}

/* Before a unary inference message is read whole: the model its field 1 names is asked whether
 * it takes a request now. Refused: answered, and the client stops sending. A name not within the
 * first window, or a model the server does not know, is left to the handler. */
static void admit_early(h2_conn *conn, h2_stream *s)
{
    const mts__grpc_method *m = s->method;
    if (!admits_early(s)) {
        admit(conn, s);
        return;
    }
    const uint8_t *p = s->buf, *end = s->buf + s->have;
    mts__pb_field f;
    while (mts__pb_next(&p, end, &f))
        if (f.number == m->model_field && f.wire == 2) {
            mts_err err = {0};
            int rc = mts_server_admit(conn->h->srv, (const char *)f.data, f.len, &err);
            if (rc) {
                respond(conn, s, 200, mts_proto_grpc_code(rc), "%s", err.msg[0] ? err.msg : mts_status_text(rc));
                return;
            }
            admit(conn, s);
            return;
        }
    if (s->have == s->len || s->have + 5 >= H2_FIRST_WINDOW) admit(conn, s);
}

static int on_data(nghttp2_session *sess, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *user)
{
    (void)flags;
    h2_conn *conn = user;
    h2_stream *s = nghttp2_session_get_stream_user_data(sess, id);
    /* Window updates are ours (no automatic ones): the connection's window is given back for
     * every byte; a unary stream's only once its message is admitted, so a refused message's
     * stream never gets more than its first window; a streaming one's as its handler takes each
     * message, so a client sending faster than the handler reads waits (flow control) instead of
     * filling the server's memory. */
    nghttp2_session_consume_connection(sess, len);
    if (s && !s->responded && s->method && !s->method->streaming) { /* (streaming: as messages are handled) */
        if (s->admitted) nghttp2_session_consume_stream(sess, id, len);
        else s->held += len;
    }
    while (s && !s->responded && s->method && len) {
        if (s->pfx_have < 5) {
            size_t k = 5 - s->pfx_have < len ? 5 - s->pfx_have : len;
            memcpy(s->pfx + s->pfx_have, data, k);
            s->pfx_have += k;
            data += k;
            len -= k;
            if (s->pfx_have < 5) break;
            size_t mlen = (size_t)s->pfx[1] << 24 | (size_t)s->pfx[2] << 16 | (size_t)s->pfx[3] << 8 | s->pfx[4];
            if (s->pfx[0] > 1) {
                respond(conn, s, 200, MTS_GRPC_INTERNAL, "invalid gRPC message flags 0x%02x", s->pfx[0]);
                break;
            }
            s->compressed = s->pfx[0] == 1;
            if (s->compressed && !s->encoding[0]) {
                respond(conn, s, 200, MTS_GRPC_INTERNAL, "a compressed message without grpc-encoding");
                break;
            }
            if (s->compressed && strcmp(s->encoding, "gzip") && strcmp(s->encoding, "deflate")) {
                respond(conn, s, 200, MTS_GRPC_UNIMPLEMENTED,
                        "grpc-encoding %s is not supported (gzip, deflate and identity are)", s->encoding);
                break;
            }
            note_size(conn, mlen, true);
            if (mlen > conn->h->max_msg) {
                respond(conn, s, 200, MTS_GRPC_RESOURCE_EXHAUSTED, "Received message larger than max (%zu vs. %zu)",
                        mlen, conn->h->max_msg);
                break;
            }
            /* the declared length is the client's word: memory follows the bytes that arrive; a
             * message that may yet be refused gets its first window's worth (a flood's refused
             * uploads take no megabyte buffers) */
            size_t first = first_cap(mlen);
            if (!s->admitted && admits_early(s) && first > H2_FIRST_WINDOW) first = H2_FIRST_WINDOW;
            s->cap = first ? first : 1;
            s->buf = mts_iobuf_alloc(s->cap);
            if (!s->buf) {
                respond(conn, s, 200, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte request message",
                        mlen);
                break;
            }
            s->len = mlen;
            s->have = 0;
            if (!mlen) {
                admit(conn, s);
                message_done(conn, s);
            }
            continue;
        }
        size_t k = s->len - s->have < len ? s->len - s->have : len;
        if (s->have + k > s->cap) {
            size_t want = s->cap * 2 > s->have + k ? s->cap * 2 : s->have + k;
            if (want > s->len) want = s->len;
            uint8_t *nb = mts_iobuf_grow(s->buf, s->have, want);
            if (!nb) {
                respond(conn, s, 200, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte request message",
                        s->len);
                break;
            }
            s->buf = nb;
            s->cap = want;
        }
        memcpy(s->buf + s->have, data, k);
        s->have += k;
        data += k;
        len -= k;
        if (!s->admitted) {
            admit_early(conn, s);
            if (s->responded) break;
        }
        if (s->have == s->len) message_done(conn, s);
    }
    return 0;
}

/* grpc-timeout: 1 to 8 digits and a unit (H M S m u n); -1 when malformed. */
static int64_t parse_timeout(const uint8_t *v, size_t n)
{
    if (n < 2 || n > 9) return -1;
    int64_t x = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (v[i] < '0' || v[i] > '9') return -1;
        x = x * 10 + (v[i] - '0');
    }
    switch (v[n - 1]) {
    case 'H': return x * 3600 * 1000000000LL;
    case 'M': return x * 60 * 1000000000LL;
    case 'S': return x * 1000000000LL;
    case 'm': return x * 1000000LL;
    case 'u': return x * 1000LL;
    case 'n': return x;
    default: return -1;
    }
}

static bool name_is(const uint8_t *name, size_t len, const char *lit)
{
    return strlen(lit) == len && !memcmp(name, lit, len);
}

static int on_header(nghttp2_session *sess, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user)
{
    (void)flags;
    (void)user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    h2_stream *s = nghttp2_session_get_stream_user_data(sess, frame->hd.stream_id);
    if (!s || s->too_big) return 0;
    s->hdr_bytes += namelen + valuelen + 32;
    if (s->hdr_bytes > H2_MAX_HEADER_BYTES) {
        s->too_big = true;
        return 0;
    }
    if (namelen && name[0] == ':') {
        if (name_is(name, namelen, ":method")) s->post = valuelen == 4 && !memcmp(value, "POST", 4);
        else if (name_is(name, namelen, ":path") && valuelen < sizeof s->path) {
            memcpy(s->path, value, valuelen);
            s->path_len = valuelen;
        }
        return 0;
    }
    if (name_is(name, namelen, "content-type")) {
        s->ct_ok = valuelen >= 16 && !memcmp(value, "application/grpc", 16) &&
                   (valuelen == 16 || value[16] == '+' || value[16] == ';');
        return 0;
    }
    if (name_is(name, namelen, "grpc-timeout")) {
        int64_t ns = parse_timeout(value, valuelen);
        if (ns >= 0) {
            s->deadline_ns = mono_ns() + ns;
            if (!s->deadline_ns) s->deadline_ns = 1;
            s->deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_nanos(ns, GPR_TIMESPAN));
        }
        return 0;
    }
    if (name_is(name, namelen, "grpc-encoding")) {
        size_t k = valuelen < sizeof s->encoding - 1 ? valuelen : sizeof s->encoding - 1;
        memcpy(s->encoding, value, k);
        s->encoding[k] = 0;
        return 0;
    }
    if (name_is(name, namelen, "te") || name_is(name, namelen, "grpc-accept-encoding")) return 0;
    grpc_metadata_array *md = &s->md;
    if (md->count == md->capacity) {
        size_t cap = md->capacity ? md->capacity * 2 : 8;
        md->metadata = gpr_realloc(md->metadata, cap * sizeof *md->metadata);
        md->capacity = cap;
    }
    grpc_metadata *e = &md->metadata[md->count++];
    memset(e, 0, sizeof *e);
    e->key = grpc_slice_from_copied_buffer((const char *)name, namelen);
    e->value = grpc_slice_from_copied_buffer((const char *)value, valuelen);
    return 0;
}

static void md_free(grpc_metadata_array *md)
{
    for (size_t i = 0; i < md->count; i++) {
        grpc_slice_unref(md->metadata[i].key);
        grpc_slice_unref(md->metadata[i].value);
    }
    grpc_metadata_array_destroy(md);
    grpc_metadata_array_init(md);
}

static int on_begin_headers(nghttp2_session *sess, const nghttp2_frame *frame, void *user)
{
    h2_conn *conn = user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    h2_stream *s = calloc(1, sizeof *s);
    if (!s) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* the stream is reset */
    s->id = frame->hd.stream_id;
    s->deadline = gpr_inf_future(GPR_CLOCK_REALTIME);
    grpc_metadata_array_init(&s->md);
    s->next = conn->streams;
    if (conn->streams) conn->streams->prev = s;
    conn->streams = s;
    nghttp2_session_set_stream_user_data(sess, s->id, s);
    return 0;
}

/* The request's headers are complete. */
static void headers_done(h2_conn *conn, h2_stream *s)
{
    if (s->too_big) {
        respond(conn, s, 200, MTS_GRPC_RESOURCE_EXHAUSTED, "request headers larger than %d bytes", H2_MAX_HEADER_BYTES);
        return;
    }
    if (!s->post) {
        respond(conn, s, 405, MTS_GRPC_UNIMPLEMENTED, "gRPC calls are POST requests");
        return;
    }
    if (!s->ct_ok) {
        respond(conn, s, 415, MTS_GRPC_INTERNAL, "content-type must be application/grpc");
        return;
    }
    s->method = mts__grpc_find_method(s->path, s->path_len);
    if (!s->method) {
        respond(conn, s, 200, MTS_GRPC_UNIMPLEMENTED, "method %.*s is not implemented by mtserve", (int)s->path_len,
                s->path);
        return;
    }
    if (s->method->streaming) make_call(conn, s);
}

/* The client has sent all it will on the stream. */
static void remote_done(h2_conn *conn, h2_stream *s)
{
    s->remote_done = true;
    if (s->responded || !s->method) return;
    if (s->method->streaming) {
        if (s->pfx_have) respond(conn, s, 200, MTS_GRPC_INTERNAL, "the stream ended inside a request message");
        else try_deliver(conn, s);
    } else if (!s->call) {
        respond(conn, s, 200, s->pfx_have ? MTS_GRPC_INTERNAL : MTS_GRPC_INVALID_ARGUMENT, "%s",
                s->pfx_have ? "the request message was cut short" : "the call carried no request message");
    }
}

static int on_frame(nghttp2_session *sess, const nghttp2_frame *frame, void *user)
{
    h2_conn *conn = user;
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
    h2_stream *s = nghttp2_session_get_stream_user_data(sess, frame->hd.stream_id);
    if (!s) return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) headers_done(conn, s);
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) remote_done(conn, s);
    return 0;
}

/* A stream is gone (answered and ended, or reset): its call, if not answered, was cancelled. */
static void stream_free(h2_conn *conn, h2_stream *s)
{
    if (s->prev) s->prev->next = s->next;
    else conn->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    mts__grpc_call *c = s->call;
    if (c) {
        c->h2s = NULL;
        if (!s->responded) {
            if (s->watching) mts__grpc_native_closed(c, false);
            else atomic_store(&c->cancelled, true);
        }
        mts__grpc_call_unref(c);
    }
    for (out_msg *o = s->out_head, *n; o; o = n) {
        n = o->next;
        out_free(o);
    }
    for (in_msg *m = s->in_head, *n; m; m = n) {
        n = m->next;
        grpc_slice_unref(m->s);
        free(m);
    }
    mts_iobuf_free(s->buf);
    md_free(&s->md);
    free(s->msg);
    free(s);
}

static int on_stream_close(nghttp2_session *sess, int32_t id, uint32_t error_code, void *user)
{
    (void)error_code;
    h2_stream *s = nghttp2_session_get_stream_user_data(sess, id);
    if (s) stream_free(user, s);
    return 0;
}

/* A status answered before the client finished sending is followed by RST_STREAM(NO_ERROR),
 * which tells the client to stop (sent only after the status: a client that reads the reset
 * first reports it instead of the status). */
static int on_frame_sent(nghttp2_session *sess, const nghttp2_frame *frame, void *user)
{
    (void)user;
    if (frame->hd.type != NGHTTP2_HEADERS || !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) return 0;
    h2_stream *s = nghttp2_session_get_stream_user_data(sess, frame->hd.stream_id);
    if (s && s->rst_after && !s->remote_done) {
        s->rst_after = false;
        nghttp2_submit_rst_stream(sess, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_NO_ERROR);
    }
    return 0;
}

static ssize_t on_send(nghttp2_session *sess, const uint8_t *data, size_t len, int flags, void *user)
{
    (void)sess;
    (void)flags;
    h2_conn *conn = user;
    if (conn->wlen >= H2_WBUF_MAX) return NGHTTP2_ERR_WOULDBLOCK;
    size_t k = len < H2_WBUF_MAX - conn->wlen ? len : H2_WBUF_MAX - conn->wlen;
    memcpy(conn->wbuf + conn->wlen, data, k);
    conn->wlen += k;
    return (ssize_t)k;
}

/* ---- the framework's operations, carried out ---- */

static bool finished(mts__grpc_call *c)
{
    pthread_mutex_lock(&c->lock);
    bool f = c->finished;
    pthread_mutex_unlock(&c->lock);
    return f;
}

static void run_op(h2_conn *conn, h2_op *op)
{
    mts__grpc_call *c = op->c;
    h2_stream *s = conn->open ? c->h2s : NULL;
    switch (op->kind) {
    case OP_FINISH:
        if (!s || s->responded) break;
        if (op->bb) queue_out(conn, s, op->bb);
        op->bb = NULL;
        s->responded = true;
        s->finish_pending = true;
        s->code = op->code;
        free(s->msg);
        s->msg = op->msg;
        op->msg = NULL;
        start_output(conn, s);
        break;
    case OP_SEND:
        if (!s || s->responded) break;
        queue_out(conn, s, op->bb);
        op->bb = NULL;
        start_output(conn, s);
        break;
    case OP_READ:
        if (!s) {
            if (!finished(c)) mts__grpc_native_message(c, NULL); /* the call is cancelled: it fails */
            break;
        }
        s->want_read = true;
        try_deliver(conn, s);
        break;
    case OP_WATCH:
        if (s) s->watching = true;
        else if (!finished(c)) mts__grpc_native_closed(c, false);
        break;
    }
    if (op->bb) grpc_byte_buffer_destroy(op->bb);
    free(op->msg);
    mts__grpc_call_unref(c);
    free(op);
}

static void run_ops(h2_conn *conn)
{
    pthread_mutex_lock(&conn->lock);
    h2_op *ops = conn->in_head;
    conn->in_head = conn->in_tail = NULL;
    pthread_mutex_unlock(&conn->lock);
    while (ops) {
        h2_op *next = ops->next;
        run_op(conn, ops);
        ops = next;
    }
}

/* Answers every stream whose deadline passed; the time until the next one, ms (-1: none). */
static int check_deadlines(h2_conn *conn)
{
    int64_t now = mono_ns(), next = -1;
    for (h2_stream *s = conn->streams; s; s = s->next) {
        if (!s->deadline_ns || s->responded) continue;
        if (s->deadline_ns <= now) {
            respond(conn, s, 200, MTS_GRPC_DEADLINE_EXCEEDED, "deadline exceeded");
        } else if (next < 0 || s->deadline_ns - now < next) {
            next = s->deadline_ns - now;
        }
    }
    return next < 0 ? -1 : (int)(next / 1000000 + 1);
}

/* ---- the connection's thread ---- */

static void close_socket(h2_conn *conn)
{
    if (!conn->open) return;
    conn->open = false;
    while (conn->streams) stream_free(conn, conn->streams);
    shutdown(conn->fd, SHUT_RDWR);
    close(conn->fd);
    conn->fd = -1;
}

/* Writes what is gathered; false when the socket would block (or failed: then it is closed). */
static bool flush(h2_conn *conn)
{
    while (conn->woff < conn->wlen) {
        ssize_t n = send(conn->fd, conn->wbuf + conn->woff, conn->wlen - conn->woff, MSG_NOSIGNAL);
        if (n > 0) {
            conn->woff += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return false;
        } else {
            close_socket(conn);
            return false;
        }
    }
    conn->wlen = conn->woff = 0;
    return true;
}

static void pump(h2_conn *conn)
{
    while (conn->open && flush(conn) && nghttp2_session_want_write(conn->sess)) {
        int rv = nghttp2_session_send(conn->sess);
        if (rv) {
            mts_log(MTS_LOG_DEBUG, "event=grpc_native_error what=send %s", nghttp2_strerror(rv));
            close_socket(conn);
            return;
        }
        if (!conn->wlen) break;
    }
}

static void read_socket(h2_conn *conn)
{
    for (int i = 0; i < H2_READS_PER_TURN && conn->open; i++) {
        ssize_t n = recv(conn->fd, conn->rbuf, H2_RBUF, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {
            close_socket(conn);
            return;
        }
        ssize_t rv = nghttp2_session_mem_recv(conn->sess, conn->rbuf, (size_t)n);
        if (rv < 0) {
            mts_log(MTS_LOG_DEBUG, "event=grpc_native_error what=recv %s", nghttp2_strerror((int)rv));
            pump(conn); /* the GOAWAY nghttp2 queued for the protocol error */
            close_socket(conn);
            return;
        }
        if ((size_t)n < H2_RBUF) return;
    }
}

static void conn_free(h2_conn *conn)
{
    for (h2_op *op = conn->in_head, *n; op; op = n) { /* (none: the loop ran them all) */
        n = op->next;
        if (op->bb) grpc_byte_buffer_destroy(op->bb);
        free(op->msg);
        free(op);
    }
    nghttp2_session_del(conn->sess);
    close(conn->efd);
    pthread_mutex_destroy(&conn->lock);
    free(conn->rbuf);
    free(conn->wbuf);
    free(conn);
}

static void *conn_main(void *arg)
{
    h2_conn *conn = arg;
    mts__h2 *h = conn->h;
    this_conn = conn;
    for (;;) {
        run_ops(conn);
        pthread_mutex_lock(&conn->lock);
        bool goaway = conn->goaway, kill = conn->kill;
        pthread_mutex_unlock(&conn->lock);
        if (kill) close_socket(conn);
        int timeout = -1;
        if (conn->open) {
            if (goaway && !conn->goaway_sent) {
                conn->goaway_sent = true;
                nghttp2_submit_goaway(conn->sess, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(conn->sess),
                                      NGHTTP2_NO_ERROR, NULL, 0);
            }
            timeout = check_deadlines(conn);
            pump(conn);
            if (conn->open && !nghttp2_session_want_read(conn->sess) && !nghttp2_session_want_write(conn->sess) &&
                conn->woff == conn->wlen)
                close_socket(conn);
        }
        pthread_mutex_lock(&conn->lock);
        bool pending = conn->in_head != NULL; /* posted by this thread since run_ops: no wake-up came */
        pthread_mutex_unlock(&conn->lock);
        if (pending) continue;
        if (!conn->open && atomic_load(&conn->refs) == 1) break;
        struct pollfd pf[2] = {{conn->efd, POLLIN, 0}, {conn->fd, 0, 0}};
        int nfds = 1;
        if (conn->open) {
            pf[1].events = (short)(POLLIN | (conn->woff < conn->wlen ? POLLOUT : 0));
            nfds = 2;
        }
        int r = poll(pf, (nfds_t)nfds, timeout);
        if (r < 0 && errno != EINTR) break;
        if (r <= 0) continue;
        if (pf[0].revents) {
            uint64_t v;
            ssize_t k = read(conn->efd, &v, sizeof v);
            (void)k;
        }
        if (nfds == 2 && (pf[1].revents & (POLLIN | POLLHUP | POLLERR))) read_socket(conn);
        if (nfds == 2 && conn->open && (pf[1].revents & POLLOUT)) pump(conn);
    }
    close_socket(conn);
    pthread_mutex_lock(&h->lock);
    if (conn->lprev) conn->lprev->lnext = conn->lnext;
    else h->conns = conn->lnext;
    if (conn->lnext) conn->lnext->lprev = conn->lprev;
    h->n_conns--;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->lock);
    conn_free(conn);
    return NULL;
}

static nghttp2_session_callbacks *callbacks(void)
{
    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb)) return NULL;
    nghttp2_session_callbacks_set_send_callback(cb, on_send);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_sent);
    return cb;
}

/* A connection for the accepted socket fd; NULL (fd closed) when out of memory. */
static h2_conn *conn_new(mts__h2 *h, int fd)
{
    h2_conn *conn = calloc(1, sizeof *conn);
    nghttp2_session_callbacks *cb = callbacks();
    if (conn) {
        conn->rbuf = malloc(H2_RBUF);
        conn->wbuf = malloc(H2_WBUF_MAX);
        conn->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    }
    nghttp2_option *opt = NULL;
    if (nghttp2_option_new(&opt)) opt = NULL;
    if (opt) nghttp2_option_set_no_auto_window_update(opt, 1);
    if (!conn || !cb || !opt || !conn->rbuf || !conn->wbuf || conn->efd < 0 ||
        nghttp2_session_server_new2(&conn->sess, cb, conn, opt)) {
        if (cb) nghttp2_session_callbacks_del(cb);
        nghttp2_option_del(opt);
        if (conn) {
            if (conn->efd >= 0) close(conn->efd);
            free(conn->rbuf);
            free(conn->wbuf);
            free(conn);
        }
        close(fd);
        return NULL;
    }
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);
    conn->h = h;
    conn->fd = fd;
    conn->open = true;
    atomic_init(&conn->refs, 1);
    pthread_mutex_init(&conn->lock, NULL);
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, H2_MAX_STREAMS},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, H2_FIRST_WINDOW},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, H2_MAX_HEADER_BYTES},
    };
    nghttp2_submit_settings(conn->sess, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]);
    nghttp2_session_set_local_window_size(conn->sess, NGHTTP2_FLAG_NONE, 0, H2_CONN_WINDOW);
    return conn;
}

static void accept_one(mts__h2 *h)
{
    int fd = accept4(h->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS)
            nanosleep(&(struct timespec){0, 10000000}, NULL); /* out of descriptors: not a busy loop */
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_mutex_lock(&h->lock);
    bool full = h->n_conns >= H2_MAX_CONNS || h->stopping;
    pthread_mutex_unlock(&h->lock);
    if (full) {
        MTS_WARN("event=grpc_refused why=\"%d connections open\"", H2_MAX_CONNS);
        close(fd);
        return;
    }
    h2_conn *conn = conn_new(h, fd);
    if (!conn) return;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, H2_STACK);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&h->lock);
    conn->lnext = h->conns;
    if (h->conns) h->conns->lprev = conn;
    h->conns = conn;
    h->n_conns++;
    pthread_t t;
    int rc = pthread_create(&t, &attr, conn_main, conn);
    if (rc) {
        h->conns = conn->lnext;
        if (h->conns) h->conns->lprev = NULL;
        h->n_conns--;
    }
    pthread_mutex_unlock(&h->lock);
    pthread_attr_destroy(&attr);
    if (rc) {
        MTS_WARN("event=grpc_refused why=\"no thread for the connection\"");
        close(conn->fd);
        conn_free(conn);
        return;
    }
    pthread_setname_np(t, "mts-grpc-conn");
}

static void *accept_main(void *arg)
{
    mts__h2 *h = arg;
    for (;;) {
        struct pollfd pf[2] = {{h->efd, POLLIN, 0}, {h->lfd, POLLIN, 0}};
        int r = poll(pf, 2, -1);
        if (r < 0 && errno != EINTR) break;
        if (r <= 0) continue;
        if (pf[0].revents) break;
        if (pf[1].revents & POLLIN)
            for (int i = 0; i < 64; i++) {
                accept_one(h);
                struct pollfd again = {h->lfd, POLLIN, 0};
                if (poll(&again, 1, 0) <= 0) break;
            }
    }
    return NULL;
}

static int listen_on(const char *host, int port, int *bound, mts_err *err)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    if (getaddrinfo(host, ps, &hints, &ai) || !ai) {
        mts_err_set(err, MTS_EIO, "cannot listen on %s:%d (unknown address)", host, port);
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1024)) {
        int e = errno;
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        mts_err_set(err, MTS_EIO, "cannot listen on %s:%d: %s", host, port, strerror(e));
        return -1;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *bound = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                      : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

int mts__h2_start(mts_grpc *g, mts_server *srv, const char *host, int port, size_t max_message, bool realtime,
                  int *bound, mts__h2 **out, mts_err *err)
{
    mts__h2 *h = calloc(1, sizeof *h);
    if (!h) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    h->g = g;
    h->srv = srv;
    h->max_msg = max_message;
    h->realtime = realtime;
    int fd = listen_on(host, port, bound, err);
    if (fd < 0) {
        free(h);
        return err->code;
    }
    h->lfd = fd;
    h->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&h->lock, NULL);
    pthread_cond_init(&h->cv, NULL);
    if (h->efd < 0 || pthread_create(&h->accepter, NULL, accept_main, h)) {
        if (h->efd >= 0) close(h->efd);
        close(fd);
        pthread_mutex_destroy(&h->lock);
        pthread_cond_destroy(&h->cv);
        free(h);
        return mts_err_set(err, MTS_EIO, "cannot start the gRPC accepting thread");
    }
    h->accepter_started = true;
    pthread_setname_np(h->accepter, "mts-grpc-accept");
    *out = h;
    return MTS_OK;
}

/* Asks every connection's thread to send GOAWAY (goaway) or to close its socket (kill). */
static void tell_all(mts__h2 *h, bool kill)
{
    pthread_mutex_lock(&h->lock);
    for (h2_conn *c = h->conns; c; c = c->lnext) {
        pthread_mutex_lock(&c->lock);
        if (kill) c->kill = true;
        else c->goaway = true;
        pthread_mutex_unlock(&c->lock);
        wake(c->efd);
    }
    pthread_mutex_unlock(&h->lock);
}

void mts__h2_stop_accepting(mts__h2 *h)
{
    pthread_mutex_lock(&h->lock);
    bool first = !h->stopping;
    h->stopping = true;
    pthread_mutex_unlock(&h->lock);
    if (!first) return;
    wake(h->efd);
    pthread_join(h->accepter, NULL);
    h->accepter_started = false;
    close(h->lfd);
    h->lfd = -1;
    tell_all(h, false);
}

void mts__h2_stop(mts__h2 *h)
{
    mts__h2_stop_accepting(h);
    tell_all(h, true);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&h->lock);
    while (h->n_conns > 0)
        if (pthread_cond_timedwait(&h->cv, &h->lock, &ts)) break;
    int left = h->n_conns;
    pthread_mutex_unlock(&h->lock);
    if (left) { /* their calls are still held by handlers: kept, not freed under them */
        MTS_WARN("grpc: %d connections still waiting for their calls after 10 s; stopping anyway", left);
        return;
    }
    close(h->efd);
    pthread_mutex_destroy(&h->lock);
    pthread_cond_destroy(&h->cv);
    free(h);
}
