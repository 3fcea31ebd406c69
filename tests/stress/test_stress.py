"""Stress test: inference over HTTP and gRPC on many models at once, with evictions, explicit
unloads and force reloads racing with it, must neither crash the server nor leave a request
unanswered.

The server gets 8 models (some the same .onnx under two names, with different batching), dynamic
batching with max_batch 4 or 8 and small queue delays, and `capacity.max_models: 4`, so models
are evicted and reloaded all the time. For MTS_STRESS_SECONDS (default 40) it then serves, all
at once: `mtserve bench` over HTTP and `mtserve bench` over gRPC, each with 16 connections spread
over all 8 models, and a Python thread that cycles through the models doing load, unload, and
load with force_reload through the KServe repository API (alternately over HTTP and gRPC).
Meant for the ASan+UBSan build (MTSERVE=build-asan/mtserve, ASAN_OPTIONS=detect_leaks=1:
halt_on_error=1), where races on freed versions, plans or weights become reports; it also runs
against the release build.

What counts as an answer. Every inference request must get a response: success, or a refusal
the server documents, with its reason: 429 / RESOURCE_EXHAUSTED (queue full) or 503 /
UNAVAILABLE, which here means the model is draining after an explicit unload ("is being
unloaded") or its last load failed because max_models was reached while every resident model
was busy and it is in back-off ("failed to load: max_models (4) reached ..."). A 404 is not
accepted: every model is configured, and an unloaded (or evicted) model is loaded again by the
next request to it (src/serve/scheduler.c, mts_server_submit), so NOT_FOUND would be a bug.
Connection failures, client timeouts (a hung request), protocol errors and any other status fail
the test. For the control thread the accepted answers are success, 503 / UNAVAILABLE for a load
of a draining model or an unload of a loading one, and a failed load reported as 400 (HTTP) /
RESOURCE_EXHAUSTED (gRPC) with "failed to load" in its message.

Afterwards the server must be alive and ready, exit 0 on SIGTERM, and its stderr must hold no
crash trace or sanitizer report (LeakSanitizer's exit-time report included). The test prints what
was exercised (requests per model and outcome, control actions, loads, unloads, evictions and
reloads) and requires evictions, explicit unloads and force reloads to have happened, and
batches of more than one sample, so it cannot pass without doing the work.
"""
import collections
import os
import re
import threading
import time

import requests

from conftest import (BERT_TINY, LIPSYNC_W4, MOBILENET, MTSERVE, SMALL_CNN, TINY, Bench, check_bench, is_asan_build,
                      zero_inputs)

STRESS_S = float(os.environ.get("MTS_STRESS_SECONDS", "40"))
CONCURRENCY = 16
MAX_MODELS = 4

MODELS = {
    "tiny": (TINY, {"max_batch": 8, "max_queue_delay_us": 500}),
    "tiny_b": (TINY, {"max_batch": 4}),
    "small_cnn": (SMALL_CNN, {"max_batch": 8, "max_queue_delay_us": 1000}),
    "small_cnn_b": (SMALL_CNN, {"max_batch": 4, "max_queue_delay_us": 200}),
    "bert_tiny": (BERT_TINY, {"max_batch": 8, "max_queue_delay_us": 500}),
    "mobilenetv3": MOBILENET,  # no config.yaml: the default dynamic batching (max_batch 8)
    "mobilenetv3_b": (MOBILENET, {"max_batch": 4, "max_queue_delay_us": 2000}),
    "lipsync_unet_w4": (LIPSYNC_W4, {"max_batch": 4, "max_queue_delay_us": 1000}),
}

HTTP_REFUSALS = ("429", "503")
GRPC_REFUSALS = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")

# Control-plane answers accepted (see the module docstring): {(transport, action): {status: reason re}}.
_LOAD_OK = {"503": r"is being unloaded", "400": r"failed to load"}
_LOAD_OK_GRPC = {"UNAVAILABLE": r"is being unloaded", "RESOURCE_EXHAUSTED": r"failed to load"}
CONTROL_ACCEPTED = {
    ("http", "load"): _LOAD_OK, ("http", "reload"): _LOAD_OK,
    ("http", "unload"): {"503": r"is loading"},
    ("grpc", "load"): _LOAD_OK_GRPC, ("grpc", "reload"): _LOAD_OK_GRPC,
    ("grpc", "unload"): {"UNAVAILABLE": r"is loading"},
}


class Churn(threading.Thread):
    """Cycles through the models: load, unload, load with force_reload; the transport alternates
    (HTTP for one pass over the models, gRPC for the next). Records every answer."""

    def __init__(self, srv, kserve, models, stop):
        super().__init__(daemon=True)
        self.srv, self.kserve, self.models, self.stop_ev = srv, kserve, models, stop
        self.outcomes = collections.Counter()   # (transport, action, status) -> count
        self.messages = {}                      # (transport, action, status) -> first message
        self.unexpected = []                    # (transport, action, model, status, message)
        self.error = None

    def _http(self, action, model):
        path = f"/v2/repository/models/{model}/{'unload' if action == 'unload' else 'load'}"
        kw = {"json": {"parameters": {"force_reload": True}}} if action == "reload" else {}
        r = requests.post(self.srv.url + path, timeout=60, **kw)
        if r.status_code == 200:
            return "OK", ""
        try:
            msg = r.json().get("error", r.text)
        except ValueError:
            msg = r.text
        return str(r.status_code), msg

    def _grpc(self, stub, action, model):
        import grpc
        pb = self.kserve.pb
        try:
            if action == "unload":
                stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=model), timeout=60)
            else:
                req = pb.RepositoryModelLoadRequest(model_name=model)
                if action == "reload":
                    req.parameters["force_reload"].bool_param = True
                stub.RepositoryModelLoad(req, timeout=60)
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details() or ""

    def run(self):
        channel = self.kserve.channel(self.srv.grpc_addr)
        stub = self.kserve.grpc.GRPCInferenceServiceStub(channel)
        try:
            i = 0
            while not self.stop_ev.is_set():
                model = self.models[i % len(self.models)]
                transport = "http" if (i // len(self.models)) % 2 == 0 else "grpc"
                for action in ("load", "unload", "reload"):
                    try:
                        status, msg = self._http(action, model) if transport == "http" else \
                            self._grpc(stub, action, model)
                    except Exception as e:  # timeouts, refused connections: no answer
                        status, msg = "NO_ANSWER", f"{type(e).__name__}: {e}"
                    self.outcomes[(transport, action, status)] += 1
                    self.messages.setdefault((transport, action, status), msg[:200])
                    allowed = CONTROL_ACCEPTED[(transport, action)]
                    if status != "OK" and not (status in allowed and re.search(allowed[status], msg)):
                        self.unexpected.append((transport, action, model, status, msg[:300]))
                    if self.stop_ev.wait(0.05):
                        break
                i += 1
        except Exception as e:  # a bug in this thread must not pass silently
            self.error = repr(e)
        finally:
            channel.close()


def _metric_by_model(samples, name, **match):
    out = collections.Counter()
    for n, labels, v in samples:
        if n == name and all(labels.get(k) == want for k, want in match.items()):
            out[labels.get("model")] += v
    return out


def test_stress_inference_with_evictions_unloads_and_reloads(start_server, kserve):
    srv = start_server(MODELS, config={"capacity": {"max_models": MAX_MODELS}})
    names = list(MODELS)

    # Every model loaded once, one after another (evicting as it goes), so each has its
    # signature known before the benches fetch metadata: metadata of an unloaded model is then
    # answered from the last loaded version instead of racing the benches for a load slot.
    for m in names:
        r = srv.post(f"/v2/repository/models/{m}/load")
        assert r.status_code == 200, f"load {m}: {r.status_code} {r.text}"
        assert zero_inputs(srv, m), m
    srv.assert_healthy("after loading every model once")

    t0 = time.monotonic()
    stop = threading.Event()
    benches = [Bench(srv, "http", names, CONCURRENCY, STRESS_S),
               Bench(srv, "grpc", names, CONCURRENCY, STRESS_S)]
    churn = Churn(srv, kserve, names, stop)
    churn.start()
    results = [b.result() for b in benches]
    stop.set()
    churn.join(timeout=120)
    wall = time.monotonic() - t0
    assert not churn.is_alive(), "the control thread hung (a repository call got no answer)"
    srv.assert_healthy("after the stress run")

    samples = srv.metrics()
    log = srv.log()
    reqs = {o: _metric_by_model(samples, "mts_requests_total", outcome=o)
            for o in ("success", "error", "timeout", "cancelled", "rejected")}
    loads = _metric_by_model(samples, "mts_model_loads_total", outcome="success")
    load_fail = _metric_by_model(samples, "mts_model_loads_total", outcome="failure")
    unloads = _metric_by_model(samples, "mts_model_unloads_total")
    evictions = _metric_by_model(samples, "mts_model_evictions_total")
    batch_le1 = _metric_by_model(samples, "mts_batch_size_bucket", le="1")
    batch_le4 = _metric_by_model(samples, "mts_batch_size_bucket", le="4")
    batch_all = _metric_by_model(samples, "mts_batch_size_count")
    reloads = collections.Counter(m.group(1) for m in re.finditer(r"model=(\S+) event=loaded .*reload=1", log))

    summaries = [r[1] or {} for r in results]
    per_model = {t: {pm["model"]: pm for pm in s.get("per_model", [])} for t, s in zip(("http", "grpc"), summaries)}
    print(f"\nstress: {STRESS_S:.0f} s of load ({wall:.1f} s wall), {len(names)} models, max_models {MAX_MODELS}, "
          f"bench concurrency {CONCURRENCY} over HTTP and over gRPC, {MTSERVE}{' (ASan)' if is_asan_build() else ''}")
    print(f"{'model':16} {'http ok/err':>13} {'grpc ok/err':>13} | server: {'success':>7} {'rejected':>8} "
          f"{'loads':>5} {'fail':>4} {'unlds':>5} {'evict':>5} {'reld':>4} {'batches':>7} {'>1':>5} {'>4':>4}")
    for m in names:
        h, g = per_model["http"].get(m, {}), per_model["grpc"].get(m, {})
        print(f"{m:16} {h.get('ok', 0):>6}/{h.get('errors', 0):<6} {g.get('ok', 0):>6}/{g.get('errors', 0):<6} | "
              f"        {reqs['success'][m]:>7.0f} {reqs['rejected'][m]:>8.0f} {loads[m]:>5.0f} {load_fail[m]:>4.0f} "
              f"{unloads[m]:>5.0f} {evictions[m]:>5.0f} {reloads[m]:>4} {batch_all[m]:>7.0f} "
              f"{batch_all[m] - batch_le1[m]:>5.0f} {batch_all[m] - batch_le4[m]:>4.0f}")
    for t, s in zip(("http", "grpc"), summaries):
        print(f"{t} bench: {s.get('requests')} requests, {s.get('ok')} ok, errors {s.get('errors_by_code')} "
              f"{s.get('error_messages')}")
    for key, n in sorted(churn.outcomes.items()):
        print(f"control {' '.join(key)}: {n}" + (f" ({churn.messages[key]})" if churn.messages.get(key) else ""))

    # Every inference request answered: success, or a documented refusal with its reason.
    for b, (rc, summary, err) in zip(benches, results):
        refusals = HTTP_REFUSALS if b.transport == "http" else GRPC_REFUSALS
        check_bench(srv, rc, summary, err, b.cmd, accepted_codes=refusals)
        assert summary["ok"] >= 100, f"{b.transport}: only {summary['ok']} successful requests"
    for t in per_model:
        assert all(per_model[t].get(m, {}).get("requests", 0) > 0 for m in names), \
            f"{t} bench did not send to every model: {per_model[t]}"
    # Most models served some requests. Not all need to: a model whose loads keep failing for
    # want of a free slot backs off for up to 64 s (1, 2, 4 ... s, and the control thread's
    # failed explicit loads count too), so in a short run one can be refused throughout.
    starved = [m for m in names if sum(per_model[t].get(m, {}).get("ok", 0) for t in per_model) == 0]
    assert len(starved) <= 2, f"no request succeeded for {starved}"
    for o in ("error", "timeout"):
        assert sum(reqs[o].values()) == 0, f"server-side {o} outcomes: {dict(reqs[o])}"
    # What the server counted as served is exactly what the clients received as served (the
    # benches were the only inference traffic). Refusals are not compared: the server's
    # mts_requests_total does not count 503s for draining or failed-load models.
    for m in names:
        client_ok = sum(per_model[t].get(m, {}).get("ok", 0) for t in per_model)
        assert reqs["success"][m] == client_ok, f"{m}: server counted {reqs['success'][m]:.0f} successes, " \
                                                f"the clients received {client_ok}"

    # The control thread got an accepted answer every time, and really unloaded and reloaded.
    assert churn.error is None, churn.error
    assert not churn.unexpected, f"unexpected repository answers: {churn.unexpected[:20]}"
    for action in ("load", "unload", "reload"):
        assert sum(v for (t, a, s), v in churn.outcomes.items() if a == action and s == "OK") > 0, \
            f"no successful {action}: {dict(churn.outcomes)}"

    # The churn the test is about happened.
    assert sum(evictions.values()) > 0, "no model was evicted"
    assert sum(unloads.values()) > 0, "no model was unloaded"
    assert sum(reloads.values()) > 0, "no force reload completed"
    assert sum(batch_all.values()) - sum(batch_le1.values()) > 0, "no batch of more than one sample ran"

    srv.assert_clean_exit()
