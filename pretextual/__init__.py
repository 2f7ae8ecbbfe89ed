"""pretextual: pretrain BERT-style text encoders from a weighted mix of pluggable objectives."""

from pretextual.errors import (CheckpointError, ConfigError, DataError, EvaluationError,
                               PluginError, PretextualError)
from pretextual.plugins.api import (ArchitectureSpec, BuildContext, Encoder, ExportedModel, ExporterSpec,
                                    ExportOptions, ExportSummary, LoggerSpec, LRScheduleSpec,
                                    Objective, ObjectiveOutput, ObjectiveSpec, OptimizerSpec,
                                    StepInputs, TaskData, TaskSpec, Vocab)
from pretextual.plugins.hookspecs import hookimpl
from pretextual.run import train

__version__ = "0.1.0"

__all__ = [
    "ArchitectureSpec", "BuildContext", "CheckpointError", "ConfigError", "DataError", "Encoder", "EvaluationError",
    "ExportedModel", "ExporterSpec", "ExportOptions", "ExportSummary", "LoggerSpec",
    "LRScheduleSpec", "Objective", "OptimizerSpec",
    "ObjectiveOutput", "ObjectiveSpec", "PluginError", "PretextualError", "StepInputs", "TaskData",
    "TaskSpec", "Vocab", "hookimpl", "train", "__version__",
]
