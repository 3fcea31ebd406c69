/*
 * `mtserve inspect MODEL`: what a model takes and gives (names, types, shapes with symbolic
 * dimensions), what it is made of (op histogram, parameter bytes), and what it costs (GFLOP
 * per sample, peak activation bytes at batch 1 and 8, load time). Text or --json. MODEL may be
 * an embedding model's folder (its configuration names a tokenizer): its model.onnx is
 * inspected and the embedding_policy in force is shown.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "config/config.h"

static void shape_of(const mts_value *v, char *buf, size_t len)
{
    size_t o = 0;
    if (v->rank < 0) {
        snprintf(buf, len, "?");
        return;
    }
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int d = 0; d < v->rank && o < len; d++) {
        if (v->dims[d] >= 0) o += (size_t)snprintf(buf + o, len - o, "%s%lld", d ? "," : "", (long long)v->dims[d]);
        else o += (size_t)snprintf(buf + o, len - o, "%s\"%s\"", d ? "," : "", v->dim_params[d] ? v->dim_params[d] : "?");
    }
    if (o < len) snprintf(buf + o, len - o, "]");
}

static int analyze(mts_model *m, int64_t batch, const mts_cli_dims *dims, double *flops, int64_t *act)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    mts_tensor *in = calloc((size_t)info.n_inputs + 1, sizeof *in);
    mts_err err = {0};
    int rc = MTS_OK;
    for (int i = 0; i < info.n_inputs && !rc; i++) rc = mts_cli_input_shape(m, i, batch, dims, &in[i], &err);
    if (!rc) rc = mts_model_analyze(m, in, info.n_inputs, flops, act, &err);
    if (rc) fprintf(stderr, "mtserve: analysis at batch %lld failed: %s\n", (long long)batch, err.msg);
    free(in);
    return rc;
}

int mts_cli_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    mts_cli_dims dims = {0};
    for (int i = 1; i < argc; i++) {
        int pa = mts_cli_precision_arg("inspect", argc, argv, &i);
        if (pa < 0) return 2;
        if (pa > 0) continue;
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc) {
            if (mts_cli_parse_dim(&dims, argv[++i])) {
                fprintf(stderr, "mtserve inspect: bad --dim '%s' (want NAME=VALUE)\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--help")) {
            printf("usage: mtserve inspect MODEL [--json] [--dim NAME=VALUE ...] [--precision P] [--max-error E]\n"
                   "  Symbolic dims: the first of each input is the batch (1 for GFLOP per sample);\n"
                   "  others default to 1 unless given with --dim.\n");
            return 0;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "mtserve inspect: unknown option '%s'\n", argv[i]);
            return 2;
        } else path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "mtserve inspect: no model given\n");
        return 2;
    }
    /* an embedding model's folder: its model file, and the policy its configuration sets */
    mts_config ecfg;
    memset(&ecfg, 0, sizeof ecfg);
    const mts_model_config *emc = NULL;
    char policy[256] = "";
    if (mts_cli_is_embedding_folder(path)) {
        if (mts_cli_embed_find(path, NULL, &ecfg, &emc)) {
            mts_config_free(&ecfg);
            mts_cli_dims_free(&dims);
            return 1;
        }
        path = emc->model_path;
        mts_embed_policy_format(emc, policy, sizeof policy);
    }
    mts_model *m;
    double load_ms;
    if (mts_cli_load(path, &m, &load_ms)) {
        mts_config_free(&ecfg);
        mts_cli_dims_free(&dims);
        return 1;
    }
    mts_model_info info;
    mts_model_get_info(m, &info);
    double flops1 = 0, flops8 = 0;
    int64_t act1 = 0, act8 = 0;
    int rc = analyze(m, 1, &dims, &flops1, &act1);
    if (!rc) rc = analyze(m, 8, &dims, &flops8, &act8);
    /* op histogram */
    const char *ops[256];
    int counts[256], n_ops = 0;
    for (int i = 0; i < info.n_nodes; i++) {
        const char *op = mts_model_node(m, i)->op_type;
        int j = 0;
        while (j < n_ops && strcmp(ops[j], op)) j++;
        if (j == n_ops && n_ops < 256) {
            ops[n_ops] = op;
            counts[n_ops++] = 0;
        }
        if (j < 256) counts[j]++;
    }
    char shp[256];
    if (json) {
        printf("{\"model\": \"%s\", \"ir_version\": %d, \"opset\": %d, \"nodes\": %d, \"load_ms\": %.2f,\n", path,
               info.ir_version, info.opset, info.n_nodes, load_ms);
        printf(" \"inputs\": [");
        for (int i = 0; i < info.n_inputs; i++) {
            const mts_value *v = mts_model_input(m, i);
            shape_of(v, shp, sizeof shp);
            printf("%s{\"name\": \"%s\", \"dtype\": \"%s\", \"shape\": %s}", i ? ", " : "", v->name,
                   mts_dtype_name(v->dtype), v->rank < 0 ? "null" : shp);
        }
        printf("],\n \"outputs\": [");
        for (int i = 0; i < info.n_outputs; i++) {
            const mts_value *v = mts_model_output(m, i);
            shape_of(v, shp, sizeof shp);
            printf("%s{\"name\": \"%s\", \"dtype\": \"%s\", \"shape\": %s}", i ? ", " : "", v->name,
                   mts_dtype_name(v->dtype), v->rank < 0 ? "null" : shp);
        }
        printf("],\n \"ops\": {");
        for (int i = 0; i < n_ops; i++) printf("%s\"%s\": %d", i ? ", " : "", ops[i], counts[i]);
        printf("},\n \"param_bytes\": %lld, \"mapped_param_bytes\": %lld, \"resident_bytes\": %lld, \"gflop_per_sample\": %.4f, \"activation_bytes_batch1\": %lld, "
               "\"activation_bytes_batch8\": %lld, ",
               (long long)info.param_bytes, (long long)info.mapped_bytes, (long long)info.resident_bytes, flops1 / 1e9, (long long)act1, (long long)act8);
        if (emc) printf("\"embedding_policy\": %s%s%s, ", policy[0] ? "\"" : "", policy[0] ? policy : "null",
                        policy[0] ? "\"" : "");
        const mts_precision_info *pi = mts_model_precision(m);
        printf("\"precision\": \"%s\", \"precision_requested\": \"%s\", \"precision_reason\": \"%s\", "
               "\"precision_guard_error\": ", pi->effective, pi->requested, pi->reason);
        if (pi->guard_error >= 0) printf("%.6g}\n", pi->guard_error);
        else printf("null}\n");
    } else {
        printf("model       %s\n", path);
        printf("format      IR %d, opset %d, %d nodes%s%s\n", info.ir_version, info.opset, info.n_nodes,
               info.producer[0] ? ", producer " : "", info.producer);
        printf("load        %.1f ms\n", load_ms);
        const mts_precision_info *pi = mts_model_precision(m);
        printf("precision   %s (requested %s: %s", pi->effective, pi->requested, pi->reason);
        if (pi->guard_error >= 0) printf("; guard rel_l2 %.3g, max %.3g", pi->guard_error, pi->max_error);
        printf(")\n");
        if (!strcmp(pi->effective, "bf16"))
            printf("bf16 steps  %d oneDNN steps compute in bf16 (MTS_PLAN_VERBOSE=1 names each implementation)\n",
                   mts_model_bf16_steps(m));
        if (!strcmp(pi->effective, "fp16"))
            printf("fp16 steps  %d few-row products keep IEEE half weights (float arithmetic)\n",
                   mts_model_half_steps(m));
        for (int i = 0; i < info.n_inputs; i++) {
            const mts_value *v = mts_model_input(m, i);
            shape_of(v, shp, sizeof shp);
            printf("input       %-16s %-6s %s\n", v->name, mts_dtype_name(v->dtype), shp);
        }
        for (int i = 0; i < info.n_outputs; i++) {
            const mts_value *v = mts_model_output(m, i);
            shape_of(v, shp, sizeof shp);
            printf("output      %-16s %-6s %s\n", v->name, mts_dtype_name(v->dtype), shp);
        }
        printf("parameters  %lld bytes (%.2f MB; %.2f MB used in place from the mapped file, the rest copied "
               "for alignment)\n", (long long)info.param_bytes, (double)info.param_bytes / 1e6,
               (double)info.mapped_bytes / 1e6);
        printf("resident    %.2f MB held by the loaded model and its plans (beyond the file mapping)\n",
               (double)info.resident_bytes / 1e6);
        if (!rc) {
            printf("compute     %.3f GFLOP per sample (Conv, ConvTranspose, MatMul, Gemm)\n", flops1 / 1e9);
            printf("activations %.2f MB peak at batch 1, %.2f MB at batch 8\n", (double)act1 / 1e6, (double)act8 / 1e6);
        }
        printf("ops        ");
        for (int i = 0; i < n_ops; i++) printf(" %s×%d", ops[i], counts[i]);
        printf("\n");
        if (emc && !emc->n_embed_policy)
            printf("embedding   no embedding_policy: the scheduler picks each batch's threads from the backlog\n");
        for (int i = 0; emc && i < emc->n_embed_policy; i++) {
            const mts_embed_policy *p = &emc->embed_policy[i];
            int lo = i ? emc->embed_policy[i - 1].max_batch + 1 : 1;
            bool last = i == emc->n_embed_policy - 1;
            char how[96];
            if (p->workers > 1)
                snprintf(how, sizeof how, "up to %d sub-batches in parallel", p->workers);
            else
                snprintf(how, sizeof how, "one batch");
            printf("%s %d..%d texts%s: %s, %d thread%s each%s\n", i ? "           " : "policy     ", lo, p->max_batch,
                   last ? " and more" : "", how, p->threads, p->threads == 1 ? "" : "s",
                   p->threads ? "" : " (0: the scheduler's choice)");
        }
    }
    mts_config_free(&ecfg);
    mts_model_free(m);
    mts_cli_dims_free(&dims);
    return rc ? 1 : 0;
}
