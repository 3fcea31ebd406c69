#!/usr/bin/python3
"""Micro benchmark of the recurrent kernels: mtserve vs ONNX Runtime on LSTM models.

Writes small LSTM models into a temporary folder (random weights scaled like a trained
network's) and times each with `mtserve run --json` and tools/ort/ort_bench.js at batch 1 on
one thread (--threads to change), printing median milliseconds and the ratio ORT / mtserve
(above 1: mtserve is faster). Cases: a voice-activity detector's LSTM (one [1,1,64] frame,
hidden 64), two such layers stacked, a sequence of 100 steps with hidden 256, and the same
bidirectional. Runs in well under a minute.

usage: /usr/bin/python3 bench/rnn_bench.py [--mtserve PATH] [--threads T]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def lstm_model(path, seq, inp, hidden, layers=1, direction="forward"):
    rng = np.random.default_rng(5)
    nd = 2 if direction == "bidirectional" else 1
    inits, nodes = [], []
    src, width = "x", inp
    for l in range(layers):
        w, r, b = "W%d" % l, "R%d" % l, "B%d" % l
        inits += [numpy_helper.from_array((rng.standard_normal((nd, 4 * hidden, width)) / np.sqrt(width)).astype(np.float32), w),
                  numpy_helper.from_array((rng.standard_normal((nd, 4 * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32), r),
                  numpy_helper.from_array((rng.standard_normal((nd, 8 * hidden)) * 0.1).astype(np.float32), b)]
        y = "y%d" % l
        nodes.append(helper.make_node("LSTM", [src, w, r, b], [y, "h%d" % l, "c%d" % l], hidden_size=hidden,
                                      direction=direction))
        if l + 1 < layers:
            # [seq, nd, 1, hidden] -> [seq, 1, nd*hidden]
            inits.append(numpy_helper.from_array(np.array([seq, 1, nd * hidden], np.int64), "shape%d" % l))
            nodes.append(helper.make_node("Reshape", [y, "shape%d" % l], [y + "_r"]))
            src, width = y + "_r", nd * hidden
    g = helper.make_graph(nodes, "lstm_bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 1, inp])],
                          [helper.make_tensor_value_info("y%d" % (layers - 1), TensorProto.FLOAT, None)],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    onnx.save(m, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mtserve", default=os.path.join(REPO, "build-dev", "mtserve"))
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    cases = [("vad_lstm_h64", dict(seq=1, inp=64, hidden=64), 3000),
             ("vad_lstm_h64_x2", dict(seq=1, inp=64, hidden=64, layers=2), 3000),
             ("lstm_s100_h256", dict(seq=100, inp=256, hidden=256), 100),
             ("bilstm_s100_h256", dict(seq=100, inp=256, hidden=256, direction="bidirectional"), 100)]
    tmp = tempfile.mkdtemp(prefix="rnn_bench.")
    print("%-18s %10s %10s %8s" % ("model", "mtserve_ms", "ort_ms", "ort/mts"))
    for name, kw, iters in cases:
        path = os.path.join(tmp, name + ".onnx")
        lstm_model(path, **kw)
        mts = subprocess.run([a.mtserve, "run", path, "--iters", str(iters), "--warmup", "50", "--threads",
                              str(a.threads), "--json"], capture_output=True, text=True, check=True)
        mts_ms = json.loads(mts.stdout.strip().splitlines()[-1])["median_ms"]
        ort = subprocess.run(["node", os.path.join(REPO, "tools", "ort", "ort_bench.js"), path, "--threads",
                              str(a.threads), "--iters", "200", "--min-seconds", "1"],
                             capture_output=True, text=True, check=True)
        ort_ms = json.loads(ort.stdout.strip().splitlines()[-1])["median_ms"]
        print("%-18s %10.4f %10.4f %8.2f" % (name, mts_ms, ort_ms, ort_ms / mts_ms), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
