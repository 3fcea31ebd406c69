#!/usr/bin/env bash
# The body of `make bench-int8`: post-training int8 quantization of the lip-sync model, timed.
# Quantizes models/out/lipsync_unet_w8.onnx (`mtserve quantize`, INT8_CAL seeded random
# calibration samples), then for ROUNDS rounds times, back to back in each round:
#   fp32     mtserve run on the float model
#   int8     mtserve run on the QDQ model (integer kernels through QDQ fusion)
#   ort-int8 ONNX Runtime (tools/ort/ort_bench.js) on the same QDQ file
# all at --batch BATCH --threads THREADS, and prints the median throughput of each, the ratios
# int8/fp32 and int8/ort-int8 (medians of the per-round ratios: the shared machine's speed
# drifts within minutes, so only ratios measured side by side mean much), the int8 output's max
# and mean abs error against fp32 on the calibration samples (tests/models/quant_check.py) and
# the CPU. Env knobs: INT8_MODEL (name in models/out), INT8_BATCH=8, INT8_THREADS=2,
# INT8_ROUNDS=3, INT8_ITERS=5, INT8_CAL=4, INT8_QARGS (extra `mtserve quantize` options, e.g.
# "--target-error 0.0156"), MTSERVE (binary).
set -uo pipefail
cd "$(dirname "$0")/.."

MTSERVE=${MTSERVE:-build/mtserve}
MODEL=${INT8_MODEL:-lipsync_unet_w8}
BATCH=${INT8_BATCH:-8}
THREADS=${INT8_THREADS:-2}
ROUNDS=${INT8_ROUNDS:-3}
ITERS=${INT8_ITERS:-5}
CAL=${INT8_CAL:-4}
QARGS=${INT8_QARGS:-}
PY=/usr/bin/python3

jget() { printf '%s' "$2" | tr -d '\n' | grep -o "\"$1\": *[-0-9.eE+]*" | head -n1 | sed 's/.*: *//'; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
calc() { awk "BEGIN { printf \"%.3f\", $1 }" </dev/null; }

[ -x "$MTSERVE" ] || { echo "bench-int8: $MTSERVE not found; run 'make build'" >&2; exit 2; }
src=models/out/$MODEL.onnx
[ -f "$src" ] || { echo "bench-int8: $src not found; run 'make models'" >&2; exit 2; }
work=$(mktemp -d /tmp/mts-int8.XXXXXX)
trap 'rm -rf "$work"' EXIT
q=$work/${MODEL}_int8.onnx
# shellcheck disable=SC2086  # QARGS is a list of options
"$MTSERVE" quantize "$src" --calibration "random:$CAL" -o "$q" $QARGS || exit 1

fp=(); i8=(); ort=(); r_fp=(); r_ort=()
for r in $(seq "$ROUNDS"); do
    a=$(jget throughput_per_s "$("$MTSERVE" run "$src" --batch "$BATCH" --threads "$THREADS" --iters "$ITERS" --json)")
    b=$(jget throughput_per_s "$("$MTSERVE" run "$q" --batch "$BATCH" --threads "$THREADS" --iters "$ITERS" --json)")
    c=$(jget throughput_per_s "$(node tools/ort/ort_bench.js "$q" --batch "$BATCH" --threads "$THREADS" \
                                --iters "$ITERS" 2>/dev/null)")
    [ -n "$a" ] && [ -n "$b" ] && [ -n "$c" ] || { echo "bench-int8: a run failed (round $r)" >&2; exit 1; }
    fp+=("$a"); i8+=("$b"); ort+=("$c")
    r_fp+=("$(calc "$b / $a")"); r_ort+=("$(calc "$b / $c")")
    echo "round $r: fp32 $a/s  int8 $b/s  ort-int8 $c/s" >&2
done

err=$(MTSERVE=$MTSERVE $PY tests/models/quant_check.py "$MODEL.onnx" 2>&1 | grep -E '^(PASS|FAIL) ')
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, flags:$(grep -o -w -E 'avx512f|avx512_vnni|avx512_bf16|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/^/ /')"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model $MODEL, batch $BATCH, $THREADS threads, $ROUNDS rounds x $ITERS iterations, quantize options: ${QARGS:-(defaults)}"
echo
echo "| engine | samples/s (median) |"
echo "|---|---|"
echo "| mtserve fp32 | $(median "${fp[@]}") |"
echo "| mtserve int8 (QDQ) | $(median "${i8[@]}") |"
echo "| ONNX Runtime int8 (same QDQ file) | $(median "${ort[@]}") |"
echo
echo "int8 / fp32 (mtserve): $(median "${r_fp[@]}")   int8 mtserve / ONNX Runtime: $(median "${r_ort[@]}")"
echo "output error: $err"
