/*
 * `mtserve serve`: loads the configuration (a design-document config.yaml and/or a model
 * repository folder), starts the server core and the KServe v2 HTTP front end, and runs until
 * SIGTERM or SIGINT. Shutdown is graceful: stop accepting connections, finish queued work within
 * server.shutdown_grace_s, fail what is left, exit 0.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/auth.h"
#include "api/grpc_server.h"
#include "api/rest.h"
#include "cli/cli.h"
#include "config/config.h"
#include "serve/server.h"
#include "util/log.h"

static void warn_cb(void *user, const char *msg)
{
    (void)user;
    MTS_WARN("config: %s", msg);
}

static void note_cb(void *user, const char *msg)
{
    (void)user;
    MTS_INFO("config: %s", msg);
}

static const char *env_get(const char *name)
{
    return getenv(name);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mtserve serve [--config FILE.yaml] [--model-repository DIR] [--host ADDR] [--http-port PORT]\n"
               "                     [--grpc-port PORT] [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]\n"
               "                     [--grace S] [--max-connections N] [--keepalive-timeout S]\n"
               "                     [--header-timeout S] [--http-thread-count N] [--max-connections-per-client N]\n"
               "                     [--auth-token-file FILE]\n"
               "                     [--log-level debug|info|warn|error]\n"
               "  Serves every model of the configuration and/or of DIR (one folder per model holding model.onnx\n"
               "  and an optional config.yaml) over KServe v2 HTTP. Stops gracefully on SIGTERM/SIGINT.\n"
               "  --auth-token-file FILE: lines '<token> infer|admin|infer,admin'; requests then need\n"
               "  'Authorization: Bearer <token>' (HTTP header or gRPC metadata); health stays open.\n");
}

int mts_cli_serve(int argc, char **argv)
{
    const char *config_path = NULL, *repo = NULL, *host = NULL;
    int port = -1, grpc_port = -1, grace = -1;
    /* --max-connections, --keepalive-timeout, --header-timeout, --http-thread-count,
     * --max-connections-per-client */
    int conn_opts[5] = {-1, -1, -1, -1, -1};
    static const char *const conn_flags[5] = {"--max-connections", "--keepalive-timeout", "--header-timeout",
                                              "--http-thread-count", "--max-connections-per-client"};
    static const int conn_max[5] = {1000000, 86400, 3600, 64, 1000000};
    const char *tls[3] = {NULL, NULL, NULL}; /* cert, key, client CA */
    const char *auth_file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--config") && has) config_path = argv[++i];
        else if (!strcmp(a, "--model-repository") && has) repo = argv[++i];
        else if (!strcmp(a, "--host") && has) host = argv[++i];
        else if (!strcmp(a, "--http-port") && has) port = atoi(argv[++i]);
        else if (!strcmp(a, "--grpc-port") && has) grpc_port = atoi(argv[++i]);
        else if (!strcmp(a, "--grace") && has) grace = atoi(argv[++i]);
        else if ((!strcmp(a, conn_flags[0]) || !strcmp(a, conn_flags[1]) || !strcmp(a, conn_flags[2]) ||
                  !strcmp(a, conn_flags[3]) || !strcmp(a, conn_flags[4])) && has) {
            int k = 0;
            while (strcmp(a, conn_flags[k])) k++;
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*argv[i] == '\0' || *end || v < 1 || v > conn_max[k]) {
                fprintf(stderr, "mtserve serve: %s wants a whole number from 1 to %d, not '%s'\n", a, conn_max[k],
                        argv[i]);
                return 2;
            }
            conn_opts[k] = (int)v;
        } else if (!strcmp(a, "--tls-cert") && has) tls[0] = argv[++i];
        else if (!strcmp(a, "--tls-key") && has) tls[1] = argv[++i];
        else if (!strcmp(a, "--tls-client-ca") && has) tls[2] = argv[++i];
        else if (!strcmp(a, "--auth-token-file") && has) auth_file = argv[++i];
        else if (!strcmp(a, "--log-level") && has) {
            const char *l = argv[++i];
            mts_log_set_level(!strcmp(l, "debug") ? MTS_LOG_DEBUG : !strcmp(l, "warn") ? MTS_LOG_WARN
                                                 : !strcmp(l, "error")                  ? MTS_LOG_ERROR
                                                                                          : MTS_LOG_INFO);
        } else if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "mtserve serve: unknown option or missing value '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!config_path && !repo) {
        fprintf(stderr, "mtserve serve: give --config FILE or --model-repository DIR\n");
        return 2;
    }
    mts_config cfg;
    mts_err err = {0};
    int rc;
    if (config_path) rc = mts_config_load_yaml(config_path, &cfg, warn_cb, NULL, &err);
    else {
        mts_config_defaults(&cfg);
        rc = MTS_OK;
    }
    if (!rc && repo) rc = mts_config_scan_repository(&cfg, repo, warn_cb, NULL, &err);
    if (!rc && !repo && cfg.model_repository) rc = mts_config_scan_repository(&cfg, cfg.model_repository, warn_cb, NULL, &err);
    if (!rc) {
        if (host) {
            free(cfg.host);
            cfg.host = strdup(host);
        }
        if (port >= 0) cfg.http_port = port;
        if (grpc_port >= 0) cfg.grpc_port = grpc_port;
        if (grace >= 0) cfg.shutdown_grace_s = grace;
        if (conn_opts[0] > 0) cfg.max_connections = conn_opts[0];
        if (conn_opts[1] > 0) cfg.keepalive_timeout_s = conn_opts[1];
        if (conn_opts[2] > 0) cfg.header_timeout_s = conn_opts[2];
        if (conn_opts[3] > 0) cfg.http_threads = conn_opts[3];
        if (conn_opts[4] > 0) cfg.max_connections_per_client = conn_opts[4];
        char **tls_dst[3] = {&cfg.tls_cert_path, &cfg.tls_key_path, &cfg.tls_client_ca_path};
        for (int i = 0; i < 3; i++)
            if (tls[i]) {
                free(*tls_dst[i]);
                *tls_dst[i] = strdup(tls[i]);
            }
        if (auth_file) {
            free(cfg.auth_token_file);
            cfg.auth_token_file = strdup(auth_file);
        }
        rc = mts_config_apply_env(&cfg, env_get, note_cb, NULL, &err);
        if (!rc) rc = mts_config_finalize(&cfg, &err);
    }
    if (rc) {
        fprintf(stderr, "mtserve: %s\n", err.msg);
        mts_config_free(&cfg);
        return 1;
    }
    if (cfg.n_models == 0) MTS_WARN("config: no models configured");
    mts_auth *auth = NULL;
    if (cfg.auth_token_file) {
        if ((rc = mts_auth_load(cfg.auth_token_file, &auth, &err))) {
            fprintf(stderr, "mtserve: %s\n", err.msg);
            mts_auth_free(auth);
            mts_config_free(&cfg);
            return 1;
        }
        MTS_INFO("event=auth tokens=%d file=%s (health open; inference needs infer, load/unload admin)",
                 mts_auth_count(auth), cfg.auth_token_file);
    } else if (!mts_auth_host_is_loopback(cfg.host)) {
        MTS_WARN("event=no_auth host=%s: listening beyond loopback without authentication: anyone who reaches "
                 "the ports can run inference and load or unload models (set --auth-token-file)",
                 cfg.host);
    }
    /* Signals are taken by sigwait below; block them before any thread starts. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    mts_server *srv = NULL;
    if ((rc = mts_server_create(&cfg, &srv, &err))) {
        fprintf(stderr, "mtserve: %s\n", err.msg);
        mts_auth_free(auth);
        mts_config_free(&cfg);
        return 1;
    }
    mts_rest_opts ho = {cfg.host,
                        cfg.http_port,
                        cfg.http_threads,
                        (size_t)cfg.max_message_size_mb << 20,
                        cfg.max_connections,
                        cfg.max_connections_per_client,
                        cfg.keepalive_timeout_s * 1000,
                        cfg.header_timeout_s * 1000,
                        auth,
                        cfg.tls_cert_path,
                        cfg.tls_key_path,
                        cfg.tls_client_ca_path};
    mts_rest *http = NULL;
    if ((rc = mts_rest_start(srv, &ho, &http, &err))) {
        fprintf(stderr, "mtserve: cannot start HTTP on %s:%d: %s\n", cfg.host, cfg.http_port, err.msg);
        mts_server_shutdown(srv, 0);
        mts_server_free(srv);
        mts_auth_free(auth);
        mts_config_free(&cfg);
        return 1;
    }
    int bound = mts_rest_port(http);
    const char *scheme = cfg.tls_cert_path ? "https" : "http";
    MTS_INFO("event=listening protocol=http url=%s://%s:%d models=%d tls=%s", scheme, cfg.host, bound, cfg.n_models,
             cfg.tls_cert_path ? (cfg.tls_client_ca_path ? "mutual" : "on") : "off");
    printf("mtserve: serving %d model%s on %s://%s:%d (KServe v2)\n", cfg.n_models, cfg.n_models == 1 ? "" : "s",
           scheme, cfg.host, bound);
    fflush(stdout);
    mts_grpc_opts go = {cfg.host,
                        cfg.grpc_port,
                        2,
                        (size_t)cfg.max_message_size_mb << 20,
                        cfg.tls_cert_path,
                        cfg.tls_key_path,
                        cfg.tls_client_ca_path,
                        auth};
    mts_grpc *grpc = NULL;
    if ((rc = mts_grpc_start(srv, &go, &grpc, &err))) {
        fprintf(stderr, "mtserve: cannot start gRPC on %s:%d: %s\n", cfg.host, cfg.grpc_port, err.msg);
        mts_rest_stop_accepting(http);
        mts_server_shutdown(srv, 0);
        mts_rest_stop(http);
        mts_server_free(srv);
        mts_auth_free(auth);
        mts_config_free(&cfg);
        return 1;
    }
    MTS_INFO("event=listening protocol=grpc address=%s:%d", cfg.host, mts_grpc_port(grpc));
    printf("mtserve: serving gRPC on %s:%d (inference.GRPCInferenceService, inference.InferenceService)\n", cfg.host,
           mts_grpc_port(grpc));
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    MTS_INFO("event=signal signal=%s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    mts_rest_stop_accepting(http);
    mts_grpc_stop_accepting(grpc);
    mts_server_shutdown(srv, cfg.shutdown_grace_s);
    mts_rest_stop(http);
    mts_grpc_stop(grpc);
    mts_server_free(srv);
    mts_auth_free(auth);
    mts_config_free(&cfg);
    return 0;
}
