/*
 * Real-time scheduling for the threads that carry only small exchanges (the light HTTP I/O
 * threads, a gRPC connection thread while its messages are small). On a machine whose cores are
 * all busy, a woken thread of the normal policy still waits for the scheduler to pick it over the
 * runnable ones (milliseconds on a loaded VM, and longer when the thread it woke preempts it); a
 * thread of the round-robin real-time policy at its lowest priority (SCHED_RR 1) runs at once and
 * is never preempted by a normal thread. Safe only for work that is short by construction: these
 * threads read small requests, run batches the short-work lane bounds at 2 ms, and write small
 * answers. The policy is not inherited by threads they create (SCHED_RESET_ON_FORK), and the
 * kernel keeps 5 % of each second for normal threads whatever real-time ones do.
 *
 * Needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at least 1; without either the calling thread keeps
 * its normal policy, the first refusal is logged once for the process and no later call tries
 * again.
 */
#ifndef MTS_UTIL_RTPRIO_H
#define MTS_UTIL_RTPRIO_H

#include <stdbool.h>

/* Moves the calling thread to SCHED_RR priority 1 (on) or back to SCHED_OTHER (off). `who` names
 * the threads in the log line of the first success or refusal. True when the thread now runs
 * real-time (always false for off). */
bool mts_thread_realtime(bool on, const char *who);

#endif
