/*
 * A composite batch (compose.h): per frame, pin the background frame in the cache, check its
 * crop rectangle, resize the mouth region into a patch, build the composited frame's row
 * pointers (only the rectangle's rows are copied) and encode (JPEG: by re-encoding only the
 * restart intervals around the rectangle onto the frame's cached encoding, jpeg_splice.h).
 * Scratch buffers are taken once per batch from the I/O buffer cache; timings are split into
 * background (cache), composite and encode.
 */
#include "media/compose.h"

#include "media/jpeg_splice.h"
#include "util/clock.h"
#include "util/iobuf.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

int mts_frame_format_parse(const char *s)
{
    if (!s || !s[0] || !strcasecmp(s, "jpeg") || !strcasecmp(s, "jpg")) return MTS_FRAME_JPEG;
    if (!strcasecmp(s, "png")) return MTS_FRAME_PNG;
    if (!strcasecmp(s, "rgb") || !strcasecmp(s, "raw")) return MTS_FRAME_RGB;
    return -1;
}

const char *mts_frame_format_name(mts_frame_format f)
{
    return f == MTS_FRAME_PNG ? "png" : f == MTS_FRAME_RGB ? "rgb" : "jpeg";
}

int mts_wrap_mode_parse(const char *s)
{
    if (!s || !s[0] || !strcasecmp(s, "loop")) return MTS_WRAP_LOOP;
    if (!strcasecmp(s, "pingpong") || !strcasecmp(s, "ping-pong")) return MTS_WRAP_PINGPONG;
    return -1;
}

int mts_frame_index(long long start, int i, int n, mts_wrap_mode w)
{
    if (n <= 1) return 0;
    long long k = start + i;
    if (w == MTS_WRAP_PINGPONG) {
        long long period = 2LL * n - 2, p = ((k % period) + period) % period;
        return (int)(p < n ? p : period - p);
    }
    return (int)(((k % n) + n) % n);
}

int mts_composite_quality(const mts_composite_opts *o)
{
    return o->quality > 0 ? (o->quality > 100 ? 100 : o->quality) : 85;
}

void mts_composite_out_free(mts_composite_out *out)
{
    mts_buf_free(&out->data);
    out->n = 0;
}

int mts_composite_batch(mts_bgcache *c, const float *mouths, int n, int side_w, int side_h,
                        const mts_composite_opts *o, mts_composite_out *out, mts_err *err)
{
    memset(out, 0, sizeof *out);
    if (n < 1 || n > MTS_COMPOSITE_MAX_FRAMES)
        return mts_err_set(err, MTS_EINVAL, "a composite batch has 1..%d frames, not %d", MTS_COMPOSITE_MAX_FRAMES, n);
    int W, H;
    mts_bgcache_size(c, &W, &H);
    out->n = n;
    out->width = W;
    out->height = H;
    const uint8_t **rows = malloc(sizeof *rows * (size_t)H);
    /* rectangle rows (at most the frame) and the resized patch: frame-sized blocks, reused from
     * the I/O buffer cache batch after batch instead of mapped and faulted in for each */
    uint8_t *scratch = mts_iobuf_alloc((size_t)W * H * 3);
    uint8_t *patch = mts_iobuf_alloc((size_t)W * H * 3);
    int rc = MTS_OK;
    if (!rows || !scratch || !patch) rc = mts_err_set(err, MTS_ENOMEM, "out of memory for compositing");
    size_t per = (size_t)3 * side_w * side_h;
    if (!rc && o->format == MTS_FRAME_RGB && mts_buf_append(&out->data, NULL, 0) == MTS_OK) {
        /* raw frames have a known size: one allocation for the batch */
        uint8_t *p = realloc(out->data.data, (size_t)n * W * H * 3);
        if (p) out->data.data = p, out->data.cap = (size_t)n * W * H * 3;
    }
    for (int i = 0; !rc && i < n; i++) {
        int idx = mts_frame_index(o->start_frame_idx, i, mts_bgcache_num_frames(c), o->wrap);
        out->frame_idx[i] = idx;
        double t0 = mts_now_ms();
        mts_bgframe *f = NULL;
        rc = mts_bgcache_get(c, idx, &f, err);
        double t1 = mts_now_ms();
        out->background_ms += t1 - t0;
        if (rc) {
            mts_err_prefix(err, "background frame %d: ", idx);
            break;
        }
        const mts_crop_rect *r = mts_bgcache_rect(c, idx);
        rc = mts_crop_check(r, f->img.width, f->img.height, idx, err);
        if (!rc) {
            mts_mouth_resize(mouths + per * (size_t)i, side_w, side_h, r->x2 - r->x1, r->y2 - r->y1, patch);
            mts_composite_rows(&f->img, r, patch, scratch, rows);
            double t2 = mts_now_ms();
            out->composite_ms += t2 - t1;
            out->offset[i] = out->data.len;
            if (o->format == MTS_FRAME_JPEG) {
                int q = mts_composite_quality(o);
                const mts_jpeg_bg *jb = mts_bgcache_jpeg(c, f, q);
                rc = jb ? mts_jpeg_bg_compose(jb, rows, r, &out->data, err)
                        : mts_jpeg_encode(rows, W, H, q, &out->data, err);
            } else if (o->format == MTS_FRAME_PNG) {
                rc = mts_png_encode(rows, W, H, o->png_level > 0 ? o->png_level : 1, &out->data, err);
            } else {
                for (int y = 0; !rc && y < H; y++) rc = mts_buf_append(&out->data, rows[y], (size_t)W * 3);
                if (rc) mts_err_set(err, MTS_ENOMEM, "out of memory for raw frames");
            }
            out->len[i] = out->data.len - out->offset[i];
            out->encode_ms += mts_now_ms() - t2;
        }
        mts_bgcache_put(c, f);
    }
    free(rows);
    mts_iobuf_free(scratch);
    mts_iobuf_free(patch);
    if (rc) mts_composite_out_free(out);
    return rc;
}
