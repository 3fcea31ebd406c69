#!/usr/bin/env bash
# The body of `make bench-embed`: sentence-embedding throughput of mtserve against ONNX Runtime
# on the same model (models/out/minilm_like.onnx, MiniLM-L6-sized) at batch 1, 8 and 32, THREADS
# intra-op threads each (default 2). mtserve's side is `mtserve embed --bench` on requests of
# batch texts (the texts in order, b at a time): tokenization,
# bucketing, padding, inference (padding-free: only the real tokens' rows), mean pooling and
# normalization of the 64 texts of bench/embed_texts.txt (10 to 16 tokens each, so one length
# bucket of 16). ONNX Runtime's side is tools/ort/ort_bench.js on already-padded [batch, S] int64
# inputs (tokenization and pooling excluded), S the mean over the batches of the texts, taken in
# order, of their longest text: what a server padding each batch to its longest text gives ONNX
# Runtime (batch 1: the texts' mean length). Both run in this invocation, alternately per batch
# size; the CPU is named. NOPADFREE=1 adds a column with padding-free runs off (MTS_NO_PADFREE).
# BENCH_SECONDS (default 3) is the measuring time of each point. The mtserve and ONNX Runtime runs
# are repeated ROUNDS times (default 3) in back-to-back pairs: texts/s are the medians, embed/ORT
# the median of the pairs' ratios (each round's ratio is printed below the table). Each round
# also runs mtserve at `--precision fp16` (few-row products on IEEE half weights, docs/engine.md;
# from batch 8 the products have more rows and keep float weights): the fp16 columns.
# The embedding_policy columns: `mtserve tune --embedding --policy` runs requests of B texts the
# way the server does, tokenization included, once as one batch on one worker with THREADS
# threads (no policy, idle device) and once as the policy says (split over W workers of T
# threads); POLICY (compact form, e.g. 1:1x2,32:2x1) is the policy, by default the one a
# `mtserve tune --embedding` sweep over batch 1, 8, 32 on these texts picks first (SWEEP_SECONDS
# per setting, default 1). scripts/bench-embed-serve.py then measures the same policy through a
# running server (/v1/embeddings, one client), with vs without.
set -euo pipefail
cd "$(dirname "$0")/.."
MTSERVE=${MTSERVE:-build/mtserve}
MODEL=${MODEL:-models/out/minilm_like.onnx}
THREADS=${THREADS:-2}
SECS=${BENCH_SECONDS:-3}
ROUNDS=${ROUNDS:-3}
TEXTS=bench/embed_texts.txt
[ -x "$MTSERVE" ] || { echo "bench-embed: $MTSERVE is missing (make build)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "bench-embed: $MODEL is missing (make models)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/minilm"
ln -s "$(readlink -f "$MODEL")" "$work/minilm/model.onnx"
/usr/bin/python3 models/gen/bert_vocab.py "$work/minilm/vocab.txt" >/dev/null
printf 'tokenizer: vocab.txt\npooling: mean\nnormalize: true\nmax_tokens: 128\n' > "$work/minilm/config.yaml"
# the texts' token counts
"$MTSERVE" embed "$work/minilm" --tokens - < "$TEXTS" | awk '{ print NF }' > "$work/lengths"
longest=$(awk '{ if ($1 > m) m = $1 } END { print m }' "$work/lengths")
# ONNX Runtime's padded length at batch b: the mean of each batch's longest text, rounded
ort_len() { /usr/bin/python3 -c "import sys
n=[int(x) for x in open(sys.argv[1])]; b=int(sys.argv[2])
m=[max(n[i:i + b]) for i in range(0, len(n), b)]; print(round(sum(m) / len(m)))" "$work/lengths" "$1"; }
# the bucket every text falls into: the next power of two from 8 above the longest
bucket=8
while [ "$bucket" -lt "$longest" ]; do bucket=$((bucket * 2)); done
cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
flags=$(grep -o -w -E 'avx2|fma|avx512f|avx512_vnni|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "bench-embed: $cpu; flags: ${flags% }; $THREADS threads; $(wc -l < "$TEXTS") texts of up to $longest tokens (bucket $bucket)"
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
if [ -z "${POLICY:-}" ]; then
  POLICY=$("$MTSERVE" tune "$work/minilm" --embedding --texts "$TEXTS" --batches 1,8,32 --cores "$THREADS" \
           --seconds "${SWEEP_SECONDS:-1}" --json 2>/dev/null | /usr/bin/python3 -c "import json,sys
print(','.join('%d:%dx%d' % (e['max_batch'], e['workers'], e['threads']) for e in json.load(sys.stdin)['embedding_policy']))")
fi
echo "bench-embed: embedding_policy $POLICY; load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %16s %16s %10s %16s %6s %16s %10s %10s %10s %13s %10s\n' batch "mtserve texts/s" "no-policy" "policy WxT" \
  "policy texts/s" "ORT S" "ORT texts/s" "embed/ORT" "policy/ORT" "policy/no" "fp16 texts/s" "fp16/ORT"
compare() { /usr/bin/python3 -c "import json,sys; c=json.load(sys.stdin)['compare'][0]
print(c['without_texts_per_s'], c['with_texts_per_s'], '%dx%d' % (c['workers'], c['threads']))"; }
round_lines=()
median() { /usr/bin/python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
for b in 1 8 32; do
  olen=$(ort_len "$b")
  # ROUNDS pairs, each mtserve's run then ONNX Runtime's, back to back: the machine's speed
  # drifts by tens of percent between seconds, so the ratio is the median of the pairs' ratios
  o_runs=() r_runs=() ratios=() h_runs=() h_ratios=()
  for _ in $(seq "$ROUNDS"); do
    o=$("$MTSERVE" embed "$work/minilm" --bench "$SECS" --batch "$b" --threads "$THREADS" - < "$TEXTS" | field texts_per_s)
    h=$("$MTSERVE" embed "$work/minilm" --bench "$SECS" --batch "$b" --threads "$THREADS" --precision fp16 - \
          < "$TEXTS" 2>/dev/null | field texts_per_s)
    r=$(node tools/ort/ort_bench.js "$work/minilm/model.onnx" --batch "$b" --threads "$THREADS" --dim S="$olen" \
          --min-seconds "$SECS" --iters 10 | field throughput_per_s)
    o_runs+=("$o") r_runs+=("$r") ratios+=("$(/usr/bin/python3 -c "print('%.3f' % ($o / $r))")")
    h_runs+=("$h") h_ratios+=("$(/usr/bin/python3 -c "print('%.3f' % ($h / $r))")")
  done
  ours=$(median "${o_runs[@]}") ort=$(median "${r_runs[@]}") ratio=$(median "${ratios[@]}")
  half=$(median "${h_runs[@]}") hratio=$(median "${h_ratios[@]}")
  round_lines+=("bench-embed: batch $b, embed/ORT per round: ${ratios[*]} (median $ratio)")
  round_lines+=("bench-embed: batch $b, fp16/ORT per round: ${h_ratios[*]} (median $hratio)")
  read -r without with wt < <("$MTSERVE" tune "$work/minilm" --embedding --texts "$TEXTS" --batches "$b" \
    --cores "$THREADS" --seconds "$SECS" --policy "$POLICY" --json 2>/dev/null | compare)
  if [ "${NOPADFREE:-0}" = 1 ]; then
    whole=$(MTS_NO_PADFREE=1 "$MTSERVE" embed "$work/minilm" --bench "$SECS" --batch "$b" --threads "$THREADS" - < "$TEXTS" | field texts_per_s)
    echo "bench-embed: batch $b padding-free off: $whole texts/s (on: $ours, $(/usr/bin/python3 -c "print('%.2fx' % ($ours / $whole))"))"
  fi
  printf '%-6s %16.1f %16.1f %10s %16.1f %6s %16.1f %9.2fx %9.2fx %9.2fx %13.1f %9.2fx\n' "$b" "$ours" "$without" "$wt" \
    "$with" "$olen" "$ort" "$ratio" "$(/usr/bin/python3 -c "print($with / $ort)")" \
    "$(/usr/bin/python3 -c "print($with / $without)")" "$half" "$hratio"
done
printf '%s\n' "${round_lines[@]}"
# the same policy through the server: /v1/embeddings, one client, with vs without
/usr/bin/python3 scripts/bench-embed-serve.py "$MTSERVE" "$work/minilm" "$TEXTS" "$POLICY" "$SECS"
echo "bench-embed: load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
