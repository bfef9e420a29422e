"""D's READ start stamps on this host: one P node and one D node (READ, `-Dkvferry.stamps=true`), a
reference engine beside each, and N requests sent as the router sends them (P's leg, then D's with
the params P returned), one at a time; the JVMs start as the tests' do (C1 only, the serial
collector). Prints the medians of D's stamps (scripts/read-stamps.py):
each stage of a transfer's start in us after the load was handed to the workers.

usage: python3 scripts/read-stamps-host.py [--requests N] [--prompt-tokens P]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "scripts", "load"))
os.environ.setdefault("KVFERRY_JAR", os.path.join(ROOT, "cli", "target", "kvferry.jar"))
from load_run import GEOMETRY, legs_straight  # noqa: E402
from tests.cluster import Engine, Node  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    args = ap.parse_args()
    wd = tempfile.mkdtemp(prefix="kvferry-read-stamps-")
    stamps = {"kvferry.stamps": "true"}
    p = Node(wd, "prefill", engine_id="p0", modes="read", config=stamps)
    d = Node(wd, "decode", engine_id="d0", modes="read", seed_port=p.port, config=stamps)
    engines: list[Engine] = []
    try:
        p.wait_ready()
        d.wait_ready()
        for node in (p, d):
            engines.append(Engine(wd, f"{node.role}-read", *GEOMETRY, "--socket", node.socket,
                                  "--role", node.role, "--mode", "read"))
        p_engine, d_engine = engines
        p_id, d_id = p_engine.stats()["engine_id"], d_engine.stats()["engine_id"]
        rnd = random.Random(3)
        for i in range(args.requests):
            prompt = [rnd.randrange(1, 250) for _ in range(args.prompt_tokens)]
            legs_straight(p_engine.url, d_engine.url, prompt, 1, mode="read", p_id=p_id, d_id=d_id,
                          transfer_id=f"stamps-{i}-{time.monotonic_ns()}")
    finally:
        for e in engines:
            e.stop()
        p.stop()
        d.stop()
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "read-stamps.py"), d.log],
                         capture_output=True, text=True, check=True).stdout
    print(out, end="", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
