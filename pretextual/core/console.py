"""What a run prints: the data line, the objectives with their schedules, progress
(a bar on a terminal, plain lines elsewhere), one line per evaluation, and the summary."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Mapping

from tqdm.auto import tqdm

from pretextual.core.config import WeightSchedule


def count(n: float) -> str:
    """1234 -> 1,234; 4_100_000 -> 4.1M: counts read at a glance."""
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if abs(n) >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:,.0f}"


def duration(seconds: float) -> str:
    """Seconds as h:mm:ss."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _ramp(what: str, schedule: str, start: float, end: float, steps: int) -> str:
    if schedule == "linear" and steps > 0:
        return f"{what} {start:g} -> {end:g} linearly over steps 0-{steps}"
    if schedule == "step" and steps > 0:
        return f"{what} {start:g} until step {steps}, then {end:g}"
    return f"{what} {end:g}"


def schedule_text(schedule: WeightSchedule, options=None) -> str:
    """An objective's weight as the start line shows it, "weight 1" or its schedule, and
    the schedule of each of its scheduled options."""
    parts = [_ramp("weight", schedule.schedule, schedule.start_weight, schedule.weight,
                   schedule.schedule_steps)]
    for option, s in schedule.schedules.items():
        parts.append(_ramp(option, s.schedule, s.start, getattr(options, option), s.steps))
    return "; ".join(parts)


def data_line(documents: int, tokens: int, steps: int, global_batch: int, seq_len: int,
              max_time: str | None = None) -> str:
    """The training split's size and what trainer.max_steps reads of it. An example holds
    at most data.max_seq_length tokens (sentences are packed up to it), so the epochs are
    at most steps x batch x length / tokens. Under trainer.max_time the steps are not known."""
    if max_time is not None:
        return (f"training data: {count(documents)} documents, {count(tokens)} tokens | "
                f"trainer.max_time={max_time}: the steps and the schedule's length follow "
                f"from the measured rate")
    read = steps * global_batch * seq_len
    return (f"training data: {count(documents)} documents, {count(tokens)} tokens | "
            f"{count(steps)} steps x {count(global_batch)} examples x up to {seq_len} tokens = "
            f"up to {count(read)} tokens, about {read / max(tokens, 1):.3g} epochs")


def metrics_text(metrics: Mapping[str, float], prefix: str = "") -> str:
    """``loss 7.04 | wwm: loss 6.32 accuracy 0.067 | sop: ...``: the total, then each
    objective's (or task's) values together; keys are metrics.jsonl's without ``prefix``."""
    groups: dict[str, list[str]] = {}
    for key, value in metrics.items():
        if not key.startswith(prefix) or not isinstance(value, (int, float)):
            continue
        name = key[len(prefix):]
        if name.startswith("loss/"):
            group, metric = name[len("loss/"):], "loss"
        elif "/" in name:
            group, metric = name.rsplit("/", 1)
        else:
            group, metric = "", name
        groups.setdefault(group, []).append(f"{metric} {value:.4g}")
    return " | ".join((f"{g}: " if g else "") + " ".join(parts) for g, parts in groups.items())


def eval_line(step: int, metrics: Mapping[str, float]) -> str:
    """One evaluation, on one line."""
    return f"eval step {step}: {metrics_text(metrics, 'eval/')}"


class Progress:
    """Training progress: tqdm's bar when stderr is a terminal and trainer.progress is on;
    otherwise (a log file, a cluster job, trainer.progress=false) a plain line every
    ``every`` steps, which a log keeps readable (no carriage returns)."""

    def __init__(self, total: int, initial: int, enabled: bool, every: int,
                 log: Callable[[str], None]):
        self.total, self.every, self.log = total, max(1, every), log
        self.start, self.start_step = time.perf_counter(), initial
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)
        self.record: Mapping[str, float] = {}

    def update(self, step: int, record: Mapping[str, float] | None) -> None:
        """Step ``step`` is done; ``record`` is its metrics line when it logged one."""
        if record:
            self.record = record
        if self.bar is not None:
            if record:
                self.bar.set_postfix(loss=f"{record['loss']:.3f}",
                                     tok_s=f"{record['tokens_per_s']:.0f}")
            self.bar.update(1)
        elif step % self.every == 0 or step == self.total:
            self.log(self.line(step))

    def line(self, step: int) -> str:
        """``step 50/1000 (5%) | loss ... | lr ... | tokens/s | elapsed, left``."""
        elapsed = time.perf_counter() - self.start
        done = step - self.start_step
        left = elapsed / done * (self.total - step) if done else 0.0
        parts = [f"step {step}/{self.total} ({step / self.total:.0%})"]
        record = self.record
        losses = {k: v for k, v in record.items() if k == "loss" or k.startswith("loss/")}
        if losses:
            parts.append(metrics_text(losses))
        if "lr" in record:
            parts.append(f"lr {record['lr']:.3g}")
        if "tokens_per_s" in record:
            parts.append(f"{count(record['tokens_per_s'])} tokens/s")
        parts.append(f"{duration(elapsed)} elapsed, {duration(left)} left")
        return " | ".join(parts)

    def write(self, line: str) -> None:
        """A line between the bar's updates (tqdm redraws the bar under it)."""
        if self.bar is not None:
            self.bar.write(line)
        else:
            self.log(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def closing_lines(first_step: int, last_step: int, tokens: int, seconds: float,
                  final: Mapping[str, float], export_dir: Path | None) -> list[str]:
    """What a finished run says first: what it trained, its final held-out values, and
    where its export is with the one line that loads it in transformers."""
    lines = [f"trained steps {first_step}-{last_step}: {count(tokens)} tokens in "
             f"{duration(seconds)} ({count(tokens / max(seconds, 1e-9))} tokens/s)"]
    if final:
        lines.append(f"held-out: {metrics_text(final, 'eval/')}")
    config = export_dir / "config.json" if export_dir is not None else None
    if config is not None and config.is_file():
        architecture = (json.loads(config.read_text()).get("architectures") or [""])[0]
        auto = "AutoModelForMaskedLM" if architecture.endswith(("ForMaskedLM", "ForPreTraining")) \
            else "AutoModel"
        lines.append(f"export: {export_dir} ({architecture}); in transformers: "
                     f"{auto}.from_pretrained({str(export_dir)!r}) and AutoTokenizer likewise")
    return lines
