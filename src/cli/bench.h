/*
 * Internals of `mtserve bench`, the load generator (cli_bench.c): the transport interface that
 * carries inference requests to a server, the blocking HTTP/1.1 keep-alive client behind the
 * first transport (bench_http.c), and latency histograms with counters (bench_stats.c). What the
 * parts of the load generator itself share is in bench_internal.h.
 *
 * Transports. A transport is a small table of functions. A client thread owns one connection
 * (connect ... close) and sends one request at a time on it (infer). Requests are prepared once
 * per model (the body is encoded up front and shared read-only by every thread), so sending
 * costs no encoding. HTTP (KServe v2 REST with the binary tensor extension, bench_http.c) and
 * gRPC (KServe v2 GRPCInferenceService ModelInfer with raw_input_contents, bench_grpc.c) fill
 * the same table. Control operations (model metadata, repository index, statistics) go over
 * HTTP when there is an HTTP address; with --grpc alone, metadata and the index go over gRPC and
 * server statistics are not read (ModelStatistics has no loads, evictions or residency).
 */
#ifndef MTS_CLI_BENCH_H
#define MTS_CLI_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- target ---------------------------------------------------------------------------- */

typedef struct mts_bench_target {
    char host[256];
    int port;
    char hostport[300]; /* "host:port" for the Host header */
} mts_bench_target;

/* Parses "http://host:port", "host:port" or "host" (port 8000). 0 or -1 with a message. */
int mts_bench_parse_url(const char *url, mts_bench_target *t, char *err, size_t errlen);

/* ---- requests and results -------------------------------------------------------------- */

#define MTS_BENCH_MAX_INPUTS 16

typedef struct mts_bench_input {
    char name[128];
    char datatype[16]; /* KServe spelling: FP32, INT64, ... */
    int rank;
    int64_t dims[8];
    size_t nbytes;
    const void *data;  /* nbytes of raw little-endian data (not owned) */
} mts_bench_input;

typedef struct mts_bench_call {
    const char *model;
    int n_inputs;
    const mts_bench_input *inputs;
    int64_t timeout_us; /* server-side deadline ("timeout" parameter); 0: none */
    /* Lip-sync transports only: inputs[0] is the visual, inputs[1] the audio tensor, both with
     * `frames` in their first dimension. */
    int frames;
    bool composite;     /* InferBatchComposite (finished frames) instead of InferBatch (raw) */
    const char *format; /* composite: "jpeg", "png" or "rgb" */
} mts_bench_call;

/* Transport-level failures (result.status == 0). */
enum {
    MTS_BENCH_OK = 0,
    MTS_BENCH_ECONNECT,  /* could not connect */
    MTS_BENCH_ETIMEOUT,  /* no complete response before the request timeout */
    MTS_BENCH_EIO,       /* connection reset or closed mid-response */
    MTS_BENCH_EPROTO,    /* malformed response */
};
const char *mts_bench_error_name(int transport_error);

typedef struct mts_bench_result {
    int status;          /* HTTP status (gRPC transports map their codes to HTTP ones); 0: failed */
    int transport_error; /* MTS_BENCH_E* when status is 0 */
    double queue_ms;     /* server-reported time queued incl. load waits; < 0 if not reported */
    double compute_ms;   /* server-reported engine time; < 0 if not reported */
    /* Lip-sync replies: compositing, encoding and background-frame times (< 0 if not reported),
     * frames and payload bytes received, the avatar's frame count (0 if not reported). */
    double composite_ms, encode_ms, background_ms;
    int frames;
    uint64_t bytes;
    int num_frames;
    char msg[200];       /* error text (server's "error" field or the transport's reason) */
    char code[24];       /* error key when the transport has its own names (gRPC: NOT_FOUND, ...);
                            empty: the HTTP status or the transport error name is used */
    bool no_server;      /* no server took part: the connection was refused or lost before any
                            response (HTTP connect/io errors; gRPC UNAVAILABLE on a channel that is
                            not connected). Many in a row stop the run: the server is gone. */
} mts_bench_result;

typedef struct mts_bench_transport {
    const char *name;
    /* Encodes a request once; *prepared is shared read-only by all connections. */
    int (*prepare)(const mts_bench_target *t, const mts_bench_call *call, void **prepared, char *err,
                   size_t errlen);
    void (*free_prepared)(void *prepared);
    /* A connection handle (never NULL unless out of memory). It connects eagerly but a failure
     * is only reported by the next infer, which also reconnects after errors. */
    void *(*connect)(const mts_bench_target *t);
    /* Sends one prepared request and waits up to timeout_ms for its response. start_frame is
     * the first background frame of a lip-sync composite (ignored by the other transports). */
    void (*infer)(void *conn, const void *prepared, int64_t start_frame, double timeout_ms, mts_bench_result *res);
    /* Optional (may be NULL): 1 when the model is resident and ready, 0 when not, -1 on error. */
    int (*model_ready)(void *conn, const char *model, double timeout_ms);
    void (*close)(void *conn);
} mts_bench_transport;

extern const mts_bench_transport mts_bench_http_transport;
extern const mts_bench_transport mts_bench_grpc_transport;
/* The lip-sync service: gRPC inference.InferenceService InferBatch / InferBatchComposite
 * (bench_grpc.c), and HTTP POST /api/v1/lipsync/{model}/composite (bench_http.c). */
extern const mts_bench_transport mts_bench_lipsync_grpc_transport;
extern const mts_bench_transport mts_bench_lipsync_http_transport;
/* Resets a result before a request: no status, every server time unreported. */
void mts_bench_result_init(mts_bench_result *res);

/* ---- gRPC (bench_grpc.c) --------------------------------------------------------------- */

/* Initialises gRPC core (pair with mts_bench_grpc_finish) and sets the channel pool: client
 * threads share `channels` channels round-robin (each its own TCP connection); 0 gives every
 * client thread a channel of its own. */
void mts_bench_grpc_configure(int channels);
void mts_bench_grpc_finish(void);
/* ModelMetadata: the inputs (name, datatype, shape with -1 for variable dimensions; no data)
 * into ins[0..max). 0, or -1 with "CODE: message" in err. */
int mts_bench_grpc_metadata(const char *target, const char *model, mts_bench_input *ins, int max, int *n,
                            char *err, size_t errlen);
/* RepositoryIndex: every configured model's name, malloc'd (caller frees each and the array). */
int mts_bench_grpc_index(const char *target, char ***names, int *n, char *err, size_t errlen);

/* ---- HTTP/1.1 client (bench_http.c) ---------------------------------------------------- */

typedef struct mts_bench_http_conn mts_bench_http_conn;

typedef struct mts_bench_http_resp {
    int status;
    const char *body;       /* into the connection's buffer; valid until the next request */
    size_t body_len;
    long long infer_header_len; /* Inference-Header-Content-Length, -1 if absent */
} mts_bench_http_resp;

mts_bench_http_conn *mts_bench_http_open(const mts_bench_target *t);
void mts_bench_http_close(mts_bench_http_conn *c);
/* One request/response exchange on a keep-alive connection (reconnecting when needed; a
 * request on a reused connection that the server had closed is retried once). head is the
 * complete request head (request line + headers + blank line); body is n_body pieces.
 * Returns MTS_BENCH_OK or MTS_BENCH_E*, with a reason in err. */
int mts_bench_http_exchange(mts_bench_http_conn *c, const char *head, size_t head_len, const void *const *body,
                            const size_t *body_len, int n_body, double timeout_ms, mts_bench_http_resp *resp,
                            char *err, size_t errlen);
/* Convenience for control calls: GET or POST (JSON body or NULL) on a fresh connection. The
 * body is returned malloc'd and NUL-terminated in *out (caller frees). */
int mts_bench_http_simple(const mts_bench_target *t, const char *method, const char *path, const char *json_body,
                          double timeout_ms, int *status, char **out, size_t *out_len, char *err, size_t errlen);

/* ---- statistics (bench_stats.c) -------------------------------------------------------- */

/* Log-linear histogram of microseconds: exact below 128 us, then 64 sub-buckets per power of
 * two (relative error below 0.8 %), up to 2^40 us. */
#define MTS_HIST_SUB 64
#define MTS_HIST_N (2 * MTS_HIST_SUB + 34 * MTS_HIST_SUB)

typedef struct mts_bench_hist {
    uint64_t count;
    double sum_us;
    uint64_t min_us, max_us;
    uint64_t bins[MTS_HIST_N];
} mts_bench_hist;

void mts_bench_hist_init(mts_bench_hist *h);
void mts_bench_hist_add(mts_bench_hist *h, double us);
void mts_bench_hist_merge(mts_bench_hist *dst, const mts_bench_hist *src);
/* Value at quantile q in [0,1] in microseconds (0 when empty); q = 1 gives the exact max. */
double mts_bench_hist_quantile(const mts_bench_hist *h, double q);
double mts_bench_hist_mean(const mts_bench_hist *h);
/* Exposed for tests. */
int mts_bench_hist_index(uint64_t us);
uint64_t mts_bench_hist_bucket_low(int idx);

/* Counts by error key ("404", "429", "timeout", "connect", ...) with the first message seen. */
#define MTS_BENCH_MAX_CODES 32
typedef struct mts_bench_codes {
    int n;
    struct {
        char key[24];
        uint64_t count;
        char msg[160];
    } e[MTS_BENCH_MAX_CODES];
} mts_bench_codes;

void mts_bench_codes_add(mts_bench_codes *c, const char *key, const char *msg, uint64_t n);
uint64_t mts_bench_codes_total(const mts_bench_codes *c);

/* Zipf(s) popularity over n ranks (s = 0: uniform): cumulative weights for sampling. */
typedef struct mts_bench_popularity {
    int n;
    double *cdf; /* n entries, last = 1 */
} mts_bench_popularity;

int mts_bench_popularity_init(mts_bench_popularity *p, int n, double s);
void mts_bench_popularity_free(mts_bench_popularity *p);
/* Rank for a uniform u in [0,1). */
int mts_bench_popularity_pick(const mts_bench_popularity *p, double u);

/* Users mode: where user u of n is in the conversation cycle (cycle_ms long) when the run
 * starts; it sends a request every period_ms while speaking, at (-offset) mod period_ms after
 * the start plus multiples of period_ms. grid: cycle_ms * u / n, offsets exactly even. Else the
 * same offsets each moved by under one period (back by one when past the cycle's end) so that
 * user u's request phase is period_ms * frac(u * golden ratio): even offsets alone can line up
 * the requests of users who speak together (15 s over 12 users is 1.25 s, 30 ms short of two
 * 640 ms periods), so each queues behind the others' whole requests, while real users' phases
 * are unrelated; the golden-ratio sequence spreads any run of consecutive users over the
 * period. */
double mts_bench_user_offset_ms(int u, int n, double cycle_ms, double period_ms, bool grid);

/* xorshift64* generator; state must be nonzero. */
uint64_t mts_bench_rand(uint64_t *state);
double mts_bench_rand01(uint64_t *state);

#endif
