/*
 * Images for lip-sync compositing: 8-bit RGB frames (interleaved, rows packed, stride = 3 x
 * width), PNG decoding (libpng; any bit depth, palette, grey or alpha is converted to RGB8 and
 * alpha is dropped), PNG header probing, and encoding to PNG (libpng) or JPEG (libjpeg-turbo)
 * in memory. The encoders take their rows through an array of row pointers, so a composited
 * frame can be encoded straight from the cached background rows plus a few patched rows
 * without first copying the whole frame.
 */
#ifndef MTS_MEDIA_IMAGE_H
#define MTS_MEDIA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

/* Largest accepted frame side (pixels). */
#define MTS_IMAGE_MAX_SIDE 16384

typedef struct mts_image {
    int width, height;
    uint8_t *rgb; /* width x height x 3, malloc'd */
} mts_image;

/* Reads a PNG file's width and height from its header (cheap). MTS_ENOTFOUND / MTS_EIO when it
 * cannot be read, MTS_EFORMAT when it is not a PNG. */
int mts_png_probe(const char *path, int *width, int *height, mts_err *err);
/* Decodes a PNG file into RGB8. MTS_ENOTFOUND (missing), MTS_EIO, MTS_EFORMAT (corrupt or
 * truncated: the message has libpng's reason), MTS_ELIMIT (a side over MTS_IMAGE_MAX_SIDE),
 * MTS_ENOMEM. */
int mts_png_decode_file(const char *path, mts_image *out, mts_err *err);
/* Same from memory. */
int mts_png_decode_mem(const void *data, size_t len, mts_image *out, mts_err *err);
/* Decodes an uploaded PNG or JPEG (told apart by their signatures) into RGB8. Beyond the per-side
 * limit, images of more than max_pixels (> 0) are refused from their header, before any pixel
 * memory is allocated (MTS_ELIMIT). JPEG warnings (a truncated file, corrupt entropy data) are
 * errors (MTS_EFORMAT with libjpeg's reason), as are CMYK JPEGs and anything that is neither
 * format. */
int mts_image_decode_mem(const void *data, size_t len, int64_t max_pixels, mts_image *out, mts_err *err);
void mts_image_free(mts_image *img);

/* A growable output buffer for the encoders. */
typedef struct mts_buf {
    uint8_t *data;
    size_t len, cap;
} mts_buf;
void mts_buf_free(mts_buf *b);
int mts_buf_append(mts_buf *b, const void *p, size_t n);

/* Encodes height rows of width RGB8 pixels (rows[y] points at row y) and APPENDS the file to out.
 * PNG: compression level 0..9 (zlib; 1 is fast), no interlace. JPEG: quality 1..100, 4:2:0
 * chroma subsampling, baseline, restart markers as below. */
int mts_png_encode(const uint8_t *const *rows, int width, int height, int level, mts_buf *out, mts_err *err);
/* Same for 8-bit greyscale rows (width bytes each), e.g. segmentation masks. */
int mts_png_encode_gray(const uint8_t *const *rows, int width, int height, int level, mts_buf *out, mts_err *err);
int mts_jpeg_encode(const uint8_t *const *rows, int width, int height, int quality, mts_buf *out, mts_err *err);
/* JPEG files from mts_jpeg_encode carry a restart marker every mts_jpeg_restart_mcus(width) MCUs:
 * a divisor of the MCUs per row (the largest in 4..10, or the whole row when there is none), so
 * every image row of MCUs holds whole restart intervals. That lets media/jpeg_splice.c replace
 * the intervals around a crop rectangle without re-encoding the rest (about 1 % larger files). */
int mts_jpeg_restart_mcus(int width);
/* Same with an explicit restart interval in MCUs (0: none). */
int mts_jpeg_encode_ex(const uint8_t *const *rows, int width, int height, int quality, int restart_mcus, mts_buf *out,
                       mts_err *err);

#endif
