#!/usr/bin/env bash
# Tokenizer speed: tokens per second of src/text (mts-tokenize --bench) against the reference
# library (Hugging Face tokenizers 0.22, Rust, through its Node binding: tools/tok/tok_oracle.js
# --bench), on the same 1,000 generated texts (tests/text/gen_texts.py --seed 7), 512-token limit,
# for each real tokenizer file of the oracle test. Prints the CPU and, per file, both rates and
# their ratio. The reference is timed two ways: encodeBatch of 64 texts (its thread pool) and
# one text at a time (what a server handling one request does); both include the binding's
# per-call cost (JS strings in, a JS object out).
#   usage: scripts/bench-tokenizers.sh [ROUNDS]   (default 5; needs build/mts-tokenize, tools/tok)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
BIN=${MTS_TOKENIZE:-build/mts-tokenize}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lscpu | grep 'Model name' | sed 's/  */ /g'
echo "flags: $(grep -o -w -E 'avx2|avx512f|avx512bw|sse4_2' /proc/cpuinfo | sort -u | tr '\n' ' ')cores: $(nproc)"
/usr/bin/python3 tests/text/gen_texts.py --n 1000 --seed 7 "$tmp/texts.jsonl"
eval "$(/usr/bin/python3 - <<'PY'
import sys
sys.path.insert(0, "tests/text")
import fetch_tokenizers as f
for k in f.FILES:
    print(f'{k.replace(".", "_")}={f.fetch(k)}')
PY
)"
node tools/tok/gpt2_json.js "$gpt2_encodings_ts" "$gpt2_bpe_vocab_ts" "$tmp/gpt2.json" >/dev/null
rate() { sed -n 's/.* \([0-9][0-9]*\) tokens\/s.*/\1/p' | head -1; }
printf '%-26s %12s %14s %14s %8s %8s\n' tokenizer mtserve/s "ref batch/s" "ref single/s" x-batch x-single
for spec in "bert vocab.txt:$bert_uncased_vocab_txt:--vocab-txt" "llama2 BPE (byte fallback):$llama2_tokenizer_json:" \
            "gpt2 byte-level BPE:$tmp/gpt2.json:" "llama3 (cl100k regex) BPE:$llama3_tokenizer_json:" \
            "qwen3 (NFC, regex) BPE:$qwen3_tokenizer_json:"; do
  IFS=: read -r name file oflag <<<"$spec"
  c=$("$BIN" --max 512 --bench "$ROUNDS" "$file" "$tmp/texts.jsonl" 2>&1 >/dev/null | rate)
  o=$(node tools/tok/tok_oracle.js $oflag --max 512 --bench "$ROUNDS" "$file" "$tmp/texts.jsonl" 2>&1 >/dev/null)
  ob=$(echo "$o" | grep encodeBatch | rate)
  os=$(echo "$o" | grep 'one at a time' | rate)
  printf '%-26s %12s %14s %14s %8.1f %8.1f\n' "$name" "$c" "$ob" "$os" "$(echo "$c / $ob" | bc -l)" "$(echo "$c / $os" | bc -l)"
done
