"""Bearer-token authentication (--auth-token-file / server.auth_token_file) on both front ends,
against a real server: health stays open; inference, metadata, statistics and metrics need a token
with the infer scope; repository load/unload needs admin; a missing or unknown token is 401 /
UNAUTHENTICATED (with WWW-Authenticate over HTTP), a token without the scope 403 /
PERMISSION_DENIED. Also: token files that are wrong stop the server with a message naming the
line and never the token, and listening beyond loopback without tokens logs a warning."""
import json
import re
import subprocess

import grpc
import numpy as np
import pytest
import requests

from conftest import TINY, _server_command, tiny_request

INFER_TOK = "infer-token-0123456789abcdef"
ADMIN_TOK = "admin-token-fedcba9876543210"
HTTP_RE = re.compile(r"serving \d+ models? on (http://[0-9.]+:\d+)")


@pytest.fixture
def authed(start_server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# tokens for the test\n{INFER_TOK} infer\n\n{ADMIN_TOK}   admin\n")
    s = start_server(server={"auth_token_file": str(tokens)})
    s.http = HTTP_RE.search(s.stdout_path.read_text()).group(1)
    return s


def bearer(tok):
    return {"Authorization": f"Bearer {tok}"}


def test_http_scopes(authed):
    u = authed.http
    x = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    assert requests.get(u + "/v2/health/live", timeout=10).status_code == 200
    assert requests.get(u + "/v2/health/ready", timeout=10).status_code == 200
    r = requests.post(u + "/v2/models/tiny/infer", json=x, timeout=10)
    assert r.status_code == 401 and "Bearer" in r.headers.get("WWW-Authenticate", "")
    assert "authentication required" in r.json()["error"]
    r = requests.post(u + "/v2/models/tiny/infer", json=x, headers=bearer("wrong-token-0123456789"), timeout=10)
    assert r.status_code == 401 and r.json()["error"] == "unknown token"
    assert "wrong-token" not in r.text  # tokens are never echoed
    r = requests.post(u + "/v2/models/tiny/infer", json=x, headers={"Authorization": "Basic abc"}, timeout=10)
    assert r.status_code == 401
    for tok in (INFER_TOK, ADMIN_TOK):
        r = requests.post(u + "/v2/models/tiny/infer", json=x, headers=bearer(tok), timeout=10)
        assert r.status_code == 200, r.text
    for path in ("/metrics", "/v2/models/tiny", "/v2/models/stats"):
        assert requests.get(u + path, timeout=10).status_code == 401, path
        assert requests.get(u + path, headers=bearer(INFER_TOK), timeout=10).status_code == 200, path
    r = requests.post(u + "/v2/repository/models/tiny/unload", headers=bearer(INFER_TOK), timeout=10)
    assert r.status_code == 403 and "admin" in r.json()["error"]
    r = requests.post(u + "/v2/repository/models/tiny/unload", headers=bearer(ADMIN_TOK), timeout=10)
    assert r.status_code == 200, r.text
    r = requests.post(u + "/v2/repository/models/tiny/load", headers=bearer(ADMIN_TOK), timeout=30)
    assert r.status_code == 200, r.text
    # an unknown route is still 404 for anyone (routing comes before the token check)
    assert requests.get(u + "/nope", timeout=10).status_code == 404


def test_grpc_scopes(authed, pb):
    ks = pb.ks_grpc.GRPCInferenceServiceStub(authed.channel)
    ls = pb.ls_grpc.InferenceServiceStub(authed.channel)
    health = pb.health_grpc.HealthStub(authed.channel)
    assert ks.ServerLive(pb.ks.ServerLiveRequest(), timeout=10).live
    assert health.Check(pb.health.HealthCheckRequest(), timeout=10).status == 1
    ls.Health(pb.ls.HealthRequest(), timeout=10)
    req = tiny_request(pb, np.ones((1, 16), np.float32))

    def code(fn, md=None):
        try:
            fn(metadata=md)
        except grpc.RpcError as e:
            return e.code(), e.details()
        return grpc.StatusCode.OK, ""

    c, d = code(lambda metadata: ks.ModelInfer(req, timeout=10, metadata=metadata))
    assert c == grpc.StatusCode.UNAUTHENTICATED and "authentication required" in d
    c, _ = code(lambda metadata: ks.ModelInfer(req, timeout=10, metadata=metadata),
                [("authorization", "Bearer nope-nope-nope-nope-nope")])
    assert c == grpc.StatusCode.UNAUTHENTICATED
    for tok in (INFER_TOK, ADMIN_TOK):
        c, d = code(lambda metadata: ks.ModelInfer(req, timeout=10, metadata=metadata),
                    [("authorization", f"Bearer {tok}")])
        assert c == grpc.StatusCode.OK, d
    unload = pb.ks.RepositoryModelUnloadRequest(model_name="tiny")
    c, d = code(lambda metadata: ks.RepositoryModelUnload(unload, timeout=10, metadata=metadata),
                [("authorization", f"Bearer {INFER_TOK}")])
    assert c == grpc.StatusCode.PERMISSION_DENIED and "admin" in d
    c, d = code(lambda metadata: ls.UnloadModel(pb.ls.UnloadModelRequest(model_id="tiny"), timeout=10,
                                                metadata=metadata), [("authorization", f"Bearer {INFER_TOK}")])
    assert c == grpc.StatusCode.PERMISSION_DENIED
    c, d = code(lambda metadata: ks.RepositoryModelUnload(unload, timeout=10, metadata=metadata),
                [("authorization", f"Bearer {ADMIN_TOK}")])
    assert c == grpc.StatusCode.OK, d
    c, _ = code(lambda metadata: ls.ListModels(pb.ls.ListModelsRequest(), timeout=10, metadata=metadata))
    assert c == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("text,needle", [
    ("short infer\n", "line 1: a token must be 16-512 characters (this one has 5)"),
    ("# c\nlong-enough-token-000000\n", "line 2: a token needs its scopes"),
    ("long-enough-token-000000 infer,root\n", "line 1: scopes must be infer, admin"),
    ("# only a comment\n", "no tokens in it"),
])
def test_bad_token_files_stop_the_server(tmp_path, text, needle):
    f = tmp_path / "tokens"
    f.write_text(text)
    r = subprocess.run(_server_command() + ["--model-repository", str(tmp_path), "--http-port", "0", "--grpc-port", "0",
                                            "--auth-token-file", str(f)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert needle in r.stderr, r.stderr
    assert "long-enough-token" not in r.stderr  # the message names the line, not the token


def test_warning_beyond_loopback_without_tokens(start_server):
    s = start_server(server={"host": "0.0.0.0"})
    assert "listening beyond loopback without authentication" in s.log()


def test_cli_clients_send_the_token(authed):
    mtserve = _server_command()[0]
    env_ok = {"MTSERVE_TOKEN": INFER_TOK, "PATH": "/usr/bin:/bin"}
    for transport in (["--grpc", authed.addr], ["--url", authed.http]):
        r = subprocess.run([mtserve, "infer", "tiny", *transport], capture_output=True, text=True, timeout=60,
                           env=env_ok)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([mtserve, "infer", "tiny", *transport], capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin"})
        out = r.stderr + r.stdout
        assert r.returncode != 0 and ("UNAUTHENTICATED" in out or "401" in out), out
    r = subprocess.run([mtserve, "bench", "--url", authed.http, "--grpc", authed.addr, "--model", "tiny",
                        "--requests", "20", "--json", "--quiet"], capture_output=True, text=True, timeout=60,
                       env=env_ok)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["ok"] == 20 and s["server"]["available"], s
