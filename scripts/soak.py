#!/usr/bin/env python3
"""Soak (`make soak`, 10 minutes by default): one mtserve under everything at once, recording its
resident memory and open file descriptors every 10 s, to show whether either drifts.

Load, all concurrently for the whole run:
  - HTTP: `mtserve bench --all-models --zipf 1.0 --rate 150` over 24 models (copies of tiny and
    small_cnn, mobilenetv3) with capacity.max_models 6: constant loads and evictions (churn);
  - gRPC: `mtserve bench --grpc --concurrency 4` on tiny and mobilenetv3;
  - admin: every 3 s a random model is unloaded and loaded again over HTTP;
  - a model file replaced: every 20 s `swap` gets a new file (tiny <-> small_cnn, written then
    renamed) and is reloaded; every 60 s it gets a truncated file for 5 s (its loads fail, the
    rest keep serving), then a good one;
  - a flood: every 60 s, 5 s of `mtserve bench --concurrency 64` on mobilenetv3.
Samples VmRSS, descriptors and threads of the server; prints Markdown: the samples after the
first minute (warm-up), the drift from minute 1 to the end, the bench runs' requests and errors,
and whether the server stayed up. Exit status 1 if the server died, RSS grew more than 20 % or
descriptors more than 32 from minute 1 to the end.

Usage: soak.py [--minutes M]   ($MTSERVE: the binary, default build/mtserve)
"""
import argparse
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MTSERVE = os.environ.get("MTSERVE", str(ROOT / "build" / "mtserve"))
MODELS = ROOT / "models" / "out"
TEST_MODELS = ROOT / "tests" / "models" / "out"


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def proc_sample(pid):
    st = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", st).group(1)) / 1024
    threads = int(re.search(r"Threads:\s+(\d+)", st).group(1))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss, fds, threads


def post(url, timeout=60):
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10)
    a = ap.parse_args()
    secs = a.minutes * 60
    small_cnn = TEST_MODELS / "small_cnn.onnx"
    if not small_cnn.exists():
        subprocess.run([sys.executable, str(ROOT / "tests/models/make_test_models.py"), str(TEST_MODELS)], check=True,
                       stdout=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp())
    repo = tmp / "repo"
    names = []
    for i in range(12):
        for base, src in (("t", MODELS / "tiny.onnx"), ("c", small_cnn)):
            n = f"{base}{i:02d}"
            (repo / n).mkdir(parents=True)
            (repo / n / "model.onnx").symlink_to(src)
            names.append(n)
    (repo / "mobilenetv3").mkdir()
    (repo / "mobilenetv3" / "model.onnx").symlink_to(MODELS / "mobilenetv3.onnx")
    (repo / "swap").mkdir()
    shutil.copy(MODELS / "tiny.onnx", repo / "swap" / "model.onnx")
    cfg = tmp / "config.yaml"
    cfg.write_text(f"capacity:\n  max_models: 6\nserver:\n  queue_size: 200\nmodel_repository: {repo}\n")
    out = open(tmp / "serve.out", "w")
    err = open(tmp / "serve.err", "w")
    srv = subprocess.Popen([MTSERVE, "serve", "--config", str(cfg), "--http-port", "0", "--grpc-port", "0",
                            "--log-level", "warn"], stdout=out, stderr=err)
    url = grpc = None
    for _ in range(300):
        text = (tmp / "serve.out").read_text()
        h = re.search(r"on (http://[0-9.]+:\d+)", text)
        g = re.search(r"serving gRPC on ([0-9.]+:\d+)", text)
        if h and g:
            url, grpc = h.group(1), g.group(1)
            break
        time.sleep(0.05)
    if not url:
        srv.kill()
        sys.exit("soak: the server did not start: " + (tmp / "serve.err").read_text()[-1000:])
    stop = threading.Event()
    results = {}
    counts = {"admin": 0, "admin_fail": 0, "swaps": 0, "floods": 0}

    def bench(key, args, duration):
        r = subprocess.run([MTSERVE, "bench", "--url", url, *args, "--duration", str(duration), "--json", "--quiet",
                            "--timeout-ms", "60000"], capture_output=True, text=True)
        try:
            j = json.loads(r.stdout)
        except ValueError:
            j = {"requests": 0, "ok": 0, "errors": -1, "errors_by_code": {"bench": r.stderr[-200:]}}
        agg = results.setdefault(key, {"requests": 0, "ok": 0, "errors": 0, "codes": {}, "msgs": {}})
        for k, v in j.get("error_messages", {}).items():
            agg["msgs"].setdefault(k, v[:120])
        agg["requests"] += j.get("requests", 0)
        agg["ok"] += j.get("ok", 0)
        agg["errors"] += j.get("errors", 0)
        for k, v in j.get("errors_by_code", {}).items():
            agg["codes"][k] = agg["codes"].get(k, 0) + (v if isinstance(v, int) else 1)

    def admin():
        rng = random.Random(1)
        while not stop.wait(3):
            n = rng.choice(names)
            for op in ("unload", "load"):
                counts["admin"] += 1
                if post(f"{url}/v2/repository/models/{n}/{op}") not in (200,):
                    counts["admin_fail"] += 1

    def swapper():
        k = 0
        while not stop.wait(20):
            k += 1
            dst = repo / "swap" / "model.onnx"
            new = repo / "swap" / "model.onnx.new"
            if k % 3 == 0:  # a broken file for a while: its loads fail, nothing else does
                new.write_bytes((MODELS / "tiny.onnx").read_bytes()[:100])
                os.replace(new, dst)
                post(f"{url}/v2/repository/models/swap/load")
                if stop.wait(5):
                    break
            shutil.copy(small_cnn if k % 2 else MODELS / "tiny.onnx", new)
            os.replace(new, dst)
            post(f"{url}/v2/repository/models/swap/load")
            counts["swaps"] += 1

    def flooder():
        while not stop.wait(60):
            counts["floods"] += 1
            bench("flood (64 connections, mobilenetv3)", ["--model", "mobilenetv3", "--concurrency", "64"], 5)

    threads = [
        threading.Thread(target=bench, args=("HTTP churn (zipf over 24 models + swap, 150 req/s)",
                                             ["--all-models", "--zipf", "1.0", "--rate", "150"], secs)),
        threading.Thread(target=bench, args=("gRPC (4 streams, tiny + mobilenetv3)",
                                             ["--grpc", grpc, "--model", "t00,mobilenetv3", "--concurrency", "4"], secs)),
        threading.Thread(target=admin), threading.Thread(target=swapper), threading.Thread(target=flooder),
    ]
    idle_before = proc_sample(srv.pid)
    for t in threads:
        t.start()
    samples = []
    t0 = time.monotonic()
    died = False
    while time.monotonic() - t0 < secs:
        if srv.poll() is not None:
            died = True
            break
        samples.append((time.monotonic() - t0, *proc_sample(srv.pid)))
        print("[%5.0fs] rss %.1f MB  fds %d  threads %d" % samples[-1], file=sys.stderr)
        time.sleep(10)
    stop.set()
    for t in threads:
        t.join()
    idle_after = None
    if srv.poll() is not None:
        died = True
    else:
        time.sleep(2)  # clients gone: what the server holds at rest
        idle_after = proc_sample(srv.pid)
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {a.minutes:g} minutes\n")
    print("| load | requests | ok | errors | errors by code |")
    print("|---|---:|---:|---:|---|")
    for k, v in results.items():
        codes = ", ".join(f"{c}: {n} ({v['msgs'].get(c, '')})" for c, n in v["codes"].items()) or "-"
        print(f"| {k} | {v['requests']} | {v['ok']} | {v['errors']} | {codes} |")
    print(f"| admin unload/load | {counts['admin']} | {counts['admin'] - counts['admin_fail']} | "
          f"{counts['admin_fail']} | (a load racing a running unload answers 503) |")
    print(f"\nmodel file replaced {counts['swaps']} times (every third time through a truncated file); "
          f"{counts['floods']} floods.\n")
    warm = [s for s in samples if s[0] >= 120] or samples
    first, last = warm[0], warm[-1]
    print("Under load (samples every 10 s from minute 2; descriptors include the clients' connections):\n")
    print("| | minute 2 | end | max | drift |")
    print("|---|---:|---:|---:|---:|")
    print(f"| RSS (MB) | {first[1]:.1f} | {last[1]:.1f} | {max(s[1] for s in warm):.1f} | {last[1] - first[1]:+.1f} |")
    print(f"| descriptors | {first[2]} | {last[2]} | {max(s[2] for s in warm)} | {last[2] - first[2]:+d} |")
    print(f"| threads | {first[3]} | {last[3]} | {max(s[3] for s in warm)} | {last[3] - first[3]:+d} |")
    if idle_after:
        print(f"\nAt rest before and after (no client connected): descriptors {idle_before[1]} -> {idle_after[1]}, "
              f"threads {idle_before[2]} -> {idle_after[2]}, RSS {idle_before[0]:.1f} -> {idle_after[0]:.1f} MB "
              "(models stay resident).")
    print(f"\nserver {'DIED' if died else 'stayed up and exited cleanly on SIGTERM'}.")
    bad = died or last[1] > first[1] * 1.25 or not idle_after or idle_after[1] > idle_before[1] + 8
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
