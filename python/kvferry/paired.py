"""Estimates for timings taken on a noisy host.

The GPU machine's host time for the same work moves by more than kvferry's time-to-first-token
goal between minutes (docs/gpu.md), so a difference of two medians taken apart says little. Here
each repetition's "with" and "without" run back to back and are differenced first; the estimate is
the median of those differences with a percentile-bootstrap confidence interval, and a goal is
called met or missed only when the whole interval is on one side of it.
"""

from __future__ import annotations

import random
import statistics
from typing import Sequence

DEFAULT_LEVEL = 0.95
DEFAULT_RESAMPLES = 4000


def median_ci(values: Sequence[float], level: float = DEFAULT_LEVEL, resamples: int = DEFAULT_RESAMPLES,
              seed: int = 0) -> tuple[float, float, float]:
    """The median of ``values`` and a ``level`` percentile-bootstrap interval around it.

    Seeded, so a report can be recomputed from its samples. One value gives an interval of width
    zero; none is an error."""
    if not values:
        raise ValueError("no values to estimate from")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    xs = list(values)
    mid = statistics.median(xs)
    rng = random.Random(seed)
    n = len(xs)
    medians = sorted(statistics.median(rng.choices(xs, k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    lo = medians[int(tail * (resamples - 1))]
    hi = medians[int((1.0 - tail) * (resamples - 1) + 0.5)]
    return mid, lo, hi


def verdict(low: float, high: float, goal: float) -> str:
    """``met`` when the interval lies at or below ``goal``, ``NOT met`` when it lies above it, else
    ``undecided``: the samples cannot tell."""
    if low > high:
        raise ValueError(f"interval [{low}, {high}] is empty")
    if high <= goal:
        return "met"
    if low > goal:
        return "NOT met"
    return "undecided"


def estimate(values: Sequence[float], goal: float | None = None, level: float = DEFAULT_LEVEL,
             seed: int = 0) -> dict:
    """``values`` summarized: median, interval, the values themselves (for the report, as
    ``diffs``) and, given a goal, the verdict."""
    xs = list(values)
    mid, lo, hi = median_ci(xs, level=level, seed=seed)
    out = {"median": mid, "ci_low": lo, "ci_high": hi, "level": level, "n": len(xs), "diffs": xs}
    if goal is not None:
        out["goal"] = goal
        out["verdict"] = verdict(lo, hi, goal)
    return out


def paired(with_: Sequence[float], without: Sequence[float], goal: float | None = None,
           level: float = DEFAULT_LEVEL, seed: int = 0) -> dict:
    """The per-repetition differences ``with_[i] - without[i]``, as :func:`estimate` gives them."""
    if len(with_) != len(without):
        raise ValueError(f"unpaired samples: {len(with_)} with, {len(without)} without")
    return estimate([a - b for a, b in zip(with_, without)], goal, level, seed)


def describe(est: dict, unit: str = "ms") -> str:
    """One line: ``3.210 ms [95% CI 1.002, 5.870], n=25`` and the verdict when there is one."""
    text = (f"{est['median']:.3f} {unit} [{est['level'] * 100:.0f}% CI {est['ci_low']:.3f}, "
            f"{est['ci_high']:.3f}], n={est['n']}")
    if "verdict" in est:
        text += f"; goal <= {est['goal']:.3f} {unit}: {est['verdict']}"
    return text
