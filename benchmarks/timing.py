"""Interleaved A/B timing and a description of the machine it ran on.

Every comparison runs its cases in one run, round-robin (a case may live in a
process of its own, see benchmarks/isolated.py): round ``r`` runs
each case once, in forward order on even rounds and reversed on odd rounds, so
a slow spell of the machine (another process, a frequency change) lands on
every case alike. Warm-up rounds run first and are not recorded. The result
of a case is the median of its per-round rates.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch



@dataclass
class Samples:
    """Per-round (seconds, work) of one case; work is whatever the rate counts (tokens, bytes)."""

    seconds: list[float] = field(default_factory=list)
    work: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # this process's CPU time per round

    def rates(self) -> list[float]:
        return [w / s for w, s in zip(self.work, self.seconds)]

    @property
    def rate(self) -> float:
        """Median over rounds of work per second."""
        return statistics.median(self.rates())

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    def cpu_share(self, threads: int) -> float:
        """Median share of ``threads`` cores this process got while the case ran: near 1
        on a quiet machine, lower when other processes took the cores."""
        return statistics.median(c / (s * threads) for c, s in zip(self.cpu_seconds, self.seconds))

    def spread(self) -> tuple[float, float]:
        """(min, max) of the per-round rates."""
        rates = self.rates()
        return min(rates), max(rates)


Case = Callable[[], float]
"""One unit of a case's work; returns how much work it did (tokens, bytes, 1 for one call).
A case with a ``timed()`` method instead (benchmarks.isolated.RemoteCase) runs in
another process and returns its own (seconds, work, CPU seconds)."""


def _cpuinfo(key: str) -> str:
    """The first value of ``key`` in /proc/cpuinfo ("model name"), "" where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def for_at_least(step: Case, seconds: float) -> Case:
    """A case that repeats ``step`` until ``seconds`` have passed (once at least) and
    returns the work of all its runs. A round of a fast training step then spans
    several steps, about as long as the slower side's one: a stall of a shared
    machine (its hypervisor's, which no load figure here sees) weighs on both alike,
    where a single short step would take it whole."""
    def run():
        start, work = time.perf_counter(), step()
        while time.perf_counter() - start < seconds:
            work += step()
        return work
    return run


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleave(cases: dict[str, Case], repeats: int, warmup: int,
               device: torch.device = torch.device("cpu"), settle: float = 0.0) -> dict[str, Samples]:
    """Run ``cases`` round-robin: ``warmup`` unrecorded rounds, then ``repeats`` recorded ones.
    ``settle``: seconds of idle before each case, so threads the previous case left
    spinning (OpenMP's, onnxruntime's) are asleep before the next one starts."""
    samples = {name: Samples() for name in cases}
    names = list(cases)
    for round_ in range(warmup + repeats):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            if settle:
                time.sleep(settle)
            timed = getattr(cases[name], "timed", None)
            if timed is not None:  # runs in a process of its own and times itself there
                elapsed, work, cpu = timed()
            else:
                synchronize(device)
                start, cpu = time.perf_counter(), time.process_time()
                work = cases[name]()
                synchronize(device)
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            if round_ >= warmup:
                samples[name].seconds.append(elapsed)
                samples[name].work.append(float(work))
                samples[name].cpu_seconds.append(cpu)
    return samples


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: say so rather than fail the run
        return "not installed"


def machine_info(device: torch.device) -> dict[str, str]:
    """What the numbers depend on: CPU, cores, thread count, library versions, load."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {
        "CPU": cpu_model(),
        "cores available": str(cores),
        "torch threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "onnxruntime": _version("onnxruntime"),
        "tokenizers": _version("tokenizers"),
        "python": platform.python_version(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["GPU"] = torch.cuda.get_device_name(device)
    return info


def load_average() -> str:
    """The 1-minute load average (other processes competing for the cores)."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "n/a"


class OtherLoad:
    """How much of the machine other processes used while a section ran (Linux
    /proc/stat): their CPU time over (wall time x cores); this process and the
    children it has joined are not "other". Near 0 on a quiet
    machine; the numbers of a section run beside a busy process understate
    both sides, the many-small-op side (pretextual's) the most."""

    def __init__(self):
        self.start = self._snapshot()

    @staticmethod
    def _snapshot() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [float(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        busy = (sum(fields[:8]) - idle) / ticks  # user..steal, without guest (already in user)
        t = os.times()  # children: the ended processes of benchmarks.isolated, once joined
        return busy, t.user + t.system + t.children_user + t.children_system, time.monotonic()

    def share(self) -> float | None:
        end = self._snapshot()
        if self.start is None or end is None:
            return None
        busy, own, wall = (e - s for e, s in zip(end, self.start))
        cores = os.cpu_count() or 1
        return max(0.0, (busy - own) / (wall * cores)) if wall > 0 else None

