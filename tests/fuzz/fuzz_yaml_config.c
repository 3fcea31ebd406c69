/*
 * libFuzzer target for the YAML server configuration (src/config/config.c over libyaml): parses
 * the input as config.yaml text and, when that succeeds, finalizes it (the derived defaults and
 * the cross-field checks). Warnings are collected and dropped.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

static void on_warn(void *user, const char *msg)
{
    size_t *n = user;
    *n += strlen(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    mts_config c;
    memset(&c, 0, sizeof c);
    mts_err err = {0};
    size_t warned = 0;
    if (mts_config_parse_yaml(copy, size, "config.yaml", &c, on_warn, &warned, &err) == 0) {
        (void)mts_config_finalize(&c, &err);
        for (int i = 0; i < c.n_models; i++) (void)mts_config_find_model(&c, c.models[i].name);
    }
    mts_config_free(&c);
    free(copy);
    return 0;
}
