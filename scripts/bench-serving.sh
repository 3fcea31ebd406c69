#!/usr/bin/env bash
# Serving benchmarks (server core and KServe v2 HTTP), printed as Markdown:
#  1. serving efficiency: lipsync_unet_w8 through HTTP with binary tensors at saturation vs the bare
#     engine (`mtserve run`) with the same threads, measured back to back;
#  2. a tiny model (16 floats in, 16 out) under wrk with keep-alive: requests/s and latency.
# Knobs: DURATION (seconds per wrk run, default 15), PORT (default 8765).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
DURATION=${DURATION:-15}
PORT=${PORT:-8765}
M=bench
TMP=$(mktemp -d)
trap 'kill $SERVER 2>/dev/null || true; rm -rf "$TMP"' EXIT
mkdir -p "$TMP/repo/lipsync_unet_w8" "$TMP/repo/tiny"
ln -s "$PWD/models/out/lipsync_unet_w8.onnx" "$TMP/repo/lipsync_unet_w8/model.onnx"
ln -s "$PWD/models/out/tiny.onnx" "$TMP/repo/tiny/model.onnx"
printf 'preload: true\nmax_batch: 1\n' > "$TMP/repo/lipsync_unet_w8/config.yaml"
printf 'preload: true\nmax_batch: 64\n' > "$TMP/repo/tiny/config.yaml"
cat > "$TMP/config.yaml" <<EOT
server:
  http_port: $PORT
  queue_size: 1000
gpus:
  count: 1
  worker_count_per_gpu: ${WORKERS:-1}
  threads_per_gpu: 2
model_repository: $TMP/repo
EOT

echo "bare engine: mtserve run lipsync_unet_w8 --batch 1 --threads 2" >&2
bare=$(build/mtserve run models/out/lipsync_unet_w8.onnx --batch 1 --threads 2 --iters 30 --json |
       $PY -c 'import json,sys; print(json.load(sys.stdin)["throughput_per_s"])')

build/mtserve serve --config "$TMP/config.yaml" --log-level warn > "$TMP/serve.out" 2> "$TMP/serve.err" &
SERVER=$!
for _ in $(seq 100); do grep -q serving "$TMP/serve.out" 2>/dev/null && break; sleep 0.1; done
sleep 1

hl=$($PY bench/make_infer_body.py "$TMP/w8.bin" visual:1,6,320,320 audio:1,32,16,16)
echo "server: wrk, binary lipsync_unet_w8, 2 connections, ${DURATION}s" >&2
BODY="$TMP/w8.bin" HDR_LEN=$hl wrk -t1 -c2 -d${DURATION}s --latency -s bench/wrk_body.lua \
  "http://127.0.0.1:$PORT/v2/models/lipsync_unet_w8/infer" > "$TMP/w8.wrk"
served=$(awk '/Requests\/sec/ {print $2}' "$TMP/w8.wrk")
w8_errors=$(awk '/non-200/ {print $3}' "$TMP/w8.wrk")

echo "$(printf '{"inputs":[{"name":"x","shape":[1,16],"datatype":"FP32","data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}')" > "$TMP/tiny.json"
echo "server: wrk, tiny JSON, 64 connections, ${DURATION}s" >&2
BODY="$TMP/tiny.json" HDR_LEN= wrk -t2 -c64 -d${DURATION}s --latency -s bench/wrk_body.lua \
  "http://127.0.0.1:$PORT/v2/models/tiny/infer" > "$TMP/tiny.wrk"
tiny_rps=$(awk '/Requests\/sec/ {print $2}' "$TMP/tiny.wrk")
tiny_p50=$(awk '/ 50%/ {print $2}' "$TMP/tiny.wrk")
tiny_p99=$(awk '/ 99%/ {print $2}' "$TMP/tiny.wrk")
tiny_errors=$(awk '/non-200/ {print $3}' "$TMP/tiny.wrk")
kill -TERM $SERVER; wait $SERVER || true

ratio=$($PY -c "print('%.3f' % ($served / $bare))")
cat <<EOT
| scenario | result |
|---|---|
| bare engine, lipsync_unet_w8, batch 1, 2 threads | $(printf '%.2f' "$bare") frames/s |
| HTTP binary, lipsync_unet_w8, 1 worker × 2 threads, 2 connections | $served frames/s ($w8_errors non-200) |
| **serving efficiency** (HTTP / bare) | **$ratio** |
| tiny model, JSON, wrk -t2 -c64 keep-alive | **$tiny_rps requests/s**, p50 $tiny_p50, p99 $tiny_p99 ($tiny_errors non-200) |
EOT
