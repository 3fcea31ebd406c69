/*
 * KServe v2 REST routes (the Open Inference Protocol as Triton and KServe clients speak it).
 *
 *   GET  /v2/health/live | /v2/health/ready          GET /v2
 *   GET  /v2/models/{m}[/versions/{v}][/ready|/config|/stats]          GET /v2/models/stats
 *   POST /v2/models/{m}[/versions/{v}]/infer
 *   POST /v2/repository/index | /v2/repository/models/{m}/load | .../unload
 *   GET|POST /v2/logging     GET|POST /v2/trace/setting | /v2/models/{m}/trace/setting
 *
 * The routes are the table mts_kserve_routes (router.h); the REST front end (rest.c) serves it
 * beside the other REST modules' tables and answers unknown paths and methods.
 * Inference requests are parsed on the I/O thread into an mts_request whose input tensors point
 * into the request body (binary extension) or into buffers flattened from JSON data; the reply
 * is encoded on the worker thread that completes the request. Every malformed request gets a
 * 400 with a message naming the field (and input) at fault; a full queue answers 429 with
 * Retry-After at once; a client that disconnects cancels its queued request.
 */
#include "api/kserve_http.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/bytes_tensor.h"
#include "api/embed_common.h"
#include "api/embed_http.h"
#include "api/protocol.h"
#include "util/json.h"
#include "util/log.h"

/* ---- responses ---- */

static void respond_json(mts_http_conn *c, int status, const char *extra, mts_jw *w)
{
    size_t len = 0;
    char *text = mts_jw_take(w, &len);
    if (!text) {
        mts_http_respond(c, mts_proto_http_status(MTS_ENOMEM), "application/json", NULL,
                         "{\"error\":\"response encoding failed\"}", 36);
        return;
    }
    mts_http_respond(c, status, "application/json", extra, text, len);
    free(text);
}

static void respond_unknown_model(mts_http_conn *c, const char *model)
{
    char m[300];
    mts_route_error_text(c, MTS_ENOTFOUND, mts_proto_unknown_model(m, sizeof m, model), 0);
}

/* Parses an optional JSON object body (repository requests); answers 400 itself and returns
 * NULL when it is malformed; *empty is set when there is no body. */
static mts_json_doc *parse_small_body(mts_http_conn *c, const mts_http_req *hr, bool *empty)
{
    *empty = hr->body_len == 0;
    if (*empty) return NULL;
    mts_json_doc *doc = NULL;
    mts_err err = {0};
    if (mts_json_parse(hr->body, hr->body_len, &doc, &err)) {
        char m[600];
        snprintf(m, sizeof m, "invalid JSON: %s", err.msg);
        mts_route_error_text(c, MTS_EINVAL, m, 0);
        return NULL;
    }
    return doc;
}

static void respond_empty(mts_http_conn *c, int status)
{
    mts_http_respond(c, status, "application/json", NULL, "", 0);
}

/* ---- inference ---- */

typedef struct infer_call {
    mts_request req;
    mts_server *srv;
    mts_http_conn *conn;
    mts_json_doc *doc;
    void *owned[MTS_REQ_MAX_TENSORS]; /* flattened JSON data / realigned binary data / string blobs */
    void *out_bin[MTS_REQ_MAX_TENSORS]; /* string outputs in the binary BYTES form */
    size_t out_bin_len[MTS_REQ_MAX_TENSORS];
    bool binary_out_default;
    bool binary_out[MTS_REQ_MAX_TENSORS]; /* per requested output */
    bool binary_out_set[MTS_REQ_MAX_TENSORS];
    const char *id; /* points into doc */
    char model[256];
    int version;         /* the model's served version (for model_version) */
    char *response_json; /* JSON header of a binary response, until it is written */
} infer_call;

static void call_free(infer_call *ic)
{
    for (int i = 0; i < MTS_REQ_MAX_TENSORS; i++) {
        free(ic->owned[i]);
        free(ic->out_bin[i]);
    }
    mts_json_free(ic->doc);
    free(ic->response_json);
    free(ic);
}

/* Runs on the connection's I/O thread once the response is written (or the connection died).
 * Freeing the call here, not on the worker, serializes it with on_cancel, which runs on the same
 * I/O thread and touches the call. */
static void response_sent(void *arg)
{
    infer_call *ic = arg;
    mts_request_release(&ic->req);
    call_free(ic);
}

static bool wants_binary(const infer_call *ic, const char *name)
{
    for (int k = 0; k < ic->req.n_requested; k++)
        if (!strcmp(ic->req.requested[k], name) && ic->binary_out_set[k]) return ic->binary_out[k];
    return ic->binary_out_default;
}

/* Sends the JSON text of w, followed by the binary outputs when with_binary, without copying
 * the outputs; everything is released by response_sent. */
static void respond_call(infer_call *ic, int http_status, const char *type, const char *extra, mts_jw *w,
                         bool with_binary)
{
    size_t jlen = 0;
    char *json = mts_jw_take(w, &jlen);
    mts_jw_free(w);
    if (!json) {
        mts_server_request_answered(ic->srv, &ic->req);
        static const char oom[] = "{\"error\":\"out of memory encoding the response\"}";
        struct iovec one = {(void *)oom, sizeof oom - 1};
        mts_http_respondv(ic->conn, mts_proto_http_status(MTS_ENOMEM), "application/json", NULL, &one, 1,
                          response_sent, ic);
        return;
    }
    ic->response_json = json;
    mts_server_request_answered(ic->srv, &ic->req);
    struct iovec iov[MTS_REQ_MAX_TENSORS + 1];
    int n = 0;
    iov[n++] = (struct iovec){json, jlen};
    for (int o = 0; with_binary && o < ic->req.n_outputs; o++)
        if (wants_binary(ic, ic->req.output_names[o])) {
            if (ic->req.outputs[o].dtype == MTS_DTYPE_STRINGS)
                iov[n++] = (struct iovec){ic->out_bin[o], ic->out_bin_len[o]};
            else
                iov[n++] = (struct iovec){ic->req.outputs[o].data, (size_t)mts_tensor_nbytes(&ic->req.outputs[o])};
        }
    mts_http_respondv(ic->conn, http_status, type, extra, iov, n, response_sent, ic);
}

/* String outputs: their shapes and strings into str[], and the binary form of those asked for
 * in binary; a string that is not UTF-8 cannot be a JSON string, so asking for it as JSON is
 * refused (binary carries any bytes). Returns a status with msg. */
static int string_outputs(infer_call *ic, mts_bytes_out *str, char *msg, size_t len)
{
    mts_request *req = &ic->req;
    for (int o = 0; o < req->n_outputs; o++) {
        if (req->outputs[o].dtype != MTS_DTYPE_STRINGS) continue;
        if (mts_bytes_out_view(req->output_names[o], &req->outputs[o], &str[o], msg, len)) return MTS_EIO;
        if (wants_binary(ic, req->output_names[o])) {
            ic->out_bin_len[o] = mts_bytes_out_binary_size(&str[o]);
            if (!(ic->out_bin[o] = malloc(ic->out_bin_len[o] ? ic->out_bin_len[o] : 1))) {
                snprintf(msg, len, "out of memory encoding output '%s'", req->output_names[o]);
                return MTS_ENOMEM;
            }
            mts_bytes_out_binary(&str[o], ic->out_bin[o]);
            continue;
        }
        int64_t bad = mts_bytes_out_non_utf8(&str[o]);
        if (bad >= 0) {
            snprintf(msg, len, "output '%s': string %lld is not valid UTF-8, which a JSON string cannot carry; ask "
                     "for the output in binary (parameters.binary_data or binary_data_output)", req->output_names[o],
                     (long long)bad);
            return MTS_EINVAL;
        }
    }
    return MTS_OK;
}

static void infer_done(mts_request *req, int status, const char *msg)
{
    infer_call *ic = (infer_call *)req;
    mts_bytes_out str[MTS_REQ_MAX_TENSORS];
    char smsg[512];
    if (!status && (status = string_outputs(ic, str, smsg, sizeof smsg)) != 0) msg = smsg;
    if (status) {
        mts_jw e;
        mts_jw_init(&e);
        mts_jw_begin_object(&e);
        mts_jw_key(&e, "error");
        mts_jw_string(&e, msg ? msg : mts_status_text(status));
        mts_jw_end_object(&e);
        char extra[64] = "";
        if (status == MTS_EFULL) snprintf(extra, sizeof extra, "Retry-After: 1\r\n");
        respond_call(ic, mts_proto_http_status(status), "application/json", extra[0] ? extra : NULL, &e, false);
        return;
    }
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    if (ic->id && ic->id[0]) {
        mts_jw_key(&w, "id");
        mts_jw_string(&w, ic->id);
    }
    mts_jw_key(&w, "model_name");
    mts_jw_string(&w, ic->model);
    mts_jw_key(&w, "model_version");
    char ver[16];
    snprintf(ver, sizeof ver, "%d", ic->version);
    mts_jw_string(&w, ver);
    mts_jw_key(&w, "parameters");
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "queue_ms");
    mts_jw_double(&w, req->queue_ms);
    mts_jw_key(&w, "compute_ms");
    mts_jw_double(&w, req->compute_ms);
    mts_jw_key(&w, "batch_size");
    mts_jw_int(&w, req->batch_size);
    mts_jw_key(&w, "device");
    mts_jw_int(&w, req->device);
    mts_jw_key(&w, "cold_start");
    mts_jw_bool(&w, req->cold);
    mts_jw_end_object(&w);
    mts_jw_key(&w, "outputs");
    mts_jw_begin_array(&w);
    size_t binary_total = 0;
    for (int o = 0; o < req->n_outputs; o++) {
        const mts_tensor *t = &req->outputs[o];
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "name");
        mts_jw_string(&w, req->output_names[o]);
        mts_jw_key(&w, "datatype");
        mts_jw_string(&w, mts_kserve_datatype(t->dtype) ? mts_kserve_datatype(t->dtype) : "FP32");
        bool is_str = t->dtype == MTS_DTYPE_STRINGS;
        mts_jw_key(&w, "shape");
        mts_jw_begin_array(&w);
        for (int d = 0; d < (is_str ? str[o].rank : t->rank); d++) mts_jw_int(&w, is_str ? str[o].dims[d] : t->dims[d]);
        mts_jw_end_array(&w);
        if (wants_binary(ic, req->output_names[o])) {
            int64_t nb = is_str ? (int64_t)ic->out_bin_len[o] : mts_tensor_nbytes(t);
            mts_jw_key(&w, "parameters");
            mts_jw_begin_object(&w);
            mts_jw_key(&w, "binary_data_size");
            mts_jw_int(&w, nb);
            mts_jw_end_object(&w);
            binary_total += (size_t)nb;
        } else if (is_str) {
            mts_jw_key(&w, "data");
            mts_jw_begin_array(&w);
            for (int64_t i = 0; i < str[o].count; i++) {
                size_t n;
                const char *sp = mts_bytes_out_at(&str[o], i, &n);
                mts_jw_string_n(&w, sp, n);
            }
            mts_jw_end_array(&w);
        } else {
            mts_jw_key(&w, "data");
            mts_jw_tensor_data(&w, t->dtype, t->data, mts_tensor_numel(t));
        }
        mts_jw_end_object(&w);
    }
    mts_jw_end_array(&w);
    mts_jw_end_object(&w);
    if (binary_total == 0) {
        respond_call(ic, 200, "application/json", NULL, &w, false);
        return;
    } else {
        char extra[96];
        snprintf(extra, sizeof extra, "Inference-Header-Content-Length: %zu\r\n", w.len);
        respond_call(ic, 200, "application/octet-stream", extra, &w, true);
        return;
    }
    mts_jw_free(&w);
    mts_request_release(req);
    call_free(ic);
}

static int bool_param(const mts_json *params, const char *key, bool *out)
{
    const mts_json *v = mts_json_get(params, key);
    if (!v) return 0;
    if (mts_json_type(v) != MTS_JSON_BOOL) return -1;
    *out = mts_json_bool(v);
    return 1;
}

/* Parses the inference request; on error fills msg and returns a status. */
static int parse_infer(infer_call *ic, const mts_http_req *hr, char *msg, size_t len)
{
    const char *body = hr->body;
    size_t body_len = hr->body_len, json_len = body_len;
    const char *hcl = mts_http_header(hr, "Inference-Header-Content-Length");
    if (hcl) {
        char *end;
        long long v = strtoll(hcl, &end, 10);
        if (end == hcl || *end || v < 0 || (unsigned long long)v > body_len) {
            snprintf(msg, len, "Inference-Header-Content-Length '%s' is not a length within the %zu-byte body", hcl,
                     body_len);
            return MTS_EINVAL;
        }
        if (v == 0) {
            snprintf(msg, len, "raw binary requests (Inference-Header-Content-Length: 0) are not supported; send a "
                               "JSON header describing the inputs");
            return MTS_EINVAL;
        }
        json_len = (size_t)v;
    }
    mts_err err = {0};
    if (mts_json_parse(body, json_len, &ic->doc, &err)) {
        snprintf(msg, len, "invalid JSON in the request: %s", err.msg);
        return MTS_EINVAL;
    }
    const mts_json *root = mts_json_root(ic->doc);
    if (mts_json_type(root) != MTS_JSON_OBJECT) {
        snprintf(msg, len, "the request must be a JSON object");
        return MTS_EINVAL;
    }
    const mts_json *id = mts_json_get(root, "id");
    if (id) {
        const char *s = mts_json_str(id, NULL);
        if (!s) {
            snprintf(msg, len, "'id' must be a string");
            return MTS_EINVAL;
        }
        ic->id = s;
    }
    const mts_json *params = mts_json_get(root, "parameters");
    if (params && mts_json_type(params) != MTS_JSON_OBJECT) {
        snprintf(msg, len, "'parameters' must be an object");
        return MTS_EINVAL;
    }
    if (bool_param(params, "binary_data_output", &ic->binary_out_default) < 0) {
        snprintf(msg, len, "parameter 'binary_data_output' must be a bool");
        return MTS_EINVAL;
    }
    const mts_json *timeout = mts_json_get(params, "timeout");
    if (timeout) {
        int64_t t;
        if (mts_json_int(timeout, &t) || t < 0) {
            snprintf(msg, len, "parameter 'timeout' must be a non-negative integer (microseconds)");
            return MTS_EINVAL;
        }
        ic->req.timeout_us = t;
    }
    const mts_json *priority = mts_json_get(params, "priority");
    if (priority) {
        int64_t pr = -1;
        if (mts_json_int(priority, &pr)) pr = -1; /* not an integer: refused with the range */
        if (mts_request_set_priority(&ic->req, pr, msg, len)) return MTS_EINVAL;
    }
    const mts_json *inputs = mts_json_get(root, "inputs");
    if (mts_json_type(inputs) != MTS_JSON_ARRAY || mts_json_len(inputs) == 0) {
        snprintf(msg, len, "'inputs' must be a non-empty array");
        return MTS_EINVAL;
    }
    if (mts_json_len(inputs) > MTS_REQ_MAX_TENSORS) {
        snprintf(msg, len, "too many inputs (%zu, at most %d)", mts_json_len(inputs), MTS_REQ_MAX_TENSORS);
        return MTS_EINVAL;
    }
    size_t bin_off = json_len;
    for (size_t i = 0; i < mts_json_len(inputs); i++) {
        const mts_json *in = mts_json_at(inputs, i);
        const char *name = mts_json_str(mts_json_get(in, "name"), NULL);
        if (!name) {
            snprintf(msg, len, "inputs[%zu]: 'name' (a string) is required", i);
            return MTS_EINVAL;
        }
        const char *dt = mts_json_str(mts_json_get(in, "datatype"), NULL);
        mts_tensor *t = &ic->req.inputs[i];
        if (!dt) {
            snprintf(msg, len, "input '%s': 'datatype' (a string such as \"FP32\") is required", name);
            return MTS_EINVAL;
        }
        const mts_json *shape = mts_json_get(in, "shape");
        if (mts_json_type(shape) != MTS_JSON_ARRAY) {
            snprintf(msg, len, "input '%s': 'shape' (an array of dimensions) is required", name);
            return MTS_EINVAL;
        }
        int64_t dims[MTS_MAX_RANK];
        size_t rank = mts_json_len(shape);
        for (size_t d = 0; d < rank && d < MTS_MAX_RANK; d++)
            if (mts_json_int(mts_json_at(shape, d), &dims[d])) dims[d] = MTS_PROTO_DIM_INVALID;
        int rc = mts_proto_input_decl(&ic->req, name, dt, dims, rank, t, msg, len);
        if (rc) return rc;
        int64_t numel = mts_tensor_numel(t), nbytes = mts_tensor_nbytes(t);
        const mts_json *ip = mts_json_get(in, "parameters");
        const mts_json *bds = mts_json_get(ip, "binary_data_size");
        const mts_json *data = mts_json_get(in, "data");
        if (bds && data) {
            snprintf(msg, len, "input '%s' has both 'data' and parameters.binary_data_size; give one", name);
            return MTS_EINVAL;
        }
        if (bds) {
            int64_t size;
            if (mts_json_int(bds, &size) || size < 0) {
                snprintf(msg, len, "input '%s': binary_data_size must be a non-negative integer", name);
                return MTS_EINVAL;
            }
            if (!hcl) {
                snprintf(msg, len, "input '%s' has binary_data_size but the request has no "
                                   "Inference-Header-Content-Length header", name);
                return MTS_EINVAL;
            }
            bool is_str = t->dtype == MTS_DTYPE_STRINGS; /* BYTES: length-prefixed strings, any size */
            rc = is_str ? MTS_OK : mts_proto_input_count(name, t, dt, "binary_data_size is", size, "bytes", msg, len);
            if (rc) return rc;
            if ((uint64_t)size > body_len - bin_off) {
                snprintf(msg, len, "input '%s': the binary section is truncated (needs %lld bytes at offset %zu, "
                                   "the body has %zu)", name, (long long)size, bin_off, body_len);
                return MTS_EINVAL;
            }
            const char *p = body + bin_off;
            if (is_str) {
                rc = mts_bytes_in_binary(name, t, (const uint8_t *)p, (size_t)size, "the binary data",
                                         &ic->owned[i], msg, len);
                if (rc) return rc;
                bin_off += (size_t)size;
                ic->req.input_names[i] = name;
                ic->req.n_inputs++;
                continue;
            }
            size_t es = mts_dtype_size(t->dtype);
            if (((uintptr_t)p % es) != 0) { /* kernels read typed pointers: realign */
                ic->owned[i] = malloc(size ? (size_t)size : 1);
                if (!ic->owned[i]) {
                    snprintf(msg, len, "out of memory");
                    return MTS_ENOMEM;
                }
                memcpy(ic->owned[i], p, (size_t)size);
                p = ic->owned[i];
            }
            t->data = (void *)p;
            bin_off += (size_t)size;
        } else if (data && t->dtype == MTS_DTYPE_STRINGS) {
            rc = mts_bytes_in_json(name, t, data, &ic->owned[i], msg, len);
            if (rc) return rc;
        } else if (data) {
            rc = mts_proto_input_count(name, t, NULL, "data has", mts_json_numel(data), "elements", msg, len);
            if (rc) return rc;
            ic->owned[i] = malloc(nbytes ? (size_t)nbytes : 1);
            if (!ic->owned[i]) {
                snprintf(msg, len, "out of memory");
                return MTS_ENOMEM;
            }
            if (mts_json_flatten(data, t->dtype, ic->owned[i], numel, &err)) {
                snprintf(msg, len, "input '%s': %s", name, err.msg);
                return MTS_EINVAL;
            }
            t->data = ic->owned[i];
        } else {
            snprintf(msg, len, "input '%s' has neither 'data' nor parameters.binary_data_size", name);
            return MTS_EINVAL;
        }
        ic->req.input_names[i] = name;
        ic->req.n_inputs++;
    }
    if (hcl && bin_off != body_len) {
        snprintf(msg, len, "the binary section has %zu bytes that no input claims", body_len - bin_off);
        return MTS_EINVAL;
    }
    const mts_json *outputs = mts_json_get(root, "outputs");
    if (outputs) {
        if (mts_json_type(outputs) != MTS_JSON_ARRAY || mts_json_len(outputs) > MTS_REQ_MAX_TENSORS) {
            snprintf(msg, len, "'outputs' must be an array of at most %d objects", MTS_REQ_MAX_TENSORS);
            return MTS_EINVAL;
        }
        for (size_t k = 0; k < mts_json_len(outputs); k++) {
            const mts_json *o = mts_json_at(outputs, k);
            const char *name = mts_json_str(mts_json_get(o, "name"), NULL);
            if (!name) {
                snprintf(msg, len, "outputs[%zu]: 'name' (a string) is required", k);
                return MTS_EINVAL;
            }
            for (size_t j = 0; j < k; j++)
                if (!strcmp(ic->req.requested[j], name)) {
                    snprintf(msg, len, "output '%s' is requested twice", name);
                    return MTS_EINVAL;
                }
            int b = bool_param(mts_json_get(o, "parameters"), "binary_data", &ic->binary_out[k]);
            if (b < 0) {
                snprintf(msg, len, "output '%s': parameter 'binary_data' must be a bool", name);
                return MTS_EINVAL;
            }
            ic->binary_out_set[k] = b > 0;
            ic->req.requested[k] = name;
            ic->req.n_requested++;
        }
    }
    return MTS_OK;
}

int mts_kserve_http_check_infer(const mts_http_req *hr, char *msg, size_t len)
{
    infer_call *ic = calloc(1, sizeof *ic);
    if (!ic) {
        snprintf(msg, len, "out of memory");
        return MTS_ENOMEM;
    }
    int rc = parse_infer(ic, hr, msg, len);
    call_free(ic);
    return rc;
}

static void handle_infer(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const char *model)
{
    int64_t arrival = mts_server_clock_ns();
    if (!mts_server_has_model(srv, model)) {
        respond_unknown_model(c, model);
        return;
    }
    if (mts_embed_is_model(srv, model) && mts_embed_kserve_infer(srv, c, hr, model, arrival)) return; /* texts */
    infer_call *ic = calloc(1, sizeof *ic);
    if (!ic) {
        mts_route_error_text(c, MTS_ENOMEM, "out of memory", 0);
        return;
    }
    ic->conn = c;
    ic->srv = srv;
    ic->req.arrival_ns = arrival;
    ic->version = mts_server_model_version(srv, model);
    snprintf(ic->model, sizeof ic->model, "%s", model);
    ic->req.model = ic->model;
    ic->req.done = infer_done;
    /* this I/O thread may run a short batch itself (scheduler.c): the answer then comes back
     * inside the handler and goes out when it returns (http.c, inline responses) */
    ic->req.run_inline = true;
    char msg[512];
    int rc = parse_infer(ic, hr, msg, sizeof msg);
    if (rc) {
        mts_route_error_text(c, rc, msg, 0);
        call_free(ic);
        return;
    }
    hr->user = ic;
    int retry = 0;
    mts_err err = {0};
    rc = mts_server_submit(srv, &ic->req, &retry, &err);
    if (rc) {
        hr->user = NULL;
        mts_route_error_text(c, rc, err.msg, retry);
        call_free(ic);
    }
}

/* ---- metadata, config, statistics ---- */

/* config_style: model configuration fields (data_type, dims) else metadata (datatype, shape);
 * skip_batch: leave out the leading batch dimension (configuration of a batching model). */
static void write_tensor_meta(mts_jw *w, const mts_tensor_meta *m, bool config_style, bool skip_batch)
{
    mts_jw_begin_object(w);
    mts_jw_key(w, "name");
    mts_jw_string(w, m->name);
    const char *dt = mts_kserve_datatype(m->dtype);
    char type[32];
    snprintf(type, sizeof type, "TYPE_%s", m->dtype == MTS_DTYPE_STRINGS ? "STRING" : dt ? dt : "UNKNOWN");
    if (config_style) {
        mts_jw_key(w, "data_type");
        mts_jw_string(w, type);
        mts_jw_key(w, "dims");
    } else {
        mts_jw_key(w, "datatype");
        mts_jw_string(w, dt ? dt : "UNKNOWN");
        mts_jw_key(w, "shape");
    }
    mts_jw_begin_array(w);
    for (int d = skip_batch ? 1 : 0; d < m->rank; d++) mts_jw_int(w, m->dims[d]);
    mts_jw_end_array(w);
    mts_jw_end_object(w);
}

typedef struct meta_call {
    mts_server *srv;
    mts_http_conn *conn;
    char model[256];
    int kind; /* 0 metadata, 1 config, 2 load */
} meta_call;

static void send_metadata(mts_server *srv, mts_http_conn *c, const char *model, int kind)
{
    mts_model_status st;
    if (mts_server_model_status_by_name(srv, model, &st)) {
        respond_unknown_model(c, model);
        return;
    }
    const mts_config *cfg = mts_server_config(srv);
    const mts_model_config *mc = mts_config_find_model(cfg, model);
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "name");
    mts_jw_string(&w, st.name);
    if (kind == 0) {
        mts_jw_key(&w, "versions");
        mts_jw_begin_array(&w);
        char ver[16];
        snprintf(ver, sizeof ver, "%d", st.model_version);
        mts_jw_string(&w, ver);
        mts_jw_end_array(&w);
        mts_jw_key(&w, "platform");
        mts_jw_string(&w, "onnxruntime_onnx");
        mts_jw_key(&w, "inputs");
        mts_jw_begin_array(&w);
        for (int i = 0; i < st.n_inputs; i++) write_tensor_meta(&w, &st.inputs[i], false, false);
        mts_jw_end_array(&w);
        mts_jw_key(&w, "outputs");
        mts_jw_begin_array(&w);
        for (int i = 0; i < st.n_outputs; i++) write_tensor_meta(&w, &st.outputs[i], false, false);
        mts_jw_end_array(&w);
    } else {
        /* max_batch_size 0 (config.pbtxt): the leading dimension is the model's own */
        bool batchable = st.n_inputs > 0 && st.inputs[0].rank > 0 && st.inputs[0].dims[0] < 0 && !st.no_batching &&
                         !mts_bytes_status_has_strings(&st); /* string models run unbatched */
        mts_jw_key(&w, "platform");
        mts_jw_string(&w, "onnxruntime_onnx");
        mts_jw_key(&w, "backend");
        mts_jw_string(&w, "mtserve");
        mts_jw_key(&w, "max_batch_size");
        mts_jw_int(&w, batchable ? st.max_batch : 0);
        mts_jw_key(&w, "input");
        mts_jw_begin_array(&w);
        for (int i = 0; i < st.n_inputs; i++) write_tensor_meta(&w, &st.inputs[i], true, batchable);
        mts_jw_end_array(&w);
        mts_jw_key(&w, "output");
        mts_jw_begin_array(&w);
        for (int i = 0; i < st.n_outputs; i++) write_tensor_meta(&w, &st.outputs[i], true, batchable);
        mts_jw_end_array(&w);
        mts_jw_key(&w, "dynamic_batching");
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "max_queue_delay_microseconds");
        mts_jw_int(&w, mc ? mc->max_queue_delay_us : 0);
        mts_jw_end_object(&w);
        mts_jw_key(&w, "instance_group");
        mts_jw_begin_array(&w);
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "count");
        mts_jw_int(&w, mc && mc->instances > 0 ? mc->instances : cfg->workers_per_device);
        mts_jw_key(&w, "kind");
        mts_jw_string(&w, "KIND_CPU");
        mts_jw_end_object(&w);
        mts_jw_end_array(&w);
        mts_jw_key(&w, "parameters");
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "model_path");
        mts_jw_string(&w, mc ? mc->model_path : "");
        mts_jw_key(&w, "pin");
        mts_jw_bool(&w, mc && mc->pin);
        mts_jw_key(&w, "preload");
        mts_jw_bool(&w, mc && mc->preload);
        mts_jw_key(&w, "queue_size");
        mts_jw_int(&w, mc ? mc->queue_size : 0);
        mts_jw_end_object(&w);
    }
    mts_jw_end_object(&w);
    respond_json(c, 200, NULL, &w);
    mts_jw_free(&w);
}

static void meta_loaded(void *user, int status, const char *msg)
{
    meta_call *mc = user;
    if (mc->kind == 2) {
        if (status) mts_route_error_text(mc->conn, status == MTS_ENOTFOUND ? MTS_ENOTFOUND : MTS_EINVAL, msg, 0);
        else respond_empty(mc->conn, 200);
    } else if (status) {
        mts_route_error_text(mc->conn, MTS_EUNAVAILABLE, msg, 0);
    } else {
        send_metadata(mc->srv, mc->conn, mc->model, mc->kind);
    }
    free(mc);
}

/* Metadata needs the model's signature, known once it has been loaded; an unloaded model is
 * loaded first (asynchronously), as its first request would. */
static void handle_meta(mts_server *srv, mts_http_conn *c, const char *model, int kind, bool force)
{
    mts_model_status st;
    if (mts_server_model_status_by_name(srv, model, &st)) {
        respond_unknown_model(c, model);
        return;
    }
    if (kind != 2 && st.n_inputs > 0) {
        send_metadata(srv, c, model, kind);
        return;
    }
    meta_call *mc = calloc(1, sizeof *mc);
    if (!mc) {
        mts_route_error_text(c, MTS_ENOMEM, "out of memory", 0);
        return;
    }
    mc->srv = srv;
    mc->conn = c;
    mc->kind = kind;
    snprintf(mc->model, sizeof mc->model, "%s", model);
    mts_err err = {0};
    int rc = mts_server_load(srv, model, force, meta_loaded, mc, &err);
    if (rc) {
        mts_route_error_text(c, rc, err.msg, 0);
        free(mc);
    }
}

static void write_dur(mts_jw *w, const char *key, const mts_duration_stat *d)
{
    mts_jw_key(w, key);
    mts_jw_begin_object(w);
    mts_jw_key(w, "count");
    mts_jw_uint(w, d->count);
    mts_jw_key(w, "ns");
    mts_jw_uint(w, d->ns);
    mts_jw_end_object(w);
}

static void write_model_stats(mts_jw *w, const mts_model_status *st)
{
    mts_jw_begin_object(w);
    mts_jw_key(w, "name");
    mts_jw_string(w, st->name);
    mts_jw_key(w, "version");
    char ver[16];
    snprintf(ver, sizeof ver, "%d", st->model_version);
    mts_jw_string(w, ver);
    mts_jw_key(w, "state");
    mts_jw_string(w, mts_model_state_name(st->state));
    mts_jw_key(w, "last_inference");
    mts_jw_int(w, st->last_used_ms);
    mts_jw_key(w, "inference_count");
    mts_jw_uint(w, st->inference_count);
    mts_jw_key(w, "execution_count");
    mts_jw_uint(w, st->execution_count);
    mts_jw_key(w, "inference_stats");
    mts_jw_begin_object(w);
    write_dur(w, "success", &st->success);
    write_dur(w, "fail", &st->fail);
    write_dur(w, "queue", &st->queue);
    write_dur(w, "compute_input", &st->compute_input);
    write_dur(w, "compute_infer", &st->compute_infer);
    write_dur(w, "compute_output", &st->compute_output);
    mts_duration_stat zero = {0, 0};
    write_dur(w, "cache_hit", &zero);
    write_dur(w, "cache_miss", &zero);
    mts_jw_end_object(w);
    mts_jw_key(w, "batch_stats");
    mts_jw_begin_array(w);
    for (int b = 1; b <= MTS_MAX_BATCH_STATS; b++) {
        if (!st->batch_infer[b].count) continue;
        mts_jw_begin_object(w);
        mts_jw_key(w, "batch_size");
        mts_jw_int(w, b);
        write_dur(w, "compute_infer", &st->batch_infer[b]);
        mts_jw_end_object(w);
    }
    mts_jw_end_array(w);
    mts_jw_key(w, "memory_usage");
    mts_jw_begin_array(w);
    if (st->device >= 0) {
        mts_jw_begin_object(w);
        mts_jw_key(w, "type");
        mts_jw_string(w, "CPU");
        mts_jw_key(w, "id");
        mts_jw_int(w, st->device);
        mts_jw_key(w, "byte_size");
        mts_jw_int(w, st->memory_bytes);
        mts_jw_end_object(w);
    }
    mts_jw_end_array(w);
    /* The registry statistics of the lip-sync deployment's API. */
    mts_jw_key(w, "UsageCount");
    mts_jw_uint(w, st->usage_count);
    mts_jw_key(w, "LastUsed");
    mts_jw_int(w, st->last_used_ms);
    mts_jw_key(w, "TotalInferenceMs");
    mts_jw_double(w, st->total_inference_ms);
    mts_jw_key(w, "MemoryBytes");
    mts_jw_int(w, st->memory_bytes);
    mts_jw_key(w, "LoadedAt");
    mts_jw_int(w, st->loaded_at_ms);
    mts_jw_key(w, "queue_depth");
    mts_jw_int(w, st->queue_depth);
    mts_jw_key(w, "loads");
    mts_jw_uint(w, st->loads);
    mts_jw_key(w, "evictions");
    mts_jw_uint(w, st->evictions);
    mts_jw_key(w, "load_failures");
    mts_jw_uint(w, st->load_failures);
    mts_jw_key(w, "last_load_ms");
    mts_jw_double(w, st->last_load_ms);
    if (st->precision[0]) { /* resident: the arithmetic it runs in and why */
        mts_jw_key(w, "precision");
        mts_jw_string(w, st->precision);
        mts_jw_key(w, "precision_requested");
        mts_jw_string(w, st->precision_requested);
        mts_jw_key(w, "precision_reason");
        mts_jw_string(w, st->precision_reason);
        mts_jw_key(w, "precision_guard_error");
        if (st->guard_error >= 0) mts_jw_double(w, st->guard_error);
        else mts_jw_null(w);
    }
    /* intra-op team sizes of the batches run, and an embedding model's policy in force */
    mts_jw_key(w, "team_sizes");
    mts_jw_begin_object(w);
    for (int t = 1; t <= MTS_TEAM_STATS; t++) {
        if (!st->team_batches[t]) continue;
        char key[16];
        snprintf(key, sizeof key, "%d%s", t, t == MTS_TEAM_STATS ? "+" : "");
        mts_jw_key(w, key);
        mts_jw_uint(w, st->team_batches[t]);
    }
    mts_jw_end_object(w);
    mts_jw_key(w, "threads_set_batches");
    mts_jw_uint(w, st->hinted_batches);
    mts_jw_key(w, "padding_free_batches");
    mts_jw_uint(w, st->padfree_batches);
    mts_jw_key(w, "padding_rows_skipped");
    mts_jw_uint(w, st->padding_rows_skipped);
    if (st->embedding_policy[0]) {
        mts_jw_key(w, "embedding_policy");
        mts_jw_string(w, st->embedding_policy);
        mts_jw_key(w, "policy_sub_batches");
        mts_jw_uint(w, st->alone_batches);
    }
    mts_jw_end_object(w);
}

static void handle_stats(mts_server *srv, mts_http_conn *c, const char *model)
{
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "model_stats");
    mts_jw_begin_array(&w);
    mts_model_status st;
    if (model) {
        if (mts_server_model_status_by_name(srv, model, &st)) {
            mts_jw_free(&w);
            respond_unknown_model(c, model);
            return;
        }
        write_model_stats(&w, &st);
    } else {
        for (int i = 0; i < mts_server_model_count(srv); i++)
            if (!mts_server_model_status(srv, i, &st)) write_model_stats(&w, &st);
    }
    mts_jw_end_array(&w);
    if (!model) {
        mts_jw_key(&w, "devices");
        mts_jw_begin_array(&w);
        for (int d = 0; d < mts_server_device_count(srv); d++) {
            mts_device_status ds;
            mts_server_device_status(srv, d, &ds);
            mts_jw_begin_object(&w);
            mts_jw_key(&w, "id");
            mts_jw_int(&w, d);
            mts_jw_key(&w, "kind");
            mts_jw_string(&w, "CPU");
            mts_jw_key(&w, "models");
            mts_jw_int(&w, ds.models);
            mts_jw_key(&w, "bytes_used");
            mts_jw_int(&w, ds.bytes_used);
            mts_jw_key(&w, "bytes_budget");
            mts_jw_int(&w, ds.bytes_budget);
            mts_jw_key(&w, "workers");
            mts_jw_int(&w, ds.workers);
            mts_jw_key(&w, "busy_workers");
            mts_jw_int(&w, ds.busy_workers);
            mts_jw_key(&w, "threads");
            mts_jw_int(&w, ds.threads);
            mts_jw_key(&w, "queue_depth");
            mts_jw_int(&w, ds.queue_depth);
            mts_jw_end_object(&w);
        }
        mts_jw_end_array(&w);
        mts_server_totals tot;
        mts_server_totals_get(srv, &tot);
        mts_jw_key(&w, "server");
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "submitted");
        mts_jw_uint(&w, tot.submitted);
        mts_jw_key(&w, "completed");
        mts_jw_uint(&w, tot.completed);
        mts_jw_key(&w, "failed");
        mts_jw_uint(&w, tot.failed);
        mts_jw_key(&w, "rejected_queue_full");
        mts_jw_uint(&w, tot.rejected_full);
        mts_jw_key(&w, "timed_out");
        mts_jw_uint(&w, tot.timed_out);
        mts_jw_key(&w, "cancelled");
        mts_jw_uint(&w, tot.cancelled);
        mts_jw_key(&w, "resident_models");
        mts_jw_int(&w, tot.resident_models);
        mts_jw_key(&w, "resident_bytes");
        mts_jw_int(&w, tot.resident_bytes);
        mts_jw_key(&w, "queue_depth");
        mts_jw_int(&w, tot.queue_depth);
        mts_jw_key(&w, "uptime_s");
        mts_jw_double(&w, tot.uptime_s);
        mts_jw_end_object(&w);
    }
    mts_jw_end_object(&w);
    respond_json(c, 200, NULL, &w);
    mts_jw_free(&w);
}

static void handle_index(mts_server *srv, mts_http_conn *c, const mts_http_req *hr)
{
    bool ready_only = false, empty;
    mts_json_doc *doc = parse_small_body(c, hr, &empty);
    if (!doc && !empty) return;
    if (doc) {
        const mts_json *root = mts_json_root(doc);
        int b = bool_param(root, "ready", &ready_only);
        mts_json_free(doc);
        if (b < 0) {
            mts_route_error_text(c, MTS_EINVAL, "'ready' must be a bool", 0);
            return;
        }
    }
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_array(&w);
    mts_model_status st;
    for (int i = 0; i < mts_server_model_count(srv); i++) {
        if (mts_server_model_status(srv, i, &st)) continue;
        if (ready_only && st.state != MTS_MODEL_READY) continue;
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "name");
        mts_jw_string(&w, st.name);
        mts_jw_key(&w, "version");
        char ver[16];
        snprintf(ver, sizeof ver, "%d", st.model_version);
        mts_jw_string(&w, ver);
        mts_jw_key(&w, "state");
        mts_jw_string(&w, mts_model_state_name(st.state));
        mts_jw_key(&w, "reason");
        mts_jw_string(&w, st.reason);
        mts_jw_end_object(&w);
    }
    mts_jw_end_array(&w);
    respond_json(c, 200, NULL, &w);
    mts_jw_free(&w);
}

static void unload_done(void *user, int status, const char *msg)
{
    mts_http_conn *c = user;
    if (status) mts_route_error_text(c, status, msg, 0);
    else respond_empty(c, 200);
}

/* ---- routes ---- */

static void route_live(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    respond_empty(c, 200);
}

static void route_ready(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    mts_server_totals t;
    mts_server_totals_get(srv, &t);
    respond_empty(c, mts_proto_http_status(t.shutting_down ? MTS_EUNAVAILABLE : MTS_OK));
}

static void route_server_metadata(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "name");
    mts_jw_string(&w, "mtserve");
    mts_jw_key(&w, "version");
    mts_jw_string(&w, "0.1.0");
    mts_jw_key(&w, "extensions");
    mts_jw_begin_array(&w);
    for (int i = 0; i < mts_proto_n_extensions; i++) mts_jw_string(&w, mts_proto_extensions[i]);
    mts_jw_end_array(&w);
    mts_jw_end_object(&w);
    respond_json(c, 200, NULL, &w);
}

/* ---- logging and trace settings (Triton's logging and trace extensions) ---- */

/* log_verbose_level as last set (0: debug lines off; any level > 0 turns them on) */
static int log_verbose_level;
static pthread_mutex_t settings_lock = PTHREAD_MUTEX_INITIALIZER;

static void respond_log_settings(mts_http_conn *c)
{
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "log_file");
    mts_jw_string(&w, "");
    mts_jw_key(&w, "log_info");
    mts_jw_bool(&w, mts_log_enabled(MTS_LOG_INFO));
    mts_jw_key(&w, "log_warning");
    mts_jw_bool(&w, mts_log_enabled(MTS_LOG_WARN));
    mts_jw_key(&w, "log_error");
    mts_jw_bool(&w, mts_log_enabled(MTS_LOG_ERROR));
    mts_jw_key(&w, "log_verbose_level");
    pthread_mutex_lock(&settings_lock);
    int verbose = mts_log_enabled(MTS_LOG_DEBUG) ? (log_verbose_level > 0 ? log_verbose_level : 1) : 0;
    pthread_mutex_unlock(&settings_lock);
    mts_jw_int(&w, verbose);
    mts_jw_key(&w, "log_format");
    mts_jw_string(&w, mts_log_get_format() == MTS_LOG_FORMAT_ISO8601 ? "ISO8601" : "default");
    mts_jw_end_object(&w);
    respond_json(c, 200, NULL, &w);
}

static void route_logging_get(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    respond_log_settings(c);
}

/* POST /v2/logging: any subset of the settings; everything is checked before anything changes.
 * log_file can only be "" (lines go to stderr). The answer is the settings now in force. */
static void route_logging_post(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    bool empty;
    mts_json_doc *doc = parse_small_body(c, hr, &empty);
    if (!doc && !empty) return;
    const mts_json *root = doc ? mts_json_root(doc) : NULL;
    char m[300] = "";
    int set[3] = {-1, -1, -1}; /* info, warning, error: -1 unchanged */
    int64_t verbose = -1;
    int format = -1;
    if (doc && mts_json_type(root) != MTS_JSON_OBJECT) snprintf(m, sizeof m, "the body must be a JSON object");
    for (size_t i = 0; !m[0] && i < mts_json_len(root); i++) {
        const char *k = mts_json_key_at(root, i);
        const mts_json *v = mts_json_at(root, i);
        if (!strcmp(k, "log_info") || !strcmp(k, "log_warning") || !strcmp(k, "log_error")) {
            if (mts_json_type(v) != MTS_JSON_BOOL) snprintf(m, sizeof m, "'%s' must be a bool", k);
            else set[k[4] == 'i' ? 0 : k[4] == 'w' ? 1 : 2] = mts_json_bool(v);
        } else if (!strcmp(k, "log_verbose_level")) {
            if (mts_json_int(v, &verbose) || verbose < 0 || verbose > 1000000)
                snprintf(m, sizeof m, "'log_verbose_level' must be an integer >= 0 (0: off; > 0: debug lines)");
        } else if (!strcmp(k, "log_format")) {
            const char *f = mts_json_str(v, NULL);
            if (f && !strcmp(f, "default")) format = MTS_LOG_FORMAT_DEFAULT;
            else if (f && !strcmp(f, "ISO8601")) format = MTS_LOG_FORMAT_ISO8601;
            else snprintf(m, sizeof m, "'log_format' must be \"default\" or \"ISO8601\"");
        } else if (!strcmp(k, "log_file")) {
            const char *f = mts_json_str(v, NULL);
            if (!f || f[0])
                snprintf(m, sizeof m, "'log_file' can only be \"\": mtserve logs to stderr (redirect it to a file)");
        } else {
            snprintf(m, sizeof m, "unknown logging setting '%.64s' (known: log_info, log_warning, log_error, "
                     "log_verbose_level, log_format, log_file)", k);
        }
    }
    mts_json_free(doc);
    if (m[0]) {
        mts_route_error_text(c, MTS_EINVAL, m, 0);
        return;
    }
    static const mts_log_level levels[3] = {MTS_LOG_INFO, MTS_LOG_WARN, MTS_LOG_ERROR};
    for (int i = 0; i < 3; i++)
        if (set[i] >= 0) mts_log_set_enabled(levels[i], set[i] != 0);
    if (verbose >= 0) {
        pthread_mutex_lock(&settings_lock);
        log_verbose_level = (int)verbose;
        pthread_mutex_unlock(&settings_lock);
        mts_log_set_enabled(MTS_LOG_DEBUG, verbose > 0);
    }
    if (format >= 0) mts_log_set_format((mts_log_format)format);
    respond_log_settings(c);
}

/* Trace settings: tracing is not implemented, so trace_level is always ["OFF"]; the other
 * settings are kept (server-wide, also for the per-model routes) so that clients see what they
 * set, and have no effect. */
static struct {
    int64_t rate, count, log_frequency;
} trace = {1000, -1, 0};

static void respond_trace_settings(mts_http_conn *c)
{
    pthread_mutex_lock(&settings_lock);
    int64_t v[3] = {trace.rate, trace.count, trace.log_frequency};
    pthread_mutex_unlock(&settings_lock);
    static const char *keys[3] = {"trace_rate", "trace_count", "log_frequency"};
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "trace_level");
    mts_jw_begin_array(&w);
    mts_jw_string(&w, "OFF");
    mts_jw_end_array(&w);
    for (int i = 0; i < 3; i++) {
        char num[24];
        snprintf(num, sizeof num, "%lld", (long long)v[i]);
        mts_jw_key(&w, keys[i]);
        mts_jw_string(&w, num);
    }
    mts_jw_key(&w, "trace_file");
    mts_jw_string(&w, "");
    mts_jw_key(&w, "trace_mode");
    mts_jw_string(&w, "triton");
    mts_jw_end_object(&w);
    respond_json(c, 200, NULL, &w);
}

/* The model a per-model trace route names must exist (404 otherwise). */
static bool trace_model_ok(mts_server *srv, mts_http_conn *c, const mts_route_args *a)
{
    if (a->n < 1) return true;
    char model[MTS_ROUTE_ARG_MAX + 1];
    mts_route_arg(a, 0, model, sizeof model);
    if (mts_server_has_model(srv, model)) return true;
    respond_unknown_model(c, model);
    return false;
}

static void route_trace_get(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    if (trace_model_ok(srv, c, a)) respond_trace_settings(c);
}

/* A trace count, rate or frequency: a decimal string or integer (Triton sends strings); null
 * restores the default. */
static int trace_int(const mts_json *v, const char *key, int64_t min, int64_t dflt, int64_t *out, char *m, size_t len)
{
    if (mts_json_type(v) == MTS_JSON_NULL) {
        *out = dflt;
        return 0;
    }
    const char *t = mts_json_str(v, NULL);
    if (t) {
        char *end;
        long long x = strtoll(t, &end, 10);
        if (end != t && !*end && x >= min) {
            *out = x;
            return 0;
        }
    } else if (!mts_json_int(v, out) && *out >= min) {
        return 0;
    }
    snprintf(m, len, "'%s' must be an integer >= %lld (as a string, e.g. \"%lld\")", key, (long long)min,
             (long long)dflt);
    return -1;
}

static void route_trace_post(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    if (!trace_model_ok(srv, c, a)) return;
    bool empty;
    mts_json_doc *doc = parse_small_body(c, hr, &empty);
    if (!doc && !empty) return;
    const mts_json *root = doc ? mts_json_root(doc) : NULL;
    char m[300] = "";
    pthread_mutex_lock(&settings_lock);
    int64_t v[3] = {trace.rate, trace.count, trace.log_frequency};
    pthread_mutex_unlock(&settings_lock);
    if (doc && mts_json_type(root) != MTS_JSON_OBJECT) snprintf(m, sizeof m, "the body must be a JSON object");
    for (size_t i = 0; !m[0] && i < mts_json_len(root); i++) {
        const char *k = mts_json_key_at(root, i);
        const mts_json *x = mts_json_at(root, i);
        if (!strcmp(k, "trace_level")) {
            bool off = mts_json_type(x) == MTS_JSON_NULL;
            if (mts_json_type(x) == MTS_JSON_ARRAY) {
                off = true;
                for (size_t j = 0; j < mts_json_len(x); j++) {
                    const char *l = mts_json_str(mts_json_at(x, j), NULL);
                    if (!l || strcmp(l, "OFF")) off = false;
                }
            }
            if (!off)
                snprintf(m, sizeof m, "tracing is not supported by mtserve: 'trace_level' can only be [\"OFF\"] "
                         "(TIMESTAMPS and TENSORS are not available)");
        } else if (!strcmp(k, "trace_rate")) {
            trace_int(x, k, 1, 1000, &v[0], m, sizeof m);
        } else if (!strcmp(k, "trace_count")) {
            trace_int(x, k, -1, -1, &v[1], m, sizeof m);
        } else if (!strcmp(k, "log_frequency")) {
            trace_int(x, k, 0, 0, &v[2], m, sizeof m);
        } else if (!strcmp(k, "trace_file")) {
            const char *f = mts_json_str(x, NULL);
            if (mts_json_type(x) != MTS_JSON_NULL && (!f || f[0]))
                snprintf(m, sizeof m, "tracing is not supported by mtserve: 'trace_file' can only be \"\"");
        } else if (!strcmp(k, "trace_mode")) {
            const char *f = mts_json_str(x, NULL);
            if (mts_json_type(x) != MTS_JSON_NULL && (!f || strcmp(f, "triton")))
                snprintf(m, sizeof m, "tracing is not supported by mtserve: 'trace_mode' can only be \"triton\"");
        } else {
            snprintf(m, sizeof m, "unknown trace setting '%.64s' (known: trace_level, trace_rate, trace_count, "
                     "log_frequency, trace_file, trace_mode)", k);
        }
    }
    mts_json_free(doc);
    if (m[0]) {
        mts_route_error_text(c, MTS_EINVAL, m, 0);
        return;
    }
    pthread_mutex_lock(&settings_lock);
    trace.rate = v[0];
    trace.count = v[1];
    trace.log_frequency = v[2];
    pthread_mutex_unlock(&settings_lock);
    respond_trace_settings(c);
}

static void route_all_stats(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    handle_stats(srv, c, NULL);
}

static void route_index(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    handle_index(srv, c, hr);
}

static void route_load(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    char model[MTS_ROUTE_ARG_MAX + 1];
    mts_route_arg(a, 0, model, sizeof model);
    bool force = false, empty;
    mts_json_doc *doc = parse_small_body(c, hr, &empty);
    if (!doc && !empty) return;
    if (doc) {
        const mts_json *params = mts_json_get(mts_json_root(doc), "parameters");
        int b = bool_param(params, "force_reload", &force);
        mts_json_free(doc);
        if (b < 0) {
            mts_route_error_text(c, MTS_EINVAL, "parameter 'force_reload' must be a bool", 0);
            return;
        }
    }
    handle_meta(srv, c, model, 2, force);
}

static void route_unload(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    char model[MTS_ROUTE_ARG_MAX + 1];
    mts_route_arg(a, 0, model, sizeof model);
    mts_err err = {0};
    int rc = mts_server_unload(srv, model, unload_done, c, &err);
    if (rc) mts_route_error_text(c, rc, err.msg, 0);
}

/* The model a /v2/models/{m}[/versions/{v}] route names, into model. With a version, a known
 * model that does not serve it is answered 404 here (false); an unknown model is left to the
 * handler, which answers "unknown model" as for a route without a version. */
static bool route_model(mts_server *srv, mts_http_conn *c, const mts_route_args *a, char *model, size_t cap)
{
    mts_route_arg(a, 0, model, cap);
    if (a->n < 2) return true;
    char want[24], m[400];
    snprintf(want, sizeof want, "%.*s", (int)(a->len[1] > 20 ? 20 : a->len[1]), a->arg[1]);
    if (mts_server_has_model(srv, model) && !mts_server_version_ok(srv, model, want, m, sizeof m)) {
        mts_route_error_text(c, MTS_ENOTFOUND, m, 0);
        return false;
    }
    return true;
}

static void route_model_metadata(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    char model[MTS_ROUTE_ARG_MAX + 1];
    if (route_model(srv, c, a, model, sizeof model)) handle_meta(srv, c, model, 0, false);
}

static void route_model_config(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    char model[MTS_ROUTE_ARG_MAX + 1];
    if (route_model(srv, c, a, model, sizeof model)) handle_meta(srv, c, model, 1, false);
}

static void route_model_stats(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    char model[MTS_ROUTE_ARG_MAX + 1];
    if (route_model(srv, c, a, model, sizeof model)) handle_stats(srv, c, model);
}

static void route_model_infer(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    char model[MTS_ROUTE_ARG_MAX + 1];
    if (route_model(srv, c, a, model, sizeof model)) handle_infer(srv, c, hr, model);
}

static void route_model_ready(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    char model[MTS_ROUTE_ARG_MAX + 1];
    if (!route_model(srv, c, a, model, sizeof model)) return;
    mts_model_status st;
    if (mts_server_model_status_by_name(srv, model, &st)) {
        respond_unknown_model(c, model);
    } else if (st.state == MTS_MODEL_READY) {
        respond_empty(c, 200);
    } else {
        char m[400];
        snprintf(m, sizeof m, "model '%s' is not ready (%s%s%s)", model, mts_model_state_name(st.state),
                 st.reason[0] ? ": " : "", st.reason);
        mts_route_error_text(c, MTS_EINVAL, m, 0);
    }
}

#define MODEL "/v2/models/{}"
#define MODEL_V "/v2/models/{}/versions/{#}"
const mts_route mts_kserve_routes[] = {
    {"POST", MODEL "/infer", route_model_infer, NULL, MTS_SCOPE_INFER},
    {"GET", "/v2/health/live", route_live, NULL, MTS_SCOPE_OPEN},
    {"GET", "/v2/health/ready", route_ready, NULL, MTS_SCOPE_OPEN},
    {"GET", "/v2", route_server_metadata, NULL, MTS_SCOPE_INFER},
    {"GET", "/v2/", route_server_metadata, NULL, MTS_SCOPE_INFER},
    {"GET", "/v2/models/stats", route_all_stats, NULL, MTS_SCOPE_INFER},
    {"POST", "/v2/repository/index", route_index, NULL, MTS_SCOPE_INFER},
    {"POST", "/v2/repository/models/{}/load", route_load, NULL, MTS_SCOPE_ADMIN},
    {"POST", "/v2/repository/models/{}/unload", route_unload, NULL, MTS_SCOPE_ADMIN},
    {"GET", MODEL, route_model_metadata, NULL, MTS_SCOPE_INFER},
    {"GET", MODEL "/ready", route_model_ready, NULL, MTS_SCOPE_INFER},
    {"GET", MODEL "/config", route_model_config, NULL, MTS_SCOPE_INFER},
    {"GET", MODEL "/stats", route_model_stats, NULL, MTS_SCOPE_INFER},
    {"POST", MODEL_V "/infer", route_model_infer, NULL, MTS_SCOPE_INFER},
    {"GET", MODEL_V, route_model_metadata, NULL, MTS_SCOPE_INFER},
    {"GET", MODEL_V "/ready", route_model_ready, NULL, MTS_SCOPE_INFER},
    {"GET", MODEL_V "/config", route_model_config, NULL, MTS_SCOPE_INFER},
    {"GET", MODEL_V "/stats", route_model_stats, NULL, MTS_SCOPE_INFER},
    {"GET", "/v2/logging", route_logging_get, NULL, MTS_SCOPE_INFER},
    {"POST", "/v2/logging", route_logging_post, NULL, MTS_SCOPE_ADMIN},
    {"GET", "/v2/trace/setting", route_trace_get, NULL, MTS_SCOPE_INFER},
    {"POST", "/v2/trace/setting", route_trace_post, NULL, MTS_SCOPE_ADMIN},
    {"GET", MODEL "/trace/setting", route_trace_get, NULL, MTS_SCOPE_INFER},
    {"POST", MODEL "/trace/setting", route_trace_post, NULL, MTS_SCOPE_ADMIN},
    {NULL, NULL, NULL, NULL, 0},
};
