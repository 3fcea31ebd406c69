/*
 * POST /api/v1/segment and /api/v1/batch-segment (segment_http.h). The I/O thread only parses the
 * multipart form (zero-copy: the image parts stay in the request body until the answer) and
 * checks the fields; a media thread decodes and resizes the images into one input batch; a
 * device worker runs the model; a media thread turns the output into masks, encodes them as
 * PNG and builds the JSON answer, which the I/O thread frees once it is written (serializing
 * the free with on_cancel, as in lipsync_http.c).
 */
#include "api/segment_http.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "api/protocol.h"
#include "media/segment.h"
#include "util/json.h"
#include "util/multipart.h"
#include "util/clock.h"

#define DEFAULT_SIDE 256                    /* model input side when the model leaves it symbolic */
#define MAX_INPUT_BYTES (1024LL * 1024 * 1024) /* one batch's float input */

typedef struct seg_call {
    mts_request req; /* first: the front end's on_cancel cancels it through hr->user */
    mts_server *srv;
    mts_http_conn *conn;
    char model[256];
    float threshold;
    bool batch, png_response;
    int n;
    const char *img[MTS_SEGMENT_MAX_IMAGES]; /* into the request body */
    size_t img_len[MTS_SEGMENT_MAX_IMAGES];
    char img_name[MTS_SEGMENT_MAX_IMAGES][128];
    int img_w[MTS_SEGMENT_MAX_IMAGES], img_h[MTS_SEGMENT_MAX_IMAGES];
    float *input;
    int in_w, in_h;
    char in_name[MTS_TENSOR_NAME_MAX], out_name[MTS_TENSOR_NAME_MAX];
    double decode_ms;
    char *answer; /* response body, malloc'd */
    size_t answer_len;
} seg_call;

/* On the I/O thread, after the response went out (or the connection died). */
static void response_sent(void *arg)
{
    seg_call *sc = arg;
    mts_request_release(&sc->req);
    free(sc->input);
    free(sc->answer);
    free(sc);
}

/* Answers an error (an MTS_E* status) and frees the call once it is written. */
#define fail(sc, status, ...)                                                                                   \
    (mts_server_request_answered((sc)->srv, &(sc)->req),                                                       \
     mts_route_fail((sc)->conn, &(sc)->answer, response_sent, (sc), (status), __VA_ARGS__))

/* Status of a failure reading the upload (the form, an image): over a limit is 413, out of
 * memory 500, anything else a malformed upload (400). */
static int upload_status(int rc)
{
    return rc == MTS_ELIMIT ? MTS_PROTO_ETOOLARGE : rc == MTS_ENOMEM ? MTS_ENOMEM : MTS_EINVAL;
}

/* ---- answer (media thread) ---- */

/* The base64 text of p[0..n) as a JSON string literal (with its quotes). */
static char *base64_json(const uint8_t *p, size_t n, size_t *out_len)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = (n + 2) / 3 * 4 + 2;
    char *s = malloc(len + 1), *o = s;
    if (!s) return NULL;
    *o++ = '"';
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *o++ = tab[v >> 18], *o++ = tab[(v >> 12) & 63], *o++ = tab[(v >> 6) & 63], *o++ = tab[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
        *o++ = tab[v >> 18], *o++ = tab[(v >> 12) & 63];
        *o++ = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o++ = '"';
    *o = 0;
    *out_len = len;
    return s;
}

static void write_timings(mts_jw *w, const seg_call *sc, double post_ms)
{
    mts_jw_key(w, "timings_ms");
    mts_jw_begin_object(w);
    mts_jw_key(w, "decode_resize");
    mts_jw_double(w, sc->decode_ms);
    mts_jw_key(w, "queue");
    mts_jw_double(w, sc->req.queue_ms);
    mts_jw_key(w, "inference");
    mts_jw_double(w, sc->req.compute_ms);
    mts_jw_key(w, "mask_encode");
    mts_jw_double(w, post_ms);
    mts_jw_end_object(w);
}

static void finish(void *arg)
{
    seg_call *sc = arg;
    double t0 = mts_now_ms();
    const mts_tensor *t = &sc->req.outputs[0];
    int channels = t->rank == 4 ? (int)t->dims[1] : 1;
    int oh = (int)t->dims[t->rank - 2], ow = (int)t->dims[t->rank - 1];
    if (t->dtype != MTS_DTYPE_FLOAT || (t->rank != 4 && t->rank != 3) || t->dims[0] != sc->n || channels < 1 || oh < 1 ||
        ow < 1) {
        fail(sc, MTS_PROTO_EPRECONDITION, "model '%s' must produce float32 scores [N,C,H,W] or [N,H,W] as its first output to segment",
             sc->model);
        return;
    }
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "model_name");
    mts_jw_string(&w, sc->model);
    mts_jw_key(&w, "threshold");
    mts_jw_double(&w, sc->threshold);
    if (sc->batch) {
        mts_jw_key(&w, "batch_size");
        mts_jw_int(&w, sc->n);
        mts_jw_key(&w, "results");
        mts_jw_begin_array(&w);
    }
    size_t per = (size_t)channels * oh * ow;
    int rc = MTS_OK;
    mts_err err = {0};
    for (int i = 0; !rc && i < sc->n; i++) {
        int W = sc->img_w[i], H = sc->img_h[i];
        uint8_t *mask = malloc((size_t)W * H);
        const uint8_t **rows = malloc(sizeof *rows * (size_t)H);
        mts_buf png = {0};
        if (!mask || !rows) rc = mts_err_set(&err, MTS_ENOMEM, "out of memory for a %dx%d mask", W, H);
        mts_seg_stats st = {0};
        if (!rc) {
            mts_seg_mask((const float *)t->data + per * (size_t)i, channels, ow, oh, sc->threshold, W, H, mask, &st);
            for (int y = 0; y < H; y++) rows[y] = mask + (size_t)y * W;
            rc = mts_png_encode_gray(rows, W, H, 1, &png, &err);
        }
        if (!rc && sc->png_response) { /* /api/v1/segment?response=png: the mask itself */
            sc->answer = (char *)png.data;
            sc->answer_len = png.len;
            png.data = NULL;
            char extra[160];
            snprintf(extra, sizeof extra, "X-Foreground-Pixels: %lld\r\nX-Mask-Size: %dx%d\r\n", (long long)st.foreground,
                     W, H);
            free(mask);
            free(rows);
            mts_jw_free(&w);
            struct iovec iov = {sc->answer, sc->answer_len};
            mts_server_request_answered(sc->srv, &sc->req);
            mts_http_respondv(sc->conn, 200, "image/png", extra, &iov, 1, response_sent, sc);
            return;
        }
        size_t b64_len = 0;
        char *b64 = rc ? NULL : base64_json(png.data, png.len, &b64_len);
        if (!rc && !b64) rc = mts_err_set(&err, MTS_ENOMEM, "out of memory");
        if (!rc) {
            if (sc->batch) mts_jw_begin_object(&w);
            mts_jw_key(&w, "filename");
            mts_jw_string(&w, sc->img_name[i]);
            mts_jw_key(&w, "width");
            mts_jw_int(&w, W);
            mts_jw_key(&w, "height");
            mts_jw_int(&w, H);
            mts_jw_key(&w, "classes");
            mts_jw_int(&w, channels);
            mts_jw_key(&w, "foreground_pixels");
            mts_jw_int(&w, st.foreground);
            mts_jw_key(&w, "foreground_fraction");
            mts_jw_double(&w, (double)st.foreground / ((double)W * H));
            mts_jw_key(&w, "bbox");
            if (st.foreground) {
                mts_jw_begin_array(&w);
                mts_jw_int(&w, st.x1);
                mts_jw_int(&w, st.y1);
                mts_jw_int(&w, st.x2);
                mts_jw_int(&w, st.y2);
                mts_jw_end_array(&w);
            } else {
                mts_jw_null(&w);
            }
            mts_jw_key(&w, "mask_png_base64");
            mts_jw_raw(&w, b64, b64_len);
            if (sc->batch) mts_jw_end_object(&w);
        }
        free(b64);
        mts_buf_free(&png);
        free(mask);
        free(rows);
    }
    if (rc) {
        mts_jw_free(&w);
        fail(sc, MTS_EIO, "model '%s': building the masks failed: %s", sc->model, err.msg);
        return;
    }
    if (sc->batch) mts_jw_end_array(&w);
    write_timings(&w, sc, mts_now_ms() - t0);
    mts_jw_end_object(&w);
    sc->answer = mts_jw_take(&w, &sc->answer_len);
    mts_jw_free(&w);
    if (!sc->answer) {
        fail(sc, MTS_ENOMEM, "out of memory encoding the response");
        return;
    }
    struct iovec iov = {sc->answer, sc->answer_len};
    mts_server_request_answered(sc->srv, &sc->req);
    mts_http_respondv(sc->conn, 200, "application/json", NULL, &iov, 1, response_sent, sc);
}

static void infer_done(mts_request *req, int status, const char *msg)
{
    seg_call *sc = (seg_call *)req;
    if (status) {
        fail(sc, status, "%s", msg ? msg : mts_status_text(status));
        return;
    }
    if (req->n_outputs < 1) {
        fail(sc, MTS_PROTO_EPRECONDITION, "model '%s' produced no output", sc->model);
        return;
    }
    mts_workq *q = mts_server_media_queue(sc->srv);
    if (!q || mts_workq_submit(q, finish, sc)) finish(sc);
}

/* ---- decoding and submission (media thread) ---- */

static void prepare(void *arg)
{
    seg_call *sc = arg;
    double t0 = mts_now_ms();
    mts_model_status *st = malloc(sizeof *st);
    if (!st || mts_server_model_status_by_name(sc->srv, sc->model, st)) {
        free(st);
        char m[300];
        fail(sc, MTS_ENOTFOUND, "%s", mts_proto_unknown_model(m, sizeof m, sc->model));
        return;
    }
    int in = -1;
    for (int i = 0; i < st->n_inputs && in < 0; i++)
        if (st->inputs[i].rank == 4 && st->inputs[i].dtype == MTS_DTYPE_FLOAT &&
            (st->inputs[i].dims[1] == 3 || st->inputs[i].dims[1] < 0))
            in = i;
    if (in < 0 || st->n_inputs != 1 || st->n_outputs < 1) {
        fail(sc, MTS_PROTO_EPRECONDITION,
             "model '%s' is not an image segmentation model: it needs one float32 input [N,3,H,W] and a "
             "score output (it has %d inputs, %d outputs)", sc->model, st->n_inputs, st->n_outputs);
        free(st);
        return;
    }
    const mts_tensor_meta *m = &st->inputs[in];
    sc->in_h = m->dims[2] > 0 ? (int)m->dims[2] : DEFAULT_SIDE;
    sc->in_w = m->dims[3] > 0 ? (int)m->dims[3] : DEFAULT_SIDE;
    snprintf(sc->in_name, sizeof sc->in_name, "%s", m->name);
    snprintf(sc->out_name, sizeof sc->out_name, "%s", st->outputs[0].name);
    free(st);
    size_t per = (size_t)3 * sc->in_h * sc->in_w;
    if ((long long)per * sc->n * 4 > MAX_INPUT_BYTES) {
        fail(sc, MTS_PROTO_ETOOLARGE, "%d images at the model's %dx%d input need more than %lld MiB", sc->n, sc->in_w,
             sc->in_h, MAX_INPUT_BYTES >> 20);
        return;
    }
    sc->input = malloc(per * (size_t)sc->n * sizeof(float));
    if (!sc->input) {
        fail(sc, MTS_ENOMEM, "out of memory for the input batch");
        return;
    }
    for (int i = 0; i < sc->n; i++) {
        mts_image img;
        mts_err err = {0};
        int rc = mts_image_decode_mem(sc->img[i], sc->img_len[i], MTS_SEGMENT_MAX_PIXELS, &img, &err);
        if (rc) {
            fail(sc, upload_status(rc), "image %d ('%s'): %s", i, sc->img_name[i], err.msg);
            return;
        }
        sc->img_w[i] = img.width;
        sc->img_h[i] = img.height;
        mts_seg_preprocess(&img, sc->in_w, sc->in_h, sc->input + per * (size_t)i);
        mts_image_free(&img);
    }
    sc->decode_ms = mts_now_ms() - t0;
    mts_tensor *t = &sc->req.inputs[0];
    t->dtype = MTS_DTYPE_FLOAT;
    t->rank = 4;
    t->dims[0] = sc->n, t->dims[1] = 3, t->dims[2] = sc->in_h, t->dims[3] = sc->in_w;
    t->data = sc->input;
    sc->req.input_names[0] = sc->in_name;
    sc->req.n_inputs = 1;
    sc->req.requested[0] = sc->out_name;
    sc->req.n_requested = 1;
    sc->req.model = sc->model;
    sc->req.done = infer_done;
    mts_err err = {0};
    int retry = 0;
    int rc = mts_server_submit(sc->srv, &sc->req, &retry, &err);
    if (rc) fail(sc, rc, "%s", err.msg);
}

static void to_media(seg_call *sc)
{
    mts_workq *q = mts_server_media_queue(sc->srv);
    if (!q || mts_workq_submit(q, prepare, sc)) prepare(sc);
}

static void loaded(void *user, int status, const char *msg)
{
    seg_call *sc = user;
    if (status) fail(sc, status, "%s", msg);
    else to_media(sc);
}

/* ---- request parsing (I/O thread) ---- */

/* A text field from the form, else the query string. False when absent; -1 when too long. */
static int field(const mts_multipart *m, const mts_http_req *hr, const char *key, char *out, size_t cap)
{
    const mts_multipart_part *p = mts_multipart_get(m, key);
    if (p) {
        if (p->len >= cap) return -1;
        memcpy(out, p->data, p->len);
        out[p->len] = 0;
        return 1;
    }
    return mts_http_query_param(hr->query, key, out, cap) ? 1 : 0;
}

static bool is_image_part(const mts_multipart_part *p)
{
    static const char *names[] = {"file", "files", "image", "images", "files[]", "images[]"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (!strcmp(p->name, names[k])) return true;
    return p->filename[0] != 0;
}

static void route_segment(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    bool batch = !strcmp(hr->path, "/api/v1/batch-segment");
    mts_multipart form;
    mts_err err = {0};
    if (mts_multipart_parse(mts_http_header(hr, "Content-Type"), hr->body, hr->body_len, &form, &err)) {
        mts_route_error(c, upload_status(err.code), "%s", err.msg);
        return;
    }
    char model[256], thr[64] = "0.5", resp[32] = "json";
    int fm = field(&form, hr, "model", model, sizeof model);
    int ft = field(&form, hr, "threshold", thr, sizeof thr);
    int fr = field(&form, hr, "response", resp, sizeof resp);
    /* The Mts-Model header names the model too, so a load balancer that cannot read the form
     * (HAProxy, docs/scale-out.md) can route on it; it must agree with a form or query field. */
    const char *hm = mts_http_header(hr, "Mts-Model");
    char mismatch[160];
    bool disagree = false;
    if (hm && fm == 0) {
        fm = strlen(hm) < sizeof model ? 1 : -1;
        if (fm > 0) snprintf(model, sizeof model, "%s", hm);
    } else if (hm && fm > 0 && strcmp(hm, model)) {
        snprintf(mismatch, sizeof mismatch, "the Mts-Model header names '%.60s' but the model field names '%.60s'", hm,
                 model);
        disagree = true;
    }
    const char *problem = fm <= 0 ? (fm < 0 ? "the model field is too long" : "the form has no 'model' field")
                          : disagree ? mismatch
                          : ft < 0 ? "the threshold field is too long"
                          : fr < 0 ? "the response field is too long"
                                   : NULL;
    char *end = NULL;
    double t = strtod(thr, &end);
    if (!problem && (!thr[0] || *end || !(t >= 0 && t <= 1))) problem = "threshold must be a number in 0..1";
    bool png = !strcasecmp(resp, "png");
    if (!problem && !png && strcasecmp(resp, "json")) problem = "response must be json or png";
    if (!problem && png && batch) problem = "response=png is for /api/v1/segment (one image); batches answer JSON";
    int n = 0;
    for (int i = 0; i < form.n; i++) n += is_image_part(&form.parts[i]);
    if (!problem && n == 0) problem = "the form has no image (a 'file' part with a PNG or JPEG)";
    if (!problem && !batch && n > 1) problem = "the form has several images; send them to /api/v1/batch-segment";
    char toomany[96];
    snprintf(toomany, sizeof toomany, "%d images in one form; a batch takes at most %d", n, MTS_SEGMENT_MAX_IMAGES);
    if (!problem && n > MTS_SEGMENT_MAX_IMAGES) problem = toomany;
    if (problem) {
        mts_multipart_free(&form);
        mts_route_error(c, MTS_EINVAL, "%s", problem);
        return;
    }
    char m[300];
    if (mts_proto_find_model(srv, model, NULL, m, sizeof m)) {
        mts_multipart_free(&form);
        mts_route_error(c, MTS_ENOTFOUND, "%s", m);
        return;
    }
    seg_call *sc = calloc(1, sizeof *sc);
    if (!sc) {
        mts_multipart_free(&form);
        mts_route_error(c, MTS_ENOMEM, "out of memory");
        return;
    }
    sc->srv = srv;
    sc->conn = c;
    sc->req.arrival_ns = mts_server_clock_ns();
    snprintf(sc->model, sizeof sc->model, "%s", model);
    sc->threshold = (float)t;
    sc->batch = batch;
    sc->png_response = png;
    for (int i = 0; i < form.n; i++) {
        const mts_multipart_part *p = &form.parts[i];
        if (!is_image_part(p)) continue;
        sc->img[sc->n] = p->data;
        sc->img_len[sc->n] = p->len;
        snprintf(sc->img_name[sc->n], sizeof sc->img_name[0], "%s", p->filename[0] ? p->filename : p->name);
        sc->n++;
    }
    mts_multipart_free(&form);
    hr->user = sc; /* from here on every answer goes through fail()/respondv and response_sent */
    mts_model_status *st = malloc(sizeof *st);
    bool known = st && !mts_server_model_status_by_name(srv, model, st) && st->n_inputs > 0;
    free(st);
    if (known) {
        to_media(sc);
        return;
    }
    int rc = mts_server_load(srv, model, false, loaded, sc, &err);
    if (rc) fail(sc, rc, "%s", err.msg);
}

#define UPLOAD "POST a multipart/form-data upload"
const mts_route mts_segment_routes[] = {
    {"POST", "/api/v1/segment", route_segment, UPLOAD, MTS_SCOPE_INFER},
    {"POST", "/api/v1/batch-segment", route_segment, UPLOAD, MTS_SCOPE_INFER},
    {NULL, NULL, NULL, NULL, 0},
};
