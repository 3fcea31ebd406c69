/*
 * POST /api/v1/lipsync/{model}/composite (lipsync_http.h): the HTTP twin of gRPC
 * InferBatchComposite. The body holds the raw float32 tensors (visual then audio) back to back;
 * parameters come from the query string. The request is parsed on the I/O thread, inference runs
 * on a device worker, compositing and encoding on a media thread, and the response (a JSON header
 * plus the encoded frames, sent without copying) is released on the I/O thread once written,
 * which serializes freeing with on_cancel. Errors are {"error": "..."} with the KServe status
 * mapping (400 bad request, 404 unknown model, 412 unusable background assets, 429 queue full,
 * 503 unavailable).
 */
#include "api/lipsync_http.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/kserve_http.h"
#include "api/lipsync_common.h"
#include "media/compose.h"
#include "util/json.h"
#include "util/clock.h"

typedef struct comp_call {
    mts_request req; /* first: kserve_http's on_cancel cancels it through req->user */
    mts_server *srv;
    mts_http_conn *conn;
    char model[256];
    int batch_size; /* 0: from the body length */
    const char *body;
    size_t body_len;
    void *aligned; /* copy of the body when it is not 4-byte aligned */
    char names[2][128], out_name[128];
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

static void fail(comp_call *cc, int http_status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(comp_call *cc, int http_status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mts_http_respond_error_async(cc->conn, http_status, msg, &cc->head, response_sent, cc);
}

static int asset_http_status(int rc)
{
    return rc == MTS_ENOMEM ? 500 : rc == MTS_EUNAVAILABLE ? 503 : 412;
}

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
        fail(cc, asset_http_status(rc), "%s", err.msg);
        return;
    }
    if (atomic_load(&req->cancelled)) {
        fail(cc, 499, "cancelled");
        return;
    }
    const mts_tensor *t = &req->outputs[0];
    rc = mts_composite_batch(cc->bg, t->data, cc->batch_size, (int)t->dims[3], (int)t->dims[2], &cc->opts, &cc->out,
                             &err);
    if (rc) {
        fail(cc, asset_http_status(rc), "model '%s': compositing failed: %s", cc->model, err.msg);
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
        fail(cc, 500, "out of memory encoding the response");
        return;
    }
    char extra[96];
    snprintf(extra, sizeof extra, "Inference-Header-Content-Length: %zu\r\n", hlen);
    struct iovec iov[2] = {{cc->head, hlen}, {cc->out.data.data, cc->out.data.len}};
    mts_http_respondv(cc->conn, 200, "application/octet-stream", extra, iov, 2, response_sent, cc);
}

static void infer_done(mts_request *req, int status, const char *msg)
{
    comp_call *cc = (comp_call *)req;
    const mts_tensor *t = &req->outputs[0];
    if (status) {
        fail(cc, mts_kserve_http_status(status), "%s", msg ? msg : mts_status_text(status));
        return;
    }
    if (req->n_outputs < 1 || t->dtype != MTS_DTYPE_FLOAT || t->rank != 4 || t->dims[0] != cc->batch_size ||
        t->dims[1] != 3 || t->dims[2] < 1 || t->dims[3] < 1) {
        fail(cc, 412, "model '%s' must produce float32 mouth regions [%d,3,H,W] as its first output to composite",
             cc->model, cc->batch_size);
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
    static const int64_t def_visual[3] = {6, 320, 320}, def_audio[3] = {32, 16, 16};
    mts_model_status *st = malloc(sizeof *st);
    if (!st || mts_server_model_status_by_name(cc->srv, cc->model, st)) {
        free(st);
        fail(cc, 404, "unknown model '%s'", cc->model);
        return;
    }
    if (st->n_inputs < 2 || st->n_outputs < 1) {
        fail(cc, 412, "model '%s' has %d inputs and %d outputs; compositing needs a lip-sync model (visual, audio -> "
             "mouth regions)", cc->model, st->n_inputs, st->n_outputs);
        free(st);
        return;
    }
    int vi = 0, ai = 1;
    for (int i = 0; i < st->n_inputs; i++) {
        if (!strcmp(st->inputs[i].name, "visual")) vi = i;
        if (!strcmp(st->inputs[i].name, "audio")) ai = i;
    }
    if (vi == ai) vi = 0, ai = 1;
    int64_t dv[3], da[3];
    int64_t pv = mts_lipsync_frame_elems(&st->inputs[vi], def_visual, dv);
    int64_t pa = mts_lipsync_frame_elems(&st->inputs[ai], def_audio, da);
    uint64_t per = (uint64_t)(pv + pa) * 4;
    if (cc->batch_size == 0 && cc->body_len % per == 0) cc->batch_size = (int)(cc->body_len / per);
    if (cc->batch_size < 1 || cc->batch_size > MTS_LIPSYNC_MAX_BATCH || cc->body_len != per * (uint64_t)cc->batch_size) {
        fail(cc, 400,
             "the body has %zu bytes; batch_size (1..%d) x (visual %lldx%lldx%lld + audio %lldx%lldx%lld) float32 "
             "needs a multiple of %llu bytes%s",
             cc->body_len, MTS_LIPSYNC_MAX_BATCH, (long long)dv[0], (long long)dv[1], (long long)dv[2], (long long)da[0],
             (long long)da[1], (long long)da[2], (unsigned long long)per,
             cc->batch_size ? " matching batch_size" : "");
        free(st);
        return;
    }
    const int64_t *dims[2] = {dv, da};
    const int idx[2] = {vi, ai};
    const char *p = cc->body;
    for (int k = 0; k < 2; k++) {
        mts_tensor *t = &cc->req.inputs[k];
        t->dtype = MTS_DTYPE_FLOAT;
        t->rank = 4;
        t->dims[0] = cc->batch_size;
        for (int d = 0; d < 3; d++) t->dims[d + 1] = dims[k][d];
        t->data = (void *)p;
        p += (size_t)cc->batch_size * (size_t)(k ? pa : pv) * 4;
        snprintf(cc->names[k], sizeof cc->names[k], "%s", st->inputs[idx[k]].name);
        cc->req.input_names[k] = cc->names[k];
    }
    cc->req.n_inputs = 2;
    snprintf(cc->out_name, sizeof cc->out_name, "%s", st->outputs[0].name);
    cc->req.requested[0] = cc->out_name;
    cc->req.n_requested = 1;
    cc->req.model = cc->model;
    cc->req.done = infer_done;
    free(st);
    mts_err err = {0};
    int rc = mts_server_bgcache_acquire(cc->srv, cc->model, &cc->bg, &err);
    if (rc && rc != MTS_EUNAVAILABLE) {
        fail(cc, rc == MTS_EUNSUPPORTED ? 412 : asset_http_status(rc), "%s", err.msg);
        return;
    }
    /* decode this batch's (and the next batch's) background frames during inference */
    mts_lipsync_prefetch(cc->srv, cc->bg, &cc->opts, cc->batch_size);
    int retry = 0;
    rc = mts_server_submit(cc->srv, &cc->req, &retry, &err);
    if (rc) fail(cc, mts_kserve_http_status(rc), "%s", err.msg);
}

static void loaded(void *user, int status, const char *msg)
{
    comp_call *cc = user;
    if (status) fail(cc, mts_kserve_http_status(status), "%s", msg);
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

void mts_lipsync_http_handle(mts_server *srv, mts_http_conn *c, mts_http_req *hr)
{
    const char *name = hr->path + strlen(MTS_LIPSYNC_HTTP_PREFIX);
    size_t nlen = strcspn(name, "/");
    if (nlen == 0 || nlen >= 256 || strcmp(name + nlen, "/composite")) {
        mts_http_respond_error(c, 404, "no route for %s %.200s (try POST /api/v1/lipsync/{model}/composite)",
                               hr->method, hr->path);
        return;
    }
    if (strcmp(hr->method, "POST")) {
        mts_http_respond_error(c, 405, "method %s is not allowed on %.200s", hr->method, hr->path);
        return;
    }
    char model[256];
    snprintf(model, sizeof model, "%.*s", (int)nlen, name);
    if (!mts_server_has_model(srv, model)) {
        mts_http_respond_error(c, 404, "unknown model '%s'", model);
        return;
    }
    char v[64];
    long long bs = 0, start = 0, quality = 85;
    int fmt = MTS_FRAME_JPEG, wrap = MTS_WRAP_LOOP;
    if (mts_http_query_param(hr->query, "batch_size", v, sizeof v) && !parse_int(v, 1, MTS_LIPSYNC_MAX_BATCH, &bs)) {
        mts_http_respond_error(c, 400, "batch_size '%s' is not a number of frames in 1..%d", v, MTS_LIPSYNC_MAX_BATCH);
        return;
    }
    if (mts_http_query_param(hr->query, "start_frame_idx", v, sizeof v) && !parse_int(v, -2000000000, 2000000000, &start)) {
        mts_http_respond_error(c, 400, "start_frame_idx '%s' is not an integer", v);
        return;
    }
    if (mts_http_query_param(hr->query, "quality", v, sizeof v) && !parse_int(v, 1, 100, &quality)) {
        mts_http_respond_error(c, 400, "quality '%s' is not in 1..100", v);
        return;
    }
    if (mts_http_query_param(hr->query, "format", v, sizeof v) && (fmt = mts_frame_format_parse(v)) < 0) {
        mts_http_respond_error(c, 400, "format '%s' is not one of jpeg, png, rgb", v);
        return;
    }
    if (mts_http_query_param(hr->query, "wrap", v, sizeof v) && (wrap = mts_wrap_mode_parse(v)) < 0) {
        mts_http_respond_error(c, 400, "wrap '%s' is not one of loop, pingpong", v);
        return;
    }
    comp_call *cc = calloc(1, sizeof *cc);
    if (!cc) {
        mts_http_respond_error(c, 500, "out of memory");
        return;
    }
    cc->srv = srv;
    cc->conn = c;
    snprintf(cc->model, sizeof cc->model, "%s", model);
    cc->batch_size = (int)bs;
    cc->opts.format = (mts_frame_format)fmt;
    cc->opts.quality = (int)quality;
    cc->opts.png_level = 1;
    cc->opts.wrap = (mts_wrap_mode)wrap;
    cc->opts.start_frame_idx = start;
    cc->body = hr->body;
    cc->body_len = hr->body_len;
    if ((uintptr_t)cc->body % 4) { /* the engine reads floats in place */
        if (!(cc->aligned = malloc(cc->body_len ? cc->body_len : 1))) {
            free(cc);
            mts_http_respond_error(c, 500, "out of memory");
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
    int rc = mts_server_load(srv, model, false, loaded, cc, &err);
    if (rc) fail(cc, mts_kserve_http_status(rc), "%s", err.msg);
}
