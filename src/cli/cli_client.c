/*
 * `mtserve infer` and `mtserve models list|load|unload|stats`: a client for a running mtserve
 * (or any KServe v2 server) over HTTP (--url http://HOST:PORT, the binary tensor extension) or
 * gRPC (--grpc HOST:PORT: GRPCInferenceService for inference, the lip-sync InferenceService's
 * ListModels/LoadModel/UnloadModel/GetModelStats for management). Inputs come from .npy files
 * or are generated from the model's metadata (uniform [0,1) floats, zero integers); outputs are
 * summarised and optionally saved as .npy.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api/protocol.h"
#include "cli/cli.h"
#include "cli/cli_grpc.h"
#include "inference_kserve.pb-c.h"
#include "lipsync.pb-c.h"
#include "util/json.h"
#include "util/npy.h"
#include "util/clock.h"

typedef struct target {
    const char *grpc;   /* host:port */
    char host[256];     /* HTTP */
    char port[16];
    double timeout_s;
} target;

static int parse_url(target *t, const char *url)
{
    if (strncmp(url, "http://", 7)) {
        fprintf(stderr, "mtserve: --url must be http://HOST:PORT (got '%s')\n", url);
        return -1;
    }
    const char *h = url + 7, *colon = strchr(h, ':'), *slash = strchr(h, '/');
    if (!colon || (slash && slash < colon)) {
        snprintf(t->host, sizeof t->host, "%.*s", (int)(slash ? slash - h : (long)strlen(h)), h);
        snprintf(t->port, sizeof t->port, "80");
    } else {
        snprintf(t->host, sizeof t->host, "%.*s", (int)(colon - h), h);
        snprintf(t->port, sizeof t->port, "%.*s", (int)(slash ? slash - colon - 1 : (long)strlen(colon + 1)), colon + 1);
    }
    return 0;
}

/* ---- a minimal blocking HTTP/1.1 client (one request per connection) ---- */

typedef struct http_reply {
    int status;
    char *buf;      /* whole response */
    char *body;
    size_t body_len;
    long header_len; /* Inference-Header-Content-Length, -1 if absent */
} http_reply;

static int http_call(const target *t, const char *method, const char *path, const char *extra_headers,
                     const void *body, size_t body_len, const void *body2, size_t body2_len, http_reply *r)
{
    memset(r, 0, sizeof *r);
    r->header_len = -1;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(t->host, t->port, &hints, &ai)) {
        fprintf(stderr, "mtserve: cannot resolve %s\n", t->host);
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        fprintf(stderr, "mtserve: cannot connect to http://%s:%s\n", t->host, t->port);
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    char head[2048];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\nContent-Length: %zu\r\n%s%s\r\n", method,
                      path, t->host, t->port, body_len + body2_len, mts_cli_auth_header(),
                      extra_headers ? extra_headers : "");
    if (hn < 0 || (size_t)hn >= sizeof head) {
        close(fd);
        fprintf(stderr, "mtserve: request head too long\n");
        return -1;
    }
    const void *parts[3] = {head, body, body2};
    size_t lens[3] = {(size_t)hn, body_len, body2_len};
    for (int p = 0; p < 3; p++)
        for (size_t off = 0; off < lens[p];) {
            ssize_t w = write(fd, (const char *)parts[p] + off, lens[p] - off);
            if (w <= 0) {
                close(fd);
                fprintf(stderr, "mtserve: write to the server failed\n");
                return -1;
            }
            off += (size_t)w;
        }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (len == cap) buf = realloc(buf, (cap *= 2) + 1);
        ssize_t n = read(fd, buf + len, cap - len);
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = 0;
    char *end = strstr(buf, "\r\n\r\n");
    if (!end || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
        fprintf(stderr, "mtserve: malformed HTTP reply\n");
        free(buf);
        return -1;
    }
    *end = 0;
    for (char *line = strstr(buf, "\r\n"); line; line = strstr(line + 2, "\r\n"))
        if (!strncasecmp(line + 2, "Inference-Header-Content-Length:", 32)) r->header_len = atol(line + 34);
    r->buf = buf;
    r->body = end + 4;
    r->body_len = len - (size_t)(r->body - buf);
    return 0;
}

/* The server's error message of a failed HTTP reply ("error" member), for printing. */
static void http_fail(const char *what, const http_reply *r)
{
    mts_json_doc *doc = NULL;
    mts_err err = {0};
    const char *msg = NULL;
    if (!mts_json_parse(r->body, r->body_len, &doc, &err)) msg = mts_json_str(mts_json_get(mts_json_root(doc), "error"), NULL);
    fprintf(stderr, "mtserve: %s: HTTP %d: %s\n", what, r->status, msg ? msg : "(no message)");
    mts_json_free(doc);
}

/* ---- inputs ---- */

typedef struct io_set {
    int n;
    char name[MTS_REQ_MAX_TENSORS][128];
    mts_tensor t[MTS_REQ_MAX_TENSORS];
} io_set;

static void io_free(io_set *s)
{
    for (int i = 0; i < s->n; i++) free(s->t[i].data);
    s->n = 0;
}

static void fill_random(mts_tensor *t)
{
    int64_t n = mts_tensor_numel(t);
    t->data = calloc(1, (size_t)(mts_tensor_nbytes(t) > 0 ? mts_tensor_nbytes(t) : 1));
    if (t->dtype == MTS_DTYPE_FLOAT)
        for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = (float)rand() / (float)RAND_MAX;
}

/* Metadata over gRPC or HTTP: fills names/dtypes/shapes (variable dims: batch first, else 1). */
static int random_inputs(const target *t, const char *model, int64_t batch, io_set *s)
{
    if (t->grpc) {
        Inference__ModelMetadataRequest req = INFERENCE__MODEL_METADATA_REQUEST__INIT;
        req.name = (char *)model;
        ProtobufCMessage *resp = NULL;
        char err[512];
        int code = mts_cli_grpc_unary(t->grpc, "/inference.GRPCInferenceService/ModelMetadata", model, &req.base,
                                      &inference__model_metadata_response__descriptor, &resp, t->timeout_s, err, sizeof err);
        if (code) {
            fprintf(stderr, "mtserve: metadata of '%s': %s: %s\n", model, mts_cli_grpc_code_name(code), err);
            return -1;
        }
        Inference__ModelMetadataResponse *md = (Inference__ModelMetadataResponse *)resp;
        for (size_t i = 0; i < md->n_inputs && s->n < MTS_REQ_MAX_TENSORS; i++) {
            mts_tensor *x = &s->t[s->n];
            memset(x, 0, sizeof *x);
            if (mts_kserve_parse_datatype(md->inputs[i]->datatype, &x->dtype)) x->dtype = MTS_DTYPE_FLOAT;
            x->rank = (int)(md->inputs[i]->n_shape > MTS_MAX_RANK ? MTS_MAX_RANK : md->inputs[i]->n_shape);
            for (int d = 0; d < x->rank; d++) x->dims[d] = md->inputs[i]->shape[d] >= 0 ? md->inputs[i]->shape[d] : d == 0 ? batch : 1;
            snprintf(s->name[s->n], sizeof s->name[0], "%s", md->inputs[i]->name);
            fill_random(x);
            s->n++;
        }
        protobuf_c_message_free_unpacked(resp, NULL);
        return 0;
    }
    char path[512];
    snprintf(path, sizeof path, "/v2/models/%s", model);
    http_reply r;
    if (http_call(t, "GET", path, NULL, NULL, 0, NULL, 0, &r)) return -1;
    if (r.status != 200) {
        http_fail("model metadata", &r);
        free(r.buf);
        return -1;
    }
    mts_json_doc *doc = NULL;
    mts_err err = {0};
    if (mts_json_parse(r.body, r.body_len, &doc, &err)) {
        fprintf(stderr, "mtserve: metadata is not JSON: %s\n", err.msg);
        free(r.buf);
        return -1;
    }
    const mts_json *ins = mts_json_get(mts_json_root(doc), "inputs");
    for (size_t i = 0; i < mts_json_len(ins) && s->n < MTS_REQ_MAX_TENSORS; i++) {
        const mts_json *in = mts_json_at(ins, i), *shape = mts_json_get(in, "shape");
        mts_tensor *x = &s->t[s->n];
        memset(x, 0, sizeof *x);
        const char *dt = mts_json_str(mts_json_get(in, "datatype"), NULL);
        if (!dt || mts_kserve_parse_datatype(dt, &x->dtype)) x->dtype = MTS_DTYPE_FLOAT;
        x->rank = (int)(mts_json_len(shape) > MTS_MAX_RANK ? MTS_MAX_RANK : mts_json_len(shape));
        for (int d = 0; d < x->rank; d++) {
            int64_t v = -1;
            mts_json_int(mts_json_at(shape, (size_t)d), &v);
            x->dims[d] = v >= 0 ? v : d == 0 ? batch : 1;
        }
        const char *name = mts_json_str(mts_json_get(in, "name"), NULL);
        snprintf(s->name[s->n], sizeof s->name[0], "%s", name ? name : "");
        fill_random(x);
        s->n++;
    }
    mts_json_free(doc);
    free(r.buf);
    return 0;
}

/* ---- inference ---- */

static int infer_grpc(const target *t, const char *model, const io_set *in, io_set *out, double *ms)
{
    Inference__ModelInferRequest req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor tensors[MTS_REQ_MAX_TENSORS], *tp[MTS_REQ_MAX_TENSORS];
    ProtobufCBinaryData raw[MTS_REQ_MAX_TENSORS];
    req.model_name = (char *)model;
    for (int i = 0; i < in->n; i++) {
        Inference__ModelInferRequest__InferInputTensor init = INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
        tensors[i] = init;
        tensors[i].name = (char *)in->name[i];
        tensors[i].datatype = (char *)mts_kserve_datatype(in->t[i].dtype);
        tensors[i].n_shape = (size_t)in->t[i].rank;
        tensors[i].shape = (int64_t *)in->t[i].dims;
        tp[i] = &tensors[i];
        raw[i].data = in->t[i].data;
        raw[i].len = (size_t)mts_tensor_nbytes(&in->t[i]);
    }
    req.n_inputs = req.n_raw_input_contents = (size_t)in->n;
    req.inputs = tp;
    req.raw_input_contents = raw;
    ProtobufCMessage *resp = NULL;
    char err[1024];
    double t0 = mts_now_ms();
    int code = mts_cli_grpc_unary(t->grpc, "/inference.GRPCInferenceService/ModelInfer", model, &req.base,
                                  &inference__model_infer_response__descriptor, &resp, t->timeout_s, err, sizeof err);
    *ms = mts_now_ms() - t0;
    if (code) {
        fprintf(stderr, "mtserve: infer '%s': %s: %s\n", model, mts_cli_grpc_code_name(code), err);
        return 1;
    }
    Inference__ModelInferResponse *r = (Inference__ModelInferResponse *)resp;
    for (size_t o = 0; o < r->n_outputs && o < r->n_raw_output_contents && out->n < MTS_REQ_MAX_TENSORS; o++) {
        mts_tensor *x = &out->t[out->n];
        memset(x, 0, sizeof *x);
        if (mts_kserve_parse_datatype(r->outputs[o]->datatype, &x->dtype)) x->dtype = MTS_DTYPE_FLOAT;
        x->rank = (int)(r->outputs[o]->n_shape > MTS_MAX_RANK ? MTS_MAX_RANK : r->outputs[o]->n_shape);
        for (int d = 0; d < x->rank; d++) x->dims[d] = r->outputs[o]->shape[d];
        x->data = malloc(r->raw_output_contents[o].len + 1);
        memcpy(x->data, r->raw_output_contents[o].data, r->raw_output_contents[o].len);
        snprintf(out->name[out->n], sizeof out->name[0], "%s", r->outputs[o]->name);
        out->n++;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

static int infer_http(const target *t, const char *model, const io_set *in, io_set *out, double *ms)
{
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "parameters");
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "binary_data_output");
    mts_jw_bool(&w, true);
    mts_jw_end_object(&w);
    mts_jw_key(&w, "inputs");
    mts_jw_begin_array(&w);
    size_t bin = 0;
    for (int i = 0; i < in->n; i++) {
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "name");
        mts_jw_string(&w, in->name[i]);
        mts_jw_key(&w, "datatype");
        mts_jw_string(&w, mts_kserve_datatype(in->t[i].dtype));
        mts_jw_key(&w, "shape");
        mts_jw_begin_array(&w);
        for (int d = 0; d < in->t[i].rank; d++) mts_jw_int(&w, in->t[i].dims[d]);
        mts_jw_end_array(&w);
        mts_jw_key(&w, "parameters");
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "binary_data_size");
        mts_jw_int(&w, mts_tensor_nbytes(&in->t[i]));
        mts_jw_end_object(&w);
        mts_jw_end_object(&w);
        bin += (size_t)mts_tensor_nbytes(&in->t[i]);
    }
    mts_jw_end_array(&w);
    mts_jw_end_object(&w);
    size_t jlen = 0;
    char *json = mts_jw_take(&w, &jlen);
    mts_jw_free(&w);
    char *body = malloc(bin + 1), *p = body;
    for (int i = 0; i < in->n; i++) {
        size_t nb = (size_t)mts_tensor_nbytes(&in->t[i]);
        memcpy(p, in->t[i].data, nb);
        p += nb;
    }
    char path[512], hdr[128];
    snprintf(path, sizeof path, "/v2/models/%s/infer", model);
    snprintf(hdr, sizeof hdr, "Inference-Header-Content-Length: %zu\r\nContent-Type: application/octet-stream\r\n", jlen);
    http_reply r;
    double t0 = mts_now_ms();
    int rc = http_call(t, "POST", path, hdr, json, jlen, body, bin, &r);
    *ms = mts_now_ms() - t0;
    free(json);
    free(body);
    if (rc) return 1;
    if (r.status != 200) {
        http_fail("infer", &r);
        free(r.buf);
        return 1;
    }
    size_t hl = r.header_len >= 0 ? (size_t)r.header_len : r.body_len;
    mts_json_doc *doc = NULL;
    mts_err err = {0};
    if (hl > r.body_len || mts_json_parse(r.body, hl, &doc, &err)) {
        fprintf(stderr, "mtserve: malformed inference reply\n");
        free(r.buf);
        return 1;
    }
    const mts_json *outs = mts_json_get(mts_json_root(doc), "outputs");
    size_t off = hl;
    for (size_t o = 0; o < mts_json_len(outs) && out->n < MTS_REQ_MAX_TENSORS; o++) {
        const mts_json *j = mts_json_at(outs, o), *shape = mts_json_get(j, "shape");
        mts_tensor *x = &out->t[out->n];
        memset(x, 0, sizeof *x);
        const char *dt = mts_json_str(mts_json_get(j, "datatype"), NULL);
        if (!dt || mts_kserve_parse_datatype(dt, &x->dtype)) x->dtype = MTS_DTYPE_FLOAT;
        x->rank = (int)(mts_json_len(shape) > MTS_MAX_RANK ? MTS_MAX_RANK : mts_json_len(shape));
        for (int d = 0; d < x->rank; d++) mts_json_int(mts_json_at(shape, (size_t)d), &x->dims[d]);
        int64_t nb = mts_tensor_nbytes(x), size = -1;
        mts_json_int(mts_json_get(mts_json_get(j, "parameters"), "binary_data_size"), &size);
        x->data = calloc(1, (size_t)(nb > 0 ? nb : 1));
        if (size >= 0 && size == nb && off + (size_t)size <= r.body_len) {
            memcpy(x->data, r.body + off, (size_t)size);
            off += (size_t)size;
        } else if (mts_json_get(j, "data")) {
            mts_json_flatten(mts_json_get(j, "data"), x->dtype, x->data, mts_tensor_numel(x), &err);
        }
        const char *name = mts_json_str(mts_json_get(j, "name"), NULL);
        snprintf(out->name[out->n], sizeof out->name[0], "%s", name ? name : "");
        out->n++;
    }
    mts_json_free(doc);
    free(r.buf);
    return 0;
}

static void usage_target(FILE *f)
{
    fprintf(f, "  --url http://HOST:PORT   KServe v2 HTTP front end (default http://127.0.0.1:8000)\n"
               "  --grpc HOST:PORT         gRPC front end instead\n"
               "  --timeout S              per call (default 60)\n");
}

/* Parses --url/--grpc/--timeout at argv[*i]; returns 1 if consumed, -1 on error. */
static int target_opt(target *t, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    bool has = *i + 1 < argc;
    if (!strcmp(a, "--url") && has) return parse_url(t, argv[++*i]) ? -1 : 1;
    if (!strcmp(a, "--grpc") && has) {
        t->grpc = argv[++*i];
        return 1;
    }
    if (!strcmp(a, "--timeout") && has) {
        t->timeout_s = atof(argv[++*i]);
        return 1;
    }
    return 0;
}

int mts_cli_infer(int argc, char **argv)
{
    target t = {.timeout_s = 60};
    parse_url(&t, "http://127.0.0.1:8000");
    const char *model = NULL, *save = NULL;
    const char *npy[MTS_REQ_MAX_TENSORS];
    int n_npy = 0, repeat = 1;
    int64_t batch = 1;
    for (int i = 1; i < argc; i++) {
        int r = target_opt(&t, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--input") && has && n_npy < MTS_REQ_MAX_TENSORS) npy[n_npy++] = argv[++i];
        else if (!strcmp(a, "--batch") && has) batch = atoll(argv[++i]);
        else if (!strcmp(a, "--repeat") && has) repeat = atoi(argv[++i]);
        else if (!strcmp(a, "--save") && has) save = argv[++i];
        else if (!strcmp(a, "--help")) {
            printf("usage: mtserve infer MODEL [--input NAME=FILE.npy]... [--batch N] [--repeat N] [--save DIR]\n");
            usage_target(stdout);
            printf("  Without --input, inputs are generated from the model's metadata (batch N, random floats).\n");
            return 0;
        } else if (a[0] != '-' && !model) model = a;
        else {
            fprintf(stderr, "mtserve infer: unknown option or missing value '%s'\n", a);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "mtserve infer: give a MODEL\n");
        return 2;
    }
    io_set in = {0};
    for (int k = 0; k < n_npy; k++) {
        const char *eq = strchr(npy[k], '=');
        if (!eq) {
            fprintf(stderr, "mtserve infer: --input wants NAME=FILE.npy (got '%s')\n", npy[k]);
            return 2;
        }
        mts_err err = {0};
        if (mts_npy_read(eq + 1, &in.t[in.n], &err)) {
            fprintf(stderr, "mtserve infer: %s\n", err.msg);
            io_free(&in);
            return 1;
        }
        snprintf(in.name[in.n], sizeof in.name[0], "%.*s", (int)(eq - npy[k]), npy[k]);
        in.n++;
    }
    if (n_npy == 0 && random_inputs(&t, model, batch, &in)) return 1;
    int rc = 0;
    for (int rep = 0; rep < repeat && !rc; rep++) {
        io_set out = {0};
        double ms = 0;
        rc = t.grpc ? infer_grpc(&t, model, &in, &out, &ms) : infer_http(&t, model, &in, &out, &ms);
        if (rc) break;
        printf("%s: %.2f ms over %s\n", model, ms, t.grpc ? "gRPC" : "HTTP");
        for (int o = 0; o < out.n; o++) {
            char shp[128];
            mts_tensor *x = &out.t[o];
            printf("  %-16s %-6s %s", out.name[o], mts_kserve_datatype(x->dtype), mts_shape_str(x, shp, sizeof shp));
            if (x->dtype == MTS_DTYPE_FLOAT && mts_tensor_numel(x) > 0) {
                const float *f = x->data;
                double lo = f[0], hi = f[0], sum = 0;
                for (int64_t e = 0; e < mts_tensor_numel(x); e++) {
                    lo = f[e] < lo ? f[e] : lo;
                    hi = f[e] > hi ? f[e] : hi;
                    sum += f[e];
                }
                printf("  min %.6g max %.6g mean %.6g", lo, hi, sum / (double)mts_tensor_numel(x));
            }
            printf("\n");
            if (save && rep == repeat - 1) {
                char path[1024];
                mts_err err = {0};
                snprintf(path, sizeof path, "%s/%s.npy", save, out.name[o]);
                if (mts_npy_write(path, x, &err)) fprintf(stderr, "mtserve infer: %s\n", err.msg);
            }
        }
        io_free(&out);
    }
    io_free(&in);
    return rc;
}

/* ---- models ---- */

static void print_row_header(void)
{
    printf("%-24s %-9s %6s %10s %10s %12s\n", "MODEL", "STATE", "DEVICE", "MEMORY_MB", "REQUESTS", "INFER_MS");
}

static int models_grpc(const target *t, const char *verb, const char *name, bool force)
{
    ProtobufCMessage *resp = NULL;
    char err[1024];
    int code;
    if (!strcmp(verb, "load")) {
        Inference__LoadModelRequest req = INFERENCE__LOAD_MODEL_REQUEST__INIT;
        req.model_id = (char *)name;
        req.force_reload = force;
        code = mts_cli_grpc_unary(t->grpc, "/inference.InferenceService/LoadModel", name, &req.base,
                                  &inference__load_model_response__descriptor, &resp, t->timeout_s, err, sizeof err);
        if (!code) {
            Inference__LoadModelResponse *r = (Inference__LoadModelResponse *)resp;
            printf("%s (%.1f ms)\n", r->message, r->load_time_ms);
        }
    } else if (!strcmp(verb, "unload")) {
        Inference__UnloadModelRequest req = INFERENCE__UNLOAD_MODEL_REQUEST__INIT;
        req.model_id = (char *)name;
        code = mts_cli_grpc_unary(t->grpc, "/inference.InferenceService/UnloadModel", name, &req.base,
                                  &inference__unload_model_response__descriptor, &resp, t->timeout_s, err, sizeof err);
        if (!code) printf("%s\n", ((Inference__UnloadModelResponse *)resp)->message);
    } else {
        Inference__GetModelStatsRequest req = INFERENCE__GET_MODEL_STATS_REQUEST__INIT;
        req.model_id = (char *)(name ? name : "");
        code = mts_cli_grpc_unary(t->grpc, "/inference.InferenceService/GetModelStats", name, &req.base,
                                  &inference__get_model_stats_response__descriptor, &resp, t->timeout_s, err, sizeof err);
        if (!code) {
            Inference__GetModelStatsResponse *r = (Inference__GetModelStatsResponse *)resp;
            print_row_header();
            for (size_t i = 0; i < r->n_models; i++) {
                Inference__ModelInfo *m = r->models[i];
                printf("%-24s %-9s %6d %10.1f %10lld %12.1f\n", m->model_id, m->state, m->gpu_id,
                       m->stats ? m->stats->memory_bytes / 1048576.0 : 0, m->stats ? (long long)m->stats->usage_count : 0,
                       m->stats ? m->stats->total_inference_time_ms : 0);
            }
            if (!strcmp(verb, "stats")) {
                for (size_t d = 0; d < r->n_devices; d++)
                    printf("device %d (%s): %d models, %.1f / %.1f MB, %d/%d workers busy, queue %d\n",
                           r->devices[d]->gpu_id, r->devices[d]->kind, r->devices[d]->models,
                           r->devices[d]->memory_used_bytes / 1048576.0, r->devices[d]->memory_total_bytes / 1048576.0,
                           r->devices[d]->busy_workers, r->devices[d]->workers, r->devices[d]->queue_depth);
                if (r->totals)
                    printf("server: %llu submitted, %llu completed, %llu failed, %llu rejected, %llu timed out, "
                           "%llu cancelled, uptime %.0f s\n",
                           (unsigned long long)r->totals->requests_submitted,
                           (unsigned long long)r->totals->requests_completed,
                           (unsigned long long)r->totals->requests_failed,
                           (unsigned long long)r->totals->rejected_queue_full, (unsigned long long)r->totals->timed_out,
                           (unsigned long long)r->totals->cancelled, r->totals->uptime_s);
            }
        }
    }
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    if (code) fprintf(stderr, "mtserve models %s: %s: %s\n", verb, mts_cli_grpc_code_name(code), err);
    return code ? 1 : 0;
}

static int models_http(const target *t, const char *verb, const char *name, bool force)
{
    char path[512];
    http_reply r;
    if (!strcmp(verb, "load") || !strcmp(verb, "unload")) {
        snprintf(path, sizeof path, "/v2/repository/models/%s/%s", name, verb);
        const char *body = force ? "{\"parameters\":{\"force_reload\":true}}" : "";
        if (http_call(t, "POST", path, "Content-Type: application/json\r\n", body, strlen(body), NULL, 0, &r)) return 1;
        if (r.status != 200) {
            http_fail(verb, &r);
            free(r.buf);
            return 1;
        }
        printf("model '%s' %s\n", name, !strcmp(verb, "load") ? (force ? "reloaded" : "loaded") : "unloaded");
        free(r.buf);
        return 0;
    }
    if (name) snprintf(path, sizeof path, "/v2/models/%s/stats", name);
    else snprintf(path, sizeof path, "/v2/models/stats");
    if (http_call(t, "GET", path, NULL, NULL, 0, NULL, 0, &r)) return 1;
    if (r.status != 200) {
        http_fail(verb, &r);
        free(r.buf);
        return 1;
    }
    mts_json_doc *doc = NULL;
    mts_err err = {0};
    if (mts_json_parse(r.body, r.body_len, &doc, &err)) {
        fprintf(stderr, "mtserve: statistics reply is not JSON: %s\n", err.msg);
        free(r.buf);
        return 1;
    }
    const mts_json *root = mts_json_root(doc), *ms = mts_json_get(root, "model_stats");
    print_row_header();
    for (size_t i = 0; i < mts_json_len(ms); i++) {
        const mts_json *m = mts_json_at(ms, i), *mu = mts_json_at(mts_json_get(m, "memory_usage"), 0);
        int64_t dev = -1;
        if (mu) mts_json_int(mts_json_get(mu, "id"), &dev);
        const char *nm = mts_json_str(mts_json_get(m, "name"), NULL), *st = mts_json_str(mts_json_get(m, "state"), NULL);
        printf("%-24s %-9s %6lld %10.1f %10.0f %12.1f\n", nm ? nm : "?", st ? st : "?", (long long)dev,
               mts_json_num(mts_json_get(m, "MemoryBytes")) / 1048576.0, mts_json_num(mts_json_get(m, "UsageCount")),
               mts_json_num(mts_json_get(m, "TotalInferenceMs")));
    }
    const mts_json *srv = mts_json_get(root, "server");
    if (!strcmp(verb, "stats") && srv)
        printf("server: %.0f submitted, %.0f completed, %.0f failed, %.0f rejected, %.0f timed out, %.0f cancelled, "
               "uptime %.0f s\n",
               mts_json_num(mts_json_get(srv, "submitted")), mts_json_num(mts_json_get(srv, "completed")),
               mts_json_num(mts_json_get(srv, "failed")), mts_json_num(mts_json_get(srv, "rejected_queue_full")),
               mts_json_num(mts_json_get(srv, "timed_out")), mts_json_num(mts_json_get(srv, "cancelled")),
               mts_json_num(mts_json_get(srv, "uptime_s")));
    mts_json_free(doc);
    free(r.buf);
    return 0;
}

int mts_cli_models(int argc, char **argv)
{
    target t = {.timeout_s = 60};
    parse_url(&t, "http://127.0.0.1:8000");
    const char *verb = NULL, *name = NULL;
    bool force = false;
    for (int i = 1; i < argc; i++) {
        int r = target_opt(&t, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--force")) force = true;
        else if (!strcmp(a, "--help")) {
            printf("usage: mtserve models list | load NAME [--force] | unload NAME | stats [NAME]\n");
            usage_target(stdout);
            return 0;
        } else if (a[0] != '-' && !verb) verb = a;
        else if (a[0] != '-' && !name) name = a;
        else {
            fprintf(stderr, "mtserve models: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!verb || (strcmp(verb, "list") && strcmp(verb, "load") && strcmp(verb, "unload") && strcmp(verb, "stats"))) {
        fprintf(stderr, "mtserve models: give list, load NAME, unload NAME or stats [NAME]\n");
        return 2;
    }
    if ((!strcmp(verb, "load") || !strcmp(verb, "unload")) && !name) {
        fprintf(stderr, "mtserve models %s: give a model NAME\n", verb);
        return 2;
    }
    if (!strcmp(verb, "list")) name = NULL;
    return t.grpc ? models_grpc(&t, verb, name, force) : models_http(&t, verb, name, force);
}
