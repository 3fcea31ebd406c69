/*
 * Fatal-signal reporting: a crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) writes one log line
 * naming the signal, the faulting address, the thread and the model it was running, then the
 * backtrace (one frame a line), and the process dies of the same signal, so supervisors and
 * shells still see the true cause (exit 139 for SIGSEGV).
 */
#ifndef MTS_UTIL_CRASH_H
#define MTS_UTIL_CRASH_H

/* Installs the handlers (idempotent). Sanitizer builds keep the sanitizers' own reports. */
void mts_crash_install(void);
/* Names what the calling thread is doing, for the crash line ("model=NAME"); NULL clears it.
 * The string must outlive the call's scope until cleared (a model's name held by the registry). */
void mts_crash_set_model(const char *model);

#endif
