/*
 * Status code names and the mts_err helpers: formatting messages into a fixed buffer and
 * prefixing context as an error travels up through the layers.
 */
#include "util/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mts_status_name(int status)
{
    switch (status) {
#define MTS__STATUS_NAME(name, value, text) \
    case value: return #name;
        MTS_STATUS_LIST(MTS__STATUS_NAME)
#undef MTS__STATUS_NAME
    }
    return "MTS_E?";
}

const char *mts_status_text(int status)
{
    switch (status) {
#define MTS__STATUS_TEXT(name, value, text) \
    case value: return text;
        MTS_STATUS_LIST(MTS__STATUS_TEXT)
#undef MTS__STATUS_TEXT
    }
    return "unknown status";
}

int mts_err_set(mts_err *err, int code, const char *fmt, ...)
{
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int mts_err_prefix(mts_err *err, const char *fmt, ...)
{
    if (!err) return MTS_OK;
    char head[MTS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    size_t hl = strlen(head), ml = strlen(err->msg);
    if (hl >= sizeof err->msg) hl = sizeof err->msg - 1;
    if (hl + ml >= sizeof err->msg) ml = sizeof err->msg - 1 - hl;
    memmove(err->msg + hl, err->msg, ml);
    memcpy(err->msg, head, hl);
    err->msg[hl + ml] = '\0';
    return err->code;
}

void mts_err_clear(mts_err *err)
{
    if (!err) return;
    err->code = 0;
    err->msg[0] = '\0';
}

void mts__assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "mtserve: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
    abort();
}
