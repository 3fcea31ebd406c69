/*
 * The lip-sync compositing endpoint of the HTTP front end (docs/media.md):
 *
 *   POST /api/v1/lipsync/{model}/composite?batch_size=N&start_frame_idx=K&format=jpeg&quality=85
 *        &wrap=loop
 *   body: N x 6 x 320 x 320 float32 (visual) then N x 32 x 16 x 16 float32 (audio), little-endian
 *   200:  a JSON header of Inference-Header-Content-Length bytes, then every frame back to back
 *         (the header lists each frame's frame_idx, offset into the binary part and size).
 *
 * The REST front end (rest.c) serves the route table below; its on_cancel treats hr->user as a
 * pointer to an mts_request: the call struct here starts with one.
 */
#ifndef MTS_API_LIPSYNC_HTTP_H
#define MTS_API_LIPSYNC_HTTP_H

#include "api/router.h"

#define MTS_LIPSYNC_HTTP_PREFIX "/api/v1/lipsync/"

/* The route (POST only; other methods get 405), ending with an all-NULL entry, and the 404 hint
 * for other paths under MTS_LIPSYNC_HTTP_PREFIX. */
extern const mts_route mts_lipsync_routes[];
extern const mts_route_hint mts_lipsync_hints[];

#endif
