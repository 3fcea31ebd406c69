/*
 * Protocol pieces shared by every wire format (the REST routes and the gRPC services): KServe
 * datatype names, the mapping of MTS_E* statuses to HTTP statuses and to gRPC status codes (and
 * the gRPC codes' names, for the server's log and the CLI client), the unknown-model message and
 * model/version lookup, and the checks of a request's input tensor: its name, datatype and shape
 * and the element or byte count of its data. Front ends decode their wire format and call these,
 * so that a client sees the same status and message whichever protocol it speaks. Shapes against
 * the model's own signature are checked once more by the scheduler (serve/), for every front end.
 * Also the one list of protocol extensions both server metadata answers (HTTP GET /v2 and gRPC
 * ServerMetadata) advertise.
 */
#ifndef MTS_API_PROTOCOL_H
#define MTS_API_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/server.h"

/* Statuses only the front ends produce, beside util/status.h's MTS_E* codes:
 * PRECONDITION  the request is well formed but the model (or its assets) cannot serve it
 *               (HTTP 412, FAILED_PRECONDITION);
 * TOOLARGE      a part of the request is over a size limit of the route (HTTP 413,
 *               RESOURCE_EXHAUSTED). */
enum {
    MTS_PROTO_EPRECONDITION = -100,
    MTS_PROTO_ETOOLARGE = -101,
};

/* grpc_status_code values, spelled out so that no gRPC header is needed. */
enum {
    MTS_GRPC_OK = 0,
    MTS_GRPC_CANCELLED = 1,
    MTS_GRPC_UNKNOWN = 2,
    MTS_GRPC_INVALID_ARGUMENT = 3,
    MTS_GRPC_DEADLINE_EXCEEDED = 4,
    MTS_GRPC_NOT_FOUND = 5,
    MTS_GRPC_PERMISSION_DENIED = 7,
    MTS_GRPC_FAILED_PRECONDITION = 9,
    MTS_GRPC_RESOURCE_EXHAUSTED = 8,
    MTS_GRPC_UNIMPLEMENTED = 12,
    MTS_GRPC_INTERNAL = 13,
    MTS_GRPC_UNAVAILABLE = 14,
    MTS_GRPC_UNAUTHENTICATED = 16,
};

/* The KServe/Triton extensions mtserve implements, advertised alike over HTTP and gRPC. */
extern const char *const mts_proto_extensions[];
extern const int mts_proto_n_extensions;

/* KServe datatype names ("FP32") <-> engine types; NULL / MTS_EUNSUPPORTED when not supported. */
const char *mts_kserve_datatype(mts_dtype t);
int mts_kserve_parse_datatype(const char *name, mts_dtype *out);

/* HTTP status of a status code (200, 404, 400, 429, 503, ...). */
int mts_proto_http_status(int status);
/* gRPC status code of a status code. */
int mts_proto_grpc_code(int status);
/* Name of a gRPC status code ("NOT_FOUND"); "?" when out of range. */
const char *mts_proto_grpc_code_name(int code);

/* "unknown model 'x'" into buf; returns buf. Names longer than MTS_PROTO_NAME_SHOWN bytes are cut
 * ("unknown model 'xxx...' (N bytes)"). */
#define MTS_PROTO_NAME_SHOWN 128
const char *mts_proto_unknown_model(char *buf, size_t len, const char *model);
/* MTS_OK when the server configures model and, when version is neither NULL nor "", serves that
 * version; else MTS_ENOTFOUND with the unknown-model or unknown-version message in msg. */
int mts_proto_find_model(const mts_server *srv, const char *model, const char *version, char *msg, size_t len);

/* Marks a dimension a wire format could not read as an integer (JSON "abc"): refused by
 * mts_proto_input_decl as not a non-negative integer. */
#define MTS_PROTO_DIM_INVALID INT64_MIN

/* Checks the declaration of req's next input (index req->n_inputs): name given once, datatype
 * supported, rank within MTS_MAX_RANK, dimensions non-negative, size representable; fills t's
 * dtype, rank and dims (t is zeroed first). dims has rank entries (read only when rank is
 * within the limit). Returns MTS_OK or MTS_EINVAL with msg naming the input. BYTES gives
 * MTS_DTYPE_STRINGS with the client's shape; the front end then builds the string blob
 * (api/bytes_tensor.h). */
int mts_proto_input_decl(const mts_request *req, const char *name, const char *datatype, const int64_t *dims,
                         size_t rank, mts_tensor *t, char *msg, size_t len);

/* Checks that an input's data holds what its declaration needs: `have` units against t's byte
 * size when unit is "bytes", else against its element count. what names the field in the
 * message ("data has", "raw_input_contents[0] has"); datatype, when not NULL, is named beside
 * the shape. Returns MTS_OK or MTS_EINVAL with msg. */
int mts_proto_input_count(const char *name, const mts_tensor *t, const char *datatype, const char *what, int64_t have,
                          const char *unit, char *msg, size_t len);

#endif
