/*
 * A stand-alone server for the gRPC tests: `mtserve serve` plus the gRPC front end, until the
 * lead wires mts_grpc_start into src/cli/cli_serve.c. Same options as `mtserve serve` and
 * --grpc-port; prints the HTTP serving line and
 *   mtserve: serving gRPC on HOST:PORT (inference.GRPCInferenceService, inference.InferenceService)
 * then runs until SIGTERM/SIGINT and shuts down in the order cli_serve.c will.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/grpc_server.h"
#include "api/kserve_http.h"
#include "config/config.h"
#include "serve/server.h"
#include "util/log.h"

static void warn_cb(void *user, const char *msg)
{
    (void)user;
    MTS_WARN("config: %s", msg);
}

int main(int argc, char **argv)
{
    const char *config_path = NULL, *repo = NULL;
    int http_port = 0, grpc_port = 0, grace = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--config") && has) config_path = argv[++i];
        else if (!strcmp(a, "--model-repository") && has) repo = argv[++i];
        else if (!strcmp(a, "--http-port") && has) http_port = atoi(argv[++i]);
        else if (!strcmp(a, "--grpc-port") && has) grpc_port = atoi(argv[++i]);
        else if (!strcmp(a, "--grace") && has) grace = atoi(argv[++i]);
        else if (!strcmp(a, "--log-level") && has) {
            const char *l = argv[++i];
            mts_log_set_level(!strcmp(l, "debug") ? MTS_LOG_DEBUG : !strcmp(l, "warn") ? MTS_LOG_WARN : MTS_LOG_INFO);
        } else {
            fprintf(stderr, "mts-grpc-harness: unknown option '%s'\n", a);
            return 2;
        }
    }
    mts_config cfg;
    mts_err err = {0};
    int rc = MTS_OK;
    if (config_path) rc = mts_config_load_yaml(config_path, &cfg, warn_cb, NULL, &err);
    else mts_config_defaults(&cfg);
    if (!rc && repo) rc = mts_config_scan_repository(&cfg, repo, warn_cb, NULL, &err);
    if (!rc) {
        cfg.http_port = http_port;
        cfg.grpc_port = grpc_port;
        if (grace >= 0) cfg.shutdown_grace_s = grace;
        rc = mts_config_finalize(&cfg, &err);
    }
    if (rc) {
        fprintf(stderr, "mts-grpc-harness: %s\n", err.msg);
        return 1;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    mts_server *srv = NULL;
    if (mts_server_create(&cfg, &srv, &err)) {
        fprintf(stderr, "mts-grpc-harness: %s\n", err.msg);
        return 1;
    }
    mts_kserve_http_opts ho = {cfg.host, cfg.http_port, 2, (size_t)cfg.max_message_size_mb << 20};
    mts_kserve_http *http = NULL;
    if (mts_kserve_http_start(srv, &ho, &http, &err)) {
        fprintf(stderr, "mts-grpc-harness: HTTP: %s\n", err.msg);
        return 1;
    }
    mts_grpc_opts go = {cfg.host, cfg.grpc_port, 2, (size_t)cfg.max_message_size_mb << 20};
    mts_grpc *grpc = NULL;
    if (mts_grpc_start(srv, &go, &grpc, &err)) {
        fprintf(stderr, "mts-grpc-harness: gRPC: %s\n", err.msg);
        return 1;
    }
    printf("mtserve: serving %d model%s on http://%s:%d (KServe v2)\n", cfg.n_models, cfg.n_models == 1 ? "" : "s",
           cfg.host, mts_kserve_http_port(http));
    printf("mtserve: serving gRPC on %s:%d (inference.GRPCInferenceService, inference.InferenceService)\n", cfg.host,
           mts_grpc_port(grpc));
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    mts_kserve_http_stop_accepting(http);
    mts_grpc_stop_accepting(grpc);
    mts_server_shutdown(srv, cfg.shutdown_grace_s);
    mts_kserve_http_stop(http);
    mts_grpc_stop(grpc);
    mts_server_free(srv);
    mts_config_free(&cfg);
    return 0;
}
