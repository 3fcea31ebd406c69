"""Scale-out behind HAProxy (docs/scale-out.md), end to end: three real `mtserve serve`
instances on free loopback ports sharing one repository of 60 copies of the tiny model (m00..m59)
plus a few probe models, each instance allowed 20 resident models (ML_CONCURRENT_MODELS), behind
HAProxy configured by `mtserve cluster-config` (the CLI's output as printed). Traffic goes through
the front door; each instance is asked directly which models it holds.

- Zipf(1.0) traffic: every request answered; no model resident on more than 2 instances
  (consistent hashing; the load bound, default factor 250, lets a request leave an instance
  that has 2.5 times the average requests in flight); the cluster holds at least 2.2x the models
  one instance can (2.7-2.85x measured on a quiet machine, down to 2.25x on a busy one). Without the load bound (--balance-factor 0) every
  model is on exactly one instance and the cluster holds what the hash split of the 60 names
  allows (19 + 18 + 20 of 23: 2.85x).
- An instance that stops answering (SIGSTOP for 1 s) under that traffic does not stop the
  cluster: the load bound moves the requests that would queue on it to the others.
- Segmentation uploads are routed by the `model` query parameter or the `mts-model` header (the
  instance takes the model from them: it answers 412 "not a segmentation model" for a tiny copy).
- gRPC through HAProxy (HTTP/2 both sides): with `mts-model` a model's calls stay on one
  instance, the same one its HTTP requests go to, also from `mtserve infer --grpc`; without it
  calls are spread round-robin and still succeed.
- A request (HTTP, head and body in separate segments) or a unary gRPC call in flight on an
  instance that is stopped and then killed is answered by another instance (HAProxy's L7 retry,
  which needs the whole request buffered first: `option http-buffer-request`, gRPC
  `wait-for-body`); a ModelStreamInfer stream is not buffered (its first answer comes back
  before its second request is sent).
- kill -9 of an instance under load: no failed request, and the clients never retry (HAProxy
  retries and redispatches), HAProxy marks it down, its models load on the survivors;
  restarted, it passes its health checks and takes traffic again. Then kill -9 of another
  instance under gRPC load: no failed call.
"""
import io
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import requests
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster as C  # noqa: E402

MAX_MODELS = 20
NAMES = [f"m{i:02d}" for i in range(60)]
PROBES = ["q_probe", "h_probe", "g_probe", "g_nohdr", "c_probe", "k_probe", "k_grpc"]


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    if not C.MTSERVE.exists():
        pytest.fail(f"{C.MTSERVE} is missing: run `make build` first")
    if not C.TINY.exists():
        pytest.fail(f"{C.TINY} is missing: run `make models` first")
    work = tmp_path_factory.mktemp("cluster")
    c = C.Cluster(work, NAMES + PROBES, n=3, max_models=MAX_MODELS)
    try:
        c.start()
        yield c
    finally:
        bad = c.stop()
    assert not bad, f"instances exited with {bad} on SIGTERM; logs in {work}"


def holders(c, model):
    return [i.idx for i in c.instances if model in i.resident()]


def test_affinity_zipf(cl):
    st = C.drive(cl.url, NAMES, n_requests=1500, threads=8, seed=1)
    assert st["failed"] == 0, st["errors"]
    where = cl.residency()
    per = [len(i.resident()) for i in cl.instances]
    copies = {m: len(v) for m, v in where.items() if m in NAMES}
    spilled = sorted(m for m, k in copies.items() if k > 1)
    print(f"\naffinity: {st['ok']} requests in {st['seconds']:.1f} s; resident per instance {per} "
          f"(max_models {MAX_MODELS}); distinct models resident {len(copies)} = "
          f"{len(copies) / MAX_MODELS:.2f}x one instance; on 2 instances: {spilled}; "
          f"loads {[i.loads() for i in cl.instances]}")
    assert max(per) <= MAX_MODELS
    assert max(copies.values()) <= 2, {m: where[m] for m in spilled}
    # factor 250: 54-57 distinct on a quiet machine, 45-57 with the 2 cores shared by a load
    # average of 17-19 (a descheduled instance sheds requests like a stalled one); 150: 45-47 quiet
    assert len(copies) >= 2.2 * MAX_MODELS, (len(copies), per)


def test_stalled_instance_does_not_stall_the_cluster(cl):
    """The reason for keeping a load bound: the instance holding the hottest model stops
    answering for 1 s (SIGSTOP: a stalled or saturated machine) under 8 client threads. Without
    the bound every thread soon waits on it and the cluster answers nothing in the second half
    of the stall; with factor 250 the stalled instance takes at most 2.5 times the average in
    flight (7 of the 8 requests) and the requests of the remaining thread go to the next
    instance on the ring (measured 0.23-1.2 of the usual rate, the spread being this shared
    machine's load; 0 without the bound)."""
    import signal
    victim = cl.owner(NAMES[0])
    ev = {}

    def during(el):
        if el >= 1.0 and "stop" not in ev:
            victim.proc.send_signal(signal.SIGSTOP)
            ev["stop"] = time.monotonic()
        if el >= 2.0 and "cont" not in ev:
            victim.proc.send_signal(signal.SIGCONT)
            ev["cont"] = True

    try:
        st = C.drive(cl.url, NAMES, seconds=2.5, threads=8, seed=6, during=during)
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    done = st["done_s"]
    before = sum(1 for t in done if 0.5 <= t < 1.0)
    stalled = sum(1 for t in done if 1.5 <= t < 2.0)
    print(f"\nmts{victim.idx} stopped for 1 s: {stalled} requests answered in the second half of the stall, "
          f"{before} in the half second before it")
    assert st["failed"] == 0, st["errors"]
    assert stalled >= 0.1 * before, (stalled, before)


def test_affinity_without_load_bound(tmp_path):
    """--balance-factor 0: pure consistent hashing, every model on exactly one instance, and the
    cluster holds about 3x the models of one instance: the hash puts 19, 18 and 23 of the 60 names
    on the instances (HAProxy's sdbm + avalanche on the name, servers placed by id), so 57 fit."""
    c = C.Cluster(tmp_path, NAMES, n=3, max_models=MAX_MODELS, balance_factor=0)
    try:
        c.start()
        st = C.drive(c.url, NAMES, n_requests=1500, threads=8, seed=1)
        assert st["failed"] == 0, st["errors"]
        where = c.residency()
        per = [len(i.resident()) for i in c.instances]
    finally:
        bad = c.stop()
    assert not bad, f"instances exited with {bad} on SIGTERM; logs in {tmp_path}"
    print(f"\naffinity, no load bound: resident per instance {per}; distinct {len(where)} = "
          f"{len(where) / MAX_MODELS:.2f}x one instance")
    assert all(len(v) == 1 for v in where.values()), {m: v for m, v in where.items() if len(v) > 1}
    assert len(where) >= 2.75 * MAX_MODELS, (len(where), per)


def png(w=8, h=8):
    b = io.BytesIO()
    Image.new("RGB", (w, h), (90, 120, 200)).save(b, format="PNG")
    return b.getvalue()


@pytest.mark.parametrize("how", ["query", "header"])
def test_segmentation_routed_by_query_or_header(cl, how):
    model = "q_probe" if how == "query" else "h_probe"
    files = {"file": ("a.png", png(), "image/png")}
    url, headers = f"{cl.url}/api/v1/segment", {}
    if how == "query":
        url += f"?model={model}"
    else:
        headers["mts-model"] = model
    r = requests.post(url, files=files, headers=headers, timeout=60)
    # a tiny copy is not a segmentation model: the instance read the model name and loaded it
    assert r.status_code == 412 and "not an image segmentation model" in r.text, r.text
    first = holders(cl, model)
    assert len(first) == 1, first
    for _ in range(4):
        r = requests.post(url, files=files, headers=headers, timeout=60)
        assert r.status_code == 412, r.text
        assert requests.post(f"{cl.url}/v2/models/{model}/infer", json=C.TINY_BODY, timeout=60).status_code == 200
    # uploads and KServe infers of the model go where the hash puts it; bounded-load hashing may
    # spill it to one more instance when that one is busier than the average (round-robin would
    # spread these 9 requests over all 3)
    now = holders(cl, model)
    assert set(first) <= set(now) and len(now) <= 2, (first, now)


def test_segmentation_header_must_agree_with_form(cl):
    r = requests.post(f"{cl.url}/api/v1/segment", files={"file": ("a.png", png(), "image/png")},
                      data={"model": "m01"}, headers={"mts-model": "m02"}, timeout=60)
    assert r.status_code == 400 and "Mts-Model header names 'm02'" in r.text, r.text


def test_grpc_through_haproxy(cl, tmp_path):
    pb2, pb2_grpc = C.grpc_stubs(tmp_path / "stubs")
    with grpc.insecure_channel(cl.grpc_target) as ch:
        stub = pb2_grpc.GRPCInferenceServiceStub(ch)
        assert stub.ServerLive(pb2.ServerLiveRequest(), timeout=10).live  # no model: round-robin
        for _ in range(6):
            r = stub.ModelInfer(C.tiny_grpc_request(pb2, "g_probe"), metadata=[("mts-model", "g_probe")],
                                timeout=60)
            assert list(r.outputs[0].shape) == [1, 16]
        with_md = holders(cl, "g_probe")
        for _ in range(6):
            r = stub.ModelInfer(C.tiny_grpc_request(pb2, "g_nohdr"), timeout=60)
            assert list(r.outputs[0].shape) == [1, 16]
        without_md = holders(cl, "g_nohdr")
    assert len(with_md) == 1, with_md
    assert len(without_md) >= 2, without_md  # six calls round-robin over three instances
    # HTTP requests for the model go to the instance its gRPC calls went to (same servers, same hash)
    for _ in range(4):
        assert requests.post(f"{cl.url}/v2/models/g_probe/infer", json=C.TINY_BODY, timeout=60).status_code == 200
    assert holders(cl, "g_probe") == with_md
    # the built-in client sends mts-model (metadata call + infer: both to one instance)
    for _ in range(3):
        out = subprocess.run([str(C.MTSERVE), "infer", "c_probe", "--grpc", cl.grpc_target], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    cli = holders(cl, "c_probe")
    assert len(cli) == 1, cli
    assert requests.post(f"{cl.url}/v2/models/c_probe/infer", json=C.TINY_BODY, timeout=60).status_code == 200
    assert holders(cl, "c_probe") == cli


def restart(c, victim):
    """Brings a killed (or stopped) instance back and waits until HAProxy has it UP again."""
    if victim.proc.poll() is None:
        victim.kill9()
    victim.start()
    c.wait_servers(["UP"] * len(c.instances))


def read_response(sock):
    """One HTTP/1.1 response with a Content-Length from sock: (status line, body), or (b"", b"")
    when the connection is closed before any byte of it."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            assert not buf, f"connection closed in the middle of a response head: {buf[:200]!r}"
            return b"", b""
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    fields = (ln.partition(b":") for ln in lines[1:])
    length = next(int(v) for k, _, v in fields if k.strip().lower() == b"content-length")
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the middle of a response body"
        body += chunk
    return lines[0], body


def inflight_retry(c, model, pad=0):
    """Sends one request for `model` (its JSON body padded with `pad` spaces) in two segments to an
    instance that was stopped so it cannot answer, then kills it; returns (status line, body)."""
    import json
    import signal
    import socket
    body = json.dumps(C.TINY_BODY).encode() + b" " * pad
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", c.front_http), timeout=20) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(head + body)
        status, _ = read_response(s)
        assert status.startswith(b"HTTP/1.1 200 "), status
        owner = holders(c, model)
        assert len(owner) == 1, owner
        victim = c.instances[owner[0] - 1]
        try:
            victim.proc.send_signal(signal.SIGSTOP)  # takes the request, never answers
            s.sendall(head)
            time.sleep(0.1)
            s.sendall(body)
            time.sleep(0.3)
            victim.kill9()  # its sockets are reset with the request unread
            status, answer = read_response(s)
            if status.startswith(b"HTTP/1.1 200 "):
                assert any(model in i.resident() for i in c.instances if i is not victim)
            return status, answer
        finally:
            restart(c, victim)


def test_inflight_request_of_killed_instance_is_retried(cl):
    """A request already sent to an instance that dies before answering is answered by another
    one: HAProxy repeats it (retry-on empty-response) only if it held the whole request when it
    first sent it, which `option http-buffer-request` makes sure of. Here the client sends the
    head and the body in two segments (as urllib3 does with TCP_NODELAY), the instance is
    stopped so it cannot answer, then killed: without the option HAProxy forwards the head at
    once, gives up the retry and closes the client's keep-alive connection without an answer."""
    status, answer = inflight_retry(cl, "k_probe")
    assert status.startswith(b"HTTP/1.1 200 "), status or "closed without an answer"
    assert b'"outputs"' in answer, answer[:200]


def test_inflight_large_request_retried_with_retry_body_kb(tmp_path):
    """A body larger than HAProxy's default 16 KiB buffer cannot be held whole, so it is not
    repeated when its instance dies; `cluster-config --retry-body-kb` makes the buffers large
    enough. A 300 KB request: with --retry-body-kb 512 another instance answers it."""
    c = C.Cluster(tmp_path / "big", ["big_probe"], n=2, config_args=["--retry-body-kb", "512"]).start()
    try:
        assert "tune.bufsize 557056" in (tmp_path / "big" / "haproxy.cfg").read_text()
        status, answer = inflight_retry(c, "big_probe", pad=300_000)
        assert status.startswith(b"HTTP/1.1 200 "), status or "closed without an answer"
        assert b'"outputs"' in answer, answer[:200]
    finally:
        c.stop()


def test_inflight_grpc_call_of_killed_instance_is_retried(cl, tmp_path):
    """The same over gRPC: a unary call in flight on a stopped, then killed instance succeeds
    (answered by another instance); a ModelStreamInfer stream is not held back by the
    wait-for-body rule (a response comes back before the client sends its next request)."""
    import queue
    import signal
    import threading
    pb2, pb2_grpc = C.grpc_stubs(tmp_path / "stubs")
    md = [("mts-model", "k_grpc")]
    with grpc.insecure_channel(cl.grpc_target) as ch:
        stub = pb2_grpc.GRPCInferenceServiceStub(ch)
        stub.ModelInfer(C.tiny_grpc_request(pb2, "k_grpc"), metadata=md, timeout=30)
        owner = holders(cl, "k_grpc")
        assert len(owner) == 1, owner
        victim = cl.instances[owner[0] - 1]
        try:
            victim.proc.send_signal(signal.SIGSTOP)
            fut = stub.ModelInfer.future(C.tiny_grpc_request(pb2, "k_grpc"), metadata=md, timeout=30)
            time.sleep(0.4)
            victim.kill9()
            r = fut.result()
            assert list(r.outputs[0].shape) == [1, 16]
        finally:
            restart(cl, victim)

        reqs = queue.Queue()
        reqs.put(C.tiny_grpc_request(pb2, "k_grpc"))
        got = []

        def read():
            for resp in stub.ModelStreamInfer(iter(reqs.get, None), metadata=md, timeout=30):
                got.append(resp)

        t = threading.Thread(target=read)
        t.start()
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
        first_back = len(got)
        reqs.put(C.tiny_grpc_request(pb2, "k_grpc"))
        reqs.put(None)
        t.join(30)
    assert first_back == 1, "the stream's first response did not come back before its second request"
    assert len(got) == 2 and all(not g.error_message for g in got), got


def test_failover_kill9_and_restart(cl):
    victim = cl.instances[0]
    before = victim.resident() & set(NAMES)
    killed = {}

    def during(elapsed):
        if elapsed >= 1.5 and not killed:
            victim.kill9()
            killed["t"] = time.monotonic()

    st = C.drive(cl.url, NAMES, seconds=6, threads=8, seed=2, during=during)
    print(f"\nfailover: {st['ok']} requests in {st['seconds']:.1f} s, kill -9 at 1.5 s: {st['failed']} failed "
          f"({st['closed']} closed without an answer); no client retries")
    assert killed
    assert st["failed"] == 0, st["errors"]
    assert cl.server_states("mts_http")[0] == "DOWN" and cl.server_states("mts_grpc")[0] == "DOWN"
    survivors = cl.residency(alive={2, 3})
    asked = {m for m in before if st["per_model"].get(m, 0) >= 5}
    moved = {m for m in asked if m in survivors}
    print(f"the victim held {len(before)} models; {len(asked)} of them got >= 5 requests after the kill, "
          f"{len(moved)} of those are now resident on the survivors")
    assert asked and len(moved) >= len(asked) // 2, (sorted(asked), sorted(moved))

    # restarted on the same ports: back in service once two health checks pass
    victim.start()
    t0 = time.monotonic()
    cl.wait_servers(["UP", "UP", "UP"])
    print(f"restarted instance back in HAProxy after {time.monotonic() - t0:.1f} s")
    st = C.drive(cl.url, NAMES, n_requests=600, threads=8, seed=3)
    assert st["failed"] == 0, st["errors"]
    back = victim.resident() & set(NAMES)
    print(f"after the restart: {st['ok']} requests, the restarted instance loaded {victim.loads()} models "
          f"and holds {len(back)}")
    assert victim.loads() >= 5 and len(back) >= 5


def test_failover_kill9_grpc(cl, tmp_path):
    """kill -9 of another instance under gRPC load (HTTP/2 both sides, mts-model metadata)."""
    pb2, pb2_grpc = C.grpc_stubs(tmp_path / "stubs")
    victim = cl.instances[1]
    killed = {}

    def during(elapsed):
        if elapsed >= 1.5 and not killed:
            victim.kill9()
            killed["t"] = True

    st = C.drive_grpc(cl.grpc_target, NAMES, pb2, pb2_grpc, seconds=4, threads=8, seed=4, during=during)
    print(f"\ngRPC failover: {st['ok']} calls, kill -9 at 1.5 s: {st['failed']} failed "
          f"({st['unavailable']} UNAVAILABLE); no client retries")
    assert killed and st["ok"] > 100
    assert st["failed"] == 0, st["errors"]
    assert cl.server_states("mts_grpc")[1] == "DOWN"


@pytest.mark.parametrize("args,words", [
    ([], "--instances is required"),
    (["--instances", ""], "item 1 is empty"),
    (["--instances", "a:1:2,"], "item 2 is empty"),
    (["--instances", "a:1"], "want HOST:HTTP_PORT:GRPC_PORT"),
    (["--instances", "a:0:2"], "want HOST:HTTP_PORT:GRPC_PORT"),
    (["--instances", "a:1:123456"], "want HOST:HTTP_PORT:GRPC_PORT"),
    (["--instances", "a:8000:8000"], "the HTTP and gRPC ports are the same"),
    (["--instances", "a;b:1:2"], "bad character at 2"),
    (["--instances", "[::1:1:2"], "'[' without ']'"),
    (["--instances", "[::g]:1:2"], "is not an IPv6 address"),
    (["--instances", "a:1:2,a:2:3"], "items 1 and 2 share a port"),
    (["--instances", "h" * 300 + ":1:2"], "1..253 characters"),
    (["--instances", "a:1:2", "--balance-factor", "100"], "0 (off) or a percentage 101..1000"),
    (["--instances", "a:1:2", "--balance-factor", "12x"], "an integer 0..1000"),
    (["--instances", "a:1:2", "--front-http"], "option --front-http needs a value"),
    (["--instances", "a:1:2", "--front-http", "8080", "--front-grpc", "8080"], "must differ"),
    (["--instances", "a:1:2", "--bind", "a b"], "--bind wants an address"),
    (["--instances", "a:1:2", "--nope"], "unknown option '--nope'"),
    (["--instances", "a:1:2", "--retry-body-kb", "0"], "an integer 1..262144"),
])
def test_cluster_config_rejects_bad_input(args, words):
    out = subprocess.run([str(C.MTSERVE), "cluster-config", *args], capture_output=True, text=True, timeout=10)
    assert out.returncode == 2 and words in out.stderr, (out.returncode, out.stderr)
    assert out.stdout == ""


def test_cluster_config_names_and_ipv6_pass_haproxy_check(tmp_path):
    """DNS names get a resolvers section (a name that does not resolve yet leaves its server
    down instead of stopping HAProxy); [IPv6] addresses pass through."""
    out = subprocess.run([str(C.MTSERVE), "cluster-config", "--instances",
                          "mtserve-0.mtserve.ml.svc.cluster.local:8000:50051,[::1]:8001:50052,10.1.2.3:8000:50051",
                          "--stats-port", "8404", "--server-timeout=60"], capture_output=True, text=True, check=True)
    assert "resolvers dns" in out.stdout and "server mts2 [::1]:8001 id 2 check" in out.stdout
    assert "timeout server 60s" in out.stdout
    cfg = tmp_path / "h.cfg"
    cfg.write_text(out.stdout)
    chk = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout + chk.stderr
