"""The pure logic of the time-to-quality comparison (benchmarks/quality.py): when a
curve of checkpoint scores reaches a score, which checkpoints come due, the clock that
leaves checkpoint writing out, and the rows it reports. No training, no evaluation."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.quality import (Checkpoint, Clock, Schedule, WallClockCheckpoints,  # noqa: E402
                                add_rows, seconds_per_step, steps_for, time_to_reach)
from benchmarks.report import Report  # noqa: E402


def test_time_to_reach_interpolates_between_the_checkpoints_around_the_crossing():
    curve = [(54.0, 0.41), (108.0, 0.47), (162.0, 0.55), (270.0, 0.58)]
    # 0.50 lies 3/8 of the way from 0.47 (108 s) to 0.55 (162 s): 108 + 0.375 * 54 = 128.25 s
    seconds, bound = time_to_reach(curve, 0.50)
    assert seconds == pytest.approx(128.25) and not bound
    # exactly a checkpoint's score: that checkpoint's time
    assert time_to_reach(curve, 0.55) == (pytest.approx(162.0), False)
    # the order the points come in does not matter
    assert time_to_reach(curve[::-1], 0.50)[0] == pytest.approx(128.25)


def test_time_to_reach_takes_the_first_crossing_of_a_curve_that_dips():
    curve = [(10.0, 0.30), (20.0, 0.50), (30.0, 0.40), (40.0, 0.60)]
    # 0.45: crossed first between 10 s and 20 s (at 17.5 s), not after the dip
    assert time_to_reach(curve, 0.45)[0] == pytest.approx(17.5)


def test_time_to_reach_before_the_first_checkpoint_is_an_upper_bound_and_never_is_none():
    curve = [(13.5, 0.52), (27.0, 0.56)]
    assert time_to_reach(curve, 0.50) == (13.5, True)
    assert time_to_reach(curve, 0.57) == (None, False)
    assert time_to_reach([], 0.1) == (None, False)


def test_schedule_gives_each_fraction_once_and_all_that_are_left_when_the_run_ends():
    schedule = Schedule(100.0, (0.2, 0.4, 1.0))
    assert schedule.due(19.9) == []
    assert schedule.due(45.0) == [0.2, 0.4]  # one slow step past two fractions
    schedule.taken += [Checkpoint(f, 45.0, 7, "a") for f in (0.2, 0.4)]
    assert schedule.due(50.0) == [] and not schedule.finished
    assert schedule.due(60.0, ended=True) == [1.0]  # the schedule's last step came early
    schedule.taken.append(Checkpoint(1.0, 60.0, 9, "b"))
    assert schedule.finished


def test_clock_leaves_out_the_time_spent_paused():
    now = iter([0.0, 10.0, 10.0, 14.0, 20.0]).__next__
    clock = Clock(now)
    clock.start()  # 0
    assert clock.elapsed() == 10.0  # 10
    with clock.paused():  # 10 .. 14
        pass
    assert clock.elapsed() == 16.0  # 20 - 4 paused
    assert Clock().elapsed() == 0.0  # not started


def test_steps_for_the_budget_with_pretextuals_default_warmup_share():
    assert steps_for(270.0, 0.78) == (346, 35)  # 20 warm-up of 200 steps: a tenth
    assert steps_for(270.0, 2.5) == (108, 11)
    assert steps_for(1.0, 5.0) == (1, 1)


def test_seconds_per_step_leaves_out_the_first_steps():
    # step ends of a measurement run: two slow first steps, then 0.5 s a step
    assert seconds_per_step([3.0, 4.0, 4.5, 5.0, 5.5, 6.0]) == pytest.approx(0.5)
    assert seconds_per_step([2.0, 4.0]) == pytest.approx(2.0)  # too few to skip any


class _FakeTrainer:
    """What the hook reads of a Trainer; writing a checkpoint takes a second of ``now``."""

    def __init__(self, max_steps: int, now: list[float]):
        self.out, self.now, self.step = Path("/runs/x"), now, 0
        self.cfg = SimpleNamespace(trainer=SimpleNamespace(max_steps=max_steps))
        self.should_stop, self.saved = False, []

    def save(self):
        self.now[0] += 1.0
        self.saved.append(self.step)
        return self.out / "checkpoints" / f"step-{self.step:07d}"


def _run_hook(max_steps: int, step_seconds: list[float]):
    now = [0.0]
    clock = Clock(lambda: now[0])
    schedule = Schedule(10.0, (0.5, 1.0))
    hook = WallClockCheckpoints(schedule, clock)
    trainer = _FakeTrainer(max_steps, now)
    clock.start()
    for step, seconds in enumerate(step_seconds, 1):
        now[0] += seconds
        trainer.step = step
        hook.pretextual_on_step_end(step=step, metrics={"tokens": 100}, trainer=trainer)
        if trainer.should_stop:
            break
    return schedule, trainer, hook


def test_pretextual_hook_saves_at_the_fractions_off_the_clock_and_stops_at_the_budget():
    # 3 s a step: 3, 6 (0.5 due: saved, its second off the clock), 9, 12 (1.0 due: stop)
    schedule, trainer, hook = _run_hook(100, [3.0] * 6)
    assert [(c.fraction, c.seconds, c.step) for c in schedule.taken] == [(0.5, 6.0, 2),
                                                                         (1.0, 12.0, 4)]
    assert trainer.saved == [2]  # the last checkpoint is the training loop's own, at its stop
    assert trainer.should_stop and schedule.taken[-1].path.endswith("step-0000004")
    assert hook.tokens == 400


def test_pretextual_hook_takes_every_fraction_left_when_max_steps_comes_first():
    schedule, trainer, _ = _run_hook(2, [3.0, 1.0])
    assert [(c.fraction, c.seconds, c.step) for c in schedule.taken] == [(0.5, 4.0, 2),
                                                                         (1.0, 4.0, 2)]
    assert trainer.saved == [] and trainer.should_stop


def _side(name, times, steps):
    return {"checkpoints": [Checkpoint(f, t, s, f"{name}-{s}")
                            for f, t, s in zip((0.2, 0.6, 1.0), times, steps)],
            "steps": steps[-1], "max_steps": steps[-1], "warmup": 1, "seconds_per_step": 1.0,
            "tokens": 1000, "examples": 10, "optim": "adamw", "scheduler": "linear",
            "lr": 1e-3, "betas": (0.9, 0.98), "eps": 1e-6, "weight_decay": 0.01,
            "max_grad_norm": 1.0}


def _entry(mean):
    return {"mean": mean, "std": 0.01, "per_seed": [mean]}


def _rows(ours, theirs, ours_floor=None, theirs_floor=None):
    report = Report(command="x", mode="x", machine={})
    sides = {"pretextual": _side("p", [60.0, 180.0, 300.0], [110, 330, 550]),
             "hf": _side("h", [61.0, 181.0, 301.0], [20, 60, 100])}
    add_rows(report, sides["pretextual"], sides["hf"], "BertForMaskedLM",
             [_entry(m) for m in ours], [_entry(m) for m in theirs],
             _entry(0.35 if ours_floor is None else ours_floor),
             _entry(0.36 if theirs_floor is None else theirs_floor), "accuracy", 300.0, 3)
    return report.rows


def _goal(rows):
    return next(r for r in rows if "Hugging Face's final score" in r.what)


def test_rows_report_the_time_to_the_other_sides_final_score_and_the_goal():
    rows = _rows([0.50, 0.60, 0.64], [0.40, 0.44, 0.55])
    assert len(rows) == 3 + 3 and all("against BertForMaskedLM" in r.what for r in rows)
    at = [r for r in rows if "% of the 300 s budget" in r.what]
    assert [r.what.split(" at ")[1][:4] for r in at] == ["20% ", "60% ", "100%"]
    assert at[0].pretextual.startswith("0.500 +/- 0.010 (60 s, step 110)")
    assert at[-1].ratio == pytest.approx(0.64 / 0.55)
    untrained = next(r for r in rows if "untrained" in r.what)
    assert (untrained.pretextual, untrained.reference) == ("0.350 +/- 0.010", "0.360 +/- 0.010")
    # Hugging Face's final 0.55: pretextual crosses it between 60 s (0.50) and 180 s (0.60),
    # at 60 + 120 * 0.5 = 120 s; Hugging Face took 301 s: 2.51x, short of the 3x goal.
    goal = _goal(rows)
    assert goal.ratio == pytest.approx(301.0 / 120.0)
    assert goal.pretextual.startswith("120 s (40% of the budget)")
    assert goal.goal == 3.0 and goal.met == "**no**"
    # pretextual's final 0.64 is never reached by Hugging Face
    back = next(r for r in rows if "pretextual's final score" in r.what)
    assert back.reference == "not reached"


def test_the_goal_row_of_a_side_that_never_reaches_the_score_is_not_met():
    goal = _goal(_rows([0.30, 0.31, 0.32], [0.40, 0.44, 0.55], 0.2, 0.2))
    assert goal.pretextual == "not reached" and goal.ratio == 0.0 and goal.met == "**no**"
    # a pretextual checkpoint that beats it at the first checkpoint: an upper bound on the time
    goal = _goal(_rows([0.60, 0.31, 0.32], [0.40, 0.44, 0.55], 0.2, 0.2))
    assert goal.pretextual.startswith("<= 60 s") and goal.ratio_text == ">= 5.0x"
    assert goal.met == "yes"


def test_no_verdict_when_hugging_faces_final_score_is_no_better_than_its_untrained_encoder():
    goal = _goal(_rows([0.405, 0.40, 0.39], [0.386, 0.37, 0.356], 0.408, 0.408))
    # pretextual's first checkpoint (0.405) is above 0.356, but so is the untrained encoder
    assert goal.pretextual.startswith("<= 60 s") and goal.ratio is None and goal.met == ""
    assert goal.ratio_text.startswith("n/a: Hugging Face's final score is not above")


def test_details_name_each_arms_model_settings_and_the_baselines():
    from benchmarks.quality import HF_ARMS, details
    from benchmarks.workloads import QUALITY

    sides = {"pretextual": {**_side("p", [60.0, 180.0, 300.0], [110, 330, 550]), "parameters": 1000}}
    for arm in HF_ARMS:
        sides[arm.model_class] = {**_side("h", [61.0, 181.0, 301.0], [20, 60, 100]),
                                  "parameters": 990, "arm": arm, "lr": arm.lr or 1e-3}
    result = {"n": 2000, "baselines": {"majority": _entry(0.5), "tfidf": _entry(0.55),
                                       "untrained": {"probe": _entry(0.48)}}}
    report = Report(command="x", mode="x", machine={})
    details(report, sides, result, 300.0, 3, QUALITY)
    (text,) = report.details
    assert "vocab 8192, sequence 64, batch 64" in text and "1,000 parameters" in text
    for arm in HF_ARMS:
        assert f"{arm.model_class} (built from the {arm.recipe} recipe's config, 990 parameters" in text
    assert text.endswith("other baselines: majority 0.500 +/- 0.010, tfidf 0.550 +/- 0.010.")
