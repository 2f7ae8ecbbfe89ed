"""benchmarks.isolated: a side of a comparison in a process of its own, driven by interleave."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.isolated import Isolated  # noqa: E402
from benchmarks.timing import interleave  # noqa: E402


def side(busy_seconds: float, fail_building: bool = False) -> dict:
    """A side the tests build in a child: ``busy`` spins for ``busy_seconds`` of CPU."""
    if fail_building:
        raise ValueError("cannot build this side")
    import torch

    def busy():
        start = time.process_time()
        while time.process_time() - start < busy_seconds:
            pass
        return 7

    return {"busy": busy, "pid": os.getpid, "threads": torch.get_num_threads,
            "broken": lambda: 1 / 0}


FACTORY = f"{__name__}:side"


def test_cases_run_in_another_process_and_time_themselves():
    with Isolated(FACTORY, 0.05, threads=1) as remote:
        assert remote.names == ["busy", "pid", "threads", "broken"]
        assert remote.call("pid") != os.getpid()
        assert remote.call("threads") == 1  # the thread count it was given
        seconds, work, cpu = remote.case("busy").timed()
        assert work == 7.0
        assert 0.05 <= cpu <= seconds + 0.01  # measured in the child, around the case only
        # interleave takes the child's own measurement, alongside a local case
        samples = interleave({"remote": remote.case("busy"), "local": lambda: 3}, repeats=3,
                             warmup=1, settle=0.01)
    assert samples["remote"].work == [7.0] * 3 and samples["local"].work == [3.0] * 3
    assert all(s >= 0.05 for s in samples["remote"].cpu_seconds)
    assert not remote.process.is_alive()


def test_failures_in_the_child_reach_the_parent_with_its_traceback():
    with pytest.raises(RuntimeError, match="cannot build this side"):
        Isolated(FACTORY, 0.0, True, threads=1)
    with Isolated(FACTORY, 0.0, threads=1) as remote:
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            remote.case("broken").timed()
        assert remote.call("threads") == 1  # still serving after a failed case
        with pytest.raises(KeyError, match="missing"):
            remote.case("missing")
