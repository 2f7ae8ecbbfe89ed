"""The plugin manager: loads built-in and installed plugins and collects what they register."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from dataclasses import dataclass, field

import pluggy

from pretextual.errors import PluginError
from pretextual.plugins import hookspecs
from pretextual.plugins.api import ExporterSpec, ObjectiveSpec

ENTRY_POINT_GROUP = "pretextual"
ENV_LOAD_PLUGINS = "PRETEXTUAL_LOAD_PLUGINS"
"""Comma-separated entry-point names to load; set but empty loads none; unset loads all."""

# Built-ins go through exactly the hooks a third-party plugin implements.
BUILTIN_PLUGINS = (
    "pretextual.objectives.mlm",
    "pretextual.objectives.wwm",
    "pretextual.objectives.span",
    "pretextual.objectives.nsp",
    "pretextual.objectives.sop",
    "pretextual.exporters.safetensors",
    "pretextual.exporters.onnx",
)


@dataclass
class PluginInfo:
    """One loaded plugin, as ``pretextual plugins`` lists it."""

    name: str
    package: str
    version: str
    hooks: list[str] = field(default_factory=list)
    objectives: list[str] = field(default_factory=list)
    exporters: list[str] = field(default_factory=list)


class Plugins:
    """The loaded plugins and the registries of objectives and exporters they fill."""

    def __init__(self, strict: bool = False, extra_modules: tuple[str, ...] = ()):
        self.strict = strict
        self.pm = pluggy.PluginManager("pretextual")
        self.pm.add_hookspecs(hookspecs)
        self.info: dict[str, PluginInfo] = {}
        self.objectives: dict[str, ObjectiveSpec] = {}
        self.exporters: dict[str, ExporterSpec] = {}
        self._owner: dict[tuple[str, str], str] = {}
        for module in BUILTIN_PLUGINS:
            self._register_module(module, module.rsplit(".", 1)[1], "pretextual", _version("pretextual"))
        self._load_entry_points()
        for module in extra_modules:
            self._register_module(module, module, module.split(".")[0], "")
        self._collect()

    @property
    def hook(self):
        return self.pm.hook

    def _fail(self, plugin: str, error: BaseException | str) -> None:
        message = f"plugin {plugin!r} failed and was skipped: {error}"
        if self.strict:
            raise PluginError(message)
        print(f"pretextual: warning: {message}", file=sys.stderr)

    def _register(self, obj, name: str, package: str, version: str) -> None:
        try:
            self.pm.register(obj, name=name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            self._fail(name, exc)
            return
        self.info[name] = PluginInfo(name, package, version)

    def _register_module(self, module: str, name: str, package: str, version: str) -> None:
        try:
            obj = importlib.import_module(module)
        except Exception as exc:  # a broken plugin must not take the program down
            self._fail(name, f"{type(exc).__name__}: {exc}")
            return
        self._register(obj, name, package, version)

    def _load_entry_points(self) -> None:
        allowed = os.environ.get(ENV_LOAD_PLUGINS)
        allow = None if allowed is None else {n.strip() for n in allowed.split(",") if n.strip()}
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if allow is not None and ep.name not in allow:
                continue
            if self.pm.has_plugin(ep.name):
                continue
            dist = ep.dist.name if ep.dist else "?"
            version = ep.dist.version if ep.dist else ""
            try:
                obj = ep.load()
            except Exception as exc:
                self._fail(ep.name, f"{type(exc).__name__}: {exc}")
                continue
            self._register(obj, ep.name, dist, version)

    def _call_register_hook(self, hook_name: str, registry: dict, kind: str) -> None:
        hook = getattr(self.pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            plugin = impl.plugin_name
            if plugin not in self.info:
                continue
            found = []
            try:
                impl.function(*[{"register": found.append}[a] for a in impl.argnames])
            except Exception as exc:
                self._fail(plugin, f"{hook_name}: {type(exc).__name__}: {exc}")
                self.pm.unregister(name=plugin)
                del self.info[plugin]
                continue
            for spec in found:
                if spec.name in registry:
                    other = self._owner[(kind, spec.name)]
                    raise PluginError(
                        f"{kind} {spec.name!r} is registered twice: by plugin {other!r} "
                        f"(package {self.info[other].package}) and by plugin {plugin!r} "
                        f"(package {self.info[plugin].package})")
                registry[spec.name] = spec
                self._owner[(kind, spec.name)] = plugin
                getattr(self.info[plugin], kind + "s").append(spec.name)

    def _collect(self) -> None:
        self._call_register_hook("pretextual_register_objectives", self.objectives, "objective")
        self._call_register_hook("pretextual_register_exporters", self.exporters, "exporter")
        for name, info in self.info.items():
            plugin = self.pm.get_plugin(name)
            info.hooks = sorted(c.name for c in self.pm.get_hookcallers(plugin) or [])

    def owner(self, kind: str, name: str) -> PluginInfo:
        """The plugin that registered objective/exporter ``name``."""
        return self.info[self._owner[(kind, name)]]

    def objective(self, name: str) -> ObjectiveSpec:
        """The registered objective ``name``; a clear error listing the known ones otherwise."""
        if name not in self.objectives:
            raise PluginError(f"objectives.{name}: no plugin registers an objective named "
                              f"{name!r} (known: {', '.join(sorted(self.objectives))})")
        return self.objectives[name]

    def exporter(self, name: str) -> ExporterSpec:
        """The registered exporter ``name``; a clear error listing the known ones otherwise."""
        if name not in self.exporters:
            raise PluginError(f"no plugin registers an exporter named {name!r} "
                              f"(known: {', '.join(sorted(self.exporters))})")
        return self.exporters[name]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""
