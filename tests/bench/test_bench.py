"""End-to-end tests of `mtserve bench` against a real `mtserve serve` (a few seconds each).

Checks that the JSON summary is self-consistent in every load shape: request counts (total =
ok + errors = sum of per-model rows = sum of errors by code), exact counts where the schedule
fixes them (--requests, open loop rate x duration, conversational users' frames), no errors
against a healthy server, errors counted by HTTP status for an unknown model and by transport
failure for a closed port, ordered percentiles, warm/cold tagging under model churn, the
--find-capacity search, and a server that dies mid-run stopping the run with an error (HTTP and
gRPC) instead of counting refused connections as requests. Run with /usr/bin/python3 -m pytest tests/bench.
"""
import json
import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import MTSERVE, TINY


def check_latency(lat, count):
    assert lat["count"] == count
    if count:
        assert 0 <= lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p999"] <= lat["max"]
        assert lat["min"] <= lat["mean"] <= lat["max"]


def check_consistent(j):
    assert j["requests"] == j["ok"] + j["errors"]
    assert sum(j["errors_by_code"].values()) == j["errors"]
    assert sum(m["requests"] for m in j["per_model"]) == j["requests"]
    assert sum(m["ok"] for m in j["per_model"]) == j["ok"]
    assert sum(m["errors"] for m in j["per_model"]) == j["errors"]
    check_latency(j["latency_ms"], j["ok"])
    for m in j["per_model"]:
        if m["ok"]:
            assert m["p50_ms"] <= m["p99_ms"] <= m["max_ms"]
    if j["duration_s"] > 0:
        assert abs(j["throughput_rps"] - j["ok"] / j["duration_s"]) < 1e-6 * max(1, j["throughput_rps"])


def test_closed_loop(serve, bench):
    url = serve({"tiny": TINY, "tiny2": TINY})
    j, _ = bench(url, "--model", "tiny,tiny2", "--concurrency", 4, "--duration", 2, "--warmup", 0.5)
    check_consistent(j)
    assert j["mode"] == "closed" and j["concurrency"] == 4
    assert j["errors"] == 0 and j["errors_by_code"] == {}
    assert j["ok"] > 100
    assert 1.9 < j["duration_s"] < 3.5
    assert {m["model"] for m in j["per_model"]} == {"tiny", "tiny2"}
    assert all(m["requests"] > 0 for m in j["per_model"])  # uniform popularity reaches both
    assert j["server"]["available"]
    assert "latency_from_send_ms" not in j  # a closed loop sends when it means to


def test_closed_loop_request_bound_and_zipf(serve, bench):
    url = serve({"a": TINY, "b": TINY, "c": TINY})
    j, _ = bench(url, "--model", "a,b,c", "--concurrency", 3, "--requests", 600, "--zipf", 2, "--batch", 4)
    check_consistent(j)
    assert j["requests"] == 600 and j["errors"] == 0
    assert j["samples_per_s"] == j["throughput_rps"] * 4
    n = {m["model"]: m["requests"] for m in j["per_model"]}
    # Zipf(2): shares 0.73 / 0.18 / 0.08
    assert n["a"] > n["b"] > n["c"] > 0
    assert n["a"] > 0.6 * 600


def test_open_loop(serve, bench):
    url = serve({"tiny": TINY})
    j, _ = bench(url, "--model", "tiny", "--rate", 200, "--duration", 2, "--warmup", 0.5)
    check_consistent(j)
    assert j["mode"] == "open" and j["rate"] == 200
    # fixed intervals: exactly rate x duration requests are scheduled in the measured window
    assert j["requests"] == 400 and j["errors"] == 0
    assert abs(j["throughput_rps"] - 200) < 1
    pool = j["pool"]
    assert 1 <= pool["connections"] <= pool["max_connections"]
    assert pool["exhausted"] is False


def test_open_loop_pool_exhaustion_reported(serve, bench):
    url = serve({"tiny": TINY})
    # one connection cannot keep up with 100000 req/s (10 us per round trip; one keep-alive
    # connection does roughly 15-20k/s here): the pool is exhausted and the latency keeps counting
    # from the scheduled times
    j, _ = bench(url, "--model", "tiny", "--rate", 100000, "--duration", 0.2, "--connections", 1,
                 "--max-connections", 1)
    check_consistent(j)
    assert j["pool"]["connections"] == 1
    assert j["pool"]["exhausted"] is True and j["pool"]["exhausted_starts"] > 0
    assert j["requests"] == 20000
    assert j["latency_ms"]["max"] > 50  # the backlog shows: the last ones waited for their turn
    # ... and from the actual send each is one quick round trip: the backlog is the client's
    sent = j["latency_from_send_ms"]
    assert sent["max"] <= j["latency_ms"]["max"] and sent["p50"] < j["latency_ms"]["p50"] / 10, (sent, j["latency_ms"])


def test_users(serve, bench):
    url = serve({"tiny": TINY})
    # cycle 2 s (1 s speaking at 25 FPS): in a 2 s window every user speaks exactly once
    j, _ = bench(url, "--model", "tiny", "--users", 4, "--speak-s", 1, "--listen-s", 0.5, "--wait-s", 0.5,
                 "--duration", 2)
    check_consistent(j)
    f = j["frames"]
    assert j["mode"] == "users" and f["users"] == 4
    assert f["frames"] == 100 == j["requests"]
    assert f["on_time"] + f["late"] + f["failed"] == f["frames"]
    assert f["failed"] == 0
    assert f["on_time_ratio"] == f["on_time"] / f["frames"]
    assert f["on_time_ratio"] > 0.9  # a tiny model answers well within 200 ms
    assert j["cycle"]["duty_cycle"] == 0.5


def test_find_capacity(serve, bench):
    url = serve({"tiny": TINY})
    j, _ = bench(url, "--model", "tiny", "--find-capacity", "--speak-s", 0.4, "--listen-s", 0.3, "--wait-s", 0.3,
                 "--level-seconds", 1, "--max-users", 8)
    assert j["mode"] == "find-capacity"
    users = [lv["users"] for lv in j["levels"]]
    assert users[:2] == [1, 2]
    for lv in j["levels"]:
        assert lv["on_time"] + lv["late"] + lv["failed"] == lv["frames"] > 0
        assert lv["passed"] == (lv["on_time_ratio"] >= 0.99)
    cap = j["capacity"]
    passed = [lv["users"] for lv in j["levels"] if lv["passed"]]
    assert cap["max_users"] == (max(passed) if passed else 0)
    assert cap["max_users"] >= 4  # tiny at 25 FPS per speaking user is easy


def test_unknown_model_errors_counted(serve, bench):
    url = serve({"tiny": TINY})
    j, err = bench(url, "--model", "nope,tiny", "--concurrency", 2, "--requests", 300)
    check_consistent(j)
    assert "metadata of 'nope'" in err and j["metadata_failures"] == 1
    rows = {m["model"]: m for m in j["per_model"]}
    assert rows["nope"]["errors"] == rows["nope"]["requests"] > 0 and rows["nope"]["ok"] == 0
    assert rows["tiny"]["errors"] == 0 and rows["tiny"]["ok"] == rows["tiny"]["requests"] > 0
    assert j["errors_by_code"] == {"404": rows["nope"]["requests"]}
    assert "nope" in j["error_messages"]["404"]
    assert j["requests"] == 300


def test_connection_refused_counted():
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([str(MTSERVE), "bench", "--url", f"127.0.0.1:{port}", "--model", "m", "--input",
                        "x:FP32:-1,16", "--requests", "20", "--json", "--quiet", "--no-server-stats"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    import json
    j = json.loads(r.stdout)
    assert j["requests"] == 20 and j["errors"] == 20 and j["errors_by_code"] == {"connect": 20}


def test_cold_probe_under_churn(serve, bench):
    models = {f"m{i}": TINY for i in range(6)}
    url = serve(models, max_models=2)
    j, _ = bench(url, "--model", ",".join(models), "--concurrency", 1, "--requests", 300, "--cold-probe",
                 "--input", "x:FP32:-1,16")
    check_consistent(j)
    assert j["errors"] == 0
    c = j["cold"]
    assert c["warm_requests"] + c["cold_requests"] + c["probe_failed"] == j["ok"]
    assert c["cold_requests"] > 0 and c["warm_requests"] > 0
    assert 0 < c["hit_rate"] < 1
    check_latency(c["latency_warm_ms"], c["warm_requests"])
    check_latency(c["latency_cold_ms"], c["cold_requests"])
    # one client, two resident of six models: every cold request caused exactly one load
    assert j["server"]["loads"] == c["cold_requests"]
    assert j["server"]["resident_models"] <= 2
    assert sum(m["cold"] for m in j["per_model"]) == c["cold_requests"]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_dead_server_stops_the_run(servers, transport):
    """The server is killed 1.5 s into a 30 s closed-loop run at concurrency 8: bench must stop
    within a few seconds with exit status 1, say why, and report server_lost; the requests it
    counts as failed stay in the hundreds, not the ~100k a second a refused port allows."""
    url, target, proc = servers({"tiny": TINY}, process=True)
    where = ["--url", url] if transport == "http" else ["--grpc", target]
    cmd = [str(MTSERVE), "bench", *where, "--model", "tiny", "--concurrency", "8", "--duration", "30", "--json",
           "--quiet", "--no-server-stats"]
    t0 = time.monotonic()
    b = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    out, err = b.communicate(timeout=30)
    took = time.monotonic() - t0
    assert b.returncode == 1, (b.returncode, err[-2000:])
    assert "stopped answering" in err, err[-2000:]
    assert took < 10, took
    j = json.loads(out)
    assert j["server_lost"] is True and j["ok"] > 0
    assert j["requests"] == j["ok"] + j["errors"]
    assert j["errors"] < 5000, j["errors_by_code"]
