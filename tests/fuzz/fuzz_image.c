/*
 * libFuzzer target for image decoding (src/media/image.c): PNG (libpng) and JPEG (libjpeg-turbo)
 * uploads through mts_image_decode_mem with a pixel cap, and PNG through mts_png_decode_mem.
 * The cap (1 Mpixel) bounds the memory and time per input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "media/image.h"

#define FUZZ_MAX_PIXELS (1024 * 1024)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    mts_image img;
    memset(&img, 0, sizeof img);
    mts_err err = {0};
    if (mts_image_decode_mem(copy, size, FUZZ_MAX_PIXELS, &img, &err) == 0) {
        volatile unsigned s = 0;
        size_t n = (size_t)img.width * (size_t)img.height * 3;
        for (size_t i = 0; i < n; i += 61) s += img.rgb[i];
        if (n) s += img.rgb[n - 1];
        mts_image_free(&img);
    }
    free(copy);
    return 0;
}
