"""gRPC and HTTP over TLS (server.tls_cert_path / tls_key_path, and tls_client_ca_path for
mutual TLS): certificates are made here with the openssl command line; a grpcio client and a
`requests` HTTPS client with the CA as their root talk to the server (large bodies both ways,
keep-alive, pipelined requests), plaintext clients and (for mutual TLS) clients without a
certificate are refused, and bad certificate files stop the start with a message naming the file.
"""
import re
import socket
import ssl
import subprocess

import grpc
import pytest

from conftest import GRPC_RE, TINY, tiny_request  # noqa: F401

import numpy as np


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path):
    d = tmp_path / "pki"
    d.mkdir()
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=mtserve test CA", cwd=d)
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={'localhost' if name == 'server' else 'client'}", cwd=d)
        (d / f"{name}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d


def call(ch, pb):
    stub = pb.ks_grpc.GRPCInferenceServiceStub(ch)
    x = np.ones((1, 16), np.float32)
    return stub.ModelInfer(tiny_request(pb, x), timeout=10)


def test_tls_and_mutual_tls(start_server, pb, pki):
    ca = (pki / "ca.pem").read_bytes()
    srv = start_server(server={"tls_cert_path": str(pki / "server.pem"), "tls_key_path": str(pki / "server.key")})
    assert "tls=on" in srv.log()
    opts = [("grpc.ssl_target_name_override", "localhost")]
    with grpc.secure_channel(srv.addr, grpc.ssl_channel_credentials(root_certificates=ca), options=opts) as ch:
        assert call(ch, pb).outputs[0].shape == [1, 16]
    with grpc.insecure_channel(srv.addr) as ch:  # plaintext against a TLS port
        with pytest.raises(grpc.RpcError) as e:
            call(ch, pb)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE

    m = start_server(server={"tls_cert_path": str(pki / "server.pem"), "tls_key_path": str(pki / "server.key"),
                             "tls_client_ca_path": str(pki / "ca.pem")})
    with grpc.secure_channel(m.addr, grpc.ssl_channel_credentials(root_certificates=ca), options=opts) as ch:
        with pytest.raises(grpc.RpcError) as e:  # no client certificate
            call(ch, pb)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=(pki / "client.key").read_bytes(),
                                         certificate_chain=(pki / "client.pem").read_bytes())
    with grpc.secure_channel(m.addr, creds, options=opts) as ch:
        assert call(ch, pb).outputs[0].shape == [1, 16]


def test_bad_tls_files_stop_the_start(tmp_path, pki):
    from conftest import _server_command
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    for cert, key, want in ((tmp_path / "missing.pem", pki / "server.key", "missing.pem: cannot read it"),
                            (tmp_path / "junk.pem", pki / "server.key", "junk.pem: cannot read it"),
                            (pki / "server.pem", None, "tls_cert_path and server.tls_key_path go together")):
        cfg = tmp_path / "c.yaml"
        lines = ["server:", f"  tls_cert_path: {cert}"] + ([f"  tls_key_path: {key}"] if key else [])
        cfg.write_text("\n".join(lines) + "\nmodels:\n  tiny:\n    model_path: %s\n" % TINY)
        r = subprocess.run(_server_command() + ["--config", str(cfg), "--http-port", "0", "--grpc-port", "0"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and want in r.stderr, r.stderr


HTTPS_RE = re.compile(r"serving \d+ models? on https://([0-9.]+):(\d+)")


def https_base(srv):
    m = HTTPS_RE.search(srv.stdout_path.read_text())
    assert m, srv.stdout_path.read_text()
    return f"https://localhost:{m.group(2)}", int(m.group(2))


def test_https_and_mutual_tls(start_server, pki):
    import requests
    srv = start_server({"tiny": {"model_path": str(TINY), "max_batch": 4096}},  # 4096-row requests
                       server={"tls_cert_path": str(pki / "server.pem"), "tls_key_path": str(pki / "server.key")})
    base, port = https_base(srv)
    ca = str(pki / "ca.pem")
    with requests.Session() as sess:  # keep-alive: several requests on one TLS connection
        assert sess.get(base + "/v2/health/ready", verify=ca, timeout=10).status_code == 200
        x = np.random.default_rng(0).standard_normal((4096, 16)).astype(np.float32)  # 256 KiB each way
        body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        for _ in range(3):
            r = sess.post(base + "/v2/models/tiny/infer", json=body, verify=ca, timeout=60)
            assert r.status_code == 200, r.text
            y = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(4096, 16)
            from conftest import tiny_reference
            assert np.allclose(y, tiny_reference(x), rtol=1e-4, atol=1e-5)
        # small requests and answers: the TLS connection moves to the light I/O thread (its
        # session with it) and stays, and back to the listening one for a large one
        for rows in (1, 2, 4096, 3):
            x = np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)
            body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
            r = sess.post(base + "/v2/models/tiny/infer", json=body, verify=ca, timeout=60)
            assert r.status_code == 200, r.text
            y = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(rows, 16)
            assert np.allclose(y, tiny_reference(x), rtol=1e-4, atol=1e-5)
    # pipelined: 50 requests in one TLS write, 50 answers
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
            got = b""
            while got.count(b"HTTP/1.1 200") < 50:
                chunk = tls.recv(65536)
                assert chunk, got[-200:]
                got += chunk
    # plaintext HTTP against the TLS port: no answer in clear
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = raw.recv(4096)
        except (ConnectionResetError, socket.timeout):
            data = b""
        assert b"HTTP/1.1 200" not in data
    assert srv.proc.poll() is None  # the server keeps serving

    m = start_server(server={"tls_cert_path": str(pki / "server.pem"), "tls_key_path": str(pki / "server.key"),
                             "tls_client_ca_path": str(pki / "ca.pem")})
    base, _ = https_base(m)
    with pytest.raises(requests.exceptions.RequestException):  # no client certificate
        requests.get(base + "/v2/health/live", verify=ca, timeout=10)
    r = requests.get(base + "/v2/health/live", verify=ca, timeout=10,
                     cert=(str(pki / "client.pem"), str(pki / "client.key")))
    assert r.status_code == 200
