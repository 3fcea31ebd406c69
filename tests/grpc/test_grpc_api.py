"""Black-box tests of the gRPC front end through a stock client (python3-grpcio): every RPC of
inference.GRPCInferenceService, inference.InferenceService, grpc.health.v1.Health and server
reflection, every error path with its status code and message, a 250-message ModelStreamInfer
session, 50 concurrent clients, large messages, deadlines, cancellation, keepalive pings and
shutdown. Fixtures are in conftest.py."""
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2

from conftest import LIPSYNC, SEG, TINY, code_of, tiny_reference, tiny_request

# One batch at a time; max_batch (which also bounds a request's batch) is each test's request size,
# so every batch is one request.
SLOW = {"instances": 1}


def ks(srv, pb):
    return pb.ks_grpc.GRPCInferenceServiceStub(srv.channel)


def lip(srv, pb):
    return pb.ls_grpc.InferenceServiceStub(srv.channel)


def seg_request(pb, n=1, timeout_us=0):
    req = pb.ks.ModelInferRequest(model_name="seg")
    req.inputs.add(name="image", datatype="FP32", shape=[n, 3, 256, 256])
    req.raw_input_contents.append(np.random.default_rng(n).random((n, 3, 256, 256), np.float32).tobytes())
    if timeout_us:
        req.parameters["timeout"].int64_param = timeout_us
    return req


def wait_queued(srv, pb, model, n, timeout=20):
    stub = lip(srv, pb)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        r = stub.GetModelStats(pb.ls.GetModelStatsRequest(model_id=model))
        if r.models[0].stats.queue_depth >= n:
            return
        time.sleep(0.01)
    pytest.fail(f"{model}: queue never reached {n}")


def lip_inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.random((n, 6, 320, 320), np.float32), rng.random((n, 32, 16, 16), np.float32))


# ---------------------------------------------------------------- KServe: server and model metadata

def test_server_live_ready_metadata(start_server, pb):
    srv = start_server()
    s = ks(srv, pb)
    assert s.ServerLive(pb.ks.ServerLiveRequest()).live
    assert s.ServerReady(pb.ks.ServerReadyRequest()).ready
    md = s.ServerMetadata(pb.ks.ServerMetadataRequest())
    assert md.name == "mtserve" and md.version
    assert {"model_repository", "statistics", "model_configuration"} <= set(md.extensions)


def test_model_ready_metadata_config(start_server, pb):
    srv = start_server()
    s = ks(srv, pb)
    assert not s.ModelReady(pb.ks.ModelReadyRequest(name="tiny")).ready  # not loaded yet
    md = s.ModelMetadata(pb.ks.ModelMetadataRequest(name="tiny"))  # loads it
    assert md.name == "tiny" and list(md.versions) == ["1"] and md.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [("x", "FP32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.outputs] == [("y", "FP32", [-1, 16])]
    assert s.ModelReady(pb.ks.ModelReadyRequest(name="tiny")).ready
    cfg = s.ModelConfig(pb.ks.ModelConfigRequest(name="tiny")).config
    assert cfg.name == "tiny" and cfg.max_batch_size == 8 and cfg.backend == "mtserve"
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("x", pb.ks.TYPE_FP32, [16])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("y", [16])]
    assert cfg.instance_group[0].kind == pb.ks.ModelInstanceGroup.KIND_CPU
    assert cfg.parameters["model_path"].string_value == str(TINY)
    for rpc, req in ((s.ModelReady, pb.ks.ModelReadyRequest(name="nope")),
                     (s.ModelMetadata, pb.ks.ModelMetadataRequest(name="nope")),
                     (s.ModelConfig, pb.ks.ModelConfigRequest(name="nope"))):
        code, msg = code_of(lambda: rpc(req))
        assert code == grpc.StatusCode.NOT_FOUND and "unknown model 'nope'" in msg


# ---------------------------------------------------------------- KServe: inference

def test_model_infer_raw_and_typed(start_server, pb):
    srv = start_server()
    s = ks(srv, pb)
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    for raw in (True, False):
        r = s.ModelInfer(tiny_request(pb, x, rid=f"req-{raw}", raw=raw))
        assert r.model_name == "tiny" and r.model_version == "1" and r.id == f"req-{raw}"
        assert [(o.name, o.datatype, list(o.shape)) for o in r.outputs] == [("y", "FP32", [3, 16])]
        assert len(r.raw_output_contents) == 1
        y = np.frombuffer(r.raw_output_contents[0], np.float32).reshape(3, 16)
        np.testing.assert_allclose(y, tiny_reference(x), rtol=1e-4, atol=1e-4)
        assert r.parameters["batch_size"].int64_param >= 3
        assert r.parameters["compute_ms"].double_param >= 0
    # requested output by name
    req = tiny_request(pb, x)
    req.outputs.add(name="y")
    assert [o.name for o in s.ModelInfer(req).outputs] == ["y"]

    # compressed messages (grpc-encoding gzip / deflate), as Triton's clients send them with
    # compression_algorithm, both ways
    # (a message compression would not shrink goes uncompressed: the second one compresses)
    z = np.zeros((8, 16), np.float32)
    z[::3] = 1.5
    for comp in (grpc.Compression.Gzip, grpc.Compression.Deflate):
        for v in (x, z):
            r = s.ModelInfer(tiny_request(pb, v), compression=comp)
            y = np.frombuffer(r.raw_output_contents[0], np.float32).reshape(v.shape)
            np.testing.assert_allclose(y, tiny_reference(v), rtol=1e-4, atol=1e-4)

def test_model_infer_errors(start_server, pb):
    srv = start_server()
    s = ks(srv, pb)
    x = np.ones((2, 16), np.float32)

    def expect(req, code, *words):
        c, msg = code_of(lambda: s.ModelInfer(req))
        assert c == code, (c, msg)
        for w in words:
            assert w in msg, msg

    expect(tiny_request(pb, x, model="nope"), grpc.StatusCode.NOT_FOUND, "unknown model 'nope'")
    req = tiny_request(pb, x)
    req.model_version = "5"  # the model serves version 1 (Triton layout folders set others)
    expect(req, grpc.StatusCode.NOT_FOUND, "model 'tiny' has no version '5' (it serves version 1)")
    req.model_version = "1"
    assert s.ModelInfer(req).model_version == "1"
    c, msg = code_of(lambda: s.ModelMetadata(pb.ks.ModelMetadataRequest(name="tiny", version="2")))
    assert c == grpc.StatusCode.NOT_FOUND and "has no version '2'" in msg
    expect(pb.ks.ModelInferRequest(model_name="tiny"), grpc.StatusCode.INVALID_ARGUMENT, "at least one input")
    req = tiny_request(pb, x)
    req.inputs[0].datatype = "FP8"
    expect(req, grpc.StatusCode.INVALID_ARGUMENT, "datatype 'FP8' is not supported")
    req = tiny_request(pb, x)
    req.raw_input_contents[0] = req.raw_input_contents[0][:-4]
    expect(req, grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents[0] has 124 bytes", "needs 128")
    req = tiny_request(pb, x)
    req.raw_input_contents.append(b"1234")
    expect(req, grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents has 2 entries; expected one per input (1)")
    req = pb.ks.ModelInferRequest(model_name="tiny")
    req.inputs.add(name="x", datatype="FP32", shape=[2, 16])
    expect(req, grpc.StatusCode.INVALID_ARGUMENT, "neither contents nor a raw_input_contents entry")
    req = tiny_request(pb, x, raw=False)
    del req.inputs[0].contents.fp32_contents[-1]
    expect(req, grpc.StatusCode.INVALID_ARGUMENT, "fp32_contents has 31 values", "needs 32")
    req = tiny_request(pb, x, raw=False)
    req.inputs[0].datatype = "INT64"
    expect(req, grpc.StatusCode.INVALID_ARGUMENT, "int64_contents has 0 values")
    req = tiny_request(pb, np.ones((2, 15), np.float32))
    expect(req, grpc.StatusCode.INVALID_ARGUMENT, "x")  # the model's shape check (server core)
    req = tiny_request(pb, x)
    req.inputs[0].name = "nope"
    expect(req, grpc.StatusCode.INVALID_ARGUMENT, "nope")
    req = tiny_request(pb, x)
    req.parameters["timeout"].string_param = "soon"
    expect(req, grpc.StatusCode.INVALID_ARGUMENT, "timeout")
    for bad in (10, -1):
        req = tiny_request(pb, x)
        req.parameters["priority"].int64_param = bad
        expect(req, grpc.StatusCode.INVALID_ARGUMENT, "priority", "0 (the model's level) to 9")
    # a request may lower its priority (Triton's clients send uint64_param)
    req = tiny_request(pb, x)
    req.parameters["priority"].uint64_param = 9
    assert s.ModelInfer(req).outputs[0].name == "y"
    # not a ModelInferRequest at all
    garbage = srv.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    c, msg = code_of(lambda: garbage(b"\xff\xff\xff\xff"))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "ModelInferRequest" in msg
    # a unary call whose client half-closes without sending a message (unary methods are
    # registered with gRPC core to have their message read with the call)
    for path in ("/inference.GRPCInferenceService/ModelInfer", "/inference.InferenceService/InferBatch",
                 "/grpc.health.v1.Health/Check"):
        empty = srv.channel.stream_unary(path)
        c, msg = code_of(lambda: empty(iter([])))
        assert c == grpc.StatusCode.INVALID_ARGUMENT and "no request message" in msg, (path, c, msg)
    # methods that do not exist
    for path in ("/inference.GRPCInferenceService/SystemSharedMemoryStatus", "/nope.Service/Call"):
        c, msg = code_of(lambda: srv.channel.unary_unary(path)(b""))
        assert c == grpc.StatusCode.UNIMPLEMENTED and path in msg
    # still serving
    assert s.ModelInfer(tiny_request(pb, x)).outputs[0].name == "y"


def test_large_messages(start_server, pb):
    """~38 MiB in and out through ModelInfer; over the 50 MiB limit is RESOURCE_EXHAUSTED. max_batch 0:
    the leading dimension is not a batch dimension, so one request may carry any number of rows."""
    srv = start_server({"tiny": {"model_path": str(TINY), "max_batch": 0}})
    s = ks(srv, pb)
    x = np.random.default_rng(2).standard_normal((600_000, 16)).astype(np.float32)
    r = s.ModelInfer(tiny_request(pb, x), timeout=120)
    y = np.frombuffer(r.raw_output_contents[0], np.float32).reshape(x.shape)
    np.testing.assert_allclose(y[:1000], tiny_reference(x[:1000]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y[-1000:], tiny_reference(x[-1000:]), rtol=1e-4, atol=1e-4)
    big = np.zeros((860_000, 16), np.float32)  # 52.5 MiB
    c, msg = code_of(lambda: s.ModelInfer(tiny_request(pb, big), timeout=120))
    assert c == grpc.StatusCode.RESOURCE_EXHAUSTED, (c, msg)
    assert s.ServerLive(pb.ks.ServerLiveRequest()).live


# ---------------------------------------------------------------- KServe: stream

def test_stream_250_in_order(start_server, pb):
    srv = start_server()
    s = ks(srv, pb)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1 + i % 4, 16)).astype(np.float32) for i in range(250)]

    def gen():
        for i, x in enumerate(xs):
            yield tiny_request(pb, x, rid=str(i))

    got = list(s.ModelStreamInfer(gen(), timeout=120))
    assert len(got) == 250
    for i, r in enumerate(got):
        assert r.error_message == "", r.error_message
        assert r.infer_response.id == str(i)
        y = np.frombuffer(r.infer_response.raw_output_contents[0], np.float32).reshape(xs[i].shape)
        np.testing.assert_allclose(y, tiny_reference(xs[i]), rtol=1e-4, atol=1e-4)


def test_stream_errors_in_band(start_server, pb):
    srv = start_server()
    s = ks(srv, pb)
    x = np.ones((1, 16), np.float32)
    reqs = [tiny_request(pb, x, rid="0"), tiny_request(pb, x, model="nope", rid="1"), tiny_request(pb, x, rid="2")]
    bad = tiny_request(pb, x, rid="3")
    bad.raw_input_contents[0] = b"123"
    reqs.append(bad)
    reqs.append(tiny_request(pb, x, rid="4"))
    got = list(s.ModelStreamInfer(iter(reqs), timeout=60))
    assert [r.infer_response.id for r in got] == ["0", "1", "2", "3", "4"]
    assert [bool(r.error_message) for r in got] == [False, True, False, True, False]
    assert "NOT_FOUND" in got[1].error_message and "unknown model 'nope'" in got[1].error_message
    assert "INVALID_ARGUMENT" in got[3].error_message and "needs 64" in got[3].error_message
    assert list(s.ModelStreamInfer(iter([]), timeout=10)) == []  # empty stream closes cleanly


# ---------------------------------------------------------------- KServe: concurrency

def test_50_concurrent_clients(start_server, pb):
    srv = start_server({"tiny": {"model_path": str(TINY), "max_batch": 8, "queue_size": 1000}})
    errors = []

    def client(k):
        ch = srv.new_channel()
        stub = pb.ks_grpc.GRPCInferenceServiceStub(ch)
        rng = np.random.default_rng(1000 + k)
        try:
            for j in range(20):
                x = rng.standard_normal((1 + (k + j) % 3, 16)).astype(np.float32)
                rid = f"{k}-{j}"
                r = stub.ModelInfer(tiny_request(pb, x, rid=rid), timeout=60)
                if r.id != rid:
                    errors.append(f"{rid}: got id {r.id}")
                y = np.frombuffer(r.raw_output_contents[0], np.float32).reshape(x.shape)
                if not np.allclose(y, tiny_reference(x), rtol=1e-4, atol=1e-4):
                    errors.append(f"{rid}: wrong values")
        except grpc.RpcError as e:
            errors.append(f"{k}: {e.code()} {e.details()}")
        finally:
            ch.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    st = ks(srv, pb).ModelStatistics(pb.ks.ModelStatisticsRequest(name="tiny")).model_stats[0]
    assert st.inference_stats.success.count == 1000


# ---------------------------------------------------------------- KServe: statistics, repository

def test_statistics_and_repository(start_server, pb):
    srv = start_server({"tiny": {"model_path": str(TINY)}, "seg": {"model_path": str(SEG)}})
    s = ks(srv, pb)
    idx = {m.name: m.state for m in s.RepositoryIndex(pb.ks.RepositoryIndexRequest()).models}
    assert idx == {"tiny": "UNLOADED", "seg": "UNLOADED"}
    s.ModelInfer(tiny_request(pb, np.ones((4, 16), np.float32)))
    ready = [m.name for m in s.RepositoryIndex(pb.ks.RepositoryIndexRequest(ready=True)).models]
    assert ready == ["tiny"]
    st = s.ModelStatistics(pb.ks.ModelStatisticsRequest(name="tiny")).model_stats
    assert len(st) == 1 and st[0].name == "tiny" and st[0].inference_count == 4 and st[0].execution_count == 1
    assert st[0].inference_stats.success.count == 1 and st[0].last_inference > 0
    assert st[0].batch_stats[0].batch_size == 4 and st[0].memory_usage[0].type == "CPU"
    all_stats = s.ModelStatistics(pb.ks.ModelStatisticsRequest()).model_stats
    assert sorted(m.name for m in all_stats) == ["seg", "tiny"]
    c, msg = code_of(lambda: s.ModelStatistics(pb.ks.ModelStatisticsRequest(name="nope")))
    assert c == grpc.StatusCode.NOT_FOUND and "unknown model 'nope'" in msg
    # load / reload / unload
    s.RepositoryModelLoad(pb.ks.RepositoryModelLoadRequest(model_name="seg"))
    assert s.ModelReady(pb.ks.ModelReadyRequest(name="seg")).ready
    req = pb.ks.RepositoryModelLoadRequest(model_name="seg")
    req.parameters["force_reload"].bool_param = True
    s.RepositoryModelLoad(req)
    info = lip(srv, pb).GetModelStats(pb.ls.GetModelStatsRequest(model_id="seg")).models[0]
    assert info.loaded and info.stats.loads == 2
    s.RepositoryModelUnload(pb.ks.RepositoryModelUnloadRequest(model_name="seg"))
    assert not s.ModelReady(pb.ks.ModelReadyRequest(name="seg")).ready
    for rpc, req in ((s.RepositoryModelLoad, pb.ks.RepositoryModelLoadRequest(model_name="nope")),
                     (s.RepositoryModelUnload, pb.ks.RepositoryModelUnloadRequest(model_name="nope"))):
        c, msg = code_of(lambda: rpc(req))
        assert c == grpc.StatusCode.NOT_FOUND and "nope" in msg, (c, msg)


# ---------------------------------------------------------------- deadlines, cancellation, queue

def test_deadline_exceeded(start_server, pb):
    srv = start_server({"seg": {"model_path": str(SEG), "max_batch": 32, **SLOW}})
    s = ks(srv, pb)
    s.RepositoryModelLoad(pb.ks.RepositoryModelLoadRequest(model_name="seg"))
    # one instance: of busy and blocker, one runs and the other waits (a 32-frame message can
    # arrive after a smaller one, so a fixed pause does not show the instance busy), and the
    # late requests queue behind the waiting one
    busy = s.ModelInfer.future(seg_request(pb, 32), timeout=60)
    blocker = s.ModelInfer.future(seg_request(pb, 4), timeout=60)
    wait_queued(srv, pb, "seg", 1)
    t0 = time.monotonic()
    c, _ = code_of(lambda: s.ModelInfer(seg_request(pb, 1), timeout=0.05))  # gRPC deadline
    assert c == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 5
    c, msg = code_of(lambda: s.ModelInfer(seg_request(pb, 1, timeout_us=100_000), timeout=60))  # request timeout
    assert c == grpc.StatusCode.DEADLINE_EXCEEDED, (c, msg)
    assert busy.result().outputs[0].name == "mask"
    assert blocker.result().outputs[0].name == "mask"
    g = lip(srv, pb).GetModelStats(pb.ls.GetModelStatsRequest()).totals
    assert g.timed_out + g.cancelled >= 1 and g.requests_completed <= 3  # neither late request ran


def test_cancel_drops_queued_request(start_server, pb):
    srv = start_server({"seg": {"model_path": str(SEG), "max_batch": 32, **SLOW}})
    s = ks(srv, pb)
    s.RepositoryModelLoad(pb.ks.RepositoryModelLoadRequest(model_name="seg"))
    # one instance: of busy and blocker, one runs and the other waits (whichever the server read
    # first: a 32-frame message can take longer to arrive than a 4-frame one), so doomed queues
    # behind a waiting request and is watched for cancellation
    busy = s.ModelInfer.future(seg_request(pb, 32), timeout=60)
    blocker = s.ModelInfer.future(seg_request(pb, 4), timeout=60)
    wait_queued(srv, pb, "seg", 1)
    doomed = s.ModelInfer.future(seg_request(pb, 4), timeout=60)
    wait_queued(srv, pb, "seg", 2)
    assert doomed.cancel()
    busy.result()
    blocker.result()
    stub = lip(srv, pb)
    t0 = time.monotonic()
    # a cancelled request is dropped when a worker next takes from the queue; the workers run at
    # nice 10, so on a loaded machine (an ASan server beside other jobs) that can take seconds
    while stub.GetModelStats(pb.ls.GetModelStatsRequest()).totals.cancelled < 1:
        assert time.monotonic() - t0 < 30, "the cancelled request was not dropped"
        time.sleep(0.05)
    info = stub.GetModelStats(pb.ls.GetModelStatsRequest(model_id="seg")).models[0]
    assert info.stats.execution_count == 2  # busy and blocker; the cancelled one never ran


def test_cancel_storm_on_light_requests(start_server, pb):
    """Light requests run at once, so the server does not watch them for cancellation (the close
    rides with the reply); clients cancelling them at every moment must still leave every call
    finished and the server answering (the ASan server's LeakSanitizer checks the calls are freed)."""
    srv = start_server({"tiny": {"model_path": str(TINY)}})
    s = ks(srv, pb)
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    s.ModelInfer(tiny_request(pb, x))
    for round_ in range(4):
        futures = [s.ModelInfer.future(tiny_request(pb, x), timeout=30) for _ in range(64)]
        for i, f in enumerate(futures):
            if i % 2 == round_ % 2:
                f.cancel()
        for f in futures:
            try:
                assert f.result().outputs[0].name == "y"
            except grpc.FutureCancelledError:
                pass
    assert s.ModelInfer(tiny_request(pb, x)).outputs[0].name == "y"


def test_queue_full_resource_exhausted(start_server, pb):
    srv = start_server({"seg": {"model_path": str(SEG), "queue_size": 2, "max_batch": 4, **SLOW}})
    s = ks(srv, pb)
    s.RepositoryModelLoad(pb.ks.RepositoryModelLoadRequest(model_name="seg"))
    futures = [s.ModelInfer.future(seg_request(pb, 4), timeout=120) for _ in range(12)]
    codes = []
    for f in futures:
        try:
            f.result()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.code(), e.details())
            assert "queue" in e.details() and "full" in e.details(), e.details()
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 1 and codes.count(grpc.StatusCode.OK) >= 2, codes


def full_seg_queue(start_server, pb):
    """A server whose seg (one batch at a time, queue_size 2) has a full queue: one request running
    and two queued. Returns the server, a KServe stub and the three calls' futures."""
    srv = start_server({"seg": {"model_path": str(SEG), "queue_size": 2, "max_batch": 16, **SLOW},
                        "tiny": {"model_path": str(TINY)}})
    s = ks(srv, pb)
    s.RepositoryModelLoad(pb.ks.RepositoryModelLoadRequest(model_name="seg"))
    futures = [s.ModelInfer.future(seg_request(pb, 16), timeout=120) for _ in range(3)]
    wait_queued(srv, pb, "seg", 2)
    return srv, s, futures


def test_queue_full_refused_before_parsing(start_server, pb):
    """A full queue is answered from the message's first bytes: a message naming a model whose
    queue is full is refused with RESOURCE_EXHAUSTED even when the rest of it would not parse, and
    the same malformed message for a model with room is parsed and rejected as malformed."""
    srv, s, futures = full_seg_queue(start_server, pb)
    raw = srv.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    garbage = b"\x3f\xff\xff"  # field 7 with wire type 7: no protobuf message
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\x0a\x03seg" + garbage, timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.value.code(), e.value.details())
    assert "queue is full" in e.value.details(), e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\x0a\x04tiny" + garbage, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details())
    # the lip-sync service's inference methods name their model in field 1 too
    for method in ("InferBatch", "InferBatchComposite"):
        lraw = srv.channel.unary_unary(f"/inference.InferenceService/{method}")
        with pytest.raises(grpc.RpcError) as e:
            lraw(b"\x0a\x03seg" + garbage, timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (method, e.value.code(), e.value.details())
        with pytest.raises(grpc.RpcError) as e:
            lraw(b"\x0a\x04tiny" + garbage, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, e.value.code(), e.value.details())
    # a well-formed request behind the full queue: refused the same way, its tensors never copied
    with pytest.raises(grpc.RpcError) as e:
        s.ModelInfer(seg_request(pb, 16), timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.value.code(), e.value.details())
    for f in futures:
        assert len(f.result().outputs) == 1
    st = s.ModelStatistics(pb.ks.ModelStatisticsRequest(name="seg")).model_stats[0]
    assert st.inference_stats.success.count == 3


def test_keepalive_pings(start_server, pb):
    srv = start_server()
    ch = srv.new_channel(**{"grpc.keepalive_time_ms": 1000, "grpc.keepalive_timeout_ms": 2000,
                            "grpc.keepalive_permit_without_calls": 1, "grpc.http2.max_pings_without_data": 0})
    stub = pb.ks_grpc.GRPCInferenceServiceStub(ch)
    assert stub.ServerLive(pb.ks.ServerLiveRequest()).live
    time.sleep(4)  # idle: the client pings every second
    x = np.ones((1, 16), np.float32)
    assert stub.ModelInfer(tiny_request(pb, x)).outputs[0].name == "y"
    ch.close()


def test_shutdown_fails_queued_with_unavailable(start_server, pb):
    srv = start_server({"seg": {"model_path": str(SEG), "queue_size": 10, "max_batch": 16, **SLOW}}, grace=0)
    s = ks(srv, pb)
    s.RepositoryModelLoad(pb.ks.RepositoryModelLoadRequest(model_name="seg"))
    futures = [s.ModelInfer.future(seg_request(pb, 16), timeout=60) for _ in range(4)]
    wait_queued(srv, pb, "seg", 3)
    srv.proc.send_signal(signal.SIGTERM)
    codes = []
    for f in futures:
        try:
            f.result()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                assert e.details(), "UNAVAILABLE without a message"
    assert all(c in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE) for c in codes), codes
    assert codes.count(grpc.StatusCode.UNAVAILABLE) >= 2, codes
    assert srv.proc.wait(timeout=30) == 0


# ---------------------------------------------------------------- health, reflection

def test_health_check(start_server, pb):
    srv = start_server()
    h = pb.health_grpc.HealthStub(srv.channel)
    SERVING = pb.health.HealthCheckResponse.SERVING
    assert h.Check(pb.health.HealthCheckRequest()).status == SERVING
    for name in ("inference.GRPCInferenceService", "inference.InferenceService", "grpc.health.v1.Health"):
        assert h.Check(pb.health.HealthCheckRequest(service=name)).status == SERVING
    c, msg = code_of(lambda: h.Check(pb.health.HealthCheckRequest(service="nope.Svc")))
    assert c == grpc.StatusCode.NOT_FOUND and "nope.Svc" in msg


def test_health_watch(start_server, pb):
    """Watch streams SERVING at once, NOT_SERVING when the server begins shutting down, then ends
    with OK; an unknown service gets SERVICE_UNKNOWN on a stream that stays open."""
    srv = start_server()
    ch = grpc.insecure_channel(srv.addr)  # srv.stop() closes srv.channel first
    h = pb.health_grpc.HealthStub(ch)
    R = pb.health.HealthCheckResponse
    whole = h.Watch(pb.health.HealthCheckRequest())
    svc = h.Watch(pb.health.HealthCheckRequest(service="inference.InferenceService"))
    unknown = h.Watch(pb.health.HealthCheckRequest(service="nope.Svc"))
    assert next(whole).status == R.SERVING
    assert next(svc).status == R.SERVING
    assert next(unknown).status == R.SERVICE_UNKNOWN
    unknown.cancel()
    # a cancelled watcher is dropped cleanly; the others see the shutdown
    srv.proc.send_signal(signal.SIGTERM)
    for stream in (whole, svc):
        assert next(stream).status == R.NOT_SERVING
        with pytest.raises(StopIteration):
            next(stream)
        assert stream.code() == grpc.StatusCode.OK
    ch.close()
    assert srv.stop() == 0


@pytest.mark.parametrize("version", ["v1alpha", "v1"])
def test_reflection(start_server, pb, version):
    srv = start_server()
    R = pb.refl.ServerReflectionRequest
    call = srv.channel.stream_stream(f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                                     request_serializer=R.SerializeToString,
                                     response_deserializer=pb.refl.ServerReflectionResponse.FromString)
    services = ["inference.GRPCInferenceService", "inference.InferenceService", "grpc.health.v1.Health"]
    reqs = [R(list_services="")] + [R(file_containing_symbol=s) for s in services] + [
        R(file_containing_symbol="inference.ModelInferRequest.InferInputTensor"),
        R(file_containing_symbol="inference.InferenceService.InferBatch"),
        R(file_by_filename="lipsync.proto"),
        R(file_containing_symbol="inference.Nope"),
        R(file_by_filename="nope.proto")]
    got = list(call(iter(reqs), timeout=30))
    assert len(got) == len(reqs)
    listed = [s.name for s in got[0].list_services_response.service]
    assert set(services + [f"grpc.reflection.{version}.ServerReflection"]) <= set(listed)

    def fdp(resp):
        assert resp.WhichOneof("message_response") == "file_descriptor_response", resp
        return [descriptor_pb2.FileDescriptorProto.FromString(b)
                for b in resp.file_descriptor_response.file_descriptor_proto]

    for resp, svc in zip(got[1:4], services):
        f = fdp(resp)[0]
        assert svc in [f"{f.package}.{s.name}" for s in f.service]
    assert fdp(got[4])[0].name == "inference_kserve.proto"
    f = fdp(got[5])[0]
    assert f.name == "lipsync.proto"
    infer_batch = [m for s in f.service for m in s.method if m.name == "InferBatch"][0]
    assert infer_batch.input_type == ".inference.InferBatchRequest"
    req_fields = {x.name: x.number for m in f.message_type if m.name == "InferBatchRequest" for x in m.field}
    assert req_fields == {"model_id": 1, "visual_frames": 2, "audio_features": 3, "batch_size": 4}
    assert fdp(got[6])[0].name == "lipsync.proto"
    for resp in got[7:]:
        assert resp.WhichOneof("message_response") == "error_response"
        assert resp.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


# ---------------------------------------------------------------- lip-sync service

def lip_server(start_server):
    return start_server({"lip": {"model_path": str(LIPSYNC), "max_batch": 4},
                         "tiny": {"model_path": str(TINY)}})


def test_lipsync_infer_batch(start_server, pb):
    srv = lip_server(start_server)
    stub = lip(srv, pb)
    vis, aud = lip_inputs(2, seed=7)
    r = stub.InferBatch(pb.ls.InferBatchRequest(model_id="lip", visual_frames=vis.tobytes(),
                                                audio_features=aud.tobytes(), batch_size=2), timeout=120)
    assert r.success and len(r.outputs) == 2 and r.gpu_id == 0 and r.inference_time_ms > 0
    outs = [np.frombuffer(o.data, np.float32).reshape(3, 320, 320) for o in r.outputs]
    assert all(o.min() >= 0 and o.max() <= 1 for o in outs)
    # the same frames through KServe ModelInfer, inputs by name: identical mouth regions
    req = pb.ks.ModelInferRequest(model_name="lip")
    req.inputs.add(name="visual", datatype="FP32", shape=list(vis.shape))
    req.inputs.add(name="audio", datatype="FP32", shape=list(aud.shape))
    req.raw_input_contents.extend([vis.tobytes(), aud.tobytes()])
    kr = ks(srv, pb).ModelInfer(req, timeout=120)
    ref = np.frombuffer(kr.raw_output_contents[0], np.float32).reshape(2, 3, 320, 320)
    for i in range(2):
        np.testing.assert_allclose(outs[i], ref[i], rtol=1e-5, atol=1e-6)


def test_lipsync_infer_batch_errors(start_server, pb):
    srv = lip_server(start_server)
    stub = lip(srv, pb)
    vis, aud = lip_inputs(1)

    def expect(code, *words, **kw):
        args = dict(model_id="lip", visual_frames=vis.tobytes(), audio_features=aud.tobytes(), batch_size=1)
        args.update(kw)
        c, msg = code_of(lambda: stub.InferBatch(pb.ls.InferBatchRequest(**args), timeout=60))
        assert c == code, (c, msg)
        for w in words:
            assert w in msg, msg

    expect(grpc.StatusCode.NOT_FOUND, "unknown model 'nope'", model_id="nope")
    expect(grpc.StatusCode.INVALID_ARGUMENT, "model_id is required", model_id="")
    expect(grpc.StatusCode.INVALID_ARGUMENT, "batch_size is 0; expected 1..25", batch_size=0)
    expect(grpc.StatusCode.INVALID_ARGUMENT, "batch_size is 26; expected 1..25", batch_size=26)
    expect(grpc.StatusCode.INVALID_ARGUMENT, "visual_frames has 2457600 bytes; batch_size 2 x 6x320x320 float32 "
           "needs 4915200", batch_size=2)
    expect(grpc.StatusCode.INVALID_ARGUMENT, "audio_features has 10 bytes", "needs 32768",
           audio_features=b"0123456789")
    expect(grpc.StatusCode.FAILED_PRECONDITION, "model 'tiny' has 1 inputs", model_id="tiny")
    # InferBatchComposite needs background assets (tests/grpc/test_composite.py covers it)
    c, msg = code_of(lambda: stub.InferBatchComposite(pb.ls.CompositeBatchRequest(
        model_id="lip", visual_frames=vis.tobytes(), audio_features=aud.tobytes(), batch_size=1), timeout=60))
    assert c == grpc.StatusCode.FAILED_PRECONDITION and "has no background_dir" in msg, (c, msg)


def test_lipsync_management(start_server, pb):
    srv = lip_server(start_server)
    stub = lip(srv, pb)
    lm = stub.ListModels(pb.ls.ListModelsRequest())
    assert [m.model_id for m in lm.models] == ["lip", "tiny"] and lm.total_models == 2 and lm.loaded_models == 0
    assert all(not m.loaded and m.state == "UNLOADED" and m.gpu_id == -1 for m in lm.models)
    r = stub.LoadModel(pb.ls.LoadModelRequest(model_id="lip"), timeout=60)
    assert r.success and r.load_time_ms > 0 and r.model.loaded and r.model.state == "READY"
    assert r.model.stats.memory_bytes > 0 and r.model.model_path == str(LIPSYNC)
    r = stub.LoadModel(pb.ls.LoadModelRequest(model_id="lip"))
    assert r.success and r.load_time_ms == 0 and "already" in r.message
    r = stub.LoadModel(pb.ls.LoadModelRequest(model_id="lip", force_reload=True), timeout=60)
    assert r.success and r.model.stats.loads == 2 and r.model.version == 2
    h = stub.Health(pb.ls.HealthRequest())
    assert h.healthy and h.status == "SERVING" and list(h.loaded_model_ids) == ["lip"]
    assert h.loaded_models == 1 and h.total_models == 2 and len(h.devices) >= 1
    vis, aud = lip_inputs(1)
    stub.InferBatch(pb.ls.InferBatchRequest(model_id="lip", visual_frames=vis.tobytes(),
                                            audio_features=aud.tobytes(), batch_size=1), timeout=120)
    one = stub.GetModelStats(pb.ls.GetModelStatsRequest(model_id="lip"))
    assert [m.model_id for m in one.models] == ["lip"]
    st = one.models[0].stats
    assert st.usage_count == 1 and st.total_inference_time_ms > 0 and st.inference_count == 1
    assert one.devices[0].kind == "CPU" and one.devices[0].memory_total_bytes > 0
    assert one.totals.total_models == 2 and one.totals.requests_completed >= 1
    every = stub.GetModelStats(pb.ls.GetModelStatsRequest())
    assert [m.model_id for m in every.models] == ["lip", "tiny"]
    assert stub.UnloadModel(pb.ls.UnloadModelRequest(model_id="lip"), timeout=60).success
    assert not stub.GetModelStats(pb.ls.GetModelStatsRequest(model_id="lip")).models[0].loaded
    for rpc, req in ((stub.LoadModel, pb.ls.LoadModelRequest(model_id="nope")),
                     (stub.UnloadModel, pb.ls.UnloadModelRequest(model_id="nope")),
                     (stub.GetModelStats, pb.ls.GetModelStatsRequest(model_id="nope"))):
        c, msg = code_of(lambda: rpc(req))
        assert c == grpc.StatusCode.NOT_FOUND and "unknown model 'nope'" in msg, (c, msg)


def test_long_unknown_names_are_cut_in_replies(start_server, pb):
    s = start_server()
    ks = pb.ks_grpc.GRPCInferenceServiceStub(s.channel)
    ls = pb.ls_grpc.InferenceServiceStub(s.channel)
    name = "n" * (1 << 20)  # a megabyte of model name
    for call in (lambda: ks.ModelInfer(tiny_request(pb, np.ones((1, 16), np.float32), model=name), timeout=30),
                 lambda: ks.ModelMetadata(pb.ks.ModelMetadataRequest(name=name), timeout=30),
                 lambda: ls.InferBatch(pb.ls.InferBatchRequest(model_id=name, batch_size=1), timeout=30)):
        with pytest.raises(grpc.RpcError) as ei:
            call()
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
        d = ei.value.details()
        assert len(d) < 300 and f"({1 << 20} bytes)" in d, d[:300]


def _pb_varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _pb_len(num, payload):
    return _pb_varint(num << 3 | 2) + _pb_varint(len(payload)) + payload


def test_lipsync_infer_batch_any_field_layout(start_server, pb):
    """InferBatch reads the frame bytes in place (no copy), moving them to a 4-byte boundary
    when needed: fields in any order, at every alignment, repeated (the last wins), and unknown
    fields give the same mouth regions as the plain request; the reply (built from slices of the
    output, scalars appended) carries every field; a truncated message is INVALID_ARGUMENT."""
    srv = lip_server(start_server)
    stub = lip(srv, pb)
    vis, aud = lip_inputs(1, seed=3)
    ref = stub.InferBatch(pb.ls.InferBatchRequest(model_id="lip", visual_frames=vis.tobytes(),
                                                  audio_features=aud.tobytes(), batch_size=1), timeout=120)
    assert ref.success and ref.executed_batch_size == 1 and ref.queue_time_ms >= 0 and len(ref.outputs) == 1
    call = srv.channel.unary_unary("/inference.InferenceService/InferBatch", request_serializer=lambda b: b,
                                   response_deserializer=pb.ls.InferBatchResponse.FromString)
    model, size = _pb_len(1, b"lip"), _pb_varint(4 << 3) + _pb_varint(1)
    v, a = _pb_len(2, vis.tobytes()), _pb_len(3, aud.tobytes())
    wrong_v = _pb_len(2, bytes(8))  # a first visual_frames, replaced by the later one
    layouts = []
    for pad in range(4):  # an unknown field of 0..3 bytes shifts the frames through every alignment
        unknown = _pb_len(15, b"x" * pad)
        layouts += [unknown + model + v + a + size, unknown + a + size + v + model,
                    wrong_v + model + unknown + size + a + v]
    for body in layouts:
        r = call(body, timeout=120)
        assert r.success and len(r.outputs) == 1 and r.executed_batch_size == 1
        np.testing.assert_array_equal(np.frombuffer(r.outputs[0].data, np.float32),
                                      np.frombuffer(ref.outputs[0].data, np.float32))
    full = model + v + a + size
    for cut in (len(model) + 3, len(model) + len(v) // 2, len(full) - 1):
        with pytest.raises(grpc.RpcError) as e:
            call(full[:cut], timeout=60)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, cut
    # the server still answers the plain request afterwards
    assert stub.InferBatch(pb.ls.InferBatchRequest(model_id="lip", visual_frames=vis.tobytes(),
                                                   audio_features=aud.tobytes(), batch_size=1),
                           timeout=120).success
