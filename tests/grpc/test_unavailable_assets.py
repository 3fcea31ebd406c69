"""A lip-sync model whose background_dir does not exist is unavailable on every route: InferBatch,
InferBatchComposite and KServe ModelInfer answer UNAVAILABLE naming the missing folder, the HTTP
composite route and KServe HTTP infer answer 503, the gRPC repository index shows UNAVAILABLE with
the reason; the other model of the same server is served.
"""
import json
import re
import urllib.error
import urllib.request

import grpc
import numpy as np

from conftest import LIPSYNC, TINY, tiny_request

HTTP_RE = re.compile(r"serving \d+ models? on http://([0-9.]+):(\d+)")


def post(url, body, ctype):
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_missing_background_dir_is_unavailable_everywhere(start_server, pb, tmp_path):
    frames = tmp_path / "gone" / "frames"
    srv = start_server({"lip": {"model_path": str(LIPSYNC), "max_batch": 4, "background_dir": str(frames),
                                "num_frames": 12},
                        "tiny": {"model_path": str(TINY)}})
    ls = pb.ls_grpc.InferenceServiceStub(srv.channel)
    ks = pb.ks_grpc.GRPCInferenceServiceStub(srv.channel)
    rng = np.random.default_rng(1)
    vis, aud = rng.random((1, 6, 320, 320), np.float32), rng.random((1, 32, 16, 16), np.float32)
    calls = {
        "InferBatch": lambda: ls.InferBatch(pb.ls.InferBatchRequest(
            model_id="lip", visual_frames=vis.tobytes(), audio_features=aud.tobytes(), batch_size=1), timeout=60),
        "InferBatchComposite": lambda: ls.InferBatchComposite(pb.ls.CompositeBatchRequest(
            model_id="lip", visual_frames=vis.tobytes(), audio_features=aud.tobytes(), batch_size=1), timeout=60),
    }
    req = pb.ks.ModelInferRequest(model_name="lip")
    req.inputs.add(name="visual", datatype="FP32", shape=list(vis.shape))
    req.inputs.add(name="audio", datatype="FP32", shape=list(aud.shape))
    req.raw_input_contents.extend([vis.tobytes(), aud.tobytes()])
    calls["ModelInfer"] = lambda: ks.ModelInfer(req, timeout=60)
    for name, call in calls.items():
        try:
            call()
            raise AssertionError(f"{name} succeeded")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, (name, e.code(), e.details())
            assert "background_dir 'frames' is missing" in e.details(), (name, e.details())
            assert str(tmp_path) not in e.details(), (name, e.details())
    idx = {m.name: m for m in ks.RepositoryIndex(pb.ks.RepositoryIndexRequest(), timeout=30).models}
    assert idx["lip"].state == "UNAVAILABLE" and "frames" in idx["lip"].reason, idx["lip"]
    m = HTTP_RE.search(srv.stdout_path.read_text())
    base = f"http://{m.group(1)}:{m.group(2)}"
    st, body = post(base + "/api/v1/lipsync/lip/composite", vis.tobytes() + aud.tobytes(), "application/octet-stream")
    assert st == 503 and "background_dir 'frames' is missing" in json.loads(body)["error"], (st, body[:300])
    st, body = post(base + "/v2/models/lip/infer", json.dumps(
        {"inputs": [{"name": "audio", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]}).encode(), "application/json")
    assert st == 503 and "unavailable" in json.loads(body)["error"], (st, body[:300])
    # the other model serves
    r = ks.ModelInfer(tiny_request(pb, np.ones((1, 16), np.float32)), timeout=30)
    assert r.model_name == "tiny"
    assert "model=lip event=unavailable" in srv.log()
