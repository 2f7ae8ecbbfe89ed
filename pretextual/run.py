"""``pretextual.train``: a training run from Python, for notebooks and scripts, with the
documents given as objects (a datasets.Dataset, a list of strings) or read from data.corpus."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig


def trainer_for(cfg: DictConfig, plugins=None, log=print, resume: bool = False,
                run_name: str = "run", documents: list | None = None):
    """The Trainer of a resolved config, with the model model.init_from names loaded (a
    pretextual run, an export or a directory transformers saved)."""
    from pretextual.core.trainer import Trainer
    start = None
    if cfg.model.init_from:
        from pretextual.exporters.load import load_pretrained
        start, _ = load_pretrained(cfg.model.init_from)
    return Trainer(cfg, plugins, log=log, resume=resume, run_name=run_name, documents=documents,
                   start=start)


def train(config: str | DictConfig | None = None, *overrides: str,
          documents: Any | Iterable[str] | Iterable[dict] | None = None, log=print):
    """Train as ``pretextual train CONFIG OVERRIDES...`` does and return the Trainer
    (``.out`` its run directory, ``.model`` the encoder and heads, ``.tokenizer``,
    ``.final_metrics`` the last evaluation). ``config``: a recipe name, a YAML file or a
    resolved config (pretextual.core.config.load_config); ``documents``: a Hugging Face
    datasets.Dataset (its data.text_field column), or strings, or dicts holding
    data.text_field, each one document, trained on instead of data.corpus (config.yaml
    then says so; such a run is resumed from Python with the same documents).
    Errors a user can make raise pretextual.PretextualError, with the one line the
    command prints."""
    from pretextual.core.config import DEFAULT_RECIPE, load_config
    from pretextual.core.corpus import documents_of
    from pretextual.core.distributed import shutdown
    from pretextual.plugins.manager import Plugins
    if isinstance(config, DictConfig):
        if overrides:
            raise TypeError("train(): overrides go with a recipe or YAML file; set them on a "
                            "resolved config before passing it")
        cfg, name = config, "run"
    else:
        cfg = load_config(config, list(overrides))
        name = Path(config or DEFAULT_RECIPE).stem
    docs = None
    if documents is not None:
        docs = documents_of(documents, cfg.data.text_field)
        cfg.data.corpus = f"(the {len(docs)} documents given to pretextual.train)"
    trainer = trainer_for(cfg, Plugins.from_config(cfg), log=log, run_name=name, documents=docs)
    try:
        trainer.final_metrics = trainer.train()
    finally:
        shutdown(trainer.world)
    return trainer
