"""gpu_check's engine processes: how many intra-op threads they get (vLLM's rule: $OMP_NUM_THREADS,
else 1), and the profiler's list of the single slowest operator calls."""

from __future__ import annotations

import pytest

from kvferry.gpu_check import _longest_calls, _torch_threads


def test_one_thread_when_nothing_asks(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert _torch_threads(None) == 1


def test_the_environment_then_the_flag(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert _torch_threads(None) == 6
    assert _torch_threads(3) == 3


def test_a_count_that_is_no_number_is_refused_by_its_name(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "six")
    with pytest.raises(SystemExit, match="OMP_NUM_THREADS must be a whole number, got 'six'"):
        _torch_threads(None)


@pytest.mark.parametrize("env", ["0", "-2"])
def test_a_count_below_one_from_the_environment_is_refused(monkeypatch, env):
    monkeypatch.setenv("OMP_NUM_THREADS", env)
    with pytest.raises(SystemExit, match=f"OMP_NUM_THREADS .* at least 1, got {env}"):
        _torch_threads(None)


def test_a_flag_below_one_is_refused(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with pytest.raises(SystemExit, match="--torch-threads .* at least 1, got 0"):
        _torch_threads(0)


def test_the_longest_calls_name_the_call_and_its_shapes():
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    small, big = torch.arange(16), torch.arange(1 << 20)
    small.flip(0)  # the op's first call pays one-time costs; not in the profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        small.flip(0)
        big.flip(0)
        small.flip(0)
    text = _longest_calls(p.events(), 1)
    lines = text.splitlines()
    assert len(lines) == 2, text
    # The one slowest call is the second flip (the big one), numbered among the calls of its name.
    assert "aten::flip #2" in lines[1] and str(1 << 20) in lines[1], text


def test_no_calls_is_said_so():
    assert _longest_calls([], 5) == "no operator calls recorded"
