/*
 * Weight lifetime: where a model's initializer bytes live and for how long.
 *
 * Initializers are used in place from the file mapping when they are aligned, or copied out of
 * it (mts__add_copy, while parsing). Once a backend has packed a plan's weights into its own
 * cache, the unpacked copies nothing reads any more are dropped and the mapping's pages are
 * handed back to the kernel (mts__release_weights); before another plan is built they are made
 * again from the mapping (mts__restore_weights). This unit keeps the copy byte accounting
 * (mts_model.copy_bytes) and owns the mappings and copies until the model is freed.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/weights.h"

/* Under AddressSanitizer the engine's memory comes from malloc, so that ASan sees every byte a
 * kernel reads: model files are read into the heap instead of mapped (an in-place weight read
 * after its model is freed is then a reported use after free, not a silent read of a live
 * mapping), and weight copies are heap blocks too (below). */
#if defined(__SANITIZE_ADDRESS__)
#define ENGINE_MALLOC_ONLY 1
#else
#define ENGINE_MALLOC_ONLY 0
#endif

void *mts__map_file(int fd, size_t len)
{
    if (!ENGINE_MALLOC_ONLY) {
        void *addr = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        return addr == MAP_FAILED ? NULL : addr;
    }
    /* Page-aligned like a mapping, so the same initializers are used in place or copied. */
    uint8_t *buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096 + (len ? 0 : 4096));
    if (!buf) return NULL;
    for (size_t off = 0; off < len;) {
        ssize_t n = pread(fd, buf + off, len - off, (off_t)off);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            if (n == 0) errno = EIO; /* the file shrank while being read */
            free(buf);
            return NULL;
        }
        off += (size_t)n;
    }
    return buf;
}

void mts__unmap_file(void *addr, size_t len)
{
    if (!addr) return;
    if (ENGINE_MALLOC_ONLY) free(addr);
    else munmap(addr, len);
}

/* Copies are large (weights): they get their own pages so dropping one returns its memory to
 * the system at once (a malloc'd block would stay in the heap). */
#define COPY_MMAP_MIN ((size_t)16 << 10)

/* Under AddressSanitizer every copy comes from malloc (ENGINE_MALLOC_ONLY), so a read of a
 * dropped copy is reported as a use after free: ASan cannot see into an anonymous mapping, and
 * a read of one that is unmapped is a bare SIGSEGV. A copy is written whole right after it is
 * made, so a mapping's pages are faulted in by the mmap call (MAP_POPULATE) rather than one fault
 * per page as memcpy first touches them: about a third of a plan's rebuild of minilm_like's 88 MB
 * of copies. */
static void *copy_alloc(size_t len)
{
    if (len < COPY_MMAP_MIN || ENGINE_MALLOC_ONLY) return malloc(len ? len : 1);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Whether [src, src + len) lies in one of m's file mappings: only a mapping's pages are read in
 * or dropped around a copy (dropped heap pages would read zero). */
static bool in_mapping(const mts_model *m, const void *src, size_t len)
{
    for (int i = 0; i < m->n_maps; i++)
        if ((const uint8_t *)src >= (const uint8_t *)m->maps[i].addr &&
            (const uint8_t *)src + len <= (const uint8_t *)m->maps[i].addr + m->maps[i].len)
            return true;
    return false;
}

/* Reads the pages of a mapped source range in by one call before it is copied (its pages were
 * dropped after an earlier copy, or never read): MADV_POPULATE_READ, Linux 5.14; an older kernel
 * refuses it and memcpy faults the pages in as before. */
static void populate_pages(const void *src, size_t len, size_t page)
{
#if defined(MADV_POPULATE_READ)
    uintptr_t a = (uintptr_t)src / page * page;
    (void)madvise((void *)a, (uintptr_t)src + len - a, MADV_POPULATE_READ);
#else
    (void)src, (void)len, (void)page;
#endif
}

/* Drops the whole pages of a copied mapped range from the resident set right after it is
 * copied: the copy is what is read from now on, and a model's load or plan build would
 * otherwise hold its weights twice (copies and mapped pages) until it ends. Pages shared with
 * an in-place initializer fault back in from the page cache when read. */
static void drop_pages(const void *src, size_t len, size_t page)
{
    uintptr_t a = ((uintptr_t)src + page - 1) / page * page;
    uintptr_t e = ((uintptr_t)src + len) / page * page;
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

/* Copies len bytes out of m's file mapping in 1 MB pieces, reading each piece's mapped pages in
 * first and dropping them once copied: a large initializer's file pages never all sit beside its
 * copy (two loader threads copying 26 MB tensors held 50 MB of file pages for a moment before). */
static void copy_out(const mts_model *m, void *dst, const void *src, size_t len)
{
    const size_t piece = (size_t)1 << 20;
    long page = sysconf(_SC_PAGESIZE);
    bool mapped = !ENGINE_MALLOC_ONLY && page > 0 && in_mapping(m, src, len);
    for (size_t off = 0; off < len; off += piece) {
        size_t n = len - off < piece ? len - off : piece;
        const uint8_t *from = (const uint8_t *)src + off;
        bool pages = mapped && n >= (size_t)page * 2;
        if (pages) populate_pages(from, n, (size_t)page);
        memcpy((uint8_t *)dst + off, from, n);
        if (pages) drop_pages(from, n, (size_t)page);
    }
}

static void copy_free(void *p, size_t len)
{
    if (!p) return;
    if (len < COPY_MMAP_MIN || ENGINE_MALLOC_ONLY) free(p);
    else munmap(p, len);
}

mts__copy *mts__add_copy(mts_model *m, const void *src, size_t len)
{
    if (m->n_copies == m->cap_copies) {
        int cap = m->cap_copies ? m->cap_copies * 2 : 16;
        mts__copy *c = realloc(m->copies, sizeof *c * (size_t)cap);
        if (!c) return NULL;
        m->copies = c;
        m->cap_copies = cap;
    }
    void *d = copy_alloc(len);
    if (!d) return NULL;
    copy_out(m, d, src, len);
    mts__copy *c = &m->copies[m->n_copies++];
    *c = (mts__copy){d, src, len, -1};
    m->copy_bytes += (int64_t)len;
    return c;
}

/* Marks every value a step of plan p reads at run time. Steps read only their inputs: fused
 * steps list the inputs of the nodes they absorbed, and oneDNN steps read packed copies kept in
 * the model's weight cache, never the originals. */
static void mark_reads(const mts__plan *p, uint8_t *used)
{
    for (int s = 0; s < p->n_steps; s++)
        for (int j = 0; j < p->steps[s].n_in; j++)
            if (p->steps[s].in[j] >= 0) used[p->steps[s].in[j]] = 1;
}

void mts__release_weights(mts_model *m, const mts__plan *p, const int *values, int n)
{
    if (n <= 0) return;
    uint8_t *used = calloc((size_t)m->n_values + 1, 1);
    if (!used) return;
    /* Every plan of the model counts, not just the new one: a plan for another batch size may
     * run the same node with a kernel that reads the unpacked weights (a direct 1x1 conv at
     * batch 1 beside a oneDNN conv at batch 8), and other workers run those plans while this one
     * is built. p is not on m->plans yet. */
    mark_reads(p, used);
    for (const mts__plan *q = m->plans; q; q = q->next) mark_reads(q, used);
    for (int i = 0; i < m->n_outputs; i++) used[m->outputs[i]] = 1;
    for (int i = 0; i < n; i++) {
        int v = values[i];
        if (v < 0 || v >= m->n_values || used[v]) continue;
        mts_value *val = &m->values[v];
        if (val->kind != MTS_VALUE_INITIALIZER || !val->init.data) continue;
        for (int c = 0; c < m->n_copies; c++)
            if (m->copies[c].value == v && m->copies[c].data) {
                copy_free(m->copies[c].data, m->copies[c].len);
                m->copies[c].data = NULL;
                m->copy_bytes -= (int64_t)m->copies[c].len;
                val->init.data = NULL;
            }
    }
    free(used);
    mts__drop_map_pages(m);
}

/* The file mapping was touched by parsing and copying; drop it from this process's resident
 * set. Pages still read by kernels (in-place initializers, biases) fault back in from the page
 * cache on their next use; copied and released weights never do. Without this the pages of
 * every copied initializer stay resident twice (the copy is accounted, the mapping is not). */
void mts__drop_map_pages(mts_model *m)
{
    long page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < m->n_maps && !ENGINE_MALLOC_ONLY; i++) {
        uintptr_t a = ((uintptr_t)m->maps[i].addr + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
        uintptr_t e = ((uintptr_t)m->maps[i].addr + m->maps[i].len) / (uintptr_t)page * (uintptr_t)page;
        if (page > 0 && e > a) madvise((void *)a, e - a, MADV_DONTNEED);
    }
}

int mts__restore_weights(mts_model *m, mts_err *err)
{
    for (int c = 0; c < m->n_copies; c++) {
        mts__copy *cp = &m->copies[c];
        if (cp->data || cp->value < 0) continue;
        if (!(cp->data = copy_alloc(cp->len))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        copy_out(m, cp->data, cp->src, cp->len);
        m->copy_bytes += (int64_t)cp->len;
        m->values[cp->value].init.data = cp->data;
    }
    return MTS_OK;
}

void mts__weights_free(mts_model *m)
{
    for (int i = 0; i < m->n_copies; i++) copy_free(m->copies[i].data, m->copies[i].len);
    free(m->copies);
    m->copies = NULL;
    m->n_copies = m->cap_copies = 0;
    for (int i = 0; i < m->n_maps; i++) {
        mts__unmap_file(m->maps[i].addr, m->maps[i].len);
        free(m->maps[i].location);
    }
    free(m->maps);
    m->maps = NULL;
    m->n_maps = 0;
}
