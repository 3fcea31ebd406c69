/*
 * `mtserve run MODEL`: runs a model through one execution context on random inputs (or .npy
 * files given with --input NAME=FILE), reports median and p90 latency and throughput in
 * samples per second, and writes outputs as .npy with --output DIR. --json prints one object
 * for scripts.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "util/npy.h"

static void fill_random(mts_tensor *t, uint64_t *state)
{
    int64_t n = mts_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        uint64_t x = *state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *state = x;
        switch (t->dtype) {
        case MTS_DTYPE_FLOAT: ((float *)t->data)[i] = (float)((x >> 40) & 0xffffff) / 16777216.0f; break;
        case MTS_DTYPE_INT64: ((int64_t *)t->data)[i] = (int64_t)(x & 1); break;
        case MTS_DTYPE_INT32: ((int32_t *)t->data)[i] = (int32_t)(x & 1); break;
        case MTS_DTYPE_DOUBLE: ((double *)t->data)[i] = (double)((x >> 40) & 0xffffff) / 16777216.0; break;
        case MTS_DTYPE_FLOAT16:
            ((uint16_t *)t->data)[i] = mts_f32_to_f16((float)((x >> 40) & 0xffffff) / 16777216.0f);
            break;
        case MTS_DTYPE_BFLOAT16:
            ((uint16_t *)t->data)[i] = mts_f32_to_bf16((float)((x >> 40) & 0xffffff) / 16777216.0f);
            break;
        default: { /* other integers and bool: 0 or 1 of the element's width (little-endian) */
            size_t es = mts_dtype_size(t->dtype);
            uint8_t *e = (uint8_t *)t->data + (size_t)i * es;
            memset(e, 0, es);
            e[0] = (uint8_t)(x & 1);
        } break;
        }
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mtserve run MODEL [--batch N] [--threads T] [--iters K] [--warmup W] [--json]\n"
               "                 [--input NAME=FILE.npy ...] [--output DIR] [--dim NAME=VALUE ...]\n"
               "                 [--precision auto|fp32|bf16|fp16|int8] [--max-error E]\n"
               "  Inputs not given with --input are random (floats in [0,1), integers 0/1), with the\n"
               "  first symbolic dimension set to --batch (default 1).\n");
}

int mts_cli_run(int argc, char **argv)
{
    const char *path = NULL, *outdir = NULL;
    int64_t batch = 1;
    int threads = 1, iters = 10, warmup = -1, json = 0;
    mts_cli_dims dims = {0};
    const char *in_names[32], *in_files[32];
    int n_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        int pa = mts_cli_precision_arg("run", argc, argv, &i);
        if (pa < 0) return 2;
        if (pa > 0) continue;
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--batch") && has) batch = atoll(argv[++i]);
        else if (!strcmp(a, "--threads") && has) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--iters") && has) iters = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && has) warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--output") && has) outdir = argv[++i];
        else if (!strcmp(a, "--dim") && has) {
            if (mts_cli_parse_dim(&dims, argv[++i])) {
                fprintf(stderr, "mtserve run: bad --dim '%s' (want NAME=VALUE)\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--input") && has) {
            const char *eq = strchr(argv[++i], '=');
            if (!eq || n_given >= 32) {
                fprintf(stderr, "mtserve run: bad --input '%s' (want NAME=FILE.npy)\n", argv[i]);
                return 2;
            }
            in_names[n_given] = strndup(argv[i], (size_t)(eq - argv[i]));
            in_files[n_given++] = eq + 1;
        } else if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (a[0] == '-') {
            fprintf(stderr, "mtserve run: unknown option or missing value '%s'\n", a);
            usage(stderr);
            return 2;
        } else path = a;
    }
    if (!path || batch < 1 || threads < 1 || iters < 1) {
        usage(stderr);
        return 2;
    }
    if (warmup < 0) warmup = iters > 1 ? 1 : 0;
    mts_model *m;
    double load_ms;
    if (mts_cli_load(path, &m, &load_ms)) {
        for (int g = 0; g < n_given; g++) free((char *)in_names[g]);
        mts_cli_dims_free(&dims);
        return 1;
    }
    mts_model_info info;
    mts_model_get_info(m, &info);
    mts_tensor *in = calloc((size_t)info.n_inputs + 1, sizeof *in);
    const mts_tensor **outs = calloc((size_t)info.n_outputs + 1, sizeof *outs);
    double *lat = calloc((size_t)iters, sizeof *lat);
    mts_err err = {0};
    int rc = 0;
    mts_ctx *ctx = NULL;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int g = 0; g < n_given; g++) {
        int found = 0;
        for (int i = 0; i < info.n_inputs; i++) found |= !strcmp(mts_model_input(m, i)->name, in_names[g]);
        if (!found) {
            fprintf(stderr, "mtserve run: the model has no input named '%s'\n", in_names[g]);
            rc = 1;
            goto out;
        }
    }
    for (int i = 0; i < info.n_inputs; i++) {
        const char *name = mts_model_input(m, i)->name;
        const char *file = NULL;
        for (int g = 0; g < n_given; g++)
            if (!strcmp(in_names[g], name)) file = in_files[g];
        if (file) {
            if ((rc = mts_npy_read(file, &in[i], &err))) goto fail;
            if (in[i].rank > 0) batch = in[i].dims[0];
            continue;
        }
        if ((rc = mts_cli_input_shape(m, i, batch, &dims, &in[i], &err))) goto fail;
        int64_t nb = mts_tensor_nbytes(&in[i]);
        in[i].data = malloc(nb > 0 ? (size_t)nb : 1);
        if (!in[i].data) {
            rc = mts_err_set(&err, MTS_ENOMEM, "out of memory for input '%s'", name);
            goto fail;
        }
        fill_random(&in[i], &seed);
    }
    /* Ready to run: the plan for this signature built (weights packed, primitives created). */
    double t_plan = mts_cli_now_ms(), flops = 0;
    int64_t act_bytes = 0;
    if ((rc = mts_model_analyze(m, in, info.n_inputs, &flops, &act_bytes, &err))) goto fail;
    double plan_ms = mts_cli_now_ms() - t_plan;
    if ((rc = mts_ctx_create(m, threads, &ctx, &err))) goto fail;
    double t_first = mts_cli_now_ms();
    for (int w = 0; w < warmup; w++)
        if ((rc = mts_ctx_run(ctx, in, info.n_inputs, outs, &err))) goto fail;
    double first_ms = warmup > 0 ? mts_cli_now_ms() - t_first : 0;
    for (int it = 0; it < iters; it++) {
        double t0 = mts_cli_now_ms();
        if ((rc = mts_ctx_run(ctx, in, info.n_inputs, outs, &err))) goto fail;
        lat[it] = mts_cli_now_ms() - t0;
        if (!json && iters >= 5 && isatty(2)) fprintf(stderr, "\rrun %d/%d  last %.2f ms", it + 1, iters, lat[it]);
    }
    if (!json && iters >= 5 && isatty(2)) fprintf(stderr, "\n");
    if (outdir) {
        mkdir(outdir, 0755);
        for (int o = 0; o < info.n_outputs; o++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s.npy", outdir, mts_model_output(m, o)->name);
            if ((rc = mts_npy_write(p, outs[o], &err))) goto fail;
        }
    }
    qsort(lat, (size_t)iters, sizeof *lat, mts_cli_cmp_double);
    double median = lat[iters / 2], p90 = lat[(int)((iters - 1) * 0.9)];
    double tput = (double)batch * 1000.0 / median;
    char shp[128];
    int64_t runs = 0, one_runs = 0;
    mts_ctx_team_stats(ctx, &runs, &one_runs);
    if (json) {
        printf("{\"model\": \"%s\", \"batch\": %lld, \"threads\": %d, \"iters\": %d, \"load_ms\": %.3f, "
               "\"plan_ms\": %.3f, \"first_run_ms\": %.3f, \"one_thread_runs\": %lld, "
               "\"median_ms\": %.4f, \"p90_ms\": %.4f, \"min_ms\": %.4f, \"throughput_per_s\": %.3f, \"outputs\": [",
               path, (long long)batch, threads, iters, load_ms, plan_ms, first_ms, (long long)one_runs, median, p90,
               lat[0], tput);
        for (int o = 0; o < info.n_outputs; o++)
            printf("%s{\"name\": \"%s\", \"dtype\": \"%s\", \"shape\": %s}", o ? ", " : "", mts_model_output(m, o)->name,
                   mts_dtype_name(outs[o]->dtype), mts_shape_str(outs[o], shp, sizeof shp));
        printf("]}\n");
    } else {
        printf("model       %s (loaded in %.1f ms, plan for this signature %.1f ms)\n", path, load_ms, plan_ms);
        printf("config      batch %lld, %d thread%s, %d iterations after %d warm-up\n", (long long)batch, threads,
               threads > 1 ? "s" : "", iters, warmup);
        printf("latency     median %.3f ms, p90 %.3f ms, min %.3f ms\n", median, p90, lat[0]);
        if (threads > 1)
            printf("team        %lld of %lld runs on %d threads, %lld on one (adaptive; MTS_TEAM_ADAPT=0 keeps the team)\n",
                   (long long)(runs - one_runs), (long long)runs, threads, (long long)one_runs);
        printf("throughput  %.2f samples/s\n", tput);
        for (int o = 0; o < info.n_outputs; o++)
            printf("output      %s %s %s\n", mts_model_output(m, o)->name, mts_dtype_name(outs[o]->dtype),
                   mts_shape_str(outs[o], shp, sizeof shp));
    }
    goto out;
fail:
    fprintf(stderr, "mtserve run: %s (%s)\n", err.msg, mts_status_name(rc));
    rc = 1;
out:
    mts_ctx_free(ctx);
    for (int i = 0; i < info.n_inputs; i++) free(in[i].data);
    free(in);
    free(outs);
    free(lat);
    mts_model_free(m);
    for (int g = 0; g < n_given; g++) free((char *)in_names[g]);
    mts_cli_dims_free(&dims);
    return rc ? 1 : 0;
}
