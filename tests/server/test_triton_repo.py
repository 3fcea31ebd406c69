"""A Triton model repository served unchanged: <model>/config.pbtxt plus numbered version folders
(<model>/<N>/model.onnx). mtserve serves the latest version (or the one version_policy names),
takes max_batch_size / dynamic_batching / instance_group from config.pbtxt, and reports and
checks that version number on every KServe v2 route, as Triton clients expect.
"""
import os

import numpy as np
import requests

from conftest import TINY, json_input


def test_triton_layout_and_versions(start_server, tmp_path):
    repo = tmp_path / "triton_repo"
    for v in (1, 2):
        (repo / "tiny" / str(v)).mkdir(parents=True)
        os.symlink(TINY, repo / "tiny" / str(v) / "model.onnx")
    (repo / "tiny" / "config.pbtxt").write_text(
        'name: "tiny"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
        "dynamic_batching { max_queue_delay_microseconds: 100 }\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n")
    srv = start_server(config={"model_repository": str(repo)})
    meta = srv.get("/v2/models/tiny").json()
    assert meta["versions"] == ["2"]
    x = np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)
    r = requests.post(f"{srv.url}/v2/models/tiny/versions/2/infer", json={"inputs": [json_input("x", x)]}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["model_version"] == "2"
    r = requests.post(f"{srv.url}/v2/models/tiny/infer", json={"inputs": [json_input("x", x)]}, timeout=30)
    assert r.status_code == 200 and r.json()["model_version"] == "2"
    r = requests.post(f"{srv.url}/v2/models/tiny/versions/1/infer", json={"inputs": [json_input("x", x)]}, timeout=30)
    assert r.status_code == 404 and "has no version '1' (it serves version 2)" in r.json()["error"]
    assert srv.get("/v2/models/tiny/versions/2/ready").status_code == 200
    assert srv.get("/v2/models/tiny/versions/7").status_code == 404
    idx = {m["name"]: m for m in srv.post("/v2/repository/index").json()}
    assert idx["tiny"]["version"] == "2"
    assert srv.model_stats("tiny")["version"] == "2"
    cfg = srv.get("/v2/models/tiny/config").json()
    assert cfg["max_batch_size"] == 4
