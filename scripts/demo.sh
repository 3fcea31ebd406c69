#!/usr/bin/env bash
# The body of `make run`: shows the engine on the demo models. (The HTTP/gRPC server comes with
# the serving issues; until then `make run` inspects and runs the lip-sync model.)
set -euo pipefail
cd "$(dirname "$0")/.."
M=models/out/lipsync_unet_w8.onnx
echo "== mtserve inspect $M"
build/mtserve inspect "$M"
echo
echo "== mtserve run $M --batch 1 --threads 2 --iters 5"
build/mtserve run "$M" --batch 1 --threads 2 --iters 5
echo
echo "Models are in models/out; try: build/mtserve run models/out/mobilenetv3.onnx --batch 8 --json"
