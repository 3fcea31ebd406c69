/*
 * `mtserve bench`: what is known about the models before the load starts. The model list from the
 * repository index, each model's inputs from its metadata (over HTTP, or over gRPC when there is
 * no HTTP address), request data generated from those input specs (random floats and booleans,
 * zero integers), and the server's statistics read before and after a run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_internal.h"

/* ---- models ---------------------------------------------------------------------------- */

int mts_bench_split_models(const char *arg, bench_opts *o)
{
    char *copy = strdup(arg);
    if (!copy) return -1;
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char **nm = realloc(o->models, (size_t)(o->n_models + 1) * sizeof *nm);
        if (!nm) {
            free(copy);
            return -1;
        }
        o->models = nm;
        o->models[o->n_models++] = strdup(t);
    }
    free(copy);
    return 0;
}

size_t mts_bench_dtype_size(const char *dt)
{
    if (!strcmp(dt, "FP32") || !strcmp(dt, "INT32") || !strcmp(dt, "UINT32")) return 4;
    if (!strcmp(dt, "INT64") || !strcmp(dt, "UINT64") || !strcmp(dt, "FP64")) return 8;
    if (!strcmp(dt, "FP16") || !strcmp(dt, "INT16") || !strcmp(dt, "UINT16") || !strcmp(dt, "BF16")) return 2;
    if (!strcmp(dt, "INT8") || !strcmp(dt, "UINT8") || !strcmp(dt, "BOOL")) return 1;
    return 0;
}

static void fill_random(void *data, size_t nbytes, const char *dt, uint64_t *rng)
{
    if (!strcmp(dt, "FP32")) {
        float *f = data;
        for (size_t i = 0; i < nbytes / 4; i++) f[i] = (float)mts_bench_rand01(rng);
    } else if (!strcmp(dt, "BOOL")) {
        uint8_t *b = data;
        for (size_t i = 0; i < nbytes; i++) b[i] = (uint8_t)(mts_bench_rand(rng) & 1);
    } else {
        memset(data, 0, nbytes); /* integers: zeros are valid indices and ids */
    }
}

/* Fills m->inputs from specs (first -1 dim = batch, others 1). */
int mts_bench_inputs_from_specs(bench_model *m, const input_spec *specs, int n, int64_t batch, uint64_t *rng,
                                void **owned, int *n_owned)
{
    m->n_inputs = n;
    for (int i = 0; i < n; i++) {
        mts_bench_input *in = &m->inputs[i];
        memset(in, 0, sizeof *in);
        snprintf(in->name, sizeof in->name, "%s", specs[i].name);
        snprintf(in->datatype, sizeof in->datatype, "%s", specs[i].datatype);
        in->rank = specs[i].rank;
        size_t numel = 1;
        bool batch_used = false;
        for (int d = 0; d < in->rank; d++) {
            int64_t v = specs[i].dims[d];
            if (v < 0) {
                v = batch_used ? 1 : batch;
                batch_used = true;
            }
            in->dims[d] = v;
            numel *= (size_t)v;
        }
        size_t es = mts_bench_dtype_size(in->datatype);
        if (!es) return -1;
        in->nbytes = numel * es;
        void *data = malloc(in->nbytes ? in->nbytes : 1);
        if (!data) return -1;
        fill_random(data, in->nbytes, in->datatype, rng);
        in->data = data;
        owned[(*n_owned)++] = data;
    }
    return 0;
}

/* ModelMetadata over gRPC into input specs. 0, or -1 with a message. */
int mts_bench_fetch_metadata_grpc(const char *target, const char *model, input_spec *specs, int *n, char *err,
                                  size_t errlen)
{
    mts_bench_input ins[MTS_BENCH_MAX_INPUTS];
    if (mts_bench_grpc_metadata(target, model, ins, MTS_BENCH_MAX_INPUTS, n, err, errlen)) return -1;
    for (int i = 0; i < *n; i++) {
        input_spec *sp = &specs[i];
        memset(sp, 0, sizeof *sp);
        snprintf(sp->name, sizeof sp->name, "%s", ins[i].name);
        snprintf(sp->datatype, sizeof sp->datatype, "%s", ins[i].datatype);
        sp->rank = ins[i].rank;
        memcpy(sp->dims, ins[i].dims, sizeof sp->dims);
        if (!mts_bench_dtype_size(sp->datatype)) {
            snprintf(err, errlen, "input '%s' has datatype %s, which bench cannot generate", sp->name, sp->datatype);
            return -1;
        }
    }
    return 0;
}

int mts_bench_fetch_index_grpc(const char *target, bench_opts *o, char *err, size_t errlen)
{
    char **names = NULL;
    int n = 0, ret = 0;
    if (mts_bench_grpc_index(target, &names, &n, err, errlen)) return -1;
    for (int i = 0; i < n; i++) {
        if (!ret && mts_bench_split_models(names[i], o)) ret = -1;
        free(names[i]);
    }
    free(names);
    if (!ret && o->n_models == 0) {
        snprintf(err, errlen, "the repository index lists no models");
        ret = -1;
    }
    return ret;
}

/* Reads GET /v2/models/NAME into input specs. 0, or -1 with a message. */
int mts_bench_fetch_metadata(const mts_bench_target *t, const char *model, input_spec *specs, int *n, char *err,
                             size_t errlen)
{
    char path[400];
    snprintf(path, sizeof path, "/v2/models/%s", model);
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    int rc = mts_bench_http_simple(t, "GET", path, NULL, 120000, &status, &body, &len, err, errlen);
    if (rc) return -1;
    mts_json_doc *doc = NULL;
    mts_err e = {0};
    int ret = -1;
    if (mts_json_parse(body, len, &doc, &e)) {
        snprintf(err, errlen, "HTTP %d, unreadable metadata", status);
        goto out;
    }
    const mts_json *root = mts_json_root(doc);
    if (status != 200) {
        const char *m = mts_json_str(mts_json_get(root, "error"), NULL);
        snprintf(err, errlen, "HTTP %d: %s", status, m ? m : "?");
        goto out;
    }
    const mts_json *ins = mts_json_get(root, "inputs");
    *n = 0;
    for (size_t i = 0; i < mts_json_len(ins) && *n < MTS_BENCH_MAX_INPUTS; i++) {
        const mts_json *in = mts_json_at(ins, i);
        input_spec *sp = &specs[(*n)++];
        memset(sp, 0, sizeof *sp);
        snprintf(sp->name, sizeof sp->name, "%s", mts_json_str(mts_json_get(in, "name"), NULL) ? mts_json_str(mts_json_get(in, "name"), NULL) : "");
        const char *dt = mts_json_str(mts_json_get(in, "datatype"), NULL);
        snprintf(sp->datatype, sizeof sp->datatype, "%s", dt ? dt : "FP32");
        const mts_json *shape = mts_json_get(in, "shape");
        for (size_t d = 0; d < mts_json_len(shape) && sp->rank < 8; d++) {
            int64_t v = -1;
            if (mts_json_int(mts_json_at(shape, d), &v)) v = -1;
            sp->dims[sp->rank++] = v < 0 ? -1 : v;
        }
        if (!mts_bench_dtype_size(sp->datatype)) {
            snprintf(err, errlen, "input '%s' has datatype %s, which bench cannot generate", sp->name, sp->datatype);
            goto out;
        }
    }
    ret = 0;
out:
    mts_json_free(doc);
    free(body);
    return ret;
}

int mts_bench_fetch_index(const mts_bench_target *t, bench_opts *o, char *err, size_t errlen)
{
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    if (mts_bench_http_simple(t, "POST", "/v2/repository/index", "{}", 30000, &status, &body, &len, err, errlen))
        return -1;
    mts_json_doc *doc = NULL;
    mts_err e = {0};
    int ret = -1;
    if (status != 200 || mts_json_parse(body, len, &doc, &e)) {
        snprintf(err, errlen, "repository index: HTTP %d", status);
        goto out;
    }
    const mts_json *root = mts_json_root(doc);
    for (size_t i = 0; i < mts_json_len(root); i++) {
        const char *nm = mts_json_str(mts_json_get(mts_json_at(root, i), "name"), NULL);
        if (nm && mts_bench_split_models(nm, o)) goto out;
    }
    ret = o->n_models > 0 ? 0 : -1;
    if (ret) snprintf(err, errlen, "the repository index lists no models");
out:
    mts_json_free(doc);
    free(body);
    return ret;
}

/* ---- server statistics ----------------------------------------------------------------- */

void mts_bench_fetch_server_stats(const mts_bench_target *t, server_stats *s)
{
    memset(s, 0, sizeof *s);
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    char err[200];
    if (mts_bench_http_simple(t, "GET", "/v2/models/stats", NULL, 30000, &status, &body, &len, err, sizeof err))
        return;
    mts_json_doc *doc = NULL;
    mts_err e = {0};
    if (status == 200 && !mts_json_parse(body, len, &doc, &e)) {
        const mts_json *root = mts_json_root(doc);
        const mts_json *ms = mts_json_get(root, "model_stats");
        for (size_t i = 0; i < mts_json_len(ms); i++) {
            int64_t v;
            const mts_json *m = mts_json_at(ms, i);
            if (!mts_json_int(mts_json_get(m, "loads"), &v)) s->loads += (uint64_t)v;
            if (!mts_json_int(mts_json_get(m, "evictions"), &v)) s->evictions += (uint64_t)v;
        }
        const mts_json *srv = mts_json_get(root, "server");
        int64_t v;
        if (!mts_json_int(mts_json_get(srv, "resident_models"), &v)) s->resident_models = v;
        if (!mts_json_int(mts_json_get(srv, "resident_bytes"), &v)) s->resident_bytes = v;
        if (!mts_json_int(mts_json_get(srv, "submitted"), &v)) s->submitted = (uint64_t)v;
        if (!mts_json_int(mts_json_get(srv, "completed"), &v)) s->completed = (uint64_t)v;
        if (!mts_json_int(mts_json_get(srv, "rejected_queue_full"), &v)) s->rejected_full = (uint64_t)v;
        if (!mts_json_int(mts_json_get(srv, "timed_out"), &v)) s->timed_out = (uint64_t)v;
        s->ok = true;
    }
    mts_json_free(doc);
    free(body);
}
