"""kvferry's load run (issue 17): a router with its HTTP proxy, two P and two D nodes, a
reference engine beside each, a baseline engine without kvferry, and Prometheus scraping them.
wrk sends the requests (bodies and expected answers prepared here from the baseline), while
clients here stream and disconnect mid-answer. Then: every engine settles to 0 blocks in use,
every query of the Grafana dashboard returns data from Prometheus, and the same wrk run straight
at the baseline engine gives the ratio of latencies. Prints one LOAD-RESULT JSON line at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from typing import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("KVFERRY_JAR", os.path.join(ROOT, "cli", "target", "kvferry.jar"))
from tests.cluster import Engine, Node, complete, free_port, settle  # noqa: E402
from tests.test_router_proxy import Router  # noqa: E402

GEOMETRY = ["--layers", "4", "--kv-heads", "4", "--head-dim", "32", "--block-size", "16",
            "--num-blocks", "1024", "--max-num-batched-tokens", "512"]


@contextlib.contextmanager
def routed_engines(wd: str, names: list[tuple[str, str]], mode: str, *, in_service: bool = False,
                   router_options: list[str] | None = None) -> Iterator[tuple[Router, list, list]]:
    """A router with its HTTP proxy, a node per (role, engine id) of ``names`` joined to it and a
    reference engine beside each node, all stopped on the way out. ``in_service``: the JVMs with
    the JVM's defaults rather than the tests' fast-start flags; ``router_options``: more JVM
    options for the router alone."""
    router = Router(wd, jvm_options=router_options, in_service=in_service)
    nodes, engines = [], []
    try:
        for role, name in names:
            nodes.append(Node(wd, role, engine_id=name, modes=mode, seed_port=router.port,
                              in_service=in_service))
        for n in nodes:
            n.wait_ready()
        for n in nodes:
            engines.append(Engine(wd, f"{n.role}-{n.socket[-8:-5]}", *GEOMETRY, "--socket", n.socket,
                                  "--role", n.role, "--mode", mode))
        yield router, nodes, engines
    finally:
        for e in engines:
            e.stop()
        for n in nodes:
            n.stop()
        router.stop()


def wait_until_routing(router_url: str, timeout_s: float = 120) -> None:
    """Until the router routes a request (it learns the engines from membership)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            complete(router_url, [1, 2, 3], 1, timeout=30)
            return
        except (AssertionError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def legs_straight(p_url: str, d_url: str, prompt: list[int], max_tokens: int, *, mode: str, p_id: str,
                  d_id: str, transfer_id: str, timeout: float = 120) -> dict:
    """One request sent as the router sends it, straight to a P and a D engine (engine ids p_id,
    d_id): WRITE, P's leg (one token) and D's together; READ, P's leg, then D's with the params P
    returned. Returns D's answer."""
    to_p = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id,
            "remote_engine_id": d_id}
    if mode == "read":
        forwarded = complete(p_url, prompt, 1, to_p, timeout=timeout)["kv_transfer_params"]
        return complete(d_url, prompt, max_tokens, forwarded, timeout=timeout)
    t = threading.Thread(target=lambda: complete(p_url, prompt, 1, to_p, timeout=timeout))
    t.start()
    try:
        return complete(d_url, prompt, max_tokens, {"do_remote_prefill": True, "do_remote_decode": False,
                                                    "transfer_id": transfer_id, "remote_engine_id": p_id},
                        timeout=timeout)
    finally:
        t.join(timeout)


def pct(v: list[float], q: float, digits: int = 2) -> float:
    """The q-quantile of v (nearest rank), rounded."""
    v = sorted(v)
    return round(v[min(len(v) - 1, int(q * len(v)))], digits)


def log(msg: str) -> None:
    print(msg, flush=True)


def prompts(n: int, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    shared = [rnd.randrange(1, 250) for _ in range(96)]  # a system prompt many requests share
    out = []
    for i in range(n):
        length = rnd.choice([8, 40, 100, 200, 400, 700])
        body = [rnd.randrange(1, 250) for _ in range(length)]
        out.append(shared + body if i % 3 == 0 else body)
    return out


def lua_string(s: str) -> str:
    return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n") + "\""


def write_bodies(path: str, baseline_url: str, distinct: int, max_tokens: int, seed: int) -> None:
    """Lua table of {body, expected}: a third stream, the rest do not."""
    lines = ["return {"]
    for i, p in enumerate(prompts(distinct, seed)):
        expected = complete(baseline_url, p, max_tokens)["choices"][0]["text"]
        body = {"prompt": p, "max_tokens": max_tokens, "stream": i % 3 == 1}
        lines.append(f"  {{body = {lua_string(json.dumps(body))}, expected = {lua_string(json.dumps(expected)[1:-1])}}},")
    lines.append("}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def wrk(url: str, bodies: str, requests: int, threads: int, connections: int, out_path: str) -> tuple[str, float]:
    """Runs wrk until every thread answered its share; returns its output and the seconds taken."""
    done_dir = tempfile.mkdtemp(prefix="wrk-done-")
    env = dict(os.environ, KVFERRY_LOAD_BODIES=bodies, KVFERRY_LOAD_REQUESTS=str(requests),
               KVFERRY_LOAD_THREADS=str(threads), KVFERRY_LOAD_DONE_DIR=done_dir)
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", "900s", "--timeout", "60s",
           "--latency", "-s", os.path.join(os.path.dirname(os.path.abspath(__file__)), "completions.lua"), url]
    log("$ " + " ".join(cmd))
    started = time.monotonic()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None and len(os.listdir(done_dir)) < threads:
            time.sleep(0.1)
        seconds = time.monotonic() - started
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(60)
    with open(out_path) as f:
        return f.read(), seconds


def parse_load(text: str) -> dict:
    out: dict = {}
    for line in text.splitlines():
        if line.startswith("LOAD "):
            for kv in line.split()[1:]:
                if "=" in kv:
                    k, v = kv.split("=")
                    out[k] = float(v) if "." in v else int(v)
    return out


def disconnecting_clients(router_url: str, count: int, seed: int, stop: threading.Event) -> dict:
    """Streams and hangs up after the first event, as an impatient client does."""
    u = urllib.parse.urlparse(router_url)
    done = {"started": 0, "cut": 0}
    rnd = random.Random(seed)
    for i in range(count):
        if stop.is_set():
            break
        p = [rnd.randrange(1, 250) for _ in range(rnd.choice([50, 300, 600]))]
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        try:
            c.request("POST", "/v1/completions", json.dumps({"prompt": p, "max_tokens": 300, "stream": True}),
                      {"Content-Type": "application/json", "X-Request-Id": f"gone-{i}"})
            r = c.getresponse()
            done["started"] += 1
            if r.status == 200 and r.read(6) == b"data: ":
                done["cut"] += 1
        except OSError:
            pass
        finally:
            c.close()
        time.sleep(0.05)
    return done


def router_overhead(router_url: str, engines: list, seed: int, concurrency: int, n: int,
                    max_tokens: int) -> dict:
    """p50/p99 of the same non-streaming requests through the router and sent directly as the
    router sends them (WRITE: P's and D's legs together), alternating rounds to share drift."""
    ps = [e for e in engines if e.stats()["role"] == "prefill"]
    ds = [e for e in engines if e.stats()["role"] == "decode"]
    ids = {e.name: e.stats()["engine_id"] for e in ps + ds}
    bodies = prompts(max(n // 4, 8), seed + 1)
    counter = iter(range(10 ** 9))
    lock = threading.Lock()

    def via_router(p: list[int]) -> None:
        complete(router_url, p, max_tokens, timeout=120)

    def direct(p: list[int]) -> None:
        with lock:
            k = next(counter)
        pe, de = ps[k % len(ps)], ds[(k // len(ps)) % len(ds)]
        legs_straight(pe.url, de.url, p, max_tokens, mode="write", p_id=ids[pe.name], d_id=ids[de.name],
                      transfer_id=f"direct-{k}-{time.monotonic_ns()}")

    def timed(fn, count: int, concurrency: int) -> list[float]:
        out: list[float] = []
        todo = iter(range(count))

        def worker() -> None:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                t0 = time.monotonic()
                fn(bodies[i % len(bodies)])
                with lock:
                    out.append((time.monotonic() - t0) * 1000)

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return out

    out: dict = {}
    # One client at a time shows the router's own cost; the load run's concurrency adds what
    # its CPU time costs the engines sharing the machine.
    for c, tag in ((1, "c1_"), (concurrency, "")):
        nonlocal_c = c
        router_ms: list[float] = []
        direct_ms: list[float] = []
        for _ in range(2):
            router_ms += timed(via_router, n // 2, nonlocal_c)
            direct_ms += timed(direct, n // 2, nonlocal_c)
        out.update({f"{tag}overhead_requests_each_way": len(router_ms), f"{tag}concurrency": c,
                    f"{tag}router_p50_ms": pct(router_ms, 0.5), f"{tag}router_p99_ms": pct(router_ms, 0.99),
                    f"{tag}direct_p50_ms": pct(direct_ms, 0.5), f"{tag}direct_p99_ms": pct(direct_ms, 0.99),
                    f"{tag}p50_ratio_router_over_direct": round(pct(router_ms, 0.5) / pct(direct_ms, 0.5), 3),
                    f"{tag}p99_ratio_router_over_direct": round(pct(router_ms, 0.99) / pct(direct_ms, 0.99), 3)})
    return out


def prometheus(wd: str, targets: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cfg = os.path.join(wd, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: kvferry\n    metrics_path: /metrics\n"
                "    static_configs:\n      - targets: [" + ", ".join(f"'{t}'" for t in targets) + "]\n")
    proc = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={wd}/tsdb",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=open(os.path.join(wd, "prometheus.log"), "w"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def check_dashboard(prom_url: str, dashboard: str) -> list[tuple[str, int]]:
    """Runs every PromQL query of the dashboard; returns (query, series with data)."""
    with open(dashboard) as f:
        d = json.load(f)
    results = []
    for panel in d["panels"]:
        for t in panel["targets"]:
            q = urllib.parse.urlencode({"query": t["expr"]})
            with urllib.request.urlopen(f"{prom_url}/api/v1/query?{q}", timeout=30) as r:
                body = json.loads(r.read())
            series = [s for s in body["data"]["result"] if s["value"][1] not in ("NaN",)]
            results.append((t["expr"], len(series)))
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--distinct", type=int, default=60, help="distinct request bodies wrk cycles through")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--disconnecting", type=int, default=60, help="clients that hang up mid-stream")
    ap.add_argument("--mode", default="write")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--latency-requests", type=int, default=200,
                    help="requests per side of the router-vs-direct latency comparison")
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="kvferry-load-"))
    args = ap.parse_args()
    for tool in ("wrk", "prometheus", "java"):
        if shutil.which(tool) is None:
            log(f"load run: {tool} is not installed (Debian: apt-get install -y wrk prometheus "
                "openjdk-17-jdk-headless)")
            return 2
    wd = args.out
    os.makedirs(wd, exist_ok=True)
    log(f"load run: logs in {wd}")
    names = [("prefill", "p0"), ("prefill", "p1"), ("decode", "d0"), ("decode", "d1")]
    with routed_engines(wd, names, args.mode) as (router, nodes, engines):
        baseline = Engine(wd, "baseline", *GEOMETRY, "--no-connector")
        prom, prom_url = prometheus(wd, [f"127.0.0.1:{router.management_port}"]
                                    + [f"127.0.0.1:{n.cmd[n.cmd.index('--management-port') + 1]}" for n in nodes])
        bodies = os.path.join(wd, "bodies.lua")
        write_bodies(bodies, baseline.url, args.distinct, args.max_tokens, args.seed)
        wait_until_routing(router.url)
        stop = threading.Event()
        cut: dict = {}
        t = threading.Thread(target=lambda: cut.update(disconnecting_clients(router.url, args.disconnecting,
                                                                             args.seed, stop)))
        t.start()
        through_router, router_s = wrk(router.url, bodies, args.requests, args.threads, args.connections,
                                       os.path.join(wd, "wrk-router.txt"))
        stop.set()
        t.join(300)
        log(through_router)
        time.sleep(3)  # two scrapes after the run, well inside the dashboard's 1m windows
        queries = check_dashboard(prom_url, os.path.join(ROOT, "deploy", "grafana", "kvferry-dashboard.json"))
        for q, n in queries:
            log(f"PROMQL series={n} {q}")
        settled = {e.name: settle(e, 120) for e in engines}
        leaked = {name: s["num_blocks"] - s["free_blocks"] for name, s in settled.items()}
        for name, s in settled.items():
            log(f"ENGINE {name} {json.dumps(s)}")
        # The router's added latency: the same requests, the same concurrency, sent through the
        # router and sent as the router would (P's and D's legs straight to the engines).
        added = router_overhead(router.url, engines, args.seed, args.connections, args.latency_requests,
                                args.max_tokens)
        log("OVERHEAD " + json.dumps(added))
        r = parse_load(through_router)
        result = {
            "requests": args.requests, "mode": args.mode, "router_seconds": round(router_s, 1),
            "answered": r.get("answered"), "mismatches": r.get("mismatches"),
            "http_errors": r.get("http_errors"), "socket_errors": r.get("socket_errors"),
            "disconnecting_clients": cut, "leaked_blocks": leaked,
            "dashboard_queries_with_data": sum(1 for _, n in queries if n > 0),
            "dashboard_queries": len(queries),
            "wrk_p50_ms": r.get("p50"), "wrk_p99_ms": r.get("p99"),
            "wrk_requests_per_s": round(args.requests / router_s, 2),
            **added,
        }
        ok = (result["mismatches"] == 0 and result["http_errors"] == 0 and all(v == 0 for v in leaked.values())
              and result["dashboard_queries_with_data"] == result["dashboard_queries"]
              and (result["answered"] or 0) >= args.requests)
        result["passed"] = ok
        log("LOAD-RESULT " + json.dumps(result))
        prom.terminate()
        baseline.stop()
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
