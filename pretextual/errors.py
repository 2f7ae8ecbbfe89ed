"""Errors a user can cause. The CLI prints them as one line; anything else is a bug and raises."""


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
