/*
 * The KServe v2 (Open Inference Protocol) REST routes: health, server and model metadata,
 * readiness, inference with JSON tensors and the binary tensor extension, model configuration,
 * repository index/load/unload and statistics, and Triton's logging and trace-setting
 * extensions (/v2/logging, /v2/trace/setting). They only translate between the wire and struct
 * mts_request; the server core does the rest. The REST front end (rest.h) serves the table.
 */
#ifndef MTS_API_KSERVE_HTTP_H
#define MTS_API_KSERVE_HTTP_H

#include "api/router.h"

/* The KServe routes, ending with an all-NULL entry. An inference request in flight keeps its
 * call (which starts with its mts_request) in hr->user, for the front end's on_cancel. */
extern const mts_route mts_kserve_routes[];

/* Turns the body of an inference request (JSON, or a JSON header plus binary tensors when the
 * request has Inference-Header-Content-Length) into a server request exactly as the infer route
 * does, without a server or submitting it: MTS_OK, or a status with the reason in msg. For the
 * fuzzer (tests/fuzz/fuzz_kserve_infer.c). */
int mts_kserve_http_check_infer(const mts_http_req *hr, char *msg, size_t len);

#endif
