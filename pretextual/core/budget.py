"""Training budgets other than a step count: trainer.max_tokens and trainer.max_time, so
that two mixes or architectures can be compared at equal tokens or equal time.

A token budget is exact: the run stops at the first step whose tokens (non-padding,
over all processes, as metrics.jsonl counts them) reach it, and its schedules are sized
to the steps that takes, estimated from the first batches. A time budget stops the run
at the first step that ends past it (metrics.jsonl's clock, continued across resumes),
and the schedules' length is re-estimated from the measured rate as the run goes.
"""

from __future__ import annotations

import math
import re

from pretextual.errors import ConfigError

MEASURE_BATCHES = 64
"""Micro-batches whose mean gives the tokens of a step."""
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text) -> float:
    """trainer.max_time in seconds: a number of seconds, or 90s, 45m, 2.5h, 1d."""
    found = _DURATION.match(str(text))
    if not found or float(found.group(1)) <= 0:
        raise ConfigError(f"trainer.max_time: expected a positive duration such as 3600, 45m "
                          f"or 2h, got {text!r}")
    return float(found.group(1)) * _SECONDS[found.group(2)]


def tokens_per_step(batches, grad_accum_steps: int, world_size: int) -> float:
    """Mean non-padding tokens of an optimizer step over all processes, from the first
    MEASURE_BATCHES micro-batches of the stream."""
    n = min(MEASURE_BATCHES, batches.epoch_length(0))
    tokens = sum(int(batches[k]["attention_mask"].sum()) for k in range(n))
    return tokens / n * grad_accum_steps * world_size


def steps_for_tokens(max_tokens: int, per_step: float) -> int:
    """The steps a token budget takes at ``per_step`` tokens a step (at least one)."""
    return max(1, math.ceil(max_tokens / per_step))


class TimeBudget:
    """Where a time budget stands: whether it is spent, and the step count the schedule
    should be sized to, from the rate measured since this session's training began."""

    def __init__(self, seconds: float, start_step: int, start_time: float, guess: int):
        self.seconds, self.start_step, self.start_time = seconds, start_step, start_time
        self.planned = max(guess, start_step + 1)

    def spent(self, now: float) -> bool:
        return now >= self.seconds

    def plan(self, step: int, now: float) -> int:
        """The estimated last step: the steps so far plus those the time left allows at
        the rate so far; never before the next step while time is left."""
        done, elapsed = step - self.start_step, now - self.start_time
        if done > 0 and elapsed > 0:
            left = max(0.0, self.seconds - now) * done / elapsed
            self.planned = max(step + 1, step + int(left))
        return self.planned
