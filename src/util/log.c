/*
 * Line-oriented logging to stderr with a UTC timestamp and level; each line is formatted in a
 * stack buffer and written with one write(2) so concurrent lines never interleave. Which levels
 * are written is a bit mask (one bit per level) and the layout a flag, both atomic so that the
 * logging endpoint can change them while other threads log. In JSON format each line is one
 * object: {"time", "level", "event", "model" (when the message names one), "msg"}, where event
 * and model come from the message's "event=..." and "model=..." tokens (without an event token,
 * a leading "word: " names the event, else it is "log").
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
static _Atomic int log_json = 0;

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

void mts_log_set_json(int on)
{
    atomic_store(&log_json, on != 0);
}

/* Appends s[0..n) as JSON string content to out (bounded); returns the new length. */
static size_t json_append(char *out, size_t len, size_t cap, const char *s, size_t n)
{
    for (size_t i = 0; i < n && len + 16 < cap; i++) { /* room for the closing "}\n */
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            out[len++] = '\\';
            out[len++] = (char)ch;
        } else if (ch < 0x20) {
            len += (size_t)snprintf(out + len, cap - len, "\\u%04x", ch);
        } else {
            out[len++] = (char)ch;
        }
    }
    return len;
}

/* The value of the first "key=" token of msg (at the start or after a space), up to a space. */
static const char *token(const char *msg, const char *key, size_t *n)
{
    size_t kl = strlen(key);
    for (const char *p = msg; (p = strstr(p, key)); p += kl) {
        if ((p == msg || p[-1] == ' ') && p[kl] == '=') {
            const char *v = p + kl + 1;
            *n = strcspn(v, " ");
            return *n ? v : NULL;
        }
    }
    return NULL;
}

void mts_log(mts_log_level level, const char *fmt, ...)
{
    if (!mts_log_enabled(level)) return;
    static const char *names[] = {"debug", "info ", "warn ", "error"};
    static const char *json_names[] = {"debug", "info", "warn", "error"};
    char msg[1024], line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    bool iso = atomic_load(&log_format) == MTS_LOG_FORMAT_ISO8601 && !atomic_load(&log_json);
    if (iso)
        snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                 tm.tm_hour, tm.tm_min, tm.tm_sec);
    else
        snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t ml = m < 0 ? 0 : (size_t)m >= sizeof msg ? sizeof msg - 1 : (size_t)m;
    size_t len;
    if (atomic_load(&log_json)) {
        len = (size_t)snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",\"event\":\"", when,
                               json_names[level & 3]);
        size_t n = 0;
        const char *ev = token(msg, "event", &n);
        if (!ev) { /* "config: ..." -> event "config" */
            size_t w = strspn(msg, "abcdefghijklmnopqrstuvwxyz_");
            if (w > 0 && msg[w] == ':' && msg[w + 1] == ' ') ev = msg, n = w;
        }
        len = ev ? json_append(line, len, sizeof line, ev, n) : json_append(line, len, sizeof line, "log", 3);
        const char *model = token(msg, "model", &n);
        if (model && len + 12 < sizeof line) {
            memcpy(line + len, "\",\"model\":\"", 11);
            len = json_append(line, len + 11, sizeof line, model, n);
        }
        if (len + 10 < sizeof line) {
            memcpy(line + len, "\",\"msg\":\"", 9);
            len = json_append(line, len + 9, sizeof line, msg, ml);
        }
        if (len > sizeof line - 3) len = sizeof line - 3;
        line[len++] = '"';
        line[len++] = '}';
    } else {
        if (iso) len = (size_t)snprintf(line, sizeof line, "%s %c %.*s", when, "DIWE"[level & 3], (int)ml, msg);
        else len = (size_t)snprintf(line, sizeof line, "%s %s %.*s", when, names[level & 3], (int)ml, msg);
        if (len > sizeof line - 2) len = sizeof line - 2;
    }
    line[len++] = '\n';
    ssize_t w = write(2, line, len);
    (void)w;
}
