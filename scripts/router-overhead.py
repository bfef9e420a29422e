"""The router's added latency, one client at a time: the same requests sent through `kvferry
router --http-port` and sent as the router sends them (WRITE: P's and D's legs together; READ: P's
leg, then D's with the params P returned), straight to the engines, in alternating rounds so both
sides share the machine's drift. One P node and one D node, a reference engine beside each; the
JVMs with the JVM's default compilers and collector (not the test cluster's fast-start flags).

usage: python3 scripts/router-overhead.py [--mode write|read] [--requests N] [--rounds R]
       [--max-tokens T] [--prompt-tokens P] [--router-jvm-options="-Dx=y ..."]
Prints each round's medians, a PROBES line (p50 ms of one forwarded GET with no engine work,
through the router and straight to D, and of the router's own HTTP server alone, each on fresh
connections and on one kept-alive connection), a CPU line (each process's CPU per timed request,
routed and direct, and the threads the router's JVM started per routed request, from jcmd), then
one OVERHEAD JSON line: p50/p90/p99 per side (ms), the p50 ratio (router / direct) and the p50
difference.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("KVFERRY_JAR", os.path.join(ROOT, "cli", "target", "kvferry.jar"))
sys.path.insert(0, os.path.join(ROOT, "scripts", "load"))
from load_run import legs_straight, pct, routed_engines, wait_until_routing  # noqa: E402
from tests.cluster import complete, jvm_threads_started  # noqa: E402


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (its threads together)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("write", "read"), default="write")
    ap.add_argument("--requests", type=int, default=200, help="timed requests per side")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds the requests are split over")
    ap.add_argument("--warm-up", type=int, default=100, help="untimed requests per side first")
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--router-jvm-options", default="", help="more JVM options for the router alone (space-separated)")
    args = ap.parse_args()
    wd = tempfile.mkdtemp(prefix="kvferry-router-overhead-")
    print(f"router overhead: logs in {wd}", flush=True)
    # The JVMs as in service (the JVM's own compilers and collector), not with the tests' flags.
    with routed_engines(wd, [("prefill", "p0"), ("decode", "d0")], args.mode, in_service=True,
                        router_options=args.router_jvm_options.split()) as (router, nodes, engines):
        p_engine, d_engine = engines
        # Whose CPU each side's requests cost: on a machine with fewer cores than busy processes
        # the router's own CPU is time the engines wait for.
        pids = {"router": router.proc.pid, "p_node": nodes[0].proc.pid, "d_node": nodes[1].proc.pid,
                "p_engine": p_engine.proc.pid, "d_engine": d_engine.proc.pid, "client": os.getpid()}
        p_id, d_id = p_engine.stats()["engine_id"], d_engine.stats()["engine_id"]
        wait_until_routing(router.url)
        rnd = random.Random(11)
        counter = iter(range(10 ** 9))

        def prompt() -> list[int]:
            return [rnd.randrange(1, 250) for _ in range(args.prompt_tokens)]

        def via_router() -> None:
            complete(router.url, prompt(), args.max_tokens)

        def direct() -> None:
            legs_straight(p_engine.url, d_engine.url, prompt(), args.max_tokens, mode=args.mode, p_id=p_id,
                          d_id=d_id, transfer_id=f"direct-{next(counter)}-{time.monotonic_ns()}")

        cpu_ms = {"router": dict.fromkeys(pids, 0.0), "direct": dict.fromkeys(pids, 0.0)}
        # Threads the router's JVM starts per routed request: none once warm (a thread per
        # callback on Pekko's futures was found here; see dev.kvferry.node.PekkoFutures).
        router_threads = {"started": 0, "known": True}

        def timed(fn, count: int, side: str | None = None) -> list[float]:
            # jcmd's attach costs the router CPU: counted outside the CPU window.
            threads_before = jvm_threads_started(router.proc.pid) if side == "router" else None
            before = {k: cpu_s(pid) for k, pid in pids.items()}
            out = []
            for _ in range(count):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
            if side:
                for k, pid in pids.items():
                    cpu_ms[side][k] += (cpu_s(pid) - before[k]) * 1e3
            if side == "router":
                threads_after = jvm_threads_started(router.proc.pid)
                if threads_before is None or threads_after is None:
                    router_threads["known"] = False
                else:
                    router_threads["started"] += threads_after - threads_before
            return out

        timed(via_router, args.warm_up)
        timed(direct, args.warm_up)
        routed: list[float] = []
        straight: list[float] = []
        per_round = max(1, args.requests // args.rounds)
        for r in range(args.rounds):
            a, b = timed(via_router, per_round, "router"), timed(direct, per_round, "direct")
            routed += a
            straight += b
            print(f"round {r + 1}: router p50 {statistics.median(a):.3f} ms, direct p50 {statistics.median(b):.3f} ms",
                  flush=True)
        # Where a leg's time goes: one forwarded GET with no engine work (/v1/models through the
        # router, against straight to D) and the router's own HTTP server alone (its management
        # endpoint, the same Pekko HTTP server code), each on a fresh connection from this client
        # (as the timed requests above) and then all on one kept-alive connection.
        def get(url: str) -> float:
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as r:
                r.read()
            return (time.perf_counter() - t0) * 1e3

        management = f"http://127.0.0.1:{router.management_port}/alive"
        probes = {"models_via_router": router.url + "/v1/models", "models_direct_to_d": d_engine.url + "/v1/models",
                  "router_management_alive": management}
        for url in probes.values():
            for _ in range(args.warm_up):
                get(url)
        probe_ms = {name: round(statistics.median([get(url) for _ in range(args.requests)]), 3)
                    for name, url in probes.items()}

        def kept_alive(url: str) -> float:
            """The same GET again and again on one connection (no connection set up per request)."""
            u = urllib.parse.urlparse(url)
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
            times = []
            try:
                for _ in range(args.warm_up + args.requests):
                    t0 = time.perf_counter()
                    c.request("GET", u.path)
                    c.getresponse().read()
                    times.append((time.perf_counter() - t0) * 1e3)
            finally:
                c.close()
            return round(statistics.median(times[args.warm_up:]), 3)

        probe_ms.update({f"{name}_kept_alive": kept_alive(url) for name, url in probes.items()})
        print("PROBES (p50 ms) " + json.dumps(probe_ms), flush=True)
        print("CPU (ms per timed request, by process) " + json.dumps(
            {side: {k: round(v / len(routed), 3) for k, v in per.items()} | {"all": round(sum(per.values()) / len(routed), 3)}
             for side, per in cpu_ms.items()}
            | {"router_threads_started_per_routed_request":
               round(router_threads["started"] / len(routed), 2) if router_threads["known"] else None}),
            flush=True)
        out = {"mode": args.mode, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
               "requests_each_way": len(routed),
               "router_p50_ms": pct(routed, 0.5, 3), "router_p90_ms": pct(routed, 0.9, 3), "router_p99_ms": pct(routed, 0.99, 3),
               "direct_p50_ms": pct(straight, 0.5, 3), "direct_p90_ms": pct(straight, 0.9, 3),
               "direct_p99_ms": pct(straight, 0.99, 3)}
        out["p50_ratio_router_over_direct"] = round(out["router_p50_ms"] / out["direct_p50_ms"], 3)
        out["p50_added_ms"] = round(out["router_p50_ms"] - out["direct_p50_ms"], 3)
        print("OVERHEAD " + json.dumps(out), flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
