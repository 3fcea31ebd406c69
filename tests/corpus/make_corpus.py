#!/usr/bin/python3
"""Writes the corpus of broken model files that tests/unit/test_corpus.c feeds to the loader.

Usage: make_corpus.py REAL_MODEL.onnx OUTDIR

It derives damaged copies of a real model (truncated at 16 points, randomly bit-flipped) and
hand-made files each breaking one rule (unknown op, missing input, cycle, unsupported type,
raw_data of the wrong size, external data missing/out of range/escaping the folder, ...).
OUTDIR/manifest.tsv lists, per file, when it must fail ("load", "run" or "any": may load, must
not crash) and a substring the error message must contain. Seeds are fixed, so the corpus is
the same on every machine.
"""
import os
import random
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def small_model(nodes, inputs, outputs, inits=(), ir=8, opset=17):
    g = helper.make_graph(nodes, "corpus", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir
    return m


def vi(name, dtype=TensorProto.FLOAT, shape=(1, 4)):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    manifest = []

    def put(name, data, phase, expect):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        manifest.append((name, phase, expect))

    def put_model(name, model, phase, expect):
        put(name, model.SerializeToString(), phase, expect)

    real = open(src, "rb").read()
    n = len(real)
    # 16 truncation points: a few tiny prefixes, then spread over the file.
    cuts = [1, 2, 7, 33, 200, 1000] + [n * k // 11 for k in range(1, 10)] + [n - 1]
    for i, c in enumerate(cuts):
        put("truncated_%02d.onnx" % i, real[:c], "load", "")
    rng = random.Random(1234)
    for i in range(24):
        b = bytearray(real)
        # Flip bits mostly in the structural part (the first KBs and the tail), some anywhere.
        for _ in range(rng.randint(1, 8)):
            region = rng.random()
            if region < 0.4:
                pos = rng.randrange(min(n, 4096))
            elif region < 0.7:
                pos = rng.randrange(max(0, n - 4096), n)
            else:
                pos = rng.randrange(n)
            b[pos] ^= 1 << rng.randrange(8)
        put("bitflip_%02d.onnx" % i, bytes(b), "any", "")
    put("empty.onnx", b"", "load", "empty")
    put("text.onnx", b"this is not an onnx model\n", "load", "")
    put("random.onnx", bytes(rng.randrange(256) for _ in range(4096)), "load", "")

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    put_model("unknown_op.onnx", small_model(
        [helper.make_node("FrobnicateTensor", ["x"], ["y"], name="frob_node")],
        [vi("x")], [vi("y")]), "load", "unsupported op 'FrobnicateTensor'")
    put_model("unknown_op_name.onnx", small_model(
        [helper.make_node("FrobnicateTensor", ["x"], ["y"], name="frob_node")],
        [vi("x")], [vi("y")]), "load", "frob_node")
    put_model("missing_input.onnx", small_model(
        [helper.make_node("MatMul", ["x", "no_such_tensor"], ["y"], name="mm")],
        [vi("x")], [vi("y")]), "load", "'no_such_tensor' is not a graph input")
    put_model("cycle.onnx", small_model(
        [helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
         helper.make_node("Relu", ["a"], ["b"], name="n2")],
        [vi("x")], [vi("a")]), "load", "cycle")
    put_model("complex_input.onnx", small_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [vi("x", TensorProto.COMPLEX64)], [vi("y", TensorProto.COMPLEX64)]), "load", "complex64")
    bad = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    bad.raw_data = bad.raw_data[:40]
    put_model("raw_size.onnx", small_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x")], [vi("y")], [bad]),
        "load", "bytes of data, expected 64")
    huge = TensorProto()
    huge.name = "w"
    huge.data_type = TensorProto.FLOAT
    huge.dims.extend([1 << 40, 1 << 40])
    put_model("huge_dims.onnx", small_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x")], [vi("y")], [huge]),
        "load", "'w'")
    for name, loc, extra, expect in [
            ("external_missing.onnx", "missing.bin", {}, "cannot open external data"),
            ("external_range.onnx", "weights.bin", {"offset": "4096"}, "outside"),
            ("external_escape.onnx", "../../../etc/passwd", {}, "relative path")]:
        t = TensorProto()
        t.name = "w"
        t.data_type = TensorProto.FLOAT
        t.dims.extend([4, 4])
        t.data_location = TensorProto.EXTERNAL
        for k, v in [("location", loc)] + list(extra.items()):
            e = t.external_data.add()
            e.key, e.value = k, v
        put_model(name, small_model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x")], [vi("y")], [t]), "load", expect)
    with open(os.path.join(out, "weights.bin"), "wb") as f:
        f.write(np.ones(16, np.float32).tobytes())
    put_model("ir_too_new.onnx", small_model(
        [helper.make_node("Relu", ["x"], ["y"])], [vi("x")], [vi("y")], ir=99), "load", "IR version 99")
    put_model("opset_too_new.onnx", small_model(
        [helper.make_node("Relu", ["x"], ["y"])], [vi("x")], [vi("y")], opset=99), "load", "opset 99")
    put_model("duplicate_output.onnx", small_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r1"), helper.make_node("Relu", ["x"], ["y"], name="r2")],
        [vi("x")], [vi("y")]), "load", "already defined")
    put_model("undefined_output.onnx", small_model(
        [helper.make_node("Relu", ["x"], ["y"])], [vi("x")], [vi("y"), vi("zzz")]), "load", "'zzz' is not produced")
    put_model("rank9.onnx", small_model(
        [helper.make_node("Relu", ["x"], ["y"])], [vi("x", shape=[1] * 9)], [vi("y", shape=[1] * 9)]), "load", "rank")
    ir_only = onnx.ModelProto()
    ir_only.ir_version = 8
    put("no_graph.onnx", ir_only.SerializeToString(), "load", "no graph")
    shape = numpy_helper.from_array(np.array([3, 5], np.int64), "shape")
    put_model("reshape_mismatch.onnx", small_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="bad_reshape")],
        [vi("x")], [vi("y", shape=(3, 5))], [shape]), "run", "bad_reshape")
    put_model("matmul_mismatch.onnx", small_model(
        [helper.make_node("MatMul", ["x", "w3"], ["y"], name="bad_matmul")],
        [vi("x")], [vi("y")], [numpy_helper.from_array(np.ones((3, 4), np.float32), "w3")]), "run", "bad_matmul")

    with open(os.path.join(out, "manifest.tsv"), "w") as f:
        for name, phase, expect in manifest:
            f.write("%s\t%s\t%s\n" % (name, phase, expect))
    print("corpus: %d files in %s" % (len(manifest), out))


if __name__ == "__main__":
    main()
