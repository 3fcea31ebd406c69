#!/usr/bin/python3
"""Writes the seed corpora of the libFuzzer targets (tests/fuzz/corpus/<target>/): a handful of
small valid and near-valid inputs per target. The committed corpus was made with this script
(plus crash reproducers added by hand, named after the bug); rerunning it rewrites the seeds it
owns and leaves other files alone. Usage: make_seeds.py [CORPUS_DIR]
"""
import gzip
import io
import json
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def put(d, name, data):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def http(d):
    """The first two bytes pick the read size and the limits (tests/fuzz/fuzz_http.c)."""
    def put(d, name, text, cfg=b"\0\0"):
        globals()["put"](d, name, cfg + (text if isinstance(text, bytes) else text.encode()))
    put(d, "get_1byte_reads", "GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n", b"\x01\0")
    put(d, "chunked_small_limits", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        "a\r\n0123456789\r\n0\r\n\r\n", b"\x03\x0a")
    put(d, "get", "GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    put(d, "post_cl", "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 11\r\n\r\n{\"inputs\":1}")
    put(d, "chunked", "POST /v2/models/m/infer?x=1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: t\r\n\r\n")
    put(d, "pipelined", "GET / HTTP/1.1\r\n\r\nGET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
        "HEAD http://host/b?q HTTP/1.1\r\nConnection: close\r\n\r\n")
    put(d, "expect", "PUT /up HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3, 3\r\n\r\nabc")
    put(d, "bare_lf", "OPTIONS * HTTP/1.1\nX-A:  v \n\n")
    put(d, "bad_te", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx")
    put(d, "version", "GET / HTTP/2.0\r\n\r\n")
    # compressed bodies (Content-Encoding): gzip, zlib-deflate in chunks, one that inflates past
    # a 300-byte body limit
    body = b'{"inputs":[{"name":"x","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}'
    gz = gzip.compress(body, mtime=0)
    put(d, "gzip_cl", b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
        % len(gz) + gz)
    zd = zlib.compress(body)
    put(d, "deflate_chunked", b"POST / HTTP/1.1\r\nContent-Encoding: deflate\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % 10 + zd[:10] + b"\r\n" + b"%x\r\n" % (len(zd) - 10) + zd[10:] + b"\r\n0\r\n\r\n", b"\x05\0")
    # the admission hook (byte 1 bits 4-7): a body refused from its head and dropped from the
    # socket, then the next request on the connection; refused with Connection: close and with
    # Expect: 100-continue (both close); one path refused and another admitted
    put(d, "admit_refused_then_next", "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 40\r\n\r\n" + "x" * 40
        + "GET /v2/health/ready HTTP/1.1\r\n\r\n", b"\x03\x50")
    put(d, "admit_close", "POST /v2/models/m/infer HTTP/1.1\r\nConnection: close\r\nContent-Length: 20\r\n\r\n"
        + "y" * 20, b"\0\x10")
    put(d, "admit_expect", "POST /v2/models/m/infer HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 20\r\n\r\n",
        b"\0\x10")
    put(d, "admit_by_path", "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 20\r\n\r\n" + "z" * 20
        + "POST /upload HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
        + "GET / HTTP/1.1\r\nConnection: close\r\n\r\n", b"\x05\x20")
    bomb = gzip.compress(b"\0" * 4096, mtime=0)
    put(d, "gzip_past_limit", b"POST / HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
        % len(bomb) + bomb, b"\0\x0c")


def json_(d):
    put(d, "infer", '{"inputs":[{"name":"x","shape":[1,3],"datatype":"FP32","data":[1.5,-2e3,0]}],'
        '"outputs":[{"name":"y"}],"parameters":{"priority":1}}')
    put(d, "nested", '[[1,2],[3,4],[true,false],[null,"a\\u00e9\\ud83d\\ude00\\n"]]')
    put(d, "numbers", "[0,-0,1e308,-1e-320,9223372036854775807,-9223372036854775808,1.0,3e2,12345678901234567890]")
    put(d, "deep", "[" * 70 + "]" * 70)
    put(d, "bad", '{"a":01,"b":.5}')
    put(d, "utf8", '"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"'.encode("latin-1"))


def multipart(d):
    b = "XyZ"
    body = ("preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n"
            "Content-Type: image/png\r\n\r\n\x89PNG...\r\n--XyZ\r\nContent-Disposition: form-data; name=\"opts\"\r\n\r\n"
            "{\"k\":1}\r\n--XyZ--\r\nepilogue")
    put(d, "two_parts", "multipart/form-data; boundary=" + b + "\n" + body)
    put(d, "quoted_lf", "multipart/form-data; boundary=\"a b\"\n--a b\nContent-Disposition: form-data; name=x\n\n1\n--a b--\n")
    put(d, "no_end", "multipart/form-data; boundary=q\n--q\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\ndata")
    put(d, "bad_ctype", "text/plain\n--q--")


def pbtxt(d):
    put(d, "triton", 'name: "seg"\nplatform: "onnxruntime_onnx"  # c\nmax_batch_size: 16\n'
        'version_policy: { latest { num_versions: 1 } }\ninput [\n  { name: "image" data_type: TYPE_FP32 dims: [ 3, 256, 256 ] }\n]\n'
        'output [ { name: "mask", data_type: TYPE_FP32, dims: [1, 256, 256] } ]\n'
        'dynamic_batching {\n  preferred_batch_size: [ 4, 8 ]\n  max_queue_delay_microseconds: 500\n}\n'
        'instance_group [ { count: 2 kind: KIND_CPU } ]\n')
    put(d, "strings", "a: 'x\\n\\t\\x41\\101' \"y\"\nb < c: -1.5e3 d: [1, 2,] >\ne: { }\n")
    put(d, "versions", "version_policy { specific { versions: [1, 3] } }\ndefault_model_filename: \"m.onnx\"\n")
    put(d, "bad", "a: [1, {b: 2}\n")
    put(d, "all_versions", "version_policy: { all { } }\nmax_batch_size: 0\ninstance_group { count: 0 }\n")
    put(d, "file_name", "default_model_filename: \"../x.onnx\"\ndynamic_batching { max_queue_delay_microseconds: -1 }\n")


def yaml(d):
    put(d, "seed000", "server:\n  port: \":50051\"\n  max_message_size_mb: 50\n  worker_count: 4\n  queue_size: 100\n\n"
        "capacity:\n  max_models: 80\n  max_memory_gb: 90\n  eviction_policy: \"lfu\"\n  idle_timeout_minutes: 30\n"
        "  background_cache_frames: 50\n")
    put(d, "models", "server:\n  port: \":50051\"\n  worker_count_per_gpu: 4\ngpus:\n  count: 8\n  memory_gb_per_gpu: 96\n"
        "capacity:\n  max_models: 1200\n  max_memory_gb: 720\nonnx:\n  library_path: \"x.dll\"\n"
        "models:\n  sanders:\n    model_path: \"path/to/unet_328.onnx\"\n    background_dir: \"/data/bg\"\n"
        "    crop_rects_path: \"/data/c.json\"\n    num_frames: 2000\n    preload: false\n"
        "  b:\n    model_path: b.onnx\n    weight: 2\n    priority: 1\n")
    put(d, "flow", "server: {port: 8000, queue_size: 5}\nmodels: {a: {model_path: a.onnx}}\n")
    put(d, "anchors", "x: &a {port: 1}\nserver: *a\nmodels:\n  - a\n")
    put(d, "bad", "capacity:\n  max_models: 0\n")


def npy_bytes(arr, version=1):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=(version, 0))
    return buf.getvalue()


def npy(d):
    put(d, "f32", npy_bytes(np.arange(6, dtype=np.float32).reshape(2, 3)))
    put(d, "i64_v2", npy_bytes(np.array([1, -2], dtype=np.int64), 2))
    put(d, "u8_scalar", npy_bytes(np.array(7, dtype=np.uint8)))
    put(d, "bool_v3", npy_bytes(np.array([[True], [False]]), 3))
    put(d, "f16_empty", npy_bytes(np.zeros((0, 4), dtype=np.float16)))
    put(d, "fortran", npy_bytes(np.asfortranarray(np.ones((2, 2), dtype=np.float64))))
    put(d, "truncated", npy_bytes(np.ones(16, dtype=np.float32))[:-5])


def png_bytes(w, h, color_type, bit_depth, rows, plte=None, trns=None):
    def chunk(t, data):
        c = struct.pack(">I", len(data)) + t + data
        return c + struct.pack(">I", zlib.crc32(t + data) & 0xFFFFFFFF)
    raw = b"".join(b"\0" + r for r in rows)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0))
    if plte:
        out += chunk(b"PLTE", plte)
    if trns:
        out += chunk(b"tRNS", trns)
    return out + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def image(d):
    put(d, "rgb8.png", png_bytes(2, 2, 2, 8, [b"\xff\0\0\0\xff\0", b"\0\0\xff\xff\xff\xff"]))
    put(d, "gray16.png", png_bytes(2, 1, 0, 16, [b"\x12\x34\xff\xff"]))
    put(d, "palette.png", png_bytes(3, 1, 3, 2, [b"\x1b"], plte=b"\0\0\0\xff\0\0\0\xff\0\0\0\xff", trns=b"\x80"))
    put(d, "rgba.png", png_bytes(1, 1, 6, 8, [b"\x10\x20\x30\x40"]))
    try:
        from PIL import Image
        for name, mode, kw in (("rgb.jpg", "RGB", {}), ("gray.jpg", "L", {}), ("prog.jpg", "RGB", {"progressive": True}),
                               ("restart.jpg", "RGB", {"restart_marker_blocks": 1})):
            im = Image.new(mode, (17, 9))
            for x in range(17):
                for y in range(9):
                    im.putpixel((x, y), (x * 15, y * 28, 128) if mode == "RGB" else x * 15)
            b = io.BytesIO()
            try:
                im.save(b, "JPEG", quality=80, **kw)
            except TypeError:
                im.save(b, "JPEG", quality=80)
            put(d, name, b.getvalue())
    except ImportError:
        pass
    put(d, "truncated.png", png_bytes(4, 4, 2, 8, [b"\x01" * 12] * 4)[:-20])


def model_bytes(nodes, inputs, outputs, inits=(), opset=13):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="fuzz-seed")
    m.ir_version = 7
    return m.SerializeToString()


def onnx_(d):
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    put(d, "add_relu.onnx", model_bytes(
        [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        [vi("x", f, ["N", 4])], [vi("y", f, ["N", 4])],
        [numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")]))
    rng = np.random.default_rng(1)
    put(d, "conv_pool.onnx", model_bytes(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Flatten", ["p"], ["fl"]),
         helper.make_node("Gemm", ["fl", "fw"], ["g"], transB=1),
         helper.make_node("Softmax", ["g"], ["y"], axis=-1)],
        [vi("x", f, [1, 2, 4, 4])], [vi("y", f, [1, 3])],
        [numpy_helper.from_array(rng.standard_normal((2, 2, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal((3, 8)).astype(np.float32), "fw")]))
    put(d, "shape_ops.onnx", model_bytes(
        [helper.make_node("Shape", ["x"], ["sh"]),
         helper.make_node("Reshape", ["x", "r"], ["rs"]),
         helper.make_node("Transpose", ["rs"], ["t"], perm=[1, 0]),
         helper.make_node("Concat", ["t", "t"], ["cat"], axis=0),
         helper.make_node("Slice", ["cat", "st", "en"], ["y"]),
         helper.make_node("Gather", ["sh", "idx"], ["g"], axis=0)],
        [vi("x", f, [2, 3])], [vi("y", f, None), vi("g", TensorProto.INT64, None)],
        [numpy_helper.from_array(np.array([3, 2], dtype=np.int64), "r"),
         numpy_helper.from_array(np.array([0], dtype=np.int64), "st"),
         numpy_helper.from_array(np.array([4], dtype=np.int64), "en"),
         numpy_helper.from_array(np.array([1], dtype=np.int64), "idx")]))
    put(d, "matmul_ln.onnx", model_bytes(
        [helper.make_node("MatMul", ["x", "w"], ["m"]),
         helper.make_node("LayerNormalization", ["m", "s", "b"], ["ln"], axis=-1),
         helper.make_node("Sigmoid", ["ln"], ["y"])],
        [vi("x", f, ["B", 2, 4])], [vi("y", f, None)],
        [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w"),
         numpy_helper.from_array(np.ones(4, dtype=np.float32), "s"),
         numpy_helper.from_array(np.zeros(4, dtype=np.float32), "b")], opset=17))
    put(d, "lipsync_tiny.onnx", lipsync_model())
    put(d, "no_opset.onnx", helper.make_model(helper.make_graph([], "e", [], [])).SerializeToString())


def lipsync_model():
    """A tiny lip-sync-shaped model: visual [N,6,4,4] and audio [N,2,2,2] in, mouth regions
    [N,3,4,4] out (fuzz_grpc serves it as "lip"; fuzz_onnx starts from it too)."""
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    return model_bytes(
        [helper.make_node("Slice", ["visual", "st", "en", "ax"], ["v3"]),
         helper.make_node("ReduceMean", ["audio"], ["am"], axes=[1, 2, 3], keepdims=1),
         helper.make_node("Add", ["v3", "am"], ["y"])],
        [vi("visual", f, ["N", 6, 4, 4]), vi("audio", f, ["N", 2, 2, 2])], [vi("y", f, ["N", 3, 4, 4])],
        [numpy_helper.from_array(np.array([0], dtype=np.int64), "st"),
         numpy_helper.from_array(np.array([3], dtype=np.int64), "en"),
         numpy_helper.from_array(np.array([1], dtype=np.int64), "ax")])


def grpc(d):
    """The first byte picks the message: 0 ModelInferRequest, 1 InferBatchRequest, 2
    CompositeBatchRequest (tests/fuzz/fuzz_grpc.c); the rest is the message, encoded by protoc."""
    proto = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")

    def enc(name, typ, text, sel):
        fname = "inference_kserve.proto" if typ == "ModelInferRequest" else "lipsync.proto"
        out = subprocess.run(["protoc", "--encode=inference." + typ, "-I", proto, fname], input=text.encode(),
                             stdout=subprocess.PIPE, check=True).stdout
        put(d, name, bytes([sel]) + out)
    raw = '\\000\\000\\200?' * 4
    enc("kserve_raw", "ModelInferRequest",
        'model_name: "tiny" inputs { name: "x" datatype: "FP32" shape: [1, 4] } raw_input_contents: "%s" '
        'outputs { name: "y" } parameters { key: "priority" value { int64_param: 1 } } '
        'parameters { key: "timeout" value { int64_param: 1000 } }' % raw, 0)
    enc("kserve_typed", "ModelInferRequest",
        'model_name: "tiny" model_version: "1" inputs { name: "x" datatype: "FP32" shape: [2, 4] '
        'contents { fp32_contents: [1, 2, 3, 4, 5, 6, 7, 8] } }', 0)
    enc("kserve_uint8", "ModelInferRequest",
        'model_name: "tiny" inputs { name: "x" datatype: "UINT8" shape: [3] contents { uint_contents: [1, 300, 2] } }'
        ' parameters { key: "priority" value { uint64_param: 18446744073709551615 } }', 0)
    enc("kserve_unknown_model", "ModelInferRequest", 'model_name: "nope" inputs { name: "x" datatype: "BOOL" shape: [1] }', 0)
    enc("kserve_bytes_raw", "ModelInferRequest",
        'model_name: "tiny" inputs { name: "x" datatype: "BYTES" shape: [1, 3] } '
        'raw_input_contents: "\\002\\000\\000\\000ab\\000\\000\\000\\000\\002\\000\\000\\000\\377\\376"', 0)
    enc("kserve_bytes_typed", "ModelInferRequest",
        'model_name: "tiny" inputs { name: "x" datatype: "BYTES" shape: [2] contents { bytes_contents: ["a", ""] } }', 0)
    vis = '\\000' * (6 * 16 * 4)
    aud = '\\000' * (8 * 4)
    enc("infer_batch", "InferBatchRequest", 'model_id: "lip" visual_frames: "%s" audio_features: "%s" batch_size: 1'
        % (vis, aud), 1)
    enc("infer_batch_short", "InferBatchRequest", 'model_id: "lip" visual_frames: "abc" batch_size: 2', 1)
    enc("composite", "CompositeBatchRequest", 'model_id: "lip" visual_frames: "%s" audio_features: "%s" batch_size: 1 '
        'start_frame_idx: 3 format: "png" jpeg_quality: 90 wrap: "pingpong"' % (vis, aud), 2)
    enc("composite_bad_format", "CompositeBatchRequest", 'model_id: "lip" batch_size: 26 format: "gif" jpeg_quality: -1', 2)


def grpc_h2(d):
    """What a client sends after the HTTP/2 preface (tests/fuzz/fuzz_grpc_h2.c), written by
    python3-h2: unary and streaming calls with whole, split, compressed and cut-short messages,
    a cancelled stream, pings and window updates."""
    import gzip
    import h2.config
    import h2.connection
    proto = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")
    infer = subprocess.run(["protoc", "--encode=inference.ModelInferRequest", "-I", proto, "inference_kserve.proto"],
                           input=b'model_name: "tiny" inputs { name: "x" datatype: "FP32" shape: [1, 4] } '
                                 b'raw_input_contents: "\\000\\000\\200?\\000\\000\\200?\\000\\000\\200?'
                                 b'\\000\\000\\200?"',
                           stdout=subprocess.PIPE, check=True).stdout

    def frame(msg, flag=0):
        return bytes([flag]) + len(msg).to_bytes(4, "big") + msg

    def session(name, calls):
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        c.initiate_connection()
        for path, body, extra, end in calls:
            sid = c.get_next_available_stream_id()
            c.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "f"),
                                 ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "2S"),
                                 *extra])
            for i in range(0, len(body), 7000):
                c.send_data(sid, body[i:i + 7000])
            if end:
                c.end_stream(sid)
            elif end is None:
                c.reset_stream(sid)
        c.ping(b"12345678")
        c.increment_flow_control_window(1 << 20)
        put(d, name, c.data_to_send()[24:])  # without the preface the target sends itself

    ks = "/inference.GRPCInferenceService/"
    session("live", [(ks + "ServerLive", frame(b""), (), True)])
    session("infer", [(ks + "ModelInfer", frame(infer), (), True)])
    session("infer_gzip", [(ks + "ModelInfer", frame(gzip.compress(infer), 1), [("grpc-encoding", "gzip")], True)])
    session("stream", [(ks + "ModelStreamInfer", frame(infer) * 3, (), True)])
    session("mixed", [(ks + "ModelInfer", frame(infer)[:20], (), True), (ks + "ModelMetadata", frame(b"\x0a\x04tiny"),
                      (), None), ("/grpc.health.v1.Health/Check", frame(b""), (), True),
                      (ks + "ModelInfer", frame(infer + bytes(20000)), (), False)])


def kserve_infer(d):
    """First line: Inference-Header-Content-Length ("-": none); then the body
    (tests/fuzz/fuzz_kserve_infer.c)."""
    put(d, "json", "-\n" + '{"id":"r1","inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4.5]]},'
        '{"name":"i","shape":[3],"datatype":"INT64","data":[1,-2,9007199254740993]},'
        '{"name":"b","shape":[1],"datatype":"BOOL","data":[true]}],'
        '"outputs":[{"name":"y","parameters":{"binary_data":true}}],"parameters":{"timeout":1000,"priority":1}}')
    hdr = ('{"inputs":[{"name":"x","shape":[1,3],"datatype":"FP32","parameters":{"binary_data_size":12}},'
           '{"name":"u","shape":[2],"datatype":"UINT8","parameters":{"binary_data_size":2}}],'
           '"parameters":{"binary_data_output":true}}')
    put(d, "binary", ("%d\n" % len(hdr)).encode() + hdr.encode() + struct.pack("<3f", 1, 2, 3) + b"\x01\x02")
    put(d, "binary_truncated", ("%d\n" % len(hdr)).encode() + hdr.encode() + b"\0" * 5)
    put(d, "bad_types", "-\n" + '{"inputs":[{"name":"x","shape":[2,-1],"datatype":"FP64","data":["a"]}],"id":3}')
    put(d, "uint8_range", "-\n" + '{"inputs":[{"name":"x","shape":[2],"datatype":"UINT8","data":[255,256]}],'
        '"outputs":[{"name":"y"},{"name":"y"}]}')
    put(d, "bytes_json", "-\n" + '{"inputs":[{"name":"s","shape":[2,2],"datatype":"BYTES",'
        '"data":[["a","\\u00e9"],["","\\u0000z"]]}],"outputs":[{"name":"y","parameters":{"binary_data":false}}]}')
    strs = b"".join(struct.pack("<I", len(x)) + x for x in (b"ab", b"", b"\xff\xfe"))
    hdr = ('{"inputs":[{"name":"s","shape":[3],"datatype":"BYTES","parameters":{"binary_data_size":%d}}],'
           '"parameters":{"binary_data_output":true}}' % len(strs))
    put(d, "bytes_binary", ("%d\n" % len(hdr)).encode() + hdr.encode() + strs)
    put(d, "bytes_binary_past_end", ("%d\n" % len(hdr)).encode() + hdr.encode() + strs[:-3] + b"\xff\xff\xff")


def tensor_pb(d):
    put(d, "f32.pb", numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "t").SerializeToString())
    put(d, "i64.pb", numpy_helper.from_array(np.array([5, -1], dtype=np.int64), "i").SerializeToString())
    t = helper.make_tensor("v", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    put(d, "float_data.pb", t.SerializeToString())
    put(d, "bool.pb", numpy_helper.from_array(np.array([True, False]), "b").SerializeToString())


def tokenizer(d):
    put(d, "text_ascii", b"text\nHello, worlds! unaffable [MASK] hello<s>hello")
    put(d, "text_unicode", "text\ncaf\u00e9 \u4e2d\u6587 \u00cf\u0301\u0323 \U0001F600 \u200b\u00a0x 12,3!!".encode())
    put(d, "text_invalid", b"text\nab\xe4\xb8 \xff\xc0\xaf")
    put(d, "vocab", b"vocab\n[UNK]\n[CLS]\n[SEP]\nhello\n##s\nab\n\0Hello abs")
    bpe = ('{"model":{"type":"BPE","unk_token":"<unk>","byte_fallback":true,"vocab":{"<unk>":0,"a":1,"b":2,'
           '"ab":3,"<0x41>":4},"merges":[["a","b"]]},"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false},'
           '"post_processor":{"type":"RobertaProcessing","sep":["b",2],"cls":["a",1]},'
           '"added_tokens":[{"id":3,"content":"ab","special":true,"normalized":false}]}')
    put(d, "json_bpe", b"json\n" + bpe.encode() + b"\0abab A ab")
    wp = ('{"normalizer":{"type":"BertNormalizer","lowercase":true},"pre_tokenizer":{"type":"Sequence",'
          '"pretokenizers":[{"type":"WhitespaceSplit"},{"type":"Metaspace","replacement":"_","prepend_scheme":"first"}]},'
          '"model":{"type":"WordPiece","unk_token":"[UNK]","vocab":{"[UNK]":0,"_a":1,"##b":2}},'
          '"post_processor":{"type":"BertProcessing","sep":["[UNK]",0],"cls":["[UNK]",0]},"truncation":{"max_length":4}}')
    put(d, "json_wp", b"json\n" + wp.encode() + b"\0A b ab")
    uni = ('{"model":{"type":"Unigram","unk_id":0,"byte_fallback":true,"vocab":[["<unk>",0],["a",-1],["b",-1],'
           '["ab",-1.5],["<0x78>",-2]]},"normalizer":{"type":"StripAccents"},"pre_tokenizer":{"type":"Metaspace",'
           '"replacement":"_","prepend_scheme":"always","split":true}}')
    put(d, "json_unigram", b"json\n" + uni.encode() + b"\0ab xyz b\xc3\xa1")
    cl = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    bl = ('{"normalizer":{"type":"NFKC"},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split",'
          '"pattern":{"Regex":' + json.dumps(cl) + '},"behavior":"Isolated","invert":false},{"type":"ByteLevel",'
          '"add_prefix_space":false,"use_regex":false}]},"model":{"type":"BPE","ignore_merges":true,'
          '"vocab":{"a":0,"b":1,"ab":2,"\u0120":3},"merges":["a b"]}}')
    put(d, "json_cl100k", b"json\n" + bl.encode() + b"\0ab AB'S 123456 \xef\xac\x81\r\n\r\n x")


def gguf(d):
    """Tiny BERT GGUF files (tests/server/gguf_writer.py) in F32, F16 and Q8_0, and one whose
    metadata holds every value type."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
    import gguf_writer as gw
    tmp = os.path.join(d, ".tmp.gguf")
    os.makedirs(d, exist_ok=True)
    variants = {"bert_f32.gguf": {}, "bert_f16.gguf": {"wtype": gw.T_F16}, "bert_q8_0.gguf": {"wtype": gw.T_Q8_0},
                "all_types.gguf": {"kv": {"x.u8": (gw.U8, 7), "x.i8": (gw.I8, -7), "x.u16": (gw.U16, 700),
                                          "x.i16": (gw.I16, -700), "x.i32": (gw.I32, -70000),
                                          "x.u64": (gw.U64, 1 << 40), "x.i64": (gw.I64, -(1 << 40)),
                                          "x.f64": (gw.F64, 0.25), "x.bool": (gw.BOOL, True),
                                          "x.arr": (gw.ARRAY, (gw.F32, [1.0, 2.0])),
                                          "general.alignment": (gw.U32, 64)}}}
    for name, kw in variants.items():
        gw.write(tmp, *gw.tiny_bert(**kw), alignment=kw.get("kv", {}).get("general.alignment", (0, 32))[1])
        with open(tmp, "rb") as f:
            put(d, name, f.read())
    os.remove(tmp)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    for name, fn in (("fuzz_http", http), ("fuzz_json", json_), ("fuzz_multipart", multipart), ("fuzz_pbtxt", pbtxt),
                     ("fuzz_yaml_config", yaml), ("fuzz_npy", npy), ("fuzz_image", image), ("fuzz_onnx", onnx_),
                     ("fuzz_tensor_pb", tensor_pb), ("fuzz_grpc", grpc), ("fuzz_grpc_h2", grpc_h2),
                     ("fuzz_kserve_infer", kserve_infer),
                     ("fuzz_triton_repo", pbtxt), ("fuzz_tokenizer", tokenizer),
                     ("fuzz_gguf", gguf)):
        fn(os.path.join(root, name))


if __name__ == "__main__":
    main()
