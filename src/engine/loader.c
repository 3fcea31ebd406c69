/*
 * Model loading: map the .onnx file, parse it into the graph IR (onnx_pb.c), put the nodes in
 * topological order, and resolve every node to a kernel. Whatever is wrong with a file — not
 * ONNX, truncated, a cycle, an unknown op, an unsupported type — ends here as an error naming the
 * file and the node or tensor, and everything allocated so far is released through
 * mts_model_free. The file mapping stays alive for the model's lifetime because initializers
 * point into it.
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

#include "engine/kernels/dnnl_ops.h"
#include "engine/model.h"

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
            if (n->attrs[a].type == MTS_ATTR_GRAPH)
                return mts_err_set(err, MTS_EUNSUPPORTED, "%s: node '%s' (#%d, %s): subgraph attributes are not supported",
                                   file, n->name, i, n->op_type);
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
    if ((rc = topo_sort(m, file, err))) return rc;
    if ((rc = resolve_ops(m, file, err))) return rc;
    return MTS_OK;
}

static mts_model *model_new(void)
{
    mts_model *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->plan_lock, NULL);
    return m;
}

/* Under AddressSanitizer the engine's memory comes from malloc, so that ASan sees every byte a
 * kernel reads: model files are read into the heap instead of mapped (an in-place weight read
 * after its model is freed is then a reported use after free, not a silent read of a live
 * mapping), and weight copies are heap blocks too (below). */
#if defined(__SANITIZE_ADDRESS__)
#define ENGINE_MALLOC_ONLY 1
#else
#define ENGINE_MALLOC_ONLY 0
#endif

void *mts__map_file(int fd, size_t len)
{
    if (!ENGINE_MALLOC_ONLY) {
        void *addr = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        return addr == MAP_FAILED ? NULL : addr;
    }
    /* Page-aligned like a mapping, so the same initializers are used in place or copied. */
    uint8_t *buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096 + (len ? 0 : 4096));
    if (!buf) return NULL;
    for (size_t off = 0; off < len;) {
        ssize_t n = pread(fd, buf + off, len - off, (off_t)off);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            if (n == 0) errno = EIO; /* the file shrank while being read */
            free(buf);
            return NULL;
        }
        off += (size_t)n;
    }
    return buf;
}

void mts__unmap_file(void *addr, size_t len)
{
    if (!addr) return;
    if (ENGINE_MALLOC_ONLY) free(addr);
    else munmap(addr, len);
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
    if (rc) {
        mts_model_free(m);
        return rc;
    }
    *out = m;
    return MTS_OK;
}

int mts_model_load_buffer(const void *data, size_t len, const char *name, const mts_load_opts *opts,
                          mts_model **out, mts_err *err)
{
    if (len == 0) return mts_err_set(err, MTS_EFORMAT, "%s: empty model", name);
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
    if (rc) {
        mts_model_free(m);
        return rc;
    }
    *out = m;
    return MTS_OK;
}

/* Copies are large (weights): they get their own pages so dropping one returns its memory to
 * the system at once (a malloc'd block would stay in the heap). */
#define COPY_MMAP_MIN ((size_t)16 << 10)

/* Under AddressSanitizer every copy comes from malloc (ENGINE_MALLOC_ONLY), so a read of a
 * dropped copy is reported as a use after free: ASan cannot see into an anonymous mapping, and
 * a read of one that is unmapped is a bare SIGSEGV. */
static void *copy_alloc(size_t len)
{
    if (len < COPY_MMAP_MIN || ENGINE_MALLOC_ONLY) return malloc(len ? len : 1);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void copy_free(void *p, size_t len)
{
    if (!p) return;
    if (len < COPY_MMAP_MIN || ENGINE_MALLOC_ONLY) free(p);
    else munmap(p, len);
}

void mts_model_free(mts_model *m)
{
    if (!m) return;
    mts__plan_free_all(m);
    mts_dnnl_cache_free(m->dnnl_cache);
    for (int i = 0; i < m->n_copies; i++) copy_free(m->copies[i].data, m->copies[i].len);
    free(m->copies);
    for (int i = 0; i < m->n_maps; i++) {
        mts__unmap_file(m->maps[i].addr, m->maps[i].len);
        free(m->maps[i].location);
    }
    free(m->maps);
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
    out->resident_bytes =
        (int64_t)m->pool.bytes + m->plan_bytes + m->copy_bytes + mts_dnnl_cache_bytes(m->dnnl_cache);
    pthread_mutex_unlock((pthread_mutex_t *)&m->plan_lock);
}

mts__copy *mts__add_copy(mts_model *m, const void *src, size_t len)
{
    if (m->n_copies == m->cap_copies) {
        int cap = m->cap_copies ? m->cap_copies * 2 : 16;
        mts__copy *c = realloc(m->copies, sizeof *c * (size_t)cap);
        if (!c) return NULL;
        m->copies = c;
        m->cap_copies = cap;
    }
    void *d = copy_alloc(len);
    if (!d) return NULL;
    if (len) memcpy(d, src, len);
    mts__copy *c = &m->copies[m->n_copies++];
    *c = (mts__copy){d, src, len, -1};
    m->copy_bytes += (int64_t)len;
    return c;
}

/* Marks every value a step of plan p reads at run time. Steps read only their inputs: fused
 * steps list the inputs of the nodes they absorbed, and oneDNN steps read packed copies kept in
 * the model's weight cache, never the originals. */
static void mark_reads(const mts__plan *p, uint8_t *used)
{
    for (int s = 0; s < p->n_steps; s++)
        for (int j = 0; j < p->steps[s].n_in; j++)
            if (p->steps[s].in[j] >= 0) used[p->steps[s].in[j]] = 1;
}

void mts__release_weights(mts_model *m, const mts__plan *p, const int *values, int n)
{
    if (n <= 0) return;
    uint8_t *used = calloc((size_t)m->n_values + 1, 1);
    if (!used) return;
    /* Every plan of the model counts, not just the new one: a plan for another batch size may
     * run the same node with a kernel that reads the unpacked weights (a direct 1x1 conv at
     * batch 1 beside a oneDNN conv at batch 8), and other workers run those plans while this one
     * is built. p is not on m->plans yet. */
    mark_reads(p, used);
    for (const mts__plan *q = m->plans; q; q = q->next) mark_reads(q, used);
    for (int i = 0; i < m->n_outputs; i++) used[m->outputs[i]] = 1;
    long page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) {
        int v = values[i];
        if (v < 0 || v >= m->n_values || used[v]) continue;
        mts_value *val = &m->values[v];
        if (val->kind != MTS_VALUE_INITIALIZER || !val->init.data) continue;
        for (int c = 0; c < m->n_copies; c++)
            if (m->copies[c].value == v && m->copies[c].data) {
                copy_free(m->copies[c].data, m->copies[c].len);
                m->copies[c].data = NULL;
                m->copy_bytes -= (int64_t)m->copies[c].len;
                val->init.data = NULL;
            }
    }
    free(used);
    /* The file mapping was touched by parsing and copying; drop it from this process's resident
     * set. Pages still read by kernels (in-place initializers, biases) fault back in from the
     * page cache on their next use; the released weights never do. */
    for (int i = 0; i < m->n_maps && !ENGINE_MALLOC_ONLY; i++) {
        uintptr_t a = ((uintptr_t)m->maps[i].addr + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
        uintptr_t e = ((uintptr_t)m->maps[i].addr + m->maps[i].len) / (uintptr_t)page * (uintptr_t)page;
        if (page > 0 && e > a) madvise((void *)a, e - a, MADV_DONTNEED);
    }
}

int mts__restore_weights(mts_model *m, mts_err *err)
{
    for (int c = 0; c < m->n_copies; c++) {
        mts__copy *cp = &m->copies[c];
        if (cp->data || cp->value < 0) continue;
        if (!(cp->data = copy_alloc(cp->len))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        if (cp->len) memcpy(cp->data, cp->src, cp->len);
        m->copy_bytes += (int64_t)cp->len;
        m->values[cp->value].init.data = cp->data;
    }
    return MTS_OK;
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
