/*
 * mtserve's entry point: dispatches to the subcommands. Each subcommand parses its own options
 * and prints its own usage with --help.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_grpc.h"
#include "util/crash.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mtserve COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  inspect MODEL     inputs/outputs, op histogram, parameter bytes, GFLOP per sample\n"
            "  run MODEL         run a model on random or .npy inputs; latency and throughput\n"
            "  serve             serve models over KServe v2 HTTP (--config FILE or --model-repository DIR)\n"
            "  tune MODEL        throughput and latency over workers x threads x batch; recommends a setting\n"
            "  infer MODEL       send one inference request to a running server (--url http://... | --grpc host:port)\n"
            "  models list|load|unload|stats   manage a running server's models (--url | --grpc)\n"
            "  embed MODEL TEXT  sentence embeddings of texts with an embedding model, locally (no server)\n"
            "  bench             load generator for a running server: closed/open loop, conversational users\n"
            "  cluster-config    print an HAProxy configuration for several instances (model-affinity routing)\n"
            "  quantize MODEL    post-training int8 quantization into a QDQ ONNX model (--calibration DIR|random:N -o OUT)\n"
            "\n"
            "`mtserve COMMAND --help` describes each command; `mtserve --version` prints the version.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    mts_crash_install();
    const char *cmd = argv[1];
    if (!strcmp(cmd, "inspect")) return mts_cli_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return mts_cli_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return mts_cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "tune")) return mts_cli_tune(argc - 1, argv + 1);
    if (!strcmp(cmd, "infer")) return mts_cli_infer(argc - 1, argv + 1);
    if (!strcmp(cmd, "models")) return mts_cli_models(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return mts_cli_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "cluster-config")) return mts_cli_cluster_config(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return mts_cli_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "embed")) return mts_cli_embed(argc - 1, argv + 1);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("mtserve %s\n", mts_version_string());
        return 0;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "mtserve: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
