"""embedding_policy end to end on minilm_like (MiniLM-L6-sized BERT encoder, mean pooling, L2
normalization): `mtserve tune --embedding` writes a policy covering the batch sizes it measured,
which the configuration then accepts; a server applies a policy as it says (a request of n texts
split into min(workers, n) sub-batches that run alone with the entry's intra-op threads, shown by
the model statistics: policy_sub_batches, team_sizes, threads_set_batches, batch_stats) and gives
the same vectors as without one; malformed policies are refused at load, naming the entry.

Three models share one minilm_like file: `plain` (no policy), `pol` (config.yaml, list form:
1 text -> one batch with 2 threads; more -> 2 sub-batches of 1 thread) and `pol3` (config.pbtxt
parameter, compact form "64:3x1": 3 sub-batches).
"""
import json
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import MTSERVE, Server
from test_embeddings import assets  # noqa: F401  (the model and vocabulary fixture)
from yamlcfg import to_yaml

BASE = {"pooling": "mean", "normalize": True, "max_tokens": 128, "max_batch": 32, "max_queue_delay_us": 0}
POLICY = [{"max_batch": 1, "workers": 1, "threads": 2}, {"max_batch": 32, "workers": 2, "threads": 1}]
SHORT = ["the cat sat", "a dog ran", "red car", "blue sky today", "hello there", "good morning all",
         "cold tea", "big house"]  # all in the 8-token bucket: one bucket part per request
MIXED = SHORT + [
    "Sentence embeddings map a text to one vector; similar texts get nearby vectors, which is what semantic "
    "search, clustering and deduplication rely on.",
    "The meeting has been moved to Thursday afternoon at three o'clock in the small conference room.",
    "numbers 12345 and symbols #$% are tokens too", "A", "Héllo, WORLD! unaffable naïve café",
    "Vector databases answer nearest-neighbour queries over millions of embeddings in milliseconds.",
] * 2 + ["one more"] * 4  # 32 texts over several buckets


def model_dir(root, name, model, cfg=None, pbtxt=None):
    d = root / name
    d.mkdir(parents=True)
    os.symlink(model, d / "model.onnx")
    if cfg is not None:
        (d / "config.yaml").write_text(to_yaml(cfg) + "\n")
    if pbtxt is not None:
        (d / "config.pbtxt").write_text(pbtxt)
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory, assets):  # noqa: F811
    model, vocab = assets
    work = tmp_path_factory.mktemp("policy_server")
    repo = work / "repo"
    model_dir(repo, "plain", model, dict(BASE, tokenizer=str(vocab)))
    model_dir(repo, "pol", model, dict(BASE, tokenizer=str(vocab), embedding_policy=POLICY))
    params = {"tokenizer": str(vocab), "pooling": "mean", "normalize": "true", "max_tokens": "128",
              "embedding_policy": "64:3x1"}
    model_dir(repo, "pol3", model, pbtxt="max_batch_size: 32\n" + "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items()))
    srv = Server(work, ["--model-repository", str(repo)], 10)
    yield srv
    srv.stop()


def embed(srv, model, texts):
    r = srv.post("/v1/embeddings", json={"model": model, "input": texts})
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float64)


def stats(srv, model):
    r = srv.get(f"/v2/models/{model}/stats")
    assert r.status_code == 200, r.text
    return r.json()["model_stats"][0]


def counts(st):
    return (st.get("policy_sub_batches", 0), st["threads_set_batches"], dict(st["team_sizes"]),
            {b["batch_size"]: b["compute_infer"]["count"] for b in st["batch_stats"]})


def delta(before, after):
    sub = after[0] - before[0]
    hinted = after[1] - before[1]
    teams = {k: v - before[2].get(k, 0) for k, v in after[2].items() if v - before[2].get(k, 0)}
    sizes = {k: v - before[3].get(k, 0) for k, v in after[3].items() if v - before[3].get(k, 0)}
    return sub, hinted, teams, sizes


def test_same_vectors_with_and_without_policy(server):
    for texts in (SHORT[:1], SHORT[:2], SHORT, MIXED):
        ref = embed(server, "plain", texts)
        for model in ("pol", "pol3"):
            got = embed(server, model, texts)
            assert got.shape == ref.shape
            cos = np.sum(got * ref, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
            assert cos.min() >= 0.999999, (model, len(texts), cos.min())


def test_stats_show_the_policy(server):
    embed(server, "pol", SHORT[:1])  # loaded and warm
    st = stats(server, "pol")
    assert st["embedding_policy"] == "1:1x2,32:2x1"
    # one text: one batch of 1 with 2 threads, not split
    before = counts(st)
    embed(server, "pol", SHORT[:1])
    team = str(min(2, os.cpu_count()))  # capped at the device's cores
    assert delta(before, counts(stats(server, "pol"))) == (0, 1, {team: 1}, {1: 1})
    # eight texts of one bucket: two sub-batches of 4, one thread each
    before = counts(stats(server, "pol"))
    embed(server, "pol", SHORT)
    assert delta(before, counts(stats(server, "pol"))) == (2, 2, {"1": 2}, {4: 2})
    # config.pbtxt's compact form, three workers: 3 + 3 + 2
    embed(server, "pol3", SHORT[:1])
    before = counts(stats(server, "pol3"))
    assert stats(server, "pol3")["embedding_policy"] == "64:3x1"
    embed(server, "pol3", SHORT)
    assert delta(before, counts(stats(server, "pol3"))) == (3, 3, {"1": 3}, {3: 2, 2: 1})
    # no policy: whole batches, the scheduler's threads
    embed(server, "plain", SHORT)
    st = stats(server, "plain")
    assert "embedding_policy" not in st and st["threads_set_batches"] == 0
    before = counts(st)
    embed(server, "plain", SHORT)
    d = delta(before, counts(stats(server, "plain")))
    assert d[0] == 0 and d[1] == 0 and d[3] == {8: 1}


def test_tune_writes_a_policy_the_config_accepts(tmp_path, assets):  # noqa: F811
    model, vocab = assets
    d = model_dir(tmp_path, "m", model, dict(BASE, tokenizer=str(vocab)))
    out = tmp_path / "policy.yaml"
    r = subprocess.run([str(MTSERVE), "tune", str(d), "--cores", "2", "--seconds", "0.05", "--batches", "1,2,4",
                        "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # the table: every (batch, workers, threads) with W x T <= 2 and W <= batch
    rows = re.findall(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(serial|fine|coarse|mixed)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
                      r.stdout, re.M)
    assert sorted((int(b), int(w), int(t)) for b, w, t, *_ in rows) == [
        (1, 1, 1), (1, 1, 2), (2, 1, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1), (4, 1, 2), (4, 2, 1)]
    assert all(float(x[4]) > 0 for x in rows)
    assert len(re.findall(r"^tune: \[\d+/8\] batch", r.stderr, re.M)) == 8  # progress lines
    text = out.read_text()
    entries = [tuple(map(int, m)) for m in re.findall(
        r"^  - \{max_batch: (\d+), workers: (\d+), threads: (\d+)\}$", text, re.M)]
    assert entries and text.count("\n  - ") == len(entries)
    assert [e[0] for e in entries] == sorted({e[0] for e in entries}) and entries[-1][0] == 4
    best = {int(m[0]): (int(m[1]), int(m[2])) for m in re.findall(r"batch +(\d+): workers (\d+), threads (\d+)",
                                                                   r.stdout)}
    assert set(best) == {1, 2, 4}
    for b, wt in best.items():  # the entry that applies to b is b's winner
        assert next(e for e in entries if b <= e[0])[1:] == wt
    # the configuration takes it as it is
    with open(d / "config.yaml", "a") as f:
        f.write(text)
    r = subprocess.run([str(MTSERVE), "embed", str(d), "hello"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split()) == 384
    # and `mtserve inspect FOLDER` shows the policy in force
    r = subprocess.run([str(MTSERVE), "inspect", str(d), "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["embedding_policy"] == ",".join(f"{b}:{w}x{t}" for b, w, t in entries)


@pytest.mark.parametrize("policy, message", [
    ([{"max_batch": 4, "workers": 1, "threads": 2}, {"max_batch": 2, "workers": 2}],
     r"key 'models\.e\.embedding_policy\[2\]': max_batch 2 is not above the previous entry's 4"),
    ([{"max_batch": 8, "wrokers": 2}], r"key 'models\.e\.embedding_policy\[1\]\.wrokers': unknown key"),
    ([{"max_batch": 2, "workers": 4}], r"embedding_policy\[1\]': workers 4 is more than max_batch 2"),
    ([{"max_batch": 4, "workers": 0}], r"embedding_policy\[1\]\.workers': expected a positive integer"),
    ([{"workers": 2}], r"embedding_policy\[1\]': the entry has no max_batch"),
    ([{"max_batch": 8, "threads": 2, "disable_matmul_parallel": True}],
     r"embedding_policy\[1\]': disable_matmul_parallel: true runs 1 thread per sub-batch, but threads is 2"),
    ("4:1x2,32:2x", r"embedding_policy': entry 2 \('32:2x'\): expected threads"),
    ("4:1x2,,8:1", r"embedding_policy': entry 2 \(''\): expected max_batch"),
    ([], r"embedding_policy': the sequence is empty"),
    ({"max_batch": 4}, r"embedding_policy': expected a sequence of \{max_batch, workers, threads\} entries, got a "
     r"mapping"),
])
def test_malformed_policy_refused_at_load(tmp_path, assets, policy, message):  # noqa: F811
    model, vocab = assets
    cfg = tmp_path / "config.yaml"
    cfg.write_text(to_yaml({"models": {"e": dict(BASE, model_path=str(model), tokenizer=str(vocab),
                                                 embedding_policy=policy)}}) + "\n")
    r = subprocess.run([str(MTSERVE), "serve", "--config", str(cfg), "--http-port", "0", "--grpc-port", "0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert re.search(message, r.stderr), r.stderr


def test_policy_needs_an_embedding_model(tmp_path, assets):  # noqa: F811
    model, _ = assets
    cfg = tmp_path / "config.yaml"
    cfg.write_text(to_yaml({"models": {"t": {"model_path": str(model), "embedding_policy": "8:2x1"}}}) + "\n")
    r = subprocess.run([str(MTSERVE), "serve", "--config", str(cfg), "--http-port", "0", "--grpc-port", "0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "model 't': embedding_policy applies to embedding models only" in r.stderr, r.stderr
