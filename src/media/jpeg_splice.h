/*
 * JPEG encoding of a composited frame by re-encoding only the part that changed.
 *
 * A lip-sync frame differs from its background only inside the crop rectangle. mts_jpeg_encode
 * puts a restart marker every R MCUs (R divides the MCUs per row, mts_jpeg_restart_mcus), and
 * at each restart the entropy coder resets its DC predictors and byte-aligns its output, so
 * every restart interval is a self-contained run of bytes that depends only on its own 16x16
 * pixel MCUs. A background frame is encoded once (mts_jpeg_bg_make) and its intervals indexed;
 * a composited frame is then the background's header and intervals with those that overlap the
 * rectangle replaced by the intervals of a small sub-image (the MCU rows and interval columns
 * around the rectangle, encoded with the same quality and interval), and fresh restart
 * markers. Colour conversion, 4:2:0 downsampling, DCT and quantization are local to an MCU,
 * and the sub-image starts on MCU boundaries, so the result is byte-for-byte the file that
 * mts_jpeg_encode produces for the whole composited frame (tests/unit/test_media.c checks
 * this) at a fraction of the cost (docs/media.md has the figures).
 */
#ifndef MTS_MEDIA_JPEG_SPLICE_H
#define MTS_MEDIA_JPEG_SPLICE_H

#include <stddef.h>
#include <stdint.h>

#include "media/composite.h"
#include "media/image.h"
#include "util/status.h"

typedef struct mts_jpeg_bg mts_jpeg_bg;

/* Encodes a width x height RGB8 frame (rows[y]) at quality and indexes its restart intervals.
 * MTS_EFORMAT if the encoder's output does not have the expected interval structure (it always
 * should), MTS_ENOMEM. */
int mts_jpeg_bg_make(const uint8_t *const *rows, int width, int height, int quality, mts_jpeg_bg **out, mts_err *err);
void mts_jpeg_bg_free(mts_jpeg_bg *b);
int mts_jpeg_bg_quality(const mts_jpeg_bg *b);
/* Bytes held (the encoded file and its index). */
size_t mts_jpeg_bg_bytes(const mts_jpeg_bg *b);

/* Appends to out the JPEG file of the composited frame whose rows are rows[0..height) (the
 * background everywhere outside r, which must have passed mts_crop_check). */
int mts_jpeg_bg_compose(const mts_jpeg_bg *b, const uint8_t *const *rows, const mts_crop_rect *r, mts_buf *out,
                        mts_err *err);

#endif
