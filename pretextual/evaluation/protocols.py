"""How a model (or a baseline) is scored on a split: each function fits on the training
rows and returns its predictions for the test rows.

* ``probe``: a linear model on frozen features ([CLS] and mean-pooled hidden states,
  standardised): logistic regression for classes, ridge regression for numbers.
* ``finetune``: the encoder with one added output layer (dropout and a linear layer on
  the pooled [CLS] state, as BERT fine-tunes) trained end to end with one fixed set of
  hyperparameters for every task and model (:class:`FinetuneSettings`).
* baselines: the training split's majority class (or mean), and TF-IDF of word uni- and
  bigrams with the same linear models.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pretextual.errors import EvaluationError
from pretextual.evaluation.encoders import Encoder, Tokenized, length_batches
from pretextual.evaluation.tasks import CLASSIFICATION, Task

PROBE_C = 0.1
"""Inverse L2 strength of the logistic probe, on standardised features (one value for every task)."""
RIDGE_ALPHA = 1.0


def require_sklearn() -> None:
    """One line naming the extra when scikit-learn (probe, TF-IDF, folds) is missing."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise EvaluationError("the probe and the TF-IDF baseline need scikit-learn: "
                              "pip install 'pretextual[eval]'") from None


def _linear_model(kind: str, scale: bool):
    require_sklearn()
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    model = (LogisticRegression(C=PROBE_C, max_iter=2000) if kind == CLASSIFICATION
             else Ridge(alpha=RIDGE_ALPHA))
    return make_pipeline(StandardScaler(), model) if scale else model


def probe(x: np.ndarray, task: Task, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Predictions of a linear model fitted on frozen features ``x`` of the train rows."""
    model = _linear_model(task.kind, scale=True)
    model.fit(x[train], task.y[train])
    return model.predict(x[test])


def majority(task: Task, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    """The most frequent class (lowest index on a tie) or the mean: of the training split
    when the task has its own evaluation split, else of the whole task (a fold's own
    majority would be, for balanced classes, the class its test fold lacks most)."""
    known = task.y[:task.eval_start] if task.eval_start is not None else task.y
    if task.kind == CLASSIFICATION:
        return np.full(len(test), np.bincount(known).argmax())
    return np.full(len(test), known.mean())


def tfidf(task: Task, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    """TF-IDF of word uni- and bigrams (each text of a pair on its own, side by side)
    with the probe's linear model: what a user would try without any encoder."""
    require_sklearn()
    from scipy.sparse import hstack
    from sklearn.feature_extraction.text import TfidfVectorizer
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    first = [task.text[i] for i in train]
    vectorizer.fit(first + ([task.text_pair[i] for i in train] if task.text_pair else []))

    def encode(rows):
        parts = [vectorizer.transform([task.text[i] for i in rows])]
        if task.text_pair is not None:
            parts.append(vectorizer.transform([task.text_pair[i] for i in rows]))
        return hstack(parts).tocsr() if len(parts) > 1 else parts[0]

    model = _linear_model(task.kind, scale=False)
    model.fit(encode(train), task.y[train])
    return model.predict(encode(test))


@dataclass(frozen=True)
class FinetuneSettings:
    """The one hyperparameter set of the fine-tune protocol, the same for every task and
    model (as Cramming's GLUE-sane rules): AdamW with linear warm-up and decay."""

    epochs: int = 5
    lr: float = 1e-3
    """Fit for the small encoders pretrained on a CPU; base-size encoders want about 4e-5
    (Cramming's GLUE-sane value): set it for the whole evaluation, never per task."""
    batch_size: int = 32
    warmup: float = 0.1
    """Share of the steps spent warming up."""
    weight_decay: float = 0.01
    dropout: float = 0.1
    max_grad_norm: float = 1.0


def finetune(encoder: Encoder, tokenized: Tokenized, task: Task, train: np.ndarray,
             test: np.ndarray, seed: int, settings: FinetuneSettings,
             device: torch.device) -> np.ndarray:
    """Predictions of a copy of the encoder fine-tuned on the train rows with one added
    output layer; ``seed`` sets the layer's initialisation, dropout and data order."""
    classes = len(task.classes) if task.kind == CLASSIFICATION else 1
    y = torch.from_numpy(task.y)
    if task.kind != CLASSIFICATION:  # regress standardised targets
        mean, std = float(task.y[train].mean()), float(task.y[train].std()) or 1.0
        y = (y - mean) / std
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model = copy.deepcopy(encoder.model).to(device).train().requires_grad_(True)
        head = nn.Sequential(nn.Dropout(settings.dropout),
                             nn.Linear(model.config.hidden_size, classes)).to(device)
        nn.init.normal_(head[1].weight, std=model.config.initializer_range)
        nn.init.zeros_(head[1].bias)
        params = list(model.parameters()) + list(head.parameters())
        optimizer = torch.optim.AdamW(
            [{"params": [p for p in params if p.ndim >= 2], "weight_decay": settings.weight_decay},
             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=settings.lr)
        per_epoch = math.ceil(len(train) / settings.batch_size)
        total = settings.epochs * per_epoch
        warmup = max(1, round(settings.warmup * total))
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
        rng = np.random.default_rng(seed)
        for _ in range(settings.epochs):
            order = rng.permutation(train)
            for start in range(0, len(order), settings.batch_size):
                rows = order[start:start + settings.batch_size]
                out = head(model(**tokenized.batch(rows, device)).pooler_output)
                target = y[rows].to(device)
                loss = (F.cross_entropy(out, target) if classes > 1
                        else F.mse_loss(out.squeeze(1), target.float()))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, settings.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
        model.eval()
        head.eval()
        predictions = np.zeros(len(test), dtype=np.float64 if classes == 1 else np.int64)
        position = {int(r): i for i, r in enumerate(test)}
        with torch.no_grad():
            for rows in length_batches(tokenized, test, 64):
                out = head(model(**tokenized.batch(rows, device)).pooler_output).float().cpu()
                where = [position[int(r)] for r in rows]
                predictions[where] = (out.argmax(1).numpy() if classes > 1
                                      else out.squeeze(1).numpy() * std + mean)
    return predictions
