/*
 * libFuzzer target for Triton model repositories (mts_config_scan_repository in
 * src/config/config.c): the input is written as <repo>/m/config.pbtxt of a private temporary
 * repository that also holds m/1/model.onnx and m/3/model.onnx (empty files), then the
 * repository is scanned into a configuration, which maps the pbtxt fields mtserve uses
 * (max_batch_size, dynamic_batching, instance_group, version_policy, default_model_filename),
 * and the configuration is finalized.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"

static char repo[64], pbpath[96];

static void touch(const char *path)
{
    FILE *f = fopen(path, "wb");
    if (f) fclose(f);
}

static void cleanup(void)
{
    char p[128];
    static const char *const files[] = {"m/1/model.onnx", "m/3/model.onnx", "m/config.pbtxt", "m/1", "m/3", "m"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", repo, files[i]);
        remove(p);
    }
    rmdir(repo);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    snprintf(repo, sizeof repo, "/tmp/mts-fuzz-repo-XXXXXX");
    if (!mkdtemp(repo)) {
        perror("mkdtemp");
        exit(1);
    }
    char p[128];
    snprintf(p, sizeof p, "%s/m", repo);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/m/1", repo);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/m/3", repo);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/m/1/model.onnx", repo);
    touch(p);
    snprintf(p, sizeof p, "%s/m/3/model.onnx", repo);
    touch(p);
    snprintf(pbpath, sizeof pbpath, "%s/m/config.pbtxt", repo);
    atexit(cleanup);
    return 0;
}

static void on_warn(void *user, const char *msg)
{
    (void)user;
    (void)msg;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(pbpath, "wb");
    if (!f) return 0;
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    mts_config c;
    mts_config_defaults(&c);
    mts_err err = {0};
    if (mts_config_scan_repository(&c, repo, on_warn, NULL, &err) == 0) (void)mts_config_finalize(&c, &err);
    mts_config_free(&c);
    return 0;
}
