/*
 * Helpers shared by the lip-sync front ends (lipsync_common.h): request checks, binding of the
 * raw frames to the model's inputs, compositing options, the output check, per-frame input
 * sizes and background prefetching on the media threads.
 */
#include "api/lipsync_common.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int64_t default_dims[2][3] = {{6, 320, 320}, {32, 16, 16}}; /* visual, audio */

int mts_lipsync_check_request(const mts_server *srv, const char *model, int batch_size, char *msg, size_t len)
{
    if (!model || !model[0]) {
        snprintf(msg, len, "model_id is required");
        return MTS_EINVAL;
    }
    int rc = mts_proto_find_model(srv, model, NULL, msg, len);
    if (rc) return rc;
    if (batch_size < 1 || batch_size > MTS_LIPSYNC_MAX_BATCH) {
        snprintf(msg, len, "batch_size is %d; expected 1..%d frames", batch_size, MTS_LIPSYNC_MAX_BATCH);
        return MTS_EINVAL;
    }
    return MTS_OK;
}

int mts_lipsync_composite_opts(const char *format, const char *wrap, int quality, int64_t start,
                               mts_composite_opts *o, char *msg, size_t len)
{
    int fmt = format ? mts_frame_format_parse(format) : MTS_FRAME_JPEG;
    int wr = wrap ? mts_wrap_mode_parse(wrap) : MTS_WRAP_LOOP;
    if (fmt < 0) {
        snprintf(msg, len, "format '%.40s' is not one of jpeg, png, rgb", format);
        return MTS_EINVAL;
    }
    if (wr < 0) {
        snprintf(msg, len, "wrap '%.40s' is not one of loop, pingpong", wrap);
        return MTS_EINVAL;
    }
    o->format = (mts_frame_format)fmt;
    o->quality = quality;
    o->png_level = 1;
    o->wrap = (mts_wrap_mode)wr;
    o->start_frame_idx = start;
    return MTS_OK;
}

int mts_lipsync_bind(const mts_model_status *st, const char *what, mts_lipsync_binding *b, char *msg, size_t len)
{
    if (st->n_inputs < 2 || st->n_outputs < 1) {
        snprintf(msg, len, "model '%s' has %d inputs and %d outputs; %s needs a lip-sync model with inputs visual "
                 "[N,6,320,320] and audio [N,32,16,16] and a mouth-region output", st->name, st->n_inputs,
                 st->n_outputs, what);
        return MTS_PROTO_EPRECONDITION;
    }
    int vi = 0, ai = 1;
    for (int i = 0; i < st->n_inputs; i++) {
        if (!strcmp(st->inputs[i].name, "visual")) vi = i;
        if (!strcmp(st->inputs[i].name, "audio")) ai = i;
    }
    if (vi == ai) vi = 0, ai = 1;
    if (st->inputs[vi].dtype != MTS_DTYPE_FLOAT || st->inputs[ai].dtype != MTS_DTYPE_FLOAT) {
        snprintf(msg, len, "model '%s': inputs '%s' and '%s' must be float32", st->name, st->inputs[vi].name,
                 st->inputs[ai].name);
        return MTS_PROTO_EPRECONDITION;
    }
    b->input[0] = vi;
    b->input[1] = ai;
    for (int k = 0; k < 2; k++)
        b->frame_elems[k] = mts_lipsync_frame_elems(&st->inputs[b->input[k]], default_dims[k], b->dims[k]);
    return MTS_OK;
}

void mts_lipsync_set_inputs(const mts_lipsync_binding *b, const mts_model_status *st, mts_request *req,
                            int batch_size, const void *visual, const void *audio,
                            char names[2][MTS_TENSOR_NAME_MAX], char out_name[MTS_TENSOR_NAME_MAX])
{
    const void *data[2] = {visual, audio};
    for (int k = 0; k < 2; k++) {
        mts_tensor *t = &req->inputs[k];
        t->dtype = MTS_DTYPE_FLOAT;
        t->rank = 4;
        t->dims[0] = batch_size;
        for (int d = 0; d < 3; d++) t->dims[d + 1] = b->dims[k][d];
        t->data = (void *)data[k];
        snprintf(names[k], MTS_TENSOR_NAME_MAX, "%s", st->inputs[b->input[k]].name);
        req->input_names[k] = names[k];
    }
    req->n_inputs = 2;
    snprintf(out_name, MTS_TENSOR_NAME_MAX, "%s", st->outputs[0].name);
    req->requested[0] = out_name;
    req->n_requested = 1;
}

int mts_lipsync_check_regions(const mts_request *req, int batch_size, const char *model, char *msg, size_t len)
{
    const mts_tensor *t = &req->outputs[0];
    if (req->n_outputs < 1 || t->dtype != MTS_DTYPE_FLOAT || t->rank != 4 || t->dims[0] != batch_size ||
        t->dims[1] != 3 || t->dims[2] < 1 || t->dims[3] < 1) {
        snprintf(msg, len, "model '%s' must produce float32 mouth regions [%d,3,H,W] as its first output to composite",
                 model, batch_size);
        return MTS_PROTO_EPRECONDITION;
    }
    return MTS_OK;
}

int mts_lipsync_asset_status(int status)
{
    return status == MTS_ENOMEM || status == MTS_EUNAVAILABLE ? status : MTS_PROTO_EPRECONDITION;
}

int64_t mts_lipsync_frame_elems(const mts_tensor_meta *m, const int64_t *def, int64_t dims[3])
{
    bool known = m->rank == 4;
    for (int d = 1; known && d < 4; d++) known = m->dims[d] > 0;
    int64_t n = 1;
    for (int d = 0; d < 3; d++) {
        dims[d] = known ? m->dims[d + 1] : def[d];
        n *= dims[d];
    }
    return n;
}

typedef struct prefetch_job {
    mts_bgcache *bg;
    int idx[2 * MTS_LIPSYNC_MAX_BATCH];
    int n;
} prefetch_job;

static void prefetch_run(void *arg)
{
    prefetch_job *p = arg;
    for (int i = 0; i < p->n; i++) mts_bgcache_preload(p->bg, p->idx[i]);
    mts_bgcache_unref(p->bg);
    free(p);
}

void mts_lipsync_prefetch(mts_server *srv, mts_bgcache *bg, const mts_composite_opts *o, int n)
{
    mts_workq *q = bg ? mts_server_media_queue(srv) : NULL;
    prefetch_job *p = q ? calloc(1, sizeof *p) : NULL;
    if (!p) return;
    if (n > MTS_LIPSYNC_MAX_BATCH) n = MTS_LIPSYNC_MAX_BATCH;
    int ahead = mts_bgcache_capacity(bg) >= 2 * n ? 2 * n : n;
    for (int i = 0; i < ahead; i++)
        p->idx[p->n++] = mts_frame_index(o->start_frame_idx, i, mts_bgcache_num_frames(bg), o->wrap);
    if (o->format == MTS_FRAME_JPEG) mts_bgcache_want_jpeg(bg, mts_composite_quality(o));
    p->bg = bg;
    mts_bgcache_ref(bg);
    if (mts_workq_submit(q, prefetch_run, p)) {
        mts_bgcache_unref(bg);
        free(p);
    }
}
