"""Fixtures for the tests of `mtserve bench` (the load generator) against a real server.

`servers(models, max_models=None)` (and `serve`, its HTTP-only form) starts `mtserve serve` on a temporary model repository (one
folder per model name with a symlink to the .onnx file, and a config.yaml when the model is given
as a (path, config text) pair) on a free port, waits for its serving
line and returns the base URL; the server gets SIGTERM at teardown. `bench(url, *args)` runs
`mtserve bench ... --json --quiet` and returns the parsed summary. The binary is $MTSERVE when
set (the Makefile exports it), else build/mtserve; models come from `make models`.
"""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MTSERVE = Path(os.environ.get("MTSERVE", ROOT / "build" / "mtserve"))
TINY = ROOT / "models" / "out" / "tiny.onnx"  # x[N,16] -> y[N,16]
SERVING_RE = re.compile(r"mtserve: serving (\d+) models? on (http://[0-9.]+:\d+) \(KServe v2\)")


GRPC_RE = re.compile(r"mtserve: serving gRPC on ([0-9.]+:\d+) \(")


@pytest.fixture
def servers(tmp_path):
    """Starts servers on demand: `start(models, max_models=None, process=False)` returns (HTTP URL,
    gRPC host:port), and the Popen with process=True, once both front ends print their serving
    lines; every server still running gets SIGTERM at teardown."""
    procs = []

    def start(models, max_models=None, process=False):
        if not MTSERVE.exists():
            pytest.fail(f"{MTSERVE} is missing: run `make build` first")
        if not TINY.exists():
            pytest.fail(f"{TINY} is missing: run `make models` first")
        repo = tmp_path / f"repo{len(procs)}"
        for name, path in models.items():
            (repo / name).mkdir(parents=True)
            if isinstance(path, tuple):  # (model path, config.yaml text)
                path, cfg_text = path
                (repo / name / "config.yaml").write_text(cfg_text)
            (repo / name / "model.onnx").symlink_to(path)
        args = [str(MTSERVE), "serve", "--http-port", "0", "--grpc-port", "0", "--log-level", "warn"]
        if max_models:
            cfg = tmp_path / f"config{len(procs)}.yaml"
            cfg.write_text(f"capacity:\n  max_models: {max_models}\nmodel_repository: {repo}\n")
            args += ["--config", str(cfg)]
        else:
            args += ["--model-repository", str(repo)]
        out = tmp_path / f"serve{len(procs)}.out"
        err = tmp_path / f"serve{len(procs)}.err"
        p = subprocess.Popen(args, stdout=open(out, "wb"), stderr=open(err, "wb"), stdin=subprocess.DEVNULL)
        procs.append(p)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            text = out.read_text(errors="replace")
            h, g = SERVING_RE.search(text), GRPC_RE.search(text)
            if h and g:
                return (h.group(2), g.group(1), p) if process else (h.group(2), g.group(1))
            if p.poll() is not None:
                break
            time.sleep(0.02)
        pytest.fail(f"server did not start: {err.read_text(errors='replace')[-2000:]}")

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def serve(servers):
    """`serve(models, max_models=None)`: like `servers`, returning the HTTP base URL."""
    return lambda models, max_models=None: servers(models, max_models)[0]


def run_bench(url, *args, timeout=120):
    """Runs `mtserve bench --url URL ARGS --json --quiet`; returns (summary dict, stderr)."""
    cmd = [str(MTSERVE), "bench", "--url", url, *map(str, args), "--json", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(r.stdout), r.stderr


@pytest.fixture
def bench():
    return run_bench
