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
        split = [r["decode_split_ms"] for r in done if "decode_split_ms" in r]
        if split:
            for name, pick in (("D port calls", lambda x: x["d"]["port_ms"]),
                               ("D forward+argmax", lambda x: x["d"]["compute_ms"]),
                               ("baseline forward+argmax", lambda x: x["baseline"]["compute_ms"])):
                v = [pick(x) for x in split]
                print(f"  decode split: {name:<24} median {statistics.median(v):9.1f} ms   max {max(v):9.1f} ms")
            ops: dict[str, list[float]] = {}
            for r in done:
                for side, per in r.get("d_decode_port_ops", {}).items():
                    for op, (calls, total, longest) in per.items():
                        o = ops.setdefault(f"{side}.{op}", [0, 0.0, 0.0])
                        o[0] += calls
                        o[1] += total
                        o[2] = max(o[2], longest)
            for op, (calls, total, longest) in sorted(ops.items(), key=lambda kv: -kv[1][1]):
                print(f"  D's port op during decode {op:<36} calls {calls:6d}  mean {total / calls * 1e3:9.1f} us"
                      f"  longest {longest:8.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
