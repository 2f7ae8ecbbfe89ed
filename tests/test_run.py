"""pretextual.train: a run from Python on documents given as objects (a datasets.Dataset,
strings, dicts), as a notebook user has them."""

import json

import datasets
import numpy as np
import pytest

import pretextual
from pretextual.errors import DataError
from run_helpers import topic_rows

FAST = ["model.preset=tiny", "data.vocab_size=300", "data.max_seq_length=32", "data.batch_size=8",
        "trainer.warmup_steps=2", "trainer.eval_every=0", "trainer.eval_batches=2",
        "trainer.export=", "trainer.plot=false", "trainer.summary_task=null",
        "trainer.progress=false", "trainer.lr=1e-3"]


def _texts() -> list[str]:
    rows = topic_rows(groups=60, per_group=4)
    return [" ".join(r["text"] for r in rows[i:i + 4]) for i in range(0, len(rows), 4)]


def test_a_dataset_trains_and_the_loss_falls(tmp_path):
    dataset = datasets.Dataset.from_dict({"text": _texts(), "id": list(range(60))})
    trainer = pretextual.train("roberta", *FAST, "trainer.max_steps=30",
                               f"trainer.output_dir={tmp_path / 'run'}", documents=dataset,
                               log=lambda *_: None)
    assert trainer.out == tmp_path / "run"
    records = [json.loads(line) for line in (trainer.out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 30 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    assert np.isfinite(trainer.final_metrics["eval/loss"])
    assert len(trainer.train_batches.docs) + len(trainer.eval_batches.docs) == 60
    assert "corpus: (the 60 documents given to pretextual.train)" in (trainer.out / "config.yaml").read_text()


def test_strings_dicts_and_a_dataset_are_the_same_documents(tmp_path):
    texts = _texts()
    first = pretextual.train("roberta", *FAST, "trainer.max_steps=1",
                             f"trainer.output_dir={tmp_path / 'a'}", documents=texts,
                             log=lambda *_: None)
    tokenizer = f"data.tokenizer={first.out / 'tokenizer.json'}"
    others = [pretextual.train("roberta", *FAST, "trainer.max_steps=1", tokenizer,
                               f"trainer.output_dir={tmp_path / name}", documents=docs,
                               log=lambda *_: None)
              for name, docs in (("b", [{"text": t, "n": 1} for t in texts]),
                                 ("c", datasets.Dataset.from_dict({"text": texts})))]

    def tokens(trainer):
        docs = trainer.train_batches.docs
        return [docs.sentence(d, s)[0].tolist() for d in range(len(docs))
                for s in range(docs.num_sentences(d))]
    assert tokens(first) == tokens(others[0]) == tokens(others[1])


@pytest.mark.parametrize("documents, message", [
    (["A sentence here.", 7], "documents[1]: int, not a string or a dict holding 'text'"),
    ([{"body": "A sentence."}], "documents[0]: no 'text' key (set data.text_field)"),
    ([{"text": 3}], "documents[0]: field 'text' is int, not a string (set data.text_field)"),
    (["", "  "], "documents: holds no text"),
])
def test_documents_of_another_kind_are_one_line(documents, message, tmp_path):
    with pytest.raises(DataError) as error:
        pretextual.train("roberta", *FAST, f"trainer.output_dir={tmp_path}", documents=documents)
    assert str(error.value) == message


def test_a_dataset_without_the_text_column_is_one_line(tmp_path):
    dataset = datasets.Dataset.from_dict({"body": ["A sentence."]})
    with pytest.raises(DataError) as error:
        pretextual.train("roberta", *FAST, f"trainer.output_dir={tmp_path}", documents=dataset)
    assert str(error.value) == ("documents: the dataset has no 'text' column (columns: body); "
                                "set data.text_field")
