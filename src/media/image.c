/*
 * PNG decoding/encoding through libpng and JPEG encoding through libjpeg-turbo (jpeglib API),
 * all in memory. Both libraries report errors with longjmp: every setjmp frame here keeps the
 * state it must free in volatile locals, and every message names the file (or "memory") and
 * the library's reason, e.g. "frame.png: corrupt PNG: IDAT: incorrect data check".
 */
#include "media/image.h"

#include <errno.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

void mts_image_free(mts_image *img)
{
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
    img->width = img->height = 0;
}

void mts_buf_free(mts_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static int buf_reserve(mts_buf *b, size_t need)
{
    if (need <= b->cap) return MTS_OK;
    size_t cap = b->cap ? b->cap : 65536;
    while (cap < need) cap *= 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p) return MTS_ENOMEM;
    b->data = p;
    b->cap = cap;
    return MTS_OK;
}

int mts_buf_append(mts_buf *b, const void *p, size_t n)
{
    if (buf_reserve(b, b->len + n)) return MTS_ENOMEM;
    if (n) memcpy(b->data + b->len, p, n); /* memcpy with NULL is undefined even for 0 bytes */
    b->len += n;
    return MTS_OK;
}

/* ---- PNG decoding ---- */

typedef struct png_ctx {
    char msg[256];
    const uint8_t *mem; /* memory source */
    size_t len, pos;
} png_ctx;

static void png_err_fn(png_structp p, png_const_charp msg)
{
    png_ctx *c = png_get_error_ptr(p);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(p, 1);
}

static void png_warn_fn(png_structp p, png_const_charp msg)
{
    (void)p;
    (void)msg;
}

static void png_read_mem(png_structp p, png_bytep out, png_size_t n)
{
    png_ctx *c = png_get_io_ptr(p);
    if (c->len - c->pos < n) png_error(p, "truncated file");
    memcpy(out, c->mem + c->pos, n);
    c->pos += n;
}

/* Decodes from an open FILE (f) or from memory (ctx->mem). */
static int png_decode(FILE *f, png_ctx *ctx, const char *what, mts_image *out, bool probe_only, mts_err *err)
{
    memset(out, 0, sizeof *out);
    png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, ctx, png_err_fn, png_warn_fn);
    if (!p) return mts_err_set(err, MTS_ENOMEM, "%s: out of memory", what);
    png_infop info = png_create_info_struct(p);
    uint8_t *volatile pixels = NULL;
    png_bytep *volatile rows = NULL;
    if (!info) {
        png_destroy_read_struct(&p, NULL, NULL);
        return mts_err_set(err, MTS_ENOMEM, "%s: out of memory", what);
    }
    if (setjmp(png_jmpbuf(p))) {
        free(pixels);
        free(rows);
        png_destroy_read_struct(&p, &info, NULL);
        return mts_err_set(err, MTS_EFORMAT, "%s: corrupt PNG: %s", what, ctx->msg[0] ? ctx->msg : "unknown error");
    }
    if (f) png_init_io(p, f);
    else png_set_read_fn(p, ctx, png_read_mem);
    png_set_user_limits(p, MTS_IMAGE_MAX_SIDE, MTS_IMAGE_MAX_SIDE);
    png_read_info(p, info);
    png_uint_32 w = png_get_image_width(p, info), h = png_get_image_height(p, info);
    out->width = (int)w;
    out->height = (int)h;
    if (probe_only) {
        png_destroy_read_struct(&p, &info, NULL);
        return MTS_OK;
    }
    int ct = png_get_color_type(p, info), depth = png_get_bit_depth(p, info);
    if (depth == 16) png_set_strip_16(p);
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(p);
    if (ct == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(p);
    if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(p);
    if (ct & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(p);
    if (png_get_valid(p, info, PNG_INFO_tRNS)) png_set_strip_alpha(p);
    png_set_interlace_handling(p);
    png_read_update_info(p, info);
    if (png_get_rowbytes(p, info) != (size_t)w * 3) png_error(p, "unexpected pixel layout after conversion to RGB8");
    pixels = malloc((size_t)w * h * 3);
    rows = malloc(sizeof *rows * h);
    if (!pixels || !rows) {
        free(pixels);
        free(rows);
        png_destroy_read_struct(&p, &info, NULL);
        return mts_err_set(err, MTS_ENOMEM, "%s: out of memory for a %ux%u frame", what, (unsigned)w, (unsigned)h);
    }
    for (png_uint_32 y = 0; y < h; y++) rows[y] = pixels + (size_t)y * w * 3;
    png_read_image(p, rows);
    png_read_end(p, NULL);
    png_destroy_read_struct(&p, &info, NULL);
    free(rows);
    out->rgb = pixels;
    return MTS_OK;
}

static int open_png(const char *path, FILE **f, mts_err *err)
{
    *f = fopen(path, "rb");
    if (!*f)
        return mts_err_set(err, errno == ENOENT ? MTS_ENOTFOUND : MTS_EIO, "%s: %s", path,
                           errno == ENOENT ? "frame file is missing" : strerror(errno));
    uint8_t sig[8];
    if (fread(sig, 1, 8, *f) != 8 || png_sig_cmp(sig, 0, 8)) {
        fclose(*f);
        return mts_err_set(err, MTS_EFORMAT, "%s: corrupt PNG: not a PNG file (bad signature)", path);
    }
    rewind(*f);
    return MTS_OK;
}

int mts_png_probe(const char *path, int *width, int *height, mts_err *err)
{
    FILE *f;
    int rc = open_png(path, &f, err);
    if (rc) return rc;
    png_ctx ctx = {0};
    mts_image img;
    rc = png_decode(f, &ctx, path, &img, true, err);
    fclose(f);
    if (!rc) *width = img.width, *height = img.height;
    return rc;
}

int mts_png_decode_file(const char *path, mts_image *out, mts_err *err)
{
    FILE *f;
    int rc = open_png(path, &f, err);
    if (rc) return rc;
    png_ctx ctx = {0};
    rc = png_decode(f, &ctx, path, out, false, err);
    fclose(f);
    return rc;
}

int mts_png_decode_mem(const void *data, size_t len, mts_image *out, mts_err *err)
{
    if (len < 8 || png_sig_cmp(data, 0, 8)) return mts_err_set(err, MTS_EFORMAT, "memory: not a PNG (bad signature)");
    png_ctx ctx = {.mem = data, .len = len};
    return png_decode(NULL, &ctx, "memory", out, false, err);
}

/* ---- JPEG decoding ---- */

/* libjpeg errors (both directions) longjmp back with libjpeg's message. */
typedef struct jpeg_err_ctx {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err_ctx;

static void jpeg_err_exit(j_common_ptr cinfo)
{
    jpeg_err_ctx *e = (jpeg_err_ctx *)cinfo->err;
    e->pub.format_message(cinfo, e->msg);
    longjmp(e->jb, 1);
}

/* Warnings (a truncated file, corrupt data that libjpeg would paper over) are errors here. */
static void jpeg_dec_message(j_common_ptr ci, int level)
{
    if (level < 0) jpeg_err_exit(ci);
}

static int jpeg_decode_mem(const void *data, size_t len, int64_t max_pixels, mts_image *out, mts_err *err)
{
    struct jpeg_decompress_struct ci;
    jpeg_err_ctx je;
    uint8_t *volatile pixels = NULL;
    memset(out, 0, sizeof *out);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jpeg_err_exit;
    je.pub.emit_message = jpeg_dec_message;
    je.msg[0] = 0;
    if (setjmp(je.jb)) {
        free(pixels);
        jpeg_destroy_decompress(&ci);
        return mts_err_set(err, MTS_EFORMAT, "corrupt JPEG: %s", je.msg);
    }
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, (const unsigned char *)data, (unsigned long)len);
    jpeg_read_header(&ci, TRUE);
    unsigned w = ci.image_width, h = ci.image_height;
    if (w > MTS_IMAGE_MAX_SIDE || h > MTS_IMAGE_MAX_SIDE || (max_pixels > 0 && (int64_t)w * h > max_pixels)) {
        jpeg_destroy_decompress(&ci);
        return mts_err_set(err, MTS_ELIMIT, "a %ux%u JPEG is over the limits (side %d, %lld pixels)", w, h,
                           MTS_IMAGE_MAX_SIDE, (long long)max_pixels);
    }
    if (ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&ci);
        return mts_err_set(err, MTS_EFORMAT, "CMYK JPEGs are not supported (convert the image to RGB)");
    }
    ci.out_color_space = JCS_RGB;
    jpeg_start_decompress(&ci);
    if (ci.output_components != 3) {
        jpeg_destroy_decompress(&ci);
        return mts_err_set(err, MTS_EFORMAT, "JPEG decodes to %d components, expected RGB", ci.output_components);
    }
    pixels = malloc((size_t)w * h * 3);
    if (!pixels) {
        jpeg_destroy_decompress(&ci);
        return mts_err_set(err, MTS_ENOMEM, "out of memory for a %ux%u image", w, h);
    }
    while (ci.output_scanline < h) {
        JSAMPROW row = pixels + (size_t)ci.output_scanline * w * 3;
        jpeg_read_scanlines(&ci, &row, 1);
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    out->width = (int)w;
    out->height = (int)h;
    out->rgb = pixels;
    return MTS_OK;
}

int mts_image_decode_mem(const void *data, size_t len, int64_t max_pixels, mts_image *out, mts_err *err)
{
    const uint8_t *b = data;
    memset(out, 0, sizeof *out);
    if (len >= 8 && !png_sig_cmp(b, 0, 8)) {
        if (len >= 24 && !memcmp(b + 12, "IHDR", 4)) { /* the size, before libpng allocates anything */
            uint32_t w = (uint32_t)b[16] << 24 | (uint32_t)b[17] << 16 | (uint32_t)b[18] << 8 | b[19];
            uint32_t h = (uint32_t)b[20] << 24 | (uint32_t)b[21] << 16 | (uint32_t)b[22] << 8 | b[23];
            if (w > MTS_IMAGE_MAX_SIDE || h > MTS_IMAGE_MAX_SIDE || (max_pixels > 0 && (int64_t)w * h > max_pixels))
                return mts_err_set(err, MTS_ELIMIT, "a %ux%u PNG is over the limits (side %d, %lld pixels)", w, h,
                                   MTS_IMAGE_MAX_SIDE, (long long)max_pixels);
        }
        png_ctx ctx = {.mem = data, .len = len}; /* IHDR must come first, so the check above saw it */
        return png_decode(NULL, &ctx, "PNG image", out, false, err);
    }
    if (len >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return jpeg_decode_mem(data, len, max_pixels, out, err);
    if (len == 0) return mts_err_set(err, MTS_EFORMAT, "the image is empty (0 bytes)");
    return mts_err_set(err, MTS_EFORMAT, "not a PNG or JPEG image (%zu bytes starting %02x %02x %02x %02x)", len, b[0],
                       len > 1 ? b[1] : 0, len > 2 ? b[2] : 0, len > 3 ? b[3] : 0);
}

/* ---- PNG encoding ---- */

static void png_write_buf(png_structp p, png_bytep data, png_size_t n)
{
    mts_buf *b = png_get_io_ptr(p);
    if (mts_buf_append(b, data, n)) png_error(p, "out of memory");
}

static void png_flush_buf(png_structp p)
{
    (void)p;
}

static int png_encode(const uint8_t *const *rows, int width, int height, int level, int color_type, mts_buf *out,
                      mts_err *err)
{
    png_ctx ctx = {0};
    png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, png_err_fn, png_warn_fn);
    if (!p) return mts_err_set(err, MTS_ENOMEM, "PNG encoder: out of memory");
    png_infop info = png_create_info_struct(p);
    size_t start = out->len;
    if (!info) {
        png_destroy_write_struct(&p, NULL);
        return mts_err_set(err, MTS_ENOMEM, "PNG encoder: out of memory");
    }
    if (setjmp(png_jmpbuf(p))) {
        png_destroy_write_struct(&p, &info);
        out->len = start;
        return mts_err_set(err, MTS_ENOMEM, "PNG encoder: %s", ctx.msg);
    }
    png_set_write_fn(p, out, png_write_buf, png_flush_buf);
    png_set_compression_level(p, level < 0 ? 1 : level > 9 ? 9 : level);
    png_set_filter(p, 0, level <= 1 ? PNG_FILTER_SUB : PNG_ALL_FILTERS);
    png_set_IHDR(p, info, (png_uint_32)width, (png_uint_32)height, 8, color_type, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(p, info);
    for (int y = 0; y < height; y++) png_write_row(p, (png_const_bytep)rows[y]);
    png_write_end(p, info);
    png_destroy_write_struct(&p, &info);
    return MTS_OK;
}

int mts_png_encode(const uint8_t *const *rows, int width, int height, int level, mts_buf *out, mts_err *err)
{
    return png_encode(rows, width, height, level, PNG_COLOR_TYPE_RGB, out, err);
}

int mts_png_encode_gray(const uint8_t *const *rows, int width, int height, int level, mts_buf *out, mts_err *err)
{
    return png_encode(rows, width, height, level, PNG_COLOR_TYPE_GRAY, out, err);
}

/* ---- JPEG encoding ---- */

typedef struct jpeg_buf_dest {
    struct jpeg_destination_mgr pub;
    mts_buf *b;
} jpeg_buf_dest;

static void jd_init(j_compress_ptr ci)
{
    jpeg_buf_dest *d = (jpeg_buf_dest *)ci->dest;
    if (buf_reserve(d->b, d->b->len + 256 * 1024)) ERREXIT1(ci, JERR_OUT_OF_MEMORY, 0);
    d->pub.next_output_byte = d->b->data + d->b->len;
    d->pub.free_in_buffer = d->b->cap - d->b->len;
}

static boolean jd_empty(j_compress_ptr ci)
{
    jpeg_buf_dest *d = (jpeg_buf_dest *)ci->dest;
    d->b->len = d->b->cap; /* the whole buffer was filled */
    if (buf_reserve(d->b, d->b->cap * 2)) ERREXIT1(ci, JERR_OUT_OF_MEMORY, 0);
    d->pub.next_output_byte = d->b->data + d->b->len;
    d->pub.free_in_buffer = d->b->cap - d->b->len;
    return TRUE;
}

static void jd_term(j_compress_ptr ci)
{
    jpeg_buf_dest *d = (jpeg_buf_dest *)ci->dest;
    d->b->len = d->b->cap - d->pub.free_in_buffer;
}

int mts_jpeg_restart_mcus(int width)
{
    int cols = (width + 15) / 16, best = cols; /* MCUs per row (4:2:0: 16x16 pixels) */
    for (int d = 10; d >= 4; d--)
        if (cols % d == 0) {
            best = d;
            break;
        }
    return best;
}

int mts_jpeg_encode(const uint8_t *const *rows, int width, int height, int quality, mts_buf *out, mts_err *err)
{
    return mts_jpeg_encode_ex(rows, width, height, quality, mts_jpeg_restart_mcus(width), out, err);
}

int mts_jpeg_encode_ex(const uint8_t *const *rows, int width, int height, int quality, int restart_mcus, mts_buf *out,
                       mts_err *err)
{
    struct jpeg_compress_struct ci;
    jpeg_err_ctx je;
    jpeg_buf_dest dest;
    size_t start = out->len;
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jpeg_err_exit;
    if (setjmp(je.jb)) {
        jpeg_destroy_compress(&ci);
        out->len = start;
        return mts_err_set(err, MTS_ENOMEM, "JPEG encoder: %s", je.msg);
    }
    jpeg_create_compress(&ci);
    memset(&dest, 0, sizeof dest);
    dest.pub.init_destination = jd_init;
    dest.pub.empty_output_buffer = jd_empty;
    dest.pub.term_destination = jd_term;
    dest.b = out;
    ci.dest = &dest.pub;
    ci.image_width = (JDIMENSION)width;
    ci.image_height = (JDIMENSION)height;
    ci.input_components = 3;
    ci.in_color_space = JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, quality < 1 ? 1 : quality > 100 ? 100 : quality, TRUE);
    ci.dct_method = JDCT_ISLOW;
    ci.restart_interval = (unsigned int)(restart_mcus > 0 ? restart_mcus : 0);
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW r[64];
        JDIMENSION n = ci.image_height - ci.next_scanline;
        if (n > 64) n = 64;
        for (JDIMENSION i = 0; i < n; i++) r[i] = (JSAMPROW)rows[ci.next_scanline + i];
        jpeg_write_scanlines(&ci, r, n);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    return MTS_OK;
}
