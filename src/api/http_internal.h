/*
 * An entry into the HTTP/1.1 request parser of http.c without a server, for the fuzzer and
 * tests: the same connection state machine (request line and header fields, Content-Length and
 * chunked bodies, pipelining, the size limits) run over bytes in memory, delivered in reads of
 * a chosen size as a socket would deliver them.
 */
#ifndef MTS_API_HTTP_INTERNAL_H
#define MTS_API_HTTP_INTERNAL_H

#include <stddef.h>

#include "api/http.h"

/* Called for every complete request, as the application handler would be; req is valid during
 * the call only. */
typedef void (*mts_http_parse_cb)(void *user, const mts_http_req *req);

/* Feeds data (len bytes) to one connection's parser in reads of at most read_size bytes (0: as
 * much as the buffer takes), calling cb for each complete request, answering each at once,
 * until the input ends, a request without keep-alive completes, or the parser rejects the input.
 * max_header / max_body: the limits of mts_http_opts (0 = their defaults); admit (NULL: none)
 * is asked about bodies from admit_min bytes (0 = MTS_HTTP_ADMIT_MIN), and the rest of a body
 * it refuses is fed through the connection's socket, where it is dropped unread as a server
 * drops it, before the next request. Returns the number of
 * complete requests (-1 when no socket pair could be made); *error_status gets the status of
 * the error response this layer produced (400, 413, 431, 501, ...), or 0. */
int mts_http_parse_stream(const void *data, size_t len, size_t read_size, size_t max_header, size_t max_body,
                          mts_http_admit_fn admit, void *admit_user, size_t admit_min, mts_http_parse_cb cb,
                          void *user, int *error_status);

#endif
