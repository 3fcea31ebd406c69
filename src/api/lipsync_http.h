/*
 * The lip-sync compositing endpoint of the HTTP front end (issue 6, docs/media.md):
 *
 *   POST /api/v1/lipsync/{model}/composite?batch_size=N&start_frame_idx=K&format=jpeg&quality=85
 *        &wrap=loop
 *   body: N x 6 x 320 x 320 float32 (visual) then N x 32 x 16 x 16 float32 (audio), little-endian
 *   200:  a JSON header of Inference-Header-Content-Length bytes, then every frame back to back
 *         (the header lists each frame's frame_idx, offset into the binary part and size).
 *
 * kserve_http.c routes the path here (its one hook) and its on_cancel treats req->user as a
 * pointer to an mts_request: the call struct here starts with one.
 */
#ifndef MTS_API_LIPSYNC_HTTP_H
#define MTS_API_LIPSYNC_HTTP_H

#include "api/http.h"
#include "serve/server.h"

#define MTS_LIPSYNC_HTTP_PREFIX "/api/v1/lipsync/"

/* Handles every request under MTS_LIPSYNC_HTTP_PREFIX (404 for unknown sub-paths, 405 for
 * methods other than POST). Runs on the I/O thread; never blocks. */
void mts_lipsync_http_handle(mts_server *srv, mts_http_conn *c, mts_http_req *hr);

#endif
