"""data.sources: several corpora mixed by weight (or by size under a temperature), each
batch from one source in its share, logged, resumed exactly, each with its own held-out
split; bad weights are one line."""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from pretextual.cli import main
from pretextual.core.config import load_config
from pretextual.core.corpus import read_corpus
from pretextual.core.documents import TokenizedDocuments
from pretextual.core.sources import MixedBatches
from pretextual.core.trainer import Trainer
from pretextual.errors import ConfigError
from run_helpers import final_weights, tiny_overrides

WORDS = {"a": "river boat fish bank stream bridge shore flood valley water",
         "b": "market price trade coin stall buyer seller goods bread fruit"}


def write_source(path: Path, words: str, documents: int, seed: int) -> Path:
    """Documents whose sentences use only ``words`` (and 'the'), so a batch tells its source."""
    rng = random.Random(seed)
    vocab = words.split()
    text = "\n\n".join(
        "\n".join(" ".join(["The"] + [rng.choice(vocab) for _ in range(rng.randint(4, 8))]) + "."
                  for _ in range(6))
        for _ in range(documents))
    path.write_text(text + "\n")
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    return (write_source(root / "a.txt", WORDS["a"], 60, 1),
            write_source(root / "b.txt", WORDS["b"], 30, 2))


def _config(sources, cache_dir, out, *extra, weights=("3", "1"), steps=8):
    a, b = sources
    mix = (f"data.sources=[{{corpus: {a}, weight: {weights[0]}}}, "
           f"{{corpus: {b}, weight: {weights[1]}}}]")
    overrides = [o for o in tiny_overrides(a, cache_dir, out, steps) if not o.startswith("data.corpus")]
    return load_config("roberta", overrides + [mix, *extra])


def _source_of(batch, tokenizer) -> tuple[str, float]:
    """(the source whose words fill the batch, the share of the other's pieces in it): MLM's
    random replacements put a few pieces of any word in any batch."""
    pieces = {name: {i for w in words.split() for i in tokenizer.encode(w, add_special_tokens=False).ids}
              for name, words in WORDS.items()}
    common = pieces["a"] & pieces["b"]
    ids = batch["input_ids"][batch["attention_mask"].bool()].tolist()
    counts = {name: sum(i in p - common for i in ids) for name, p in pieces.items()}
    top = max(counts, key=counts.get)
    return top, min(counts.values()) / max(sum(counts.values()), 1)


def test_each_batch_comes_from_one_source_in_its_weights_share(sources, cache_dir, tmp_path):
    trainer = Trainer(_config(sources, cache_dir, tmp_path / "run"), log=lambda *_: None)
    batches = trainer.train_batches
    assert isinstance(batches, MixedBatches) and batches.names == ["a", "b"]
    seen = [_source_of(batches[k], trainer.tokenizer) for k in range(400)]
    assert max(other for _, other in seen) < 0.1  # never two sources in one batch
    from_a = np.cumsum([name == "a" for name, _ in seen])
    # after every number of batches, a's count is within a batch of three quarters of them
    assert np.abs(from_a - 0.75 * np.arange(1, 401)).max() <= 1.0
    assert batches.counts(400).tolist() == [300, 100] == [from_a[-1], 400 - from_a[-1]]
    # each source keeps its own held-out split; evaluation reads both
    held_out = trainer.eval_batches
    texts = [trainer.tokenizer.decode(held_out.docs.sentence(d, 0)[0].tolist())
             for d in range(len(held_out.docs))]
    assert {any(w in t for w in WORDS["a"].split()) for t in texts} == {True, False}


def test_the_logged_share_matches_the_weights_and_a_resume_is_exact(sources, cache_dir, tmp_path):
    straight = tmp_path / "straight"
    Trainer(_config(sources, cache_dir, straight, steps=8), log=lambda *_: None).train()
    records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "loss" in r][-1]
    assert last["step"] == 8 and (last["source/a/share"], last["source/b/share"]) == (0.75, 0.25)
    # a run stopped after its step-4 checkpoint, resumed: its last checkpoint removed
    resumed = tmp_path / "resumed"
    cfg = _config(sources, cache_dir, resumed, "trainer.checkpoint_every=4", steps=8)
    Trainer(cfg, log=lambda *_: None).train()
    shutil.rmtree(resumed / "checkpoints" / "step-0000008")
    Trainer(_config(sources, cache_dir, resumed, "trainer.checkpoint_every=4", steps=8),
            log=lambda *_: None, resume=True).train()
    assert json.loads((resumed / "checkpoints" / "step-0000008" / "trainer.json").read_text())
    a, b = final_weights(straight), final_weights(resumed)
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)


def test_a_temperature_weighs_the_sources_by_size(sources, cache_dir, tmp_path):
    a, b = sources
    overrides = [o for o in tiny_overrides(a, cache_dir, tmp_path / "run", 4)
                 if not o.startswith("data.corpus")]
    cfg = load_config("roberta", overrides + [f"data.sources=[{{corpus: {a}}}, {{corpus: {b}}}]",
                                              "data.mix_temperature=2"])
    trainer = Trainer(cfg, log=lambda *_: None)
    tokens = np.array([TokenizedDocuments.from_documents(read_corpus(str(path)), trainer.tokenizer)
                       .num_tokens() for path in (a, b)], dtype=float)
    expected = tokens ** 0.5 / (tokens ** 0.5).sum()  # T=2: closer to even than by size
    assert np.allclose(trainer.train_batches.share, expected)
    assert tokens[0] / tokens.sum() > expected[0] > 0.5


def test_prepared_sources_share_one_tokenizer(sources, cache_dir, tmp_path, capsys):
    a, b = sources
    assert main(["prepare", str(a), "--out", str(tmp_path / "pa"), "--vocab-size", "300"]) == 0
    tokenizer = tmp_path / "pa" / "tokenizer.json"
    assert main(["prepare", str(b), "--out", str(tmp_path / "pb"), "--tokenizer", str(tokenizer)]) == 0
    assert main(["prepare", str(b), "--out", str(tmp_path / "pc"), "--vocab-size", "300"]) == 0
    overrides = [o for o in tiny_overrides(a, cache_dir, tmp_path / "run", 2)
                 if not o.startswith("data.corpus")]
    mix = f"data.sources=[{{prepared: {tmp_path / 'pa'}}}, {{prepared: {tmp_path / 'pb'}, name: b}}]"
    assert main(["train", "roberta", *overrides, mix]) == 0
    capsys.readouterr()
    other = f"data.sources=[{{prepared: {tmp_path / 'pa'}}}, {{prepared: {tmp_path / 'pc'}}}]"
    assert main(["train", "roberta", *overrides, other, "trainer.overwrite_output_dir=true"]) == 2
    assert capsys.readouterr().err == (
        f"pretextual: error: data.sources[1].prepared: {tmp_path / 'pc'} was prepared with another "
        f"tokenizer than the run's; prepare every source with --tokenizer the same tokenizer.json\n")


@pytest.mark.parametrize("mix, message", [
    ("[{corpus: a.txt, weight: -1}]", "data.sources[0].weight must be a finite number, not negative, got -1.0"),
    ("[{corpus: a.txt, weight: 0}, {corpus: b.txt, weight: 0}]", "data.sources: every weight is zero"),
    ("[{corpus: x/a.txt}, {corpus: y/a.txt}]", "data.sources: two sources are named 'a'; set data.sources[i].name"),
    ("[{weight: 1}]", "data.sources[0]: give exactly one of corpus and prepared"),
])
def test_bad_sources_are_one_line(mix, message):
    with pytest.raises(ConfigError) as error:
        load_config("roberta", [f"data.sources={mix}"])
    assert str(error.value) == message


def test_a_temperature_with_weights_or_without_sources_is_refused():
    with pytest.raises(ConfigError, match=r"^data.sources\[0\].weight: data.mix_temperature weighs"):
        load_config("roberta", ["data.sources=[{corpus: a.txt, weight: 1}]", "data.mix_temperature=2"])
    with pytest.raises(ConfigError, match=r"^data.mix_temperature: mixes data.sources, and none"):
        load_config("roberta", ["data.mix_temperature=2"])
