/*
 * `mtserve embed MODEL TEXT...`: sentence embeddings on the command line, no server. MODEL is
 * a model folder (model.onnx or <version>/model.onnx with config.yaml / config.pbtxt giving the
 * embedding keys, docs/embeddings.md) or, with --config FILE, a model name in that
 * configuration. The texts are taken --batch at a time (a request of that many), each group
 * tokenized, grouped by length bucket, run and pooled exactly as the server does a request
 * (text/embed.h); the vectors are printed one per line, or as an OpenAI-style JSON document with
 * --json. --bench SECONDS instead measures texts per second over the given texts (tokenization
 * included) in requests of --batch texts;
 * --tokens prints the token ids (what the model is fed, before padding).
 */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "config/config.h"
#include "text/embed.h"
#include "util/json.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mtserve embed MODEL [options] TEXT...\n"
            "  MODEL           a model folder (model.onnx + config.yaml or config.pbtxt with 'tokenizer',\n"
            "                  or a GGUF BERT encoder model.gguf), or a model name with --config\n"
            "  TEXT            texts to embed; '-' reads one text per line from standard input\n"
            "options:\n"
            "  --config FILE   the server configuration (YAML) that defines MODEL\n"
            "  --json          print {\"data\":[{\"index\",\"embedding\"}],\"usage\"} instead of one vector per line\n"
            "  --threads N     intra-op threads (default: online cores)\n"
            "  --batch N       texts per request (default 32): the texts N at a time, each group sorted\n"
            "                  by length and run in length buckets, as the server runs a request\n"
            "  --bench SECONDS run the texts repeatedly for SECONDS and print texts per second\n"
            "  --tokens        print each text's token ids (one line per text) instead of vectors\n"
            "  --precision P   auto, fp32, bf16, fp16 or int8 (default: the model's `precision` setting)\n"
            "  --max-error E   the reduced-precision guard's bound (default: the model's `max_error`)\n");
}

typedef struct emb_text {
    char *s;
    size_t len;
    int64_t *ids, *types;
    int n;
} emb_text;

static int add_text(emb_text **t, int *n, int *cap, const char *s, size_t len)
{
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        emb_text *nt = realloc(*t, sizeof **t * (size_t)nc);
        if (!nt) return -1;
        *t = nt, *cap = nc;
    }
    emb_text *x = &(*t)[*n];
    memset(x, 0, sizeof *x);
    x->s = strndup(s, len);
    x->len = len;
    if (!x->s) return -1;
    (*n)++;
    return 0;
}

/* Finds the model: a folder (scanned as a one-model repository) or a name in --config. */
int mts_cli_embed_find(const char *model, const char *config, mts_config *c, const mts_model_config **out)
{
    mts_err err = {0};
    mts_config_defaults(c);
    int rc;
    const char *name = model;
    char *copy = NULL, *parent = NULL;
    if (config) {
        rc = mts_config_load_yaml(config, c, NULL, NULL, &err);
    } else {
        copy = strdup(model);
        char *p2 = strdup(model);
        if (!copy || !p2) {
            free(copy), free(p2);
            fprintf(stderr, "mtserve embed: out of memory\n");
            return 1;
        }
        size_t l = strlen(copy);
        while (l > 1 && copy[l - 1] == '/') copy[--l] = 0, p2[l] = 0;
        name = basename(copy);
        parent = dirname(p2);
        rc = mts_config_scan_repository(c, parent, NULL, NULL, &err);
        name = name ? name : model;
        const mts_model_config *m = rc ? NULL : mts_config_find_model(c, name);
        if (!rc && !m) {
            fprintf(stderr, "mtserve embed: %s is not a model folder (no model.onnx or model.gguf in it, no version folder)\n",
                    model);
            free(copy), free(p2);
            return 1;
        }
        *out = m;
        free(p2);
    }
    if (rc) {
        fprintf(stderr, "mtserve embed: %s\n", err.msg);
        free(copy);
        return 1;
    }
    if (config) *out = mts_config_find_model(c, name);
    if (!*out) {
        fprintf(stderr, "mtserve embed: %s defines no model '%s'\n", config, name);
        free(copy);
        return 1;
    }
    free(copy);
    if (!(*out)->tokenizer_path) {
        fprintf(stderr, "mtserve embed: model '%s' is not an embedding model (its configuration has no 'tokenizer')\n",
                (*out)->name);
        return 1;
    }
    return 0;
}

/* qsort has no context argument in C11: the texts being sorted (one thread) */
static const emb_text *g_sort_texts;
static int cmp_len_g(const void *a, const void *b)
{
    const emb_text *t = g_sort_texts;
    int x = *(const int *)a, y = *(const int *)b;
    return t[x].n != t[y].n ? (t[x].n > t[y].n) - (t[x].n < t[y].n) : (x > y) - (x < y);
}

/* Tokenizes every text; 0 or 1 (message printed). */
static int tokenize_all(const mts_tokenizer *tok, int max_tokens, emb_text *t, int n, int64_t *tokens)
{
    *tokens = 0;
    for (int i = 0; i < n; i++) {
        char err[256] = "";
        if (!t[i].ids) {
            t[i].ids = malloc(sizeof(int64_t) * (size_t)max_tokens);
            t[i].types = malloc(sizeof(int64_t) * (size_t)max_tokens);
            if (!t[i].ids || !t[i].types) {
                fprintf(stderr, "mtserve embed: out of memory\n");
                return 1;
            }
        }
        t[i].n = mts_tokenize(tok, t[i].s, t[i].len, max_tokens, t[i].ids, t[i].types, max_tokens, err, sizeof err);
        if (t[i].n < 1) {
            fprintf(stderr, "mtserve embed: text %d: %s\n", i, err[0] ? err : "no tokens");
            return 1;
        }
        *tokens += t[i].n;
    }
    return 0;
}

/* Runs every text through the model into vecs (n x *dim, allocated here on first use): the
 * texts `batch` at a time in their order, as the server gets a request of that many, each such
 * group sorted by length and run in length buckets as the server runs a request. */
static int embed_all(mts_ctx *ctx, const mts_model *mdl, const mts_embedder *e, emb_text *t, int n, int batch,
                     float **vecs, int64_t *dim)
{
    int *order = malloc(sizeof(int) * (size_t)n);
    if (!order) return 1;
    for (int i = 0; i < n; i++) order[i] = i;
    g_sort_texts = t;
    for (int c = 0; c < n; c += batch)
        qsort(order + c, (size_t)(n - c < batch ? n - c : batch), sizeof(int), cmp_len_g);
    int rc = 0;
    mts_model_info info;
    mts_model_get_info(mdl, &info);
    int n_in = info.n_inputs;
    for (int i = 0; i < n && !rc;) {
        int len = mts_embed_bucket(e, t[order[i]].n);
        int j = i, group_end = (i / batch + 1) * batch < n ? (i / batch + 1) * batch : n;
        while (j < group_end && t[order[j]].n <= len) j++;
        int k = j - i;
        const int64_t *ids[k > 0 ? k : 1], *types[k > 0 ? k : 1];
        int cnt[k > 0 ? k : 1];
        for (int r = 0; r < k; r++) ids[r] = t[order[i + r]].ids, types[r] = t[order[i + r]].types,
                                    cnt[r] = t[order[i + r]].n;
        size_t plane = (size_t)k * (size_t)len;
        int64_t *buf = malloc(sizeof(int64_t) * 3 * plane);
        if (!buf) {
            rc = 1;
            break;
        }
        mts_embed_fill(e, k, len, ids, types, cnt, buf, buf + plane, buf + 2 * plane);
        mts_tensor in[MTS_REQ_MAX_TENSORS];
        for (int x = 0; x < n_in; x++) {
            const char *name = mts_model_input(mdl, x)->name;
            int which = !strcmp(name, e->ids_name) ? 0 : !strcmp(name, e->mask_name) ? 1 : 2;
            in[x] = (mts_tensor){.dtype = MTS_DTYPE_INT64, .rank = 2, .dims = {k, len}, .data = buf + which * plane};
        }
        const mts_tensor *outs[MTS_REQ_MAX_TENSORS];
        mts_err err = {0};
        if (mts_ctx_run(ctx, in, n_in, outs, &err)) {
            fprintf(stderr, "mtserve embed: %s\n", err.msg);
            free(buf);
            rc = 1;
            break;
        }
        const mts_tensor *o = NULL;
        for (int x = 0; x < info.n_outputs; x++)
            if (!strcmp(mts_model_output(mdl, x)->name, e->out_name)) o = outs[x];
        char msg[300];
        int64_t d = o ? mts_embed_output_dim(o, k, len, msg, sizeof msg) : -1;
        if (d < 0) {
            fprintf(stderr, "mtserve embed: %s\n", o ? msg : "no such output");
            free(buf);
            rc = 1;
            break;
        }
        if (!*vecs) {
            *dim = d;
            *vecs = malloc(sizeof(float) * (size_t)n * (size_t)d);
            if (!*vecs) {
                free(buf);
                rc = 1;
                break;
            }
        }
        float *tmp = malloc(sizeof(float) * (size_t)k * (size_t)d);
        if (!tmp) {
            free(buf);
            rc = 1;
            break;
        }
        mts_embed_pool(e, o, k, len, cnt, tmp);
        for (int r = 0; r < k; r++)
            memcpy(*vecs + (size_t)order[i + r] * d, tmp + (size_t)r * d, sizeof(float) * (size_t)d);
        free(tmp);
        free(buf);
        i = j;
    }
    free(order);
    return rc;
}

void mts_cli_embed_padding(struct mts_ctx *ctx, const struct mts_embedder *e, const mts_model *mdl)
{
    mts_model_info info;
    mts_model_get_info(mdl, &info);
    for (int i = 0; e->mask_name[0] && i < info.n_inputs; i++)
        if (!strcmp(mts_model_input(mdl, i)->name, e->mask_name)) mts_ctx_set_padding_mask(ctx, i);
}

int mts_cli_embedder_init(struct mts_embedder *e, const struct mts_model_config *mc, const mts_model *mdl,
                          int64_t pad_id, int *n_in_out, int *n_out_out, char *err, size_t errlen)
{
    mts_model_info info;
    mts_model_get_info(mdl, &info);
    mts_tensor_meta in[MTS_REQ_MAX_TENSORS], out[MTS_REQ_MAX_TENSORS];
    int n_in = info.n_inputs < MTS_REQ_MAX_TENSORS ? info.n_inputs : MTS_REQ_MAX_TENSORS;
    int n_out = info.n_outputs < MTS_REQ_MAX_TENSORS ? info.n_outputs : MTS_REQ_MAX_TENSORS;
    for (int i = 0; i < n_in + n_out; i++) {
        const mts_value *v = i < n_in ? mts_model_input(mdl, i) : mts_model_output(mdl, i - n_in);
        mts_tensor_meta *m = i < n_in ? &in[i] : &out[i - n_in];
        memset(m, 0, sizeof *m);
        snprintf(m->name, sizeof m->name, "%s", v->name);
        m->dtype = v->dtype;
        m->rank = v->rank;
        for (int d = 0; d < v->rank && d < MTS_MAX_RANK; d++) m->dims[d] = v->dims[d];
    }
    if (n_in_out) *n_in_out = n_in;
    if (n_out_out) *n_out_out = n_out;
    return mts_embedder_init(e, mc, pad_id, n_in, in, n_out, out, err, errlen) ? -1 : 0;
}

int mts_cli_embed(int argc, char **argv)
{
    const char *model = NULL, *config = NULL;
    bool json = false, show_tokens = false;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), batch = 32;
    double bench_s = 0;
    emb_text *texts = NULL;
    int n = 0, cap = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int pa = mts_cli_precision_arg("embed", argc, argv, &i);
        if (pa < 0) return 2;
        if (pa > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--tokens")) {
            show_tokens = true;
        } else if ((!strcmp(a, "--config") || !strcmp(a, "--threads") || !strcmp(a, "--batch") ||
                    !strcmp(a, "--bench")) && i + 1 < argc) {
            const char *v = argv[++i];
            char *end;
            if (!strcmp(a, "--config")) config = v;
            else if (!strcmp(a, "--bench")) {
                bench_s = strtod(v, &end);
                if (*end || !(bench_s > 0 && bench_s <= 3600)) {
                    fprintf(stderr, "mtserve embed: --bench takes seconds (0 to 3600)\n");
                    return 2;
                }
            } else {
                long x = strtol(v, &end, 10);
                if (*end || x < 1 || x > 4096) {
                    fprintf(stderr, "mtserve embed: %s takes an integer from 1 to 4096\n", a);
                    return 2;
                }
                if (!strcmp(a, "--threads")) threads = (int)x;
                else batch = (int)x;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "mtserve embed: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!model) {
            model = a;
        } else if (!strcmp(a, "-")) {
            char *line = NULL;
            size_t lcap = 0;
            ssize_t l;
            while ((l = getline(&line, &lcap, stdin)) >= 0) {
                while (l > 0 && (line[l - 1] == '\n' || line[l - 1] == '\r')) l--;
                if (l > 0 && add_text(&texts, &n, &cap, line, (size_t)l)) return 1;
            }
            free(line);
        } else if (add_text(&texts, &n, &cap, a, strlen(a))) {
            return 1;
        }
    }
    if (!model || n == 0) {
        usage(stderr);
        return 2;
    }
    if (threads < 1) threads = 1;
    mts_config cfg;
    const mts_model_config *mc = NULL;
    int rc = mts_cli_embed_find(model, config, &cfg, &mc);
    if (rc) {
        mts_config_free(&cfg);
        return rc;
    }
    char err[400] = "";
    int lc = mc->lowercase == 1 ? 1 : mc->lowercase == 2 ? 0 : -1;
    mts_tokenizer *tok = mts_tokenizer_load(mc->tokenizer_path, lc, err, sizeof err);
    mts_model *mdl = NULL;
    mts_ctx *ctx = NULL;
    float *vecs = NULL;
    int64_t dim = 0, tokens = 0;
    mts_embedder e;
    rc = 1;
    if (!tok) {
        fprintf(stderr, "mtserve embed: tokenizer %s: %s\n", mc->tokenizer_path, err);
        goto done;
    }
    double load_ms;
    if (mts_cli_load_config(mc, &mdl, &load_ms)) goto done;
    if (mts_cli_embedder_init(&e, mc, mdl, mts_tokenizer_pad_id(tok), NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "mtserve embed: %s\n", err);
        goto done;
    }
    mts_err merr = {0};
    if (mts_ctx_create(mdl, threads, &ctx, &merr)) {
        fprintf(stderr, "mtserve embed: %s\n", merr.msg);
        goto done;
    }
    mts_cli_embed_padding(ctx, &e, mdl);
    if (show_tokens) {
        if (tokenize_all(tok, e.max_tokens, texts, n, &tokens)) goto done;
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < texts[i].n; j++) printf("%s%lld", j ? " " : "", (long long)texts[i].ids[j]);
            putchar('\n');
        }
        rc = 0;
        goto done;
    }
    if (tokenize_all(tok, e.max_tokens, texts, n, &tokens) || embed_all(ctx, mdl, &e, texts, n, batch, &vecs, &dim))
        goto done;
    if (bench_s > 0) {
        /* warm: every bucket's plan is built by the run above */
        double t0 = mts_cli_now_ms(), t = t0;
        long runs = 0;
        while (t - t0 < bench_s * 1000) {
            if (tokenize_all(tok, e.max_tokens, texts, n, &tokens) ||
                embed_all(ctx, mdl, &e, texts, n, batch, &vecs, &dim))
                goto done;
            runs++;
            t = mts_cli_now_ms();
        }
        double s = (t - t0) / 1000;
        printf("{\"texts_per_s\": %.2f, \"texts\": %ld, \"seconds\": %.3f, \"batch\": %d, \"threads\": %d, "
               "\"tokens_per_text\": %.1f}\n", (double)runs * n / s, runs * n, s, batch, threads,
               (double)tokens / n);
        rc = 0;
        goto done;
    }
    if (json) {
        size_t len = 0;
        char *text = mts_embed_openai_json(mc->name, vecs, n, dim, tokens, false, &len);
        if (!text) goto done;
        fwrite(text, 1, len, stdout);
        fputc('\n', stdout);
        free(text);
    } else {
        for (int i = 0; i < n; i++) {
            for (int64_t d = 0; d < dim; d++) {
                char buf[32];
                mts_json_format_float(vecs[(size_t)i * dim + d], buf);
                printf("%s%s", d ? " " : "", buf);
            }
            putchar('\n');
        }
    }
    rc = 0;
done:
    free(vecs);
    for (int i = 0; i < n; i++) free(texts[i].s), free(texts[i].ids), free(texts[i].types);
    free(texts);
    mts_ctx_free(ctx);
    mts_model_free(mdl);
    mts_tokenizer_free(tok);
    mts_config_free(&cfg);
    return rc;
}
