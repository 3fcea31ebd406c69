/*
 * Compositing micro-benchmark (figures for docs/benchmarks.md), single-threaded:
 *   1. PNG decode time of a background frame (cache miss cost), and the time to encode a
 *      decoded background as the JPEG that composites splice into (once per cached frame, on
 *      the prefetch thread in the server);
 *   2. composite + encode per frame with the background cached (resize 3x320x320 -> crop
 *      rectangle, paste, encode) for JPEG at the given quality, PNG (level 1) and raw RGB, and
 *      as the reference for JPEG the whole-frame encode that splicing replaces;
 *   3. cache hit rate of sequential playback (batches of `batch` frames, start advancing by
 *      batch, wrapping over the avatar) with the given cache size, with and without preloading
 *      the next batch, plus the bytes the cache holds / reserves.
 * usage: mts-media-bench FRAMES_DIR CROP_RECTS_JSON [--cache 50] [--batch 25] [--quality 85]
 *        [--iters 200] [--loops 3]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "media/compose.h"
#include "media/jpeg_splice.h"
#include "util/clock.h"

/* CPU time of this thread: what one core spends, whatever else the machine runs. */
static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void playback(const char *dir, const char *rects, int cache, int batch, int loops, int preload)
{
    mts_bgcache_config cfg = {"bench", dir, rects, 0, cache};
    mts_bgcache *c;
    mts_err err = {0};
    if (mts_bgcache_open(&cfg, &c, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    int n = mts_bgcache_num_frames(c);
    for (long start = 0; start < (long)n * loops; start += batch) {
        if (preload) /* what the server does while the batch is inferred: this batch and the next */
            for (int i = 0; i < 2 * batch && 2 * batch <= cache; i++)
                mts_bgcache_preload(c, mts_frame_index(start, i, n, MTS_WRAP_LOOP));
        for (int i = 0; i < batch; i++) {
            mts_bgframe *f;
            if (mts_bgcache_get(c, mts_frame_index(start, i, n, MTS_WRAP_LOOP), &f, &err)) exit(1);
            mts_bgcache_put(c, f);
        }
    }
    mts_bgcache_stats st;
    mts_bgcache_stats_get(c, &st);
    printf("playback  %d frames x %d loops, batch %d, cache %d, preload %s: lookups %llu, hit rate %.1f%%, "
           "decodes %llu (misses %llu + preloads %llu), evictions %llu, held %.1f MB, reserved %.1f MB\n",
           n, loops, batch, cache, preload ? "next batch" : "off", (unsigned long long)st.requests,
           100 * st.hit_rate, (unsigned long long)st.loads, (unsigned long long)st.misses,
           (unsigned long long)st.preloads, (unsigned long long)st.evictions, st.bytes / 1e6, st.capacity_bytes / 1e6);
    mts_bgcache_unref(c);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s FRAMES_DIR CROP_RECTS_JSON [--cache N] [--batch N] [--quality Q] [--iters N] "
                        "[--loops N]\n", argv[0]);
        return 2;
    }
    int cache = 50, batch = 25, quality = 85, iters = 200, loops = 3;
    for (int i = 3; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--cache")) cache = v;
        else if (!strcmp(argv[i], "--batch")) batch = v;
        else if (!strcmp(argv[i], "--quality")) quality = v;
        else if (!strcmp(argv[i], "--iters")) iters = v;
        else if (!strcmp(argv[i], "--loops")) loops = v;
    }
    mts_bgcache_config cfg = {"bench", argv[1], argv[2], 0, cache};
    mts_bgcache *c;
    mts_err err = {0};
    if (mts_bgcache_open(&cfg, &c, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int W, H, n = mts_bgcache_num_frames(c);
    mts_bgcache_size(c, &W, &H);
    /* 1. decode */
    double t0 = cpu_ms();
    int nd = n < cache ? n : cache;
    for (int i = 0; i < nd; i++) mts_bgcache_preload(c, i);
    printf("decode    %dx%d PNG: %.2f ms CPU/frame (%d frames)\n", W, H, (cpu_ms() - t0) / nd, nd);
    /* 1b. the background's JPEG encoding (what a decode adds once composites want JPEG) */
    t0 = cpu_ms();
    size_t jbytes = 0;
    for (int i = 0; i < nd; i++) {
        mts_bgframe *f;
        if (mts_bgcache_get(c, i, &f, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        const mts_jpeg_bg *jb = mts_bgcache_jpeg(c, f, quality);
        jbytes += jb ? mts_jpeg_bg_bytes(jb) : 0;
        mts_bgcache_put(c, f);
    }
    printf("bg jpeg   q%d encoding of a cached background: %.2f ms CPU/frame, %.0f KB/frame held\n", quality,
           (cpu_ms() - t0) / nd, (double)jbytes / nd / 1024);
    /* 2. composite + encode with cached backgrounds */
    float *m = malloc(sizeof(float) * 3 * 320 * 320);
    for (size_t i = 0; i < (size_t)3 * 320 * 320; i++) m[i] = (float)((i * 2654435761u) % 1000) / 1000.f;
    const mts_frame_format fmts[] = {MTS_FRAME_JPEG, MTS_FRAME_PNG, MTS_FRAME_RGB};
    for (int k = 0; k < 3; k++) {
        int it = fmts[k] == MTS_FRAME_PNG ? iters / 4 + 1 : iters;
        double *tot = malloc(sizeof(double) * (size_t)it), *cpu = malloc(sizeof(double) * (size_t)it), comp = 0,
               enc = 0, bytes = 0;
        for (int i = 0; i < it; i++) {
            mts_composite_opts o = {fmts[k], quality, 1, MTS_WRAP_LOOP, i % nd};
            mts_composite_out out;
            double a = mts_now_ms(), ca = cpu_ms();
            if (mts_composite_batch(c, m, 1, 320, 320, &o, &out, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            tot[i] = mts_now_ms() - a;
            cpu[i] = cpu_ms() - ca;
            comp += out.composite_ms;
            enc += out.encode_ms;
            bytes += (double)out.data.len;
            mts_composite_out_free(&out);
        }
        qsort(tot, (size_t)it, sizeof *tot, cmp_d);
        qsort(cpu, (size_t)it, sizeof *cpu, cmp_d);
        printf("frame     %-4s%s: CPU median %.2f ms (min %.2f); wall median %.2f ms, p90 %.2f ms (composite %.2f + "
               "encode %.2f wall mean), %.0f KB\n", mts_frame_format_name(fmts[k]), fmts[k] == MTS_FRAME_JPEG ? " q85" : "    ",
               cpu[it / 2], cpu[0], tot[it / 2], tot[it * 9 / 10], comp / it, enc / it, bytes / it / 1024);
        free(tot);
        free(cpu);
    }
    /* 2b. reference in the same run: encoding the whole composited frame (what a frame costs
     * without splicing: composite as above + this) */
    {
        mts_composite_opts o = {MTS_FRAME_RGB, quality, 1, MTS_WRAP_LOOP, 0};
        mts_composite_out out;
        if (mts_composite_batch(c, m, 1, 320, 320, &o, &out, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        const uint8_t **rows = malloc(sizeof *rows * (size_t)H);
        for (int y = 0; y < H; y++) rows[y] = out.data.data + (size_t)y * W * 3;
        double *cpu = malloc(sizeof(double) * (size_t)iters);
        size_t bytes = 0;
        for (int i = 0; i < iters; i++) {
            mts_buf b = {0};
            double ca = cpu_ms();
            mts_jpeg_encode(rows, W, H, quality, &b, &err);
            cpu[i] = cpu_ms() - ca;
            bytes = b.len;
            mts_buf_free(&b);
        }
        qsort(cpu, (size_t)iters, sizeof *cpu, cmp_d);
        printf("reference whole-frame JPEG q%d encode (no splicing): CPU median %.2f ms (min %.2f), %.0f KB\n", quality,
               cpu[iters / 2], cpu[0], (double)bytes / 1024);
        free(cpu);
        free(rows);
        mts_composite_out_free(&out);
    }
    free(m);
    mts_bgcache_unref(c);
    /* 3. playback */
    playback(argv[1], argv[2], cache, batch, loops, 0);
    playback(argv[1], argv[2], cache, batch, loops, 1);
    return 0;
}
