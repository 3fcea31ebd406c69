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
               150 (cluster-config's default), 300, and 0: no load bound, pure consistent hashing)

Then kill -9 of one instance under load, TRIALS times on the affinity configuration: failed
requests at the client. Ratios are against roundrobin measured in the same run.
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


def run_routing(routing, factor, a, names):
    with tempfile.TemporaryDirectory(prefix="mts-bench-cluster-") as work:
        cl = C.Cluster(work, names, n=3, max_models=a.max_models, routing=routing, balance_factor=factor).start()
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
    return {"routing": routing if routing == "roundrobin" else f"affinity-{factor}",
            "distinct": len(where), "per": per, "loads_per_1k": 1000.0 * loads / max(1, st["ok"]),
            "failed": st["failed"], "rps": st["ok"] / st["seconds"], "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)), "copies2": sum(1 for v in where.values() if len(v) > 1)}


def run_failover(a, names, trial):
    with tempfile.TemporaryDirectory(prefix="mts-bench-cluster-") as work:
        cl = C.Cluster(work, names, n=3, max_models=a.max_models).start()
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
    ap.add_argument("--factors", default="150,300,0", help="hash-balance-factor values to compare")
    a = ap.parse_args()
    if not C.MTSERVE.exists() or not C.TINY.exists():
        sys.exit(f"bench-cluster: {C.MTSERVE} or {C.TINY} is missing (make build models)")
    names = [f"m{i:02d}" for i in range(a.models)]
    print(f"bench-cluster: 3 instances x max_models {a.max_models}, {a.models} models (tiny copies), "
          f"Zipf({a.s}), {a.threads} client threads, {a.warmup} warm-up + {a.requests} measured requests")
    print(f"CPU: {cpu_name()}")
    rows = [run_routing("roundrobin", 150, a, names)]
    rows += [run_routing("affinity", int(f), a, names) for f in a.factors.split(",")]
    ref = rows[0]
    print(f"\n{'routing':<13} {'distinct resident':>17} {'x ref':>6} {'per instance':>14} {'on 2+':>6} "
          f"{'cold loads/1k req':>17} {'x ref':>6} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'failed':>6}")
    for r in rows:
        print(f"{r['routing']:<13} {r['distinct']:>17} {r['distinct'] / ref['distinct']:>6.2f} "
              f"{'/'.join(map(str, r['per'])):>14} {r['copies2']:>6} {r['loads_per_1k']:>17.1f} "
              f"{r['loads_per_1k'] / max(ref['loads_per_1k'], 1e-9):>6.2f} {r['rps']:>7.0f} {r['p50']:>7.2f} "
              f"{r['p99']:>7.2f} {r['failed']:>6}")
    print(f"\nkill -9 of one instance under load (affinity, {a.threads} threads, 6 s, kill at 2 s):")
    for t in range(a.trials):
        st = run_failover(a, names, t)
        print(f"  trial {t + 1}: {st['ok']} requests answered, {st['failed']} failed "
              f"({st['closed']} of them connections closed without an answer; no client retries)")


if __name__ == "__main__":
    main()
