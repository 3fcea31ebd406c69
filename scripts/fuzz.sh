#!/usr/bin/env bash
# The body of `make fuzz` (and of the fuzzing stage of `make test`): runs each libFuzzer target
# of build-fuzz/ (tests/fuzz/fuzz_*.c) for SECONDS seconds, one after the other, on a working
# copy of its seed corpus under build-fuzz/fuzz-work/<target>/corpus (inputs libFuzzer finds go
# there, so tests/fuzz/corpus only grows by deliberate commits; the copy is kept between runs).
# Prints per target the executions, the coverage (cov: edges, ft: features, from libFuzzer's
# final stats) and any crash, leak, timeout or out-of-memory report with its reproducer file.
# Exits non-zero when a target found something.
#   usage: scripts/fuzz.sh [SECONDS [TARGET...]]     (TARGET: json, fuzz_json, ...; default all)
# FUZZ_RUNS=N (the make test stage): N executions per target from a fixed seed instead of a
# time budget, so a given commit mutates the same inputs on every run (SECONDS then only caps a
# target that runs very slowly).
set -uo pipefail
cd "$(dirname "$0")/.."
B=build-fuzz
TESTDATA=/usr/share/libonnx-testdata/data/node
secs=${1:-60}
shift || true
targets=()
if [ $# -gt 0 ]; then
  for t in "$@"; do targets+=("fuzz_${t#fuzz_}"); done
else
  for f in tests/fuzz/fuzz_*.c; do t=$(basename "$f" .c); targets+=("$t"); done
fi
# LeakSanitizer on; UBSan reports are fatal (the build has -fno-sanitize-recover=undefined).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
printf '%-18s %12s %8s %8s  %s\n' target executions cov ft result
for t in "${targets[@]}"; do
  bin=$PWD/$B/$t
  if [ ! -x "$bin" ]; then echo "$t: $bin is missing (make build-fuzz)"; failed+=("$t"); continue; fi
  work=$B/fuzz-work/$t
  mkdir -p "$work/corpus" "$work/artifacts"
  [ -d "tests/fuzz/corpus/$t" ] && cp -n "tests/fuzz/corpus/$t"/* "$work/corpus/" 2>/dev/null
  # The ONNX node tests (Debian libonnx-testdata, a build dependency) are ~800 small models, one
  # or a few per operator, and their tensors: extra seeds for the model and TensorProto readers.
  if [ -d "$TESTDATA" ] && [ ! -e "$work/.testdata" ]; then
    case $t in
      fuzz_onnx) find "$TESTDATA" -name model.onnx -size -4k | while read -r f; do
                   cp "$f" "$work/corpus/node-$(basename "$(dirname "$f")").onnx"; done ;;
      fuzz_tensor_pb) find "$TESTDATA" -name '*.pb' -size -1k | head -300 | while read -r f; do
                   d=$(dirname "$f"); cp "$f" "$work/corpus/node-$(basename "$(dirname "$d")")-$(basename "$f")"; done ;;
    esac
    touch "$work/.testdata"
  fi
  before=$(ls "$work/artifacts" | wc -l)
  # -timeout: one input taking longer is a bug (each target bounds its work per input);
  # -rss_limit_mb / -malloc_limit_mb: so is an unbounded allocation.
  budget=(-max_total_time="$secs")
  [ -n "${FUZZ_RUNS:-}" ] && budget=(-seed=1 -runs="$FUZZ_RUNS" -max_total_time="$secs")
  (cd "$work" && "$bin" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -print_final_stats=1 -artifact_prefix=artifacts/ corpus > log 2>&1)
  rc=$?
  log=$work/log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  covline=$(grep -E '(DONE|INITED|NEW|REDUCE|pulse) +cov:' "$log" | tail -1)
  cov=$(echo "$covline" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
  ft=$(echo "$covline" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
  result=ok
  if [ $rc -ne 0 ] || [ "$(ls "$work/artifacts" | wc -l)" -gt "$before" ]; then
    what=$(grep -m1 -E '^==[0-9]+==ERROR|runtime error:|^SUMMARY|ERROR: libFuzzer' "$log")
    art=$(sed -n 's/.*Test unit written to \([^ ]*\).*/\1/p' "$log" | head -1)
    result="FAILED (rc $rc): $what; input: $work/${art:-?}; log: $log"
    failed+=("$t")
  fi
  printf '%-18s %12s %8s %8s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$result"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in: ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${secs} s each, no findings"
