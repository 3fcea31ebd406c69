/*
 * The shared embedding path (embed_common.h): tokenizer cache, tokenization, length-bucket
 * grouping, one scheduler request per bucket part, pooling on the worker thread and the
 * gathering of the parts into one answer.
 *
 * With an embedding_policy (config.h mts_embed_policy) the entry for the request's text count n
 * decides how its parts run: each bucket part is split into min(workers, texts) sub-batches of
 * near-equal size, submitted together and marked to run alone (the scheduler does not merge
 * them back), each with the entry's intra-op threads. workers 1 keeps the part whole and only
 * sets its team size. Without a policy nothing changes: parts batch with other requests' parts
 * and the scheduler picks the threads.
 */
#include "api/embed_common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/protocol.h"
#include "text/embed.h"
#include "util/log.h"

/* ---- tokenizers, loaded once per model and tokenizer file ---- */

typedef struct tok_entry {
    char *model, *path;
    int lowercase;
    mts_tokenizer *tok;
    struct tok_entry *next;
} tok_entry;

static pthread_mutex_t g_tok_lock = PTHREAD_MUTEX_INITIALIZER;
static tok_entry *g_toks;

static const mts_tokenizer *get_tokenizer(const mts_model_config *m, char *msg, size_t len)
{
    int lc = m->lowercase == 1 ? 1 : m->lowercase == 2 ? 0 : -1; /* -1: the tokenizer decides */
    pthread_mutex_lock(&g_tok_lock);
    for (tok_entry *t = g_toks; t; t = t->next)
        if (!strcmp(t->model, m->name) && !strcmp(t->path, m->tokenizer_path) && t->lowercase == lc) {
            pthread_mutex_unlock(&g_tok_lock);
            return t->tok;
        }
    char err[300] = "";
    tok_entry *t = calloc(1, sizeof *t);
    if (t) {
        t->model = strdup(m->name);
        t->path = strdup(m->tokenizer_path);
        t->lowercase = lc;
    }
    if (t && t->model && t->path) t->tok = mts_tokenizer_load(m->tokenizer_path, lc, err, sizeof err);
    if (!t || !t->tok) {
        if (t) free(t->model), free(t->path);
        free(t);
        pthread_mutex_unlock(&g_tok_lock);
        snprintf(msg, len, "model '%s': tokenizer %s does not load: %s", m->name, m->tokenizer_path,
                 err[0] ? err : "out of memory");
        return NULL;
    }
    t->next = g_toks;
    g_toks = t;
    pthread_mutex_unlock(&g_tok_lock);
    MTS_INFO("tokenizer loaded model=%s path=%s lowercase=%d", m->name, m->tokenizer_path, lc);
    return t->tok;
}

void mts_embed_shutdown(void)
{
    pthread_mutex_lock(&g_tok_lock);
    while (g_toks) {
        tok_entry *t = g_toks;
        g_toks = t->next;
        mts_tokenizer_free(t->tok);
        free(t->model);
        free(t->path);
        free(t);
    }
    pthread_mutex_unlock(&g_tok_lock);
}

/* ---- one call: every text of a request ---- */

typedef struct embed_call {
    mts_server *s;
    const mts_model_config *cfg;
    char model[256];
    int n;
    int64_t **ids, **types; /* per text, into arena (ids then type ids, back to back) */
    int *nt;                /* tokens per text */
    int64_t *arena;
    int64_t tokens;
    int64_t pad_id;
    int64_t arrival_ns;
    mts_embed_done done;
    void *user;
    mts_embedder e;
    pthread_mutex_t lock;
    int pending;
    int status;
    char msg[MTS_ERR_MSG_MAX];
    float *vecs;
    int64_t dim;
    /* the parts (bucket spans of the length order), submitted MAX_PARTS_IN_FLIGHT at a time */
    int *order;
    struct embed_span { int from, to, len; } *spans;
    int n_spans, next_span;
    int threads;       /* the policy's intra-op threads for every part (0: the scheduler's) */
    bool alone;        /* the policy split the parts: each runs as its own batch */
    const mts_request *cancel; /* the front end's: cancelled when the client went away */
} embed_call;

/* Parts of one request queued or running at once: a large request takes a bounded share of
 * its model's queue (queue_size) and the next part is submitted as one completes, while
 * concurrent requests' parts still batch together. */
#define MAX_PARTS_IN_FLIGHT 4

typedef struct embed_part {
    mts_request req;
    embed_call *call;
    int k, len;
    int *idx, *n;      /* text index and tokens of each row */
    int64_t *buf;      /* ids, mask, types: 3 * k * len */
} embed_part;

static void call_free(embed_call *c)
{
    pthread_mutex_destroy(&c->lock);
    free(c->ids);
    free(c->types);
    free(c->nt);
    free(c->arena);
    free(c->vecs);
    free(c->order);
    free(c->spans);
    free(c);
}

/* Drops one pending reference; the last one answers and frees the call. */
static void call_unref(embed_call *c)
{
    pthread_mutex_lock(&c->lock);
    bool last = --c->pending == 0;
    pthread_mutex_unlock(&c->lock);
    if (!last) return;
    if (c->status == 0 && !c->vecs) c->status = MTS_EIO, snprintf(c->msg, sizeof c->msg, "no vectors");
    if (c->status) {
        c->done(c->user, c->status, c->msg, NULL, c->n, 0, c->tokens);
    } else {
        float *v = c->vecs;
        c->vecs = NULL;
        c->done(c->user, 0, NULL, v, c->n, c->dim, c->tokens);
    }
    call_free(c);
}

static void call_fail(embed_call *c, int status, const char *fmt, const char *detail)
{
    pthread_mutex_lock(&c->lock);
    if (!c->status) {
        c->status = status;
        snprintf(c->msg, sizeof c->msg, fmt, detail);
    }
    pthread_mutex_unlock(&c->lock);
}

static void submit_part(embed_call *c, const int *order, int from, int to, int len);

/* Submits the next part when one is left and nothing failed. */
static void submit_next(embed_call *c)
{
    if (c->cancel && atomic_load(&c->cancel->cancelled))
        call_fail(c, MTS_ECANCELLED, "%s", "request cancelled: the client went away");
    pthread_mutex_lock(&c->lock);
    int k = !c->status && c->next_span < c->n_spans ? c->next_span++ : -1;
    pthread_mutex_unlock(&c->lock);
    if (k >= 0) submit_part(c, c->order, c->spans[k].from, c->spans[k].to, c->spans[k].len);
}

static void part_done(mts_request *req, int status, const char *msg)
{
    embed_part *p = (embed_part *)req;
    embed_call *c = p->call;
    if (status) {
        call_fail(c, status, "%s", msg ? msg : mts_status_text(status));
    } else if (req->n_outputs < 1) {
        call_fail(c, MTS_EIO, "%s", "the model produced no output");
    } else {
        char err[300];
        const mts_tensor *t = &req->outputs[0];
        int64_t dim = mts_embed_output_dim(t, p->k, p->len, err, sizeof err);
        if (dim < 0) {
            call_fail(c, MTS_PROTO_EPRECONDITION, "%s", err);
        } else {
            float *tmp = malloc(sizeof(float) * (size_t)dim * (size_t)p->k);
            if (tmp) mts_embed_pool(&c->e, t, p->k, p->len, p->n, tmp);
            pthread_mutex_lock(&c->lock);
            if (!tmp) {
                if (!c->status) c->status = MTS_ENOMEM, snprintf(c->msg, sizeof c->msg, "out of memory");
            } else if (!c->vecs && !c->status) {
                c->dim = dim;
                c->vecs = malloc(sizeof(float) * (size_t)dim * (size_t)c->n);
                if (!c->vecs) c->status = MTS_ENOMEM, snprintf(c->msg, sizeof c->msg, "out of memory");
            }
            if (c->vecs && !c->status && dim != c->dim) {
                c->status = MTS_EIO;
                snprintf(c->msg, sizeof c->msg, "the model gave vectors of %lld and of %lld floats", (long long)c->dim,
                         (long long)dim);
            }
            if (c->vecs && !c->status)
                for (int i = 0; i < p->k; i++)
                    memcpy(c->vecs + (size_t)p->idx[i] * dim, tmp + (size_t)i * dim, sizeof(float) * (size_t)dim);
            pthread_mutex_unlock(&c->lock);
            free(tmp);
        }
    }
    mts_server_request_answered(c->s, req);
    mts_request_release(req);
    free(p->idx);
    free(p->n);
    free(p->buf);
    free(p);
    submit_next(c); /* before dropping this part's reference: the call stays alive */
    call_unref(c);
}

/* Sorts text indices by token count (insertion into buckets keeps the order stable). */
static int *order_by_length(const embed_call *c)
{
    int *o = malloc(sizeof(int) * (size_t)c->n);
    if (!o) return NULL;
    for (int i = 0; i < c->n; i++) o[i] = i;
    /* counting sort on the token count keeps equal lengths in text order */
    int maxn = 0;
    for (int i = 0; i < c->n; i++) maxn = c->nt[i] > maxn ? c->nt[i] : maxn;
    int *cnt = calloc((size_t)maxn + 2, sizeof(int));
    if (!cnt) {
        free(o);
        return NULL;
    }
    for (int i = 0; i < c->n; i++) cnt[c->nt[i] + 1]++;
    for (int v = 1; v <= maxn + 1; v++) cnt[v] += cnt[v - 1];
    for (int i = 0; i < c->n; i++) o[cnt[c->nt[i]]++] = i;
    free(cnt);
    return o;
}

/* Submits one part: rows order[from..to) padded to len. */
static void submit_part(embed_call *c, const int *order, int from, int to, int len)
{
    int k = to - from;
    embed_part *p = calloc(1, sizeof *p);
    if (p) {
        p->idx = malloc(sizeof(int) * (size_t)k);
        p->n = malloc(sizeof(int) * (size_t)k);
        p->buf = malloc(sizeof(int64_t) * 3 * (size_t)k * (size_t)len);
    }
    if (!p || !p->idx || !p->n || !p->buf) {
        if (p) free(p->idx), free(p->n), free(p->buf);
        free(p);
        call_fail(c, MTS_ENOMEM, "%s", "out of memory for the input batch");
        return;
    }
    p->call = c;
    p->k = k;
    p->len = len;
    const int64_t *ids[MTS_EMBED_MAX_TEXTS], *types[MTS_EMBED_MAX_TEXTS];
    for (int i = 0; i < k; i++) {
        int t = order[from + i];
        p->idx[i] = t;
        p->n[i] = c->nt[t];
        ids[i] = c->ids[t];
        types[i] = c->types[t];
    }
    size_t plane = (size_t)k * (size_t)len;
    int64_t *in_ids = p->buf, *in_mask = p->buf + plane, *in_types = p->buf + 2 * plane;
    mts_embed_fill(&c->e, k, len, ids, types, p->n, in_ids, in_mask, in_types);
    mts_request *r = &p->req;
    r->model = c->model;
    r->arrival_ns = c->arrival_ns;
    const char *names[3] = {c->e.ids_name, c->e.mask_name, c->e.types_name};
    int64_t *data[3] = {in_ids, in_mask, in_types};
    for (int j = 0; j < 3; j++) {
        if (!names[j][0]) continue;
        mts_tensor *t = &r->inputs[r->n_inputs];
        t->dtype = MTS_DTYPE_INT64;
        t->rank = 2;
        t->dims[0] = k;
        t->dims[1] = len;
        t->data = data[j];
        r->input_names[r->n_inputs++] = names[j];
    }
    r->requested[0] = c->e.out_name;
    r->n_requested = 1;
    r->threads = c->threads;
    r->alone = c->alone;
    r->padding_mask = c->e.mask_name[0] ? c->e.mask_name : NULL; /* pooling reads the valid tokens only */
    r->done = part_done;
    pthread_mutex_lock(&c->lock);
    c->pending++;
    pthread_mutex_unlock(&c->lock);
    mts_err err = {0};
    int retry = 0;
    int rc = mts_server_submit(c->s, r, &retry, &err);
    if (rc) {
        call_fail(c, rc, "%s", err.msg);
        free(p->idx);
        free(p->n);
        free(p->buf);
        free(p);
        call_unref(c);
    }
}

/* With the model's signature known: resolve names, bucket, submit. Consumes the caller's
 * pending reference. */
static void dispatch(embed_call *c)
{
    mts_model_status *st = malloc(sizeof *st);
    if (!st || mts_server_model_status_by_name(c->s, c->model, st) || st->n_inputs < 1) {
        call_fail(c, st ? MTS_EUNAVAILABLE : MTS_ENOMEM, "model '%s': its signature is not known (it is not loaded)",
                  c->model);
        free(st);
        call_unref(c);
        return;
    }
    char err[MTS_ERR_MSG_MAX];
    int rc = mts_embedder_init(&c->e, c->cfg, c->pad_id, st->n_inputs, st->inputs, st->n_outputs, st->outputs, err,
                               sizeof err);
    int max_batch = st->no_batching ? 1 : st->max_batch > 0 ? st->max_batch : 1;
    free(st);
    if (rc) {
        call_fail(c, MTS_PROTO_EPRECONDITION, "%s", err);
        call_unref(c);
        return;
    }
    /* a model with a shorter fixed length than the tokenizer's limit: cut, keeping the last token */
    for (int i = 0; i < c->n; i++)
        if (c->nt[i] > c->e.max_tokens) {
            c->ids[i][c->e.max_tokens - 1] = c->ids[i][c->nt[i] - 1];
            c->nt[i] = c->e.max_tokens;
        }
    int *order = order_by_length(c);
    if (!order) {
        call_fail(c, MTS_ENOMEM, "%s", "out of memory");
        call_unref(c);
        return;
    }
    c->order = order;
    c->spans = malloc(sizeof *c->spans * (size_t)c->n);
    if (!c->spans) {
        call_fail(c, MTS_ENOMEM, "%s", "out of memory");
        call_unref(c);
        return;
    }
    for (int i = 0; i < c->n;) {
        int len = mts_embed_bucket(&c->e, c->nt[order[i]]);
        int j = i;
        while (j < c->n && j - i < max_batch && c->nt[order[j]] <= len) j++;
        c->spans[c->n_spans].from = i, c->spans[c->n_spans].to = j, c->spans[c->n_spans].len = len;
        c->n_spans++;
        i = j;
    }
    int window = MAX_PARTS_IN_FLIGHT;
    const mts_embed_policy *pol = mts_embed_policy_for(c->cfg, c->n);
    if (pol) {
        c->threads = pol->threads;
        if (pol->workers > 1) { /* each bucket part into min(workers, k) sub-batches, in place */
            int n_sub = 0;
            for (int s = 0; s < c->n_spans; s++) {
                int k = c->spans[s].to - c->spans[s].from;
                n_sub += k < pol->workers ? k : pol->workers;
            }
            struct embed_span *sub = malloc(sizeof *sub * (size_t)n_sub);
            if (!sub) {
                call_fail(c, MTS_ENOMEM, "%s", "out of memory");
                call_unref(c);
                return;
            }
            int o = 0;
            for (int s = 0; s < c->n_spans; s++) {
                int from = c->spans[s].from, k = c->spans[s].to - from, w = k < pol->workers ? k : pol->workers;
                for (int q = 0; q < w; q++) { /* the first k % w sub-batches take one text more */
                    int size = k / w + (q < k % w), start = from + q * (k / w) + (q < k % w ? q : k % w);
                    sub[o].from = start, sub[o].to = start + size, sub[o].len = c->spans[s].len;
                    o++;
                }
            }
            free(c->spans);
            c->spans = sub;
            c->n_spans = n_sub;
            c->alone = true;
            if (pol->workers > window) window = pol->workers;
        }
    }
    for (int k = 0; k < window; k++) submit_next(c);
    call_unref(c);
}

static void loaded(void *user, int status, const char *msg)
{
    embed_call *c = user;
    if (status) {
        call_fail(c, status, "%s", msg ? msg : mts_status_text(status));
        call_unref(c);
        return;
    }
    dispatch(c);
}

bool mts_embed_is_model(const mts_server *s, const char *model)
{
    const mts_model_config *m = mts_config_find_model(mts_server_config(s), model);
    return m && m->tokenizer_path;
}

int mts_embed_submit(mts_server *s, const char *model, const mts_embed_input *in, int n, int64_t arrival_ns,
                     const mts_request *cancel, mts_embed_done done, void *user, char *msg, size_t msglen)
{
    const mts_model_config *m = mts_config_find_model(mts_server_config(s), model);
    if (!m) {
        mts_proto_unknown_model(msg, msglen, model);
        return MTS_ENOTFOUND;
    }
    if (!m->tokenizer_path) {
        snprintf(msg, msglen, "model '%s' is not an embedding model (its configuration has no 'tokenizer')", model);
        return MTS_EINVAL;
    }
    if (n < 1) {
        snprintf(msg, msglen, "no input texts");
        return MTS_EINVAL;
    }
    if (n > MTS_EMBED_MAX_TEXTS) {
        snprintf(msg, msglen, "%d inputs in one request; at most %d", n, MTS_EMBED_MAX_TEXTS);
        return MTS_EINVAL;
    }
    const mts_tokenizer *tok = get_tokenizer(m, msg, msglen);
    if (!tok) return MTS_EUNAVAILABLE;
    int max_tokens = mts_embed_config_max_tokens(m);
    embed_call *c = calloc(1, sizeof *c);
    if (!c) return snprintf(msg, msglen, "out of memory"), MTS_ENOMEM;
    pthread_mutex_init(&c->lock, NULL);
    c->s = s;
    c->cfg = m;
    snprintf(c->model, sizeof c->model, "%s", model);
    c->n = n;
    c->arrival_ns = arrival_ns ? arrival_ns : mts_server_clock_ns();
    c->done = done;
    c->user = user;
    c->cancel = cancel;
    c->pad_id = mts_tokenizer_pad_id(tok);
    c->ids = calloc((size_t)n, sizeof *c->ids);
    c->types = calloc((size_t)n, sizeof *c->types);
    c->nt = calloc((size_t)n, sizeof *c->nt);
    /* one text's tokens into scratch, then appended to the arena (ids then type ids): memory
     * follows the texts' real lengths, not n x max_tokens */
    int64_t *scratch = malloc(sizeof(int64_t) * 2 * (size_t)max_tokens);
    size_t *off = malloc(sizeof(size_t) * (size_t)n), used = 0, cap = 0;
    if (!c->ids || !c->types || !c->nt || !scratch || !off) {
        free(scratch);
        free(off);
        call_free(c);
        return snprintf(msg, msglen, "out of memory"), MTS_ENOMEM;
    }
#define FAIL_TEXT(status)                                                                                             \
    do {                                                                                                               \
        free(scratch);                                                                                                 \
        free(off);                                                                                                     \
        call_free(c);                                                                                                  \
        return (status);                                                                                               \
    } while (0)
    for (int i = 0; i < n; i++) {
        int64_t *ids = scratch, *types = scratch + max_tokens;
        int cnt;
        if (in[i].ids) {
            if (in[i].n_ids < 1 || in[i].n_ids > max_tokens) {
                snprintf(msg, msglen, "input %d has %d token ids; the model takes 1 to %d", i, in[i].n_ids, max_tokens);
                FAIL_TEXT(MTS_EINVAL);
            }
            int vocab = mts_tokenizer_vocab_size(tok);
            for (int j = 0; j < in[i].n_ids; j++)
                if (in[i].ids[j] < 0 || (vocab > 0 && in[i].ids[j] >= vocab)) {
                    snprintf(msg, msglen, "input %d: token id %lld at position %d is outside the vocabulary (0 to %d)",
                             i, (long long)in[i].ids[j], j, vocab - 1);
                    FAIL_TEXT(MTS_EINVAL);
                }
            memcpy(ids, in[i].ids, sizeof(int64_t) * (size_t)in[i].n_ids);
            memset(types, 0, sizeof(int64_t) * (size_t)in[i].n_ids);
            cnt = in[i].n_ids;
        } else {
            if (in[i].len > MTS_EMBED_MAX_TEXT_BYTES) {
                snprintf(msg, msglen, "input %d is %zu bytes; at most %d", i, in[i].len, MTS_EMBED_MAX_TEXT_BYTES);
                FAIL_TEXT(MTS_EINVAL);
            }
            char err[256] = "";
            cnt = mts_tokenize(tok, in[i].text, in[i].len, max_tokens, ids, types, max_tokens, err, sizeof err);
            if (cnt < 1) {
                snprintf(msg, msglen, "input %d: %s", i, err[0] ? err : "the tokenizer gave no tokens");
                FAIL_TEXT(MTS_EINVAL);
            }
        }
        if (used + 2 * (size_t)cnt > cap) {
            size_t nc = cap ? cap * 2 : 1024;
            while (nc < used + 2 * (size_t)cnt) nc *= 2;
            int64_t *na = realloc(c->arena, sizeof(int64_t) * nc);
            if (!na) {
                snprintf(msg, msglen, "out of memory");
                FAIL_TEXT(MTS_ENOMEM);
            }
            c->arena = na, cap = nc;
        }
        memcpy(c->arena + used, ids, sizeof(int64_t) * (size_t)cnt);
        memcpy(c->arena + used + cnt, types, sizeof(int64_t) * (size_t)cnt);
        off[i] = used;
        used += 2 * (size_t)cnt;
        c->nt[i] = cnt;
        c->tokens += cnt;
    }
#undef FAIL_TEXT
    for (int i = 0; i < n; i++) {
        c->ids[i] = c->arena + off[i];
        c->types[i] = c->arena + off[i] + c->nt[i];
    }
    free(scratch);
    free(off);
    c->pending = 1; /* dispatch's own reference */
    mts_model_status *st = malloc(sizeof *st);
    bool known = st && !mts_server_model_status_by_name(s, model, st) && st->n_inputs > 0;
    free(st);
    if (known) {
        dispatch(c);
        return MTS_OK;
    }
    if (mts_server_config(s)->model_control == MTS_CONTROL_EXPLICIT) {
        snprintf(msg, msglen, "model '%s' is not loaded (explicit model control: load it first)", model);
        call_free(c);
        return MTS_EUNAVAILABLE;
    }
    mts_err err = {0};
    int rc = mts_server_load(s, model, false, loaded, c, &err);
    if (rc) {
        snprintf(msg, msglen, "%s", err.msg);
        call_free(c);
        return rc;
    }
    return MTS_OK;
}

int mts_embed_split_bytes(const uint8_t *p, size_t len, mts_embed_input *out, int cap, char *msg, size_t msglen)
{
    size_t off = 0;
    int n = 0;
    while (off < len) {
        if (len - off < 4) {
            snprintf(msg, msglen, "BYTES element %d at byte %zu: truncated length prefix (%zu bytes left)", n, off,
                     len - off);
            return -1;
        }
        uint32_t l = (uint32_t)p[off] | (uint32_t)p[off + 1] << 8 | (uint32_t)p[off + 2] << 16 |
                     (uint32_t)p[off + 3] << 24;
        off += 4;
        if (l > len - off) {
            snprintf(msg, msglen, "BYTES element %d at byte %zu: length %u runs past the end of the data (%zu bytes "
                     "left)", n, off - 4, l, len - off);
            return -1;
        }
        if (n == cap) {
            snprintf(msg, msglen, "more than %d BYTES elements; at most %d texts per request", cap, cap);
            return -1;
        }
        out[n].text = (const char *)p + off;
        out[n].len = l;
        out[n].ids = NULL;
        n++;
        off += l;
    }
    return n;
}
