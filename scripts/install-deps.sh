#!/usr/bin/env bash
# Installs what mtserve needs on a fresh Debian 12 machine: build tools and libraries from Debian,
# the ONNX conformance data, python3-onnx/numpy for the model generators, and onnxruntime-node
# (npm, used only as a test oracle). Each step is skipped when already satisfied, so it is cheap to
# call from every make target.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(build-essential cmake pkg-config libcmocka-dev libyaml-dev libdnnl-dev libonnx-testdata python3 python3-onnx
      python3-numpy python3-requests python3-pytest python3-h2 wrk nodejs npm
      libgrpc-dev libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-grpcio python3-grpc-tools
      libpng-dev libjpeg62-turbo-dev zlib1g-dev python3-pil fonts-dejavu-core openssl libssl-dev
      chromium python3-websocket  # the dashboard test (headless Chromium over the DevTools protocol)
      clang-14 libclang-rt-14-dev  # the libFuzzer targets (make fuzz): clang and its fuzzer runtime
      haproxy)  # the front door of make cluster and tests/cluster (docs/scale-out.md)
missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  # node/npm may come from elsewhere on this machine (not through dpkg); keep them only if absent.
  want=()
  for p in "${missing[@]}"; do
    case "$p" in
      nodejs) command -v node >/dev/null || want+=("$p") ;;
      npm) command -v npm >/dev/null || want+=("$p") ;;
      *) want+=("$p") ;;
    esac
  done
  if [ ${#want[@]} -gt 0 ]; then
    echo "install-deps: installing Debian packages: ${want[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}"
  fi
fi

# ONNX Runtime for Node: only a test oracle for whole-model comparisons.
if [ ! -f tools/ort/node_modules/onnxruntime-node/package.json ]; then
  echo "install-deps: installing onnxruntime-node (test oracle) into tools/ort"
  mkdir -p tools/ort
  (cd tools/ort && [ -f package.json ] || echo '{"name":"mts-ort-oracle","private":true}' > package.json
   npm install --no-audit --no-fund --ignore-scripts onnxruntime-node@1.30.0 >/dev/null)
fi
# Hugging Face tokenizers (Rust, prebuilt Node binding): the test oracle for src/text (tests/text).
if [ ! -f tools/tok/node_modules/@anush008/tokenizers/package.json ]; then
  echo "install-deps: installing @anush008/tokenizers (tokenizer test oracle) into tools/tok"
  (cd tools/tok && npm install --no-audit --no-fund --ignore-scripts >/dev/null)
fi
echo "install-deps: ok"
