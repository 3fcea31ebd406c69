"""GGUF embedding models (engine/gguf.c, gguf_bert.c, text/tokenizer_gguf.c) end to end.

The minilm_like encoder's weights are written as GGUF files the way llama.cpp's converter lays
out a BERT model (tests/server/gguf_writer.py: the converter's tensor names, ggml's [out, in]
weight layout, the vocabulary in its phantom-space spelling with the special token ids as
metadata, 1-D tensors in F32), in F32, F16, BF16 and Q8_0. One server serves the ONNX model and the
GGUF folders (model.gguf alone, no tokenizer or pooling configured) side by side; the vectors of
/v1/embeddings must match the ONNX model's with the same weights: the original ONNX for F32, an
ONNX copy with the weights rounded through float16 (bfloat16) for F16 (BF16) and one with the
Q8_0-dequantized weights for Q8_0 (all cosine >= 0.99999, i.e. the GGUF path adds only float rounding). Q8_0
against the original full-precision weights is held to cosine >= 0.999: the quantization error
of 8-bit blocks (at most half a step, d/2 = max|w|/254 per weight) on random weights measures
about 0.9998 here through six layers; 0.999 leaves room for that and still fails a wrong scale,
block order or layout (those give cosines far below 0.9). Token ids (`mtserve embed --tokens`)
must be the same as with the vocab.txt the model was built with, and pooling comes from
bert.pooling_type (a CLS file against the ONNX model configured with pooling: cls) unless
config.yaml says otherwise.

A version 2 file loads as version 3 does. Malformed files (bad magic, version 1 or big-endian,
truncated, huge counts, a string past the end, tensor data past the
end, an unknown tensor type, a missing tensor, a wrong shape, an array of arrays, another
architecture) each make their model fail to load with a message naming the problem, while the
server keeps serving the good models.
"""
import os
import struct
import subprocess

import numpy as np
import pytest
import requests

from conftest import MTSERVE, Server
from yamlcfg import to_yaml

import gguf_writer as gw
from test_embeddings import assets  # noqa: F401  (the model and vocabulary fixture)


TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Héllo, WORLD! unaffable naïve café",
    "numbers 12345 and symbols #$% are tokens too",
    "A",
    "Sentence embeddings map a text to one vector; similar texts get nearby vectors.",
]


def tiny_bytes(tmp, kv=None, tensors=None):
    p = tmp / "t.gguf"
    gw.write(p, *gw.tiny_bert(kv, tensors))
    return bytearray(p.read_bytes())


def info_off(b):
    """Byte offset of the first tensor info (after the key/values) of a tiny file."""
    n_kv = struct.unpack_from("<Q", b, 16)[0]
    pos = 24
    for _ in range(n_kv):
        pos += 8 + struct.unpack_from("<Q", b, pos)[0]
        t = struct.unpack_from("<I", b, pos)[0]
        pos += 4
        if t == gw.STRING:
            pos += 8 + struct.unpack_from("<Q", b, pos)[0]
        elif t == gw.ARRAY:
            et, n = struct.unpack_from("<IQ", b, pos)
            pos += 12
            for _ in range(n):
                pos += 8 + struct.unpack_from("<Q", b, pos)[0] if et == gw.STRING else 4
        else:
            pos += struct.calcsize(gw._FMT[t])
    return pos


def malformed(tmp):
    """{model name: (file bytes, text the load error must contain)}."""
    good = tiny_bytes(tmp)
    out = {}
    b = bytearray(good)
    b[0:4] = b"GGUV"
    out["bad_magic"] = (b, "bad magic")
    b = bytearray(good)
    struct.pack_into("<I", b, 4, 1)
    out["version1"] = (b, "version 1 is not supported")
    b = bytearray(good)
    struct.pack_into("<I", b, 4, 3 << 24)  # a big-endian file's version
    out["big_endian"] = (b, "version 50331648 is not supported")
    out["truncated"] = (good[: len(good) // 2], "past the end of the file")
    out["cut_header"] = (good[:20], "truncated file: the key/value count needs 8 bytes")
    b = bytearray(good)
    struct.pack_into("<Q", b, 8, 1 << 40)
    out["huge_tensor_count"] = (b, "tensor count 1099511627776")
    b = bytearray(good)
    struct.pack_into("<Q", b, 16, 1 << 60)
    out["huge_kv_count"] = (b, "key/value count")
    b = bytearray(good)
    struct.pack_into("<Q", b, 24, 1 << 50)  # the first key's length
    out["huge_string"] = (b, "a metadata key of 1125899906842624 bytes")
    b = bytearray(good)
    t0 = info_off(b)  # first tensor: token_embd.weight, 2 dims; its offset field follows the type
    name_len = struct.unpack_from("<Q", b, t0)[0]
    off_at = t0 + 8 + name_len + 4 + 16 + 4
    struct.pack_into("<Q", b, off_at, 1 << 20)
    out["offset_past_end"] = (b, "past the end of the file")
    b = bytearray(good)
    struct.pack_into("<I", b, off_at - 4, 12)  # Q4_K
    out["unknown_type"] = (b, "type 12 (Q4_K)")
    b = bytearray(good)
    struct.pack_into("<I", b, off_at - 4, 77)
    out["bad_type"] = (b, "type 77 (unknown)")
    out["missing_tensor"] = (tiny_bytes(tmp, tensors={"blk.0.ffn_down.weight": None}), "'blk.0.ffn_down.weight' is missing")
    out["shape_mismatch"] = (tiny_bytes(tmp, tensors={"blk.0.attn_k.weight": np.zeros((32, 16), np.float32)}),
                             "'blk.0.attn_k.weight'")
    out["nested_array"] = (tiny_bytes(tmp, {"general.tags": (gw.ARRAY, (gw.ARRAY, []))}), "array of arrays")
    out["nomic"] = (tiny_bytes(tmp, {"general.architecture": (gw.STRING, "nomic-bert")}),
                    "architecture 'nomic-bert' is not supported")
    out["no_vocab"] = (tiny_bytes(tmp, {"tokenizer.ggml.tokens": None}), "tokenizer.ggml.tokens")
    out["spm_vocab"] = (tiny_bytes(tmp, {"tokenizer.ggml.model": (gw.STRING, "llama")}),
                        "tokenizer model 'llama' is not supported")
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory, assets):
    model, vocab = assets[0], str(assets[1])
    work = tmp_path_factory.mktemp("gguf")
    repo = work / "repo"

    def folder(name, cfg=None):
        d = repo / name
        d.mkdir(parents=True)
        if cfg:
            (d / "config.yaml").write_text(to_yaml(cfg) + "\n")
        return d

    emb = {"normalize": True, "max_tokens": 128, "max_batch": 16}
    os.symlink(model, folder("onnx", dict(emb, tokenizer=vocab, pooling="mean")) / "model.onnx")
    os.symlink(model, folder("onnx_cls", dict(emb, tokenizer=vocab, pooling="cls")) / "model.onnx")
    for name, wt, pooling in (("g_f32", gw.T_F32, 1), ("g_f16", gw.T_F16, 1), ("g_bf16", gw.T_BF16, 1),
                              ("g_q8", gw.T_Q8_0, 1), ("g_cls", gw.T_F32, 2)):
        kvs, ts, ref = gw.bert_from_onnx(model, vocab, wt, pooling=pooling)
        gw.write(folder(name, emb) / "model.gguf", kvs, ts)
        if wt != gw.T_F32:  # the ONNX model of exactly the weights the reader must get back
            gw.onnx_with(model, ref, folder("ref_" + name, dict(emb, tokenizer=vocab, pooling="mean")) / "model.onnx")
    # config.yaml overrides the file's pooling
    os.symlink(repo / "g_cls" / "model.gguf", folder("g_cls_mean", dict(emb, pooling="mean")) / "model.gguf")
    (folder("tiny_ok", emb) / "model.gguf").write_bytes(bytes(tiny_bytes(work)))
    (folder("tiny_ctx", {"normalize": True}) / "model.gguf").write_bytes(bytes(tiny_bytes(work)))
    # token_types is optional (models with one token type may omit it)
    (folder("tiny_notypes", emb) / "model.gguf").write_bytes(bytes(tiny_bytes(work, tensors={"token_types.weight": None})))
    v2 = tiny_bytes(work)  # version 2 has version 3's layout (3 added big-endian support)
    struct.pack_into("<I", v2, 4, 2)
    (folder("tiny_v2", emb) / "model.gguf").write_bytes(bytes(v2))
    bad = malformed(work)
    for name, (data, _) in bad.items():
        (folder("bad_" + name, emb) / "model.gguf").write_bytes(bytes(data))
    srv = Server(work, ["--model-repository", str(repo)], 10)
    yield srv, repo, bad
    srv.stop()


def embed(srv, model, texts):
    r = requests.post(srv.url + "/v1/embeddings", json={"model": model, "input": texts}, timeout=120)
    assert r.status_code == 200, r.text
    doc = r.json()
    return np.array([d["embedding"] for d in doc["data"]], np.float64), doc["usage"]["prompt_tokens"]


def cosines(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_gguf_matches_onnx(setup):
    srv, repo, _ = setup
    ref, ntok = embed(srv, "onnx", TEXTS)
    assert ref.shape == (len(TEXTS), 384)
    pairs = [("g_f32", "onnx", 0.99999), ("g_f16", "ref_g_f16", 0.99999), ("g_bf16", "ref_g_bf16", 0.99999),
             ("g_q8", "ref_g_q8", 0.99999),
             ("g_q8", "onnx", 0.999), ("g_cls", "onnx_cls", 0.99999), ("g_cls_mean", "onnx", 0.99999)]
    worst = {}
    for g, o, bound in pairs:
        a, na = embed(srv, g, TEXTS)
        b, nb = embed(srv, o, TEXTS)
        assert na == nb == ntok, (g, na, nb, ntok)
        c = cosines(a, b)
        worst[(g, o)] = float(c.min())
        assert c.min() >= bound, (g, o, c)
    # F16 weights are not the F32 ones, and CLS pooling is not mean pooling: the pairs above compare
    # what they claim to
    assert cosines(embed(srv, "g_f16", TEXTS)[0], ref).min() < 0.9999999
    assert cosines(embed(srv, "g_cls", TEXTS)[0], ref).min() < 0.99
    print("worst cosines:", worst)


def test_gguf_token_ids(setup):
    _, repo, _ = setup

    def tokens(name):
        r = subprocess.run([str(MTSERVE), "embed", str(repo / name), "--tokens", *TEXTS], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.split("\n")

    want = tokens("onnx")
    assert tokens("g_q8") == want
    assert want[0].split()[:1] == ["101"] and want[2].split()[-1] == "102"
    # the tiny file's phantom-space vocabulary: "▁hello", "▁world", "s" (a continuation)
    r = subprocess.run([str(MTSERVE), "embed", str(repo / "tiny_ok"), "--tokens", "Hello worlds", "hello, you"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["2 5 6 7 3", "2 5 1 1 3"], r.stdout


def test_gguf_inspect(setup):
    _, repo, _ = setup
    r = subprocess.run([str(MTSERVE), "inspect", str(repo / "g_q8" / "model.gguf")], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "last_hidden_state" in r.stdout and "MatMul×48" in r.stdout and "producer mtserve-gguf" in r.stdout, \
        r.stdout


def test_malformed_gguf(setup):
    srv, _, bad = setup
    for name, (_, msg) in bad.items():
        r = requests.post(srv.url + "/v1/embeddings", json={"model": "bad_" + name, "input": ["hello"]}, timeout=60)
        assert r.status_code in (400, 500, 501, 503), (name, r.status_code, r.text)
        assert msg in r.text, (name, r.text)
        assert srv.alive()
    # still serving, the tiny file the malformed ones were made from included
    v, _ = embed(srv, "g_f32", ["still here"])
    assert v.shape == (1, 384)
    v, n = embed(srv, "tiny_ok", ["hello worlds"])
    assert v.shape == (1, 32) and n == 5 and np.isfinite(v).all()
    v2, _ = embed(srv, "tiny_v2", ["hello worlds"])
    assert np.array_equal(v, v2)
    v3, _ = embed(srv, "tiny_notypes", ["hello worlds"])
    assert v3.shape == (1, 32) and np.isfinite(v3).all() and not np.allclose(v, v3)
    # bert.context_length (16 positions) caps the tokens per text when config.yaml sets no max_tokens
    v4, n = embed(srv, "tiny_ctx", [" ".join(["hello"] * 40)])
    assert v4.shape == (1, 32) and n == 16
