/*
 * The gRPC front end's transport layer on gRPC core (Debian's libgrpc, C API): listening,
 * completion-queue threads, the call object and its reference counting, message and status
 * sending, deadlines, cancellation, and method dispatch to the service files
 * (grpc_kserve.c, grpc_lipsync.c, grpc_reflection.c). gRPC core does HTTP/2, flow control,
 * keepalive and message-size limits; this file only sequences batches on calls.
 *
 * Threads: `threads` pollers run grpc_completion_queue_next and the handlers (which never
 * block); workers and loaders of the server core finish calls from their own threads through
 * the same functions (grpc_call_start_batch is thread-safe; per-call state is under c->lock).
 */
#include "api/grpc_internal.h"
#include "util/clock.h"
#include "util/iobuf.h"
#include "util/workq.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "util/log.h"

#define MTS_GRPC_SLOTS 32       /* pending requests for calls of streaming or unknown methods */
#define MTS_GRPC_UNARY_SLOTS 8  /* pending requests per unary method */
#define MTS_GRPC_MAX_THREADS 16

/* A pending request for a new call: when it fires, its call becomes an mts__grpc_call and the
 * slot asks for the next one. A slot of a unary method (`method` set) asks gRPC core for calls
 * of that registered method with their request message read already (one completion per call
 * instead of two: the call, then its message); the others ask for any call and read messages
 * themselves. */
typedef struct request_slot {
    mts__grpc_tag tag;
    mts_grpc *g;
    const struct mts__grpc_method *method; /* registered unary method, or NULL */
    void *registered;                      /* its grpc_server_register_method handle */
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    gpr_timespec deadline;                 /* registered calls: the call's deadline */
    grpc_byte_buffer *payload;             /* registered calls: the request message */
} request_slot;

struct mts_grpc {
    mts_server *srv;
    const mts_auth *auth; /* bearer tokens; NULL: every method open */
    grpc_server *server;
    grpc_completion_queue *cq;
    int port;
    int n_threads;
    pthread_t threads[MTS_GRPC_MAX_THREADS];
    request_slot *slots;
    size_t n_slots;
    mts__grpc_tag t_shutdown;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    bool shutdown_started, shutdown_done;
    _Atomic int live_calls;
    mts_workq *replies; /* builds large replies off the device workers (NULL: inline) */
    mts__h2 *native;    /* the native transport, when it serves the port (then no server, cq, slots) */
    struct watcher *watchers; /* health Watch streams (under lock) */
};

typedef struct watcher {
    mts__grpc_call *c;
    void (*on_shutdown)(mts__grpc_call *c);
    struct watcher *next;
} watcher;

bool mts__grpc_watch_add(mts__grpc_call *c, void (*on_shutdown)(mts__grpc_call *c))
{
    mts_grpc *g = c->g;
    watcher *w = malloc(sizeof *w);
    if (!w) return false;
    pthread_mutex_lock(&g->lock);
    bool ok = !g->shutdown_started;
    if (ok) {
        mts__grpc_call_ref(c);
        *w = (watcher){c, on_shutdown, g->watchers};
        g->watchers = w;
    }
    pthread_mutex_unlock(&g->lock);
    if (!ok) free(w);
    return ok;
}

void mts__grpc_watch_remove(mts__grpc_call *c)
{
    mts_grpc *g = c->g;
    watcher *found = NULL;
    pthread_mutex_lock(&g->lock);
    for (watcher **p = &g->watchers; *p; p = &(*p)->next)
        if ((*p)->c == c) {
            found = *p;
            *p = found->next;
            break;
        }
    pthread_mutex_unlock(&g->lock);
    if (found) {
        mts__grpc_call_unref(c);
        free(found);
    }
}

/* ---- arena ---- */

void *mts__grpc_alloc(mts__grpc_arena *a, size_t n)
{
    void **b = calloc(1, sizeof(void *) * 2 + n);
    MTS_ASSERT(b != NULL);
    b[0] = a->blocks;
    a->blocks = b;
    return b + 2;
}

void *mts__grpc_dup(mts__grpc_arena *a, const void *p, size_t n)
{
    void *d = mts__grpc_alloc(a, n);
    memcpy(d, p, n);
    return d;
}

char *mts__grpc_strdup(mts__grpc_arena *a, const char *s)
{
    size_t n = strlen(s ? s : "");
    char *d = mts__grpc_alloc(a, n + 1);
    memcpy(d, s ? s : "", n);
    return d;
}

void mts__grpc_arena_free(mts__grpc_arena *a)
{
    for (void **b = a->blocks, **n; b; b = n) {
        n = b[0];
        free(b);
    }
    a->blocks = NULL;
}

/* ---- protobuf fields on the wire ---- */

bool mts__pb_next(const uint8_t **p, const uint8_t *end, mts__pb_field *f)
{
    uint64_t key = 0, v;
    int shift = 0;
    if (*p >= end) return false;
    do {
        if (*p >= end || shift > 63) return false;
        key |= (uint64_t)(**p & 0x7f) << shift;
        shift += 7;
    } while (*(*p)++ & 0x80);
    if ((key >> 3) == 0 || (key >> 3) > 0x1fffffff) return false; /* field numbers are 1..2^29-1 */
    f->number = (uint32_t)(key >> 3);
    f->wire = (int)(key & 7);
    switch (f->wire) {
    case 0:
    case 2:
        v = 0;
        shift = 0;
        do {
            if (*p >= end || shift > 63) return false;
            v |= (uint64_t)(**p & 0x7f) << shift;
            shift += 7;
        } while (*(*p)++ & 0x80);
        f->varint = v;
        if (f->wire == 2) {
            if (v > (uint64_t)(end - *p)) return false;
            f->data = *p;
            f->len = (size_t)v;
            *p += v;
        }
        return true;
    case 1: if (end - *p < 8) return false; *p += 8; return true;
    case 5: if (end - *p < 4) return false; *p += 4; return true;
    default: return false;
    }
}

/* ---- unpacking without copying the large byte fields ---- */

/* The byte field `number` of desc when it is one (NULL otherwise). */
static const ProtobufCFieldDescriptor *bytes_field(const ProtobufCMessageDescriptor *desc, unsigned number)
{
    const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(desc, number);
    return fd && fd->type == PROTOBUF_C_TYPE_BYTES ? fd : NULL;
}

/* The scan's view of the listed fields: which it uses, and where a singular one last occurs. */
typedef struct borrow_scan {
    const ProtobufCMessageDescriptor *desc;
    unsigned use[8];
    const uint8_t *last[8]; /* singular fields: the start of the last occurrence (the one protobuf keeps) */
    int n_use;
    size_t align;
} borrow_scan;

static int used(const borrow_scan *b, uint32_t number)
{
    for (int i = 0; i < b->n_use; i++)
        if (b->use[i] == number) return i;
    return -1;
}

/* Whether the occurrence at `start` is read in place: a listed field (a singular one's last
 * occurrence) whose bytes can start `align`-aligned by moving back over their own tag and
 * length (read already). */
static bool take(const borrow_scan *b, const uint8_t *start, const mts__pb_field *f)
{
    int u = used(b, f->number);
    if (u < 0 || f->wire != 2) return false;
    if (bytes_field(b->desc, f->number)->label != PROTOBUF_C_LABEL_REPEATED && start != b->last[u]) return false;
    return (uintptr_t)f->data % b->align <= (size_t)(f->data - start);
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

ProtobufCMessage *mts__pb_unpack_borrowing(const ProtobufCMessageDescriptor *desc, uint8_t *data, size_t len,
                                           const unsigned *fields, int n_fields, size_t align, bool *borrowed)
{
    *borrowed = false;
    borrow_scan b = {.desc = desc, .align = align ? align : 1};
    for (int i = 0; i < n_fields && b.n_use < 8; i++)
        if (bytes_field(desc, fields[i])) b.use[b.n_use++] = fields[i];
    /* pass 1: the scan accepts the whole message; where each singular field last occurs */
    const uint8_t *p = data, *e = data + len;
    mts__pb_field f;
    while (p < e) {
        const uint8_t *start = p;
        if (!mts__pb_next(&p, e, &f)) return protobuf_c_message_unpack(desc, NULL, len, data); /* it decides */
        int u = used(&b, f.number);
        if (u >= 0 && f.wire == 2) b.last[u] = start;
    }
    /* pass 2: the size of what protobuf-c is given */
    size_t rest_len = 0, n_borrow = 0;
    for (p = data; p < e;) {
        const uint8_t *start = p;
        mts__pb_next(&p, e, &f);
        if (take(&b, start, &f)) {
            n_borrow++;
            /* a repeated field keeps its place in the array as an empty entry */
            if (bytes_field(desc, f.number)->label == PROTOBUF_C_LABEL_REPEATED)
                rest_len += varint_size((uint64_t)f.number << 3 | 2) + 1;
        } else {
            rest_len += (size_t)(p - start);
        }
    }
    if (!n_borrow) return protobuf_c_message_unpack(desc, NULL, len, data);
    /* pass 3: the message without the borrowed bytes */
    uint8_t *rest = malloc(rest_len ? rest_len : 1), *q = rest;
    if (!rest) return NULL;
    for (p = data; p < e;) {
        const uint8_t *start = p;
        mts__pb_next(&p, e, &f);
        if (!take(&b, start, &f)) {
            memcpy(q, start, (size_t)(p - start));
            q += p - start;
        } else if (bytes_field(desc, f.number)->label == PROTOBUF_C_LABEL_REPEATED) {
            for (uint64_t tag = (uint64_t)f.number << 3 | 2;; tag >>= 7) {
                *q++ = (uint8_t)((tag & 0x7f) | (tag >= 0x80 ? 0x80 : 0));
                if (tag < 0x80) break;
            }
            *q++ = 0;
        }
    }
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, rest_len, rest);
    free(rest);
    if (!m) return NULL;
    /* pass 4: point the fields at their bytes, moved to alignment */
    size_t next[8] = {0};
    for (p = data; p < e;) {
        const uint8_t *start = p;
        mts__pb_next(&p, e, &f);
        int u = used(&b, f.number);
        if (u < 0 || f.wire != 2) continue;
        const ProtobufCFieldDescriptor *fd = bytes_field(desc, f.number);
        bool repeated = fd->label == PROTOBUF_C_LABEL_REPEATED;
        size_t index = repeated ? next[u]++ : 0; /* every occurrence has its entry, copied or not */
        if (!take(&b, start, &f)) continue;
        size_t k = (uintptr_t)f.data % b.align;
        uint8_t *at = (uint8_t *)f.data - k;
        if (k) memmove(at, f.data, f.len); /* over this field's own tag and length only */
        ProtobufCBinaryData *bd = (ProtobufCBinaryData *)((char *)m + fd->offset);
        if (repeated) {
            if (index >= *(size_t *)((char *)m + fd->quantifier_offset)) continue; /* (cannot happen) */
            bd = *(ProtobufCBinaryData **)bd + index;
        } else {
            free(bd->data); /* protobuf-c's copy of an earlier occurrence, which this one replaces */
            if (fd->label == PROTOBUF_C_LABEL_OPTIONAL && fd->quantifier_offset)
                *(protobuf_c_boolean *)((char *)m + fd->quantifier_offset) = 1;
        }
        bd->data = f.len ? at : NULL;
        bd->len = f.len;
    }
    *borrowed = true;
    return m;
}

/* Calls fn on every listed byte field of m whose bytes lie in [lo, hi). */
static int each_borrowed(ProtobufCMessage *m, const unsigned *fields, int n_fields, const uint8_t *lo,
                         const uint8_t *hi, int (*fn)(ProtobufCBinaryData *))
{
    for (int i = 0; i < n_fields; i++) {
        const ProtobufCFieldDescriptor *fd = bytes_field(m->descriptor, fields[i]);
        if (!fd) continue;
        ProtobufCBinaryData *b = (ProtobufCBinaryData *)((char *)m + fd->offset);
        size_t count = 1;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            count = *(size_t *)((char *)m + fd->quantifier_offset);
            b = *(ProtobufCBinaryData **)b;
        }
        for (size_t j = 0; j < count; j++)
            if (b[j].data && b[j].data >= lo && b[j].data < hi && fn(&b[j])) return -1;
    }
    return 0;
}

static int detach(ProtobufCBinaryData *b)
{
    *b = (ProtobufCBinaryData){0, NULL};
    return 0;
}

static int own(ProtobufCBinaryData *b)
{
    uint8_t *copy = malloc(b->len);
    if (!copy) return -1;
    memcpy(copy, b->data, b->len);
    b->data = copy;
    return 0;
}

void mts__pb_unborrow(ProtobufCMessage *m, const unsigned *fields, int n_fields, const uint8_t *data, size_t len)
{
    if (m) each_borrowed(m, fields, n_fields, data, data + len, detach);
}

int mts__pb_own_borrowed(ProtobufCMessage *m, const unsigned *fields, int n_fields, const uint8_t *data, size_t len)
{
    return each_borrowed(m, fields, n_fields, data, data + len, own);
}

/* ---- call lifetime ---- */

void mts__grpc_call_ref(mts__grpc_call *c)
{
    atomic_fetch_add(&c->refs, 1);
}

void mts__grpc_call_unref(mts__grpc_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    for (mts__grpc_out *o = c->out_head, *n; o; o = n) {
        n = o->next;
        grpc_byte_buffer_destroy(o->buf);
        free(o);
    }
    if (c->recv_buf) grpc_byte_buffer_destroy(c->recv_buf);
    if (c->method && c->method->state_free && c->state) c->method->state_free(c->state);
    grpc_slice_unref(c->status_details);
    free(c->close_msg);
    grpc_call_details_destroy(&c->details);
    if (!c->call) /* the native transport's metadata: the slices are the call's */
        for (size_t i = 0; i < c->md.count; i++) {
            grpc_slice_unref(c->md.metadata[i].key);
            grpc_slice_unref(c->md.metadata[i].value);
        }
    grpc_metadata_array_destroy(&c->md);
    if (c->call) grpc_call_unref(c->call);
    else mts__h2_conn_unref(c->h2c);
    pthread_mutex_destroy(&c->lock);
    atomic_fetch_sub(&c->g->live_calls, 1);
    free(c);
}

/* Starts a batch holding a reference for it; on failure to start, the reference is returned. */
static bool start_batch(mts__grpc_call *c, const grpc_op *ops, size_t n, mts__grpc_tag *tag)
{
    mts__grpc_call_ref(c);
    mts__grpc_tag_handoff(tag);
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        MTS_WARN("grpc: start_batch failed (%d) on %.*s", (int)e, (int)GRPC_SLICE_LENGTH(c->details.method),
                 (const char *)GRPC_SLICE_START_PTR(c->details.method));
        mts__grpc_call_unref(c);
        return false;
    }
    return true;
}

static grpc_byte_buffer *pack(const ProtobufCMessage *msg)
{
    size_t n = msg ? protobuf_c_message_get_packed_size(msg) : 0;
    grpc_slice s = grpc_slice_malloc(n);
    if (n) protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

static void on_status_sent(mts__grpc_tag *t, bool ok)
{
    mts__grpc_call *c = t->call;
    if (c->t_reply_ms > 0 && mts_log_enabled(MTS_LOG_DEBUG)) {
        double now = mts_now_ms();
        mts_log(MTS_LOG_DEBUG, "event=grpc_sent method=%.*s ok=%d bytes=%zu handler_ms=%.2f send_ms=%.2f",
                (int)GRPC_SLICE_LENGTH(c->details.method), (const char *)GRPC_SLICE_START_PTR(c->details.method),
                (int)ok, c->reply_bytes, c->t_reply_ms - c->t_read_ms, now - c->t_reply_ms);
    }
    mts__grpc_call_unref(c);
}

static void on_close(mts__grpc_tag *t, bool ok);

/* Starts watching for the call's close (RECV_CLOSE_ON_SERVER), under c->lock. */
static void start_close_locked(mts__grpc_call *c)
{
    if (!c->call) {
        c->close_with_status = false;
        mts__h2_watch(c);
        return;
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled_flag;
    c->close_with_status = false;
    start_batch(c, &op, 1, &c->t_close);
}

void mts__grpc_watch_close(mts__grpc_call *c)
{
    pthread_mutex_lock(&c->lock);
    if (c->close_with_status && !c->finished) start_close_locked(c);
    pthread_mutex_unlock(&c->lock);
}

/* gRPC core's status batch: the close (when it rides with the status), initial metadata if not
 * sent yet, the reply (taken over) and the status. */
static void send_status_core(mts__grpc_call *c, grpc_byte_buffer *reply, int code, const char *msg)
{
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (c->close_with_status) { /* a unary call that did not watch for its close */
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n].data.recv_close_on_server.cancelled = &c->cancelled_flag;
        n++;
    }
    if (!c->sent_initial_md) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        n++;
        c->sent_initial_md = true;
    }
    if (reply) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = reply;
        n++;
    }
    grpc_slice_unref(c->status_details);
    c->status_details = grpc_slice_from_copied_string(msg ? msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n].data.send_status_from_server.status_details = code ? &c->status_details : NULL;
    n++;
    start_batch(c, ops, n, &c->t_status);
    /* gRPC core copies what it needs from SEND_MESSAGE when the batch starts. */
    if (reply) grpc_byte_buffer_destroy(reply);
}

/* Sends the final status (with the reply message for unary calls), under c->lock. Drops the
 * alive reference. Does nothing (but free the reply) if the call was already finished. */
static void finish_locked(mts__grpc_call *c, grpc_byte_buffer *reply, int code, const char *msg)
{
    if (c->finished) {
        if (reply) grpc_byte_buffer_destroy(reply);
        return;
    }
    c->finished = true;
    if (reply) {
        c->t_reply_ms = mts_now_ms();
        c->reply_bytes = grpc_byte_buffer_length(reply);
    }
    if (c->call) send_status_core(c, reply, code, msg);
    else mts__h2_finish(c, reply, code, msg); /* carried out on the connection's thread */
    if (code && code != MTS_GRPC_CANCELLED)
        mts_log(MTS_LOG_DEBUG, "grpc: %.*s -> %s: %s", (int)GRPC_SLICE_LENGTH(c->details.method),
                  (const char *)GRPC_SLICE_START_PTR(c->details.method), mts_proto_grpc_code_name(code), msg ? msg : "");
    mts__grpc_call_unref(c); /* the alive reference */
}

void mts__grpc_reply(mts__grpc_call *c, const ProtobufCMessage *msg)
{
    grpc_byte_buffer *bb = pack(msg);
    pthread_mutex_lock(&c->lock);
    finish_locked(c, bb, MTS_GRPC_OK, NULL);
    pthread_mutex_unlock(&c->lock);
}

/* The message the calling thread's on_message is handling. Per thread, not per call: a stream
 * handler starts the next read before it returns, so another poll thread may already be in
 * on_message for the same call with the next message. */
static _Thread_local grpc_slice handled_message;

grpc_slice mts__grpc_message_ref(mts__grpc_call *c)
{
    (void)c;
    return grpc_slice_ref(handled_message);
}

void mts__grpc_reply_buffer(mts__grpc_call *c, grpc_byte_buffer *bb)
{
    pthread_mutex_lock(&c->lock);
    finish_locked(c, bb, MTS_GRPC_OK, NULL);
    pthread_mutex_unlock(&c->lock);
}

void mts__grpc_fail(mts__grpc_call *c, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->lock);
    if (c->method && c->method->streaming) mts__grpc_close_locked(c, code, msg);
    else finish_locked(c, NULL, code, msg);
    pthread_mutex_unlock(&c->lock);
}

void mts__grpc_fail_status(mts__grpc_call *c, int status, const char *msg)
{
    mts__grpc_fail(c, mts_proto_grpc_code(status), "%s", msg && msg[0] ? msg : mts_status_text(status));
}

/* ---- streaming sends ---- */

static void on_sent(mts__grpc_tag *t, bool ok);

/* Starts the next queued send, or the pending status once the queue is empty. */
static void pump_locked(mts__grpc_call *c)
{
    if (c->send_in_flight || c->finished) return;
    if (!c->call) { /* the native transport keeps the order itself */
        for (mts__grpc_out *o = c->out_head, *n; o; o = n) {
            n = o->next;
            mts__h2_send(c, o->buf);
            free(o);
        }
        c->out_head = c->out_tail = NULL;
        if (c->close_pending) finish_locked(c, NULL, c->close_code, c->close_msg);
        return;
    }
    mts__grpc_out *o = c->out_head;
    if (o) {
        c->out_head = o->next;
        if (!c->out_head) c->out_tail = NULL;
        grpc_op ops[2];
        memset(ops, 0, sizeof ops);
        size_t n = 0;
        if (!c->sent_initial_md) {
            ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
            c->sent_initial_md = true;
        }
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = o->buf;
        n++;
        c->send_in_flight = start_batch(c, ops, n, &c->t_send);
        grpc_byte_buffer_destroy(o->buf);
        free(o);
        return;
    }
    if (c->close_pending) finish_locked(c, NULL, c->close_code, c->close_msg);
}

static void on_sent(mts__grpc_tag *t, bool ok)
{
    mts__grpc_call *c = t->call;
    pthread_mutex_lock(&c->lock);
    c->send_in_flight = false;
    if (!ok) { /* the stream is broken: drop what is queued */
        for (mts__grpc_out *o = c->out_head, *n; o; o = n) {
            n = o->next;
            grpc_byte_buffer_destroy(o->buf);
            free(o);
        }
        c->out_head = c->out_tail = NULL;
    }
    pump_locked(c);
    pthread_mutex_unlock(&c->lock);
    mts__grpc_call_unref(c);
}

void mts__grpc_send_locked(mts__grpc_call *c, const ProtobufCMessage *msg)
{
    if (c->finished || c->close_pending || atomic_load(&c->cancelled)) return;
    mts__grpc_out *o = malloc(sizeof *o);
    if (!o) return;
    o->buf = pack(msg);
    o->next = NULL;
    if (c->out_tail) c->out_tail->next = o;
    else c->out_head = o;
    c->out_tail = o;
    pump_locked(c);
}

void mts__grpc_send(mts__grpc_call *c, const ProtobufCMessage *msg)
{
    pthread_mutex_lock(&c->lock);
    mts__grpc_send_locked(c, msg);
    pthread_mutex_unlock(&c->lock);
}

void mts__grpc_close_locked(mts__grpc_call *c, int code, const char *msg)
{
    if (c->finished || c->close_pending) return;
    c->close_pending = true;
    c->close_code = code;
    c->close_msg = strdup(msg ? msg : "");
    pump_locked(c);
}

/* ---- reading ---- */

static void iobuf_release(void *p)
{
    mts_iobuf_free(p);
}

/* The message in one contiguous slice of the server's own, refcounted memory, which the call can
 * hold while parts of the request point into it (mts__grpc_message_ref): `first`, the message's
 * first slice already taken from r (taken over), then the rest of r. A large one (a lip-sync
 * request of 16 frames is 40 MB) goes into a block of the I/O buffer cache (util/iobuf.h), which
 * a later request of the same size class reuses instead of faulting in a fresh mapping, when the
 * cache may hold it. False when out of memory. */
static bool read_message(grpc_byte_buffer_reader *r, grpc_slice first, grpc_slice *out)
{
    size_t len = grpc_byte_buffer_length(r->buffer_out);
    uint8_t *buf = mts_iobuf_alloc(len ? len : 1);
    if (!buf) {
        grpc_slice_unref(first);
        return false;
    }
    size_t off = 0;
    grpc_slice s = first;
    do {
        size_t n = GRPC_SLICE_LENGTH(s);
        if (n > len - off) n = len - off; /* (the length above counts every slice) */
        memcpy(buf + off, GRPC_SLICE_START_PTR(s), n);
        off += n;
        grpc_slice_unref(s);
    } while (grpc_byte_buffer_reader_next(r, &s));
    *out = grpc_slice_new_with_user_data(buf, off, iobuf_release, buf);
    return true;
}

/* Whether the model named in a unary inference message's first slice (field m->model_field, when
 * the slice holds it whole) has a full queue: then msg says so and the call is refused before its
 * message is copied. A name the slice does not hold, or a model the server does not know, passes:
 * the handler answers those after parsing the whole message. */
static int refused_early(const mts__grpc_call *c, grpc_slice first, mts_err *err)
{
    const mts__grpc_method *m = c->method;
    if (!m->model_field) return MTS_OK;
    const uint8_t *p = GRPC_SLICE_START_PTR(first), *end = p + GRPC_SLICE_LENGTH(first);
    mts__pb_field f;
    while (mts__pb_next(&p, end, &f))
        if (f.number == m->model_field && f.wire == 2)
            return mts_server_admit(c->srv, (const char *)f.data, f.len, err);
    return MTS_OK;
}

/* Runs the method's handler on message s (its reference taken over). */
static void handle(mts__grpc_call *c, grpc_slice s)
{
    handled_message = s;
    c->method->on_message(c, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
    handled_message = grpc_empty_slice();
    grpc_slice_unref(s);
}

/* The client sent no more: a stream's half-close, or a unary call without its message. */
static void input_ended(mts__grpc_call *c)
{
    const mts__grpc_method *m = c->method;
    if (!m->streaming) mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "the call carried no request message");
    else if (m->on_half_close) m->on_half_close(c);
    else mts__grpc_fail(c, MTS_GRPC_OK, "%s", "");
}

/* Hands a call's next request message (bb, taken over; NULL: the client sent no more) to its
 * method's handler. ok false: the read failed (the call is gone). */
static void deliver(mts__grpc_call *c, bool ok, grpc_byte_buffer *bb)
{
    if (!ok || atomic_load(&c->cancelled)) {
        if (bb) grpc_byte_buffer_destroy(bb);
        mts__grpc_fail(c, MTS_GRPC_CANCELLED, "cancelled");
    } else if (!bb) {
        input_ended(c);
    } else {
        grpc_byte_buffer_reader r;
        if (!grpc_byte_buffer_reader_init(&r, bb)) {
            grpc_byte_buffer_destroy(bb);
            mts__grpc_fail(c, MTS_GRPC_INTERNAL, "cannot read the request message");
            return;
        }
        grpc_slice s = grpc_empty_slice(), first;
        mts_err err = {0};
        int rc = MTS_OK;
        bool got = true;
        if (grpc_byte_buffer_reader_next(&r, &first)) {
            if ((rc = refused_early(c, first, &err))) grpc_slice_unref(first);
            else got = read_message(&r, first, &s);
        }
        grpc_byte_buffer_reader_destroy(&r);
        grpc_byte_buffer_destroy(bb);
        if (rc) {
            mts__grpc_fail_status(c, rc, err.msg);
            return;
        }
        if (!got) {
            mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory reading the request message");
            return;
        }
        handle(c, s);
    }
}

static void on_read(mts__grpc_tag *t, bool ok)
{
    mts__grpc_call *c = t->call;
    pthread_mutex_lock(&c->lock);
    c->reading = false;
    grpc_byte_buffer *bb = c->recv_buf;
    c->recv_buf = NULL;
    c->t_read_ms = mts_now_ms();
    pthread_mutex_unlock(&c->lock);
    deliver(c, ok, bb);
    mts__grpc_call_unref(c); /* the read's reference */
}

void mts__grpc_read_locked(mts__grpc_call *c)
{
    if (c->reading || c->finished || atomic_load(&c->cancelled)) return;
    if (!c->call) {
        c->reading = true;
        mts__h2_read(c);
        return;
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    c->reading = start_batch(c, &op, 1, &c->t_recv);
}

void mts__grpc_read(mts__grpc_call *c)
{
    pthread_mutex_lock(&c->lock);
    mts__grpc_read_locked(c);
    pthread_mutex_unlock(&c->lock);
}

/* ---- deadlines, cancellation ---- */

int64_t mts__grpc_timeout_us(const mts__grpc_call *c)
{
    gpr_timespec d = c->details.deadline;
    if (gpr_time_cmp(d, gpr_inf_future(d.clock_type)) == 0) return 0;
    gpr_timespec left = gpr_time_sub(gpr_convert_clock_type(d, GPR_CLOCK_MONOTONIC), gpr_now(GPR_CLOCK_MONOTONIC));
    int64_t us = (int64_t)left.tv_sec * 1000000 + left.tv_nsec / 1000;
    return us == 0 ? -1 : us;
}

bool mts__grpc_shutting_down(const mts__grpc_call *c)
{
    mts_server_totals t;
    mts_server_totals_get(c->srv, &t);
    return t.shutting_down;
}

static void on_close(mts__grpc_tag *t, bool ok)
{
    mts__grpc_call *c = t->call;
    (void)ok;
    pthread_mutex_lock(&c->lock);
    c->closed = true;
    bool cancelled = c->cancelled_flag && !c->finished;
    pthread_mutex_unlock(&c->lock);
    if (c->cancelled_flag) {
        atomic_store(&c->cancelled, true);
        if (c->method && c->method->on_cancel) c->method->on_cancel(c);
        if (cancelled) mts__grpc_fail(c, MTS_GRPC_CANCELLED, "cancelled by the client");
    }
    mts__grpc_call_unref(c);
}

/* ---- dispatch ---- */

static const mts__grpc_method *const method_tables[] = {mts__grpc_kserve_methods, mts__grpc_lipsync_methods,
                                                        mts__grpc_health_methods, mts__grpc_reflection_methods};

const mts__grpc_method *mts__grpc_find_method(const char *path, size_t len)
{
    for (size_t k = 0; k < sizeof method_tables / sizeof method_tables[0]; k++)
        for (const mts__grpc_method *m = method_tables[k]; m->path; m++)
            if (strlen(m->path) == len && !memcmp(m->path, path, len)) return m;
    return NULL;
}

static const mts__grpc_method *find_method(grpc_slice path)
{
    return mts__grpc_find_method((const char *)GRPC_SLICE_START_PTR(path), GRPC_SLICE_LENGTH(path));
}

static void arm_slot(request_slot *s);
static bool call_checks(mts__grpc_call *c);
static mts__grpc_call *call_alloc(mts_grpc *g);

static void on_new_call(mts__grpc_tag *t, bool ok)
{
    request_slot *s = (request_slot *)t;
    mts_grpc *g = s->g;
    grpc_byte_buffer *payload = s->payload; /* a registered call's request message */
    s->payload = NULL;
    if (!ok) { /* server shutting down: this slot is spent */
        if (payload) grpc_byte_buffer_destroy(payload);
        grpc_call_details_destroy(&s->details);
        grpc_metadata_array_destroy(&s->md);
        return;
    }
    if (s->method) { /* gRPC core reports no details for a registered method's call */
        s->details.method = grpc_slice_from_static_string(s->method->path);
        s->details.deadline = s->deadline;
    }
    mts__grpc_call *c = call_alloc(g);
    if (!c) {
        if (payload) grpc_byte_buffer_destroy(payload);
        grpc_call_cancel_with_status(s->call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL);
        grpc_call_unref(s->call);
        grpc_call_details_destroy(&s->details);
        grpc_metadata_array_destroy(&s->md);
        arm_slot(s);
        return;
    }
    c->call = s->call;
    c->details = s->details;
    c->md = s->md;

    c->method = s->method ? s->method : find_method(c->details.method);
    bool registered = s->method != NULL;
    arm_slot(s); /* s is the next call's from here on */
    /* A unary call's close (RECV_CLOSE_ON_SERVER) completes when the call ends, or earlier when
     * the client cancels. Watched from the start, it is a completion of its own, one more
     * wake-up of a polling thread per call (a light request's whole cost is a few of them). A
     * unary call nobody acts on cancellation for (no on_cancel: gRPC core drops the reply of a
     * cancelled call itself), or whose handler says when to watch (lazy_close), has the close
     * ride in the status batch unless mts__grpc_watch_close asks for it first. */
    c->close_with_status = registered && (!c->method->on_cancel || c->method->lazy_close);
    if (!c->close_with_status) {
        pthread_mutex_lock(&c->lock);
        start_close_locked(c);
        pthread_mutex_unlock(&c->lock);
    }
    if (!call_checks(c)) {
        if (payload) grpc_byte_buffer_destroy(payload);
        return;
    }
    if (!registered) {
        mts__grpc_read(c);
        return;
    }
    mts__grpc_call_ref(c); /* the message's, as a read's */
    c->t_read_ms = mts_now_ms();
    deliver(c, true, payload);
    mts__grpc_call_unref(c);
}

/* A new call's checks: its method is known, its authorization covers the method's scope, its
 * deadline has not passed. False when the call was failed for one of them. */
static bool call_checks(mts__grpc_call *c)
{
    mts_grpc *g = c->g;
    if (!c->method) {
        mts__grpc_fail(c, MTS_GRPC_UNIMPLEMENTED, "method %.*s is not implemented by mtserve",
                       (int)GRPC_SLICE_LENGTH(c->details.method), (const char *)GRPC_SLICE_START_PTR(c->details.method));
        return false;
    }
    if (g->auth && c->method->scope != MTS_SCOPE_OPEN) {
        const char *v = NULL;
        size_t vlen = 0;
        for (size_t i = 0; i < c->md.count; i++) {
            grpc_slice k = c->md.metadata[i].key;
            if (GRPC_SLICE_LENGTH(k) == 13 && !memcmp(GRPC_SLICE_START_PTR(k), "authorization", 13)) {
                v = (const char *)GRPC_SLICE_START_PTR(c->md.metadata[i].value);
                vlen = GRPC_SLICE_LENGTH(c->md.metadata[i].value);
                break;
            }
        }
        mts_err e = {0};
        int rc = mts_auth_check(g->auth, v, vlen, c->method->scope, &e);
        if (rc) {
            mts__grpc_fail(c, mts_proto_grpc_code(rc), "%s", e.msg);
            return false;
        }
    }
    if (mts__grpc_timeout_us(c) < 0) {
        mts__grpc_fail(c, MTS_GRPC_DEADLINE_EXCEEDED, "the deadline passed before the call started");
        return false;
    }
    return true;
}

/* ---- the native transport's calls ---- */

/* A call object with its tags and counters set; one reference (alive). */
static mts__grpc_call *call_alloc(mts_grpc *g)
{
    mts__grpc_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->g = g;
    c->srv = g->srv;
    c->status_details = grpc_empty_slice();
    atomic_init(&c->refs, 1); /* alive */
    pthread_mutex_init(&c->lock, NULL);
    c->t_close = (mts__grpc_tag){on_close, c, 0};
    c->t_recv = (mts__grpc_tag){on_read, c, 0};
    c->t_send = (mts__grpc_tag){on_sent, c, 0};
    c->t_status = (mts__grpc_tag){on_status_sent, c, 0};
    atomic_fetch_add(&g->live_calls, 1);
    return c;
}

mts__grpc_call *mts__grpc_native_call(mts_grpc *g, const mts__grpc_method *m, const char *path, size_t path_len,
                                      grpc_metadata_array *md, gpr_timespec deadline)
{
    mts__grpc_call *c = call_alloc(g);
    if (!c) return NULL;
    grpc_call_details_init(&c->details);
    c->details.method = grpc_slice_from_copied_buffer(path, path_len);
    c->details.deadline = deadline;
    c->md = *md;
    grpc_metadata_array_init(md);
    c->method = m;
    /* as for gRPC core's calls: a unary call watches for the client going away only when its
     * handler acts on it, and a lazy_close one only once the handler asks */
    c->close_with_status = m && !m->streaming && (!m->on_cancel || m->lazy_close);
    return c;
}

bool mts__grpc_native_begin(mts__grpc_call *c)
{
    if (!c->close_with_status) {
        pthread_mutex_lock(&c->lock);
        start_close_locked(c);
        pthread_mutex_unlock(&c->lock);
    }
    if (!call_checks(c)) return false;
    if (c->method->streaming) mts__grpc_read(c);
    return true;
}

void mts__grpc_native_message(mts__grpc_call *c, grpc_slice *msg)
{
    mts__grpc_call_ref(c); /* held while the handler runs */
    pthread_mutex_lock(&c->lock);
    c->reading = false;
    c->t_read_ms = mts_now_ms();
    pthread_mutex_unlock(&c->lock);
    if (atomic_load(&c->cancelled)) {
        if (msg) grpc_slice_unref(*msg);
        mts__grpc_fail(c, MTS_GRPC_CANCELLED, "cancelled");
    } else if (msg) {
        handle(c, *msg);
    } else {
        input_ended(c);
    }
    mts__grpc_call_unref(c);
}

void mts__grpc_native_closed(mts__grpc_call *c, bool deadline)
{
    atomic_store(&c->cancelled, true);
    if (c->method && c->method->on_cancel) c->method->on_cancel(c);
    mts__grpc_fail(c, deadline ? MTS_GRPC_DEADLINE_EXCEEDED : MTS_GRPC_CANCELLED,
                   deadline ? "deadline exceeded" : "cancelled by the client");
}

static void arm_slot(request_slot *s)
{
    s->call = NULL;
    grpc_call_details_init(&s->details);
    grpc_metadata_array_init(&s->md);
    s->payload = NULL;
    mts__grpc_tag_handoff(&s->tag);
    grpc_call_error e =
        s->registered ? grpc_server_request_registered_call(s->g->server, s->registered, &s->call, &s->deadline, &s->md,
                                                            &s->payload, s->g->cq, s->g->cq, s)
                      : grpc_server_request_call(s->g->server, &s->call, &s->details, &s->md, s->g->cq, s->g->cq, s);
    if (e != GRPC_CALL_OK) {
        grpc_call_details_destroy(&s->details);
        grpc_metadata_array_destroy(&s->md);
    }
}

static void on_shutdown(mts__grpc_tag *t, bool ok)
{
    (void)ok;
    mts_grpc *g = (mts_grpc *)((char *)t - offsetof(mts_grpc, t_shutdown));
    pthread_mutex_lock(&g->lock);
    g->shutdown_done = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->lock);
}

static void *poll_main(void *arg)
{
    mts_grpc *g = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        mts__grpc_tag *t = ev.tag;
        (void)atomic_load_explicit(&t->handoffs, memory_order_acquire);
        t->fn(t, ev.success != 0);
    }
    return NULL;
}

/* ---- start / stop ---- */

/* A PEM file's text (NUL-terminated), or NULL when it cannot be read or holds no PEM block. */
static char *read_pem(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    if (!strstr(buf, "-----BEGIN ")) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Plaintext, or TLS from the PEM files of o (mutual when tls_client_ca is set); NULL with err set
 * when a file cannot be read or gRPC rejects the pair. */
static grpc_server_credentials *server_credentials(const mts_grpc_opts *o, mts_err *err)
{
    if (!o->tls_cert) return grpc_insecure_server_credentials_create();
    char *pem[3] = {0};
    const char *paths[3] = {o->tls_cert, o->tls_key, o->tls_client_ca}, *what[3] = {"certificate", "key", "client CA"};
    int bad = -1;
    for (int i = 0; i < 3 && bad < 0; i++)
        if (paths[i] && !(pem[i] = read_pem(paths[i]))) bad = i;
    grpc_server_credentials *creds = NULL;
    if (bad < 0) {
        grpc_ssl_pem_key_cert_pair pair = {pem[1], pem[0]};
        creds = grpc_ssl_server_credentials_create_ex(
            pem[2], &pair, 1,
            pem[2] ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
    }
    for (int i = 0; i < 3; i++) free(pem[i]);
    if (!creds && bad >= 0)
        mts_err_set(err, MTS_EIO, "TLS %s %s: cannot read it (or it is not PEM text)", what[bad], paths[bad]);
    else if (!creds)
        mts_err_set(err, MTS_EINVAL, "TLS: gRPC rejected the certificate/key pair");
    return creds;
}

/* Frees the front end's own state and drops its gRPC library reference (the last step of every
 * way out: a failed start, a stop). */
static void release(mts_grpc *g)
{
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cv);
    free(g->slots);
    free(g);
    grpc_shutdown();
}

/* Undoes a start that failed before the server started: no call exists yet. */
static void discard_unstarted(mts_grpc *g)
{
    grpc_server_destroy(g->server);
    grpc_completion_queue_shutdown(g->cq);
    while (grpc_completion_queue_next(g->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(g->cq);
    release(g);
}

/* The request slots: MTS_GRPC_SLOTS for any call, and MTS_GRPC_UNARY_SLOTS for each unary method,
 * registered with gRPC core (before the server starts) to have its request message read with the
 * call. False when out of memory. */
static bool register_methods(mts_grpc *g)
{
    size_t n_unary = 0;
    for (size_t k = 0; k < sizeof method_tables / sizeof method_tables[0]; k++)
        for (const mts__grpc_method *m = method_tables[k]; m->path; m++) n_unary += !m->streaming;
    g->n_slots = MTS_GRPC_SLOTS + n_unary * MTS_GRPC_UNARY_SLOTS;
    g->slots = calloc(g->n_slots, sizeof *g->slots);
    if (!g->slots) return false;
    size_t i = 0;
    for (; i < MTS_GRPC_SLOTS; i++) g->slots[i] = (request_slot){.tag.fn = on_new_call, .g = g};
    for (size_t k = 0; k < sizeof method_tables / sizeof method_tables[0]; k++)
        for (const mts__grpc_method *m = method_tables[k]; m->path; m++) {
            if (m->streaming) continue;
            void *rm = grpc_server_register_method(g->server, m->path, NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
            if (!rm) { /* (a path registered twice) its calls come through the general slots */
                MTS_WARN("grpc: cannot register method %s", m->path);
                continue;
            }
            for (int j = 0; j < MTS_GRPC_UNARY_SLOTS; j++)
                g->slots[i++] = (request_slot){.tag.fn = on_new_call, .g = g, .method = m, .registered = rm};
        }
    g->n_slots = i;
    return true;
}

/* gRPC core's own log lines go through mtserve's log (one format, one level setting); while a
 * port is being bound its errors are only debug lines: the failure is reported once, by us. */
static _Atomic int grpc_log_binding;

static void grpc_core_log(gpr_log_func_args *a)
{
    mts_log_level lvl = a->severity == GPR_LOG_SEVERITY_ERROR && !atomic_load(&grpc_log_binding) ? MTS_LOG_WARN
                                                                                              : MTS_LOG_DEBUG;
    mts_log(lvl, "event=grpc_core file=%s:%d %s", a->file ? a->file : "?", a->line, a->message ? a->message : "");
}

/* Whether the native transport serves the port: o->transport, else $MTS_GRPC_TRANSPORT, else
 * the default (native); TLS is gRPC core's. */
static int choose_native(const mts_grpc_opts *o, bool *native, mts_err *err)
{
    const char *t = o->transport && o->transport[0] ? o->transport : getenv("MTS_GRPC_TRANSPORT");
    if (!t || !t[0]) t = "native";
    if (strcmp(t, "native") && strcmp(t, "core"))
        return mts_err_set(err, MTS_EINVAL, "gRPC transport '%s': expected native or core", t);
    *native = !strcmp(t, "native") && !o->tls_cert;
    return MTS_OK;
}

/* Starts the native transport on the port (no gRPC core server). */
static int start_native(mts_grpc *g, const mts_grpc_opts *o, size_t max_msg, mts_err *err)
{
    mts_err qerr = {0}; /* before the first call can arrive */
    if (mts_workq_create(1, 0, "mts-grpc-reply", &g->replies, &qerr)) g->replies = NULL;
    int rc = mts__h2_start(g, g->srv, o->host ? o->host : "127.0.0.1", o->port, max_msg, o->light_realtime, &g->port,
                           &g->native, err);
    if (rc) {
        mts_workq_destroy(g->replies);
        return rc;
    }
    MTS_INFO("event=grpc_listening addr=%s:%d max_message=%zu transport=native tls=off",
             o->host ? o->host : "127.0.0.1", g->port, max_msg);
    return MTS_OK;
}

int mts_grpc_start(mts_server *srv, const mts_grpc_opts *o, mts_grpc **out, mts_err *err)
{
    bool native = false;
    int crc = choose_native(o, &native, err);
    if (crc) return crc;
    mts_grpc *g = calloc(1, sizeof *g);
    if (!g) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    grpc_init();
    g->srv = srv;
    g->auth = o->auth;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cv, NULL);
    size_t max_msg = o->max_message ? o->max_message : (size_t)50 << 20;
    if (max_msg > INT_MAX) max_msg = INT_MAX;
    if (native) {
        int rc = start_native(g, o, max_msg, err);
        if (rc) {
            release(g);
            return rc;
        }
        *out = g;
        return MTS_OK;
    }
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = (int)max_msg},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = -1},
        /* Keepalive: ping idle clients every 60 s (20 s to answer); accept client keepalive pings
         * as often as every 5 s, with or without calls in flight, without GOAWAY for strikes. */
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = 60000},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = 20000},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, .value.integer = 1},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
         .value.integer = 5000},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_HTTP2_MAX_PING_STRIKES, .value.integer = 0},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
    };
    grpc_channel_args ca = {sizeof args / sizeof args[0], args};
    g->server = grpc_server_create(&ca, NULL);
    g->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(g->server, g->cq, NULL);
    char addr[300];
    snprintf(addr, sizeof addr, "%s:%d", o->host ? o->host : "127.0.0.1", o->port);
    if (!register_methods(g)) {
        mts_err_set(err, MTS_ENOMEM, "out of memory");
        discard_unstarted(g);
        return MTS_ENOMEM;
    }
    grpc_server_credentials *creds = server_credentials(o, err);
    if (!creds) {
        discard_unstarted(g);
        return err->code;
    }
    gpr_set_log_function(grpc_core_log);
    atomic_store(&grpc_log_binding, 1);
    g->port = grpc_server_add_http2_port(g->server, addr, creds);
    atomic_store(&grpc_log_binding, 0);
    grpc_server_credentials_release(creds);
    if (g->port <= 0) {
        mts_err_set(err, MTS_EIO, "cannot listen on %s (address in use or not local)", addr);
        discard_unstarted(g);
        return MTS_EIO;
    }
    grpc_server_start(g->server);
    for (size_t i = 0; i < g->n_slots; i++) arm_slot(&g->slots[i]);
    g->t_shutdown.fn = on_shutdown;
    mts_err qerr = {0};
    if (mts_workq_create(1, 0, "mts-grpc-reply", &g->replies, &qerr))
        g->replies = NULL; /* replies are then built inline */
    g->n_threads = o->threads > 0 ? (o->threads > MTS_GRPC_MAX_THREADS ? MTS_GRPC_MAX_THREADS : o->threads) : 2;
    for (int i = 0; i < g->n_threads; i++)
        if (pthread_create(&g->threads[i], NULL, poll_main, g) == 0) pthread_setname_np(g->threads[i], "mts-grpc");
    MTS_INFO("event=grpc_listening addr=%s:%d max_message=%zu transport=core threads=%d tls=%s", o->host ? o->host : "127.0.0.1",
             g->port, max_msg, g->n_threads, o->tls_cert ? (o->tls_client_ca ? "mutual" : "on") : "off");
    *out = g;
    return MTS_OK;
}

int mts_grpc_port(const mts_grpc *g)
{
    return g->port;
}

void mts_grpc_stop_accepting(mts_grpc *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->lock);
    bool start = !g->shutdown_started;
    g->shutdown_started = true;
    watcher *ws = g->watchers; /* taken: no Watch registers after this */
    g->watchers = NULL;
    pthread_mutex_unlock(&g->lock);
    while (ws) { /* health watchers learn NOT_SERVING before the listener goes */
        watcher *next = ws->next;
        ws->on_shutdown(ws->c);
        mts__grpc_call_unref(ws->c);
        free(ws);
        ws = next;
    }
    if (g->native) {
        if (start) mts__h2_stop_accepting(g->native);
        return;
    }
    if (start) mts__grpc_tag_handoff(&g->t_shutdown);
    if (start) grpc_server_shutdown_and_notify(g->server, g->cq, &g->t_shutdown);
}

int mts__grpc_defer(mts__grpc_call *c, void (*fn)(void *), void *arg)
{
    return c->g->replies ? mts_workq_submit(c->g->replies, fn, arg) : MTS_EUNAVAILABLE;
}

void mts_grpc_stop(mts_grpc *g)
{
    if (!g) return;
    mts_grpc_stop_accepting(g);
    /* Replies still being built go out before calls are cancelled. */
    mts_workq_destroy(g->replies);
    g->replies = NULL;
    /* Answers already queued (health watchers' NOT_SERVING, calls the core failed at shutdown)
     * get up to a second to go out before whatever is still open is cancelled. */
    for (int i = 0; i < 100 && atomic_load(&g->live_calls) > 0; i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
    if (g->native) {
        mts__h2_stop(g->native);
        /* every stream is gone; what holds a call now is a handler finishing it */
        for (int i = 0; i < 1000 && atomic_load(&g->live_calls) > 0; i++)
            nanosleep(&(struct timespec){0, 10000000}, NULL);
        if (atomic_load(&g->live_calls) > 0) { /* kept, not freed under them */
            MTS_WARN("grpc: %d calls still open after 10 s; stopping anyway", atomic_load(&g->live_calls));
            return;
        }
        release(g);
        return;
    }
    grpc_server_cancel_all_calls(g->server);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&g->lock);
    while (!g->shutdown_done)
        if (pthread_cond_timedwait(&g->cv, &g->lock, &ts)) break;
    bool done = g->shutdown_done;
    pthread_mutex_unlock(&g->lock);
    if (!done) MTS_WARN("grpc: %d calls still open after 10 s; stopping anyway", atomic_load(&g->live_calls));
    grpc_server_destroy(g->server);
    grpc_completion_queue_shutdown(g->cq);
    for (int i = 0; i < g->n_threads; i++) pthread_join(g->threads[i], NULL);
    grpc_completion_queue_destroy(g->cq);
    release(g);
}
