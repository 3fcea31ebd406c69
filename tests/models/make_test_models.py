#!/usr/bin/python3
"""Small fixed-seed models for the unit and concurrency tests (tests/unit): a CNN that touches
the main op families (Conv, depthwise Conv, BatchNormalization, Relu, MaxPool, Resize, Concat,
GlobalAveragePool, Gemm, Softmax) at 32x32, small enough to run hundreds of times under
ThreadSanitizer; the same CNN exported in float16 (weights, inputs and outputs float16, the
Resize scales float as the spec requires); and a double-precision model (y = relu(x * w + b),
z = x - b) and a model with one uint16, int16, uint32, uint64 and bfloat16 input and output
each, for the element-type tests. Usage: make_test_models.py OUTDIR
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def small_cnn(half=False):
    """The small CNN; half=True: float16 weights, inputs and outputs."""
    rng = np.random.default_rng(7)
    ft = np.float16 if half else np.float32
    et = TensorProto.FLOAT16 if half else TensorProto.FLOAT
    inits = []

    def w(name, *shape, scale=0.3):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32).astype(ft), name))
        return name

    nodes = [
        helper.make_node("Conv", ["x", w("c1w", 8, 3, 3, 3), w("c1b", 8)], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", w("g", 8), w("b", 8), w("mu", 8), "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("Conv", ["r1", w("dw", 8, 1, 3, 3)], ["d1"], pads=[1, 1, 1, 1], group=8),
        helper.make_node("MaxPool", ["d1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Resize", ["p1", "", "scales"], ["u1"], mode="nearest"),
        helper.make_node("Concat", ["u1", "r1"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", w("c2w", 4, 16, 1, 1)], ["c2"]),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("GlobalAveragePool", ["s2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", w("fcw", 4, 10), w("fcb", 10)], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    inits.append(numpy_helper.from_array((np.abs(rng.standard_normal(8)).astype(np.float32) + 0.5).astype(ft), "var"))
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    g = helper.make_graph(nodes, "small_cnn_fp16" if half else "small_cnn",
                          [helper.make_tensor_value_info("x", et, ["N", 3, 32, 32])],
                          [helper.make_tensor_value_info("probs", et, ["N", 10]),
                           helper.make_tensor_value_info("s2", et, ["N", 4, 32, 32])],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def double_model():
    """x[N,4] double -> y = relu(x * w + b), z = x - b (both double)."""
    w = numpy_helper.from_array(np.array([1.5, -2.0, 0.25, 3.0], np.float64), "w")
    b = numpy_helper.from_array(np.array([0.1, 0.2, -0.3, 1e-12], np.float64), "b")
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"]), helper.make_node("Sub", ["x", "b"], ["z"])]
    g = helper.make_graph(nodes, "double_model", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 4]),
                           helper.make_tensor_value_info("z", TensorProto.DOUBLE, ["N", 4])], initializer=[w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def types_model():
    """One input and output of each remaining wire type: ua = a + a (uint16), nb = -b (int16),
    uc = c * c (uint32), ud = d + d (uint64), be = e * 2 (bfloat16, computed in float)."""
    two = helper.make_tensor("two", TensorProto.BFLOAT16, [1], [2.0])
    nodes = [helper.make_node("Add", ["a", "a"], ["ua"]), helper.make_node("Neg", ["b"], ["nb"]),
             helper.make_node("Mul", ["c", "c"], ["uc"]), helper.make_node("Add", ["d", "d"], ["ud"]),
             helper.make_node("Mul", ["e", "two"], ["be"])]
    io = [("a", "ua", TensorProto.UINT16), ("b", "nb", TensorProto.INT16), ("c", "uc", TensorProto.UINT32),
          ("d", "ud", TensorProto.UINT64), ("e", "be", TensorProto.BFLOAT16)]
    g = helper.make_graph(nodes, "types_model", [helper.make_tensor_value_info(i, t, ["N", 3]) for i, _, t in io],
                          [helper.make_tensor_value_info(o, t, ["N", 3]) for _, o, t in io], initializer=[two])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    onnx.save(small_cnn(), os.path.join(out, "small_cnn.onnx"))
    onnx.save(small_cnn(half=True), os.path.join(out, "small_cnn_fp16.onnx"))
    onnx.save(double_model(), os.path.join(out, "double_model.onnx"))
    onnx.save(types_model(), os.path.join(out, "types_model.onnx"))
    print("test models written to", out)


if __name__ == "__main__":
    main()
