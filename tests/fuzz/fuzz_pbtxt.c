/*
 * libFuzzer target for Triton's config.pbtxt reader (src/config/pbtxt.c): parses the input as
 * protobuf text format (an exact-size heap copy) and walks the resulting field tree.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/pbtxt.h"

static unsigned walk(const mts_pbtxt *n, int depth)
{
    unsigned s = (unsigned)strlen(n->name ? n->name : "") + (unsigned)n->line;
    if (n->scalar) s += (unsigned)strlen(n->scalar);
    for (int i = 0; i < n->n_kids; i++) s += walk(&n->kids[i], depth + 1);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    mts_pbtxt root;
    memset(&root, 0, sizeof root);
    mts_err err = {0};
    if (mts_pbtxt_parse(copy, size, "config.pbtxt", &root, &err) == 0) {
        volatile unsigned s = walk(&root, 0);
        (void)s;
        (void)mts_pbtxt_get(&root, "max_batch_size");
        const mts_pbtxt *db = mts_pbtxt_get(&root, "dynamic_batching");
        if (db) (void)mts_pbtxt_get(db, "max_queue_delay_microseconds");
    }
    mts_pbtxt_free(&root);
    free(copy);
    return 0;
}
