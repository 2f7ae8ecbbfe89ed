"""Hugging Face's names: config.json, the encoder's and the pretraining heads' keys, the
tokenizer files, for each architecture transformers has a native class of.

pretextual's encoders already use transformers' parameter names (BertModel's,
ModernBertModel's), so only the heads are renamed: a head whose tensors are exactly
those of the architecture's transformers head of that role becomes its keys (BERT's
``cls.predictions.*`` and ``cls.seq_relationship.*``; ModernBERT's ``head.*`` and
``decoder.bias``). Any other head (SOP, a third-party head) has no Hugging Face
counterpart and keeps its own name.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tokenizers import Tokenizer, processors

from pretextual.architectures.bert import BertConfig
from pretextual.architectures.modernbert import ModernBertConfig
from pretextual.core.tokenizer import vocab_of
from pretextual.errors import PretextualError
from pretextual.plugins.api import Vocab

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
MODEL_INPUT_NAMES = ["input_ids", "token_type_ids", "attention_mask"]
"""What the exported tokenizer returns: BERT's inputs, the ONNX model's (all three required)."""

Shape = Callable[[int, int], tuple[int, ...]]  # (hidden, vocab) -> a tensor's shape


@dataclass(frozen=True)
class Layout:
    """How transformers saves one architecture: config.json's model_type, the encoder's
    key prefix in a model saved with heads (its base_model_prefix), each pretraining
    head's keys (pretextual's key -> transformers' key and shape), the keys it ties to
    the word embeddings (which a file may hold and nothing reads), and the class saved
    with a given set of heads."""

    model_type: str
    config: type
    prefix: str
    heads: dict[str, dict[str, tuple[str, Shape]]]
    tied: tuple[str, ...]
    classes: Callable[[set[str]], str]
    config_json: Callable[[Any, Vocab], dict]
    config_fields: Callable[[dict], dict]


def _bert_class(hf_heads: set[str]) -> str:
    if "nsp" in hf_heads:
        return "BertForPreTraining" if "mlm" in hf_heads else "BertForNextSentencePrediction"
    return "BertForMaskedLM" if "mlm" in hf_heads else "BertModel"


def _bert_json(config: BertConfig, vocab: Vocab) -> dict:
    return {**config.to_dict(), "position_embedding_type": "absolute", "classifier_dropout": None}


def _modernbert_json(config: ModernBertConfig, vocab: Vocab) -> dict:
    # transformers 5 reads the layer pattern and rotary bases from layer_types and
    # rope_parameters; the older fields stay for transformers 4.
    layer_types = ["full_attention" if config.is_global(i) else "sliding_attention"
                   for i in range(config.num_hidden_layers)]
    rope = {"full_attention": {"rope_type": "default", "rope_theta": config.global_rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta}}
    return {**config.to_dict(), "layer_types": layer_types, "rope_parameters": rope,
            "cls_token_id": vocab.cls_id, "sep_token_id": vocab.sep_id, "bos_token_id": vocab.cls_id,
            "eos_token_id": vocab.sep_id, "classifier_pooling": "cls", "classifier_bias": False,
            "classifier_activation": "gelu", "classifier_dropout": 0.0, "sparse_prediction": False}


def _modernbert_fields(data: dict) -> dict:
    """ModernBertConfig's fields of a transformers 5 config.json (layer_types and
    rope_parameters) or a transformers 4 one (the fields themselves)."""
    data = dict(data)
    rope = data.get("rope_parameters") or {}
    for kind, field in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
        if (rope.get(kind) or {}).get("rope_theta") is not None:
            data.setdefault(field, rope[kind]["rope_theta"])
    types = data.get("layer_types")
    if types:
        every = next((i for i, t in enumerate(types) if t == "full_attention" and i), len(types))
        expected = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(len(types))]
        if types != expected:
            raise ValueError(f"layer_types {types} is not a global layer every n layers from the first")
        data.setdefault("global_attn_every_n_layers", every)
    return data


LAYOUTS = {
    "bert": Layout(
        model_type="bert", config=BertConfig, prefix="bert.",
        heads={"mlm": {"bias": ("cls.predictions.bias", lambda h, v: (v,)),
                       "transform.dense.weight": ("cls.predictions.transform.dense.weight",
                                                  lambda h, v: (h, h)),
                       "transform.dense.bias": ("cls.predictions.transform.dense.bias",
                                                lambda h, v: (h,)),
                       "transform.LayerNorm.weight": ("cls.predictions.transform.LayerNorm.weight",
                                                      lambda h, v: (h,)),
                       "transform.LayerNorm.bias": ("cls.predictions.transform.LayerNorm.bias",
                                                    lambda h, v: (h,))},
               "nsp": {"weight": ("cls.seq_relationship.weight", lambda h, v: (2, h)),
                       "bias": ("cls.seq_relationship.bias", lambda h, v: (2,))}},
        tied=("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
        classes=_bert_class, config_json=_bert_json, config_fields=dict),
    "modernbert": Layout(
        model_type="modernbert", config=ModernBertConfig, prefix="model.",
        heads={"mlm": {"transform.dense.weight": ("head.dense.weight", lambda h, v: (h, h)),
                       "transform.norm.weight": ("head.norm.weight", lambda h, v: (h,)),
                       "bias": ("decoder.bias", lambda h, v: (v,))}},
        tied=("decoder.weight",),
        classes=lambda hf_heads: "ModernBertForMaskedLM" if "mlm" in hf_heads else "ModernBertModel",
        config_json=_modernbert_json, config_fields=_modernbert_fields),
}
"""The transformers layout of each architecture that has one, by architecture name."""


def layout(config) -> Layout:
    """The transformers layout of ``config``'s architecture; PretextualError for one
    transformers has no class of."""
    if config.architecture not in LAYOUTS:
        raise PretextualError(f"the {config.architecture} architecture has no transformers "
                              f"counterpart to export to (those that do: {', '.join(LAYOUTS)})")
    return LAYOUTS[config.architecture]


def hf_counterpart(name: str, tensors: dict[str, torch.Tensor], config) -> dict[str, str] | None:
    """pretextual key -> transformers key of head ``name``, or None when its tensors are not
    exactly those of the transformers head of that role (a same-named head of another shape)."""
    keys = layout(config).heads.get(name)
    if keys is None:
        return None
    expected = {k: shape(config.hidden_size, config.vocab_size) for k, (_, shape) in keys.items()}
    found = {k: tuple(t.shape) for k, t in tensors.items()}
    return {k: hf for k, (hf, _) in keys.items()} if found == expected else None


def architecture(config, hf_heads: set[str]) -> str:
    """The transformers class a model with these heads is saved as."""
    return layout(config).classes(hf_heads)


def config_json(config, architecture_name: str, vocab: Vocab) -> dict:
    """config.json for transformers: the architecture's model_type and config fields."""
    found = layout(config)
    return {"architectures": [architecture_name], "model_type": found.model_type,
            **found.config_json(config, vocab), "tie_word_embeddings": True, "dtype": "float32"}


def encoder_config_from_json(data: dict):
    """The encoder config of a config.json, by its model_type (keys the config lacks are
    ignored); raises KeyError/TypeError/ValueError for one of another kind."""
    found = next((l for l in LAYOUTS.values() if l.model_type == data.get("model_type")), None)
    if found is None:
        raise ValueError(f"model_type is {data.get('model_type')!r}, not one of "
                         f"{', '.join(repr(l.model_type) for l in LAYOUTS.values())}")
    fields = found.config_fields(data)
    names = {f.name for f in dataclasses.fields(found.config)}
    return found.config(**{k: v for k, v in fields.items() if k in names})


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
