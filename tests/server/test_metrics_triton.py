"""Triton compatibility at the edges of the protocol, against a real server: Triton's metric
names in /metrics beside mtserve's own (counters that move with traffic over HTTP and gRPC, the
end-to-end request-duration histogram, the nv_gpu_memory_* gauges per device), the logging and
trace-setting extensions (/v2/logging, /v2/trace/setting), one extension list for both
protocols, max_batch_size enforced per request (and max_batch_size 0 meaning no batch
dimension), and loaded/unloaded log lines that name the served version and a separate load
counter.
"""
import importlib
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import ROOT, TINY, json_input

LINE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
GRPC_RE = re.compile(r"mtserve: serving gRPC on ([0-9.]+):(\d+)")


def parse_metrics(text):
    """{(name, frozenset(labels)): value} of every sample, plus {name: type} from # TYPE lines."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            types[name] = typ
            continue
        if not line or line.startswith("#"):
            continue
        m = LINE_RE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples, types


def metric(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture(scope="module")
def ks(tmp_path_factory):
    """Generated KServe stubs (grpc_tools from python3-grpc-tools)."""
    out = tmp_path_factory.mktemp("ks_stubs")
    shutil.copy(ROOT / "proto/inference_kserve.proto", out / "inference_kserve.proto")
    from grpc_tools import protoc
    assert protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}",
                        "inference_kserve.proto"]) == 0
    sys.path.insert(0, str(out))
    pb = importlib.import_module("inference_kserve_pb2")
    pbg = importlib.import_module("inference_kserve_pb2_grpc")
    return pb, pbg


def grpc_stub(srv, pbg):
    import grpc
    # the gRPC serving line may follow the HTTP one the fixture waited for
    m = srv.wait_for(lambda: GRPC_RE.search(srv.stdout_path.read_text(errors="replace")), what="gRPC serving line")
    ch = grpc.insecure_channel(f"{m.group(1)}:{m.group(2)}")
    return ch, pbg.GRPCInferenceServiceStub(ch)


def grpc_infer(pb, stub, model, x):
    req = pb.ModelInferRequest(model_name=model)
    t = req.inputs.add()
    t.name, t.datatype = "x", "FP32"
    t.shape.extend(x.shape)
    t.contents.fp32_contents.extend(x.reshape(-1).tolist())
    return stub.ModelInfer(req, timeout=30)


TRITON_COUNTERS = ["nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                   "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                   "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                   "nv_inference_compute_output_duration_us"]


def test_triton_metrics_move_with_traffic(start_server, ks):
    import grpc
    pb, pbg = ks
    srv = start_server({"tiny": (TINY, {"max_batch": 4})})
    samples, types = parse_metrics(srv.metrics())
    for name in TRITON_COUNTERS:
        assert types[name] == "counter", name
        assert metric(samples, name, model="tiny", version="1") == 0, name
    assert types["mts_request_duration_seconds"] == "histogram"
    assert metric(samples, "mts_request_duration_seconds_count", model="tiny") == 0
    assert types["nv_gpu_memory_total_bytes"] == "gauge" and types["nv_gpu_memory_used_bytes"] == "gauge"
    assert metric(samples, "nv_gpu_memory_total_bytes", gpu_uuid="cpu:0") > 0

    rng = np.random.default_rng(1)
    for n in (1, 2, 3):  # HTTP: 3 requests, 6 samples
        r = srv.infer("tiny", {"inputs": [json_input("x", rng.standard_normal((n, 16)).astype(np.float32))]})
        assert r.status_code == 200, r.text
    ch, stub = grpc_stub(srv, pbg)
    with ch:
        for n in (2, 2):  # gRPC: 2 requests, 4 samples
            grpc_infer(pb, stub, "tiny", rng.standard_normal((n, 16)).astype(np.float32))
        # a request the scheduler refuses (wrong shape): a failure, still answered
        with pytest.raises(grpc.RpcError) as ei:
            grpc_infer(pb, stub, "tiny", rng.standard_normal((1, 15)).astype(np.float32))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    samples, _ = parse_metrics(srv.metrics())
    v = {name: metric(samples, name, model="tiny", version="1") for name in TRITON_COUNTERS}
    assert v["nv_inference_request_success"] == 5
    assert v["nv_inference_request_failure"] == 1
    assert v["nv_inference_count"] == 10
    assert 1 <= v["nv_inference_exec_count"] <= 5
    for name in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_infer_duration_us"):
        assert v[name] > 0, name
    # end to end covers queue and compute of every request
    assert v["nv_inference_request_duration_us"] >= v["nv_inference_queue_duration_us"]
    # the histogram: one observation per answered request (HTTP and gRPC, errors included)
    assert metric(samples, "mts_request_duration_seconds_count", model="tiny") == 6
    assert metric(samples, "mts_request_duration_seconds_bucket", model="tiny", le="+Inf") == 6
    assert metric(samples, "mts_request_duration_seconds_sum", model="tiny") > 0
    assert abs(metric(samples, "mts_request_duration_seconds_sum", model="tiny") * 1e6 -
               v["nv_inference_request_duration_us"]) < 1000
    assert metric(samples, "nv_gpu_memory_used_bytes", gpu_uuid="cpu:0") > 0  # tiny is resident
    assert metric(samples, "nv_gpu_memory_used_bytes", gpu_uuid="cpu:0") == \
        metric(samples, "mts_device_memory_bytes", device="cpu:0")



@pytest.mark.parametrize("inline", [True, False])
def test_short_work_runs_on_the_thread_that_read_it(start_server, ks, monkeypatch, inline):
    """A light model's requests, over HTTP and over gRPC, run on the front-end thread that read
    them (mts_inline_batches_total counts them, and they are the lane's batches); with
    MTS_INLINE_SHORT=0 the short-work lane's own thread runs them instead."""
    pb, pbg = ks
    if not inline:
        monkeypatch.setenv("MTS_INLINE_SHORT", "0")
    srv = start_server({"tiny": TINY})
    rng = np.random.default_rng(3)
    x = lambda: rng.standard_normal((1, 16)).astype(np.float32)

    def counts():
        samples, types = parse_metrics(srv.metrics())
        assert types["mts_inline_batches_total"] == "counter"
        return (metric(samples, "mts_inline_batches_total", device="cpu:0"),
                metric(samples, "mts_worker_batches_total", device="cpu:0", worker="short"))

    # the first batches build plans and set the cost estimate that makes tiny short work
    for _ in range(3):
        assert srv.infer("tiny", {"inputs": [json_input("x", x())]}).status_code == 200
    ch, stub = grpc_stub(srv, pbg)
    with ch:
        grpc_infer(pb, stub, "tiny", x())
        inl0, short0 = counts()
        for _ in range(20):
            r = srv.http.post(f"{srv.url}/v2/models/tiny/infer", json={"inputs": [json_input("x", x())]}, timeout=30)
            assert r.status_code == 200, r.text
        inl1, short1 = counts()
        for _ in range(20):
            grpc_infer(pb, stub, "tiny", x())
        inl2, short2 = counts()
    if inline:
        # sequential requests on an idle server: every one is a batch of its own, run inline
        assert inl1 - inl0 >= 18 and inl2 - inl1 >= 18, (inl0, inl1, inl2)
        assert short2 - short0 >= inl2 - inl0  # counted as the lane's too
    else:
        assert inl2 == 0
        assert short1 - short0 >= 18 and short2 - short1 >= 18, (short0, short1, short2)

def test_max_batch_size_enforced(start_server, ks, tmp_path):
    import grpc
    pb, pbg = ks
    srv = start_server({"tiny": (TINY, {"max_batch": 4})})
    x = np.ones((4, 16), np.float32)
    assert srv.infer("tiny", {"inputs": [json_input("x", x)]}).status_code == 200
    r = srv.infer("tiny", {"inputs": [json_input("x", np.ones((5, 16), np.float32))]})
    assert r.status_code == 400, r.text
    assert "batch size 5" in r.json()["error"] and "max_batch_size 4" in r.json()["error"]
    ch, stub = grpc_stub(srv, pbg)
    with ch:
        with pytest.raises(grpc.RpcError) as ei:
            grpc_infer(pb, stub, "tiny", np.ones((6, 16), np.float32))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_batch_size 4" in ei.value.details()
    assert srv.get("/v2/models/tiny/config").json()["max_batch_size"] == 4


def test_max_batch_size_zero_is_no_batch_dimension(start_server, tmp_path):
    repo = tmp_path / "triton_repo"
    (repo / "tiny" / "1").mkdir(parents=True)
    os.symlink(TINY, repo / "tiny" / "1" / "model.onnx")
    (repo / "tiny" / "config.pbtxt").write_text('name: "tiny"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
    srv = start_server(config={"model_repository": str(repo)})
    r = srv.infer("tiny", {"inputs": [json_input("x", np.ones((7, 16), np.float32))]})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["shape"] == [7, 16]
    cfg = srv.get("/v2/models/tiny/config").json()
    assert cfg["max_batch_size"] == 0
    assert cfg["input"][0]["dims"] == [-1, 16]  # the full shape, as Triton shows it without batching


def test_max_batch_zero_in_yaml(start_server):
    srv = start_server({"tiny": (TINY, {"max_batch": 0})})
    r = srv.infer("tiny", {"inputs": [json_input("x", np.ones((300, 16), np.float32))]})
    assert r.status_code == 200, r.text
    assert srv.get("/v2/models/tiny/config").json()["max_batch_size"] == 0


def test_logging_round_trip(start_server):
    srv = start_server({"tiny": TINY})
    r = srv.get("/v2/logging")
    assert r.status_code == 200, r.text
    assert r.json() == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                        "log_verbose_level": 0, "log_format": "default"}
    r = srv.post("/v2/logging", json={"log_format": "ISO8601", "log_verbose_level": 2})
    assert r.status_code == 200, r.text
    assert r.json()["log_format"] == "ISO8601" and r.json()["log_verbose_level"] == 2
    got = srv.get("/v2/logging").json()
    assert got["log_format"] == "ISO8601" and got["log_verbose_level"] == 2 and got["log_info"] is True
    assert srv.post("/v2/repository/models/tiny/load").status_code == 200
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I model=tiny event=loaded ", srv.log(), re.M), srv.log()
    # info off: the next load writes no line; every field is checked before any changes
    assert srv.post("/v2/logging", json={"log_info": False, "log_format": "default"}).json()["log_info"] is False
    assert srv.post("/v2/repository/models/tiny/unload").status_code == 200
    srv.wait_for(lambda: srv.index()["tiny"] == "UNLOADED", what="unload")
    assert srv.count_events("tiny", "unloaded") == 0
    for bad, word in (({"log_info": "yes"}, "log_info"), ({"log_format": "json"}, "log_format"),
                      ({"log_verbose_level": -1}, "log_verbose_level"), ({"log_file": "/tmp/x.log"}, "log_file"),
                      ({"log_colour": True}, "unknown logging setting"), ([1], "JSON object")):
        r = srv.post("/v2/logging", json=bad)
        assert r.status_code == 400 and word in r.json()["error"], (bad, r.text)
    r = srv.post("/v2/logging", json={"log_info": True, "log_format": "bad"})
    assert r.status_code == 400
    assert srv.get("/v2/logging").json()["log_info"] is False  # nothing applied from the bad request
    assert srv.post("/v2/logging", json={"log_info": True, "log_verbose_level": 0}).status_code == 200


def test_trace_setting_reports_off(start_server):
    srv = start_server({"tiny": TINY})
    r = srv.get("/v2/trace/setting")
    assert r.status_code == 200, r.text
    t = r.json()
    assert t["trace_level"] == ["OFF"] and t["trace_rate"] == "1000" and t["trace_count"] == "-1"
    r = srv.post("/v2/trace/setting", json={"trace_rate": "50", "trace_level": ["OFF"]})
    assert r.status_code == 200 and r.json()["trace_rate"] == "50", r.text
    assert srv.get("/v2/models/tiny/trace/setting").json()["trace_rate"] == "50"
    r = srv.post("/v2/trace/setting", json={"trace_level": ["TIMESTAMPS"]})
    assert r.status_code == 400 and "tracing is not supported" in r.json()["error"]
    r = srv.post("/v2/trace/setting", json={"trace_rate": "often"})
    assert r.status_code == 400 and "trace_rate" in r.json()["error"]
    r = srv.post("/v2/trace/setting", json={"trace_sampling": "1"})
    assert r.status_code == 400 and "unknown trace setting" in r.json()["error"]
    assert srv.get("/v2/models/nope/trace/setting").status_code == 404
    r = srv.post("/v2/trace/setting", json={"trace_rate": None})
    assert r.status_code == 200 and r.json()["trace_rate"] == "1000"


def test_extensions_equal_over_http_and_grpc(start_server, ks):
    pb, pbg = ks
    srv = start_server({"tiny": TINY})
    http_ext = srv.get("/v2").json()["extensions"]
    ch, stub = grpc_stub(srv, pbg)
    with ch:
        grpc_ext = list(stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10).extensions)
    assert http_ext == grpc_ext
    assert {"binary_tensor_data", "model_repository", "statistics", "model_configuration", "logging"} <= set(http_ext)
    assert "trace" not in http_ext  # tracing is off: only its settings route exists


def test_load_lines_name_served_version(start_server, tmp_path):
    repo = tmp_path / "triton_repo"
    (repo / "tiny" / "3").mkdir(parents=True)
    os.symlink(TINY, repo / "tiny" / "3" / "model.onnx")
    (repo / "tiny" / "config.pbtxt").write_text('name: "tiny"\nmax_batch_size: 8\n')
    srv = start_server(config={"model_repository": str(repo)})
    for _ in range(2):
        r = srv.post("/v2/repository/models/tiny/load", json={"parameters": {"force_reload": True}})
        assert r.status_code == 200, r.text
    assert srv.post("/v2/repository/models/tiny/unload").status_code == 200
    srv.wait_for(lambda: "event=unloaded" in srv.log(), what="unload line")
    log = srv.log()
    assert re.search(r"model=tiny event=loaded version=3 load=1 ", log), log
    assert re.search(r"model=tiny event=loaded version=3 load=2 .*reload=1", log), log
    assert re.search(r"model=tiny event=unloaded version=3 load=2 ", log), log
    x = np.ones((1, 16), np.float32)
    r = requests.post(f"{srv.url}/v2/models/tiny/infer", json={"inputs": [json_input("x", x)]}, timeout=30)
    assert r.status_code == 200 and r.json()["model_version"] == "3"
    samples, _ = parse_metrics(srv.metrics())
    assert metric(samples, "nv_inference_request_success", model="tiny", version="3") == 1


def test_settings_routes_scopes(start_server, tmp_path):
    infer_tok, admin_tok = "i" * 32, "a" * 32
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{infer_tok} infer\n{admin_tok} admin\n")
    srv = start_server({"tiny": TINY}, config={"server": {"auth_token_file": str(tokens)}})
    auth = lambda t: {"Authorization": f"Bearer {t}"}  # noqa: E731
    for path in ("/v2/logging", "/v2/trace/setting"):
        assert srv.get(path).status_code == 401
        assert srv.get(path, headers=auth(infer_tok)).status_code == 200
        assert srv.post(path, json={}, headers=auth(infer_tok)).status_code == 403
        assert srv.post(path, json={}, headers=auth(admin_tok)).status_code == 200
