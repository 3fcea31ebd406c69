#!/usr/bin/env python3
"""Served sentence-embedding throughput with and without an embedding_policy (part of
`make bench-embed`): one `mtserve serve` with two models on the same ONNX file, `plain` (no
policy) and `pol` (POLICY), and one client posting requests of B texts to /v1/embeddings back to
back (HTTP, JSON, tokenization, scheduler and pooling included), alternating between the two
models in slices so that a busy spell of a shared machine hits both. Prints texts/s per batch
size, the ratio, and the batches / team sizes the policy model's statistics show.

usage: bench-embed-serve.py MTSERVE MODEL_DIR TEXTS POLICY [SECONDS]
MODEL_DIR holds model.onnx, vocab.txt and config.yaml (the embedding keys).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import requests


def main():
    mtserve, model_dir, texts_path, policy = sys.argv[1:5]
    secs = float(sys.argv[5]) if len(sys.argv) > 5 else 3.0
    texts = [t for t in open(texts_path).read().splitlines() if t.strip()]
    work = tempfile.mkdtemp()
    try:
        base = open(os.path.join(model_dir, "config.yaml")).read()
        for name, extra in (("plain", ""), ("pol", f'embedding_policy: "{policy}"\n')):
            d = os.path.join(work, "repo", name)
            os.makedirs(d)
            for f in ("model.onnx", "vocab.txt"):
                os.symlink(os.path.realpath(os.path.join(model_dir, f)), os.path.join(d, f))
            with open(os.path.join(d, "config.yaml"), "w") as f:
                f.write(base + "max_batch: 64\n" + extra)
        out = open(os.path.join(work, "out.log"), "wb")
        proc = subprocess.Popen([mtserve, "serve", "--model-repository", os.path.join(work, "repo"), "--http-port",
                                 "0", "--grpc-port", "0"], stdout=out, stderr=subprocess.STDOUT)
        url = None
        for _ in range(400):
            m = re.search(r"serving \d+ models? on (http://[0-9.:]+)", open(os.path.join(work, "out.log")).read())
            if m:
                url = m.group(1)
                break
            time.sleep(0.05)
        if not url:
            sys.exit("bench-embed-serve: the server did not start:\n" + open(os.path.join(work, "out.log")).read())
        s = requests.Session()

        def post(model, batch):
            r = s.post(url + "/v1/embeddings", json={"model": model, "input": batch}, timeout=120)
            r.raise_for_status()

        print(f"served /v1/embeddings, one client, {secs:g} s per point in 4 slices (ABBA); policy {policy}")
        print(f"{'batch':<6} {'no-policy texts/s':>18} {'policy texts/s':>15} {'policy/no':>10}")
        for b in (1, 8, 32):
            batch = [texts[i % len(texts)] for i in range(b)]
            for m in ("plain", "pol"):
                post(m, batch)  # load, plans for this shape
            done = {"plain": [0, 0.0], "pol": [0, 0.0]}
            for k in range(4):  # ABBA order: neither model always runs right after the other
                for m in (("plain", "pol") if k % 3 == 0 else ("pol", "plain")):
                    t0 = time.monotonic()
                    while time.monotonic() - t0 < secs / 4:
                        post(m, batch)
                        done[m][0] += b
                    done[m][1] += time.monotonic() - t0
            without, with_ = (done[m][0] / done[m][1] for m in ("plain", "pol"))
            print(f"{b:<6} {without:>18.1f} {with_:>15.1f} {with_ / without:>9.2f}x")
        st = s.get(url + "/v2/models/pol/stats").json()["model_stats"][0]
        sizes = {x["batch_size"]: x["compute_infer"]["count"] for x in st["batch_stats"]}
        print(f"pol statistics: policy_sub_batches {st['policy_sub_batches']}, "
              f"team_sizes {json.dumps(st['team_sizes'])}, batch sizes {json.dumps(sizes)}")
        proc.terminate()
        proc.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
