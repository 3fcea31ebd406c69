/*
 * Adaptive team size: the bookkeeping of the two-armed bandit described in team.h (which mode a
 * plan's next run uses, and how each run's time updates the estimates).
 */
#include "engine/team.h"

#define TEAM_ALPHA 0.3         /* weight of a new sample in the moving average */
#define TEAM_ALPHA_EXPLORE 0.5 /* ... of an exploring run's sample: a change of load shows sooner */
#define TEAM_BURST 4           /* runs of an exploration (the first is not counted) */
#define TEAM_MIN_INTERVAL 16
#define TEAM_MAX_INTERVAL 512

static int best_mode(const mts_team_arm *a)
{
    if (!a->samples[MTS_TEAM_ONE]) return MTS_TEAM_FULL;
    if (!a->samples[MTS_TEAM_FULL]) return MTS_TEAM_ONE;
    return a->ewma[MTS_TEAM_ONE] < a->ewma[MTS_TEAM_FULL] ? MTS_TEAM_ONE : MTS_TEAM_FULL;
}

int mts_team_interval(const mts_team_arm *a)
{
    int b = best_mode(a);
    double win = a->ewma[b], lose = a->ewma[!b];
    if (!a->samples[!b] || !(win > 0) || !(lose > win)) return TEAM_MIN_INTERVAL;
    /* A burst costs about TEAM_BURST * (lose - win): keep it near 3 % of the time between them. */
    double iv = TEAM_BURST * (lose - win) / win / 0.03;
    if (iv < TEAM_MIN_INTERVAL) iv = TEAM_MIN_INTERVAL;
    if (iv > TEAM_MAX_INTERVAL) iv = TEAM_MAX_INTERVAL;
    return (int)iv;
}

int mts_team_pick(mts_team_arm *a)
{
    if (a->burst > 0) return a->burst_mode;
    int b = best_mode(a);
    if (a->since >= mts_team_interval(a)) {
        a->since = 0;
        a->burst = TEAM_BURST;
        a->burst_mode = !b;
        return a->burst_mode;
    }
    return b;
}

void mts_team_record(mts_team_arm *a, int mode, double ms)
{
    mode = mode == MTS_TEAM_ONE;
    int exploring = a->burst > 0 && mode == a->burst_mode;
    if (exploring) a->burst--;
    int counted = a->prev == mode + 1;
    a->prev = mode + 1;
    if (!counted) return;
    if (a->samples[mode]++ == 0) {
        a->ewma[mode] = ms;
    } else {
        /* One run that the machine stalled (tens of ms here, now and then) moves the estimate at
         * most as far as a run twice as slow would: a real change shows over a few runs. */
        double e = a->ewma[mode];
        if (ms > 2 * e) ms = 2 * e;
        if (ms < 0.5 * e) ms = 0.5 * e;
        a->ewma[mode] = e + (exploring ? TEAM_ALPHA_EXPLORE : TEAM_ALPHA) * (ms - e);
    }
    if (!exploring) a->since++;
}
