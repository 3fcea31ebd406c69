#!/usr/bin/env python3
"""Connection exhaustion (`make bench-connections`): while IDLE idle keep-alive connections
(default 10,000: each sent one request and then nothing) and SLOW slowloris connections (default
4,000: each trickles a request head, one byte per second) are held against a running mtserve,
a new client opens a fresh connection every 0.5 s and sends one request; the figure is how long
that takes (target: under 1 s). With the server's defaults (max_connections 4096, header
deadline 10 s, keep-alive 60 s) the server admits each new client by closing its oldest idle
connection, and the slowloris connections die at the header deadline; the script also counts
what happened to the held connections (closed by the server, 408, still open).

Usage: bench-connections.py [--idle N] [--slow N] [--seconds S] [--server-args "..."]
Starts build/mtserve (or $MTSERVE) on the tiny reference model itself. Raises its own file
descriptor limit to the hard limit; needs about IDLE + SLOW descriptors. Prints Markdown.
"""
import argparse
import os
import re
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MTSERVE = os.environ.get("MTSERVE", str(ROOT / "build" / "mtserve"))
TINY = ROOT / "models" / "out" / "tiny.onnx"
REQ = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def open_many(port, n, send):
    """n connections, each sent `send` (b"" for none); returns the sockets that connected."""
    socks = []
    for i in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError as e:
            print(f"connection {i}: {e}", file=sys.stderr)
            break
        if send:
            try:
                s.sendall(send)
            except OSError:
                s.close()
                continue
        s.setblocking(False)
        socks.append(s)
        if i and i % 2000 == 0:
            print(f"  {i} connections open", file=sys.stderr)
    return socks


def probe(port, timeout=10.0):
    """A new client: connect, one request, the answer. Seconds, or None on failure."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    return time.monotonic() - t0 if data.startswith(b"HTTP/1.1 200") else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--slow", type=int, default=4000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--server-args", default="")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    need = a.idle + a.slow + 100
    if hard < need:
        sys.exit(f"bench-connections: needs {need} file descriptors, the hard limit is {hard}")
    tmp = Path(tempfile.mkdtemp())
    (tmp / "repo" / "tiny").mkdir(parents=True)
    (tmp / "repo" / "tiny" / "model.onnx").symlink_to(TINY)
    out = open(tmp / "serve.out", "w")
    srv = subprocess.Popen([MTSERVE, "serve", "--model-repository", str(tmp / "repo"), "--http-port", "0",
                            "--grpc-port", "0", "--log-level", "warn", *a.server_args.split()],
                           stdout=out, stderr=subprocess.DEVNULL,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard)))
    port = None
    for _ in range(200):
        m = re.search(r"on http://[0-9.]+:(\d+)", (tmp / "serve.out").read_text())
        if m:
            port = int(m.group(1))
            break
        time.sleep(0.05)
    if not port:
        srv.kill()
        sys.exit("bench-connections: the server did not start")
    try:
        base = [probe(port) for _ in range(5)]
        print(f"opening {a.idle} idle keep-alive connections", file=sys.stderr)
        idle = open_many(port, a.idle, REQ)
        print(f"opening {a.slow} slowloris connections", file=sys.stderr)
        slow = open_many(port, a.slow, b"G")
        head = b"ET /v2 HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
        lat, failed = [], 0
        t_end = time.monotonic() + a.seconds
        k = 1
        slow_closed = slow_408 = 0
        alive_slow = list(slow)
        next_trickle = time.monotonic()
        while time.monotonic() < t_end:
            now = time.monotonic()
            if now >= next_trickle:  # one more byte on every slowloris connection
                still = []
                for s in alive_slow:
                    try:
                        s.send(head[k % len(head):k % len(head) + 1])
                        still.append(s)
                    except OSError:
                        slow_closed += 1
                        try:  # the server may have said why before closing
                            if s.recv(4096).startswith(b"HTTP/1.1 408"):
                                slow_408 += 1
                        except OSError:
                            pass
                alive_slow = still
                k += 1
                next_trickle = now + 1.0
            r = probe(port)
            if r is None:
                failed += 1
            else:
                lat.append(r)
            time.sleep(0.5)
        # what happened to the held connections
        idle_closed = 0
        for s in idle:
            try:
                data = s.recv(65536)  # the answer to the one request, then EOF if closed
                while data:
                    data = s.recv(65536)
                idle_closed += 1
            except BlockingIOError:
                pass
            except OSError:
                idle_closed += 1
        for s in alive_slow:
            try:
                data = s.recv(65536)
                if data.startswith(b"HTTP/1.1 408"):
                    slow_408 += 1
                if data == b"" or data.startswith(b"HTTP/1.1 408"):
                    slow_closed += 1
            except BlockingIOError:
                pass
            except OSError:
                slow_closed += 1
        ok = srv.poll() is None
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; server args: `{a.server_args or '(defaults)'}`\n")
    print("| held | new clients served | failed | latency p50 | p99 | max | before the flood (p50) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    q = sorted(lat)
    p = lambda f: q[min(len(q) - 1, int(f * len(q)))] * 1e3 if q else float("nan")
    b = statistics.median([x for x in base if x is not None]) * 1e3
    print(f"| {len(idle)} idle + {len(slow)} slowloris | {len(lat)} | {failed} | {p(0.5):.1f} ms | {p(0.99):.1f} ms "
          f"| {max(q) * 1e3 if q else float('nan'):.1f} ms | {b:.2f} ms |")
    print(f"\nAfter {a.seconds:g} s: {idle_closed} of {len(idle)} idle connections closed by the server (oldest "
          f"first, to admit new clients); {slow_closed} of {len(slow)} slowloris connections closed "
          f"({slow_408} answered 408 first); server {'still serving' if ok else 'DIED'}.")
    sys.exit(0 if ok and failed == 0 and q and max(q) < 1.0 else 1)


if __name__ == "__main__":
    main()
