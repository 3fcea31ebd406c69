/*
 * The mtserve command line: one binary, subcommands dispatched from main.c. Shared helpers for
 * the engine-facing commands (building input tensors from a model's signature, clocks) live in
 * cli_common.c.
 */
#ifndef MTS_CLI_CLI_H
#define MTS_CLI_CLI_H

#include "engine/engine.h"

int mts_cli_inspect(int argc, char **argv);
int mts_cli_run(int argc, char **argv);
int mts_cli_serve(int argc, char **argv);
/* "0.9.0 (git describe)" as configured by CMake. */
const char *mts_version_string(void);
int mts_cli_tune(int argc, char **argv);
int mts_cli_bench(int argc, char **argv);
int mts_cli_cluster_config(int argc, char **argv);
int mts_cli_quantize(int argc, char **argv);
int mts_cli_embed(int argc, char **argv);
/* An embedding model for the command line: MODEL a model folder (scanned as a one-model
 * repository) or, with config, a model name in that YAML file. c is initialized here (free it
 * with mts_config_free); *out points into it. 0, or 1 with the reason printed. */
struct mts_config;
struct mts_model_config;
int mts_cli_embed_find(const char *model, const char *config, struct mts_config *c,
                       const struct mts_model_config **out);
/* mts_embedder_init with a loaded model's declared inputs and outputs; *n_in / *n_out (may be
 * NULL) get their counts. 0, or -1 with the reason in err. */
struct mts_embedder;
int mts_cli_embedder_init(struct mts_embedder *e, const struct mts_model_config *mc, const mts_model *mdl,
                          int64_t pad_id, int *n_in, int *n_out, char *err, size_t errlen);
/* Makes ctx's runs padding-free (engine.h mts_ctx_set_padding_mask) on the embedder's attention
 * mask input, when the model has one: the embedder pools over the valid tokens only. */
void mts_cli_embed_padding(struct mts_ctx *ctx, const struct mts_embedder *e, const mts_model *mdl);
/* True when path is a model folder whose configuration makes it an embedding model (it names a
 * tokenizer); quiet. */
int mts_cli_is_embedding_folder(const char *path);
/* `mtserve tune MODEL --embedding` (cli_tune_embed.c), called by mts_cli_tune with its options. */
typedef struct mts_tune_embed_opts {
    int cores;
    double seconds;            /* measuring time per setting, in `rounds` round-robin slices */
    int rounds;
    const int *batches;
    int n_batches;
    const char *texts_file;    /* one text per line; NULL: the built-in corpus */
    const char *out_path;      /* the policy YAML to write; NULL: printed only */
    const char *policy;        /* compact policy ("4:1x2,32:2x1"): measure only it against one
                                * worker with every core (the server without a policy, idle) */
    int json;
} mts_tune_embed_opts;
int mts_cli_tune_embed(const char *model, const mts_tune_embed_opts *o);

/* Named overrides of symbolic dimensions, from `--dim NAME=VALUE`. */
typedef struct mts_cli_dims {
    int n;
    const char *name[16];
    int64_t value[16];
} mts_cli_dims;

int mts_cli_parse_dim(mts_cli_dims *d, const char *arg);
void mts_cli_dims_free(mts_cli_dims *d);
/* Concrete shape for input i: the first symbolic dim becomes `batch`, others come from dims
 * (default 1). Data is left NULL. */
int mts_cli_input_shape(const mts_model *m, int i, int64_t batch, const mts_cli_dims *dims, mts_tensor *t,
                        mts_err *err);
double mts_cli_now_ms(void);
/* qsort comparison of doubles, ascending (latency percentiles). */
int mts_cli_cmp_double(const void *a, const void *b);
/* The client side of bearer-token authentication: the token in $MTSERVE_TOKEN, or NULL; and the
 * HTTP header line carrying it ("Authorization: Bearer <token>\r\n"), or "" without one. Every
 * client command (infer, models, bench) sends it on HTTP and as gRPC `authorization` metadata. */
const char *mts_cli_token(void);
const char *mts_cli_auth_header(void);
/* Loads a model with the precision of --precision / --max-error (mts_cli_precision, NULL =
 * $MTS_PRECISION or fp32; mts_cli_max_error, 0 = default) and prints one line on stderr saying
 * which precision it runs in and why, unless that is plain fp32 as requested. */
extern const char *mts_cli_precision;
extern double mts_cli_max_error;
int mts_cli_load(const char *path, mts_model **m, double *load_ms);
/* The same for a model of a configuration (embed, tune --embedding): --precision / --max-error
 * when given on the command line, else the model's own `precision` / `max_error` settings. */
struct mts_model_config;
int mts_cli_load_config(const struct mts_model_config *mc, mts_model **m, double *load_ms);
/* Handles --precision P and --max-error E at argv[*i] (advancing *i): 1 when consumed, 0 when
 * argv[*i] is another option, -1 (message printed) on a bad value. */
int mts_cli_precision_arg(const char *cmd, int argc, char **argv, int *i);

#endif
