/*
 * TLS for the HTTP server (OpenSSL): the server context built from the same PEM files as the
 * gRPC front end (certificate chain, key, optional client CA for mutual TLS), and non-blocking
 * record I/O on a connection's socket in the shape http.c's plain socket calls have: a read or a
 * gathered write returns bytes, 0 at EOF, or -1 with errno EAGAIN when the socket must become
 * readable or writable first (the TLS handshake runs inside the first reads and writes, so a
 * read may need the socket writable and a write readable: http.c retries both on either event).
 */
#ifndef MTS_API_HTTP_TLS_H
#define MTS_API_HTTP_TLS_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "util/status.h"

typedef struct mts_tls_ctx mts_tls_ctx;
typedef struct mts_tls mts_tls;

/* Loads cert (PEM chain) and key, and client_ca (PEM roots; NULL: no client certificates asked
 * for). Errors name the file and say what OpenSSL found wrong. TLS 1.2 and 1.3 only. */
int mts_tls_ctx_create(const char *cert, const char *key, const char *client_ca, mts_tls_ctx **out, mts_err *err);
void mts_tls_ctx_free(mts_tls_ctx *ctx);

/* A server-side TLS session on a connected non-blocking socket; NULL when out of memory. */
mts_tls *mts_tls_new(mts_tls_ctx *ctx, int fd);
/* Sends close_notify when the session is established (best effort, never blocks) and frees it.
 * The socket stays open. */
void mts_tls_close(mts_tls *t);
void mts_tls_free(mts_tls *t);

ssize_t mts_tls_read(mts_tls *t, void *buf, size_t n);
ssize_t mts_tls_writev(mts_tls *t, const struct iovec *iov, int n);

#endif
