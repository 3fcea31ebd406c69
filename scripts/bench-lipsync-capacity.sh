#!/usr/bin/env bash
# Conversational-user capacity on the lip-sync service's own path (`make bench-capacity`): for
# each lip-sync model (MODELS, default lipsync_unet_w8 and lipsync_unet_w16) on the demo avatar
# (models/out/avatar: 100 frames, 1280x720), the users held with
#   - InferBatch (raw mouth regions, gRPC), and
#   - InferBatchComposite (finished JPEG frames, gRPC),
# each found by `mtserve bench --api lipsync --find-capacity` (requests of FRAMES frames, a user
# speaking sends one request per FRAMES frames; a request is on time when its reply arrives
# within FRAMES/fps, before its first frame is due; a level passes with >= 99 % of frames on
# time), beside the bound computed from the bare engine at the same batch:
#     bound = engine frames/s x 15/4 / fps      (4 s speaking in every 15 s cycle)
# and the design documents' figures (150 FPS per worker, 22 users per worker, 80-90 users on a
# 4-worker GPU at 25 FPS). The server runs 1 worker x THREADS threads, max_batch FRAMES (a
# request is one batch), compositing on its media threads.
# A 2-core machine computes a lip-sync frame in tens of milliseconds, so a 25 FPS user would need
# the whole machine: when the engine does fewer than 50 frames/s (twice one speaking user's rate:
# a request must be answered within FRAMES/fps and the engine alone needs FRAMES/engine fps of
# it) the users speak at a reduced rate, FPS2 = engine fps / 3 (bound 11.25 users by
# construction), so that the ratio measured / bound stays informative; the table says which
# rate ran. Prints Markdown with the CPU model.
# Also prints the CPU a request costs (engine threads, rest of the server, the client) and the
# co-located ceiling that follows from it. About 3-4 minutes per model.
# Knobs: MODELS, FRAMES (16), THREADS (2), LEVEL_S (15), FPS2 (auto), ITERS (engine runs, 6),
# IOBUF_MB (the server's MTS_IOBUF_CACHE_MB; unset: the server's own policy), PRECISION (fp32 |
# bf16 | auto | int8: the model's precision in the server and in the bare engine run, fp32),
# PHASES (the users' --request-phases: spread, the default, or grid),
# ENGINE_BATCH (the model's engine_batch: a request's frames run in engine runs of at most this
# many; the bare engine is then measured at that batch size, so the bound is its throughput;
# unset: one run per request, engine measured at FRAMES).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
MTSERVE=${MTSERVE:-build/mtserve}
MODELS=${MODELS:-lipsync_unet_w8 lipsync_unet_w16}
FRAMES=${FRAMES:-16}
THREADS=${THREADS:-2}
LEVEL_S=${LEVEL_S:-15}
FPS2=${FPS2:-}
ITERS=${ITERS:-6}
PRECISION=${PRECISION:-fp32}
ENGINE_BATCH=${ENGINE_BATCH:-}
PHASES=${PHASES:-spread}
AVATAR=models/out/avatar
TMP=$(mktemp -d)
SERVER=
cleanup() {
  if [ -n "$SERVER" ]; then kill -TERM "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
[ -f "$AVATAR/crop_rects.json" ] || $PY models/gen/avatar.py assets "$AVATAR"

engine() { # MODEL -> frames/s at batch FRAMES (or ENGINE_BATCH)
  local b=${ENGINE_BATCH:-$FRAMES}
  echo "bare engine: mtserve run $1 --batch $b --threads $THREADS --iters $ITERS --precision $PRECISION" >&2
  "$MTSERVE" run "models/out/$1.onnx" --batch "$b" --threads "$THREADS" --iters "$ITERS" --precision "$PRECISION" --json |
    $PY -c 'import json,sys; print(json.load(sys.stdin)["throughput_per_s"])'
}

start_server() { # MODEL
  rm -rf "$TMP/repo"; mkdir -p "$TMP/repo/$1"
  ln -s "$PWD/models/out/$1.onnx" "$TMP/repo/$1/model.onnx"
  printf 'preload: true\nmax_batch: %d\nmax_queue_delay_us: 2000\nbackground_dir: %s\ncrop_rects_path: %s\nnum_frames: 100\nbackground_cache_frames: 100\nprecision: %s\n' \
    "$FRAMES" "$PWD/$AVATAR/frames" "$PWD/$AVATAR/crop_rects.json" "$PRECISION" > "$TMP/repo/$1/config.yaml"
  if [ -n "$ENGINE_BATCH" ]; then echo "engine_batch: $ENGINE_BATCH" >> "$TMP/repo/$1/config.yaml"; fi
  cat > "$TMP/config.yaml" <<EOT
server:
  http_port: 0
  grpc_port: 0
  queue_size: 1000
gpus:
  count: 1
  worker_count_per_gpu: 1
  threads_per_gpu: $THREADS
model_repository: $TMP/repo
EOT
  : > "$TMP/serve.out"
  # A 16-frame request is 40 MB and its raw reply 19.7 MB: the server's I/O buffer cache follows
  # the largest blocks in use (util/iobuf.h); IOBUF_MB fixes its cap instead.
  ${IOBUF_MB:+env MTS_IOBUF_CACHE_MB=$IOBUF_MB} \
    "$MTSERVE" serve --config "$TMP/config.yaml" --log-level warn > "$TMP/serve.out" 2> "$TMP/serve.err" &
  SERVER=$!
  for _ in $(seq 300); do grep -q 'serving gRPC' "$TMP/serve.out" 2>/dev/null && break; sleep 0.1; done
  URL=$(grep -o 'http://[0-9.]*:[0-9]*' "$TMP/serve.out" | head -1)
  GRPC=$(grep -o 'serving gRPC on [0-9.]*:[0-9]*' "$TMP/serve.out" | awk '{print $4}')
  [ -n "$URL" ] && [ -n "$GRPC" ] || { echo "server did not start:"; cat "$TMP/serve.err"; exit 1; }
}

stop_server() {
  kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=
}

for MODEL in $MODELS; do
  before=$(engine "$MODEL")
  start_server "$MODEL"
  # warm-up (not counted): plans for the request batch, the background frames decoded
  "$MTSERVE" bench --url "$URL" --grpc "$GRPC" --api lipsync --model "$MODEL" --frames-per-request "$FRAMES" \
    --concurrency 1 --requests 2 --quiet > /dev/null
  fps=25
  # A request of FRAMES frames must be answered within FRAMES/fps of being sent, and takes
  # FRAMES/engine fps of engine time alone: with the engine below twice a speaking user's 25 FPS
  # not even one user has room for queueing and compositing, so the search runs at FPS2.
  fits=$($PY -c "print(1 if $before >= 50 else 0)")
  if [ "$fits" = 0 ]; then fps=${FPS2:-$($PY -c "print('%.3f' % ($before / 3))")}; fi
  # A speaking phase ends with a shorter request (4 s x fps mod FRAMES frames): its batch size
  # builds a plan on first use (tens to hundreds of ms), which would land in the first level.
  tail=$($PY -c "import math; print(math.ceil(4 * $fps - 1e-9) % $FRAMES)")
  if [ "$tail" != 0 ]; then
    "$MTSERVE" bench --url "$URL" --grpc "$GRPC" --api lipsync --model "$MODEL" --frames-per-request "$tail" \
      --concurrency 1 --requests 2 --quiet > /dev/null
  fi
  bound=$($PY -c "print($before * 15 / 4 / $fps)")
  max=$($PY -c "import math; print(max(2, math.ceil($bound * 2) + 1))")
  startu=$($PY -c "print(max(1, int($bound / 2)))")
  for rpc in infer composite; do
    echo "running: mtserve bench --api lipsync --rpc $rpc --model $MODEL --frames-per-request $FRAMES --fps $fps --find-capacity --start-users $startu --max-users $max --level-seconds $LEVEL_S" >&2
    "$MTSERVE" bench --url "$URL" --grpc "$GRPC" --api lipsync --rpc "$rpc" --format jpeg --model "$MODEL" \
      --frames-per-request "$FRAMES" --fps "$fps" --find-capacity --start-users "$startu" --max-users "$max" \
      --level-seconds "$LEVEL_S" --request-phases "$PHASES" --json > "$TMP/$MODEL.$rpc.json"
  done
  # one closed-loop run of each for the per-request server times and bytes per frame, and one
  # client alone for the CPU a request costs: the server's engine worker threads (mts-dD-wN,
  # their OpenMP team included), the rest of the server, and the bench client (same cores)
  for rpc in infer composite; do
    "$MTSERVE" bench --url "$URL" --grpc "$GRPC" --api lipsync --rpc "$rpc" --model "$MODEL" \
      --frames-per-request "$FRAMES" --concurrency 2 --requests 6 --json --quiet > "$TMP/$MODEL.$rpc.times.json"
    $PY - "$SERVER" "$TMP/$MODEL.$rpc.cpu.json" 8 "$MTSERVE" bench --url "$URL" --grpc "$GRPC" --api lipsync \
      --rpc "$rpc" --model "$MODEL" --frames-per-request "$FRAMES" --concurrency 1 --requests 8 --json --quiet \
      <<'CPUEOF'
import glob, json, os, re, subprocess, sys
pid, out, n, cmd = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
tck = os.sysconf("SC_CLK_TCK")
def threads():
    t = {}
    for d in glob.glob(f"/proc/{pid}/task/*"):
        try:
            comm = open(d + "/comm").read().strip()
            f = open(d + "/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        t[d] = (comm, (int(f[11]) + int(f[12])) * 1000 / tck)
    return t
a = threads()
p = subprocess.run(cmd, stdout=subprocess.PIPE)
b = threads()
eng = oth = 0.0
for k, (comm, ms) in b.items():
    d = ms - a.get(k, (comm, 0.0))[1]
    if re.match(r"mts-d\d+-w\d+$", comm): eng += d
    else: oth += d
# the client's own figure: its CPU while sending, not its start-up (inputs made, connections)
client = json.loads(p.stdout)["client_cpu_ms_per_request"]
json.dump({"engine_ms": eng / n, "server_other_ms": oth / n, "client_ms": client, "cpus": os.cpu_count()},
          open(out, "w"))
sys.exit(p.returncode)
CPUEOF
  done
  stop_server
  after=$(engine "$MODEL")
  echo "$MODEL $before $after $fps" >> "$TMP/engines.txt"
done

$PY - "$TMP" "$FRAMES" "$THREADS" "$PRECISION" "${ENGINE_BATCH:-$FRAMES}" <<'PYEOF'
import json, os, sys
tmp, frames, threads, precision, ebatch = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu}, {os.cpu_count()} cores; {threads} engine threads, 1 worker; requests of {frames} frames; "
      f"precision {precision} (server and bare engine)" + (f"; engine_batch {ebatch}" if ebatch != frames else "") + "\n")
print("| model | engine frames/s (batch %d) | bound at 25 FPS | user rate | bound at that rate | users, InferBatch (raw) | users, InferBatchComposite (JPEG) | composite / raw | raw / bound | composite / bound |" % ebatch)
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
rows = []
for line in open(os.path.join(tmp, "engines.txt")):
    model, before, after, fps = line.split()
    eng = (float(before) + float(after)) / 2
    fps = float(fps)
    bound25, bound = eng * 15 / 4 / 25, eng * 15 / 4 / fps
    cap = {r: json.load(open(os.path.join(tmp, f"{model}.{r}.json")))["capacity"]["max_users"] for r in ("infer", "composite")}
    times = {r: json.load(open(os.path.join(tmp, f"{model}.{r}.times.json"))) for r in ("infer", "composite")}
    cpu = {r: json.load(open(os.path.join(tmp, f"{model}.{r}.cpu.json"))) for r in ("infer", "composite")}
    rows.append((model, times, cpu, cap, bound, fps))
    print(f"| {model} | {eng:.2f} ({float(before):.2f} / {float(after):.2f}) | {bound25:.2f} | {fps:g} FPS{'' if fps == 25 else ' (reduced)'} "
          f"| {bound:.2f} | **{cap['infer']}** | **{cap['composite']}** | "
          f"{cap['composite'] / cap['infer'] if cap['infer'] else float('nan'):.2f} | {cap['infer'] / bound:.2f} | {cap['composite'] / bound:.2f} |")
print("\nDesign documents (GPU, 25 FPS): 150 FPS per worker, 22 users per worker, 80-90 users per GPU with 4 workers "
      "(bound 150 x 15/4 / 25 = 22.5 users per worker).\n")
print("CPU per request and the co-located ceiling: client and server share this machine's cores, so the users it "
      "can hold are at most (cores x 1000 ms / CPU ms per request, server and client) requests/s x %d frames x 15/4 "
      "/ rate (1 client, 8 requests; CPU from /proc). An estimate: under load the engine's team also waits for "
      "cores it shares, and a capacity search's levels are short.\n" % frames)
print("| model | rpc | engine threads ms | rest of server ms | client ms | engine share | co-located ceiling (users) | users / ceiling |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for model, times, cpu, cap, bound, fps in rows:
    for r, c in cpu.items():
        tot = c["engine_ms"] + c["server_other_ms"] + c["client_ms"]
        ceil = c["cpus"] * 1000 / tot * frames * 15 / 4 / fps if tot > 0 else float("nan")
        print(f"| {model} | {r} | {c['engine_ms']:.0f} | {c['server_other_ms']:.0f} | {c['client_ms']:.0f} | "
              f"{c['engine_ms'] / tot if tot > 0 else float('nan'):.2f} | {ceil:.1f} | {cap[r] / ceil if ceil > 0 else float('nan'):.2f} |")
print()
print("Per request (closed loop, 2 clients, %d frames):\n" % frames)
print("| model | rpc | server inference p50 ms | composite p50 ms | encode p50 ms | background p50 ms | queue p50 ms | KB per frame |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for model, times, *_ in rows:
    for r, j in times.items():
        lip = j.get("lipsync", {})
        g = lambda d, k: d.get(k, {}).get("p50", float("nan"))
        print(f"| {model} | {r} | {g(j, 'server_compute_ms'):.1f} | {g(lip, 'server_composite_ms'):.1f} | {g(lip, 'server_encode_ms'):.1f} "
              f"| {g(lip, 'server_background_ms'):.2f} | {g(j, 'server_queue_ms'):.2f} | {lip.get('bytes_per_frame', 0) / 1e3:.1f} |")
PYEOF
