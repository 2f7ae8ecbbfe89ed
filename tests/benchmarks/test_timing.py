"""The round-robin timing harness (benchmarks/timing.py)."""

from __future__ import annotations

import time

from benchmarks.timing import for_at_least, interleave


def counting_step(calls: list, seconds: float, work: float):
    def step():
        calls.append(time.perf_counter())
        time.sleep(seconds)
        return work
    return step


def test_for_at_least_repeats_the_step_until_the_time_has_passed_and_sums_its_work():
    calls = []
    case = for_at_least(counting_step(calls, 0.01, 3.0), 0.05)
    start = time.perf_counter()
    work = case()
    elapsed = time.perf_counter() - start
    assert elapsed >= 0.05
    assert len(calls) >= 2  # a 10 ms step cannot fill 50 ms once
    assert work == 3.0 * len(calls)
    # it stops at the first step that ends past the time
    assert calls[-1] - start < 0.05


def test_for_at_least_zero_seconds_runs_the_step_once():
    calls = []
    assert for_at_least(counting_step(calls, 0.0, 2.0), 0.0)() == 2.0
    assert len(calls) == 1


def test_interleave_rates_count_every_step_of_a_repeated_round():
    calls = []
    samples = interleave({"repeated": for_at_least(counting_step(calls, 0.01, 1.0), 0.03)},
                         repeats=3, warmup=1)
    recorded = samples["repeated"]
    assert len(recorded.seconds) == 3
    assert 0 < sum(recorded.work) < len(calls)  # the warm-up round's steps are not recorded
    assert all(w >= 2 for w in recorded.work)
    # one step per 10 ms and a little more (sleep's overshoot), whatever the count per round
    assert 20 < recorded.rate <= 100
