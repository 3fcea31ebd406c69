"""String model inputs and outputs as KServe v2 BYTES over HTTP: models with ONNX string graph
inputs/outputs (tests/models/string_models.py: StringNormalizer, Cast float->string, Cast
string->float, a string Identity beside a float output) load, report BYTES in their metadata
(TYPE_STRING and max_batch_size 0 in their configuration: they run unbatched), take BYTES as JSON
strings and in the binary tensor extension (4-byte little-endian length-prefixed strings) and
return them in the form asked for; results are checked against ONNX Runtime
(tools/ort/ort_strings.js). Strings that are not UTF-8 come back in binary and are refused as
JSON. Hostile or mismatched data (element counts against the shape, length prefixes past the
end, BYTES for a numeric input and numbers for a string input, a body over the size cap) gets a
4xx naming the tensor and the problem."""
import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "models"))
import string_models  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return string_models.all_paths(tmp_path_factory.mktemp("string_models"))


ort, pack, unpack = string_models.ort, string_models.pack, string_models.unpack



def binary_request(inputs, parameters=None, outputs=None):
    """inputs: [(name, datatype, shape, bytes)] -> (body, headers) of the binary extension."""
    head = {"inputs": [{"name": n, "datatype": dt, "shape": list(shape), "parameters": {"binary_data_size": len(b)}}
                       for n, dt, shape, b in inputs]}
    if parameters:
        head["parameters"] = parameters
    if outputs:
        head["outputs"] = outputs
    js = json.dumps(head).encode()
    return js + b"".join(b for *_, b in inputs), {"Inference-Header-Content-Length": str(len(js)),
                                                 "Content-Type": "application/octet-stream"}


def response(r):
    """{name: (datatype, shape, value)}: BYTES as a list of bytes, numbers as an ndarray."""
    assert r.status_code == 200, r.text
    hcl = r.headers.get("Inference-Header-Content-Length")
    head = json.loads(r.content[:int(hcl)] if hcl else r.content)
    rest, off, out = (r.content[int(hcl):] if hcl else b""), 0, {}
    for o in head["outputs"]:
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            raw = rest[off:off + size]
            off += size
            val = unpack(raw) if o["datatype"] == "BYTES" else np.frombuffer(raw, np.float32).reshape(o["shape"])
        elif o["datatype"] == "BYTES":
            val = [s.encode() for s in o["data"]]
        else:
            val = np.array([np.nan if v is None else v for v in o["data"]], np.float32).reshape(o["shape"])
        out[o["name"]] = (o["datatype"], o["shape"], val)
    assert off == len(rest)
    return out, head


def error_of(r):
    return r.json().get("error", "")


def test_string_models_json_binary_and_metadata(start_server, models):
    srv = start_server({k: models[k] for k in ("strnorm", "f2s", "s2f", "mix")})

    meta = srv.get("/v2/models/mix").json()
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [("s", "BYTES", [-1, -1]),
                                                                               ("x", "FP32", [-1])]
    assert [(t["name"], t["datatype"]) for t in meta["outputs"]] == [("y", "BYTES"), ("z", "FP32")]
    cfg = srv.get("/v2/models/mix/config").json()
    assert cfg["max_batch_size"] == 0, cfg
    assert [(t["data_type"], t["dims"]) for t in cfg["input"]] == [("TYPE_STRING", [-1, -1]), ("TYPE_FP32", [-1])]

    # StringNormalizer: JSON in and out, then binary in and out, against ONNX Runtime
    for texts in (["Hello", "THE", "quick", "A", "Brown", "fox", "the end"], ["The", "a", "THE"]):
        want_dims, want = ort(models["strnorm_oracle"], {"s": ("string", [len(texts)], texts)})["y"]
        r = srv.infer("strnorm", {"inputs": [{"name": "s", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]})
        out, _ = response(r)
        assert out["y"] == ("BYTES", want_dims, [w.encode() for w in want]), (out, want)
        body, headers = binary_request([("s", "BYTES", [len(texts)], pack(texts))],
                                       parameters={"binary_data_output": True})
        out, _ = response(srv.infer("strnorm", body, headers=headers))
        assert out["y"] == ("BYTES", want_dims, [w.encode() for w in want])
    assert want_dims == [1] and want == [""]  # every word a stopword: one empty string, as ORT does

    # Cast float -> string. The engine writes numpy's str() (ONNX's test data: "100.0"), ONNX
    # Runtime the shortest form ("100"): the same numbers, compared as such, and the same text
    # where neither is a whole number.
    x = [1.5, -2.0, 0.1, 100.0, 1e20, 3.25, -0.0078125, 123456.789, 7.0]
    r = srv.infer("f2s", {"inputs": [{"name": "x", "shape": [3, 3], "datatype": "FP32", "data": x}]})
    out, _ = response(r)
    dims, want = ort(models["f2s"], {"x": ("float32", [3, 3], x)})["y"]
    assert out["y"][:2] == ("BYTES", dims)
    for got, w in zip(out["y"][2], want):
        assert float(got) == float(w), (got, w)
        if not float(w).is_integer():
            assert got.decode() == w, (got, w)

    # Cast string -> float, JSON (nested rows) and binary in, JSON and binary out
    s = ["1.5", "-2", "1e3", "  7", "nan", "-INF"]
    dims, want = ort(models["s2f"], {"s": ("string", [3, 2], s)})["y"]
    want = np.array([float(v) for v in want], np.float32).reshape(dims)
    r = srv.infer("s2f", {"inputs": [{"name": "s", "shape": [3, 2], "datatype": "BYTES",
                                      "data": [s[0:2], s[2:4], s[4:6]]}]})
    out, _ = response(r)
    np.testing.assert_array_equal(out["y"][2][:2], want[:2])  # JSON writes NaN and inf as null
    body, headers = binary_request([("s", "BYTES", [3, 2], pack(s))], parameters={"binary_data_output": True})
    out, _ = response(srv.infer("s2f", body, headers=headers))
    np.testing.assert_array_equal(out["y"][2], want)
    r = srv.infer("s2f", {"inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES", "data": ["1", "one"]}]})
    assert r.status_code == 400 and "'one'" in error_of(r) and "not a number" in error_of(r), r.text

    # Identity of arbitrary bytes beside a float output: binary carries any bytes; per-output choice
    raw = [b"plain", b"", b"\xff\xfe not utf-8", "caf\u00e9 \u65e5\u672c".encode(), b"nul\x00inside", b"z" * 3000]
    xs = np.array([1.0, -2.5, 4.0], np.float32)
    body, headers = binary_request([("s", "BYTES", [3, 2], pack(raw)), ("x", "FP32", [3], xs.tobytes())],
                                   outputs=[{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}])
    out, head = response(srv.infer("mix", body, headers=headers))
    assert out["y"] == ("BYTES", [3, 2], raw)
    assert out["z"][0] == "FP32" and "data" in head["outputs"][1]
    np.testing.assert_array_equal(out["z"][2], xs + xs)
    # the same strings asked for as JSON: refused, naming the output and the string
    body, headers = binary_request([("s", "BYTES", [3, 2], pack(raw)), ("x", "FP32", [3], xs.tobytes())])
    r = srv.infer("mix", body, headers=headers)
    assert r.status_code == 400 and "output 'y': string 2 is not valid UTF-8" in error_of(r), r.text
    # JSON strings with escapes and a NUL come back as sent
    texts = ["tab\there", "quote\"", "nul\u0000", "\u00e9\U0001F600", "", "x"]
    r = srv.infer("mix", {"inputs": [{"name": "s", "shape": [2, 3], "datatype": "BYTES", "data": texts},
                                     {"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]})
    out, _ = response(r)
    assert out["y"] == ("BYTES", [2, 3], [t.encode() for t in texts])

    # concurrent string requests: each runs alone (batch_size 1) and gets its own strings back
    results, errors = {}, []

    def one(i):
        try:
            strs = [f"req{i}-{k}" for k in range(i + 1)]
            rr = requests.post(f"{srv.url}/v2/models/mix/infer", timeout=30, json={"inputs": [
                {"name": "s", "shape": [1, i + 1], "datatype": "BYTES", "data": strs},
                {"name": "x", "shape": [1], "datatype": "FP32", "data": [i]}]})
            o, h = response(rr)
            results[i] = (o["y"][2] == [s.encode() for s in strs], float(o["z"][2][0]), h["parameters"]["batch_size"])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == {i: (True, 2.0 * i, 1) for i in range(12)}


def test_bytes_hostile_input(start_server, models):
    srv = start_server({"mix": models["mix"], "s2f": models["s2f"]}, config={"server": {"max_message_size_mb": 1}})
    xs = {"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}

    def js(s_shape, s_data, x=xs, s_dt="BYTES"):
        return srv.infer("mix", {"inputs": [{"name": "s", "shape": s_shape, "datatype": s_dt, "data": s_data}, x]})

    def binary(shape, blob, x=xs):
        body, headers = binary_request([("s", "BYTES", shape, blob)])
        head_len = int(headers["Inference-Header-Content-Length"])
        head = json.loads(body[:head_len])
        head["inputs"].append(x)
        hj = json.dumps(head).encode()
        return srv.infer("mix", hj + body[head_len:], headers={"Inference-Header-Content-Length": str(len(hj))})

    cases = [
        (js([2, 2], ["a", "b", "c"]), "input 's': data has 3 strings, shape [2,2] of BYTES needs 4"),
        (js([2, 1], ["a", 5]), "input 's': data element 1 is number; BYTES data must be strings"),
        (js([1 << 40, 1], ["a"]), "input 's': shape [1099511627776,1] of BYTES holds more than 16777216 strings"),
        (binary([2, 1], pack(["ab"]) + (100).to_bytes(4, "little") + b"xyz"),
         "input 's': the binary data: BYTES element 1 at byte 6: length 100 runs past the end of the data"),
        (binary([2, 1], pack(["ab", "c", "d", "e"])),
         "input 's': the binary data holds more than 3 strings, shape [2,1] of BYTES needs 2"),
        (binary([2, 1], pack(["ab"]) + b"\x01\x00"),
         "input 's': the binary data: BYTES element 1 at byte 6: truncated length prefix (2 bytes left)"),
        (binary([2, 2], pack(["ab", "c", "d"])), "input 's': the binary data holds 3 strings, shape [2,2] of BYTES needs 4"),
        (binary([100000, 1], pack(["ab", "c"])),
         "input 's': the binary data has 11 bytes, too few for the 100000 length-prefixed strings"),
        # BYTES for a numeric input, numbers for a string input
        (js([2, 1], ["a", "b"], x={"name": "x", "shape": [2], "datatype": "BYTES", "data": ["1", "2"]}),
         "input 'x' holds strings (datatype BYTES), the model expects float"),
        (js([2, 1], [1.0, 2.0], s_dt="FP32"), "input 's' holds numbers, the model expects strings (datatype BYTES)"),
    ]
    for r, words in cases:
        assert r.status_code == 400 and words in error_of(r), (words, r.status_code, r.text)
    r = srv.infer("s2f", {"inputs": [{"name": "s", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
    assert r.status_code == 400 and "input 's' holds numbers, the model expects strings" in error_of(r), r.text
    # the request cap (server.max_message_size_mb) bounds what BYTES can make the server hold
    big = pack(["q" * 1000] * 1100)
    r = binary([1100, 1], big)
    assert r.status_code == 413, r.text
    # the server still answers
    out, _ = response(js([2, 1], ["ok", "fine"]))
    assert out["y"][2] == [b"ok", b"fine"]


def test_sequence_io_still_refused(start_server, tmp_path, models):
    """A model whose graph output is a sequence is refused at load with the reason; string models load."""
    import onnx
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("SequenceConstruct", ["x", "x"], ["q"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_sequence_value_info("q", TensorProto.FLOAT, None)])
    seqm = tmp_path / "seqout.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(seqm))
    srv = start_server({"seqout": seqm, "s2f": models["s2f"]})
    r = srv.infer("seqout", {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]})
    assert r.status_code == 503 and "graph output 'q' is a sequence" in error_of(r), r.text
    r = srv.infer("s2f", {"inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES", "data": ["0.5", "2"]}]})
    out, _ = response(r)
    np.testing.assert_array_equal(out["y"][2], np.array([[0.5, 2]], np.float32))
