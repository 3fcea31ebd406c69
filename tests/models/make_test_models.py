#!/usr/bin/python3
"""Small fixed-seed models for the unit and concurrency tests (tests/unit): a CNN that touches
the main op families (Conv, depthwise Conv, BatchNormalization, Relu, MaxPool, Resize, Concat,
GlobalAveragePool, Gemm, Softmax) at 32x32, small enough to run hundreds of times under
ThreadSanitizer; the same CNN exported in float16 (weights, inputs and outputs float16, the
Resize scales float as the spec requires); a double-precision model (y = relu(x * w + b),
z = x - b) and a model with one uint16, int16, uint32, uint64 and bfloat16 input and output
each, for the element-type tests; a QDQ-quantized CNN (qdq_cnn: uint8 activations, int8
per-channel weights) for the int8 kernels under concurrency; and control-flow models (cf_*.onnx: If branches reading
outer-scope values and initializers, an If chosen at plan time, a Loop carrying state with a scan
output and a nested If, a while-style Loop, a Scan) that tests/models/compare_ort.py checks
against ONNX Runtime:
    compare_ort.py --models-dir tests/models/out cf_if cf_if_const cf_loop cf_while cf_scan
and three recurrent models for compare_ort.py: rnn_lstm_bidir (bidirectional LSTM with
sequence_lens, initial states and peepholes), rnn_gru_batchwise (GRU, linear_before_reset=1,
layout=1) and rnn_lstm_vad (two stacked LSTMs on one 64-sample frame with their states as inputs
and outputs, a voice-activity detector's shape); and two small BERT-style encoders with an
attention mask for the padding-free tests (models/gen/minilm_like.py at 2 layers, hidden 64):
bert_mask_small, bert_mask_pooled with a second output pooled over the tokens in the graph, and
bert_mask_pooler with BERT's pooler_output (the first token, a dense layer and tanh).
Usage: make_test_models.py OUTDIR
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


def qdq_cnn():
    """A QDQ-quantized CNN as post-training static quantizers write it: uint8 activations
    (QuantizeLinear -> DequantizeLinear before each Conv), int8 weights with per-output-channel
    scales (DequantizeLinear, axis 0), float biases; a 3x3 Conv, a strided 3x3 Conv and a
    depthwise Conv, each quantized on output, then a float head (GlobalAveragePool, Flatten).
    Outputs: the pooled features and the strided Conv's (dequantized) activation map."""
    rng = np.random.default_rng(11)
    inits = []

    def t(name, arr):
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def qconv(x, name, cin, cout, group=1, **attrs):
        wf = rng.standard_normal((cout, cin // group, 3, 3)).astype(np.float32) * 0.3
        ws = (np.abs(wf).reshape(cout, -1).max(axis=1) / 127).astype(np.float32)
        wq = np.clip(np.round(wf / ws[:, None, None, None]), -127, 127).astype(np.int8)
        return [helper.make_node("DequantizeLinear", [t(name + "_wq", wq), t(name + "_ws", ws),
                                                      t(name + "_wz", np.zeros(cout, np.int8))], [name + "_w"], axis=0),
                helper.make_node("Conv", [x, name + "_w", t(name + "_b", rng.standard_normal(cout).astype(np.float32) * 0.1)],
                                 [name], pads=[1, 1, 1, 1], group=group, **attrs)]

    def qdq(x, name, scale):
        return [helper.make_node("QuantizeLinear", [x, t(name + "_s", np.array(scale, np.float32)),
                                                    t(name + "_z", np.array(0, np.uint8))], [name + "_q"]),
                helper.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name])]

    # each Conv's output is quantized to uint8 with zero point 0, which is its Relu (quantizers
    # drop the Relu so): the engine runs DequantizeLinear -> Conv -> QuantizeLinear as one int8
    # convolution
    nodes = (qdq("x", "a0", 1 / 255) + qconv("a0", "c1", 3, 8) + qdq("c1", "a1", 0.02)
             + qconv("a1", "c2", 8, 16, strides=[2, 2]) + qdq("c2", "r2", 0.03)
             + qconv("r2", "c3", 16, 16, group=16) + qdq("c3", "a3", 0.03)
             + [helper.make_node("GlobalAveragePool", ["a3"], ["gap"]), helper.make_node("Flatten", ["gap"], ["feat"])])
    g = helper.make_graph(nodes, "qdq_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
                          [helper.make_tensor_value_info("feat", TensorProto.FLOAT, ["N", 16]),
                           helper.make_tensor_value_info("r2", TensorProto.FLOAT, ["N", 16, 16, 16])], inits)
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
    onnx.save(qdq_cnn(), os.path.join(out, "qdq_cnn.onnx"))
    onnx.save(types_model(), os.path.join(out, "types_model.onnx"))
    control_flow_models(out, np.random.default_rng(7))
    recurrent_models(out)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "gen"))
    import minilm_like  # noqa: E402
    small = dict(vocab=1000, hidden=64, heads=2, ffn=128, layers=2)
    onnx.save(minilm_like.build(name="bert_mask_small", **small), os.path.join(out, "bert_mask_small.onnx"))
    onnx.save(minilm_like.build(name="bert_mask_pooled", pooled=True, **small),
              os.path.join(out, "bert_mask_pooled.onnx"))
    onnx.save(minilm_like.build(name="bert_mask_pooler", pooler=True, **small),
              os.path.join(out, "bert_mask_pooler.onnx"))
    print("test models written to", out)


def control_flow_models(out, rng):
    F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    def vi(name, t, shape):
        # shape None: two dimensions left symbolic (the checker wants a shape)
        if shape is None:
            shape = [name + "_d0", name + "_d1"]
        return helper.make_tensor_value_info(name, t, shape)

    def arr(name, a):
        return numpy_helper.from_array(np.asarray(a), name)

    def save(name, nodes, inputs, outputs, inits):
        g = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        onnx.save(m, os.path.join(out, name + ".onnx"))

    # cf_if: two Ifs on conditions computed at run time (one always true, one always false);
    # the branches read the outer input x and initializer W and have initializers of their own;
    # output z has a different shape in each branch (run-time shapes).
    W = rng.standard_normal(4).astype(np.float32)
    def branches(tag):
        then_g = helper.make_graph(
            [helper.make_node("Add", ["x", "W"], ["ty" + tag]),
             helper.make_node("Mul", ["x", "tw" + tag], ["tz" + tag])],
            "then" + tag, [], [vi("ty" + tag, F, None), vi("tz" + tag, F, None)],
            initializer=[arr("tw" + tag, rng.standard_normal(4).astype(np.float32))])
        else_g = helper.make_graph(
            [helper.make_node("Sub", ["x", "W"], ["ey" + tag]),
             helper.make_node("Concat", ["x", "x"], ["ez" + tag], axis=0)],
            "else" + tag, [], [vi("ey" + tag, F, None), vi("ez" + tag, F, None)])
        return then_g, else_g
    t1, e1 = branches("1")
    t2, e2 = branches("2")
    save("cf_if", [
        helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=0),
        helper.make_node("Greater", ["mean", "lo"], ["c1"]),
        helper.make_node("Less", ["mean", "lo"], ["c2"]),
        helper.make_node("If", ["c1"], ["y1", "z1"], then_branch=t1, else_branch=e1),
        helper.make_node("If", ["c2"], ["y2", "z2"], then_branch=t2, else_branch=e2),
    ], [vi("x", F, ["N", 4])],
        [vi("y1", F, None), vi("z1", F, None), vi("y2", F, None), vi("z2", F, None)],
        [arr("W", W), arr("lo", np.float32(-1.0))])

    # cf_if_const: the condition is an initializer, so the plan takes the else branch at plan
    # time with static shapes; the branch's MatMul reads the outer initializer Wm.
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["ty"])], "then", [], [vi("ty", F, None)])
    else_g = helper.make_graph([helper.make_node("MatMul", ["x", "Wm"], ["em"]),
                                helper.make_node("Add", ["em", "bias"], ["ey"])],
                               "else", [], [vi("ey", F, None)],
                               initializer=[arr("bias", rng.standard_normal(4).astype(np.float32))])
    save("cf_if_const", [
        helper.make_node("If", ["cond"], ["y0"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Sigmoid", ["y0"], ["y"]),
    ], [vi("x", F, ["N", 4])], [vi("y", F, ["N", 4])],
        [arr("cond", np.array(False)), arr("Wm", rng.standard_normal((4, 4)).astype(np.float32))])

    # cf_loop: M = 5 iterations, no condition input; carried h (initially x) goes through a
    # nested If (iteration < 2) whose branches read h, the outer x and W; a scan output stacks
    # the per-iteration row sums scaled by the iteration number.
    inner_then = helper.make_graph([helper.make_node("Mul", ["h_in", "W"], ["hw"]),
                                    helper.make_node("Tanh", ["hw"], ["it_y"])],
                                   "inner_then", [], [vi("it_y", F, None)])
    inner_else = helper.make_graph([helper.make_node("Sub", ["h_in", "x"], ["hx"]),
                                    helper.make_node("Sigmoid", ["hx"], ["ie_y"])],
                                   "inner_else", [], [vi("ie_y", F, None)])
    body = helper.make_graph([
        helper.make_node("Less", ["i", "two"], ["small"]),
        helper.make_node("If", ["small"], ["h_out"], then_branch=inner_then, else_branch=inner_else),
        helper.make_node("Cast", ["i"], ["i_f"], to=F),
        helper.make_node("ReduceSum", ["h_out", "ax1"], ["rs"], keepdims=0),
        helper.make_node("Mul", ["rs", "i_f"], ["scan"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
    ], "body", [vi("i", I64, []), vi("cond_in", B, []), vi("h_in", F, None)],
        [vi("cond_out", B, []), vi("h_out", F, None), vi("scan", F, None)],
        initializer=[arr("two", np.int64(2)), arr("ax1", np.array([1], np.int64))])
    save("cf_loop", [
        helper.make_node("Loop", ["M", "", "x"], ["h_final", "scans"], body=body),
    ], [vi("x", F, ["N", 4])], [vi("h_final", F, None), vi("scans", F, None)],
        [arr("W", W), arr("M", np.int64(5))])

    # cf_while: no trip count; the body's condition (counter < 3.5) ends the loop.
    body = helper.make_graph([
        helper.make_node("Add", ["c_in", "one"], ["c_out"]),
        helper.make_node("Less", ["c_out", "lim"], ["cond_out"]),
        helper.make_node("Mul", ["acc_in", "x"], ["acc_out"]),
    ], "body", [vi("i", I64, []), vi("cond_in", B, []), vi("c_in", F, []), vi("acc_in", F, None)],
        [vi("cond_out", B, []), vi("c_out", F, []), vi("acc_out", F, None)],
        initializer=[arr("one", np.float32(1)), arr("lim", np.float32(3.5))])
    save("cf_while", [
        helper.make_node("Loop", ["", "go", "c0", "x"], ["count", "pw"], body=body),
    ], [vi("x", F, ["N", 4])], [vi("count", F, []), vi("pw", F, None)],
        [arr("go", np.array(True)), arr("c0", np.float32(0))])

    # cf_scan: state s [2,3]; x [2,6,3] scanned along axis 1 in reverse, y [6] along axis 0;
    # the per-step output is stacked along axis 1.
    body = helper.make_graph([
        helper.make_node("Mul", ["xt", "Ws"], ["xw"]),
        helper.make_node("Add", ["s_in", "xw"], ["s1"]),
        helper.make_node("Add", ["s1", "yt"], ["s_out"]),
        helper.make_node("Tanh", ["s_out"], ["o"]),
    ], "body", [vi("s_in", F, [2, 3]), vi("xt", F, [2, 3]), vi("yt", F, [])],
        [vi("s_out", F, [2, 3]), vi("o", F, [2, 3])])
    save("cf_scan", [
        helper.make_node("Scan", ["s0", "x", "y"], ["s", "os"], body=body, num_scan_inputs=2,
                         scan_input_axes=[1, 0], scan_input_directions=[1, 0], scan_output_axes=[1]),
    ], [vi("x", F, [2, 6, 3]), vi("y", F, [6])], [vi("s", F, [2, 3]), vi("os", F, [2, 6, 3])],
        [arr("s0", np.zeros((2, 3), np.float32)), arr("Ws", rng.standard_normal(3).astype(np.float32))])


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
