/*
 * multipart/form-data bodies (RFC 7578 on top of RFC 2046 section 5.1), as browsers, curl -F and
 * Python requests send them for file uploads. Parsing is zero-copy: every part's name, filename
 * and content type are copied into small fixed fields, and its data points into the body.
 *
 * What is checked, each failure naming the byte offset in the body:
 *   - the Content-Type is multipart/form-data with a boundary parameter of 1..70 characters
 *     (quoted or not);
 *   - the body starts with "--boundary" (a preamble before it is skipped, as RFC 2046 allows)
 *     and ends with the closing "--boundary--" delimiter (an epilogue after it is ignored);
 *   - each part has a header block of at most MTS_MULTIPART_MAX_HEADER bytes ending in an empty
 *     line, with a Content-Disposition: form-data header carrying a name;
 *   - at most MTS_MULTIPART_MAX_PARTS parts.
 * Line ends may be CRLF or bare LF. Header values longer than the fixed fields are an error, not
 * silently cut.
 */
#ifndef MTS_UTIL_MULTIPART_H
#define MTS_UTIL_MULTIPART_H

#include <stddef.h>

#include "util/status.h"

#define MTS_MULTIPART_MAX_PARTS 256
#define MTS_MULTIPART_MAX_HEADER 8192

typedef struct mts_multipart_part {
    char name[128];
    char filename[256];      /* "" when the part is not a file */
    char content_type[128];  /* "" when absent */
    const char *data;        /* into the body */
    size_t len;
} mts_multipart_part;

typedef struct mts_multipart {
    int n;
    mts_multipart_part *parts; /* malloc'd, n entries */
} mts_multipart;

/* Parses body (len bytes) sent with the given Content-Type header value. MTS_EINVAL with a
 * message on malformed input, MTS_ELIMIT over the limits above, MTS_ENOMEM. */
int mts_multipart_parse(const char *content_type, const char *body, size_t len, mts_multipart *out, mts_err *err);
void mts_multipart_free(mts_multipart *m);
/* The first part called name, or NULL. */
const mts_multipart_part *mts_multipart_get(const mts_multipart *m, const char *name);

#endif
