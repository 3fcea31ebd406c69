#!/usr/bin/env bash
# gRPC benchmarks, measured with `mtserve bench --grpc` and printed as Markdown:
#  1. the tiny model (x[N,16] -> y[N,16], max_batch 64) over KServe gRPC ModelInfer with
#     raw_input_contents: requests/s and p99 with 1, 16 and 64 concurrent streams (closed loop);
#  2. serving efficiency on lipsync_unet_w8: throughput at saturation through gRPC ModelInfer
#     (2 concurrent streams, max_batch 1) over the bare engine (`mtserve run --batch 1 --threads 2
#     --iters 20`) with the same threads (server: 1 device, 1 worker, 2 threads), back to back:
#     each round runs the bare engine, gRPC, the same through HTTP (binary tensors, for comparison)
#     and the bare engine again; a round's efficiency is served / mean of its two bare runs. The
#     worker's busy fraction (served frames/s x the server's mean compute_ms) separates time lost
#     between frames from engine slowdown under the front end's load.
# Every figure is measured REPEAT times and reported as median and range (the machine is small and
# shared). Knobs: DURATION (seconds per tiny run, default 8), W8_DURATION (seconds per served w8
# run, default 15), ITERS (bare engine iterations, default 20), REPEAT (default 3), CHANNELS
# (--grpc-channels, default 4), PORT (gRPC, default 0 = any free port).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
DURATION=${DURATION:-8}
W8_DURATION=${W8_DURATION:-15}
ITERS=${ITERS:-20}
REPEAT=${REPEAT:-3}
CHANNELS=${CHANNELS:-4}
PORT=${PORT:-0}
TMP=$(mktemp -d)
SERVER=
trap '[ -n "$SERVER" ] && kill $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
mkdir -p "$TMP/repo/lipsync_unet_w8" "$TMP/repo/tiny"
ln -s "$PWD/models/out/lipsync_unet_w8.onnx" "$TMP/repo/lipsync_unet_w8/model.onnx"
ln -s "$PWD/models/out/tiny.onnx" "$TMP/repo/tiny/model.onnx"
printf 'preload: true\nmax_batch: 1\n' > "$TMP/repo/lipsync_unet_w8/config.yaml"
printf 'preload: true\nmax_batch: 64\n' > "$TMP/repo/tiny/config.yaml"
cat > "$TMP/config.yaml" <<EOT
server:
  port: $PORT
  http_port: 0
  queue_size: 1000
gpus:
  count: 1
  worker_count_per_gpu: 1
  threads_per_gpu: 2
model_repository: $TMP/repo
EOT

build/mtserve serve --config "$TMP/config.yaml" --log-level warn > "$TMP/serve.out" 2> "$TMP/serve.err" &
SERVER=$!
for _ in $(seq 200); do grep -q 'serving gRPC' "$TMP/serve.out" 2>/dev/null && break; sleep 0.1; done
G=$(sed -n 's/^mtserve: serving gRPC on \([^ ]*\) .*/\1/p' "$TMP/serve.out")
U=$(sed -n 's/^mtserve: serving .* on \(http:[^ ]*\) .*/\1/p' "$TMP/serve.out")
[ -n "$G" ] && [ -n "$U" ] || { echo "server did not start:" >&2; cat "$TMP/serve.err" >&2; exit 1; }
sleep 1

# bench TRANSPORT-ARGS ARGS... -> "rps p50 p99 errors busy" of one run
run_bench() {
  build/mtserve bench --json --quiet "$@" |
    $PY -c 'import json,sys; d=json.load(sys.stdin); l=d["latency_ms"]; c=d.get("server_compute_ms", {}).get("mean", 0)
print(d["throughput_rps"], l["p50"], l["p99"], d["errors"], d["throughput_rps"] * c / 1e3)'
}
bench() { run_bench --grpc "$G" --grpc-channels "$CHANNELS" "$@"; }
bare() {
  build/mtserve run models/out/lipsync_unet_w8.onnx --batch 1 --threads 2 --iters "$ITERS" --json |
    $PY -c 'import json,sys; print(json.load(sys.stdin)["throughput_per_s"])'
}
# summary FILE COLUMN DIGITS -> "median (min-max)" of a column of numbers
summary() {
  $PY - "$@" <<'EOT'
import statistics, sys
xs = [float(l.split()[int(sys.argv[2])]) for l in open(sys.argv[1]) if l.strip()]
f = "%%.%df" % int(sys.argv[3])
print((f + " (" + f + "-" + f + ")") % (statistics.median(xs), min(xs), max(xs)))
EOT
}

for c in 1 16 64; do
  : > "$TMP/tiny$c"
  for r in $(seq "$REPEAT"); do
    echo "tiny over gRPC: $c concurrent streams, ${DURATION}s, run $r/$REPEAT" >&2
    bench --model tiny --concurrency "$c" --duration "$DURATION" --warmup 1 >> "$TMP/tiny$c"
  done
done

: > "$TMP/pairs"
W8="--model lipsync_unet_w8 --concurrency 2 --duration $W8_DURATION --warmup 2"
for r in $(seq "$REPEAT"); do
  echo "lipsync_unet_w8 round $r/$REPEAT: bare engine, gRPC (2 streams, ${W8_DURATION}s), HTTP, bare engine" >&2
  b1=$(bare)
  set -- $(bench $W8); g=$1 gerr=$4 gbusy=$5
  set -- $(run_bench --url "$U" $W8); h=$1 herr=$4 hbusy=$5
  b2=$(bare)
  # columns: bare grpc grpc/bare errors http http/bare grpc-busy http-busy b1 b2
  $PY -c "b = ($b1 + $b2) / 2; print(b, $g, $g / b, $gerr + $herr, $h, $h / b, $gbusy, $hbusy, $b1, $b2)" >> "$TMP/pairs"
done
kill -TERM $SERVER; wait $SERVER || true
SERVER=

errs=$(awk '{s += $4} END {print s + 0}' "$TMP/tiny1" "$TMP/tiny16" "$TMP/tiny64")
w8errs=$(awk '{s += $4} END {print s + 0}' "$TMP/pairs")
cat <<EOT
| scenario (median (min-max) of $REPEAT runs) | requests/s | p50 ms | p99 ms |
|---|---:|---:|---:|
| tiny, gRPC, 1 stream | $(summary "$TMP/tiny1" 0 0) | $(summary "$TMP/tiny1" 1 3) | $(summary "$TMP/tiny1" 2 3) |
| tiny, gRPC, 16 streams | $(summary "$TMP/tiny16" 0 0) | $(summary "$TMP/tiny16" 1 2) | $(summary "$TMP/tiny16" 2 2) |
| tiny, gRPC, 64 streams | $(summary "$TMP/tiny64" 0 0) | $(summary "$TMP/tiny64" 1 2) | $(summary "$TMP/tiny64" 2 2) |

Errors in the tiny runs: $errs.

| lipsync_unet_w8, batch 1, 2 threads (median (min-max) of $REPEAT rounds) | result |
|---|---:|
| bare engine (\`mtserve run\`, mean of the runs before and after) | $(summary "$TMP/pairs" 0 2) frames/s |
| gRPC ModelInfer, raw contents, 2 streams, 1 worker × 2 threads | $(summary "$TMP/pairs" 1 2) frames/s |
| **serving efficiency, gRPC** (gRPC / bare, per round) | **$(summary "$TMP/pairs" 2 3)** |
| worker busy fraction, gRPC (frames/s × mean compute_ms) | $(summary "$TMP/pairs" 6 3) |
| HTTP binary, same server, 2 connections (comparison) | $(summary "$TMP/pairs" 4 2) frames/s |
| serving efficiency, HTTP (HTTP / bare, per round) | $(summary "$TMP/pairs" 5 3) |
| worker busy fraction, HTTP | $(summary "$TMP/pairs" 7 3) |

Errors in the served runs: $w8errs. Rounds (bare before, bare after, gRPC, HTTP frames/s):
$(awk '{printf "%s%.2f/%.2f/%.2f/%.2f", (NR > 1 ? "; " : ""), $9, $10, $2, $5} END {print ""}' "$TMP/pairs").
EOT
