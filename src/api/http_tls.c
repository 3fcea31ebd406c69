/*
 * TLS for the HTTP server on OpenSSL (http_tls.h). One SSL_CTX per server: TLS 1.2 minimum,
 * the certificate chain and key checked against each other at start, and with a client CA,
 * SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT (mutual TLS). Sessions run in accept state
 * on the non-blocking socket; SSL_read / SSL_write perform the handshake as needed. Writes use
 * partial-write mode with a moving buffer, so http.c can hand the same bytes again from a later
 * position of its output queue after EAGAIN, as it does for plain sockets; a gathered write is
 * one SSL_write per piece (TLS records of at most 16 KiB each anyway).
 */
#include "api/http_tls.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

struct mts_tls_ctx {
    SSL_CTX *ctx;
};

struct mts_tls {
    SSL *ssl;
};

static const char *ssl_reason(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    if (!e) {
        snprintf(buf, len, "no detail");
    } else {
        ERR_error_string_n(e, buf, len);
    }
    ERR_clear_error();
    return buf;
}

int mts_tls_ctx_create(const char *cert, const char *key, const char *client_ca, mts_tls_ctx **out, mts_err *err)
{
    *out = NULL;
    char why[256];
    mts_tls_ctx *c = calloc(1, sizeof *c);
    if (!c) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    ERR_clear_error();
    c->ctx = SSL_CTX_new(TLS_server_method());
    int rc = MTS_OK;
    if (!c->ctx) rc = mts_err_set(err, MTS_ENOMEM, "TLS: cannot create a context: %s", ssl_reason(why, sizeof why));
    if (!rc && !SSL_CTX_set_min_proto_version(c->ctx, TLS1_2_VERSION))
        rc = mts_err_set(err, MTS_EINVAL, "TLS: cannot require TLS 1.2: %s", ssl_reason(why, sizeof why));
    if (!rc && SSL_CTX_use_certificate_chain_file(c->ctx, cert) != 1)
        rc = mts_err_set(err, MTS_EIO, "TLS certificate %s: cannot read it as a PEM certificate chain (%s)", cert,
                         ssl_reason(why, sizeof why));
    if (!rc && SSL_CTX_use_PrivateKey_file(c->ctx, key, SSL_FILETYPE_PEM) != 1)
        rc = mts_err_set(err, MTS_EIO, "TLS key %s: cannot read it as a PEM private key (%s)", key,
                         ssl_reason(why, sizeof why));
    if (!rc && SSL_CTX_check_private_key(c->ctx) != 1)
        rc = mts_err_set(err, MTS_EINVAL, "TLS key %s does not match the certificate %s", key, cert);
    if (!rc && client_ca) {
        if (SSL_CTX_load_verify_locations(c->ctx, client_ca, NULL) != 1)
            rc = mts_err_set(err, MTS_EIO, "TLS client CA %s: cannot read it as PEM certificates (%s)", client_ca,
                             ssl_reason(why, sizeof why));
        else
            SSL_CTX_set_verify(c->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    if (!rc) {
        SSL_CTX_set_mode(c->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                                     SSL_MODE_RELEASE_BUFFERS);
        SSL_CTX_set_options(c->ctx, SSL_OP_NO_RENEGOTIATION);
    }
    if (rc) {
        mts_tls_ctx_free(c);
        return rc;
    }
    *out = c;
    return MTS_OK;
}

void mts_tls_ctx_free(mts_tls_ctx *c)
{
    if (!c) return;
    SSL_CTX_free(c->ctx);
    free(c);
}

mts_tls *mts_tls_new(mts_tls_ctx *c, int fd)
{
    mts_tls *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->ssl = SSL_new(c->ctx);
    if (!t->ssl || SSL_set_fd(t->ssl, fd) != 1) {
        SSL_free(t->ssl);
        free(t);
        ERR_clear_error();
        return NULL;
    }
    SSL_set_accept_state(t->ssl);
    return t;
}

void mts_tls_close(mts_tls *t)
{
    if (!t) return;
    if (SSL_is_init_finished(t->ssl)) {
        ERR_clear_error();
        (void)SSL_shutdown(t->ssl); /* queues close_notify; a full socket just drops it */
    }
    ERR_clear_error();
}

void mts_tls_free(mts_tls *t)
{
    if (!t) return;
    SSL_free(t->ssl);
    free(t);
}

/* errno for a failed call: EAGAIN when the handshake or a record waits for the socket. */
static ssize_t fail(mts_tls *t, int r)
{
    int e = SSL_get_error(t->ssl, r);
    int saved = errno;
    ERR_clear_error();
    switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE: errno = EAGAIN; return -1;
    case SSL_ERROR_ZERO_RETURN: return 0; /* close_notify */
    case SSL_ERROR_SYSCALL:
        if (saved == 0 || saved == EAGAIN) return 0; /* EOF without close_notify */
        errno = saved;
        return -1;
    default: errno = EPROTO; return -1; /* a TLS protocol error: handshake failed, bad record */
    }
}

ssize_t mts_tls_read(mts_tls *t, void *buf, size_t n)
{
    if (n > INT_MAX) n = INT_MAX;
    ERR_clear_error();
    errno = 0;
    int r = SSL_read(t->ssl, buf, (int)n);
    return r > 0 ? r : fail(t, r);
}

ssize_t mts_tls_writev(mts_tls *t, const struct iovec *iov, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t len = iov[i].iov_len;
        if (!len) continue;
        if (len > INT_MAX) len = INT_MAX;
        ERR_clear_error();
        errno = 0;
        int w = SSL_write(t->ssl, iov[i].iov_base, (int)len);
        if (w > 0) {
            total += (size_t)w;
            if ((size_t)w < iov[i].iov_len) break;
            continue;
        }
        if (total) {
            ERR_clear_error();
            break; /* report what went; the rest is retried with the same bytes */
        }
        ssize_t f = fail(t, w);
        if (f == 0) { /* the peer closed: writing is an error */
            errno = EPIPE;
            return -1;
        }
        return f;
    }
    return (ssize_t)total;
}
