"""`mtserve infer` and `mtserve models` against a running server over both front ends. Skipped
until src/cli/main.c dispatches `infer` and `models` to cli_client.c."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import BUILD, LIPSYNC, TINY

MTSERVE = Path(os.environ.get("MTSERVE", BUILD / "mtserve"))


def cli(*args):
    return subprocess.run([str(MTSERVE), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def targets(start_server):
    if not MTSERVE.exists() or cli("infer", "--help").returncode != 0:
        pytest.skip("mtserve has no `infer` command yet (main.c dispatch)")
    srv = start_server({"tiny": {"model_path": str(TINY)}, "lip": {"model_path": str(LIPSYNC)}})
    http = re.search(r"(http://[0-9.]+:\d+)", srv.stdout_path.read_text()).group(1)
    return [["--grpc", srv.addr], ["--url", http]]


def test_cli_infer_and_models(targets, tmp_path):
    for t in targets:
        r = cli("infer", "tiny", "--batch", "3", *t)
        assert r.returncode == 0, r.stderr
        assert re.search(r"y\s+FP32\s+\[3,16\]", r.stdout), r.stdout
        r = cli("infer", "nope", *t)
        assert r.returncode != 0 and "unknown model 'nope'" in r.stderr
        r = cli("models", "load", "lip", "--force", *t)
        assert r.returncode == 0 and "lip" in r.stdout, r.stderr
        r = cli("models", "list", *t)
        assert r.returncode == 0 and re.search(r"lip\s+READY", r.stdout), r.stdout
        r = cli("models", "unload", "lip", *t)
        assert r.returncode == 0, r.stderr
        r = cli("models", "stats", *t)
        assert r.returncode == 0 and re.search(r"lip\s+UNLOADED", r.stdout) and "server:" in r.stdout, r.stdout
        r = cli("models", "load", "nope", *t)
        assert r.returncode != 0 and "nope" in r.stderr
    r = cli("infer", "tiny", "--url", targets[1][1], "--save", str(tmp_path))
    assert r.returncode == 0 and (tmp_path / "y.npy").exists(), r.stderr
    r = cli("infer", "tiny", "--grpc", targets[0][1], "--input", f"x={tmp_path / 'y.npy'}")
    assert r.returncode == 0 and re.search(r"\[1,16\]", r.stdout), r.stderr + r.stdout
