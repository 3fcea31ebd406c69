"""A local mtserve cluster for tests and benchmarks: N `mtserve serve` processes on loopback
sharing one model repository, behind HAProxy configured by `mtserve cluster-config`, all on
free ports. Used by tests/cluster/test_cluster.py and scripts/bench-cluster.py.

Instances are asked directly (their own HTTP ports) which models they hold (POST
/v2/repository/index, state READY) and how many loads they did (`model=... event=loaded` log
lines); traffic goes through the front door. HAProxy's state of each server comes from its
statistics page as CSV.
"""
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[2]
MTSERVE = Path(os.environ.get("MTSERVE", ROOT / "build" / "mtserve"))
TINY = ROOT / "models" / "out" / "tiny.onnx"  # x[N,16] -> y[N,16]
TINY_BODY = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def make_repo(root, names, model=TINY):
    """A model repository: one folder per name holding a symlink to `model`."""
    repo = Path(root) / "repo"
    for n in names:
        (repo / n).mkdir(parents=True)
        os.symlink(model, repo / n / "model.onnx")
    return repo


def wait_http(url, timeout=20, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


class Instance:
    def __init__(self, idx, repo, work, http, grpc, env):
        self.idx, self.repo, self.work = idx, repo, Path(work)
        self.http_port, self.grpc_port, self.env = http, grpc, env
        self.url = f"http://127.0.0.1:{http}"
        self.proc = None
        self.starts = 0

    @property
    def log_path(self):
        return self.work / f"mts{self.idx}.{self.starts}.log"

    def start(self):
        self.starts += 1
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(MTSERVE), "serve", "--model-repository", str(self.repo),
                                      "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
                                      "--grace", "2"],
                                     stdout=subprocess.DEVNULL, stderr=self._log, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **self.env})
        if not wait_http(self.url + "/v2/health/ready", proc=self.proc):
            raise RuntimeError(f"instance {self.idx} did not become ready:\n{self.log_path.read_text()[-3000:]}")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def stop(self):
        """SIGTERM; returns the exit status of this run (None when it was killed before)."""
        if not self.proc or self._log.closed:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def resident(self):
        """Models READY on this instance (asked directly, not through the front door)."""
        r = requests.post(self.url + "/v2/repository/index", timeout=10)
        r.raise_for_status()
        return {m["name"] for m in r.json() if m.get("state") == "READY"}

    def loads(self):
        """model=... event=loaded lines in the current run's log."""
        return sum(1 for line in self.log_path.read_text(errors="replace").splitlines() if " event=loaded " in line)


class Cluster:
    """Instances plus HAProxy. routing="affinity" is cluster-config's output as printed
    (balance_factor None: its default --balance-factor); "roundrobin" is the same configuration
    with `balance roundrobin` in both backends (the reference that bench-cluster compares with)."""

    def __init__(self, work, names, n=3, max_models=20, routing="affinity", balance_factor=None, env=None,
                 config_args=()):
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.repo = make_repo(self.work, names)
        ports = free_ports(2 * n + 3)
        self.front_http, self.front_grpc, self.stats_port = ports[2 * n:]
        env = {"ML_CONCURRENT_MODELS": str(max_models), **(env or {})}
        self.instances = [Instance(i + 1, self.repo, self.work, ports[2 * i], ports[2 * i + 1], env)
                          for i in range(n)]
        self.url = f"http://127.0.0.1:{self.front_http}"
        self.grpc_target = f"127.0.0.1:{self.front_grpc}"
        self.haproxy = None
        self.routing = routing
        self.balance_factor = balance_factor
        self.config_args = list(config_args)

    def config(self):
        inst = ",".join(f"127.0.0.1:{i.http_port}:{i.grpc_port}" for i in self.instances)
        out = subprocess.run([str(MTSERVE), "cluster-config", "--instances", inst, "--bind", "127.0.0.1",
                              "--front-http", str(self.front_http), "--front-grpc", str(self.front_grpc),
                              "--stats-port", str(self.stats_port)] +
                             ([] if self.balance_factor is None else ["--balance-factor", str(self.balance_factor)]) +
                             self.config_args,
                             check=True, capture_output=True, text=True).stdout
        if self.routing == "roundrobin":
            out = out.replace("balance hash var(txn.model)", "balance roundrobin")
            out = out.replace("balance hdr(mts-model)", "balance roundrobin")
        return out

    def start(self):
        for i in self.instances:
            i.start()
        cfg = self.work / "haproxy.cfg"
        cfg.write_text(self.config())
        chk = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
        if chk.returncode:
            raise RuntimeError(f"haproxy -c failed:\n{chk.stdout}{chk.stderr}")
        self._hlog = open(self.work / "haproxy.log", "wb")
        self.haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=self._hlog, stderr=self._hlog,
                                        stdin=subprocess.DEVNULL)
        if not wait_http(self.url + "/v2/health/ready", proc=self.haproxy):
            raise RuntimeError("HAProxy did not answer:\n" + (self.work / "haproxy.log").read_text()[-3000:])
        self.wait_servers(["UP"] * len(self.instances))
        return self

    def stop(self):
        """Stops HAProxy and the instances; returns {instance index: exit status} of those that
        did not exit 0 on SIGTERM (a sanitizer report at exit, a crash on shutdown)."""
        if self.haproxy and self.haproxy.poll() is None:
            self.haproxy.terminate()
            try:
                self.haproxy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.haproxy.kill()
                self.haproxy.wait()
            self._hlog.close()
        bad = {}
        for i in self.instances:
            rc = i.stop()
            if rc not in (None, 0):
                bad[i.idx] = rc
        return bad

    def server_states(self, backend="mts_http"):
        """HAProxy's status of each server of a backend, in instance order ("UP", "DOWN", ...)."""
        r = requests.get(f"http://127.0.0.1:{self.stats_port}/;csv", timeout=5)
        rows = [line.split(",") for line in r.text.splitlines() if line and not line.startswith("#")]
        st = {row[1]: row[17] for row in rows if row[0] == backend}
        return [st.get(f"mts{i.idx}", "?").split(" ")[0] for i in self.instances]

    def wait_servers(self, want, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.server_states(b) == want for b in ("mts_http", "mts_grpc")):
                return
            time.sleep(0.1)
        raise AssertionError(f"HAProxy servers are {self.server_states()} / {self.server_states('mts_grpc')}, "
                             f"want {want}")

    def owner(self, model):
        """The instance the hash gives `model`: the one whose inference_count grows when one
        request is sent with nothing else in flight (a spilled model is resident on two)."""
        def count(inst):
            r = requests.get(f"{inst.url}/v2/models/{model}/stats", timeout=10)
            if r.status_code != 200:
                return 0
            return sum(int(m.get("inference_count", 0)) for m in r.json().get("model_stats", [])
                       if m.get("name") == model)

        before = [count(i) for i in self.instances]
        r = requests.post(f"{self.url}/v2/models/{model}/infer", json=TINY_BODY, timeout=60)
        assert r.status_code == 200, r.text
        grew = [i for i, b in zip(self.instances, before) if count(i) > b]
        assert len(grew) == 1, [i.idx for i in grew]
        return grew[0]

    def residency(self, alive=None):
        """{model: [instance indices holding it READY]} over the instances that are running."""
        where = {}
        for i in self.instances:
            if alive is not None and i.idx not in alive:
                continue
            for m in i.resident():
                where.setdefault(m, []).append(i.idx)
        return where


def zipf_weights(n, s=1.0):
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def drive(url, names, n_requests=None, seconds=None, threads=8, s=1.0, seed=1, during=None):
    """Zipf(s) traffic over `names` (rank order) through `url` from `threads` client threads,
    each with its own keep-alive session, until n_requests are answered or `seconds` pass.
    `during(elapsed_s)` is called from the main thread every 50 ms (to kill or restart an
    instance under load). Returns dict(ok, failed, errors (first 10), per_model, closed (of the
    failed: connections closed without an answer), latency_ms (every request), latency_model
    (the model of each latency_ms entry), done_s (when each ended, seconds from the start), seconds).

    Each request is sent once: a connection closed without an answer or an error answer is a
    failed request. Killing an instance must not fail any (HAProxy retries the requests that
    were in flight on it, see the configuration's `option http-buffer-request`)."""
    import threading
    rng = np.random.default_rng(seed)
    total = n_requests if n_requests is not None else 10 ** 9
    picks = rng.choice(len(names), size=min(total, 200000), p=zipf_weights(len(names), s))
    lock = threading.Lock()
    state = {"next": 0, "ok": 0, "failed": 0, "errors": [], "per_model": {}, "closed": 0,
             "latency_ms": [], "latency_model": [], "done_s": []}
    t0 = time.monotonic()
    stop = threading.Event()

    def worker():
        sess = requests.Session()
        while not stop.is_set():
            with lock:
                k = state["next"]
                if k >= len(picks) or k >= total:
                    return
                state["next"] += 1
            name = names[picks[k]]
            t_req = time.monotonic()
            try:
                r = sess.post(f"{url}/v2/models/{name}/infer", json=TINY_BODY, timeout=60)
                good, why = r.status_code == 200, f"{r.status_code} {r.text[:200]}"
            except requests.RequestException as e:
                good, why = False, repr(e)[:200]
                if "RemoteDisconnected" in why:
                    with lock:
                        state["closed"] += 1
            with lock:
                state["latency_ms"].append((time.monotonic() - t_req) * 1e3)
                state["latency_model"].append(name)
                state["done_s"].append(time.monotonic() - t0)
                if good:
                    state["ok"] += 1
                    state["per_model"][name] = state["per_model"].get(name, 0) + 1
                else:
                    state["failed"] += 1
                    if len(state["errors"]) < 10:
                        state["errors"].append(f"{name}: {why}")

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in ts:
        t.start()
    while any(t.is_alive() for t in ts):
        el = time.monotonic() - t0
        if seconds is not None and el >= seconds:
            stop.set()
        if during is not None:
            during(el)
        time.sleep(0.05)
    for t in ts:
        t.join()
    state["seconds"] = time.monotonic() - t0
    return state


def grpc_stubs(out):
    """KServe gRPC modules generated with grpc_tools.protoc into `out`; returns (pb2, pb2_grpc)."""
    import importlib
    import shutil
    import sys
    from grpc_tools import protoc
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "proto/inference_kserve.proto", out / "inference_kserve.proto")
    rc = protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}",
                      "inference_kserve.proto"])
    assert rc == 0, "grpc_tools.protoc failed"
    sys.path.insert(0, str(out))
    return importlib.import_module("inference_kserve_pb2"), importlib.import_module("inference_kserve_pb2_grpc")


def tiny_grpc_request(pb2, name):
    req = pb2.ModelInferRequest(model_name=name)
    t = req.inputs.add()
    t.name, t.datatype = "x", "FP32"
    t.shape.extend([1, 16])
    req.raw_input_contents.append(np.full(16, 0.5, np.float32).tobytes())
    return req



def drive_grpc(target, names, pb2, pb2_grpc, seconds, threads=8, s=1.0, seed=1, during=None):
    """Zipf(s) ModelInfer calls with `mts-model` metadata through `target` for `seconds`, one
    channel per thread. Each call is made once (no client retry); a call that fails UNAVAILABLE
    is also counted in `unavailable`. Returns dict(ok, failed, errors, unavailable)."""
    import threading
    import grpc
    lock = threading.Lock()
    state = {"ok": 0, "failed": 0, "errors": [], "unavailable": 0}
    stop = threading.Event()
    p = zipf_weights(len(names), s)

    def worker(k):
        rng = np.random.default_rng(seed * 1000 + k)
        with grpc.insecure_channel(target) as ch:
            stub = pb2_grpc.GRPCInferenceServiceStub(ch)
            while not stop.is_set():
                name = names[rng.choice(len(names), p=p)]
                try:
                    stub.ModelInfer(tiny_grpc_request(pb2, name), metadata=[("mts-model", name)], timeout=30)
                    good, why, unavailable = True, "", 0
                except grpc.RpcError as e:
                    good, why = False, f"{e.code()} {e.details()}"[:200]
                    unavailable = int(e.code() == grpc.StatusCode.UNAVAILABLE)
                with lock:
                    state["ok" if good else "failed"] += 1
                    state["unavailable"] += unavailable
                    if not good and len(state["errors"]) < 10:
                        state["errors"].append(f"{name}: {why}")

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    while time.monotonic() - t0 < seconds:
        if during is not None:
            during(time.monotonic() - t0)
        time.sleep(0.05)
    stop.set()
    for t in ts:
        t.join()
    return state
