/*
 * The HTTP side of `mtserve bench`: a small blocking HTTP/1.1 client and the KServe v2 HTTP
 * transport built on it.
 *
 * Client. One keep-alive connection per client thread, on a non-blocking socket driven by
 * poll() against one deadline for the whole exchange (connect, send, receive). Responses are
 * framed by Content-Length (digits only; conflicting duplicates are rejected), by chunked
 * transfer coding, or by the end of the connection when neither is present; 1xx interim
 * responses are skipped. A connection is closed after "Connection: close", an HTTP/1.0 reply,
 * a timeout or any error, and reopened by the next exchange. A request sent on a reused
 * connection that turns out to have been closed by the server (no byte of response) is retried
 * once on a fresh one, as browsers do.
 *
 * Transports. KServe: a request is encoded once (the request head, the JSON inference header
 * with parameters.binary_data_size per input and binary_data_output, then the raw tensors) and
 * sent with sendmsg() from shared buffers. The response's JSON header is parsed for the error
 * text and for the server's queue_ms / compute_ms parameters. Lip-sync composite: POST
 * /api/v1/lipsync/{model}/composite with the visual and audio tensors back to back as the body
 * (shared buffers) and a request head made per send (start_frame_idx is in the query string);
 * the response's JSON header gives the server's times, the frames and the avatar's frame count.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "util/json.h"
#include "util/clock.h"

#define MAX_HEAD (64 * 1024)

const char *mts_bench_error_name(int e)
{
    switch (e) {
    case MTS_BENCH_OK: return "ok";
    case MTS_BENCH_ECONNECT: return "connect";
    case MTS_BENCH_ETIMEOUT: return "timeout";
    case MTS_BENCH_EIO: return "io";
    case MTS_BENCH_EPROTO: return "protocol";
    default: return "error";
    }
}

void mts_bench_result_init(mts_bench_result *res)
{
    memset(res, 0, sizeof *res);
    res->queue_ms = res->compute_ms = res->composite_ms = res->encode_ms = res->background_ms = -1;
}

int mts_bench_parse_url(const char *url, mts_bench_target *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    const char *p = url;
    if (!strncmp(p, "http://", 7)) p += 7;
    else if (strstr(p, "://")) {
        snprintf(err, errlen, "unsupported URL scheme in '%s' (http:// only)", url);
        return -1;
    }
    size_t n = strcspn(p, "/");
    char hp[300];
    if (n == 0 || n >= sizeof hp) {
        snprintf(err, errlen, "no host in URL '%s'", url);
        return -1;
    }
    memcpy(hp, p, n);
    hp[n] = 0;
    char *colon = strrchr(hp, ':');
    t->port = 8000;
    if (colon) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (*end || v <= 0 || v > 65535) {
            snprintf(err, errlen, "bad port in URL '%s'", url);
            return -1;
        }
        t->port = (int)v;
        *colon = 0;
    }
    if (!hp[0] || strlen(hp) >= sizeof t->host) {
        snprintf(err, errlen, "no host in URL '%s'", url);
        return -1;
    }
    snprintf(t->host, sizeof t->host, "%s", hp);
    snprintf(t->hostport, sizeof t->hostport, "%s:%d", t->host, t->port);
    return 0;
}

/* ---- the client ------------------------------------------------------------------------ */

struct mts_bench_http_conn {
    mts_bench_target target;
    int fd;
    bool used; /* at least one exchange completed on this socket */
    char *buf; /* receive buffer */
    size_t cap, len;
};

static int remaining_ms(double deadline)
{
    double r = deadline - mts_now_ms();
    if (r <= 0) return 0;
    return r > 1e9 ? 1000000000 : (int)r + 1;
}

static void conn_drop(mts_bench_http_conn *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->used = false;
    c->len = 0;
}

static int conn_open(mts_bench_http_conn *c, double deadline, char *err, size_t errlen)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char port[16];
    snprintf(port, sizeof port, "%d", c->target.port);
    int g = getaddrinfo(c->target.host, port, &hints, &res);
    if (g) {
        snprintf(err, errlen, "resolving %s: %s", c->target.host, gai_strerror(g));
        return MTS_BENCH_ECONNECT;
    }
    int rc = MTS_BENCH_ECONNECT;
    snprintf(err, errlen, "connecting to %s: no address", c->target.hostport);
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
            snprintf(err, errlen, "connecting to %s: %s", c->target.hostport, strerror(errno));
            close(fd);
            continue;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int pr;
        do pr = poll(&pfd, 1, remaining_ms(deadline));
        while (pr < 0 && errno == EINTR);
        if (pr <= 0) {
            snprintf(err, errlen, "connecting to %s: timed out", c->target.hostport);
            close(fd);
            rc = MTS_BENCH_ETIMEOUT;
            continue;
        }
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr) {
            snprintf(err, errlen, "connecting to %s: %s", c->target.hostport, strerror(soerr));
            close(fd);
            rc = MTS_BENCH_ECONNECT;
            continue;
        }
        c->fd = fd;
        c->used = false;
        c->len = 0;
        rc = MTS_BENCH_OK;
        break;
    }
    freeaddrinfo(res);
    return rc;
}

mts_bench_http_conn *mts_bench_http_open(const mts_bench_target *t)
{
    mts_bench_http_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->target = *t;
    c->fd = -1;
    c->cap = 64 * 1024;
    c->buf = malloc(c->cap);
    if (!c->buf) {
        free(c);
        return NULL;
    }
    char err[200];
    conn_open(c, mts_now_ms() + 5000, err, sizeof err); /* a failure shows on the first exchange */
    return c;
}

void mts_bench_http_close(mts_bench_http_conn *c)
{
    if (!c) return;
    conn_drop(c);
    free(c->buf);
    free(c);
}

static int send_all(mts_bench_http_conn *c, struct iovec *iov, int niov, double deadline, char *err, size_t errlen)
{
    int i = 0;
    while (i < niov) {
        if (iov[i].iov_len == 0) {
            i++;
            continue;
        }
        struct msghdr mh = {0};
        mh.msg_iov = iov + i;
        mh.msg_iovlen = (size_t)(niov - i);
        ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
                int ms = remaining_ms(deadline);
                if (ms == 0 || poll(&pfd, 1, ms) == 0) {
                    snprintf(err, errlen, "sending the request: timed out");
                    return MTS_BENCH_ETIMEOUT;
                }
                continue;
            }
            snprintf(err, errlen, "sending the request: %s", strerror(errno));
            return MTS_BENCH_EIO;
        }
        size_t left = (size_t)n;
        while (i < niov && left >= iov[i].iov_len) {
            left -= iov[i].iov_len;
            i++;
        }
        if (i < niov) {
            iov[i].iov_base = (char *)iov[i].iov_base + left;
            iov[i].iov_len -= left;
        }
    }
    return MTS_BENCH_OK;
}

/* Reads more bytes into the buffer (growing it up to need). 1: got bytes, 0: EOF, <0: error. */
static int recv_more(mts_bench_http_conn *c, size_t need, double deadline, int *why)
{
    if (c->cap - c->len < 16384 || c->cap < need) {
        size_t ncap = c->cap * 2;
        while (ncap < need || ncap - c->len < 16384) ncap *= 2;
        char *nb = realloc(c->buf, ncap);
        if (!nb) {
            *why = MTS_BENCH_EIO;
            return -1;
        }
        c->buf = nb;
        c->cap = ncap;
    }
    for (;;) {
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (n > 0) {
            c->len += (size_t)n;
            return 1;
        }
        if (n == 0) return 0;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
            int ms = remaining_ms(deadline);
            int pr = ms ? poll(&pfd, 1, ms) : 0;
            if (pr < 0 && errno == EINTR) continue;
            if (pr <= 0) {
                *why = MTS_BENCH_ETIMEOUT;
                return -1;
            }
            continue;
        }
        *why = MTS_BENCH_EIO;
        return -1;
    }
}

static const char *find_head_end(const char *p, size_t n)
{
    for (size_t i = 3; i < n; i++)
        if (p[i] == '\n' && p[i - 1] == '\r' && p[i - 2] == '\n' && p[i - 3] == '\r') return p + i + 1;
    return NULL;
}

static bool header_is(const char *line, size_t len, const char *name, const char **value, size_t *vlen)
{
    size_t nl = strlen(name);
    if (len <= nl || line[nl] != ':' || strncasecmp(line, name, nl)) return false;
    const char *v = line + nl + 1, *e = line + len;
    while (v < e && (*v == ' ' || *v == '\t')) v++;
    while (e > v && (e[-1] == ' ' || e[-1] == '\t')) e--;
    *value = v;
    *vlen = (size_t)(e - v);
    return true;
}

static bool parse_len(const char *v, size_t n, long long *out)
{
    if (n == 0 || n > 18) return false;
    long long x = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') return false;
        x = x * 10 + (v[i] - '0');
    }
    *out = x;
    return true;
}

static bool token_in(const char *v, size_t n, const char *tok)
{
    size_t tl = strlen(tok);
    for (size_t i = 0; i + tl <= n; i++)
        if (!strncasecmp(v + i, tok, tl) && (i == 0 || v[i - 1] == ',' || v[i - 1] == ' ') &&
            (i + tl == n || v[i + tl] == ',' || v[i + tl] == ' '))
            return true;
    return false;
}

typedef struct head_info {
    int status;
    int minor;
    long long content_length; /* -1: absent */
    bool chunked, close;
    long long infer_header_len;
} head_info;

static int parse_head(const char *p, size_t n, head_info *h, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    h->content_length = -1;
    h->infer_header_len = -1;
    if (n < 14 || strncmp(p, "HTTP/1.", 7) || (p[7] != '0' && p[7] != '1') || p[8] != ' ' || p[9] < '1' ||
        p[9] > '5' || p[10] < '0' || p[10] > '9' || p[11] < '0' || p[11] > '9' || (p[12] != ' ' && p[12] != '\r')) {
        snprintf(err, errlen, "malformed status line '%.40s'", p);
        return -1;
    }
    h->minor = p[7] - '0';
    h->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    h->close = h->minor == 0;
    const char *line = memchr(p, '\n', n);
    const char *end = p + n;
    while (line && line + 1 < end) {
        line++;
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        if (!nl) break;
        size_t len = (size_t)(nl - line);
        if (len && line[len - 1] == '\r') len--;
        if (len == 0) break;
        const char *v;
        size_t vl;
        if (header_is(line, len, "Content-Length", &v, &vl)) {
            long long x;
            if (!parse_len(v, vl, &x)) {
                snprintf(err, errlen, "malformed Content-Length '%.*s'", (int)(vl > 40 ? 40 : vl), v);
                return -1;
            }
            if (h->content_length >= 0 && h->content_length != x) {
                snprintf(err, errlen, "conflicting Content-Length headers");
                return -1;
            }
            h->content_length = x;
        } else if (header_is(line, len, "Transfer-Encoding", &v, &vl)) {
            if (token_in(v, vl, "chunked")) h->chunked = true;
        } else if (header_is(line, len, "Connection", &v, &vl)) {
            if (token_in(v, vl, "close")) h->close = true;
            else if (token_in(v, vl, "keep-alive")) h->close = false;
        } else if (header_is(line, len, "Inference-Header-Content-Length", &v, &vl)) {
            long long x;
            if (parse_len(v, vl, &x)) h->infer_header_len = x;
        }
        line = nl;
    }
    return 0;
}

/* Decodes a chunked body in place starting at c->buf + off; reads more as needed. Returns 0
 * with the body at buf+off..+*blen, or an MTS_BENCH_E* code. */
static int read_chunked(mts_bench_http_conn *c, size_t off, double deadline, size_t *blen, char *err, size_t errlen)
{
    size_t out = off, in = off;
    for (;;) {
        /* chunk size line */
        char *nl;
        while (!(nl = memchr(c->buf + in, '\n', c->len - in))) {
            int why = 0, r = recv_more(c, c->len + 1, deadline, &why);
            if (r <= 0) {
                snprintf(err, errlen, "reading a chunked body: %s", r == 0 ? "connection closed" : "failed");
                return r == 0 ? MTS_BENCH_EIO : why;
            }
        }
        char *endp;
        unsigned long long sz = strtoull(c->buf + in, &endp, 16);
        if (endp == c->buf + in || (*endp != '\r' && *endp != ';' && *endp != '\n') || sz > (1ull << 34)) {
            snprintf(err, errlen, "malformed chunk size");
            return MTS_BENCH_EPROTO;
        }
        in = (size_t)(nl - c->buf) + 1;
        if (sz == 0) {
            /* trailers until an empty line */
            for (;;) {
                char *e;
                while (!(e = memchr(c->buf + in, '\n', c->len - in))) {
                    int why = 0, r = recv_more(c, c->len + 1, deadline, &why);
                    if (r <= 0) {
                        snprintf(err, errlen, "reading chunked trailers: %s", r == 0 ? "connection closed" : "failed");
                        return r == 0 ? MTS_BENCH_EIO : why;
                    }
                }
                size_t l = (size_t)(e - (c->buf + in));
                in += l + 1;
                if (l == 0 || (l == 1 && c->buf[in - 2] == '\r')) break;
            }
            if (in != c->len) {
                snprintf(err, errlen, "unexpected bytes after the response");
                return MTS_BENCH_EPROTO;
            }
            *blen = out - off;
            return MTS_BENCH_OK;
        }
        while (c->len - in < sz + 2) {
            int why = 0, r = recv_more(c, in + (size_t)sz + 2, deadline, &why);
            if (r <= 0) {
                snprintf(err, errlen, "reading a chunk: %s", r == 0 ? "connection closed" : "failed");
                return r == 0 ? MTS_BENCH_EIO : why;
            }
        }
        memmove(c->buf + out, c->buf + in, (size_t)sz);
        out += (size_t)sz;
        in += (size_t)sz;
        if (c->buf[in] == '\r') in++;
        if (c->buf[in] != '\n') {
            snprintf(err, errlen, "chunk not followed by CRLF");
            return MTS_BENCH_EPROTO;
        }
        in++;
    }
}

static int exchange_once(mts_bench_http_conn *c, struct iovec *iov, int niov, bool head_only, double deadline,
                         mts_bench_http_resp *resp, bool *got_bytes, char *err, size_t errlen)
{
    *got_bytes = false;
    c->len = 0;
    int rc = send_all(c, iov, niov, deadline, err, errlen);
    if (rc) return rc;
    for (;;) { /* skip 1xx interim responses */
        const char *he;
        while (!(he = find_head_end(c->buf, c->len))) {
            if (c->len > MAX_HEAD) {
                snprintf(err, errlen, "response head larger than %d bytes", MAX_HEAD);
                return MTS_BENCH_EPROTO;
            }
            int why = 0, r = recv_more(c, c->len + 1, deadline, &why);
            if (r < 0) {
                snprintf(err, errlen, "waiting for the response: %s",
                         why == MTS_BENCH_ETIMEOUT ? "timed out" : strerror(errno));
                return why;
            }
            if (r == 0) {
                snprintf(err, errlen, "connection closed %s", c->len ? "in the response head" : "before a response");
                return MTS_BENCH_EIO;
            }
            *got_bytes = true;
        }
        head_info h;
        size_t hlen = (size_t)(he - c->buf);
        if (parse_head(c->buf, hlen, &h, err, errlen)) return MTS_BENCH_EPROTO;
        if (h.status >= 100 && h.status < 200) {
            memmove(c->buf, c->buf + hlen, c->len - hlen);
            c->len -= hlen;
            continue;
        }
        size_t blen = 0;
        bool no_body = head_only || h.status == 204 || h.status == 304;
        if (no_body) {
            blen = 0;
        } else if (h.chunked) {
            int r = read_chunked(c, hlen, deadline, &blen, err, errlen);
            if (r) return r;
        } else if (h.content_length >= 0) {
            size_t need = hlen + (size_t)h.content_length;
            while (c->len < need) {
                int why = 0, r = recv_more(c, need, deadline, &why);
                if (r < 0) {
                    snprintf(err, errlen, "reading the %lld-byte body: %s", h.content_length,
                             why == MTS_BENCH_ETIMEOUT ? "timed out" : strerror(errno));
                    return why;
                }
                if (r == 0) {
                    snprintf(err, errlen, "connection closed after %zu of %lld body bytes", c->len - hlen,
                             h.content_length);
                    return MTS_BENCH_EIO;
                }
            }
            if (c->len > need) {
                snprintf(err, errlen, "%zu unexpected bytes after the response", c->len - need);
                return MTS_BENCH_EPROTO;
            }
            blen = (size_t)h.content_length;
        } else { /* delimited by the end of the connection */
            for (;;) {
                int why = 0, r = recv_more(c, c->len + 1, deadline, &why);
                if (r < 0) {
                    snprintf(err, errlen, "reading a body delimited by close: %s",
                             why == MTS_BENCH_ETIMEOUT ? "timed out" : strerror(errno));
                    return why;
                }
                if (r == 0) break;
            }
            blen = c->len - hlen;
            h.close = true;
        }
        resp->status = h.status;
        resp->body = c->buf + hlen;
        resp->body_len = blen;
        resp->infer_header_len = h.infer_header_len;
        if (h.close) {
            /* keep the bytes readable: detach the socket but not the buffer */
            close(c->fd);
            c->fd = -1;
            c->used = false;
        } else {
            c->used = true;
        }
        return MTS_BENCH_OK;
    }
}

int mts_bench_http_exchange(mts_bench_http_conn *c, const char *head, size_t head_len, const void *const *body,
                            const size_t *body_len, int n_body, double timeout_ms, mts_bench_http_resp *resp,
                            char *err, size_t errlen)
{
    double deadline = mts_now_ms() + timeout_ms;
    bool head_only = head_len >= 5 && !strncmp(head, "HEAD ", 5);
    memset(resp, 0, sizeof *resp);
    resp->infer_header_len = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (c->fd < 0) {
            int rc = conn_open(c, deadline, err, errlen);
            if (rc) return rc;
        }
        bool reused = c->used;
        struct iovec iov[2 + MTS_BENCH_MAX_INPUTS];
        int niov = 0;
        iov[niov].iov_base = (void *)head;
        iov[niov++].iov_len = head_len;
        for (int i = 0; i < n_body && niov < (int)(sizeof iov / sizeof iov[0]); i++) {
            iov[niov].iov_base = (void *)body[i];
            iov[niov++].iov_len = body_len[i];
        }
        bool got = false;
        int rc = exchange_once(c, iov, niov, head_only, deadline, resp, &got, err, errlen);
        if (rc == MTS_BENCH_OK) return rc;
        conn_drop(c);
        if (!(reused && !got && rc == MTS_BENCH_EIO)) return rc; /* retry only a stale keep-alive */
    }
    return MTS_BENCH_EIO;
}

int mts_bench_http_simple(const mts_bench_target *t, const char *method, const char *path, const char *json_body,
                          double timeout_ms, int *status, char **out, size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    mts_bench_http_conn *c = mts_bench_http_open(t);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return MTS_BENCH_EIO;
    }
    size_t blen = json_body ? strlen(json_body) : 0;
    char head[2048];
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, t->hostport, mts_cli_auth_header(), blen);
    if (hl < 0 || (size_t)hl >= sizeof head) {
        mts_bench_http_close(c);
        snprintf(err, errlen, "path too long");
        return MTS_BENCH_EPROTO;
    }
    const void *bp[1] = {json_body};
    mts_bench_http_resp r;
    int rc = mts_bench_http_exchange(c, head, (size_t)hl, bp, &blen, json_body ? 1 : 0, timeout_ms, &r, err, errlen);
    if (rc == MTS_BENCH_OK) {
        *status = r.status;
        *out = malloc(r.body_len + 1);
        if (!*out) rc = MTS_BENCH_EIO;
        else {
            memcpy(*out, r.body, r.body_len);
            (*out)[r.body_len] = 0;
            if (out_len) *out_len = r.body_len;
        }
    }
    mts_bench_http_close(c);
    return rc;
}

/* ---- the KServe v2 HTTP transport ------------------------------------------------------ */

typedef struct http_prepared {
    char *head; /* request line + headers + JSON inference header */
    size_t head_len;
    int n;
    const void *data[MTS_BENCH_MAX_INPUTS];
    size_t len[MTS_BENCH_MAX_INPUTS];
    int frames; /* lip-sync frames carried (raw frames over KServe infer), else 0 */
} http_prepared;

static int http_prepare(const mts_bench_target *t, const mts_bench_call *call, void **out, char *err, size_t errlen)
{
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "inputs");
    mts_jw_begin_array(&w);
    size_t data_total = 0;
    for (int i = 0; i < call->n_inputs; i++) {
        const mts_bench_input *in = &call->inputs[i];
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "name");
        mts_jw_string(&w, in->name);
        mts_jw_key(&w, "shape");
        mts_jw_begin_array(&w);
        for (int d = 0; d < in->rank; d++) mts_jw_int(&w, in->dims[d]);
        mts_jw_end_array(&w);
        mts_jw_key(&w, "datatype");
        mts_jw_string(&w, in->datatype);
        mts_jw_key(&w, "parameters");
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "binary_data_size");
        mts_jw_uint(&w, in->nbytes);
        mts_jw_end_object(&w);
        mts_jw_end_object(&w);
        data_total += in->nbytes;
    }
    mts_jw_end_array(&w);
    mts_jw_key(&w, "parameters");
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "binary_data_output");
    mts_jw_bool(&w, true);
    if (call->timeout_us > 0) {
        mts_jw_key(&w, "timeout");
        mts_jw_int(&w, call->timeout_us);
    }
    mts_jw_end_object(&w);
    mts_jw_end_object(&w);
    size_t jlen = 0;
    char *json = mts_jw_take(&w, &jlen);
    mts_jw_free(&w);
    http_prepared *p = calloc(1, sizeof *p);
    if (!json || !p || call->n_inputs > MTS_BENCH_MAX_INPUTS) {
        free(json);
        free(p);
        snprintf(err, errlen, "encoding the request for '%s' failed", call->model);
        return -1;
    }
    char line[2048];
    int ll = snprintf(line, sizeof line,
                      "POST /v2/models/%s/infer HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/octet-stream\r\n"
                      "Inference-Header-Content-Length: %zu\r\nContent-Length: %zu\r\n\r\n",
                      call->model, t->hostport, mts_cli_auth_header(), jlen, jlen + data_total);
    if (ll < 0 || (size_t)ll >= sizeof line) {
        free(json);
        free(p);
        snprintf(err, errlen, "model name too long");
        return -1;
    }
    p->head = malloc((size_t)ll + jlen);
    if (!p->head) {
        free(json);
        free(p);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(p->head, line, (size_t)ll);
    memcpy(p->head + ll, json, jlen);
    p->head_len = (size_t)ll + jlen;
    free(json);
    p->n = call->n_inputs;
    p->frames = call->frames;
    for (int i = 0; i < call->n_inputs; i++) {
        p->data[i] = call->inputs[i].data;
        p->len[i] = call->inputs[i].nbytes;
    }
    *out = p;
    return 0;
}

static void http_free_prepared(void *prepared)
{
    http_prepared *p = prepared;
    if (!p) return;
    free(p->head);
    free(p);
}

static void *http_connect(const mts_bench_target *t)
{
    return mts_bench_http_open(t);
}

/* Pulls queue_ms / compute_ms or the error text out of a response's JSON (header). */
static void parse_reply(const mts_bench_http_resp *r, mts_bench_result *res)
{
    size_t jlen = r->body_len;
    if (r->infer_header_len >= 0 && (size_t)r->infer_header_len <= r->body_len) jlen = (size_t)r->infer_header_len;
    if (jlen == 0) return;
    mts_json_doc *doc = NULL;
    mts_err e = {0};
    if (mts_json_parse(r->body, jlen, &doc, &e)) {
        if (r->status >= 300) snprintf(res->msg, sizeof res->msg, "%.*s", (int)(jlen > 150 ? 150 : jlen), r->body);
        return;
    }
    const mts_json *root = mts_json_root(doc);
    if (r->status >= 300) {
        const char *m = mts_json_str(mts_json_get(root, "error"), NULL);
        if (m) snprintf(res->msg, sizeof res->msg, "%s", m);
    } else {
        const mts_json *params = mts_json_get(root, "parameters");
        double q = mts_json_num(mts_json_get(params, "queue_ms"));
        double cm = mts_json_num(mts_json_get(params, "compute_ms"));
        if (q == q) res->queue_ms = q;
        if (cm == cm) res->compute_ms = cm;
    }
    mts_json_free(doc);
}

static void http_infer(void *conn, const void *prepared, int64_t start_frame, double timeout_ms,
                       mts_bench_result *res)
{
    (void)start_frame;
    const http_prepared *p = prepared;
    mts_bench_result_init(res);
    mts_bench_http_resp r;
    int rc = mts_bench_http_exchange(conn, p->head, p->head_len, p->data, p->len, p->n, timeout_ms, &r, res->msg,
                                     sizeof res->msg);
    if (rc) {
        res->status = 0;
        res->transport_error = rc;
        res->no_server = rc == MTS_BENCH_ECONNECT || rc == MTS_BENCH_EIO;
        return;
    }
    res->status = r.status;
    parse_reply(&r, res);
    if (p->frames > 0 && r.status >= 200 && r.status < 300) {
        res->frames = p->frames;
        if (r.infer_header_len >= 0 && (size_t)r.infer_header_len <= r.body_len)
            res->bytes = r.body_len - (size_t)r.infer_header_len;
    }
}

static int http_model_ready(void *conn, const char *model, double timeout_ms)
{
    mts_bench_http_conn *c = conn;
    char head[1400];
    int hl = snprintf(head, sizeof head, "GET /v2/models/%s/ready HTTP/1.1\r\nHost: %s\r\n%s\r\n", model,
                      c->target.hostport, mts_cli_auth_header());
    if (hl < 0 || (size_t)hl >= sizeof head) return -1;
    mts_bench_http_resp r;
    char err[200];
    if (mts_bench_http_exchange(c, head, (size_t)hl, NULL, NULL, 0, timeout_ms, &r, err, sizeof err)) return -1;
    if (r.status == 200) return 1;
    return r.status == 400 || r.status == 503 ? 0 : -1;
}

static void http_close(void *conn)
{
    mts_bench_http_close(conn);
}

const mts_bench_transport mts_bench_http_transport = {
    .name = "http",
    .prepare = http_prepare,
    .free_prepared = http_free_prepared,
    .connect = http_connect,
    .infer = http_infer,
    .model_ready = http_model_ready,
    .close = http_close,
};

/* ---- lip-sync composite ---------------------------------------------------------------- */

typedef struct lip_prepared {
    char path[400]; /* /api/v1/lipsync/{model}/composite?batch_size=N&format=F */
    char host[300];
    const void *data[2];
    size_t len[2];
} lip_prepared;

static int lip_prepare(const mts_bench_target *t, const mts_bench_call *call, void **out, char *err, size_t errlen)
{
    if (!call->composite) {
        snprintf(err, errlen, "the HTTP lip-sync route composites; raw frames go over KServe infer");
        return -1;
    }
    if (call->n_inputs < 2 || call->frames < 1) {
        snprintf(err, errlen, "'%s': a lip-sync request needs visual and audio inputs and at least one frame",
                 call->model);
        return -1;
    }
    lip_prepared *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int n = snprintf(p->path, sizeof p->path, "/api/v1/lipsync/%s/composite?batch_size=%d&format=%s", call->model,
                     call->frames, call->format ? call->format : "jpeg");
    if (n < 0 || (size_t)n >= sizeof p->path) {
        free(p);
        snprintf(err, errlen, "model name too long");
        return -1;
    }
    snprintf(p->host, sizeof p->host, "%s", t->hostport);
    for (int i = 0; i < 2; i++) {
        p->data[i] = call->inputs[i].data;
        p->len[i] = call->inputs[i].nbytes;
    }
    *out = p;
    return 0;
}

static void lip_free_prepared(void *prepared)
{
    free(prepared);
}

/* The composite reply's JSON header: times, frames (count and sizes) and num_frames. */
static void parse_lip_reply(const mts_bench_http_resp *r, mts_bench_result *res)
{
    if (r->status >= 300) {
        parse_reply(r, res);
        return;
    }
    size_t jlen = r->infer_header_len >= 0 && (size_t)r->infer_header_len <= r->body_len ? (size_t)r->infer_header_len
                                                                                          : 0;
    mts_json_doc *doc = NULL;
    mts_err e = {0};
    if (!jlen || mts_json_parse(r->body, jlen, &doc, &e)) {
        res->status = 0;
        res->transport_error = MTS_BENCH_EPROTO;
        snprintf(res->msg, sizeof res->msg, "the composite reply has no valid JSON header");
        return;
    }
    const mts_json *root = mts_json_root(doc);
    const struct {
        const char *k;
        double *dst;
    } times[] = {{"queue_time_ms", &res->queue_ms},         {"inference_time_ms", &res->compute_ms},
                 {"composite_time_ms", &res->composite_ms}, {"encode_time_ms", &res->encode_ms},
                 {"background_time_ms", &res->background_ms}};
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++) {
        double x = mts_json_num(mts_json_get(root, times[i].k));
        if (x == x) *times[i].dst = x;
    }
    int64_t nf = 0;
    if (!mts_json_int(mts_json_get(root, "num_frames"), &nf) && nf > 0 && nf <= INT32_MAX) res->num_frames = (int)nf;
    const mts_json *frames = mts_json_get(root, "frames");
    size_t n = mts_json_len(frames);
    for (size_t i = 0; i < n; i++) {
        int64_t size = 0;
        if (!mts_json_int(mts_json_get(mts_json_at(frames, i), "size"), &size) && size > 0) res->bytes += (uint64_t)size;
    }
    res->frames = (int)n;
    if (res->bytes > r->body_len - jlen) {
        res->status = 0;
        res->transport_error = MTS_BENCH_EPROTO;
        snprintf(res->msg, sizeof res->msg, "the composite reply lists %llu frame bytes but carries %zu",
                 (unsigned long long)res->bytes, r->body_len - jlen);
    }
    mts_json_free(doc);
}

static void lip_infer(void *conn, const void *prepared, int64_t start_frame, double timeout_ms,
                      mts_bench_result *res)
{
    const lip_prepared *p = prepared;
    mts_bench_result_init(res);
    char head[2048];
    int hl = snprintf(head, sizeof head,
                      "POST %s&start_frame_idx=%lld HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/octet-stream\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      p->path, (long long)start_frame, p->host, mts_cli_auth_header(), p->len[0] + p->len[1]);
    mts_bench_http_resp r;
    int rc = mts_bench_http_exchange(conn, head, (size_t)hl, p->data, p->len, 2, timeout_ms, &r, res->msg,
                                     sizeof res->msg);
    if (rc) {
        res->transport_error = rc;
        res->no_server = rc == MTS_BENCH_ECONNECT || rc == MTS_BENCH_EIO;
        return;
    }
    res->status = r.status;
    parse_lip_reply(&r, res);
}

const mts_bench_transport mts_bench_lipsync_http_transport = {
    .name = "http-lipsync",
    .prepare = lip_prepare,
    .free_prepared = lip_free_prepared,
    .connect = http_connect,
    .infer = lip_infer,
    .close = http_close,
};
