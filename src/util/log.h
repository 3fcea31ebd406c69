/*
 * Logging: one line per event on stderr, "2026-11-21T22:54:57.123Z info  model=seg event=loaded ...".
 * Levels below the configured one are dropped. Thread-safe (one write(2) per line). JSON lines
 * instead with mts_log_set_json(1).
 */
#ifndef MTS_UTIL_LOG_H
#define MTS_UTIL_LOG_H

typedef enum mts_log_level { MTS_LOG_DEBUG = 0, MTS_LOG_INFO, MTS_LOG_WARN, MTS_LOG_ERROR, MTS_LOG_OFF } mts_log_level;

void mts_log_set_level(mts_log_level level);
/* 1: one JSON object per line ({"time","level","event","model","msg"}); 0: text (the default). */
void mts_log_set_json(int on);
void mts_log(mts_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define MTS_INFO(...) mts_log(MTS_LOG_INFO, __VA_ARGS__)
#define MTS_WARN(...) mts_log(MTS_LOG_WARN, __VA_ARGS__)
#define MTS_ERROR(...) mts_log(MTS_LOG_ERROR, __VA_ARGS__)

#endif
