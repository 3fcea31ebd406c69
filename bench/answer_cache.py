#!/usr/bin/python3
"""A server that answers from a cache: the floor under a light tenant's latency (bench-isolation).

`answer_cache.py http|grpc UPSTREAM` listens on a free local port, prints it ("port N") and then
answers KServe v2 requests over HTTP/1.1 (keep-alive, Content-Length bodies) or gRPC (unary
methods) the way UPSTREAM (host:port of a running mtserve) answered the first request of the same
method and path: that first one is forwarded and its answer kept, every later one is answered
from the cache without looking at the request. It runs no model and does nothing but read
requests and write answers, so a client's latency against it, beside the same heavy load on the
same cores, is what the kernel's delivery of the bytes and the OS's wake-ups of the client and of
one server process cost: the part of the light tenant's latency that no server can remove.

The HTTP side is one thread on epoll (selectors); the gRPC side is Python's gRPC server, which
runs on gRPC core like mtserve's gRPC front end, with a thread pool for the handlers.
"""
import http.client
import selectors
import socket
import sys
import threading
from concurrent import futures


def http_main(upstream):
    host, port = upstream.rsplit(":", 1)
    cache = {}
    sel = selectors.DefaultSelector()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(1024)
    ls.setblocking(False)
    sel.register(ls, selectors.EVENT_READ, None)
    print(f"port {ls.getsockname()[1]}", flush=True)

    def answer(method, path, headers, body):
        key = (method, path)
        if key not in cache:  # the first of its kind: ask the real server once
            c = http.client.HTTPConnection(host, int(port), timeout=60)
            c.request(method, path, body=body, headers={k: v for k, v in headers.items()
                                                        if k.lower() not in ("connection", "host")})
            r = c.getresponse()
            data = r.read()
            head = [f"HTTP/1.1 {r.status} {r.reason}"]
            head += [f"{k}: {v}" for k, v in r.getheaders()
                     if k.lower() not in ("connection", "content-length", "transfer-encoding", "keep-alive")]
            head.append(f"Content-Length: {len(data)}")
            cache[key] = ("\r\n".join(head) + "\r\n\r\n").encode() + data
            c.close()
        return cache[key]

    while True:
        for k, _ in sel.select():
            if k.data is None:
                try:
                    conn, _ = ls.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sel.register(conn, selectors.EVENT_READ, bytearray())
                continue
            conn, buf = k.fileobj, k.data
            try:
                chunk = conn.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if not chunk:
                sel.unregister(conn)
                conn.close()
                continue
            buf += chunk
            while True:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
                headers = {a.strip(): b.strip() for a, b in headers.items()}
                n = int(next((v for a, v in headers.items() if a.lower() == "content-length"), "0"))
                if len(buf) < end + 4 + n:
                    break
                body = bytes(buf[end + 4:end + 4 + n])
                del buf[:end + 4 + n]
                out = answer(method, path, headers, body)
                conn.setblocking(True)
                conn.sendall(out)
                conn.setblocking(False)


def grpc_main(upstream):
    import grpc
    channel = grpc.insecure_channel(upstream)
    cache, lock = {}, threading.Lock()

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            method = details.method

            def unary(req, ctx):
                with lock:
                    if method not in cache:  # the first of its kind: ask the real server once
                        cache[method] = channel.unary_unary(method)(req, timeout=60)
                    return cache[method]
            return grpc.unary_unary_rpc_method_handler(unary)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((Handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"port {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("http", "grpc"):
        sys.exit("usage: answer_cache.py http|grpc UPSTREAM_HOST:PORT")
    (http_main if sys.argv[1] == "http" else grpc_main)(sys.argv[2])
