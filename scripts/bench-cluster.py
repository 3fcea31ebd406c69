#!/usr/bin/env python3
"""`make bench-cluster`: what routing by model buys behind HAProxy (docs/scale-out.md).

Three instances on loopback, each allowed MAX_MODELS resident models, share a repository of
MODELS copies of the tiny model; Zipf(S) traffic from THREADS client threads goes through the
front door. For each routing, after a warm-up, it measures the distinct models resident in the
cluster (asked from each instance), the cold loads per 1,000 requests (each instance's
`event=loaded` log lines) and the request latency:

  roundrobin   the configuration of `mtserve cluster-config` with `balance roundrobin` in both
               backends (the reference: every instance sees every model)
  affinity-F   cluster-config's output with --balance-factor F (consistent hash on the model,
               no instance above F % of the average concurrent requests; --factors, default
               150, 200, 250 (cluster-config's default) and 0: no load bound, pure consistent
               hashing)

The latency columns include the 99th percentile of the hottest model's requests. Then, per
factor, the instance holding the hottest model is stopped (SIGSTOP) for STALL seconds under
load: the requests answered during the stall against the same span before it (what the load
bound is for). Then kill -9 of one instance under load, TRIALS times on cluster-config's
default configuration: failed requests at the client (no client retries). Ratios are against
roundrobin measured in the same run.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
import cluster as C  # noqa: E402


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), "?")
        cores = os.cpu_count()
        return f"{name}, {cores} cores online"
    except OSError:
        return "?"


def instance_env(a):
    return {"ML_INFERENCE_WORKERS": str(a.workers)} if a.workers else {}


def run_routing(routing, factor, a, names):
    with tempfile.TemporaryDirectory(prefix="mts-bench-cluster-") as work:
        cl = C.Cluster(work, names, n=3, max_models=a.max_models, routing=routing, balance_factor=factor,
                       env=instance_env(a)).start()
        try:
            C.drive(cl.url, names, n_requests=a.warmup, threads=a.threads, s=a.s, seed=1)
            loads0 = sum(i.loads() for i in cl.instances)
            st = C.drive(cl.url, names, n_requests=a.requests, threads=a.threads, s=a.s, seed=2)
            loads = sum(i.loads() for i in cl.instances) - loads0
            where = cl.residency()
            per = [len(i.resident()) for i in cl.instances]
        finally:
            cl.stop()
    lat = np.array(st["latency_ms"])
    hot = lat[np.array(st["latency_model"]) == names[0]]
    return {"hot_p99": float(np.percentile(hot, 99)), "hot_share": len(hot) / max(1, len(lat)),
            "routing": routing if routing == "roundrobin" else f"affinity-{factor}",
            "distinct": len(where), "per": per, "loads_per_1k": 1000.0 * loads / max(1, st["ok"]),
            "failed": st["failed"], "rps": st["ok"] / st["seconds"], "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)), "copies2": sum(1 for v in where.values() if len(v) > 1)}


def run_stall(factor, a, names):
    """The instance that holds the hottest model stops answering for STALL seconds (SIGSTOP, as
    a saturated or stalled machine would) under load: how many requests the cluster still
    answers meanwhile, against the same span before the stall. The load bound lets requests
    leave an instance that holds more than its share of the requests in flight; without it
    every client thread ends up waiting on the stalled instance."""
    import signal
    with tempfile.TemporaryDirectory(prefix="mts-bench-cluster-") as work:
        cl = C.Cluster(work, names, n=3, max_models=a.max_models, balance_factor=factor,
                       env=instance_env(a)).start()
        victim = None
        try:
            C.drive(cl.url, names, n_requests=a.warmup, threads=a.threads, s=a.s, seed=1)
            victim = cl.owner(names[0])
            t_stop, t_cont, ev = 2.0, 2.0 + a.stall, {}

            def during(el):
                if el >= t_stop and "stop" not in ev:
                    victim.proc.send_signal(signal.SIGSTOP)
                    ev["stop"] = True
                if el >= t_cont and "cont" not in ev:
                    victim.proc.send_signal(signal.SIGCONT)
                    ev["cont"] = True

            st = C.drive(cl.url, names, seconds=t_cont + 2, threads=a.threads, s=a.s, seed=5, during=during)
        finally:
            if victim is not None and victim.proc.poll() is None:
                victim.proc.send_signal(signal.SIGCONT)
            cl.stop()
    done = np.array(st["done_s"])
    before = np.sum((done >= t_stop - a.stall) & (done < t_stop))
    during_ = np.sum((done >= t_stop) & (done < t_cont))
    return {"factor": factor, "before": int(before), "during": int(during_), "failed": st["failed"]}


def run_failover(a, names, trial):
    with tempfile.TemporaryDirectory(prefix="mts-bench-cluster-") as work:
        cl = C.Cluster(work, names, n=3, max_models=a.max_models, env=instance_env(a)).start()
        try:
            C.drive(cl.url, names, n_requests=a.warmup, threads=a.threads, s=a.s, seed=1)
            victim = cl.instances[trial % 3]
            done = {}

            def during(el):
                if el >= 2 and not done:
                    victim.kill9()
                    done["t"] = True

            st = C.drive(cl.url, names, seconds=6, threads=a.threads, s=a.s, seed=10 + trial, during=during)
        finally:
            cl.stop()
    return st


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--max-models", type=int, default=20)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--s", type=float, default=1.0, help="Zipf exponent")
    ap.add_argument("--warmup", type=int, default=1500)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--trials", type=int, default=3, help="kill -9 failover trials")
    ap.add_argument("--stall", type=float, default=1.0, help="seconds the hot model's instance is stopped")
    ap.add_argument("--workers", type=int, default=0, help="ML_INFERENCE_WORKERS of each instance (0: its default)")
    ap.add_argument("--factors", default="150,200,250,0", help="hash-balance-factor values to compare")
    a = ap.parse_args()
    if not C.MTSERVE.exists() or not C.TINY.exists():
        sys.exit(f"bench-cluster: {C.MTSERVE} or {C.TINY} is missing (make build models)")
    names = [f"m{i:02d}" for i in range(a.models)]
    print(f"bench-cluster: 3 instances x max_models {a.max_models}, {a.models} models (tiny copies), "
          f"Zipf({a.s}), {a.threads} client threads, {a.warmup} warm-up + {a.requests} measured requests")
    print(f"CPU: {cpu_name()}")
    rows = [run_routing("roundrobin", None, a, names)]
    rows += [run_routing("affinity", int(f), a, names) for f in a.factors.split(",")]
    ref = rows[0]
    print(f"\n{'routing':<13} {'distinct resident':>17} {'x ref':>6} {'per instance':>14} {'on 2+':>6} "
          f"{'cold loads/1k req':>17} {'x ref':>6} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'hot p99':>7} "
          f"{'failed':>6}")
    for r in rows:
        print(f"{r['routing']:<13} {r['distinct']:>17} {r['distinct'] / ref['distinct']:>6.2f} "
              f"{'/'.join(map(str, r['per'])):>14} {r['copies2']:>6} {r['loads_per_1k']:>17.1f} "
              f"{r['loads_per_1k'] / max(ref['loads_per_1k'], 1e-9):>6.2f} {r['rps']:>7.0f} {r['p50']:>7.2f} "
              f"{r['p99']:>7.2f} {r['hot_p99']:>7.2f} {r['failed']:>6}")
    print(f"hot p99: the 99th percentile latency of the most requested model ({names[0]}, "
          f"{100 * rows[0]['hot_share']:.0f} % of the requests)")
    print(f"\nthe hot model's instance stopped for {a.stall:g} s under load (SIGSTOP): requests answered "
          f"during the stall / in the {a.stall:g} s before")
    for f in a.factors.split(","):
        r = run_stall(int(f), a, names)
        print(f"  affinity-{f:<4} {r['during']:>6} / {r['before']:<6} = {r['during'] / max(1, r['before']):.2f}"
              f"   failed {r['failed']}")
    print(f"\nkill -9 of one instance under load (cluster-config default, {a.threads} threads, 6 s, kill at 2 s):")
    for t in range(a.trials):
        st = run_failover(a, names, t)
        print(f"  trial {t + 1}: {st['ok']} requests answered, {st['failed']} failed "
              f"({st['closed']} of them connections closed without an answer; no client retries)")


if __name__ == "__main__":
    main()
