/*
 * The monotonic clock in milliseconds (CLOCK_MONOTONIC), for timings in logs, statistics and
 * responses. A header-only helper so every module measures time the same way.
 */
#ifndef MTS_UTIL_CLOCK_H
#define MTS_UTIL_CLOCK_H

#include <time.h>

static inline double mts_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#endif
