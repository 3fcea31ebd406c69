#!/usr/bin/env bash
# The convolution ceiling and the width-32 lipsync-UNet against it (the target "w32 at >= 85 % of
# the measured convolution ceiling", `make bench-ceiling`). Builds four chains of eight 3x3 convs
# (tools/ceiling/conv_ceiling.py make), then for ROUNDS rounds runs, one after the other, every
# chain with mtserve and with ONNX Runtime and the model (MODEL, default lipsync_unet_w32) at each
# batch in BATCHES, all at THREADS threads; prints the median GFLOP/s of each (samples/s x GFLOP
# per sample) and the model's rate as a fraction of the ceiling (the best chain median of
# mtserve or ORT). The model's rate is given twice: by the nominal count (`mtserve inspect`) and
# by the work mtserve executes (upsample + 3x3 conv run as 2x2 phase convolutions:
# `conv_ceiling.py work`). Rounds interleave the runs so that a drift of the shared machine's
# speed hits all of them alike. Knobs: ROUNDS (3), THREADS (2), BATCHES ("1 8"), MODEL.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
MTSERVE=${MTSERVE:-build/mtserve}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
BATCHES=${BATCHES:-1 8}
MODEL=${MODEL:-lipsync_unet_w32}
DIR=build/ceiling
mkdir -p "$DIR"
log() { echo "bench-ceiling: $*" >&2; }

$PY tools/ceiling/conv_ceiling.py make "$DIR" >/dev/null || { log "cannot build the conv chains"; exit 2; }
model_path=models/out/$MODEL.onnx
[ -f "$model_path" ] || { log "$model_path not found; run 'make models'"; exit 2; }
work=$($PY tools/ceiling/conv_ceiling.py work "$model_path")
nominal=$(printf '%s\n' "$work" | awk '/nominal_gflop/{print $2}')
executed=$(printf '%s\n' "$work" | awk '/executed_gflop/{print $2}')
have_ort=1
(cd tools/ort && node -e "require('onnxruntime-node')" 2>/dev/null) || { have_ort=0; log "onnxruntime-node missing: ORT columns n/a"; }

chains="conv32_320 conv64_160 conv128_80 conv256_40"
declare -A res
mt_rate() { "$MTSERVE" run "$1" --batch "$2" --threads "$THREADS" --iters "$3" --warmup 1 --json 2>/dev/null |
              grep -o '"throughput_per_s": *[0-9.]*' | sed 's/.*: *//'; }
ort_rate() { node tools/ort/ort_bench.js "$1" --batch "$2" --threads "$THREADS" --iters "$3" --min-seconds 0 2>/dev/null |
               grep -o '"throughput_per_s":[0-9.]*' | cut -d: -f2; }
for r in $(seq 1 "$ROUNDS"); do
  for c in $chains; do
    res[mt_$c]+=" $(mt_rate "$DIR/$c.onnx" 1 3)"
    [ $have_ort = 1 ] && res[ort_$c]+=" $(ort_rate "$DIR/$c.onnx" 1 3)"
  done
  for b in $BATCHES; do
    it=3; [ "$b" -gt 1 ] && it=2
    res[model_$b]+=" $(mt_rate "$model_path" "$b" $it)"
  done
  log "round $r/$ROUNDS done"
done
med() { printf '%s\n' $1 | grep . | sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print 0}'; }
echo "Convolution ceiling, $THREADS threads, medians of $ROUNDS interleaved rounds (load $(cut -d' ' -f1-3 /proc/loadavg)):"
echo
echo "| conv chain (8 x 3x3, C ch, HW x HW, batch 1) | mtserve GFLOP/s | ORT GFLOP/s |"
echo "|---|---:|---:|"
ceiling=0
for c in $chains; do
  g_mt=$(awk "BEGIN{printf \"%.1f\", $(med "${res[mt_$c]}") * 15.099}")
  g_ort=n/a
  [ $have_ort = 1 ] && g_ort=$(awk "BEGIN{printf \"%.1f\", $(med "${res[ort_$c]:-}") * 15.099}")
  echo "| $c | $g_mt | $g_ort |"
  for g in $g_mt $g_ort; do
    [ "$g" != n/a ] && ceiling=$(awk "BEGIN{print ($g > $ceiling) ? $g : $ceiling}")
  done
done
echo
echo "Ceiling (best chain median): $ceiling GFLOP/s"
echo
echo "| model | batch | samples/s | nominal GFLOP/s | of ceiling | executed GFLOP/s | of ceiling |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for b in $BATCHES; do
  s=$(med "${res[model_$b]}")
  awk -v m="$MODEL" -v b="$b" -v s="$s" -v n="$nominal" -v e="$executed" -v c="$ceiling" 'BEGIN {
    printf "| %s | %d | %.2f | %.1f | %.0f %% | %.1f | %.0f %% |\n", m, b, s, s * n, 100 * s * n / c, s * e, 100 * s * e / c }'
done
echo
echo "(GFLOP per sample: nominal $nominal, executed $executed.)"
