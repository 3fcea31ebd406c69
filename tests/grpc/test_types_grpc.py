"""Element types over KServe v2 gRPC: a float16 export of the small CNN (FP16 only as raw
contents, as the KServe v2 protocol has no typed field for it), a double-precision model through
fp64_contents and raw contents, and a model with one uint16, int16, uint32, uint64 and bfloat16
input/output each (int_contents, uint_contents, uint64_contents, raw), checked against numpy;
model metadata and configuration report the declared types; malformed data (raw byte counts that
do not fit the datatype, FP16 in typed contents, out-of-range 16-bit values, BYTES for a numeric
input) gets
INVALID_ARGUMENT with a message. Models come from tests/models/make_test_models.py."""
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import code_of

ROOT = Path(__file__).resolve().parents[2]
TEST_MODELS = ROOT / "tests" / "models" / "out"
FP16_CNN = TEST_MODELS / "small_cnn_fp16.onnx"
CNN = TEST_MODELS / "small_cnn.onnx"
DOUBLE = TEST_MODELS / "double_model.onnx"
TYPES = TEST_MODELS / "types_model.onnx"

NP = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "INT16": np.int16, "UINT16": np.uint16,
      "UINT32": np.uint32, "UINT64": np.uint64, "BF16": np.uint16}


@pytest.fixture(scope="module", autouse=True)
def models():
    if not all(p.exists() for p in (FP16_CNN, CNN, DOUBLE, TYPES)):
        subprocess.run(["/usr/bin/python3", str(ROOT / "tests/models/make_test_models.py"), str(TEST_MODELS)],
                       check=True, stdout=subprocess.DEVNULL)


def bf16_bits(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def outputs(resp):
    assert len(resp.raw_output_contents) == len(resp.outputs)
    return {o.name: np.frombuffer(raw, dtype=NP[o.datatype]).reshape(list(o.shape))
            for o, raw in zip(resp.outputs, resp.raw_output_contents)}, [o.datatype for o in resp.outputs]


def serve(start_server, **models):
    return start_server({name: {"model_path": str(path), "max_batch": 4} for name, path in models.items()})


def test_fp16_raw_contents(start_server, pb):
    srv = serve(start_server, cnn16=FP16_CNN, cnn=CNN)
    stub = pb.ks_grpc.GRPCInferenceServiceStub(srv.channel)
    meta = stub.ModelMetadata(pb.ks.ModelMetadataRequest(name="cnn16"))
    assert [t.datatype for t in meta.inputs] == ["FP16"] and [t.datatype for t in meta.outputs] == ["FP16", "FP16"]
    cfg = stub.ModelConfig(pb.ks.ModelConfigRequest(name="cnn16"))
    assert pb.ks.DataType.Name(cfg.config.input[0].data_type) == "TYPE_FP16"

    x = np.random.default_rng(9).random((2, 3, 32, 32)).astype(np.float16)
    req = pb.ks.ModelInferRequest(model_name="cnn16")
    req.inputs.add(name="x", datatype="FP16", shape=[2, 3, 32, 32])
    req.raw_input_contents.append(x.tobytes())
    out, dts = outputs(stub.ModelInfer(req))
    assert dts == ["FP16", "FP16"]
    ref_req = pb.ks.ModelInferRequest(model_name="cnn")
    ref_req.inputs.add(name="x", datatype="FP32", shape=[2, 3, 32, 32])
    ref_req.raw_input_contents.append(x.astype(np.float32).tobytes())
    ref, _ = outputs(stub.ModelInfer(ref_req))
    for name in ("probs", "s2"):
        np.testing.assert_allclose(out[name].astype(np.float32), ref[name], atol=3e-3)

    # the byte count of FP32 data for an FP16 declaration
    bad = pb.ks.ModelInferRequest(model_name="cnn16")
    bad.inputs.add(name="x", datatype="FP16", shape=[1, 3, 32, 32])
    bad.raw_input_contents.append(bytes(3072 * 4))
    code, msg = code_of(lambda: stub.ModelInfer(bad))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "needs 6144" in msg, msg
    # FP16 has no typed contents field
    bad = pb.ks.ModelInferRequest(model_name="cnn16")
    t = bad.inputs.add(name="x", datatype="FP16", shape=[1, 3, 32, 32])
    t.contents.fp32_contents.extend([0.5] * 3072)
    code, msg = code_of(lambda: stub.ModelInfer(bad))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "raw_input_contents" in msg, msg


def test_double_typed_and_raw(start_server, pb):
    srv = serve(start_server, dbl=DOUBLE)
    stub = pb.ks_grpc.GRPCInferenceServiceStub(srv.channel)
    x = np.random.default_rng(2).standard_normal((3, 4)) * 1e3
    x[0, 0] = 1.0000000000000002
    w = np.array([1.5, -2.0, 0.25, 3.0])
    b = np.array([0.1, 0.2, -0.3, 1e-12])
    for raw in (False, True):
        req = pb.ks.ModelInferRequest(model_name="dbl")
        t = req.inputs.add(name="x", datatype="FP64", shape=[3, 4])
        if raw:
            req.raw_input_contents.append(x.tobytes())
        else:
            t.contents.fp64_contents.extend(x.ravel().tolist())
        out, dts = outputs(stub.ModelInfer(req))
        assert dts == ["FP64", "FP64"]
        np.testing.assert_array_equal(out["y"], np.maximum(x * w + b, 0))
        np.testing.assert_array_equal(out["z"], x - b)

    bad = pb.ks.ModelInferRequest(model_name="dbl")
    t = bad.inputs.add(name="x", datatype="FP64", shape=[1, 4])
    t.contents.fp64_contents.extend([1.0, 2.0, 3.0])
    code, msg = code_of(lambda: stub.ModelInfer(bad))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "fp64_contents has 3" in msg, msg
    bad = pb.ks.ModelInferRequest(model_name="dbl")
    t = bad.inputs.add(name="x", datatype="BYTES", shape=[1, 4])
    t.contents.bytes_contents.extend([b"a", b"b", b"c", b"d"])
    code, msg = code_of(lambda: stub.ModelInfer(bad))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "input 'x' holds strings (datatype BYTES)" in msg, msg


def test_integer_and_bf16_contents(start_server, pb):
    srv = serve(start_server, types=TYPES)
    stub = pb.ks_grpc.GRPCInferenceServiceStub(srv.channel)
    a = np.array([[0, 1, 40000], [65535, 7, 3]], np.uint16)
    b = np.array([[-32768, 5, 0], [32767, -2, 1]], np.int16)
    c = np.array([[0, 70000, 4294967295], [3, 65536, 2]], np.uint32)
    d = np.array([[0, 2**62, 2**64 - 1], [12345678901234, 1, 2**40]], np.uint64)
    eb = bf16_bits(np.array([[1.5, -3.25, 1e30], [0.1, 65504.0, -0.0]], np.float32))
    want = {"ua": a + a, "nb": -b, "uc": c * c, "ud": d + d, "be": bf16_bits(bf16_value(eb) * 2)}
    req = pb.ks.ModelInferRequest(model_name="types")
    for n, dt, arr in (("a", "UINT16", a), ("b", "INT16", b), ("c", "UINT32", c), ("d", "UINT64", d), ("e", "BF16", eb)):
        req.inputs.add(name=n, datatype=dt, shape=[2, 3])
        req.raw_input_contents.append(arr.tobytes())
    out, dts = outputs(stub.ModelInfer(req))
    assert dts == ["UINT16", "INT16", "UINT32", "UINT64", "BF16"]
    for k, v in want.items():
        np.testing.assert_array_equal(out[k], v, err_msg=k)

    # typed contents: int_contents (INT16), uint_contents (UINT16/32), uint64_contents are read;
    # BF16 has no typed field, so the request is refused at e with a pointer to raw contents
    req = pb.ks.ModelInferRequest(model_name="types")
    for n, dt, arr in (("a", "UINT16", a), ("b", "INT16", b), ("c", "UINT32", c), ("d", "UINT64", d), ("e", "BF16", eb)):
        t = req.inputs.add(name=n, datatype=dt, shape=[2, 3])
        if dt == "INT16":
            t.contents.int_contents.extend(arr.ravel().tolist())
        elif dt == "UINT64":
            t.contents.uint64_contents.extend([int(v) for v in arr.ravel()])
        else:
            t.contents.uint_contents.extend(arr.ravel().tolist())
    code, msg = code_of(lambda: stub.ModelInfer(req))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "input 'e'" in msg and "raw_input_contents" in msg, msg

    # 16-bit values beyond the type in 32-bit typed fields
    for dt, field, val in (("UINT16", "uint_contents", 70000), ("INT16", "int_contents", -40000)):
        req = pb.ks.ModelInferRequest(model_name="types")
        t = req.inputs.add(name="a" if dt == "UINT16" else "b", datatype=dt, shape=[1, 3])
        getattr(t.contents, field).extend([1, val, 2])
        code, msg = code_of(lambda: stub.ModelInfer(req))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "out of range" in msg, (dt, msg)
