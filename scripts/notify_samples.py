#!/usr/bin/env python3
"""When a notify run's slow round trips happened: reads the file written by
`-Dkvferry.notify.samples-file=F` (or F.gz) and prints p50/p99, the values above 0.8x p99 per
100 ms of the measured window, how many of them came right after another, and the slowest ten.

usage: scripts/notify_samples.py FILE [FILE ...]
"""
import gzip
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = [line.strip().split(",") for line in f if line[:1].isdigit()]
    return [int(r[0]) for r in rows], [float(r[1]) for r in rows]


def percentile(sorted_values, p):
    """The bench's own percentile (Samples.percentile: nearest rank, no interpolation), so this
    script's p50 and p99 are the figures the bench printed for the same samples."""
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p / 100))]


def main(paths):
    for path in paths:
        sent, us = load(path)
        ordered = sorted(us)
        p99 = percentile(ordered, 99)
        slow = [i for i, v in enumerate(us) if v > 0.8 * p99]
        window_ms = (sent[-1] - sent[0]) / 1e6
        bins = [0] * (int(window_ms // 100) + 1)
        for i in slow:
            bins[int((sent[i] - sent[0]) / 1e6 // 100)] += 1
        after_another = sum(1 for a, b in zip(slow, slow[1:]) if b == a + 1)
        print(f"{path}: {len(us)} round trips over {window_ms:.0f} ms; p50 {percentile(ordered, 50):.1f} us, "
              f"p99 {p99:.1f} us")
        print(f"  above 0.8x p99: {len(slow)}, of them right after another: {after_another}")
        print(f"  per 100 ms: {bins}")
        print(f"  slowest ten (us): {[round(v, 1) for v in ordered[-10:]]}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
