/*
 * Model loading: map the .onnx file, parse it into the graph IR (onnx_pb.c), put the nodes in
 * topological order, and resolve every node to a kernel. Whatever is wrong with a file — not
 * ONNX, truncated, a cycle, an unknown op, an unsupported type — ends here as an error naming the
 * file and the node or tensor, and everything allocated so far is released through
 * mts_model_free. The file mapping stays alive for the model's lifetime because initializers
 * point into it; the mappings and initializer copies are managed by weights.c, and the
 * backends' per-model caches are freed through the backend table.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/subgraph.h"
#include "engine/weights.h"

static int topo_sort(mts_model *m, const char *file, mts_err *err)
{
    int n = m->n_nodes;
    int *indeg = calloc((size_t)n + 1, sizeof(int));
    int *order = calloc((size_t)n + 1, sizeof(int));
    /* consumers lists in CSR form */
    int *cnt = calloc((size_t)n + 1, sizeof(int));
    int64_t edges = 0;
    int rc = MTS_OK;
    if (!indeg || !order || !cnt) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m->nodes[i].n_in; j++) {
            int v = m->nodes[i].in[j];
            if (v >= 0 && m->values[v].producer >= 0) {
                indeg[i]++;
                cnt[m->values[v].producer]++;
                edges++;
            }
        }
    int *start = calloc((size_t)n + 2, sizeof(int));
    int *adj = calloc((size_t)edges + 1, sizeof(int));
    if (!start || !adj) {
        free(start);
        free(adj);
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) start[i + 1] = start[i] + cnt[i];
    memset(cnt, 0, sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m->nodes[i].n_in; j++) {
            int v = m->nodes[i].in[j];
            if (v >= 0 && m->values[v].producer >= 0) {
                int p = m->values[v].producer;
                adj[start[p] + cnt[p]++] = i;
            }
        }
    /* Kahn's algorithm; a FIFO in `order` keeps the file's order among ready nodes. */
    int head = 0, tail = 0;
    for (int i = 0; i < n; i++)
        if (indeg[i] == 0) order[tail++] = i;
    while (head < tail) {
        int u = order[head++];
        for (int e = start[u]; e < start[u + 1]; e++)
            if (--indeg[adj[e]] == 0) order[tail++] = adj[e];
    }
    free(start);
    free(adj);
    if (tail != n) {
        int stuck = 0;
        for (int i = 0; i < n; i++)
            if (indeg[i] > 0) {
                stuck = i;
                break;
            }
        rc = mts_err_set(err, MTS_EFORMAT, "%s: the graph has a cycle through node '%s' (#%d, %s)", file,
                         m->nodes[stuck].name, stuck, m->nodes[stuck].op_type);
        goto out;
    }
    /* Reorder nodes and renumber producers. */
    mts_node *sorted = mts_pool_calloc(&m->pool, (size_t)n + 1, sizeof(mts_node));
    if (!sorted) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) sorted[i] = m->nodes[order[i]];
    m->nodes = sorted;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < sorted[i].n_out; j++) m->values[sorted[i].out[j]].producer = i;
out:
    free(indeg);
    free(order);
    free(cnt);
    return rc;
}

static int resolve_ops(mts_model *m, const char *file, mts_err *err)
{
    m->ops = mts_pool_calloc(&m->pool, (size_t)m->n_nodes + 1, sizeof(mts_op *));
    if (!m->ops) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    for (int i = 0; i < m->n_nodes; i++) {
        mts_node *n = &m->nodes[i];
        n->opset = m->opset;
        if (n->domain[0] && strcmp(n->domain, "ai.onnx") != 0)
            return mts_err_set(err, MTS_EUNSUPPORTED, "%s: node '%s' (#%d): op '%s' of domain '%s' is not supported",
                               file, n->name, i, n->op_type, n->domain);
        if (m->opset == 0)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (#%d, %s) is in the default domain but the model "
                               "has no opset_import for it", file, n->name, i, n->op_type);
        m->ops[i] = mts_op_lookup(n->op_type);
        if (!m->ops[i])
            return mts_err_set(err, MTS_EUNSUPPORTED, "%s: node '%s' (#%d): unsupported op '%s'", file, n->name, i,
                               n->op_type);
        for (int a = 0; a < n->n_attr; a++)
            if (n->attrs[a].type == MTS_ATTR_GRAPH) {
                int rc = mts__subgraph_check(m, n, file, err);
                if (rc) return rc;
                break;
            }
    }
    return MTS_OK;
}

static int load_common(mts_model *m, const uint8_t *bytes, size_t len, const char *file, const char *dir,
                       const mts_load_opts *opts, mts_err *err)
{
    mts__pb_src src = {bytes, len, file, m, dir};
    int rc;
    m->max_tensor_bytes = (opts && opts->max_tensor_bytes > 0) ? opts->max_tensor_bytes : (int64_t)8 << 30;
    if ((rc = mts__resolve_backend(opts, err)) < 0) return rc;
    m->backend = rc;
    if ((rc = mts__parse_model(&src, m, err))) return rc;
    if ((rc = mts__lower_half(m, file, err))) return rc;
    if ((rc = topo_sort(m, file, err))) return rc;
    if ((rc = resolve_ops(m, file, err))) return rc;
    /* Subgraphs (at any depth) after their parents: their nodes get the same treatment. */
    for (int i = 0; i < m->n_subs; i++) {
        mts_model *g = m->subs[i];
        if ((rc = topo_sort(g, g->path, err)) || (rc = resolve_ops(g, g->path, err))) return rc;
    }
    return mts__subgraph_rewrite(m, err);
}

static mts_model *model_new(void)
{
    mts_model *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->plan_lock, NULL);
    return m;
}


static int reload_path(void *arg, const mts_load_opts *opts, mts_model **out, mts_err *err)
{
    return mts_model_load(arg, opts, out, err);
}

typedef struct buf_arg {
    const void *data;
    size_t len;
    const char *name;
} buf_arg;

static int reload_buffer(void *arg, const mts_load_opts *opts, mts_model **out, mts_err *err)
{
    const buf_arg *b = arg;
    return mts_model_load_buffer(b->data, b->len, b->name, opts, out, err);
}

int mts_model_load(const char *path, const mts_load_opts *opts, mts_model **out, mts_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mts_err_set(err, MTS_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return mts_err_set(err, MTS_EIO, "%s is not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return mts_err_set(err, MTS_EFORMAT, "%s: empty file", path);
    }
    void *addr = mts__map_file(fd, (size_t)st.st_size);
    int map_errno = errno;
    close(fd);
    if (!addr) return mts_err_set(err, MTS_EIO, "cannot map %s: %s", path, strerror(map_errno));
    if (mts_gguf_is(addr, (size_t)st.st_size)) { /* a GGUF encoder: as the ONNX model it maps to */
        mts_pbw w = {0};
        int rc = mts_gguf_to_onnx(addr, (size_t)st.st_size, path, &w, err);
        mts__unmap_file(addr, (size_t)st.st_size);
        if (!rc) rc = mts_model_load_buffer(w.p, w.len, path, opts, out, err);
        mts_pbw_free(&w);
        return rc;
    }
    mts_model *m = model_new();
    if (!m) {
        mts__unmap_file(addr, (size_t)st.st_size);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    m->maps = calloc(1, sizeof *m->maps);
    m->path = strdup(path);
    char *dircopy = strdup(path);
    if (!m->maps || !m->path || !dircopy) {
        free(dircopy);
        mts__unmap_file(addr, (size_t)st.st_size);
        mts_model_free(m);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    m->maps[0].location = strdup("");
    m->maps[0].addr = addr;
    m->maps[0].len = (size_t)st.st_size;
    m->n_maps = 1;
    int rc = load_common(m, addr, (size_t)st.st_size, path, dirname(dircopy), opts, err);
    free(dircopy);
    if (!rc) rc = mts__apply_precision(&m, opts, reload_path, (void *)path, err);
    if (rc) {
        mts_model_free(m);
        return rc;
    }
    mts__drop_map_pages(m); /* parsing touched every page; the copies are what is read now */
    *out = m;
    return MTS_OK;
}

int mts_model_load_buffer(const void *data, size_t len, const char *name, const mts_load_opts *opts,
                          mts_model **out, mts_err *err)
{
    if (len == 0) return mts_err_set(err, MTS_EFORMAT, "%s: empty model", name);
    if (mts_gguf_is(data, len)) {
        mts_pbw w = {0};
        int rc = mts_gguf_to_onnx(data, len, name, &w, err);
        if (!rc) rc = mts_model_load_buffer(w.p, w.len, name, opts, out, err);
        mts_pbw_free(&w);
        return rc;
    }
    mts_model *m = model_new();
    if (!m) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    m->owned_copy = malloc(len);
    m->path = strdup(name);
    if (!m->owned_copy || !m->path) {
        mts_model_free(m);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    memcpy(m->owned_copy, data, len);
    int rc = load_common(m, m->owned_copy, len, name, NULL, opts, err);
    buf_arg ba = {data, len, name};
    if (!rc) rc = mts__apply_precision(&m, opts, reload_buffer, &ba, err);
    if (rc) {
        mts_model_free(m);
        return rc;
    }
    *out = m;
    return MTS_OK;
}


void mts_model_free(mts_model *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_subs; i++) mts_model_free(m->subs[i]);
    free(m->subs);
    mts__plan_free_all(m);
    for (int b = 0; mts_backends[b]; b++)
        if (mts_backends[b]->model_free) mts_backends[b]->model_free(m->bstate[b]);
    mts__weights_free(m);
    mts_pool_free(&m->pool);
    free(m->owned_copy);
    free(m->path);
    pthread_mutex_destroy(&m->plan_lock);
    free(m);
}

void mts_model_get_info(const mts_model *m, mts_model_info *out)
{
    out->ir_version = m->ir_version;
    out->opset = m->opset;
    out->producer = m->producer;
    out->n_inputs = m->n_inputs;
    out->n_outputs = m->n_outputs;
    out->n_nodes = m->n_nodes;
    out->param_bytes = m->param_bytes;
    out->mapped_bytes = m->mapped_bytes;
    pthread_mutex_lock((pthread_mutex_t *)&m->plan_lock);
    int64_t cached = 0; /* backends' per-model caches (packed weights) */
    for (int b = 0; mts_backends[b]; b++)
        if (mts_backends[b]->model_bytes) cached += mts_backends[b]->model_bytes(m->bstate[b]);
    out->resident_bytes = (int64_t)m->pool.bytes + m->plan_bytes + m->copy_bytes + cached;
    pthread_mutex_unlock((pthread_mutex_t *)&m->plan_lock);
    for (int i = 0; i < m->n_subs; i++) { /* subgraphs' plans and caches (their IR is in m's pool) */
        mts_model *g = m->subs[i];
        pthread_mutex_lock(&g->plan_lock);
        out->resident_bytes += g->plan_bytes;
        for (int b = 0; mts_backends[b]; b++)
            if (mts_backends[b]->model_bytes) out->resident_bytes += mts_backends[b]->model_bytes(g->bstate[b]);
        pthread_mutex_unlock(&g->plan_lock);
    }
}


const char *mts_model_backend(const mts_model *m)
{
    return m->backend == MTS_BACKEND_REFERENCE ? "reference" : "default";
}

int mts__resolve_backend(const mts_load_opts *opts, mts_err *err)
{
    const char *b = opts && opts->backend && *opts->backend ? opts->backend : getenv("MTS_BACKEND");
    if (!b || !*b) return MTS_BACKEND_DEFAULT;
    if (!strcmp(b, "reference") || !strcmp(b, "ref")) return MTS_BACKEND_REFERENCE;
    if (!strcmp(b, "default") || !strcmp(b, "onednn") || !strcmp(b, "dnnl")) return MTS_BACKEND_DEFAULT;
    return mts_err_set(err, MTS_EINVAL, "unknown backend '%s' (expected default or reference)", b);
}

const mts_value *mts_model_input(const mts_model *m, int i)
{
    return (i >= 0 && i < m->n_inputs) ? &m->values[m->inputs[i]] : NULL;
}

const mts_value *mts_model_output(const mts_model *m, int i)
{
    return (i >= 0 && i < m->n_outputs) ? &m->values[m->outputs[i]] : NULL;
}

const mts_node *mts_model_node(const mts_model *m, int i)
{
    return (i >= 0 && i < m->n_nodes) ? &m->nodes[i] : NULL;
}

int mts_tensor_parse_pb(const void *data, size_t len, mts_tensor *t, char **name, mts_err *err)
{
    mts_pool pool = {0};
    mts__pb_src src = {data, len, "tensor", NULL, NULL};
    const char *nm = NULL;
    mts_tensor tmp;
    int rc = mts__parse_tensor(&src, data, len, &pool, &tmp, &nm, err);
    if (rc) {
        mts_pool_free(&pool);
        return rc;
    }
    int64_t nbytes = mts_tensor_nbytes(&tmp);
    *t = tmp;
    t->data = malloc(nbytes > 0 ? (size_t)nbytes : 1);
    if (!t->data) {
        mts_pool_free(&pool);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    if (nbytes > 0) memcpy(t->data, tmp.data, (size_t)nbytes);
    if (name) *name = strdup(nm ? nm : "");
    mts_pool_free(&pool);
    return MTS_OK;
}
