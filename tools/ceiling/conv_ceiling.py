#!/usr/bin/env python3
"""The convolution ceiling models and a model's executed convolution work.

`conv_ceiling.py make DIR` writes convC_HW.onnx into DIR: chains of eight 3x3 convolutions
(stride 1, pad 1, C channels in and out, HW x HW, symbolic batch) for C/HW in 32/320, 64/160,
128/80, 256/40 -- the densest work a conv engine gets, whose GFLOP/s is the practical ceiling
of the machine for this kind of network.

`conv_ceiling.py work MODEL.onnx` prints two GFLOP-per-sample figures for a model's Conv and
ConvTranspose nodes (2 x multiply-adds, batch 1, shapes from ONNX shape inference): the nominal
count (what `mtserve inspect` reports) and the count mtserve executes, where a 3x3 stride-1 conv
reading a 2x nearest upsampling runs as four 2x2 convolutions on the low-resolution input
(16 taps instead of 4 x 9 per output 2x2 block: 4/9 of the nominal work, docs/engine.md).
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx import shape_inference


def make(out_dir):
    rng = np.random.default_rng(1)
    for c, hw in [(32, 320), (64, 160), (128, 80), (256, 40)]:
        inits, nodes, x = [], [], "x"
        for i in range(8):
            w = ((rng.random((c, c, 3, 3)) - 0.5) / np.sqrt(9 * c)).astype(np.float32)
            inits += [nh.from_array(w, f"w{i}"), nh.from_array(np.zeros(c, np.float32), f"b{i}")]
            y = "y" if i == 7 else f"y{i}"
            nodes.append(h.make_node("Conv", [x, f"w{i}", f"b{i}"], [y], pads=[1, 1, 1, 1]))
            x = y
        g = h.make_graph(nodes, "conv_chain", [h.make_tensor_value_info("x", T.FLOAT, ["N", c, hw, hw])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["N", c, hw, hw])], inits)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], producer_name="mtserve-ceiling")
        m.ir_version = 8
        onnx.save(m, f"{out_dir}/conv{c}_{hw}.onnx")
        print(f"{out_dir}/conv{c}_{hw}.onnx  {2 * 8 * c * c * 9 * hw * hw / 1e9:.3f} GFLOP/sample")


def work(path):
    m = onnx.load(path)
    for inp in m.graph.input:  # batch 1 for every symbolic dim
        for d in inp.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                d.dim_value = 1
    m = shape_inference.infer_shapes(m)
    shapes = {}
    for v in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        shapes[v.name] = [d.dim_value for d in v.type.tensor_type.shape.dim]
    inits = {i.name: list(i.dims) for i in m.graph.initializer}
    producer = {o: n for n in m.graph.node for o in n.output}
    nominal = executed = 0.0
    for n in m.graph.node:
        if n.op_type not in ("Conv", "ConvTranspose"):
            continue
        wd = inits.get(n.input[1]) or shapes.get(n.input[1])
        out = shapes.get(n.output[0])
        xin = shapes.get(n.input[0])
        if not wd or not out or not xin:
            continue
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        if n.op_type == "Conv":
            macs = float(np.prod(out)) * wd[1] * float(np.prod(wd[2:]))
        else:
            macs = float(np.prod(xin)) * wd[1] * float(np.prod(wd[2:]))
        nominal += 2 * macs
        p = producer.get(n.input[0])
        strides = next((list(a.ints) for a in n.attribute if a.name == "strides"), [1, 1])
        up = p is not None and p.op_type == "Resize" and \
            any(a.name == "mode" and a.s == b"nearest" for a in p.attribute) and \
            shapes.get(p.input[0]) and shapes[p.output[0]][2] == 2 * shapes[p.input[0]][2] and \
            shapes[p.output[0]][3] == 2 * shapes[p.input[0]][3]
        if n.op_type == "Conv" and up and wd[2:] == [3, 3] and strides == [1, 1] and group == 1:
            macs *= 4.0 / 9.0
        executed += 2 * macs
    print(f"nominal_gflop {nominal / 1e9:.4f}")
    print(f"executed_gflop {executed / 1e9:.4f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "work":
        work(sys.argv[2])
    else:
        sys.exit("usage: conv_ceiling.py make DIR | work MODEL.onnx")
