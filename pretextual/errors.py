"""Errors a user can cause. The CLI prints them as one line; anything else is a bug and raises."""

import os
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch


class PretextualError(Exception):
    """Base class: a problem with the user's input, reported as one clear line."""


class ConfigError(PretextualError):
    """A bad config key or value (the message names the key)."""


class DataError(PretextualError):
    """A corpus or tokenizer problem (the message names the file)."""


class PluginError(PretextualError):
    """A plugin failed to load or registered something inconsistent."""


class PluginRunError(PluginError):
    """A plugin's code failed, or returned what no run can use, on this process's data:
    under torchrun each process reports its own (the others may not meet it)."""


class CheckpointError(PretextualError):
    """A checkpoint or export that is missing, corrupt or does not fit the model."""


class EvaluationError(PretextualError):
    """A downstream task or model that cannot be evaluated (the message names the file and column)."""


class TrainingError(PretextualError):
    """Training cannot go on (e.g. a non-finite loss); the message names the step and objective."""


# Package directories with a trailing separator: site-packages/pretextual/ must not
# claim site-packages/pretextual_myobj.py, nor torch/ claim torchvision/.
_OWN = os.path.join(str(Path(__file__).resolve().parent), "")
_LIBRARIES = tuple(os.path.join(str(Path(m.__file__).resolve().parent), "") for m in (np, torch))


def plugin_call(where: str, what: str, function: Callable, *args) -> Any:
    """``function(*args)`` where ``function`` may be a plugin's code: an exception it
    raises becomes one PluginRunError line naming ``where`` (``objectives.<name>``), what
    was called, and the last line outside torch and numpy that it passed through.
    pretextual's own errors, an exception whose line is pretextual's (a bug: it keeps
    its traceback) and running out of memory pass through unchanged."""
    try:
        return function(*args)
    except (PretextualError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)[1:] or traceback.extract_tb(exc.__traceback__)
        outside = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_LIBRARIES)]
        frame = (outside or frames)[-1]
        if str(Path(frame.filename).resolve()).startswith(_OWN):
            raise
        raise PluginRunError(f"{where}: {what} raised {type(exc).__name__}: "
                             f"{' '.join(str(exc).split())} (at {Path(frame.filename).name}:"
                             f"{frame.lineno})") from exc
