#!/usr/bin/python3
"""Compares mtserve against ONNX Runtime on the generated reference models.

For every model in --models-dir (or the names given on the command line) this
draws random inputs with a fixed seed (batch 2, symbolic S = 64; float inputs
uniform [0,1), int64 ids uniform in [0, vocab) where vocab is the row count of
the embedding table the ids are gathered from), saves them as .npy, runs
tools/ort/ort_run.js (onnxruntime-node) and `mtserve run MODEL --input
NAME=FILE.npy ... --output DIR --iters 1`, and reports per model the relative
L2 error ||mtserve - ort|| / ||ort|| and max abs diff of each output,
PASS/FAIL at --tol (1e-4), then `N passed, N failed`; exit status 1 on any
failure. --self-check replaces mtserve by a numpy reference for tiny.onnx and
by ORT with graph optimizations disabled (unfused kernels) for the other models,
which tests the harness and that --tol is reachable by another fp32 engine.
Recurrent nodes with layout=1, which ONNX Runtime's CPU kernels reject, run in
ORT as layout 0 between Transposes (ort_layout0).

usage: /usr/bin/python3 tests/models/compare_ort.py [--models-dir DIR]
       [--mtserve PATH] [--self-check] [--keep DIR] [MODEL ...]
MTSERVE env var (default /work/main/build/mtserve) selects the binary.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
ORT_RUN = os.path.join(REPO, "tools", "ort", "ort_run.js")
DIM_DEFAULTS = {"N": 2, "S": 64}
NP_TYPES = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64,
            TensorProto.INT32: np.int32, TensorProto.DOUBLE: np.float64}


def safe_name(name):
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)


def vocab_for(model, input_name):
    """Rows of the initializer a Gather indexes with this input (None if none)."""
    inits = {t.name: t for t in model.graph.initializer}
    for nd in model.graph.node:
        if nd.op_type == "Gather" and len(nd.input) > 1 and nd.input[1] == input_name \
                and nd.input[0] in inits:
            return inits[nd.input[0]].dims[0]
    return None


def make_inputs(model, rng):
    init_names = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                shape.append(DIM_DEFAULTS.get(d.dim_param, 1))
        dt = NP_TYPES.get(tt.elem_type)
        if dt is None:
            raise RuntimeError("input %s: unsupported element type %d" % (vi.name, tt.elem_type))
        if np.issubdtype(dt, np.floating):
            feeds[vi.name] = rng.random(shape, dtype=np.float64).astype(dt)
        else:
            hi = vocab_for(model, vi.name) or 100
            feeds[vi.name] = rng.integers(0, hi, size=shape).astype(dt)
    return feeds


def run_cmd(cmd, timeout):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    if p.returncode != 0:
        out = p.stdout.decode(errors="replace").strip().splitlines()
        raise RuntimeError("%s exited %d: %s" % (os.path.basename(cmd[0]) if cmd[0] != "node" else "ort_run.js",
                                                 p.returncode, " | ".join(out[-5:])))


RECURRENT_OPS = ("LSTM", "GRU", "RNN")


def ort_layout0(model):
    """ONNX Runtime's CPU kernels reject recurrent nodes with layout=1 (batch-major). Returns a
    copy of model where each such node runs with layout 0 between Transposes (the same
    function), or None when the model has none."""
    if not any(n.op_type in RECURRENT_OPS and any(a.name == "layout" and a.i == 1 for a in n.attribute)
               for n in model.graph.node):
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = []
    for i, n0 in enumerate(m.graph.node):
        n = onnx.NodeProto()
        n.CopyFrom(n0)
        lay = [a for a in n.attribute if a.name == "layout"]
        if n.op_type not in RECURRENT_OPS or not lay or lay[0].i != 1:
            nodes.append(n)
            continue
        lay[0].i = 0
        tag = "_l0_%d" % i
        # inputs: X [b,s,i] -> [s,b,i]; initial_h / initial_c [b,d,h] -> [d,b,h]
        for j in (0, 5, 6):
            if j < len(n.input) and n.input[j]:
                t = n.input[j] + tag
                nodes.append(helper.make_node("Transpose", [n.input[j]], [t], perm=[1, 0, 2]))
                n.input[j] = t
        post = []
        # outputs: Y [s,d,b,h] -> [b,s,d,h]; Y_h / Y_c [d,b,h] -> [b,d,h]
        for j, perm in ((0, [2, 0, 1, 3]), (1, [1, 0, 2]), (2, [1, 0, 2])):
            if j < len(n.output) and n.output[j]:
                t = n.output[j] + tag
                post.append(helper.make_node("Transpose", [t], [n.output[j]], perm=perm))
                n.output[j] = t
        nodes.append(n)
        nodes.extend(post)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def run_ort(model_path, in_files, outdir, timeout, opt="all"):
    model = onnx.load(model_path)
    alt = ort_layout0(model)
    if alt is not None:
        os.makedirs(outdir, exist_ok=True)
        model_path = os.path.join(outdir, "ort_layout0.onnx")
        onnx.save(alt, model_path)
    os.makedirs(outdir, exist_ok=True)
    run_cmd(["node", ORT_RUN, "--opt=" + opt, model_path, outdir]
            + ["%s=%s" % kv for kv in in_files.items()], timeout)


def run_mtserve(exe, model_path, in_files, outdir, timeout):
    os.makedirs(outdir, exist_ok=True)
    cmd = [exe, "run", model_path]
    for k, v in in_files.items():
        cmd += ["--input", "%s=%s" % (k, v)]
    cmd += ["--output", outdir, "--iters", "1"]
    run_cmd(cmd, timeout)


def tiny_reference(model, feeds, outdir):
    """numpy Gemm(transB=1) + Relu for tiny.onnx."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    x = feeds[model.graph.input[0].name].astype(np.float64)
    w = inits[gemm.input[1]].astype(np.float64)
    b = inits[gemm.input[2]].astype(np.float64)
    y = np.maximum(x @ w.T + b, 0.0).astype(np.float32)
    os.makedirs(outdir, exist_ok=True)
    np.save(os.path.join(outdir, safe_name(model.graph.output[0].name) + ".npy"), y)


def compare(model, ref_dir, got_dir, tol):
    rows = []
    ok = True
    for o in model.graph.output:
        fn = safe_name(o.name) + ".npy"
        b = np.load(os.path.join(ref_dir, fn))
        gp = os.path.join(got_dir, fn)
        if not os.path.exists(gp):
            rows.append("%s: missing output file" % o.name)
            ok = False
            continue
        a = np.load(gp)
        if a.shape != b.shape:
            rows.append("%s: shape %s != ort %s" % (o.name, a.shape, b.shape))
            ok = False
            continue
        a64 = a.astype(np.float64)
        b64 = b.astype(np.float64)
        nb = np.linalg.norm(b64)
        rel = np.linalg.norm(a64 - b64) / (nb if nb > 0 else 1.0)
        mad = float(np.max(np.abs(a64 - b64))) if a.size else 0.0
        good = bool(np.isfinite(rel)) and rel <= tol
        ok = ok and good
        rows.append("%s%s rel_l2=%.3e max_abs=%.3e" % (o.name, list(a.shape), rel, mad))
    return ok, rows


def main():
    ap = argparse.ArgumentParser(description="compare mtserve against ONNX Runtime")
    ap.add_argument("models", nargs="*", help="model names or paths (default: all in --models-dir)")
    ap.add_argument("--models-dir", default=os.path.join(REPO, "models", "out"))
    ap.add_argument("--mtserve", default=os.environ.get("MTSERVE", os.path.join(REPO, "build", "mtserve")))
    ap.add_argument("--tol", type=float, default=1e-4, help="relative L2 threshold (default 1e-4)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per engine run")
    ap.add_argument("--self-check", action="store_true",
                    help="check the harness: numpy reference for tiny.onnx, ORT unoptimized otherwise")
    ap.add_argument("--keep", metavar="DIR", help="keep inputs/outputs under DIR instead of a temp dir")
    args = ap.parse_args()

    if args.models:
        paths = []
        for m in args.models:
            if os.path.sep in m or os.path.exists(m):
                paths.append(m)
            else:
                paths.append(os.path.join(args.models_dir, m if m.endswith(".onnx") else m + ".onnx"))
    else:
        if not os.path.isdir(args.models_dir):
            print("no models dir %s (run models/gen/generate_all.py)" % args.models_dir, file=sys.stderr)
            return 1
        paths = sorted(os.path.join(args.models_dir, f) for f in os.listdir(args.models_dir)
                       if f.endswith(".onnx"))
    if not paths:
        print("no models found", file=sys.stderr)
        return 1
    if not args.self_check and not os.access(args.mtserve, os.X_OK):
        print("mtserve binary not found: %s (set MTSERVE or --mtserve)" % args.mtserve, file=sys.stderr)
        return 1

    work = args.keep or tempfile.mkdtemp(prefix="compare_ort.")
    passed = failed = 0
    try:
        for path in paths:
            name = os.path.basename(path)
            base = os.path.join(work, name[:-5] if name.endswith(".onnx") else name)
            try:
                model = onnx.load(path)
                rng = np.random.default_rng(args.seed)
                feeds = make_inputs(model, rng)
                in_dir = os.path.join(base, "inputs")
                os.makedirs(in_dir, exist_ok=True)
                in_files = {}
                for k, v in feeds.items():
                    in_files[k] = os.path.join(in_dir, safe_name(k) + ".npy")
                    np.save(in_files[k], v)
                ref_dir = os.path.join(base, "ort")
                got_dir = os.path.join(base, "mtserve")
                run_ort(path, in_files, ref_dir, args.timeout)
                if args.self_check:
                    if name == "tiny.onnx":
                        tiny_reference(model, feeds, got_dir)
                    else:
                        run_ort(path, in_files, got_dir, args.timeout, opt="disabled")
                else:
                    run_mtserve(args.mtserve, path, in_files, got_dir, args.timeout)
                ok, rows = compare(model, ref_dir, got_dir, args.tol)
            except Exception as e:  # noqa: BLE001 - report and continue with the next model
                ok, rows = False, ["error: %s" % e]
            if ok:
                passed += 1
            else:
                failed += 1
            print("%-24s %s  %s" % (name, "; ".join(rows), "PASS" if ok else "FAIL"), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
