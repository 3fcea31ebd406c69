#!/usr/bin/python3
"""Memory budget under model churn (`make bench-memory`): where the process's RSS goes beyond the
bytes the registry accounts for.

Starts `mtserve serve` with a memory budget of --budget-mb (default 100 MB, as
`capacity.max_memory_gb`) on a repository of ten models that together need several times the
budget (eight generated conv + fully-connected models of 13-26 MB of weights, so 3-5 fit, and
two copies of models/out/mobilenetv3.onnx for oneDNN's many small convolution primitives), and
runs Zipf(1.0) traffic from --streams closed-loop HTTP clients (KServe v2 infer, binary tensors)
for --duration seconds. Every 0.5 s it samples the server's RSS (/proc/PID/status VmRSS; anon and
file parts from /proc/PID/smaps_rollup) and the bytes the server accounts for (GET
/v2/models/stats: server.resident_bytes, the devices' used bytes).

The baseline is the idle process after the runtime is warm: a tiny model and a small model of
the generated kind (oneDNN convolutions and matmuls) are loaded, answer one request each and are
unloaded, then RSS is read (binary, libraries, oneDNN/OpenMP runtime and thread
stacks, front ends' buffers, what the allocator keeps). Printed: requests, failed %, RSS max and
p95, accounted max, baseline, and the excess RSS - accounted - baseline (max and p95), loads and
evictions per second. --json FILE keeps the figures. About 90 s.
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
MOBILENET = ROOT / "models" / "out" / "mobilenetv3.onnx"


def gen_model(path, idx, h=None):
    """x[N,3,32,32] -> Conv3x3(3->16) Relu Conv3x3/2(16->32) Relu Flatten Gemm(8192->H) Relu
    Gemm(H->10): weights 32 KB x H (H from 400 to 800 by model: 13-26 MB)."""
    rng = np.random.default_rng(4242 + idx)
    h = h or 400 + (idx * 57) % 401
    inits = [
        numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.2).astype(np.float32), "w1"),
        numpy_helper.from_array(np.zeros(16, np.float32), "b1"),
        numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.08).astype(np.float32), "w2"),
        numpy_helper.from_array(np.zeros(32, np.float32), "b2"),
        numpy_helper.from_array((rng.standard_normal((8192, h)) * 0.01).astype(np.float32), "w3"),
        numpy_helper.from_array(np.zeros(h, np.float32), "b3"),
        numpy_helper.from_array((rng.standard_normal((h, 10)) * 0.05).astype(np.float32), "w4"),
        numpy_helper.from_array(np.zeros(10, np.float32), "b4"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Flatten", ["r2"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["g1"]),
        helper.make_node("Relu", ["g1"], ["r3"]),
        helper.make_node("Gemm", ["r3", "w4", "b4"], ["y"]),
    ]
    g = helper.make_graph(nodes, f"memchurn_{idx}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def make_repo(tmp, n_models, tiny):
    """Folders mem_00 .. mem_09 (popularity order), `tiny` and `warm`; returns [(name, input name, shape)]."""
    repo = tmp / "repo"
    models = []
    gen = 0
    for i in range(n_models):
        name = f"mem_{i:02d}"
        d = repo / name
        d.mkdir(parents=True)
        if i in (2, 7) and MOBILENET.exists():  # ranks 3 and 8: many small oneDNN convolutions
            (d / "model.onnx").symlink_to(MOBILENET)
            models.append((name, "image", [1, 3, 224, 224]))
        else:
            gen_model(d / "model.onnx", gen)
            gen += 1
            models.append((name, "x", [1, 3, 32, 32]))
    d = repo / "tiny"
    d.mkdir()
    (d / "model.onnx").symlink_to(tiny)
    d = repo / "warm"  # the same operators, 0.5 MB: warms oneDNN for the baseline
    d.mkdir()
    gen_model(d / "model.onnx", 99, h=16)
    return repo, models


def infer_body(inp, shape, rng, timeout_ms=0):
    data = rng.standard_normal(shape).astype(np.float32).tobytes()
    params = {"binary_data_output": True}
    if timeout_ms > 0:
        params["timeout"] = timeout_ms * 1000  # microseconds: the request's own deadline
    hdr = json.dumps({"inputs": [{"name": inp, "datatype": "FP32", "shape": shape,
                                  "parameters": {"binary_data_size": len(data)}}],
                      "parameters": params}).encode()
    return hdr + data, len(hdr)


class Sampler(threading.Thread):
    def __init__(self, pid, port, period=0.5):
        super().__init__(daemon=True)
        self.pid, self.port, self.period = pid, port, period
        self.rows = []  # (t, rss, anon, file, accounted)
        self.stop = threading.Event()

    def one(self):
        return sample(self.pid, self.port)

    def run(self):
        t0 = time.monotonic()
        while not self.stop.is_set():
            try:
                r = self.one()
                self.rows.append((time.monotonic() - t0, *r))
            except (OSError, ValueError, KeyError, http.client.HTTPException):
                pass
            self.stop.wait(self.period)


def rss_of(pid):
    """(VmRSS, anonymous, file-backed) bytes of pid."""
    rss = anon = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Anonymous:"):
                    anon = int(line.split()[1]) * 1024
    except OSError:
        anon = rss
    return rss, anon, rss - anon


def stats(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/v2/models/stats")
    r = c.getresponse()
    body = r.read()
    c.close()
    return json.loads(body)


def sample(pid, port):
    rss, anon, fil = rss_of(pid)
    s = stats(port)
    return rss, anon, fil, int(s["server"]["resident_bytes"])


def post(conn, path, body=b"", hlen=None):
    hdrs = {"Content-Type": "application/octet-stream"}
    if hlen is not None:
        hdrs["Inference-Header-Content-Length"] = str(hlen)
    conn.request("POST", path, body=body, headers=hdrs)
    r = conn.getresponse()
    data = r.read()
    return r.status, data


def pct(xs, p):
    if not xs:
        return 0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mtserve", default=os.environ.get("MTSERVE", str(ROOT / "build" / "mtserve")))
    ap.add_argument("--budget-mb", type=float, default=100)
    ap.add_argument("--models", type=int, default=10)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout-ms", type=int, default=30000, help="each request's server-side timeout")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server (repeatable)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()

    tiny = ROOT / "models" / "out" / "tiny.onnx"
    for p in (Path(a.mtserve), tiny, MOBILENET):
        if not p.exists():
            sys.exit(f"bench-memory: {p} is missing (make build models)")
    tmp = Path(tempfile.mkdtemp(prefix="mts-benchmem-"))
    proc = None
    try:
        repo, models = make_repo(tmp, a.models, tiny)
        cfg = tmp / "config.yaml"
        cfg.write_text(
            f"model_repository: {repo}\n"
            f"server:\n  queue_size: 1000\n  worker_count: {a.workers}\n"
            f"capacity:\n  max_memory_gb: {a.budget_mb / 1000.0}\n  eviction_policy: lru\n")
        env = dict(os.environ)
        for kv in a.env:
            k, _, v = kv.partition("=")
            env[k] = v
        out, err = open(tmp / "serve.out", "wb"), open(tmp / "serve.err", "wb")
        proc = subprocess.Popen([a.mtserve, "serve", "--config", str(cfg), "--http-port", "0", "--grpc-port", "0",
                                 "--log-level", "info"], stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        port = None
        for _ in range(600):
            m = re.search(r"on http://[0-9.]+:(\d+)", (tmp / "serve.out").read_text(errors="replace"))
            if m:
                port = int(m.group(1))
                break
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        if not port:
            sys.exit("bench-memory: server did not start:\n" + (tmp / "serve.err").read_text(errors="replace")[-3000:])

        # Baseline: runtime warm (one tiny request), no model resident.
        rng = np.random.default_rng(1)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body, hl = infer_body("x", [1, 16], rng)
        st, _ = post(c, "/v2/models/tiny/infer", body, hl)
        if st != 200:
            sys.exit(f"bench-memory: tiny request answered {st}: {_[:300]!r}")
        body, hl = infer_body("x", [1, 3, 32, 32], rng)
        st, _ = post(c, "/v2/models/warm/infer", body, hl)
        if st != 200:
            sys.exit(f"bench-memory: warm request answered {st}: {_[:300]!r}")
        post(c, "/v2/repository/models/tiny/unload")
        post(c, "/v2/repository/models/warm/unload")
        time.sleep(1.0)
        idle = [sample(proc.pid, port) for _ in range(3) if not time.sleep(0.2)]
        base = min(r[0] for r in idle)
        base_anon = min(r[1] for r in idle)
        base_acc = max(r[3] for r in idle)

        # Zipf traffic.
        weights = np.array([1.0 / (i + 1) ** a.zipf for i in range(len(models))])
        weights /= weights.sum()
        bodies = {n: infer_body(inp, shape, rng, a.timeout_ms) for n, inp, shape in models}
        counts = {"ok": 0, "failed": 0}
        fail_reasons = {}
        lock = threading.Lock()
        stop_at = time.monotonic() + a.duration

        def client(k):
            r = random.Random(100 + k)
            names = [m[0] for m in models]
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=a.timeout_ms / 1000 + 30)
            while time.monotonic() < stop_at:
                name = r.choices(names, weights=weights)[0]
                b, h = bodies[name]
                try:
                    st, data = post(conn, f"/v2/models/{name}/infer", b, h)
                    why = None if st == 200 else f"{st} {data[:160].decode(errors='replace')}"
                except (OSError, http.client.HTTPException) as e:
                    st, why = 0, f"transport {type(e).__name__}"
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=a.timeout_ms / 1000 + 30)
                with lock:
                    if why is None:
                        counts["ok"] += 1
                    else:
                        counts["failed"] += 1
                        fail_reasons[why] = fail_reasons.get(why, 0) + 1
            conn.close()

        s0 = stats(port)
        sampler = Sampler(proc.pid, port)
        sampler.start()
        t0 = time.monotonic()
        th = [threading.Thread(target=client, args=(k,)) for k in range(a.streams)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        elapsed = time.monotonic() - t0
        sampler.stop.set()
        sampler.join()
        s1 = stats(port)
        rows = sampler.rows
        if not rows:
            sys.exit("bench-memory: no samples")

        def tot(s, key):
            return sum(int(m.get(key, 0)) for m in s["model_stats"] if m["name"] not in ("tiny", "warm"))

        loads = tot(s1, "loads") - tot(s0, "loads")
        evictions = tot(s1, "evictions") - tot(s0, "evictions")
        n = counts["ok"] + counts["failed"]
        rss = [r[1] for r in rows]
        acc = [r[4] for r in rows]
        excess = [r[1] - r[4] - base for r in rows]
        excess_anon = [r[2] - r[4] - base_anon for r in rows]
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        cpu = next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), "?")
        budget = int(a.budget_mb * 1e6)
        res = {
            "budget_bytes": budget, "models": len(models), "streams": a.streams, "zipf": a.zipf,
            "duration_s": round(elapsed, 1), "requests": n, "failed": counts["failed"],
            "failed_pct": round(100.0 * counts["failed"] / n, 3) if n else 0.0,
            "baseline_rss": base, "baseline_anon": base_anon, "baseline_accounted": base_acc,
            "rss_max": max(rss), "rss_p95": pct(rss, 95), "accounted_max": max(acc), "accounted_p95": pct(acc, 95),
            "anon_max": max(r[2] for r in rows), "file_max": max(r[3] for r in rows),
            "excess_max": max(excess), "excess_p95": pct(excess, 95), "excess_anon_max": max(excess_anon),
            "rss_minus_budget_max": max(rss) - budget,
            "loads": loads, "evictions": evictions, "loads_per_s": round(loads / elapsed, 2),
            "evictions_per_s": round(evictions / elapsed, 2), "samples": len(rows),
            "fail_reasons": fail_reasons, "cpu": cpu, "env": a.env,
            "series": [[round(r[0], 2), r[1], r[2], r[3], r[4]] for r in rows],  # t, rss, anon, file, accounted
        }
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
        mb = lambda x: f"{x / 1e6:.1f} MB"  # noqa: E731
        print(f"CPU: {cpu}; budget {mb(budget)}, {len(models)} models, Zipf({a.zipf}), {a.streams} streams, "
              f"{elapsed:.0f} s{'; env ' + ' '.join(a.env) if a.env else ''}")
        print(f"requests {n}, failed {counts['failed']} ({res['failed_pct']:.2f} %), "
              f"loads {loads} ({res['loads_per_s']}/s), evictions {evictions} ({res['evictions_per_s']}/s)")
        print(f"baseline RSS {mb(base)} (anon {mb(base_anon)}, accounted when idle {mb(base_acc)})")
        print(f"RSS max {mb(res['rss_max'])}, p95 {mb(res['rss_p95'])} (anon max {mb(res['anon_max'])}, "
              f"file max {mb(res['file_max'])}); accounted max {mb(res['accounted_max'])}, "
              f"p95 {mb(res['accounted_p95'])}")
        print(f"excess RSS - accounted - baseline: max {mb(res['excess_max'])}, p95 {mb(res['excess_p95'])}; "
              f"RSS - budget max {mb(res['rss_minus_budget_max'])} "
              f"(ratio RSS max / (budget + baseline) = {res['rss_max'] / (budget + base):.3f})")
        if fail_reasons and not a.quiet:
            for k, v in sorted(fail_reasons.items(), key=lambda kv: -kv[1])[:5]:
                print(f"  failure x{v}: {k}")
        return 0
    finally:
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.environ.get("BENCH_MEMORY_KEEP"):
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
