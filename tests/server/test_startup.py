"""`mtserve serve` at start: strict flags (exit 2 naming the flag), taken ports (one line naming
the flag that moves it, exit 1, no gRPC-core dump), models whose file is missing (marked
unavailable with the reason while the rest is served), resource warnings, unknown-key
suggestions, non-ONNX files, --version, --log-format json / --log-verbose and the model control
modes (none, explicit, poll).
"""
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest
import requests

from conftest import MTSERVE, TINY, Server, _ensure_models, json_input
from threadinfo import realtime_allowed, thread_policies

GOOD = {"inputs": [json_input("x", np.ones((1, 16), np.float32))]}


def run_serve(*args, timeout=20):
    """Runs `mtserve serve ARGS` expecting it to exit by itself; returns (rc, stdout, stderr)."""
    p = subprocess.run([str(MTSERVE), "serve", *args], capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def make_repo(root, models):
    repo = root / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    for name, path in models.items():
        (repo / name).mkdir()
        os.symlink(path, repo / name / "model.onnx")
    return repo


@pytest.fixture
def repo(tmp_path):
    _ensure_models()
    return make_repo(tmp_path, {"tiny": TINY})


@pytest.fixture
def servers():
    started = []
    yield started
    for s in started:
        if s.returncode is None:
            s.stop()


@pytest.mark.parametrize("flag,value", [
    ("--http-port", "abc"), ("--http-port", "-5"), ("--http-port", "70000"), ("--http-port", "80x"),
    ("--grpc-port", ""), ("--grace", "1e3"), ("--max-connections", "0"), ("--repository-poll-secs", "-1"),
    ("--log-verbose", "x"),
])
def test_numeric_flags_are_strict(repo, flag, value):
    extra = ["--model-control-mode", "poll"] if flag == "--repository-poll-secs" else []
    rc, out, err = run_serve("--model-repository", str(repo), *extra, flag, value)
    assert rc == 2, (out, err)
    assert flag in err and f"'{value}'" in err and "whole number" in err, err
    assert "serving" not in out


def test_flag_equals_form(repo):
    rc, _, err = run_serve("--model-repository", str(repo), "--http-port=12x")
    assert rc == 2 and "--http-port" in err and "'12x'" in err, err


def test_unknown_option_and_missing_value_differ(repo):
    rc, _, err = run_serve("--model-repository", str(repo), "--bogus-flag")
    assert rc == 2 and "unknown option '--bogus-flag'" in err, err
    rc, _, err = run_serve("--model-repository", str(repo), "--http-prot", "5")
    assert rc == 2 and "unknown option '--http-prot'" in err and "did you mean '--http-port'" in err, err
    rc, _, err = run_serve("--model-repository", str(repo), "--http-port")
    assert rc == 2 and "option --http-port needs a value" in err, err
    # the next option is not taken as the value
    rc, _, err = run_serve("--config", "--model-repository", str(repo))
    assert rc == 2 and "option --config needs a value" in err, err


@pytest.mark.parametrize("flag,value,allowed", [
    ("--log-format", "xml", "text|json"), ("--model-control-mode", "auto", "none|explicit|poll"),
    ("--log-level", "loud", "debug|info|warn|error"),
])
def test_enum_flags(repo, flag, value, allowed):
    rc, _, err = run_serve("--model-repository", str(repo), flag, value)
    assert rc == 2 and flag in err and allowed in err, err


def test_version():
    for argv in ([str(MTSERVE), "--version"], [str(MTSERVE), "serve", "--version"]):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        assert p.returncode == 0, p.stderr
        assert re.match(r"mtserve \d+\.\d+\.\d+", p.stdout), p.stdout


def _listen():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


@pytest.mark.parametrize("which", ["--http-port", "--grpc-port"])
def test_port_in_use(repo, which):
    holder, port = _listen()
    try:
        other = "--grpc-port" if which == "--http-port" else "--http-port"
        rc, out, err = run_serve("--model-repository", str(repo), which, str(port), other, "0")
    finally:
        holder.close()
    assert rc == 1, (out, err)
    lines = [ln for ln in err.splitlines() if str(port) in ln]
    assert len(lines) == 1, err
    assert "in use" in lines[0] and which in lines[0], err
    assert "serving" not in out  # nothing was announced
    assert "UNKNOWN:" not in err and "grpc_core" not in err and "chttp2" not in err, err


def test_same_port_for_both(repo):
    holder, port = _listen()
    holder.close()
    rc, _, err = run_serve("--model-repository", str(repo), "--http-port", str(port), "--grpc-port", str(port))
    assert rc == 1 and "--grpc-port" in err and "HTTP port" in err, err


def test_missing_model_file_is_unavailable(tmp_path, servers):
    _ensure_models()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"models:\n  tiny:\n    model_path: {TINY}\n"
                   f"  ghost:\n    model_path: {tmp_path}/nowhere/ghost.onnx\n"
                   f"  tiny2:\n    model_path: {TINY}\n    background_dir: {tmp_path}/no_frames\n")
    srv = Server(tmp_path, ["--config", str(cfg)], 10)
    servers.append(srv)
    assert srv.n_models == 1  # tiny is servable; ghost (model file) and tiny2 (background_dir) are not
    out = srv.stdout_path.read_text()
    assert "2 models are unavailable" in out, out
    log = srv.log()
    assert re.search(r"model=ghost event=unavailable path=\S*ghost.onnx", log), log
    assert "model=tiny2 event=unavailable background_dir=" in log, log
    entry = next(m for m in srv.post("/v2/repository/index").json() if m["name"] == "ghost")
    assert entry["state"] == "FAILED" and "missing" in entry["reason"], entry
    assert str(tmp_path) not in entry["reason"]
    r = srv.infer("ghost", GOOD)
    assert r.status_code == 503, r.text
    assert "ghost" in r.text
    assert srv.infer("tiny", GOOD).status_code == 200
    entry = next(m for m in srv.post("/v2/repository/index").json() if m["name"] == "tiny2")
    assert entry["state"] == "UNAVAILABLE" and "background_dir 'no_frames' is missing" in entry["reason"], entry
    r = srv.infer("tiny2", GOOD)
    assert r.status_code == 503 and "no_frames" in r.text and str(tmp_path) not in r.text, r.text


def test_resource_warnings_and_key_suggestion(tmp_path, servers):
    _ensure_models()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("gpus:\n  count: 8\n  worker_count_per_gpu: 4\ncapacity:\n  max_memory_gb: 90000\n"
                   f"models:\n  tiny:\n    model_path: {TINY}\n    max_bacth: 4\n")
    srv = Server(tmp_path, ["--config", str(cfg)], 10)
    servers.append(srv)
    log = srv.log()
    assert log.count("event=memory_overcommit") == 1 and "budget_gb=90000.0" in log, log
    assert log.count("event=cpu_oversubscribed") == 1 and "8 devices x max(4 workers" in log, log
    assert "unknown key 'models.tiny.max_bacth'; ignored (did you mean 'max_batch'?)" in log, log


def test_no_resource_warning_by_default(repo, tmp_path, servers):
    srv = Server(tmp_path, ["--model-repository", str(repo)], 10)
    servers.append(srv)
    assert "memory_overcommit" not in srv.log() and "cpu_oversubscribed" not in srv.log()


def test_pbtxt_field_suggestion(tmp_path, servers):
    _ensure_models()
    repo = make_repo(tmp_path, {"tiny": TINY})
    (repo / "tiny" / "config.pbtxt").write_text('name: "tiny"\nmax_batch_sise: 4\n')
    srv = Server(tmp_path, ["--model-repository", str(repo)], 10)
    servers.append(srv)
    assert "unknown field 'max_batch_sise'; ignored (did you mean 'max_batch_size'?)" in srv.log(), srv.log()


def test_not_onnx_is_called_that(tmp_path, servers):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not an ONNX protobuf" * 8)
    repo = make_repo(tmp_path, {"junk": junk})
    srv = Server(tmp_path, ["--model-repository", str(repo)], 10)
    servers.append(srv)
    r = srv.infer("junk", GOOD)
    assert r.status_code == 503
    assert "junk/model.onnx is not an ONNX model: " in r.text and "wire type" in r.text, r.text


def test_json_log_format(repo, tmp_path, servers):
    srv = Server(tmp_path, ["--model-repository", str(repo), "--log-format", "json", "--log-verbose", "1"], 10)
    servers.append(srv)
    assert srv.infer("tiny", GOOD).status_code == 200
    srv.stop()
    lines = [ln for ln in srv.log().splitlines() if ln.strip()]
    assert lines
    events = []
    for ln in lines:
        obj = json.loads(ln)  # every line is one JSON object
        assert {"time", "level", "event", "msg"} <= obj.keys(), obj
        events.append(obj["event"])
    assert "listening" in events and "signal" in events and "loaded" in events, events


def test_model_control_none_loads_everything(repo, tmp_path, servers):
    srv = Server(tmp_path, ["--model-repository", str(repo), "--model-control-mode", "none"], 10)
    servers.append(srv)
    srv.wait_for(lambda: srv.index()["tiny"] == "READY", what="tiny preloaded")


def test_model_control_explicit(repo, tmp_path, servers):
    srv = Server(tmp_path, ["--model-repository", str(repo), "--model-control-mode", "explicit"], 10)
    servers.append(srv)
    r = srv.infer("tiny", GOOD)
    assert r.status_code == 503 and "explicit" in r.text and "/load" in r.text, r.text
    assert srv.index()["tiny"] == "UNLOADED"
    r = srv.post("/v2/repository/models/tiny/load")
    assert r.status_code == 200, r.text
    assert srv.infer("tiny", GOOD).status_code == 200


def test_model_control_poll(tmp_path, servers):
    _ensure_models()
    repo = tmp_path / "repo"
    (repo / "tiny").mkdir(parents=True)
    shutil.copy(TINY, repo / "tiny" / "model.onnx")
    srv = Server(tmp_path, ["--model-repository", str(repo), "--model-control-mode", "poll",
                            "--repository-poll-secs", "1"], 10)
    servers.append(srv)
    assert srv.infer("tiny", GOOD).status_code == 200
    # a changed file is reloaded
    data = (repo / "tiny" / "model.onnx").read_bytes()
    tmp = repo / "tiny" / "model.onnx.new"
    tmp.write_bytes(data)
    os.utime(tmp, (time.time() + 5, time.time() + 5))
    os.replace(tmp, repo / "tiny" / "model.onnx")
    srv.wait_for(lambda: "model=tiny event=repository_changed" in srv.log(), timeout=10, what="reload")
    srv.wait_for(lambda: srv.count_events("tiny", "loaded") >= 2, timeout=10, what="second load")
    assert srv.infer("tiny", GOOD).status_code == 200


def test_metrics_port(repo, tmp_path, servers):
    holder, port = _listen()
    holder.close()
    srv = Server(tmp_path, ["--model-repository", str(repo), "--metrics-port", str(port)], 10)
    servers.append(srv)
    r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert r.status_code == 200 and "mts_" in r.text
    # only metrics there
    r = requests.post(f"http://127.0.0.1:{port}/v2/models/tiny/infer", json=GOOD, timeout=10)
    assert r.status_code == 404, r.text
    assert srv.get("/metrics").status_code == 200  # still on the HTTP port


def test_metrics_port_in_use(repo):
    holder, port = _listen()
    try:
        rc, _, err = run_serve("--model-repository", str(repo), "--http-port", "0", "--grpc-port", "0",
                               "--metrics-port", str(port))
    finally:
        holder.close()
    assert rc == 1 and "--metrics-port" in err and "in use" in err, err


def test_light_http_threads_run_realtime(start_server, repo, tmp_path, servers):
    """The light HTTP I/O threads ask for SCHED_RR 1 and get it where the process may (otherwise
    one log line says why and they stay at the normal policy, serving as before); the listening
    threads and the workers stay normal; server.light_io_realtime: false keeps every thread
    normal."""
    srv = start_server(models={"tiny": TINY})
    assert srv.infer("tiny", {"inputs": [json_input("x", np.ones((1, 16), np.float32))]}).status_code == 200
    light = thread_policies(srv.proc.pid, "mts-http-light")
    assert len(light) == 2, light
    if realtime_allowed():
        assert light == [os.SCHED_RR, os.SCHED_RR], light
        assert "event=realtime_threads threads=mts-http-light policy=SCHED_RR" in srv.log()
    else:
        assert light == [os.SCHED_OTHER, os.SCHED_OTHER], light
        assert "event=realtime_unavailable threads=mts-http-light" in srv.log()
    for name in ("mts-http", "mts-d0-w0", "mts-d0-lane"):
        assert set(thread_policies(srv.proc.pid, name)) == {os.SCHED_OTHER}, name

    off = start_server(models={"tiny": TINY}, config={"server": {"light_io_realtime": False}})
    assert off.infer("tiny", {"inputs": [json_input("x", np.ones((1, 16), np.float32))]}).status_code == 200
    assert thread_policies(off.proc.pid, "mts-http-light") == [os.SCHED_OTHER, os.SCHED_OTHER]
    assert "event=realtime" not in off.log()

    drop = ["setpriv", "--bounding-set", "-sys_nice"]
    can_drop = shutil.which("setpriv") and subprocess.run([*drop, "true"], capture_output=True).returncode == 0
    if realtime_allowed() and can_drop and resource.getrlimit(resource.RLIMIT_RTPRIO)[0] == 0:
        # the same server without CAP_SYS_NICE: refused, said once, served at the normal policy
        (tmp_path / "denied").mkdir()
        denied = Server(tmp_path / "denied", ["--model-repository", str(repo)], 10, prefix=drop)
        servers.append(denied)
        assert denied.infer("tiny", {"inputs": [json_input("x", np.ones((1, 16), np.float32))]}).status_code == 200
        assert thread_policies(denied.proc.pid, "mts-http-light") == [os.SCHED_OTHER, os.SCHED_OTHER]
        assert denied.log().count("event=realtime_unavailable threads=mts-http-light") == 1, denied.log()


def test_bad_host(repo):
    rc, out, err = run_serve("--model-repository", str(repo), "--host", "no-such-host.invalid", "--http-port", "0",
                             "--grpc-port", "0")
    assert rc == 1 and "cannot resolve host 'no-such-host.invalid'" in err and "--host" in err, err
    assert "serving" not in out


def test_threads_are_named(start_server):
    """The server's threads carry names that say what they do (top -H, ps -L, perf, gdb)."""
    srv = start_server(models={"tiny": TINY})
    r = srv.infer("tiny", {"inputs": [json_input("x", np.ones((1, 16), np.float32))]})
    assert r.status_code == 200, r.text
    wanted = ("mts-d0-w0", "mts-d0-lane", "mts-http", "mts-http-light", "mts-grpc-accept", "mts-grpc-reply", "mts-loader", "mts-janitor")
    # The HTTP serving line (what start_server waits for) comes before the gRPC listener starts,
    # so its threads may appear a moment later: look again for up to 10 s.
    deadline = time.monotonic() + 10
    while True:
        names = set()
        for tid in os.listdir(f"/proc/{srv.proc.pid}/task"):
            try:
                names.add(open(f"/proc/{srv.proc.pid}/task/{tid}/comm").read().strip())
            except OSError:
                pass  # a thread that ended meanwhile
        if all(w in names for w in wanted) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for want in wanted:
        assert want in names, f"no thread named {want}: {sorted(names)}"
