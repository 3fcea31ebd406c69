/*
 * Status codes and error objects shared by every mtserve module.
 *
 * Fallible functions return an int status: 0 (MTS_OK) or a negative MTS_E* code. The codes and
 * their names come from one X-macro list so a code can always be printed. Details for a human
 * (which model, which node, expected vs got) go into a caller-provided struct mts_err.
 */
#ifndef MTS_UTIL_STATUS_H
#define MTS_UTIL_STATUS_H

#include <stddef.h>

#define MTS_STATUS_LIST(X)                                                   \
    X(MTS_OK, 0, "ok")                                                       \
    X(MTS_EINVAL, -1, "invalid argument")                                    \
    X(MTS_ENOMEM, -2, "out of memory")                                       \
    X(MTS_EIO, -3, "i/o error")                                              \
    X(MTS_EFORMAT, -4, "malformed model")                                    \
    X(MTS_EUNSUPPORTED, -5, "unsupported")                                   \
    X(MTS_ESHAPE, -6, "shape mismatch")                                      \
    X(MTS_ENOTFOUND, -7, "not found")                                        \
    X(MTS_EDYNAMIC, -8, "value not known before run time")                   \
    X(MTS_ELIMIT, -9, "limit exceeded")                                      \
    X(MTS_EFULL, -10, "queue full")                                          \
    X(MTS_ETIMEDOUT, -11, "deadline exceeded")                               \
    X(MTS_EUNAVAILABLE, -12, "unavailable")                                  \
    X(MTS_ECANCELLED, -13, "cancelled")                                      \
    X(MTS_EUNAUTHENTICATED, -14, "unauthenticated")                          \
    X(MTS_EPERMISSION, -15, "permission denied")

enum mts_status {
#define MTS__STATUS_ENUM(name, value, text) name = value,
    MTS_STATUS_LIST(MTS__STATUS_ENUM)
#undef MTS__STATUS_ENUM
};

/* Name ("MTS_EFORMAT") and description ("malformed model") of a status code. */
const char *mts_status_name(int status);
const char *mts_status_text(int status);

#define MTS_ERR_MSG_MAX 512

typedef struct mts_err {
    int code;                    /* last status set, 0 if none */
    char msg[MTS_ERR_MSG_MAX];   /* human-readable: what is wrong and where */
} mts_err;

/* Records code and a printf-style message in err (which may be NULL) and returns code, so
 * callers write `return mts_err_set(err, MTS_EFORMAT, "...", ...);`. */
int mts_err_set(mts_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends context ("loading model.onnx: ") to an existing message, keeping the code. */
int mts_err_prefix(mts_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void mts_err_clear(mts_err *err);

/* Aborts with file/line on a broken internal invariant. Never used for bad input. */
#define MTS_ASSERT(cond)                                                                  \
    do {                                                                                  \
        if (!(cond)) mts__assert_fail(#cond, __FILE__, __LINE__);                        \
    } while (0)
_Noreturn void mts__assert_fail(const char *expr, const char *file, int line);

#endif
