/*
 * A small FIFO work queue with its own threads, for work that must run neither on the engine's
 * device workers (which would hold a worker, and its compute threads, idle) nor on I/O threads
 * (which must not block): the server's media queue composites and encodes lip-sync frames on
 * one, the gRPC front end builds large replies on another. Threads may run at a lower
 * scheduling priority (nice) so that, when cores are scarce, the engine's compute threads win
 * and the queued work takes the idle time between batches.
 */
#ifndef MTS_UTIL_WORKQ_H
#define MTS_UTIL_WORKQ_H

#include "util/status.h"

typedef struct mts_workq mts_workq;
typedef void (*mts_work_fn)(void *arg);

/* threads >= 1; nice: added to the threads' nice value (0 = same priority, Linux only); name: the
 * threads' name as top -H and perf show it (at most 15 characters; NULL keeps the creator's). */
int mts_workq_create(int threads, int nice, const char *name, mts_workq **out, mts_err *err);
/* Queues fn(arg); never blocks. MTS_EUNAVAILABLE once shutdown has begun, MTS_ENOMEM. */
int mts_workq_submit(mts_workq *q, mts_work_fn fn, void *arg);
/* Jobs queued or running. */
int mts_workq_pending(mts_workq *q);
/* Runs every queued job, joins the threads and frees the queue. NULL is ignored. */
void mts_workq_destroy(mts_workq *q);

#endif
