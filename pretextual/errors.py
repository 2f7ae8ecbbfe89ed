"""Errors a user can cause. The CLI prints them as one line; anything else is a bug and raises."""

import traceback
from pathlib import Path
from typing import Any, Callable


class PretextualError(Exception):
    """Base class: a problem with the user's input, reported as one clear line."""


class ConfigError(PretextualError):
    """A bad config key or value (the message names the key)."""


class DataError(PretextualError):
    """A corpus or tokenizer problem (the message names the file)."""


class PluginError(PretextualError):
    """A plugin failed to load or registered something inconsistent."""


class CheckpointError(PretextualError):
    """A checkpoint or export that is missing, corrupt or does not fit the model."""


class TrainingError(PretextualError):
    """Training cannot go on (e.g. a non-finite loss); the message names the step and objective."""


def plugin_call(where: str, what: str, function: Callable, *args) -> Any:
    """``function(*args)`` where ``function`` is a plugin's code: an exception other than
    pretextual's own becomes one PluginError line naming ``where`` (``objectives.<name>``),
    what was called, and the file and line that raised."""
    try:
        return function(*args)
    except PretextualError:
        raise
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise PluginError(f"{where}: {what} raised {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())} (at {Path(frame.filename).name}:"
                          f"{frame.lineno})") from exc
