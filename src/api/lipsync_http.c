/*
 * POST /api/v1/lipsync/{model}/composite (lipsync_http.h): the HTTP twin of gRPC
 * InferBatchComposite. The body holds the raw float32 tensors (visual then audio) back to back;
 * parameters come from the query string. The request is parsed on the I/O thread, inference runs
 * on a device worker, compositing and encoding on a media thread, and the response (a JSON header
 * plus the encoded frames, sent without copying) is released on the I/O thread once written,
 * which serializes freeing with on_cancel. Errors are {"error": "..."} with the statuses of
 * protocol.h (400 bad request, 404 unknown model, 412 not a lip-sync model or unusable
 * background assets, 429 queue full, 503 unavailable). The request checks, the binding of the
 * frames to the model's inputs and the output check are lipsync_common.c's, shared with gRPC.
 */
#include "api/lipsync_http.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/lipsync_common.h"
#include "api/protocol.h"
#include "api/router.h"
#include "media/compose.h"
#include "util/json.h"
#include "util/clock.h"

typedef struct comp_call {
    mts_request req; /* first: the front end's on_cancel cancels it through hr->user */
    mts_server *srv;
    mts_http_conn *conn;
    char model[256];
    int batch_size; /* 0: from the body length */
    const char *body;
    size_t body_len;
    void *aligned; /* copy of the body when it is not 4-byte aligned */
    char names[2][MTS_TENSOR_NAME_MAX], out_name[MTS_TENSOR_NAME_MAX];
    mts_bgcache *bg;
    mts_composite_opts opts;
    mts_composite_out out;
    bool have_out;
    char *head; /* JSON header of the response */
    double t_done;
} comp_call;

static void call_free(comp_call *cc)
{
    mts_request_release(&cc->req);
    mts_bgcache_unref(cc->bg);
    if (cc->have_out) mts_composite_out_free(&cc->out);
    free(cc->aligned);
    free(cc->head);
    free(cc);
}

/* On the I/O thread, after the response went out (or the connection died). */
static void response_sent(void *arg)
{
    call_free(arg);
}

/* Answers an error (an MTS_E* status) and frees the call once it is written. */
#define fail(cc, status, ...)                                                                                   \
    (mts_server_request_answered((cc)->srv, &(cc)->req),                                                       \
     mts_route_fail((cc)->conn, &(cc)->head, response_sent, (cc), (status), __VA_ARGS__))

/* ---- compositing (media thread) ---- */

static void composite_run(void *arg)
{
    comp_call *cc = arg;
    mts_request *req = &cc->req;
    double t_start = mts_now_ms();
    mts_err err = {0};
    int rc = MTS_OK;
    if (!cc->bg) rc = mts_server_bgcache_acquire(cc->srv, cc->model, &cc->bg, &err);
    if (rc) {
        fail(cc, mts_lipsync_asset_status(rc), "%s", err.msg);
        return;
    }
    if (atomic_load(&req->cancelled)) {
        fail(cc, MTS_ECANCELLED, "cancelled");
        return;
    }
    const mts_tensor *t = &req->outputs[0];
    rc = mts_composite_batch(cc->bg, t->data, cc->batch_size, (int)t->dims[3], (int)t->dims[2], &cc->opts, &cc->out,
                             &err);
    if (rc) {
        fail(cc, mts_lipsync_asset_status(rc), "model '%s': compositing failed: %s", cc->model, err.msg);
        return;
    }
    cc->have_out = true;
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "model_name");
    mts_jw_string(&w, cc->model);
    mts_jw_key(&w, "batch_size");
    mts_jw_int(&w, cc->batch_size);
    mts_jw_key(&w, "format");
    mts_jw_string(&w, mts_frame_format_name(cc->opts.format));
    mts_jw_key(&w, "width");
    mts_jw_int(&w, cc->out.width);
    mts_jw_key(&w, "height");
    mts_jw_int(&w, cc->out.height);
    const struct {
        const char *k;
        double v;
    } times[] = {{"queue_time_ms", req->queue_ms},
                 {"inference_time_ms", req->compute_ms},
                 {"media_queue_time_ms", t_start - cc->t_done},
                 {"background_time_ms", cc->out.background_ms},
                 {"composite_time_ms", cc->out.composite_ms},
                 {"encode_time_ms", cc->out.encode_ms}};
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
        mts_jw_key(&w, times[i].k);
        mts_jw_double(&w, times[i].v);
    }
    mts_jw_key(&w, "executed_batch_size");
    mts_jw_int(&w, req->batch_size);
    mts_jw_key(&w, "num_frames");
    mts_jw_int(&w, mts_bgcache_num_frames(cc->bg));
    mts_jw_key(&w, "frames");
    mts_jw_begin_array(&w);
    for (int i = 0; i < cc->out.n; i++) {
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "frame_idx");
        mts_jw_int(&w, cc->out.frame_idx[i]);
        mts_jw_key(&w, "offset");
        mts_jw_uint(&w, cc->out.offset[i]);
        mts_jw_key(&w, "size");
        mts_jw_uint(&w, cc->out.len[i]);
        mts_jw_end_object(&w);
    }
    mts_jw_end_array(&w);
    mts_jw_end_object(&w);
    size_t hlen = 0;
    cc->head = mts_jw_take(&w, &hlen);
    mts_jw_free(&w);
    if (!cc->head) {
        fail(cc, MTS_ENOMEM, "out of memory encoding the response");
        return;
    }
    char extra[96];
    snprintf(extra, sizeof extra, "Inference-Header-Content-Length: %zu\r\n", hlen);
    struct iovec iov[2] = {{cc->head, hlen}, {cc->out.data.data, cc->out.data.len}};
    mts_server_request_answered(cc->srv, &cc->req);
    mts_http_respondv(cc->conn, 200, "application/octet-stream", extra, iov, 2, response_sent, cc);
}

static void infer_done(mts_request *req, int status, const char *msg)
{
    comp_call *cc = (comp_call *)req;
    if (status) {
        fail(cc, status, "%s", msg ? msg : mts_status_text(status));
        return;
    }
    char m[300];
    int rc = mts_lipsync_check_regions(req, cc->batch_size, cc->model, m, sizeof m);
    if (rc) {
        fail(cc, rc, "%s", m);
        return;
    }
    cc->t_done = mts_now_ms();
    mts_workq *q = mts_server_media_queue(cc->srv);
    if (!q || mts_workq_submit(q, composite_run, cc)) composite_run(cc);
}

/* ---- submission ---- */

/* With the model loaded: sizes, inputs, background cache, prefetch, submit. Any thread. */
static void submit(comp_call *cc)
{
    mts_model_status *st = malloc(sizeof *st);
    char m[600];
    if (!st || mts_server_model_status_by_name(cc->srv, cc->model, st)) {
        free(st);
        fail(cc, MTS_ENOTFOUND, "%s", mts_proto_unknown_model(m, sizeof m, cc->model));
        return;
    }
    mts_lipsync_binding b;
    int rc = mts_lipsync_bind(st, "compositing", &b, m, sizeof m);
    if (rc) {
        free(st);
        fail(cc, rc, "%s", m);
        return;
    }
    uint64_t per = mts_lipsync_frame_bytes(&b, 0) + mts_lipsync_frame_bytes(&b, 1);
    if (cc->batch_size == 0 && cc->body_len % per == 0) cc->batch_size = (int)(cc->body_len / per);
    if (cc->batch_size < 1 || cc->batch_size > MTS_LIPSYNC_MAX_BATCH || cc->body_len != per * (uint64_t)cc->batch_size) {
        const int64_t *dv = b.dims[0], *da = b.dims[1];
        fail(cc, MTS_EINVAL,
             "the body has %zu bytes; batch_size (1..%d) x (visual %lldx%lldx%lld + audio %lldx%lldx%lld) float32 "
             "needs a multiple of %llu bytes%s",
             cc->body_len, MTS_LIPSYNC_MAX_BATCH, (long long)dv[0], (long long)dv[1], (long long)dv[2], (long long)da[0],
             (long long)da[1], (long long)da[2], (unsigned long long)per,
             cc->batch_size ? " matching batch_size" : "");
        free(st);
        return;
    }
    mts_lipsync_set_inputs(&b, st, &cc->req, cc->batch_size, cc->body,
                           cc->body + (size_t)cc->batch_size * mts_lipsync_frame_bytes(&b, 0), cc->names, cc->out_name);
    cc->req.model = cc->model;
    cc->req.done = infer_done;
    free(st);
    mts_err err = {0};
    rc = mts_server_bgcache_acquire(cc->srv, cc->model, &cc->bg, &err);
    if (rc && rc != MTS_EUNAVAILABLE) {
        fail(cc, mts_lipsync_asset_status(rc), "%s", err.msg);
        return;
    }
    /* decode this batch's (and the next batch's) background frames during inference */
    mts_lipsync_prefetch(cc->srv, cc->bg, &cc->opts, cc->batch_size);
    int retry = 0;
    rc = mts_server_submit(cc->srv, &cc->req, &retry, &err);
    if (rc) fail(cc, rc, "%s", err.msg);
}

static void loaded(void *user, int status, const char *msg)
{
    comp_call *cc = user;
    if (status) fail(cc, status, "%s", msg);
    else submit(cc);
}

/* ---- request parsing (I/O thread) ---- */

static bool parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (!s[0] || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static void route_composite(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    char model[MTS_ROUTE_ARG_MAX + 1], m[300];
    mts_route_arg(a, 0, model, sizeof model);
    if (mts_proto_find_model(srv, model, NULL, m, sizeof m)) {
        mts_route_error(c, MTS_ENOTFOUND, "%s", m);
        return;
    }
    char v[64];
    long long bs = 0, start = 0, quality = 85;
    if (mts_http_query_param(hr->query, "batch_size", v, sizeof v) && !parse_int(v, 1, MTS_LIPSYNC_MAX_BATCH, &bs)) {
        mts_route_error(c, MTS_EINVAL, "batch_size '%s' is not a number of frames in 1..%d", v, MTS_LIPSYNC_MAX_BATCH);
        return;
    }
    if (mts_http_query_param(hr->query, "start_frame_idx", v, sizeof v) &&
        !parse_int(v, -2000000000, 2000000000, &start)) {
        mts_route_error(c, MTS_EINVAL, "start_frame_idx '%s' is not an integer", v);
        return;
    }
    if (mts_http_query_param(hr->query, "quality", v, sizeof v) && !parse_int(v, 1, 100, &quality)) {
        mts_route_error(c, MTS_EINVAL, "quality '%s' is not in 1..100", v);
        return;
    }
    char format[64], wrap[64];
    mts_composite_opts opts = {0};
    int rc = mts_lipsync_composite_opts(mts_http_query_param(hr->query, "format", format, sizeof format) ? format : NULL,
                                        mts_http_query_param(hr->query, "wrap", wrap, sizeof wrap) ? wrap : NULL,
                                        (int)quality, start, &opts, m, sizeof m);
    if (rc) {
        mts_route_error(c, rc, "%s", m);
        return;
    }
    comp_call *cc = calloc(1, sizeof *cc);
    if (!cc) {
        mts_route_error(c, MTS_ENOMEM, "out of memory");
        return;
    }
    cc->srv = srv;
    cc->conn = c;
    cc->req.arrival_ns = mts_server_clock_ns();
    snprintf(cc->model, sizeof cc->model, "%s", model);
    cc->batch_size = (int)bs;
    cc->opts = opts;
    cc->body = hr->body;
    cc->body_len = hr->body_len;
    if ((uintptr_t)cc->body % 4) { /* the engine reads floats in place */
        if (!(cc->aligned = malloc(cc->body_len ? cc->body_len : 1))) {
            free(cc);
            mts_route_error(c, MTS_ENOMEM, "out of memory");
            return;
        }
        memcpy(cc->aligned, hr->body, hr->body_len);
        cc->body = cc->aligned;
    }
    hr->user = cc; /* from here on every answer goes through fail()/respondv and response_sent */
    mts_model_status *st = malloc(sizeof *st);
    bool known = st && !mts_server_model_status_by_name(srv, model, st) && st->n_inputs > 0;
    free(st);
    if (known) {
        submit(cc);
        return;
    }
    mts_err err = {0};
    rc = mts_server_load(srv, model, false, loaded, cc, &err);
    if (rc) fail(cc, rc, "%s", err.msg);
}

const mts_route mts_lipsync_routes[] = {
    {"POST", MTS_LIPSYNC_HTTP_PREFIX "{}/composite", route_composite, NULL, MTS_SCOPE_INFER},
    {NULL, NULL, NULL, NULL, 0},
};

const mts_route_hint mts_lipsync_hints[] = {
    {MTS_LIPSYNC_HTTP_PREFIX, "try POST /api/v1/lipsync/{model}/composite"},
    {NULL, NULL},
};
