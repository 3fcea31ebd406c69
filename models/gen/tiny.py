"""Tiny serving-test model generator (tiny.onnx).

Input `x` float N x 16, output `y` float N x 16: y = Relu(x W^T + b), a single
Gemm (transB=1) followed by Relu. Small enough to check against numpy by hand.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import FLOAT, GraphBuilder  # noqa: E402

DIM = 16


def build():
    g = GraphBuilder("tiny", seed=6001)
    x = g.input("x", FLOAT, ["N", DIM])
    w = g.init("fc.weight", g.randn((DIM, DIM), 0.25))
    b = g.init("fc.bias", g.randn((DIM,), 0.1))
    h = g.node("Gemm", [x, w, b], name="fc", transB=1)
    g.node("Relu", [h], name="relu", outputs=["y"])
    g.output("y", FLOAT, ["N", DIM])
    return g.model("tiny Gemm + Relu serving test model")


def models():
    return {"tiny.onnx": build}


if __name__ == "__main__":
    import onnx
    onnx.save(build(), os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "tiny.onnx"))
