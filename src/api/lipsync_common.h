/*
 * Pieces shared by the two lip-sync front ends (gRPC inference.InferenceService in
 * grpc_lipsync.c and POST /api/v1/lipsync/{model}/composite in lipsync_http.c): the batch limit
 * of the lip-sync API, the request checks, the binding of the raw visual and audio frames
 * to the model's inputs, the compositing options and the check of the model's mouth-region
 * output, the status of an asset failure, and the background prefetch that overlaps frame
 * decoding with inference. Checks return MTS_E* statuses (protocol.h maps them per wire).
 */
#ifndef MTS_API_LIPSYNC_COMMON_H
#define MTS_API_LIPSYNC_COMMON_H

#include <stdint.h>

#include "api/protocol.h"
#include "media/compose.h"
#include "serve/server.h"

/* Frames per request at most (the documents' batch_size range 1..25). */
#define MTS_LIPSYNC_MAX_BATCH 25

/* Model and batch of a request: MTS_EINVAL when model is empty ("model_id is required") or
 * batch_size is outside 1..MTS_LIPSYNC_MAX_BATCH, MTS_ENOTFOUND for an unknown model. */
int mts_lipsync_check_request(const mts_server *srv, const char *model, int batch_size, char *msg, size_t len);

/* Compositing options from a request's format and wrap names ("" or NULL: jpeg, loop), JPEG
 * quality (already checked to be 1..100), start frame; MTS_EINVAL for an unknown name. */
int mts_lipsync_composite_opts(const char *format, const char *wrap, int quality, int64_t start,
                               mts_composite_opts *o, char *msg, size_t len);

/* How a lip-sync model takes its two inputs: visual and audio (by those names, else its first
 * two inputs), each one frame of dims[k] (frame_elems[k] float32 values). */
typedef struct mts_lipsync_binding {
    int input[2];          /* index among the model's inputs: visual, audio */
    int64_t dims[2][3];
    int64_t frame_elems[2];
} mts_lipsync_binding;

/* Binds the model of status st; MTS_PROTO_EPRECONDITION when it is not a lip-sync model (what
 * names the operation that needs one, "InferBatch"). */
int mts_lipsync_bind(const mts_model_status *st, const char *what, mts_lipsync_binding *b, char *msg, size_t len);

/* Bytes of one frame of input k (0 visual, 1 audio). */
static inline uint64_t mts_lipsync_frame_bytes(const mts_lipsync_binding *b, int k)
{
    return (uint64_t)b->frame_elems[k] * 4;
}

/* Fills req's two inputs (batch_size frames from visual and audio, float32 in place), their
 * names (copied into names) and the requested first output (into out_name). */
void mts_lipsync_set_inputs(const mts_lipsync_binding *b, const mts_model_status *st, mts_request *req,
                            int batch_size, const void *visual, const void *audio,
                            char names[2][MTS_TENSOR_NAME_MAX], char out_name[MTS_TENSOR_NAME_MAX]);

/* Checks that a completed request produced float32 mouth regions [batch_size,3,H,W] as its
 * first output; MTS_PROTO_EPRECONDITION otherwise. */
int mts_lipsync_check_regions(const mts_request *req, int batch_size, const char *model, char *msg, size_t len);

/* Status of a failure with the background assets (acquiring the cache, compositing): out of
 * memory and unavailable stay what they are; anything else is the server's assets not fitting
 * the request, MTS_PROTO_EPRECONDITION. */
int mts_lipsync_asset_status(int status);

/* Elements of one frame of an input: the model's dims 1..3 when it declares them (rank 4, all
 * positive), else def[0..2]; the three dims go to dims. */
int64_t mts_lipsync_frame_elems(const mts_tensor_meta *m, const int64_t *def, int64_t dims[3]);

/* Queues the decoding of the batch's n background frames (and, when the cache has room for two
 * batches, of the next batch's, for sequential playback) on the server's media threads, so that
 * it overlaps the inference. Best effort: does nothing without a media queue or memory. */
void mts_lipsync_prefetch(mts_server *srv, mts_bgcache *bg, const mts_composite_opts *o, int n);

#endif
