/*
 * Background frame cache (see bgcache.h): asset scanning and validation at open, a slot per
 * frame index (EMPTY, LOADING, READY), a doubly linked LRU list of READY slots, and eviction of
 * unpinned least-recently-used frames whenever more than `capacity` are decoded. A frame pinned
 * by a reader is never evicted; while every cached frame is pinned the cache may briefly hold
 * more than `capacity` frames (at most the frames of the composites in flight) and trims itself
 * as they are released.
 */
#include "media/bgcache.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "media/jpeg_splice.h"
#include "util/json.h"
#include "util/clock.h"

enum { SLOT_EMPTY = 0, SLOT_LOADING, SLOT_READY };

typedef struct slot {
    mts_bgframe *frame;
    int state;
    int refs;
    int jpeg_busy; /* a thread is encoding this frame as JPEG (mts_bgcache_jpeg) */
    int prev, next; /* LRU list (READY slots), -1 terminated */
} slot;

struct mts_bgcache {
    _Atomic int refs;
    char *model;
    int n;            /* frames */
    char **paths;
    mts_crop_rect *rects;
    int width, height;
    int capacity;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    slot *slots;
    int head, tail;   /* most / least recently used */
    int cached;
    int64_t bytes;
    uint64_t requests, hits, misses, evictions, preloads, load_errors, loads, jpeg_spliced, jpeg_full;
    _Atomic int jpeg_quality; /* of the latest mts_bgcache_jpeg call: decodes encode at it (0: none yet) */
    double total_load_ms;
};

/* ---- opening: frames ---- */

typedef struct numbered {
    long long number;
    char *name;
} numbered;

static int cmp_numbered(const void *a, const void *b)
{
    const numbered *x = a, *y = b;
    return x->number < y->number ? -1 : x->number > y->number;
}

/* Trailing number of "frame_000017.png" -> 17; -1 if the stem does not end in digits. */
static long long png_number(const char *name)
{
    size_t len = strlen(name);
    if (len < 5 || strcasecmp(name + len - 4, ".png")) return -1;
    size_t end = len - 4, start = end;
    while (start > 0 && isdigit((unsigned char)name[start - 1])) start--;
    if (start == end || end - start > 15) return -1;
    long long v = 0;
    for (size_t i = start; i < end; i++) v = v * 10 + (name[i] - '0');
    return v;
}

static int scan_frames(mts_bgcache *c, const char *dir, int want, mts_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return mts_err_set(err, errno == ENOENT ? MTS_ENOTFOUND : MTS_EIO, "background_dir %s: %s", dir,
                           strerror(errno));
    numbered *v = NULL;
    size_t n = 0, cap = 0;
    int rc = MTS_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        long long num = png_number(de->d_name);
        if (num < 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            numbered *nv = realloc(v, sizeof *v * cap);
            if (!nv) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                break;
            }
            v = nv;
        }
        v[n].number = num;
        if (!(v[n].name = strdup(de->d_name))) {
            rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (!rc && n == 0)
        rc = mts_err_set(err, MTS_ENOTFOUND, "background_dir %s has no numbered PNG frames (e.g. 000000.png)", dir);
    if (!rc && n > 1000000) rc = mts_err_set(err, MTS_ELIMIT, "background_dir %s has %zu frames (limit 1000000)", dir, n);
    if (!rc) {
        qsort(v, n, sizeof *v, cmp_numbered);
        for (size_t i = 1; i < n && !rc; i++) {
            if (v[i].number == v[i - 1].number)
                rc = mts_err_set(err, MTS_EINVAL, "background_dir %s: %s and %s have the same frame number %lld", dir,
                                 v[i - 1].name, v[i].name, v[i].number);
            else if (v[i].number != v[i - 1].number + 1)
                rc = mts_err_set(err, MTS_ENOTFOUND,
                                 "background_dir %s: frame file number %lld (frame index %zu) is missing: %s is followed "
                                 "by %s",
                                 dir, v[i - 1].number + 1, i, v[i - 1].name, v[i].name);
        }
    }
    if (!rc && want > 0 && (size_t)want != n)
        rc = mts_err_set(err, MTS_EINVAL, "num_frames is %d but background_dir %s has %zu PNG frames (%s .. %s)", want,
                         dir, n, v[0].name, v[n - 1].name);
    if (!rc) {
        c->paths = calloc(n, sizeof *c->paths);
        if (!c->paths) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        for (size_t i = 0; !rc && i < n; i++) {
            size_t len = strlen(dir) + strlen(v[i].name) + 2;
            if (!(c->paths[i] = malloc(len))) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
            else snprintf(c->paths[i], len, "%s/%s", dir, v[i].name);
        }
        c->n = (int)n;
    }
    for (size_t i = 0; i < n; i++) free(v[i].name);
    free(v);
    return rc;
}

/* ---- opening: crop rectangles ---- */

static int rect_from_json(const mts_json *j, mts_crop_rect *r, const char *path, int idx, mts_err *err)
{
    static const char *keys[4] = {"x1", "y1", "x2", "y2"};
    int64_t v[4];
    for (int k = 0; k < 4; k++) {
        const mts_json *x = NULL;
        if (mts_json_type(j) == MTS_JSON_ARRAY && mts_json_len(j) == 4) x = mts_json_at(j, (size_t)k);
        else if (mts_json_type(j) == MTS_JSON_OBJECT) x = mts_json_get(j, keys[k]);
        else
            return mts_err_set(err, MTS_EINVAL,
                               "crop_rects_path %s: the rectangle of frame %d must be [x1, y1, x2, y2] or "
                               "{\"x1\":..,\"y1\":..,\"x2\":..,\"y2\":..}",
                               path, idx);
        if (!x || mts_json_int(x, &v[k]) || v[k] < -1000000000 || v[k] > 1000000000)
            return mts_err_set(err, MTS_EINVAL, "crop_rects_path %s: frame %d: %s must be an integer", path, idx,
                               keys[k]);
    }
    r->x1 = (int)v[0], r->y1 = (int)v[1], r->x2 = (int)v[2], r->y2 = (int)v[3];
    return MTS_OK;
}

static int load_rects(mts_bgcache *c, const char *path, mts_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return mts_err_set(err, errno == ENOENT ? MTS_ENOTFOUND : MTS_EIO, "crop_rects_path %s: %s", path,
                           strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = MTS_OK;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 65536;
            if (cap > (256u << 20)) {
                rc = mts_err_set(err, MTS_ELIMIT, "crop_rects_path %s: larger than 256 MiB", path);
                break;
            }
            char *nt = realloc(text, cap);
            if (!nt) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                break;
            }
            text = nt;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    fclose(f);
    mts_json_doc *doc = NULL;
    if (!rc && mts_json_parse(text, len, &doc, err)) rc = mts_err_prefix(err, "crop_rects_path %s: ", path);
    free(text);
    if (rc) return rc;
    c->rects = calloc((size_t)c->n, sizeof *c->rects);
    bool *seen = calloc((size_t)c->n, 1);
    const mts_json *root = mts_json_root(doc);
    if (!c->rects || !seen) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
    else if (mts_json_type(root) == MTS_JSON_ARRAY) {
        size_t m = mts_json_len(root);
        for (size_t i = 0; !rc && i < m && i < (size_t)c->n; i++) {
            rc = rect_from_json(mts_json_at(root, i), &c->rects[i], path, (int)i, err);
            seen[i] = true;
        }
    } else if (mts_json_type(root) == MTS_JSON_OBJECT) {
        size_t m = mts_json_len(root);
        for (size_t i = 0; !rc && i < m; i++) {
            const char *key = mts_json_key_at(root, i);
            char *end = NULL;
            errno = 0;
            long idx = strtol(key, &end, 10);
            if (!key[0] || *end || errno || idx < 0) {
                rc = mts_err_set(err, MTS_EINVAL, "crop_rects_path %s: key \"%.40s\" is not a frame index", path, key);
                break;
            }
            if (idx >= c->n) continue; /* beyond num_frames: unused */
            rc = rect_from_json(mts_json_at(root, i), &c->rects[idx], path, (int)idx, err);
            seen[idx] = true;
        }
    } else {
        rc = mts_err_set(err, MTS_EINVAL, "crop_rects_path %s: expected a list of rectangles or an object keyed by frame index",
                         path);
    }
    for (int i = 0; !rc && i < c->n; i++)
        if (!seen[i])
            rc = mts_err_set(err, MTS_EINVAL, "crop_rects_path %s has no rectangle for frame %d (of %d frames)", path, i,
                             c->n);
    free(seen);
    mts_json_free(doc);
    return rc;
}

/* ---- lifetime ---- */

static void free_frame(mts_bgframe *f)
{
    if (!f) return;
    mts_image_free(&f->img);
    mts_jpeg_bg_free(f->jpeg);
    free(f);
}

static int64_t frame_bytes(const mts_bgframe *f)
{
    return (int64_t)f->img.width * f->img.height * 3 + (f->jpeg ? (int64_t)mts_jpeg_bg_bytes(f->jpeg) : 0);
}

/* The frame's JPEG encoding at quality (lock NOT held); NULL if the encoder fails. */
static mts_jpeg_bg *encode_jpeg(const mts_image *img, int quality)
{
    const uint8_t **rows = malloc(sizeof *rows * (size_t)img->height);
    mts_jpeg_bg *b = NULL;
    mts_err err = {0};
    if (rows) {
        for (int y = 0; y < img->height; y++) rows[y] = img->rgb + (size_t)y * img->width * 3;
        if (mts_jpeg_bg_make(rows, img->width, img->height, quality, &b, &err)) b = NULL;
    }
    free(rows);
    return b;
}

static void cache_free(mts_bgcache *c)
{
    if (!c) return;
    for (int i = 0; c->paths && i < c->n; i++) free(c->paths[i]);
    for (int i = 0; c->slots && i < c->n; i++) free_frame(c->slots[i].frame);
    free(c->paths);
    free(c->rects);
    free(c->slots);
    free(c->model);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cv);
    free(c);
}

int mts_bgcache_open(const mts_bgcache_config *cfg, mts_bgcache **out, mts_err *err)
{
    *out = NULL;
    if (!cfg->background_dir || !cfg->background_dir[0])
        return mts_err_set(err, MTS_EINVAL, "model '%s' has no background_dir", cfg->model ? cfg->model : "");
    if (!cfg->crop_rects_path || !cfg->crop_rects_path[0])
        return mts_err_set(err, MTS_EINVAL, "model '%s' has background_dir but no crop_rects_path",
                           cfg->model ? cfg->model : "");
    mts_bgcache *c = calloc(1, sizeof *c);
    if (!c) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->head = c->tail = -1;
    c->capacity = cfg->capacity > 0 ? cfg->capacity : 1;
    c->model = strdup(cfg->model ? cfg->model : "");
    int rc = c->model ? MTS_OK : mts_err_set(err, MTS_ENOMEM, "out of memory");
    if (!rc) rc = scan_frames(c, cfg->background_dir, cfg->num_frames, err);
    if (!rc) rc = load_rects(c, cfg->crop_rects_path, err);
    if (!rc) {
        /* Size of the first frame whose header reads: the budget reserves capacity such frames. A
         * frame that does not probe is reported by the request that uses it. */
        mts_err first = {0};
        rc = MTS_EFORMAT;
        for (int i = 0; rc && i < c->n && i < 16; i++) {
            mts_err e = {0};
            rc = mts_png_probe(c->paths[i], &c->width, &c->height, &e);
            if (rc && !first.code) first = e;
        }
        if (rc) rc = mts_err_set(err, first.code, "%s", first.msg);
    }
    if (!rc && !(c->slots = calloc((size_t)c->n, sizeof *c->slots))) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
    if (rc) {
        cache_free(c);
        return rc;
    }
    for (int i = 0; i < c->n; i++) c->slots[i].prev = c->slots[i].next = -1;
    *out = c;
    return MTS_OK;
}

void mts_bgcache_ref(mts_bgcache *c)
{
    atomic_fetch_add(&c->refs, 1);
}

void mts_bgcache_unref(mts_bgcache *c)
{
    if (c && atomic_fetch_sub(&c->refs, 1) == 1) cache_free(c);
}

int mts_bgcache_num_frames(const mts_bgcache *c)
{
    return c->n;
}

int mts_bgcache_capacity(const mts_bgcache *c)
{
    return c->capacity;
}

void mts_bgcache_size(const mts_bgcache *c, int *width, int *height)
{
    *width = c->width;
    *height = c->height;
}

int64_t mts_bgcache_frame_reserve(int width, int height)
{
    return (int64_t)width * height * 3 + (int64_t)width * height / 4;
}

int64_t mts_bgcache_capacity_bytes(const mts_bgcache *c)
{
    return (int64_t)c->capacity * mts_bgcache_frame_reserve(c->width, c->height);
}

const mts_crop_rect *mts_bgcache_rect(const mts_bgcache *c, int idx)
{
    return &c->rects[idx];
}

static const mts_jpeg_bg *jpeg_of(mts_bgcache *c, mts_bgframe *f, int quality, bool count);

/* ---- LRU (lock held) ---- */

static void lru_unlink(mts_bgcache *c, int i)
{
    slot *s = &c->slots[i];
    if (s->prev >= 0) c->slots[s->prev].next = s->next;
    else c->head = s->next;
    if (s->next >= 0) c->slots[s->next].prev = s->prev;
    else c->tail = s->prev;
    s->prev = s->next = -1;
}

static void lru_push_head(mts_bgcache *c, int i)
{
    slot *s = &c->slots[i];
    s->prev = -1;
    s->next = c->head;
    if (c->head >= 0) c->slots[c->head].prev = i;
    c->head = i;
    if (c->tail < 0) c->tail = i;
}

/* Evicts unpinned frames from the cold end while over capacity (lock held). */
static void trim(mts_bgcache *c)
{
    int i = c->tail;
    while (c->cached > c->capacity && i >= 0) {
        int prev = c->slots[i].prev;
        slot *s = &c->slots[i];
        if (s->refs == 0) {
            lru_unlink(c, i);
            s->state = SLOT_EMPTY;
            c->cached--;
            c->bytes -= frame_bytes(s->frame);
            c->evictions++;
            free_frame(s->frame);
            s->frame = NULL;
        }
        i = prev;
    }
}

/* Decodes slot idx (state LOADING, lock NOT held). */
static int decode(mts_bgcache *c, int idx, mts_bgframe **out, double *ms, mts_err *err)
{
    double t0 = mts_now_ms();
    mts_bgframe *f = calloc(1, sizeof *f);
    if (!f) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    int rc = mts_png_decode_file(c->paths[idx], &f->img, err);
    if (!rc && (f->img.width != c->width || f->img.height != c->height))
        rc = mts_err_set(err, MTS_EFORMAT, "%s: frame %d is %dx%d but the avatar's frames are %dx%d", c->paths[idx], idx,
                         f->img.width, f->img.height, c->width, c->height);
    if (rc) {
        free_frame(f);
        return rc;
    }
    f->idx = idx;
    int q = atomic_load(&c->jpeg_quality);
    if (q > 0) f->jpeg = encode_jpeg(&f->img, q); /* NULL on failure: requests encode whole frames */
    *out = f;
    *ms = mts_now_ms() - t0;
    return MTS_OK;
}

/* Lock held; slot idx LOADING. Installs the result of a decode. */
static void install(mts_bgcache *c, int idx, mts_bgframe *f, double ms, int pin)
{
    slot *s = &c->slots[idx];
    s->frame = f;
    s->state = SLOT_READY;
    s->refs = pin;
    lru_push_head(c, idx);
    c->cached++;
    c->bytes += frame_bytes(f);
    c->loads++;
    c->total_load_ms += ms;
    trim(c);
    pthread_cond_broadcast(&c->cv);
}

int mts_bgcache_get(mts_bgcache *c, int idx, mts_bgframe **out, mts_err *err)
{
    *out = NULL;
    if (idx < 0 || idx >= c->n)
        return mts_err_set(err, MTS_EINVAL, "background frame index %d is outside 0..%d", idx, c->n - 1);
    pthread_mutex_lock(&c->lock);
    c->requests++;
    for (;;) {
        slot *s = &c->slots[idx];
        if (s->state == SLOT_READY) {
            c->hits++;
            s->refs++;
            lru_unlink(c, idx);
            lru_push_head(c, idx);
            *out = s->frame;
            pthread_mutex_unlock(&c->lock);
            return MTS_OK;
        }
        if (s->state == SLOT_LOADING) {
            pthread_cond_wait(&c->cv, &c->lock);
            continue;
        }
        s->state = SLOT_LOADING;
        c->misses++;
        pthread_mutex_unlock(&c->lock);
        mts_bgframe *f = NULL;
        double ms = 0;
        int rc = decode(c, idx, &f, &ms, err);
        pthread_mutex_lock(&c->lock);
        if (rc) {
            s->state = SLOT_EMPTY;
            c->load_errors++;
            pthread_cond_broadcast(&c->cv);
        } else {
            install(c, idx, f, ms, 1);
            *out = f;
        }
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
}

void mts_bgcache_put(mts_bgcache *c, mts_bgframe *f)
{
    if (!f) return;
    pthread_mutex_lock(&c->lock);
    slot *s = &c->slots[f->idx];
    if (--s->refs == 0) trim(c);
    pthread_mutex_unlock(&c->lock);
}

void mts_bgcache_preload(mts_bgcache *c, int idx)
{
    if (idx < 0 || idx >= c->n) return;
    pthread_mutex_lock(&c->lock);
    slot *s = &c->slots[idx];
    if (s->state != SLOT_EMPTY) {
        int q = atomic_load(&c->jpeg_quality);
        mts_bgframe *f = s->frame;
        if (s->state == SLOT_READY) {
            lru_unlink(c, idx);
            lru_push_head(c, idx);
            /* cached without the JPEG encoding composites will want: make it now, off their path */
            if (q > 0 && !s->jpeg_busy && s->refs == 0 && (!f->jpeg || mts_jpeg_bg_quality(f->jpeg) != q)) {
                s->refs++;
                pthread_mutex_unlock(&c->lock);
                jpeg_of(c, f, q, false);
                mts_bgcache_put(c, f);
                return;
            }
        }
        pthread_mutex_unlock(&c->lock);
        return;
    }
    s->state = SLOT_LOADING;
    pthread_mutex_unlock(&c->lock);
    mts_bgframe *f = NULL;
    double ms = 0;
    mts_err err = {0};
    int rc = decode(c, idx, &f, &ms, &err);
    pthread_mutex_lock(&c->lock);
    if (rc) {
        s->state = SLOT_EMPTY;
        c->load_errors++;
        pthread_cond_broadcast(&c->cv);
    } else {
        c->preloads++;
        install(c, idx, f, ms, 0);
    }
    pthread_mutex_unlock(&c->lock);
}

void mts_bgcache_stats_get(mts_bgcache *c, mts_bgcache_stats *o)
{
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&c->lock);
    o->requests = c->requests;
    o->hits = c->hits;
    o->misses = c->misses;
    o->evictions = c->evictions;
    o->preloads = c->preloads;
    o->load_errors = c->load_errors;
    o->loads = c->loads;
    o->jpeg_spliced = c->jpeg_spliced;
    o->jpeg_full = c->jpeg_full;
    o->total_load_ms = c->total_load_ms;
    o->frames_cached = c->cached;
    o->bytes = c->bytes;
    pthread_mutex_unlock(&c->lock);
    o->hit_rate = o->requests ? (double)o->hits / (double)o->requests : 0;
    o->avg_load_ms = o->loads ? o->total_load_ms / (double)o->loads : 0;
    o->capacity_frames = c->capacity;
    o->num_frames = c->n;
    o->width = c->width;
    o->height = c->height;
    o->capacity_bytes = mts_bgcache_capacity_bytes(c);
}

void mts_bgcache_want_jpeg(mts_bgcache *c, int quality)
{
    atomic_store(&c->jpeg_quality, quality);
}

/* mts_bgcache_jpeg; count: whether this is a composite's lookup (counted in the stats). */
static const mts_jpeg_bg *jpeg_of(mts_bgcache *c, mts_bgframe *f, int quality, bool count)
{
    pthread_mutex_lock(&c->lock);
    slot *s = &c->slots[f->idx];
    mts_jpeg_bg *have = f->jpeg;
    if (have && mts_jpeg_bg_quality(have) == quality) {
        c->jpeg_spliced += count;
        pthread_mutex_unlock(&c->lock);
        return have;
    }
    if (s->jpeg_busy || (have && s->refs > 1)) { /* being encoded, or read by others at another quality */
        c->jpeg_full += count;
        pthread_mutex_unlock(&c->lock);
        return NULL;
    }
    s->jpeg_busy = 1;
    f->jpeg = NULL;
    if (have) c->bytes -= (int64_t)mts_jpeg_bg_bytes(have);
    pthread_mutex_unlock(&c->lock);
    mts_jpeg_bg_free(have); /* only this thread has the frame pinned: nobody else reads it */
    mts_jpeg_bg *b = encode_jpeg(&f->img, quality);
    pthread_mutex_lock(&c->lock);
    s->jpeg_busy = 0;
    f->jpeg = b;
    if (b) {
        c->bytes += (int64_t)mts_jpeg_bg_bytes(b);
        c->jpeg_spliced += count;
    } else {
        c->jpeg_full += count;
    }
    pthread_mutex_unlock(&c->lock);
    return b;
}

const mts_jpeg_bg *mts_bgcache_jpeg(mts_bgcache *c, mts_bgframe *f, int quality)
{
    atomic_store(&c->jpeg_quality, quality);
    return jpeg_of(c, f, quality, true);
}
