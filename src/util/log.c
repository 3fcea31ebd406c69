/*
 * Line-oriented logging to stderr with a UTC timestamp and level; each line is formatted in a
 * stack buffer and written with one write(2) so concurrent lines never interleave. Which levels
 * are written is a bit mask (one bit per level) and the layout a flag, both atomic so that the
 * logging endpoint can change them while other threads log.
 */
#include "util/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* bit L set: level L is written (INFO, WARN and ERROR by default) */
static _Atomic int log_mask = (1 << MTS_LOG_INFO) | (1 << MTS_LOG_WARN) | (1 << MTS_LOG_ERROR);
static _Atomic int log_format = MTS_LOG_FORMAT_DEFAULT;

void mts_log_set_level(mts_log_level level)
{
    int m = 0;
    for (int l = (int)level; l < MTS_LOG_OFF; l++) m |= 1 << l;
    atomic_store(&log_mask, m);
}

void mts_log_set_enabled(mts_log_level level, bool on)
{
    if (level < MTS_LOG_DEBUG || level >= MTS_LOG_OFF) return;
    if (on) atomic_fetch_or(&log_mask, 1 << level);
    else atomic_fetch_and(&log_mask, ~(1 << level));
}

bool mts_log_enabled(mts_log_level level)
{
    return level >= MTS_LOG_DEBUG && level < MTS_LOG_OFF && (atomic_load(&log_mask) & (1 << level));
}

void mts_log_set_format(mts_log_format f)
{
    atomic_store(&log_format, (int)f);
}

mts_log_format mts_log_get_format(void)
{
    return (mts_log_format)atomic_load(&log_format);
}

void mts_log(mts_log_level level, const char *fmt, ...)
{
    if (!mts_log_enabled(level)) return;
    static const char *names[] = {"debug", "info ", "warn ", "error"};
    char line[1024];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n;
    if (atomic_load(&log_format) == MTS_LOG_FORMAT_ISO8601)
        n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02dZ %c ", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, "DIWE"[level & 3]);
    else
        n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ", tm.tm_year + 1900, tm.tm_mon + 1,
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
