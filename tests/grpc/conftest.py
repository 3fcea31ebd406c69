"""Fixtures for the black-box tests of the gRPC front end with a stock client (Debian's
python3-grpcio).

Stubs are generated at test time (grpc_tools.protoc from python3-grpc-tools) from proto/ into a
temporary folder; the health and reflection protos are copied under flat file names first so their
`grpc.*` Python module paths do not shadow the grpc package itself (the wire names, which come
from the proto packages, are unchanged).

The server under test is `build/mtserve serve --grpc-port 0`; it prints
`mtserve: serving gRPC on HOST:PORT (...)` and the fixture waits for that line. $MTSERVE (or
$MTS_GRPC_SERVER, a whole command) overrides the binary.
"""
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # shared helpers (threadinfo)
BUILD = ROOT / "build"
MODELS = ROOT / "models" / "out"
TINY = MODELS / "tiny.onnx"              # x[N,16] -> y[N,16]
LIPSYNC = MODELS / "lipsync_unet_w4.onnx"  # visual[N,6,320,320], audio[N,32,16,16] -> output[N,3,320,320]
SEG = MODELS / "seg_unet.onnx"           # slow (~0.2 s/frame): for queue, deadline and cancel tests
GRPC_RE = re.compile(r"mtserve: serving gRPC on ([0-9.]+):(\d+)")
MAX_MSG = 64 << 20
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MSG), ("grpc.max_send_message_length", MAX_MSG)]


def _server_command():
    if os.environ.get("MTS_GRPC_SERVER"):
        return [os.environ["MTS_GRPC_SERVER"]]
    mtserve = Path(os.environ.get("MTSERVE", BUILD / "mtserve"))
    if not mtserve.exists():
        pytest.fail(f"{mtserve} is missing: run `make build` first")
    return [str(mtserve), "serve"]


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """Generated modules: pb.ks (KServe), pb.ks_grpc, pb.ls (lip-sync), pb.ls_grpc, pb.health,
    pb.health_grpc, pb.refl, pb.refl_grpc."""
    out = tmp_path_factory.mktemp("stubs")
    src = out / "src"
    src.mkdir()
    shutil.copy(ROOT / "proto/inference_kserve.proto", src / "inference_kserve.proto")
    shutil.copy(ROOT / "proto/lipsync.proto", src / "lipsync.proto")
    shutil.copy(ROOT / "proto/grpc/health/v1/health.proto", src / "mts_health.proto")
    shutil.copy(ROOT / "proto/grpc/reflection/v1alpha/reflection.proto", src / "mts_reflection.proto")
    from grpc_tools import protoc
    rc = protoc.main(["protoc", f"-I{src}", f"--python_out={out}", f"--grpc_python_out={out}",
                      "inference_kserve.proto", "lipsync.proto", "mts_health.proto", "mts_reflection.proto"])
    assert rc == 0, "grpc_tools.protoc failed"
    sys.path.insert(0, str(out))

    class PB:
        ks = importlib.import_module("inference_kserve_pb2")
        ks_grpc = importlib.import_module("inference_kserve_pb2_grpc")
        ls = importlib.import_module("lipsync_pb2")
        ls_grpc = importlib.import_module("lipsync_pb2_grpc")
        health = importlib.import_module("mts_health_pb2")
        health_grpc = importlib.import_module("mts_health_pb2_grpc")
        refl = importlib.import_module("mts_reflection_pb2")
        refl_grpc = importlib.import_module("mts_reflection_pb2_grpc")
    return PB


def _yaml(models, server=None):
    lines = ["server:"]
    for k, v in (server or {}).items():
        lines.append(f"  {k}: {v}")
    if len(lines) == 1:
        lines.append("  queue_size: 100")
    lines.append("models:")
    for name, m in models.items():
        lines.append(f"  {name}:")
        for k, v in m.items():
            lines.append(f"    {k}: {v}")
    return "\n".join(lines) + "\n"


class GrpcServer:
    def __init__(self, workdir, models, server_cfg, grace):
        import grpc
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "config.yaml"
        cfg.write_text(_yaml(models, server_cfg))
        self.stdout_path = self.workdir / "stdout.log"
        self.stderr_path = self.workdir / "stderr.log"
        self._out = open(self.stdout_path, "wb")
        self._err = open(self.stderr_path, "wb")
        cmd = _server_command() + ["--config", str(cfg), "--http-port", "0", "--grpc-port", "0",
                                   "--grace", str(grace)]
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL)
        self.grace = grace
        self.addr = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = GRPC_RE.search(self.stdout_path.read_text(errors="replace"))
            if m:
                self.addr = f"{m.group(1)}:{m.group(2)}"
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        if self.addr is None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            pytest.fail(f"gRPC server did not start; stderr:\n{self.log()}")
        self.channel = grpc.insecure_channel(self.addr, options=CHANNEL_OPTIONS)
        self.returncode = None

    def new_channel(self, **extra):
        import grpc
        opts = dict(CHANNEL_OPTIONS)
        opts.update(extra)
        return grpc.insecure_channel(self.addr, options=list(opts.items()))

    def log(self):
        return self.stderr_path.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        if self.returncode is not None:
            return self.returncode
        self.channel.close()
        self.proc.send_signal(sig)
        try:
            self.returncode = self.proc.wait(timeout=self.grace + 20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"server did not exit after SIGTERM; stderr:\n{self.log()}")
        self._out.close()
        self._err.close()
        return self.returncode


@pytest.fixture
def start_server(tmp_path):
    servers = []

    def start(models=None, server=None, grace=5):
        for p in (TINY, LIPSYNC, SEG):
            if not p.exists():
                pytest.fail(f"{p} is missing: run `make models` first")
        if models is None:
            models = {"tiny": {"model_path": str(TINY), "max_batch": 8}}
        s = GrpcServer(tmp_path / f"srv{len(servers)}", models, server, grace)
        servers.append(s)
        return s

    yield start
    for s in servers:
        rc = s.stop()
        assert rc == 0, f"server exited with {rc}; stderr:\n{s.log()}"


def code_of(fn):
    """The gRPC status code and details of calling fn (OK and "" when it succeeds)."""
    import grpc
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def tiny_request(pb, x, model="tiny", rid="", raw=True):
    """A ModelInferRequest for tiny (x: float32 [N,16])."""
    req = pb.ks.ModelInferRequest(model_name=model, id=rid)
    t = req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    if raw:
        req.raw_input_contents.append(np.ascontiguousarray(x, dtype=np.float32).tobytes())
    else:
        t.contents.fp32_contents.extend(x.astype(np.float32).ravel().tolist())
    return req


def tiny_reference(x):
    """tiny's output computed by a plain HTTP-free oracle: relu(x @ W.T + b) read from the model."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(TINY))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    gemm = m.graph.node[0]
    w, b = inits[gemm.input[1]], inits[gemm.input[2]]
    trans_b = any(a.name == "transB" and a.i == 1 for a in gemm.attribute)
    y = x @ (w.T if trans_b else w) + b
    return np.maximum(y, 0).astype(np.float32)
