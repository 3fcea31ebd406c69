#!/usr/bin/env bash
# The body of `make cluster`: three mtserve instances on loopback serving the demo repository
# (models/repo, laid out as `make run` does), each with its own memory budget, behind HAProxy
# configured by `mtserve cluster-config` (requests routed by model; docs/scale-out.md). Prints the
# front door's HTTP and gRPC addresses and runs in the foreground; Ctrl-C (or any instance or
# HAProxy exiting) stops every process it started.
#
# Knobs: PORT / GRPC_PORT (front door, default 8000 / 50051, as make run), STATS_PORT (HAProxy's
# statistics, default 8404), INSTANCES (default 3), INSTANCE_HTTP_BASE / INSTANCE_GRPC_BASE
# (instance i listens on BASE+i; default 8100 / 50150), INSTANCE_MEMORY_GB (each instance's
# budget, default 2), BALANCE_FACTOR (default 250, as cluster-config).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-8000}
GRPC_PORT=${GRPC_PORT:-50051}
STATS_PORT=${STATS_PORT:-8404}
INSTANCES=${INSTANCES:-3}
HTTP_BASE=${INSTANCE_HTTP_BASE:-8100}
GRPC_BASE=${INSTANCE_GRPC_BASE:-50150}
MEMORY_GB=${INSTANCE_MEMORY_GB:-2}
BALANCE_FACTOR=${BALANCE_FACTOR:-250}
BIN=${MTSERVE:-build/mtserve}

command -v haproxy >/dev/null || { echo "make cluster: haproxy is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
case "$INSTANCES" in ''|*[!0-9]*) echo "make cluster: INSTANCES must be a number 1..16" >&2; exit 1 ;; esac
if [ "$INSTANCES" -lt 1 ] || [ "$INSTANCES" -gt 16 ]; then echo "make cluster: INSTANCES must be 1..16" >&2; exit 1; fi

. scripts/ports.sh
ports=("$PORT" "$GRPC_PORT" "$STATS_PORT")
for i in $(seq 1 "$INSTANCES"); do ports+=($((HTTP_BASE + i)) $((GRPC_BASE + i))); done
if [ "$(printf '%s\n' "${ports[@]}" | sort | uniq -d)" ]; then
  echo "make cluster: two of the ports coincide (${ports[*]}); move PORT, GRPC_PORT, STATS_PORT or the bases" >&2
  exit 1
fi
for p in "${ports[@]}"; do
  if port_taken "$p"; then
    echo "make cluster: port $p is already in use; move it (PORT, GRPC_PORT, STATS_PORT, INSTANCE_HTTP_BASE, INSTANCE_GRPC_BASE)" >&2
    exit 1
  fi
done

# The demo repository, as scripts/demo.sh lays it out (shared by every instance).
REPO=models/repo
mkdir -p "$REPO"
for m in tiny mobilenetv3 seg_unet cbam_resunet bert_tiny lipsync_unet_w4 lipsync_unet_w8 lipsync_unet_w16; do
  mkdir -p "$REPO/$m"
  ln -sf "../../out/$m.onnx" "$REPO/$m/model.onnx"
done
[ -f models/out/avatar/crop_rects.json ] || /usr/bin/python3 models/gen/avatar.py assets models/out/avatar
printf 'max_batch: 16\nmax_queue_delay_us: 2000\nbackground_dir: ../../out/avatar/frames\ncrop_rects_path: ../../out/avatar/crop_rects.json\nnum_frames: 100\nbackground_cache_frames: 50\n' \
  > "$REPO/lipsync_unet_w8/config.yaml"
printf 'pin: true\nmax_batch: 64\n' > "$REPO/tiny/config.yaml"

WORK=$(mktemp -d /tmp/mtserve-cluster.XXXXXX)
pids=()
stopping=0
stop_all() {
  [ "$stopping" = 1 ] && return
  stopping=1
  trap - INT TERM
  echo
  echo "make cluster: stopping ${#pids[@]} processes"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # instances drain within their grace (5 s); anything still there after 10 s is killed
  for _ in $(seq 1 100); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "make cluster: stopped (logs in $WORK)"
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap stop_all EXIT

list=""
for i in $(seq 1 "$INSTANCES"); do
  h=$((HTTP_BASE + i)); g=$((GRPC_BASE + i))
  ML_MEMORY_LIMIT_GB=$MEMORY_GB "$BIN" serve --model-repository "$REPO" --http-port "$h" --grpc-port "$g" --grace 5 \
    > "$WORK/mts$i.out" 2> "$WORK/mts$i.log" < /dev/null &
  pids+=($!)
  list="$list${list:+,}127.0.0.1:$h:$g"
done
"$BIN" cluster-config --instances "$list" --front-http "$PORT" --front-grpc "$GRPC_PORT" --bind 127.0.0.1 \
  --stats-port "$STATS_PORT" --balance-factor "$BALANCE_FACTOR" > "$WORK/haproxy.cfg"
haproxy -c -q -f "$WORK/haproxy.cfg"
for i in $(seq 1 "$INSTANCES"); do
  h=$((HTTP_BASE + i))
  for _ in $(seq 1 300); do
    /usr/bin/python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$h/v2/health/ready', timeout=1)" \
      2>/dev/null && break
    kill -0 "${pids[$((i - 1))]}" 2>/dev/null || { echo "make cluster: instance $i exited; its log:" >&2; tail -20 "$WORK/mts$i.log" >&2; exit 1; }
    sleep 0.1
  done
done
haproxy -db -f "$WORK/haproxy.cfg" > "$WORK/haproxy.log" 2>&1 < /dev/null &
pids+=($!)

cat <<EOT

mtserve cluster: $INSTANCES instances ($MEMORY_GB GB budget each, ports $((HTTP_BASE + 1))..$((HTTP_BASE + INSTANCES)) HTTP,
$((GRPC_BASE + 1))..$((GRPC_BASE + INSTANCES)) gRPC) behind HAProxy, routed by model (docs/scale-out.md)

  front door, HTTP:  http://127.0.0.1:$PORT
  front door, gRPC:  127.0.0.1:$GRPC_PORT
  HAProxy statistics: http://127.0.0.1:$STATS_PORT/   (Prometheus: /metrics)
  HAProxy config and logs: $WORK

Try, in another terminal:
  curl -s localhost:$PORT/v2/models/tiny/infer -d '{"inputs":[{"name":"x","shape":[1,16],"datatype":"FP32","data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}'
  build/mtserve infer mobilenetv3 --grpc 127.0.0.1:$GRPC_PORT
  build/mtserve bench --url http://127.0.0.1:$PORT --model tiny --concurrency 8 --duration 5
  for i in \$(seq 1 $INSTANCES); do curl -s -X POST localhost:\$(($HTTP_BASE + i))/v2/repository/index; echo; done

Stop with Ctrl-C.
EOT
# Run until Ctrl-C or until one of the processes exits (then stop the others).
set +e
wait -n "${pids[@]}"
echo "make cluster: a process exited; see $WORK" >&2
exit 1
