/*
 * libFuzzer target for the HTTP/1.1 request parser (src/api/http.c through
 * mts_http_parse_stream in api/http_internal.h): request line, header fields, Content-Length and
 * chunked bodies, pipelined requests and the size limits, over the real connection state
 * machine. The first two input bytes pick how the rest arrives and the limits:
 *   byte 0: the size of each simulated read (whole buffer, 1, 2, 3, 5, 8, 13, ... bytes);
 *   byte 1: bits 0-1 the header limit (16 KiB, 64, 200, 1024 bytes), bits 2-3 the body limit
 *           (64 KiB, 1, 16, 300 bytes), bits 4-5 the admission hook (none; one refusing
 *           every body with 503 and Retry-After; one refusing POSTs to a path with "infer"
 *           with 429; one admitting all), bits 6-7 the body size it is asked from (1, 8, 100
 *           bytes, 64 KiB): a refused body is dropped from the socket and the stream goes on
 *           with the next request.
 * Every field of each complete request is read back.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/http_internal.h"

static void on_request(void *user, const mts_http_req *r)
{
    unsigned *sum = user;
    *sum += (unsigned)strlen(r->method) + (unsigned)strlen(r->path) + (unsigned)strlen(r->query);
    for (int i = 0; i < r->n_headers; i++)
        *sum += (unsigned)strlen(r->headers[i].name) + (unsigned)strlen(r->headers[i].value);
    for (size_t i = 0; i < r->body_len; i++) *sum += (unsigned char)r->body[i];
    (void)mts_http_header(r, "content-type");
    char v[64];
    (void)mts_http_query_param(r->query, "timeout", v, sizeof v);
}

typedef struct {
    int mode;
    size_t min;
} admit_cfg;

static int admit(void *user, const char *method, const char *path, size_t content_length, char *msg, size_t cap,
                 int *retry_after_s)
{
    const admit_cfg *a = user;
    int mode = a->mode;
    if (content_length < a->min || !method[0]) abort(); /* never asked so */
    if (mode == 1) {
        snprintf(msg, cap, "{\"error\":\"queue full for %s %s (%zu bytes)\"}", method, path, content_length);
        *retry_after_s = 1;
        return 503;
    }
    if (mode == 2 && !strcmp(method, "POST") && strstr(path, "infer")) {
        snprintf(msg, cap, "{\"error\":\"too many requests\"}");
        return 429;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t reads[16] = {0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 4096};
    static const size_t headers[4] = {16384, 64, 200, 1024};
    static const size_t bodies[4] = {65536, 1, 16, 300};
    if (size < 2) return 0;
    size_t read_size = reads[data[0] & 15];
    static const size_t admit_from[4] = {1, 8, 100, 65536};
    size_t max_header = headers[data[1] & 3], max_body = bodies[(data[1] >> 2) & 3];
    admit_cfg a = {(data[1] >> 4) & 3, admit_from[(data[1] >> 6) & 3]};
    unsigned sum = 0;
    int status = 0;
    (void)mts_http_parse_stream(data + 2, size - 2, read_size, max_header, max_body, a.mode ? admit : NULL, &a, a.min,
                                on_request, &sum, &status);
    return 0;
}
