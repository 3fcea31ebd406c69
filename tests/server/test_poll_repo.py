"""Repository polling (--model-control-mode poll --repository-poll-secs 1) against a real server:
a model folder copied in after start is served without a restart while a background client keeps
inferring the models already there with no failure; a new version folder of a Triton model
replaces the served version (the old one answers until the new one is loaded, then its version
number is refused) and removing it again brings version 1 back; an edited config.pbtxt applies; a removed folder makes the model unknown (404) and a folder of that name
copied back serves again; a folder with a broken config.pbtxt is logged once and skipped. A
lip-sync model whose background_dir is missing is UNAVAILABLE with the folder named in the
repository index and its requests get 503, and it serves once the folder appears.
"""
import os
import re
import shutil
import threading
import time

import sys

import numpy as np
import pytest
import requests

from conftest import ROOT, TINY, Server, _ensure_models, json_input

sys.path.insert(0, str(ROOT / "models" / "gen"))
import avatar  # noqa: E402
X = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)
BODY = {"inputs": [json_input("x", X)]}
PBTXT = ('name: "tri"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
         'input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]\n')


def add_folder(repo, name, pbtxt=None, version=None):
    """Builds the folder beside the repository and renames it in, as a deployment tool would."""
    tmp = repo.parent / f".staging-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    d = tmp / str(version) if version else tmp
    d.mkdir(parents=True)
    os.symlink(TINY, d / "model.onnx")
    if pbtxt:
        (tmp / "config.pbtxt").write_text(pbtxt)
    os.rename(tmp, repo / name)


@pytest.fixture
def poll_server(tmp_path):
    _ensure_models()
    servers = []

    def start(repo):
        srv = Server(tmp_path / "srv", ["--model-repository", str(repo), "--model-control-mode", "poll",
                                        "--repository-poll-secs", "1"], 10)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        if srv.returncode is None:
            srv.stop()


def infer(srv, model, version=None):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return requests.post(srv.url + path, json=BODY, timeout=30)


def index(srv):
    r = srv.post("/v2/repository/index")
    assert r.status_code == 200, r.text
    return {m["name"]: m for m in r.json()}


def test_poll_adds_versions_removes_and_assets(poll_server, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (tmp_path / "srv").mkdir()
    assets = tmp_path / "avatar"  # a small synthetic avatar of this test's own
    avatar.make_assets(str(assets), frames=4, width=160, height=120, crop=64, level=1)
    add_folder(repo, "tiny")
    add_folder(repo, "tri", PBTXT, version=1)
    add_folder(repo, "lips")
    (repo / "lips" / "config.yaml").write_text(
        f"background_dir: frames\ncrop_rects_path: {assets / 'crop_rects.json'}\nnum_frames: 4\n")
    srv = poll_server(repo)
    assert srv.n_models == 2  # lips is unavailable

    # missing asset folder: UNAVAILABLE with the folder (relative to the repository) named
    idx = index(srv)
    assert idx["lips"]["state"] == "UNAVAILABLE", idx
    assert "lips/frames" in idx["lips"]["reason"] and str(tmp_path) not in idx["lips"]["reason"], idx
    r = infer(srv, "lips")
    assert r.status_code == 503 and "lips/frames" in r.json()["error"], r.text
    assert infer(srv, "tri").json()["model_version"] == "1"  # resident: the switch below is a reload

    # a client keeps inferring the models already served through every change below
    stop, counts, failures = threading.Event(), {"ok": 0}, []

    def client():
        s = requests.Session()
        while not stop.is_set():
            for m in ("tiny", "tri"):
                r = s.post(f"{srv.url}/v2/models/{m}/infer", json=BODY, timeout=30)
                if r.status_code == 200:
                    counts["ok"] += 1
                else:
                    failures.append((m, r.status_code, r.text))

    th = threading.Thread(target=client, daemon=True)
    th.start()
    try:
        # a new folder and a broken one
        add_folder(repo, "bad", 'max_batch_size: -5\n')
        add_folder(repo, "tiny2")
        t0 = time.monotonic()
        srv.wait_for(lambda: infer(srv, "tiny2").status_code == 200, timeout=10, interval=0.1, what="tiny2 served")
        added_s = time.monotonic() - t0
        assert "tiny2" in index(srv) and "bad" not in index(srv)
        meta = srv.get("/v2/models/tiny2")
        assert meta.status_code == 200 and meta.json()["versions"] == ["1"], meta.text

        # version 2 of the Triton model: served, version 1 refused (latest 1)
        (repo / "tri" / "2").mkdir()
        os.symlink(TINY, repo / "tri" / "2" / "model.onnx")
        srv.wait_for(lambda: infer(srv, "tri").json().get("model_version") == "2", timeout=10, interval=0.1,
                     what="tri version 2")
        r = infer(srv, "tri", version=1)
        assert r.status_code == 404 and "serves version 2" in r.json()["error"], r.text
        assert infer(srv, "tri", version=2).status_code == 200
        assert index(srv)["tri"]["version"] == "2"
        # version 2 removed again: back to version 1, version 2 refused
        shutil.rmtree(repo / "tri" / "2")
        srv.wait_for(lambda: infer(srv, "tri").json().get("model_version") == "1", timeout=10, interval=0.1,
                     what="tri back to version 1")
        assert infer(srv, "tri", version=2).status_code == 404

        # the served model's config.pbtxt edited: the new configuration applies (reloaded in place)
        assert srv.get("/v2/models/tri/config").json()["max_batch_size"] == 4
        (repo / "tri" / "config.pbtxt").write_text(PBTXT.replace("max_batch_size: 4", "max_batch_size: 2"))
        srv.wait_for(lambda: srv.get("/v2/models/tri/config").json().get("max_batch_size") == 2, timeout=10,
                     interval=0.1, what="tri config applied")
        assert infer(srv, "tri").json()["model_version"] == "1"

        # a removed folder: the model is unknown; copied back, it serves again
        shutil.rmtree(repo / "tiny2")
        srv.wait_for(lambda: infer(srv, "tiny2").status_code == 404, timeout=10, interval=0.1, what="tiny2 gone")
        assert "tiny2" not in index(srv)
        add_folder(repo, "tiny2")
        srv.wait_for(lambda: infer(srv, "tiny2").status_code == 200, timeout=10, interval=0.1, what="tiny2 back")

        # the asset folder appears: available
        os.symlink(assets / "frames", repo / "lips" / "frames")
        srv.wait_for(lambda: index(srv)["lips"]["state"] != "UNAVAILABLE", timeout=10, interval=0.1,
                     what="lips available")
        r = infer(srv, "lips")
        assert r.status_code == 200, r.text
        # and gone again: unavailable again, the others still serve
        os.unlink(repo / "lips" / "frames")
        srv.wait_for(lambda: infer(srv, "lips").status_code == 503, timeout=10, interval=0.1, what="lips unavailable")
    finally:
        stop.set()
        th.join(timeout=30)
    assert not failures, failures[:3]
    assert counts["ok"] > 20, counts
    log = srv.log()
    assert len(re.findall(r"event=poll_added model=tiny2 version=1", log)) == 2, log[-3000:]
    assert "event=poll_version model=tri version=2 previous=1" in log
    assert "event=poll_version model=tri version=1 previous=2" in log
    assert "event=poll_removed model=tiny2" in log
    assert "event=poll_config_changed model=tri version=1" in log
    assert len(re.findall(r"event=poll_config_error folder=\S*/bad ", log)) == 1, log[-3000:]
    assert "model=lips event=available" in log
    assert added_s < 5, added_s
