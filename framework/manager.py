"""Loads the ``ndcost.plugins`` entry points, built-ins exactly like third parties.

After loading, an essential set of built-in plugins must be present (a stale
editable install lacks newly added entry points, and fails loudly naming the
fix) and ``check_pending()`` verifies that every implemented hook has a spec.

A broken plugin is left out whole, with a :class:`PluginLoadWarning` naming
its distribution (an error under ``NDCOST_STRICT_PLUGINS=1``): one whose
import fails (``SystemExit`` included), whose hook raises or returns what its
spec does not allow, or whose registrations its namespace's contract refuses.
A hook's consumer that finds a contribution unusable leaves its plugin out
the same way (:meth:`PluginSet.exclude`), so that a broken plugin never
changes a figure silently.
"""
from __future__ import annotations

import importlib
import os
import threading
import warnings
from importlib import metadata
from typing import Dict, List, Optional

import attrs
import pluggy

from ndcost import hookspecs
from ndcost.errors import PluginLoadError, RegistrationError, StalePluginSet
from ndcost.plugins import BUILTIN_ENTRY_POINTS
from ndcost.registry import Registry, Source

GROUP = "ndcost.plugins"

# Every built-in entry point (the built-in plugin package's manifest): an install whose metadata lacks one
# is stale.
ESSENTIAL = BUILTIN_ENTRY_POINTS


class PluginLoadWarning(UserWarning):
    """A plugin failed to import; the others still loaded."""


@attrs.frozen(kw_only=True)
class LoadedPlugin:
    """One entry point as loaded: who ships it, and what it registered (or why it failed)."""

    name: str
    distribution: str
    version: str
    module: str
    registered: tuple = ()
    error: Optional[str] = None


class PluginSet:
    """A pluggy manager, the registry its plugins filled, and what each contributed."""

    def __init__(self, pm: pluggy.PluginManager, registry: Registry, plugins: List[LoadedPlugin]):
        self.pm = pm
        self.registry = registry
        self.plugins = plugins
        self.revision = 0  # counts exclusions: what a consumer merged from the hooks before one is stale

    @property
    def hook(self):
        return self.pm.hook

    def exclude(self, plugin_name: str, why: str) -> None:
        """Leave out the loaded plugin *plugin_name* (pluggy's name, ``<distribution>:<entry point>``), broken as *why*.

        Its hooks are unregistered and its registrations withdrawn; it is
        reported as any plugin that failed to load: a PluginLoadWarning, or
        under NDCOST_STRICT_PLUGINS=1 a PluginLoadError.
        """
        index = next((i for i, p in enumerate(self.plugins)
                      if f"{p.distribution}:{p.name}" == plugin_name and p.error is None), None)
        if index is None:
            raise KeyError(f"no loaded plugin {plugin_name!r}")
        p = self.plugins[index]
        _report(p, why, stacklevel=3)
        if self.pm.get_plugin(plugin_name) is not None:
            self.pm.unregister(name=plugin_name)
        self.registry.withdraw(_source(p))
        self.plugins[index] = attrs.evolve(p, registered=(), error=why)
        self.revision += 1


def _strict() -> bool:
    return os.environ.get("NDCOST_STRICT_PLUGINS", "").strip() not in ("", "0", "false", "no")


def _source(p: LoadedPlugin) -> Source:
    return Source(distribution=p.distribution, module=p.module, version=p.version, entry_point=p.name)


def _report(p: LoadedPlugin, error: str, stacklevel: int) -> None:
    """A broken plugin: a PluginLoadError under NDCOST_STRICT_PLUGINS, else a PluginLoadWarning naming it."""
    message = f"ndcost plugin {p.name!r} ({p.module}) of distribution {p.distribution!r} failed to load: {error}"
    if _strict():
        raise PluginLoadError(message + " (NDCOST_STRICT_PLUGINS is set; unset it to load the "
                              "other plugins without this one, or fix or uninstall "
                              f"{p.distribution!r})")
    warnings.warn(message + "; the other plugins still load "
                  "(set NDCOST_STRICT_PLUGINS=1 to make this an error)", PluginLoadWarning, stacklevel=stacklevel + 1)


def _returned(hook: str, value: object) -> None:
    """A hook specified to return nothing that returned something: the plugin misread the hook."""
    if value is not None:
        text = repr(value)
        raise PluginLoadError(f"its {hook} hook returned {type(value).__name__} "
                              f"{text[:60] + '...' if len(text) > 60 else text}; it must return None "
                              f"(see ndcost.hookspecs.{hook})")


def _entry_points() -> list:
    return sorted(metadata.entry_points(group=GROUP), key=lambda ep: (ep.dist.name if ep.dist else "", ep.name))


def load(extra_modules: Optional[Dict[str, object]] = None, *, check_essential: bool = True) -> PluginSet:
    """Load every plugin of the entry-point group and resolve their registrations.

    *extra_modules* (name -> module or object with hooks) are added as if they
    were entry points of a distribution named ``<local>``, for tests and
    scripts.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    registry = Registry()
    loaded: List[LoadedPlugin] = []
    seen_names = set()
    candidates = []
    for ep in _entry_points():
        dist = ep.dist.name if ep.dist else "<unknown>"
        version = ep.dist.version if ep.dist else ""
        candidates.append((ep.name, dist, version, ep.value, ep.load))
    for name, obj in (extra_modules or {}).items():
        candidates.append((name, "<local>", "", getattr(obj, "__name__", name), lambda obj=obj: obj))

    for name, dist, version, module, loader in candidates:
        plugin_name = f"{dist}:{name}"
        if plugin_name in seen_names:
            continue
        seen_names.add(plugin_name)
        before = len(registry._pending)
        try:
            plugin = loader()
            if pm.is_registered(plugin):  # a second entry point naming a module already loaded
                loaded.append(LoadedPlugin(name=name, distribution=dist, version=version, module=module))
                continue
            pm.register(plugin, name=plugin_name)
            source = Source(distribution=dist, module=module, version=version, entry_point=name)
            impls = [impl for impl in pm.hook.ndcost_register.get_hookimpls() if impl.plugin is plugin]
            for impl in impls:
                _returned("ndcost_register", _call(impl, register=registry.callback(source)))
        except (Exception, SystemExit) as exc:  # a broken third party must not take the rest down, nor exit
            del registry._pending[before:]  # nothing of a failed plugin stays registered
            if pm.get_plugin(plugin_name) is not None:
                pm.unregister(name=plugin_name)
            error = f"{type(exc).__name__}: {exc}"
            failed = LoadedPlugin(name=name, distribution=dist, version=version, module=module, error=error)
            try:
                _report(failed, error, stacklevel=2)
            except PluginLoadError as strict:
                raise strict from exc
            loaded.append(failed)
            continue
        keys = tuple(e.key for e in registry._pending[before:])
        loaded.append(LoadedPlugin(name=name, distribution=dist, version=version, module=module, registered=keys))

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginLoadError(f"a plugin implements a hook ndcost does not define: {exc}; hooks are named in "
                              f"ndcost.hookspecs (ndcost_register, ndcost_op_records, ndcost_loaded)") from exc
    registry.freeze()
    plugin_set = PluginSet(pm, registry, loaded)
    if check_essential:
        _check_essential(loaded)
    for impl in pm.hook.ndcost_loaded.get_hookimpls():  # one by one, to name a plugin that fails or registers late
        if pm.get_plugin(impl.plugin_name) is None:  # left out by a hook before this one
            continue
        earlier = {id(e) for e in registry._pending}  # by identity: a hook may withdraw another plugin's
        try:
            _returned("ndcost_loaded", _call(impl, registry=registry, plugins=plugin_set))
            late = [e.key for e in registry._pending if id(e) not in earlier]
            if late:
                raise RegistrationError(f"it registered {', '.join(late)} from ndcost_loaded, which runs after "
                                        f"registration closed; register them in its ndcost_register hook")
        except (Exception, SystemExit) as exc:
            if isinstance(exc, PluginLoadError) and _strict():
                raise  # a plugin this hook left out (PluginSet.exclude), under NDCOST_STRICT_PLUGINS
            registry._pending = [e for e in registry._pending if id(e) in earlier]  # exclude resolves again
            plugin_set.exclude(impl.plugin_name, f"its ndcost_loaded hook failed: {type(exc).__name__}: {exc}")
    if check_essential and plugin_set.revision:
        _check_essential(plugin_set.plugins)
    return plugin_set


def _check_essential(loaded: List[LoadedPlugin]) -> None:
    """Every essential built-in loaded, else a StalePluginSet naming the missing ones and why they failed."""
    present = {p.name for p in loaded if p.distribution == "ndcost" and p.error is None}
    missing = sorted(ESSENTIAL - present)
    if missing:
        failures = {p.name: p.error for p in loaded if p.distribution == "ndcost" and p.error is not None}
        why = "; ".join(f"{n}: {failures[n]}" for n in missing if n in failures)
        raise StalePluginSet(
            f"ndcost's essential plugins {', '.join(missing)} are not installed or failed to load"
            f"{' (' + why + ')' if why else ''}: the installed metadata is stale or broken; reinstall "
            f"with `pip install -e .` (or `pip install .`) from the ndcost checkout")


def _call(impl, **kwargs):
    """One hook implementation with the arguments it declares (pluggy lets it take a subset)."""
    return impl.function(*(kwargs[name] for name in impl.argnames))


_lock = threading.Lock()
_current: Optional[PluginSet] = None


def plugins() -> PluginSet:
    """The process-wide plugin set, loaded on first use."""
    global _current
    with _lock:
        if _current is None:
            _current = load()
        return _current


def registry() -> Registry:
    """The process-wide registry (see :func:`plugins`)."""
    return plugins().registry


def reset() -> None:
    """Forget the loaded plugin set (tests that install or remove a distribution)."""
    global _current
    with _lock:
        _current = None
    importlib.invalidate_caches()
