"""End-to-end tests of the KServe v2 REST API of `mtserve serve`, through a real HTTP client.

Each test starts its own server process (tests/server/conftest.py) on an ephemeral port with a
temporary model repository and checks, over HTTP with `requests`:
  - every endpoint: health, server metadata, model metadata / ready / config / stats, the
    global statistics, the repository index, load and unload, Prometheus metrics;
  - inference with JSON data (checked against numpy evaluating tiny.onnx's initializers), with
    the binary tensor extension in both directions (bodies built by hand), requested outputs;
  - error handling: status codes and the messages naming what is wrong (404, 400, 405, 413);
  - behaviour under load: queue full (429 + Retry-After; a large upload refused from its head
    while the queue is full), per-request timeout (504),
    20 models through max_models 5 (eviction), a storm on one cold model (one load), unload
    and force_reload while serving, SIGTERM with queued work, clients that disconnect.
The slow model (seg_unet) is used only where slowness is the point; the rest use tiny.onnx and
tests/models/out/small_cnn.onnx.
"""
import gzip
import importlib.util
import json
import random
import re
import signal
import socket
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
import requests
from onnx import numpy_helper


def _helpers():
    """The shared helpers of conftest.py, loaded by path (works with any pytest import mode and
    whatever other conftest.py files the session has)."""
    spec = importlib.util.spec_from_file_location("mts_server_conftest", Path(__file__).with_name("conftest.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_h = _helpers()
SEG, SMALL_CNN, TINY = _h.SEG, _h.SMALL_CNN, _h.TINY
binary_body, json_input, parse_response = _h.binary_body, _h.json_input, _h.parse_response


# ---------------------------------------------------------------- helpers

def tiny_reference(x):
    """Evaluates tiny.onnx with numpy from its own graph: Gemm(x, W, b, transB=1) then Relu."""
    m = onnx.load(str(TINY))
    g = m.graph
    ops = [n.op_type for n in g.node]
    assert ops == ["Gemm", "Relu"], f"tiny.onnx changed: {ops}"
    gemm = g.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gemm.attribute}
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    w, b = inits[gemm.input[1]], inits[gemm.input[2]]
    a = np.asarray(x, dtype=np.float64)
    if attrs.get("transA", 0):
        a = a.T
    w = w.T if attrs.get("transB", 0) else w
    y = attrs.get("alpha", 1.0) * (a @ w) + attrs.get("beta", 1.0) * b
    return np.maximum(y, 0).astype(np.float32)


def parse_metrics(text):
    """Prometheus text -> {(name, frozenset(labels)): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$', line)
        assert m, f"malformed metrics line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def metric(parsed, name, **labels):
    return parsed.get((name, frozenset(labels.items())))


def metric_sum(parsed, name):
    return sum(v for (n, _), v in parsed.items() if n == name)


def error_of(r):
    assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    return body["error"]


def run_concurrently(fns):
    """Runs the callables at once (released together by a barrier); returns their results in order."""
    results = [None] * len(fns)
    barrier = threading.Barrier(len(fns))

    def worker(i):
        barrier.wait()
        try:
            results[i] = fns[i]()
        except Exception as e:  # recorded, asserted by the caller
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def in_background(fn):
    """Starts fn in a thread; returns a callable that joins it and returns its result."""
    box = {}

    def run():
        try:
            box["v"] = fn()
        except Exception as e:
            box["v"] = e

    t = threading.Thread(target=run)
    t.start()

    def join(timeout=120):
        t.join(timeout)
        assert not t.is_alive(), "background request did not finish"
        return box["v"]

    return join


def cnn_input(seed, n=1):
    return np.random.default_rng(seed).random((n, 3, 32, 32), dtype=np.float32)


def seg_body(seed=0):
    img = np.random.default_rng(seed).random((1, 3, 256, 256), dtype=np.float32)
    return binary_body([("image", img)], outputs=[{"name": "mask", "parameters": {"binary_data": True}}])


def status_of(r):
    return r if isinstance(r, Exception) else r.status_code


SLOW = {"max_batch": 1, "instances": 1}


def wait_queued(srv, model, n, timeout=30):
    """Waits until at least n requests of model wait in its queue."""
    srv.wait_for(lambda: srv.model_stats(model)["queue_depth"] >= n, timeout=timeout,
                 what=f"{n} queued request(s) on {model}")


# ---------------------------------------------------------------- endpoints

def test_health_and_server_metadata(start_server):
    srv = start_server({"tiny": TINY})
    assert srv.n_models == 1
    for path in ("/v2/health/live", "/v2/health/ready"):
        r = srv.get(path)
        assert r.status_code == 200, (path, r.text)
        assert r.content == b""
    r = srv.get("/v2")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    meta = r.json()
    assert meta["name"] == "mtserve"
    assert isinstance(meta["version"], str) and meta["version"]
    for ext in ("binary_tensor_data", "model_repository", "statistics", "model_configuration"):
        assert ext in meta["extensions"], meta


def test_metadata_ready_config_load_unload(start_server):
    srv = start_server({"tiny": TINY, "cnn": (SMALL_CNN, {"max_batch": 4, "max_queue_delay_us": 1500})})
    assert srv.n_models == 2
    assert srv.index() == {"tiny": "UNLOADED", "cnn": "UNLOADED"}
    idx = srv.post("/v2/repository/index").json()
    assert all(m["version"] == "1" and "reason" in m for m in idx), idx
    assert srv.post("/v2/repository/index", json={"ready": True}).json() == []

    # ready before load: 400 naming the state
    r = srv.get("/v2/models/tiny/ready")
    assert r.status_code == 400
    assert "not ready" in error_of(r) and "UNLOADED" in error_of(r)

    # metadata loads the model and shows -1 for the batch dimension
    r = srv.get("/v2/models/tiny")
    assert r.status_code == 200, r.text
    meta = r.json()
    assert meta["name"] == "tiny" and meta["versions"] == ["1"] and meta["platform"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 16]}]
    assert srv.get("/v2/models/tiny/versions/1").json() == meta
    assert srv.get("/v2/models/tiny/ready").status_code == 200
    assert srv.get("/v2/models/tiny/versions/1/ready").status_code == 200
    assert srv.index()["tiny"] == "READY"

    # explicit load
    assert srv.get("/v2/models/cnn/ready").status_code == 400
    r = srv.post("/v2/repository/models/cnn/load")
    assert r.status_code == 200, r.text
    assert r.content == b""
    assert srv.get("/v2/models/cnn/ready").status_code == 200
    assert srv.index() == {"tiny": "READY", "cnn": "READY"}
    assert {m["name"] for m in srv.post("/v2/repository/index", json={"ready": True}).json()} == {"tiny", "cnn"}
    meta = srv.get("/v2/models/cnn").json()
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert {o["name"]: o["shape"] for o in meta["outputs"]} == {"probs": [-1, 10], "s2": [-1, 4, 32, 32]}

    # model configuration reflects the per-model config.yaml
    r = srv.get("/v2/models/cnn/config")
    assert r.status_code == 200, r.text
    cfg = r.json()
    assert cfg["name"] == "cnn"
    assert cfg["max_batch_size"] == 4
    assert cfg["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [3, 32, 32]}]
    assert {o["name"]: o["dims"] for o in cfg["output"]} == {"probs": [10], "s2": [4, 32, 32]}
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 1500
    tcfg = srv.get("/v2/models/tiny/config").json()
    assert tcfg["max_batch_size"] == 8  # the default max_batch
    assert tcfg["input"][0]["dims"] == [16]

    # unload
    r = srv.post("/v2/repository/models/cnn/unload")
    assert r.status_code == 200, r.text
    assert srv.index() == {"tiny": "READY", "cnn": "UNLOADED"}
    r = srv.get("/v2/models/cnn/ready")
    assert r.status_code == 400 and "UNLOADED" in error_of(r)
    # unloading an unloaded model is fine; unknown models are 404 everywhere
    assert srv.post("/v2/repository/models/cnn/unload").status_code == 200
    for method, path in (("GET", "/v2/models/nope"), ("GET", "/v2/models/nope/ready"),
                         ("GET", "/v2/models/nope/config"), ("GET", "/v2/models/nope/stats"),
                         ("POST", "/v2/repository/models/nope/load"),
                         ("POST", "/v2/repository/models/nope/unload")):
        r = srv.http.request(method, srv.url + path, timeout=30)
        assert r.status_code == 404, (path, r.status_code, r.text)
        assert "nope" in error_of(r), path


def test_stats_and_metrics(start_server):
    srv = start_server({"tiny": TINY, "cnn": SMALL_CNN})
    before_ms = time.time() * 1000
    x = np.arange(32, dtype=np.float32).reshape(2, 16) / 10
    for body in ({"inputs": [json_input("x", x[:1])]}, {"inputs": [json_input("x", x[1:])]},
                 {"inputs": [json_input("x", x)]}):
        r = srv.infer("tiny", body)
        assert r.status_code == 200, r.text

    st = srv.model_stats("tiny")
    assert st["name"] == "tiny" and st["version"] == "1" and st["state"] == "READY"
    assert st["inference_count"] == 4  # batch elements: 1 + 1 + 2
    assert st["execution_count"] == 3
    inf = st["inference_stats"]
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                "cache_hit", "cache_miss"):
        assert set(inf[key]) == {"count", "ns"}, key
    assert inf["success"]["count"] == 3 and inf["success"]["ns"] > 0
    assert inf["fail"]["count"] == 0
    assert inf["compute_infer"]["count"] == 3
    assert {b["batch_size"] for b in st["batch_stats"]} == {1, 2}
    assert st["UsageCount"] == 3
    assert st["TotalInferenceMs"] > 0
    assert st["MemoryBytes"] > 0
    assert st["memory_usage"][0]["byte_size"] == st["MemoryBytes"]
    now_ms = time.time() * 1000
    assert before_ms - 1000 <= st["LoadedAt"] <= now_ms + 1000
    assert st["LoadedAt"] <= st["LastUsed"] <= now_ms + 1000
    assert st["last_inference"] == st["LastUsed"]
    assert st["loads"] == 1 and st["evictions"] == 0 and st["queue_depth"] == 0

    cold = srv.model_stats("cnn")
    assert cold["state"] == "UNLOADED"
    assert cold["inference_count"] == 0 and cold["UsageCount"] == 0 and cold["loads"] == 0
    assert cold["LoadedAt"] == 0

    g = srv.stats()
    assert {m["name"] for m in g["model_stats"]} == {"tiny", "cnn"}
    assert g["server"]["completed"] == 3
    assert g["server"]["resident_models"] == 1
    assert g["server"]["uptime_s"] > 0
    assert len(g["devices"]) >= 1 and sum(d["models"] for d in g["devices"]) == 1

    r = srv.get("/metrics")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    assert "# TYPE mts_requests_total counter" in r.text
    m = parse_metrics(r.text)
    assert metric(m, "mts_requests_total", model="tiny", outcome="success") == 3
    assert metric(m, "mts_requests_total", model="cnn", outcome="success") == 0
    assert metric(m, "mts_model_loads_total", model="tiny", outcome="success") == 1
    assert metric(m, "mts_resident_models") == 1
    assert metric(m, "mts_queue_depth", model="tiny") == 0
    assert metric(m, "mts_compute_duration_seconds_count", model="tiny") == 3
    assert metric(m, "mts_batch_size_count", model="tiny") == 3
    assert metric(m, "mts_uptime_seconds") > 0


# ---------------------------------------------------------------- inference

def test_infer_json_matches_numpy(start_server):
    srv = start_server({"tiny": TINY})
    x = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)
    expected = tiny_reference(x)
    assert (expected > 0).any() and (expected == 0).any()  # the Relu matters for this input
    r = srv.infer("tiny", {"id": "req-42", "inputs": [json_input("x", x)]})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    body = r.json()
    assert body["id"] == "req-42"
    assert body["model_name"] == "tiny" and body["model_version"] == "1"
    (out,) = body["outputs"]
    assert out["name"] == "y" and out["datatype"] == "FP32" and out["shape"] == [3, 16]
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(3, 16), expected, rtol=1e-5, atol=1e-5)

    # nested data is the same tensor; the versioned route works too
    nested = {"name": "x", "shape": [3, 16], "datatype": "FP32", "data": x.tolist()}
    r2 = requests.post(f"{srv.url}/v2/models/tiny/versions/1/infer", json={"inputs": [nested]}, timeout=30)
    assert r2.status_code == 200, r2.text
    assert "id" not in r2.json()
    assert r2.json()["outputs"][0]["data"] == out["data"]


def test_engine_batch_runs_a_large_batch_in_slices(start_server):
    """engine_batch: a batch of more samples runs as engine runs of at most that many, in order;
    the answer is the same as one run's, and execution_count counts the runs."""
    srv = start_server({"tiny": (TINY, {"max_batch": 16, "engine_batch": 3}),
                        "cnn": (SMALL_CNN, {"max_batch": 16, "engine_batch": 4}),
                        "cnn_whole": (SMALL_CNN, {"max_batch": 16})})
    x = np.random.default_rng(11).standard_normal((7, 16)).astype(np.float32)
    r = srv.infer("tiny", {"inputs": [json_input("x", x)]})
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert out["shape"] == [7, 16]
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(7, 16), tiny_reference(x),
                               rtol=1e-5, atol=1e-5)
    st = srv.model_stats("tiny")
    assert st["inference_count"] == 7 and st["execution_count"] == 3  # 3 + 3 + 1
    # a small batch is one run
    r = srv.infer("tiny", {"inputs": [json_input("x", x[:2])]})
    assert r.status_code == 200, r.text
    assert srv.model_stats("tiny")["execution_count"] == 4
    # a 4-D model: slices of 4 + 4 + 1 answer what one run of 9 does (kernels may pick other
    # blockings for other batch sizes, so to float rounding rather than bit for bit)
    meta = srv.get("/v2/models/cnn").json()
    shape = [9] + [d if d > 0 else 8 for d in meta["inputs"][0]["shape"][1:]]
    img = np.random.default_rng(5).random(shape, dtype=np.float32)
    inp = {"name": meta["inputs"][0]["name"], "shape": shape, "datatype": "FP32", "data": img.ravel().tolist()}
    a = srv.infer("cnn", {"inputs": [inp]})
    b = srv.infer("cnn_whole", {"inputs": [inp]})
    assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
    oa, ob = a.json()["outputs"], b.json()["outputs"]
    assert [o["shape"] for o in oa] == [o["shape"] for o in ob] and oa[0]["shape"][0] == 9
    for p, q in zip(oa, ob):
        np.testing.assert_allclose(np.asarray(p["data"], np.float32), np.asarray(q["data"], np.float32),
                                   rtol=1e-5, atol=1e-6)
    assert srv.model_stats("cnn")["execution_count"] == 3
    assert srv.model_stats("cnn_whole")["execution_count"] == 1


def test_infer_binary_in_and_out(start_server):
    srv = start_server({"tiny": TINY, "cnn": SMALL_CNN})
    # tiny: binary input, binary output, against numpy
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    body, headers = binary_body([("x", x)], parameters={"binary_data_output": True})
    r = srv.infer("tiny", body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/octet-stream"
    hcl = int(r.headers["Inference-Header-Content-Length"])
    head = json.loads(r.content[:hcl])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 4 * 16 * 4
    assert len(r.content) == hcl + 4 * 16 * 4
    outs, _ = parse_response(r)
    np.testing.assert_allclose(outs["y"], tiny_reference(x), rtol=1e-5, atol=1e-5)

    # small_cnn: JSON path vs binary path, both outputs
    xc = cnn_input(11, n=2)
    rj = srv.infer("cnn", {"inputs": [json_input("x", xc)]})
    assert rj.status_code == 200, rj.text
    assert "Inference-Header-Content-Length" not in rj.headers
    via_json, _ = parse_response(rj)
    assert via_json["probs"].shape == (2, 10) and via_json["s2"].shape == (2, 4, 32, 32)
    np.testing.assert_allclose(via_json["probs"].sum(axis=1), 1.0, rtol=1e-5)  # softmax

    body, headers = binary_body([("x", xc)], parameters={"binary_data_output": True})
    rb = srv.infer("cnn", body, headers=headers)
    assert rb.status_code == 200, rb.text
    via_bin, head = parse_response(rb)
    assert [o["name"] for o in head["outputs"]] == ["probs", "s2"]
    for name in ("probs", "s2"):
        np.testing.assert_allclose(via_bin[name], via_json[name], rtol=1e-6, atol=1e-7)

    # per-output binary_data overrides: s2 binary, probs as JSON data
    body, headers = binary_body([("x", xc)], outputs=[{"name": "s2", "parameters": {"binary_data": True}},
                                                       {"name": "probs", "parameters": {"binary_data": False}}])
    rm = srv.infer("cnn", body, headers=headers)
    assert rm.status_code == 200, rm.text
    mixed, head = parse_response(rm)
    by_name = {o["name"]: o for o in head["outputs"]}
    assert "data" in by_name["probs"] and "data" not in by_name["s2"]
    assert by_name["s2"]["parameters"]["binary_data_size"] == 2 * 4 * 32 * 32 * 4
    for name in ("probs", "s2"):
        np.testing.assert_allclose(mixed[name], via_json[name], rtol=1e-6, atol=1e-7)


def test_requested_outputs_subset(start_server):
    srv = start_server({"cnn": SMALL_CNN})
    xc = cnn_input(5)
    full, _ = parse_response(srv.infer("cnn", {"inputs": [json_input("x", xc)]}))
    r = srv.infer("cnn", {"inputs": [json_input("x", xc)], "outputs": [{"name": "probs"}]})
    assert r.status_code == 200, r.text
    outs = r.json()["outputs"]
    assert [o["name"] for o in outs] == ["probs"]
    np.testing.assert_allclose(np.asarray(outs[0]["data"], np.float32).reshape(1, 10), full["probs"], rtol=1e-6)
    r = srv.infer("cnn", {"inputs": [json_input("x", xc)], "outputs": [{"name": "s2"}]})
    assert r.status_code == 200, r.text
    assert [o["name"] for o in r.json()["outputs"]] == ["s2"]
    assert r.json()["outputs"][0]["shape"] == [1, 4, 32, 32]
    r = srv.infer("cnn", {"inputs": [json_input("x", xc)], "outputs": [{"name": "nope"}]})
    assert r.status_code == 400, r.text
    assert "nope" in error_of(r)


# ---------------------------------------------------------------- errors

def test_request_errors(start_server):
    srv = start_server({"tiny": TINY})
    ones = [1.0] * 16
    good = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": ones}]}
    assert srv.infer("tiny", good).status_code == 200

    r = srv.infer("nope", good)
    assert r.status_code == 404
    assert error_of(r) == "unknown model 'nope'"

    def post_raw(body, headers=None):
        return srv.post("/v2/models/tiny/infer", data=body, headers=headers or {})

    # malformed JSON: the message names the byte offset of the fault
    r = post_raw(b'{"inputs":[1,]}')
    assert r.status_code == 400
    msg = error_of(r)
    assert "invalid JSON" in msg and re.search(r"\bbyte 13\b", msg), msg
    r = post_raw(b'{"inputs": [')
    assert r.status_code == 400 and re.search(r"\bbyte 12\b", error_of(r)), r.text
    r = post_raw(b'[1, 2]')
    assert r.status_code == 400 and "object" in error_of(r)
    r = post_raw(b'{"outputs": []}')
    assert r.status_code == 400 and "'inputs'" in error_of(r)

    # shape: names the input and the model's expected shape
    bad = {"inputs": [{"name": "x", "shape": [1, 15], "datatype": "FP32", "data": ones[:15]}]}
    r = srv.infer("tiny", bad)
    assert r.status_code == 400
    msg = error_of(r)
    assert "'x'" in msg and "[1,15]" in msg and "[-1,16]" in msg, msg
    bad = {"inputs": [{"name": "x", "shape": [16], "datatype": "FP32", "data": ones}]}
    r = srv.infer("tiny", bad)
    assert r.status_code == 400 and "'x'" in error_of(r) and "[-1,16]" in error_of(r), r.text

    # datatype: a known one the model does not take, and an unknown one
    bad = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "INT64", "data": [1] * 16}]}
    r = srv.infer("tiny", bad)
    assert r.status_code == 400
    assert "'x'" in error_of(r) and "type" in error_of(r), r.text
    bad = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP99", "data": ones}]}
    r = srv.infer("tiny", bad)
    assert r.status_code == 400 and "FP99" in error_of(r), r.text

    # input name not in the model
    bad = {"inputs": [{"name": "z", "shape": [1, 16], "datatype": "FP32", "data": ones}]}
    r = srv.infer("tiny", bad)
    assert r.status_code == 400 and "'x'" in error_of(r), r.text

    # element count
    bad = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0, 2.0]}]}
    r = srv.infer("tiny", bad)
    assert r.status_code == 400
    assert error_of(r) == "input 'x': data has 2 elements, shape [1,16] needs 16"
    bad = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": ["a"] * 16}]}
    r = srv.infer("tiny", bad)
    assert r.status_code == 400 and "'x'" in error_of(r), r.text

    # binary extension: binary_data_size disagreeing with the shape
    x = np.ones((1, 16), np.float32)
    hdr = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 60}}]}
    js = json.dumps(hdr).encode()
    r = post_raw(js + x.tobytes()[:60], {"Inference-Header-Content-Length": str(len(js))})
    assert r.status_code == 400
    msg = error_of(r)
    assert "'x'" in msg and "binary_data_size is 60" in msg and "64" in msg, msg
    # truncated binary section (size right, bytes missing)
    hdr["inputs"][0]["parameters"]["binary_data_size"] = 64
    js = json.dumps(hdr).encode()
    r = post_raw(js + x.tobytes()[:40], {"Inference-Header-Content-Length": str(len(js))})
    assert r.status_code == 400
    assert "'x'" in error_of(r) and "truncated" in error_of(r), r.text
    # trailing bytes nobody claims
    r = post_raw(js + x.tobytes() + b"\0" * 8, {"Inference-Header-Content-Length": str(len(js))})
    assert r.status_code == 400 and "8 bytes" in error_of(r), r.text
    # header length beyond the body, and not a number
    r = post_raw(js + x.tobytes(), {"Inference-Header-Content-Length": str(len(js) + 1000)})
    assert r.status_code == 400 and "Inference-Header-Content-Length" in error_of(r), r.text
    r = post_raw(js + x.tobytes(), {"Inference-Header-Content-Length": "abc"})
    assert r.status_code == 400 and "Inference-Header-Content-Length" in error_of(r), r.text
    # binary_data_size without the header
    r = post_raw(js)
    assert r.status_code == 400 and "Inference-Header-Content-Length" in error_of(r), r.text
    # the correct binary request on the same connection still works
    r = post_raw(js + x.tobytes(), {"Inference-Header-Content-Length": str(len(js))})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(1, 16),
                               tiny_reference(x), rtol=1e-5, atol=1e-5)

    # bad parameters
    for params, word in (({"timeout": -5}, "timeout"), ({"timeout": "soon"}, "timeout"),
                         ({"binary_data_output": "yes"}, "binary_data_output"), ({"priority": 10}, "priority"),
                         ({"priority": -1}, "priority"), ({"priority": "high"}, "priority")):
        r = srv.infer("tiny", dict(good, parameters=params))
        assert r.status_code == 400 and word in error_of(r), (params, r.text)
    # a request may lower its priority below its model's
    r = srv.infer("tiny", dict(good, parameters={"priority": 9}))
    assert r.status_code == 200, r.text

    # wrong method: 405; unknown route: 404
    for method, path in (("GET", "/v2/models/tiny/infer"), ("POST", "/v2/health/live"),
                         ("POST", "/v2/models/tiny"), ("GET", "/v2/repository/index"),
                         ("GET", "/v2/repository/models/tiny/load"), ("DELETE", "/v2"),
                         ("POST", "/metrics")):
        r = srv.http.request(method, srv.url + path, timeout=30)
        assert r.status_code == 405, (method, path, r.status_code, r.text)
        assert f"method {method} is not allowed" in error_of(r)
    for method, path in (("GET", "/v3/models"), ("GET", "/v2/models/tiny/bogus"),
                         ("GET", "/v2/models/tiny/versions/abc/ready"), ("POST", "/v2/repository/models/tiny/x"),
                         ("GET", "/")):
        r = srv.http.request(method, srv.url + path, timeout=30)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        assert "no route" in error_of(r), r.text

    # the failures did not disturb the model
    assert srv.infer("tiny", good).status_code == 200
    assert srv.model_stats("tiny")["UsageCount"] == 4  # incl. the request at priority 9


def test_oversize_body_413(start_server):
    srv = start_server({"tiny": TINY, "cnn": (SMALL_CNN, {"max_batch": 128})},
                       config={"server": {"max_message_size_mb": 1}})
    limit = 1 << 20
    r = requests.post(f"{srv.url}/v2/models/tiny/infer", data=b"{" + b" " * (2 * limit) + b"}", timeout=30)
    assert r.status_code == 413, r.text
    msg = error_of(r)
    assert str(limit) in msg and "max_message_size_mb" in msg, msg
    # just below the limit is accepted: a binary batch of 80 images (983,040 bytes + header;
    # within the model's max_batch, which bounds a request's batch)
    x = np.random.default_rng(1).standard_normal((80, 3, 32, 32)).astype(np.float32)
    body, headers = binary_body([("x", x)], parameters={"binary_data_output": True})
    assert len(body) < limit
    r = srv.infer("cnn", body, headers=headers)
    assert r.status_code == 200, r.text
    outs, _ = parse_response(r)
    assert outs["probs"].shape == (80, 10) and np.isfinite(outs["probs"]).all()
    assert srv.get("/v2/health/live").status_code == 200


def test_compressed_request_bodies(start_server):
    """Content-Encoding gzip and deflate (zlib, or raw deflate as some clients send it) on infer
    requests, JSON and binary (Inference-Header-Content-Length counts the decoded JSON); bodies
    that are not such data, truncated, followed by junk, in an unknown coding, or that decode past
    max_message_size_mb are refused with a message saying so, and the server goes on serving."""
    srv = start_server({"tiny": TINY}, config={"server": {"max_message_size_mb": 1}})
    url = f"{srv.url}/v2/models/tiny/infer"
    x = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)
    body = json.dumps({"inputs": [json_input("x", x)]}).encode()
    raw_deflate = zlib.compressobj(wbits=-15)
    raw_deflate = raw_deflate.compress(body) + raw_deflate.flush()
    for enc, data in (("gzip", gzip.compress(body)), ("x-gzip", gzip.compress(body)),
                      ("deflate", zlib.compress(body)), ("deflate", raw_deflate), ("identity", body)):
        r = requests.post(url, data=data, headers={"Content-Encoding": enc}, timeout=30)
        assert r.status_code == 200, (enc, r.text)
        y = np.array(r.json()["outputs"][0]["data"], dtype=np.float32).reshape(3, 16)
        np.testing.assert_allclose(y, tiny_reference(x), rtol=1e-5, atol=1e-5)
    # binary extension, gzip over the whole body; chunked transfer of it too
    xb = np.random.default_rng(8).standard_normal((5, 16)).astype(np.float32)
    bbody, headers = binary_body([("x", xb)], parameters={"binary_data_output": True})
    gz = gzip.compress(bbody)
    for data in (gz, iter([gz[:7], gz[7:40], gz[40:]])):
        r = requests.post(url, data=data, headers={**headers, "Content-Encoding": "gzip"}, timeout=30)
        assert r.status_code == 200, r.text
        outs, _ = parse_response(r)
        np.testing.assert_allclose(outs["y"], tiny_reference(xb), rtol=1e-5, atol=1e-5)

    def refused(data, enc, status):
        r = requests.post(url, data=data, headers={"Content-Encoding": enc}, timeout=30)
        assert r.status_code == status, (enc, r.status_code, r.text)
        return error_of(r)

    msg = refused(body, "gzip", 400)  # not compressed at all
    assert "not valid gzip data" in msg and "at compressed byte" in msg, msg
    msg = refused(gzip.compress(body)[:-12], "gzip", 400)
    assert "truncated" in msg, msg
    msg = refused(gzip.compress(body) + b"junk", "gzip", 400)
    assert "4 bytes after the end" in msg, msg
    msg = refused(b"\x00\x01garbage", "deflate", 400)
    assert "not valid deflate data" in msg, msg
    msg = refused(body, "br", 415)
    assert '"br"' in msg and "gzip" in msg, msg
    # 40 MB of zeros in 40 KB: refused at the 1 MiB limit without being decoded whole
    msg = refused(gzip.compress(b"\0" * (40 << 20)), "gzip", 413)
    assert str(1 << 20) in msg and "max_message_size_mb" in msg, msg
    r = requests.post(url, data=body, headers={"Content-Encoding": "gzip, gzip"}, timeout=30)
    assert r.status_code == 415, r.text
    # everyone else is still served
    assert srv.infer("tiny", {"inputs": [json_input("x", x)]}).status_code == 200
    assert srv.get("/v2/health/live").status_code == 200


# ---------------------------------------------------------------- load behaviour

def test_queue_full_429(start_server):
    srv = start_server({"seg": (SEG, {"queue_size": 2, **SLOW})})
    assert srv.post("/v2/repository/models/seg/load").status_code == 200
    body, headers = seg_body()
    results = run_concurrently([lambda: srv.infer("seg", body, headers=headers) for _ in range(20)])
    codes = [status_of(r) for r in results]
    assert all(c in (200, 429) for c in codes), [str(c) for c in codes]
    n429, n200 = codes.count(429), codes.count(200)
    assert n429 >= 1 and n200 >= 2, codes
    for r in results:
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) >= 1
            assert "queue is full" in error_of(r) and "limit 2" in error_of(r), r.text
        else:
            outs, _ = parse_response(r)
            assert outs["mask"].shape == (1, 1, 256, 256)
    g = srv.stats()
    assert g["server"]["rejected_queue_full"] == n429
    m = parse_metrics(srv.metrics())
    assert metric(m, "mts_requests_total", model="seg", outcome="rejected") == n429
    assert metric(m, "mts_requests_total", model="seg", outcome="success") == n200


def test_full_queue_refused_from_head(start_server):
    """A large infer upload whose model's queue is full is answered 429 (Retry-After, the same
    message as after submit) from its head alone: the server neither waits for nor reads the
    body (it drops it unread and the connection serves its next request). With room in the queue
    the same head waits for its body. Everyone else is served throughout."""
    srv = start_server({"seg": (SEG, {"queue_size": 1, "max_batch": 16, "instances": 1}), "tiny": TINY})
    assert srv.post("/v2/repository/models/seg/load").status_code == 200
    body, headers = seg_body()
    img16 = np.random.default_rng(3).random((16, 3, 256, 256), dtype=np.float32)
    big, big_headers = binary_body([("image", img16)])
    head = ("POST /v2/models/seg/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {headers['Inference-Header-Content-Length']}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()

    def send_head(wait_s):
        """Sends the head alone; returns (socket, the answer that came back within wait_s or None)."""
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=wait_s)
        s.sendall(head)
        data = b""
        try:
            while True:
                end = data.find(b"\r\n\r\n")
                if end >= 0:
                    m = re.search(rb"(?i)\r\nContent-Length: *(\d+)", data[:end])
                    if len(data) >= end + 4 + (int(m.group(1)) if m else 0):
                        break
                d = s.recv(65536)
                if not d:
                    break
                data += d
        except socket.timeout:
            pass
        return s, data or None

    def finish(s):
        s.settimeout(30)
        s.sendall(body)
        data = b""
        while b"\r\n\r\n" not in data:
            d = s.recv(65536)
            assert d, data
            data += d
        s.close()
        return data.split(b"\r\n", 1)[0]

    s, data = send_head(1.0)
    assert data is None, data  # room in the queue: the body is awaited
    assert finish(s) == b"HTTP/1.1 200 OK"
    refused = None
    for _ in range(8):  # the queue must still be full when the head arrives: retried if it was not
        running = in_background(lambda: srv.infer("seg", big, headers=big_headers))
        time.sleep(0.1)  # 16 images: it runs for a while (instances: 1), the next one waits
        queued = in_background(lambda: srv.infer("seg", big, headers=big_headers))
        wait_queued(srv, "seg", 1)
        t0 = time.monotonic()
        s, data = send_head(10.0)
        if data and data.startswith(b"HTTP/1.1 429"):
            refused = (data, time.monotonic() - t0)
            # the connection goes on once the body is dropped: the next request on it is answered
            s.settimeout(30)
            s.sendall(body + b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n")
            nxt = b""
            while b"\r\n\r\n" not in nxt:
                d = s.recv(65536)
                assert d, nxt
                nxt += d
            assert nxt.startswith(b"HTTP/1.1 200"), nxt
            s.close()
        elif data is None:
            finish(s)
        assert srv.infer("tiny", {"inputs": [json_input("x", np.ones((1, 16)))]}).status_code == 200
        for f in (running, queued):
            assert status_of(f()) in (200, 429)
        if refused:
            break
    assert refused, "the queue was never full when the head arrived"
    data, secs = refused
    text = data.decode(errors="replace")
    assert re.search(r"(?im)^Retry-After: *1\r$", text), text
    assert not re.search(r"(?im)^Connection: *close\r$", text), text
    assert "queue is full" in text and "limit 1" in text, text
    assert secs < 5, secs
    m = parse_metrics(srv.metrics())
    assert metric(m, "mts_requests_total", model="seg", outcome="rejected") >= 1


def test_timeout_504(start_server):
    srv = start_server({"seg": (SEG, SLOW), "tiny": TINY})
    assert srv.post("/v2/repository/models/seg/load").status_code == 200
    body, headers = seg_body()
    first = in_background(lambda: srv.infer("seg", body, headers=headers))
    second = in_background(lambda: srv.infer("seg", body, headers=headers))
    wait_queued(srv, "seg", 1)  # one runs (instances: 1), one waits
    hdr = json.loads(body[:int(headers["Inference-Header-Content-Length"])])
    hdr["parameters"] = {"timeout": 1000}
    js = json.dumps(hdr).encode()
    t0 = time.monotonic()
    r = srv.infer("seg", js + body[int(headers["Inference-Header-Content-Length"]):],
                  headers={"Inference-Header-Content-Length": str(len(js))})
    assert r.status_code == 504, r.text
    assert "tim" in error_of(r).lower(), r.text
    assert time.monotonic() - t0 < 30
    assert status_of(first()) == 200 and status_of(second()) == 200
    # a generous timeout does not fire
    r = srv.infer("tiny", {"parameters": {"timeout": 60_000_000}, "inputs": [json_input("x", np.ones((1, 16)))]})
    assert r.status_code == 200, r.text
    assert srv.stats()["server"]["timed_out"] == 1
    m = parse_metrics(srv.metrics())
    assert metric(m, "mts_requests_total", model="seg", outcome="timeout") == 1
    assert metric(m, "mts_requests_total", model="seg", outcome="success") == 2


def test_20_models_through_max_models_5(start_server):
    names = [f"cnn{i:02d}" for i in range(20)]
    models = {n: SMALL_CNN for n in names}
    models["cnn19"] = (SMALL_CNN, {"pin": True, "preload": True})  # the coldest one, pinned
    srv = start_server(models, config={"capacity": {"max_models": 5, "eviction_policy": "lru"}},
                       repo_in_config=True)
    assert srv.n_models == 20
    srv.wait_for(lambda: srv.index()["cnn19"] == "READY", what="preloaded cnn19")
    assert sum(1 for s in srv.index().values() if s != "UNLOADED") == 1
    xc = cnn_input(99)
    body = {"inputs": [json_input("x", xc)], "outputs": [{"name": "probs"}]}
    ref = None
    rng = random.Random(20240601)
    weights = [1.0 / (i + 1) ** 1.1 for i in range(20)]  # skewed: a few hot models, a long tail
    sent, used = 0, set()
    max_ready = max_resident = 0

    def check(r):
        nonlocal ref
        assert not isinstance(r, Exception), r
        assert r.status_code == 200, r.text
        probs = np.asarray(r.json()["outputs"][0]["data"], np.float32)
        if ref is None:
            ref = probs
        np.testing.assert_allclose(probs, ref, rtol=1e-6, atol=1e-7)  # same file under every name

    while sent < 150:
        group = rng.choice([1, 1, 1, 2, 3])
        models = rng.choices(names, weights, k=group)
        used.update(models)
        if group == 1:
            check(srv.infer(models[0], body))
        else:
            for r in run_concurrently([lambda m=m: srv.infer(m, body) for m in models]):
                check(r)
        sent += group
        states = srv.index()
        ready = sum(1 for s in states.values() if s == "READY")
        resident = sum(1 for s in states.values() if s in ("READY", "LOADING", "DRAINING"))
        assert ready <= 5 and resident <= 5, states
        assert srv.stats()["server"]["resident_models"] <= 5
        max_ready, max_resident = max(max_ready, ready), max(max_resident, resident)

    assert len(used) > 5
    assert max_ready == 5
    assert srv.index()["cnn19"] == "READY"  # pinned: never evicted
    stats = srv.stats()["model_stats"]
    assert next(s for s in stats if s["name"] == "cnn19")["evictions"] == 0
    evictions = sum(s["evictions"] for s in stats)
    loads = sum(s["loads"] for s in stats)
    assert evictions > 0
    assert loads - evictions == sum(1 for s in stats if s["state"] == "READY")
    assert sum(s["UsageCount"] for s in stats) == sent
    assert all(s["inference_stats"]["fail"]["count"] == 0 for s in stats)
    m = parse_metrics(srv.metrics())
    assert metric_sum(m, "mts_model_evictions_total") == evictions
    assert metric(m, "mts_resident_models") <= 5
    assert sum(v for (n, lab), v in m.items()
               if n == "mts_requests_total" and ("outcome", "success") in lab) == sent
    assert len(re.findall(r"event=evicted reason=max_models", srv.log())) == evictions


def test_storm_on_cold_model_loads_once(start_server):
    # models given by the `models:` section of a --config file
    srv = start_server(config={"server": {"queue_size": 64},
                               "models": {"cnn": {"model_path": str(SMALL_CNN), "max_batch": 8},
                                          "tiny": {"model_path": str(TINY), "preload": False}}})
    assert srv.n_models == 2
    assert srv.index()["cnn"] == "UNLOADED"
    xc = cnn_input(1)
    body = {"inputs": [json_input("x", xc)], "outputs": [{"name": "probs"}]}
    results = run_concurrently([lambda: srv.infer("cnn", body) for _ in range(32)])
    assert [status_of(r) for r in results] == [200] * 32, [getattr(r, "text", r) for r in results]
    first = results[0].json()["outputs"][0]["data"]
    assert all(r.json()["outputs"][0]["data"] == first for r in results)
    st = srv.model_stats("cnn")
    assert st["loads"] == 1
    assert st["UsageCount"] == 32 and st["inference_count"] == 32
    assert srv.count_events("cnn", "loaded") == 1
    assert srv.index() == {"cnn": "READY", "tiny": "UNLOADED"}


def test_unload_while_requests_in_flight(start_server):
    srv = start_server({"seg": (SEG, SLOW)})
    assert srv.post("/v2/repository/models/seg/load").status_code == 200
    body, headers = seg_body(3)
    pending = [in_background(lambda: srv.infer("seg", body, headers=headers)) for _ in range(3)]

    def all_three_in():
        # one running and two queued: all three reached the server (two queued alone may be the
        # first two while no worker has taken one yet and the third is still on its way)
        m = {x["name"]: x for x in srv.get("/api/v1/dashboard/state").json()["models"]}["seg"]
        return m["running"] >= 1 and m["queue_depth"] >= 2
    srv.wait_for(all_three_in, timeout=30, what="seg: one request running and two queued")
    unload = in_background(lambda: requests.post(f"{srv.url}/v2/repository/models/seg/unload", timeout=60))
    # while it drains (two queued seg frames: long enough to see), new requests are refused with 503
    srv.wait_for(lambda: srv.index()["seg"] == "DRAINING", timeout=10, interval=0.005, what="DRAINING")
    r = srv.infer("seg", body, headers=headers)
    assert r.status_code == 503 and "being unloaded" in error_of(r), r.text
    r = unload()
    assert status_of(r) == 200, getattr(r, "text", r)
    results = [p() for p in pending]
    assert [status_of(r) for r in results] == [200] * 3, [getattr(r, "text", r) for r in results]
    for r in results:
        assert parse_response(r)[0]["mask"].shape == (1, 1, 256, 256)
    assert srv.index()["seg"] == "UNLOADED"
    st = srv.model_stats("seg")
    assert st["UsageCount"] == 3 and st["state"] == "UNLOADED"
    assert srv.count_events("seg", "unloaded") == 1
    # it loads again on demand
    r = srv.infer("seg", body, headers=headers)
    assert r.status_code == 200, r.text
    assert srv.model_stats("seg")["loads"] == 2


def test_force_reload_while_serving(start_server):
    srv = start_server({"tiny": TINY})
    assert srv.post("/v2/repository/models/tiny/load").status_code == 200
    x = np.random.default_rng(2).standard_normal((2, 16)).astype(np.float32)
    expected = tiny_reference(x)
    body = {"inputs": [json_input("x", x)]}
    stop = threading.Event()
    failures, counts = [], [0, 0, 0]

    def client(k):
        s = requests.Session()
        while not stop.is_set() or counts[k] < 20:
            try:
                r = s.post(f"{srv.url}/v2/models/tiny/infer", json=body, timeout=30)
            except Exception as e:
                failures.append(repr(e))
                return
            if r.status_code != 200:
                failures.append(r.text)
                return
            y = np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(2, 16)
            if not np.allclose(y, expected, rtol=1e-5, atol=1e-5):
                failures.append("wrong output")
                return
            counts[k] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for _ in range(3):
        time.sleep(0.1)
        r = srv.post("/v2/repository/models/tiny/load", json={"parameters": {"force_reload": True}})
        assert r.status_code == 200, r.text
    stop.set()
    for t in threads:
        t.join(60)
    assert failures == [], failures[:3]
    assert min(counts) >= 20
    st = srv.model_stats("tiny")
    assert st["loads"] == 4 and st["state"] == "READY"
    assert st["UsageCount"] == sum(counts)
    assert len(re.findall(r"model=tiny event=loaded .*reload=1", srv.log())) == 3


@pytest.mark.parametrize("grace", [20, 0])
def test_sigterm_with_queued_requests(start_server, grace):
    srv = start_server({"seg": (SEG, {"queue_size": 10, **SLOW})}, grace=grace)
    assert srv.post("/v2/repository/models/seg/load").status_code == 200
    body, headers = seg_body(4)
    pending = [in_background(lambda: srv.infer("seg", body, headers=headers)) for _ in range(4)]
    wait_queued(srv, "seg", 3)
    t0 = time.monotonic()
    srv.signal(signal.SIGTERM)
    results = [p() for p in pending]
    codes = [status_of(r) for r in results]
    assert all(c in (200, 503) for c in codes), codes
    for r in results:
        if r.status_code == 503:
            assert "shut" in error_of(r).lower(), r.text
    if grace:
        assert codes == [200] * 4, codes  # the queue drains within the grace period
    else:
        assert codes.count(503) >= 2, codes  # nothing waits: queued requests are failed
    assert srv.wait_exit() == 0, srv.log()[-3000:]
    assert time.monotonic() - t0 < grace + 10
    assert "event=shutdown" in srv.log()


def read_http_response(sock):
    """Reads one HTTP/1.1 response with a Content-Length body from a raw socket. Returns (status,
    close) or raises EOFError when the connection ends before the whole response arrived."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} bytes of a response")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    fields = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    need = int(fields.get("content-length", "0")) - len(rest)
    while need > 0:
        chunk = sock.recv(min(need, 65536))
        if not chunk:
            raise EOFError("connection closed in a response body")
        need -= len(chunk)
    return status, fields.get("connection", "").lower() == "close"


def test_sigterm_under_overload_answers_what_was_sent(start_server):
    """SIGTERM while 24 keep-alive clients overload a one-instance model: every request a client
    had sent gets an HTTP answer (200, 429 for the full queue, 503 for the shutdown), none is
    reset or closed unanswered; clients that connect after the listener closed are refused, which
    is not a loss."""
    srv = start_server({"seg": (SEG, {"queue_size": 4, **SLOW})}, grace=2)
    assert srv.post("/v2/repository/models/seg/load").status_code == 200
    body, headers = seg_body(3)
    req = (f"POST /v2/models/seg/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
           + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode() + body
    stop = threading.Event()
    lock = threading.Lock()
    tally = {"answered": 0, "codes": {}, "lost": [], "refused": 0}

    def client():
        while not stop.is_set():
            try:
                # the timeout is generous: the request running at SIGTERM is answered when its batch
                # ends, tens of seconds under the sanitizers' instrumented kernels
                sock = socket.create_connection(("127.0.0.1", srv.port), timeout=180)
            except OSError:  # refused: the server no longer listens
                with lock:
                    tally["refused"] += 1
                return
            try:
                while True:
                    sock.sendall(req)
                    try:
                        code, close = read_http_response(sock)
                    except (EOFError, OSError) as e:
                        with lock:
                            tally["lost"].append(repr(e))
                        return
                    with lock:
                        tally["answered"] += 1
                        tally["codes"][code] = tally["codes"].get(code, 0) + 1
                    if close:
                        break
            except OSError as e:  # sending failed: the server closed a connection it kept alive
                with lock:
                    tally["lost"].append("send: " + repr(e))
                return
            finally:
                sock.close()

    threads = [threading.Thread(target=client) for _ in range(24)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    before = tally["answered"]
    srv.signal(signal.SIGTERM)
    for t in threads:
        t.join(200)
    stop.set()
    assert srv.wait_exit() == 0, srv.log()[-3000:]
    assert before > 20 and tally["codes"].get(429, 0) > before // 2, tally  # it was overloaded
    assert tally["lost"] == [], tally
    assert set(tally["codes"]) <= {200, 429, 503}, tally


def test_connection_opened_before_stop_gets_its_first_request_answered(start_server):
    """A connection the server accepted but whose first request had not arrived yet when it
    stopped (a client that connected just before SIGTERM) is kept open until that request has
    been answered (503, Connection: close), not closed under the client's request."""
    srv = start_server({"tiny": TINY}, grace=2)
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    assert srv.get("/v2/health/live").status_code == 200  # the server has accepted by now
    srv.signal(signal.SIGTERM)
    srv.wait_for(lambda: "event=shutdown_complete" in srv.log(), what="shutdown_complete")
    time.sleep(0.2)  # the HTTP threads close idle keep-alive connections at this point
    body = json.dumps({"inputs": [json_input("x", np.ones((1, 16), np.float32))]}).encode()
    sock.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    code, close = read_http_response(sock)
    sock.close()
    assert code == 503 and close
    assert srv.wait_exit() == 0, srv.log()[-3000:]


def test_client_disconnect_keeps_serving(start_server):
    srv = start_server({"seg": (SEG, SLOW), "tiny": TINY})
    assert srv.post("/v2/repository/models/seg/load").status_code == 200
    body, headers = seg_body(5)
    busy = in_background(lambda: srv.infer("seg", body, headers=headers))
    head = (f"POST /v2/models/seg/infer HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {headers['Inference-Header-Content-Length']}\r\n\r\n").encode()
    for i in range(3):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(head + body)
        time.sleep(0.05)
        s.close()
    # a connection that dies halfway through its body
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(head + body[:1000])
    s.close()
    # the server keeps serving others meanwhile
    assert srv.get("/v2/health/live").status_code == 200
    r = srv.infer("tiny", {"inputs": [json_input("x", np.ones((1, 16), np.float32))]})
    assert r.status_code == 200, r.text
    assert status_of(busy()) == 200
    r = srv.infer("seg", body, headers=headers)
    assert r.status_code == 200, r.text
    assert parse_response(r)[0]["mask"].shape == (1, 1, 256, 256)
    assert srv.alive()
    assert srv.get("/v2/health/ready").status_code == 200
    # no request of the abandoned ones is still queued
    srv.wait_for(lambda: srv.model_stats("seg")["queue_depth"] == 0, timeout=30, what="empty seg queue")


def test_model_that_fails_to_load(start_server, tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not an ONNX protobuf" * 8)
    srv = start_server({"broken": broken, "tiny": TINY})
    good = {"inputs": [json_input("x", np.ones((1, 16), np.float32))]}
    r = srv.infer("broken", good)
    assert r.status_code == 503, r.text
    assert "'broken' failed to load" in error_of(r)
    # clients see the file relative to the repository; the log keeps the full path
    assert "broken/model.onnx" in error_of(r) and str(tmp_path) not in r.text, r.text
    assert str(tmp_path) in srv.log()
    # in back-off: refused at once, with Retry-After
    r = srv.infer("broken", good)
    assert r.status_code == 503 and "next retry" in error_of(r), r.text
    assert int(r.headers["Retry-After"]) >= 1
    states = srv.post("/v2/repository/index").json()
    entry = next(m for m in states if m["name"] == "broken")
    assert entry["state"] == "FAILED" and "broken" in entry["reason"], entry
    r = srv.get("/v2/models/broken/ready")
    assert r.status_code == 400 and "FAILED" in error_of(r)
    r = srv.post("/v2/repository/models/broken/load")
    assert r.status_code in (400, 503), r.text  # Triton answers 400; the brief says 503
    assert "failed to load" in error_of(r)
    assert srv.model_stats("broken")["load_failures"] >= 2
    m = parse_metrics(srv.metrics())
    assert metric(m, "mts_model_loads_total", model="broken", outcome="failure") >= 2
    assert "event=load_failed" in srv.log()
    # the other model is unaffected
    assert srv.infer("tiny", good).status_code == 200
    assert srv.get("/v2/health/ready").status_code == 200


def test_full_server_admits_a_new_client_by_closing_the_oldest_idle(start_server):
    """server.max_connections 4: with four idle keep-alive connections open, a fifth client is
    served (not refused with 503): the oldest idle keep-alive connection is closed to admit it."""
    srv = start_server({"tiny": TINY}, config={"server": {"max_connections": 4, "http_threads": 1}})
    srv.http.close()  # the fixture's own keep-alive session would count as a connection
    idle = []
    for _ in range(4):
        sk = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        sk.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_http_response(sk) == (200, False)
        idle.append(sk)
        time.sleep(0.05)  # distinct idle ages
    r = requests.get(srv.url + "/v2/health/ready", headers={"Connection": "close"}, timeout=10)
    assert r.status_code == 200, r.text
    # the connection idle the longest was closed to make room (one I/O thread here: each thread
    # closes the oldest of its own connections); the other three still serve
    idle[0].settimeout(5)
    assert idle[0].recv(100) == b""
    for sk in idle[1:]:
        sk.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_http_response(sk)[0] == 200
    for sk in idle:
        sk.close()


def test_per_client_address_cap(start_server):
    """server.max_connections_per_client 3: a client address holding three connections gets 503
    for a fourth (the others keep working); once one closes, a new connection is admitted. The
    same cap counts across both I/O threads (a client's connections land on either)."""
    srv = start_server({"tiny": TINY}, config={"server": {"max_connections_per_client": 3, "http_threads": 2}})
    srv.http.close()  # the fixture's own keep-alive session would count
    held = []
    for _ in range(3):
        sk = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        sk.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_http_response(sk) == (200, False)
        held.append(sk)
    extra = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    extra.settimeout(10)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = extra.recv(4096)
        if not chunk:
            break
        got += chunk
    assert got.startswith(b"HTTP/1.1 503"), got
    extra.close()
    for sk in held:  # the three still serve
        sk.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_http_response(sk)[0] == 200
    held.pop().close()
    deadline = time.monotonic() + 5
    while True:  # the server sees the close on its next event
        r = None
        try:
            r = requests.get(srv.url + "/v2/health/ready", headers={"Connection": "close"}, timeout=10)
        except requests.ConnectionError:
            pass
        if (r is not None and r.status_code == 200) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert r is not None and r.status_code == 200
    for sk in held:
        sk.close()


def test_slowloris_dies_at_the_header_deadline(start_server):
    """server.header_timeout_s 1: a client trickling a request head one byte per 100 ms gets 408
    about 1 s after its first byte, although each byte keeps it from looking idle; a normal client
    is served meanwhile."""
    srv = start_server({"tiny": TINY}, config={"server": {"header_timeout_s": 1}})
    sk = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    head = b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    t0 = time.monotonic()
    got = b""
    sk.settimeout(0.1)
    for b in head:
        try:
            sk.sendall(bytes([b]))
        except OSError:
            break
        try:
            chunk = sk.recv(4096)
            if not chunk:
                break
            got += chunk
            if b"\r\n\r\n" in got:
                break
        except socket.timeout:
            pass
        assert requests.get(srv.url + "/v2/health/live", timeout=5).status_code == 200
        if time.monotonic() - t0 > 5:
            break
    dt = time.monotonic() - t0
    sk.close()
    assert got.startswith(b"HTTP/1.1 408"), got
    assert 0.9 <= dt <= 3.0, dt
    assert requests.get(srv.url + "/v2/health/live", timeout=5).status_code == 200


def test_pipelined_burst_all_answered(start_server):
    """3,000 pipelined requests in one write get 3,000 answers, in order. Their answers pass the
    output high-water mark many times over; parsing must resume each time the socket takes the
    backlog, with or without an EPOLLOUT to wake it."""
    srv = start_server({"tiny": TINY})
    n = 3000
    reqs = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n" * (n - 1) + \
        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
    # the client reads while it writes (the server stops reading while its answers back up)
    sender = threading.Thread(target=sock.sendall, args=(reqs,))
    sender.start()
    buf = bytearray()
    t0 = time.monotonic()
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
    sender.join()
    sock.close()
    got = bytes(buf).count(b"HTTP/1.1 200 OK")
    assert got == n, f"{got} of {n} pipelined requests answered in {time.monotonic() - t0:.1f} s"
    assert time.monotonic() - t0 < 15
    # the server still serves others
    assert requests.get(srv.url + "/v2/health/live", timeout=5).status_code == 200


def test_http_protocol_details(start_server):
    """HEAD, keep-alive, pipelining, Expect: 100-continue, HTTP/1.0, chunked bodies, huge headers."""
    srv = start_server({"tiny": TINY})
    good = json.dumps({"inputs": [json_input("x", np.ones((1, 16), np.float32))]}).encode()

    s = requests.Session()
    r = s.head(srv.url + "/v2")
    assert r.status_code == 200 and r.content == b""
    r = s.get(srv.url + "/v2")  # same connection: HEAD must not have sent a body
    assert r.status_code == 200 and r.json()["name"] == "mtserve"

    def raw(data, timeout=10):
        """Sends bytes on a fresh connection and reads until the server closes it."""
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
        sock.sendall(data)
        buf = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
        sock.close()
        return buf

    # two pipelined requests on one connection: two responses in order
    out = raw(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\nGET /v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200 OK") == 2 and out.rstrip().endswith(b"}"), out

    # HTTP/1.0: answered and closed
    out = raw(b"GET /v2 HTTP/1.0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200") or out.startswith(b"HTTP/1.0 200"), out
    assert b'"mtserve"' in out

    # Expect: 100-continue gets the interim response before the body is sent
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    sock.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                 b"Expect: 100-continue\r\n\r\n" % len(good))
    assert sock.recv(100).startswith(b"HTTP/1.1 100")
    sock.sendall(good)
    buf = b""
    while b'"outputs"' not in buf:
        chunk = sock.recv(65536)
        assert chunk, buf
        buf += chunk
    sock.close()
    assert buf.startswith(b"HTTP/1.1 200"), buf

    # chunked request body (requests streams a generator that way)
    r = requests.post(f"{srv.url}/v2/models/tiny/infer", data=iter([good[:20], good[20:]]), timeout=30)
    assert r.status_code == 200, r.text

    # an oversized header section is refused with 431 and the server goes on
    r = requests.get(srv.url + "/v2", headers={"X-Big": "a" * 70000}, timeout=30)
    assert r.status_code == 431, r.text
    assert requests.get(srv.url + "/v2/health/live", timeout=30).status_code == 200
