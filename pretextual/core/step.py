"""Pieces of one training step: the forward of the whole mix as one module, reading the
next batch, and tracking non-finite losses on the device."""

from __future__ import annotations

from pathlib import Path

import torch

from pretextual.core import distributed as dist_utils
from pretextual.core.checkpoint import list_checkpoints
from pretextual.core.mix import ObjectiveMix, PretrainingModel
from pretextual.errors import PretextualError, TrainingError


class MixForward(torch.nn.Module):
    """The whole forward of a step (encoder, heads, objectives) as one module, so
    DistributedDataParallel can wrap it and synchronise gradients in backward."""

    def __init__(self, model: PretrainingModel, mix: ObjectiveMix):
        super().__init__()
        self.model, self.mix = model, mix

    def forward(self, batch, step: int):
        return self.mix.loss(self.model, batch, step)


def next_batch(loader):
    """The loader's next batch. One of pretextual's errors raised in a DataLoader worker
    comes back as torch re-raises it, its message the worker's whole traceback: raised
    again here as its last line, the error's own message."""
    try:
        return next(loader)
    except PretextualError as exc:
        text = str(exc)
        if not text.startswith("Caught "):
            raise
        last = text.strip().splitlines()[-1]
        raise type(exc)(last.split(": ", 1)[1] if ": " in last else last) from None


class NonFinite:
    """The first step whose losses were not finite since the last read, kept on the device
    (recording costs no synchronisation), with the names of the losses that were not;
    and what trainer.nonfinite does about it (:meth:`check`)."""

    def __init__(self, device: torch.device, policy: str = "stop", max_skipped: int = 0):
        self.device, self.keys = device, None
        self.policy, self.max_skipped, self.skipped_in_a_row = policy, max_skipped, 0
        self.clear()

    def check(self, world, checkpoints: Path, log) -> bool:
        """Whether the step just made must be skipped (its losses, or an earlier unread
        step's, were not finite under trainer.nonfinite=skip); TrainingError where the run
        must stop: under trainer.nonfinite=stop, or after more than max_skipped skipped
        steps in a row. Reads the flags (a synchronisation)."""
        bad_step, bad = self.first(world)
        if bad_step is None:
            self.skipped_in_a_row = 0
            return False
        message = f"step {bad_step}: non-finite loss in {', '.join(bad) or 'loss'}"
        if self.policy == "stop":
            kept = list_checkpoints(checkpoints)
            raise TrainingError(f"{message}; stopped, "
                                + (f"the last good checkpoint {kept[-1]} is kept" if kept
                                   else "no checkpoint had been written yet")
                                + " (trainer.nonfinite=skip skips such batches)")
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row > self.max_skipped:
            raise TrainingError(f"{message}; stopped after {self.skipped_in_a_row} skipped steps in "
                                f"a row (trainer.max_skipped_steps={self.max_skipped}): the losses "
                                f"do not recover; lower trainer.lr or check the data")
        log(f"warning: {message}; batch skipped (trainer.nonfinite=skip)")
        self.clear()
        return True

    def clear(self) -> None:
        self.step = torch.tensor(-1, device=self.device)
        self.bad = None

    def record(self, step: int, logs: dict[str, torch.Tensor]) -> None:
        if self.keys is None:
            self.keys = [k for k in sorted(logs) if k == "loss" or k.startswith("loss/")]
        bad = torch.stack([~torch.isfinite(torch.as_tensor(logs[k], device=self.device)).any()
                           for k in self.keys])
        first = (self.step < 0) & bad.any()
        self.step = torch.where(first, step, self.step)
        self.bad = bad if self.bad is None else torch.where(first, bad, self.bad)

    def first(self, world) -> tuple[int | None, list[str]]:
        """(the first non-finite step on any process, its non-finite losses) or (None, [])."""
        step, bad = dist_utils.first_flagged(self.step, self.bad, world)
        if step < 0:
            return None, []
        return step, [k for k, b in zip(self.keys, bad) if b and k != "loss"]
