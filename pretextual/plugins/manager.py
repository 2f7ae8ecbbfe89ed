"""The plugin manager: loads built-in and installed plugins, isolates their failures, and
collects the objectives, exporters, downstream tasks and loggers they register.

A plugin that fails (cannot be imported, implements a hook wrongly, raises inside a hook)
is named on stderr with its error and the program goes on without it; ``strict=True``
turns each of these into a :class:`~pretextual.errors.PluginError` instead. Two plugins
registering the same objective or exporter name are both named on stderr (strict: an
error), and a run selecting that name is refused with the same message, while everything
else they registered stays usable and ``pretextual plugins`` still lists them.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import pluggy

from pretextual.errors import PluginError
from pretextual.plugins import hookspecs
from pretextual.plugins.api import (PARTS, SCHEDULE_KEYS, ArchitectureSpec, ExporterSpec, LoggerSpec,
                                   LRScheduleSpec, ObjectiveSpec, OptimizerSpec, TaskSpec)

ENTRY_POINT_GROUP = "pretextual"
ENV_LOAD_PLUGINS = "PRETEXTUAL_LOAD_PLUGINS"
"""Comma-separated entry-point or distribution names to load; set but empty loads none;
unset loads every installed plugin. Built-ins and modules named in the config always load."""

# Built-ins go through exactly the hooks a third-party plugin implements.
BUILTIN_PLUGINS = (
    "pretextual.architectures.bert",
    "pretextual.architectures.modernbert",
    "pretextual.objectives.mlm",
    "pretextual.objectives.wwm",
    "pretextual.objectives.span",
    "pretextual.objectives.nsp",
    "pretextual.objectives.sop",
    "pretextual.exporters.safetensors",
    "pretextual.exporters.onnx",
    "pretextual.exporters.export",  # the final export, at the end of training
    "pretextual.analysis.plot",  # the run's plot, at the end of training
    # the loggers of trainer.loggers; after the export, which their end of training uploads
    "pretextual.loggers.tensorboard",
    "pretextual.loggers.mlflow",
    "pretextual.loggers.wandb",
    "pretextual.core.optim",  # the built-in optimizers and learning-rate schedules
    "pretextual.evaluation.builtin_tasks",
    "pretextual.evaluation.glue",
)

# Registration hooks: the kind of thing each registers and the spec class it must be.
REGISTER_HOOKS = {
    "pretextual_register_architectures": ("architecture", ArchitectureSpec),
    "pretextual_register_objectives": ("objective", ObjectiveSpec),
    "pretextual_register_exporters": ("exporter", ExporterSpec),
    "pretextual_register_tasks": ("task", TaskSpec),
    "pretextual_register_loggers": ("logger", LoggerSpec),
    "pretextual_register_optimizers": ("optimizer", OptimizerSpec),
    "pretextual_register_lr_schedules": ("lr_schedule", LRScheduleSpec),
}


@dataclass
class PluginInfo:
    """One loaded plugin, as ``pretextual plugins`` lists it."""

    name: str
    package: str
    version: str
    hooks: list[str] = field(default_factory=list)
    architectures: list[str] = field(default_factory=list)
    objectives: list[str] = field(default_factory=list)
    exporters: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    loggers: list[str] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)
    lr_schedules: list[str] = field(default_factory=list)

    def label(self) -> str:
        """``'name' (package P V)``: how messages name the plugin."""
        package = " ".join(p for p in (self.package, self.version) if p)
        return f"plugin {self.name!r}" + (f" (package {package})" if package else "")


class Plugins:
    """The loaded plugins and the registries of objectives, exporters, tasks and loggers
    they fill.

    Load order: built-ins, then installed entry points (group ``pretextual``, filtered by
    ``PRETEXTUAL_LOAD_PLUGINS``), then ``extra_modules`` (import paths, e.g. from the
    config). Call hooks through :attr:`hook`, which isolates each implementation.
    """

    def __init__(self, strict: bool = False, extra_modules: tuple[str, ...] | list[str] = ()):
        self.strict = strict
        self.pm = pluggy.PluginManager("pretextual")
        self.pm.add_hookspecs(hookspecs)
        self.info: dict[str, PluginInfo] = {}
        self.architectures: dict[str, ArchitectureSpec] = {}
        self.objectives: dict[str, ObjectiveSpec] = {}
        self.exporters: dict[str, ExporterSpec] = {}
        self.tasks: dict[str, TaskSpec] = {}
        self.loggers: dict[str, LoggerSpec] = {}
        self.optimizers: dict[str, OptimizerSpec] = {}
        self.lr_schedules: dict[str, LRScheduleSpec] = {}
        self._owner: dict[tuple[str, str], str] = {}
        self.clashes: dict[tuple[str, str], str] = {}
        """(kind, name) registered by two plugins -> the message naming both."""
        self.hook = IsolatedHooks(self)
        for module in BUILTIN_PLUGINS:
            self._load_module(module, module.rsplit(".", 1)[1], "pretextual")
        self._load_entry_points()
        for module in extra_modules:
            self._load_module(module, module, _distribution_of(module), named=True)

    @classmethod
    def from_config(cls, cfg: Any, strict: bool = False) -> "Plugins":
        """The plugins of a run: ``plugins.modules`` are loaded next to the installed
        ones; ``plugins.strict`` (or ``strict``) makes any broken plugin an error."""
        section = cfg.get("plugins") or {}
        return cls(strict=strict or bool(section.get("strict", False)),
                   extra_modules=tuple(section.get("modules") or ()))

    # --- loading ---------------------------------------------------------------------------

    def _fail(self, message: str, consequence: str = "skipped it") -> None:
        if self.strict:
            raise PluginError(message)
        print(f"pretextual: warning: {message}; {consequence}", file=sys.stderr)

    def _load_module(self, module: str, name: str, package: str, named: bool = False) -> None:
        """Import and register ``module``. ``named``: the user named it (plugins.modules),
        so failing to import it is an error, not a plugin skipped."""
        info = PluginInfo(name, package, _version(package))
        try:
            obj = importlib.import_module(module)
        except Exception as exc:  # pluggy does not catch these; one broken plugin must not stop us
            if named:
                raise PluginError(f"plugins.modules: {module!r} failed to import: "
                                  f"{_describe(exc)}") from None
            self._fail(f"{info.label()} failed to import: {_describe(exc)}")
            return
        self._add(obj, info)

    def _load_entry_points(self) -> None:
        allowed = os.environ.get(ENV_LOAD_PLUGINS)
        allow = None if allowed is None else {n.strip() for n in allowed.split(",") if n.strip()}
        installed: list[str] = []
        matched: set[str] = set()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist else ""
            installed.append(ep.name)
            if allow is not None:
                names = {n for n in allow if n == ep.name or _normalize(n) == _normalize(dist)}
                if not names:
                    continue
                matched |= names
            info = PluginInfo(ep.name, dist, ep.dist.version if ep.dist else "")
            try:
                obj = ep.load()
            except Exception as exc:  # pluggy does not catch these; one broken plugin must not stop us
                self._fail(f"{info.label()} failed to import: {_describe(exc)}")
                continue
            self._add(obj, info)
        for name in sorted((allow or set()) - matched):  # most likely a typo
            self._fail(f"{ENV_LOAD_PLUGINS} names {name!r}, but no installed plugin has that "
                       f"entry-point or package name (installed: {', '.join(installed) or 'none'})",
                       "ignored it")

    def register(self, plugin: Any, name: str | None = None, package: str = "",
                 version: str = "") -> bool:
        """Register an in-process plugin (a module or an object with ``@hookimpl``
        methods, e.g. a logger in a notebook or a test) and collect what it registers.

        Returns False when it was refused (reported like any broken plugin).
        """
        name = name or getattr(plugin, "__name__", type(plugin).__name__)
        return self._add(plugin, PluginInfo(name, package, version))

    def _add(self, obj: Any, info: PluginInfo) -> bool:
        if self.pm.is_registered(obj):  # e.g. named by an entry point and by the config
            return True
        if self.pm.has_plugin(info.name):
            other = self.info.get(info.name, PluginInfo(info.name, "", ""))
            self._fail(f"{info.label()} has the same name as {other.label()}")
            return False
        try:
            self.pm.register(obj, name=info.name)
        except pluggy.PluginValidationError as exc:
            if self.pm.is_registered(obj):  # pluggy < 1.7 leaves the hooks attached before the bad one
                self.pm.unregister(obj)
            self._fail(f"{info.label()} implements a hook wrongly: {' '.join(str(exc).split())}")
            return False
        problem = self._check_hooks(obj)
        if problem:
            self.pm.unregister(obj)
            self._fail(f"{info.label()} {problem}")
            return False
        if not self._collect(info):
            return False
        self.info[info.name] = info
        info.hooks = sorted(c.name for c in self.pm.get_hookcallers(obj) or [])
        return True

    def _check_hooks(self, obj: Any) -> str | None:
        """What pluggy lets through at registration but would misbehave later, if anything."""
        callers = self.pm.get_hookcallers(obj) or []
        if not callers:
            return "implements no pretextual hook (is each hook function decorated with @pretextual.hookimpl?)"
        known = [n for n in vars(hookspecs) if n.startswith("pretextual_")]
        for caller in callers:
            impls = [i for i in caller.get_hookimpls() if i.plugin is obj]
            if not caller.has_spec() and not all(i.optionalhook for i in impls):
                close = difflib.get_close_matches(caller.name, known, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                return f"implements {caller.name}, which is not a pretextual hook{hint}"
            if any(i.wrapper or i.hookwrapper for i in impls):
                return f"implements {caller.name} as a wrapper; pretextual hooks are plain calls"
        return None

    def _collect(self, info: PluginInfo) -> bool:
        """Call the plugin's registration hooks, then add what they registered (nothing if a
        hook fails or one name is registered twice by this plugin)."""
        found: dict[str, list[Any]] = {kind: [] for kind, _ in REGISTER_HOOKS.values()}
        for hook_name, (kind, spec_class) in REGISTER_HOOKS.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin_name != info.name:
                    continue
                try:
                    impl.function(*[{"register": found[kind].append}[a] for a in impl.argnames])
                    bad = [s for s in found[kind] if not isinstance(s, spec_class)]
                    if bad:
                        raise TypeError(f"register() takes a {spec_class.__name__}, got {bad[0]!r}")
                    for spec in found[kind]:
                        _check_spec(kind, spec)
                except Exception as exc:
                    self.pm.unregister(name=info.name)
                    self._fail(f"{info.label()} failed in {hook_name}: {_describe(exc)}")
                    return False
        for kind, specs in found.items():
            names = [spec.name for spec in specs]
            twice = next((n for n in names if names.count(n) > 1), None)
            if twice is not None:
                self.pm.unregister(name=info.name)
                self._fail(f"{kind} {twice!r} is registered twice by {info.label()}: give each "
                           f"registration its own name")
                return False
        for kind, specs in found.items():
            registry = getattr(self, kind + "s")
            for spec in specs:
                getattr(info, kind + "s").append(spec.name)
                if spec.name not in registry:
                    registry[spec.name] = spec
                    self._owner[(kind, spec.name)] = info.name
                    continue
                message = (f"{kind} {spec.name!r} is registered twice: by "
                           f"{self.info[self._owner[(kind, spec.name)]].label()} and by "
                           f"{info.label()}; uninstall one or leave it out with {ENV_LOAD_PLUGINS}")
                self.clashes[(kind, spec.name)] = message
                self._fail(message, f"a run that selects {spec.name!r} is refused")
        return True

    def _disable(self, plugin_name: str, hook_name: str, exc: Exception) -> None:
        """Unregister a plugin whose hook raised (or raise PluginError in strict mode)."""
        info = self.info.get(plugin_name, PluginInfo(plugin_name, "", ""))
        message = f"{info.label()} failed in {hook_name}: {_describe(exc)}"
        if self.strict:
            raise PluginError(message) from exc
        self.pm.unregister(name=plugin_name)
        self._fail(message, "disabled its hooks for the rest of the run (what it registered, "
                            "objectives, exporters and tasks, stays in use)")

    # --- lookup ----------------------------------------------------------------------------

    def owner(self, kind: str, name: str) -> PluginInfo:
        """The plugin that registered objective/exporter/task ``name``."""
        return self.info[self._owner[(kind, name)]]

    def architecture(self, name: str) -> ArchitectureSpec:
        """The registered architecture ``name``; a clear error listing the known ones
        otherwise, or naming both plugins that registered it."""
        if ("architecture", name) in self.clashes:
            raise PluginError(f"model.architecture: {self.clashes[('architecture', name)]}")
        if name not in self.architectures:
            raise PluginError(f"model.architecture: no plugin registers an architecture named "
                              f"{name!r} (known: {', '.join(sorted(self.architectures))})")
        return self.architectures[name]

    def objective(self, name: str) -> ObjectiveSpec:
        """The registered objective ``name``; a clear error listing the known ones otherwise,
        or naming both plugins that registered it."""
        if ("objective", name) in self.clashes:
            raise PluginError(f"objectives.{name}: {self.clashes[('objective', name)]}")
        if name not in self.objectives:
            raise PluginError(f"objectives.{name}: no plugin registers an objective named "
                              f"{name!r} (known: {', '.join(sorted(self.objectives))})")
        return self.objectives[name]

    def exporter(self, name: str) -> ExporterSpec:
        """The registered exporter ``name``; a clear error listing the known ones otherwise,
        or naming both plugins that registered it."""
        if ("exporter", name) in self.clashes:
            raise PluginError(self.clashes[("exporter", name)])
        if name not in self.exporters:
            raise PluginError(f"no plugin registers an exporter named {name!r} "
                              f"(known: {', '.join(sorted(self.exporters))})")
        return self.exporters[name]

    def task(self, name: str) -> TaskSpec:
        """The registered downstream task ``name``; a clear error listing the known ones
        otherwise, or naming both plugins that registered it."""
        if ("task", name) in self.clashes:
            raise PluginError(self.clashes[("task", name)])
        if name not in self.tasks:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise PluginError(f"--task {name}: no such file, and no plugin registers a task "
                              f"named {name!r} (known: {known})")
        return self.tasks[name]


class IsolatedHooks:
    """``plugins.hook.<hook>(**kwargs)``: calls every implementation in pluggy's order,
    each on its own, so one that raises is reported and unregistered while the others
    (and the run) go on. Returns the implementations' non-None results, as pluggy does."""

    def __init__(self, plugins: Plugins):
        self._plugins = plugins

    def __getattr__(self, hook_name: str):
        caller = getattr(self._plugins.pm.hook, hook_name)

        def call(**kwargs: Any) -> list[Any]:
            results = []
            for impl in reversed(caller.get_hookimpls()):  # pluggy calls the last registered first
                args = [kwargs[a] for a in impl.argnames]  # a plugin names only what it needs
                try:
                    result = impl.function(*args)
                except Exception as exc:
                    self._plugins._disable(impl.plugin_name, hook_name, exc)
                    continue
                if result is not None:
                    results.append(result)
            return results

        return call


NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
"""What an objective or exporter may be named: a config key (``objectives.<name>``) and
a word on the command line (``--format a,b``)."""


def _check_spec(kind: str, spec: Any) -> None:
    """ValueError for a spec no run could use: a name that is not a config key, parts it
    provides that are not :data:`PARTS`, options that are not a dataclass or that shadow
    the keys the core adds to every objective."""
    if not isinstance(spec.name, str) or not NAME.fullmatch(spec.name):
        raise ValueError(f"{kind} name {spec.name!r} is not a config key (letters, digits, _ and -)")
    if kind != "objective":
        return
    if not callable(spec.provides) and (isinstance(spec.provides, str)
                                        or not set(spec.provides) <= set(PARTS)):
        raise ValueError(f"objective {spec.name!r}: provides must be a collection of "
                         f"{', '.join(map(repr, PARTS))} or a function of the options returning "
                         f"one, got {spec.provides!r}")
    if spec.options is None:
        return
    if not (isinstance(spec.options, type) and dataclasses.is_dataclass(spec.options)):
        raise ValueError(f"objective {spec.name!r}: options must be a dataclass, got {spec.options!r}")
    shadowed = sorted({f.name for f in dataclasses.fields(spec.options)} & SCHEDULE_KEYS)
    if shadowed:
        raise ValueError(f"objective {spec.name!r}: its options field {shadowed[0]!r} is a key the "
                         f"core sets for every objective ({', '.join(sorted(SCHEDULE_KEYS))}); "
                         f"rename it")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _normalize(dist: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def _distribution_of(module: str) -> str:
    """The installed distribution providing ``module``, else its top-level package name."""
    top = module.split(".")[0]
    return importlib.metadata.packages_distributions().get(top, [top])[0]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""
