/*
 * The lip-sync inference.InferenceService (proto/lipsync.proto) over
 * the server core. InferBatch maps the documents' raw float32 byte arrays onto a model with two
 * inputs, visual [N,6,320,320] and audio [N,32,16,16] (taken by name when the model calls them
 * "visual" and "audio", else its first two inputs in order), checks every byte count against
 * batch_size x the model's frame size, and splits the first output into one RawMouthRegion per
 * frame. ListModels / LoadModel / UnloadModel / GetModelStats / Health report the registry,
 * devices and totals.
 *
 * InferBatchComposite (docs/media.md) runs the same inference, then composites each
 * mouth region onto the model's background frame start_frame_idx + i and encodes it. While the
 * batch is queued and running, the request's background frames are decoded ahead on the media
 * threads (mts_bgcache_preload); when inference completes, the worker only hands the batch to a
 * media thread, so compositing and encoding of one batch overlap the inference of the next and
 * never hold a device worker.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/grpc_internal.h"
#include "api/lipsync_common.h"
#include "lipsync.pb-c.h"
#include "media/compose.h"
#include "util/clock.h"
#include "util/iobuf.h"
#include "util/log.h"

typedef struct lip_call {
    mts_request req; /* first: the completion callback casts back */
    mts__grpc_call *call;
    Inference__InferBatchRequest *msg;      /* InferBatch */
    Inference__CompositeBatchRequest *cmsg; /* InferBatchComposite */
    /* the fields both requests share */
    const char *model_id;
    const ProtobufCBinaryData *visual, *audio;
    int batch_size;
    char names[2][MTS_TENSOR_NAME_MAX];
    char out_name[MTS_TENSOR_NAME_MAX];
    /* compositing */
    mts_bgcache *bg;
    mts_composite_opts opts;
    double t_done; /* inference completed (ms, monotonic) */
    double unpack_ms; /* parsing the request message */
    bool borrowed;    /* the message's frame bytes point into `slice` (lip_unpack) */
    grpc_slice slice; /* the request message, held while borrowed */
} lip_call;

/* One debug line per answered request: where its time went on the server (the transport's
 * event=grpc_sent line adds the sending). */
static void lip_log(const lip_call *l, const char *rpc, double reply_ms, double media_ms)
{
    if (!mts_log_enabled(MTS_LOG_DEBUG)) return;
    mts_log(MTS_LOG_DEBUG, "event=lipsync_reply rpc=%s model=%s frames=%d unpack_ms=%.2f queue_ms=%.2f compute_ms=%.2f "
            "media_ms=%.2f reply_ms=%.2f", rpc, l->model_id, l->batch_size, l->unpack_ms, l->req.queue_ms,
            l->req.compute_ms, media_ms, reply_ms);
}

/* ---- reading a request without copying its frames ---- */

/* The frame bytes of an InferBatchRequest / CompositeBatchRequest (fields 2 visual_frames and 3
 * audio_features in both, 40 MB for 16 frames) are not copied: they stay in the received message
 * (mts__pb_unpack_borrowing), 4-byte aligned for the float kernels, which the call then holds
 * (lip_call.slice) until lip_unborrow detaches them again before the message is freed. */
static const unsigned lip_fields[] = {2, 3};

static ProtobufCMessage *lip_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                                    bool *borrowed)
{
    /* (the message is the server's own copy: see mts__grpc_message_ref) */
    return mts__pb_unpack_borrowing(desc, (uint8_t *)data, len, lip_fields, 2, sizeof(float), borrowed);
}

/* Detaches borrowed frame bytes (those inside data..data+len) from a message before protobuf-c
 * frees it. */
static void lip_unborrow(void *msg, const uint8_t *data, size_t len, bool borrowed)
{
    if (borrowed) mts__pb_unborrow(msg, lip_fields, 2, data, len);
}

/* Frees a call once its answer (reply or error) has been handed to gRPC: the request's
 * end-to-end time ends here (nothing is recorded for requests never submitted). */
static void lip_free(lip_call *l)
{
    if (l->call) mts_server_request_answered(l->call->srv, &l->req); /* no call: built by a check only */
    mts_request_release(&l->req);
    lip_unborrow(l->msg ? (void *)l->msg : (void *)l->cmsg, GRPC_SLICE_START_PTR(l->slice), GRPC_SLICE_LENGTH(l->slice),
                 l->borrowed);
    if (l->msg) inference__infer_batch_request__free_unpacked(l->msg, NULL);
    if (l->cmsg) inference__composite_batch_request__free_unpacked(l->cmsg, NULL);
    if (l->borrowed) grpc_slice_unref(l->slice);
    mts_bgcache_unref(l->bg);
    free(l);
}

static void composite_done(mts_request *req, int status, const char *err);
static bool composite_prepare(lip_call *l);

/* ---- InferBatch ---- */

/* Base-128 varint of v at p; returns its length (at most 10). */
static size_t varint_put(uint8_t *p, uint64_t v)
{
    size_t k = 0;
    do {
        p[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return k;
}

static void iobuf_release(void *p)
{
    mts_iobuf_free(p);
}

/* The InferBatchResponse of a finished request, serialized without copying the mouth regions:
 * the byte buffer holds, per frame, a shared header slice (outputs = 1, a RawMouthRegion whose
 * data = 1 follows) and a slice of the output tensor itself, then the packed scalar fields
 * (protobuf fields may come in any order; the scalars are a message of their own appended).
 * The output buffer moves from the request to the slices and is freed when gRPC has sent
 * them. NULL when out of memory (the request keeps its output). */
static grpc_byte_buffer *raw_reply(mts_request *req, int batch_size)
{
    const mts_tensor *t = &req->outputs[0];
    size_t n = (size_t)batch_size, total = (size_t)mts_tensor_nbytes(t), per = total / n;
    uint8_t hdr[24];
    size_t h = 0;
    /* outputs (field 1, length-delimited): a RawMouthRegion of 1 + varint(per) + per bytes */
    uint8_t len_per[10];
    size_t inner = 1 + varint_put(len_per, per) + per;
    hdr[h++] = 1 << 3 | 2;
    h += varint_put(hdr + h, inner);
    hdr[h++] = 1 << 3 | 2; /* RawMouthRegion.data */
    h += varint_put(hdr + h, per);
    Inference__InferBatchResponse r = INFERENCE__INFER_BATCH_RESPONSE__INIT;
    r.inference_time_ms = (float)req->compute_ms;
    r.queue_time_ms = (float)req->queue_ms;
    r.success = 1;
    r.gpu_id = req->device;
    r.executed_batch_size = req->batch_size;
    size_t tail_len = inference__infer_batch_response__get_packed_size(&r);
    grpc_slice *sl = malloc(sizeof *sl * (2 * n + 1));
    if (!sl) return NULL;
    grpc_slice head = grpc_slice_from_copied_buffer((const char *)hdr, h);
    grpc_slice tail = grpc_slice_malloc(tail_len);
    inference__infer_batch_response__pack(&r, GRPC_SLICE_START_PTR(tail));
    void *data = t->data;
    grpc_slice all = grpc_slice_new_with_user_data(data, total, iobuf_release, data);
    req->outputs[0].data = NULL; /* owned by `all` and its sub-slices now */
    for (size_t i = 0; i < n; i++) {
        sl[2 * i] = head;
        sl[2 * i + 1] = grpc_slice_sub(all, i * per, (i + 1) * per);
    }
    sl[2 * n] = tail;
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, 2 * n + 1); /* takes references */
    for (size_t i = 0; i < n; i++) grpc_slice_unref(sl[2 * i + 1]);
    grpc_slice_unref(head);
    grpc_slice_unref(tail);
    grpc_slice_unref(all);
    free(sl);
    return bb;
}

static void infer_done(mts_request *req, int status, const char *err)
{
    lip_call *l = (lip_call *)req;
    mts__grpc_call *c = l->call;
    pthread_mutex_lock(&c->lock);
    c->state = NULL;
    pthread_mutex_unlock(&c->lock);
    if (status) {
        mts__grpc_fail_status(c, status, err);
    } else if (req->n_outputs < 1 || req->outputs[0].rank < 1 || req->outputs[0].dims[0] != l->batch_size) {
        mts__grpc_fail(c, MTS_GRPC_INTERNAL, "model '%s' did not produce a batch of %d mouth regions as its first output",
                       l->model_id, l->batch_size);
    } else {
        double t_reply = mts_now_ms();
        grpc_byte_buffer *bb = raw_reply(req, l->batch_size);
        if (bb) mts__grpc_reply_buffer(c, bb);
        else mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory building the reply");
        lip_log(l, "infer", mts_now_ms() - t_reply, 0);
    }
    lip_free(l);
    mts__grpc_call_unref(c);
}

/* Binds the frames of l to the inputs of the model of status st and fills l->req (inputs,
 * names, model). MTS_OK, or a status with the reason in buf. */
static int lip_bind_request(lip_call *l, const mts_model_status *st, char *buf, size_t len)
{
    mts_lipsync_binding b;
    int rc = mts_lipsync_bind(st, "InferBatch", &b, buf, len);
    if (rc) return rc;
    const ProtobufCBinaryData *bytes[2] = {l->visual, l->audio};
    static const char *const field[2] = {"visual_frames", "audio_features"};
    for (int k = 0; k < 2; k++) {
        uint64_t want = (uint64_t)l->batch_size * mts_lipsync_frame_bytes(&b, k);
        if (bytes[k]->len != want) {
            snprintf(buf, len, "%s has %zu bytes; batch_size %d x %lldx%lldx%lld float32 needs %llu", field[k],
                     bytes[k]->len, l->batch_size, (long long)b.dims[k][0], (long long)b.dims[k][1],
                     (long long)b.dims[k][2], (unsigned long long)want);
            return MTS_EINVAL;
        }
    }
    mts_lipsync_set_inputs(&b, st, &l->req, l->batch_size, l->visual->data, l->audio->data, l->names, l->out_name);
    l->req.model = l->model_id;
    return MTS_OK;
}

/* With the model's signature known: binds the inputs, checks sizes, submits. Takes over l. */
static void infer_submit(lip_call *l)
{
    mts__grpc_call *c = l->call;
    mts_model_status *st = malloc(sizeof *st);
    char buf[600];
    int rc;
    if (!st || mts_server_model_status_by_name(c->srv, l->model_id, st)) {
        mts__grpc_fail_status(c, MTS_ENOTFOUND, mts_proto_unknown_model(buf, sizeof buf, l->model_id));
        goto fail;
    }
    if ((rc = lip_bind_request(l, st, buf, sizeof buf))) {
        mts__grpc_fail_status(c, rc, buf);
        goto fail;
    }
    l->req.done = l->cmsg ? composite_done : infer_done;
    if (l->cmsg && !composite_prepare(l)) goto fail;
    int64_t timeout = mts__grpc_timeout_us(c);
    if (timeout < 0) {
        mts__grpc_fail_status(c, MTS_ETIMEDOUT, "the deadline passed before the request was queued");
        goto fail;
    }
    l->req.timeout_us = timeout;
    free(st);
    st = NULL;
    pthread_mutex_lock(&c->lock);
    c->state = l;
    pthread_mutex_unlock(&c->lock);
    int retry = 0;
    mts_err err = {0};
    rc = mts_server_submit(c->srv, &l->req, &retry, &err);
    if (!rc) return; /* infer_done owns l and the call reference now */
    pthread_mutex_lock(&c->lock);
    c->state = NULL;
    pthread_mutex_unlock(&c->lock);
    mts__grpc_fail_status(c, rc, err.msg);
fail:
    free(st);
    lip_free(l);
    mts__grpc_call_unref(c);
}

static void infer_loaded(void *user, int status, const char *msg)
{
    lip_call *l = user;
    if (status) {
        mts__grpc_fail_status(l->call, status, msg);
        mts__grpc_call_unref(l->call);
        lip_free(l);
        return;
    }
    infer_submit(l);
}

/* Submits at once when the model's signature is known, else loads it first. Takes over l. */
static void lip_start(lip_call *l)
{
    mts__grpc_call *c = l->call;
    mts_model_status *st = malloc(sizeof *st);
    bool known = st && !mts_server_model_status_by_name(c->srv, l->model_id, st) && st->n_inputs > 0;
    free(st);
    if (known) {
        infer_submit(l);
        return;
    }
    /* First use: the signature is known once the model has been loaded. */
    mts_err err = {0};
    int rc = mts_server_load(c->srv, l->model_id, false, infer_loaded, l, &err);
    if (rc) {
        mts__grpc_fail_status(c, rc, err.msg);
        mts__grpc_call_unref(c);
        lip_free(l);
    }
}

/* A new call for the request both RPCs share the fields of, after the checks they share;
 * NULL after failing the call. */
static lip_call *lip_new(mts__grpc_call *c, const char *model_id, int batch_size, const ProtobufCBinaryData *visual,
                         const ProtobufCBinaryData *audio)
{
    char buf[400];
    int rc = mts_lipsync_check_request(c->srv, model_id, batch_size, buf, sizeof buf);
    lip_call *l = rc ? NULL : calloc(1, sizeof *l);
    if (rc) mts__grpc_fail_status(c, rc, buf);
    else if (!l) mts__grpc_fail_status(c, MTS_ENOMEM, "out of memory");
    if (!l) return NULL;
    l->call = c;
    l->req.arrival_ns = mts_server_clock_ns();
    l->model_id = model_id;
    l->visual = visual;
    l->audio = audio;
    l->batch_size = batch_size;
    return l;
}

static void infer_batch(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    double t0 = mts_now_ms();
    bool borrowed;
    Inference__InferBatchRequest *m = (Inference__InferBatchRequest *)lip_unpack(&inference__infer_batch_request__descriptor, data, len, &borrowed);
    double unpack_ms = mts_now_ms() - t0;
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "the request is not a valid inference.InferBatchRequest");
        return;
    }
    lip_call *l = lip_new(c, m->model_id, m->batch_size, &m->visual_frames, &m->audio_features);
    if (!l) {
        lip_unborrow(m, data, len, borrowed);
        inference__infer_batch_request__free_unpacked(m, NULL);
        return;
    }
    l->msg = m;
    l->unpack_ms = unpack_ms;
    if ((l->borrowed = borrowed)) l->slice = mts__grpc_message_ref(c);
    mts__grpc_call_ref(c);
    lip_start(l);
}

static void infer_cancel(mts__grpc_call *c)
{
    pthread_mutex_lock(&c->lock);
    if (c->state) mts_request_cancel(&((lip_call *)c->state)->req);
    pthread_mutex_unlock(&c->lock);
}

/* ---- InferBatchComposite ---- */

/* Before submitting: the background cache of the resident version (fails the call when the
 * assets are unusable) and the prefetch. Returns false after failing the call. */
static bool composite_prepare(lip_call *l)
{
    mts_err err = {0};
    int rc = mts_server_bgcache_acquire(l->call->srv, l->model_id, &l->bg, &err);
    if (rc == MTS_EUNAVAILABLE) return true; /* not resident: acquired after the inference */
    if (rc) {
        mts__grpc_fail_status(l->call, mts_lipsync_asset_status(rc), err.msg);
        return false;
    }
    mts_lipsync_prefetch(l->call->srv, l->bg, &l->opts, l->batch_size);
    return true;
}

/* On a media thread (or inline): composite, encode, reply. Takes over l and its call ref. */
static void composite_run(void *arg)
{
    lip_call *l = arg;
    mts__grpc_call *c = l->call;
    mts_request *req = &l->req;
    double t_start = mts_now_ms();
    mts_err err = {0};
    int rc = MTS_OK;
    if (!l->bg) rc = mts_server_bgcache_acquire(c->srv, l->model_id, &l->bg, &err);
    const mts_tensor *t = &req->outputs[0];
    mts_composite_out out;
    if (!rc && atomic_load(&c->cancelled)) rc = mts_err_set(&err, MTS_ECANCELLED, "cancelled");
    if (!rc)
        rc = mts_composite_batch(l->bg, t->data, l->batch_size, (int)t->dims[3], (int)t->dims[2], &l->opts, &out, &err);
    if (rc) {
        if (rc == MTS_ECANCELLED) mts__grpc_fail_status(c, MTS_ECANCELLED, "cancelled");
        else mts__grpc_fail(c, mts_proto_grpc_code(mts_lipsync_asset_status(rc)), "model '%s': compositing failed: %s",
                            l->model_id, err.msg);
    } else {
        mts__grpc_arena a = {0};
        Inference__CompositeBatchResponse r = INFERENCE__COMPOSITE_BATCH_RESPONSE__INIT;
        r.n_frames = (size_t)out.n;
        r.frames = mts__grpc_alloc(&a, sizeof *r.frames * (size_t)out.n);
        const char *fmt = mts_frame_format_name(l->opts.format);
        for (int i = 0; i < out.n; i++) {
            Inference__CompositedFrame *f = MTS__GRPC_NEW(&a, Inference__CompositedFrame, INFERENCE__COMPOSITED_FRAME__INIT);
            f->data.data = out.data.data + out.offset[i];
            f->data.len = out.len[i];
            f->frame_idx = out.frame_idx[i];
            f->format = (char *)fmt;
            f->width = out.width;
            f->height = out.height;
            r.frames[i] = f;
        }
        r.inference_time_ms = (float)req->compute_ms;
        r.success = 1;
        r.composite_time_ms = (float)out.composite_ms;
        r.gpu_id = req->device;
        r.encode_time_ms = (float)out.encode_ms;
        r.background_time_ms = (float)out.background_ms;
        r.queue_time_ms = (float)req->queue_ms;
        r.executed_batch_size = req->batch_size;
        r.media_queue_time_ms = (float)(t_start - l->t_done);
        r.num_frames = mts_bgcache_num_frames(l->bg);
        double t_reply = mts_now_ms();
        mts__grpc_reply(c, &r.base);
        mts__grpc_arena_free(&a);
        mts_composite_out_free(&out);
        lip_log(l, "composite", mts_now_ms() - t_reply, t_reply - l->t_done);
    }
    lip_free(l);
    mts__grpc_call_unref(c);
}

/* On the device worker: checks the output and hands the batch to a media thread. */
static void composite_done(mts_request *req, int status, const char *err)
{
    lip_call *l = (lip_call *)req;
    mts__grpc_call *c = l->call;
    pthread_mutex_lock(&c->lock);
    c->state = NULL;
    pthread_mutex_unlock(&c->lock);
    char buf[300];
    int rc = status ? status : mts_lipsync_check_regions(req, l->batch_size, l->model_id, buf, sizeof buf);
    if (rc) {
        mts__grpc_fail_status(c, rc, status ? err : buf);
    } else {
        l->t_done = mts_now_ms();
        mts_workq *q = mts_server_media_queue(c->srv);
        if (!q || mts_workq_submit(q, composite_run, l)) composite_run(l); /* shutting down: inline */
        return;
    }
    lip_free(l);
    mts__grpc_call_unref(c);
}

static void infer_batch_composite(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    double t0 = mts_now_ms();
    bool borrowed;
    Inference__CompositeBatchRequest *m = (Inference__CompositeBatchRequest *)lip_unpack(&inference__composite_batch_request__descriptor, data, len, &borrowed);
    double unpack_ms = mts_now_ms() - t0;
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "the request is not a valid inference.CompositeBatchRequest");
        return;
    }
    lip_call *l = lip_new(c, m->model_id, m->batch_size, &m->visual_frames, &m->audio_features);
    char buf[200];
    int rc = l ? mts_lipsync_composite_opts(m->format, m->wrap, m->jpeg_quality ? m->jpeg_quality : 85,
                                            m->start_frame_idx, &l->opts, buf, sizeof buf)
               : MTS_OK;
    if (l && rc) {
        mts__grpc_fail_status(c, rc, buf);
    } else if (l && (m->jpeg_quality < 0 || m->jpeg_quality > 100)) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "jpeg_quality is %d; expected 1..100 (0 = 85)", m->jpeg_quality);
    } else if (l) {
        l->cmsg = m;
        l->unpack_ms = unpack_ms;
        if ((l->borrowed = borrowed)) l->slice = mts__grpc_message_ref(c);
        mts__grpc_call_ref(c);
        lip_start(l);
        return;
    }
    free(l);
    lip_unborrow(m, data, len, borrowed);
    inference__composite_batch_request__free_unpacked(m, NULL);
}

/* ---- registry reports ---- */

static Inference__ModelInfo *model_info(mts__grpc_arena *a, const mts_server *srv, const mts_model_status *st)
{
    const mts_model_config *mc = mts_config_find_model(mts_server_config(srv), st->name);
    Inference__ModelInfo *m = MTS__GRPC_NEW(a, Inference__ModelInfo, INFERENCE__MODEL_INFO__INIT);
    m->model_id = mts__grpc_strdup(a, st->name);
    m->loaded = st->state == MTS_MODEL_READY;
    m->state = (char *)mts_model_state_name(st->state);
    m->gpu_id = st->device;
    m->model_path = mts__grpc_strdup(a, mc && mc->model_path ? mc->model_path : "");
    m->reason = mts__grpc_strdup(a, st->reason);
    m->pinned = st->pinned;
    m->max_batch = st->max_batch;
    m->version = st->version;
    Inference__ModelStats *s = MTS__GRPC_NEW(a, Inference__ModelStats, INFERENCE__MODEL_STATS__INIT);
    s->usage_count = (int64_t)st->usage_count;
    s->total_inference_time_ms = st->total_inference_ms;
    s->memory_bytes = st->memory_bytes;
    s->last_used_unix_ms = st->last_used_ms;
    s->loaded_at_unix_ms = st->loaded_at_ms;
    s->avg_inference_time_ms = st->execution_count ? st->total_inference_ms / (double)st->execution_count : 0;
    s->inference_count = st->inference_count;
    s->execution_count = st->execution_count;
    s->queue_depth = st->queue_depth;
    s->loads = st->loads;
    s->unloads = st->unloads;
    s->evictions = st->evictions;
    s->load_failures = st->load_failures;
    s->last_load_ms = st->last_load_ms;
    if (st->has_bgcache || st->bg_error[0]) {
        Inference__BackgroundCacheStats *b =
            MTS__GRPC_NEW(a, Inference__BackgroundCacheStats, INFERENCE__BACKGROUND_CACHE_STATS__INIT);
        const mts_bgcache_stats *bs = &st->bgcache;
        b->enabled = st->has_bgcache;
        b->error = mts__grpc_strdup(a, st->bg_error);
        b->requests = bs->requests;
        b->hits = bs->hits;
        b->misses = bs->misses;
        b->hit_rate = bs->hit_rate;
        b->evictions = bs->evictions;
        b->avg_load_ms = bs->avg_load_ms;
        b->preloads = bs->preloads;
        b->load_errors = bs->load_errors;
        b->frames_cached = bs->frames_cached;
        b->capacity_frames = bs->capacity_frames;
        b->num_frames = bs->num_frames;
        b->bytes = bs->bytes;
        b->capacity_bytes = bs->capacity_bytes;
        b->width = bs->width;
        b->height = bs->height;
        s->background_cache = b;
    }
    m->stats = s;
    return m;
}

static Inference__DeviceStats **device_stats(mts__grpc_arena *a, mts_server *srv, size_t *n)
{
    int nd = mts_server_device_count(srv);
    Inference__DeviceStats **out = mts__grpc_alloc(a, sizeof *out * (size_t)(nd + 1));
    for (int d = 0; d < nd; d++) {
        mts_device_status ds;
        mts_server_device_status(srv, d, &ds);
        Inference__DeviceStats *s = MTS__GRPC_NEW(a, Inference__DeviceStats, INFERENCE__DEVICE_STATS__INIT);
        s->gpu_id = d;
        s->kind = "CPU";
        s->models = ds.models;
        s->memory_used_bytes = ds.bytes_used;
        s->memory_total_bytes = ds.bytes_budget;
        s->workers = ds.workers;
        s->busy_workers = ds.busy_workers;
        s->queue_depth = ds.queue_depth;
        s->threads = ds.threads;
        out[d] = s;
    }
    *n = (size_t)nd;
    return out;
}

/* All models (or the one named) as ModelInfo; returns false (and fails the call) if unknown. */
static bool collect_models(mts__grpc_call *c, mts__grpc_arena *a, const char *only, Inference__ModelInfo ***out,
                           size_t *n_out, int *loaded)
{
    int n = mts_server_model_count(c->srv);
    Inference__ModelInfo **models = mts__grpc_alloc(a, sizeof *models * (size_t)(n + 1));
    mts_model_status *st = malloc(sizeof *st);
    size_t k = 0;
    *loaded = 0;
    if (!st) {
        mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    if (only && only[0]) {
        char buf[300];
        if (mts_server_model_status_by_name(c->srv, only, st)) {
            free(st);
            mts__grpc_fail_status(c, MTS_ENOTFOUND, mts_proto_unknown_model(buf, sizeof buf, only));
            return false;
        }
        models[k++] = model_info(a, c->srv, st);
        *loaded = st->state == MTS_MODEL_READY;
    } else {
        for (int i = 0; i < n; i++) {
            if (mts_server_model_status(c->srv, i, st)) continue;
            models[k++] = model_info(a, c->srv, st);
            if (st->state == MTS_MODEL_READY) (*loaded)++;
        }
    }
    free(st);
    *out = models;
    *n_out = k;
    return true;
}

static void list_models(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    mts__grpc_arena a = {0};
    Inference__ListModelsResponse r = INFERENCE__LIST_MODELS_RESPONSE__INIT;
    int loaded = 0;
    if (collect_models(c, &a, NULL, &r.models, &r.n_models, &loaded)) {
        r.total_models = (int32_t)r.n_models;
        r.loaded_models = loaded;
        mts__grpc_reply(c, &r.base);
    }
    mts__grpc_arena_free(&a);
}

static void get_model_stats(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    Inference__GetModelStatsRequest *m = inference__get_model_stats_request__unpack(NULL, len, data);
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "the request is not a valid inference.GetModelStatsRequest");
        return;
    }
    mts__grpc_arena a = {0};
    Inference__GetModelStatsResponse r = INFERENCE__GET_MODEL_STATS_RESPONSE__INIT;
    int loaded = 0;
    if (collect_models(c, &a, m->model_id, &r.models, &r.n_models, &loaded)) {
        r.devices = device_stats(&a, c->srv, &r.n_devices);
        mts_server_totals t;
        mts_server_totals_get(c->srv, &t);
        Inference__GlobalStats *g = MTS__GRPC_NEW(&a, Inference__GlobalStats, INFERENCE__GLOBAL_STATS__INIT);
        g->total_models = mts_server_model_count(c->srv);
        g->loaded_models = t.resident_models;
        g->total_memory_bytes = t.resident_bytes;
        g->requests_submitted = t.submitted;
        g->requests_completed = t.completed;
        g->requests_failed = t.failed;
        g->rejected_queue_full = t.rejected_full;
        g->timed_out = t.timed_out;
        g->cancelled = t.cancelled;
        g->queue_depth = t.queue_depth;
        g->uptime_s = t.uptime_s;
        r.totals = g;
        mts__grpc_reply(c, &r.base);
    }
    mts__grpc_arena_free(&a);
    inference__get_model_stats_request__free_unpacked(m, NULL);
}

static void health(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    mts__grpc_arena a = {0};
    Inference__HealthResponse r = INFERENCE__HEALTH_RESPONSE__INIT;
    mts_server_totals t;
    mts_server_totals_get(c->srv, &t);
    r.healthy = !t.shutting_down;
    r.status = t.shutting_down ? "SHUTTING_DOWN" : "SERVING";
    r.cuda_available = 0;
    r.total_models = mts_server_model_count(c->srv);
    r.devices = device_stats(&a, c->srv, &r.n_devices);
    r.loaded_model_ids = mts__grpc_alloc(&a, sizeof(char *) * (size_t)(r.total_models + 1));
    mts_model_status *st = malloc(sizeof *st);
    for (int i = 0; st && i < r.total_models; i++)
        if (!mts_server_model_status(c->srv, i, st) && st->state == MTS_MODEL_READY)
            r.loaded_model_ids[r.n_loaded_model_ids++] = mts__grpc_strdup(&a, st->name);
    free(st);
    r.loaded_models = (int32_t)r.n_loaded_model_ids;
    r.version = "mtserve 0.1.0";
    r.uptime_s = t.uptime_s;
    mts__grpc_reply(c, &r.base);
    mts__grpc_arena_free(&a);
}

/* ---- LoadModel / UnloadModel ---- */

typedef struct load_call {
    mts__grpc_call *call;
    char model[256];
    double t0;
    bool was_ready;
    bool force;
} load_call;

static void load_done(void *user, int status, const char *msg)
{
    load_call *lc = user;
    mts__grpc_call *c = lc->call;
    if (status) {
        mts__grpc_fail_status(c, status, msg);
    } else {
        mts__grpc_arena a = {0};
        Inference__LoadModelResponse r = INFERENCE__LOAD_MODEL_RESPONSE__INIT;
        mts_model_status *st = malloc(sizeof *st);
        if (st && !mts_server_model_status_by_name(c->srv, lc->model, st)) r.model = model_info(&a, c->srv, st);
        r.success = 1;
        r.load_time_ms = lc->was_ready && !lc->force ? 0 : mts_now_ms() - lc->t0;
        char text[400];
        snprintf(text, sizeof text, "model '%s' %s", lc->model,
                 lc->was_ready && !lc->force ? "was already loaded" : lc->force ? "reloaded" : "loaded");
        r.message = text;
        mts__grpc_reply(c, &r.base);
        free(st);
        mts__grpc_arena_free(&a);
    }
    mts__grpc_call_unref(c);
    free(lc);
}

static void load_model(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    Inference__LoadModelRequest *m = inference__load_model_request__unpack(NULL, len, data);
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "the request is not a valid inference.LoadModelRequest");
        return;
    }
    mts_model_status *st = malloc(sizeof *st);
    load_call *lc = calloc(1, sizeof *lc);
    char buf[300];
    if (!st || !lc) {
        mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        free(lc);
    } else if (!m->model_id[0]) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "model_id is required");
        free(lc);
    } else if (mts_server_model_status_by_name(c->srv, m->model_id, st)) {
        mts__grpc_fail_status(c, MTS_ENOTFOUND, mts_proto_unknown_model(buf, sizeof buf, m->model_id));
        free(lc);
    } else {
        lc->call = c;
        snprintf(lc->model, sizeof lc->model, "%s", m->model_id);
        lc->t0 = mts_now_ms();
        lc->was_ready = st->state == MTS_MODEL_READY;
        lc->force = m->force_reload;
        mts__grpc_call_ref(c);
        mts_err err = {0};
        int rc = mts_server_load(c->srv, m->model_id, m->force_reload, load_done, lc, &err);
        if (rc) {
            mts__grpc_fail_status(c, rc, err.msg);
            mts__grpc_call_unref(c);
            free(lc);
        }
    }
    free(st);
    inference__load_model_request__free_unpacked(m, NULL);
}

typedef struct unload_call {
    mts__grpc_call *call;
    char model[256];
} unload_call;

static void unload_done(void *user, int status, const char *msg)
{
    unload_call *uc = user;
    if (status) {
        mts__grpc_fail_status(uc->call, status, msg);
    } else {
        Inference__UnloadModelResponse r = INFERENCE__UNLOAD_MODEL_RESPONSE__INIT;
        char text[400];
        snprintf(text, sizeof text, "model '%s' unloaded", uc->model);
        r.success = 1;
        r.message = text;
        mts__grpc_reply(uc->call, &r.base);
    }
    mts__grpc_call_unref(uc->call);
    free(uc);
}

static void unload_model(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    Inference__UnloadModelRequest *m = inference__unload_model_request__unpack(NULL, len, data);
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "the request is not a valid inference.UnloadModelRequest");
        return;
    }
    char buf[300];
    unload_call *uc = NULL;
    if (!m->model_id[0]) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "model_id is required");
    } else if (!mts_server_has_model(c->srv, m->model_id)) {
        mts__grpc_fail_status(c, MTS_ENOTFOUND, mts_proto_unknown_model(buf, sizeof buf, m->model_id));
    } else if (!(uc = calloc(1, sizeof *uc))) {
        mts__grpc_fail(c, MTS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        uc->call = c;
        snprintf(uc->model, sizeof uc->model, "%s", m->model_id);
        mts__grpc_call_ref(c);
        mts_err err = {0};
        int rc = mts_server_unload(c->srv, m->model_id, unload_done, uc, &err);
        if (rc) {
            mts__grpc_fail_status(c, rc, err.msg);
            mts__grpc_call_unref(c);
            free(uc);
        }
    }
    inference__unload_model_request__free_unpacked(m, NULL);
}

#define LS "/inference.InferenceService/"
const mts__grpc_method mts__grpc_lipsync_methods[] = {
    {LS "InferBatch", false, infer_batch, NULL, infer_cancel, NULL, MTS_SCOPE_INFER, false, 1},
    {LS "InferBatchComposite", false, infer_batch_composite, NULL, infer_cancel, NULL, MTS_SCOPE_INFER, false, 1},
    {LS "ListModels", false, list_models, NULL, NULL, NULL, MTS_SCOPE_INFER, false, 0},
    {LS "LoadModel", false, load_model, NULL, NULL, NULL, MTS_SCOPE_ADMIN, false, 0},
    {LS "UnloadModel", false, unload_model, NULL, NULL, NULL, MTS_SCOPE_ADMIN, false, 0},
    {LS "GetModelStats", false, get_model_stats, NULL, NULL, NULL, MTS_SCOPE_INFER, false, 0},
    {LS "Health", false, health, NULL, NULL, NULL, MTS_SCOPE_OPEN, false, 0},
    {NULL, false, NULL, NULL, NULL, NULL, 0, false, 0},
};

/* ---- the request checks without a call (for the fuzzer) ---- */

int mts__grpc_lipsync_check(mts_server *srv, bool composite, const uint8_t *data, size_t len, char *msg,
                            size_t msglen)
{
    Inference__InferBatchRequest *m = NULL;
    Inference__CompositeBatchRequest *cm = NULL;
    lip_call *l = calloc(1, sizeof *l);
    mts_model_status *st = malloc(sizeof *st);
    /* on a copy: lip_unpack may move the frame bytes within the message */
    uint8_t *copy = malloc(len ? len : 1);
    bool borrowed = false;
    int rc = MTS_OK;
    if (!l || !st || !copy) {
        snprintf(msg, msglen, "out of memory");
        rc = MTS_ENOMEM;
        goto done;
    }
    {
        memcpy(copy, data, len);
        if (composite) cm = (Inference__CompositeBatchRequest *)lip_unpack(&inference__composite_batch_request__descriptor, copy, len, &borrowed);
        else m = (Inference__InferBatchRequest *)lip_unpack(&inference__infer_batch_request__descriptor, copy, len, &borrowed);
    }
    if (!m && !cm) {
        snprintf(msg, msglen, "the request is not a valid inference.%s",
                 composite ? "CompositeBatchRequest" : "InferBatchRequest");
        rc = MTS_EINVAL;
        goto done;
    }
    l->msg = m;
    l->cmsg = cm;
    l->borrowed = borrowed;
    l->slice = borrowed ? grpc_slice_from_static_buffer(copy, len) : grpc_empty_slice(); /* (freed below) */
    l->model_id = m ? m->model_id : cm->model_id;
    l->batch_size = m ? m->batch_size : cm->batch_size;
    l->visual = m ? &m->visual_frames : &cm->visual_frames;
    l->audio = m ? &m->audio_features : &cm->audio_features;
    rc = mts_lipsync_check_request(srv, l->model_id, l->batch_size, msg, msglen);
    if (!rc && cm)
        rc = mts_lipsync_composite_opts(cm->format, cm->wrap, cm->jpeg_quality ? cm->jpeg_quality : 85,
                                        cm->start_frame_idx, &l->opts, msg, msglen);
    if (!rc && cm && (cm->jpeg_quality < 0 || cm->jpeg_quality > 100)) {
        snprintf(msg, msglen, "jpeg_quality is %d; expected 1..100 (0 = 85)", cm->jpeg_quality);
        rc = MTS_EINVAL;
    }
    if (!rc && !mts_server_model_status_by_name(srv, l->model_id, st) && st->n_inputs > 0)
        rc = lip_bind_request(l, st, msg, msglen);
done:
    free(st);
    if (l) lip_free(l); /* (m and cm are only set with l) */
    free(copy);
    return rc;
}
