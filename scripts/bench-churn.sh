#!/usr/bin/env bash
# Model churn benchmark (`make bench-churn`): 1,000 configured small models (generated
# by models/gen/churn.py: five architectures x seeds, a few KB to 1.3 MB each, same signature),
# capacity.max_models 100, Zipf(1.0) traffic from `mtserve bench` in open loop. Every request is
# tagged warm or cold by asking the server whether its model is resident just before sending it
# (--cold-probe), so latency is reported with and without cold loads; server statistics before
# and after give loads, loads/s, evictions and resident bytes. Prints Markdown; the raw JSON
# summary is kept in $OUT_JSON when set. About 2 minutes.
# Knobs: RATE (requests/s, default 300), DURATION (measured seconds, 60), WARMUP (20),
#        COUNT (models, 1000), MAX_MODELS (100), ZIPF (1.0), POLICY (lru), WORKERS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
MTSERVE=${MTSERVE:-build/mtserve}
RATE=${RATE:-300}
DURATION=${DURATION:-60}
WARMUP=${WARMUP:-20}
COUNT=${COUNT:-1000}
MAX_MODELS=${MAX_MODELS:-100}
ZIPF=${ZIPF:-1.0}
POLICY=${POLICY:-lru}
WORKERS=${WORKERS:-2}
CHURN=models/out/churn
TMP=$(mktemp -d)
SERVER=
cleanup() {
  if [ -n "$SERVER" ]; then kill -TERM "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

t0=$(date +%s.%N)
$PY models/gen/churn.py "$CHURN" "$COUNT"
gen_s=$($PY -c "import time; print('%.1f' % (time.time() - $t0))")
model_mb=$($PY -c "import glob,os; print('%.1f' % (sum(os.path.getsize(p) for p in glob.glob('$CHURN/churn_*.onnx')[:$COUNT]) / 1e6))")

{
  cat <<EOT
server:
  http_port: 0
  queue_size: 1000
gpus:
  count: 1
  worker_count_per_gpu: $WORKERS
capacity:
  max_models: $MAX_MODELS
  eviction_policy: $POLICY
models:
EOT
  for i in $(seq 0 $((COUNT - 1))); do
    n=$(printf 'churn_%04d' "$i")
    printf '  %s:\n    model_path: %s/%s.onnx\n' "$n" "$PWD/$CHURN" "$n"
  done
} > "$TMP/config.yaml"

"$MTSERVE" serve --config "$TMP/config.yaml" --http-port 0 --log-level warn > "$TMP/serve.out" 2> "$TMP/serve.err" &
SERVER=$!
for _ in $(seq 200); do grep -q serving "$TMP/serve.out" 2>/dev/null && break; sleep 0.1; done
URL=$(grep -o 'http://[0-9.]*:[0-9]*' "$TMP/serve.out" | head -1)
[ -n "$URL" ] || { echo "server did not start:"; cat "$TMP/serve.err"; exit 1; }

# Models in popularity order: churn_0000 is the most popular (rank 1).
MODELS=$(seq -f 'churn_%04g' 0 $((COUNT - 1)) | paste -sd, -)
CMD="mtserve bench --url URL --model churn_0000,...,churn_$(printf '%04d' $((COUNT - 1))) --zipf $ZIPF --rate $RATE --duration $DURATION --warmup $WARMUP --input x:FP32:-1,64 --cold-probe --json"
echo "running: $CMD" >&2
"$MTSERVE" bench --url "$URL" --model "$MODELS" --zipf "$ZIPF" --rate "$RATE" --duration "$DURATION" \
  --warmup "$WARMUP" --input x:FP32:-1,64 --cold-probe --json > "$TMP/bench.json"
[ -n "${OUT_JSON:-}" ] && cp "$TMP/bench.json" "$OUT_JSON"

$PY - "$TMP/bench.json" "$COUNT" "$MAX_MODELS" "$ZIPF" "$RATE" "$DURATION" "$WARMUP" "$gen_s" "$model_mb" "$POLICY" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
count, max_models, zipf, rate, dur, warm, gen_s, model_mb, policy = sys.argv[2:11]
c, s, lat = j["cold"], j["server"], j["latency_ms"]
w, k = c["latency_warm_ms"], c["latency_cold_ms"]
# hit rate the policy could reach at best: the max_models most popular models always resident
zs = float(zipf); n = int(count); m = int(max_models)
weights = [1.0 / (i + 1) ** zs for i in range(n)]
ideal = sum(weights[:m]) / sum(weights)
def f(x): return "%.2f" % x
print("| metric | value |")
print("|---|---|")
print(f"| models | {count} configured ({model_mb} MB of ONNX, generated in {gen_s} s), max_models {max_models}, {policy.upper()} |")
print(f"| traffic | Zipf({zipf}) open loop {rate} req/s, {dur} s measured after {warm} s warm-up |")
print(f"| requests | {j['requests']} ({j['ok']} ok, {j['errors']} errors {json.dumps(j['errors_by_code'])}), {f(j['throughput_rps'])} req/s served |")
print(f"| **hit rate** (served without a load) | **{c['hit_rate']:.3f}** ({c['warm_requests']} warm, {c['cold_requests']} cold; ideal static top-{max_models}: {ideal:.3f}) |")
if s.get("available"):
    print(f"| **loads** | **{s['loads']} ({f(s['loads_per_s'])}/s)**, {s['evictions']} evictions (whole run incl. warm-up) |")
    print(f"| resident at end | {s['resident_models']} models, **{s['resident_bytes'] / 1e6:.1f} MB** |")
print(f"| latency, all | p50 {f(lat['p50'])} ms, p99 {f(lat['p99'])} ms, max {f(lat['max'])} ms |")
print(f"| **latency, warm** (model resident) | **p50 {f(w['p50'])} ms, p99 {f(w['p99'])} ms** |")
print(f"| **latency, cold** (load needed) | **p50 {f(k['p50'])} ms, p99 {f(k['p99'])} ms** |")
p = j["pool"]
print(f"| client pool | {p['connections']} connections, exhausted: {str(p['exhausted']).lower()} |")
EOF
