"""Helpers shared by tests: a synthetic corpus and the overrides of a run that takes seconds."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

TOPICS = {
    "river": "water boat fish bank stream bridge current shore flood valley",
    "market": "price trade coin stall buyer seller goods bread fruit street",
    "forest": "tree leaf bird wolf moss trail branch root deer shade",
    "school": "teacher lesson book pupil desk chalk exam class bell study",
    "harbor": "ship sail anchor dock crane cargo wave tide rope gull",
    "castle": "tower wall gate king guard moat stone hall banner knight",
}
VERBS = "sees finds carries watches follows needs moves keeps".split()


def write_corpus(path: Path, documents: int = 60, sentences: int = 8, seed: int = 0) -> Path:
    """Documents of simple sentences, each document on one topic, blank lines between them."""
    rng = random.Random(seed)
    topics = list(TOPICS.values())
    lines = []
    for d in range(documents):
        words = topics[d % len(topics)].split()
        for _ in range(sentences):
            n = rng.randint(4, 9)
            sentence = " ".join(rng.choice(words) if i % 3 else rng.choice(VERBS) for i in range(n))
            lines.append(sentence.capitalize() + ".")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def tiny_overrides(corpus: Path, cache: Path, out: Path, steps: int = 5) -> list[str]:
    """Overrides for a run that takes seconds: tiny preset, short sequences, small vocab."""
    return [f"data.corpus={corpus}", f"data.cache_dir={cache}", f"trainer.output_dir={out}",
            "model.preset=tiny", "data.vocab_size=300", "data.max_seq_length=32",
            "data.batch_size=8", f"trainer.max_steps={steps}", "trainer.warmup_steps=2",
            "trainer.eval_every=0", "trainer.eval_batches=2", f"trainer.checkpoint_every={steps}",
            "trainer.progress=false", "trainer.export=", "trainer.plot=false",
            "trainer.lr=1e-3", "trainer.summary_task=null"]


def swapped_tokenizer(text: str) -> str:
    """A tokenizer JSON with the ids of its last two vocabulary entries swapped: the same
    size, another tokenizer."""
    data = json.loads(text)
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    return json.dumps(data)


def final_weights(run_dir: Path) -> dict:
    """The tensors of a run's newest checkpoint's model.safetensors."""
    from safetensors.torch import load_file
    from pretextual.core.checkpoint import list_checkpoints
    return load_file(str(list_checkpoints(run_dir / "checkpoints")[-1] / "model.safetensors"))


def topic_rows(groups: int = 36, per_group: int = 5, seed: int = 1) -> list[dict]:
    """Sentences of the training corpus's kind, labelled by topic; each group is one
    "document" of sentences on one topic."""
    rng = random.Random(seed)
    names = sorted(TOPICS)
    rows = []
    for g in range(groups):
        topic = names[g % len(names)]
        words = TOPICS[topic].split()
        for _ in range(per_group):
            n = rng.randint(4, 9)
            text = " ".join(rng.choice(words) if i % 3 else rng.choice(VERBS) for i in range(n))
            rows.append({"text": text.capitalize() + ".", "label": topic, "doc": f"d{g}"})
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    """``rows`` as .jsonl, .csv or .tsv, by the path's suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return path
    if path.suffix == ".tsv":  # GLUE's layout: no quoting at all
        lines = ["\t".join(rows[0])] + ["\t".join(str(v) for v in r.values()) for r in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_topic_task(path: Path, **kwargs) -> Path:
    return write_rows(path, topic_rows(**kwargs))


def save_wordpiece_for_transformers(corpus: Path, out: Path):
    """A 300-piece WordPiece tokenizer trained on ``corpus``, saved to ``out`` as transformers'
    save_pretrained writes a BERT tokenizer; returns transformers' tokenizer."""
    import transformers
    from pretextual.core.tokenizer import train_wordpiece
    tokenizer = train_wordpiece(corpus.read_text().splitlines(), 300)
    fast = transformers.BertTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]",
                                          sep_token="[SEP]", pad_token="[PAD]",
                                          cls_token="[CLS]", mask_token="[MASK]")
    fast.save_pretrained(out)
    return fast
