#!/usr/bin/env bash
# The body of `make bench` (called after the build and the models exist): runs mtserve and ONNX
# Runtime (tools/ort/ort_bench.js) back to back on every reference model except tiny, at each batch
# and thread count, and prints a Markdown table (samples/s, ratio, achieved GFLOP/s) plus a table of
# model load times, to stdout and to build/bench-engine.md. Progress goes to stderr.
#
# Iteration policy: each mtserve config is first timed with one cold run; then it runs with enough
# iterations for about BENCH_SECONDS (default 2) s, at least 3 (at most 200), after one warm-up.
# Configs whose single run takes >= BENCH_HEAVY_MS (default 4000) ms get 2 iterations and no
# warm-up (the timing run already paged everything in). ORT gets one warm-up and runs until both 3
# iterations and BENCH_SECONDS s are reached (heavy configs: 2 iterations).
#
# Env knobs: BENCH_MODELS="a b" (model names in models/out), BENCH_BATCHES="1 8",
# BENCH_THREADS="1 2", BENCH_ROUNDS=N (mtserve and ORT alternate N times per config; the table
# shows the medians: the shared machine's speed drifts by +-30 % within minutes), BENCH_QUICK=1 (one iteration each, no timing run: smoke test),
# BENCH_DIMS="S=64" (values for symbolic dims other than the batch), MTSERVE (binary path).
set -uo pipefail
cd "$(dirname "$0")/.."

MTSERVE=${MTSERVE:-build/mtserve}
MODELS_DIR=models/out
ORT_BENCH=tools/ort/ort_bench.js
OUT_MD=build/bench-engine.md
BATCHES=${BENCH_BATCHES:-1 8}
THREADS=${BENCH_THREADS:-1 2}
QUICK=${BENCH_QUICK:-0}
DIMS=${BENCH_DIMS:-S=64}
SECS=${BENCH_SECONDS:-2}
HEAVY_MS=${BENCH_HEAVY_MS:-4000}
ROUNDS=${BENCH_ROUNDS:-1}

log() { echo "bench: $*" >&2; }

# jget KEY JSON: the numeric value of "KEY" in a one-object JSON text (empty if absent)
jget() { printf '%s' "$2" | tr -d '\n' | grep -o "\"$1\": *[-0-9.eE+]*" | head -n1 | sed 's/.*: *//'; }
# calc EXPR: floating-point arithmetic through awk
calc() { awk "BEGIN { printf \"%s\", $1 }" </dev/null; }
# median V...: the median of the values (empty if none)
median() { [ $# -gt 0 ] && printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

if [ ! -x "$MTSERVE" ]; then
  log "$MTSERVE not found; run 'make build' first"; exit 2
fi

if [ -n "${BENCH_MODELS:-}" ]; then
  MODELS=$BENCH_MODELS
else
  MODELS=$(ls "$MODELS_DIR"/*.onnx 2>/dev/null | xargs -n1 basename 2>/dev/null | sed 's/\.onnx$//' \
             | grep -vx tiny | sort -V | tr '\n' ' ')
fi
if [ -z "${MODELS// /}" ]; then
  log "no models in $MODELS_DIR; run 'make models' first"; exit 2
fi

HAVE_ORT=1
if ! command -v node >/dev/null || ! (cd tools/ort && node -e "require('onnxruntime-node')" 2>/dev/null); then
  HAVE_ORT=0
  log "onnxruntime-node is not available (npm install in tools/ort); ORT columns will be n/a"
fi

mkdir -p build
t_start=$SECONDS
load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)
git_desc="$(git rev-parse --short HEAD 2>/dev/null | sed 's/^/git /')$(git diff --quiet HEAD -- src 2>/dev/null || echo ' (+ local changes)')"
failures=0
rows=()       # Markdown table rows, in run order
load_rows=()

for model in $MODELS; do
  path=$MODELS_DIR/$model.onnx
  if [ ! -f "$path" ]; then
    log "$path not found; skipped"; failures=$((failures + 1)); continue
  fi
  # --dim options for the symbolic dims this model's inputs actually use
  info=$("$MTSERVE" inspect --json "$path" 2>/dev/null) || { log "inspect failed on $path"; failures=$((failures + 1)); continue; }
  inputs_line=$(printf '%s\n' "$info" | grep '"inputs"')
  dimargs=()
  for d in $DIMS; do
    if printf '%s' "$inputs_line" | grep -q "\"${d%%=*}\""; then dimargs+=(--dim "$d"); fi
  done
  [ ${#dimargs[@]} -gt 0 ] && info=$("$MTSERVE" inspect --json "$path" "${dimargs[@]}" 2>/dev/null)
  gflop=$(jget gflop_per_sample "$info")
  gflop=${gflop:-0}
  m_load=""; o_load=""; m_plan=""

  for batch in $BATCHES; do
    for threads in $THREADS; do
      t_cfg=$SECONDS
      common=(--batch "$batch" --threads "$threads" "${dimargs[@]}")
      heavy=0
      if [ "$QUICK" = 1 ]; then
        m_iters=1; m_warm=0; o_iters=1; o_secs=0
      else
        # timing run: one cold iteration
        probe=$("$MTSERVE" run "$path" "${common[@]}" --iters 1 --warmup 0 --json 2>/dev/null)
        p_ms=$(jget median_ms "$probe")
        if [ -z "$p_ms" ]; then
          log "$model batch $batch threads $threads: mtserve run failed"
          rows+=("| $model | $batch | $threads | fail | | | |"); failures=$((failures + 1)); continue
        fi
        if [ "$(calc "($p_ms >= $HEAVY_MS) ? 1 : 0")" = 1 ]; then
          heavy=1; m_iters=2; m_warm=0; o_iters=2; o_secs=0
        else
          m_iters=$(calc "int($SECS * 1000 / ($p_ms > 0.001 ? $p_ms : 0.001)) + 1")
          [ "$m_iters" -lt 3 ] && m_iters=3
          [ "$m_iters" -gt 200 ] && m_iters=200
          m_warm=1; o_iters=3; o_secs=$SECS
        fi
      fi

      m_all=(); o_all=(); o_n=""
      for round in $(seq 1 "$ROUNDS"); do
        m_json=$("$MTSERVE" run "$path" "${common[@]}" --iters "$m_iters" --warmup "$m_warm" --json 2>/dev/null)
        v=$(jget throughput_per_s "$m_json"); [ -n "$v" ] && m_all+=("$v")
        ml=$(jget load_ms "$m_json")
        if [ -n "$ml" ] && { [ -z "$m_load" ] || [ "$(calc "($ml < $m_load) ? 1 : 0")" = 1 ]; }; then m_load=$ml; fi
        mp=$(jget plan_ms "$m_json")
        if [ "$batch" = 1 ] && [ -n "$mp" ] && { [ -z "$m_plan" ] || [ "$(calc "($mp < $m_plan) ? 1 : 0")" = 1 ]; }; then m_plan=$mp; fi
        if [ "$HAVE_ORT" = 1 ]; then
          o_json=$(node "$ORT_BENCH" "$path" "${common[@]}" --iters "$o_iters" --min-seconds "$o_secs" 2>/dev/null)
          v=$(jget throughput_per_s "$o_json"); [ -n "$v" ] && o_all+=("$v")
          o_n=$(jget iters "$o_json")
          ol=$(jget load_ms "$o_json")
          if [ -n "$ol" ] && { [ -z "$o_load" ] || [ "$(calc "($ol < $o_load) ? 1 : 0")" = 1 ]; }; then o_load=$ol; fi
        fi
      done
      m_tp=$(median "${m_all[@]}"); o_tp=""
      if [ "$HAVE_ORT" = 1 ]; then
        o_tp=$(median "${o_all[@]}")
        [ -z "$o_tp" ] && { log "$model batch $batch threads $threads: ORT run failed"; failures=$((failures + 1)); }
      fi
      [ -z "$m_tp" ] && { log "$model batch $batch threads $threads: mtserve run failed"; failures=$((failures + 1)); }

      m_cell=${m_tp:-fail}; o_cell=${o_tp:-n/a}; [ "$HAVE_ORT" = 1 ] && [ -z "$o_tp" ] && o_cell=fail
      ratio=""; gfs=""
      [ -n "$m_tp" ] && m_cell=$(calc "sprintf(\"%.2f\", $m_tp)")
      [ -n "$o_tp" ] && o_cell=$(calc "sprintf(\"%.2f\", $o_tp)")
      [ -n "$m_tp" ] && [ -n "$o_tp" ] && ratio=$(calc "sprintf(\"%.2f\", $m_tp / $o_tp)")
      if [ -n "$m_tp" ]; then
        if [ "$(calc "($gflop > 0) ? 1 : 0")" = 1 ]; then gfs=$(calc "sprintf(\"%.1f\", $gflop * $m_tp)"); else gfs="n/a"; fi
      fi
      rows+=("| $model | $batch | $threads | $m_cell | $o_cell | ${ratio:-} | ${gfs:-} |")
      log "$model batch=$batch threads=$threads: mtserve $m_cell/s (${m_iters} it$([ $heavy = 1 ] && echo ', heavy')), ORT $o_cell/s (${o_n:-?} it), ratio ${ratio:-?} [$((SECONDS - t_cfg)) s]"
    done
  done
  gcell=$gflop; [ "$(calc "($gflop > 0) ? 1 : 0")" = 1 ] || gcell="n/a"
  ready="?"; [ -n "$m_load" ] && [ -n "$m_plan" ] && ready=$(calc "sprintf(\"%.1f\", $m_load + $m_plan)")
  load_rows+=("| $model | $gcell | ${m_load:-?} | ${m_plan:-?} | $ready | ${o_load:-n/a} |")
done

elapsed=$((SECONDS - t_start))
{
  echo "## mtserve vs ONNX Runtime (CPU)"
  echo
  echo "- machine: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //'), $(nproc) cores;" \
       "load average at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  echo "- mtserve: $MTSERVE, source $git_desc at start"
  if [ "$HAVE_ORT" = 1 ]; then
    echo "- ONNX Runtime: $(cd tools/ort && node -e "console.log(require('onnxruntime-node').env.versions.node)" 2>/dev/null) (onnxruntime-node, CPU EP, graph optimization 'all', sequential)"
  fi
  [ "$QUICK" = 1 ] && echo "- BENCH_QUICK=1: one iteration per config; the numbers are not meaningful"
  [ "$ROUNDS" -gt 1 ] && echo "- each config: $ROUNDS rounds of mtserve then ORT; the table gives the median round of each"
  echo "- samples/s = batch / median latency; ratio = mtserve / ORT; GFLOP/s = mtserve samples/s x GFLOP per sample (mtserve inspect)"
  echo
  echo "| model | batch | threads | mtserve samples/s | ORT samples/s | mtserve/ORT | mtserve GFLOP/s |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Load: mtserve parse + map (load ms), then the batch-1 plan built: weights packed, primitives"
  echo "created (plan ms); ready = load + plan, best of the runs. ORT: session creation."
  echo
  echo "| model | GFLOP/sample | mtserve load ms | mtserve plan ms | mtserve ready ms | ORT load ms |"
  echo "|---|---:|---:|---:|---:|---:|"
  printf '%s\n' "${load_rows[@]}"
  echo
  echo "Total benchmark time: ${elapsed} s."
} > "$OUT_MD.tmp"
mv "$OUT_MD.tmp" "$OUT_MD"
cat "$OUT_MD"
log "done in ${elapsed} s; table written to $OUT_MD"
[ "$failures" -eq 0 ] || { log "$failures run(s) failed"; exit 1; }
