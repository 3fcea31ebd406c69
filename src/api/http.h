/*
 * mts_http: the small HTTP/1.1 server underneath the KServe v2 REST front end. It owns the
 * sockets and the wire format and nothing else: N I/O threads, each with its own epoll set and
 * its own SO_REUSEPORT listener, parse requests incrementally (keep-alive, pipelining with one
 * request in flight per connection, Content-Length and chunked bodies, Expect: 100-continue),
 * enforce the size and time limits, decode request bodies sent with Content-Encoding gzip or
 * deflate, and hand each complete request to one application callback.
 * The callback runs on the I/O thread and must not block: it answers at once with
 * mts_http_respond*, or keeps the connection handle and answers later from any thread (the
 * answer is queued to the connection's I/O thread and wakes it through an eventfd). Errors this
 * layer produces itself (400, 408, 413, 415, 417, 431, 501, 503, 505) carry KServe-style JSON bodies
 * {"error":"..."}.
 *
 * Limits: a request head (request line + header fields) longer than max_header -> 431; more than
 * MTS_HTTP_MAX_HEADERS fields -> 431; a body (Content-Length, or the decoded size of a chunked
 * body, or the decoded size of a compressed one) larger than max_body -> 413; a Content-Encoding
 * other than gzip, x-gzip, deflate or identity -> 415; compressed data that is invalid, truncated
 * or followed by more bytes -> 400; a Transfer-Encoding other than "chunked" -> 501; invalid
 * Content-Length (non-digits, overflow, conflicting duplicates) or both Content-Length and
 * Transfer-Encoding -> 400. After any of these the connection is closed (framing is lost). A bare
 * LF is accepted as a line end (RFC 9112 section 2.2 allows it); a bare CR is rejected (400).
 * A connection idle for idle_timeout_ms is closed; a request head that is not complete
 * header_timeout_ms after its first byte (slowloris) and a body that stalls for idle_timeout_ms
 * get 408 and are closed. Buffers grow only as bytes actually arrive. When max_connections are
 * open, a new client is admitted by closing the accepting thread's oldest idle keep-alive
 * connection (with light_io, its light partner's when the accepting one has none); only when
 * there is none does it get 503.
 */
#ifndef MTS_API_HTTP_H
#define MTS_API_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>

#include "util/status.h"

#define MTS_HTTP_MAX_HEADERS 64

typedef struct mts_http_server mts_http_server;
/* One connection, used as the handle of its (single) in-flight request. Opaque. */
typedef struct mts_http_conn mts_http_conn;

typedef struct mts_http_header_field {
    const char *name;   /* as sent (case preserved) */
    const char *value;  /* leading/trailing blanks removed */
} mts_http_header_field;

/* A parsed request. All strings are NUL-terminated and point into the connection's buffer; the
 * whole struct stays valid until mts_http_respond* is called for it (and, for a cancelled request,
 * through on_cancel). */
typedef struct mts_http_req {
    const char *method;  /* "GET", "POST", ... (case as sent) */
    const char *path;    /* "/v2/models/x/infer": no percent-decoding; "/" for "http://host" */
    const char *query;   /* after '?', "" if none; not decoded */
    const char *body;    /* decoded body (never NULL; "" when empty); NOT NUL-terminated */
    size_t body_len;
    int n_headers;
    mts_http_header_field headers[MTS_HTTP_MAX_HEADERS];
    int http_minor;      /* 0 for HTTP/1.0, 1 for HTTP/1.1 */
    int keep_alive;      /* the connection stays open after the response (unless draining) */
    void *user;          /* free for the application (NULL at dispatch) */
} mts_http_req;

/* Value of the first header field called `name` (case-insensitive), or NULL. */
const char *mts_http_header(const mts_http_req *r, const char *name);

/* Called on the I/O thread for every complete request. Must not block. Must eventually lead to
 * exactly one mts_http_respond / mts_http_respondv / mts_http_respond_error call for `c`, either
 * inside the call or later from any thread. */
typedef void (*mts_http_handler)(void *user, mts_http_conn *c, mts_http_req *req);

/* Called at most once per request, on the I/O thread, when the client goes away (disconnect or
 * half-close) or the server stops while the request has not been answered yet, so the
 * application can cancel the work. The application must still answer `c` (the answer is then
 * discarded and the memory freed). If the application answers from another thread at the same
 * moment, the two may race: `c` and `req` stay valid for the whole on_cancel call regardless. */
typedef void (*mts_http_cancel_fn)(void *user, mts_http_conn *c, mts_http_req *req);

/* Asked on the I/O thread once a request's head is read, before a body of at least
 * MTS_HTTP_ADMIT_MIN bytes (by Content-Length) is read: method and path (NUL-terminated, the
 * query cut off) and the body's length. 0 reads the body as usual; an HTTP status refuses the
 * request at once, msg (NUL-terminated, at most cap bytes) being its JSON error and a positive
 * *retry_after_s a Retry-After header: the answer goes
 * out at once and the body is dropped without being copied out of the kernel, after which the
 * connection reads its next request (it closes instead with Connection: close, Expect:
 * 100-continue or TLS). A flood of large requests that would be refused anyway (a full queue)
 * then costs the I/O threads no copying and no buffer of the upload's size. Must not block. */
typedef int (*mts_http_admit_fn)(void *user, const char *method, const char *path, size_t content_length, char *msg,
                                 size_t cap, int *retry_after_s);
#define MTS_HTTP_ADMIT_MIN ((size_t)64 * 1024)

typedef struct mts_http_opts {
    const char *host;         /* address to bind; NULL = "0.0.0.0" (first getaddrinfo result) */
    int port;                 /* 0 = ephemeral (see mts_http_port) */
    int io_threads;           /* 0 = min(online CPUs, 4) */
    size_t max_body;          /* bytes; 0 = 64 MiB */
    size_t max_header;        /* bytes of request line + header fields; 0 = 16 KiB (min 64) */
    int idle_timeout_ms;      /* 0 = 60000; < 0 = no timeouts (no slowloris protection either) */
    int max_connections;      /* over all I/O threads; 0 = 10000; beyond it: an idle one goes, or 503 */
    int max_per_client;       /* open connections of one client address (IPv4, IPv6); 0 = no limit;
                               * beyond it the new connection gets 503 and is closed */
    int header_timeout_ms;    /* a request head's first byte to its end; 0 = 10000 (capped at idle) */
    /* TLS (OpenSSL): with tls_cert (and tls_key) every connection speaks TLS 1.2+; tls_client_ca
     * (optional) makes clients present a certificate it signed. NULL: plaintext. */
    const char *tls_cert, *tls_key, *tls_client_ca;
    /* Optional: a request header whose integer value N asks that byte N of the body start on a
     * 64-byte boundary in memory (KServe's Inference-Header-Content-Length: the binary tensors
     * follow the JSON header), so typed data can be read in place. NULL: no such header. */
    const char *align_header;
    mts_http_handler handler; /* required */
    mts_http_cancel_fn on_cancel; /* optional */
    mts_http_admit_fn admit;      /* optional: early refusal of large requests */
    bool light_io;            /* a light I/O thread beside each listening one, for connections
                               * whose requests and answers are small (see http.c) */
    bool light_realtime;      /* those threads ask for SCHED_RR 1 (util/rtprio.h) */
    void *user;               /* first argument of handler and on_cancel */
} mts_http_opts;

/* Binds, listens and starts the I/O threads. Returns 0 or a negative MTS_E* code (err says why). */
int mts_http_start(const mts_http_opts *o, mts_http_server **out, mts_err *err);

/* The bound port (useful with port 0). */
int mts_http_port(const mts_http_server *s);

/* Sends the response to the request of `c`. Thread-safe: from the handler (written straight
 * away) or from any other thread (queued to the connection's I/O thread, which an eventfd wakes).
 * status: any 1xx-5xx code (204 and 304 get neither Content-Length nor body); content_type: NULL
 * for none; extra_headers: NULL or complete "Name: value\r\n" lines (a missing final CRLF is
 * added); body/len: COPIED, so the caller keeps ownership. HEAD requests get the headers only.
 * Adds Content-Length, and "Connection: close" when the connection will close (client asked,
 * HTTP/1.0 without keep-alive, or the server is draining). After the call `c` and its request
 * must not be touched again. */
void mts_http_respond(mts_http_conn *c, int status, const char *content_type,
                      const char *extra_headers, const void *body, size_t len);

/* Gather variant. With done == NULL the pieces are copied (like mts_http_respond). With done !=
 * NULL nothing is copied: the memory of iov[0..iovcnt) must stay valid and unchanged until
 * done(done_arg) is called, exactly once, on an I/O thread after the bytes went out or the
 * connection died (or inside this call if it fails early). The pieces must not point into the
 * request (it is released when the response is queued). */
void mts_http_respondv(mts_http_conn *c, int status, const char *content_type,
                       const char *extra_headers, const struct iovec *iov, int iovcnt,
                       void (*done)(void *arg), void *done_arg);

/* Convenience: status with body {"error":"<formatted message, JSON-escaped>"}. */
void mts_http_respond_error(mts_http_conn *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* For applications that free their request state in a respondv done callback: answers c with
 * status and {"error":"<msg>"} (429 adds Retry-After: 1) from a body malloc'd into *body (freed
 * first if set), which done must free; then done(done_arg) as for mts_http_respondv. */
void mts_http_respond_error_async(mts_http_conn *c, int status, const char *msg, char **body,
                                  void (*done)(void *arg), void *done_arg);

/* Copies the raw (not percent-decoded) value of `key` in a query string ("a=1&b=2") into out
 * (cut to cap - 1 bytes). False when the key is absent. */
bool mts_http_query_param(const char *query, const char *key, char *out, size_t cap);

/* The request of an in-flight connection handle (the same pointer the handler got). */
mts_http_req *mts_http_conn_request(mts_http_conn *c);

/* Graceful shutdown step 1: closes the listeners (new connections are refused), closes idle
 * keep-alive connections and answers further requests with "Connection: close". Returns once
 * every listener is closed (when called on an I/O thread, from a handler, it returns at once and
 * the other threads' listeners close shortly after). Idempotent. */
void mts_http_stop_accepting(mts_http_server *s);

/* Closes every connection (calling on_cancel for unanswered requests), waits until each
 * unanswered request has been answered by the application (the answers are discarded), joins
 * the threads and frees the server. Must not be called from an I/O thread. NULL is ignored. */
void mts_http_stop(mts_http_server *s);

#endif
