#!/usr/bin/env bash
# The body of `make bench-embed`: sentence-embedding throughput of mtserve against ONNX Runtime
# on the same model (models/out/minilm_like.onnx, MiniLM-L6-sized) at batch 1, 8 and 32, THREADS
# intra-op threads each (default 2). mtserve's side is `mtserve embed --bench`: tokenization,
# bucketing, padding, inference, mean pooling and normalization of the 64 texts of
# bench/embed_texts.txt (10 to 16 tokens each, so one length bucket of 16). ONNX Runtime's side
# is tools/ort/ort_bench.js on already-padded [batch, 16] int64 inputs (tokenization and pooling
# excluded). Both run in this invocation, alternately per batch size; the CPU is named.
# BENCH_SECONDS (default 3) is the measuring time of each point.
set -euo pipefail
cd "$(dirname "$0")/.."
MTSERVE=${MTSERVE:-build/mtserve}
MODEL=${MODEL:-models/out/minilm_like.onnx}
THREADS=${THREADS:-2}
SECS=${BENCH_SECONDS:-3}
TEXTS=bench/embed_texts.txt
[ -x "$MTSERVE" ] || { echo "bench-embed: $MTSERVE is missing (make build)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "bench-embed: $MODEL is missing (make models)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/minilm"
ln -s "$(readlink -f "$MODEL")" "$work/minilm/model.onnx"
/usr/bin/python3 models/gen/bert_vocab.py "$work/minilm/vocab.txt" >/dev/null
printf 'tokenizer: vocab.txt\npooling: mean\nnormalize: true\nmax_tokens: 128\n' > "$work/minilm/config.yaml"
# the bucket every text falls into: the next power of two from 8 above the longest
longest=$("$MTSERVE" embed "$work/minilm" --tokens - < "$TEXTS" | awk '{ if (NF > m) m = NF } END { print m }')
bucket=8
while [ "$bucket" -lt "$longest" ]; do bucket=$((bucket * 2)); done
cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
flags=$(grep -o -w -E 'avx2|fma|avx512f|avx512_vnni|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "bench-embed: $cpu; flags: ${flags% }; $THREADS threads; $(wc -l < "$TEXTS") texts of up to $longest tokens (bucket $bucket)"
printf '%-6s %18s %18s %8s\n' batch "mtserve texts/s" "ORT texts/s" ratio
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
for b in 1 8 32; do
  ours=$("$MTSERVE" embed "$work/minilm" --bench "$SECS" --batch "$b" --threads "$THREADS" - < "$TEXTS" | field texts_per_s)
  ort=$(node tools/ort/ort_bench.js "$work/minilm/model.onnx" --batch "$b" --threads "$THREADS" --dim S="$bucket" \
        --min-seconds "$SECS" --iters 10 | field throughput_per_s)
  printf '%-6s %18.1f %18.1f %7.2fx\n' "$b" "$ours" "$ort" "$(/usr/bin/python3 -c "print($ours / $ort)")"
done
