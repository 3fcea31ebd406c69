/*
 * The client side of the command line: `mtserve infer` and `mtserve models ...` against a
 * running server over KServe v2 HTTP (--url http://HOST:PORT) or gRPC (--grpc HOST:PORT), and the
 * small blocking unary gRPC client they use (gRPC core C API, protobuf-c messages).
 */
#ifndef MTS_CLI_CLI_GRPC_H
#define MTS_CLI_CLI_GRPC_H

#include <stddef.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

int mts_cli_infer(int argc, char **argv);
int mts_cli_models(int argc, char **argv);

/* One unary call: sends req to method ("/pkg.Service/Method") on target ("host:port"), waits
 * up to timeout_s, unpacks the reply with resp_desc into *resp (free with
 * protobuf_c_message_free_unpacked). Returns the gRPC status code (0 = OK); err gets the status
 * message. model (NULL or "" for none) is sent as the `mts-model` metadata, which a load
 * balancer in front of several instances routes on (docs/scale-out.md). */
int mts_cli_grpc_unary(const char *target, const char *method, const char *model, const ProtobufCMessage *req,
                       const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp, double timeout_s,
                       char *err, size_t err_len);
const char *mts_cli_grpc_code_name(int code);

/* The six operations of a unary call (send metadata, message and close; receive metadata,
 * message and status) pointing at the caller's buffers, for callers that run their own call
 * and completion queue (the load generator reuses channels and registered methods). The initial
 * metadata (authorization from $MTSERVE_TOKEN, mts-model when model is printable ASCII) is built
 * in md, which must live until the batch completes. */
void mts_cli_grpc_unary_ops(grpc_op ops[6], grpc_metadata md[2], const char *model, grpc_byte_buffer *send,
                            grpc_byte_buffer **recv,
                            grpc_metadata_array *md_initial, grpc_metadata_array *md_trailing,
                            grpc_status_code *status, grpc_slice *details);

#endif
