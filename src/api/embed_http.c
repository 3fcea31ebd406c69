/*
 * POST /v1/embeddings (embed_http.h): the I/O thread parses and checks the JSON body and hands
 * the texts to the shared embedding path (embed_common.h), which tokenizes them before it
 * returns; the answer is encoded on the thread that completes the last part and written by the
 * I/O thread, which frees it. A client that goes away stops the parts not yet submitted.
 */
#include "api/embed_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/embed_common.h"
#include "api/protocol.h"
#include "text/embed.h"
#include "util/json.h"

#define MAX_TOTAL_IDS (1 << 20) /* token ids in one request (8 MiB as int64) */

typedef struct emb_call {
    mts_request cancel; /* first: the front end's on_cancel marks it through hr->user (never submitted) */
    mts_http_conn *conn;
    char model[256];
    bool b64;
    int64_t dims_wanted; /* 0: any */
    char *answer;
    size_t answer_len;
    /* KServe BYTES requests */
    bool kserve, binary_out;
    char *id;
    char out_name[MTS_TENSOR_NAME_MAX];
    int version;
    float *vecs; /* the binary section of a binary answer */
} emb_call;

static void response_sent(void *arg)
{
    emb_call *ec = arg;
    free(ec->answer);
    free(ec->id);
    free(ec->vecs);
    free(ec);
}

/* Base64 of n bytes into out (4 * ceil(n / 3) characters, no NUL). */
static void kserve_done(emb_call *ec, float *vecs, int n, int64_t dim)
{
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    if (ec->id) {
        mts_jw_key(&w, "id");
        mts_jw_string(&w, ec->id);
    }
    mts_jw_key(&w, "model_name");
    mts_jw_string(&w, ec->model);
    mts_jw_key(&w, "model_version");
    char ver[16];
    snprintf(ver, sizeof ver, "%d", ec->version);
    mts_jw_string(&w, ver);
    mts_jw_key(&w, "outputs");
    mts_jw_begin_array(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "name");
    mts_jw_string(&w, ec->out_name);
    mts_jw_key(&w, "datatype");
    mts_jw_string(&w, "FP32");
    mts_jw_key(&w, "shape");
    mts_jw_begin_array(&w);
    mts_jw_int(&w, n);
    mts_jw_int(&w, dim);
    mts_jw_end_array(&w);
    size_t nbytes = sizeof(float) * (size_t)n * (size_t)dim;
    if (ec->binary_out) {
        mts_jw_key(&w, "parameters");
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "binary_data_size");
        mts_jw_int(&w, (int64_t)nbytes);
        mts_jw_end_object(&w);
    } else {
        mts_jw_key(&w, "data");
        mts_jw_tensor_data(&w, MTS_DTYPE_FLOAT, vecs, (int64_t)n * dim);
    }
    mts_jw_end_object(&w);
    mts_jw_end_array(&w);
    mts_jw_end_object(&w);
    ec->answer = mts_jw_take(&w, &ec->answer_len);
    mts_jw_free(&w);
    if (!ec->answer) {
        free(vecs);
        mts_route_fail(ec->conn, &ec->answer, response_sent, ec, MTS_ENOMEM, "out of memory encoding the answer");
        return;
    }
    if (!ec->binary_out) {
        free(vecs);
        struct iovec iov = {ec->answer, ec->answer_len};
        mts_http_respondv(ec->conn, 200, "application/json", NULL, &iov, 1, response_sent, ec);
        return;
    }
    ec->vecs = vecs; /* float32 in host order: little-endian on every platform mtserve builds for */
    char extra[96];
    snprintf(extra, sizeof extra, "Inference-Header-Content-Length: %zu\r\n", ec->answer_len);
    struct iovec iov[2] = {{ec->answer, ec->answer_len}, {ec->vecs, nbytes}};
    mts_http_respondv(ec->conn, 200, "application/octet-stream", extra, iov, 2, response_sent, ec);
}

static void embed_done(void *user, int status, const char *msg, float *vecs, int n, int64_t dim, int64_t tokens)
{
    emb_call *ec = user;
    if (!status && ec->kserve) {
        kserve_done(ec, vecs, n, dim);
        return;
    }
    if (status) {
        mts_route_fail(ec->conn, &ec->answer, response_sent, ec, status, "%s", msg);
        return;
    }
    if (ec->dims_wanted && ec->dims_wanted != dim) {
        free(vecs);
        mts_route_fail(ec->conn, &ec->answer, response_sent, ec, MTS_EINVAL,
                       "dimensions %lld: model '%s' gives vectors of %lld floats (set no dimensions or this one)",
                       (long long)ec->dims_wanted, ec->model, (long long)dim);
        return;
    }
    ec->answer = mts_embed_openai_json(ec->model, vecs, n, dim, tokens, ec->b64, &ec->answer_len);
    free(vecs);
    if (!ec->answer) {
        mts_route_fail(ec->conn, &ec->answer, response_sent, ec, MTS_ENOMEM, "out of memory encoding the answer");
        return;
    }
    struct iovec iov = {ec->answer, ec->answer_len};
    mts_http_respondv(ec->conn, 200, "application/json", NULL, &iov, 1, response_sent, ec);
}

/* Reads one token-id array into ids (n elements). NULL problem when fine. */
static const char *read_ids(const mts_json *a, int64_t *ids, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        int64_t v;
        if (mts_json_int(mts_json_at(a, j), &v) || v < 0) return "token ids must be non-negative integers";
        ids[j] = v;
    }
    return NULL;
}

static void route_embeddings(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    (void)a;
    mts_json_doc *doc = NULL;
    mts_err err = {0};
    if (mts_json_parse(hr->body, hr->body_len, &doc, &err)) {
        mts_route_error(c, err.code == MTS_ENOMEM ? MTS_ENOMEM : MTS_EINVAL, "malformed JSON body: %s", err.msg);
        return;
    }
    const mts_json *root = mts_json_root(doc);
    const mts_json *jm = mts_json_get(root, "model"), *ji = mts_json_get(root, "input");
    const mts_json *jf = mts_json_get(root, "encoding_format"), *jd = mts_json_get(root, "dimensions");
    const char *model = mts_json_str(jm, NULL), *fmt = jf ? mts_json_str(jf, NULL) : "float";
    char problem[256] = "";
    int64_t dims = 0;
    if (mts_json_type(root) != MTS_JSON_OBJECT) snprintf(problem, sizeof problem, "the body must be a JSON object");
    else if (!model || !model[0]) snprintf(problem, sizeof problem, "'model' must be a non-empty string");
    else if (!fmt || (strcmp(fmt, "float") && strcmp(fmt, "base64")))
        snprintf(problem, sizeof problem, "'encoding_format' must be \"float\" or \"base64\"");
    else if (jd && mts_json_type(jd) != MTS_JSON_NULL && (mts_json_int(jd, &dims) || dims < 1))
        snprintf(problem, sizeof problem, "'dimensions' must be a positive integer");
    else if (!ji) snprintf(problem, sizeof problem, "'input' is missing (a string or an array of strings)");
    if (problem[0]) {
        mts_json_free(doc);
        mts_route_error(c, MTS_EINVAL, "%s", problem);
        return;
    }
    /* the inputs: one string, strings, one token-id array, or token-id arrays */
    mts_json_type it = mts_json_type(ji);
    size_t n = it == MTS_JSON_STRING ? 1 : it == MTS_JSON_ARRAY ? mts_json_len(ji) : 0;
    bool one_ids = it == MTS_JSON_ARRAY && n > 0 && mts_json_type(mts_json_at(ji, 0)) == MTS_JSON_NUMBER;
    if (one_ids) n = 1;
    if (it != MTS_JSON_STRING && it != MTS_JSON_ARRAY)
        snprintf(problem, sizeof problem, "'input' must be a string or an array of strings (it is %s)",
                 mts_json_type_name(it));
    else if (n == 0) snprintf(problem, sizeof problem, "'input' is empty");
    else if (n > MTS_EMBED_MAX_TEXTS)
        snprintf(problem, sizeof problem, "'input' has %zu items; at most %d per request", n, MTS_EMBED_MAX_TEXTS);
    mts_embed_input *in = problem[0] ? NULL : calloc(n, sizeof *in);
    int64_t *ids = NULL;
    if (!problem[0] && !in) snprintf(problem, sizeof problem, "out of memory");
    size_t total_ids = 0;
    for (size_t i = 0; !problem[0] && i < n; i++) {
        const mts_json *x = one_ids ? ji : it == MTS_JSON_STRING ? ji : mts_json_at(ji, i);
        mts_json_type xt = mts_json_type(x);
        if (xt == MTS_JSON_STRING) {
            in[i].text = mts_json_str(x, &in[i].len);
            if (in[i].len == 0) snprintf(problem, sizeof problem, "'input' item %zu is an empty string", i);
        } else if (xt == MTS_JSON_ARRAY && !one_ids && mts_json_len(x) > 0 &&
                   mts_json_type(mts_json_at(x, 0)) == MTS_JSON_NUMBER) {
            total_ids += mts_json_len(x);
        } else if (one_ids && xt == MTS_JSON_ARRAY) {
            total_ids += mts_json_len(x);
        } else {
            snprintf(problem, sizeof problem, "'input' item %zu is %s; items must be strings (or arrays of token ids)",
                     i, xt == MTS_JSON_ARRAY ? "an empty array" : mts_json_type_name(xt));
        }
    }
    if (!problem[0] && total_ids > MAX_TOTAL_IDS)
        snprintf(problem, sizeof problem, "%zu token ids in one request; at most %d", total_ids, MAX_TOTAL_IDS);
    if (!problem[0] && total_ids && !(ids = malloc(sizeof(int64_t) * total_ids)))
        snprintf(problem, sizeof problem, "out of memory");
    size_t off = 0;
    for (size_t i = 0; !problem[0] && total_ids && i < n; i++) {
        const mts_json *x = one_ids ? ji : mts_json_at(ji, i);
        if (mts_json_type(x) != MTS_JSON_ARRAY) continue;
        size_t k = mts_json_len(x);
        const char *p = read_ids(x, ids + off, k);
        if (p) snprintf(problem, sizeof problem, "'input' item %zu: %s", i, p);
        in[i].ids = ids + off;
        in[i].n_ids = (int)(k > 65536 ? 65536 + 1 : k);
        off += k;
    }
    if (problem[0]) {
        free(in);
        free(ids);
        mts_json_free(doc);
        mts_route_error(c, MTS_EINVAL, "%s", problem);
        return;
    }
    emb_call *ec = calloc(1, sizeof *ec);
    if (!ec) {
        free(in);
        free(ids);
        mts_json_free(doc);
        mts_route_error(c, MTS_ENOMEM, "out of memory");
        return;
    }
    ec->conn = c;
    snprintf(ec->model, sizeof ec->model, "%s", model);
    ec->b64 = !strcmp(fmt, "base64");
    ec->dims_wanted = dims;
    char msg[MTS_ERR_MSG_MAX];
    hr->user = ec; /* before submitting: the answer may go out (and ec be freed) inside it */
    int rc = mts_embed_submit(srv, ec->model, in, (int)n, mts_server_clock_ns(), &ec->cancel, embed_done, ec, msg,
                              sizeof msg);
    free(in);
    free(ids);
    mts_json_free(doc);
    if (rc) {
        hr->user = NULL;
        free(ec);
        mts_route_error(c, rc, "%s", msg);
    }
}

/* The texts of a JSON "data" array of strings (flat, or one string per row). */
static int json_texts(const mts_json *data, mts_embed_input *in, int cap, char *msg, size_t len)
{
    int n = 0;
    for (size_t i = 0; i < mts_json_len(data); i++) {
        const mts_json *x = mts_json_at(data, i);
        if (mts_json_type(x) == MTS_JSON_ARRAY && mts_json_len(x) == 1) x = mts_json_at(x, 0);
        if (mts_json_type(x) != MTS_JSON_STRING) {
            snprintf(msg, len, "BYTES data element %zu is %s; the texts must be strings", i,
                     mts_json_type_name(mts_json_type(x)));
            return -1;
        }
        if (n == cap) {
            snprintf(msg, len, "more than %d texts; at most %d per request", cap, cap);
            return -1;
        }
        in[n].text = mts_json_str(x, &in[n].len);
        n++;
    }
    return n;
}

bool mts_embed_kserve_infer(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const char *model,
                            int64_t arrival_ns)
{
    size_t json_len = hr->body_len;
    const char *hcl = mts_http_header(hr, "Inference-Header-Content-Length");
    if (hcl) {
        char *end;
        long long v = strtoll(hcl, &end, 10);
        if (end == hcl || *end || v <= 0 || (unsigned long long)v > hr->body_len) return false; /* kserve_http says why */
        json_len = (size_t)v;
    }
    mts_json_doc *doc = NULL;
    mts_err err = {0};
    if (mts_json_parse(hr->body, json_len, &doc, &err)) return false;
    const mts_json *root = mts_json_root(doc);
    const mts_json *inputs = mts_json_get(root, "inputs");
    const mts_json *in0 = mts_json_at(inputs, 0);
    const char *dt = mts_json_str(mts_json_get(in0, "datatype"), NULL);
    if (!dt || strcmp(dt, "BYTES")) {
        mts_json_free(doc);
        return false;
    }
    char msg[MTS_ERR_MSG_MAX] = "";
    const char *iname = mts_json_str(mts_json_get(in0, "name"), NULL);
    const mts_json *shape = mts_json_get(in0, "shape"), *data = mts_json_get(in0, "data");
    const mts_json *bds = mts_json_get(mts_json_get(in0, "parameters"), "binary_data_size");
    const mts_json *params = mts_json_get(root, "parameters"), *outputs = mts_json_get(root, "outputs");
    const mts_json *id = mts_json_get(root, "id");
    int64_t numel = 1, size = -1;
    for (size_t d = 0; d < mts_json_len(shape); d++) {
        int64_t v;
        if (mts_json_int(mts_json_at(shape, d), &v) || v < 0 || v > MTS_EMBED_MAX_TEXTS) numel = -1;
        else if (numel >= 0) numel *= v;
    }
    if (mts_json_len(inputs) != 1)
        snprintf(msg, sizeof msg, "an embedding model takes one BYTES input holding the texts (got %zu inputs)",
                 mts_json_len(inputs));
    else if (!iname) snprintf(msg, sizeof msg, "inputs[0]: 'name' (a string) is required");
    else if (mts_json_type(shape) != MTS_JSON_ARRAY || mts_json_len(shape) < 1 || mts_json_len(shape) > 2 ||
             numel < 0 || (mts_json_len(shape) == 2 && mts_json_is_int(mts_json_at(shape, 1)) &&
                           mts_json_num(mts_json_at(shape, 1)) != 1))
        snprintf(msg, sizeof msg, "input '%s': shape must be [N] or [N, 1] with N texts (1 to %d)", iname,
                 MTS_EMBED_MAX_TEXTS);
    else if (id && !mts_json_str(id, NULL)) snprintf(msg, sizeof msg, "'id' must be a string");
    else if (!!data == !!bds)
        snprintf(msg, sizeof msg, "input '%s': give the texts in 'data' or in the binary section (binary_data_size)",
                 iname);
    else if (data && mts_json_type(data) != MTS_JSON_ARRAY)
        snprintf(msg, sizeof msg, "input '%s': 'data' must be an array of strings", iname);
    else if (bds && (mts_json_int(bds, &size) || size < 0 || !hcl || (uint64_t)size != hr->body_len - json_len))
        snprintf(msg, sizeof msg, "input '%s': binary_data_size must be the length of the binary section (%zu bytes, "
                 "after an Inference-Header-Content-Length header)", iname, hr->body_len - json_len);
    else if (outputs && (mts_json_type(outputs) != MTS_JSON_ARRAY || mts_json_len(outputs) > 1))
        snprintf(msg, sizeof msg, "an embedding model has one output; 'outputs' lists at most one");
    mts_embed_input *in = msg[0] ? NULL : calloc(MTS_EMBED_MAX_TEXTS, sizeof *in);
    int n = 0;
    if (!msg[0] && !in) snprintf(msg, sizeof msg, "out of memory");
    if (!msg[0]) {
        n = data ? json_texts(data, in, MTS_EMBED_MAX_TEXTS, msg, sizeof msg)
                 : mts_embed_split_bytes((const uint8_t *)hr->body + json_len, (size_t)size, in, MTS_EMBED_MAX_TEXTS,
                                         msg, sizeof msg);
        if (n >= 0 && n != numel)
            snprintf(msg, sizeof msg, "input '%s': shape says %lld texts, the data has %d", iname, (long long)numel, n);
    }
    emb_call *ec = msg[0] ? NULL : calloc(1, sizeof *ec);
    if (!msg[0] && !ec) snprintf(msg, sizeof msg, "out of memory");
    if (msg[0]) {
        free(in);
        mts_json_free(doc);
        mts_route_error(c, MTS_EINVAL, "%s", msg);
        return true;
    }
    ec->conn = c;
    ec->kserve = true;
    snprintf(ec->model, sizeof ec->model, "%s", model);
    ec->version = mts_server_model_version(srv, model);
    ec->id = id ? strdup(mts_json_str(id, NULL)) : NULL;
    const mts_json *o0 = mts_json_at(outputs, 0);
    const char *oname = mts_json_str(mts_json_get(o0, "name"), NULL);
    snprintf(ec->out_name, sizeof ec->out_name, "%s", oname ? oname : "embedding");
    const mts_json *bo = mts_json_get(mts_json_get(o0, "parameters"), "binary_data");
    if (!bo) bo = mts_json_get(params, "binary_data_output");
    ec->binary_out = mts_json_type(bo) == MTS_JSON_BOOL && mts_json_bool(bo);
    hr->user = ec; /* before submitting: the answer may go out (and ec be freed) inside it */
    int rc = mts_embed_submit(srv, ec->model, in, n, arrival_ns, &ec->cancel, embed_done, ec, msg, sizeof msg);
    free(in);
    mts_json_free(doc);
    if (rc) {
        hr->user = NULL;
        free(ec->id);
        free(ec);
        mts_route_error(c, rc, "%s", msg);
    }
    return true;
}

const mts_route mts_embed_routes[] = {
    {"POST", "/v1/embeddings", route_embeddings, "POST a JSON body {\"model\", \"input\"}", MTS_SCOPE_INFER},
    {NULL, NULL, NULL, NULL, 0},
};
