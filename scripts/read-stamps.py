#!/usr/bin/env python3
"""Medians of D's READ start stamps (ReadStamps, -Dkvferry.stamps=true) from node logs.

usage: scripts/read-stamps.py [--match REGEX] LOG [LOG ...]
Each "read start stamps" line gives, per transfer, each stage in us after the load was handed to
the workers (the scheduler's update_state_after_alloc with reads at admission, else the worker's
start_load_kv); prints the count and each stage's median and p90 over the lines whose transfer id
matches REGEX (default: every line).
"""
import argparse
import re
import statistics

ap = argparse.ArgumentParser()
ap.add_argument("--match", default="")
ap.add_argument("logs", nargs="+")
a = ap.parse_args()
pattern = re.compile(a.match)
stages: dict[str, list[float]] = {}
count = 0
for path in a.logs:
    with open(path, errors="replace") as f:
        for line in f:
            if "read start stamps" not in line:
                continue
            rest = line.split("transfer ", 1)[1]
            if not pattern.search(rest.split(" ", 1)[0]):
                continue
            count += 1
            for name, value in re.findall(r" (\w+)=([-\d.]+)", rest):
                if value != "-":
                    stages.setdefault(name, []).append(float(value))
print(f"transfers: {count}" + (f" (ids matching {a.match})" if a.match else ""))
for name, values in stages.items():
    v = sorted(values)
    print(f"  {name:14s} median {statistics.median(v):9.1f} us   p90 {v[int(0.9 * (len(v) - 1))]:9.1f} us   n={len(v)}")
