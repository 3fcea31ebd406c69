/*
 * Unit tests of src/media (lip-sync compositing): quantization and bilinear resize
 * against a reference computed here in double precision, pixel-exact compositing of a known
 * pattern through the whole batch path (cache -> resize -> paste -> raw RGB / PNG round trip),
 * JPEG output structure, JPEG splicing (byte-identical to encoding the whole frame, for frame
 * sizes with and without partial MCUs and rectangles touching every edge), decoding of uploaded
 * PNG/JPEG images (limits, every truncation), segmentation pre/post-processing, frame index wrapping, LRU accounting (hits, misses, evictions,
 * preloads, pinned frames), every bad-asset case (missing folder, numbering gap, num_frames
 * mismatch, bad or incomplete crop JSON, missing / corrupt / wrong-size frame, rectangle
 * outside the frame), and concurrent lookups and composites (run under TSan by the TSan build).
 * Assets are written to a temporary folder by the test itself.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jpeglib.h>

#include "media/compose.h"
#include "media/jpeg_splice.h"
#include "media/segment.h"

#define W 200
#define H 150
#define NF 10
#define S 320

/* ---- helpers ---- */

static uint8_t bg_pixel(int f, int x, int y, int c)
{
    return (uint8_t)((x * 7 + y * 13 + f * 31 + c * 85) & 255);
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void write_frame(const char *dir, int f, int w, int h)
{
    uint8_t *px = malloc((size_t)w * h * 3);
    const uint8_t **rows = malloc(sizeof *rows * (size_t)h);
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) px[((size_t)y * w + x) * 3 + c] = bg_pixel(f, x, y, c);
        rows[y] = px + (size_t)y * w * 3;
    }
    mts_buf b = {0};
    mts_err err = {0};
    assert_int_equal(mts_png_encode(rows, w, h, 6, &b, &err), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/%06d.png", dir, f);
    write_file(path, b.data, b.len);
    mts_buf_free(&b);
    free(rows);
    free(px);
}

static mts_crop_rect rect_of(int f)
{
    mts_crop_rect r = {30 + f, 20 + f, 130 + f, 100 + f}; /* 100 x 80, moving */
    return r;
}

/* A fresh asset folder: NF frames W x H and rects.json (list form). */
static void make_assets(char *dir, size_t len)
{
    snprintf(dir, len, "/tmp/mts_media_test_XXXXXX");
    assert_non_null(mkdtemp(dir));
    char fdir[512];
    snprintf(fdir, sizeof fdir, "%s/frames", dir);
    mkdir(fdir, 0755);
    for (int f = 0; f < NF; f++) write_frame(fdir, f, W, H);
    char path[600], json[4096];
    size_t n = 0;
    n += (size_t)snprintf(json + n, sizeof json - n, "[");
    for (int f = 0; f < NF; f++) {
        mts_crop_rect r = rect_of(f);
        n += (size_t)snprintf(json + n, sizeof json - n, "%s{\"x1\":%d,\"y1\":%d,\"x2\":%d,\"y2\":%d}", f ? "," : "",
                              r.x1, r.y1, r.x2, r.y2);
    }
    n += (size_t)snprintf(json + n, sizeof json - n, "]");
    snprintf(path, sizeof path, "%s/rects.json", dir);
    write_file(path, json, n);
}

static void remove_assets(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static int open_cache(const char *dir, const char *rects, int num_frames, int capacity, mts_bgcache **c, mts_err *err)
{
    char fdir[512], rpath[512];
    snprintf(fdir, sizeof fdir, "%s/frames", dir);
    snprintf(rpath, sizeof rpath, "%s/%s", dir, rects ? rects : "rects.json");
    mts_bgcache_config cfg = {"test", fdir, rpath, num_frames, capacity};
    return mts_bgcache_open(&cfg, c, err);
}

static float *make_mouths(int n, unsigned seed)
{
    float *m = malloc(sizeof(float) * 3 * S * S * (size_t)n);
    for (size_t i = 0; i < (size_t)3 * S * S * n; i++) {
        seed = seed * 1103515245u + 12345u;
        m[i] = (float)((seed >> 8) & 0xffff) / 65535.0f * 1.2f - 0.1f; /* some values outside [0,1] */
    }
    return m;
}

/* Reference bilinear value (before quantization) in double: the documented convention. */
static double ref_value(const float *planar, int c, int dw, int dh, int x, int y)
{
    double sx = (x + 0.5) * S / dw - 0.5, sy = (y + 0.5) * S / dh - 0.5;
    sx = sx < 0 ? 0 : sx > S - 1 ? S - 1 : sx;
    sy = sy < 0 ? 0 : sy > S - 1 ? S - 1 : sy;
    int x0 = (int)floor(sx), y0 = (int)floor(sy);
    int x1 = x0 + 1 < S ? x0 + 1 : x0, y1 = y0 + 1 < S ? y0 + 1 : y0;
    double fx = sx - x0, fy = sy - y0;
    const float *p = planar + (size_t)c * S * S;
    double a = p[y0 * S + x0], b = p[y0 * S + x1], cc = p[y1 * S + x0], d = p[y1 * S + x1];
    return (1 - fy) * ((1 - fx) * a + fx * b) + fy * ((1 - fx) * cc + fx * d);
}

/* Quantized reference; *tie when v*255+0.5 lies within float rounding (2e-4) of an integer:
 * there float32 and double may round differently, and +-1 is accepted. */
static int ref_u8(double v, bool *tie)
{
    double s = v * 255.0 + 0.5;
    *tie = fabs(s - floor(s + 0.5)) < 2e-4 && s > 0.5 && s < 255.5;
    if (!(s > 0)) return 0;
    if (s >= 255) return 255;
    return (int)floor(s);
}

/* ---- tests ---- */

static void test_quantize(void **state)
{
    (void)state;
    for (int k = 0; k <= 255; k++) assert_int_equal(mts_unit_to_u8((float)k / 255.0f), k);
    assert_int_equal(mts_unit_to_u8(NAN), 0);
    assert_int_equal(mts_unit_to_u8(-3.0f), 0);
    assert_int_equal(mts_unit_to_u8(7.0f), 255);
    assert_int_equal(mts_unit_to_u8(INFINITY), 255);
    assert_int_equal(mts_unit_to_u8(-INFINITY), 0);
    assert_int_equal(mts_unit_to_u8(0.4f / 255.0f), 0);
    assert_int_equal(mts_unit_to_u8(0.6f / 255.0f), 1);
}

static void check_resize(void)
{
    float *m = make_mouths(1, 7);
    uint8_t *out = malloc((size_t)S * S * 3);
    mts_mouth_resize(m, S, S, S, S, out); /* same size: exact per-pixel quantization */
    for (int y = 0; y < S; y++)
        for (int x = 0; x < S; x++)
            for (int c = 0; c < 3; c++)
                assert_int_equal(out[((size_t)y * S + x) * 3 + c], mts_unit_to_u8(m[(size_t)c * S * S + y * S + x]));
    const int sizes[][2] = {{100, 80}, {288, 288}, {400, 500}, {1, 1}, {7, 333}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int dw = sizes[k][0], dh = sizes[k][1], ties = 0;
        uint8_t *o = malloc((size_t)dw * dh * 3);
        mts_mouth_resize(m, S, S, dw, dh, o);
        for (int y = 0; y < dh; y++)
            for (int x = 0; x < dw; x++)
                for (int c = 0; c < 3; c++) {
                    bool tie;
                    int want = ref_u8(ref_value(m, c, dw, dh, x, y), &tie), got = o[((size_t)y * dw + x) * 3 + c];
                    if (tie) {
                        ties++;
                        assert_true(abs(got - want) <= 1);
                    } else if (got != want) {
                        fail_msg("%dx%d pixel (%d,%d) channel %d: %d, reference %d", dw, dh, x, y, c, got, want);
                    }
                }
        if (ties > dw * dh * 3 / 1000 + 2) printf("%dx%d: %d ties\n", dw, dh, ties);
        assert_true(ties <= dw * dh * 3 / 1000 + 2);
        free(o);
    }
    free(out);
    free(m);
}

/* Both resize paths (AVX2 where the CPU has it, and the scalar one) against the reference. */
static void test_resize_identity_and_reference(void **state)
{
    (void)state;
    check_resize();
    mts_mouth_resize_force_scalar(1);
    check_resize();
    mts_mouth_resize_force_scalar(0);
}

static void test_composite_pixel_exact(void **state)
{
    (void)state;
    char dir[256];
    make_assets(dir, sizeof dir);
    mts_bgcache *c;
    mts_err err = {0};
    assert_int_equal(open_cache(dir, NULL, 0, 4, &c, &err), 0);
    assert_int_equal(mts_bgcache_num_frames(c), NF);
    int n = 3;
    float *m = make_mouths(n, 11);
    mts_composite_opts o = {MTS_FRAME_RGB, 85, 1, MTS_WRAP_LOOP, 8}; /* frames 8, 9, 0 */
    mts_composite_out out;
    assert_int_equal(mts_composite_batch(c, m, n, S, S, &o, &out, &err), 0);
    assert_int_equal(out.width, W);
    assert_int_equal(out.height, H);
    int ties = 0;
    for (int i = 0; i < n; i++) {
        int f = (8 + i) % NF;
        assert_int_equal(out.frame_idx[i], f);
        assert_int_equal(out.len[i], (size_t)W * H * 3);
        const uint8_t *px = out.data.data + out.offset[i];
        mts_crop_rect r = rect_of(f);
        int dw = r.x2 - r.x1, dh = r.y2 - r.y1;
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                for (int ch = 0; ch < 3; ch++) {
                    int got = px[((size_t)y * W + x) * 3 + ch];
                    if (x < r.x1 || x >= r.x2 || y < r.y1 || y >= r.y2) {
                        assert_int_equal(got, bg_pixel(f, x, y, ch));
                        continue;
                    }
                    bool tie;
                    int want = ref_u8(ref_value(m + (size_t)i * 3 * S * S, ch, dw, dh, x - r.x1, y - r.y1), &tie);
                    if (tie) {
                        ties++;
                        assert_true(abs(got - want) <= 1);
                    } else if (got != want) {
                        fail_msg("frame %d pixel (%d,%d) channel %d: %d, reference %d", f, x, y, ch, got, want);
                    }
                }
    }
    assert_true(ties <= n * 100 * 80 * 3 / 1000 + 2); /* float vs double near .5: rare */
    /* PNG output decodes to exactly the raw frames; JPEG is a well-formed baseline JFIF. */
    mts_composite_out png, jpg;
    o.format = MTS_FRAME_PNG;
    assert_int_equal(mts_composite_batch(c, m, n, S, S, &o, &png, &err), 0);
    o.format = MTS_FRAME_JPEG;
    assert_int_equal(mts_composite_batch(c, m, n, S, S, &o, &jpg, &err), 0);
    for (int i = 0; i < n; i++) {
        mts_image img;
        assert_int_equal(mts_png_decode_mem(png.data.data + png.offset[i], png.len[i], &img, &err), 0);
        assert_int_equal(img.width, W);
        assert_int_equal(img.height, H);
        assert_memory_equal(img.rgb, out.data.data + out.offset[i], (size_t)W * H * 3);
        mts_image_free(&img);
        const uint8_t *j = jpg.data.data + jpg.offset[i];
        size_t jl = jpg.len[i];
        assert_true(jl > 100 && j[0] == 0xFF && j[1] == 0xD8 && j[jl - 2] == 0xFF && j[jl - 1] == 0xD9);
        bool sof = false;
        for (size_t k = 2; k + 8 < jl && !sof; k++)
            if (j[k] == 0xFF && j[k + 1] == 0xC0) {
                sof = true;
                assert_int_equal((j[k + 5] << 8) | j[k + 6], H);
                assert_int_equal((j[k + 7] << 8) | j[k + 8], W);
            }
        assert_true(sof);
        /* It is the whole-frame encoding of the raw frame, byte for byte, and decodes without
         * warnings to that frame within JPEG's error (the sawtooth pattern here is hard on 4:2:0
         * JPEG: about 18 dB; garbage blocks from a misplaced restart interval would drop it). */
        const uint8_t *rrows[H];
        for (int y = 0; y < H; y++) rrows[y] = out.data.data + out.offset[i] + (size_t)y * W * 3;
        mts_buf whole = {0};
        assert_int_equal(mts_jpeg_encode(rrows, W, H, 85, &whole, &err), 0);
        assert_int_equal(whole.len, jl);
        assert_memory_equal(whole.data, j, jl);
        mts_buf_free(&whole);
        struct jpeg_decompress_struct d;
        struct jpeg_error_mgr je;
        d.err = jpeg_std_error(&je);
        jpeg_create_decompress(&d);
        jpeg_mem_src(&d, j, (unsigned long)jl);
        assert_int_equal(jpeg_read_header(&d, TRUE), JPEG_HEADER_OK);
        d.out_color_space = JCS_RGB;
        jpeg_start_decompress(&d);
        uint8_t line[W * 3];
        double se = 0;
        const uint8_t *want = out.data.data + out.offset[i];
        while (d.output_scanline < (unsigned)H) {
            JSAMPROW rp = line;
            int y = (int)d.output_scanline;
            jpeg_read_scanlines(&d, &rp, 1);
            for (int x = 0; x < W * 3; x++) se += (line[x] - want[(size_t)y * W * 3 + x]) * (double)(line[x] - want[(size_t)y * W * 3 + x]);
        }
        jpeg_finish_decompress(&d);
        assert_int_equal(je.num_warnings, 0);
        jpeg_destroy_decompress(&d);
        double psnr = 10 * log10(255.0 * 255.0 / (se / ((double)W * H * 3)));
        if (psnr < 16) fail_msg("frame %d: JPEG decodes with PSNR %.1f dB against the raw frame", i, psnr);
    }
    mts_composite_out_free(&png);
    mts_composite_out_free(&jpg);
    mts_composite_out_free(&out);
    free(m);
    mts_bgcache_unref(c);
    remove_assets(dir);
}

/* A frame with structure (gradients, edges) and noise, like a photo. */
static uint8_t *noisy_frame(int w, int h, unsigned seed)
{
    uint8_t *px = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) {
                seed = seed * 1103515245u + 12345u;
                int v = (x * (c + 1) + y * 2) / 3 + ((x / 37 + y / 23) & 1) * 60 + (int)((seed >> 16) & 31);
                px[((size_t)y * w + x) * 3 + c] = (uint8_t)(v & 255);
            }
    return px;
}

/* Splicing the re-encoded intervals around a rectangle into the background's encoding gives the
 * exact bytes of encoding the whole composited frame. */
static void test_jpeg_splice(void **state)
{
    (void)state;
    static const int sizes[][2] = {{1280, 720}, {1000, 700}, {200, 150}, {40, 24}, {16, 16}, {17, 9}, {333, 100}};
    unsigned seed = 7;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int w = sizes[si][0], h = sizes[si][1];
        uint8_t *bg = noisy_frame(w, h, (unsigned)si + 1), *comp = malloc((size_t)w * h * 3);
        const uint8_t **rows = malloc(sizeof *rows * (size_t)h);
        for (int y = 0; y < h; y++) rows[y] = bg + (size_t)y * w * 3;
        for (int q = 50; q <= 95; q += 45) {
            mts_jpeg_bg *jb;
            mts_err err = {0};
            assert_int_equal(mts_jpeg_bg_make(rows, w, h, q, &jb, &err), 0);
            mts_crop_rect rects[8] = {{0, 0, w, h}, {0, 0, 1, 1}, {w - 1, h - 1, w, h}, {w / 3, h / 4, w / 2 + 1, h / 2 + 3}};
            for (int k = 4; k < 8; k++) { /* random rectangles */
                seed = seed * 1103515245u + 12345u;
                int x1 = (int)(seed >> 8) % w, y1 = (int)(seed >> 4) % h;
                seed = seed * 1103515245u + 12345u;
                int x2 = x1 + 1 + (int)(seed >> 8) % (w - x1), y2 = y1 + 1 + (int)(seed >> 4) % (h - y1);
                rects[k] = (mts_crop_rect){x1, y1, x2, y2};
            }
            if (w > 300 && h > 270) rects[4] = (mts_crop_rect){w - 290, h - 260, w, h}; /* touching right, bottom */
            for (int k = 0; k < 8; k++) {
                mts_crop_rect r = rects[k];
                assert_int_equal(mts_crop_check(&r, w, h, 0, &err), 0);
                memcpy(comp, bg, (size_t)w * h * 3);
                for (int y = r.y1; y < r.y2; y++)
                    for (int x = r.x1; x < r.x2; x++)
                        for (int c = 0; c < 3; c++) comp[((size_t)y * w + x) * 3 + c] = (uint8_t)(255 - x - c * y);
                const uint8_t **crow = malloc(sizeof *crow * (size_t)h);
                for (int y = 0; y < h; y++) crow[y] = comp + (size_t)y * w * 3;
                mts_buf whole = {0}, spliced = {0};
                assert_int_equal(mts_jpeg_encode(crow, w, h, q, &whole, &err), 0);
                assert_int_equal(mts_buf_append(&spliced, "x", 1), 0); /* appends after existing bytes */
                assert_int_equal(mts_jpeg_bg_compose(jb, crow, &r, &spliced, &err), 0);
                if (spliced.len - 1 != whole.len || memcmp(spliced.data + 1, whole.data, whole.len))
                    fail_msg("%dx%d q%d rect [%d,%d,%d,%d]: spliced JPEG (%zu bytes) differs from the whole-frame "
                             "encoding (%zu bytes)", w, h, q, r.x1, r.y1, r.x2, r.y2, spliced.len - 1, whole.len);
                mts_buf_free(&whole);
                mts_buf_free(&spliced);
                free(crow);
            }
            mts_jpeg_bg_free(jb);
        }
        free(rows);
        free(bg);
        free(comp);
    }
}

/* Uploaded images (segmentation endpoints): PNG and JPEG decode, every prefix of each fails
 * cleanly (ASan build), size limits are enforced from the header. */
static void test_upload_decode(void **state)
{
    (void)state;
    int w = 53, h = 37;
    uint8_t *px = noisy_frame(w, h, 9);
    const uint8_t *rows[37];
    for (int y = 0; y < h; y++) rows[y] = px + (size_t)y * w * 3;
    mts_buf png = {0}, jpg = {0};
    mts_err err = {0};
    assert_int_equal(mts_png_encode(rows, w, h, 6, &png, &err), 0);
    assert_int_equal(mts_jpeg_encode(rows, w, h, 95, &jpg, &err), 0);
    mts_image img;
    assert_int_equal(mts_image_decode_mem(png.data, png.len, 0, &img, &err), 0);
    assert_int_equal(img.width, w);
    assert_int_equal(img.height, h);
    assert_memory_equal(img.rgb, px, (size_t)w * h * 3);
    mts_image_free(&img);
    assert_int_equal(mts_image_decode_mem(jpg.data, jpg.len, 0, &img, &err), 0);
    assert_int_equal(img.width, w);
    double se = 0;
    for (size_t i = 0; i < (size_t)w * h * 3; i++) se += (img.rgb[i] - px[i]) * (double)(img.rgb[i] - px[i]);
    assert_true(se / ((double)w * h * 3) < 100); /* q95 on a noisy image: RMS error under 10 */
    mts_image_free(&img);
    /* limits from the header */
    assert_int_equal(mts_image_decode_mem(png.data, png.len, (int64_t)w * h - 1, &img, &err), MTS_ELIMIT);
    assert_non_null(strstr(err.msg, "53x37 PNG is over the limits"));
    assert_int_equal(mts_image_decode_mem(jpg.data, jpg.len, (int64_t)w * h - 1, &img, &err), MTS_ELIMIT);
    assert_non_null(strstr(err.msg, "53x37 JPEG"));
    /* every truncation fails with a message */
    for (int k = 0; k < 2; k++) {
        const mts_buf *b = k ? &jpg : &png;
        for (size_t len = 0; len < b->len; len++) {
            uint8_t *cut = malloc(len ? len : 1);
            memcpy(cut, b->data, len);
            err = (mts_err){0};
            int rc = mts_image_decode_mem(cut, len, 0, &img, &err);
            if (rc == 0) fail_msg("%s truncated to %zu of %zu bytes decoded", k ? "JPEG" : "PNG", len, b->len);
            assert_true(err.msg[0] != 0);
            free(cut);
        }
    }
    assert_int_equal(mts_image_decode_mem("GIF89a", 6, 0, &img, &err), MTS_EFORMAT);
    assert_non_null(strstr(err.msg, "not a PNG or JPEG"));
    mts_buf_free(&png);
    mts_buf_free(&jpg);
    free(px);
}

/* Segmentation pre/post-processing against direct computations. */
static void test_segment_processing(void **state)
{
    (void)state;
    /* same size: preprocessing is value / 255 per channel, planar */
    mts_image img = {5, 4, noisy_frame(5, 4, 3)};
    float in[3 * 4 * 5];
    mts_seg_preprocess(&img, 5, 4, in);
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 20; i++) assert_true(fabsf(in[c * 20 + i] - img.rgb[i * 3 + c] / 255.0f) < 1e-6f);
    mts_image_free(&img);
    /* one channel, same size: threshold only; statistics and bounding box */
    float prob[12] = {0.1f, 0.6f, 0.2f, 0.9f, 0.5f, 0.51f, 0.0f, 0.0f, 0.7f, 0.0f, 0.0f, 0.0f};
    uint8_t mask[12];
    mts_seg_stats st;
    mts_seg_mask(prob, 1, 4, 3, 0.5f, 4, 3, mask, &st);
    const uint8_t want[12] = {0, 255, 0, 255, 0, 255, 0, 0, 255, 0, 0, 0};
    assert_memory_equal(mask, want, 12);
    assert_int_equal(st.foreground, 4);
    assert_int_equal(st.x1, 0);
    assert_int_equal(st.y1, 0);
    assert_int_equal(st.x2, 4);
    assert_int_equal(st.y2, 3);
    /* one channel, 2x upscale: bilinear between model pixels, clamped at the edges */
    float p2[2] = {0.0f, 1.0f};
    uint8_t m4[4];
    mts_seg_mask(p2, 1, 2, 1, 0.5f, 4, 1, m4, &st);
    const uint8_t w4[4] = {0, 0, 255, 255}; /* samples at 0, 0.25, 0.75, 1 */
    assert_memory_equal(m4, w4, 4);
    /* three classes: argmax per model pixel, nearest for the image pixels; first wins ties */
    float sc[3 * 2] = {0.9f, 0.1f, /* class 0 */ 0.05f, 0.1f, /* class 1 */ 0.05f, 0.8f /* class 2 */};
    uint8_t m6[4];
    mts_seg_mask(sc, 3, 2, 1, 0.5f, 4, 1, m6, &st);
    const uint8_t w6[4] = {0, 0, 2, 2};
    assert_memory_equal(m6, w6, 4);
    assert_int_equal(st.foreground, 2);
    assert_int_equal(st.x1, 2);
    float tie[2] = {0.5f, 0.5f};
    mts_seg_mask(tie, 2, 1, 1, 0.5f, 1, 1, m6, &st);
    assert_int_equal(m6[0], 0);
    assert_int_equal(st.foreground, 0);
}

static void test_frame_index(void **state)
{
    (void)state;
    const int loop[] = {3, 4, 0, 1, 2, 3};
    for (int i = 0; i < 6; i++) assert_int_equal(mts_frame_index(3, i, 5, MTS_WRAP_LOOP), loop[i]);
    const int pp[] = {0, 1, 2, 3, 4, 3, 2, 1, 0, 1, 2};
    for (int i = 0; i < 11; i++) assert_int_equal(mts_frame_index(0, i, 5, MTS_WRAP_PINGPONG), pp[i]);
    assert_int_equal(mts_frame_index(-1, 0, 5, MTS_WRAP_LOOP), 4);
    assert_int_equal(mts_frame_index(-1, 0, 5, MTS_WRAP_PINGPONG), 1);
    assert_int_equal(mts_frame_index(123456789012LL, 0, 1, MTS_WRAP_LOOP), 0);
    assert_int_equal(mts_frame_format_parse(""), MTS_FRAME_JPEG);
    assert_int_equal(mts_frame_format_parse("PNG"), MTS_FRAME_PNG);
    assert_int_equal(mts_frame_format_parse("rgb"), MTS_FRAME_RGB);
    assert_int_equal(mts_frame_format_parse("gif"), -1);
    assert_int_equal(mts_wrap_mode_parse("ping-pong"), MTS_WRAP_PINGPONG);
    assert_int_equal(mts_wrap_mode_parse("bounce"), -1);
}

static void get_put(mts_bgcache *c, int idx)
{
    mts_bgframe *f;
    mts_err err = {0};
    assert_int_equal(mts_bgcache_get(c, idx, &f, &err), 0);
    assert_int_equal(f->img.rgb[0], bg_pixel(idx, 0, 0, 0));
    mts_bgcache_put(c, f);
}

static void test_cache_accounting(void **state)
{
    (void)state;
    char dir[256];
    make_assets(dir, sizeof dir);
    mts_bgcache *c;
    mts_err err = {0};
    assert_int_equal(open_cache(dir, NULL, NF, 3, &c, &err), 0);
    mts_bgcache_stats st;
    mts_bgcache_stats_get(c, &st);
    assert_int_equal(st.capacity_bytes, 3 * mts_bgcache_frame_reserve(W, H));
    assert_true(st.capacity_bytes > 3LL * W * H * 3);
    assert_int_equal(st.width, W);
    assert_int_equal(st.height, H);
    get_put(c, 0);
    get_put(c, 1);
    get_put(c, 2); /* 3 misses */
    get_put(c, 0); /* hit; LRU order now 1 (oldest), 2, 0 */
    get_put(c, 3); /* miss, evicts 1 */
    get_put(c, 1); /* miss, evicts 2 */
    get_put(c, 0); /* hit */
    mts_bgcache_stats_get(c, &st);
    assert_int_equal(st.requests, 7);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.misses, 5);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.frames_cached, 3);
    assert_int_equal(st.bytes, 3LL * W * H * 3);
    assert_int_equal(st.loads, 5);
    assert_true(st.avg_load_ms > 0);
    assert_true(fabs(st.hit_rate - 2.0 / 7.0) < 1e-9);
    /* A pinned frame is never evicted, even while others cycle through. */
    mts_bgframe *pinned;
    assert_int_equal(mts_bgcache_get(c, 5, &pinned, &err), 0);
    for (int i = 6; i < NF; i++) get_put(c, i);
    assert_int_equal(pinned->img.rgb[3], bg_pixel(5, 1, 0, 0));
    mts_bgcache_put(c, pinned);
    get_put(c, 5); /* still cached: a hit */
    mts_bgcache_stats_get(c, &st);
    assert_int_equal(st.hits, 3);
    assert_true(st.frames_cached <= 3);
    /* Preload decodes ahead; the next lookup is a hit. */
    mts_bgcache_preload(c, 2);
    mts_bgcache_preload(c, 2); /* already cached: no second decode */
    mts_bgcache_stats_get(c, &st);
    assert_int_equal(st.preloads, 1);
    uint64_t hits = st.hits;
    get_put(c, 2);
    mts_bgcache_stats_get(c, &st);
    assert_int_equal(st.hits, hits + 1);
    /* JPEG encodings: made on first use at a quality, reused, replaced at another quality while
     * only this reader has the frame pinned, refused while another reader has it pinned. */
    mts_bgframe *f, *f2;
    assert_int_equal(mts_bgcache_get(c, 2, &f, &err), 0);
    mts_bgcache_stats_get(c, &st);
    int64_t before = st.bytes;
    const mts_jpeg_bg *j85 = mts_bgcache_jpeg(c, f, 85);
    assert_non_null(j85);
    assert_int_equal(mts_jpeg_bg_quality(j85), 85);
    assert_ptr_equal(mts_bgcache_jpeg(c, f, 85), j85);
    mts_bgcache_stats_get(c, &st);
    assert_int_equal(st.bytes, before + (int64_t)mts_jpeg_bg_bytes(j85));
    const mts_jpeg_bg *j90 = mts_bgcache_jpeg(c, f, 90);
    assert_non_null(j90);
    assert_int_equal(mts_jpeg_bg_quality(j90), 90);
    assert_int_equal(mts_bgcache_get(c, 2, &f2, &err), 0);
    assert_null(mts_bgcache_jpeg(c, f2, 85)); /* pinned twice: the quality-90 encoding stays */
    assert_int_equal(mts_jpeg_bg_quality(j90), 90);
    mts_bgcache_put(c, f2);
    mts_bgcache_stats_get(c, &st);
    assert_int_equal(st.jpeg_spliced, 3);
    assert_int_equal(st.jpeg_full, 1);
    assert_int_equal(st.bytes, before + (int64_t)mts_jpeg_bg_bytes(j90));
    mts_bgcache_put(c, f);
    /* Frames decoded from now on are encoded at the latest quality (85) as they are decoded. */
    get_put(c, 7);
    assert_int_equal(mts_bgcache_get(c, 7, &f, &err), 0);
    assert_non_null(f->jpeg);
    assert_int_equal(mts_jpeg_bg_quality(f->jpeg), 85);
    mts_bgcache_put(c, f);
    /* Out of range index. */
    assert_int_equal(mts_bgcache_get(c, NF, &f, &err), MTS_EINVAL);
    mts_bgcache_unref(c);
    remove_assets(dir);
}

static void expect_open_error(const char *dir, const char *rects, int num_frames, int code, const char *needle)
{
    mts_bgcache *c = NULL;
    mts_err err = {0};
    int rc = open_cache(dir, rects, num_frames, 4, &c, &err);
    if (rc != code || !strstr(err.msg, needle))
        fail_msg("expected %d with '%s', got %d: %s", code, needle, rc, err.msg);
    assert_null(c);
}

static void test_bad_assets(void **state)
{
    (void)state;
    char dir[256], path[600];
    make_assets(dir, sizeof dir);
    mts_bgcache *c;
    mts_err err = {0};
    /* num_frames not matching the files */
    expect_open_error(dir, NULL, NF + 2, MTS_EINVAL, "num_frames is 12 but");
    /* crop rectangles: missing file, bad JSON, wrong shapes, a frame without a rectangle */
    expect_open_error(dir, "nope.json", 0, MTS_ENOTFOUND, "nope.json");
    snprintf(path, sizeof path, "%s/bad.json", dir);
    write_file(path, "[[1,2,3,4]", 10);
    expect_open_error(dir, "bad.json", 0, MTS_EINVAL, "bad.json");
    write_file(path, "[[1,2,3]]", 9);
    expect_open_error(dir, "bad.json", 0, MTS_EINVAL, "frame 0");
    write_file(path, "[[1,2,3,4.5]]", 13);
    expect_open_error(dir, "bad.json", 0, MTS_EINVAL, "y2 must be an integer");
    write_file(path, "[[1,2,3,4],[1,2,3,4]]", 21);
    expect_open_error(dir, "bad.json", 0, MTS_EINVAL, "no rectangle for frame 2");
    write_file(path, "{\"zero\":[1,2,3,4]}", 18);
    expect_open_error(dir, "bad.json", 0, MTS_EINVAL, "not a frame index");
    /* the object form, keyed by index, with array or object rectangles */
    char json[2048];
    size_t n = (size_t)snprintf(json, sizeof json, "{");
    for (int f = NF - 1; f >= 0; f--)
        n += (size_t)snprintf(json + n, sizeof json - n, "%s\"%d\":[%d,%d,%d,%d]", f == NF - 1 ? "" : ",", f,
                              rect_of(f).x1, rect_of(f).y1, rect_of(f).x2, rect_of(f).y2);
    n += (size_t)snprintf(json + n, sizeof json - n, ",\"99\":[0,0,1,1]}");
    snprintf(path, sizeof path, "%s/obj.json", dir);
    write_file(path, json, n);
    assert_int_equal(open_cache(dir, "obj.json", NF, 4, &c, &err), 0);
    assert_int_equal(mts_bgcache_rect(c, 4)->x1, rect_of(4).x1);
    assert_int_equal(mts_bgcache_rect(c, 4)->y2, rect_of(4).y2);
    mts_bgcache_unref(c);
    /* a crop rectangle outside the frame fails only the composites that use that frame */
    snprintf(path, sizeof path, "%s/out.json", dir);
    n = (size_t)snprintf(json, sizeof json, "[");
    for (int f = 0; f < NF; f++)
        n += (size_t)snprintf(json + n, sizeof json - n, "%s[%d,%d,%d,%d]", f ? "," : "", f == 4 ? W - 50 : 10, 10,
                              f == 4 ? W + 10 : 60, 60);
    n += (size_t)snprintf(json + n, sizeof json - n, "]");
    write_file(path, json, n);
    assert_int_equal(open_cache(dir, "out.json", NF, 4, &c, &err), 0);
    float *m = make_mouths(2, 3);
    mts_composite_opts o = {MTS_FRAME_JPEG, 85, 1, MTS_WRAP_LOOP, 3};
    mts_composite_out out;
    assert_int_equal(mts_composite_batch(c, m, 2, S, S, &o, &out, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "of frame 4 lies outside the 200x150 background frame"));
    o.start_frame_idx = 5;
    assert_int_equal(mts_composite_batch(c, m, 2, S, S, &o, &out, &err), 0);
    mts_composite_out_free(&out);
    mts_bgcache_unref(c);
    /* corrupt PNG (bad data), truncated PNG, a frame of another size, a frame deleted after open */
    char fdir[512];
    snprintf(fdir, sizeof fdir, "%s/frames", dir);
    assert_int_equal(open_cache(dir, NULL, NF, 4, &c, &err), 0);
    snprintf(path, sizeof path, "%s/000002.png", fdir);
    FILE *fp = fopen(path, "r+b");
    fseek(fp, 60, SEEK_SET);
    fwrite("garbage-garbage-garbage", 1, 23, fp);
    fclose(fp);
    snprintf(path, sizeof path, "%s/000003.png", fdir);
    assert_int_equal(truncate(path, 100), 0);
    write_frame(fdir, 6, W / 2, H);
    snprintf(path, sizeof path, "%s/000007.png", fdir);
    unlink(path);
    mts_bgframe *f;
    const struct {
        int idx, code;
        const char *needle;
    } cases[] = {{2, MTS_EFORMAT, "000002.png: corrupt PNG"},
                 {3, MTS_EFORMAT, "000003.png: corrupt PNG"},
                 {6, MTS_EFORMAT, "frame 6 is 100x150 but the avatar's frames are 200x150"},
                 {7, MTS_ENOTFOUND, "000007.png: frame file is missing"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memset(&err, 0, sizeof err);
        int rc = mts_bgcache_get(c, cases[k].idx, &f, &err);
        if (rc != cases[k].code || !strstr(err.msg, cases[k].needle))
            fail_msg("frame %d: expected %d '%s', got %d: %s", cases[k].idx, cases[k].code, cases[k].needle, rc, err.msg);
        o.start_frame_idx = cases[k].idx;
        assert_int_equal(mts_composite_batch(c, m, 1, S, S, &o, &out, &err), cases[k].code);
        assert_non_null(strstr(err.msg, "background frame"));
    }
    get_put(c, 1); /* the cache keeps serving good frames */
    o.start_frame_idx = 8;
    assert_int_equal(mts_composite_batch(c, m, 2, S, S, &o, &out, &err), 0);
    mts_composite_out_free(&out);
    mts_bgcache_stats st;
    mts_bgcache_stats_get(c, &st);
    assert_int_equal(st.load_errors, 8);
    mts_bgcache_unref(c);
    /* a numbering gap (000007.png is gone) and a missing folder are open errors */
    expect_open_error(dir, NULL, 0, MTS_ENOTFOUND, "frame file number 7 (frame index 7) is missing");
    snprintf(path, sizeof path, "%s/nodir", dir);
    mts_bgcache_config cfg = {"test", path, path, 0, 4};
    assert_int_equal(mts_bgcache_open(&cfg, &c, &err), MTS_ENOTFOUND);
    assert_non_null(strstr(err.msg, "background_dir"));
    free(m);
    remove_assets(dir);
}

typedef struct worker_arg {
    mts_bgcache *c;
    unsigned seed;
    int failures;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    float *m = make_mouths(2, a->seed);
    for (int k = 0; k < 40; k++) {
        a->seed = a->seed * 1103515245u + 12345u;
        int idx = (int)((a->seed >> 8) % NF);
        mts_bgframe *f;
        mts_err err = {0};
        if (mts_bgcache_get(a->c, idx, &f, &err) || f->img.rgb[0] != bg_pixel(idx, 0, 0, 0)) a->failures++;
        else mts_bgcache_put(a->c, f);
        if (k % 4 == 0) mts_bgcache_preload(a->c, (idx + 1) % NF);
        if (k % 5 == 0) { /* JPEG at two qualities (encodings replaced under contention) vs whole-frame encoding */
            int q = k % 10 ? 80 : 90;
            mts_composite_opts o = {MTS_FRAME_RGB, q, 1, MTS_WRAP_PINGPONG, idx};
            mts_composite_out raw, jpg;
            if (mts_composite_batch(a->c, m, 2, S, S, &o, &raw, &err)) {
                a->failures++;
                continue;
            }
            o.format = MTS_FRAME_JPEG;
            if (mts_composite_batch(a->c, m, 2, S, S, &o, &jpg, &err)) a->failures++;
            for (int i = 0; !err.code && i < 2; i++) {
                const uint8_t *rows[H];
                for (int y = 0; y < H; y++) rows[y] = raw.data.data + raw.offset[i] + (size_t)y * W * 3;
                mts_buf whole = {0};
                if (mts_jpeg_encode(rows, W, H, q, &whole, &err) || whole.len != jpg.len[i] ||
                    memcmp(whole.data, jpg.data.data + jpg.offset[i], whole.len))
                    a->failures++;
                mts_buf_free(&whole);
            }
            if (!err.code) mts_composite_out_free(&jpg);
            mts_composite_out_free(&raw);
        }
        mts_bgcache_stats st;
        mts_bgcache_stats_get(a->c, &st);
    }
    free(m);
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    char dir[256];
    make_assets(dir, sizeof dir);
    mts_bgcache *c;
    mts_err err = {0};
    assert_int_equal(open_cache(dir, NULL, NF, 3, &c, &err), 0);
    pthread_t t[6];
    worker_arg a[6];
    for (int i = 0; i < 6; i++) {
        a[i] = (worker_arg){c, 100u + (unsigned)i, 0};
        mts_bgcache_ref(c);
        assert_int_equal(pthread_create(&t[i], NULL, worker, &a[i]), 0);
    }
    mts_bgcache_unref(c); /* the workers' references keep it alive */
    for (int i = 0; i < 6; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(a[i].failures, 0);
    }
    mts_bgcache_stats st;
    mts_bgcache_stats_get(c, &st);
    assert_int_equal(st.requests, st.hits + st.misses);
    assert_true(st.frames_cached <= 3);
    for (int i = 0; i < 6; i++) mts_bgcache_unref(c);
    remove_assets(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize),
        cmocka_unit_test(test_resize_identity_and_reference),
        cmocka_unit_test(test_composite_pixel_exact),
        cmocka_unit_test(test_jpeg_splice),
        cmocka_unit_test(test_upload_decode),
        cmocka_unit_test(test_segment_processing),
        cmocka_unit_test(test_frame_index),
        cmocka_unit_test(test_cache_accounting),
        cmocka_unit_test(test_bad_assets),
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
