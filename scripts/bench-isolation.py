#!/usr/bin/python3
"""Tenant isolation benchmark (`make bench-isolation`): a light tenant's latency beside a heavy one.

One server (1 device, 2 workers, 2 threads: the defaults on this 2-core machine) holds
lipsync_unet_w8 (the heavy tenant, default config: max_batch 8) and tiny (the light tenant,
default config). For each protocol (HTTP, gRPC) it measures, with `mtserve bench`:

  1. the heavy tenant alone, closed loop at concurrency 4: its capacity (requests/s);
  2. the light tenant alone, open loop at LIGHT_RATE requests/s;
  3. the light tenant at LIGHT_RATE beside the heavy one at concurrency 4, at concurrency 32,
     and as an open-loop flood at 5x the heavy capacity measured in 1.

Each heavy load runs ROUNDS times alone and ROUNDS times with the light tenant beside it,
interleaved (timings drift on this shared machine); a row prints medians: the light tenant's p50,
p99, p99 measured from the moment the client actually sent (without the client's own late
starts), p99 of the server's end-to-end time (from the request read to the answer handed back, a
bucket bound of the server's mts_request_duration_seconds histogram: what lies between this and
the client's figure is spent in the kernels' delivery of the bytes and in the threads' wake-ups),
p99 of its time queued in the server, answered/sent, and the heavy tenant's throughput alone
and beside the light one with their ratio (the median of the rounds' ratios: what the heavy
tenant lost for the light one). The heavy model's batch
engine time (the server's mean compute per request at the heavy load) is printed beside it: the
target for the light p99 is 5 ms plus one engine step of the heavy model, and a batch is many
steps. Then two heavy tenants of equal weight (lipsync_unet_w8 and seg_unet, whose batches cost
different times) run side by side: each one's share of the engine time, target 50 % +- 10 %.
The CPU model is printed first (it changes between machines).

The load generators run on the server's 2 cores. They stand in for clients on other machines, so
they run at fixed priorities: the heavy tenant's generator at nice HEAVY_NICE (default 19) and
the light tenant's client, which measures, at nice LIGHT_NICE (default -10; lowering a nice value
needs root or CAP_SYS_NICE, else it is left at 0). The server itself runs as it would in production
(front ends at nice 0, regular workers at nice 10). At equal priorities (HEAVY_NICE=0
LIGHT_NICE=0) a heavy flood's generator, writing 2.4 MB requests 250-300 times a second, takes
CPU from the server's I/O threads and from the measuring client: the client then starts its own
requests late (reported as "client late starts") and that lateness counts in the light p99.

Each round also runs the heavy load beside a stand-in for the light tenant's client (STANDIN=1,
the default; 0 leaves it out): a process at the client's priority that wakes LIGHT_RATE times a
second and burns the client's measured CPU per request each time, sending nothing (what the
light client used per request beside the same heavy load in the rounds before, the median; in
the first round its cost alone). The heavy
tenant's throughput beside it is what the measuring client alone takes from it on these shared
cores, and "with light / with stand-in" (the median of the rounds' ratios) what the server's
handling of the light tenant costs it. The stand-in also records how late the OS wakes it
("stand-in woken late": median of the rounds' p99, and the worst): a floor under the light p99
that no server can lower, set by the machine's scheduling of the load generators beside it.

Each round also runs the heavy load with the light tenant's client sending to a server that
answers from a cache instead (FLOOR=1, the default; 0 leaves it out; bench/answer_cache.py, at
the server's priority, answering every request the way mtserve answered the first of its kind,
over HTTP from one epoll thread, over gRPC from Python's gRPC server on gRPC core): "light p99,
answering cache" is what the kernel's delivery and the OS's wake-ups of two processes cost the
light tenant beside that heavy load, with nothing computed and no other traffic in the
answering process, the floor under the light p99 on this machine.

Knobs (environment): DURATION (seconds per measured run, default 10), ROUNDS (default 3),
PROTOCOLS (default "http,grpc"),
LIGHT_RATE (default 200), PARTS (default "light,two-heavy": which parts to run; "modes" adds
the scheduler comparison below, "heavy-loss" the paired measurement of the heavy tenant's loss
at the end), MTSERVE (binary, default build/mtserve); MTS_SHORT_LANE=0 runs the
server without its short-work lane (fair sharing alone), MTS_PREEMPT=1 with preemption between
engine steps. PARTS=modes compares the ways of bounding the light tenant's wait side by side
(MODES, default "lane,preempt,none"; also "lane+preempt", and "nice0" / "nice10": the regular
workers at nice 0 or 10, MTS_WORKER_NICE; "noinline": short work never run on the thread that
read the request, MTS_INLINE_SHORT=0; "noearly": large HTTP uploads for a full queue read whole
before the 429, MTS_EARLY_REFUSAL=0; "nolight": HTTP without the light I/O threads, small
requests read by the listening threads with everything else, MTS_HTTP_LIGHT_IO=0; "nort": the
light threads and small gRPC connections at the normal policy instead of SCHED_RR 1,
MTS_LIGHT_REALTIME=0; "native" /
"core": the gRPC port served by mtserve's own HTTP/2 transport or by gRPC core,
MTS_GRPC_TRANSPORT; "bin=PATH": another mtserve binary with the default settings, to compare
two builds): one server
per mode, the light tenant beside the heavy one at concurrency 4 and 32 and an open-loop flood
of FLOOD_RATE/s (default 230, about 5x the heavy capacity), rounds interleaved across the
servers; with the heavy tenant's refused requests a second and the server's CPU seconds a
second.

PARTS=heavy-loss measures the heavy tenant's loss alone, with more samples than the rounds above
give it (a run's throughput on this VM swings by 10 % and more from one 8 s run to the next):
for each heavy load, PAIRS (default 10) pairs of back-to-back runs, the heavy load beside the
light tenant and beside the client stand-in, the pair's order alternating (the stand-in burns
the median of what the light client itself used per request in this load's runs so far: beside
a flood the client costs more than alone, 0.31 against 0.19 ms per request over HTTP, and that
difference is the client's, not the server's); it prints the median
of the pairs' ratios (with light / with stand-in) with their quartiles and extremes. Beside them,
two readings with less noise than a run's throughput: the CPU time the server's regular workers
got (the same ratio: the share of the cores the light tenant's handling takes from the heavy
one, whose throughput follows that share times the machine's speed of the moment, which swings),
and the server's CPU outside the workers in the light run minus the stand-in run, per light
request (the front end's and the kernel's work for one light request beside that load).
"""
import json
import os
import resource
import urllib.request
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MTSERVE = os.environ.get("MTSERVE", str(ROOT / "build" / "mtserve"))
DURATION = float(os.environ.get("DURATION", "10"))
LIGHT_RATE = float(os.environ.get("LIGHT_RATE", "200"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PARTS = os.environ.get("PARTS", "light,two-heavy").split(",")
PROTOCOLS = os.environ.get("PROTOCOLS", "http,grpc").split(",")
HEAVY, LIGHT, HEAVY2 = "lipsync_unet_w8", "tiny", "seg_unet"
HEAVY_NICE = int(os.environ.get("HEAVY_NICE", "19"))
LIGHT_NICE = int(os.environ.get("LIGHT_NICE", "-10"))
STANDIN = os.environ.get("STANDIN", "1") != "0"
FLOOR = os.environ.get("FLOOR", "1") != "0"
ANSWERERS = []  # answering caches started (stopped when main ends, however it ends)
if LIGHT_NICE < 0 and os.geteuid() != 0:
    LIGHT_NICE = 0  # `nice` would run it at 0 anyway, with a warning


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def start_server(tmp, env=None, binary=None):
    repo = Path(tmp) / "repo"
    for m in (HEAVY, LIGHT, HEAVY2):
        if (repo / m).exists():
            continue
        (repo / m).mkdir(parents=True)
        (repo / m / "model.onnx").symlink_to(ROOT / "models" / "out" / f"{m}.onnx")
        (repo / m / "config.yaml").write_text("preload: true\n")
    tag = "-".join(f"{k}{v}" for k, v in (env or {}).items()) + (f"-{Path(binary).name}" if binary else "")
    outp, errp = Path(tmp) / f"serve{tag}.out", Path(tmp) / f"serve{tag}.err"
    out = open(outp, "w+")
    err = open(errp, "w")
    p = subprocess.Popen([binary or MTSERVE, "serve", "--model-repository", str(repo), "--http-port", "0", "--grpc-port", "0",
                          "--log-level", "warn"], stdout=out, stderr=err, env={**os.environ, **(env or {})})
    deadline = time.time() + 60
    while time.time() < deadline:
        text = outp.read_text()
        h = re.search(r"on (http://[0-9.]+:\d+) \(KServe v2\)", text)
        g = re.search(r"serving gRPC on ([0-9.]+:\d+)", text)
        if h and g:
            return p, h.group(1), g.group(1)
        if p.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit("bench-isolation: the server did not start:\n" + errp.read_text())


def start_answerer(proto, url, grpc):
    """bench/answer_cache.py in front of the server for one protocol: (process, its address in
    the form bench_cmd takes for that protocol)."""
    upstream = url.split("//", 1)[1] if proto == "http" else grpc
    p = subprocess.Popen([sys.executable, str(ROOT / "bench" / "answer_cache.py"), proto, upstream],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    if len(line) != 2 or line[0] != "port":
        p.kill()
        sys.exit("bench-isolation: the answering cache did not start")
    ANSWERERS.append(p)
    return p, f"http://127.0.0.1:{line[1]}" if proto == "http" else f"127.0.0.1:{line[1]}"


def bench_cmd(proto, url, grpc, model, *args):
    where = ["--url", url] if proto == "http" else ["--grpc", grpc]
    nice = HEAVY_NICE if model != LIGHT else LIGHT_NICE
    return (["nice", "-n", str(nice)] if nice else []) + \
        [MTSERVE, "bench", *where, "--model", model, "--json", "--quiet", "--no-server-stats", *[str(a) for a in args]]


def run(cmds):
    """Runs the bench commands at the same time; returns their JSON summaries."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    res = []
    for c, p in zip(cmds, procs):
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"bench-isolation: {' '.join(c)} failed ({p.returncode}): {err[-1000:]}")
        res.append(json.loads(out))
    return res


def stat_cpu_s(path):
    """CPU seconds (user + system) from a /proc stat file (a process's or one thread's)."""
    f = open(path).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid):
    """CPU seconds a running process has used so far."""
    return stat_cpu_s(f"/proc/{pid}/stat")


def worker_cpu_s(pid):
    """CPU seconds the server's regular workers (threads named mts-dN-wN, with the intra-op
    threads they start, which carry the name) have used so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if re.fullmatch(r"mts-d\d+-w\d+", open(f"/proc/{pid}/task/{tid}/comm").read().strip()):
                total += stat_cpu_s(f"/proc/{pid}/task/{tid}/stat")
        except (FileNotFoundError, ProcessLookupError):
            pass  # the thread ended
    return total


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def duration_buckets(url, model):
    """The server's end-to-end request-duration histogram of one model (/metrics): {le: count}."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    pat = re.compile(r'mts_request_duration_seconds_bucket\{model="%s",le="([^"]+)"\} (\S+)' % re.escape(model))
    return {m.group(1): float(m.group(2)) for m in pat.finditer(text)}


def server_p99(before, after):
    """The upper bound (ms) of the bucket holding the 99th percentile of the requests counted
    between two duration_buckets readings; None without any."""
    d = {k: v - before.get(k, 0) for k, v in after.items()}
    n = d.get("+Inf", 0)
    if n <= 0:
        return None
    for le in sorted((k for k in d if k != "+Inf"), key=float):
        if d[le] >= 0.99 * n:
            return 1e3 * float(le)
    return float("inf")


def fmt_bound(ms):
    return "-" if ms is None else f"<= {ms:g} ms"


def late_starts(summary):
    """Requests the open-loop client itself sent late (it was not scheduled in time); None where
    the client does not report it."""
    return summary.get("pool", {}).get("late_starts")


def total(xs):
    """The sum, or "-" when any is unknown."""
    return "-" if None in xs else sum(xs)


def stand_in_cmd(burn_ms):
    """A process standing in for the light tenant's client: LIGHT_RATE wake-ups a second at the
    client's priority, each burning burn_ms of CPU (the client's measured cost per request),
    sending nothing. Prints how late it was woken (run() reads every command's JSON)."""
    return (["nice", "-n", str(LIGHT_NICE)] if LIGHT_NICE else []) + \
        [sys.executable, __file__, "--stand-in", str(LIGHT_RATE), f"{burn_ms:.4f}", str(DURATION)]


def stand_in(rate, burn_ms, duration):
    """Also measures how late the OS wakes it (a probe of the machine's scheduling under the
    heavy load: what any client at this priority sees before it sends anything)."""
    t0 = time.monotonic()
    lags = []
    for i in range(int(rate * duration)):
        due = t0 + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
            lags.append(1e3 * (time.monotonic() - due))
        end = time.thread_time() + burn_ms / 1e3
        while time.thread_time() < end:
            pass
    lags.sort()
    print(json.dumps({"wake_lag_ms": {"p99": lags[len(lags) * 99 // 100] if lags else 0,
                                      "max": lags[-1] if lags else 0}}))


def stand_in_burn(client_beside, client_ms):
    """The CPU the stand-in burns per wake-up: the median of what the light client used per
    request in the same load's runs so far (beside a flood it costs more than alone), else its
    cost alone."""
    return median(client_beside) if client_beside else client_ms


def note_client_cost(client_beside, summary):
    if summary.get("client_cpu_ms_per_request"):
        client_beside.append(summary["client_cpu_ms_per_request"])


def light_args():
    return ("--rate", LIGHT_RATE, "--duration", DURATION)


def engine_ms(url, model):
    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=30) as r:
        return json.load(r)["model_stats"][0]["TotalInferenceMs"]


def two_heavy(url, grpc):
    """Two heavy tenants of equal weight, both closed loop at concurrency 8 over HTTP: each one's
    share of the engine time (TotalInferenceMs) over the run; the target is 50 % +- 10 %."""
    shares = []
    for _ in range(ROUNDS):
        before = [engine_ms(url, m) for m in (HEAVY, HEAVY2)]
        a, b = run([bench_cmd("http", url, grpc, HEAVY, "--concurrency", 8, "--duration", DURATION),
                    bench_cmd("http", url, grpc, HEAVY2, "--concurrency", 8, "--duration", DURATION)])
        after = [engine_ms(url, m) for m in (HEAVY, HEAVY2)]
        d = [y - x for x, y in zip(before, after)]
        shares.append((d[0] / sum(d), a["throughput_rps"], b["throughput_rps"]))
    s = median([x[0] for x in shares])
    print(f"\ntwo heavy tenants, equal weight, closed loop at concurrency 8 each (HTTP): {HEAVY} "
          f"{100 * s:.1f} % of the engine time, {HEAVY2} {100 * (1 - s):.1f} % (median of {ROUNDS}; rounds: "
          + ", ".join(f"{100 * x[0]:.1f} %" for x in shares) + ")", flush=True)


# Ways the scheduler keeps a light tenant from waiting behind a heavy one (PARTS=modes):
# server environment per mode.
MODES = {"lane": {}, "preempt": {"MTS_SHORT_LANE": "0", "MTS_PREEMPT": "1"},
         "lane+preempt": {"MTS_PREEMPT": "1"}, "none": {"MTS_SHORT_LANE": "0"},
         "nice0": {"MTS_WORKER_NICE": "0"}, "nice10": {"MTS_WORKER_NICE": "10"},
         "noinline": {"MTS_INLINE_SHORT": "0"}, "noearly": {"MTS_EARLY_REFUSAL": "0"},
         "nolight": {"MTS_HTTP_LIGHT_IO": "0"}, "nort": {"MTS_LIGHT_REALTIME": "0"},
         "native": {"MTS_GRPC_TRANSPORT": "native"}, "core": {"MTS_GRPC_TRANSPORT": "core"}}
FLOOD_RATE = float(os.environ.get("FLOOD_RATE", "230"))  # the open-loop row of PARTS=modes


PAIRS = int(os.environ.get("PAIRS", "10"))  # PARTS=heavy-loss


def calibrate(proto, server, url, grpc):
    """Warms both tenants' plans, then measures the heavy tenant's capacity (closed loop at
    concurrency 4) and the light tenant alone: returns (capacity, the light client's CPU ms per
    request, the server's CPU s and the client's for the light run, the light run's summary with
    the server's own p99 for it as "server_p99")."""
    run([bench_cmd(proto, url, grpc, HEAVY, "--concurrency", 8, "--duration", 3),
         bench_cmd(proto, url, grpc, LIGHT, "--concurrency", 4, "--duration", 3)])
    (cap_run,) = run([bench_cmd(proto, url, grpc, HEAVY, "--concurrency", 4, "--duration", DURATION)])
    s0, c0 = proc_cpu_s(server.pid), children_cpu_s()
    hb = duration_buckets(url, LIGHT)
    (light,) = run([bench_cmd(proto, url, grpc, LIGHT, *light_args())])
    light["server_p99"] = server_p99(hb, duration_buckets(url, LIGHT))
    s_cpu, c_cpu = proc_cpu_s(server.pid) - s0, children_cpu_s() - c0
    return cap_run["throughput_rps"], 1e3 * c_cpu / max(light["requests"], 1), s_cpu, c_cpu, light


def shapes_of(cap):
    return (("closed loop, concurrency 4", ("--concurrency", 4)),
            ("closed loop, concurrency 32", ("--concurrency", 32)),
            (f"open loop, 5x capacity ({5 * cap:.0f}/s)", ("--rate", f"{5 * cap:.2f}", "--max-connections", 256)))


def quartiles(xs):
    xs = sorted(xs)
    at = lambda q: xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]
    return at(0.25), median(xs), at(0.75)


def heavy_loss(server, url, grpc):
    """PARTS=heavy-loss: PAIRS back-to-back pairs per heavy load (see the module comment)."""
    for proto in PROTOCOLS:
        cap, client_ms, _, _, _ = calibrate(proto, server, url, grpc)
        print(f"\n{proto}: heavy tenant {HEAVY} (capacity {cap:.2f} req/s at concurrency 4) beside the light "
              f"tenant {LIGHT} at {LIGHT_RATE:.0f}/s and beside the client stand-in (the light client's CPU per request "
              f"beside the same load: {client_ms:.3f} ms alone); {PAIRS} pairs of {DURATION:.0f} s runs per load, the "
              f"order alternating\n", flush=True)
        print("| heavy load | with light / with stand-in: median | quartiles | min - max | heavy with light "
              "(median) | heavy with stand-in (median) | workers' CPU, with light / with stand-in: median "
              "(quartiles) | server CPU outside the workers per light request (light run minus stand-in run) | "
              "stand-in's CPU per request (median) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for label, hargs in shapes_of(cap):
            ratios, lit, std, wratios, per_req = [], [], [], [], []
            client_beside, burns = [], []  # the light client's CPU per request in this load's runs
            for i in range(PAIRS):
                got, wk, other = {}, {}, {}
                for kind in (("light", "stand-in") if i % 2 == 0 else ("stand-in", "light")):
                    if kind == "light":
                        beside = bench_cmd(proto, url, grpc, LIGHT, *light_args())
                    else:
                        burns.append(stand_in_burn(client_beside, client_ms))
                        beside = stand_in_cmd(burns[-1])
                    s0, w0 = proc_cpu_s(server.pid), worker_cpu_s(server.pid)
                    h, b = run([bench_cmd(proto, url, grpc, HEAVY, *hargs, "--duration", DURATION), beside])
                    s1, w1 = proc_cpu_s(server.pid), worker_cpu_s(server.pid)
                    got[kind], wk[kind], other[kind] = h["throughput_rps"], w1 - w0, (s1 - s0) - (w1 - w0)
                    if kind == "light":
                        n_light = max(b["requests"], 1)
                        note_client_cost(client_beside, b)
                hl, hs = got["light"], got["stand-in"]
                lit.append(hl)
                std.append(hs)
                if hs > 0:
                    ratios.append(hl / hs)
                if wk["stand-in"] > 0:
                    wratios.append(wk["light"] / wk["stand-in"])
                per_req.append(1e6 * (other["light"] - other["stand-in"]) / n_light)
            q1, mid, q3 = quartiles(ratios)
            wq1, wmid, wq3 = quartiles(wratios)
            print(f"| {label} | {mid:.3f} | {q1:.3f} - {q3:.3f} | {min(ratios):.3f} - {max(ratios):.3f} | "
                  f"{median(lit):.2f} req/s | {median(std):.2f} req/s | {wmid:.3f} ({wq1:.3f} - {wq3:.3f}) | "
                  f"{median(per_req):.0f} us | {median(burns):.3f} ms |", flush=True)


def modes(tmp):
    """The same light/heavy pairs against one server per scheduler mode, interleaved round by
    round (every server idle but the one measured), so the modes see the same machine."""
    names = [m for m in os.environ.get("MODES", "lane,preempt,none").split(",") if m]
    servers = {m: start_server(tmp, {}, m[4:]) if m.startswith("bin=") else start_server(tmp, MODES[m])
               for m in names}
    try:
        for proto in PROTOCOLS:
            for m in names:
                _, url, grpc = servers[m]
                run([bench_cmd(proto, url, grpc, HEAVY, "--concurrency", 8, "--duration", 3),
                     bench_cmd(proto, url, grpc, LIGHT, "--concurrency", 4, "--duration", 3)])
            print(f"\n{proto}: light tenant {LIGHT} at {LIGHT_RATE:.0f}/s beside {HEAVY}; one server per mode, "
                  f"medians of {ROUNDS} interleaved rounds\n")
            print("| heavy load | mode | light p50 | light p99 | light p99 queued in server | light answered | "
                  "heavy req/s | heavy vs lane | heavy refused/s | server CPU s/s |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for label, hargs in (("closed loop, concurrency 4", ("--concurrency", 4)),
                                 ("closed loop, concurrency 32", ("--concurrency", 32)),
                                 (f"open loop, {FLOOD_RATE:.0f}/s", ("--rate", FLOOD_RATE))):
                res = {m: [] for m in names}
                cpu = {m: [] for m in names}
                for _ in range(ROUNDS):
                    for m in names:
                        p, url, grpc = servers[m]
                        c0, t0 = proc_cpu_s(p.pid), time.monotonic()
                        res[m].append(run([bench_cmd(proto, url, grpc, HEAVY, *hargs, "--duration", DURATION),
                                           bench_cmd(proto, url, grpc, LIGHT, *light_args())]))
                        cpu[m].append((proc_cpu_s(p.pid) - c0) / (time.monotonic() - t0))
                ref = median([h["throughput_rps"] for h, _ in res[names[0]]])
                for m in names:
                    hs, ls = [h for h, _ in res[m]], [x for _, x in res[m]]
                    thr = median([h["throughput_rps"] for h in hs])
                    print(f"| {label} | {m} | {median([x['latency_ms']['p50'] for x in ls]):.2f} ms | "
                          f"{median([x['latency_ms']['p99'] for x in ls]):.2f} ms | "
                          f"{median([x['server_queue_ms']['p99'] for x in ls]):.2f} ms | "
                          f"{sum(x['ok'] for x in ls)}/{sum(x['requests'] for x in ls)} | {thr:.2f} | "
                          f"{thr / ref if ref else 0:.3f} | "
                          f"{median([h.get('errors', 0) / DURATION for h in hs]):.1f} | {median(cpu[m]):.2f} |",
                          flush=True)
    finally:
        for p, _, _ in servers.values():
            p.terminate()
            p.wait(timeout=30)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def main():
    print(f"bench-isolation: {cpu_model()}, {os.cpu_count()} cores, {DURATION:.0f} s per run, {ROUNDS} rounds, "
          f"light rate {LIGHT_RATE:.0f}/s, short-work lane {'off' if os.environ.get('MTS_SHORT_LANE') == '0' else 'on'}; "
          f"load generators at nice {HEAVY_NICE} (heavy) and {LIGHT_NICE} (light client)",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if "modes" in PARTS:
            modes(tmp)
            if PARTS == ["modes"]:
                return
        server, url, grpc = start_server(tmp)
        try:
            if "heavy-loss" in PARTS:
                heavy_loss(server, url, grpc)
            for proto in PROTOCOLS if "light" in PARTS else ():
                cap, client_ms, s_cpu, c_cpu, light = calibrate(proto, server, url, grpc)
                srv0 = light["server_p99"]
                print(f"\n{proto}: heavy tenant {HEAVY} (closed loop, concurrency 4): {cap:.2f} req/s; light tenant "
                      f"{LIGHT} at {LIGHT_RATE:.0f}/s (open loop). Medians of {ROUNDS} rounds; each round runs the heavy "
                      f"load alone and with the light tenant beside it, back to back.\n")
                answerer, floor_at = start_answerer(proto, url, grpc) if FLOOR else (None, None)
                floor_args = (floor_at, floor_at) if FLOOR else None
                if FLOOR:  # the cache's first answers come from the server; then alone
                    run([bench_cmd(proto, *floor_args, LIGHT, "--concurrency", 1, "--duration", 1)])
                    (fl,) = run([bench_cmd(proto, *floor_args, LIGHT, *light_args())])
                print("| heavy load | light p50 | light p99 | light p99 from the send | light p99 in the server "
                      "(read to answer) | light p99 queued in server | light answered | "
                      "client late starts | heavy alone | heavy with light | ratio | "
                      + ("heavy beside the client stand-in | with light / with stand-in | "
                         "stand-in woken late, p99 / max | " if STANDIN else "")
                      + ("light p99, answering cache | " if FLOOR else "") + "heavy compute/request |")
                print("|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if STANDIN else "")
                      + ("---|" if FLOOR else ""))
                lat, q = light["latency_ms"], light["server_queue_ms"]
                print(f"| none | {lat['p50']:.2f} ms | {lat['p99']:.2f} ms | "
                      f"{light['latency_from_send_ms']['p99']:.2f} ms | {fmt_bound(srv0)} | {q['p99']:.2f} ms | "
                      f"{light['ok']}/{light['requests']} | {total([late_starts(light)])} | - | - | - | "
                      + ("- | - | - | " if STANDIN else "")
                      + (f"{fl['latency_ms']['p99']:.2f} ms | " if FLOOR else "") + "- |", flush=True)
                for label, hargs in shapes_of(cap):
                    alone, beside, p50, p99, q99, ok, sent, comp, late = [], [], [], [], [], 0, 0, [], []
                    sent99, srv99 = [], []
                    stand, wake99, wakemax, floor99 = [], [], [], []
                    client_beside = []  # the light client's CPU per request in this load's rounds
                    for _ in range(ROUNDS):
                        (h,) = run([bench_cmd(proto, url, grpc, HEAVY, *hargs, "--duration", DURATION)])
                        alone.append(h["throughput_rps"])
                        if STANDIN:
                            h, si = run([bench_cmd(proto, url, grpc, HEAVY, *hargs, "--duration", DURATION),
                                         stand_in_cmd(stand_in_burn(client_beside, client_ms))])
                            stand.append(h["throughput_rps"])
                            wake99.append(si["wake_lag_ms"]["p99"])
                            wakemax.append(si["wake_lag_ms"]["max"])
                        if FLOOR:
                            _, fl = run([bench_cmd(proto, url, grpc, HEAVY, *hargs, "--duration", DURATION),
                                         bench_cmd(proto, *floor_args, LIGHT, *light_args())])
                            floor99.append(fl["latency_ms"]["p99"])
                        hb = duration_buckets(url, LIGHT)
                        h, l = run([bench_cmd(proto, url, grpc, HEAVY, *hargs, "--duration", DURATION),
                                    bench_cmd(proto, url, grpc, LIGHT, *light_args())])
                        srv99.append(server_p99(hb, duration_buckets(url, LIGHT)))
                        sent99.append(l["latency_from_send_ms"]["p99"])
                        note_client_cost(client_beside, l)
                        beside.append(h["throughput_rps"])
                        comp.append(h["server_compute_ms"]["mean"])
                        p50.append(l["latency_ms"]["p50"])
                        p99.append(l["latency_ms"]["p99"])
                        q99.append(l["server_queue_ms"]["p99"])
                        ok += l["ok"]
                        sent += l["requests"]
                        late.append(late_starts(l))
                    # each round's pair was measured back to back: the ratio is the median of the
                    # rounds' ratios (the machine's speed drifts between rounds)
                    a, b = median(alone), median(beside)
                    ratio = median([y / x for x, y in zip(alone, beside) if x > 0] or [0])
                    control = ""
                    if STANDIN:
                        sr = median([y / x for x, y in zip(stand, beside) if x > 0] or [0])
                        control = (f"{median(stand):.2f} req/s | {sr:.3f} | "
                                   f"{median(wake99):.2f} / {max(wakemax):.1f} ms | ")
                    srv = None if None in srv99 else median(srv99)
                    print(f"| {label} | {median(p50):.2f} ms | {median(p99):.2f} ms | {median(sent99):.2f} ms | "
                          f"{fmt_bound(srv)} | {median(q99):.2f} ms | {ok}/{sent} | {total(late)} | "
                          f"{a:.2f} req/s | {b:.2f} req/s | {ratio:.3f} | {control}"
                          + (f"{median(floor99):.2f} ms | " if FLOOR else "") + f"{median(comp):.1f} ms |", flush=True)
                if answerer:
                    answerer.kill()
                nreq, cores = max(light["requests"], 1), os.cpu_count() * DURATION
                print(f"\nThe light tenant alone cost the server {1e3 * s_cpu / nreq:.3f} ms of CPU per request "
                      f"({100 * s_cpu / cores:.1f} % of the cores) and its client, on the same cores, "
                      f"{1e3 * c_cpu / nreq:.3f} ms ({100 * c_cpu / cores:.1f} %): about what the heavy tenant "
                      f"loses beside it on this machine."
                      + (f" The stand-in burns what the client used per request beside the same load in "
                         f"the rounds before ({client_ms:.3f} ms alone, in the first round) at "
                         f"{LIGHT_RATE:.0f}/s and nice {LIGHT_NICE} without sending anything: the heavy "
                         f"tenant's throughput beside it is what the measuring client alone takes, and "
                         f"'with light / with stand-in' what the server's handling of the light "
                         f"tenant costs the heavy one." if STANDIN else ""), flush=True)
            if "two-heavy" in PARTS:
                run([bench_cmd("http", url, grpc, h, "--concurrency", 4, "--duration", 3) for h in (HEAVY, HEAVY2)])
                two_heavy(url, grpc)
        finally:
            for p in ANSWERERS:
                p.kill()
                p.wait()
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--stand-in":
        stand_in(float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
    else:
        main()
