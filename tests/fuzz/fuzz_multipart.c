/*
 * libFuzzer target for the multipart/form-data parser (src/util/multipart.c). The input's first
 * line is the Content-Type header value, the rest the body (an exact-size heap copy, so a read
 * past its end is caught). Every part's fields and data are read back.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "util/multipart.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *ctype;
    const uint8_t *body;
    size_t blen;
    if (fuzz_split_line(data, size, 512, &ctype, &body, &blen)) return 0;
    char *copy = malloc(blen ? blen : 1);
    if (!copy) {
        free(ctype);
        return 0;
    }
    if (blen) memcpy(copy, body, blen);
    mts_multipart m = {0};
    mts_err err = {0};
    if (mts_multipart_parse(ctype, copy, blen, &m, &err) == 0) {
        volatile unsigned sum = 0;
        for (int i = 0; i < m.n; i++) {
            const mts_multipart_part *p = &m.parts[i];
            sum += (unsigned)strlen(p->name) + (unsigned)strlen(p->filename) + (unsigned)strlen(p->content_type);
            for (size_t k = 0; k < p->len; k++) sum += (unsigned char)p->data[k];
            (void)mts_multipart_get(&m, p->name);
        }
        (void)mts_multipart_get(&m, "file");
        mts_multipart_free(&m);
    }
    free(copy);
    free(ctype);
    return 0;
}
