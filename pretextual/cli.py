"""The ``pretextual`` command: train, prepare, config, plugins, export, plot, compare, evaluate, ablate."""

from __future__ import annotations

import argparse
import importlib.metadata
import functools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pretextual.errors import (CheckpointError, DataError, EvaluationError, PluginRunError,
                               PretextualError, TrainingError)

if TYPE_CHECKING:
    from omegaconf import DictConfig


def _split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """The optional leading CONFIG (recipe name or YAML path), then key=value overrides."""
    if args and "=" not in args[0] and not args[0].startswith("~"):
        return args[0], args[1:]
    return None, args


def _load(args) -> DictConfig:
    from pretextual.core.config import load_config
    source, overrides = _split_config_args(args.args)
    return load_config(source, overrides)


def cmd_train(args) -> int:
    from pretextual.core.config import DEFAULT_RECIPE
    from pretextual.core.distributed import leave_process_group, shutdown
    from pretextual.plugins.manager import Plugins
    from pretextual.run import trainer_for
    source, _ = _split_config_args(args.args)
    cfg = _load(args)
    try:
        trainer = trainer_for(cfg, Plugins.from_config(cfg, strict=args.strict_plugins),
                              resume=args.resume, run_name=Path(source or DEFAULT_RECIPE).stem)
    except BaseException:
        leave_process_group()  # joined while the trainer was set up: leave it cleanly
        raise
    try:
        metrics = trainer.train()
    finally:
        shutdown(trainer.world)
    if trainer.world.is_main:
        from pretextual.core.console import closing_lines
        if trainer.step > trainer.start_step:
            export = trainer.out / "export" if trainer.export_formats else None
            for line in closing_lines(trainer.start_step, trainer.step, trainer.tokens_trained,
                                      trainer.train_seconds, metrics, export):
                print(line)
        if metrics:
            from pretextual.analysis.summary import run_summary
            for line in run_summary(trainer, metrics):
                print(line)
        print(f"run directory: {cfg.trainer.output_dir}")
    return 0


def cmd_prepare(args) -> int:
    from pretextual.core.config import load_config
    from pretextual.core.prepare import prepare_corpus
    flags = {"tokenizer": args.tokenizer, "vocab_size": args.vocab_size, "text_field": args.text_field}
    overrides = [f"data.{key}={value}" for key, value in flags.items() if value is not None]
    cfg = load_config(None, overrides + (["data.lowercase=false"] if args.cased else []))
    prepare_corpus(args.corpus, args.out, cfg.data, workers=args.workers, shard_mb=args.shard_mb,
                   sample_mb=args.sample_mb)
    return 0


def cmd_config(args) -> int:
    from pretextual.core.config import to_yaml
    from pretextual.core.config_reference import reference_markdown
    from pretextual.plugins.manager import Plugins
    if args.reference:
        print(reference_markdown(Plugins(strict=args.strict_plugins).objectives))
        return 0
    from pretextual.core.mix import check_objectives, resolved_objectives
    cfg = _load(args)
    # What train would refuse before reading the corpus, this refuses too.
    checked = check_objectives(cfg.objectives, Plugins.from_config(cfg, strict=args.strict_plugins))
    cfg.objectives = resolved_objectives(checked)  # as a run records it in config.yaml
    print(to_yaml(cfg), end="")
    return 0


def cmd_plugins(args) -> int:
    from pretextual.plugins.manager import Plugins
    plugins = Plugins(strict=args.strict_plugins)
    rows = [vars(info) for info in plugins.info.values()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("plugin", "package", "version", "objectives", "exporters", "tasks", "hooks")
    table = [header] + [(r["name"], r["package"], r["version"], ",".join(r["objectives"]),
                         ",".join(r["exporters"]), ",".join(r["tasks"]),
                         ",".join(h.removeprefix("pretextual_") for h in r["hooks"])) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def cmd_export(args) -> int:
    from pretextual.exporters.export import export_checkpoint
    from pretextual.plugins.manager import Plugins
    export_checkpoint(args.source, args.out, args.format,
                      with_heads=False if args.encoder_only else None,
                      quantize=args.quantize, force=args.force,
                      plugins=Plugins(strict=args.strict_plugins))
    return 0


def cmd_plot(args) -> int:
    from pretextual.analysis.plot import describe, plot_runs
    panels = plot_runs(args.run_dirs, args.out)
    print(f"wrote {args.out}: {describe(panels)}, {len(args.run_dirs)} run(s)")
    return 0


def cmd_compare(args) -> int:
    from dataclasses import asdict
    from pretextual.analysis.compare import compare, comparison_rows, format_table
    summaries = compare(args.run_dirs)
    if args.json:
        print(json.dumps([asdict(s) for s in summaries], indent=2))
    else:
        print(format_table(comparison_rows(summaries), markdown=args.markdown))
    return 0


def cmd_ablate(args) -> int:
    from pretextual.analysis.ablate import ablate, parse_mixes
    ablate(parse_mixes(args.mixes), args.out, steps=args.steps, seeds=args.seeds,
           overrides=args.overrides, strict_plugins=args.strict_plugins, tasks=args.task or [],
           protocols=[p.strip() for p in args.protocol.split(",") if p.strip()])
    return 0


def cmd_evaluate(args) -> int:
    from pretextual.evaluation.evaluate import EvalSettings, evaluate
    from pretextual.evaluation.protocols import FinetuneSettings
    from pretextual.evaluation.report import format_tables, write_json
    from pretextual.evaluation.tasks import Columns, load_task
    from pretextual.plugins.manager import Plugins
    eval_files = args.eval_file or []
    if len(eval_files) > len(args.task):
        raise EvaluationError(f"--eval-file: {len(eval_files)} given for {len(args.task)} "
                              f"--task(s); the i-th --eval-file belongs to the i-th --task")
    columns = Columns(text=args.text_column, pair=args.pair_column, label=args.label_column,
                      group=args.group_column)
    plugins = Plugins(strict=args.strict_plugins)
    tasks = [load_task(task, plugins, columns, eval_files[i] if i < len(eval_files) else None)
             for i, task in enumerate(args.task)]
    settings = EvalSettings(
        protocols=tuple(p.strip() for p in args.protocol.split(",") if p.strip()),
        seeds=args.seeds, folds=args.folds, max_length=args.max_length, device=args.device,
        finetune=FinetuneSettings(epochs=args.finetune_epochs, lr=args.finetune_lr,
                                  batch_size=args.finetune_batch_size))
    document = evaluate(args.models, tasks, settings)
    if args.json:
        write_json(document, args.json)
    print(format_tables(document), end="")
    return 0


STRICT_PLUGINS_HELP = "fail when a plugin cannot be loaded instead of skipping it"


def _positive(kind: type):
    """An argparse type: a finite number of ``kind`` above zero."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


class _Parser(argparse.ArgumentParser):
    """A parser whose epilog may be a function, called only when help is shown (train's
    lists every config key, which costs imports no other command should pay)."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def _keys_help() -> str:
    from pretextual.core.config_reference import keys_help
    return keys_help()


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand; each sets ``func``, the cmd_* function that runs it."""
    parser = argparse.ArgumentParser(prog="pretextual", description=__doc__)
    parser.add_argument("--version", action="version",
                        version=f"pretextual {importlib.metadata.version('pretextual')}")
    parser.add_argument("--strict-plugins", action="store_true", help=STRICT_PLUGINS_HELP)
    # Also accepted after the subcommand. SUPPRESS: a subcommand not given the flag keeps
    # the value parsed before it (argparse copies a subparser's defaults over it).
    strict = argparse.ArgumentParser(add_help=False)
    strict.add_argument("--strict-plugins", action="store_true", default=argparse.SUPPRESS,
                        help=STRICT_PLUGINS_HELP)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_command = functools.partial(sub.add_parser, parents=[strict])
    from pretextual.core.config import DEFAULT_RECIPE, recipe_names
    config_help = (f"a recipe ({', '.join(recipe_names())}; default {DEFAULT_RECIPE}) or a "
                   f"YAML file, then key=value overrides")

    train = add_command("train", help="pretrain an encoder", epilog=_keys_help,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("args", nargs="*", metavar="[CONFIG] key=value", help=config_help)
    train.add_argument("--resume", action="store_true",
                       help="continue from the newest good checkpoint in trainer.output_dir "
                            "(unset: the run runs/latest points at)")
    train.set_defaults(func=cmd_train, overrides_into="args")

    prepare = add_command("prepare", help="tokenize a corpus once into memory-mapped shards "
                          "(for corpora larger than memory; train with data.prepared=DIR)")
    prepare.add_argument("corpus", metavar="CORPUS",
                         help="a text or .jsonl file, a directory or a glob (as data.corpus)")
    prepare.add_argument("--out", required=True, metavar="DIR",
                         help="the prepared directory (an interrupted prepare there is resumed)")
    prepare.add_argument("--tokenizer", metavar="FILE",
                         help="a tokenizer.json, a directory holding one, or a WordPiece vocab.txt "
                              "(data.tokenizer); default: train WordPiece")
    prepare.add_argument("--vocab-size", type=int, metavar="N",
                         help="vocabulary of the trained WordPiece tokenizer (data.vocab_size)")
    prepare.add_argument("--cased", action="store_true",
                         help="do not lower-case in the trained tokenizer (data.lowercase=false)")
    prepare.add_argument("--text-field", metavar="NAME", help="text field of .jsonl files")
    prepare.add_argument("--workers", type=_positive(int), metavar="N",
                         help="tokenizing processes (default: one per CPU)")
    prepare.add_argument("--shard-mb", type=_positive(float), default=16, metavar="MB",
                         help="text per shard (default: 16)")
    prepare.add_argument("--sample-mb", type=_positive(float), default=16, metavar="MB",
                         help="text from the start of the corpus to train the tokenizer on (default: 16)")
    prepare.set_defaults(func=cmd_prepare)

    config = add_command("config", help="print the resolved config")
    config.add_argument("args", nargs="*", metavar="[CONFIG] key=value", help=config_help)
    config.add_argument("--reference", action="store_true",
                        help="print the markdown reference of every key (docs/config.md)")
    config.set_defaults(func=cmd_config, overrides_into="args")

    plugins = add_command("plugins", help="list plugins and what they register")
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plugins.set_defaults(func=cmd_plugins)

    export = add_command("export", help="write a checkpoint as files other tools load")
    export.add_argument("source", metavar="RUN_DIR_OR_CHECKPOINT",
                        help="a run directory (its newest checkpoint) or a checkpoint directory")
    export.add_argument("--out", required=True, metavar="DIR", help="the export directory")
    export.add_argument("--format", default="safetensors,onnx",
                        help="comma-separated exporters (default: safetensors,onnx)")
    export.add_argument("--quantize", metavar="SCHEME",
                        help="also write a quantized model (onnx: int8)")
    export.add_argument("--encoder-only", action="store_true",
                        help="write the encoder alone (default: the pretraining heads too, under "
                             "Hugging Face's names where they exist, in the formats that store heads)")
    export.add_argument("--force", action="store_true",
                        help="replace DIR if it exists and is not empty (once the new export is complete)")
    export.set_defaults(func=cmd_export)

    plot = add_command("plot", help="plot the loss curves and eval metrics of runs")
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories to overlay")
    plot.add_argument("--out", required=True, metavar="FILE.png",
                      help="the image to write (needs matplotlib: "
                           "pip install 'pretextual[plot]')")
    plot.set_defaults(func=cmd_plot)

    compare = add_command("compare", help="a table of runs: final and best eval metrics, "
                                          "tokens, time")
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                         help="run directories to compare")
    compare.add_argument("--markdown", action="store_true", help="print a markdown table")
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")
    compare.set_defaults(func=cmd_compare)

    evaluate = add_command("evaluate", help="score encoders on downstream tasks against "
                                              "baselines, on the same splits and seeds")
    evaluate.add_argument("models", nargs="+", metavar="MODEL",
                          help="a run directory (its newest checkpoint), a checkpoint, an export "
                               "or a directory saved by transformers")
    evaluate.add_argument("--task", action="append", required=True, metavar="TASK",
                          help="a .csv, .tsv or .jsonl file with text (text_pair) and label "
                               "columns, or a task a plugin registers; repeat for several")
    evaluate.add_argument("--eval-file", action="append", metavar="FILE",
                          help="the evaluation split of the task file given in the same place "
                               "(default: cross-validation)")
    evaluate.add_argument("--protocol", default="probe",
                          help="probe (frozen features), finetune, or both: probe,finetune "
                               "(default: %(default)s)")
    evaluate.add_argument("--seeds", type=_positive(int), default=3,
                          help="seeds per model and protocol (default: %(default)s)")
    evaluate.add_argument("--folds", type=_positive(int), default=5,
                          help="cross-validation folds without --eval-file (default: %(default)s)")
    evaluate.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    evaluate.add_argument("--text-column", default="text", metavar="NAME")
    evaluate.add_argument("--pair-column", metavar="NAME",
                          help="the second text of a pair task (default: text_pair, if present)")
    evaluate.add_argument("--label-column", default="label", metavar="NAME")
    evaluate.add_argument("--group-column", metavar="NAME",
                          help="examples of one group stay in one fold")
    evaluate.add_argument("--max-length", type=_positive(int), default=128, metavar="N",
                          help="tokens per example at most (default: %(default)s)")
    evaluate.add_argument("--finetune-epochs", type=_positive(int), default=5, metavar="N")
    evaluate.add_argument("--finetune-lr", type=_positive(float), default=1e-3, metavar="LR",
                          help="(default: %(default)s, for small encoders; about 4e-5 for "
                               "base-size ones)")
    evaluate.add_argument("--finetune-batch-size", type=_positive(int), default=32, metavar="N")
    evaluate.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    evaluate.set_defaults(func=cmd_evaluate)

    ablate = add_command("ablate", help="train objective mixes on the same data and token "
                                        "budget, probe them alike, write a report")
    ablate.add_argument("overrides", nargs="*", metavar="key=value",
                        help="overrides applied to every mix (corpus, preset, lengths, ...)")
    ablate.add_argument("--mixes", default="bert,roberta,albert,spanbert",
                        help="comma-separated recipes or YAML files (default: %(default)s)")
    ablate.add_argument("--steps", type=int, default=200,
                        help="steps of the mix with the fewest tokens per step; sets the token "
                             "budget of every run (default: %(default)s)")
    ablate.add_argument("--seeds", type=int, default=1,
                        help="seeds 0..k-1 per mix (default: %(default)s)")
    ablate.add_argument("--out", required=True, metavar="DIR",
                        help="where the runs and the report (report.md) go")
    ablate.add_argument("--task", action="append", metavar="TASK",
                        help="also score every run on this downstream task (a task file or a "
                             "registered name, as pretextual evaluate); repeat for several")
    ablate.add_argument("--protocol", default="probe",
                        help="the downstream protocols of --task (default: %(default)s)")
    ablate.set_defaults(func=cmd_ablate, overrides_into="overrides")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: sys.argv[1:]); returns the exit status,
    2 for an error the user can fix, reported as one line."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse ends a positional list at the first option: `train bert --resume k=v` leaves
    # k=v over. Overrides after an option belong to the same list, wherever it stands.
    into = getattr(args, "overrides_into", None)
    if extra and (into is None or any(a.startswith("-") for a in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        getattr(args, into).extend(extra)
    try:
        status = args.func(args)
        sys.stdout.flush()  # here, so that a closed pipe is caught below, not at exit
        return status
    except BrokenPipeError:
        # The reader went away (`pretextual plugins --json | head`): stop quietly, as cat
        # does, with nothing more written to the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # killed by SIGPIPE, as the shell reports it
    except PretextualError as exc:
        # Under torchrun every process meets the same config or plugin mistake: rank 0's
        # line is enough. Data, checkpoint and training errors, and a plugin's code failing
        # on a batch, may be one process's own:
        # each says it, naming its rank. The environment, not the process group, which
        # may not exist yet.
        rank = os.environ.get("RANK", "0") if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "0"
        if rank == "0":
            print(f"pretextual: error: {exc}", file=sys.stderr)
        elif isinstance(exc, (DataError, CheckpointError, TrainingError, PluginRunError)):
            print(f"pretextual: error: [rank {rank}] {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pretextual: interrupted", file=sys.stderr)
        return 130
