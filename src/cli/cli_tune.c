/*
 * `mtserve tune MODEL`: the worker-pool tuning study (workers vs intra-op threads vs batch size), automated. For
 * every combination of workers W (parallel execution contexts) and intra-op threads T with
 * W × T ≤ cores, and batch sizes B, it runs W threads each doing batches of B for a fixed time
 * and reports aggregate throughput and per-batch latency (p50, p99). It then recommends the
 * setting with the highest throughput, and the fastest one that keeps p99 under --max-latency-ms.
 * The recommendation maps onto the configuration: workers → gpus.worker_count_per_gpu (or
 * server.worker_count), B → models.NAME.max_batch; T is what the scheduler gives each batch.
 * With --embedding (or a model folder whose configuration names a tokenizer) the sweep runs on
 * texts instead and ends in an embedding_policy (cli_tune_embed.c).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

typedef struct tune_worker {
    mts_model *m;
    const mts_tensor *in;
    int n_in, threads;
    double seconds;
    int runs;
    double *lat;
    int cap;
    int rc;
    char msg[256];
} tune_worker;

static void *tune_main(void *arg)
{
    tune_worker *w = arg;
    mts_ctx *ctx;
    mts_err err = {0};
    const mts_tensor *outs[64];
    if ((w->rc = mts_ctx_create(w->m, w->threads, &ctx, &err))) {
        snprintf(w->msg, sizeof w->msg, "%s", err.msg);
        return NULL;
    }
    /* warm-up: plan and buffers */
    if ((w->rc = mts_ctx_run(ctx, w->in, w->n_in, outs, &err))) {
        snprintf(w->msg, sizeof w->msg, "%s", err.msg);
        mts_ctx_free(ctx);
        return NULL;
    }
    double start = mts_cli_now_ms();
    while (w->runs < w->cap && (mts_cli_now_ms() - start < w->seconds * 1000 || w->runs < 2)) {
        double t0 = mts_cli_now_ms();
        if ((w->rc = mts_ctx_run(ctx, w->in, w->n_in, outs, &err))) {
            snprintf(w->msg, sizeof w->msg, "%s", err.msg);
            break;
        }
        w->lat[w->runs++] = mts_cli_now_ms() - t0;
    }
    mts_ctx_free(ctx);
    return NULL;
}

typedef struct tune_row {
    int workers, threads, batch;
    double throughput, p50, p99;
} tune_row;

int mts_cli_tune(int argc, char **argv)
{
    const char *path = NULL;
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    double seconds = 1.0, max_latency = 0;
    int batches[8] = {1, 2, 4, 8}, n_batches = 4;
    mts_cli_dims dims = {0};
    int json = 0, embedding = 0, batches_given = 0, rounds = 3;
    const char *texts_file = NULL, *out_path = NULL, *policy = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int pa = mts_cli_precision_arg("tune", argc, argv, &i);
        if (pa < 0) return 2;
        if (pa > 0) continue;
        bool has = i + 1 < argc;
        if (!strcmp(a, "--cores") && has) cores = atoi(argv[++i]);
        else if (!strcmp(a, "--seconds") && has) seconds = atof(argv[++i]);
        else if (!strcmp(a, "--max-latency-ms") && has) max_latency = atof(argv[++i]);
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--embedding")) embedding = 1;
        else if (!strcmp(a, "--texts") && has) texts_file = argv[++i];
        else if (!strcmp(a, "--policy") && has) policy = argv[++i];
        else if (!strcmp(a, "--rounds") && has) {
            rounds = atoi(argv[++i]);
            if (rounds < 1 || rounds > 100) {
                fprintf(stderr, "mtserve tune: --rounds takes 1 to 100\n");
                return 2;
            }
        }
        else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has) out_path = argv[++i];
        else if (!strcmp(a, "--batches") && has) {
            n_batches = 0;
            batches_given = 1;
            for (char *tok = strtok(argv[++i], ","); tok; tok = strtok(NULL, ",")) {
                char *end;
                long b = strtol(tok, &end, 10);
                if (*end || b < 1 || b > 2048 || n_batches == 8) {
                    fprintf(stderr, "mtserve tune: --batches takes up to 8 sizes from 1 to 2048, got '%s'\n", tok);
                    return 2;
                }
                batches[n_batches++] = (int)b;
            }
        } else if (!strcmp(a, "--dim") && has) {
            if (mts_cli_parse_dim(&dims, argv[++i])) {
                fprintf(stderr, "mtserve tune: bad --dim '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--help")) {
            printf("usage: mtserve tune MODEL [--cores N] [--batches 1,2,4,8] [--seconds S] [--max-latency-ms L]\n"
                   "                  [--dim NAME=VALUE] [--json] [--precision auto|fp32|bf16|fp16|int8] [--max-error E]\n"
                   "       mtserve tune MODEL_FOLDER --embedding [--texts FILE] [-o policy.yaml]\n"
                   "                  [--batches 1,2,4,8,16,32] [--rounds 3]\n"
                   "                  [--policy 4:1x2,32:2x1 (measure it against one worker with every core)]\n"
                   "  Measures throughput and latency over workers x threads x batch sizes and recommends a setting.\n"
                   "  --embedding (automatic for a folder whose config names a tokenizer): requests of B texts,\n"
                   "  tokenization included, split over W workers of T threads; writes an embedding_policy.\n");
            return 0;
        } else if (a[0] == '-') {
            fprintf(stderr, "mtserve tune: unknown option '%s'\n", a);
            return 2;
        } else path = a;
    }
    if (!path || cores < 1 || n_batches < 1 || !(seconds > 0 && seconds <= 600)) {
        fprintf(stderr, "usage: mtserve tune MODEL [options] (--help)\n");
        return 2;
    }
    if (embedding || mts_cli_is_embedding_folder(path)) {
        static const int emb_default[] = {1, 2, 4, 8, 16, 32};
        mts_tune_embed_opts eo = {cores,      seconds,  rounds, batches_given ? batches : emb_default,
                                  batches_given ? n_batches : 6, texts_file, out_path, policy, json};
        mts_cli_dims_free(&dims);
        return mts_cli_tune_embed(path, &eo) ? 1 : 0;
    }
    if (texts_file || out_path || policy) {
        fprintf(stderr, "mtserve tune: --texts, --policy and -o apply to embedding models (--embedding)\n");
        return 2;
    }
    mts_model *m;
    double load_ms;
    if (mts_cli_load(path, &m, &load_ms)) return 1;
    mts_model_info info;
    mts_model_get_info(m, &info);
    tune_row rows[256];
    int n_rows = 0, rc = 0;
    if (!json) {
        printf("model %s, %d cores, %.1f s per setting\n\n", path, cores, seconds);
        printf("%7s %7s %5s %12s %10s %10s\n", "workers", "threads", "batch", "samples/s", "p50 ms", "p99 ms");
    }
    for (int bi = 0; bi < n_batches && !rc; bi++) {
        int b = batches[bi];
        mts_tensor *in = calloc((size_t)info.n_inputs + 1, sizeof *in);
        mts_err err = {0};
        for (int i = 0; i < info.n_inputs && !rc; i++) {
            if ((rc = mts_cli_input_shape(m, i, b, &dims, &in[i], &err))) {
                fprintf(stderr, "mtserve tune: %s\n", err.msg);
                break;
            }
            int64_t nb = mts_tensor_nbytes(&in[i]);
            in[i].data = calloc(1, nb > 0 ? (size_t)nb : 1);
            if (in[i].dtype == MTS_DTYPE_FLOAT)
                for (int64_t k = 0; k < nb / 4; k++) ((float *)in[i].data)[k] = (float)(k % 97) / 97.0f;
        }
        for (int workers = 1; workers <= cores && !rc; workers++) {
            for (int threads = 1; workers * threads <= cores && !rc; threads++) {
                tune_worker w[64];
                pthread_t th[64];
                int nw = workers < 64 ? workers : 64;
                for (int k = 0; k < nw; k++) {
                    w[k] = (tune_worker){m, in, info.n_inputs, threads, seconds, 0, NULL, 4096, 0, ""};
                    w[k].lat = calloc(4096, sizeof(double));
                }
                double t0 = mts_cli_now_ms();
                for (int k = 0; k < nw; k++) pthread_create(&th[k], NULL, tune_main, &w[k]);
                for (int k = 0; k < nw; k++) pthread_join(th[k], NULL);
                double wall = (mts_cli_now_ms() - t0) / 1000.0;
                int total = 0;
                double all[64 * 64];
                int n_all = 0;
                for (int k = 0; k < nw; k++) {
                    if (w[k].rc) {
                        fprintf(stderr, "mtserve tune: %s\n", w[k].msg);
                        rc = w[k].rc;
                    }
                    total += w[k].runs;
                    for (int r = 0; r < w[k].runs && n_all < 64 * 64; r++) all[n_all++] = w[k].lat[r];
                    free(w[k].lat);
                }
                if (rc || n_all == 0) break;
                qsort(all, (size_t)n_all, sizeof *all, mts_cli_cmp_double);
                /* Throughput over the measured runs: total samples / the longest worker's busy time. */
                double busy = 0;
                (void)wall;
                for (int k = 0; k < n_all; k++) busy += all[k];
                double per_worker_s = busy / 1000.0 / nw;
                tune_row row = {workers, threads, b, per_worker_s > 0 ? (double)total * b / per_worker_s : 0,
                                all[n_all / 2], all[(int)ceil((n_all - 1) * 0.99)]};
                if (n_rows < 256) rows[n_rows++] = row;
                if (!json) {
                    printf("%7d %7d %5d %12.2f %10.2f %10.2f\n", row.workers, row.threads, row.batch, row.throughput,
                           row.p50, row.p99);
                    fflush(stdout);
                }
            }
        }
        for (int i = 0; i < info.n_inputs; i++) free(in[i].data);
        free(in);
    }
    if (!rc && n_rows > 0) {
        int best = 0, best_lat = -1;
        for (int i = 1; i < n_rows; i++)
            if (rows[i].throughput > rows[best].throughput) best = i;
        if (max_latency > 0)
            for (int i = 0; i < n_rows; i++)
                if (rows[i].p99 <= max_latency && (best_lat < 0 || rows[i].throughput > rows[best_lat].throughput))
                    best_lat = i;
        if (json) {
            printf("{\"model\": \"%s\", \"cores\": %d, \"rows\": [", path, cores);
            for (int i = 0; i < n_rows; i++)
                printf("%s{\"workers\": %d, \"threads\": %d, \"batch\": %d, \"throughput\": %.3f, \"p50_ms\": %.3f, "
                       "\"p99_ms\": %.3f}",
                       i ? ", " : "", rows[i].workers, rows[i].threads, rows[i].batch, rows[i].throughput, rows[i].p50,
                       rows[i].p99);
            printf("], \"best\": {\"workers\": %d, \"threads\": %d, \"batch\": %d}}\n", rows[best].workers,
                   rows[best].threads, rows[best].batch);
        } else {
            printf("\nrecommended for throughput: workers %d, threads %d, max_batch %d (%.2f samples/s, p99 %.2f ms)\n",
                   rows[best].workers, rows[best].threads, rows[best].batch, rows[best].throughput, rows[best].p99);
            if (max_latency > 0) {
                if (best_lat >= 0)
                    printf("recommended for p99 <= %.1f ms: workers %d, threads %d, max_batch %d (%.2f samples/s)\n",
                           max_latency, rows[best_lat].workers, rows[best_lat].threads, rows[best_lat].batch,
                           rows[best_lat].throughput);
                else
                    printf("no setting keeps p99 under %.1f ms\n", max_latency);
            }
            printf("config: gpus.worker_count_per_gpu: %d, models.<name>.max_batch: %d\n", rows[best].workers,
                   rows[best].batch);
        }
    }
    mts_model_free(m);
    mts_cli_dims_free(&dims);
    return rc ? 1 : 0;
}
