"""The end of a run says what it learned: MLM accuracy against the unigram stage, each
downstream probe against the untrained encoder, and fill-mask guesses on held-out text."""

import json
import re

import numpy as np

from pretextual.analysis.summary import unigram_accuracy
from pretextual.cli import main
from pretextual.core.documents import TokenizedDocuments
from pretextual.core.tokenizer import train_wordpiece, vocab_of
from run_helpers import tiny_overrides, write_topic_task


def test_a_run_ends_with_what_it_learned(corpus_file, cache_dir, tmp_path, capsys):
    task = write_topic_task(tmp_path / "topics.jsonl")
    out = tmp_path / "run"
    assert main(["train", "bert", *tiny_overrides(corpus_file, cache_dir, out, 30),
                 "data.eval_fraction=0.2", "trainer.lr=3e-3", "trainer.eval_every=15",
                 f"trainer.eval_tasks=[{task}]"]) == 0
    printed = capsys.readouterr().out
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    start = lines[0]
    assert start["step"] == 0 and set(start) == {"step", "eval/topics/accuracy", "time"}
    final = [l for l in lines if "eval/topics/accuracy" in l][-1]
    assert final["step"] == 30
    assert re.search(r"held-out MLM accuracy 0\.\d{4}: (past|still at) the unigram stage "
                     r"\(always guessing the most frequent token, '.+', scores 0\.\d{4}\)", printed)
    assert (f"downstream topics (frozen-feature probe, cross-validated): accuracy "
            f"{final['eval/topics/accuracy']:.4f} vs {start['eval/topics/accuracy']:.4f} for the "
            f"untrained encoder") in printed
    examples = printed.split("fill-mask on held-out sentences:\n")[1].splitlines()[:3]
    assert len(examples) == 3
    for line in examples:
        guesses = re.fullmatch(r'  ".*\[MASK\].*" -> (.+) \(held-out word: \w+\)', line)
        assert guesses, line
        probabilities = [float(g.rsplit(" ", 1)[1]) for g in guesses.group(1).split(", ")]
        assert len(probabilities) == 3 and probabilities == sorted(probabilities, reverse=True)


def test_the_unigram_stage_is_the_most_frequent_ordinary_token():
    tokenizer = train_wordpiece(["a a a b c . [CLS]", "a b . ."], 60)
    vocab = vocab_of(tokenizer)
    from pretextual.core.corpus import Document
    docs = TokenizedDocuments.from_documents([Document(["a a a b c .", "a b . ."], "d")], tokenizer)
    share, token = unigram_accuracy(docs, vocab)
    assert tokenizer.id_to_token(token) == "a" and np.isclose(share, 4 / 10)


def test_the_summary_task_compares_the_final_encoder_with_its_start(corpus_file, cache_dir,
                                                                   tmp_path, capsys):
    task = write_topic_task(tmp_path / "topics.jsonl")
    out = tmp_path / "run"
    assert main(["train", "roberta", *tiny_overrides(corpus_file, cache_dir, out, 10),
                 "data.eval_fraction=0.2", f"trainer.summary_task={task}"]) == 0
    printed = capsys.readouterr().out
    found = re.search(r"downstream topics \(frozen-feature probe, cross-validated\): accuracy "
                      r"(0\.\d{4}|1\.0000) vs (0\.\d{4}|1\.0000) for the untrained encoder", printed)
    assert found, printed
    assert float(found.group(2)) > 0.5  # even random features separate six topics' words
    assert not any('"step": 0' in l for l in (out / "metrics.jsonl").read_text().splitlines())
