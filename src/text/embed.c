/*
 * Embedding-model plumbing shared by the server and the command line (embed.h): resolving an
 * encoder's input and output names from its signature, length buckets, filling the padded
 * input batch, and pooling plus L2 normalization of the output.
 */
#include "text/embed.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"

int mts_embed_config_max_tokens(const mts_model_config *m)
{
    return m->max_tokens > 0 ? m->max_tokens : MTS_EMBED_DEFAULT_MAX_TOKENS;
}

static int find_input(int n_in, const mts_tensor_meta *in, const char *name)
{
    for (int i = 0; i < n_in; i++)
        if (!strcmp(in[i].name, name)) return i;
    return -1;
}

/* A configured name (must exist) or the conventional one (may be absent): index or -1; -2 when a
 * configured name is not an input. */
static int pick(int n_in, const mts_tensor_meta *in, const char *configured, const char *conventional)
{
    if (configured) {
        int i = find_input(n_in, in, configured);
        return i >= 0 ? i : -2;
    }
    return find_input(n_in, in, conventional);
}

static void input_list(int n_in, const mts_tensor_meta *in, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n_in && o + 1 < len; i++) {
        int w = snprintf(buf + o, len - o, "%s'%s'", i ? ", " : "", in[i].name);
        if (w < 0) break;
        o += (size_t)w;
    }
}

int mts_embedder_init(mts_embedder *e, const mts_model_config *m, int64_t pad_id, int n_in,
                      const mts_tensor_meta *in, int n_out, const mts_tensor_meta *out, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    e->pooling = m->pooling;
    e->normalize = m->normalize;
    e->pad_id = pad_id;
    char names[400];
    input_list(n_in, in, names, sizeof names);
    int ids = pick(n_in, in, m->input_ids_name, "input_ids");
    int mask = pick(n_in, in, m->attention_mask_name, "attention_mask");
    int types = pick(n_in, in, m->token_type_ids_name, "token_type_ids");
    if (ids == -2 || mask == -2 || types == -2) {
        const char *which = ids == -2 ? m->input_ids_name : mask == -2 ? m->attention_mask_name : m->token_type_ids_name;
        snprintf(err, errlen, "model '%s': configured input '%s' is not an input of the model (its inputs are %s)",
                 m->name, which, names);
        return -1;
    }
    if (ids < 0) {
        /* no input called input_ids: the one input that is neither the mask nor the type ids */
        for (int i = 0; i < n_in; i++)
            if (i != mask && i != types) {
                if (ids >= 0) {
                    ids = -1;
                    break;
                }
                ids = i;
            }
    }
    if (ids < 0 || n_out < 1) {
        snprintf(err, errlen, "model '%s' is not a text encoder: cannot tell its token ids input (its inputs are %s; "
                 "set input_ids_name)", m->name, names);
        return -1;
    }
    int used = 1 + (mask >= 0) + (types >= 0);
    if (used != n_in) {
        snprintf(err, errlen, "model '%s' has inputs besides token ids, attention mask and token type ids (its "
                 "inputs are %s); name them with input_ids_name, attention_mask_name, token_type_ids_name", m->name,
                 names);
        return -1;
    }
    int idx[3] = {ids, mask, types};
    e->fixed_len = 0;
    for (int j = 0; j < 3; j++) {
        if (idx[j] < 0) continue;
        const mts_tensor_meta *t = &in[idx[j]];
        if (t->dtype != MTS_DTYPE_INT64 || t->rank != 2) {
            snprintf(err, errlen, "model '%s': input '%s' must be int64 [batch, sequence] (it is %s of rank %d)",
                     m->name, t->name, mts_dtype_name(t->dtype), t->rank);
            return -1;
        }
        if (t->dims[1] > 0) e->fixed_len = (int)(t->dims[1] > 65536 ? 65536 : t->dims[1]);
    }
    snprintf(e->ids_name, sizeof e->ids_name, "%s", in[ids].name);
    if (mask >= 0) snprintf(e->mask_name, sizeof e->mask_name, "%s", in[mask].name);
    if (types >= 0) snprintf(e->types_name, sizeof e->types_name, "%s", in[types].name);
    e->n_inputs = used;
    int o = 0;
    if (m->output_name) {
        o = -1;
        for (int i = 0; i < n_out; i++)
            if (!strcmp(out[i].name, m->output_name)) o = i;
        if (o < 0) {
            snprintf(err, errlen, "model '%s': output_name '%s' is not an output of the model (the first is '%s')",
                     m->name, m->output_name, out[0].name);
            return -1;
        }
    }
    if (out[o].dtype != MTS_DTYPE_FLOAT || (out[o].rank != 2 && out[o].rank != 3)) {
        snprintf(err, errlen, "model '%s': output '%s' must be float32 [batch, sequence, hidden] or [batch, hidden] "
                 "(it is %s of rank %d)", m->name, out[o].name, mts_dtype_name(out[o].dtype), out[o].rank);
        return -1;
    }
    snprintf(e->out_name, sizeof e->out_name, "%s", out[o].name);
    e->max_tokens = mts_embed_config_max_tokens(m);
    if (e->fixed_len && e->max_tokens > e->fixed_len) e->max_tokens = e->fixed_len;
    return 0;
}

int mts_embed_bucket(const mts_embedder *e, int n)
{
    if (e->fixed_len) return e->fixed_len;
    int b = MTS_EMBED_MIN_BUCKET;
    while (b < n) b *= 2;
    return b > e->max_tokens ? (n > e->max_tokens ? n : e->max_tokens) : b;
}

void mts_embed_fill(const mts_embedder *e, int k, int len, const int64_t *const *ids, const int64_t *const *types,
                    const int *n, int64_t *ids_out, int64_t *mask_out, int64_t *types_out)
{
    for (int i = 0; i < k; i++) {
        int64_t *ro = ids_out + (size_t)i * len;
        memcpy(ro, ids[i], sizeof(int64_t) * (size_t)n[i]);
        for (int j = n[i]; j < len; j++) ro[j] = e->pad_id;
        if (mask_out) {
            int64_t *mo = mask_out + (size_t)i * len;
            for (int j = 0; j < len; j++) mo[j] = j < n[i];
        }
        if (types_out) {
            int64_t *to = types_out + (size_t)i * len;
            if (types && types[i]) memcpy(to, types[i], sizeof(int64_t) * (size_t)n[i]);
            else memset(to, 0, sizeof(int64_t) * (size_t)n[i]);
            memset(to + n[i], 0, sizeof(int64_t) * (size_t)(len - n[i]));
        }
    }
}

int64_t mts_embed_output_dim(const mts_tensor *t, int k, int len, char *err, size_t errlen)
{
    bool ok = t->dtype == MTS_DTYPE_FLOAT && t->data && t->dims[0] == k &&
              ((t->rank == 3 && t->dims[1] == len && t->dims[2] > 0) || (t->rank == 2 && t->dims[1] > 0));
    if (!ok) {
        snprintf(err, errlen, "the embedding output is %s of rank %d with %lld rows; expected float32 [%d, %d, hidden] "
                 "or [%d, hidden]", mts_dtype_name(t->dtype), t->rank, (long long)(t->rank > 0 ? t->dims[0] : 0), k,
                 len, k);
        return -1;
    }
    return t->dims[t->rank - 1];
}

void mts_embed_pool(const mts_embedder *e, const mts_tensor *t, int k, int len, const int *n, float *dst)
{
    const float *src = t->data;
    int64_t h = t->dims[t->rank - 1];
    for (int i = 0; i < k; i++) {
        float *o = dst + (size_t)i * h;
        if (t->rank == 2) {
            memcpy(o, src + (size_t)i * h, sizeof(float) * (size_t)h);
        } else {
            const float *row = src + (size_t)i * len * h;
            int cnt = n[i] < 1 ? 1 : n[i] > len ? len : n[i];
            if (e->pooling == MTS_POOL_CLS) {
                memcpy(o, row, sizeof(float) * (size_t)h);
            } else if (e->pooling == MTS_POOL_LAST) {
                memcpy(o, row + (size_t)(cnt - 1) * h, sizeof(float) * (size_t)h);
            } else {
                /* mean over the tokens the attention mask keeps; double sums for stability */
                double acc[1024];
                for (int64_t c0 = 0; c0 < h; c0 += 1024) {
                    int64_t w = h - c0 < 1024 ? h - c0 : 1024;
                    for (int64_t c = 0; c < w; c++) acc[c] = 0;
                    for (int j = 0; j < cnt; j++) {
                        const float *x = row + (size_t)j * h + c0;
                        for (int64_t c = 0; c < w; c++) acc[c] += x[c];
                    }
                    for (int64_t c = 0; c < w; c++) o[c0 + c] = (float)(acc[c] / cnt);
                }
            }
        }
        if (e->normalize) {
            double ss = 0;
            for (int64_t c = 0; c < h; c++) ss += (double)o[c] * o[c];
            double norm = sqrt(ss);
            /* as torch.nn.functional.normalize: divide by max(norm, eps) */
            float inv = (float)(1.0 / (norm > 1e-12 ? norm : 1e-12));
            for (int64_t c = 0; c < h; c++) o[c] *= inv;
        }
    }
}

static void base64(const uint8_t *p, size_t n, char *out)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *out++ = tab[v >> 18], *out++ = tab[(v >> 12) & 63], *out++ = tab[(v >> 6) & 63], *out++ = tab[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
        *out++ = tab[v >> 18], *out++ = tab[(v >> 12) & 63];
        *out++ = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        *out++ = '=';
    }
}

char *mts_embed_openai_json(const char *model, const float *vecs, int n, int64_t dim, int64_t tokens, bool b64,
                            size_t *len)
{
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "object");
    mts_jw_string(&w, "list");
    mts_jw_key(&w, "data");
    mts_jw_begin_array(&w);
    size_t b64_len = ((size_t)dim * 4 + 2) / 3 * 4;
    char *text = b64 ? malloc(b64_len) : NULL;
    uint8_t *bytes = b64 ? malloc((size_t)dim * 4) : NULL;
    bool oom = b64 && (!text || !bytes);
    for (int i = 0; i < n && !oom; i++) {
        const float *v = vecs + (size_t)i * dim;
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "object");
        mts_jw_string(&w, "embedding");
        mts_jw_key(&w, "embedding");
        if (b64) {
            /* little-endian float32 bytes, whatever the host order */
            for (int64_t j = 0; j < dim; j++) {
                uint32_t u;
                memcpy(&u, &v[j], 4);
                bytes[4 * j] = (uint8_t)u, bytes[4 * j + 1] = (uint8_t)(u >> 8);
                bytes[4 * j + 2] = (uint8_t)(u >> 16), bytes[4 * j + 3] = (uint8_t)(u >> 24);
            }
            base64(bytes, (size_t)dim * 4, text);
            mts_jw_string_n(&w, text, b64_len);
        } else {
            mts_jw_begin_array(&w);
            for (int64_t j = 0; j < dim; j++) mts_jw_float(&w, v[j]);
            mts_jw_end_array(&w);
        }
        mts_jw_key(&w, "index");
        mts_jw_int(&w, i);
        mts_jw_end_object(&w);
    }
    mts_jw_end_array(&w);
    mts_jw_key(&w, "model");
    mts_jw_string(&w, model);
    mts_jw_key(&w, "usage");
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "prompt_tokens");
    mts_jw_int(&w, tokens);
    mts_jw_key(&w, "total_tokens");
    mts_jw_int(&w, tokens);
    mts_jw_end_object(&w);
    mts_jw_end_object(&w);
    free(text);
    free(bytes);
    char *out = oom ? NULL : mts_jw_take(&w, len);
    mts_jw_free(&w);
    return out;
}
