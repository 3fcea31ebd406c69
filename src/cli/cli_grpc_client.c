/*
 * A blocking unary gRPC client on gRPC core's C API, for `mtserve infer` and `mtserve models`:
 * one channel per call (the CLI makes a handful of calls), one completion queue plucked until
 * the single batch (send metadata + message + half-close, receive metadata + message + status)
 * completes. Message limits are raised to 1 GiB so large tensors come back whole.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "api/protocol.h"
#include "cli/cli.h"
#include "cli/cli_grpc.h"

const char *mts_cli_grpc_code_name(int code)
{
    return mts_proto_grpc_code_name(code); /* the server's table (api/protocol.c) */
}

void mts_cli_grpc_unary_ops(grpc_op ops[6], grpc_metadata md[2], const char *model, grpc_byte_buffer *send,
                            grpc_byte_buffer **recv,
                            grpc_metadata_array *md_initial, grpc_metadata_array *md_trailing,
                            grpc_status_code *status, grpc_slice *details)
{
    memset(ops, 0, 6 * sizeof *ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    static grpc_metadata auth;
    static char value[600];
    static int have = -1;
    if (have < 0) { /* set up on the first call (the main thread, before client threads start) */
        const char *t = mts_cli_token();
        have = t && strlen(t) < sizeof value - 8;
        if (have) {
            snprintf(value, sizeof value, "Bearer %s", t);
            auth.key = grpc_slice_from_static_string("authorization");
            auth.value = grpc_slice_from_static_string(value);
        }
    }
    size_t n_md = 0;
    memset(md, 0, 2 * sizeof *md);
    if (have) md[n_md++] = auth;
    bool printable = model && *model;
    for (const char *c = model; printable && *c; c++) printable = *c >= 0x20 && *c < 0x7f;
    if (printable) {
        /* gRPC metadata values are printable ASCII; a name with other bytes is not sent (its
         * calls are balanced round-robin). The slice points at the caller's string, which
         * outlives the call. */
        md[n_md].key = grpc_slice_from_static_string("mts-model");
        md[n_md++].value = grpc_slice_from_static_string(model);
    }
    ops[0].data.send_initial_metadata.count = n_md;
    ops[0].data.send_initial_metadata.metadata = n_md ? md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = md_initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = md_trailing;
    ops[5].data.recv_status_on_client.status = status;
    ops[5].data.recv_status_on_client.status_details = details;
}

int mts_cli_grpc_unary(const char *target, const char *method, const char *model, const ProtobufCMessage *req,
                       const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp, double timeout_s,
                       char *err, size_t err_len)
{
    grpc_init();
    *resp = NULL;
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, .value.integer = 1 << 30},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, .value.integer = 1 << 30},
    };
    grpc_channel_args ca = {2, args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, creds, &ca);
    grpc_channel_credentials_release(creds);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = timeout_s > 0 ? gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                                         gpr_time_from_millis((int64_t)(timeout_s * 1000), GPR_TIMESPAN))
                                          : gpr_inf_future(GPR_CLOCK_REALTIME);
    grpc_slice mslice = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, mslice, NULL, deadline, NULL);
    grpc_slice_unref(mslice);

    size_t n = protobuf_c_message_get_packed_size(req);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(req, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array md_initial, md_trailing;
    grpc_metadata_array_init(&md_initial);
    grpc_metadata_array_init(&md_trailing);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    grpc_metadata md[2];
    mts_cli_grpc_unary_ops(ops, md, model, send, &recv, &md_initial, &md_trailing, &status, &details);
    int tag = 1;
    if (grpc_call_start_batch(call, ops, 6, &tag, NULL) == GRPC_CALL_OK)
        grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    snprintf(err, err_len, "%.*s", (int)GRPC_SLICE_LENGTH(details), (const char *)GRPC_SLICE_START_PTR(details));
    if (status == GRPC_STATUS_OK) {
        grpc_byte_buffer_reader r;
        if (recv && grpc_byte_buffer_reader_init(&r, recv)) {
            grpc_slice all = grpc_byte_buffer_reader_readall(&r);
            grpc_byte_buffer_reader_destroy(&r);
            *resp = protobuf_c_message_unpack(resp_desc, NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
            grpc_slice_unref(all);
        }
        if (!*resp) {
            status = GRPC_STATUS_INTERNAL;
            snprintf(err, err_len, "the reply is not a valid %s", resp_desc->name);
        }
    }
    if (recv) grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&md_initial);
    grpc_metadata_array_destroy(&md_trailing);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    grpc_channel_destroy(ch);
    grpc_shutdown();
    return (int)status;
}
