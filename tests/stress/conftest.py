"""Fixtures for the concurrency and stress tests of `mtserve serve` under load from `mtserve bench`.

These tests guard against crashes that only show under concurrent traffic: dynamic batching
building plans for new batch sizes while other workers run older ones, evictions, explicit
unloads and force reloads racing with inference. They run a real server process and the
project's own load generator, and judge the server from outside: the process must still be
alive and healthy, every request must have been answered with success or a legitimate, explained
refusal, and the server's stderr must hold no crash trace (`event=crash`) or sanitizer report.
Run them against the release build (default) and the ASan+UBSan build
(`MTSERVE=build-asan/mtserve`), where a use-after-free becomes a report instead of silent luck.

`start_server(models, config=None)` builds a temporary model repository (one folder per name
with a symlink `model.onnx` and an optional `config.yaml`), optionally a `--config` YAML file that
names that repository (`model_repository:`), starts `$MTSERVE serve ... --http-port 0
--grpc-port 0`, and waits for both serving lines on stdout ('mtserve: serving N models on
http://...', 'mtserve: serving gRPC on HOST:PORT'). `Bench` runs `mtserve bench ... --json
--quiet` (HTTP with --url, gRPC with --grpc) as a child process; `kserve` is a session fixture
with the KServe gRPC stubs generated from proto/ at test time (as tests/grpc/conftest.py does).

The binary is $MTSERVE when set, else build/mtserve; models come from `make models`
(models/out) and tests/models/out (generated on demand).
"""
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
from yamlcfg import to_yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MTSERVE = Path(os.environ.get("MTSERVE", ROOT / "build" / "mtserve"))
MODELS = ROOT / "models" / "out"
TEST_MODELS = ROOT / "tests" / "models" / "out"
PY = "/usr/bin/python3"

TINY = MODELS / "tiny.onnx"                  # x[N,16] -> y[N,16]
MOBILENET = MODELS / "mobilenetv3.onnx"      # image classifier, N x 3 x 224 x 224
LIPSYNC_W4 = MODELS / "lipsync_unet_w4.onnx"  # visual[N,6,320,320], audio[N,32,16,16] -> output[N,3,320,320]
BERT_TINY = MODELS / "bert_tiny.onnx"        # token ids -> embeddings (INT64 inputs)
CBAM = MODELS / "cbam_resunet.onnx"          # segmentation, slow under ASan
SMALL_CNN = TEST_MODELS / "small_cnn.onnx"   # x[N,3,32,32] -> probs[N,10], s2[N,4,32,32]

HTTP_RE = re.compile(r"mtserve: serving (\d+) models? on (http://[0-9.]+:\d+) \(KServe v2\)")
GRPC_RE = re.compile(r"mtserve: serving gRPC on ([0-9.]+:\d+) \(")

# What must never appear on the server's stderr: its own crash handler's line (src/util/crash.c)
# and the reports of AddressSanitizer / LeakSanitizer / UndefinedBehaviorSanitizer / ThreadSanitizer.
BAD_LOG_PATTERNS = (
    "event=crash",
    "ERROR: AddressSanitizer",
    "ERROR: LeakSanitizer",
    "runtime error:",
    "UndefinedBehaviorSanitizer",
    "WARNING: ThreadSanitizer",
)

# Server-side reasons for refusing an inference request that are legitimate under this load
# (src/serve/scheduler.c mts_server_submit, src/serve/registry.c load_one):
#   queue full -> 429 / RESOURCE_EXHAUSTED; model draining after an explicit unload, or its last
#   load failed (max_models reached with every resident model busy) and it is in back-off
#   -> 503 / UNAVAILABLE.
REFUSAL_REASON_RE = re.compile(r"queue is full|is being unloaded|failed to load|shutting down")


def is_asan_build():
    return b"__asan_init" in MTSERVE.read_bytes()


def ensure_models(*paths):
    if not MTSERVE.exists():
        pytest.fail(f"{MTSERVE} is missing: run `make build` first")
    if SMALL_CNN in paths and not SMALL_CNN.exists():
        subprocess.run([PY, str(ROOT / "tests/models/make_test_models.py"), str(TEST_MODELS)], check=True,
                       stdout=subprocess.DEVNULL)
    for p in paths:
        if not Path(p).exists():
            pytest.fail(f"{p} is missing: run `make models` first")


def bad_log_lines(text):
    """The lines of a server log that report a crash or a sanitizer finding (with 30 lines of
    context after the first one, so a failure shows the stack)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if any(p in line for p in BAD_LOG_PATTERNS):
            return "\n".join(lines[i:i + 30])
    return ""


def parse_metrics(text):
    """Prometheus text -> list of (name, {label: value}, float)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)$", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out.append((m.group(1), labels, float(m.group(4))))
    return out


class Server:
    """One running `mtserve serve` child process with both front ends."""

    def __init__(self, workdir, args, grace, start_timeout=60):
        self.workdir = Path(workdir)
        self.grace = grace
        self.stdout_path = self.workdir / "stdout.log"
        self.stderr_path = self.workdir / "stderr.log"
        self._out = open(self.stdout_path, "wb")
        self._err = open(self.stderr_path, "wb")
        self.cmd = [str(MTSERVE), "serve", *args, "--http-port", "0", "--grpc-port", "0", "--grace", str(grace)]
        self.proc = subprocess.Popen(self.cmd, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL)
        self.returncode = None
        self.url = self.grpc_addr = None
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            text = self.stdout_path.read_text(errors="replace")
            h, g = HTTP_RE.search(text), GRPC_RE.search(text)
            if h and g:
                self.n_models = int(h.group(1))
                self.url, self.grpc_addr = h.group(2), g.group(1)
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        if self.url is None:
            rc = self.proc.poll()
            if rc is None:
                self.proc.kill()
                self.proc.wait()
            self._close()
            pytest.fail(f"server did not print its serving lines (exit {rc}); stderr:\n{self.log()[-4000:]}")
        self.http = requests.Session()

    def get(self, path, **kw):
        kw.setdefault("timeout", 60)
        return self.http.get(self.url + path, **kw)

    def post(self, path, **kw):
        kw.setdefault("timeout", 60)
        return self.http.post(self.url + path, **kw)

    def metrics(self):
        r = self.get("/metrics")
        assert r.status_code == 200, r.text
        return parse_metrics(r.text)

    def model_stats(self, model):
        r = self.get(f"/v2/models/{model}/stats")
        assert r.status_code == 200, r.text
        return r.json()["model_stats"][0]

    def log(self):
        return self.stderr_path.read_text(errors="replace")

    def alive(self):
        return self.proc.poll() is None

    def assert_healthy(self, when):
        """The process runs, answers /v2/health/ready with 200 and has logged no crash or
        sanitizer report."""
        rc = self.proc.poll()
        assert rc is None, f"server died {when} (exit status {rc}); stderr:\n{self.log()[-6000:]}"
        bad = bad_log_lines(self.log())
        assert not bad, f"server logged a crash or sanitizer report {when}:\n{bad}"
        try:
            r = self.get("/v2/health/ready", timeout=30)
        except requests.RequestException as e:
            pytest.fail(f"/v2/health/ready {when}: {e}; stderr:\n{self.log()[-4000:]}")
        assert r.status_code == 200, f"/v2/health/ready {when}: {r.status_code} {r.text}"

    def stop(self):
        """SIGTERM; returns the exit status (also kept in self.returncode). Waits the grace period
        plus slack for LeakSanitizer's exit-time scan in the ASan build."""
        if self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.proc.wait(timeout=self.grace + 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._close()
            pytest.fail(f"server did not exit within {self.grace + 60} s of SIGTERM; stderr:\n{self.log()[-4000:]}")
        self._close()
        return self.returncode

    def assert_clean_exit(self):
        """SIGTERM must end the server with status 0 and no crash or sanitizer report (LeakSanitizer
        reports at exit in the ASan build, which also turns them into a non-zero status)."""
        rc = self.stop()
        log = self.log()
        bad = bad_log_lines(log)
        assert not bad, f"server logged a crash or sanitizer report (exit status {rc}):\n{bad}"
        assert rc == 0, f"server exited with {rc} after SIGTERM; stderr:\n{log[-4000:]}"

    def _close(self):
        try:
            self.http.close()
        except Exception:
            pass
        for f in (self._out, self._err):
            if not f.closed:
                f.close()


@pytest.fixture
def start_server(tmp_path):
    """Factory: start_server(models={name: path | (path, {per-model config.yaml keys})},
    config=None | dict, grace=10) -> Server. With config, a YAML file holding it plus
    `model_repository: <the repository>` is passed with --config; else --model-repository."""
    servers = []

    def start(models, config=None, grace=10):
        ensure_models(*{spec[0] if isinstance(spec, tuple) else spec for spec in models.values()})
        work = tmp_path / f"srv{len(servers)}"
        repo = work / "repo"
        repo.mkdir(parents=True)
        for name, spec in models.items():
            path, mcfg = spec if isinstance(spec, tuple) else (spec, None)
            (repo / name).mkdir()
            os.symlink(path, repo / name / "model.onnx")
            if mcfg:
                (repo / name / "config.yaml").write_text(to_yaml(mcfg) + "\n")
        if config is not None:
            cfg = dict(config)
            cfg["model_repository"] = str(repo)
            cfg_path = work / "config.yaml"
            cfg_path.write_text(to_yaml(cfg) + "\n")
            args = ["--config", str(cfg_path)]
        else:
            args = ["--model-repository", str(repo)]
        srv = Server(work, args, grace)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        if srv.returncode is None:
            srv.stop()


class Bench:
    """`mtserve bench` as a child process: Bench(server, "http" | "grpc", models, concurrency,
    duration, *extra). result() waits and returns (exit status, JSON summary or None, stderr)."""

    def __init__(self, server, transport, models, concurrency, duration, *extra, workdir=None):
        target = ["--url", server.url] if transport == "http" else ["--grpc", server.grpc_addr]
        self.transport = transport
        self.duration = duration
        self.cmd = [str(MTSERVE), "bench", *target]
        for m in models:
            self.cmd += ["--model", m]
        self.cmd += ["--concurrency", str(concurrency), "--duration", str(duration), *map(str, extra),
                     "--json", "--quiet"]
        work = Path(workdir or server.workdir)
        n = len(list(work.glob("bench*.out")))
        self.out_path, self.err_path = work / f"bench{n}.out", work / f"bench{n}.err"
        self._out, self._err = open(self.out_path, "wb"), open(self.err_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL)

    def result(self, slack=90):
        try:
            rc = self.proc.wait(timeout=self.duration + slack)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = "killed (did not finish in time)"
        self._out.close()
        self._err.close()
        out = self.out_path.read_text(errors="replace")
        err = self.err_path.read_text(errors="replace")
        try:
            summary = json.loads(out)
        except ValueError:
            summary = None
        return rc, summary, err

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def check_bench(server, rc, summary, err, cmd, accepted_codes=()):
    """Every request the bench sent got an answer: success, or one of accepted_codes (bench's
    errors_by_code keys) whose sample message is a server-side refusal reason. Returns the
    summary. The server's state is checked first, so a crash is reported as a crash rather than
    as the bench's connection errors."""
    server.assert_healthy(f"after `{' '.join(map(str, cmd))}`")
    where = f"`{' '.join(map(str, cmd))}` (exit {rc})"
    assert summary is not None, f"{where} printed no JSON summary; stderr:\n{err[-3000:]}"
    assert rc == 0, f"{where}: {err[-3000:]}\nsummary: {json.dumps(summary)[:3000]}"
    assert not summary.get("interrupted"), f"{where} was interrupted"
    assert not summary.get("server_lost"), f"{where}: the bench lost the server: {err[-2000:]}"
    assert summary.get("metadata_failures", 0) == 0, f"{where}: metadata failures: {err[-2000:]}"
    codes = summary.get("errors_by_code", {})
    msgs = summary.get("error_messages", {})
    assert summary["requests"] == summary["ok"] + sum(codes.values()), summary
    unexpected = {k: (v, msgs.get(k)) for k, v in codes.items() if k not in accepted_codes}
    assert not unexpected, f"{where}: requests answered with unexpected errors {unexpected}"
    for k in codes:
        assert msgs.get(k) and REFUSAL_REASON_RE.search(msgs[k]), \
            f"{where}: {codes[k]} x {k} without a server refusal reason: {msgs.get(k)!r}"
    return summary


# ---- KServe gRPC stubs (generated from proto/ as in tests/grpc/conftest.py) ----

@pytest.fixture(scope="session")
def kserve(tmp_path_factory):
    """Namespace with .pb (messages of inference_kserve.proto), .grpc (its stubs) and
    .channel(addr) -> grpc.Channel with 64 MiB message limits."""
    import grpc
    from grpc_tools import protoc
    out = tmp_path_factory.mktemp("stress_stubs")
    shutil.copy(ROOT / "proto/inference_kserve.proto", out / "inference_kserve.proto")
    rc = protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}",
                      "inference_kserve.proto"])
    assert rc == 0, "grpc_tools.protoc failed"
    sys.path.insert(0, str(out))

    class KServe:
        pb = importlib.import_module("inference_kserve_pb2")
        grpc = importlib.import_module("inference_kserve_pb2_grpc")

        @staticmethod
        def channel(addr):
            opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
            return grpc.insecure_channel(addr, options=opts)
    return KServe


# ---- requests built from a model's metadata ----

NP_TYPES = {"FP32": np.float32, "INT64": np.int64, "INT32": np.int32, "INT8": np.int8, "UINT8": np.uint8,
            "BOOL": np.bool_}


def zero_inputs(server, model, batch=1):
    """[(name, datatype, np.ndarray of zeros)] for the model's inputs (variable dims -> batch at
    the front, 1 elsewhere), from GET /v2/models/NAME (which loads the model if needed)."""
    r = server.get(f"/v2/models/{model}")
    assert r.status_code == 200, f"metadata of {model}: {r.status_code} {r.text}"
    out = []
    for t in r.json()["inputs"]:
        shape = [(batch if i == 0 else 1) if d < 0 else d for i, d in enumerate(t["shape"])]
        out.append((t["name"], t["datatype"], np.zeros(shape, dtype=NP_TYPES[t["datatype"]])))
    return out


def infer_http(server, model, batch=1):
    """One JSON inference with zero inputs; returns the response JSON (asserts 200)."""
    body = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": dt, "data": a.reshape(-1).tolist()}
                       for n, dt, a in zero_inputs(server, model, batch)]}
    r = server.post(f"/v2/models/{model}/infer", json=body)
    assert r.status_code == 200, f"infer {model}: {r.status_code} {r.text[:500]}"
    return r.json()


def infer_grpc(kserve, stub, server, model, batch=1):
    """One ModelInfer with zero inputs as raw_input_contents; returns the ModelInferResponse."""
    req = kserve.pb.ModelInferRequest(model_name=model)
    for n, dt, a in zero_inputs(server, model, batch):
        req.inputs.add(name=n, datatype=dt, shape=list(a.shape))
        req.raw_input_contents.append(np.ascontiguousarray(a).tobytes())
    return stub.ModelInfer(req, timeout=60)
