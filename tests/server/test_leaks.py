"""No leaks across load / infer / unload cycles (a standing complaint about Triton and TF Serving):
a real server cycles models through eviction (max_models 1, three
models used in turn) and through explicit load/unload calls, hundreds of times, and its resident
memory, open file descriptors and memory mappings must come back to what they were after the
warm-up. Measured from /proc/PID of the server process.
"""
import os

import numpy as np

from conftest import SMALL_CNN, TINY, binary_body


def proc_state(pid):
    with open(f"/proc/{pid}/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(1 for _ in f)
    return rss_kb, fds, maps


def test_load_infer_unload_cycles_do_not_leak(start_server):
    srv = start_server({"tiny": TINY, "cnn": SMALL_CNN, "cnn2": SMALL_CNN}, config={"capacity": {"max_models": 1}})
    pid = srv.proc.pid
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    xc = np.random.default_rng(3).random((2, 3, 32, 32), dtype=np.float32)
    tiny_body, tiny_h = binary_body([("x", x)])
    cnn_body, cnn_h = binary_body([("x", xc)])

    def cycle(i):
        # three models through a one-model budget: every request loads one and evicts another
        for name, body, h in (("tiny", tiny_body, tiny_h), ("cnn", cnn_body, cnn_h), ("cnn2", cnn_body, cnn_h)):
            r = srv.infer(name, body, headers=h)
            assert r.status_code == 200, r.text
        # and the explicit API
        assert srv.post("/v2/repository/models/tiny/load").status_code == 200
        assert srv.post("/v2/repository/models/tiny/unload").status_code == 200

    for i in range(40):  # warm-up: allocator pools, plans, thread stacks reach their steady size
        cycle(i)
    rss0, fds0, maps0 = proc_state(pid)
    n = 200
    for i in range(n):
        cycle(i)
    rss1, fds1, maps1 = proc_state(pid)
    st = srv.model_stats("tiny")
    loads = int(srv.metrics().split('mts_model_loads_total{model="tiny",outcome="success"} ')[1].split()[0])
    print(f"after warm-up: RSS {rss0} KiB, {fds0} fds, {maps0} maps; after {n} more cycles ({loads} loads of "
          f"tiny in all): RSS {rss1} KiB, {fds1} fds, {maps1} maps")
    assert loads >= 2 * (40 + n)  # every cycle really loaded it (eviction + explicit load)
    assert st is not None
    assert fds1 <= fds0 + 2, "file descriptors leak across load/unload cycles"
    assert maps1 <= maps0 + 8, "memory mappings (model files, arenas) leak across load/unload cycles"
    # 200 cycles = 800 loads; a leak of even 4 KiB per load would show as 3 MiB
    assert rss1 - rss0 < 3 * 1024, f"resident memory grew by {rss1 - rss0} KiB over {n} cycles"
