/*
 * Bilinear resize of planar float mouth regions to crop rectangles and row-pointer compositing
 * onto background frames (conventions in composite.h). The resize is separable: each output row
 * first blends its two source rows (per channel, in float), then each output pixel blends two
 * columns of that blended row, with per-column indices and weights computed once per call.
 * On x86-64 CPUs with AVX2 and FMA both passes run 8 values at a time (gathers for the
 * columns); the scalar path is the fallback and what MTS_MEDIA_SCALAR=1 or
 * mts_mouth_resize_force_scalar selects.
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

void mts_resize_axis(int src, int dst, int *i0, int *i1, float *w)
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

/* One output row from the three blended source rows (r, g, b planes of src_w floats). */
static void hpass_scalar(const float *row, int src_w, const int *x0, const int *x1, const float *wx, int dst_w,
                         uint8_t *out)
{
    const float *r = row, *g = row + src_w, *b = row + 2 * (size_t)src_w;
    for (int x = 0; x < dst_w; x++) {
        float fx = wx[x];
        int a = x0[x], e = x1[x];
        out[3 * x + 0] = mts_unit_to_u8(r[a] + fx * (r[e] - r[a]));
        out[3 * x + 1] = mts_unit_to_u8(g[a] + fx * (g[e] - g[a]));
        out[3 * x + 2] = mts_unit_to_u8(b[a] + fx * (b[e] - b[a]));
    }
}

static void vpass_scalar(const float *a, const float *b, float fy, int n, float *o)
{
    for (int x = 0; x < n; x++) o[x] = a[x] + fy * (b[x] - a[x]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* The same arithmetic 8 outputs at a time (AVX2 gathers; FMA may round the last bit
 * differently, which only matters within float rounding of a quantization tie). */
__attribute__((target("avx2,fma"))) static void hpass_avx2(const float *row, int src_w, const int *x0, const int *x1,
                                                             const float *wx, int dst_w, uint8_t *out)
{
    const __m256 k255 = _mm256_set1_ps(255.0f), half = _mm256_set1_ps(0.5f), zero = _mm256_setzero_ps();
    int x = 0;
    for (; x + 8 <= dst_w; x += 8) {
        __m256i i0 = _mm256_loadu_si256((const __m256i *)(x0 + x)), i1 = _mm256_loadu_si256((const __m256i *)(x1 + x));
        __m256 w = _mm256_loadu_ps(wx + x);
        int32_t q[3][8];
        for (int c = 0; c < 3; c++) {
            const float *p = row + (size_t)c * src_w;
            __m256 va = _mm256_i32gather_ps(p, i0, 4), vb = _mm256_i32gather_ps(p, i1, 4);
            __m256 v = _mm256_add_ps(va, _mm256_mul_ps(w, _mm256_sub_ps(vb, va)));
            __m256 s = _mm256_add_ps(_mm256_mul_ps(v, k255), half);
            s = _mm256_min_ps(_mm256_max_ps(s, zero), k255); /* max(NaN, 0) is 0 */
            _mm256_storeu_si256((__m256i *)q[c], _mm256_cvttps_epi32(s));
        }
        uint8_t *o = out + 3 * (size_t)x;
        for (int k = 0; k < 8; k++) {
            o[3 * k + 0] = (uint8_t)q[0][k];
            o[3 * k + 1] = (uint8_t)q[1][k];
            o[3 * k + 2] = (uint8_t)q[2][k];
        }
    }
    if (x < dst_w) /* the tail: shifted tables, so the scalar pass writes outputs x..dst_w-1 */
        hpass_scalar(row, src_w, x0 + x, x1 + x, wx + x, dst_w - x, out + 3 * (size_t)x);
}

__attribute__((target("avx2,fma"))) static void vpass_avx2(const float *a, const float *b, float fy, int n, float *o)
{
    __m256 f = _mm256_set1_ps(fy);
    int x = 0;
    for (; x + 8 <= n; x += 8) {
        __m256 va = _mm256_loadu_ps(a + x), vb = _mm256_loadu_ps(b + x);
        _mm256_storeu_ps(o + x, _mm256_add_ps(va, _mm256_mul_ps(f, _mm256_sub_ps(vb, va))));
    }
    for (; x < n; x++) o[x] = a[x] + fy * (b[x] - a[x]);
}
#endif

static int use_avx2 = -1; /* -1: not decided yet; MTS_MEDIA_SCALAR=1 forces the scalar path */

void mts_mouth_resize_force_scalar(int on)
{
    use_avx2 = on ? 0 : -1;
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
    mts_resize_axis(src_w, dst_w, x0, x1, wx);
    mts_resize_axis(src_h, dst_h, y0, y1, wy);
    int fast = 0;
#ifdef HAVE_AVX2_PATH
    int u = __atomic_load_n(&use_avx2, __ATOMIC_RELAXED);
    if (u < 0) {
        const char *e = getenv("MTS_MEDIA_SCALAR");
        u = !(e && e[0] == '1') && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        __atomic_store_n(&use_avx2, u, __ATOMIC_RELAXED);
    }
    fast = u;
#endif
    size_t plane = (size_t)src_w * src_h;
    for (int y = 0; y < dst_h; y++) {
        float fy = wy[y];
        for (int c = 0; c < 3; c++) {
            const float *a = planar + c * plane + (size_t)y0[y] * src_w;
            const float *b = planar + c * plane + (size_t)y1[y] * src_w;
            float *o = row + (size_t)c * src_w;
#ifdef HAVE_AVX2_PATH
            if (fast) {
                vpass_avx2(a, b, fy, src_w, o);
                continue;
            }
#endif
            vpass_scalar(a, b, fy, src_w, o);
        }
        uint8_t *out = dst_rgb + (size_t)y * dst_w * 3;
#ifdef HAVE_AVX2_PATH
        if (fast) {
            hpass_avx2(row, src_w, x0, x1, wx, dst_w, out);
            continue;
        }
#endif
        hpass_scalar(row, src_w, x0, x1, wx, dst_w, out);
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
