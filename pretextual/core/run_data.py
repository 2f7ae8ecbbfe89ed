"""A run's data: its tokenizer and documents (the same on every process), split into
training and held-out batches that are checked before the first step."""

from __future__ import annotations

from omegaconf import DictConfig
from tokenizers import Tokenizer

from pretextual.core import distributed as dist_utils
from pretextual.core.data import Batches, full_sentences
from pretextual.core.documents import MIN_SPLIT_DOCUMENTS, TokenizedDocuments, split_documents
from pretextual.core.mix import ObjectiveMix
from pretextual.core.prepare import tokenized_corpus
from pretextual.core.sources import MixedBatches, Source, shares, source_corpora
from pretextual.core.tokenizer import tokenizer_sha256
from pretextual.errors import DataError, PluginRunError

EVAL_SEED_OFFSET = 1_000_003  # eval batches use their own fixed stream
SOURCE_SEED_OFFSET = 7_919  # and each source of a mix its own


def _documents(n: int) -> str:
    return f"{n} document{'' if n == 1 else 's'}"


def run_corpus(data: DictConfig, world, device, log, required: Tokenizer | None = None,
               source: str = "", documents: list | None = None):
    """The run's tokenizer and documents (under data.sources, each source's: a list of
    Source). The main process tokenizes (training the
    tokenizer, whose ties tokenizers breaks differently in each process, unless
    ``required``, read from ``source``, is given) and fills the cache; the others tokenize
    with its tokenizer, from the cache when it holds that one. ``documents``: the run's
    documents given in Python (pretextual.train), instead of data.corpus."""
    def read(tokenizer):
        if data.sources:
            return source_corpora(data, log, tokenizer)
        return tokenized_corpus(data, log=log, tokenizer=tokenizer, documents=documents)

    if world.is_main:
        tokenizer, docs = read(required)
    text = dist_utils.broadcast_text(tokenizer.to_str() if world.is_main else None, world, device)
    if not world.is_main:
        required, source = Tokenizer.from_str(text), "the main process's"
        tokenizer, docs = read(required)
    if required is not None and tokenizer_sha256(tokenizer) != tokenizer_sha256(required):
        # only a prepared corpus comes with a tokenizer of its own
        raise DataError(f"data.prepared: {data.prepared} was prepared with another tokenizer "
                        f"than {source}")
    views = [s.docs for s in docs] if data.sources else [docs]
    too_long = sum(v.sentences_longer_than(data.max_seq_length - 2) for v in views)
    if too_long:
        what = "data.sources" if data.sources else data.prepared or data.corpus
        log(f"note: {too_long} sentences of {what} are longer than the "
            f"{data.max_seq_length - 2} tokens that data.max_seq_length={data.max_seq_length} "
            f"leaves beside [CLS] and [SEP]; they are split into pieces")
    return tokenizer, docs


def _log_split(fraction: float, documents: int, held_out: int, log, whose: str = "") -> None:
    """Say when the held-out split is empty or far larger than data.eval_fraction asks."""
    if fraction > 0 and held_out == 0:
        log(f"warning: {whose}no held-out split, so no evaluation{' of it' if whose else ''}: "
            f"the corpus has "
            f"{_documents(documents)}, and a split keeps at least {MIN_SPLIT_DOCUMENTS} on each "
            f"side (in a text file a blank line ends a document)")
    elif held_out > max(2 * fraction * documents, 1):
        log(f"note: {whose}{held_out} of the corpus's {documents} documents are held out for "
            f"evaluation ({held_out / documents:.0%}; data.eval_fraction={fraction}), the fewest "
            f"a split keeps")


def split_batches(docs, data: DictConfig, mix: ObjectiveMix, vocab, seed: int,
                  log, micro_per_step: int = 1) -> tuple[Batches | MixedBatches, Batches | None]:
    """(training batches, held-out batches or None); under data.sources the training
    batches mix the sources by weight, and the held-out batches hold every source's
    held-out split. The first epoch of each and its first batch are built now, so bad
    data or a plugin's builder or transform that breaks the batch fails before any step,
    naming the split. ``micro_per_step``: micro-batches per optimizer step (the steps
    scheduled objective options follow)."""
    builder = mix.example_builder or full_sentences(data.max_seq_length, vocab,
                                                    bool(data.document_attention))
    parts = docs if data.sources else [Source("", None, docs)]
    trains, held_out_docs = [], []
    for i, part in enumerate(parts):
        train_docs, eval_docs = split_documents(part.docs, data.eval_fraction)
        whose = f"source {part.name}: " if part.name else ""
        _log_split(data.eval_fraction, len(part.docs), len(eval_docs), log, whose)
        # each source its own stream of epochs
        train = Batches(train_docs, builder, mix.batch_transform, vocab, data.batch_size,
                        seed + SOURCE_SEED_OFFSET * i, micro_per_step=micro_per_step)
        _check_first_batch(train, f"{whose}the training split: {_documents(len(train_docs))}",
                           data, mix)
        trains.append(train)
        if len(eval_docs):
            held_out_docs.append(eval_docs)
    held_out = None
    if held_out_docs:
        eval_docs = TokenizedDocuments.concatenate(held_out_docs)
        held_out = Batches(eval_docs, builder, mix.batch_transform, vocab, data.batch_size,
                           seed + EVAL_SEED_OFFSET, drop_last=False)
        _check_first_batch(held_out, f"the held-out split: {_documents(len(eval_docs))}, "
                                     f"data.eval_fraction={data.eval_fraction}", data, mix)
    if not data.sources:
        return trains[0], held_out
    share = shares(parts, data.mix_temperature)
    log("sources: " + ", ".join(f"{p.name} {p.docs.num_tokens():,} tokens, {s:.1%} of the batches"
                                for p, s in zip(parts, share)))
    return MixedBatches(trains, [p.name for p in parts], share), held_out


def _check_first_batch(batches: Batches, split: str, data: DictConfig, mix: ObjectiveMix) -> None:
    """Build the split's first batch now: a split too small for one batch, bad data, or a
    plugin's builder making examples that do not collate is one line naming the split."""
    try:
        # locate(0) raises for a training epoch shorter than one batch
        found = batches.available(1) if not batches.drop_last else batches.locate(0)
    except ValueError as exc:
        raise DataError(f"data.corpus: too little text for data.batch_size={data.batch_size} "
                        f"({split}): {exc}") from None
    except DataError as exc:
        raise DataError(f"{exc} ({split})") from None
    try:
        if found:
            batches[0]
    except ValueError as exc:  # collate: a plugin's examples of another layout than a batch's
        if mix.example_builder is None:
            raise
        raise PluginRunError(f"objectives.{mix.example_builder.name}: example_builder made "
                             f"examples that do not make a batch ({split}): {exc}") from None
