"""`mtserve bench --api lipsync` against a real server: InferBatch and InferBatchComposite over
gRPC, POST /api/v1/lipsync/{model}/composite over HTTP (and raw frames over KServe infer), the
users mode with requests of several frames, the avatar walk of each user and --find-capacity.

The server runs lipsync_unet_w4 on a small synthetic avatar (models/gen/avatar.py) so every run
takes a few seconds on 2 cores. Counts are checked exactly where the schedule fixes them (frames
and requests per speaking phase, bytes of raw and rgb frames), and the frames each user walked
are read back from the server's background cache."""
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import MTSERVE, ROOT, TINY

sys.path.insert(0, str(ROOT / "models" / "gen"))
import avatar  # noqa: E402

LIPSYNC = ROOT / "models" / "out" / "lipsync_unet_w4.onnx"  # visual[N,6,320,320], audio[N,32,16,16]
FW, FH, NF, CROP = 256, 192, 12, 96
MODEL = "lip"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    d = tmp_path_factory.mktemp("avatar")
    avatar.make_assets(str(d), frames=NF, width=FW, height=FH, crop=CROP, level=1)
    return d


def lip_server(servers, assets, cache_frames=NF):
    cfg = (f"max_batch: 8\nbackground_dir: {assets / 'frames'}\ncrop_rects_path: {assets / 'crop_rects.json'}\n"
           f"num_frames: {NF}\nbackground_cache_frames: {cache_frames}\n")
    return servers({MODEL: (LIPSYNC, cfg)})


def frames_cached(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    m = re.search(r'^mts_bgcache_frames\{model="%s"\} (\d+)' % MODEL, text, re.M)
    assert m, "no mts_bgcache_frames for the model in /metrics"
    return int(m.group(1))


def test_composite_over_grpc_and_http(servers, assets, bench):
    url, grpc_addr = lip_server(servers, assets)
    for transport, fmt in (("grpc", "jpeg"), ("http", "rgb"), ("grpc", "png")):
        extra = ["--grpc", grpc_addr] if transport == "grpc" else []
        s, _ = bench(url, *extra, "--api", "lipsync", "--model", MODEL, "--frames-per-request", 4, "--format", fmt,
                     "--concurrency", 1, "--requests", 3)
        assert s["transport"] == ("grpc-lipsync" if transport == "grpc" else "http-lipsync")
        assert s["ok"] == 3 and s["errors"] == 0, s
        lip = s["lipsync"]
        assert lip["rpc"] == "composite" and lip["format"] == fmt
        assert lip["avatar_frames"] == NF  # learned from the first reply
        assert lip["frames_received"] == 12
        if fmt == "rgb":
            assert lip["bytes_per_frame"] == FW * FH * 3
        else:
            assert 100 < lip["bytes_per_frame"] < FW * FH * 3
        for k in ("server_composite_ms", "server_encode_ms", "server_background_ms"):
            assert lip[k]["count"] == 3, k
        assert s["server_compute_ms"]["count"] == 3 and s["server_compute_ms"]["min"] > 0


def test_raw_frames_over_grpc_and_kserve_http(servers, assets, bench):
    url, grpc_addr = lip_server(servers, assets)
    for extra in (["--grpc", grpc_addr], []):
        s, _ = bench(url, *extra, "--api", "lipsync", "--rpc", "infer", "--model", MODEL, "--frames-per-request", 2,
                     "--concurrency", 2, "--requests", 4)
        assert s["ok"] == 4 and s["errors"] == 0, s
        assert s["lipsync"]["rpc"] == "infer"
        assert s["lipsync"]["frames_received"] == 8
        assert s["lipsync"]["bytes_per_frame"] == 3 * 320 * 320 * 4  # float32 mouth regions
        # the server's times follow the mouth regions in a gRPC reply: read past 2.4 MB of them
        assert s["server_compute_ms"]["count"] == 4 and s["server_compute_ms"]["min"] > 0, s
        assert s["server_queue_ms"]["count"] == 4, s
        # the client's own CPU while it ran: receiving 2.4 MB per request costs something
        assert s["client_cpu_ms"] > 0 and abs(s["client_cpu_ms_per_request"] - s["client_cpu_ms"] / 4) < 0.01, s
    assert s["transport"] == "http"  # raw frames over HTTP are a KServe infer


def test_users_send_requests_of_several_frames(servers, assets, bench):
    url, grpc_addr = lip_server(servers, assets)
    # speaking 0.4 s at 25 FPS = 10 frames = requests of 4, 4 and 2 frames; cycle 1 s; the second
    # user's phase starts half a cycle later, inside the measured cycle
    s, _ = bench(url, "--grpc", grpc_addr, "--api", "lipsync", "--model", MODEL, "--frames-per-request", 4,
                 "--users", 2, "--speak-s", 0.4, "--listen-s", 0.3, "--wait-s", 0.3, "--timeout-ms", 20000)
    f = s["frames"]
    assert f["frames"] == 20, s
    assert s["requests"] == 6
    assert s["lipsync"]["frames_received"] == 20
    assert f["on_time"] + f["late"] + f["failed"] == 20
    assert f["failed"] == 0
    assert s["cycle"]["frame_deadline_ms"] == pytest.approx(160)  # 4 frames at 25 FPS


@pytest.mark.parametrize("policy,expect", [("spread", 8), ("zero", 4)])
def test_each_user_walks_its_own_frames(servers, assets, bench, policy, expect):
    url, grpc_addr = lip_server(servers, assets)
    # two users, one request of 2 frames each: spread starts them at frames 0 and 6 (12 frames,
    # 2 users), zero both at frame 0. The server decodes each request's frames and the next 2
    # ahead (its prefetch), so the cache ends up holding 0-3 and 6-9, or only 0-3.
    s, _ = bench(url, "--grpc", grpc_addr, "--api", "lipsync", "--model", MODEL, "--frames-per-request", 2,
                 "--users", 2, "--speak-s", 0.08, "--listen-s", 0.2, "--wait-s", 0.2, "--start-frame", policy,
                 "--timeout-ms", 20000)
    assert s["frames"]["frames"] == 4 and s["errors"] == 0, s
    deadline = time.monotonic() + 5  # the prefetch of the last frames may still be running
    while frames_cached(url) < expect and time.monotonic() < deadline:
        time.sleep(0.05)
    assert frames_cached(url) == expect


def test_request_phases(servers, assets, bench):
    """Users mode places 12 users evenly over the 15 s cycle; their 8-frame requests come every
    320 ms. grid keeps the even offsets, whose request phases (15 s / 12 = 1.25 s, 30 ms short of
    four periods) put the requests of users speaking together within 30 ms of each other; spread
    (the default) moves each offset by under one period so the phases follow the golden-ratio
    sequence, whose 4 consecutive points leave gaps of at least 0.146 of the period."""
    url, grpc_addr = lip_server(servers, assets)
    period, n = 320.0, 12
    phases = {}
    for policy in ("grid", "spread"):
        s, _ = bench(url, "--grpc", grpc_addr, "--api", "lipsync", "--model", MODEL, "--users", n, "--duration", 0.3,
                     "--frames-per-request", 8, "--request-phases", policy, "--frame-deadline-ms", 20000, "--timeout-ms", 20000)
        assert s["cycle"]["request_phases"] == policy
        off = s["cycle"]["user_offsets_ms"]
        assert len(off) == n
        even = [15000.0 * u / n for u in range(n)]
        if policy == "grid":
            assert off == pytest.approx(even)
        else:
            for u in range(n):
                assert 0 <= off[u] < 15000 and abs(off[u] - even[u]) < period, (u, off[u])
                want = period * ((u * 0.6180339887498949) % 1.0)
                assert (-off[u]) % period == pytest.approx(want, abs=1e-6)
        phases[policy] = [(-o) % period for o in off]

    def closest(ph):  # the smallest circular gap between the phases of 4 consecutive users
        gaps = []
        for u in range(n - 3):
            p = sorted(ph[u:u + 4])
            gaps += [b - a for a, b in zip(p, p[1:])] + [p[0] + period - p[-1]]
        return min(gaps)
    assert closest(phases["grid"]) == pytest.approx(30, abs=1e-6)
    assert closest(phases["spread"]) > 0.14 * period
    r = subprocess.run([str(MTSERVE), "bench", "--api", "lipsync", "--model", "x", "--users", "2",
                        "--request-phases", "random"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "expected spread or grid" in r.stderr


def test_find_capacity_over_http(servers, assets, bench):
    url, _ = lip_server(servers, assets)
    s, _ = bench(url, "--api", "lipsync", "--model", MODEL, "--frames-per-request", 4, "--find-capacity",
                 "--max-users", 2, "--speak-s", 0.4, "--listen-s", 0.3, "--wait-s", 0.3, "--frame-deadline-ms", 20000,
                 timeout=180)
    assert s["levels"], s
    assert all(lv["frames"] > 0 for lv in s["levels"])
    assert s["capacity"]["max_users"] == 2  # a 20 s deadline holds on any machine


def test_usage_errors(servers, assets, bench):
    url, grpc_addr = servers({"tiny": TINY})
    r = subprocess.run([str(MTSERVE), "bench", "--url", url, "--api", "lipsync", "--model", "tiny", "--requests", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not a lip-sync model" in r.stderr, r.stderr
    r = subprocess.run([str(MTSERVE), "bench", "--api", "lipsync", "--frames-per-request", "26", "--model", "x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "1..25" in r.stderr
    # a lip-sync model without background assets: the first composite says why, and the run stops
    url, grpc_addr = servers({MODEL: LIPSYNC})
    r = subprocess.run([str(MTSERVE), "bench", "--url", url, "--grpc", grpc_addr, "--api", "lipsync", "--model", MODEL,
                        "--requests", "1", "--frames-per-request", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "first composite of 'lip' failed: FAILED_PRECONDITION" in r.stderr, r.stderr
