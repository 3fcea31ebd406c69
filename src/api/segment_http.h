/*
 * REST segmentation endpoints (as the ML service analysis has them: a backend uploads
 * images as multipart/form-data with model and threshold fields):
 *
 *   POST /api/v1/segment         one image: form fields `file` (or `image`), `model`, `threshold`
 *   POST /api/v1/batch-segment   several images: every `files`/`file`/`images`/`image` part (or
 *                                any part with a filename), run as one batch
 *
 * `model` and `threshold` may also come from the query string. Images are PNG or JPEG of any
 * size; each is resized to the model's input, the model runs, and its output is turned into a
 * mask of the image's size (media/segment.h). The answer is JSON: per image its size, the
 * foreground pixel count, fraction and bounding box, and the mask as a base64 PNG (greyscale,
 * 0/255, or class indices for multi-class models); for /api/v1/segment with `response=png`
 * (query or form field) the body is the mask PNG itself. docs/server.md has the exact schema.
 * Decoding, resizing and encoding run on the media threads, inference on the device workers,
 * nothing heavy on the HTTP I/O threads. Errors are {"error": "..."} with the statuses of
 * protocol.h: 400 malformed form or image, 404 unknown model, 412 a model that is not a
 * segmentation model, 413 an image over the pixel limit, 429 queue full, 503 unavailable; other
 * methods than POST get 405.
 */
#ifndef MTS_API_SEGMENT_HTTP_H
#define MTS_API_SEGMENT_HTTP_H

#include "api/router.h"

#define MTS_SEGMENT_MAX_IMAGES 64
#define MTS_SEGMENT_MAX_PIXELS (40LL * 1000 * 1000) /* per image */

/* The two routes, ending with an all-NULL entry. A call struct starts with an mts_request, so
 * the front end's on_cancel can cancel it through hr->user. */
extern const mts_route mts_segment_routes[];

#endif
