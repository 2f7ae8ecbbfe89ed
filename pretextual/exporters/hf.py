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

import torch
from tokenizers import Tokenizer, processors

from pretextual.core.encoder import EncoderConfig
from pretextual.core.tokenizer import vocab_of

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
ENCODER_PREFIX = "bert."  # Hugging Face's base_model_prefix, used when heads are written

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


def with_post_processor(tokenizer: Tokenizer) -> Tokenizer:
    """A copy that adds [CLS] A [SEP] (B [SEP]) with token_type_ids 0/1, as the
    data pipeline builds examples; a tokenizer that has a post-processor is kept."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    if copy.post_processor is None:
        vocab = vocab_of(copy)
        cls, sep = copy.id_to_token(vocab.cls_id), copy.id_to_token(vocab.sep_id)
        copy.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, vocab.cls_id), (sep, vocab.sep_id)])
    return copy


def tokenizer_files(tokenizer: Tokenizer, model_max_length: int) -> dict[str, str]:
    """The files AutoTokenizer reads, by name: tokenizer.json, tokenizer_config.json,
    special_tokens_map.json and, for WordPiece, vocab.txt."""
    vocab = vocab_of(tokenizer)
    data = json.loads(tokenizer.to_str())
    special = {role: tokenizer.id_to_token(getattr(vocab, f"{role}_id"))
               for role in ("unk", "sep", "pad", "cls", "mask")}
    special_map = {f"{role}_token": token for role, token in special.items()}
    wordpiece = data["model"]["type"] == "WordPiece"
    normalizer = data.get("normalizer") or {}
    config = {"tokenizer_class": "BertTokenizer" if wordpiece else "PreTrainedTokenizerFast",
              "model_max_length": model_max_length, "clean_up_tokenization_spaces": False,
              **special_map}
    if normalizer.get("type") == "BertNormalizer":
        config["do_lower_case"] = bool(normalizer.get("lowercase"))
    files = {"tokenizer.json": tokenizer.to_str(pretty=True),
             TOKENIZER_CONFIG_FILE: json.dumps(config, indent=2),
             "special_tokens_map.json": json.dumps(special_map, indent=2)}
    if wordpiece:
        by_id = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        files["vocab.txt"] = "".join(token + "\n" for token, _ in by_id)
    return files
