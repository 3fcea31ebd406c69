/*
 * libFuzzer target for the HTTP/1.1 request parser (src/api/http.c through
 * mts_http_parse_stream in api/http_internal.h): request line, header fields, Content-Length and
 * chunked bodies, pipelined requests and the size limits, over the real connection state
 * machine. The first two input bytes pick how the rest arrives and the limits:
 *   byte 0: the size of each simulated read (whole buffer, 1, 2, 3, 5, 8, 13, ... bytes);
 *   byte 1: bits 0-1 the header limit (16 KiB, 64, 200, 1024 bytes), bits 2-3 the body limit
 *           (64 KiB, 1, 16, 300 bytes).
 * Every field of each complete request is read back.
 */
#include <stdint.h>
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t reads[16] = {0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 4096};
    static const size_t headers[4] = {16384, 64, 200, 1024};
    static const size_t bodies[4] = {65536, 1, 16, 300};
    if (size < 2) return 0;
    size_t read_size = reads[data[0] & 15];
    size_t max_header = headers[data[1] & 3], max_body = bodies[(data[1] >> 2) & 3];
    unsigned sum = 0;
    int status = 0;
    (void)mts_http_parse_stream(data + 2, size - 2, read_size, max_header, max_body, on_request, &sum, &status);
    return 0;
}
