"""Per-model precision served for real: a model with `precision: bf16` loads, serves, and reports
bf16 (with the guard's error) in its stats, /metrics and the dashboard; a model whose guard
cannot pass (`max_error: 1e-9`) serves in fp32 and says why; config.pbtxt parameters select
the precision too; `int8` on a float model falls back to fp32 with the reason.

On a CPU where oneDNN makes no bf16 kernels (or with the reference backend) the bf16 model
also falls back to fp32 with that reason, which is asserted instead.
"""
import os

import numpy as np
import requests

from conftest import SMALL_CNN, binary_body, parse_response


def _infer(srv, model):
    x = np.random.default_rng(3).random((2, 3, 32, 32), dtype=np.float32)
    body, headers = binary_body([("x", x)])
    r = requests.post(f"{srv.url}/v2/models/{model}/infer", data=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    outs, _ = parse_response(r)
    assert np.isfinite(outs["probs"]).all()
    return outs


def test_bf16_and_guard_fallback(start_server):
    srv = start_server(models={
        "cnn_bf16": (SMALL_CNN, {"precision": "bf16"}),
        "cnn_strict": (SMALL_CNN, {"precision": "bf16", "max_error": 1e-9}),
        "cnn_int8": (SMALL_CNN, {"precision": "int8"}),
        "cnn_fp32": SMALL_CNN,
    })
    outs = {m: _infer(srv, m) for m in ("cnn_bf16", "cnn_strict", "cnn_int8", "cnn_fp32")}
    # bf16 stays close to fp32 (softmax probabilities)
    assert np.abs(outs["cnn_bf16"]["probs"] - outs["cnn_fp32"]["probs"]).max() < 2e-2

    st = srv.model_stats("cnn_bf16")
    assert st["precision_requested"] == "bf16"
    if st["precision"] == "bf16":
        assert st["precision_reason"].startswith("requested")
        assert 0 <= st["precision_guard_error"] <= 1e-2
    else:
        assert st["precision"] == "fp32"
        assert "no bf16 kernels" in st["precision_reason"] or "reference backend" in st["precision_reason"]
    bf16_here = st["precision"] == "bf16"

    strict = srv.model_stats("cnn_strict")
    assert strict["precision"] == "fp32" and strict["precision_requested"] == "bf16"
    if bf16_here:
        assert strict["precision_reason"] == "guard failed"
        assert strict["precision_guard_error"] > 1e-9
    i8 = srv.model_stats("cnn_int8")
    assert i8["precision"] == "fp32" and "QDQ" in i8["precision_reason"]
    assert srv.model_stats("cnn_fp32")["precision"] == "fp32"

    # one log line per model whose precision is not plain fp32
    log = srv.log()
    assert log.count("model=cnn_strict event=precision precision=fp32 requested=bf16") == 1
    assert log.count("model=cnn_int8 event=precision precision=fp32 requested=int8") == 1

    metrics = srv.metrics()
    want = "bf16" if bf16_here else "fp32"
    assert f'mts_model_precision{{model="cnn_bf16",precision="{want}",requested="bf16"' in metrics
    assert 'mts_model_precision{model="cnn_strict",precision="fp32",requested="bf16",reason="' in metrics
    if st["precision_guard_error"] is not None:
        assert 'mts_model_precision_guard_error{model="cnn_bf16"}' in metrics

    dash = {m["name"]: m for m in srv.get("/api/v1/dashboard/state").json()["models"]}
    assert dash["cnn_bf16"]["precision"] == want
    assert dash["cnn_strict"]["precision"] == "fp32"
    assert dash["cnn_strict"]["precision_reason"] == strict["precision_reason"]


def test_pbtxt_parameters(start_server, tmp_path):
    repo = tmp_path / "triton_repo"
    (repo / "cnn" / "1").mkdir(parents=True)
    os.symlink(SMALL_CNN, repo / "cnn" / "1" / "model.onnx")
    (repo / "cnn" / "config.pbtxt").write_text(
        'name: "cnn"\nmax_batch_size: 4\n'
        'parameters { key: "precision" value: { string_value: "bf16" } }\n'
        'parameters { key: "max_error" value: { string_value: "1e-9" } }\n')
    srv = start_server(config={"model_repository": str(repo)})
    _infer(srv, "cnn")
    st = srv.model_stats("cnn")
    assert st["precision_requested"] == "bf16" and st["precision"] == "fp32"
    assert st["precision_reason"] in ("guard failed", "no bf16 kernels for this model on this cpu",
                                      "the reference backend computes in fp32")


def test_guard_verdict_remembered_across_reloads(start_server, tmp_path):
    """A reload of the same file with the same settings applies the guard's earlier verdict (no
    second model, no guard runs) with the error measured then; a changed file is guarded again."""
    import shutil
    import time
    path = tmp_path / "cnn.onnx"
    shutil.copy(SMALL_CNN, path)
    srv = start_server(models={"cnn_bf16": (str(path), {"precision": "bf16"}),
                               "cnn_strict": (str(path), {"precision": "bf16", "max_error": 1e-9})})
    first = {}
    for m in ("cnn_bf16", "cnn_strict"):
        _infer(srv, m)
        first[m] = srv.model_stats(m)
    if first["cnn_bf16"]["precision_guard_error"] is None:
        return  # no guard here (reference backend): nothing to remember; asserted by the test above
    for m in ("cnn_bf16", "cnn_strict"):
        assert srv.post(f"/v2/repository/models/{m}/unload").status_code == 200
        assert srv.post(f"/v2/repository/models/{m}/load").status_code == 200
        _infer(srv, m)
        st = srv.model_stats(m)
        assert st["precision"] == first[m]["precision"], (m, st, first[m])
        assert st["precision_reason"].endswith("(at an earlier load)") or \
            st["precision_reason"] == "guard failed (at an earlier load of this file)", st["precision_reason"]
        assert st["precision_guard_error"] == first[m]["precision_guard_error"]
    # a new file (modification time) is guarded again
    time.sleep(0.01)
    os.utime(path, None)
    assert srv.post("/v2/repository/models/cnn_bf16/unload").status_code == 200
    assert srv.post("/v2/repository/models/cnn_bf16/load").status_code == 200
    _infer(srv, "cnn_bf16")
    assert "earlier load" not in srv.model_stats("cnn_bf16")["precision_reason"]
