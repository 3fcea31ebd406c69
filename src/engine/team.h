/*
 * Adaptive team size for one execution context (engine-internal).
 *
 * A context given T > 1 intra-op threads runs each of its plans either with the whole team or
 * on the calling thread alone, whichever has been faster lately on this machine as it is now:
 * on an idle machine small-step networks gain from the second core only while its thread
 * answers quickly; when other processes or other contexts keep the cores busy, every parallel
 * step waits at its barrier for a thread that is not running, and one thread is faster (measured:
 * mobilenetv3 at batch 1 with two busy processes beside it, 380-400 samples/s on one thread
 * against 145-190 with the team). The choice is a two-armed bandit on each plan's run time. The
 * first run after a switch of mode is not counted: it pays for waking a team that slept (up to
 * several ms on this VM after a long stretch on one thread) or for a cold cache, which is not
 * what a run in that mode costs while it stays in it. A plan starts on the whole team; after 16
 * runs one thread is tried in a short burst; from then on the faster mode (exponential moving
 * average) is used and the other is tried again in a burst every `interval` runs, more rarely
 * the slower it was, so that a change of load is noticed without paying much for exploring. Pure bookkeeping: no clock, no threads.
 */
#ifndef MTS_ENGINE_TEAM_H
#define MTS_ENGINE_TEAM_H

enum { MTS_TEAM_FULL = 0, MTS_TEAM_ONE = 1 };

typedef struct {
    const void *key;   /* the plan this state belongs to */
    double ewma[2];    /* ms per run, by mode */
    int samples[2];    /* runs counted, by mode */
    int prev;          /* mode of the last run + 1 (0: none yet) */
    int since;         /* runs in the better mode since the last exploration */
    int burst;         /* runs left in the exploration under way */
    int burst_mode;
} mts_team_arm;

/* The mode the next run should use. */
int mts_team_pick(mts_team_arm *a);
/* Records that a run in `mode` took `ms`. */
void mts_team_record(mts_team_arm *a, int mode, double ms);
/* Runs between explorations of the slower mode, given the current estimates. */
int mts_team_interval(const mts_team_arm *a);

#endif
