/*
 * mts_thread_realtime (rtprio.h): sched_setscheduler on the calling thread (Linux schedules
 * threads, so pid 0 is this thread alone), with SCHED_RESET_ON_FORK so that a thread it starts
 * (an OpenMP team's, say) begins at the normal policy. The first outcome of each kind is logged
 * once; after a refusal the process stops asking.
 */
#include "util/rtprio.h"
#include "util/log.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#ifndef SCHED_RESET_ON_FORK
#define SCHED_RESET_ON_FORK 0x40000000
#endif

static atomic_bool g_denied, g_logged_ok;

bool mts_thread_realtime(bool on, const char *who)
{
    struct sched_param p = {.sched_priority = on ? 1 : 0};
    if (!on) {
        (void)sched_setscheduler(0, SCHED_OTHER | SCHED_RESET_ON_FORK, &p);
        return false;
    }
    if (atomic_load_explicit(&g_denied, memory_order_relaxed)) return false;
    if (sched_setscheduler(0, SCHED_RR | SCHED_RESET_ON_FORK, &p) == 0) {
        if (!atomic_exchange(&g_logged_ok, true))
            MTS_INFO("event=realtime_threads threads=%s policy=SCHED_RR priority=1", who);
        return true;
    }
    int e = errno;
    if (!atomic_exchange(&g_denied, true))
        MTS_INFO("event=realtime_unavailable threads=%s reason=\"%s\" (they run at the normal priority; "
                 "CAP_SYS_NICE or an RLIMIT_RTPRIO of 1 allows SCHED_RR, server.light_io_realtime: false "
                 "stops asking)",
                 who, strerror(e));
    return false;
}
