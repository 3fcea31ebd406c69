/*
 * Compositing of a generated mouth region onto a background frame. The model's output for one
 * frame is a planar float image (3 x S x S, R, G, B planes, values nominally in [0,1]); it is
 * resized to the frame's crop rectangle with bilinear filtering (pixel centres aligned: source
 * coordinate = (dst + 0.5) x src/dst - 0.5, clamped to the edge; the same convention as
 * OpenCV INTER_LINEAR and PyTorch align_corners=False), quantized as floor(v x 255 + 0.5)
 * clamped to 0..255 (NaN becomes 0), and pasted over the rectangle.
 *
 * Crop rectangles are half-open: columns x1..x2-1, rows y1..y2-1 (width x2 - x1). A rectangle
 * must lie inside the frame and be at least 1x1 (mts_crop_check).
 *
 * The composited frame is described by row pointers: rows outside the rectangle point into the
 * (shared, read-only) background, rows inside point into a scratch block holding a copy of the
 * background row with the patch pasted. So compositing copies only the rectangle's rows, and
 * the encoders read the rest from the cache.
 */
#ifndef MTS_MEDIA_COMPOSITE_H
#define MTS_MEDIA_COMPOSITE_H

#include <stdint.h>

#include "media/image.h"
#include "util/status.h"

typedef struct mts_crop_rect {
    int x1, y1, x2, y2;
} mts_crop_rect;

/* MTS_EINVAL with "crop rectangle [x1,y1,x2,y2] of frame N lies outside the WxH frame" (or is
 * empty) when r does not fit. */
int mts_crop_check(const mts_crop_rect *r, int width, int height, int frame_idx, mts_err *err);

/* The bilinear sampling of one axis under the convention above: for each of dst output
 * positions, the two source indices (i1 = i0 + 1, or i0 at the last one) and the weight of i1. */
void mts_resize_axis(int src, int dst, int *i0, int *i1, float *w);

/* Resizes a planar float image (3 x src_h x src_w) to dst_w x dst_h interleaved RGB8. */
void mts_mouth_resize(const float *planar, int src_w, int src_h, int dst_w, int dst_h, uint8_t *dst_rgb);
/* Tests: 1 makes mts_mouth_resize use its scalar path, 0 lets it pick (AVX2 where present). */
void mts_mouth_resize_force_scalar(int on);

/* Quantizes one value as above (exposed for tests). */
static inline uint8_t mts_unit_to_u8(float v)
{
    /* The comparisons also send NaN to 0 (and compile to maxss/minss); truncation of a
     * non-negative value is floor. */
    float s = v * 255.0f + 0.5f;
    s = s > 0.0f ? s : 0.0f;
    s = s < 255.0f ? s : 255.0f;
    return (uint8_t)(int)s;
}

/* Fills rows[0..bg->height) for the composited frame. scratch must hold (r->y2 - r->y1) x
 * bg->width x 3 bytes; patch is the resized region ((x2-x1) x (y2-y1) RGB8). r must have passed
 * mts_crop_check. */
void mts_composite_rows(const mts_image *bg, const mts_crop_rect *r, const uint8_t *patch, uint8_t *scratch,
                        const uint8_t **rows);

#endif
