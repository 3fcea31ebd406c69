/*
 * Fatal-signal handler: formats one log line with only async-signal-safe calls (no stdio, no
 * malloc; the timestamp is converted by hand), writes it and backtrace_symbols_fd's frames to
 * stderr, then re-raises the signal with its default action. backtrace() is called once at
 * install time so that libgcc's unwinder is loaded before any crash (its first call may
 * allocate). The handler runs on an alternate stack on the thread that installs it, so a stack
 * overflow of the main thread is reported too.
 *
 * Sanitizer builds install nothing: ASan, UBSan and TSan print their own report with a stack
 * for these signals, which is more than this handler could say.
 */
#include "util/crash.h"

#include <execinfo.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Thread_local const char *crash_model;

void mts_crash_set_model(const char *model)
{
    crash_model = model;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
void mts_crash_install(void)
{
}
#else

typedef struct {
    char *p, *end;
} out_buf;

static void put_str(out_buf *b, const char *s)
{
    while (*s && b->p < b->end) *b->p++ = *s++;
}

static void put_uint(out_buf *b, uint64_t v, int base, int width)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v % (unsigned)base];
        v /= (unsigned)base;
    } while (v && n < (int)sizeof tmp);
    while (n < width && n < (int)sizeof tmp) tmp[n++] = '0';
    while (n > 0 && b->p < b->end) *b->p++ = tmp[--n];
}

static const char *sig_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    default: return "signal";
    }
}

/* Civil date from days since 1970-01-01 (proleptic Gregorian). */
static void put_time(out_buf *b)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t secs = ts.tv_sec, days = secs / 86400, rem = secs % 86400;
    int64_t z = days + 719468, era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097, yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    int64_t d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9, y = yoe + era * 400 + (m <= 2);
    put_uint(b, (uint64_t)y, 10, 4);
    put_str(b, "-");
    put_uint(b, (uint64_t)m, 10, 2);
    put_str(b, "-");
    put_uint(b, (uint64_t)d, 10, 2);
    put_str(b, "T");
    put_uint(b, (uint64_t)(rem / 3600), 10, 2);
    put_str(b, ":");
    put_uint(b, (uint64_t)(rem / 60 % 60), 10, 2);
    put_str(b, ":");
    put_uint(b, (uint64_t)(rem % 60), 10, 2);
    put_str(b, ".");
    put_uint(b, (uint64_t)(ts.tv_nsec / 1000000), 10, 3);
    put_str(b, "Z");
}

static atomic_int crashing;

static void on_fatal(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    /* A second thread crashing meanwhile waits for the first report to be written. */
    if (atomic_exchange(&crashing, 1)) {
        sleep(2);
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    char line[512];
    out_buf b = {line, line + sizeof line - 1};
    put_time(&b);
    put_str(&b, " error event=crash signal=");
    put_str(&b, sig_name(sig));
    if (si->si_code <= 0) { /* sent by kill(2), tgkill or raise: no fault address */
        put_str(&b, " sent_by_pid=");
        put_uint(&b, (uint64_t)si->si_pid, 10, 1);
    } else {
        put_str(&b, " addr=0x");
        put_uint(&b, (uint64_t)(uintptr_t)si->si_addr, 16, 1);
    }
    put_str(&b, " tid=");
    put_uint(&b, (uint64_t)syscall(SYS_gettid), 10, 1);
    if (crash_model) {
        put_str(&b, " model=");
        put_str(&b, crash_model);
    }
    put_str(&b, " backtrace follows");
    *b.p++ = '\n';
    ssize_t w = write(2, line, (size_t)(b.p - line));
    (void)w;
    void *frames[64];
    int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

void mts_crash_install(void)
{
    static atomic_int installed;
    if (atomic_exchange(&installed, 1)) return;
    void *frames[4];
    (void)backtrace(frames, 4);
    static char altstack[64 << 10];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}
#endif
