"""The ``pretextual`` command: train, config, plugins."""

from __future__ import annotations

import argparse
import json
import sys

from pretextual.errors import PretextualError


def _split_config_args(args: list[str]) -> tuple[str | None, list[str]]:
    """The optional leading CONFIG (recipe name or YAML path), then key=value overrides."""
    if args and "=" not in args[0] and not args[0].startswith("~"):
        return args[0], args[1:]
    return None, args


def _load(args) -> "DictConfig":  # noqa: F821
    from pretextual.core.config import load_config
    source, overrides = _split_config_args(args.args)
    return load_config(source, overrides)


def cmd_train(args) -> int:
    from pretextual.core.distributed import shutdown
    from pretextual.core.trainer import Trainer
    from pretextual.plugins.manager import Plugins
    cfg = _load(args)
    trainer = Trainer(cfg, Plugins(strict=args.strict_plugins))
    try:
        metrics = trainer.train(resume=args.resume)
    finally:
        shutdown(trainer.world)
    if trainer.world.is_main:
        if metrics:
            print("final eval: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        print(f"run directory: {cfg.trainer.output_dir}")
    return 0


def cmd_config(args) -> int:
    from pretextual.core.config import reference_markdown, to_yaml
    if args.reference:
        from pretextual.plugins.manager import Plugins
        print(reference_markdown(Plugins(strict=args.strict_plugins).objectives))
        return 0
    print(to_yaml(_load(args)), end="")
    return 0


def cmd_plugins(args) -> int:
    from pretextual.plugins.manager import Plugins
    plugins = Plugins(strict=args.strict_plugins)
    rows = [vars(info) for info in plugins.info.values()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("plugin", "package", "version", "objectives", "exporters", "hooks")
    table = [header] + [(r["name"], r["package"], r["version"], ",".join(r["objectives"]),
                         ",".join(r["exporters"]),
                         ",".join(h.removeprefix("pretextual_") for h in r["hooks"])) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pretextual", description=__doc__)
    parser.add_argument("--strict-plugins", action="store_true",
                        help="fail when a plugin cannot be loaded instead of skipping it")
    sub = parser.add_subparsers(dest="command", required=True)
    config_help = "a recipe (bert, roberta, albert, spanbert) or a YAML file, then key=value overrides"

    train = sub.add_parser("train", help="pretrain an encoder")
    train.add_argument("args", nargs="*", metavar="[CONFIG] key=value", help=config_help)
    train.add_argument("--resume", action="store_true",
                       help="continue from the newest good checkpoint in trainer.output_dir")
    train.set_defaults(func=cmd_train)

    config = sub.add_parser("config", help="print the resolved config")
    config.add_argument("args", nargs="*", metavar="[CONFIG] key=value", help=config_help)
    config.add_argument("--reference", action="store_true",
                        help="print the markdown reference of every key (docs/config.md)")
    config.set_defaults(func=cmd_config)

    plugins = sub.add_parser("plugins", help="list plugins and what they register")
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plugins.set_defaults(func=cmd_plugins)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except PretextualError as exc:
        print(f"pretextual: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pretextual: interrupted", file=sys.stderr)
        return 130
