"""gpu_check's count of device allocations around a timed step: a missing count is never read
as none (the difference is -1 then), and the CPU makes none."""

from __future__ import annotations

from types import SimpleNamespace

from kvferry.gpu_check import _allocs_between, _device_allocs


def test_a_difference_of_two_readings():
    assert _allocs_between(3, 5) == 2
    assert _allocs_between(7, 7) == 0


def test_a_missing_reading_gives_minus_one_not_zero():
    assert _allocs_between(None, 5) == -1
    assert _allocs_between(5, None) == -1
    assert _allocs_between(None, None) == -1


def test_the_cpu_makes_no_device_allocations():
    assert _device_allocs(SimpleNamespace(type="cpu")) == 0
