/*
 * Segmentation pre/post-processing (segment.h): separable bilinear resampling with the tables of
 * mts_resize_axis (rows blended first, then columns), thresholding or per-pixel argmax, and the
 * foreground statistics.
 */
#include "media/segment.h"

#include <stdlib.h>
#include <string.h>

#include "media/composite.h"

typedef struct axes {
    int *x0, *x1, *y0, *y1;
    float *wx, *wy;
} axes;

static int axes_make(axes *a, int sw, int sh, int dw, int dh)
{
    a->x0 = malloc(sizeof(int) * 2 * ((size_t)dw + dh));
    a->wx = malloc(sizeof(float) * ((size_t)dw + dh));
    if (!a->x0 || !a->wx) {
        free(a->x0);
        free(a->wx);
        return -1;
    }
    a->x1 = a->x0 + dw;
    a->y0 = a->x1 + dw;
    a->y1 = a->y0 + dh;
    a->wy = a->wx + dw;
    mts_resize_axis(sw, dw, a->x0, a->x1, a->wx);
    mts_resize_axis(sh, dh, a->y0, a->y1, a->wy);
    return 0;
}

static void axes_free(axes *a)
{
    free(a->x0);
    free(a->wx);
}

void mts_seg_preprocess(const mts_image *img, int w, int h, float *planar)
{
    axes a;
    int sw = img->width;
    float *row = malloc(sizeof(float) * 3 * (size_t)sw);
    if (!row || axes_make(&a, sw, img->height, w, h)) { /* callers size-check first; never crash */
        free(row);
        memset(planar, 0, sizeof(float) * 3 * (size_t)w * h);
        return;
    }
    size_t plane = (size_t)w * h;
    for (int y = 0; y < h; y++) {
        const uint8_t *r0 = img->rgb + (size_t)a.y0[y] * sw * 3, *r1 = img->rgb + (size_t)a.y1[y] * sw * 3;
        float fy = a.wy[y];
        for (int x = 0; x < sw * 3; x++) row[x] = (float)r0[x] + fy * (float)(r1[x] - r0[x]);
        for (int x = 0; x < w; x++) {
            const float *p = row + 3 * (size_t)a.x0[x], *q = row + 3 * (size_t)a.x1[x];
            float fx = a.wx[x];
            for (int c = 0; c < 3; c++)
                planar[c * plane + (size_t)y * w + x] = (p[c] + fx * (q[c] - p[c])) * (1.0f / 255.0f);
        }
    }
    free(row);
    axes_free(&a);
}

static void stats_add(mts_seg_stats *st, int x, int y)
{
    if (st->foreground == 0) {
        st->x1 = x, st->y1 = y, st->x2 = x + 1, st->y2 = y + 1;
    } else {
        if (x < st->x1) st->x1 = x;
        if (y < st->y1) st->y1 = y;
        if (x + 1 > st->x2) st->x2 = x + 1;
        if (y + 1 > st->y2) st->y2 = y + 1;
    }
    st->foreground++;
}

void mts_seg_mask(const float *scores, int channels, int w, int h, float threshold, int width, int height,
                  uint8_t *mask, mts_seg_stats *st)
{
    memset(st, 0, sizeof *st);
    if (channels > 1) {
        size_t plane = (size_t)w * h;
        for (int y = 0; y < height; y++) {
            int sy = (int)(((int64_t)y * h) / height); /* the model pixel this image pixel falls in */
            for (int x = 0; x < width; x++) {
                int sx = (int)(((int64_t)x * w) / width);
                size_t i = (size_t)sy * w + sx;
                int best = 0;
                for (int c = 1; c < channels; c++)
                    if (scores[c * plane + i] > scores[best * plane + i]) best = c;
                mask[(size_t)y * width + x] = (uint8_t)(best > 255 ? 255 : best);
                if (best) stats_add(st, x, y);
            }
        }
        return;
    }
    axes a;
    float *row = malloc(sizeof(float) * (size_t)w);
    if (!row || axes_make(&a, w, h, width, height)) {
        free(row);
        memset(mask, 0, (size_t)width * height);
        return;
    }
    for (int y = 0; y < height; y++) {
        const float *r0 = scores + (size_t)a.y0[y] * w, *r1 = scores + (size_t)a.y1[y] * w;
        float fy = a.wy[y];
        for (int x = 0; x < w; x++) row[x] = r0[x] + fy * (r1[x] - r0[x]);
        uint8_t *m = mask + (size_t)y * width;
        for (int x = 0; x < width; x++) {
            float v = row[a.x0[x]] + a.wx[x] * (row[a.x1[x]] - row[a.x0[x]]);
            m[x] = v > threshold ? 255 : 0;
            if (m[x]) stats_add(st, x, y);
        }
    }
    free(row);
    axes_free(&a);
}
