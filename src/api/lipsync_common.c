/*
 * Helpers shared by the lip-sync front ends: per-frame input sizes and background prefetching
 * on the media threads (see lipsync_common.h).
 */
#include "api/lipsync_common.h"

#include <stdbool.h>
#include <stdlib.h>

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
