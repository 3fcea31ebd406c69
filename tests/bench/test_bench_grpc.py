"""End-to-end tests of `mtserve bench --grpc` (the gRPC transport, src/cli/bench_grpc.c) against a
real `mtserve serve --http-port 0 --grpc-port 0` (a few seconds each).

Checks the JSON summary's consistency (total = ok + errors = per-model rows = errors by code,
ordered percentiles, throughput = ok / window) in the closed loop with both channel layouts
(shared channels and one channel per client thread), the open loop's exact schedule, the
conversational-users mode, --all-models and Zipf popularity read over gRPC alone (ModelMetadata,
RepositoryIndex), errors counted by gRPC status code name (NOT_FOUND for an unknown model,
INVALID_ARGUMENT for a bad shape, UNAVAILABLE for a closed port), the server's queue_ms picked
out of the reply, and statistics read over HTTP when --url is given as well.
Run with /usr/bin/python3 -m pytest tests/bench/test_bench_grpc.py.
"""
import json
import socket
import subprocess

import pytest

from conftest import MTSERVE, TINY

@pytest.fixture
def grpc_serve(servers):
    """Starts `mtserve serve` with both front ends on free ports; returns (grpc host:port, http url)."""
    return lambda models: tuple(reversed(servers(models)))


def gbench(target, *args, timeout=120):
    """Runs `mtserve bench --grpc TARGET ARGS --json --quiet`; returns (summary dict, stderr)."""
    cmd = [str(MTSERVE), "bench", "--grpc", target, *map(str, args), "--json", "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(r.stdout), r.stderr


def check_latency(lat, count):
    assert lat["count"] == count
    if count:
        assert 0 <= lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p999"] <= lat["max"]
        assert lat["min"] <= lat["mean"] <= lat["max"]


def check_consistent(j):
    assert j["transport"] == "grpc"
    assert j["requests"] == j["ok"] + j["errors"]
    assert sum(j["errors_by_code"].values()) == j["errors"]
    assert set(j["errors_by_code"]) == set(j["error_messages"])
    assert sum(m["requests"] for m in j["per_model"]) == j["requests"]
    assert sum(m["ok"] for m in j["per_model"]) == j["ok"]
    assert sum(m["errors"] for m in j["per_model"]) == j["errors"]
    check_latency(j["latency_ms"], j["ok"])
    for m in j["per_model"]:
        if m["ok"]:
            assert m["p50_ms"] <= m["p99_ms"] <= m["max_ms"]
    if j["duration_s"] > 0:
        assert abs(j["throughput_rps"] - j["ok"] / j["duration_s"]) < 1e-6 * max(1, j["throughput_rps"])


@pytest.mark.parametrize("channels", [1, 0])
def test_closed_loop(grpc_serve, channels):
    target, _ = grpc_serve({"tiny": TINY, "tiny2": TINY})
    j, _ = gbench(target, "--model", "tiny,tiny2", "--concurrency", 8, "--grpc-channels", channels,
                  "--duration", 2, "--warmup", 0.5)
    check_consistent(j)
    assert j["mode"] == "closed" and j["concurrency"] == 8
    assert j["url"] == target and j["grpc_channels"] == channels
    assert j["errors"] == 0 and j["errors_by_code"] == {}
    assert j["ok"] > 100
    assert 1.9 < j["duration_s"] < 3.5
    assert all(m["requests"] > 0 for m in j["per_model"])
    # the server's queue_ms parameter is read out of every ModelInferResponse
    assert j["server_queue_ms"]["count"] == j["ok"]
    # no HTTP address: server statistics are reported as unavailable, not guessed
    assert j["server"]["available"] is False


def test_request_bound_zipf_batch_all_models(grpc_serve):
    target, _ = grpc_serve({"a": TINY, "b": TINY, "c": TINY})
    # --all-models over gRPC: RepositoryIndex (sorted by name) and ModelMetadata for the inputs
    j, _ = gbench(target, "--all-models", "--concurrency", 3, "--requests", 600, "--zipf", 2, "--batch", 4)
    check_consistent(j)
    assert j["models"] == 3 and j["metadata_failures"] == 0
    assert j["requests"] == 600 and j["errors"] == 0
    assert j["samples_per_s"] == j["throughput_rps"] * 4
    n = {m["model"]: m["requests"] for m in j["per_model"]}
    assert set(n) == {"a", "b", "c"}
    ranked = sorted(n.values(), reverse=True)  # Zipf(2): shares 0.73 / 0.18 / 0.08
    assert ranked[0] > 0.6 * 600 and ranked[2] > 0


def test_open_loop(grpc_serve):
    target, _ = grpc_serve({"tiny": TINY})
    j, _ = gbench(target, "--model", "tiny", "--rate", 200, "--duration", 2, "--warmup", 0.5)
    check_consistent(j)
    assert j["mode"] == "open"
    assert j["requests"] == 400 and j["errors"] == 0  # exactly rate x duration
    assert abs(j["throughput_rps"] - 200) < 1
    assert j["pool"]["exhausted"] is False


def test_users(grpc_serve):
    target, _ = grpc_serve({"tiny": TINY})
    j, _ = gbench(target, "--model", "tiny", "--users", 4, "--speak-s", 0.4, "--listen-s", 0.3, "--wait-s", 0.3,
                  "--duration", 1)
    check_consistent(j)
    f = j["frames"]
    assert f["frames"] == j["requests"] == 4 * 10  # 4 users x 10 frames in one 1 s cycle
    assert f["on_time"] + f["late"] + f["failed"] == f["frames"]
    assert f["failed"] == 0


def test_unknown_model_and_bad_shape_counted_by_code(grpc_serve):
    target, url = grpc_serve({"tiny": TINY})
    j, err = gbench(target, "--model", "tiny,nope", "--concurrency", 2, "--requests", 200)
    check_consistent(j)
    assert "NOT_FOUND" in err  # the metadata lookup says why 'nope' gets no inputs
    assert j["metadata_failures"] == 1
    rows = {m["model"]: m for m in j["per_model"]}
    assert rows["nope"]["errors"] == rows["nope"]["requests"] > 0 and rows["nope"]["ok"] == 0
    assert rows["tiny"]["errors"] == 0 and rows["tiny"]["ok"] == rows["tiny"]["requests"] > 0
    assert j["errors_by_code"] == {"NOT_FOUND": rows["nope"]["requests"]}
    assert "nope" in j["error_messages"]["NOT_FOUND"]

    # wrong inner dimension: INVALID_ARGUMENT from the server, every request; --url adds statistics
    j, _ = gbench(target, "--url", url, "--model", "tiny", "--input", "x:FP32:-1,15", "--concurrency", 2,
                  "--requests", 50)
    check_consistent(j)
    assert j["ok"] == 0 and j["errors_by_code"] == {"INVALID_ARGUMENT": 50}
    assert j["server"]["available"] is True


def test_connection_refused_counted():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    j, _ = gbench(f"127.0.0.1:{port}", "--model", "tiny", "--input", "x:FP32:-1,16", "--requests", 20,
                  "--timeout-ms", 2000)
    check_consistent(j)
    assert j["ok"] == 0 and j["errors_by_code"] == {"UNAVAILABLE": 20}


def test_bad_target_rejected():
    r = subprocess.run([str(MTSERVE), "bench", "--grpc", "http://127.0.0.1:1", "--model", "tiny"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "HOST:PORT" in r.stderr
