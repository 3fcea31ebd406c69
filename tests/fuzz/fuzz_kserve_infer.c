/*
 * libFuzzer target for the KServe v2 REST inference request (parse_infer in
 * src/api/kserve_http.c, through mts_kserve_http_check_infer): the JSON request with its
 * tensors' names, datatypes, shapes, "data" and parameters, and the binary tensor extension
 * (Inference-Header-Content-Length, binary_data_size). The input's first line is the value of
 * the Inference-Header-Content-Length header ("-" for no such header); the rest is the body
 * (an exact-size heap copy).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/kserve_http.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *hcl;
    const uint8_t *body;
    size_t blen;
    if (fuzz_split_line(data, size, 64, &hcl, &body, &blen)) return 0;
    char *copy = malloc(blen ? blen : 1);
    if (!copy) {
        free(hcl);
        return 0;
    }
    if (blen) memcpy(copy, body, blen);
    mts_http_req hr;
    memset(&hr, 0, sizeof hr);
    hr.method = "POST";
    hr.path = "/v2/models/m/infer";
    hr.query = "";
    hr.body = copy;
    hr.body_len = blen;
    hr.http_minor = 1;
    if (strcmp(hcl, "-") != 0) {
        hr.headers[0].name = "Inference-Header-Content-Length";
        hr.headers[0].value = hcl;
        hr.n_headers = 1;
    }
    char msg[512];
    (void)mts_kserve_http_check_infer(&hr, msg, sizeof msg);
    free(copy);
    free(hcl);
    return 0;
}
