/*
 * `mtserve tune MODEL --embedding`: the worker-pool tuning study for a sentence-embedding model,
 * measured on this machine, ending in an embedding_policy for the model's configuration.
 *
 * For every batch size B (texts per request; default 1, 2, 4, 8, 16, 32) and every split of the
 * cores into W workers x T intra-op threads (W x T <= cores, W <= B) it runs requests of B texts
 * the way the server does with that policy entry: the texts are tokenized, ordered by length and
 * grouped into length-bucket parts, each part split into min(W, k) contiguous sub-batches of
 * near-equal size, which W workers (each with its own execution context of T threads) take in
 * turn, pad to the part's bucket, run and pool in parallel; a request ends when its last
 * sub-batch does. W = 1 with T = cores is fine-grained parallelism
 * (threads inside each matrix multiply), W = cores with T = 1 coarse-grained (texts in
 * parallel). Each setting runs for --seconds (after one untimed pass over the texts, so plans
 * are built before the clock starts), in --rounds slices taken round-robin with the batch size's
 * other settings (default 3), and reports texts/s and the p50 / p99 request latency.
 *
 * For each batch size the setting with the most texts/s wins (one worker with every core, what
 * runs without a policy, unless another beats it by 5 %); consecutive batch sizes with the
 * same winner are merged into one entry, and the policy (config.h mts_embed_policy) is printed
 * and, with -o FILE, written as a config.yaml fragment. Progress goes to stderr, one line per
 * setting.
 *
 * --policy SPEC measures a given policy instead of sweeping: per batch size only the policy's
 * (W, T) and one worker with every core (what the server runs without a policy on an idle
 * device), and prints texts/s with and without it (scripts/bench-embed.sh uses this).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "config/config.h"
#include "text/embed.h"

/* Varied texts: one to a few dozen words, so requests span several length buckets. */
static const char *const corpus[] = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "A",
    "Sentence embeddings map a text to one vector; similar texts get nearby vectors.",
    "How do I reset my password?",
    "Semantic search ranks documents by the cosine similarity of their embeddings to the query's embedding, "
    "which finds passages that share meaning rather than words.",
    "short one",
    "numbers 12345 and symbols #$% are tokens too",
    "The meeting has been moved to Thursday afternoon at three o'clock in the small conference room.",
    "Caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France, on the Seine river in the north of the country.",
    "Batching texts of similar length together keeps padding, and so wasted compute, small.",
    "ok",
    "Deduplication drops near-identical records: two support tickets describing the same outage get vectors whose "
    "cosine similarity is close to one, while unrelated tickets stay far apart, so a threshold separates them.",
    "Please summarize the attached report in three bullet points.",
    "Clustering groups customer reviews by topic without labels.",
    "The server splits large requests into sub-batches that run on several workers at once.",
    "Latency matters for single queries; throughput matters for bulk indexing jobs.",
    "I would like to order two large pizzas with extra cheese and a bottle of sparkling water, delivered to the "
    "office before noon if that is possible.",
    "Error: connection refused",
    "Machine learning models turn raw text into numbers a computer can compare.",
    "Is it going to rain tomorrow?",
    "The library opens at nine and closes at six on weekdays; on weekends it closes at four.",
    "embedding",
    "Vector databases store embeddings and answer nearest-neighbour queries over millions of them in "
    "milliseconds, using approximate indexes such as HNSW graphs or inverted files with product quantization.",
    "Thanks!",
    "Translate this sentence into German, please.",
    "The function returns the number of bytes written, or a negative value on error.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Where is the nearest train station?",
    "Two texts with the same meaning but different words should still land close together in the vector space.",
};
#define N_CORPUS ((int)(sizeof corpus / sizeof corpus[0]))

typedef struct tok_text {
    int64_t *ids, *types;
    int n;
} tok_text;

typedef struct tune_ctx tune_ctx;

typedef struct ew_worker {
    tune_ctx *t;
    int index;
    mts_ctx *ctx;
    pthread_t th;
    int rc;
    char msg[300];
} ew_worker;

/* The shared state of one sweep: the model, the texts, the workers and the request in flight. */
struct tune_ctx {
    mts_model *mdl;
    const mts_tokenizer *tok;
    mts_embedder e;
    int n_in, n_out; /* the model's inputs and outputs (at most MTS_REQ_MAX_TENSORS) */
    int max_tokens;
    char **texts;
    size_t *lens;
    int n_texts;
    /* the request in flight: tokens of its B texts in length order, split into W sub-batches */
    tok_text *req;
    int *order;
    struct { int from, to, len; } *subs; /* the sub-batches of the request in flight */
    int n_subs;
    _Atomic int next_sub;                /* the next one a free worker takes */
    int batch, workers;
    bool quit;
    pthread_barrier_t start, end;
    ew_worker w[64];
};

/* Pads, runs and pools sub-batch q of the request in flight on worker w's context. */
static int run_sub(tune_ctx *t, ew_worker *w, int q)
{
    int from = t->subs[q].from, size = t->subs[q].to - from;
    if (size < 1) return 0;
    const int64_t **ids = malloc(sizeof *ids * (size_t)size), **types = malloc(sizeof *types * (size_t)size);
    int *cnt = malloc(sizeof *cnt * (size_t)size);
    if (!ids || !types || !cnt) {
        free(ids), free(types), free(cnt);
        return snprintf(w->msg, sizeof w->msg, "out of memory"), -1;
    }
    for (int r = 0; r < size; r++) {
        const tok_text *x = &t->req[t->order[from + r]];
        ids[r] = x->ids, types[r] = x->types, cnt[r] = x->n;
    }
    int len = t->subs[q].len;
    size_t plane = (size_t)size * (size_t)len;
    int64_t *buf = malloc(sizeof(int64_t) * 3 * plane);
    float *tmp = NULL;
    int rc = -1;
    if (!buf) {
        snprintf(w->msg, sizeof w->msg, "out of memory");
        goto out;
    }
    mts_embed_fill(&t->e, size, len, ids, types, cnt, buf, buf + plane, buf + 2 * plane);
    mts_tensor in[MTS_REQ_MAX_TENSORS];
    for (int x = 0; x < t->n_in; x++) {
        const char *name = mts_model_input(t->mdl, x)->name;
        int which = !strcmp(name, t->e.ids_name) ? 0 : !strcmp(name, t->e.mask_name) ? 1 : 2;
        in[x] = (mts_tensor){.dtype = MTS_DTYPE_INT64, .rank = 2, .dims = {size, len}, .data = buf + which * plane};
    }
    const mts_tensor *outs[MTS_REQ_MAX_TENSORS];
    mts_err err = {0};
    if (mts_ctx_run(w->ctx, in, t->n_in, outs, &err)) {
        snprintf(w->msg, sizeof w->msg, "%s", err.msg);
        goto out;
    }
    const mts_tensor *o = NULL;
    for (int x = 0; x < t->n_out; x++)
        if (!strcmp(mts_model_output(t->mdl, x)->name, t->e.out_name)) o = outs[x];
    int64_t d = o ? mts_embed_output_dim(o, size, len, w->msg, sizeof w->msg) : -1;
    if (d < 0) {
        if (!o) snprintf(w->msg, sizeof w->msg, "the model has no output '%s'", t->e.out_name);
        goto out;
    }
    tmp = malloc(sizeof(float) * (size_t)size * (size_t)d);
    if (!tmp) {
        snprintf(w->msg, sizeof w->msg, "out of memory");
        goto out;
    }
    mts_embed_pool(&t->e, o, size, len, cnt, tmp);
    /* (the vectors themselves are not kept: pooling is timed, the server's answer is not built) */
    rc = 0;
out:
    free(tmp);
    free(buf);
    free(ids), free(types), free(cnt);
    return rc;
}

static void *worker_main(void *arg)
{
    ew_worker *w = arg;
    tune_ctx *t = w->t;
    for (;;) {
        pthread_barrier_wait(&t->start);
        if (t->quit) break;
        if (w->index < t->workers)
            for (int q; !w->rc && (q = atomic_fetch_add(&t->next_sub, 1)) < t->n_subs;) w->rc = run_sub(t, w, q);
        pthread_barrier_wait(&t->end);
    }
    return NULL;
}

/* qsort has no context argument in C11: the request being ordered (the main thread only) */
static const tok_text *g_req;
static int cmp_len(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return g_req[x].n != g_req[y].n ? (g_req[x].n > g_req[y].n) - (g_req[x].n < g_req[y].n) : (x > y) - (x < y);
}

/* One request of B texts from position first of the texts: tokenize, order, run on the workers.
 * Returns 0, or -1 with the message printed. */
static int run_request(tune_ctx *t, int first)
{
    for (int i = 0; i < t->batch; i++) {
        int k = (first + i) % t->n_texts;
        char err[256] = "";
        t->req[i].n = mts_tokenize(t->tok, t->texts[k], t->lens[k], t->max_tokens, t->req[i].ids, t->req[i].types,
                                   t->max_tokens, err, sizeof err);
        if (t->req[i].n < 1) {
            fprintf(stderr, "mtserve tune: text %d: %s\n", k + 1, err[0] ? err : "no tokens");
            return -1;
        }
        if (t->req[i].n > t->e.max_tokens) { /* as the server does: cut, keeping the last token */
            t->req[i].ids[t->e.max_tokens - 1] = t->req[i].ids[t->req[i].n - 1];
            t->req[i].n = t->e.max_tokens;
        }
        t->order[i] = i;
    }
    g_req = t->req;
    qsort(t->order, (size_t)t->batch, sizeof(int), cmp_len);
    /* as the server: length-bucket parts, each split into min(W, k) contiguous sub-batches */
    t->n_subs = 0;
    for (int i = 0; i < t->batch;) {
        int len = mts_embed_bucket(&t->e, t->req[t->order[i]].n), j = i;
        while (j < t->batch && t->req[t->order[j]].n <= len) j++;
        int k = j - i, w = k < t->workers ? k : t->workers;
        for (int q = 0; q < w; q++) {
            int size = k / w + (q < k % w), start = i + q * (k / w) + (q < k % w ? q : k % w);
            t->subs[t->n_subs].from = start, t->subs[t->n_subs].to = start + size, t->subs[t->n_subs].len = len;
            t->n_subs++;
        }
        i = j;
    }
    atomic_store(&t->next_sub, 0);
    pthread_barrier_wait(&t->start);
    pthread_barrier_wait(&t->end);
    for (int k = 0; k < t->workers; k++)
        if (t->w[k].rc) {
            fprintf(stderr, "mtserve tune: %s\n", t->w[k].msg);
            return -1;
        }
    return 0;
}

typedef struct erow {
    int batch, workers, threads;
    double texts_s, p50, p99;
    int requests;
} erow;

#define MIN_GAIN 0.05

static const char *mode_name(int w, int t)
{
    return w == 1 && t == 1 ? "serial" : w == 1 ? "fine" : t == 1 ? "coarse" : "mixed";
}

/* The (W, T) a policy entry runs for a batch of b texts: W capped at b, T 0 taken as cores / W. */
static void policy_wt(const mts_embed_policy *p, int b, int cores, int *w, int *t)
{
    *w = p->workers < b ? p->workers : b;
    *t = p->threads > 0 ? p->threads : cores / *w > 0 ? cores / *w : 1;
    if (*w * *t > cores) *t = cores / *w > 0 ? cores / *w : 1;
}

/* Whether setting (w, t) at batch b is measured: every one in a sweep; with --policy, the
 * policy's and one worker with every core. */
static int measured(const mts_tune_embed_opts *o, const mts_model_config *given, int b, int w, int t)
{
    if (!o->policy) return 1;
    int pw, pt;
    policy_wt(mts_embed_policy_for(given, b), b, o->cores, &pw, &pt);
    return (w == 1 && t == (o->cores < 64 ? o->cores : 64)) || (w == pw && t == pt);
}

/* Reads one text per line (empty lines skipped) into t; 0 or 1 (message printed). */
static int read_texts(const char *path, tune_ctx *t)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "mtserve tune: cannot open --texts %s\n", path);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t l;
    int n = 0, ncap = 0, rc = 0;
    while ((l = getline(&line, &cap, f)) >= 0) {
        while (l > 0 && (line[l - 1] == '\n' || line[l - 1] == '\r')) l--;
        if (l == 0) continue;
        if ((size_t)l > MTS_EMBED_MAX_TEXT_BYTES || n == 100000) {
            fprintf(stderr, "mtserve tune: --texts %s: line %d is over %d bytes or there are over 100000 texts\n",
                    path, n + 1, MTS_EMBED_MAX_TEXT_BYTES);
            rc = 1;
            break;
        }
        if (n == ncap) {
            ncap = ncap ? ncap * 2 : 64;
            char **nt = realloc(t->texts, sizeof *nt * (size_t)ncap);
            size_t *nl = realloc(t->lens, sizeof *nl * (size_t)ncap);
            if (nt) t->texts = nt;
            if (nl) t->lens = nl;
            if (!nt || !nl) {
                rc = 1;
                break;
            }
        }
        t->texts[n] = strndup(line, (size_t)l);
        t->lens[n] = (size_t)l;
        if (!t->texts[n]) {
            rc = 1;
            break;
        }
        n++;
    }
    free(line);
    fclose(f);
    t->n_texts = n;
    if (!rc && n == 0) {
        fprintf(stderr, "mtserve tune: --texts %s holds no texts\n", path);
        rc = 1;
    }
    return rc;
}

int mts_cli_is_embedding_folder(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) || !S_ISDIR(sb.st_mode)) return 0;
    char p[4096];
    snprintf(p, sizeof p, "%s/config.yaml", path);
    FILE *f = fopen(p, "r");
    if (!f) {
        snprintf(p, sizeof p, "%s/config.pbtxt", path);
        f = fopen(p, "r");
    }
    if (!f) return 0;
    char line[1024];
    int yes = 0;
    while (!yes && fgets(line, sizeof line, f)) yes = strstr(line, "tokenizer") != NULL;
    fclose(f);
    return yes;
}

int mts_cli_tune_embed(const char *model, const mts_tune_embed_opts *o)
{
    mts_config cfg;
    const mts_model_config *mc = NULL;
    if (mts_cli_embed_find(model, NULL, &cfg, &mc)) {
        mts_config_free(&cfg);
        return 1;
    }
    tune_ctx *t = calloc(1, sizeof *t);
    erow *rows = NULL;
    mts_tokenizer *tok = NULL;
    int rc = 1, n_rows = 0, started = 0, max_b = 0;
    bool barriers = false;
    char err[400] = "";
    if (!t) goto done;
    for (int i = 0; i < o->n_batches; i++) max_b = o->batches[i] > max_b ? o->batches[i] : max_b;
    mts_model_config given = {0};
    if (o->policy &&
        mts_embed_policy_parse(o->policy, given.embed_policy, &given.n_embed_policy, err, sizeof err)) {
        fprintf(stderr, "mtserve tune: --policy: %s\n", err);
        goto done;
    }
    if (o->texts_file) {
        if (read_texts(o->texts_file, t)) goto done;
    } else {
        t->texts = malloc(sizeof *t->texts * N_CORPUS);
        t->lens = malloc(sizeof *t->lens * N_CORPUS);
        if (!t->texts || !t->lens) goto done;
        for (int i = 0; i < N_CORPUS; i++) {
            t->texts[i] = strdup(corpus[i]);
            t->lens[i] = strlen(corpus[i]);
            if (!t->texts[i]) goto done;
            t->n_texts = i + 1;
        }
    }
    int lc = mc->lowercase == 1 ? 1 : mc->lowercase == 2 ? 0 : -1;
    if (!(tok = mts_tokenizer_load(mc->tokenizer_path, lc, err, sizeof err))) {
        fprintf(stderr, "mtserve tune: tokenizer %s: %s\n", mc->tokenizer_path, err);
        goto done;
    }
    t->tok = tok;
    double load_ms;
    if (mts_cli_load_config(mc, &t->mdl, &load_ms)) goto done;
    int n_in, n_out;
    if (mts_cli_embedder_init(&t->e, mc, t->mdl, mts_tokenizer_pad_id(tok), &n_in, &n_out, err, sizeof err)) {
        fprintf(stderr, "mtserve tune: %s\n", err);
        goto done;
    }
    t->max_tokens = mts_embed_config_max_tokens(mc);
    t->n_in = n_in, t->n_out = n_out;
    t->req = calloc((size_t)max_b, sizeof *t->req);
    t->order = calloc((size_t)max_b, sizeof *t->order);
    t->subs = calloc((size_t)max_b, sizeof *t->subs);
    if (!t->req || !t->order || !t->subs) goto done;
    for (int i = 0; i < max_b; i++) {
        t->req[i].ids = malloc(sizeof(int64_t) * (size_t)t->max_tokens);
        t->req[i].types = malloc(sizeof(int64_t) * (size_t)t->max_tokens);
        if (!t->req[i].ids || !t->req[i].types) goto done;
    }
    /* the workers: one context each, kept across settings (mts_ctx_set_threads), so the plans of
     * each sub-batch shape are built once */
    int nw = o->cores < 64 ? o->cores : 64;
    for (int k = 0; k < nw; k++) {
        mts_err e2 = {0};
        t->w[k] = (ew_worker){.t = t, .index = k};
        if (mts_ctx_create(t->mdl, 1, &t->w[k].ctx, &e2)) {
            fprintf(stderr, "mtserve tune: %s\n", e2.msg);
            goto done;
        }
        mts_cli_embed_padding(t->w[k].ctx, &t->e, t->mdl);
    }
    pthread_barrier_init(&t->start, NULL, (unsigned)nw + 1);
    pthread_barrier_init(&t->end, NULL, (unsigned)nw + 1);
    barriers = true;
    for (int k = 0; k < nw; k++) pthread_create(&t->w[k].th, NULL, worker_main, &t->w[k]), started++;

    int total = 0;
    for (int bi = 0; bi < o->n_batches; bi++)
        for (int w = 1; w <= nw && w <= o->batches[bi]; w++)
            for (int th = 1; w * th <= o->cores; th++) total += measured(o, &given, o->batches[bi], w, th);
    rows = calloc((size_t)total + 1, sizeof *rows);
    if (!rows) goto done;
    char cpu[128] = "";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[512];
        while (!cpu[0] && fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
                snprintf(cpu, sizeof cpu, "%s", strchr(line, ':') + 2);
                cpu[strcspn(cpu, "\n")] = 0;
            }
        fclose(ci);
    }
    double load1 = -1;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &load1) != 1) load1 = -1;
        fclose(la);
    }
    if (!o->json) {
        printf("embedding model %s, %d cores (%s), %d texts, %.2f s per setting, tokenization included; "
               "load average %.1f at start\n\n", model, o->cores, cpu[0] ? cpu : "CPU unknown", t->n_texts, o->seconds,
               load1);
        printf("%5s %7s %7s %-6s %10s %9s %9s\n", "batch", "workers", "threads", "mode", "texts/s", "p50 ms",
               "p99 ms");
        fflush(stdout);
    }
    /* Per batch size, the settings run round-robin for o->rounds rounds of seconds / rounds
     * each, so a slow spell of a shared machine spreads over all of them instead of deciding
     * against whichever setting it hit. */
#define LAT_CAP 20000
    int n_set = 0;
    struct setting {
        int w, t, n;
        double wall_s, *lat;
    } *set = calloc((size_t)nw * (size_t)o->cores + 1, sizeof *set);
    if (!set) goto done;
    int pos = 0, done_n = 0, rounds = o->rounds > 0 ? o->rounds : 1;
    rc = 0;
    for (int bi = 0; bi < o->n_batches && !rc; bi++) {
        int B = o->batches[bi];
        n_set = 0;
        for (int W = 1; W <= nw && W <= B; W++)
            for (int T = 1; W * T <= o->cores; T++)
                if (measured(o, &given, B, W, T)) {
                    set[n_set] = (struct setting){W, T, 0, 0, malloc(sizeof(double) * LAT_CAP)};
                    if (!set[n_set++].lat) rc = 1;
                }
        for (int round = 0; round < rounds && !rc; round++) {
            for (int si = 0; si < n_set && !rc; si++) {
                struct setting *st = &set[si];
                int W = st->w, T = st->t;
                t->batch = B, t->workers = W;
                for (int k = 0; k < W; k++) mts_ctx_set_threads(t->w[k].ctx, T);
                if (round == 0) {
                    fprintf(stderr, "tune: [%d/%d] batch %d, %d worker%s x %d thread%s ...\n", ++done_n, total, B, W,
                            W == 1 ? "" : "s", T, T == 1 ? "" : "s");
                    /* untimed: one pass over the texts (at most half the measuring time) */
                    double w0 = mts_cli_now_ms();
                    for (int i = 0; i * B < t->n_texts && !rc; i++) {
                        rc = run_request(t, pos);
                        pos = (pos + B) % t->n_texts;
                        if (mts_cli_now_ms() - w0 > o->seconds * 500) break;
                    }
                }
                double t0 = mts_cli_now_ms(), span = o->seconds * 1000 / rounds;
                int n0 = st->n;
                while (!rc && st->n < LAT_CAP && (mts_cli_now_ms() - t0 < span || st->n - n0 < 1)) {
                    double r0 = mts_cli_now_ms();
                    rc = run_request(t, pos);
                    pos = (pos + B) % t->n_texts;
                    st->lat[st->n++] = mts_cli_now_ms() - r0;
                }
                st->wall_s += (mts_cli_now_ms() - t0) / 1000.0;
            }
        }
        for (int si = 0; si < n_set && !rc; si++) {
            struct setting *st = &set[si];
            int n = st->n;
            qsort(st->lat, (size_t)n, sizeof *st->lat, mts_cli_cmp_double);
            int i99 = (int)(0.99 * (n - 1) + 0.999);
            erow r = {B, st->w, st->t, st->wall_s > 0 ? (double)n * B / st->wall_s : 0, st->lat[n / 2],
                      st->lat[i99 < n ? i99 : n - 1], n};
            rows[n_rows++] = r;
            if (!o->json) {
                printf("%5d %7d %7d %-6s %10.1f %9.2f %9.2f\n", B, r.workers, r.threads,
                       mode_name(r.workers, r.threads), r.texts_s, r.p50, r.p99);
                fflush(stdout);
            }
        }
        for (int si = 0; si < n_set; si++) free(set[si].lat);
    }
    free(set);
    if (rc) goto done;
    if (o->policy) { /* with vs without, per batch size */
        if (!o->json) printf("\n%5s %-18s %16s %16s %8s\n", "batch", "policy (W x T)", "with texts/s",
                             "without texts/s", "ratio");
        else printf("{\"model\": \"%s\", \"cores\": %d, \"policy\": \"%s\", \"compare\": [", model, o->cores,
                    o->policy);
        for (int bi = 0; bi < o->n_batches; bi++) {
            int B = o->batches[bi], pw, pt;
            policy_wt(mts_embed_policy_for(&given, B), B, o->cores, &pw, &pt);
            const erow *with = NULL, *without = NULL;
            for (int i = 0; i < n_rows; i++) {
                if (rows[i].batch != B) continue;
                if (rows[i].workers == pw && rows[i].threads == pt) with = &rows[i];
                if (rows[i].workers == 1 && rows[i].threads == (o->cores < 64 ? o->cores : 64)) without = &rows[i];
            }
            if (!with || !without) continue;
            double ratio = without->texts_s > 0 ? with->texts_s / without->texts_s : 0;
            if (!o->json)
                printf("%5d %dx%-16d %16.1f %16.1f %7.2fx\n", B, pw, pt, with->texts_s, without->texts_s, ratio);
            else
                printf("%s{\"batch\": %d, \"workers\": %d, \"threads\": %d, \"with_texts_per_s\": %.3f, "
                       "\"without_texts_per_s\": %.3f, \"with_p50_ms\": %.3f, \"without_p50_ms\": %.3f}",
                       bi ? ", " : "", B, pw, pt, with->texts_s, without->texts_s, with->p50, without->p50);
        }
        if (o->json) printf("]}\n");
        goto done;
    }
    /* the winner per batch size, then consecutive equal winners merged */
    mts_embed_policy pol[64];
    int n_pol = 0;
    if (!o->json) printf("\nbest per batch size (most texts/s):\n");
    for (int bi = 0; bi < o->n_batches; bi++) {
        int best = -1, base = -1;
        for (int i = 0; i < n_rows; i++) {
            if (rows[i].batch != o->batches[bi]) continue;
            if (best < 0 || rows[i].texts_s > rows[best].texts_s) best = i;
            if (rows[i].workers == 1 && rows[i].threads == (o->cores < 64 ? o->cores : 64)) base = i;
        }
        if (best < 0) continue;
        /* one worker with every core is what runs without a policy: another setting must beat
         * it by MIN_GAIN to be chosen, so noise alone does not change behaviour */
        if (base >= 0 && best != base && rows[best].texts_s < rows[base].texts_s * (1 + MIN_GAIN)) best = base;
        if (!o->json) {
            printf("  batch %3d: workers %d, threads %d (%s): %.1f texts/s, p50 %.2f ms, p99 %.2f ms", rows[best].batch,
                   rows[best].workers, rows[best].threads, mode_name(rows[best].workers, rows[best].threads),
                   rows[best].texts_s, rows[best].p50, rows[best].p99);
            if (base >= 0 && base != best && rows[base].texts_s > 0)
                printf("; %.2fx one worker with every core", rows[best].texts_s / rows[base].texts_s);
            printf("\n");
        }
        if (n_pol > 0 && pol[n_pol - 1].workers == rows[best].workers && pol[n_pol - 1].threads == rows[best].threads)
            pol[n_pol - 1].max_batch = rows[best].batch;
        else if (n_pol < 64)
            pol[n_pol++] = (mts_embed_policy){rows[best].batch, rows[best].workers, rows[best].threads};
    }
    /* ascending max_batch for the policy even when --batches was given out of order */
    for (int i = 1; i < n_pol; i++)
        for (int j = i; j > 0 && pol[j].max_batch < pol[j - 1].max_batch; j--) {
            mts_embed_policy x = pol[j];
            pol[j] = pol[j - 1], pol[j - 1] = x;
        }
    if (n_pol > MTS_EMBED_POLICY_MAX) n_pol = MTS_EMBED_POLICY_MAX;
    char yaml[4096];
    size_t yo = 0;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
    yo += (size_t)snprintf(yaml + yo, sizeof yaml - yo,
                           "# mtserve tune --embedding: %d cores (%s), %.2f s per setting, load average %.1f, %s\n"
                           "# for a request of n texts the first entry with n <= max_batch applies (the last beyond)\n"
                           "embedding_policy:\n",
                           o->cores, cpu[0] ? cpu : "CPU unknown", o->seconds, load1, when);
    for (int i = 0; i < n_pol && yo < sizeof yaml; i++)
        yo += (size_t)snprintf(yaml + yo, sizeof yaml - yo, "  - {max_batch: %d, workers: %d, threads: %d}\n",
                               pol[i].max_batch, pol[i].workers, pol[i].threads);
    if (o->json) {
        printf("{\"model\": \"%s\", \"cores\": %d, \"rows\": [", model, o->cores);
        for (int i = 0; i < n_rows; i++)
            printf("%s{\"batch\": %d, \"workers\": %d, \"threads\": %d, \"texts_per_s\": %.3f, \"p50_ms\": %.3f, "
                   "\"p99_ms\": %.3f}",
                   i ? ", " : "", rows[i].batch, rows[i].workers, rows[i].threads, rows[i].texts_s, rows[i].p50,
                   rows[i].p99);
        printf("], \"embedding_policy\": [");
        for (int i = 0; i < n_pol; i++)
            printf("%s{\"max_batch\": %d, \"workers\": %d, \"threads\": %d}", i ? ", " : "", pol[i].max_batch,
                   pol[i].workers, pol[i].threads);
        printf("]}\n");
    } else {
        printf("\npolicy (paste into the model's config.yaml, or under models.NAME in a configuration file):\n%s",
               yaml);
    }
    if (o->out_path) {
        FILE *f = fopen(o->out_path, "w");
        if (!f || fputs(yaml, f) < 0 || fclose(f)) {
            fprintf(stderr, "mtserve tune: cannot write %s\n", o->out_path);
            rc = 1;
        } else {
            fprintf(stderr, "tune: policy written to %s\n", o->out_path);
        }
    }
done:
    if (t) {
        if (started) {
            t->quit = true;
            pthread_barrier_wait(&t->start);
            for (int k = 0; k < started; k++) pthread_join(t->w[k].th, NULL);
        }
        if (barriers) {
            pthread_barrier_destroy(&t->start);
            pthread_barrier_destroy(&t->end);
        }
        for (int k = 0; k < 64; k++)
            if (t->w[k].ctx) mts_ctx_free(t->w[k].ctx);
        if (t->req)
            for (int i = 0; i < max_b; i++) free(t->req[i].ids), free(t->req[i].types);
        free(t->req);
        free(t->order);
        free(t->subs);
        for (int i = 0; i < t->n_texts; i++) free(t->texts[i]);
        free(t->texts);
        free(t->lens);
        if (t->mdl) mts_model_free(t->mdl);
        free(t);
    }
    free(rows);
    mts_tokenizer_free(tok);
    mts_config_free(&cfg);
    return rc;
}
