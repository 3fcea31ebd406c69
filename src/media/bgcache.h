/*
 * The background frame cache of one lip-sync model ("avatar"): its assets (a folder of numbered
 * PNG frames and a JSON file of crop rectangles, one per frame) and an LRU cache of decoded
 * frames. Frames are decoded on demand (or ahead of use through mts_bgcache_preload), at most
 * `capacity` stay decoded, and the least recently used frame nobody is reading is evicted.
 *
 * Assets (mts_bgcache_open):
 *   background_dir   every *.png whose name ends in a number ("000017.png", "frame_17.png"); the
 *                    numbers must be consecutive (any start); frame index i is the i-th number.
 *   crop_rects_path  JSON: a list indexed by frame ([[x1,y1,x2,y2], ...] or
 *                    [{"x1":..,"y1":..,"x2":..,"y2":..}, ...]) or an object keyed by the decimal
 *                    frame index ({"0": [..], "1": {..}}); every frame index needs a rectangle.
 *   num_frames       0: the number of PNG files; otherwise it must equal that number.
 * Problems found when opening (no PNG files, numbering gap, num_frames mismatch, unreadable or
 * invalid JSON, a missing rectangle) fail the open with a message naming the file and index.
 * Problems of one frame (missing or corrupt file, a size different from the first frame, a crop
 * rectangle outside the frame) surface from mts_bgcache_get for the requests that use it.
 *
 * Thread safety: every function may be called from any thread. One mutex guards the table; PNG
 * decoding runs outside it, and concurrent requests for a frame being decoded wait for that
 * decode instead of starting another. A frame handed out by mts_bgcache_get stays valid (it
 * is never evicted) until mts_bgcache_put. The cache is reference counted (the model version
 * that owns it holds one reference, requests in flight hold others).
 */
#ifndef MTS_MEDIA_BGCACHE_H
#define MTS_MEDIA_BGCACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "media/composite.h"
#include "media/image.h"
#include "util/status.h"

typedef struct mts_bgcache mts_bgcache;

typedef struct mts_bgcache_config {
    const char *model;           /* for messages */
    const char *background_dir;
    const char *crop_rects_path;
    int num_frames;              /* 0: count the files */
    int capacity;                /* decoded frames kept; >= 1 */
} mts_bgcache_config;

typedef struct mts_bgcache_stats {
    uint64_t requests;    /* frame lookups by composites */
    uint64_t hits;        /* ... that found the frame decoded (or being decoded by a preload) */
    uint64_t misses;      /* ... that decoded it themselves */
    uint64_t evictions;
    uint64_t preloads;    /* frames decoded ahead of use by mts_bgcache_preload */
    uint64_t load_errors; /* decodes that failed (missing/corrupt file, wrong size) */
    uint64_t loads;       /* decodes done (misses + preloads, successful) */
    uint64_t jpeg_spliced; /* JPEG frames encoded by splicing onto the frame's cached encoding */
    uint64_t jpeg_full;    /* JPEG frames encoded whole (no cached encoding at that quality yet) */
    double total_load_ms;
    double hit_rate;      /* hits / requests (0 when no requests) */
    double avg_load_ms;   /* total_load_ms / loads */
    int frames_cached, capacity_frames, num_frames, width, height;
    int64_t bytes;          /* decoded frames and their JPEG encodings held now */
    int64_t capacity_bytes; /* capacity x mts_bgcache_frame_reserve: what the model's budget reserves */
} mts_bgcache_stats;

int mts_bgcache_open(const mts_bgcache_config *cfg, mts_bgcache **out, mts_err *err);
void mts_bgcache_ref(mts_bgcache *c);
void mts_bgcache_unref(mts_bgcache *c); /* frees at the last reference */

int mts_bgcache_num_frames(const mts_bgcache *c);
int mts_bgcache_capacity(const mts_bgcache *c);
/* Size of the first decodable frame, probed at open. */
void mts_bgcache_size(const mts_bgcache *c, int *width, int *height);
int64_t mts_bgcache_capacity_bytes(const mts_bgcache *c);
/* Crop rectangle of frame idx (0 <= idx < num_frames). */
const mts_crop_rect *mts_bgcache_rect(const mts_bgcache *c, int idx);

/* A decoded frame, read-only, valid until mts_bgcache_put. */
typedef struct mts_bgframe {
    mts_image img;
    int idx;
    struct mts_jpeg_bg *jpeg; /* the frame encoded as JPEG, managed by the cache: use mts_bgcache_jpeg */
} mts_bgframe;

/* Looks frame idx up (decoding it on a miss) and pins it. Errors: MTS_EINVAL (index out of
 * range), MTS_ENOTFOUND (frame file missing), MTS_EFORMAT (corrupt PNG, or a size other than
 * the first frame's), MTS_EIO, MTS_ENOMEM. */
int mts_bgcache_get(mts_bgcache *c, int idx, mts_bgframe **out, mts_err *err);
void mts_bgcache_put(mts_bgcache *c, mts_bgframe *f);
/* Decodes frame idx ahead of use if it is not cached (or marks it recently used if it is).
 * Failures are counted in load_errors and otherwise ignored (the request that uses the frame
 * reports them). */
void mts_bgcache_preload(mts_bgcache *c, int idx);
void mts_bgcache_stats_get(mts_bgcache *c, mts_bgcache_stats *out);

/* JPEG encodings of background frames, for media/jpeg_splice.h. Each cached frame may hold one
 * encoding, at one quality. The cache remembers the quality of the latest call and encodes
 * every frame it decodes from then on at that quality (off the request path when the frame is
 * preloaded). For a pinned frame f, mts_bgcache_jpeg returns its encoding at `quality`, making
 * it now if the frame has none (or one at another quality that no other reader has pinned);
 * the result stays valid until mts_bgcache_put(c, f). NULL when that is not possible right now
 * (another thread is encoding the frame, or it is pinned elsewhere at another quality, or the
 * encoder failed): the caller encodes the whole frame instead. Counts jpeg_spliced/jpeg_full. */
const struct mts_jpeg_bg *mts_bgcache_jpeg(mts_bgcache *c, mts_bgframe *f, int quality);
/* Sets the quality that decodes and preloads encode at (before the first composite's lookup;
 * a preload of a cached frame lacking the encoding makes it). */
void mts_bgcache_want_jpeg(mts_bgcache *c, int quality);
/* Bytes the budget reserves per cached frame: the decoded RGB frame plus 2 bits per pixel for
 * its JPEG encoding (q85 photos take about 1; measured figures in docs/benchmarks.md). */
int64_t mts_bgcache_frame_reserve(int width, int height);

#endif
