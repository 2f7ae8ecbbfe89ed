"""What a finished run says it learned: held-out MLM accuracy against the unigram stage,
each downstream probe against the untrained encoder, and fill-mask examples from
held-out sentences."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

MASKED_OBJECTIVES = ("mlm", "wwm", "span")
FILL_MASK_EXAMPLES = 3
FILL_MASK_SEED = 0
TOP_K = 3


def unigram_accuracy(docs, vocab) -> tuple[float, int]:
    """(share, id) of the most frequent ordinary token of the documents: the MLM accuracy
    of always guessing it (what a model at the unigram stage scores)."""
    counts = np.zeros(vocab.size, dtype=np.int64)
    for doc in range(len(docs)):
        for index in range(docs.num_sentences(doc)):
            counts += np.bincount(docs.sentence(doc, index)[0], minlength=vocab.size)
    counts[list(vocab.special_ids)] = 0
    top = int(counts.argmax())
    return (float(counts[top] / counts.sum()) if counts.sum() else 0.0), top


def downstream_lines(run_dir: Path, final: dict[str, float], keys: list[str]) -> list[str]:
    """For each downstream probe ``eval/<task>/<metric>`` of ``keys``: the final value
    against the step-0 one (the untrained encoder the run started from) in metrics.jsonl."""
    first: dict[str, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("step") == 0:
            first.update(record)
    return [_downstream_line(run_dir, key, final[key], first[key])
            for key in keys if key in final and key in first]


@torch.no_grad()
def fill_mask_lines(model, tokenizer, docs, vocab, device: torch.device,
                    max_tokens: int) -> list[str]:
    """Top guesses of the MLM head for one masked whole word in each of a few held-out
    sentences (chosen by a fixed seed)."""
    if "mlm" not in model.heads or len(docs) == 0:
        return []
    rng = np.random.default_rng(FILL_MASK_SEED)
    lines = []
    was_training = model.training
    model.eval()
    for doc in rng.permutation(len(docs)):
        if len(lines) == FILL_MASK_EXAMPLES:
            break
        ids, starts = docs.sentence(int(doc), int(rng.integers(docs.num_sentences(int(doc)))))
        if not 8 <= len(ids) <= min(max_tokens - 2, 40):
            continue
        # whole words of letters only, one token long: a guess can be read at a glance
        words = [i for i in range(len(ids)) if starts[i] and (i + 1 == len(ids) or starts[i + 1])
                 and tokenizer.id_to_token(int(ids[i])).isalpha()]
        if not words:
            continue
        position = words[len(words) // 2]
        masked = ids.copy()
        masked[position] = vocab.mask_id
        inputs = torch.tensor([[vocab.cls_id, *masked.tolist(), vocab.sep_id]], device=device)
        hidden = model.bert(inputs, torch.ones_like(inputs)).last_hidden_state
        probabilities = model.heads["mlm"](hidden[0, position + 1]).float().softmax(-1)
        top = probabilities.topk(TOP_K)
        guesses = ", ".join(f"{tokenizer.id_to_token(int(i))} {float(p):.2f}"
                            for p, i in zip(top.values, top.indices))
        text = tokenizer.decode(masked.tolist(), skip_special_tokens=False)
        lines.append(f'  "{text}" -> {guesses} (held-out word: '
                     f'{tokenizer.id_to_token(int(ids[position]))})')
    model.train(was_training)
    return lines


def summary_task_lines(trainer) -> list[str]:
    """trainer.summary_task's probe on the final encoder against the untrained one."""
    from pretextual.evaluation.encoders import initial_encoder
    from pretextual.evaluation.probing import TaskProbes, probes_available
    task = trainer.cfg.trainer.summary_task
    if not probes_available():
        return [f"(no downstream line: probing {task} needs scikit-learn, "
                f"pip install 'pretextual[eval]')"]
    probes = TaskProbes([task], trainer.plugins, trainer.tokenizer,
                        trainer.cfg.data.max_seq_length, trainer.vocab.size)
    model, device = _local_model(trainer)
    untrained = initial_encoder(trainer.encoder_config, trainer.cfg.trainer.seed,
                                trainer.plugins).to(device)
    (key,) = probes.keys
    final, first = probes(model.bert, device)[key], probes(untrained, device)[key]
    return [_downstream_line(trainer.out, key, final, first)]


def _downstream_line(run_dir: Path, key: str, value: float, untrained: float) -> str:
    _, task, metric = key.split("/")
    return (f"downstream {task} (frozen-feature probe, cross-validated): {metric} {value:.4f} "
            f"vs {untrained:.4f} for the untrained encoder ({value - untrained:+.4f}); "
            f"`pretextual evaluate {run_dir} --task {task}` adds seeds, baselines and error bars")


def _local_model(trainer):
    """(model, device) of the trained model as this one process holds it: the trainer's
    own, or under torchrun (sharded or wrapped) rebuilt from the final checkpoint."""
    if not trainer.world.enabled:
        return trainer.model, trainer.device
    from pretextual.core.checkpoint import latest_checkpoint
    from pretextual.core.mix import PretrainingModel
    model = PretrainingModel(trainer.architecture.model(trainer.encoder_config), trainer.mix.heads)
    model.load_state_dict(latest_checkpoint(trainer.out / "checkpoints").model_state())
    return model, torch.device("cpu")


def run_summary(trainer, final: dict[str, float]) -> list[str]:
    """The lines a finished run prints about what it learned."""
    lines = []
    docs = trainer.eval_batches.docs if trainer.eval_batches is not None else None
    # the objectives that predict masked tokens with the shared mlm head
    masked = next((n for n in MASKED_OBJECTIVES if f"eval/{n}/accuracy" in final), None)
    if masked is not None and docs is not None:
        accuracy = final[f"eval/{masked}/accuracy"]
        share, token = unigram_accuracy(docs, trainer.vocab)
        stage = "past the unigram stage" if accuracy > 2 * share else "still at the unigram stage"
        lines.append(f"held-out {'MLM' if masked == 'mlm' else masked} accuracy {accuracy:.4f}: "
                     f"{stage} (always guessing the most frequent token, "
                     f"{trainer.tokenizer.id_to_token(token)!r}, scores {share:.4f})")
    if trainer.task_probes is not None:
        lines += downstream_lines(trainer.out, final, trainer.task_probes.keys)
    elif trainer.cfg.trainer.summary_task:
        lines += summary_task_lines(trainer)
    if docs is not None:
        model, device = _local_model(trainer)
        examples = fill_mask_lines(model, trainer.tokenizer, docs, trainer.vocab, device,
                                   trainer.cfg.data.max_seq_length)
        if examples:
            lines += ["fill-mask on held-out sentences:", *examples]
    return lines
