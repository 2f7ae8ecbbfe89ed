"""The exported tokenizer frames text exactly as training did, whatever tokenizer the run
used (WordPiece trained by pretextual, a RoBERTa-style byte-level BPE, a SentencePiece-style
Unigram), and returns exactly the inputs the ONNX model takes."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from export_helpers import STEPS, reference_model
from pretextual.core.config import load_config
from pretextual.core.corpus import Document
from pretextual.core.data import pair_example, single_segment
from pretextual.core.documents import TokenizedDocuments
from pretextual.core.tokenizer import load_tokenizer, vocab_of
from pretextual.core.trainer import Trainer
from pretextual.exporters.hf import with_post_processor, write_tokenizer
from run_helpers import tiny_overrides

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

A = "The boat sees the river bank."
B = "A guard follows the King, 1999!"
ONNX_TOLERANCE = 1e-4


def corpus_lines(corpus_file) -> list[str]:
    return [line for line in corpus_file.read_text().splitlines() if line]


def byte_level_bpe(lines: list[str]) -> Tokenizer:
    """RoBERTa's layout: <s> </s> <pad> <unk> <mask>, byte-level BPE whose own
    post-processor (ByteLevel) trims offsets and adds no token."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=True)
    bpe.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return bpe


def unigram(lines: list[str]) -> Tokenizer:
    """SentencePiece's layout (Metaspace), with XLNet's framing (A <sep> <cls>), which the
    export must replace by the one training used."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(lines, trainers.UnigramTrainer(
        vocab_size=200, special_tokens=["<pad>", "<unk>", "<cls>", "<sep>", "<mask>"],
        unk_token="<unk>", show_progress=False))
    cls, sep = tokenizer.token_to_id("<cls>"), tokenizer.token_to_id("<sep>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2", pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep), ("<cls>", cls)])
    return tokenizer


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_file, cache_dir, mlm_run, full_export):
    """kind -> (run directory, its export, the framing tokens): the session's WordPiece run,
    and a run of each other tokenizer, exported at the end of training."""
    made = {"wordpiece": (mlm_run, full_export[0], ("[CLS]", "[SEP]"))}
    for kind, build, framing in (("bpe", byte_level_bpe, ("<s>", "</s>")),
                                 ("unigram", unigram, ("<cls>", "<sep>"))):
        root = tmp_path_factory.mktemp(kind)
        build(corpus_lines(corpus_file)).save(str(root / "tokenizer.json"))
        run = root / "run"
        cfg = load_config("roberta", tiny_overrides(corpus_file, cache_dir, run, STEPS) + [
            f"data.tokenizer={root / 'tokenizer.json'}", "trainer.export=safetensors,onnx"])
        Trainer(cfg, log=lambda *a: None).train()
        made[kind] = (run, run / "export", framing)
    return made


def pipeline_examples(run_dir):
    """What the data pipeline builds from A alone and from the pair (A, B)."""
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    vocab = vocab_of(tokenizer)
    docs = TokenizedDocuments.from_documents([Document([A, B], "test")], tokenizer)
    return (single_segment(*docs.sentence(0, 0), vocab),
            pair_example(docs.sentence(0, 0), docs.sentence(0, 1), vocab))


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_autotokenizer_frames_text_as_the_data_pipeline(runs, kind):
    run, export, (cls, sep) = runs[kind]
    theirs = transformers.AutoTokenizer.from_pretrained(export)
    single, pair = pipeline_examples(run)
    got = theirs(A, B)
    assert got["input_ids"] == pair["input_ids"].tolist()
    assert got["token_type_ids"] == pair["token_type_ids"].tolist()
    n_a = single["input_ids"].size - 2
    assert got["token_type_ids"] == [0] * (n_a + 2) + [1] * (len(got["input_ids"]) - n_a - 2)
    tokens = theirs.convert_ids_to_tokens(got["input_ids"])
    assert (tokens[0], tokens[n_a + 1], tokens[-1]) == (cls, sep, sep)
    assert tokens.count(cls) == 1 and tokens.count(sep) == 2
    alone = theirs(A)
    assert alone["input_ids"] == single["input_ids"].tolist()
    assert alone["token_type_ids"] == [0] * len(alone["input_ids"])
    assert theirs.model_input_names == ["input_ids", "token_type_ids", "attention_mask"]
    assert theirs.cls_token == cls and theirs.sep_token == sep and theirs.model_max_length == 32


def test_byte_level_offsets_stay_trimmed(runs):
    _, export, _ = runs["bpe"]
    steps = json.loads((export / "tokenizer.json").read_text())["post_processor"]["processors"]
    assert [s["type"] for s in steps] == ["ByteLevel", "TemplateProcessing"]
    theirs = transformers.AutoTokenizer.from_pretrained(export)
    offsets = theirs(A, return_offsets_mapping=True)["offset_mapping"]
    words = [A[start:end] for start, end in offsets if end > start]
    assert len(words) > 6 and not any(w.startswith(" ") for w in words)  # no leading space kept
    assert offsets[0] == (0, 0) and offsets[-1] == (0, 0)  # <s> and </s>


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_onnx_takes_exactly_what_the_tokenizer_returns(runs, kind):
    run, export, _ = runs[kind]
    theirs = transformers.AutoTokenizer.from_pretrained(export)
    feed = dict(theirs([A, "Water moves."], [B, "Fish."], padding=True, return_tensors="np"))
    session = ort.InferenceSession(str(export / "model.onnx"), providers=["CPUExecutionProvider"])
    assert sorted(feed) == sorted(i.name for i in session.get_inputs())
    assert (feed["attention_mask"] == 0).any() and (feed["token_type_ids"] == 1).any()
    last, pooled = session.run(["last_hidden_state", "pooler_output"], feed)
    with torch.no_grad():
        expected = reference_model(run).bert(**{k: torch.from_numpy(v) for k, v in feed.items()})
    real = feed["attention_mask"].astype(bool)  # padding positions are meaningless
    assert np.abs(last - expected.last_hidden_state.numpy())[real].max() <= ONNX_TOLERANCE
    assert np.abs(pooled - expected.pooler_output.numpy()).max() <= ONNX_TOLERANCE


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_without_transformers_the_files_written_by_hand_read_the_same(runs, kind, tmp_path,
                                                                      monkeypatch):
    run, export, _ = runs[kind]
    tokenizer = with_post_processor(Tokenizer.from_file(str(run / "tokenizer.json")))
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
        names = write_tokenizer(tokenizer, 32, tmp_path)
    assert "special_tokens_map.json" in names and ("vocab.txt" in names) == (kind == "wordpiece")
    by_hand = transformers.AutoTokenizer.from_pretrained(tmp_path)
    saved = transformers.AutoTokenizer.from_pretrained(export)
    for texts in ((A,), (A, B)):
        assert by_hand(*texts) == saved(*texts)
    assert by_hand.model_max_length == 32 and by_hand.mask_token == saved.mask_token
