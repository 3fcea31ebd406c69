/*
 * Restart-interval splicing of JPEG files (jpeg_splice.h): indexing the entropy-coded segment
 * of a baseline JPEG written by mts_jpeg_encode_ex into its restart intervals, and assembling a
 * composited frame from a cached background's intervals and a freshly encoded sub-image's.
 */
#include "media/jpeg_splice.h"

#include <stdlib.h>
#include <string.h>

struct mts_jpeg_bg {
    int width, height, quality;
    int restart;            /* MCUs per restart interval */
    int per_row;            /* intervals per MCU row */
    int mcu_rows;
    int n;                  /* intervals */
    uint8_t *file;
    size_t len, header_len; /* header: SOI .. end of the SOS header */
    uint32_t *start, *end;  /* byte range of interval k's entropy-coded data (markers excluded) */
};

/* Indexes a JPEG file of our own encoder: header length and the byte ranges of its `expect`
 * restart intervals. Checks the marker sequence (RST0..RST7 in turn, EOI at the end). */
static int index_intervals(const uint8_t *p, size_t len, int expect, size_t *header_len, uint32_t *start,
                           uint32_t *end, mts_err *err)
{
    if (len > UINT32_MAX) return mts_err_set(err, MTS_ELIMIT, "JPEG splice: file of %zu bytes is too large", len);
    if (len < 4 || p[0] != 0xFF || p[1] != 0xD8)
        return mts_err_set(err, MTS_EFORMAT, "JPEG splice: no SOI marker at byte 0");
    size_t i = 2;
    for (;;) { /* marker segments up to SOS */
        if (i + 4 > len || p[i] != 0xFF)
            return mts_err_set(err, MTS_EFORMAT, "JPEG splice: expected a marker at byte %zu", i);
        uint8_t m = p[i + 1];
        size_t seg = (size_t)p[i + 2] << 8 | p[i + 3];
        if (seg < 2 || i + 2 + seg > len)
            return mts_err_set(err, MTS_EFORMAT, "JPEG splice: marker 0x%02X at byte %zu has a bad length %zu", m, i, seg);
        i += 2 + seg;
        if (m == 0xDA) break;
    }
    *header_len = i;
    int k = 0;
    size_t s = i;
    while (i + 1 < len) {
        if (p[i] != 0xFF) {
            i++;
            continue;
        }
        uint8_t m = p[i + 1];
        if (m == 0x00) { /* a stuffed 0xFF data byte */
            i += 2;
            continue;
        }
        if (k >= expect)
            return mts_err_set(err, MTS_EFORMAT, "JPEG splice: more than %d restart intervals", expect);
        start[k] = (uint32_t)s;
        end[k] = (uint32_t)i;
        if (m == 0xD9) {
            if (k + 1 != expect)
                return mts_err_set(err, MTS_EFORMAT, "JPEG splice: %d restart intervals, expected %d", k + 1, expect);
            return MTS_OK;
        }
        if (m != 0xD0 + (k & 7))
            return mts_err_set(err, MTS_EFORMAT, "JPEG splice: marker 0x%02X at byte %zu where RST%d belongs", m, i, k & 7);
        k++;
        i += 2;
        s = i;
    }
    return mts_err_set(err, MTS_EFORMAT, "JPEG splice: no EOI marker");
}

int mts_jpeg_bg_make(const uint8_t *const *rows, int width, int height, int quality, mts_jpeg_bg **out, mts_err *err)
{
    *out = NULL;
    mts_jpeg_bg *b = calloc(1, sizeof *b);
    if (!b) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    b->width = width;
    b->height = height;
    b->quality = quality;
    b->restart = mts_jpeg_restart_mcus(width);
    b->per_row = (width + 15) / 16 / b->restart;
    b->mcu_rows = (height + 15) / 16;
    b->n = b->per_row * b->mcu_rows;
    mts_buf f = {0};
    int rc = mts_jpeg_encode_ex(rows, width, height, quality, b->restart, &f, err);
    b->file = f.data;
    b->len = f.len;
    if (!rc && (!(b->start = malloc(sizeof *b->start * (size_t)b->n)) || !(b->end = malloc(sizeof *b->end * (size_t)b->n))))
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
    if (!rc) rc = index_intervals(b->file, b->len, b->n, &b->header_len, b->start, b->end, err);
    if (rc) {
        mts_jpeg_bg_free(b);
        return rc;
    }
    uint8_t *shrunk = realloc(b->file, b->len); /* the encoder's buffer grows in large steps */
    if (shrunk) b->file = shrunk;
    *out = b;
    return MTS_OK;
}

void mts_jpeg_bg_free(mts_jpeg_bg *b)
{
    if (!b) return;
    free(b->file);
    free(b->start);
    free(b->end);
    free(b);
}

int mts_jpeg_bg_quality(const mts_jpeg_bg *b)
{
    return b->quality;
}

size_t mts_jpeg_bg_bytes(const mts_jpeg_bg *b)
{
    return sizeof *b + b->len + 2 * sizeof(uint32_t) * (size_t)b->n;
}

static int put(mts_buf *o, const void *p, size_t n, mts_err *err)
{
    return mts_buf_append(o, p, n) ? mts_err_set(err, MTS_ENOMEM, "out of memory for a JPEG frame") : MTS_OK;
}

int mts_jpeg_bg_compose(const mts_jpeg_bg *b, const uint8_t *const *rows, const mts_crop_rect *r, mts_buf *out,
                        mts_err *err)
{
    /* The window: MCU rows my0..my1-1 and interval columns ix0..ix1-1 covering the rectangle. */
    int span = b->restart * 16; /* pixels per interval */
    int my0 = r->y1 / 16, my1 = (r->y2 + 15) / 16;
    int ix0 = r->x1 / span, ix1 = (r->x2 + span - 1) / span;
    if (my1 > b->mcu_rows) my1 = b->mcu_rows;
    if (ix1 > b->per_row) ix1 = b->per_row;
    int px0 = ix0 * span, px1 = ix1 * span < b->width ? ix1 * span : b->width;
    int py0 = my0 * 16, py1 = my1 * 16 < b->height ? my1 * 16 : b->height;
    int sub_n = (my1 - my0) * (ix1 - ix0);
    const uint8_t **srows = malloc(sizeof *srows * (size_t)(py1 - py0));
    uint32_t *ss = malloc(sizeof *ss * 2 * (size_t)sub_n), *se = ss ? ss + sub_n : NULL;
    mts_buf sub = {0};
    size_t start_len = out->len, sub_header;
    int rc = srows && ss ? MTS_OK : mts_err_set(err, MTS_ENOMEM, "out of memory for a JPEG frame");
    for (int y = py0; !rc && y < py1; y++) srows[y - py0] = rows[y] + (size_t)px0 * 3;
    if (!rc) rc = mts_jpeg_encode_ex(srows, px1 - px0, py1 - py0, b->quality, b->restart, &sub, err);
    if (!rc) rc = index_intervals(sub.data, sub.len, sub_n, &sub_header, ss, se, err);
    if (!rc) rc = put(out, b->file, b->header_len, err);
    for (int k = 0; !rc && k < b->n; k++) {
        int row = k / b->per_row, col = k % b->per_row;
        if (row >= my0 && row < my1 && col >= ix0 && col < ix1) {
            int j = (row - my0) * (ix1 - ix0) + (col - ix0);
            rc = put(out, sub.data + ss[j], se[j] - ss[j], err);
        } else {
            rc = put(out, b->file + b->start[k], b->end[k] - b->start[k], err);
        }
        uint8_t marker[2] = {0xFF, (uint8_t)(k + 1 < b->n ? 0xD0 + (k & 7) : 0xD9)};
        if (!rc) rc = put(out, marker, 2, err);
    }
    mts_buf_free(&sub);
    free(srows);
    free(ss);
    if (rc) out->len = start_len;
    return rc;
}
