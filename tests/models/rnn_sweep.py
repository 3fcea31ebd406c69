#!/usr/bin/python3
"""Sweep of single-node LSTM / GRU / RNN models against ONNX Runtime.

Builds about 36 one-node models covering every direction and layout, sequence_lens (with
empty and full sequences), initial states, peepholes, input_forget, clip, linear_before_reset,
non-default activations with alpha/beta, omitted outputs, time blocks (a sequence longer than
one block of input projections) and the threaded paths, runs each with `mtserve run` on both
backends and with tools/ort/ort_run.js (layout=1 nodes through compare_ort.ort_layout0), and
prints the max abs difference per output; exit status 1 when one exceeds its bound (1e-5, or
1e-6 relative to the output's largest value for the long sequences whose cell states grow).

usage: /usr/bin/python3 tests/models/rnn_sweep.py [INDEX ...]   (MTSERVE selects the binary,
default build-dev/mtserve)
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(WT, "tests", "models"))
import compare_ort  # noqa: E402


GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
ATTRS = ("clip", "activations", "activation_alpha", "activation_beta", "input_forget", "linear_before_reset",
         "layout")


def build(cfg, path):
    """Writes the one-node model of cfg to path and its input X to path + '.X.npy'; returns the
    names of the outputs it has."""
    op = cfg["op"]
    G = GATES[op]
    rng = np.random.default_rng(cfg["seed"])
    seq, batch, inp, H = cfg["seq"], cfg["batch"], cfg["in"], cfg["H"]
    nd = 2 if cfg["dir"] == "bidirectional" else 1
    lay = cfg.get("layout", 0)
    xs = [batch, seq, inp] if lay else [seq, batch, inp]
    hs = [batch, nd, H] if lay else [nd, batch, H]
    inits = []

    def add(name, arr):
        inits.append(numpy_helper.from_array(arr.astype(np.float32) if arr.dtype == np.float64 else arr, name))
        return name

    def opt(key, name, make):
        return add(name, make()) if cfg.get(key) is not None else ""

    # weights scaled like a trained network's, so that long sequences stay well conditioned
    ins = ["X", add("W", rng.standard_normal((nd, G * H, inp)) * 0.8 / np.sqrt(max(inp, 1))),
           add("R", rng.standard_normal((nd, G * H, H)) * 0.8 / np.sqrt(H)),
           opt("B", "B", lambda: rng.standard_normal((nd, 2 * G * H)) * 0.3),
           opt("sl", "SL", lambda: np.array(cfg["sl"], np.int32)),
           opt("h0", "H0", lambda: rng.standard_normal(hs) * 0.5)]
    if op == "LSTM":
        ins += [opt("c0", "C0", lambda: rng.standard_normal(hs) * 0.5),
                opt("P", "P", lambda: rng.standard_normal((nd, 3 * H)) * 0.5)]
    while ins[-1] == "":
        ins.pop()
    outs = cfg.get("outs", ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])
    attrs = dict(hidden_size=H, direction=cfg["dir"])
    attrs.update({a: cfg[a] for a in ATTRS if a in cfg})
    node = helper.make_node(op, ins, outs, **attrs)
    g = helper.make_graph([node], "sweep", [helper.make_tensor_value_info("X", TensorProto.FLOAT, xs)],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs if o],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", cfg.get("opset", 14))])
    m.ir_version = 8
    onnx.save(m, path)
    np.save(path + ".X.npy", rng.standard_normal(xs).astype(np.float32))
    return [o for o in outs if o]


def run(cfg, d, backend, threads):
    """(message, ok) for cfg run in folder d."""
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "m.onnx")
    outs = build(cfg, p)
    alt = compare_ort.ort_layout0(onnx.load(p))
    po = p
    if alt is not None:
        po = os.path.join(d, "alt.onnx")
        onnx.save(alt, po)
    r = subprocess.run(["node", os.path.join(WT, "tools", "ort", "ort_run.js"), po, d + "/ort", "X=" + p + ".X.npy"],
                       capture_output=True, text=True)
    if r.returncode:
        return "ort_run.js failed: " + r.stderr.strip()[-200:], False
    env = dict(os.environ, MTS_BACKEND=backend)
    exe = os.environ.get("MTSERVE", os.path.join(WT, "build-dev", "mtserve"))
    r = subprocess.run([exe, "run", p, "--input", "X=" + p + ".X.npy", "--output", d + "/mts", "--iters", "1",
                        "--threads", str(threads)], capture_output=True, text=True, env=env)
    if r.returncode:
        return "mtserve failed: " + (r.stdout + r.stderr).strip()[-300:], False
    res, ok = [], True
    for o in outs:
        a, b = np.load("%s/mts/%s.npy" % (d, o)), np.load("%s/ort/%s.npy" % (d, o))
        if a.shape != b.shape:
            res.append("%s shape %s vs %s" % (o, a.shape, b.shape))
            ok = False
            continue
        err = float(np.max(np.abs(a - b))) if a.size else 0.0
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        ok = ok and err <= max(1e-5, 1e-6 * scale)
        res.append("%s %.1e" % (o, err))
    return " ".join(res), ok


def configs():
    cfgs = []
    # every op x direction x layout, with sequence_lens (an empty sequence at layout 0)
    for op in ("LSTM", "GRU", "RNN"):
        for dr in ("forward", "reverse", "bidirectional"):
            for lay in (0, 1):
                c = dict(op=op, dir=dr, layout=lay, seq=5, batch=3, H=6, B=1, h0=1, c0=1, seed=len(cfgs),
                         sl=[5, 2, 0] if lay == 0 else [3, 5, 1])
                c["in"] = 4
                if op == "LSTM":
                    c["P"] = 1
                if op == "GRU":
                    c["linear_before_reset"] = len(cfgs) % 2
                cfgs.append(c)
    extra = [
        dict(op="LSTM", dir="bidirectional", seq=7, batch=5, H=17, B=1, clip=0.5, input_forget=1, P=1),
        dict(op="LSTM", dir="forward", seq=4, batch=2, H=5, activations=["HardSigmoid", "LeakyRelu", "Softsign"],
             activation_alpha=[0.3, 0.2], activation_beta=[0.4]),
        dict(op="GRU", dir="bidirectional", seq=4, batch=2, H=5, activations=["Sigmoid", "Elu", "Relu", "Softplus"],
             activation_alpha=[0.7], B=1, linear_before_reset=1),
        dict(op="GRU", dir="forward", seq=6, batch=6, inp=8, H=20, B=1, sl=[6, 1, 3, 0, 6, 2], h0=1),
        dict(op="RNN", dir="bidirectional", seq=4, batch=2, H=5, activations=["Affine", "ScaledTanh"],
             activation_alpha=[0.5, 0.8], activation_beta=[0.1, 1.3], B=1),
        dict(op="RNN", dir="forward", seq=4, batch=2, H=5, activations=["ThresholdedRelu"], activation_alpha=[0.2],
             B=1, clip=0.7),
        dict(op="LSTM", dir="forward", seq=3, batch=2, H=5, outs=["", "Y_h"]),
        dict(op="LSTM", dir="reverse", seq=3, batch=2, H=5, outs=["", "", "Y_c"]),
        dict(op="LSTM", dir="bidirectional", seq=9, batch=9, inp=16, H=32, B=1, h0=1, c0=1, P=1,
             sl=[9, 8, 7, 6, 5, 4, 3, 2, 1]),
        dict(op="GRU", dir="bidirectional", seq=9, batch=9, inp=16, H=32, B=1, h0=1, sl=[9, 8, 7, 6, 5, 4, 3, 2, 1],
             layout=1, linear_before_reset=1),
        dict(op="LSTM", dir="forward", seq=3, batch=2, H=5, opset=7),
        # two time blocks (forward and reverse in different blocks), threaded over directions
        dict(op="LSTM", dir="bidirectional", seq=300, batch=8, inp=16, H=256, B=1, h0=1, c0=1, P=1,
             sl=[300, 299, 150, 1, 0, 257, 256, 255]),
        # threaded: the GEMM path on a whole batch of 10, batch slices of 3 (matrix-vector path)
        dict(op="GRU", dir="forward", seq=40, batch=10, inp=16, H=64, B=1, h0=1, sl=[40, 39, 1, 0, 20, 40, 40, 3, 7, 8]),
        dict(op="GRU", dir="reverse", seq=40, batch=10, inp=16, H=64, B=1, h0=1, sl=[40, 39, 1, 0, 20, 40, 40, 3, 7, 8],
             linear_before_reset=1, layout=1),
        dict(op="RNN", dir="bidirectional", seq=600, batch=3, inp=5, H=1024, B=1, h0=1, sl=[600, 300, 599]),
        dict(op="LSTM", dir="forward", seq=50, batch=6, inp=16, H=64, B=1, h0=1, c0=1, P=1, sl=[50, 49, 1, 0, 25, 50]),
        dict(op="GRU", dir="reverse", seq=50, batch=6, inp=16, H=64, B=1, h0=1, sl=[50, 49, 1, 0, 25, 50], clip=0.9),
        dict(op="GRU", dir="bidirectional", seq=2, batch=1, inp=16, H=64, B=1, h0=1, linear_before_reset=1, clip=0.6),
        # threaded over batch slices of 20 rows (the GEMM path)
        dict(op="LSTM", dir="forward", seq=12, batch=40, inp=16, H=32, B=1, h0=1, c0=1, P=1,
             sl=[12, 11, 0, 1, 5] * 8),
        dict(op="GRU", dir="forward", seq=12, batch=40, inp=16, H=32, B=1, h0=1, sl=[12, 11, 0, 1, 5] * 8),
    ]
    for i, c in enumerate(extra):
        c["in"] = c.pop("inp", 3)
        c["seed"] = 100 + i
        cfgs.append(c)
    return cfgs


def main():
    sel = set(sys.argv[1:])
    tmp = tempfile.mkdtemp(prefix="rnn_sweep.")
    bad = 0
    try:
        for i, c in enumerate(configs()):
            if sel and str(i) not in sel:
                continue
            for be in ("reference", "default"):
                msg, ok = run(c, os.path.join(tmp, "c%d" % i), be, 2 if i % 2 or i > 28 else 1)
                bad += not ok
                print("%-4s %2d %-9s %-4s %-13s L%d %s" % ("ok" if ok else "FAIL", i, be, c["op"], c["dir"],
                                                          c.get("layout", 0), msg), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
