#!/usr/bin/env python3
"""Where the engine port's time in a step goes, per client op: runs kvferry.bench_port's step
against a running node with each PortClient op timed on the client side.

usage: scripts/port-step-profile.py SOCKET [--requests N] [--new K] [--steps S]
  (start the node first: ./kvferry node --role prefill --engine-id bp --engine port --engine-socket SOCKET)
A one-way op's figure is only its send; what the node does for it shows in the next round trip.
"""
import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from kvferry import bench_port  # noqa: E402
from kvferry.port import PortClient  # noqa: E402

OPS = ["get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
       "request_finished", "bind_connector_metadata", "start_load_kv", "save_kv_layer",
       "wait_for_save", "get_finished"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("socket")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    times = collections.defaultdict(list)
    for name in OPS:
        def timed(self, *args, _f=getattr(PortClient, name), _n=name, **kw):
            t0 = time.perf_counter_ns()
            try:
                return _f(self, *args, **kw)
            finally:
                times[_n].append((time.perf_counter_ns() - t0) / 1000)
        setattr(PortClient, name, timed)
    result = bench_port.run(a.socket, a.requests, a.new, 32, a.steps, 500)
    print(json.dumps(result))
    for name in OPS:
        v = times[name]
        if v:
            print(f"{name:28s} calls {len(v):6d}  median {statistics.median(v):8.1f} us  "
                  f"mean {statistics.mean(v):8.1f} us  total {sum(v) / 1000:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
