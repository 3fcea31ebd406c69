/*
 * A small reader for the protobuf text format of Triton's config.pbtxt, so a Triton model
 * repository can be served unchanged. It builds a tree of fields (name, line, scalar text or
 * nested message) without knowing the schema: `name: value`, `name { ... }`, `name: { ... }`,
 * `name < ... >`, lists `name: [a, b]` / `name [ {..}, {..} ]` (expanded into repeated fields),
 * "..." / '...' strings with C escapes (adjacent strings concatenated), numbers, enum
 * identifiers, and # comments. Errors say "FILE:LINE: what". Depth and node count are bounded.
 * config.c maps the fields mtserve uses (max_batch_size, dynamic_batching, instance_group,
 * version_policy) onto the model's settings.
 */
#ifndef MTS_CONFIG_PBTXT_H
#define MTS_CONFIG_PBTXT_H

#include <stddef.h>

#include "util/status.h"

#define MTS_PBTXT_MAX_DEPTH 32
#define MTS_PBTXT_MAX_NODES 100000

typedef struct mts_pbtxt {
    char *name;
    int line;
    char *scalar;           /* NULL for a message */
    struct mts_pbtxt *kids; /* fields of a message, in order */
    int n_kids;
} mts_pbtxt;

/* Parses text (len bytes) into *root (a message holding the top-level fields). */
int mts_pbtxt_parse(const char *text, size_t len, const char *file, mts_pbtxt *root, mts_err *err);
void mts_pbtxt_free(mts_pbtxt *n);
/* The first field called name in message m, or NULL. */
const mts_pbtxt *mts_pbtxt_get(const mts_pbtxt *m, const char *name);

#endif
