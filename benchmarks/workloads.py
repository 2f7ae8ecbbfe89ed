"""What the comparisons run on: sizes, the corpus, one tokenizer for both
frameworks, pretextual's trainers and Hugging Face's models.

pretextual's side is built the way its users run it: a config from a shipped
recipe (``load_config``), then ``Trainer`` (the objective mix from the plugin
registry, the model, the optimizer, the data pipeline). Hugging Face's side
is what its users run: ``BertForPreTraining``/``BertForMaskedLM`` with
``attn_implementation="sdpa"``, a fast tokenizer and ``DataCollatorForLanguageModeling``.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from pretextual.core.config import load_config
from pretextual.core.corpus import Document, embedded_corpus
from pretextual.core.tokenizer import train_wordpiece, vocab_of
from pretextual.plugins.api import Batch, Vocab


@dataclass(frozen=True)
class Sizes:
    """Model and batch sizes of a run, and how many rounds it times."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int
    seq: int
    batch: int
    repeats: int
    warmup: int
    corpus_documents: int | None  # None: the whole embedded corpus
    masking_batches: int
    latency_calls_b1: int  # batch-1 inference calls per timed round
    settle: float  # seconds idle before each case: the previous one's spinning threads go to sleep
    round_seconds: float  # a training case repeats its step for at least this long in a round
    smoke: bool = False  # tiny sizes that prove the benchmark runs and measure nothing

    def encoder_overrides(self) -> list[str]:
        return [f"model.num_hidden_layers={self.layers}", f"model.hidden_size={self.hidden}",
                f"model.num_attention_heads={self.heads}",
                f"model.intermediate_size={self.intermediate}",
                f"model.max_position_embeddings={max(512, self.seq)}"]

    def describe(self) -> str:
        return (f"{self.layers} layers, hidden {self.hidden}, {self.heads} heads, intermediate "
                f"{self.intermediate}, vocab {self.vocab}, sequence {self.seq}, batch {self.batch}")


REFERENCE = Sizes(layers=4, hidden=256, heads=4, intermediate=1024, vocab=30522, seq=128, batch=32,
                  repeats=7, warmup=2, corpus_documents=None, masking_batches=256,
                  latency_calls_b1=10, settle=0.2,
                  round_seconds=2.0)
"""The issue's reference config."""

SMOKE = Sizes(layers=2, hidden=64, heads=2, intermediate=256, vocab=1000, seq=32, batch=4,
              repeats=1, warmup=1, corpus_documents=24, masking_batches=4, latency_calls_b1=2,
              settle=0.0, round_seconds=0.0, smoke=True)
"""Tiny sizes and one round: proves the benchmark runs, measures nothing."""

QUALITY = replace(REFERENCE, vocab=8192, seq=64, batch=64)
"""The time-to-quality comparison's vocabulary, sequence length and batch: the main job's (its
models are the recipes' own tiny presets, not REFERENCE's layer sizes)."""


# --- corpus and tokenizer -----------------------------------------------------------------------

def corpus_documents(sizes: Sizes) -> list[Document]:
    docs = embedded_corpus()
    return docs if sizes.corpus_documents is None else docs[:sizes.corpus_documents]


def write_corpus(docs: list[Document], path: Path) -> Path:
    """The documents as a text corpus in Google's BERT format (one sentence per
    line, a blank line between documents), the way both frameworks read text."""
    path.write_text("\n\n".join("\n".join(d.sentences) for d in docs) + "\n", encoding="utf-8")
    return path


def unused_token(i: int) -> str:
    return f"[unused{i}]"


def shared_tokenizer(docs: list[Document], vocab_size: int, path: Path):
    """A WordPiece tokenizer trained on the corpus, its vocabulary filled up to
    ``vocab_size`` with [unusedN] tokens (as bert-base-uncased's vocabulary has
    them) when the corpus is too small to learn that many pieces, so both
    frameworks' models have the reference vocabulary size. Written to ``path``."""
    import json

    from tokenizers import Tokenizer

    tokenizer = train_wordpiece((s for d in docs for s in d.sentences), vocab_size)
    missing = vocab_size - tokenizer.get_vocab_size()
    if missing > 0:
        # Into the WordPiece vocabulary itself, not as added tokens: the pre-tokenizer splits
        # "[", so these pieces never match text and tokenizing costs the same as before.
        spec = json.loads(tokenizer.to_str())
        table = spec["model"]["vocab"]
        first = len(table)
        table.update({unused_token(i): first + i for i in range(missing)})
        tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.save(str(path))
    return tokenizer


def hf_tokenizer(tokenizer, vocab: Vocab):
    """The same tokenizer as a transformers fast tokenizer that adds [CLS] ... [SEP]."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab.cls_id), ("[SEP]", vocab.sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=copy, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


@dataclass
class Workspace:
    """The shared inputs of one benchmark run (temporary files live in ``root``)."""

    sizes: Sizes
    device: torch.device
    root: Path
    docs: list[Document]
    corpus_file: Path
    tokenizer_file: Path
    tokenizer: object
    vocab: Vocab
    precisions: tuple[str, ...] = ("fp32", "bf16")
    """The training precisions timed (``--precisions``)."""
    peaks: dict = field(default_factory=dict)
    """The matmul peaks the training section measured (precision -> flops.Peak), for later sections."""

    @classmethod
    def create(cls, sizes: Sizes, device: torch.device, root: Path,
               precisions: tuple[str, ...] = ("fp32", "bf16")) -> "Workspace":
        docs = corpus_documents(sizes)
        corpus_file = write_corpus(docs, root / "corpus.txt")
        tokenizer_file = root / "tokenizer.json"
        tokenizer = shared_tokenizer(docs, sizes.vocab, tokenizer_file)
        return cls(sizes, device, root, docs, corpus_file, tokenizer_file, tokenizer,
                   vocab_of(tokenizer), precisions)

    @classmethod
    def reopen(cls, sizes: Sizes, device: torch.device, root: Path) -> "Workspace":
        """The workspace another process created in ``root`` (same documents and tokenizer)."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        return cls(sizes, device, root, corpus_documents(sizes), root / "corpus.txt",
                   root / "tokenizer.json", tokenizer, vocab_of(tokenizer))

    @property
    def lines(self) -> list[str]:
        """The corpus line by line (one sentence a line), as Hugging Face's line_by_line reads it."""
        return [s for d in self.docs for s in d.sentences]

    def config(self, recipe: str, *overrides: str, sized: bool = True):
        """A pretextual config from a shipped recipe, at the run's sizes (``sized=False``: its
        model the recipe's own preset; the run's vocabulary, length and batch), reading the
        shared corpus."""
        s = self.sizes
        run_dir = Path(tempfile.mkdtemp(prefix=f"{recipe}-", dir=self.root))
        return load_config(recipe, [
            f"data.corpus={self.corpus_file}", f"data.tokenizer={self.tokenizer_file}",
            f"data.cache_dir={self.root / 'cache'}", f"data.max_seq_length={s.seq}",
            f"data.batch_size={s.batch}", "data.eval_fraction=0", f"trainer.output_dir={run_dir}",
            f"trainer.device={self.device.type}", "trainer.progress=false",
            *(s.encoder_overrides() if sized else ()), *overrides])

    def trainer(self, recipe: str, *overrides: str):
        from pretextual.core.trainer import Trainer
        return Trainer(self.config(recipe, *overrides), log=lambda *_: None)


# --- Hugging Face models ------------------------------------------------------------------------

def hf_config(sizes: Sizes, vocab: Vocab):
    from transformers import BertConfig
    return BertConfig(vocab_size=vocab.size, hidden_size=sizes.hidden,
                      num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads,
                      intermediate_size=sizes.intermediate, max_position_embeddings=max(512, sizes.seq),
                      pad_token_id=vocab.pad_id, attn_implementation="sdpa")


def hf_model(kind: str, sizes: Sizes, vocab: Vocab, device: torch.device):
    """BertForPreTraining or BertForMaskedLM at the run's sizes, in training mode."""
    import transformers
    model = getattr(transformers, kind)(hf_config(sizes, vocab)).to(device)
    return model.train()


def decay_groups_like_hf(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Hugging Face Trainer's grouping: no weight decay on biases and LayerNorm weights."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "LayerNorm" in name or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer's class and settings without its parameters (picklable, so a
    side built in another process gets the same optimizer)."""

    cls: type
    defaults: dict
    weight_decay: float

    @classmethod
    def of(cls, reference: torch.optim.Optimizer) -> "OptimizerSpec":
        """``reference``'s class and settings (learning rate, betas, eps, weight decay,
        fused/foreach), so both frameworks pay the same optimizer cost."""
        import inspect

        defaults = dict(reference.defaults)
        weight_decay = max(g.get("weight_decay", 0.0) for g in reference.param_groups)
        defaults.pop("weight_decay", None)
        # Keep only settings the constructor takes (some torch versions record extra defaults).
        accepted = set(inspect.signature(type(reference).__init__).parameters)
        return cls(type(reference), {k: v for k, v in defaults.items() if k in accepted},
                   weight_decay)

    def build(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """The optimizer for ``model``, with Hugging Face Trainer's no-decay grouping."""
        return self.cls(decay_groups_like_hf(model, self.weight_decay), **self.defaults)


def optimizer_description(optimizer: torch.optim.Optimizer) -> str:
    d = optimizer.defaults
    impl = "fused" if d.get("fused") else "foreach" if d.get("foreach") else "default implementation"
    return (f"{type(optimizer).__name__} (lr {d.get('lr')}, betas {tuple(d.get('betas', ()))}, "
            f"eps {d.get('eps')}, {impl})")


# --- batches ------------------------------------------------------------------------------------

def synthetic_pair_batch(sizes: Sizes, vocab: Vocab, seed: int = 0) -> Batch:
    """A full batch (no padding) of [CLS] A [SEP] B [SEP] rows of random ordinary
    tokens, with next_sentence_label, before masking (pretextual's batch layout)."""
    g = torch.Generator().manual_seed(seed)
    b, n = sizes.batch, sizes.seq
    ordinary = vocab.ordinary_ids()
    ids = ordinary[torch.randint(len(ordinary), (b, n), generator=g)]
    split = torch.randint(n // 4, 3 * n // 4, (b,), generator=g)
    positions = torch.arange(n)[None, :]
    ids[:, 0] = vocab.cls_id
    ids[torch.arange(b), split] = vocab.sep_id
    ids[:, -1] = vocab.sep_id
    special = (positions == 0) | (positions == split[:, None]) | (positions == n - 1)
    return {"input_ids": ids, "attention_mask": torch.ones(b, n, dtype=torch.long),
            "token_type_ids": (positions > split[:, None]).long(),
            "special_tokens_mask": special, "word_starts": torch.ones(b, n, dtype=torch.bool),
            "next_sentence_label": torch.randint(0, 2, (b,), generator=g)}


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def word_starts_of(encoding_word_ids: list) -> np.ndarray:
    """1 where a token begins a word (special tokens count as words of their own)."""
    starts = np.ones(len(encoding_word_ids), dtype=np.uint8)
    for j in range(1, len(encoding_word_ids)):
        w = encoding_word_ids[j]
        starts[j] = w is None or w != encoding_word_ids[j - 1]
    return starts


@dataclass
class MaskedStep:
    """What a training-step comparison steps: one masked synthetic batch on the host and on
    the device, its MLM predictions and tokens, and the trainer's clipping norm and optimizer."""

    host_batch: Batch
    batch: Batch
    predictions: int
    tokens: int
    max_norm: float
    optimizer: OptimizerSpec


def masked_step(trainer, sizes: Sizes, vocab: Vocab, device: torch.device) -> MaskedStep:
    """The trainer's objective mix applied (with a fixed seed) to the synthetic pair batch."""
    from pretextual.objectives.masking import IGNORE_INDEX
    generator = torch.Generator().manual_seed(1)
    host_batch = trainer.mix.batch_transform(synthetic_pair_batch(sizes, vocab), generator)
    batch = to_device(host_batch, device)
    return MaskedStep(host_batch, batch, int((batch["mlm_labels"] != IGNORE_INDEX).sum()),
                      sizes.batch * sizes.seq, trainer.cfg.trainer.max_grad_norm,
                      OptimizerSpec.of(trainer.optimizer))
