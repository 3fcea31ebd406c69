"""The live dashboard (GET /dashboard, GET /api/v1/dashboard/state; docs/server.md, "Dashboard")
in a real browser: Debian's headless Chromium driven through the DevTools protocol
(python3-websocket). A server with a plain model and a lip-sync model (synthetic avatar assets)
is started, the page is opened, and the test asserts that it logs no console error and throws
no exception, lists every model with its state, device and precision, and that its numbers
(answered and failed requests, rates, latency, batch sizes, cache hit rate, the lip-sync
capacity estimate, recent events) change once traffic is sent. A second test runs the page
against a server with bearer tokens: the state endpoint needs the infer scope, the page takes
the token from ?token= once, drops it from the address bar and sends it on every poll.

A screenshot of the first test's page is written to the test's folder, and to the file named by
$MTS_DASHBOARD_SCREENSHOT when set (docs/dashboard.png is made that way). Chromium and
python3-websocket are installed by scripts/install-deps.sh; when either is missing the tests
fail with a message saying so (they never skip).
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import MODELS, ROOT, TINY, json_input

LIPSYNC = MODELS / "lipsync_unet_w4.onnx"  # visual[N,6,320,320], audio[N,32,16,16] -> output[N,3,320,320]
sys.path.insert(0, str(ROOT / "models" / "gen"))
import avatar  # noqa: E402

try:
    import websocket  # Debian python3-websocket (websocket-client)
except ImportError:  # reported by the fixture as a failure, never a skip
    websocket = None

TOKEN = "dash-test-token-0123456789"


class Browser:
    """One headless Chromium with a page target, spoken to over the DevTools protocol."""

    def __init__(self, workdir):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if not exe:
            pytest.fail("chromium is not installed: run scripts/install-deps.sh (Debian package chromium)")
        if websocket is None:
            pytest.fail("python3-websocket is not installed: run scripts/install-deps.sh")
        self.profile = Path(workdir) / "chromium-profile"
        self.profile.mkdir(parents=True, exist_ok=True)
        self.log = open(Path(workdir) / "chromium.log", "wb")
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--user-data-dir={self.profile}", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--disable-sync",
             "--disable-component-update", "--disable-features=Translate,MediaRouter", "--window-size=1400,1000",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=self.log, stdin=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        port = None
        while time.monotonic() < deadline:
            if port_file.exists():
                lines = port_file.read_text().split()
                if lines and lines[0].isdigit():
                    port = int(lines[0])
                    break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if port is None:
            self.close()
            pytest.fail("chromium did not open its DevTools port; its log:\n" +
                        (Path(workdir) / "chromium.log").read_text(errors="replace")[-3000:])
        pages = []
        while time.monotonic() < deadline and not pages:
            pages = [t for t in requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
                     if t.get("type") == "page"]
            if not pages:
                time.sleep(0.05)
        assert pages, "chromium has no page target"
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events = []
        for m in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(m)

    def call(self, method, **params):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def navigate(self, url):
        n0 = len(self.events)
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(e["method"] == "Page.loadEventFired" for e in self.events[n0:]):
                return
            self.eval("1")  # pumps events
            time.sleep(0.05)
        raise AssertionError(f"{url} did not finish loading")

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, what, timeout=20):
        deadline = time.monotonic() + timeout
        v = None
        while time.monotonic() < deadline:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what} ({expr} -> {v!r}); console: {self.problems()}")

    def problems(self):
        """Console errors, uncaught exceptions and error log entries seen so far."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.%s: %s" % (p["type"], " ".join(str(a.get("value", a.get("description")))
                                                                   for a in p.get("args", []))))
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: %s %s" % (p["entry"].get("text"), p["entry"].get("url", "")))
        return out

    def screenshot(self, path):
        h = int(self.eval("Math.ceil(document.documentElement.scrollHeight)"))
        self.call("Emulation.setDeviceMetricsOverride", width=1400, height=max(600, min(h, 4000)),
                  deviceScaleFactor=1, mobile=False)
        time.sleep(0.2)
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        Path(path).write_bytes(data)
        return data

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path)
    yield b
    b.close()


# ---- helpers ----

def cell(b, model, field):
    return b.eval(f"(document.querySelector('#models tr[data-model=\"{model}\"] [data-field=\"{field}\"]') || {{}})"
                  ".textContent || null")


def tiny_body(rows=1, cols=16):
    return {"inputs": [json_input("x", np.ones((rows, cols), np.float32))]}


def lip_body(n, seed=0):
    rng = np.random.default_rng(seed)
    vis = rng.random((n, 6, 320, 320), np.float32)
    aud = rng.standard_normal((n, 32, 16, 16)).astype(np.float32)
    return vis.tobytes() + aud.tobytes()


def test_dashboard_shows_models_and_live_numbers(start_server, browser, tmp_path):
    assets = tmp_path / "avatar"
    avatar.make_assets(str(assets), frames=8, width=256, height=192, crop=96, level=1)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not an ONNX model")
    srv = start_server(models={
        "tiny": (TINY, {"max_batch": 8}),
        "broken": broken,
        "lip": (LIPSYNC, {"max_batch": 2, "background_dir": str(assets / "frames"),
                          "crop_rects_path": str(assets / "crop_rects.json"), "num_frames": 8,
                          "background_cache_frames": 4}),
    })
    # the page itself is open and holds no data; the state is JSON
    page = srv.get("/dashboard")
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert "<script>" in page.text and "src=" not in page.text.replace('href="data:,"', "")
    st = srv.get("/api/v1/dashboard/state").json()
    by_name = {m["name"]: m for m in st["models"]}
    assert sorted(by_name) == ["broken", "lip", "tiny"]
    assert by_name["tiny"]["lipsync"] is None and by_name["lip"]["lipsync"] is not None

    browser.navigate(srv.url + "/dashboard")
    browser.wait("window.mtsDashboard && window.mtsDashboard.polls >= 1", "the first poll")
    for m in ("tiny", "lip", "broken"):
        assert cell(browser, m, "state") == "UNLOADED", cell(browser, m, "state")
        assert cell(browser, m, "precision") == "fp32"
    assert browser.eval("document.querySelectorAll('#devices tbody tr[data-device]').length") == 1
    assert cell(browser, "tiny", "success") == "0"

    # traffic: tiny (batched and single), one bad request, and lip-sync composites
    for _ in range(12):
        r = srv.infer("tiny", tiny_body())
        assert r.status_code == 200, r.text
    r = srv.infer("tiny", tiny_body(rows=3))
    assert r.status_code == 200, r.text
    bad = srv.infer("tiny", tiny_body(cols=15))
    assert bad.status_code == 400
    assert srv.infer("broken", tiny_body()).status_code == 503  # its load fails
    for k in range(2):
        r = requests.post(f"{srv.url}/api/v1/lipsync/lip/composite?start_frame_idx={k * 2}&batch_size=2",
                          data=lip_body(2, seed=k), timeout=120)
        assert r.status_code == 200, r.text[:300]

    browser.wait(f"""(() => {{
        const q = (m, f) => (document.querySelector(`#models tr[data-model="${{m}}"] [data-field="${{f}}"]`) || {{}}).textContent;
        return q('tiny', 'success') === '13' && q('tiny', 'failed') === '1' && q('tiny', 'state') === 'READY'
            && q('lip', 'state') === 'READY' && q('lip', 'success') === '2';
    }})()""", "the page to show the traffic")
    assert cell(browser, "tiny", "device") == "cpu:0"
    assert float(cell(browser, "tiny", "rps")) > 0
    assert float(cell(browser, "tiny", "eps")) > 0
    assert float(cell(browser, "tiny", "p50")) > 0 and float(cell(browser, "tiny", "p99")) >= float(cell(browser, "tiny", "p50"))
    assert cell(browser, "tiny", "memory") not in ("0 B", "–")
    # the batch-size histogram has bars; the sparkline has a line
    assert browser.eval("document.querySelectorAll('#models tr[data-model=\"tiny\"] rect.hist-bar[height]:not([height=\"0.0\"])').length") >= 1
    assert browser.eval("!!document.querySelector('#models tr[data-model=\"tiny\"] polyline.spark-req')")
    # lip-sync: cache hit rate, frames/s and the user estimate, with the formula on the page
    lip = "#lipsync tr[data-model=\"lip\"]"
    assert browser.eval(f"!!document.querySelector('{lip}')")
    hit = browser.eval(f"document.querySelector('{lip} [data-field=\"hit_rate\"]').textContent")
    assert hit.endswith("%"), hit
    fps = float(browser.eval(f"document.querySelector('{lip} [data-field=\"fps\"]').textContent"))
    users = float(browser.eval(f"document.querySelector('{lip} [data-field=\"users\"]').textContent"))
    assert fps > 0 and abs(users - fps * 15 / 4 / 25) <= 0.051 + fps * 0.01, (fps, users)
    assert "15/4" in browser.eval("document.querySelector('.formula').textContent")
    state = browser.eval("window.mtsDashboard.state")
    lm = [m for m in state["models"] if m["name"] == "lip"][0]
    assert lm["bgcache"]["requests"] >= 4 and lm["lipsync"]["users"] > 0
    # recent events: both loads, newest first
    ev = browser.eval("Array.from(document.querySelectorAll('#events tbody tr[data-seq]'))"
                      ".map(r => Array.from(r.cells).map(c => c.textContent))")  # time, kind, model, device, details
    kinds = [(e[1], e[2]) for e in ev]
    assert kinds.count(("loaded", "tiny")) == 1 and kinds.count(("loaded", "lip")) == 1, ev
    failed = [e for e in ev if e[1] == "load_failed"]
    assert len(failed) == 1 and failed[0][2] == "broken" and "model.onnx" in failed[0][4], ev
    assert cell(browser, "broken", "state") == "FAILED"
    assert float(cell(browser, "broken", "eps")) > 0
    assert "model.onnx" in browser.eval("document.querySelector('#models tr[data-model=\"broken\"]').textContent")

    # an unload shows up as an event and a state change
    assert srv.post("/v2/repository/models/tiny/unload").status_code == 200
    browser.wait("""Array.from(document.querySelectorAll('#events tbody tr[data-seq]'))
                    .some(r => r.textContent.includes('unloaded') && r.textContent.includes('tiny'))""",
                 "the unload event")
    browser.wait("""(document.querySelector('#models tr[data-model="tiny"] [data-field="state"]') || {}).textContent
                    === 'UNLOADED'""", "tiny to show UNLOADED")

    png = browser.screenshot(tmp_path / "dashboard.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000
    if os.environ.get("MTS_DASHBOARD_SCREENSHOT"):
        Path(os.environ["MTS_DASHBOARD_SCREENSHOT"]).write_bytes(png)
    assert browser.problems() == []


def test_dashboard_with_bearer_tokens(start_server, browser, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} infer\n")
    srv = start_server(models={"tiny": TINY}, config={"server": {"auth_token_file": str(tokens)}})
    assert srv.get("/dashboard").status_code == 200  # open: no data in it
    r = srv.get("/api/v1/dashboard/state")
    assert r.status_code == 401, r.text
    r = srv.get("/api/v1/dashboard/state", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.json()["models"][0]["name"] == "tiny"

    browser.navigate(srv.url + "/dashboard?token=" + TOKEN)
    browser.wait("window.mtsDashboard && window.mtsDashboard.polls >= 2", "two authorized polls")
    assert browser.eval("location.search") == ""  # the token left the address bar
    assert browser.eval("sessionStorage.getItem('mtserve.dashboard.token')") == TOKEN
    assert cell(browser, "tiny", "state") == "UNLOADED"
    r = srv.infer("tiny", tiny_body(), headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    browser.wait("(document.querySelector('#models tr[data-model=\"tiny\"] [data-field=\"success\"]') || {})"
                 ".textContent === '1'", "the request to show")
    assert browser.problems() == []

    # without the token the page asks for one (the refused poll is logged by the browser as a
    # failed resource load; that is the only console entry allowed here)
    browser.eval("sessionStorage.clear()")
    n0 = len(browser.events)
    browser.navigate(srv.url + "/dashboard")
    browser.wait("!document.getElementById('auth').hidden", "the token form")
    assert "token" in browser.eval("document.getElementById('conn-text').textContent")
    later = browser.events[n0:]
    browser.events = later
    assert all("401" in p for p in browser.problems()), browser.problems()
