/*
 * Weight lifetime (weights.c): file mappings, initializer copies and their release once a
 * backend has packed them. Internal to the engine: the parser records copies, the loader maps
 * and frees, the planner restores before it builds, and backends release what they packed.
 */
#ifndef MTS_ENGINE_WEIGHTS_H
#define MTS_ENGINE_WEIGHTS_H

#include <stddef.h>

#include "engine/model.h"

/* Maps a model or external-data file read-only (read into the heap in the ASan build, so that
 * ASan sees the weights); NULL with errno set on failure. mts__unmap_file releases it. */
void *mts__map_file(int fd, size_t len);
void mts__unmap_file(void *addr, size_t len);
/* Records a copy of len bytes at src (onnx_pb.c, loading). NULL when out of memory. */
mts__copy *mts__add_copy(mts_model *m, const void *src, size_t len);
/* Weights packed by a backend are not read again by the plan that packed them: drops the copies
 * of the given initializers unless a step of plan p (or of another plan of m) still reads them,
 * and lets the kernel reclaim the file mapping's pages (MADV_DONTNEED; the file stays mapped and
 * pages still in use fault back in from the page cache). mts__restore_weights remakes dropped
 * copies before another plan is built. Both run under the plan lock. */
void mts__release_weights(mts_model *m, const mts__plan *p, const int *values, int n);
int mts__restore_weights(mts_model *m, mts_err *err);
/* Drops m's file mappings from the resident set (MADV_DONTNEED; pages fault back from the page
 * cache when read): after loading, and after mts__release_weights. */
void mts__drop_map_pages(mts_model *m);
/* Frees every copy and unmaps every mapping of m (mts_model_free). */
void mts__weights_free(mts_model *m);

#endif
