/*
 * Pieces shared by the two lip-sync front ends (gRPC inference.InferenceService in
 * grpc_lipsync.c and POST /api/v1/lipsync/{model}/composite in lipsync_http.c): the batch limit
 * of the design documents, the per-frame size of an input, and the background prefetch that
 * overlaps frame decoding with inference.
 */
#ifndef MTS_API_LIPSYNC_COMMON_H
#define MTS_API_LIPSYNC_COMMON_H

#include <stdint.h>

#include "media/compose.h"
#include "serve/server.h"

/* Frames per request at most (the documents' batch_size range 1..25). */
#define MTS_LIPSYNC_MAX_BATCH 25

/* Elements of one frame of an input: the model's dims 1..3 when it declares them (rank 4, all
 * positive), else def[0..2]; the three dims go to dims. */
int64_t mts_lipsync_frame_elems(const mts_tensor_meta *m, const int64_t *def, int64_t dims[3]);

/* Queues the decoding of the batch's n background frames (and, when the cache has room for two
 * batches, of the next batch's, for sequential playback) on the server's media threads, so that
 * it overlaps the inference. Best effort: does nothing without a media queue or memory. */
void mts_lipsync_prefetch(mts_server *srv, mts_bgcache *bg, const mts_composite_opts *o, int n);

#endif
