#!/usr/bin/env python3
"""Where the real-model check's time went, from its report.json (scripts/gpu-model.sh --json):
per mode, the median and max of each phase of a completed request, and D's 64 decode steps
through the engine port against the same engine without kvferry in the same process."""

import json
import statistics
import sys


def main(path: str) -> None:
    report = json.load(open(path))
    for m in report["modes"]:
        done = [r for r in m["requests"] if "compare_ms" in r]
        if not done:
            continue
        print(f"{m['mode']}: {len(done)} completed requests")
        phases: dict[str, list[float]] = {}
        for r in done:
            for k, v in list(r.get("phase_ms", {}).items()) + list(r["compare_ms"].items()):
                phases.setdefault(k, []).append(v)
        for k, v in phases.items():
            print(f"  {k:<20} median {statistics.median(v):9.1f} ms   max {max(v):9.1f} ms")
        ratios = sorted(r["compare_ms"]["d_decode"] / r["compare_ms"]["baseline_decode"] for r in done)
        slow = sum(1 for x in ratios if x > 2)
        print(f"  D's decode through the port / the same decode without kvferry: median "
              f"{statistics.median(ratios):.2f}x, max {ratios[-1]:.2f}x; more than 2x in {slow} of {len(ratios)}")


if __name__ == "__main__":
    main(sys.argv[1])
