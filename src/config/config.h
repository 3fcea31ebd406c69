/*
 * Server configuration: the lip-sync deployment's YAML format (sections server, gpus,
 * capacity, onnx, models) or a Triton-style model repository folder, turned into validated
 * structs. Errors name the file, the line and the key; keys that do not apply to mtserve are
 * warned about once (through the log callback) and otherwise ignored.
 */
#ifndef MTS_CONFIG_CONFIG_H
#define MTS_CONFIG_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "util/status.h"

typedef enum mts_eviction_policy { MTS_EVICT_LRU = 0, MTS_EVICT_LFU } mts_eviction_policy;
typedef enum mts_placement { MTS_PLACE_ROUND_ROBIN = 0, MTS_PLACE_LEAST_LOADED } mts_placement;
/* Model control (Triton's --model-control-mode): AUTO (mtserve's default) loads a model on its
 * first request or when preload/pin says so, and evicts by capacity; NONE loads every model at
 * start; EXPLICIT loads only through the load API (and preload/pin at start): requests to a
 * model not loaded are refused; POLL is AUTO plus a rescan of the repository every
 * repository_poll_s seconds. */
typedef enum mts_model_control { MTS_CONTROL_AUTO = 0, MTS_CONTROL_NONE, MTS_CONTROL_EXPLICIT, MTS_CONTROL_POLL }
    mts_model_control;

/* Priority levels: 1 runs first, MTS_PRIORITY_LEVELS last. */
#define MTS_PRIORITY_LEVELS 9
#define MTS_DEFAULT_PRIORITY 5

/* One entry of an embedding model's embedding_policy (written by `mtserve tune --embedding`):
 * a request of n texts takes the first entry with n <= max_batch (the last entry beyond it);
 * its texts are split into min(workers, n) sub-batches that run in parallel on the device's
 * workers, each with `threads` intra-op threads (0: the scheduler's backlog rule). workers 1
 * with threads > 1 is fine-grained parallelism (threads inside each matrix multiply), workers > 1
 * with threads 1 coarse-grained (texts in parallel). YAML: a sequence of mappings with keys
 * max_batch, workers, threads (alias num_threads) and disable_matmul_parallel (true: threads 1),
 * or the compact text "4:1x2,32:2x1" (max_batch:workers x threads, comma-separated), which is
 * also the form of config.pbtxt's parameter 'embedding_policy'. */
#define MTS_EMBED_POLICY_MAX 16
typedef struct mts_embed_policy {
    int max_batch, workers, threads;
} mts_embed_policy;

typedef struct mts_model_config {
    char *name;
    char *model_path;          /* .onnx file */
    int max_batch;             /* samples per batch; default 8; 1 disables batching. A request
                                * with more samples than this is refused (400/INVALID_ARGUMENT) */
    bool no_batching;          /* max_batch 0 (config.pbtxt max_batch_size 0): the leading dimension
                                * is not a batch dimension (not limited, never batched; max_batch
                                * becomes 1) */
    int64_t max_queue_delay_us;/* batching delay; default 2000 */
    int engine_batch;          /* > 0: a batch of more samples runs as engine runs of at most this
                                * many (in order, on the same worker); 0 (default): one run */
    int queue_size;            /* per-model queue bound (requests); default server.queue_size */
    bool preload;              /* load at start-up */
    bool pin;                  /* never evicted */
    int preferred_device;      /* -1 = placement strategy decides (documents: preferred_gpu) */
    int instances;             /* max concurrent batches of this model; default: device workers */
    double weight;             /* share of a device's compute time under contention; default 1 */
    int priority;              /* 1 (first) .. 9 (last): ready models of a better level run
                                * first; default MTS_DEFAULT_PRIORITY */
    char *precision;           /* "auto", "fp32", "bf16", "int8" (engine.h mts_load_opts.precision);
                                * NULL = $MTS_PRECISION, else fp32 */
    double max_error;          /* bf16 accuracy guard: relative L2 bound; 0 = default (1e-2) */
    int version;               /* the version served (Triton layout <name>/<N>/model.onnx); default 1 */
    /* lip-sync assets (compositing issue) */
    char *background_dir;
    char *crop_rects_path;
    int num_frames;
    int background_cache_frames; /* default capacity.background_cache_frames */
    /* text embeddings (docs/embeddings.md): a model with a tokenizer takes texts */
    char *tokenizer_path;      /* tokenizer: vocab.txt (WordPiece) or tokenizer.json; NULL: not an
                                * embedding model */
    int pooling;               /* pooling: MTS_POOL_MEAN (default), _CLS or _LAST */
    bool normalize;            /* normalize: L2-normalize the vectors (default false) */
    int lowercase;             /* lowercase: 0 = the tokenizer's own default, 1 = true, 2 = false */
    int max_tokens;            /* max_tokens: tokens per text, [CLS]/[SEP] included; 0: 512 or the
                                * model's fixed sequence length */
    char *input_ids_name, *attention_mask_name, *token_type_ids_name; /* NULL: detected */
    char *output_name;         /* output_name: NULL = the model's first output */
    /* embedding_policy: how a request of n texts runs (see mts_embed_policy) */
    int n_embed_policy;        /* 0: no policy, the scheduler decides as for any model */
    mts_embed_policy embed_policy[MTS_EMBED_POLICY_MAX]; /* ascending max_batch */
} mts_model_config;

/* Pooling of an embedding model's per-token output (mts_model_config.pooling). */
enum { MTS_POOL_MEAN = 0, MTS_POOL_CLS = 1, MTS_POOL_LAST = 2 };

typedef struct mts_config {
    char *source;              /* file or folder the configuration came from */
    /* server */
    char *host;                /* listen address; default 127.0.0.1 */
    int http_port;             /* default 8000 */
    int grpc_port;             /* from server.port ":50051"; default 50051 */
    int worker_count;          /* server.worker_count: workers per device when gpus is absent */
    int queue_size;            /* server.queue_size: default per-model queue bound (100) */
    int max_queue_total;       /* global cap on queued requests; default 16 × queue_size */
    int max_message_size_mb;   /* request body / message limit; default 50 */
    int64_t default_timeout_ms;/* 0 = none */
    int shutdown_grace_s;      /* SIGTERM: time to finish queued work; default 30 */
    int max_connections;       /* server.max_connections: open HTTP connections; default 4096 */
    int max_connections_per_client; /* server.max_connections_per_client: per client address; 0 = none */
    int http_threads;          /* server.http_threads: HTTP I/O threads; default 2 */
    int keepalive_timeout_s;   /* server.keepalive_timeout_s: idle HTTP connection closes; default 60 */
    int header_timeout_s;      /* server.header_timeout_s: a request head must arrive within; default 10 */
    char *tls_cert_path;       /* server.tls_cert_path: PEM certificate chain; gRPC and HTTP serve TLS when set */
    char *tls_key_path;        /* server.tls_key_path: its PEM private key */
    char *tls_client_ca_path;  /* server.tls_client_ca_path: when set, clients must present a cert it signed */
    char *auth_token_file;     /* server.auth_token_file: bearer tokens and their scopes (api/auth.h) */
    const char *grpc_transport; /* server.grpc_transport: "native" or "core" (static text); NULL: the
                                 * environment's MTS_GRPC_TRANSPORT, else native (api/grpc_server.h) */
    int light_io_realtime;     /* server.light_io_realtime: 1 true, 0 false; -1 (not set): true unless
                                * the environment's MTS_LIGHT_REALTIME is "0" (util/rtprio.h) */
    mts_model_control model_control; /* --model-control-mode; default MTS_CONTROL_AUTO */
    int repository_poll_s;     /* --repository-poll-secs (poll mode); default 15 */
    /* devices (the documents' gpus section maps onto CPU devices) */
    int device_count;          /* gpus.count; default 1 */
    double memory_gb_per_device; /* gpus.memory_gb_per_gpu; default capacity.max_memory_gb / count */
    int workers_per_device;    /* gpus.worker_count_per_gpu or server.worker_count; default 2 */
    int threads_per_device;    /* cores each device owns; default online cores / device_count */
    mts_placement placement;   /* gpus.assignment_strategy */
    /* capacity */
    int max_models;            /* default 100 */
    double max_memory_gb;      /* default: 0.5 × physical memory */
    mts_eviction_policy eviction;
    double idle_timeout_minutes; /* 0 = never */
    int background_cache_frames; /* default 50 */
    /* models */
    char *model_repository;    /* folder scanned for <name>/model.onnx (optional) */
    int n_models;
    mts_model_config *models;
} mts_config;

/* Called once per warning ("config.yaml:12: key 'onnx.library_path' does not apply ..."). */
typedef void (*mts_config_warn_fn)(void *user, const char *msg);

/* Values that default from other values stay unset until mts_config_finalize: worker_count,
 * max_queue_total, memory_gb_per_device, workers_per_device, threads_per_device and max_memory_gb
 * are 0; per model, max_batch, queue_size and instances are 0, max_queue_delay_us and
 * background_cache_frames -1. Status codes: MTS_EINVAL (bad content), MTS_ELIMIT (file larger than
 * 4 MiB, nesting deeper than 64), MTS_ENOTFOUND / MTS_EIO (cannot read), MTS_ENOMEM. When loading
 * or parsing fails, c is left freed (zeroed), so a further mts_config_free is harmless. */

/* Sets every field to its default (no models). */
void mts_config_defaults(mts_config *c);
/* Parses a YAML file into c (defaults first). On error returns MTS_EINVAL and err says
 * "FILE:LINE: key 'a.b': what is wrong". */
int mts_config_load_yaml(const char *path, mts_config *c, mts_config_warn_fn warn, void *user, mts_err *err);
/* Parses YAML text (for tests); name is used in messages. */
int mts_config_parse_yaml(const char *text, size_t len, const char *name, mts_config *c, mts_config_warn_fn warn,
                          void *user, mts_err *err);
/* Adds every <dir>/<name>/model.onnx (optionally with <dir>/<name>/config.yaml holding the
 * per-model keys) as a model; models already configured by name are kept. */
int mts_config_scan_repository(mts_config *c, const char *dir, mts_config_warn_fn warn, void *user, mts_err *err);
/* The ML service design's environment variables, applied over the file:
 *   ML_INFERENCE_WORKERS=N          workers per device (1..256)
 *   ML_MEMORY_LIMIT_GB=G            total memory budget (capacity.max_memory_gb; per-device
 *                                   budgets above G / devices are lowered to it)
 *   ML_CONCURRENT_MODELS=K          resident models at most (capacity.max_models, 1..1000000)
 *   ML_ENABLE_PARALLEL_INFERENCE=B  true (default: batches of one model run concurrently, no
 *                                   model locks) or false (one batch at a time per model)
 * getenv_fn is getenv (tests pass their own). note() receives one line per variable applied.
 * MTS_EINVAL names the variable and the expected values. Call before mts_config_finalize. */
int mts_config_apply_env(mts_config *c, const char *(*getenv_fn)(const char *name), mts_config_warn_fn note,
                         void *user, mts_err *err);
/* Fills derived defaults (per-device memory, workers, threads) and checks cross-field rules. */
int mts_config_finalize(mts_config *c, mts_err *err);
const mts_model_config *mts_config_find_model(const mts_config *c, const char *name);
void mts_config_free(mts_config *c);

/* Scans the one repository folder <dir>/<name> as mts_config_scan_repository does, with base's
 * server-wide defaults and getenv_fn's environment (mts_config_apply_env) applied, into a
 * malloc'd model (free it with mts_model_config_free). *out is NULL with MTS_OK when the folder
 * holds no model (warn says why); an error names the file and what is wrong. Poll mode uses it
 * for folders and version folders that appear after start. */
int mts_config_scan_model(const mts_config *base, const char *dir, const char *name,
                          const char *(*getenv_fn)(const char *name), mts_model_config **out, mts_config_warn_fn warn,
                          void *user, mts_err *err);
/* The compact form "4:1x2,32:2x1" into out[] (*n entries): entries with max_batch ascending,
 * workers 1..256 and no more than max_batch, threads 0..1024; 0, or -1 with what is wrong and in
 * which entry in err. */
int mts_embed_policy_parse(const char *text, mts_embed_policy *out, int *n, char *err, size_t errlen);
/* The compact form of m's policy into buf ("" when none). */
void mts_embed_policy_format(const mts_model_config *m, char *buf, size_t len);
/* The entry that applies to a request of n texts; NULL when m has no policy. */
const mts_embed_policy *mts_embed_policy_for(const mts_model_config *m, int n);

/* Frees a model from mts_config_scan_model (its strings and itself); NULL is fine. */
void mts_model_config_free(mts_model_config *m);

#endif
