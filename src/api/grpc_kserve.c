/*
 * KServe v2 GRPCInferenceService (proto/inference_kserve.proto) over the server core: health,
 * server and model metadata, model configuration, inference (raw_input_contents and typed
 * contents in; one raw_output_contents entry per output, in order, out), the bidirectional
 * ModelStreamInfer (responses in request order, at most MTS__STREAM_WINDOW requests in flight
 * per stream: reading pauses beyond that, so a fast client is flow-controlled by HTTP/2),
 * statistics and the repository RPCs. Behaviour and messages mirror kserve_http.c; errors are
 * gRPC status codes (mts_proto_grpc_code in protocol.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/bytes_tensor.h"
#include "api/grpc_internal.h"
#include "inference_kserve.pb-c.h"

#define MTS__STREAM_WINDOW 64

/* ---- inference request parsing ---- */

typedef struct stream_state stream_state;

static const unsigned raw_fields[] = {7}; /* ModelInferRequest.raw_input_contents */

typedef struct kinfer {
    mts_request req; /* first: the completion callback casts back */
    mts__grpc_call *call;
    Inference__ModelInferRequest *msg; /* input tensors point into it */
    bool borrowed;                     /* its raw_input_contents point into `slice` (kinfer_unpack) */
    grpc_slice slice;                  /* the request message, held while borrowed */
    void *owned[MTS_REQ_MAX_TENSORS];  /* converted typed contents, string blobs */
    void *out_bin[MTS_REQ_MAX_TENSORS]; /* string outputs in the binary BYTES form */
    size_t out_bin_len[MTS_REQ_MAX_TENSORS];
    mts_bytes_out str[MTS_REQ_MAX_TENSORS]; /* string outputs' shapes */
    stream_state *stream;              /* NULL for ModelInfer */
    bool done;                         /* stream: completed, waiting for its turn */
    int status;
    char *error;
    struct kinfer *next;
} kinfer;

struct stream_state {
    kinfer *head, *tail; /* in request order */
    int pending;         /* not yet sent */
    bool client_done;
    bool paused;
};

static void kinfer_free(kinfer *k)
{
    if (!k) return;
    mts_request_release(&k->req);
    for (int i = 0; i < MTS_REQ_MAX_TENSORS; i++) {
        free(k->owned[i]);
        free(k->out_bin[i]);
    }
    if (k->borrowed) mts__pb_unborrow(&k->msg->base, raw_fields, 1, GRPC_SLICE_START_PTR(k->slice), GRPC_SLICE_LENGTH(k->slice));
    if (k->msg) inference__model_infer_request__free_unpacked(k->msg, NULL);
    if (k->borrowed) grpc_slice_unref(k->slice);
    free(k->error);
    free(k);
}

/* Unpacks a ModelInferRequest into k->msg without copying its raw_input_contents: they stay in
 * the received message (4-byte aligned where their framing allows; parse_infer realigns what
 * needs more), which k holds (`slice`: the call's message, or the caller's buffer) until freed. */
static Inference__ModelInferRequest *kinfer_unpack(kinfer *k, mts__grpc_call *c, const uint8_t *data, size_t len)
{
    bool borrowed;
    k->msg = (Inference__ModelInferRequest *)mts__pb_unpack_borrowing(
        &inference__model_infer_request__descriptor, (uint8_t *)data, len, raw_fields, 1, sizeof(float), &borrowed);
    if (k->msg && borrowed) {
        k->borrowed = true;
        k->slice = c ? mts__grpc_message_ref(c) : grpc_slice_from_static_buffer(data, len);
    }
    return k->msg;
}

/* An embedding model's request outlives the message in its own handler: it gets its own copies. */
static bool kinfer_own(kinfer *k)
{
    if (!k->borrowed) return true;
    if (mts__pb_own_borrowed(&k->msg->base, raw_fields, 1, GRPC_SLICE_START_PTR(k->slice), GRPC_SLICE_LENGTH(k->slice)))
        return false;
    k->borrowed = false;
    grpc_slice_unref(k->slice);
    return true;
}

/* Copies typed contents of one input into an engine buffer. */
static int typed_contents(kinfer *k, int i, const Inference__InferTensorContents *ct, const char *name,
                          const char *dt, char *msg, size_t len)
{
    mts_tensor *t = &k->req.inputs[i];
    size_t have = 0;
    const char *field = "";
    const void *src = NULL;
    switch (t->dtype) {
    case MTS_DTYPE_FLOAT: have = ct->n_fp32_contents; field = "fp32_contents"; src = ct->fp32_contents; break;
    case MTS_DTYPE_INT64: have = ct->n_int64_contents; field = "int64_contents"; src = ct->int64_contents; break;
    case MTS_DTYPE_INT32: case MTS_DTYPE_INT8:
        have = ct->n_int_contents; field = "int_contents"; src = ct->int_contents; break;
    case MTS_DTYPE_UINT8: have = ct->n_uint_contents; field = "uint_contents"; src = ct->uint_contents; break;
    case MTS_DTYPE_BOOL: have = ct->n_bool_contents; field = "bool_contents"; src = ct->bool_contents; break;
    case MTS_DTYPE_DOUBLE: have = ct->n_fp64_contents; field = "fp64_contents"; src = ct->fp64_contents; break;
    case MTS_DTYPE_UINT64: have = ct->n_uint64_contents; field = "uint64_contents"; src = ct->uint64_contents; break;
    case MTS_DTYPE_INT16: have = ct->n_int_contents; field = "int_contents"; src = ct->int_contents; break;
    case MTS_DTYPE_UINT16: case MTS_DTYPE_UINT32:
        have = ct->n_uint_contents; field = "uint_contents"; src = ct->uint_contents; break;
    case MTS_DTYPE_FLOAT16: case MTS_DTYPE_BFLOAT16:
        snprintf(msg, len, "input '%s': datatype %s has no typed contents field; send it in raw_input_contents", name,
                 dt);
        return MTS_EINVAL;
    case MTS_DTYPE_STRINGS: { /* BYTES: contents.bytes_contents, one entry per string */
        if ((uint64_t)ct->n_bytes_contents != (uint64_t)mts_tensor_numel(t)) {
            char shp[128];
            snprintf(msg, len, "input '%s': contents.bytes_contents has %zu values, shape %s of BYTES needs %lld", name,
                     ct->n_bytes_contents, mts_shape_str(t, shp, sizeof shp), (long long)mts_tensor_numel(t));
            return MTS_EINVAL;
        }
        mts_bytes_elem *e = malloc((ct->n_bytes_contents + 1) * sizeof *e);
        if (!e) {
            snprintf(msg, len, "out of memory");
            return MTS_ENOMEM;
        }
        for (size_t j = 0; j < ct->n_bytes_contents; j++)
            e[j] = (mts_bytes_elem){(const char *)ct->bytes_contents[j].data, ct->bytes_contents[j].len};
        int rc = mts_bytes_in_elems(name, t, e, (int64_t)ct->n_bytes_contents, &k->owned[i], msg, len);
        free(e);
        return rc;
    }
    default: snprintf(msg, len, "input '%s': datatype %s cannot be sent as typed contents", name, dt); return MTS_EINVAL;
    }
    char what[64];
    snprintf(what, sizeof what, "contents.%s has", field);
    int rc = mts_proto_input_count(name, t, dt, what, (int64_t)have, "values", msg, len);
    if (rc) return rc;
    if (t->dtype == MTS_DTYPE_FLOAT || t->dtype == MTS_DTYPE_INT64 || t->dtype == MTS_DTYPE_INT32 ||
        t->dtype == MTS_DTYPE_DOUBLE || t->dtype == MTS_DTYPE_UINT64 || t->dtype == MTS_DTYPE_UINT32) {
        t->data = (void *)src; /* same layout: use in place */
        if (!t->data) t->data = k->owned[i] = malloc(1);
        return MTS_OK;
    }
    if (t->dtype == MTS_DTYPE_INT16 || t->dtype == MTS_DTYPE_UINT16) { /* 32-bit fields: range-checked */
        uint16_t *o16 = k->owned[i] = malloc(have ? have * 2 : 1);
        if (!o16) {
            snprintf(msg, len, "out of memory");
            return MTS_ENOMEM;
        }
        for (size_t e = 0; e < have; e++) {
            bool sgn = t->dtype == MTS_DTYPE_INT16;
            int64_t v = sgn ? (int64_t)ct->int_contents[e] : (int64_t)ct->uint_contents[e];
            if (sgn ? (v < INT16_MIN || v > INT16_MAX) : v > UINT16_MAX) {
                snprintf(msg, len, "input '%s': contents.%s[%zu] (%lld) is out of range for %s", name, field, e,
                         (long long)v, dt);
                return MTS_EINVAL;
            }
            o16[e] = (uint16_t)v;
        }
        t->data = o16;
        return MTS_OK;
    }
    uint8_t *out = k->owned[i] = malloc(have ? have : 1);
    if (!out) {
        snprintf(msg, len, "out of memory");
        return MTS_ENOMEM;
    }
    for (size_t e = 0; e < have; e++) {
        if (t->dtype == MTS_DTYPE_INT8) out[e] = (uint8_t)(int8_t)ct->int_contents[e];
        else if (t->dtype == MTS_DTYPE_UINT8) out[e] = (uint8_t)ct->uint_contents[e];
        else out[e] = ct->bool_contents[e] ? 1 : 0;
    }
    t->data = out;
    return MTS_OK;
}

/* Fills k->req from k->msg; on error writes msg and returns a status. */
static int parse_infer(mts__grpc_call *c, kinfer *k, char *msg, size_t len)
{
    Inference__ModelInferRequest *m = k->msg;
    if (!m->model_name[0]) {
        snprintf(msg, len, "model_name is required");
        return MTS_EINVAL;
    }
    int rc = mts_proto_find_model(c->srv, m->model_name, m->model_version, msg, len);
    if (rc) return rc;
    k->req.model = m->model_name;
    if (m->n_inputs == 0) {
        snprintf(msg, len, "at least one input is required");
        return MTS_EINVAL;
    }
    if (m->n_inputs > MTS_REQ_MAX_TENSORS) {
        snprintf(msg, len, "too many inputs (%zu, at most %d)", m->n_inputs, MTS_REQ_MAX_TENSORS);
        return MTS_EINVAL;
    }
    bool raw = m->n_raw_input_contents > 0;
    if (raw && m->n_raw_input_contents != m->n_inputs) {
        snprintf(msg, len, "raw_input_contents has %zu entries; expected one per input (%zu), in the order of inputs",
                 m->n_raw_input_contents, m->n_inputs);
        return MTS_EINVAL;
    }
    for (size_t i = 0; i < m->n_inputs; i++) {
        const Inference__ModelInferRequest__InferInputTensor *in = m->inputs[i];
        const char *name = in->name;
        if (!name[0]) {
            snprintf(msg, len, "inputs[%zu]: name is required", i);
            return MTS_EINVAL;
        }
        mts_tensor *t = &k->req.inputs[i];
        rc = mts_proto_input_decl(&k->req, name, in->datatype, in->shape, in->n_shape, t, msg, len);
        if (rc) return rc;
        if (raw) {
            if (in->contents) {
                snprintf(msg, len, "input '%s' has contents although raw_input_contents is used; send one or the other",
                         name);
                return MTS_EINVAL;
            }
            const ProtobufCBinaryData *b = &m->raw_input_contents[i];
            char what[64];
            if (t->dtype == MTS_DTYPE_STRINGS) { /* BYTES: length-prefixed strings */
                snprintf(what, sizeof what, "raw_input_contents[%zu]", i);
                rc = mts_bytes_in_binary(name, t, b->data, b->len, what, &k->owned[i], msg, len);
                if (rc) return rc;
                k->req.input_names[i] = name;
                k->req.n_inputs++;
                continue;
            }
            snprintf(what, sizeof what, "raw_input_contents[%zu] has", i);
            rc = mts_proto_input_count(name, t, in->datatype, what, (int64_t)b->len, "bytes", msg, len);
            if (rc) return rc;
            size_t es = mts_dtype_size(t->dtype);
            if (b->data && es > 1 && (uintptr_t)b->data % es) { /* kernels read typed pointers: realign */
                if (!(k->owned[i] = malloc(b->len))) {
                    snprintf(msg, len, "out of memory");
                    return MTS_ENOMEM;
                }
                t->data = memcpy(k->owned[i], b->data, b->len);
            } else {
                t->data = b->data ? (void *)b->data : (k->owned[i] = malloc(1));
            }
        } else if (in->contents) {
            rc = typed_contents(k, (int)i, in->contents, name, in->datatype, msg, len);
            if (rc) return rc;
        } else {
            snprintf(msg, len, "input '%s' has neither contents nor a raw_input_contents entry", name);
            return MTS_EINVAL;
        }
        k->req.input_names[i] = name;
        k->req.n_inputs++;
    }
    if (m->n_outputs > MTS_REQ_MAX_TENSORS) {
        snprintf(msg, len, "too many requested outputs (%zu, at most %d)", m->n_outputs, MTS_REQ_MAX_TENSORS);
        return MTS_EINVAL;
    }
    for (size_t o = 0; o < m->n_outputs; o++) {
        if (!m->outputs[o]->name[0]) {
            snprintf(msg, len, "outputs[%zu]: name is required", o);
            return MTS_EINVAL;
        }
        k->req.requested[o] = m->outputs[o]->name;
        k->req.n_requested++;
    }
    int64_t timeout = mts__grpc_timeout_us(c);
    if (timeout < 0) {
        snprintf(msg, len, "the deadline passed before the request was queued");
        return MTS_ETIMEDOUT;
    }
    for (size_t p = 0; p < m->n_parameters; p++) {
        const Inference__ModelInferRequest__ParametersEntry *e = m->parameters[p];
        if (!strcmp(e->key, "priority")) {
            /* Triton's clients send uint64_param; int64_param is taken too (anything else, or a
             * uint64 beyond int64's range, becomes -1: refused with the range) */
            int64_t pr = -1;
            if (e->value && e->value->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM)
                pr = e->value->int64_param;
            else if (e->value &&
                     e->value->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM &&
                     e->value->uint64_param <= INT64_MAX)
                pr = (int64_t)e->value->uint64_param;
            if (mts_request_set_priority(&k->req, pr, msg, len)) return MTS_EINVAL;
            continue;
        }
        if (strcmp(e->key, "timeout")) continue;
        if (!e->value || e->value->parameter_choice_case != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM ||
            e->value->int64_param < 0) {
            snprintf(msg, len, "parameter 'timeout' must be a non-negative int64_param (microseconds)");
            return MTS_EINVAL;
        }
        if (e->value->int64_param > 0 && (timeout == 0 || e->value->int64_param < timeout))
            timeout = e->value->int64_param;
    }
    k->req.timeout_us = timeout;
    return MTS_OK;
}

static Inference__ModelInferResponse__ParametersEntry *param_entry(mts__grpc_arena *a, const char *key, bool dbl,
                                                                   double d, int64_t i)
{
    Inference__InferParameter *v = MTS__GRPC_NEW(a, Inference__InferParameter, INFERENCE__INFER_PARAMETER__INIT);
    if (dbl) {
        v->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM;
        v->double_param = d;
    } else {
        v->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
        v->int64_param = i;
    }
    Inference__ModelInferResponse__ParametersEntry *e = MTS__GRPC_NEW(
        a, Inference__ModelInferResponse__ParametersEntry, INFERENCE__MODEL_INFER_RESPONSE__PARAMETERS_ENTRY__INIT);
    e->key = (char *)key;
    e->value = v;
    return e;
}

/* The response for a completed request; output bytes point into req.outputs (not copied). */
static Inference__ModelInferResponse *build_response(mts__grpc_arena *a, kinfer *k)
{
    mts_request *req = &k->req;
    Inference__ModelInferResponse *r = MTS__GRPC_NEW(a, Inference__ModelInferResponse, INFERENCE__MODEL_INFER_RESPONSE__INIT);
    r->model_name = k->msg->model_name;
    char ver[16];
    snprintf(ver, sizeof ver, "%d", mts_server_model_version(k->call->srv, req->model));
    r->model_version = mts__grpc_strdup(a, ver);
    r->id = k->msg->id;
    r->n_parameters = 4;
    r->parameters = mts__grpc_alloc(a, 4 * sizeof *r->parameters);
    r->parameters[0] = param_entry(a, "queue_ms", true, req->queue_ms, 0);
    r->parameters[1] = param_entry(a, "compute_ms", true, req->compute_ms, 0);
    r->parameters[2] = param_entry(a, "batch_size", false, 0, req->batch_size);
    r->parameters[3] = param_entry(a, "device", false, 0, req->device);
    r->n_outputs = r->n_raw_output_contents = (size_t)req->n_outputs;
    r->outputs = mts__grpc_alloc(a, (size_t)req->n_outputs * sizeof *r->outputs + 1);
    r->raw_output_contents = mts__grpc_alloc(a, (size_t)req->n_outputs * sizeof *r->raw_output_contents + 1);
    for (int o = 0; o < req->n_outputs; o++) {
        const mts_tensor *t = &req->outputs[o];
        Inference__ModelInferResponse__InferOutputTensor *ot = MTS__GRPC_NEW(
            a, Inference__ModelInferResponse__InferOutputTensor, INFERENCE__MODEL_INFER_RESPONSE__INFER_OUTPUT_TENSOR__INIT);
        ot->name = (char *)req->output_names[o];
        const char *dt = mts_kserve_datatype(t->dtype);
        ot->datatype = (char *)(dt ? dt : "FP32");
        bool is_str = t->dtype == MTS_DTYPE_STRINGS; /* shape inside the blob, binary form out */
        int rank = is_str ? k->str[o].rank : t->rank;
        ot->n_shape = (size_t)rank;
        ot->shape = mts__grpc_alloc(a, sizeof(int64_t) * (size_t)(rank + 1));
        for (int d = 0; d < rank; d++) ot->shape[d] = is_str ? k->str[o].dims[d] : t->dims[d];
        r->outputs[o] = ot;
        r->raw_output_contents[o].data = is_str ? k->out_bin[o] : t->data;
        r->raw_output_contents[o].len = is_str ? k->out_bin_len[o] : (size_t)mts_tensor_nbytes(t);
    }
    return r;
}

/* ---- ModelInfer ---- */

/* Encodes and sends a successful reply; frees the call's request. */
static void send_reply(void *arg)
{
    kinfer *k = arg;
    mts__grpc_call *c = k->call;
    mts__grpc_arena a = {0};
    Inference__ModelInferResponse *r = build_response(&a, k);
    mts_server_request_answered(c->srv, &k->req);
    mts__grpc_reply(c, &r->base);
    mts__grpc_arena_free(&a);
    kinfer_free(k);
    mts__grpc_call_unref(c);
}

/* String outputs go back in raw_output_contents in the binary BYTES form (each string a 4-byte
 * little-endian length and its bytes), as Triton sends them. Returns a status with msg. */
static int string_outputs(kinfer *k, char *msg, size_t len)
{
    mts_request *req = &k->req;
    for (int o = 0; o < req->n_outputs; o++) {
        if (req->outputs[o].dtype != MTS_DTYPE_STRINGS) continue;
        if (mts_bytes_out_view(req->output_names[o], &req->outputs[o], &k->str[o], msg, len)) return MTS_EIO;
        k->out_bin_len[o] = mts_bytes_out_binary_size(&k->str[o]);
        if (!(k->out_bin[o] = malloc(k->out_bin_len[o] ? k->out_bin_len[o] : 1))) {
            snprintf(msg, len, "out of memory encoding output '%s'", req->output_names[o]);
            return MTS_ENOMEM;
        }
        mts_bytes_out_binary(&k->str[o], k->out_bin[o]);
    }
    return MTS_OK;
}

static void unary_done(mts_request *req, int status, const char *err)
{
    kinfer *k = (kinfer *)req;
    mts__grpc_call *c = k->call;
    char smsg[512];
    if (!status && (status = string_outputs(k, smsg, sizeof smsg)) != 0) err = smsg;
    pthread_mutex_lock(&c->lock);
    c->state = NULL;
    pthread_mutex_unlock(&c->lock);
    if (status) {
        mts_server_request_answered(c->srv, req);
        mts__grpc_fail_status(c, status, err);
        kinfer_free(k);
        mts__grpc_call_unref(c);
        return;
    }
    /* Copying and encoding a large reply (1.2 MB per lip-sync frame) takes about a millisecond:
     * do it on the reply thread so the device worker can start its next batch. Small replies
     * are cheaper to send right here than to hand over. */
    int64_t bytes = 0;
    for (int o = 0; o < req->n_outputs; o++) bytes += mts_tensor_nbytes(&req->outputs[o]);
    if (bytes < (256 << 10) || mts__grpc_defer(c, send_reply, k)) send_reply(k);
}

static void model_infer(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    kinfer *k = calloc(1, sizeof *k);
    if (!k) {
        mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    k->call = c;
    k->req.arrival_ns = mts_server_clock_ns();
    if (!kinfer_unpack(k, c, data, len)) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "the request is not a valid inference.ModelInferRequest");
        kinfer_free(k);
        return;
    }
    const Inference__ModelInferRequest *m = k->msg; /* BYTES may be texts for an embedding model: */
    bool texts = m->n_inputs >= 1 && m->inputs[0]->datatype && !strcmp(m->inputs[0]->datatype, "BYTES");
    if (texts && !kinfer_own(k)) { /* that request outlives this message, so it takes copies */
        mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        kinfer_free(k);
        return;
    }
    if (texts) mts__grpc_watch_close(c); /* the embedding path reads the cancellation itself */
    if (mts__grpc_embed_infer(c, k->msg, k->req.arrival_ns)) { /* texts to an embedding model */
        k->msg = NULL;
        kinfer_free(k);
        return;
    }
    char msg[512];
    int rc = parse_infer(c, k, msg, sizeof msg);
    if (rc) {
        mts__grpc_fail_status(c, rc, msg);
        kinfer_free(k);
        return;
    }
    k->req.done = unary_done;
    k->req.user = k;
    k->req.run_inline = true; /* this polling thread may run a short batch itself (scheduler.c) */
    mts__grpc_call_ref(c);
    pthread_mutex_lock(&c->lock);
    c->state = k;
    pthread_mutex_unlock(&c->lock);
    int retry = 0;
    mts_err err = {0};
    rc = mts_server_submit(c->srv, &k->req, &retry, &err);
    if (rc) {
        pthread_mutex_lock(&c->lock);
        c->state = NULL;
        pthread_mutex_unlock(&c->lock);
        mts__grpc_fail_status(c, rc, err.msg);
        kinfer_free(k);
        mts__grpc_call_unref(c);
        return;
    }
    /* A request a worker was woken for runs now: cancelling it would save nothing. One that
     * waits (queued behind others, its model loading) is watched, so a cancellation drops it. */
    pthread_mutex_lock(&c->lock);
    bool watch = c->state == k && !k->req.prompt; /* (k is the call's until it is answered) */
    pthread_mutex_unlock(&c->lock);
    if (watch) mts__grpc_watch_close(c);
}

int mts__grpc_kserve_check_infer(mts_server *srv, const uint8_t *data, size_t len, char *msg, size_t msglen)
{
    mts__grpc_call c;
    memset(&c, 0, sizeof c);
    c.srv = srv;
    c.details.deadline = gpr_inf_future(GPR_CLOCK_REALTIME);
    kinfer *k = calloc(1, sizeof *k);
    if (!k) {
        snprintf(msg, msglen, "out of memory");
        return MTS_ENOMEM;
    }
    k->call = &c;
    uint8_t *copy = malloc(len ? len : 1); /* kinfer_unpack may move tensor bytes within the message */
    if (!copy) {
        free(k);
        snprintf(msg, msglen, "out of memory");
        return MTS_ENOMEM;
    }
    memcpy(copy, data, len);
    int rc;
    if (!kinfer_unpack(k, NULL, copy, len)) {
        snprintf(msg, msglen, "the request is not a valid inference.ModelInferRequest");
        rc = MTS_EINVAL;
    } else {
        rc = parse_infer(&c, k, msg, msglen);
    }
    kinfer_free(k);
    free(copy);
    return rc;
}

static void model_infer_cancel(mts__grpc_call *c)
{
    pthread_mutex_lock(&c->lock);
    if (c->state) mts_request_cancel(&((kinfer *)c->state)->req);
    pthread_mutex_unlock(&c->lock);
}

/* ---- ModelStreamInfer ---- */

/* Sends every completed request at the head of the stream, in order. Under c->lock. */
static void stream_flush_locked(mts__grpc_call *c, stream_state *st)
{
    while (st->head && st->head->done) {
        kinfer *k = st->head;
        st->head = k->next;
        if (!st->head) st->tail = NULL;
        st->pending--;
        mts__grpc_arena a = {0};
        Inference__ModelStreamInferResponse r = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
        if (k->status) {
            r.error_message = k->error ? k->error : (char *)mts_status_text(k->status);
            Inference__ModelInferResponse *ir =
                MTS__GRPC_NEW(&a, Inference__ModelInferResponse, INFERENCE__MODEL_INFER_RESPONSE__INIT);
            if (k->msg) {
                ir->model_name = k->msg->model_name;
                ir->id = k->msg->id;
            }
            r.infer_response = ir;
        } else {
            r.infer_response = build_response(&a, k);
        }
        mts_server_request_answered(c->srv, &k->req);
        mts__grpc_send_locked(c, &r.base);
        mts__grpc_arena_free(&a);
        kinfer_free(k);
    }
    if (st->paused && st->pending < MTS__STREAM_WINDOW && !st->client_done) {
        st->paused = false;
        mts__grpc_read_locked(c);
    }
    if (st->client_done && !st->head) mts__grpc_close_locked(c, MTS_GRPC_OK, NULL);
}

static void stream_complete(mts__grpc_call *c, kinfer *k, int status, const char *err)
{
    pthread_mutex_lock(&c->lock);
    k->done = true;
    k->status = status;
    if (status) {
        char buf[600];
        snprintf(buf, sizeof buf, "%s: %s", mts_proto_grpc_code_name(mts_proto_grpc_code(status)),
                 err && err[0] ? err : mts_status_text(status));
        k->error = strdup(buf);
    }
    stream_flush_locked(c, (stream_state *)c->state);
    pthread_mutex_unlock(&c->lock);
}

static void stream_done(mts_request *req, int status, const char *err)
{
    kinfer *k = (kinfer *)req;
    mts__grpc_call *c = k->call;
    char smsg[512];
    if (!status && (status = string_outputs(k, smsg, sizeof smsg)) != 0) err = smsg;
    stream_complete(c, k, status, err);
    mts__grpc_call_unref(c);
}

static void stream_message(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    stream_state *st = c->state;
    if (!st) {
        st = calloc(1, sizeof *st);
        if (!st) {
            mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        pthread_mutex_lock(&c->lock);
        c->state = st;
        pthread_mutex_unlock(&c->lock);
    }
    kinfer *k = calloc(1, sizeof *k);
    if (!k) {
        mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    k->call = c;
    k->stream = st;
    k->req.arrival_ns = mts_server_clock_ns();
    pthread_mutex_lock(&c->lock);
    if (st->tail) st->tail->next = k;
    else st->head = k;
    st->tail = k;
    st->pending++;
    pthread_mutex_unlock(&c->lock);

    char msg[512];
    int rc;
    if (!kinfer_unpack(k, c, data, len)) {
        rc = MTS_EINVAL;
        snprintf(msg, sizeof msg, "the message is not a valid inference.ModelInferRequest");
    } else {
        rc = parse_infer(c, k, msg, sizeof msg);
    }
    if (!rc) {
        k->req.done = stream_done;
        k->req.user = k;
        mts__grpc_call_ref(c);
        int retry = 0;
        mts_err err = {0};
        rc = mts_server_submit(c->srv, &k->req, &retry, &err);
        if (rc) {
            snprintf(msg, sizeof msg, "%s", err.msg);
            mts__grpc_call_unref(c);
        }
    }
    if (rc) stream_complete(c, k, rc, msg);
    pthread_mutex_lock(&c->lock);
    if (st->pending < MTS__STREAM_WINDOW) mts__grpc_read_locked(c);
    else st->paused = true;
    pthread_mutex_unlock(&c->lock);
}

static void stream_half_close(mts__grpc_call *c)
{
    pthread_mutex_lock(&c->lock);
    stream_state *st = c->state;
    if (st) {
        st->client_done = true;
        if (!st->head) mts__grpc_close_locked(c, MTS_GRPC_OK, NULL);
    } else {
        mts__grpc_close_locked(c, MTS_GRPC_OK, NULL);
    }
    pthread_mutex_unlock(&c->lock);
}

static void stream_cancel(mts__grpc_call *c)
{
    pthread_mutex_lock(&c->lock);
    stream_state *st = c->state;
    for (kinfer *k = st ? st->head : NULL; k; k = k->next)
        if (!k->done) mts_request_cancel(&k->req);
    pthread_mutex_unlock(&c->lock);
}

static void stream_state_free(void *p)
{
    stream_state *st = p;
    for (kinfer *k = st->head, *n; k; k = n) { /* only completed ones can be left */
        n = k->next;
        kinfer_free(k);
    }
    free(st);
}

/* ---- health and metadata ---- */

static void server_live(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
    r.live = 1;
    mts__grpc_reply(c, &r.base);
}

static void server_ready(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
    r.ready = !mts__grpc_shutting_down(c);
    mts__grpc_reply(c, &r.base);
}

static void server_metadata(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    Inference__ServerMetadataResponse r = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
    r.name = "mtserve";
    r.version = "0.1.0";
    r.n_extensions = (size_t)mts_proto_n_extensions;
    r.extensions = (char **)mts_proto_extensions; /* only read by the packer */
    mts__grpc_reply(c, &r.base);
}

/* Unpacks a request whose fields 1 and 2 are name and version (ModelReady, ModelMetadata,
 * ModelConfig, ModelStatistics): all share that layout, so ModelReadyRequest reads them all. */
static char *unpack_name(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    Inference__ModelReadyRequest *m = inference__model_ready_request__unpack(NULL, len, data);
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "malformed request message");
        return NULL;
    }
    char msg[400];
    if (m->name[0] && mts_server_has_model(c->srv, m->name) && !mts_server_version_ok(c->srv, m->name, m->version, msg, sizeof msg)) {
        inference__model_ready_request__free_unpacked(m, NULL);
        mts__grpc_fail(c, MTS_GRPC_NOT_FOUND, "%s", msg);
        return NULL;
    }
    char *name = strdup(m->name);
    inference__model_ready_request__free_unpacked(m, NULL);
    if (!name) mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return name;
}

static void model_ready(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    char *name = unpack_name(c, data, len);
    if (!name) return;
    mts_model_status st;
    char buf[300];
    if (mts_server_model_status_by_name(c->srv, name, &st)) {
        mts__grpc_fail_status(c, MTS_ENOTFOUND, mts_proto_unknown_model(buf, sizeof buf, name));
    } else {
        Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
        r.ready = st.state == MTS_MODEL_READY;
        mts__grpc_reply(c, &r.base);
    }
    free(name);
}

static int config_datatype(mts_dtype t)
{
    switch (t) {
    case MTS_DTYPE_BOOL: return INFERENCE__DATA_TYPE__TYPE_BOOL;
    case MTS_DTYPE_UINT8: return INFERENCE__DATA_TYPE__TYPE_UINT8;
    case MTS_DTYPE_INT8: return INFERENCE__DATA_TYPE__TYPE_INT8;
    case MTS_DTYPE_INT32: return INFERENCE__DATA_TYPE__TYPE_INT32;
    case MTS_DTYPE_INT64: return INFERENCE__DATA_TYPE__TYPE_INT64;
    case MTS_DTYPE_FLOAT: return INFERENCE__DATA_TYPE__TYPE_FP32;
    case MTS_DTYPE_FLOAT16: return INFERENCE__DATA_TYPE__TYPE_FP16;
    case MTS_DTYPE_BFLOAT16: return INFERENCE__DATA_TYPE__TYPE_BF16;
    case MTS_DTYPE_DOUBLE: return INFERENCE__DATA_TYPE__TYPE_FP64;
    case MTS_DTYPE_INT16: return INFERENCE__DATA_TYPE__TYPE_INT16;
    case MTS_DTYPE_UINT16: return INFERENCE__DATA_TYPE__TYPE_UINT16;
    case MTS_DTYPE_UINT32: return INFERENCE__DATA_TYPE__TYPE_UINT32;
    case MTS_DTYPE_UINT64: return INFERENCE__DATA_TYPE__TYPE_UINT64;
    case MTS_DTYPE_STRINGS: return INFERENCE__DATA_TYPE__TYPE_STRING;
    default: return INFERENCE__DATA_TYPE__TYPE_INVALID;
    }
}

enum { META_METADATA, META_CONFIG, META_LOAD };

static void send_metadata(mts__grpc_call *c, const char *model, int kind)
{
    mts_model_status st;
    char buf[300];
    if (mts_server_model_status_by_name(c->srv, model, &st)) {
        mts__grpc_fail_status(c, MTS_ENOTFOUND, mts_proto_unknown_model(buf, sizeof buf, model));
        return;
    }
    mts__grpc_arena a = {0};
    if (kind == META_METADATA) {
        char ver[16], *versions[1] = {ver};
        snprintf(ver, sizeof ver, "%d", st.model_version);
        Inference__ModelMetadataResponse r = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
        r.name = st.name;
        r.n_versions = 1;
        r.versions = versions;
        r.platform = "onnxruntime_onnx";
        Inference__ModelMetadataResponse__TensorMetadata **tm[2];
        for (int side = 0; side < 2; side++) {
            int n = side ? st.n_outputs : st.n_inputs;
            const mts_tensor_meta *metas = side ? st.outputs : st.inputs;
            tm[side] = mts__grpc_alloc(&a, sizeof *tm[side] * (size_t)(n + 1));
            for (int i = 0; i < n; i++) {
                Inference__ModelMetadataResponse__TensorMetadata *t =
                    MTS__GRPC_NEW(&a, Inference__ModelMetadataResponse__TensorMetadata,
                                  INFERENCE__MODEL_METADATA_RESPONSE__TENSOR_METADATA__INIT);
                t->name = (char *)metas[i].name;
                const char *dt = mts_kserve_datatype(metas[i].dtype);
                t->datatype = (char *)(dt ? dt : "UNKNOWN");
                t->n_shape = (size_t)metas[i].rank;
                t->shape = (int64_t *)metas[i].dims;
                tm[side][i] = t;
            }
        }
        r.n_inputs = (size_t)st.n_inputs;
        r.inputs = tm[0];
        r.n_outputs = (size_t)st.n_outputs;
        r.outputs = tm[1];
        mts__grpc_reply(c, &r.base);
    } else {
        const mts_config *cfg = mts_server_config(c->srv);
        const mts_model_config *mc = mts_config_find_model(cfg, model);
        /* max_batch_size 0 (config.pbtxt): the leading dimension is the model's own */
        bool batchable = st.n_inputs > 0 && st.inputs[0].rank > 0 && st.inputs[0].dims[0] < 0 && !st.no_batching &&
                         !mts_bytes_status_has_strings(&st); /* string models run unbatched */
        Inference__ModelConfig *mcfg = MTS__GRPC_NEW(&a, Inference__ModelConfig, INFERENCE__MODEL_CONFIG__INIT);
        mcfg->name = st.name;
        mcfg->platform = "onnxruntime_onnx";
        mcfg->backend = "mtserve";
        mcfg->max_batch_size = batchable ? st.max_batch : 0;
        int skip = batchable ? 1 : 0;
        mcfg->n_input = (size_t)st.n_inputs;
        mcfg->input = mts__grpc_alloc(&a, sizeof *mcfg->input * (size_t)(st.n_inputs + 1));
        for (int i = 0; i < st.n_inputs; i++) {
            Inference__ModelInput *in = MTS__GRPC_NEW(&a, Inference__ModelInput, INFERENCE__MODEL_INPUT__INIT);
            in->name = st.inputs[i].name;
            in->data_type = config_datatype(st.inputs[i].dtype);
            in->n_dims = st.inputs[i].rank > skip ? (size_t)(st.inputs[i].rank - skip) : 0;
            in->dims = st.inputs[i].dims + (st.inputs[i].rank > skip ? skip : 0);
            mcfg->input[i] = in;
        }
        mcfg->n_output = (size_t)st.n_outputs;
        mcfg->output = mts__grpc_alloc(&a, sizeof *mcfg->output * (size_t)(st.n_outputs + 1));
        for (int i = 0; i < st.n_outputs; i++) {
            Inference__ModelOutput *out = MTS__GRPC_NEW(&a, Inference__ModelOutput, INFERENCE__MODEL_OUTPUT__INIT);
            out->name = st.outputs[i].name;
            out->data_type = config_datatype(st.outputs[i].dtype);
            out->n_dims = st.outputs[i].rank > skip ? (size_t)(st.outputs[i].rank - skip) : 0;
            out->dims = st.outputs[i].dims + (st.outputs[i].rank > skip ? skip : 0);
            mcfg->output[i] = out;
        }
        Inference__ModelInstanceGroup *ig =
            MTS__GRPC_NEW(&a, Inference__ModelInstanceGroup, INFERENCE__MODEL_INSTANCE_GROUP__INIT);
        ig->kind = INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_CPU;
        ig->count = mc && mc->instances > 0 ? mc->instances : cfg->workers_per_device;
        mcfg->n_instance_group = 1;
        mcfg->instance_group = mts__grpc_alloc(&a, sizeof *mcfg->instance_group);
        mcfg->instance_group[0] = ig;
        mcfg->dynamic_batching =
            MTS__GRPC_NEW(&a, Inference__ModelDynamicBatching, INFERENCE__MODEL_DYNAMIC_BATCHING__INIT);
        mcfg->dynamic_batching->max_queue_delay_microseconds =
            mc && mc->max_queue_delay_us > 0 ? (uint64_t)mc->max_queue_delay_us : 0;
        mcfg->model_transaction_policy =
            MTS__GRPC_NEW(&a, Inference__ModelTransactionPolicy, INFERENCE__MODEL_TRANSACTION_POLICY__INIT);
        char qs[32];
        snprintf(qs, sizeof qs, "%d", mc ? mc->queue_size : 0);
        const char *keys[] = {"model_path", "pin", "preload", "queue_size"};
        const char *vals[] = {mc && mc->model_path ? mc->model_path : "", mc && mc->pin ? "true" : "false",
                              mc && mc->preload ? "true" : "false", qs};
        mcfg->n_parameters = 4;
        mcfg->parameters = mts__grpc_alloc(&a, sizeof *mcfg->parameters * 4);
        for (int i = 0; i < 4; i++) {
            Inference__ModelConfig__ParametersEntry *e = MTS__GRPC_NEW(&a, Inference__ModelConfig__ParametersEntry,
                                                                       INFERENCE__MODEL_CONFIG__PARAMETERS_ENTRY__INIT);
            e->key = (char *)keys[i];
            e->value = MTS__GRPC_NEW(&a, Inference__ModelParameter, INFERENCE__MODEL_PARAMETER__INIT);
            e->value->string_value = mts__grpc_strdup(&a, vals[i]);
            mcfg->parameters[i] = e;
        }
        Inference__ModelConfigResponse r = INFERENCE__MODEL_CONFIG_RESPONSE__INIT;
        r.config = mcfg;
        mts__grpc_reply(c, &r.base);
    }
    mts__grpc_arena_free(&a);
}

typedef struct meta_call {
    mts__grpc_call *call;
    int kind;
    char model[256];
} meta_call;

static void meta_loaded(void *user, int status, const char *msg)
{
    meta_call *mc = user;
    if (status) mts__grpc_fail_status(mc->call, status, msg);
    else if (mc->kind == META_LOAD) mts__grpc_reply(mc->call, NULL);
    else send_metadata(mc->call, mc->model, mc->kind);
    mts__grpc_call_unref(mc->call);
    free(mc);
}

/* Metadata needs the model's signature, known once it has been loaded; an unloaded model is
 * loaded first (asynchronously), as its first request would. */
static void meta_or_load(mts__grpc_call *c, const char *model, int kind, bool force)
{
    mts_model_status st;
    char buf[300];
    if (mts_server_model_status_by_name(c->srv, model, &st)) {
        mts__grpc_fail_status(c, MTS_ENOTFOUND, mts_proto_unknown_model(buf, sizeof buf, model));
        return;
    }
    if (kind != META_LOAD && st.n_inputs > 0) {
        send_metadata(c, model, kind);
        return;
    }
    meta_call *mc = calloc(1, sizeof *mc);
    if (!mc) {
        mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    mc->call = c;
    mc->kind = kind;
    snprintf(mc->model, sizeof mc->model, "%s", model);
    mts__grpc_call_ref(c);
    mts_err err = {0};
    int rc = mts_server_load(c->srv, model, force, meta_loaded, mc, &err);
    if (rc) {
        mts__grpc_fail_status(c, rc, err.msg);
        mts__grpc_call_unref(c);
        free(mc);
    }
}

static void model_metadata(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    char *name = unpack_name(c, data, len);
    if (!name) return;
    meta_or_load(c, name, META_METADATA, false);
    free(name);
}

static void model_config(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    char *name = unpack_name(c, data, len);
    if (!name) return;
    meta_or_load(c, name, META_CONFIG, false);
    free(name);
}

/* ---- statistics ---- */

static Inference__StatisticDuration *dur(mts__grpc_arena *a, const mts_duration_stat *d)
{
    Inference__StatisticDuration *s = MTS__GRPC_NEW(a, Inference__StatisticDuration, INFERENCE__STATISTIC_DURATION__INIT);
    s->count = d->count;
    s->ns = d->ns;
    return s;
}

static Inference__ModelStatistics *model_stats(mts__grpc_arena *a, const mts_model_status *st)
{
    Inference__ModelStatistics *m = MTS__GRPC_NEW(a, Inference__ModelStatistics, INFERENCE__MODEL_STATISTICS__INIT);
    m->name = mts__grpc_strdup(a, st->name);
    char ver[16];
    snprintf(ver, sizeof ver, "%d", st->model_version);
    m->version = mts__grpc_strdup(a, ver);
    m->last_inference = (uint64_t)st->last_used_ms;
    m->inference_count = st->inference_count;
    m->execution_count = st->execution_count;
    Inference__InferStatistics *is = MTS__GRPC_NEW(a, Inference__InferStatistics, INFERENCE__INFER_STATISTICS__INIT);
    mts_duration_stat zero = {0, 0};
    is->success = dur(a, &st->success);
    is->fail = dur(a, &st->fail);
    is->queue = dur(a, &st->queue);
    is->compute_input = dur(a, &st->compute_input);
    is->compute_infer = dur(a, &st->compute_infer);
    is->compute_output = dur(a, &st->compute_output);
    is->cache_hit = dur(a, &zero);
    is->cache_miss = dur(a, &zero);
    m->inference_stats = is;
    m->batch_stats = mts__grpc_alloc(a, sizeof *m->batch_stats * (MTS_MAX_BATCH_STATS + 1));
    for (int b = 1; b <= MTS_MAX_BATCH_STATS; b++) {
        if (!st->batch_infer[b].count) continue;
        Inference__InferBatchStatistics *bs =
            MTS__GRPC_NEW(a, Inference__InferBatchStatistics, INFERENCE__INFER_BATCH_STATISTICS__INIT);
        bs->batch_size = (uint64_t)b;
        bs->compute_infer = dur(a, &st->batch_infer[b]);
        m->batch_stats[m->n_batch_stats++] = bs;
    }
    if (st->device >= 0) {
        Inference__MemoryUsage *mu = MTS__GRPC_NEW(a, Inference__MemoryUsage, INFERENCE__MEMORY_USAGE__INIT);
        mu->type = "CPU";
        mu->id = st->device;
        mu->byte_size = (uint64_t)st->memory_bytes;
        m->n_memory_usage = 1;
        m->memory_usage = mts__grpc_alloc(a, sizeof *m->memory_usage);
        m->memory_usage[0] = mu;
    }
    return m;
}

static void model_statistics(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    char *name = unpack_name(c, data, len);
    if (!name) return;
    mts__grpc_arena a = {0};
    Inference__ModelStatisticsResponse r = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
    mts_model_status *st = malloc(sizeof *st);
    if (!st) {
        mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        free(name);
        return;
    }
    if (name[0]) {
        char buf[300];
        if (mts_server_model_status_by_name(c->srv, name, st)) {
            mts__grpc_fail_status(c, MTS_ENOTFOUND, mts_proto_unknown_model(buf, sizeof buf, name));
            goto out;
        }
        r.model_stats = mts__grpc_alloc(&a, sizeof *r.model_stats);
        r.model_stats[r.n_model_stats++] = model_stats(&a, st);
    } else {
        int n = mts_server_model_count(c->srv);
        r.model_stats = mts__grpc_alloc(&a, sizeof *r.model_stats * (size_t)(n + 1));
        for (int i = 0; i < n; i++)
            if (!mts_server_model_status(c->srv, i, st)) r.model_stats[r.n_model_stats++] = model_stats(&a, st);
    }
    mts__grpc_reply(c, &r.base);
out:
    mts__grpc_arena_free(&a);
    free(st);
    free(name);
}

/* ---- repository ---- */

static void repository_index(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    Inference__RepositoryIndexRequest *m = inference__repository_index_request__unpack(NULL, len, data);
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "malformed inference.RepositoryIndexRequest");
        return;
    }
    bool ready_only = m->ready;
    inference__repository_index_request__free_unpacked(m, NULL);
    mts__grpc_arena a = {0};
    Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    int n = mts_server_model_count(c->srv);
    r.models = mts__grpc_alloc(&a, sizeof *r.models * (size_t)(n + 1));
    mts_model_status *st = malloc(sizeof *st);
    for (int i = 0; st && i < n; i++) {
        if (mts_server_model_status(c->srv, i, st)) continue;
        if (ready_only && st->state != MTS_MODEL_READY) continue;
        Inference__RepositoryIndexResponse__ModelIndex *mi = MTS__GRPC_NEW(
            &a, Inference__RepositoryIndexResponse__ModelIndex, INFERENCE__REPOSITORY_INDEX_RESPONSE__MODEL_INDEX__INIT);
        mi->name = mts__grpc_strdup(&a, st->name);
        char ver[16];
        snprintf(ver, sizeof ver, "%d", st->model_version);
        mi->version = mts__grpc_strdup(&a, ver);
        mi->state = (char *)mts_model_state_name(st->state);
        mi->reason = mts__grpc_strdup(&a, st->reason);
        r.models[r.n_models++] = mi;
    }
    free(st);
    mts__grpc_reply(c, &r.base);
    mts__grpc_arena_free(&a);
}

static bool repo_bool_param(Inference__RepositoryModelLoadRequest__ParametersEntry **p, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(p[i]->key, key) && p[i]->value &&
            p[i]->value->parameter_choice_case == INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)
            return p[i]->value->bool_param;
    return false;
}

static void repository_load(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    Inference__RepositoryModelLoadRequest *m = inference__repository_model_load_request__unpack(NULL, len, data);
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "malformed inference.RepositoryModelLoadRequest");
        return;
    }
    if (!m->model_name[0]) mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "model_name is required");
    else meta_or_load(c, m->model_name, META_LOAD, repo_bool_param(m->parameters, m->n_parameters, "force_reload"));
    inference__repository_model_load_request__free_unpacked(m, NULL);
}

static void unload_done(void *user, int status, const char *msg)
{
    mts__grpc_call *c = user;
    if (status) mts__grpc_fail_status(c, status, msg);
    else mts__grpc_reply(c, NULL);
    mts__grpc_call_unref(c);
}

static void repository_unload(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    Inference__RepositoryModelUnloadRequest *m = inference__repository_model_unload_request__unpack(NULL, len, data);
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "malformed inference.RepositoryModelUnloadRequest");
        return;
    }
    char buf[300];
    if (!mts_server_has_model(c->srv, m->model_name)) {
        mts__grpc_fail_status(c, MTS_ENOTFOUND, mts_proto_unknown_model(buf, sizeof buf, m->model_name));
    } else {
        mts__grpc_call_ref(c);
        mts_err err = {0};
        int rc = mts_server_unload(c->srv, m->model_name, unload_done, c, &err);
        if (rc) {
            mts__grpc_fail_status(c, rc, err.msg);
            mts__grpc_call_unref(c);
        }
    }
    inference__repository_model_unload_request__free_unpacked(m, NULL);
}

#define KS "/inference.GRPCInferenceService/"
const mts__grpc_method mts__grpc_kserve_methods[] = {
    {KS "ServerLive", false, server_live, NULL, NULL, NULL, MTS_SCOPE_OPEN, false, 0},
    {KS "ServerReady", false, server_ready, NULL, NULL, NULL, MTS_SCOPE_OPEN, false, 0},
    {KS "ServerMetadata", false, server_metadata, NULL, NULL, NULL, MTS_SCOPE_INFER, false, 0},
    {KS "ModelReady", false, model_ready, NULL, NULL, NULL, MTS_SCOPE_INFER, false, 0},
    {KS "ModelMetadata", false, model_metadata, NULL, NULL, NULL, MTS_SCOPE_INFER, false, 0},
    {KS "ModelConfig", false, model_config, NULL, NULL, NULL, MTS_SCOPE_INFER, false, 0},
    {KS "ModelInfer", false, model_infer, NULL, model_infer_cancel, NULL, MTS_SCOPE_INFER, true, 1},
    {KS "ModelStreamInfer", true, stream_message, stream_half_close, stream_cancel, stream_state_free,
     MTS_SCOPE_INFER, false, 0},
    {KS "ModelStatistics", false, model_statistics, NULL, NULL, NULL, MTS_SCOPE_INFER, false, 0},
    {KS "RepositoryIndex", false, repository_index, NULL, NULL, NULL, MTS_SCOPE_INFER, false, 0},
    {KS "RepositoryModelLoad", false, repository_load, NULL, NULL, NULL, MTS_SCOPE_ADMIN, false, 0},
    {KS "RepositoryModelUnload", false, repository_unload, NULL, NULL, NULL, MTS_SCOPE_ADMIN, false, 0},
    {NULL, false, NULL, NULL, NULL, NULL, 0, false, 0},
};
