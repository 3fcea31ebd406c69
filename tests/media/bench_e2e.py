#!/usr/bin/python3
"""End-to-end frames/s of InferBatchComposite vs InferBatch (figure for docs/benchmarks.md).

Starts `mtserve serve` ($MTSERVE, default build/mtserve) on a one-model repository: MODEL
(default lipsync_unet_w8) with the demo avatar (models/out/avatar: make avatar). Then, for each
RPC, CLIENTS closed-loop gRPC clients send batches of BATCH frames for SECONDS (sequential
playback: each client's start_frame_idx advances by BATCH), and it prints frames/s, latency
percentiles, the server-side time split, and the background cache's hit rate and bytes.

usage: bench_e2e.py [--model lipsync_unet_w8] [--batch 8] [--clients 2] [--seconds 20]
                    [--format jpeg] [--quality 85] [--cache 50]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "grpc"))


def stubs():
    import importlib
    import shutil
    from grpc_tools import protoc
    out = Path(tempfile.mkdtemp(prefix="mts_bench_stubs_"))
    shutil.copy(ROOT / "proto/lipsync.proto", out / "lipsync.proto")
    assert protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}",
                        "lipsync.proto"]) == 0
    sys.path.insert(0, str(out))
    return importlib.import_module("lipsync_pb2"), importlib.import_module("lipsync_pb2_grpc")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lipsync_unet_w8")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--format", default="jpeg")
    ap.add_argument("--quality", type=int, default=85)
    ap.add_argument("--cache", type=int, default=50)
    a = ap.parse_args()
    import grpc
    pb, pbg = stubs()
    avatar = ROOT / "models/out/avatar"
    if not (avatar / "crop_rects.json").exists():
        sys.exit("run `make avatar` first")
    repo = Path(tempfile.mkdtemp(prefix="mts_bench_repo_"))
    (repo / a.model).mkdir()
    (repo / a.model / "model.onnx").symlink_to(ROOT / "models/out" / (a.model + ".onnx"))
    (repo / a.model / "config.yaml").write_text(
        "max_batch: %d\nbackground_dir: %s\ncrop_rects_path: %s\nnum_frames: 100\nbackground_cache_frames: %d\n"
        % (max(a.batch, 8), avatar / "frames", avatar / "crop_rects.json", a.cache))
    mtserve = os.environ.get("MTSERVE", str(ROOT / "build/mtserve"))
    proc = subprocess.Popen([mtserve, "serve", "--model-repository", str(repo), "--http-port", "0", "--grpc-port",
                             "0", "--log-level", "warn"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    addr = None
    for line in proc.stdout:
        m = re.search(r"serving gRPC on ([0-9.]+:\d+)", line)
        if m:
            addr = m.group(1)
            break
    opts = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]
    ch = grpc.insecure_channel(addr, options=opts)
    stub = pbg.InferenceServiceStub(ch)
    rng = np.random.default_rng(0)
    vis = rng.random((a.batch, 6, 320, 320), np.float32).tobytes()
    aud = rng.standard_normal((a.batch, 32, 16, 16)).astype(np.float32).tobytes()
    stub.LoadModel(pb.LoadModelRequest(model_id=a.model), timeout=120)
    print("model %s, batch %d, %d clients, %.0f s per RPC, %s, cache %d frames, %d cores" % (
        a.model, a.batch, a.clients, a.seconds, a.format, a.cache, os.cpu_count()))

    def run(kind):
        lat, split, stop, lock = [], [], time.time() + a.seconds, threading.Lock()

        def client(k):
            start = k * 1000
            while time.time() < stop:
                t0 = time.time()
                if kind == "InferBatch":
                    r = stub.InferBatch(pb.InferBatchRequest(model_id=a.model, visual_frames=vis,
                                                             audio_features=aud, batch_size=a.batch), timeout=300)
                    s = (r.queue_time_ms, r.inference_time_ms, 0, 0, 0, 0)
                else:
                    r = stub.InferBatchComposite(pb.CompositeBatchRequest(
                        model_id=a.model, visual_frames=vis, audio_features=aud, batch_size=a.batch,
                        start_frame_idx=start, format=a.format, jpeg_quality=a.quality), timeout=300)
                    s = (r.queue_time_ms, r.inference_time_ms, r.media_queue_time_ms, r.background_time_ms,
                         r.composite_time_ms, r.encode_time_ms)
                    start += a.batch
                with lock:
                    lat.append((time.time() - t0) * 1e3)
                    split.append(s)

        t0 = time.time()
        ts = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        el = time.time() - t0
        lat.sort()
        sp = np.mean(np.array(split), axis=0)
        print("%-20s %6.1f frames/s  latency p50 %6.0f ms p90 %6.0f ms  per batch: queue %.0f, inference %.0f, "
              "media queue %.0f, background %.1f, composite %.1f, encode %.1f ms" % (
                  kind, len(lat) * a.batch / el, lat[len(lat) // 2], lat[len(lat) * 9 // 10], *sp))

    run("InferBatch")
    run("InferBatchComposite")
    st = stub.GetModelStats(pb.GetModelStatsRequest(model_id=a.model)).models[0].stats
    bc = st.background_cache
    print("background cache: %d lookups, hit rate %.1f%%, %d preloads, %d evictions, avg decode %.1f ms, "
          "%.1f MB held / %.1f MB reserved; model memory_bytes %.1f MB" % (
              bc.requests, 100 * bc.hit_rate, bc.preloads, bc.evictions, bc.avg_load_ms, bc.bytes / 1e6,
              bc.capacity_bytes / 1e6, st.memory_bytes / 1e6))
    ch.close()
    proc.terminate()
    proc.wait()


if __name__ == "__main__":
    main()
