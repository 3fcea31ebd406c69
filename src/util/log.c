/*
 * Line-oriented logging to stderr with a UTC timestamp and level; each line is formatted in a
 * stack buffer and written with one write(2) so concurrent lines never interleave.
 */
#include "util/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_level = MTS_LOG_INFO;

void mts_log_set_level(mts_log_level level)
{
    atomic_store(&log_level, (int)level);
}

void mts_log(mts_log_level level, const char *fmt, ...)
{
    if ((int)level < atomic_load(&log_level)) return;
    static const char *names[] = {"debug", "info ", "warn ", "error"};
    char line[1024];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, names[level & 3]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t w = write(2, line, len);
    (void)w;
}
