/*
 * Logging: one line per event on stderr, "2026-11-21T22:54:57.123Z info  model=seg event=loaded ...".
 * Levels below the configured one are dropped; each level can also be switched on or off on its
 * own (the Triton logging extension's log_info / log_warning / log_error / log_verbose_level),
 * and the line layout chosen (log_format "default" as above, or "ISO8601":
 * "2026-11-21T22:54:57Z I model=seg ..."), or JSON lines with mts_log_set_json(1). Thread-safe
 * (one write(2) per line).
 */
#ifndef MTS_UTIL_LOG_H
#define MTS_UTIL_LOG_H

#include <stdbool.h>

typedef enum mts_log_level { MTS_LOG_DEBUG = 0, MTS_LOG_INFO, MTS_LOG_WARN, MTS_LOG_ERROR, MTS_LOG_OFF } mts_log_level;

void mts_log_set_level(mts_log_level level);
/* One level on or off (DEBUG..ERROR); the others keep their state. */
void mts_log_set_enabled(mts_log_level level, bool on);
bool mts_log_enabled(mts_log_level level);
typedef enum mts_log_format { MTS_LOG_FORMAT_DEFAULT = 0, MTS_LOG_FORMAT_ISO8601 } mts_log_format;
void mts_log_set_format(mts_log_format f);
mts_log_format mts_log_get_format(void);
/* 1: one JSON object per line ({"time","level","event","model","msg"}); 0: text (the default). */
void mts_log_set_json(int on);
void mts_log(mts_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define MTS_INFO(...) mts_log(MTS_LOG_INFO, __VA_ARGS__)
#define MTS_WARN(...) mts_log(MTS_LOG_WARN, __VA_ARGS__)
#define MTS_ERROR(...) mts_log(MTS_LOG_ERROR, __VA_ARGS__)

#endif
