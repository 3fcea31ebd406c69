/*
 * Internals shared by the gRPC front end's files: the call object and the small framework the
 * service files (grpc_kserve.c, grpc_lipsync.c, grpc_reflection.c) are written against.
 *
 * A call is reference counted; it is freed when the last reference goes. References are held
 * by: the handler until it has sent the final status (the "alive" reference), the
 * RECV_CLOSE_ON_SERVER batch, every other batch in flight, and every asynchronous operation a
 * handler starts on the call's behalf (a submitted request, a load) — handlers take those with
 * mts__grpc_call_ref before the operation and drop them in its completion.
 *
 *   new call --recv msg--> on_message (unary: exactly once)  --reply/fail--> status sent --> free
 *   streaming: on_message per message (after mts__grpc_read), on_half_close at end of input;
 *              stream_send queues responses (one SEND_MESSAGE in flight at a time, in order),
 *              stream_close sends the status once every queued response has gone.
 *   client cancel / deadline: on_cancel (if set) runs once, on a polling thread.
 */
#ifndef MTS_API_GRPC_INTERNAL_H
#define MTS_API_GRPC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "api/grpc_server.h"
#include "api/protocol.h"


typedef struct mts__grpc_call mts__grpc_call;

typedef struct mts__grpc_method {
    const char *path;      /* "/inference.GRPCInferenceService/ModelInfer" */
    bool streaming;        /* bidirectional stream */
    /* Unary: called once with the request message. Streaming: once per message read. */
    void (*on_message)(mts__grpc_call *c, const uint8_t *data, size_t len);
    void (*on_half_close)(mts__grpc_call *c); /* streaming: the client finished sending */
    void (*on_cancel)(mts__grpc_call *c);     /* optional: the client went away / deadline */
    void (*state_free)(void *state);          /* optional: frees c->state with the call */
    int scope;                                /* enum mts_scope (auth.h): 0 = infer */
    /* Unary with on_cancel: the handler calls mts__grpc_watch_close when its call may wait,
     * instead of every call watching for cancellation from its start (see grpc_server.c). */
    bool lazy_close;
    /* Unary inference: the request message's field that names the model (string), or 0. When the
     * first part of a message gRPC core hands over names a model whose queue is full, the call is
     * refused before the message is copied and parsed (as the HTTP front end refuses an upload
     * before reading it): under a flood of one model, most of its messages cost only the read. */
    unsigned model_field;
} mts__grpc_method;

/* One send queued on a stream. */
typedef struct mts__grpc_out {
    grpc_byte_buffer *buf;
    struct mts__grpc_out *next;
} mts__grpc_out;

typedef struct mts__grpc_tag {
    void (*fn)(struct mts__grpc_tag *t, bool ok);
    mts__grpc_call *call;
    /* Bumped (release) whenever the tag is handed to gRPC and read (acquire) by the poller that
     * gets it back: the completion queue orders the two, but inside Debian's gRPC build, which
     * ThreadSanitizer cannot see; this makes the hand-over visible to it (and costs nothing). */
    _Atomic unsigned handoffs;
} mts__grpc_tag;

static inline void mts__grpc_tag_handoff(mts__grpc_tag *t)
{
    atomic_fetch_add_explicit(&t->handoffs, 1, memory_order_release);
}

/* Runs fn(arg) on the gRPC reply thread instead of the calling (worker) thread. Returns 0, or
 * an error when there is no such thread (the caller then runs fn itself). */
int mts__grpc_defer(mts__grpc_call *c, void (*fn)(void *), void *arg);

struct mts__h2_conn;
struct mts__h2_stream;

struct mts__grpc_call {
    mts_grpc *g;
    mts_server *srv;
    const mts__grpc_method *method;
    grpc_call *call;            /* gRPC core's call; NULL for a call of the native transport */
    struct mts__h2_conn *h2c;   /* native: the connection (a reference held), set at creation */
    struct mts__h2_stream *h2s; /* native: the stream, touched only by the connection's thread */
    grpc_call_details details;
    grpc_metadata_array md;
    _Atomic int refs;
    pthread_mutex_t lock;    /* stream state below, and handlers' own stream state */
    mts__grpc_tag t_close, t_recv, t_send, t_status;
    int cancelled_flag;      /* filled by RECV_CLOSE_ON_SERVER */
    grpc_byte_buffer *recv_buf;
    bool sent_initial_md;    /* under lock */
    bool send_in_flight;
    bool reading;
    bool finished;           /* status sent (or being sent) */
    bool closed;             /* RECV_CLOSE_ON_SERVER fired */
    bool close_with_status;  /* unary: RECV_CLOSE_ON_SERVER goes in the status batch */
    _Atomic bool cancelled;  /* client cancelled or deadline passed */
    mts__grpc_out *out_head, *out_tail;
    bool close_pending;      /* stream_close asked: send status when the queue is empty */
    int close_code;
    char *close_msg;
    grpc_slice status_details;
    int64_t deadline_ns;     /* CLOCK_MONOTONIC deadline, 0 = none */
    void *state;             /* the handler's */
    /* unary timing (mts_now_ms), logged at debug level when the status has been sent
     * (event=grpc_sent): message read, reply handed to gRPC, its size */
    double t_read_ms, t_reply_ms;
    size_t reply_bytes;
};

/* ---- framework (grpc_server.c) ---- */
/* Unary calls of a lazy_close method: from now on a cancellation reaches on_cancel (the call
 * starts watching for its close). Does nothing for other calls or once the call finished. */
void mts__grpc_watch_close(mts__grpc_call *c);
void mts__grpc_call_ref(mts__grpc_call *c);
void mts__grpc_call_unref(mts__grpc_call *c);
/* Unary: sends msg (may be NULL for an empty message) and status OK; drops the alive ref. */
void mts__grpc_reply(mts__grpc_call *c, const ProtobufCMessage *msg);
/* Inside on_message (on the thread running it): a reference to the slice holding `data`, for a handler that keeps
 * pointers into the message past its return (grpc_slice_unref when done). The slice is the
 * server's own contiguous copy of the message (grpc_server.c read_message), so the handler may
 * also rearrange bytes in it. */
grpc_slice mts__grpc_message_ref(mts__grpc_call *c);
/* Unary: sends the message already serialized in bb (taken over) and status OK; drops the
 * alive ref. For replies that reference large buffers instead of copying them. */
void mts__grpc_reply_buffer(mts__grpc_call *c, grpc_byte_buffer *bb);
/* Unary or streaming: sends the status (after queued stream messages); drops the alive ref. */
void mts__grpc_fail(mts__grpc_call *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Fails with the gRPC code of an mtserve status. */
void mts__grpc_fail_status(mts__grpc_call *c, int status, const char *msg);
/* Streaming: queue a message (sent in the order queued). The _locked form expects c->lock
 * held (lets a handler keep its own ordering under the same lock). */
void mts__grpc_send(mts__grpc_call *c, const ProtobufCMessage *msg);
void mts__grpc_send_locked(mts__grpc_call *c, const ProtobufCMessage *msg);
void mts__grpc_close_locked(mts__grpc_call *c, int code, const char *msg);
/* Streaming: read the next message (at most one read in flight; no-op if one is). */
void mts__grpc_read(mts__grpc_call *c);
void mts__grpc_read_locked(mts__grpc_call *c);
/* Microseconds left before the call's deadline; 0 when it has none, <0 when past. */
int64_t mts__grpc_timeout_us(const mts__grpc_call *c);
bool mts__grpc_shutting_down(const mts__grpc_call *c);
/* Health Watch streams: a registered call (one reference taken) gets on_shutdown(c) once when the
 * server starts shutting down (which must send the final status and close the stream), unless
 * it was unregistered first (client gone). Returns false when shutdown already began. */
bool mts__grpc_watch_add(mts__grpc_call *c, void (*on_shutdown)(mts__grpc_call *c));
void mts__grpc_watch_remove(mts__grpc_call *c);

/* ---- the native transport (grpc_h2.c): gRPC over HTTP/2 on mtserve's own threads ---- */
typedef struct mts__h2 mts__h2;
/* Listens on host:port (0: ephemeral; *bound tells which) and serves calls through g; with
 * realtime, a connection's thread runs SCHED_RR 1 while its messages are small (grpc_h2.c). */
int mts__h2_start(mts_grpc *g, mts_server *srv, const char *host, int port, size_t max_message, bool realtime,
                  int *bound, mts__h2 **out, mts_err *err);
/* Stops accepting and sends GOAWAY on every connection; calls in progress go on. */
void mts__h2_stop_accepting(mts__h2 *h);
/* Closes every connection (what is still open is cancelled), waits for their threads, frees. */
void mts__h2_stop(mts__h2 *h);
/* The framework's operations on a native call, called under c->lock; each is carried out on the
 * connection's thread. finish: the reply (may be NULL, taken over) and the final status. send: one
 * stream message (taken over). read: the next request message goes to mts__grpc_native_message.
 * watch: the client going away reaches the call from now on (mts__grpc_native_closed). */
void mts__h2_finish(mts__grpc_call *c, grpc_byte_buffer *reply, int code, const char *msg);
void mts__h2_send(mts__grpc_call *c, grpc_byte_buffer *bb);
void mts__h2_read(mts__grpc_call *c);
void mts__h2_watch(mts__grpc_call *c);
void mts__h2_conn_unref(struct mts__h2_conn *conn);

/* The framework's side for the native transport (grpc_server.c). */
const mts__grpc_method *mts__grpc_find_method(const char *path, size_t len);
/* A new call (one reference: alive) of method m at `path`, with the client's metadata (taken
 * over; its slices are the call's) and deadline (gpr_inf_future when none). NULL when out of memory. */
mts__grpc_call *mts__grpc_native_call(mts_grpc *g, const mts__grpc_method *m, const char *path, size_t path_len,
                                      grpc_metadata_array *md, gpr_timespec deadline);
/* The call's checks (method known, authorization, deadline) and the start of a streaming call's
 * reading. False when the call was failed (its status is on its way). */
bool mts__grpc_native_begin(mts__grpc_call *c);
/* A request message for a call: msg (its reference taken over), or NULL at the end of input.
 * Unary: the call's one message; streaming: the answer to mts__h2_read. */
void mts__grpc_native_message(mts__grpc_call *c, grpc_slice *msg);
/* The client went away (or the deadline passed, `deadline`) before the call's status was sent. */
void mts__grpc_native_closed(mts__grpc_call *c, bool deadline);

/* ---- texts to an embedding model (grpc_embed.c) ---- */
/* ModelInfer with a BYTES first input on an embedding model: answers the call (now or later),
 * owns and frees m, and returns true; false (nothing done) for any other request. */
struct Inference__ModelInferRequest;
bool mts__grpc_embed_infer(mts__grpc_call *c, struct Inference__ModelInferRequest *m, int64_t arrival_ns);

/* ---- the request checks without a call or a client (the fuzzer, tests/fuzz/fuzz_grpc.c) ---- */
/* Unpacks a ModelInferRequest and turns it into a server request exactly as ModelInfer does,
 * without submitting it: MTS_OK when it would be submitted, else a status with msg. */
int mts__grpc_kserve_check_infer(mts_server *srv, const uint8_t *data, size_t len, char *msg, size_t msglen);
/* Same for InferBatchRequest (composite false) or CompositeBatchRequest: the shared checks, the
 * compositing options, and (when the model's signature is known) the binding of the frames. */
int mts__grpc_lipsync_check(mts_server *srv, bool composite, const uint8_t *data, size_t len, char *msg,
                            size_t msglen);

/* ---- services ---- */
extern const mts__grpc_method mts__grpc_kserve_methods[];
extern const mts__grpc_method mts__grpc_lipsync_methods[];
extern const mts__grpc_method mts__grpc_health_methods[];
extern const mts__grpc_method mts__grpc_reflection_methods[];
/* Full names of the services served (for health and reflection), NULL-terminated. */
extern const char *const mts__grpc_service_names[];

/* The serialized FileDescriptorSet of proto/ (generated at build time). */
extern const unsigned char mts__grpc_descriptor_set[];
extern const size_t mts__grpc_descriptor_set_len;

/* A bag of zeroed allocations freed together: response messages are built in one and freed
 * after packing. mts__grpc_alloc aborts on out-of-memory (responses are small; tensor data is
 * never copied into the arena). */
typedef struct mts__grpc_arena {
    void *blocks;
} mts__grpc_arena;
void *mts__grpc_alloc(mts__grpc_arena *a, size_t n);
char *mts__grpc_strdup(mts__grpc_arena *a, const char *s);
void mts__grpc_arena_free(mts__grpc_arena *a);

/* One field of a protobuf message read from the wire (grpc_server.c): its number, wire type,
 * varint value (types 0 and 2) and, for length-delimited fields, the bytes. */
typedef struct mts__pb_field {
    uint32_t number;
    int wire;
    uint64_t varint;
    const uint8_t *data;
    size_t len;
} mts__pb_field;
/* Reads the field at *p and advances past it; false at the end or on malformed input (a varint
 * over 10 bytes, a field number outside 1..2^29-1, a length past `end`, a group or unknown wire
 * type). */
bool mts__pb_next(const uint8_t **p, const uint8_t *end, mts__pb_field *f);
/* Unpacks a message whose large byte fields are not copied: the listed byte fields (singular or
 * repeated, at most 8) keep pointing into `data`, which the caller must keep alive and unchanged
 * until it frees the message (a received message: mts__grpc_message_ref). An occurrence is read
 * in place when its bytes can be moved back over their own tag and length to start
 * `align`-aligned (kernels read typed pointers; data is changed there), else protobuf-c copies it
 * as usual; *borrowed says whether any was. Protobuf-c still checks the whole message, and
 * anything the scan does not accept goes to it unchanged, so errors are protobuf-c's. */
ProtobufCMessage *mts__pb_unpack_borrowing(const ProtobufCMessageDescriptor *desc, uint8_t *data, size_t len,
                                           const unsigned *fields, int n_fields, size_t align, bool *borrowed);
/* Detaches the borrowed fields (those pointing into data..data+len) before the message is freed. */
void mts__pb_unborrow(ProtobufCMessage *m, const unsigned *fields, int n_fields, const uint8_t *data, size_t len);
/* Gives the borrowed fields copies of their own (-1: out of memory), so the message outlives data. */
int mts__pb_own_borrowed(ProtobufCMessage *m, const unsigned *fields, int n_fields, const uint8_t *data, size_t len);
void *mts__grpc_dup(mts__grpc_arena *a, const void *p, size_t n);
/* A new message in the arena initialised with its protobuf-c INIT macro. */
#define MTS__GRPC_NEW(a, type, init) ((type *)mts__grpc_dup((a), &(type)init, sizeof(type)))

#endif
