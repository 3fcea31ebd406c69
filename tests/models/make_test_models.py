#!/usr/bin/python3
"""Small fixed-seed models for the unit and concurrency tests (tests/unit): a CNN that touches
the main op families (Conv, depthwise Conv, BatchNormalization, Relu, MaxPool, Resize, Concat,
GlobalAveragePool, Gemm, Softmax) at 32x32, small enough to run hundreds of times under
ThreadSanitizer; and three recurrent models for tests/models/compare_ort.py (--models-dir OUTDIR):
rnn_lstm_bidir (bidirectional LSTM with sequence_lens, initial states and peepholes),
rnn_gru_batchwise (GRU, linear_before_reset=1, layout=1) and rnn_lstm_vad (two stacked LSTMs
on one 64-sample frame with their states as inputs and outputs, a voice-activity detector's
shape). Usage: make_test_models.py OUTDIR
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    inits = []

    def w(name, *shape, scale=0.3):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
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
    inits.append(numpy_helper.from_array(np.abs(rng.standard_normal(8)).astype(np.float32) + 0.5, "var"))
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    g = helper.make_graph(nodes, "small_cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10]),
                           helper.make_tensor_value_info("s2", TensorProto.FLOAT, ["N", 4, 32, 32])],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, os.path.join(out, "small_cnn.onnx"))
    recurrent_models(out)
    print("test models written to", out)


def recurrent_models(out):
    rng = np.random.default_rng(11)

    def arr(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def save(name, nodes, inputs, outputs, inits):
        g = helper.make_graph(nodes, name, inputs, outputs,
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        onnx.save(m, os.path.join(out, name + ".onnx"))

    def fvi(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    # Bidirectional LSTM, seq 10, batch 3, input 8, hidden 16: per-sequence lengths (one full,
    # one short, one of a single step), initial states, peepholes, bias.
    S, N, I, H = 10, 3, 8, 16
    inits = {"W": arr(2, 4 * H, I, scale=0.35), "R": arr(2, 4 * H, H, scale=0.2), "B": arr(2, 8 * H, scale=0.2),
             "lens": np.array([10, 6, 1], np.int32), "h0": arr(2, N, H, scale=0.5), "c0": arr(2, N, H, scale=0.5),
             "P": arr(2, 3 * H, scale=0.3)}
    save("rnn_lstm_bidir",
         [helper.make_node("LSTM", ["x", "W", "R", "B", "lens", "h0", "c0", "P"], ["y", "y_h", "y_c"],
                           hidden_size=H, direction="bidirectional")],
         [fvi("x", [S, N, I])], [fvi("y", [S, 2, N, H]), fvi("y_h", [2, N, H]), fvi("y_c", [2, N, H])], inits)

    # GRU with linear_before_reset=1 and layout=1 (batch-major): x [N, S, 12], hidden 20.
    I, H = 12, 20
    inits = {"W": arr(1, 3 * H, I, scale=0.3), "R": arr(1, 3 * H, H, scale=0.2), "B": arr(1, 6 * H, scale=0.2)}
    save("rnn_gru_batchwise",
         [helper.make_node("GRU", ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=H, linear_before_reset=1,
                           layout=1)],
         [fvi("x", ["N", "S", I])], [fvi("y", ["N", "S", 1, H]), fvi("y_h", ["N", 1, H])], inits)

    # Stacked LSTMs on one frame [1, 1, 64] -> hidden 64 -> hidden 64, states in and out.
    H = 64
    inits = {"axes": np.array([1], np.int64)}
    nodes, ins, outs = [], [fvi("x", [1, 1, 64])], []
    src = "x"
    for layer in (1, 2):
        w, r, b = "W%d" % layer, "R%d" % layer, "B%d" % layer
        inits[w], inits[r], inits[b] = arr(1, 4 * H, 64, scale=0.15), arr(1, 4 * H, H, scale=0.12), arr(1, 8 * H, scale=0.1)
        h, c = "h%d" % layer, "c%d" % layer
        ins += [fvi(h, [1, 1, H]), fvi(c, [1, 1, H])]
        y = "y%d" % layer
        nodes.append(helper.make_node("LSTM", [src, w, r, b, "", h, c], [y, h + "_out", c + "_out"], hidden_size=H))
        nodes.append(helper.make_node("Squeeze", [y, "axes"], [y + "_sq"]))
        outs += [fvi(h + "_out", [1, 1, H]), fvi(c + "_out", [1, 1, H])]
        src = y + "_sq"
    outs.insert(0, fvi(src, [1, 1, H]))
    save("rnn_lstm_vad", nodes, ins, outs, inits)


if __name__ == "__main__":
    main()
