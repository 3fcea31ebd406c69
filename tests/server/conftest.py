"""Fixtures for the end-to-end tests of `mtserve serve` over real HTTP.

A test asks the `start_server` factory for a server: it builds a temporary model repository
(one folder per model holding a symlink `model.onnx` and an optional `config.yaml`), optionally
writes a YAML `--config` file, starts `build/mtserve serve ... --http-port 0` as a child
process, waits for the `mtserve: serving N models on http://127.0.0.1:PORT (KServe v2)` line
on stdout and hands back a `Server` (base URL, request helpers, captured stderr log). On
teardown every server still running gets SIGTERM and must exit with status 0 within its grace
period; a test that stops a server itself (SIGTERM tests) does the same check through
`Server.stop()`.

The binary under test is $MTSERVE when set (the Makefile exports it), else build/mtserve.
Reference models come from `make models` (models/out) and tests/models/out (generated here
on demand with tests/models/make_test_models.py).
"""
import json
import os
import re
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

TINY = MODELS / "tiny.onnx"            # x[N,16] -> y[N,16] = relu(x @ W.T + b)
SEG = MODELS / "seg_unet.onnx"         # image[N,3,256,256] -> mask[N,1,256,256], slow (~0.2 s/frame)
SMALL_CNN = TEST_MODELS / "small_cnn.onnx"  # x[N,3,32,32] -> probs[N,10], s2[N,4,32,32]

SERVING_RE = re.compile(r"mtserve: serving (\d+) models? on (http://[0-9.]+:(\d+)) \(KServe v2\)")


def _ensure_models():
    if not MTSERVE.exists():
        pytest.fail(f"{MTSERVE} is missing: run `make build` first")
    for p in (TINY, SEG):
        if not p.exists():
            pytest.fail(f"{p} is missing: run `make models` first")
    if not SMALL_CNN.exists():
        subprocess.run([PY, str(ROOT / "tests/models/make_test_models.py"), str(TEST_MODELS)], check=True,
                       stdout=subprocess.DEVNULL)
        assert SMALL_CNN.exists(), "make_test_models.py did not write small_cnn.onnx"


class Server:
    """One running `mtserve serve` child process."""

    def __init__(self, workdir, args, grace, prefix=()):
        """prefix: a command the server runs under (setpriv, say)."""
        self.workdir = Path(workdir)
        self.grace = grace
        self.stdout_path = self.workdir / "stdout.log"
        self.stderr_path = self.workdir / "stderr.log"
        self._out = open(self.stdout_path, "wb")
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen([*prefix, str(MTSERVE), "serve", *args, "--http-port", "0", "--grpc-port", "0", "--grace", str(grace)],
                                     stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL)
        self.returncode = None
        self.url = None
        self.n_models = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = SERVING_RE.search(self.stdout_path.read_text(errors="replace"))
            if m:
                self.n_models = int(m.group(1))
                self.url = m.group(2)
                self.port = int(m.group(3))
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
            pytest.fail(f"server did not print its serving line (exit {rc}); stderr:\n{self.log()}")
        assert self.port > 0
        self.http = requests.Session()

    # ---- helpers ----
    def get(self, path, **kw):
        kw.setdefault("timeout", 30)
        return self.http.get(self.url + path, **kw)

    def post(self, path, **kw):
        kw.setdefault("timeout", 30)
        return self.http.post(self.url + path, **kw)

    def infer(self, model, body, **kw):
        """POST /v2/models/{model}/infer with a fresh connection (safe from any thread)."""
        kw.setdefault("timeout", 60)
        if isinstance(body, (bytes, bytearray)):
            return requests.post(f"{self.url}/v2/models/{model}/infer", data=body, **kw)
        return requests.post(f"{self.url}/v2/models/{model}/infer", json=body, **kw)

    def index(self):
        r = self.post("/v2/repository/index")
        assert r.status_code == 200, r.text
        return {m["name"]: m["state"] for m in r.json()}

    def stats(self, model=None):
        r = self.get(f"/v2/models/{model}/stats" if model else "/v2/models/stats")
        assert r.status_code == 200, r.text
        return r.json()

    def model_stats(self, model):
        return self.stats(model)["model_stats"][0]

    def metrics(self):
        r = self.get("/metrics")
        assert r.status_code == 200, r.text
        return r.text

    def log(self):
        return self.stderr_path.read_text(errors="replace")

    def count_events(self, model, event):
        pat = re.compile(rf"\bmodel={re.escape(model)} event={re.escape(event)}\b")
        return sum(1 for line in self.log().splitlines() if pat.search(line))

    def wait_for(self, pred, timeout=15, interval=0.02, what="condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = pred()
            if v:
                return v
            time.sleep(interval)
        raise AssertionError(f"timed out waiting for {what}")

    def alive(self):
        return self.proc.poll() is None

    # ---- shutdown ----
    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout=None):
        timeout = self.grace + 10 if timeout is None else timeout
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._close()
            raise AssertionError(f"server did not exit within {timeout} s of SIGTERM; stderr:\n{self.log()[-4000:]}")
        self._close()
        return self.returncode

    def stop(self):
        """SIGTERM, then the exit status must be 0 within the grace period (plus slack)."""
        if self.returncode is None and self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        rc = self.wait_exit()
        assert rc == 0, f"server exited with {rc}; stderr:\n{self.log()[-4000:]}"
        return rc

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
    """Factory: start_server(models={name: path | (path, {per-model config})}, config=None | dict,
    repo_in_config=False, grace=10) -> Server. With config, a YAML file is written and passed with
    --config; with repo_in_config, the repository is named by its model_repository key instead of
    --model-repository; with config and no models, only the config's models: entries are served."""
    _ensure_models()
    servers = []
    counter = [0]

    def start(models=None, config=None, repo_in_config=False, grace=10):
        counter[0] += 1
        work = tmp_path / f"srv{counter[0]}"
        repo = work / "repo"
        repo.mkdir(parents=True)
        for name, spec in (models or {}).items():
            path, mcfg = (spec, None) if not isinstance(spec, tuple) else spec
            d = repo / name
            d.mkdir()
            os.symlink(path, d / "model.onnx")
            if mcfg:
                (d / "config.yaml").write_text(to_yaml(mcfg) + "\n")
        args = []
        if config is not None:
            cfg = dict(config)
            if repo_in_config:
                cfg["model_repository"] = str(repo)
            cfg_path = work / "config.yaml"
            cfg_path.write_text(to_yaml(cfg) + "\n")
            args += ["--config", str(cfg_path)]
        if config is None or (models is not None and not repo_in_config):
            args += ["--model-repository", str(repo)]
        srv = Server(work, args, grace)
        servers.append(srv)
        return srv

    yield start
    errors = []
    for srv in servers:
        if srv.returncode is not None:
            continue
        try:
            srv.stop()
        except AssertionError as e:
            errors.append(str(e))
    if errors:
        pytest.fail("\n".join(errors))


# ---- request builders shared by the tests ----

def json_input(name, arr, datatype="FP32"):
    arr = np.asarray(arr)
    return {"name": name, "shape": list(arr.shape), "datatype": datatype, "data": arr.reshape(-1).tolist()}


def binary_body(inputs, outputs=None, parameters=None):
    """inputs: [(name, np.ndarray float32)]. Returns (body bytes, headers) for the binary extension."""
    header = {"inputs": [], "outputs": outputs or []}
    if not outputs:
        del header["outputs"]
    if parameters:
        header["parameters"] = parameters
    blobs = []
    for name, arr in inputs:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        header["inputs"].append({"name": name, "shape": list(arr.shape), "datatype": "FP32",
                                 "parameters": {"binary_data_size": arr.nbytes}})
        blobs.append(arr.tobytes())
    js = json.dumps(header).encode()
    return js + b"".join(blobs), {"Inference-Header-Content-Length": str(len(js)),
                                  "Content-Type": "application/octet-stream"}


def parse_response(r):
    """Returns {output name: np.ndarray} from a JSON or binary-extension response, plus the header."""
    hcl = r.headers.get("Inference-Header-Content-Length")
    if hcl is None:
        head, rest = r.json(), b""
    else:
        n = int(hcl)
        head, rest = json.loads(r.content[:n]), r.content[n:]
    out, off = {}, 0
    for o in head["outputs"]:
        assert o["datatype"] == "FP32", o
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            out[o["name"]] = np.frombuffer(rest[off:off + size], dtype=np.float32).reshape(o["shape"])
            off += size
        else:
            out[o["name"]] = np.asarray(o["data"], dtype=np.float32).reshape(o["shape"])
    assert off == len(rest), f"binary section has {len(rest)} bytes, outputs claim {off}"
    return out, head
