/*
 * libFuzzer target for the native gRPC transport (src/api/grpc_h2.c): each input is what a
 * client sends after the HTTP/2 connection preface, written on a real TCP connection to the gRPC
 * port of a real server (the server core serving "tiny", add_relu.onnx from the fuzz_onnx seed
 * corpus, and the gRPC front end on the native transport with a 1 MiB message limit). The
 * connection is then half-closed and everything the server answers is read until it closes, so
 * each input's frames, HPACK blocks, gRPC messages and the handlers they reach run, and the
 * streams they leave open are torn down, before the next input.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "api/grpc_server.h"
#include "config/config.h"
#include "serve/server.h"

static mts_config cfg;
static mts_server *srv;
static mts_grpc *grpc;
static int port;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("MTS_FUZZ_MODELS");
    if (!dir) dir = MTS_SOURCE_DIR "/tests/fuzz/corpus/fuzz_onnx";
    char text[1024];
    int n = snprintf(text, sizeof text,
                     "server:\n  worker_count: 1\n  max_message_size_mb: 1\nmodels:\n"
                     "  tiny:\n    model_path: \"%s/add_relu.onnx\"\n    preload: true\n",
                     dir);
    mts_err err = {0};
    if (mts_config_parse_yaml(text, (size_t)n, "fuzz.yaml", &cfg, NULL, NULL, &err) ||
        mts_config_finalize(&cfg, &err) || mts_server_create(&cfg, &srv, &err)) {
        fprintf(stderr, "fuzz_grpc_h2: cannot start the server core: %s\n", err.msg);
        exit(1);
    }
    mts_grpc_opts go = {"127.0.0.1", 0, 2, (size_t)1 << 20, NULL, NULL, NULL, NULL, "native"};
    if (mts_grpc_start(srv, &go, &grpc, &err)) {
        fprintf(stderr, "fuzz_grpc_h2: cannot start the gRPC front end: %s\n", err.msg);
        exit(1);
    }
    port = mts_grpc_port(grpc);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return 0;
    }
    uint8_t *buf = malloc(sizeof preface - 1 + size);
    if (buf) {
        memcpy(buf, preface, sizeof preface - 1);
        if (size) memcpy(buf + sizeof preface - 1, data, size);
        size_t off = 0, len = sizeof preface - 1 + size;
        while (off < len) {
            ssize_t k = send(fd, buf + off, len - off, MSG_NOSIGNAL);
            if (k <= 0) break;
            off += (size_t)k;
        }
        free(buf);
    }
    shutdown(fd, SHUT_WR);
    char sink[65536];
    while (recv(fd, sink, sizeof sink, 0) > 0) {
    }
    close(fd);
    return 0;
}
