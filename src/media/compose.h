/*
 * One composite batch: for each of the model's N mouth regions (N x 3 x S x S float32 planar),
 * pick background frame idx(start + i), resize the region to that frame's crop rectangle, paste
 * it over the frame and encode the result as JPEG, PNG or raw RGB. All N encoded frames land in
 * one buffer (offsets per frame) so front ends can reference them without copying.
 *
 * Frame indices wrap over num_frames. MTS_WRAP_LOOP: idx = (start + i) mod n (0 1 2 .. n-1 0 1
 * ..). MTS_WRAP_PINGPONG: the sequence runs forward then backward without repeating the end
 * frames (0 1 .. n-1 n-2 .. 1 0 1 ..), period 2n - 2. Negative starts wrap the same way.
 */
#ifndef MTS_MEDIA_COMPOSE_H
#define MTS_MEDIA_COMPOSE_H

#include <stddef.h>

#include "media/bgcache.h"
#include "media/image.h"

typedef enum mts_frame_format { MTS_FRAME_JPEG = 0, MTS_FRAME_PNG, MTS_FRAME_RGB } mts_frame_format;
typedef enum mts_wrap_mode { MTS_WRAP_LOOP = 0, MTS_WRAP_PINGPONG } mts_wrap_mode;

/* "jpeg"|"jpg" / "png" / "rgb"|"raw" ("" = jpeg); -1 if unknown. Name of a format. */
int mts_frame_format_parse(const char *s);
const char *mts_frame_format_name(mts_frame_format f);
/* "loop" ("" = loop) / "pingpong"|"ping-pong"; -1 if unknown. */
int mts_wrap_mode_parse(const char *s);

int mts_frame_index(long long start, int i, int n, mts_wrap_mode w);

typedef struct mts_composite_opts {
    mts_frame_format format;
    int quality;       /* JPEG 1..100 (0: 85) */
    int png_level;     /* zlib level for PNG (default 1 when 0 is not wanted: pass -1) */
    mts_wrap_mode wrap;
    long long start_frame_idx;
} mts_composite_opts;

/* The JPEG quality a request gets: o->quality clamped to 1..100, 85 when 0. */
int mts_composite_quality(const mts_composite_opts *o);

#define MTS_COMPOSITE_MAX_FRAMES 256

typedef struct mts_composite_out {
    int n, width, height;
    mts_buf data;                               /* every frame, back to back */
    size_t offset[MTS_COMPOSITE_MAX_FRAMES], len[MTS_COMPOSITE_MAX_FRAMES];
    int frame_idx[MTS_COMPOSITE_MAX_FRAMES];
    double background_ms; /* waiting for / decoding background frames (cache misses) */
    double composite_ms;  /* resize + paste */
    double encode_ms;     /* JPEG / PNG encoding (RGB: the copy into the output) */
} mts_composite_out;

/* mouths: n regions of 3 x side_h x side_w floats. On error out holds nothing (freed) and err
 * names the frame. */
int mts_composite_batch(mts_bgcache *c, const float *mouths, int n, int side_w, int side_h,
                        const mts_composite_opts *o, mts_composite_out *out, mts_err *err);
void mts_composite_out_free(mts_composite_out *out);

#endif
