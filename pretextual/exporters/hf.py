"""Hugging Face's names: config.json, the pretraining heads' keys, the tokenizer files.

pretextual's encoder already uses BertModel's parameter names, so only the
heads are renamed: a head whose tensors are exactly those of Hugging Face's
BertLMPredictionHead becomes ``cls.predictions.*``, a 2-way classifier named
"nsp" becomes ``cls.seq_relationship.*``. Any other head (SOP, a third-party
head) has no Hugging Face counterpart and keeps its own name.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, processors

from pretextual.core.encoder import EncoderConfig
from pretextual.core.tokenizer import vocab_of
from pretextual.errors import PretextualError

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
ENCODER_PREFIX = "bert."  # Hugging Face's base_model_prefix, used when heads are written
MODEL_INPUT_NAMES = ["input_ids", "token_type_ids", "attention_mask"]
"""What the exported tokenizer returns: BERT's inputs, the ONNX model's (all three required)."""

# Head name -> (Hugging Face prefix, shape of each tensor as a function of (hidden, vocab)).
HF_HEADS = {
    "mlm": ("cls.predictions.", {
        "bias": lambda h, v: (v,),
        "transform.dense.weight": lambda h, v: (h, h),
        "transform.dense.bias": lambda h, v: (h,),
        "transform.LayerNorm.weight": lambda h, v: (h,),
        "transform.LayerNorm.bias": lambda h, v: (h,),
    }),
    "nsp": ("cls.seq_relationship.", {
        "weight": lambda h, v: (2, h),
        "bias": lambda h, v: (2,),
    }),
}


def hf_counterpart(name: str, tensors: dict[str, torch.Tensor], config: EncoderConfig) -> str | None:
    """The Hugging Face prefix of head ``name``, or None when its tensors are not exactly
    those of the Hugging Face head of that role (a same-named head of another shape)."""
    if name not in HF_HEADS:
        return None
    prefix, shapes = HF_HEADS[name]
    expected = {k: f(config.hidden_size, config.vocab_size) for k, f in shapes.items()}
    found = {k: tuple(t.shape) for k, t in tensors.items()}
    return prefix if found == expected else None


def architecture(hf_heads: set[str]) -> str:
    """The Hugging Face class a checkpoint with these heads is saved from."""
    if "nsp" in hf_heads:
        return "BertForPreTraining" if "mlm" in hf_heads else "BertForNextSentencePrediction"
    return "BertForMaskedLM" if "mlm" in hf_heads else "BertModel"


def config_json(config: EncoderConfig, architecture_name: str) -> dict:
    """config.json for transformers: model_type "bert" and the BertConfig fields."""
    return {"architectures": [architecture_name], "model_type": "bert", **config.to_dict(),
            "position_embedding_type": "absolute", "classifier_dropout": None,
            "tie_word_embeddings": True, "dtype": "float32"}


def encoder_config_from_json(data: dict) -> EncoderConfig:
    """The EncoderConfig of a config.json (keys EncoderConfig lacks are ignored);
    raises KeyError/TypeError/ValueError for a config that is not BERT's."""
    if data.get("model_type") != "bert":
        raise ValueError(f"model_type is {data.get('model_type')!r}, not 'bert'")
    names = {f.name for f in dataclasses.fields(EncoderConfig)}
    return EncoderConfig(**{k: v for k, v in data.items() if k in names})


def _offset_trimming(processor: dict | None) -> list:
    """The byte-level offset trimming a post-processor does (a ByteLevel step, alone or in
    a Sequence, or RobertaProcessing's own), as ByteLevel steps: they add no tokens."""
    if not processor:
        return []
    if processor["type"] == "Sequence":
        return [step for p in processor["processors"] for step in _offset_trimming(p)]
    if processor["type"] in ("ByteLevel", "RobertaProcessing") and processor.get("trim_offsets"):
        return [processors.ByteLevel(trim_offsets=True,
                                     add_prefix_space=processor.get("add_prefix_space", True))]
    return []


def with_post_processor(tokenizer: Tokenizer) -> Tokenizer:
    """A copy that frames text as the data pipeline builds examples: cls A sep (B sep),
    token_type_ids 0 through the first sep and 1 after it, in the tokenizer's own
    spelling ([CLS]/[SEP], <s>/</s>...). The framing of a post-processor it has (a
    ByteLevel one adds none, RoBERTa's puts two </s> between the texts) is replaced;
    its byte-level offset trimming is kept."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    vocab = vocab_of(copy)
    cls, sep = copy.id_to_token(vocab.cls_id), copy.id_to_token(vocab.sep_id)
    framing = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab.cls_id), (sep, vocab.sep_id)])
    trimming = _offset_trimming(json.loads(copy.to_str()).get("post_processor"))
    copy.post_processor = processors.Sequence([*trimming, framing]) if trimming else framing
    return copy


def _special_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    """transformers' special-token arguments (unk_token=..., cls_token=...) of a tokenizer."""
    vocab = vocab_of(tokenizer)
    return {f"{role}_token": tokenizer.id_to_token(getattr(vocab, f"{role}_id"))
            for role in ("unk", "sep", "pad", "cls", "mask")}


def _bert_normalizer(data: dict) -> dict | None:
    """The BertNormalizer of a WordPiece tokenizer's JSON (a BERT tokenizer), else None."""
    normalizer = data.get("normalizer") or {}
    bert = data["model"]["type"] == "WordPiece" and normalizer.get("type") == "BertNormalizer"
    return normalizer if bert else None


def _vocab_txt(tokenizer: Tokenizer) -> str:
    """vocab.txt of a WordPiece tokenizer: one token a line, by id."""
    by_id = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    return "".join(token + "\n" for token, _ in by_id)


def tokenizer_files(tokenizer: Tokenizer, model_max_length: int) -> dict[str, str]:
    """The files AutoTokenizer reads, by name, written by hand (for when transformers is
    not installed): tokenizer.json, tokenizer_config.json, special_tokens_map.json and,
    for WordPiece, vocab.txt."""
    data = json.loads(tokenizer.to_str())
    special_map = _special_tokens(tokenizer)
    bert = _bert_normalizer(data)
    config = {"tokenizer_class": "BertTokenizer" if bert else "PreTrainedTokenizerFast",
              "model_max_length": model_max_length, "model_input_names": MODEL_INPUT_NAMES,
              "clean_up_tokenization_spaces": False, **special_map}
    if bert:
        config["do_lower_case"] = bool(bert.get("lowercase"))
    files = {"tokenizer.json": tokenizer.to_str(pretty=True),
             TOKENIZER_CONFIG_FILE: json.dumps(config, indent=2),
             "special_tokens_map.json": json.dumps(special_map, indent=2)}
    if data["model"]["type"] == "WordPiece":
        files["vocab.txt"] = _vocab_txt(tokenizer)
    return files


def write_tokenizer(tokenizer: Tokenizer, model_max_length: int, out_dir: Path) -> list[str]:
    """Write the files AutoTokenizer reads into ``out_dir`` and return their names: with
    transformers' own save_pretrained where transformers is installed (BertTokenizerFast
    for a BERT tokenizer, else PreTrainedTokenizerFast), by hand otherwise; vocab.txt too
    for WordPiece. ``tokenizer`` already frames text (:func:`with_post_processor`);
    transformers is told to return token_type_ids, which BERT and model.onnx read."""
    try:
        import transformers
    except ImportError:
        files = tokenizer_files(tokenizer, model_max_length)
        for name, text in files.items():
            (out_dir / name).write_text(text, encoding="utf-8")
        return list(files)
    data = json.loads(tokenizer.to_str())
    common = {"tokenizer_object": tokenizer, "model_max_length": model_max_length,
              "model_input_names": MODEL_INPUT_NAMES, "clean_up_tokenization_spaces": False,
              **_special_tokens(tokenizer)}
    bert = _bert_normalizer(data)
    if bert:  # the arguments say what the normalizer does, so transformers keeps it as it is
        saved = transformers.BertTokenizerFast(
            do_lower_case=bool(bert.get("lowercase")), strip_accents=bert.get("strip_accents"),
            tokenize_chinese_chars=bool(bert.get("handle_chinese_chars", True)), **common)
    else:
        saved = transformers.PreTrainedTokenizerFast(**common)
    before = set(os.listdir(out_dir))
    saved.save_pretrained(out_dir)
    if data["model"]["type"] == "WordPiece" and not (out_dir / "vocab.txt").exists():
        (out_dir / "vocab.txt").write_text(_vocab_txt(tokenizer), encoding="utf-8")
    _check_tokenizer(transformers, out_dir, tokenizer)
    return sorted(set(os.listdir(out_dir)) - before)


CHECK_PAIR = ("The Quick brown fox, 1999.", "Ça va? Über-naïve résumé!")
"""Text of every kind a normalizer touches (case, accents, digits, punctuation)."""


def _check_tokenizer(transformers, out_dir: Path, tokenizer: Tokenizer) -> None:
    """AutoTokenizer of ``out_dir`` must give the ids and token_type_ids ``tokenizer`` gives."""
    loaded = transformers.AutoTokenizer.from_pretrained(out_dir)
    for texts in (CHECK_PAIR[:1], CHECK_PAIR):
        expected = tokenizer.encode(*texts)
        got = loaded(*texts, verbose=False)  # no warning when longer than model_max_length
        if (got["input_ids"], got.get("token_type_ids")) != (expected.ids, expected.type_ids):
            raise PretextualError(f"{out_dir}: transformers {transformers.__version__} reads the "
                                  f"exported tokenizer otherwise than the run's: {texts!r} gives "
                                  f"{got['input_ids']}, not {expected.ids}")
