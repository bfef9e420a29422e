"""kvferry.paired: the TTFT check's estimate of kvferry's added time (median of paired differences,
bootstrap interval, a verdict that can say the samples cannot tell)."""

from __future__ import annotations

import random

import pytest

from kvferry.paired import describe, median_ci, paired, verdict


def test_a_shift_hidden_by_drift_is_found_by_pairing():
    # The host's speed drifts by far more than the effect between repetitions; each pair shares
    # the drift, so the paired median finds the 1.0 shift that a difference of medians blurs.
    rng = random.Random(7)
    drift = [rng.uniform(0.0, 40.0) for _ in range(25)]
    without = [50.0 + d + rng.gauss(0.0, 0.1) for d in drift]
    with_ = [51.0 + d + rng.gauss(0.0, 0.1) for d in drift]
    est = paired(with_, without, goal=2.0)
    assert 0.9 < est["median"] < 1.1
    assert est["ci_low"] <= est["median"] <= est["ci_high"]
    assert est["ci_high"] - est["ci_low"] < 0.3
    assert est["verdict"] == "met"
    assert est["n"] == 25 and len(est["diffs"]) == 25


def test_the_verdict_says_undecided_when_the_interval_spans_the_goal():
    assert verdict(0.5, 0.9, 1.0) == "met"
    assert verdict(0.5, 1.0, 1.0) == "met"
    assert verdict(1.01, 3.0, 1.0) == "NOT met"
    assert verdict(0.2, 3.0, 1.0) == "undecided"
    with pytest.raises(ValueError, match="empty"):
        verdict(2.0, 1.0, 1.0)


def test_wide_samples_give_a_wide_interval_and_no_verdict():
    rng = random.Random(3)
    with_ = [rng.uniform(-20.0, 22.0) for _ in range(9)]
    est = paired(with_, [0.0] * 9, goal=1.0)
    assert est["ci_high"] - est["ci_low"] > 5.0
    assert est["verdict"] == "undecided"


def test_the_interval_is_reproducible_and_covers_the_median():
    xs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0]
    assert median_ci(xs, seed=11) == median_ci(xs, seed=11)
    mid, lo, hi = median_ci(xs)
    assert mid == 4.0
    assert min(xs) <= lo <= mid <= hi <= max(xs)
    assert median_ci([2.5]) == (2.5, 2.5, 2.5)


def test_bad_input_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="no values"):
        median_ci([])
    with pytest.raises(ValueError, match="level"):
        median_ci([1.0], level=1.0)
    with pytest.raises(ValueError, match="resamples"):
        median_ci([1.0], resamples=0)
    with pytest.raises(ValueError, match="unpaired"):
        paired([1.0, 2.0], [1.0])


def test_describe_reads_as_one_line():
    est = paired([2.0, 3.0, 4.0], [1.0, 1.0, 1.0], goal=1.5)
    line = describe(est)
    assert line.startswith("2.000 ms [95% CI ")
    assert "n=3" in line and "goal <= 1.500 ms: " in line
    assert "goal" not in describe(paired([1.0], [0.5]))


def test_the_ttft_rows_estimates_difference_each_repetition_against_its_own_without_run():
    from kvferry.gpu_check import _paired_estimates

    # Three repetitions in seconds (dis, base) and the split in milliseconds, as run_ttft collects
    # them: disaggregated = P's prefill + KV after P's end + D's first token; the matched "without"
    # is P's prefill in P's process + the first token in D's (here 29, 55, 43 ms).
    dis, base = [0.030, 0.060, 0.045], [0.028, 0.057, 0.044]
    parts = {"p_prefill_ms": [20.0, 45.0, 30.0], "p_process_baseline_prefill_ms": [19.5, 44.0, 29.0],
             "kv_after_p_end_ms": [0.5, 1.0, 0.5], "d_first_token_ms": [9.5, 14.0, 14.5],
             "baseline_first_token_ms": [9.5, 11.0, 14.0]}
    est = _paired_estimates(dis, base, parts, goal_ms=0.5)
    d_process = est["added, without = D's process"]
    assert d_process["diffs"] == pytest.approx([2.0, 3.0, 1.0])
    assert d_process["median"] == pytest.approx(2.0)
    assert d_process["verdict"] == "NOT met"
    assert est["added, without = P's prefill in P's process + first token in D's"]["diffs"] == pytest.approx([1.0, 5.0, 2.0])
    assert est["P's prefill, added"]["diffs"] == pytest.approx([0.5, 1.0, 1.0])
    assert est["KV in place after P's prefill"]["median"] == pytest.approx(0.5)
    assert est["D's first token, added"]["diffs"] == pytest.approx([0.0, 3.0, 0.5])
    assert "verdict" not in est["P's prefill, added"]
