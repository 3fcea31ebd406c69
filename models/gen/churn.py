"""Many small models for the model-churn benchmark (scripts/bench-churn.sh).

Writes COUNT models churn_0000.onnx ... into OUTDIR: four small architectures x seeds, all
with the same signature (input `x` float [N, 64], output `y` float [N, 64]) so one request
body fits every model, and widths drawn per seed so files range from under 1 KB to 1.3 MB:

  mlp     Gemm(64->H) Relu Gemm(H->64)                 H in 16..512
  resmlp  x + Gemm(Relu(Gemm(x)))                      H in 16..512
  gated   Gemm(Sigmoid(Gemm(x)) * Tanh(Gemm(x)))       H in 16..256
  conv    Reshape [N,1,8,8], Conv3x3(1->C) Relu Conv3x3(C->1), Reshape [N,64]   C in 4..64
  deep    Gemm(64->512) Relu Gemm(512->512) Relu Gemm(512->64)  (every 16th model, ~1.3 MB)

Usage: /usr/bin/python3 models/gen/churn.py OUTDIR [COUNT]   (default 1000; about 5 s)
A stamp file records COUNT and this file's hash; existing output is reused when it matches.
"""
import hashlib
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

D = 64
OPSET = 17


def _w(rng, shape, fan_in):
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def build(idx):
    rng = np.random.default_rng(10007 + idx)
    arch = "deep" if idx % 16 == 15 else ("mlp", "resmlp", "gated", "conv")[idx % 4]
    inits, nodes = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def gemm(x, n_in, n_out, name):
        w = init(name + ".w", _w(rng, (n_out, n_in), n_in))
        b = init(name + ".b", (rng.standard_normal(n_out) * 0.05).astype(np.float32))
        return node("Gemm", [x, w, b], name, transB=1)

    if arch in ("mlp", "resmlp", "gated"):
        h = int(2 ** rng.integers(4, 10 if arch != "gated" else 9))  # 16..512 (gated 16..256)
        if arch == "mlp":
            y = gemm(node("Relu", [gemm("x", D, h, "fc1")], "relu"), h, D, "y")
        elif arch == "resmlp":
            t = gemm(node("Relu", [gemm("x", D, h, "fc1")], "relu"), h, D, "fc2")
            y = node("Add", ["x", t], "y")
        else:
            g = node("Sigmoid", [gemm("x", D, h, "gate")], "sig")
            v = node("Tanh", [gemm("x", D, h, "val")], "tanh")
            y = gemm(node("Mul", [g, v], "mul"), h, D, "y")
        desc = "%s H=%d" % (arch, h)
    elif arch == "conv":
        c = int(2 ** rng.integers(2, 7))  # 4..64
        s4 = init("shape4", np.array([-1, 1, 8, 8], dtype=np.int64))
        s2 = init("shape2", np.array([-1, D], dtype=np.int64))
        t = node("Reshape", ["x", s4], "img")
        w1 = init("conv1.w", _w(rng, (c, 1, 3, 3), 9))
        b1 = init("conv1.b", np.zeros(c, dtype=np.float32))
        t = node("Relu", [node("Conv", [t, w1, b1], "conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1])], "relu")
        w2 = init("conv2.w", _w(rng, (1, c, 3, 3), 9 * c))
        b2 = init("conv2.b", np.zeros(1, dtype=np.float32))
        t = node("Conv", [t, w2, b2], "conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        y = node("Reshape", [t, s2], "y")
        desc = "conv C=%d" % c
    else:
        t = node("Relu", [gemm("x", D, 512, "fc1")], "relu1")
        t = node("Relu", [gemm(t, 512, 512, "fc2")], "relu2")
        y = gemm(t, 512, D, "y")
        desc = "deep 512"
    assert y == "y"
    graph = helper.make_graph(nodes, "churn_%04d" % idx,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", D])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                          producer_name="mtserve-models-gen", producer_version="1")
    m.ir_version = 8
    m.doc_string = "churn benchmark model %d: %s" % (idx, desc)
    return m


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "models/out/churn"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    os.makedirs(out, exist_ok=True)
    with open(__file__, "rb") as f:
        stamp = "%d %s\n" % (count, hashlib.sha256(f.read()).hexdigest())
    stamp_path = os.path.join(out, "churn.stamp")
    if os.path.exists(stamp_path) and open(stamp_path).read() == stamp:
        return
    total = 0
    for i in range(count):
        m = build(i)
        if i < 5:
            onnx.checker.check_model(m)  # the architectures, once each
        data = m.SerializeToString()
        total += len(data)
        with open(os.path.join(out, "churn_%04d.onnx" % i), "wb") as f:
            f.write(data)
    with open(stamp_path, "w") as f:
        f.write(stamp)
    print("churn.py: %d models, %.1f MB in %s" % (count, total / 1e6, out), file=sys.stderr)


if __name__ == "__main__":
    main()
