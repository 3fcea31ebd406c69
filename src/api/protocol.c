/*
 * Protocol pieces shared by the REST routes and the gRPC services (protocol.h): the KServe
 * datatype table, the status mappings to HTTP and gRPC, the gRPC status names, the model
 * lookup messages and the input-tensor checks.
 */
#include "api/protocol.h"

#include <stdio.h>
#include <string.h>

/* binary_tensor_data: HTTP binary tensors (gRPC has raw contents natively); model_repository:
 * index, load, unload; statistics; model_configuration; schedule_policy: the 'priority'
 * parameter; logging: GET/POST /v2/logging. Tracing is not implemented (/v2/trace/setting
 * only reports it off), so "trace" is not listed. */
const char *const mts_proto_extensions[] = {"binary_tensor_data", "model_repository", "statistics",
                                            "model_configuration", "schedule_policy", "logging"};
const int mts_proto_n_extensions = (int)(sizeof mts_proto_extensions / sizeof mts_proto_extensions[0]);

static const struct {
    const char *name;
    mts_dtype dtype;
} datatypes[] = {
    {"FP32", MTS_DTYPE_FLOAT}, {"INT64", MTS_DTYPE_INT64}, {"INT32", MTS_DTYPE_INT32},
    {"INT8", MTS_DTYPE_INT8},  {"UINT8", MTS_DTYPE_UINT8}, {"BOOL", MTS_DTYPE_BOOL},
    {"FP16", MTS_DTYPE_FLOAT16}, {"BF16", MTS_DTYPE_BFLOAT16}, {"FP64", MTS_DTYPE_DOUBLE},
    {"INT16", MTS_DTYPE_INT16}, {"UINT16", MTS_DTYPE_UINT16}, {"UINT32", MTS_DTYPE_UINT32},
    {"UINT64", MTS_DTYPE_UINT64},
    {"BYTES", MTS_DTYPE_STRINGS}, /* string tensors (api/bytes_tensor.h) */
};

const char *mts_kserve_datatype(mts_dtype t)
{
    for (size_t i = 0; i < sizeof datatypes / sizeof datatypes[0]; i++)
        if (datatypes[i].dtype == t) return datatypes[i].name;
    return NULL;
}

int mts_kserve_parse_datatype(const char *name, mts_dtype *out)
{
    for (size_t i = 0; i < sizeof datatypes / sizeof datatypes[0]; i++)
        if (!strcmp(datatypes[i].name, name)) {
            *out = datatypes[i].dtype;
            return MTS_OK;
        }
    return MTS_EUNSUPPORTED;
}

int mts_proto_http_status(int status)
{
    switch (status) {
    case MTS_OK: return 200;
    case MTS_ENOTFOUND: return 404;
    case MTS_EINVAL: case MTS_ESHAPE: case MTS_EFORMAT: return 400;
    case MTS_PROTO_EPRECONDITION: return 412;
    case MTS_PROTO_ETOOLARGE: return 413;
    case MTS_EFULL: return 429;
    case MTS_EUNAVAILABLE: return 503;
    case MTS_ETIMEDOUT: return 504;
    case MTS_EUNSUPPORTED: return 501;
    case MTS_ECANCELLED: return 499;
    case MTS_ELIMIT: return 507;
    case MTS_EUNAUTHENTICATED: return 401;
    case MTS_EPERMISSION: return 403;
    default: return 500;
    }
}

int mts_proto_grpc_code(int status)
{
    switch (status) {
    case MTS_OK: return MTS_GRPC_OK;
    case MTS_ENOTFOUND: return MTS_GRPC_NOT_FOUND;
    case MTS_EINVAL: case MTS_ESHAPE: case MTS_EFORMAT: return MTS_GRPC_INVALID_ARGUMENT;
    case MTS_PROTO_EPRECONDITION: return MTS_GRPC_FAILED_PRECONDITION;
    case MTS_EFULL: case MTS_ELIMIT: case MTS_ENOMEM: case MTS_PROTO_ETOOLARGE: return MTS_GRPC_RESOURCE_EXHAUSTED;
    case MTS_ETIMEDOUT: return MTS_GRPC_DEADLINE_EXCEEDED;
    case MTS_EUNAVAILABLE: return MTS_GRPC_UNAVAILABLE;
    case MTS_ECANCELLED: return MTS_GRPC_CANCELLED;
    case MTS_EUNSUPPORTED: return MTS_GRPC_UNIMPLEMENTED;
    case MTS_EUNAUTHENTICATED: return MTS_GRPC_UNAUTHENTICATED;
    case MTS_EPERMISSION: return MTS_GRPC_PERMISSION_DENIED;
    default: return MTS_GRPC_INTERNAL;
    }
}

const char *mts_proto_grpc_code_name(int code)
{
    static const char *names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                  "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                  "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                  "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
    return code >= 0 && code < (int)(sizeof names / sizeof names[0]) ? names[code] : "?";
}

const char *mts_proto_unknown_model(char *buf, size_t len, const char *model)
{
    size_t n = strlen(model);
    if (n > MTS_PROTO_NAME_SHOWN) /* a name is echoed back cut: a reply never carries a client's megabyte */
        snprintf(buf, len, "unknown model '%.*s...' (%zu bytes)", MTS_PROTO_NAME_SHOWN, model, n);
    else
        snprintf(buf, len, "unknown model '%s'", model);
    return buf;
}

int mts_proto_find_model(const mts_server *srv, const char *model, const char *version, char *msg, size_t len)
{
    if (!mts_server_has_model(srv, model)) {
        mts_proto_unknown_model(msg, len, model);
        return MTS_ENOTFOUND;
    }
    return mts_server_version_ok(srv, model, version, msg, len) ? MTS_OK : MTS_ENOTFOUND;
}

int mts_proto_input_decl(const mts_request *req, const char *name, const char *datatype, const int64_t *dims,
                         size_t rank, mts_tensor *t, char *msg, size_t len)
{
    for (int k = 0; k < req->n_inputs; k++)
        if (!strcmp(req->input_names[k], name)) {
            snprintf(msg, len, "input '%s' is given twice", name);
            return MTS_EINVAL;
        }
    memset(t, 0, sizeof *t);
    if (mts_kserve_parse_datatype(datatype, &t->dtype)) {
        snprintf(msg, len, "input '%s': datatype '%s' is not supported (FP32, FP16, BF16, FP64, INT64, INT32, INT16, "
                 "INT8, UINT64, UINT32, UINT16, UINT8, BOOL, BYTES are)", name, datatype);
        return MTS_EINVAL;
    }
    if (rank > MTS_MAX_RANK) {
        snprintf(msg, len, "input '%s': rank %zu is above the limit of %d", name, rank, MTS_MAX_RANK);
        return MTS_EINVAL;
    }
    t->rank = (int)rank;
    for (int d = 0; d < t->rank; d++) {
        if (dims[d] == MTS_PROTO_DIM_INVALID) {
            snprintf(msg, len, "input '%s': shape[%d] must be a non-negative integer", name, d);
            return MTS_EINVAL;
        }
        if (dims[d] < 0) {
            snprintf(msg, len, "input '%s': shape[%d] is %lld; dimensions must be non-negative", name, d,
                     (long long)dims[d]);
            return MTS_EINVAL;
        }
        t->dims[d] = dims[d];
    }
    if (mts_tensor_numel(t) < 0 || mts_tensor_nbytes(t) < 0) {
        char shp[128];
        snprintf(msg, len, "input '%s': shape %s is too large", name, mts_shape_str(t, shp, sizeof shp));
        return MTS_EINVAL;
    }
    return MTS_OK;
}

int mts_proto_input_count(const char *name, const mts_tensor *t, const char *datatype, const char *what, int64_t have,
                          const char *unit, char *msg, size_t len)
{
    int64_t need = strcmp(unit, "bytes") ? mts_tensor_numel(t) : mts_tensor_nbytes(t);
    if (have == need) return MTS_OK;
    char shp[128];
    snprintf(msg, len, "input '%s': %s %lld %s, shape %s%s%s needs %lld", name, what, (long long)have, unit,
             mts_shape_str(t, shp, sizeof shp), datatype ? " of " : "", datatype ? datatype : "", (long long)need);
    return MTS_EINVAL;
}
