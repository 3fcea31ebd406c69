/*
 * The gRPC side of `mtserve bench`: the KServe v2 GRPCInferenceService transport (ModelInfer with
 * raw_input_contents) and the lip-sync service transport (inference.InferenceService InferBatch
 * and InferBatchComposite), on gRPC core's C API and protobuf-c, plus the control calls bench
 * needs when it has no HTTP address (ModelMetadata, RepositoryIndex).
 *
 * Channels. A client thread ("connection" in bench's terms) owns a completion queue and has one
 * call in flight at a time on a channel. Channels come from a pool of --grpc-channels K
 * (mts_bench_grpc_configure): K = 0 gives every client thread its own channel, K >= 1 spreads
 * the threads over K channels round-robin (each opened when its first thread starts), so N
 * threads are N concurrent HTTP/2 streams on min(N, K) connections. Each channel uses a local
 * subchannel pool, so K channels really are K TCP connections (gRPC core would otherwise share
 * one connection between channels with the same target and arguments). The ModelInfer and
 * ModelReady methods are registered per channel. On 2 cores with the tiny model, a few shared
 * channels (default 4) gave 20-50 % more requests/s than one channel per thread at 16 and 64
 * streams and, at 64 streams, 10-30 % more than a single channel (docs/benchmarks.md).
 *
 * Requests. A request is packed once into a grpc_slice shared read-only by all threads; each
 * send wraps it in a byte buffer (a reference, no copy; a lip-sync composite adds its
 * start_frame_idx as a second, small slice). Replies are not unpacked: a small wire scanner reads
 * only the response's `parameters` map (queue_ms, compute_ms), or a lip-sync reply's times, frame
 * sizes and the avatar's frame count, and checks the framing, so the client spends no time
 * copying output tensors or frames. Lip-sync replies are read in place, slice by slice (a raw
 * InferBatch reply is 19.7 MB for 16 frames); KServe replies are made contiguous first. A non-OK status is reported by
 * its code name (NOT_FOUND, RESOURCE_EXHAUSTED, ...) and mapped to the HTTP status the KServe
 * HTTP front end would have used, so success and failure are judged as for HTTP.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "cli/bench.h"
#include "cli/cli_grpc.h"
#include "inference_kserve.pb-c.h"
#include "lipsync.pb-c.h"

#define M_INFER "/inference.GRPCInferenceService/ModelInfer"
#define M_READY "/inference.GRPCInferenceService/ModelReady"
#define M_METADATA "/inference.GRPCInferenceService/ModelMetadata"
#define M_INDEX "/inference.GRPCInferenceService/RepositoryIndex"
#define M_LIP_INFER "/inference.InferenceService/InferBatch"
#define M_LIP_COMPOSITE "/inference.InferenceService/InferBatchComposite"

/* ---- channels -------------------------------------------------------------------------- */

typedef struct chan {
    grpc_channel *ch;
    void *reg_infer, *reg_ready, *reg_lip_infer, *reg_lip_composite;
} chan;

static struct {
    pthread_mutex_t mu;
    int want;  /* channels in the shared pool; 0: one per connection */
    int n, next, refs;
    chan *pool;
} g_chans = {.mu = PTHREAD_MUTEX_INITIALIZER, .want = 4};

static int chan_open(chan *c, const char *target)
{
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = 1 << 30},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = 1 << 30},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, .value.integer = 1},
    };
    grpc_channel_args ca = {sizeof args / sizeof args[0], args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    c->ch = grpc_channel_create(target, creds, &ca);
    grpc_channel_credentials_release(creds);
    if (!c->ch) return -1;
    c->reg_infer = grpc_channel_register_call(c->ch, M_INFER, NULL, NULL);
    c->reg_ready = grpc_channel_register_call(c->ch, M_READY, NULL, NULL);
    c->reg_lip_infer = grpc_channel_register_call(c->ch, M_LIP_INFER, NULL, NULL);
    c->reg_lip_composite = grpc_channel_register_call(c->ch, M_LIP_COMPOSITE, NULL, NULL);
    grpc_channel_check_connectivity_state(c->ch, 1); /* start connecting now */
    return 0;
}

void mts_bench_grpc_configure(int channels)
{
    grpc_init();
    pthread_mutex_lock(&g_chans.mu);
    g_chans.want = channels < 0 ? 0 : channels;
    pthread_mutex_unlock(&g_chans.mu);
}

void mts_bench_grpc_finish(void)
{
    grpc_shutdown();
}

/* ---- requests -------------------------------------------------------------------------- */

typedef struct grpc_prepared {
    grpc_slice body;
    char model[256]; /* sent as mts-model metadata (load balancers route on it) */
} grpc_prepared;

static int grpc_prepare(const mts_bench_target *t, const mts_bench_call *call, void **out, char *err, size_t errlen)
{
    (void)t;
    if (call->n_inputs > MTS_BENCH_MAX_INPUTS) {
        snprintf(err, errlen, "too many inputs for '%s'", call->model);
        return -1;
    }
    Inference__ModelInferRequest req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor tensors[MTS_BENCH_MAX_INPUTS], *tp[MTS_BENCH_MAX_INPUTS];
    ProtobufCBinaryData raw[MTS_BENCH_MAX_INPUTS];
    int64_t dims[MTS_BENCH_MAX_INPUTS][8];
    req.model_name = (char *)call->model;
    for (int i = 0; i < call->n_inputs; i++) {
        const mts_bench_input *in = &call->inputs[i];
        Inference__ModelInferRequest__InferInputTensor init = INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
        tensors[i] = init;
        tensors[i].name = (char *)in->name;
        tensors[i].datatype = (char *)in->datatype;
        memcpy(dims[i], in->dims, sizeof dims[i]);
        tensors[i].n_shape = (size_t)in->rank;
        tensors[i].shape = dims[i];
        tp[i] = &tensors[i];
        raw[i].data = (uint8_t *)in->data;
        raw[i].len = in->nbytes;
    }
    req.n_inputs = req.n_raw_input_contents = (size_t)call->n_inputs;
    req.inputs = tp;
    req.raw_input_contents = raw;
    Inference__InferParameter timeout = INFERENCE__INFER_PARAMETER__INIT;
    Inference__ModelInferRequest__ParametersEntry entry = INFERENCE__MODEL_INFER_REQUEST__PARAMETERS_ENTRY__INIT;
    Inference__ModelInferRequest__ParametersEntry *entries[1] = {&entry};
    if (call->timeout_us > 0) {
        timeout.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
        timeout.int64_param = call->timeout_us;
        entry.key = (char *)"timeout";
        entry.value = &timeout;
        req.n_parameters = 1;
        req.parameters = entries;
    }
    if (strlen(call->model) >= sizeof ((grpc_prepared *)0)->model) {
        snprintf(err, errlen, "model name '%.40s...' is too long (at most 255 bytes)", call->model);
        return -1;
    }
    grpc_prepared *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(p->model, sizeof p->model, "%s", call->model);
    size_t n = inference__model_infer_request__get_packed_size(&req);
    p->body = grpc_slice_malloc(n);
    inference__model_infer_request__pack(&req, GRPC_SLICE_START_PTR(p->body));
    *out = p;
    return 0;
}

static void grpc_free_prepared(void *prepared)
{
    grpc_prepared *p = prepared;
    if (!p) return;
    grpc_slice_unref(p->body);
    free(p);
}

/* ---- connections ----------------------------------------------------------------------- */

typedef struct grpc_conn {
    chan own;     /* used when the pool is off */
    const chan *c;
    grpc_completion_queue *cq;
    bool pooled;
} grpc_conn;

static void *grpc_connect(const mts_bench_target *t)
{
    grpc_conn *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    pthread_mutex_lock(&g_chans.mu);
    if (g_chans.want > 0) {
        if (!g_chans.pool) {
            g_chans.pool = calloc((size_t)g_chans.want, sizeof *g_chans.pool);
            g_chans.n = g_chans.pool ? g_chans.want : 0;
            g_chans.next = 0;
        }
        if (g_chans.n > 0) {
            chan *c = &g_chans.pool[g_chans.next++ % g_chans.n];
            if (c->ch || !chan_open(c, t->hostport)) { /* opened by the first thread that needs it */
                k->c = c;
                k->pooled = true;
                g_chans.refs++;
            }
        }
    }
    pthread_mutex_unlock(&g_chans.mu);
    if (!k->pooled) {
        if (chan_open(&k->own, t->hostport)) {
            free(k);
            return NULL;
        }
        k->c = &k->own;
    }
    k->cq = grpc_completion_queue_create_for_next(NULL);
    return k;
}

static void grpc_close(void *conn)
{
    grpc_conn *k = conn;
    if (!k) return;
    grpc_completion_queue_shutdown(k->cq);
    while (grpc_completion_queue_next(k->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(k->cq);
    if (k->pooled) {
        pthread_mutex_lock(&g_chans.mu);
        if (--g_chans.refs == 0) {
            for (int i = 0; i < g_chans.n; i++)
                if (g_chans.pool[i].ch) grpc_channel_destroy(g_chans.pool[i].ch);
            free(g_chans.pool);
            g_chans.pool = NULL;
            g_chans.n = 0;
        }
        pthread_mutex_unlock(&g_chans.mu);
    } else {
        grpc_channel_destroy(k->own.ch);
    }
    free(k);
}

/* One unary call on the connection's channel: sends the message made of n_body slices (taken by
 * reference), waits for status and reply. The reply (NULL when none) is returned in *recv for the
 * caller to destroy. */
static grpc_status_code conn_unary(grpc_conn *k, void *reg, const char *model, grpc_slice *body, size_t n_body,
                                   double timeout_ms, grpc_byte_buffer **recv, char *msg, size_t msglen)
{
    *recv = NULL;
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_micros((int64_t)(timeout_ms * 1e3), GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_registered_call(k->c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, k->cq, reg,
                                                          deadline, NULL);
    if (!call) {
        snprintf(msg, msglen, "cannot create a call");
        return GRPC_STATUS_INTERNAL;
    }
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(body, n_body);
    grpc_metadata_array md_initial, md_trailing;
    grpc_metadata_array_init(&md_initial);
    grpc_metadata_array_init(&md_trailing);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    grpc_metadata md[2];
    mts_cli_grpc_unary_ops(ops, md, model, send, recv, &md_initial, &md_trailing, &status, &details);
    int tag = 1;
    if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK) {
        snprintf(msg, msglen, "cannot start the call");
        status = GRPC_STATUS_INTERNAL;
    } else {
        /* gRPC core completes the batch by the deadline; the margin only guards against a hang */
        gpr_timespec guard = gpr_time_add(deadline, gpr_time_from_seconds(10, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(k->cq, guard, NULL);
        if (ev.type != GRPC_OP_COMPLETE) {
            grpc_call_cancel(call, NULL);
            ev = grpc_completion_queue_next(k->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (status == GRPC_STATUS_OK) status = GRPC_STATUS_DEADLINE_EXCEEDED;
        }
        snprintf(msg, msglen, "%.*s", (int)GRPC_SLICE_LENGTH(details), (const char *)GRPC_SLICE_START_PTR(details));
    }
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&md_initial);
    grpc_metadata_array_destroy(&md_trailing);
    grpc_call_unref(call);
    return status;
}

/* ---- reading replies ------------------------------------------------------------------- */

static bool rd_varint(const uint8_t **p, const uint8_t *e, uint64_t *v)
{
    uint64_t x = 0;
    for (int s = 0; s < 64 && *p < e; s += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* Skips or returns one field. For length-delimited fields, sub and sublen give the payload. */
static bool rd_field(const uint8_t **p, const uint8_t *e, uint32_t *field, int *wt, uint64_t *val,
                     const uint8_t **sub, size_t *sublen)
{
    uint64_t key;
    if (!rd_varint(p, e, &key)) return false;
    *field = (uint32_t)(key >> 3);
    *wt = (int)(key & 7);
    switch (*wt) {
    case 0: return rd_varint(p, e, val);
    case 1:
        if (e - *p < 8) return false;
        memcpy(val, *p, 8); /* little-endian hosts only, as everywhere in mtserve */
        *p += 8;
        return true;
    case 5:
        if (e - *p < 4) return false;
        *val = 0;
        memcpy(val, *p, 4);
        *p += 4;
        return true;
    case 2: {
        uint64_t n;
        if (!rd_varint(p, e, &n) || n > (uint64_t)(e - *p)) return false;
        *sub = *p;
        *sublen = (size_t)n;
        *p += n;
        return true;
    }
    default: return false;
    }
}

/* A number from an InferParameter (double or int64); NaN when neither. */
static double param_number(const uint8_t *p, const uint8_t *e)
{
    double out = 0.0 / 0.0;
    while (p < e) {
        uint32_t f;
        int wt;
        uint64_t v = 0;
        const uint8_t *s;
        size_t sl;
        if (!rd_field(&p, e, &f, &wt, &v, &s, &sl)) break;
        if (f == 4 && wt == 1) memcpy(&out, &v, sizeof out);
        else if ((f == 2 || f == 5) && wt == 0) out = (double)(int64_t)v;
    }
    return out;
}

/* Walks a ModelInferResponse: 0 when well formed, with queue_ms and compute_ms picked up. */
static int scan_reply(const uint8_t *p, size_t n, mts_bench_result *res)
{
    const uint8_t *e = p + n;
    while (p < e) {
        uint32_t f;
        int wt;
        uint64_t v;
        const uint8_t *s = NULL;
        size_t sl = 0;
        if (!rd_field(&p, e, &f, &wt, &v, &s, &sl)) return -1;
        if (f != 4 || wt != 2) continue;
        /* map entry: key = 1 (string), value = 2 (InferParameter) */
        const uint8_t *q = s, *qe = s + sl, *key = NULL, *val = NULL;
        size_t klen = 0, vlen = 0;
        while (q < qe) {
            uint32_t ef;
            int ewt;
            uint64_t ev;
            const uint8_t *es = NULL;
            size_t esl = 0;
            if (!rd_field(&q, qe, &ef, &ewt, &ev, &es, &esl)) return -1;
            if (ef == 1 && ewt == 2) key = es, klen = esl;
            else if (ef == 2 && ewt == 2) val = es, vlen = esl;
        }
        if (!key || !val) continue;
        double x = param_number(val, val + vlen);
        if (x != x) continue;
        if (klen == 8 && !memcmp(key, "queue_ms", 8)) res->queue_ms = x;
        else if (klen == 10 && !memcmp(key, "compute_ms", 10)) res->compute_ms = x;
    }
    return 0;
}

static int http_status_of(grpc_status_code c)
{
    switch (c) {
    case GRPC_STATUS_OK: return 200;
    case GRPC_STATUS_CANCELLED: return 499;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_FAILED_PRECONDITION:
    case GRPC_STATUS_OUT_OF_RANGE: return 400;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return 504;
    case GRPC_STATUS_NOT_FOUND: return 404;
    case GRPC_STATUS_ALREADY_EXISTS:
    case GRPC_STATUS_ABORTED: return 409;
    case GRPC_STATUS_PERMISSION_DENIED: return 403;
    case GRPC_STATUS_UNAUTHENTICATED: return 401;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return 429;
    case GRPC_STATUS_UNIMPLEMENTED: return 501;
    case GRPC_STATUS_UNAVAILABLE: return 503;
    default: return 500;
    }
}

/* Judges a finished call: status and code, whether a server took part, and the reply read by
 * scan (0 when well formed; `what` names the message expected otherwise). scan NULL: the reply
 * was read already and is well formed when present. */
static void finish_call(grpc_conn *k, grpc_status_code st, grpc_byte_buffer *recv,
                        int (*scan)(const uint8_t *, size_t, mts_bench_result *), const char *what,
                        mts_bench_result *res)
{
    res->status = http_status_of(st);
    snprintf(res->code, sizeof res->code, "%s", mts_cli_grpc_code_name((int)st));
    /* The server's own UNAVAILABLE comes over a connected channel; a refused or lost connection
     * leaves the channel connecting or failed. */
    res->no_server = st == GRPC_STATUS_UNAVAILABLE &&
                     grpc_channel_check_connectivity_state(k->c->ch, 0) != GRPC_CHANNEL_READY;
    if (st == GRPC_STATUS_OK) {
        int bad = 1;
        grpc_byte_buffer_reader r;
        if (!scan) {
            bad = !recv;
        } else if (recv && grpc_byte_buffer_reader_init(&r, recv)) {
            grpc_slice all = grpc_byte_buffer_reader_readall(&r);
            grpc_byte_buffer_reader_destroy(&r);
            bad = scan(GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all), res);
            grpc_slice_unref(all);
        }
        if (bad) {
            res->status = 0;
            res->transport_error = MTS_BENCH_EPROTO;
            res->code[0] = 0;
            snprintf(res->msg, sizeof res->msg, "the reply is not a valid %s", what);
        }
    }
    if (recv) grpc_byte_buffer_destroy(recv);
}

static void grpc_infer(void *conn, const void *prepared, int64_t start_frame, double timeout_ms,
                       mts_bench_result *res)
{
    (void)start_frame;
    grpc_conn *k = conn;
    const grpc_prepared *p = prepared;
    mts_bench_result_init(res);
    grpc_byte_buffer *recv = NULL;
    grpc_slice body = p->body;
    grpc_status_code st = conn_unary(k, k->c->reg_infer, p->model, &body, 1, timeout_ms, &recv, res->msg, sizeof res->msg);
    finish_call(k, st, recv, scan_reply, "ModelInferResponse", res);
}

static int grpc_model_ready(void *conn, const char *model, double timeout_ms)
{
    grpc_conn *k = conn;
    Inference__ModelReadyRequest req = INFERENCE__MODEL_READY_REQUEST__INIT;
    req.name = (char *)model;
    size_t n = inference__model_ready_request__get_packed_size(&req);
    grpc_slice body = grpc_slice_malloc(n);
    inference__model_ready_request__pack(&req, GRPC_SLICE_START_PTR(body));
    grpc_byte_buffer *recv = NULL;
    char msg[200];
    grpc_status_code st = conn_unary(k, k->c->reg_ready, model, &body, 1, timeout_ms, &recv, msg, sizeof msg);
    grpc_slice_unref(body);
    int ready = -1;
    if (st == GRPC_STATUS_OK && recv) {
        grpc_byte_buffer_reader r;
        if (grpc_byte_buffer_reader_init(&r, recv)) {
            grpc_slice all = grpc_byte_buffer_reader_readall(&r);
            grpc_byte_buffer_reader_destroy(&r);
            Inference__ModelReadyResponse *m =
                inference__model_ready_response__unpack(NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
            if (m) {
                ready = m->ready ? 1 : 0;
                inference__model_ready_response__free_unpacked(m, NULL);
            }
            grpc_slice_unref(all);
        }
    }
    if (recv) grpc_byte_buffer_destroy(recv);
    return ready;
}

const mts_bench_transport mts_bench_grpc_transport = {
    .name = "grpc",
    .prepare = grpc_prepare,
    .free_prepared = grpc_free_prepared,
    .connect = grpc_connect,
    .infer = grpc_infer,
    .model_ready = grpc_model_ready,
    .close = grpc_close,
};

/* ---- the lip-sync service ------------------------------------------------------------- */

/* A lip-sync request is packed once without start_frame_idx; each send appends that field in a
 * small second slice (protobuf fields may come in any order), so users walking their own avatar
 * frames share one packed body. */
typedef struct lip_prepared {
    grpc_slice body;
    bool composite;
    char model[256]; /* sent as mts-model metadata */
} lip_prepared;

static int lip_prepare(const mts_bench_target *t, const mts_bench_call *call, void **out, char *err, size_t errlen)
{
    (void)t;
    if (call->n_inputs < 2 || call->frames < 1) {
        snprintf(err, errlen, "'%s': a lip-sync request needs visual and audio inputs and at least one frame",
                 call->model);
        return -1;
    }
    if (strlen(call->model) >= sizeof ((lip_prepared *)0)->model) {
        snprintf(err, errlen, "model name '%.40s...' is too long (at most 255 bytes)", call->model);
        return -1;
    }
    lip_prepared *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(p->model, sizeof p->model, "%s", call->model);
    ProtobufCBinaryData visual = {call->inputs[0].nbytes, (uint8_t *)call->inputs[0].data};
    ProtobufCBinaryData audio = {call->inputs[1].nbytes, (uint8_t *)call->inputs[1].data};
    p->composite = call->composite;
    size_t n;
    if (call->composite) {
        Inference__CompositeBatchRequest req = INFERENCE__COMPOSITE_BATCH_REQUEST__INIT;
        req.model_id = (char *)call->model;
        req.visual_frames = visual;
        req.audio_features = audio;
        req.batch_size = call->frames;
        req.format = (char *)(call->format ? call->format : "jpeg");
        n = inference__composite_batch_request__get_packed_size(&req);
        p->body = grpc_slice_malloc(n);
        inference__composite_batch_request__pack(&req, GRPC_SLICE_START_PTR(p->body));
    } else {
        Inference__InferBatchRequest req = INFERENCE__INFER_BATCH_REQUEST__INIT;
        req.model_id = (char *)call->model;
        req.visual_frames = visual;
        req.audio_features = audio;
        req.batch_size = call->frames;
        n = inference__infer_batch_request__get_packed_size(&req);
        p->body = grpc_slice_malloc(n);
        inference__infer_batch_request__pack(&req, GRPC_SLICE_START_PTR(p->body));
    }
    *out = p;
    return 0;
}

static void lip_free_prepared(void *prepared)
{
    lip_prepared *p = prepared;
    if (!p) return;
    grpc_slice_unref(p->body);
    free(p);
}

static float f32_of(uint64_t v)
{
    uint32_t u = (uint32_t)v;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A reply read in place, slice by slice (grpc_byte_buffer_reader_peek): a raw InferBatch reply's
 * 19.7 MB of mouth regions (16 frames) are skipped, never copied into one contiguous buffer. */
typedef struct bb_cursor {
    grpc_byte_buffer_reader r;
    const uint8_t *p, *e; /* unread bytes of the current slice */
    uint64_t pos;         /* bytes consumed */
} bb_cursor;

static bool cur_fill(bb_cursor *c)
{
    while (c->p == c->e) {
        grpc_slice *s;
        if (!grpc_byte_buffer_reader_peek(&c->r, &s)) return false;
        c->p = GRPC_SLICE_START_PTR(*s);
        c->e = c->p + GRPC_SLICE_LENGTH(*s);
    }
    return true;
}

static bool cur_skip(bb_cursor *c, uint64_t n)
{
    while (n) {
        if (!cur_fill(c)) return false;
        size_t k = (size_t)(c->e - c->p) < n ? (size_t)(c->e - c->p) : (size_t)n;
        c->p += k;
        c->pos += k;
        n -= k;
    }
    return true;
}

static bool cur_varint(bb_cursor *c, uint64_t *v)
{
    uint64_t x = 0;
    for (int sh = 0; sh < 64; sh += 7) {
        if (!cur_fill(c)) return false;
        uint8_t b = *c->p++;
        c->pos++;
        x |= (uint64_t)(b & 0x7f) << sh;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* One field up to `end`: its number, wire type and value (little-endian fixed values); for a
 * length-delimited field *val is the payload's length, left unread. */
static bool cur_field(bb_cursor *c, uint64_t end, uint32_t *field, int *wt, uint64_t *val)
{
    uint64_t key;
    if (!cur_varint(c, &key)) return false;
    *field = (uint32_t)(key >> 3);
    *wt = (int)(key & 7);
    *val = 0;
    switch (*wt) {
    case 0: return cur_varint(c, val) && c->pos <= end;
    case 1:
    case 5:
        for (int i = 0; i < (*wt == 1 ? 8 : 4); i++) {
            if (!cur_fill(c)) return false;
            *val |= (uint64_t)*c->p++ << (8 * i);
            c->pos++;
        }
        return c->pos <= end;
    case 2: return cur_varint(c, val) && c->pos <= end && *val <= end - c->pos;
    default: return false;
    }
}

/* InferBatchResponse: outputs = 1 (RawMouthRegion{data = 1}), inference_time_ms = 2,
 * queue_time_ms = 7. CompositeBatchResponse: frames = 1 (CompositedFrame{data = 1}),
 * inference_time_ms = 2, composite_time_ms = 4, encode_time_ms = 7, background_time_ms = 8,
 * queue_time_ms = 9, num_frames = 12. Frames are counted and their data bytes summed. */
static int scan_lip(bb_cursor *c, uint64_t end, bool composite, mts_bench_result *res)
{
    while (c->pos < end) {
        uint32_t f;
        int wt;
        uint64_t v;
        if (!cur_field(c, end, &f, &wt, &v)) return -1;
        if (f == 1 && wt == 2) {
            uint64_t fe = c->pos + v;
            while (c->pos < fe) {
                uint32_t g;
                int w;
                uint64_t x;
                if (!cur_field(c, fe, &g, &w, &x)) return -1;
                if (w == 2) {
                    if (g == 1) res->bytes += x;
                    if (!cur_skip(c, x)) return -1;
                }
            }
            res->frames++;
        } else if (wt == 2) {
            if (!cur_skip(c, v)) return -1;
        } else if (wt == 5) {
            double x = f32_of(v);
            if (f == 2) res->compute_ms = x;
            else if (composite && f == 4) res->composite_ms = x;
            else if (composite && f == 7) res->encode_ms = x;
            else if (composite && f == 8) res->background_ms = x;
            else if (f == (composite ? 9u : 7u)) res->queue_ms = x;
        } else if (composite && f == 12 && wt == 0) {
            res->num_frames = (int)(int32_t)v;
        }
    }
    return 0;
}

/* finish_call for the lip-sync replies, read in place */
static void finish_lip_call(grpc_conn *k, grpc_status_code st, grpc_byte_buffer *recv, bool composite,
                            mts_bench_result *res)
{
    if (st == GRPC_STATUS_OK && recv) {
        bb_cursor c = {0};
        int bad = 1;
        if (grpc_byte_buffer_reader_init(&c.r, recv)) {
            bad = scan_lip(&c, grpc_byte_buffer_length(c.r.buffer_out), composite, res);
            grpc_byte_buffer_reader_destroy(&c.r);
        }
        if (bad) { /* finish_call reports it (no reply) */
            grpc_byte_buffer_destroy(recv);
            recv = NULL;
            res->frames = 0;
            res->bytes = 0;
        }
    }
    finish_call(k, st, recv, NULL, composite ? "CompositeBatchResponse" : "InferBatchResponse", res);
}

static void lip_infer(void *conn, const void *prepared, int64_t start_frame, double timeout_ms,
                      mts_bench_result *res)
{
    grpc_conn *k = conn;
    const lip_prepared *p = prepared;
    mts_bench_result_init(res);
    grpc_slice parts[2] = {p->body, grpc_empty_slice()};
    size_t n = 1;
    uint8_t tail[12];
    if (p->composite && start_frame > 0) {
        /* start_frame_idx = 5, varint (an int32 field: callers keep it below 2^31) */
        size_t len = 0;
        uint64_t v = (uint64_t)start_frame;
        tail[len++] = 5 << 3;
        do {
            uint8_t b = v & 0x7f;
            v >>= 7;
            tail[len++] = b | (v ? 0x80 : 0);
        } while (v);
        parts[1] = grpc_slice_from_copied_buffer((const char *)tail, len);
        n = 2;
    }
    grpc_byte_buffer *recv = NULL;
    grpc_status_code st = conn_unary(k, p->composite ? k->c->reg_lip_composite : k->c->reg_lip_infer, p->model, parts, n,
                                     timeout_ms, &recv, res->msg, sizeof res->msg);
    grpc_slice_unref(parts[1]);
    finish_lip_call(k, st, recv, p->composite, res);
}

const mts_bench_transport mts_bench_lipsync_grpc_transport = {
    .name = "grpc-lipsync",
    .prepare = lip_prepare,
    .free_prepared = lip_free_prepared,
    .connect = grpc_connect,
    .infer = lip_infer,
    .close = grpc_close,
};

/* ---- control calls --------------------------------------------------------------------- */

int mts_bench_grpc_metadata(const char *target, const char *model, mts_bench_input *ins, int max, int *n,
                            char *err, size_t errlen)
{
    Inference__ModelMetadataRequest req = INFERENCE__MODEL_METADATA_REQUEST__INIT;
    req.name = (char *)model;
    ProtobufCMessage *resp = NULL;
    char msg[200];
    int code = mts_cli_grpc_unary(target, M_METADATA, model, &req.base, &inference__model_metadata_response__descriptor,
                                  &resp, 120, msg, sizeof msg);
    if (code) {
        snprintf(err, errlen, "%s: %s", mts_cli_grpc_code_name(code), msg);
        return -1;
    }
    Inference__ModelMetadataResponse *r = (Inference__ModelMetadataResponse *)resp;
    *n = 0;
    for (size_t i = 0; i < r->n_inputs && *n < max; i++) {
        const Inference__ModelMetadataResponse__TensorMetadata *t = r->inputs[i];
        mts_bench_input *in = &ins[(*n)++];
        memset(in, 0, sizeof *in);
        snprintf(in->name, sizeof in->name, "%s", t->name);
        snprintf(in->datatype, sizeof in->datatype, "%s", t->datatype[0] ? t->datatype : "FP32");
        for (size_t d = 0; d < t->n_shape && in->rank < 8; d++) in->dims[in->rank++] = t->shape[d] < 0 ? -1 : t->shape[d];
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

int mts_bench_grpc_index(const char *target, char ***names, int *n, char *err, size_t errlen)
{
    Inference__RepositoryIndexRequest req = INFERENCE__REPOSITORY_INDEX_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    char msg[200];
    *names = NULL;
    *n = 0;
    int code = mts_cli_grpc_unary(target, M_INDEX, NULL, &req.base, &inference__repository_index_response__descriptor,
                                  &resp, 30, msg, sizeof msg);
    if (code) {
        snprintf(err, errlen, "repository index: %s: %s", mts_cli_grpc_code_name(code), msg);
        return -1;
    }
    Inference__RepositoryIndexResponse *r = (Inference__RepositoryIndexResponse *)resp;
    int ret = 0;
    if (r->n_models) {
        *names = calloc(r->n_models, sizeof **names);
        if (!*names) ret = -1;
        for (size_t i = 0; !ret && i < r->n_models; i++) {
            if (!((*names)[i] = strdup(r->models[i]->name))) ret = -1;
            else (*n)++;
        }
    }
    if (ret) snprintf(err, errlen, "out of memory");
    protobuf_c_message_free_unpacked(resp, NULL);
    return ret;
}
