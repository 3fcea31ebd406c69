/*
 * Image pre- and post-processing for segmentation models (the /api/v1/segment endpoints):
 *
 *   preprocess   an RGB8 image of any size -> the model's planar float input (3 x H x W), resized
 *                bilinearly with the pixel-centre convention of media/composite.h and scaled to
 *                [0,1] (value / 255); no mean/std normalisation (the reference models expect
 *                [0,1]).
 *   mask         the model's output for one image (C x h x w floats) -> an 8-bit mask of the
 *                original image size. One channel (a probability map, e.g. after a Sigmoid):
 *                the map is resized bilinearly to the image size and each pixel is 255 where
 *                the value is > threshold, else 0. Several channels (per-class scores): each
 *                model pixel takes the index of its largest channel (the first on ties), and the
 *                image pixel takes the label of the model pixel it falls in (nearest), so mask
 *                values are class indices 0..C-1 and the threshold is not used.
 * The mask statistics count non-zero pixels ("foreground") and their bounding box.
 */
#ifndef MTS_MEDIA_SEGMENT_H
#define MTS_MEDIA_SEGMENT_H

#include <stdint.h>

#include "media/image.h"

/* planar: 3 x h x w floats. */
void mts_seg_preprocess(const mts_image *img, int w, int h, float *planar);

typedef struct mts_seg_stats {
    int64_t foreground; /* non-zero mask pixels */
    int x1, y1, x2, y2; /* their bounding box, half-open; all 0 when foreground == 0 */
} mts_seg_stats;

/* scores: channels x h x w floats; mask: width x height bytes. */
void mts_seg_mask(const float *scores, int channels, int w, int h, float threshold, int width, int height,
                  uint8_t *mask, mts_seg_stats *st);

#endif
