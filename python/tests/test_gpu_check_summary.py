"""kvferry.gpu_check's summary tells a late copy from a baseline that is not P's work (it needs no
torch: the summary reads the report's plain values)."""

from __future__ import annotations

from kvferry.gpu_check import summarize


def _request(name: str, d_kv_still_p: bool = True, baseline_kv_is_p: bool = True, first_equal: bool = True) -> dict:
    return {"request": name, "kind": "plain", "d_hit": 0, "kv_equal": True, "steps": 5,
            "first_logits_bitwise_equal": first_equal, "tokens_equal": True, "divergence": None,
            "cache_after_decode": {"compared": True, "equal": d_kv_still_p and baseline_kv_is_p, "positions": 10,
                                   "first_differing_position": 0, "first_differing_part": "transferred",
                                   "differing_positions": 1, "transferred_positions_differing": 1,
                                   "d_kv_still_p": d_kv_still_p, "baseline_kv_is_p": baseline_kv_is_p}}


def _report(*requests: dict) -> dict:
    ends = {"P": {"free_blocks": 8, "num_blocks": 8}, "D": {"free_blocks": 8, "num_blocks": 8}}
    return {"modes": [{"mode": "write", "requests": list(requests), "blocks_at_end": ends}]}


def test_every_check_passing_is_ok_and_names_no_request():
    s = summarize(_report(_request("a"), _request("b")))
    assert s["all_ok"]
    assert any("D's transferred KV changed after the check in 0" in line for line in s["lines"])
    assert not any("computed other KV than P" in line for line in s["lines"])


def test_a_late_copy_fails_the_run_and_is_named():
    s = summarize(_report(_request("a"), _request("late", d_kv_still_p=False, first_equal=False)))
    assert not s["all_ok"]
    assert any("D's transferred KV changed after the check in 1: late" in line for line in s["lines"])
    assert not any("computed other KV than P" in line for line in s["lines"])


def test_a_baseline_unlike_p_is_named_apart_from_a_late_copy_and_still_fails():
    s = summarize(_report(_request("a"), _request("odd", baseline_kv_is_p=False, first_equal=False)))
    assert not s["all_ok"]  # the bitwise check could not hold: the run does not pass
    assert any("D's transferred KV changed after the check in 0" in line for line in s["lines"])
    assert any("computed other KV than P for the same chunks in 1: odd" in line for line in s["lines"])


def test_a_ttft_run_without_check_requests_passes_and_a_stopped_one_fails():
    # --prompts 0 (TTFT only): no request planned is not a failure; a TTFT run that raised is.
    assert summarize(_report())["all_ok"]
    s = summarize({**_report(), "ttft_error": "ttft-warm-write-0: engine left the cluster"})
    assert not s["all_ok"]
    assert "TTFT FAILED: ttft-warm-write-0: engine left the cluster" in s["lines"]
    assert not summarize({**_report(), "modes": [{**_report()["modes"][0], "requests": [
        {"request": "x", "kind": "plain", "error": "timeout"}]}]})["all_ok"]
