/*
 * Bilinear resize of planar float mouth regions to crop rectangles and row-pointer compositing
 * onto background frames (conventions in composite.h). The resize is separable: each output row
 * first blends its two source rows (per channel, in float), then each output pixel blends two
 * columns of that blended row, with per-column indices and weights computed once per call.
 */
#include "media/composite.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int mts_crop_check(const mts_crop_rect *r, int width, int height, int frame_idx, mts_err *err)
{
    if (r->x1 < 0 || r->y1 < 0 || r->x2 > width || r->y2 > height || r->x2 <= r->x1 || r->y2 <= r->y1)
        return mts_err_set(err, MTS_EINVAL,
                           "crop rectangle [x1=%d, y1=%d, x2=%d, y2=%d] of frame %d %s the %dx%d background frame",
                           r->x1, r->y1, r->x2, r->y2, frame_idx,
                           (r->x2 <= r->x1 || r->y2 <= r->y1) ? "is empty; it must be at least 1x1 inside"
                                                                : "lies outside",
                           width, height);
    return MTS_OK;
}

/* Source index pair and weight of the second for each of n output positions. */
static void axis_map(int src, int dst, int *i0, int *i1, float *w)
{
    double scale = (double)src / (double)dst;
    for (int d = 0; d < dst; d++) {
        double s = (d + 0.5) * scale - 0.5;
        if (s < 0) s = 0;
        if (s > src - 1) s = src - 1;
        int a = (int)s;
        i0[d] = a;
        i1[d] = a + 1 < src ? a + 1 : a;
        w[d] = (float)(s - a);
    }
}

void mts_mouth_resize(const float *planar, int src_w, int src_h, int dst_w, int dst_h, uint8_t *dst_rgb)
{
    int *xi = malloc(sizeof(int) * (size_t)dst_w * 2 + sizeof(int) * (size_t)dst_h * 2);
    float *xw = malloc(sizeof(float) * ((size_t)dst_w + (size_t)dst_h + 3 * (size_t)src_w));
    if (!xi || !xw) { /* degrade to a black patch rather than crash; callers check sizes first */
        free(xi);
        free(xw);
        memset(dst_rgb, 0, (size_t)dst_w * dst_h * 3);
        return;
    }
    int *x0 = xi, *x1 = xi + dst_w, *y0 = xi + 2 * dst_w, *y1 = y0 + dst_h;
    float *wx = xw, *wy = xw + dst_w, *row = wy + dst_h; /* row: 3 blended source rows */
    axis_map(src_w, dst_w, x0, x1, wx);
    axis_map(src_h, dst_h, y0, y1, wy);
    size_t plane = (size_t)src_w * src_h;
    for (int y = 0; y < dst_h; y++) {
        float fy = wy[y];
        for (int c = 0; c < 3; c++) {
            const float *a = planar + c * plane + (size_t)y0[y] * src_w;
            const float *b = planar + c * plane + (size_t)y1[y] * src_w;
            float *o = row + (size_t)c * src_w;
            for (int x = 0; x < src_w; x++) o[x] = a[x] + fy * (b[x] - a[x]);
        }
        uint8_t *out = dst_rgb + (size_t)y * dst_w * 3;
        const float *r = row, *g = row + src_w, *b = row + 2 * (size_t)src_w;
        for (int x = 0; x < dst_w; x++) {
            float fx = wx[x];
            int a = x0[x], e = x1[x];
            out[3 * x + 0] = mts_unit_to_u8(r[a] + fx * (r[e] - r[a]));
            out[3 * x + 1] = mts_unit_to_u8(g[a] + fx * (g[e] - g[a]));
            out[3 * x + 2] = mts_unit_to_u8(b[a] + fx * (b[e] - b[a]));
        }
    }
    free(xi);
    free(xw);
}

void mts_composite_rows(const mts_image *bg, const mts_crop_rect *r, const uint8_t *patch, uint8_t *scratch,
                        const uint8_t **rows)
{
    size_t stride = (size_t)bg->width * 3, pw = (size_t)(r->x2 - r->x1) * 3;
    for (int y = 0; y < bg->height; y++) {
        const uint8_t *src = bg->rgb + (size_t)y * stride;
        if (y < r->y1 || y >= r->y2) {
            rows[y] = src;
            continue;
        }
        uint8_t *dst = scratch + (size_t)(y - r->y1) * stride;
        memcpy(dst, src, stride);
        memcpy(dst + (size_t)r->x1 * 3, patch + (size_t)(y - r->y1) * pw, pw);
        rows[y] = dst;
    }
}
