#!/usr/bin/python3
"""Writes every mtserve reference model into an output directory.

usage: /usr/bin/python3 models/gen/generate_all.py [OUTDIR] [--force] [--only NAME ...]

OUTDIR defaults to models/out next to this directory. Each MODEL.onnx gets a
MODEL.onnx.stamp (JSON: sha256 of the generator sources common.py + the family
script, GFLOP/frame at batch 1, initializer bytes); a model whose stamp hash
matches the current sources is skipped. One line per model is printed with its
file size, GFLOP/frame and parameter bytes. Needs onnx (1.12+) and numpy.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import onnx  # noqa: E402

import bert_tiny  # noqa: E402
import cbam_resunet  # noqa: E402
import common  # noqa: E402
import lipsync_unet  # noqa: E402
import minilm_like  # noqa: E402
import mobilenetv3  # noqa: E402
import seg_unet  # noqa: E402
import tiny  # noqa: E402

FAMILIES = [lipsync_unet, seg_unet, cbam_resunet, mobilenetv3, bert_tiny, tiny, minilm_like]
DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "out"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", nargs="?", default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true", help="regenerate even if up to date")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="model file names (with or without .onnx) to generate")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    only = {n if n.endswith(".onnx") else n + ".onnx" for n in args.only} if args.only else None

    t_all = time.time()
    done = 0
    for fam in FAMILIES:
        src_hash = common.sources_hash([os.path.join(HERE, "common.py"), os.path.abspath(fam.__file__)])
        for fname, build in fam.models().items():
            if only is not None and fname not in only:
                continue
            done += 1
            path = os.path.join(args.outdir, fname)
            stamp_path = path + ".stamp"
            stamp = None
            if not args.force and os.path.exists(path) and os.path.exists(stamp_path):
                try:
                    with open(stamp_path) as f:
                        stamp = json.load(f)
                except (OSError, ValueError):
                    stamp = None
                if stamp is not None and stamp.get("sources_sha256") != src_hash:
                    stamp = None
            status = "up to date"
            if stamp is None:
                t0 = time.time()
                model = build()
                flops, pbytes = common.model_stats(model)
                tmp = path + ".tmp"
                onnx.save(model, tmp)
                os.replace(tmp, path)
                stamp = {"sources_sha256": src_hash, "gflop_per_frame": flops / 1e9,
                         "param_bytes": pbytes}
                with open(stamp_path + ".tmp", "w") as f:
                    json.dump(stamp, f, indent=1)
                    f.write("\n")
                os.replace(stamp_path + ".tmp", stamp_path)
                status = "generated in %.2fs" % (time.time() - t0)
            size = os.path.getsize(path)
            size_s = "%.2f MB" % (size / 1e6) if size >= 1e5 else "%.1f kB" % (size / 1e3)
            print("%-24s %9s  %8.3f GFLOP/frame  params %9d B  (%s)" % (
                fname, size_s, stamp["gflop_per_frame"], stamp["param_bytes"], status), flush=True)
    if only is not None and done != len(only):
        known = [n for fam in FAMILIES for n in fam.models()]
        print("unknown model name(s): %s (known: %s)" % (
            ", ".join(sorted(only - set(known))), ", ".join(known)), file=sys.stderr)
        return 2
    print("%d models in %s (%.1fs)" % (done, args.outdir, time.time() - t_all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
