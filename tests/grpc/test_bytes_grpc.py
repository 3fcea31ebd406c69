"""String model inputs and outputs as KServe v2 BYTES over gRPC (Debian's python3-grpcio with the
stubs conftest.py generates): models with ONNX string graph inputs/outputs
(tests/models/string_models.py) report BYTES in ModelMetadata (TYPE_STRING, max_batch_size 0 in
ModelConfig), take strings in contents.bytes_contents and in raw_input_contents (4-byte
little-endian length-prefixed), in ModelInfer and ModelStreamInfer, and return them in
raw_output_contents in the same length-prefixed form; results are checked against ONNX Runtime
(tools/ort/ort_strings.js). Hostile data gets INVALID_ARGUMENT naming the tensor and the problem,
a message over the size cap RESOURCE_EXHAUSTED."""
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import code_of

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "models"))
import string_models  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return string_models.all_paths(tmp_path_factory.mktemp("string_models"))


ort, pack, unpack = string_models.ort, string_models.pack, string_models.unpack


def outputs(resp):
    """{name: (datatype, shape, value)}: BYTES as a list of bytes, FP32 as an ndarray."""
    assert len(resp.raw_output_contents) == len(resp.outputs)
    return {o.name: (o.datatype, list(o.shape),
                     unpack(raw) if o.datatype == "BYTES" else np.frombuffer(raw, np.float32).reshape(list(o.shape)))
            for o, raw in zip(resp.outputs, resp.raw_output_contents)}


def request(pb, model, inputs, raw):
    """inputs: [(name, datatype, shape, values)]; BYTES values are str/bytes, FP32 floats."""
    req = pb.ks.ModelInferRequest(model_name=model)
    for name, dt, shape, vals in inputs:
        t = req.inputs.add(name=name, datatype=dt, shape=list(shape))
        if dt == "BYTES":
            vals = [v.encode() if isinstance(v, str) else v for v in vals]
            if raw:
                req.raw_input_contents.append(pack(vals))
            else:
                t.contents.bytes_contents.extend(vals)
        elif raw:
            req.raw_input_contents.append(np.asarray(vals, np.float32).tobytes())
        else:
            t.contents.fp32_contents.extend(vals)
    return req


def test_bytes_over_grpc(start_server, pb, models):
    srv = start_server({k: {"model_path": str(models[k]), "max_batch": 4} for k in ("strnorm", "f2s", "s2f", "mix")},
                       server={"max_message_size_mb": 1})
    stub = pb.ks_grpc.GRPCInferenceServiceStub(srv.channel)
    meta = stub.ModelMetadata(pb.ks.ModelMetadataRequest(name="mix"))
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("s", "BYTES", [-1, -1]), ("x", "FP32", [-1])]
    assert [(t.name, t.datatype) for t in meta.outputs] == [("y", "BYTES"), ("z", "FP32")]
    cfg = stub.ModelConfig(pb.ks.ModelConfigRequest(name="mix")).config
    assert cfg.max_batch_size == 0
    assert [pb.ks.DataType.Name(t.data_type) for t in cfg.input] == ["TYPE_STRING", "TYPE_FP32"]

    texts = ["Hello", "THE", "quick", "A", "Brown", "fox"]
    dims, want = ort(models["strnorm_oracle"], {"s": ("string", [len(texts)], texts)})["y"]
    for raw in (False, True):
        out = outputs(stub.ModelInfer(request(pb, "strnorm", [("s", "BYTES", [len(texts)], texts)], raw)))
        assert out["y"] == ("BYTES", dims, [w.encode() for w in want]), (raw, out)

    s = ["1.5", "-2", "1e3", "  7", "nan", "-INF"]
    dims, want = ort(models["s2f"], {"s": ("string", [3, 2], s)})["y"]
    want = np.array([float(v) for v in want], np.float32).reshape(dims)
    for raw in (False, True):
        out = outputs(stub.ModelInfer(request(pb, "s2f", [("s", "BYTES", [3, 2], s)], raw)))
        np.testing.assert_array_equal(out["y"][2], want)

    x = [1.5, -2.0, 0.1, 100.0, 1e20, 3.25]
    dims, want = ort(models["f2s"], {"x": ("float32", [2, 3], x)})["y"]
    out = outputs(stub.ModelInfer(request(pb, "f2s", [("x", "FP32", [2, 3], x)], False)))
    assert out["y"][:2] == ("BYTES", dims)
    assert [float(v) for v in out["y"][2]] == [float(v) for v in want]

    raw_strs = [b"\xff\x00bin", b"", "\u00e9".encode(), b"q" * 5000]
    for raw in (False, True):
        out = outputs(stub.ModelInfer(request(pb, "mix", [("s", "BYTES", [2, 2], raw_strs), ("x", "FP32", [2], [3, 4])],
                                              raw)))
        assert out["y"] == ("BYTES", [2, 2], raw_strs)
        np.testing.assert_array_equal(out["z"][2], np.array([6, 8], np.float32))

    # ModelStreamInfer: responses in order, each with its own strings
    reqs = [request(pb, "mix", [("s", "BYTES", [1, i + 1], [f"s{i}-{k}" for k in range(i + 1)]),
                                ("x", "FP32", [1], [float(i)])], i % 2 == 0) for i in range(6)]
    got = [outputs(r.infer_response) for r in stub.ModelStreamInfer(iter(reqs))]
    assert [g["y"][2] for g in got] == [[f"s{i}-{k}".encode() for k in range(i + 1)] for i in range(6)]

    bad = [
        (request(pb, "mix", [("s", "BYTES", [2, 2], ["a", "b", "c"]), ("x", "FP32", [2], [1, 2])], False),
         "input 's': contents.bytes_contents has 3 values, shape [2,2] of BYTES needs 4"),
        (request(pb, "mix", [("s", "BYTES", [2, 2], ["ab", "cd", "ef"]), ("x", "FP32", [2], [1, 2])], True),
         "input 's': raw_input_contents[0] holds 3 strings, shape [2,2] of BYTES needs 4"),
        (request(pb, "mix", [("s", "BYTES", [2, 1], ["a", "b"]), ("x", "BYTES", [2], ["1", "2"])], False),
         "input 'x' holds strings (datatype BYTES), the model expects float"),
        (request(pb, "s2f", [("s", "FP32", [1, 2], [1.0, 2.0])], False),
         "input 's' holds numbers, the model expects strings (datatype BYTES)"),
        (request(pb, "s2f", [("s", "FP32", [1, 2], [1.0, 2.0])], True),
         "input 's' holds numbers, the model expects strings (datatype BYTES)"),
    ]
    req = request(pb, "mix", [("s", "BYTES", [2, 1], ["a", "b"]), ("x", "FP32", [2], [1, 2])], True)
    req.raw_input_contents[0] = pack(["ab"]) + (50).to_bytes(4, "little") + b"xy"
    bad.append((req, "input 's': raw_input_contents[0]: BYTES element 1 at byte 6: length 50 runs past the end"))
    req = request(pb, "mix", [("s", "BYTES", [4000, 1], ["a", "b"]), ("x", "FP32", [2], [1, 2])], True)
    bad.append((req, "input 's': raw_input_contents[0] has 10 bytes, too few for the 4000 length-prefixed strings"))
    for req, words in bad:
        code, msg = code_of(lambda: stub.ModelInfer(req))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and words in msg, (words, code, msg)
    # a message over the size cap (server.max_message_size_mb: 1)
    req = request(pb, "mix", [("s", "BYTES", [1100, 1], ["q" * 1000] * 1100), ("x", "FP32", [1100], [0.0] * 1100)],
                  True)
    code, msg = code_of(lambda: stub.ModelInfer(req))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, msg)
    out = outputs(stub.ModelInfer(request(pb, "mix", [("s", "BYTES", [1, 1], ["ok"]), ("x", "FP32", [1], [1])], False)))
    assert out["y"][2] == [b"ok"]
