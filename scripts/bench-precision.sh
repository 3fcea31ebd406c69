#!/usr/bin/env bash
# The body of `make bench-precision`: per reference model, mtserve's throughput in fp32, in bf16
# (`mtserve run --precision`) and in int8 (below), the ratio bf16/fp32, ONNX Runtime's fp32 throughput in the same run
# (tools/ort/ort_bench.js) and the ratio to it, and the bf16 output's error against fp32 on the
# same seeded inputs (max abs difference and relative L2 over all outputs), with the precision the
# guard settled on. Prints the CPU model and its bf16-related flags, then a Markdown table (also
# written to build/bench-precision.md). Progress goes to stderr.
#
# Each config runs BENCH_ROUNDS (default 3) rounds of fp32, bf16, ORT back to back; the table shows
# the median of each (the shared machine's speed drifts). Each mtserve run takes about
# BENCH_SECONDS (default 2) s of iterations after one warm-up.
#
# int8: each model is quantized by `mtserve quantize --calibration random:4` (post-training,
# static, QDQ; defaults), and the lip-sync UNets a second time with `--target-error 0.0156` (the
# 4/255 budget of their pixel outputs, met on the calibration set by keeping the most sensitive
# layers in float); each round then also times mtserve on the QDQ file and ONNX Runtime on the
# same file, and a second table gives int8's throughput against fp32, bf16, ONNX Runtime fp32 and
# ONNX Runtime int8, its error against fp32 on the same seeded inputs as bf16's, and the
# quantizer's own maximum error on its calibration set where it measured one.
#
# Last, the conversational-user capacity of lipsync_unet_w8 at fp32 and at bf16
# (scripts/bench-lipsync-capacity.sh with PRECISION, about 7 minutes; BENCH_CAPACITY=0 leaves it
# out), with the ratios bf16 / fp32 of the users held.
#
# Env knobs: BENCH_MODELS="a b" (names in models/out; default the lip-sync UNets, seg_unet,
# cbam_resunet, mobilenetv3, bert_tiny), BENCH_BATCH (8), BENCH_THREADS (2), BENCH_ROUNDS (3),
# BENCH_SECONDS (2), BENCH_DIMS="S=64" (symbolic dims other than the batch), BENCH_INT8 (1; 0
# leaves int8 out), BENCH_INT8_QARGS (quantize options for every model's single int8 variant,
# replacing the defaults above), MTSERVE (binary).
set -uo pipefail
cd "$(dirname "$0")/.."

MTSERVE=${MTSERVE:-build/mtserve}
MODELS_DIR=models/out
ORT_BENCH=tools/ort/ort_bench.js
OUT_MD=build/bench-precision.md
MODELS=${BENCH_MODELS:-lipsync_unet_w8 lipsync_unet_w16 lipsync_unet_w32 seg_unet cbam_resunet mobilenetv3 bert_tiny}
BATCH=${BENCH_BATCH:-8}
THREADS=${BENCH_THREADS:-2}
ROUNDS=${BENCH_ROUNDS:-3}
SECS=${BENCH_SECONDS:-2}
DIMS=${BENCH_DIMS:-S=64}
PY=/usr/bin/python3

log() { echo "bench-precision: $*" >&2; }
jget() { printf '%s' "$2" | tr -d '\n' | grep -o "\"$1\": *[-0-9.eE+]*" | head -n1 | sed 's/.*: *//'; }
calc() { awk "BEGIN { printf \"%s\", $1 }" </dev/null; }
median() { [ $# -gt 0 ] && printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

[ -x "$MTSERVE" ] || { log "$MTSERVE not found; run 'make build' first"; exit 2; }
HAVE_ORT=1
if ! command -v node >/dev/null || ! (cd tools/ort && node -e "require('onnxruntime-node')" 2>/dev/null); then
  HAVE_ORT=0
  log "onnxruntime-node is not available (npm install in tools/ort); ORT columns will be n/a"
fi

mkdir -p build
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t_start=$SECONDS
load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)
rows=()
irows=()
failures=0
INT8=${BENCH_INT8:-1}

# errors DIR_A DIR_B: "maxabs rel_l2" over every .npy output present in both
errors() {
  "$PY" - "$1" "$2" <<'EOF'
import sys, glob, os
import numpy as np
a_dir, b_dir = sys.argv[1], sys.argv[2]
mx, num, den = 0.0, 0.0, 0.0
for f in sorted(glob.glob(os.path.join(a_dir, "*.npy"))):
    a = np.load(f).astype(np.float64)
    b = np.load(os.path.join(b_dir, os.path.basename(f))).astype(np.float64)
    if a.dtype.kind != "f" or a.size == 0:
        continue
    d = b - a
    mx = max(mx, float(np.abs(d).max()))
    num += float((d * d).sum()); den += float((a * a).sum())
print("%.2g %.2g" % (mx, (num / den) ** 0.5 if den > 0 else num ** 0.5))
EOF
}

for model in $MODELS; do
  path=$MODELS_DIR/$model.onnx
  [ -f "$path" ] || { log "$path not found; skipped"; failures=$((failures + 1)); continue; }
  info=$("$MTSERVE" inspect --json "$path" 2>/dev/null)
  inputs_line=$(printf '%s\n' "$info" | grep '"inputs"')
  dimargs=()
  for d in $DIMS; do
    printf '%s' "$inputs_line" | grep -q "\"${d%%=*}\"" && dimargs+=(--dim "$d")
  done
  common=(--batch "$BATCH" --threads "$THREADS" "${dimargs[@]}")
  # iterations for about SECS s, from one fp32 run
  probe=$("$MTSERVE" run "$path" "${common[@]}" --iters 1 --warmup 0 --json 2>/dev/null)
  p_ms=$(jget median_ms "$probe")
  [ -n "$p_ms" ] || { log "$model: mtserve run failed"; failures=$((failures + 1)); continue; }
  iters=$(calc "int($SECS * 1000 / ($p_ms > 0.001 ? $p_ms : 0.001)) + 1")
  [ "$iters" -lt 3 ] && iters=3
  [ "$iters" -gt 200 ] && iters=200
  # int8 variants: "label|quantize options"
  variants=()
  if [ "$INT8" = 1 ]; then
    if [ -n "${BENCH_INT8_QARGS+x}" ]; then variants=("${BENCH_INT8_QARGS:-defaults}|$BENCH_INT8_QARGS")
    else
      variants=("defaults|")
      case $model in lipsync_unet_*) variants+=("--target-error 0.0156|--target-error 0.0156") ;; esac
    fi
  fi
  qfiles=(); qkept=(); qcal=()
  for vi in "${!variants[@]}"; do
    qf=$tmp/$model.int8.$vi.onnx
    # shellcheck disable=SC2086  # the options are a list
    qout=$("$MTSERVE" quantize "$path" --calibration random:4 "${dimargs[@]}" -o "$qf" ${variants[$vi]#*|} 2>&1)
    if [ $? -ne 0 ] || [ ! -f "$qf" ]; then
      log "$model: quantize ${variants[$vi]%%|*} failed: $(printf '%s' "$qout" | tail -n1)"
      failures=$((failures + 1)); qf=""
    fi
    qfiles+=("$qf")
    qkept+=("$(printf '%s\n' "$qout" | grep -o 'kept_fp32=[0-9]*' | tail -n1 | sed 's/.*=//')")
    qcal+=("$(printf '%s\n' "$qout" | sed -n 's/^search .* max_error=\([0-9.e+-]*\).*/\1/p' | tail -n1)")
  done
  declare -A i_all=() oi_all=()
  f_all=(); b_all=(); o_all=()
  for round in $(seq 1 "$ROUNDS"); do
    j=$("$MTSERVE" run "$path" "${common[@]}" --iters "$iters" --json --precision fp32 2>/dev/null)
    v=$(jget throughput_per_s "$j"); [ -n "$v" ] && f_all+=("$v")
    j=$("$MTSERVE" run "$path" "${common[@]}" --iters "$iters" --json --precision bf16 2>"$tmp/bf16.err")
    v=$(jget throughput_per_s "$j"); [ -n "$v" ] && b_all+=("$v")
    if [ "$HAVE_ORT" = 1 ]; then
      j=$(node "$ORT_BENCH" "$path" "${common[@]}" --iters 3 --min-seconds "$SECS" 2>/dev/null)
      v=$(jget throughput_per_s "$j"); [ -n "$v" ] && o_all+=("$v")
    fi
    for vi in "${!qfiles[@]}"; do
      [ -n "${qfiles[$vi]}" ] || continue
      j=$("$MTSERVE" run "${qfiles[$vi]}" "${common[@]}" --iters "$iters" --json 2>/dev/null)
      v=$(jget throughput_per_s "$j"); [ -n "$v" ] && i_all[$vi]+="$v "
      if [ "$HAVE_ORT" = 1 ]; then
        j=$(node "$ORT_BENCH" "${qfiles[$vi]}" "${common[@]}" --iters 3 --min-seconds "$SECS" 2>/dev/null)
        v=$(jget throughput_per_s "$j"); [ -n "$v" ] && oi_all[$vi]+="$v "
      fi
    done
  done
  # "bf16 (guard 0.0024)" or "fp32 (guard failed)" from the precision line of the bf16 run
  pline=$(sed -n 's/^precision *//p' "$tmp/bf16.err" | head -n1)
  prec="${pline%% *}"
  g=$(printf '%s' "$pline" | grep -o 'rel_l2 [0-9.e+-]*' | sed 's/rel_l2 //')
  if [ -n "$g" ]; then prec="$prec (guard $g)"; elif [ -n "$pline" ]; then
    prec="$prec ($(printf '%s' "$pline" | sed 's/^[^:]*: *//; s/[|)].*//'))"; fi
  # error of the bf16 outputs against fp32 on the same seeded inputs (batch 2)
  rm -rf "$tmp/f" "$tmp/b"
  "$MTSERVE" run "$path" --batch 2 "${dimargs[@]}" --iters 1 --warmup 0 --precision fp32 --output "$tmp/f" >/dev/null 2>&1
  "$MTSERVE" run "$path" --batch 2 "${dimargs[@]}" --iters 1 --warmup 0 --precision bf16 --output "$tmp/b" >/dev/null 2>&1
  err=$(errors "$tmp/f" "$tmp/b" 2>/dev/null) || err="? ?"
  f_tp=$(median "${f_all[@]}"); b_tp=$(median "${b_all[@]}"); o_tp=$(median "${o_all[@]}")
  [ -n "$f_tp" ] && [ -n "$b_tp" ] || { log "$model: a run failed"; failures=$((failures + 1)); continue; }
  r_f=$(calc "sprintf(\"%.2f\", $b_tp / $f_tp)")
  r_o=n/a; r_fo=n/a; o_cell=n/a
  if [ -n "$o_tp" ]; then
    o_cell=$(calc "sprintf(\"%.2f\", $o_tp)")
    r_o=$(calc "sprintf(\"%.2f\", $b_tp / $o_tp)")
    r_fo=$(calc "sprintf(\"%.2f\", $f_tp / $o_tp)")
  fi
  f_cell=$(calc "sprintf(\"%.2f\", $f_tp)"); b_cell=$(calc "sprintf(\"%.2f\", $b_tp)")
  r_cell="**$r_f**"
  [ "${prec%% *}" = bf16 ] || r_cell="($r_f: ran fp32)"
  rows+=("| $model | $f_cell | $b_cell | $r_cell | $o_cell | $r_fo | $r_o | ${err% *} | ${err#* } | ${prec:-bf16} |")
  log "$model: fp32 $f_cell/s, bf16 $b_cell/s (x$r_f), ORT $o_cell/s; err ${err}; ${prec}"
  for vi in "${!qfiles[@]}"; do
    qf=${qfiles[$vi]}; label=${variants[$vi]%%|*}
    # shellcheck disable=SC2086  # space-separated samples
    i_tp=$(median ${i_all[$vi]:-}); oi_tp=$(median ${oi_all[$vi]:-})
    if [ -z "$qf" ] || [ -z "$i_tp" ]; then
      irows+=("| $model | $label | - | failed | | | | | | | | | |"); continue
    fi
    rm -rf "$tmp/i"
    "$MTSERVE" run "$qf" --batch 2 "${dimargs[@]}" --iters 1 --warmup 0 --output "$tmp/i" >/dev/null 2>&1
    ierr=$(errors "$tmp/f" "$tmp/i" 2>/dev/null) || ierr="? ?"
    i_cell=$(calc "sprintf(\"%.2f\", $i_tp)")
    r_if=$(calc "sprintf(\"%.2f\", $i_tp / $f_tp)"); r_ib=$(calc "sprintf(\"%.2f\", $i_tp / $b_tp)")
    r_io=n/a; oi_cell=n/a; r_ioi=n/a
    [ -n "$o_tp" ] && r_io=$(calc "sprintf(\"%.2f\", $i_tp / $o_tp)")
    if [ -n "$oi_tp" ]; then
      oi_cell=$(calc "sprintf(\"%.2f\", $oi_tp)"); r_ioi=$(calc "sprintf(\"%.2f\", $i_tp / $oi_tp)")
    fi
    emax=${ierr% *}; cal=${qcal[$vi]:-}
    case $model in lipsync_unet_*) # pixels in [0, 1]: the error in 1/255 steps too
      emax="$emax ($(calc "sprintf(\"%.2f\", ${ierr% *} * 255)" 2>/dev/null)/255)"
      [ -n "$cal" ] && cal="$cal ($(calc "sprintf(\"%.2f\", $cal * 255)")/255)" ;;
    esac
    irows+=("| $model | $label | ${qkept[$vi]:-?} | $i_cell | **$r_if** | $r_ib | $r_io | $oi_cell | **$r_ioi** | $emax | ${ierr#* } | ${cal:--} |")
    log "$model int8 ($label): $i_cell/s (x$r_if fp32, x$r_ioi ORT int8 $oi_cell/s); err ${ierr}"
  done
  unset i_all oi_all
done

# Conversational users of lipsync_unet_w8 at fp32 and at bf16 (scripts/bench-lipsync-capacity.sh,
# as `make bench-capacity`: gRPC InferBatch raw and InferBatchComposite JPEG, 16-frame requests)
caprows=()
if [ "${BENCH_CAPACITY:-1}" = 1 ]; then
  declare -A capraw=() capcomp=()
  for p in fp32 bf16; do
    log "capacity of lipsync_unet_w8 at $p (about 3-4 minutes)"
    cout=$(MODELS=lipsync_unet_w8 PRECISION=$p MTSERVE=$MTSERVE bash scripts/bench-lipsync-capacity.sh 2>"$tmp/cap.err")
    row=$(printf '%s\n' "$cout" | grep '^| lipsync_unet_w8 |' | head -n1)
    if [ -z "$row" ]; then
      log "capacity at $p failed: $(tail -n2 "$tmp/cap.err")"; failures=$((failures + 1)); continue
    fi
    fps=$(printf '%s' "$row" | awk -F'|' '{gsub(/^ +| +$/, "", $3); print $3}')
    bound=$(printf '%s' "$row" | awk -F'|' '{gsub(/ /, "", $6); print $6}')
    capraw[$p]=$(printf '%s' "$row" | awk -F'|' '{gsub(/[ *]/, "", $7); print $7}')
    capcomp[$p]=$(printf '%s' "$row" | awk -F'|' '{gsub(/[ *]/, "", $8); print $8}')
    caprows+=("| $p | $fps | $bound | ${capraw[$p]} | ${capcomp[$p]} |")
  done
  ratio() { [ -n "${1:-}" ] && [ -n "${2:-}" ] && [ "$2" != 0 ] && calc "sprintf(\"%.2f\", $1 / $2)" || echo n/a; }
  [ "${#caprows[@]}" -eq 2 ] && caprows+=("| bf16 / fp32 | | | $(ratio "${capraw[bf16]}" "${capraw[fp32]}") | $(ratio "${capcomp[bf16]}" "${capcomp[fp32]}") |")
fi

elapsed=$((SECONDS - t_start))
{
  echo "## fp32, bf16 and int8 (\`make bench-precision\`)"
  echo
  echo "- machine: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1), $(nproc) cores;" \
       "flags: $(grep -m1 -o -w 'avx512f\|avx512_vnni\|avx512vbmi\|avx512_bf16\|amx_bf16\|amx_int8\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')" \
       "(fast bf16 kernels need avx512f; native bf16 is avx512_bf16 or amx_bf16)"
  echo "- load average at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  echo "- batch $BATCH, $THREADS threads; $ROUNDS rounds of fp32, bf16, ORT per model, medians; mtserve $MTSERVE," \
       "$(git rev-parse --short HEAD 2>/dev/null)"
  [ "$HAVE_ORT" = 1 ] && echo "- ORT: onnxruntime-node, CPU EP, fp32 (its CPU provider does not run fp32 models in bf16)"
  echo "- error: bf16 outputs against fp32 on the same seeded random inputs (batch 2), all float outputs"
  echo
  echo "| model | fp32 samples/s | bf16 samples/s | bf16/fp32 | ORT fp32 samples/s | fp32/ORT | bf16/ORT | max abs err | rel L2 | precision (guard) |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
  printf '%s\n' "${rows[@]}"
  echo
  if [ "${#irows[@]}" -gt 0 ]; then
    echo "int8: \`mtserve quantize MODEL --calibration random:4 [options]\` (QDQ, per-channel int8 weights, uint8"
    echo "activations), timed in the same rounds; ONNX Runtime int8 runs the same QDQ file. Error: against mtserve fp32"
    echo "on the bf16 column's seeded inputs (not the calibration samples); \"calibration max\": the quantizer's own"
    echo "maximum on its 4 calibration samples, reported by --target-error."
    echo
    echo "| model | quantize options | layers kept float | int8 samples/s | int8/fp32 | int8/bf16 | int8/ORT fp32 | ORT int8 samples/s | int8/ORT int8 | max abs err | rel L2 | calibration max |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    printf '%s\n' "${irows[@]}"
    echo
  fi
  if [ "${#caprows[@]}" -gt 0 ]; then
    echo "Conversational users of lipsync_unet_w8 (25 FPS, 4 s speaking in 15 s; gRPC, 16-frame requests, the"
    echo "demo avatar; \`mtserve bench --api lipsync --find-capacity\` as in \`make bench-capacity\`; bound = engine"
    echo "frames/s x 15/4 / 25):"
    echo
    echo "| precision | engine frames/s (batch 16) | bound (users) | users, InferBatch (raw) | users, InferBatchComposite (JPEG) |"
    echo "|---|---:|---:|---:|---:|"
    printf '%s\n' "${caprows[@]}"
    echo
  fi
  echo "Total benchmark time: ${elapsed} s."
} > "$OUT_MD.tmp"
mv "$OUT_MD.tmp" "$OUT_MD"
cat "$OUT_MD"
[ "$failures" -eq 0 ] || { log "$failures model(s) failed"; exit 1; }
