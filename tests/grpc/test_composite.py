"""Black-box tests of lip-sync compositing (docs/media.md) against a real server:
InferBatchComposite over gRPC and POST /api/v1/lipsync/{model}/composite over HTTP.

Assets are small synthetic avatars written by models/gen/avatar.py (make_assets) into the test's
folder. The composited frames are checked against a reference computed here: the model's mouth
regions (from InferBatch on the same inputs), resized with the documented bilinear convention in
numpy (float64) and pasted onto the background PNGs; every pixel must match, except that a value
within float rounding of a .5 quantization tie may differ by one. Also: PNG = raw, JPEG
structure, loop and ping-pong wrapping, cache statistics in GetModelStats and /metrics, every
bad-asset case (the model keeps serving), HTTP errors, an HTTP upload refused from its head while
the model's queue is full, and concurrent clients."""
import json
import os
import re
import shutil
import struct
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from conftest import LIPSYNC, ROOT, code_of

sys.path.insert(0, str(ROOT / "models" / "gen"))
import avatar  # noqa: E402

FW, FH, NF, CROP = 256, 192, 12, 96
HTTP_RE = re.compile(r"serving \d+ models? on http://([0-9.]+):(\d+)")


@pytest.fixture
def assets(tmp_path):
    d = tmp_path / "avatar"
    avatar.make_assets(str(d), frames=NF, width=FW, height=FH, crop=CROP, level=1)
    return d


def lip_models(assets, **extra):
    m = {"model_path": str(LIPSYNC), "max_batch": 4, "background_dir": str(assets / "frames"),
         "crop_rects_path": str(assets / "crop_rects.json"), "num_frames": NF, "background_cache_frames": 6}
    m.update(extra)
    return m


def start(start_server, models):
    for need in ("max_batch",):
        for m in models.values():
            m.setdefault(need, 4)
    return start_server(models=models)


def http_base(srv):
    m = HTTP_RE.search(srv.stdout_path.read_text())
    assert m, srv.stdout_path.read_text()
    return "http://%s:%s" % (m.group(1), m.group(2))


def inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.random((n, 6, 320, 320), np.float32), rng.standard_normal((n, 32, 16, 16)).astype(np.float32))


def stub(srv, pb):
    return pb.ls_grpc.InferenceServiceStub(srv.channel)


def comp_req(pb, vis, aud, model="lip", **kw):
    return pb.ls.CompositeBatchRequest(model_id=model, visual_frames=vis.tobytes(), audio_features=aud.tobytes(),
                                       batch_size=len(vis), **kw)


def resize_ref(mouth, w, h):
    """Bilinear, pixel centres aligned, edge-clamped (docs/media.md); float64 values and tie mask."""
    s = mouth.shape[1]

    def axis(n):
        c = np.clip((np.arange(n) + 0.5) * s / n - 0.5, 0, s - 1)
        i0 = np.floor(c).astype(int)
        return i0, np.minimum(i0 + 1, s - 1), c - i0

    x0, x1, fx = axis(w)
    y0, y1, fy = axis(h)
    m = mouth.astype(np.float64)
    top = m[:, y0][:, :, x0] * (1 - fx) + m[:, y0][:, :, x1] * fx
    bot = m[:, y1][:, :, x0] * (1 - fx) + m[:, y1][:, :, x1] * fx
    v = top * (1 - fy)[None, :, None] + bot * fy[None, :, None]
    sv = v * 255 + 0.5
    tie = np.abs(sv - np.floor(sv + 0.5)) < 2e-4
    return np.clip(np.floor(sv), 0, 255).astype(np.uint8).transpose(1, 2, 0), tie.transpose(1, 2, 0)


def reference_frame(assets, idx, mouth):
    bg = avatar.read_png((assets / "frames" / ("%06d.png" % idx)).read_bytes())
    r = json.loads((assets / "crop_rects.json").read_text())[idx]
    patch, tie = resize_ref(mouth, r["x2"] - r["x1"], r["y2"] - r["y1"])
    out = bg.copy()
    out[r["y1"]:r["y2"], r["x1"]:r["x2"]] = patch
    ties = np.zeros(bg.shape, bool)
    ties[r["y1"]:r["y2"], r["x1"]:r["x2"]] = tie
    return out, ties


def assert_frame(got, want, ties):
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff[~ties].max(initial=0) == 0, "pixels differ outside rounding ties: %d" % int((diff[~ties] > 0).sum())
    assert diff.max(initial=0) <= 1


def mouths_of(srv, pb, vis, aud):
    r = stub(srv, pb).InferBatch(pb.ls.InferBatchRequest(model_id="lip", visual_frames=vis.tobytes(),
                                                         audio_features=aud.tobytes(), batch_size=len(vis)),
                                 timeout=120)
    return [np.frombuffer(o.data, np.float32).reshape(3, 320, 320) for o in r.outputs]


def test_composite_matches_reference(start_server, pb, assets):
    srv = start(start_server, {"lip": lip_models(assets)})
    vis, aud = inputs(3, seed=5)
    mouths = mouths_of(srv, pb, vis, aud)
    s = stub(srv, pb)
    r = s.InferBatchComposite(comp_req(pb, vis, aud, start_frame_idx=NF - 2, format="rgb"), timeout=120)
    assert r.success and len(r.frames) == 3 and r.inference_time_ms > 0 and r.composite_time_ms > 0
    assert r.executed_batch_size >= 1 and r.gpu_id == 0
    assert [f.frame_idx for f in r.frames] == [NF - 2, NF - 1, 0]  # loop
    for f, mouth in zip(r.frames, mouths):
        assert (f.format, f.width, f.height) == ("rgb", FW, FH) and len(f.data) == FW * FH * 3
        want, ties = reference_frame(assets, f.frame_idx, mouth)
        assert_frame(np.frombuffer(f.data, np.uint8).reshape(FH, FW, 3), want, ties)
    # PNG decodes to exactly the raw frames; JPEG is well formed and sized; ping-pong wraps back
    raw = [np.frombuffer(f.data, np.uint8).reshape(FH, FW, 3) for f in r.frames]
    p = s.InferBatchComposite(comp_req(pb, vis, aud, start_frame_idx=NF - 2, format="png"), timeout=120)
    for f, want in zip(p.frames, raw):
        assert f.format == "png"
        np.testing.assert_array_equal(avatar.read_png(f.data), want)
    j = s.InferBatchComposite(comp_req(pb, vis, aud, start_frame_idx=NF - 2, jpeg_quality=90, wrap="pingpong"),
                              timeout=120)
    assert [f.frame_idx for f in j.frames] == [NF - 2, NF - 1, NF - 2]
    for f in j.frames:
        d = f.data
        assert f.format == "jpeg" and d[:2] == b"\xff\xd8" and d[-2:] == b"\xff\xd9" and len(d) < FW * FH
        k = d.index(b"\xff\xc0")
        assert struct.unpack(">HH", d[k + 5:k + 9]) == (FH, FW)
    assert j.encode_time_ms > 0


def test_cache_stats_and_metrics(start_server, pb, assets):
    srv = start(start_server, {"lip": lip_models(assets)})
    s = stub(srv, pb)
    vis, aud = inputs(2, seed=1)
    for start_idx in range(0, 2 * NF, 2):  # sequential playback, two loops over 12 frames, cache 6
        s.InferBatchComposite(comp_req(pb, vis, aud, start_frame_idx=start_idx, format="rgb"), timeout=120)
    st = s.GetModelStats(pb.ls.GetModelStatsRequest(model_id="lip")).models[0].stats
    bc = st.background_cache
    assert bc.enabled and not bc.error and bc.requests == 2 * NF and bc.hits + bc.misses == bc.requests
    assert bc.capacity_frames == 6 and bc.num_frames == NF and (bc.width, bc.height) == (FW, FH)
    assert bc.frames_cached <= 6 and bc.bytes == bc.frames_cached * FW * FH * 3
    # per frame: the decoded RGB frame plus 2 bits per pixel for its JPEG encoding (jpeg_splice.h)
    assert bc.capacity_bytes == 6 * (FW * FH * 3 + FW * FH // 4) and st.memory_bytes > bc.capacity_bytes
    assert bc.evictions > 0 and bc.avg_load_ms > 0 and 0 <= bc.hit_rate <= 1
    assert bc.hit_rate == pytest.approx(bc.hits / bc.requests)
    metrics = urllib.request.urlopen(http_base(srv) + "/metrics", timeout=30).read().decode()
    assert 'mts_bgcache_requests_total{model="lip"} %d' % (2 * NF) in metrics
    for name in ("hits_total", "misses_total", "evictions_total", "hit_rate", "load_avg_ms", "bytes",
                 "capacity_bytes", "jpeg_spliced_total", "jpeg_full_total"):
        assert 'mts_bgcache_%s{model="lip"}' % name in metrics
    assert 'mts_bgcache_jpeg_spliced_total{model="lip"} 0\n' in metrics  # no JPEG asked for yet
    # JPEG playback: frames are encoded by splicing onto the backgrounds' cached encodings
    for start_idx in range(0, 2 * NF, 2):
        s.InferBatchComposite(comp_req(pb, vis, aud, start_frame_idx=start_idx), timeout=120)
    metrics = urllib.request.urlopen(http_base(srv) + "/metrics", timeout=30).read().decode()
    val = {k: float(metrics.split('mts_bgcache_%s{model="lip"} ' % k)[1].split()[0])
           for k in ("jpeg_spliced_total", "jpeg_full_total", "bytes", "frames")}
    assert val["jpeg_spliced_total"] + val["jpeg_full_total"] == 2 * NF and val["jpeg_spliced_total"] >= NF
    assert val["bytes"] > val["frames"] * FW * FH * 3  # the encodings are counted


def test_bad_assets_fail_requests_model_keeps_serving(start_server, pb, assets, tmp_path):
    # a second, broken copy: num_frames mismatch for one model, a gap-free copy with defects for another
    broken = tmp_path / "broken"
    shutil.copytree(assets, broken)
    (broken / "frames" / "000003.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 100)
    rects = json.loads((broken / "crop_rects.json").read_text())
    rects[5] = {"x1": FW - 10, "y1": 0, "x2": FW + 50, "y2": 40}
    (broken / "crop_rects.json").write_text(json.dumps(rects))
    models = {"lip": lip_models(broken), "mismatch": lip_models(assets, num_frames=NF + 1),
              "noassets": {"model_path": str(LIPSYNC)},
              "badjson": lip_models(assets, crop_rects_path=str(tmp_path / "missing.json"))}
    srv = start(start_server, models)
    s = stub(srv, pb)
    vis, aud = inputs(1, seed=2)

    def expect(code, words, **kw):
        c, msg = code_of(lambda: s.InferBatchComposite(comp_req(pb, vis, aud, **kw), timeout=120))
        assert c == code, (c, msg)
        for w in words:
            assert w in msg, msg

    fp = grpc.StatusCode.FAILED_PRECONDITION
    expect(fp, ["000003.png: corrupt PNG"], start_frame_idx=3)
    expect(fp, ["crop rectangle", "frame 5 lies outside the 256x192 background frame"], start_frame_idx=5)
    (broken / "frames" / "000007.png").unlink()
    expect(fp, ["000007.png: frame file is missing"], start_frame_idx=7)
    expect(fp, ["num_frames is 13 but background_dir", "has 12 PNG frames"], model="mismatch")
    expect(fp, ["has no background_dir"], model="noassets")
    expect(fp, ["missing.json"], model="badjson")
    expect(grpc.StatusCode.INVALID_ARGUMENT, ["format 'gif'"], format="gif")
    expect(grpc.StatusCode.INVALID_ARGUMENT, ["wrap 'bounce'"], wrap="bounce")
    expect(grpc.StatusCode.INVALID_ARGUMENT, ["jpeg_quality is 101"], jpeg_quality=101)
    # the same models keep serving: other frames composite, InferBatch works, the stats say why
    r = s.InferBatchComposite(comp_req(pb, vis, aud, start_frame_idx=8), timeout=120)
    assert r.frames[0].frame_idx == 8
    for m in ("mismatch", "noassets"):
        r = s.InferBatch(pb.ls.InferBatchRequest(model_id=m, visual_frames=vis.tobytes(),
                                                 audio_features=aud.tobytes(), batch_size=1), timeout=120)
        assert len(r.outputs) == 1
    st = s.GetModelStats(pb.ls.GetModelStatsRequest(model_id="mismatch")).models[0].stats.background_cache
    assert not st.enabled and "num_frames is 13" in st.error
    st = s.GetModelStats(pb.ls.GetModelStatsRequest(model_id="lip")).models[0].stats.background_cache
    assert st.enabled and st.load_errors >= 2


def http_post(url, body, timeout=120):
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_http_composite(start_server, pb, assets):
    srv = start(start_server, {"lip": lip_models(assets), "tiny": {"model_path": str(ROOT / "models/out/tiny.onnx")}})
    base = http_base(srv)
    vis, aud = inputs(2, seed=9)
    body = vis.tobytes() + aud.tobytes()
    status, headers, data = http_post(base + "/api/v1/lipsync/lip/composite?start_frame_idx=4&format=rgb", body)
    assert status == 200, data[:300]
    head, frames = avatar.parse_composite_response(data, int(headers["Inference-Header-Content-Length"]))
    assert head["batch_size"] == 2 and head["format"] == "rgb" and (head["width"], head["height"]) == (FW, FH)
    assert [f["frame_idx"] for f in head["frames"]] == [4, 5] and head["inference_time_ms"] > 0
    g = stub(srv, pb).InferBatchComposite(comp_req(pb, vis, aud, start_frame_idx=4, format="rgb"), timeout=120)
    assert frames == [f.data for f in g.frames]  # the same bytes as gRPC
    status, headers, data = http_post(base + "/api/v1/lipsync/lip/composite?batch_size=2&quality=70", body)
    head, frames = avatar.parse_composite_response(data, int(headers["Inference-Header-Content-Length"]))
    assert status == 200 and head["format"] == "jpeg" and all(f[:2] == b"\xff\xd8" for f in frames)

    def expect(code, path, words, payload=body):
        st, _, d = http_post(base + path, payload)
        assert st == code, (st, d)
        msg = json.loads(d)["error"]
        for w in words:
            assert w in msg, msg

    expect(400, "/api/v1/lipsync/lip/composite", ["the body has 10 bytes"], b"0123456789")
    expect(400, "/api/v1/lipsync/lip/composite?batch_size=3", ["matching batch_size"])
    expect(400, "/api/v1/lipsync/lip/composite?format=gif", ["format 'gif'"])
    expect(400, "/api/v1/lipsync/lip/composite?quality=0", ["quality '0'"])
    expect(404, "/api/v1/lipsync/nope/composite", ["unknown model 'nope'"])
    expect(404, "/api/v1/lipsync/lip/other", ["no route"])
    expect(412, "/api/v1/lipsync/tiny/composite", ["model 'tiny' has 1 inputs"], b"\0" * 64)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(base + "/api/v1/lipsync/lip/composite", timeout=30)
    assert e.value.code == 405


def test_http_composite_refused_from_head(start_server, pb, assets):
    """While the lip-sync model's queue is full, a composite upload is answered 429 (Retry-After)
    from its head alone, before any of its frames is sent."""
    import socket
    import threading
    import time
    srv = start(start_server, {"lip": lip_models(assets, queue_size=1, max_batch=16, instances=1)})
    base = http_base(srv)
    host, port = base[len("http://"):].split(":")
    vis, aud = inputs(16, seed=5)
    busy = vis.tobytes() + aud.tobytes()  # 16 frames: one long batch
    one = inputs(1, seed=6)
    body = one[0].tobytes() + one[1].tobytes()
    head = (f"POST /api/v1/lipsync/lip/composite?format=rgb HTTP/1.1\r\nHost: t\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    assert http_post(base + "/api/v1/lipsync/lip/composite?format=rgb", body)[0] == 200  # loaded, warm
    refused = None
    for _ in range(8):  # the queue must still be full when the head arrives: retried if it was not
        threads = [threading.Thread(target=http_post, args=(base + "/api/v1/lipsync/lip/composite", busy))
                   for _ in range(2)]
        threads[0].start()
        time.sleep(0.05)
        threads[1].start()  # waits behind the first (instances: 1): the queue of one is full
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            with urllib.request.urlopen(base + "/v2/models/lip/stats", timeout=10) as r:
                if json.loads(r.read())["model_stats"][0]["queue_depth"] >= 1:
                    break
            time.sleep(0.002)
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(head)
        data = b""
        try:
            while True:  # until one whole answer (head and Content-Length body) or the timeout
                end = data.find(b"\r\n\r\n")
                m = re.search(rb"(?i)\r\nContent-Length: *(\d+)", data[:end]) if end >= 0 else None
                if end >= 0 and len(data) >= end + 4 + (int(m.group(1)) if m else 0):
                    break
                d = sock.recv(65536)
                if not d:
                    break
                data += d
        except socket.timeout:
            pass
        if data.startswith(b"HTTP/1.1 429"):
            refused = data.decode(errors="replace")
        else:
            sock.settimeout(120)
            sock.sendall(body)
            while b"\r\n\r\n" not in data:
                d = sock.recv(65536)
                assert d, data
                data += d
        sock.close()
        for t in threads:
            t.join(300)
        if refused:
            break
    assert refused, "the queue was never full when the head arrived"
    assert re.search(r"(?im)^Retry-After: *1\r$", refused), refused
    assert not re.search(r"(?im)^Connection: *close\r$", refused), refused  # kept: the body is dropped
    assert "queue is full" in refused, refused
    assert http_post(base + "/api/v1/lipsync/lip/composite?format=rgb", body)[0] == 200  # still serving


def test_concurrent_clients(start_server, pb, assets):
    srv = start(start_server, {"lip": lip_models(assets, background_cache_frames=3)})
    s = stub(srv, pb)
    vis, aud = inputs(2, seed=3)

    def one(i):
        r = s.InferBatchComposite(comp_req(pb, vis, aud, start_frame_idx=i, format="jpeg" if i % 2 else "rgb"),
                                  timeout=300)
        return [f.frame_idx for f in r.frames]

    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(one, range(16)))
    assert got == [[i % NF, (i + 1) % NF] for i in range(16)]
    bc = s.GetModelStats(pb.ls.GetModelStatsRequest(model_id="lip")).models[0].stats.background_cache
    assert bc.requests == 32 and bc.frames_cached <= 3 + 16
