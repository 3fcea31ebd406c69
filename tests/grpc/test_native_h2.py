"""The native gRPC transport at the HTTP/2 level, through a raw HTTP/2 client (python3-h2): a
unary inference message for a model whose queue is full is answered from its first bytes and the
client told to stop (RST_STREAM NO_ERROR) without the stream's window ever being opened, so the
rest of the message is never sent; the same message for a model with room gets its window opened
to the whole message; malformed gRPC framing, headers and HTTP/2 get a status (or GOAWAY) that says
what is wrong, and the server keeps serving; the gRPC core transport (MTS_GRPC_TRANSPORT=core)
still serves the same methods."""
import gzip
import os
import socket
import struct
import time

import grpc
import h2.config
import h2.connection
import h2.events
import numpy as np
import pytest

from conftest import tiny_request
from threadinfo import realtime_allowed, thread_policies
from test_grpc_api import full_seg_queue, ks

KS = "/inference.GRPCInferenceService/"
X = np.arange(32, dtype=np.float32).reshape(2, 16) / 32
WINDOW = 65535  # HTTP/2's default stream window, which the native transport keeps until it admits


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


class Raw:
    """One HTTP/2 connection to the gRPC port, driven by hand."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.events = []
        self.closed = False
        self.flush()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, until, timeout=15):
        deadline = time.monotonic() + timeout
        while not until() and not self.closed and time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                break
            if not data:
                self.closed = True
                break
            self.events += self.conn.receive_data(data)
            self.flush()
        return until()

    def start(self, path, extra=(), content_type="application/grpc"):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                     (":authority", "mtserve"), ("content-type", content_type), ("te", "trailers"),
                                     *extra])
        self.flush()
        return sid

    def send(self, sid, data, end=False):
        """Sends what the stream's window allows of data; returns how much that was."""
        n = min(len(data), self.conn.local_flow_control_window(sid))
        step = self.conn.max_outbound_frame_size
        for off in range(0, n, step):
            self.conn.send_data(sid, data[off:min(n, off + step)], end_stream=end and min(n, off + step) == len(data))
        if not n and end:
            self.conn.end_stream(sid)
        self.flush()
        return n

    def of(self, sid, kind):
        return [e for e in self.events if isinstance(e, kind) and getattr(e, "stream_id", None) == sid]

    def status(self, sid):
        """grpc-status and grpc-message of the stream, from its headers or trailers (None: not yet)."""
        for e in self.of(sid, h2.events.ResponseReceived) + self.of(sid, h2.events.TrailersReceived):
            h = dict(e.headers)
            if "grpc-status" in h:
                return int(h["grpc-status"]), h.get("grpc-message", ""), h
        return None

    def close(self):
        self.sock.close()


def big_infer_message(model, total):
    """The first bytes of a ModelInferRequest of `total` bytes naming `model`: field 1, then one
    raw_input_contents (field 7) holding the rest."""
    head = b"\x0a" + varint(len(model)) + model.encode()
    rest = total - len(head) - 1
    rest -= len(varint(rest))
    return head + b"\x3a" + varint(rest) + bytes(WINDOW)


def test_full_queue_refused_before_the_body(start_server, pb):
    srv, s, futures = full_seg_queue(start_server, pb)
    raw = Raw(srv.addr)
    total = 8 << 20
    body = struct.pack(">BI", 0, total) + big_infer_message("seg", total)
    sid = raw.start(KS + "ModelInfer")
    sent = raw.send(sid, body)
    assert sent <= WINDOW
    assert raw.pump(lambda: raw.of(sid, h2.events.StreamReset)), raw.events
    code, msg, _ = raw.status(sid)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and "queue is full" in msg, (code, msg)
    assert raw.of(sid, h2.events.StreamReset)[0].error_code == 0  # NO_ERROR: stop sending
    assert not raw.of(sid, h2.events.WindowUpdated), "the refused stream's window was opened"
    # the same message for a model with room: its window opens to the whole message
    sid = raw.start(KS + "ModelInfer")
    raw.send(sid, struct.pack(">BI", 0, total) + big_infer_message("tiny", total))
    assert raw.pump(lambda: raw.of(sid, h2.events.WindowUpdated)), raw.events
    grant = sum(e.delta for e in raw.of(sid, h2.events.WindowUpdated))
    assert WINDOW + grant >= total + 5, grant
    raw.conn.reset_stream(sid)
    raw.flush()
    raw.close()
    for f in futures:
        assert len(f.result().outputs) == 1
    assert s.ServerLive(pb.ks.ServerLiveRequest()).live


def test_bad_framing_and_headers(start_server, pb):
    srv = start_server(server={"max_message_size_mb": 1})
    raw = Raw(srv.addr)
    cases = []
    # message flags other than 0/1
    sid = raw.start(KS + "ServerLive")
    raw.send(sid, b"\x02\x00\x00\x00\x00", end=True)
    cases.append((sid, 13, "invalid gRPC message flags 0x02"))
    # compressed messages: not gzip data, an encoding the server does not know, no encoding named,
    # and more than the message limit once decompressed
    sid = raw.start(KS + "ServerLive", extra=[("grpc-encoding", "gzip")])
    raw.send(sid, b"\x01\x00\x00\x00\x02ab", end=True)
    cases.append((sid, 13, "cannot decompress the request message"))
    sid = raw.start(KS + "ServerLive", extra=[("grpc-encoding", "br")])
    raw.send(sid, b"\x01\x00\x00\x00\x02ab", end=True)
    cases.append((sid, 12, "grpc-encoding br is not supported"))
    sid = raw.start(KS + "ServerLive")
    raw.send(sid, b"\x01\x00\x00\x00\x02ab", end=True)
    cases.append((sid, 13, "a compressed message without grpc-encoding"))
    bomb = gzip.compress(bytes(3 << 20))
    sid = raw.start(KS + "ServerLive", extra=[("grpc-encoding", "gzip")])
    raw.send(sid, struct.pack(">BI", 1, len(bomb)) + bomb, end=True)
    cases.append((sid, 8, "larger than max (decompressed beyond 1048576 bytes)"))
    # a declared length over server.max_message_size_mb, refused before any of it is read
    sid = raw.start(KS + "ModelInfer")
    raw.send(sid, struct.pack(">BI", 0, 2 << 20) + b"\x0a\x04tiny")
    cases.append((sid, 8, "Received message larger than max (2097152 vs. 1048576)"))
    # the stream ends inside a message
    sid = raw.start(KS + "ServerLive")
    raw.send(sid, b"\x00\x00\x00\x00\x10abc", end=True)
    cases.append((sid, 13, "the request message was cut short"))
    # no message at all for a unary method
    sid = raw.start(KS + "ServerLive")
    raw.conn.end_stream(sid)
    raw.flush()
    cases.append((sid, 3, "the call carried no request message"))
    # an unknown method
    sid = raw.start("/no.Such/Method")
    raw.send(sid, b"\x00\x00\x00\x00\x00", end=True)
    cases.append((sid, 12, "method /no.Such/Method is not implemented by mtserve"))
    # not gRPC: the content type
    sid = raw.start(KS + "ServerLive", content_type="application/json")
    raw.send(sid, b"{}", end=True)
    cases.append((sid, 13, "content-type must be application/grpc"))
    # headers over 64 KiB
    sid = raw.start(KS + "ServerLive", extra=[(f"x-pad-{i}", "v" * 4000) for i in range(20)])
    raw.send(sid, b"\x00\x00\x00\x00\x00", end=True)
    cases.append((sid, 8, "request headers larger than 65536 bytes"))
    assert raw.pump(lambda: all(raw.status(sid) for sid, _, _ in cases)), raw.events
    for sid, code, words in cases:
        got, msg, headers = raw.status(sid)
        assert got == code and words in msg, (words, got, msg)
    ct = [e for e in raw.events if isinstance(e, h2.events.ResponseReceived) and e.stream_id == cases[9][0]]
    assert dict(ct[0].headers)[":status"] == "415"
    # a good call on the same connection still works
    sid = raw.start(KS + "ServerLive")
    raw.send(sid, b"\x00\x00\x00\x00\x00", end=True)
    assert raw.pump(lambda: raw.status(sid)), raw.events
    assert raw.status(sid)[0] == 0
    raw.close()
    # bytes that are no HTTP/2 at all: the connection is closed, the server serves the next one
    bad = socket.create_connection(tuple([srv.addr.rsplit(":", 1)[0], int(srv.addr.rsplit(":", 1)[1])]), timeout=10)
    bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\xff" * 100)
    got = b""
    while True:
        try:
            d = bad.recv(4096)
        except (socket.timeout, ConnectionResetError):
            break
        if not d:
            break
        got += d
    bad.close()
    s = ks(srv, pb)
    assert s.ServerLive(pb.ks.ServerLiveRequest()).live
    out = s.ModelInfer(tiny_request(pb, X))
    assert out.model_name == "tiny"


def test_deadline_answered_by_the_transport(start_server, pb):
    """A call whose message never completes is answered DEADLINE_EXCEEDED at its grpc-timeout."""
    srv = start_server()
    raw = Raw(srv.addr)
    sid = raw.start(KS + "ModelInfer", extra=[("grpc-timeout", "300m")])
    raw.send(sid, struct.pack(">BI", 0, 1000) + b"\x0a\x04tiny")
    t0 = time.monotonic()
    assert raw.pump(lambda: raw.status(sid), timeout=10), raw.events
    code, msg, _ = raw.status(sid)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], (code, msg)
    assert 0.2 < time.monotonic() - t0 < 5
    raw.close()


def test_core_transport_still_serves(start_server, pb, monkeypatch):
    monkeypatch.setenv("MTS_GRPC_TRANSPORT", "core")
    srv = start_server()
    assert "transport=core" in srv.log()
    s = ks(srv, pb)
    out = s.ModelInfer(tiny_request(pb, X))
    assert out.model_name == "tiny" and len(out.raw_output_contents) == 1
    stream = list(s.ModelStreamInfer(iter([tiny_request(pb, X) for _ in range(5)])))
    assert len(stream) == 5 and all(not r.error_message for r in stream)
    h = pb.health_grpc.HealthStub(srv.channel)
    assert h.Check(pb.health.HealthCheckRequest(service="")).status == 1


def test_native_is_the_default(start_server, pb, monkeypatch):
    monkeypatch.delenv("MTS_GRPC_TRANSPORT", raising=False)
    srv = start_server()
    assert "transport=native" in srv.log()
    monkeypatch.setenv("MTS_GRPC_TRANSPORT", "bogus")
    with pytest.raises(BaseException):
        start_server()


def test_stream_compressed_messages_in_order(start_server, pb):
    """ModelStreamInfer with gzip messages, sent faster than they are handled: every answer comes
    back in order (the stream's window is given back per message handled, as sent on the wire)."""
    srv = start_server()
    s = ks(srv, pb)
    xs = [np.full((8, 16), i % 5, np.float32) for i in range(200)]

    def gen():
        for i, x in enumerate(xs):
            yield tiny_request(pb, x, rid=str(i))

    got = list(s.ModelStreamInfer(gen(), timeout=120, compression=grpc.Compression.Gzip))
    assert [r.infer_response.id for r in got] == [str(i) for i in range(200)]
    assert all(not r.error_message for r in got)


def test_small_calls_turn_the_connection_thread_realtime(start_server, pb):
    """A connection's thread runs SCHED_RR 1 from its second small request message in a row (where
    the process may; otherwise one log line says why) and goes back to the normal policy when a large
    message (64 KiB or more) arrives; server.light_io_realtime: false never turns it."""
    allowed = realtime_allowed()
    srv = start_server()
    s = ks(srv, pb)
    s.ModelInfer(tiny_request(pb, X))
    assert thread_policies(srv.proc.pid, "mts-grpc-conn") == [os.SCHED_OTHER]  # one small message: not yet
    s.ModelInfer(tiny_request(pb, X))
    if allowed:
        assert thread_policies(srv.proc.pid, "mts-grpc-conn") == [os.SCHED_RR]
        assert "event=realtime_threads" in srv.log()  # once per process: the HTTP light threads' first
    else:
        assert thread_policies(srv.proc.pid, "mts-grpc-conn") == [os.SCHED_OTHER]
        assert "event=realtime_unavailable" in srv.log()
    big = np.zeros((1100, 16), np.float32)  # 70 KB of tensor: a large message (refused: max_batch 8)
    with pytest.raises(grpc.RpcError):
        s.ModelInfer(tiny_request(pb, big))
    assert thread_policies(srv.proc.pid, "mts-grpc-conn") == [os.SCHED_OTHER]
    s.ModelInfer(tiny_request(pb, X))
    s.ModelInfer(tiny_request(pb, X))
    assert thread_policies(srv.proc.pid, "mts-grpc-conn") == [os.SCHED_RR if allowed else os.SCHED_OTHER]

    off = start_server(server={"light_io_realtime": "false"})
    so = ks(off, pb)
    for _ in range(4):
        so.ModelInfer(tiny_request(pb, X))
    assert thread_policies(off.proc.pid, "mts-grpc-conn") == [os.SCHED_OTHER]
    assert "event=realtime" not in off.log()
