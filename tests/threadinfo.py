"""A running server's threads as the OS schedules them, for the black-box tests (tests/server and
tests/grpc): the scheduling policy of each thread of a given name, and whether this machine lets a
process use the real-time round-robin policy at all.
"""
import os
import subprocess
import sys


def realtime_allowed():
    """Whether a process started here may run a thread at SCHED_RR 1 (CAP_SYS_NICE, or an
    RLIMIT_RTPRIO of at least 1)."""
    probe = "import os; os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def thread_policies(pid, name):
    """The scheduling policy (os.SCHED_*, without SCHED_RESET_ON_FORK) of each of the process's
    threads named `name`."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if open(f"/proc/{pid}/task/{tid}/comm").read().strip() == name:
                out.append(os.sched_getscheduler(int(tid)) & ~os.SCHED_RESET_ON_FORK)
        except OSError:
            pass  # a thread that ended meanwhile
    return out
