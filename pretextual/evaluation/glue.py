"""GLUE's tasks by name (``glue-sst2``, ``glue-mrpc``, ...), read through Hugging Face
``datasets`` where the user has it and the data (its cache, or a network): nothing here
downloads unless ``datasets`` does. The dev split is the evaluation split, as GLUE
reports; MNLI's is validation_matched. Scores are accuracy, or Pearson for STS-B (not
GLUE's Matthews correlation for CoLA or F1 for MRPC and QQP)."""

from __future__ import annotations

import pretextual
from pretextual.errors import EvaluationError
from pretextual.plugins.api import TaskData, TaskSpec

DATASET = "nyu-mll/glue"
# name -> (first text column, second text column or None, dev split)
TASKS = {
    "cola": ("sentence", None, "validation"),
    "sst2": ("sentence", None, "validation"),
    "mrpc": ("sentence1", "sentence2", "validation"),
    "qqp": ("question1", "question2", "validation"),
    "stsb": ("sentence1", "sentence2", "validation"),
    "mnli": ("premise", "hypothesis", "validation_matched"),
    "qnli": ("question", "sentence", "validation"),
    "rte": ("sentence1", "sentence2", "validation"),
}


def _loader(name: str, split: str):
    first, second, _ = TASKS[name]

    def load() -> TaskData:
        try:
            import datasets
        except ImportError:
            raise EvaluationError(f"task 'glue-{name}' reads GLUE through Hugging Face datasets: "
                                  f"pip install datasets") from None
        try:
            rows = datasets.load_dataset(DATASET, name, split=split)
        except Exception as exc:  # offline without a cached copy, a hub error, ...
            raise EvaluationError(f"task 'glue-{name}': datasets could not load {DATASET} {name} "
                                  f"{split} ({type(exc).__name__}: {' '.join(str(exc).split())})") from None
        label = list(rows["label"])
        if name == "stsb":
            label = [float(v) for v in label]  # a similarity score, 0 to 5
        return TaskData(text=list(rows[first]), label=label,
                        text_pair=list(rows[second]) if second else None)

    return load


@pretextual.hookimpl
def pretextual_register_tasks(register):
    for name, (_, _, dev) in TASKS.items():
        register(TaskSpec(f"glue-{name}", _loader(name, "train"),
                          f"GLUE {name.upper()} through Hugging Face datasets (dev: {dev})",
                          load_eval=_loader(name, dev)))
