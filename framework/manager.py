"""Loads the ``ndcost.plugins`` entry points, built-ins exactly like third parties.

After loading, an essential set of built-in plugins must be present (a stale
editable install lacks newly added entry points, and fails loudly naming the
fix) and ``check_pending()`` verifies that every implemented hook has a spec.
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

    @property
    def hook(self):
        return self.pm.hook


def _strict() -> bool:
    return os.environ.get("NDCOST_STRICT_PLUGINS", "").strip() not in ("", "0", "false", "no")


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

    failures: Dict[str, str] = {}
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
                _call(impl, register=registry.callback(source))
        except Exception as exc:  # a broken third party must not take the rest down
            del registry._pending[before:]  # nothing of a failed plugin stays registered
            if pm.get_plugin(plugin_name) is not None:
                pm.unregister(name=plugin_name)
            error = f"{type(exc).__name__}: {exc}"
            message = f"ndcost plugin {name!r} ({module}) of distribution {dist!r} failed to load: {error}"
            if _strict():
                raise PluginLoadError(message + " (NDCOST_STRICT_PLUGINS is set; unset it to load the "
                                      "other plugins without this one, or fix or uninstall "
                                      f"{dist!r})") from exc
            warnings.warn(message + "; the other plugins still load "
                          "(set NDCOST_STRICT_PLUGINS=1 to make this an error)", PluginLoadWarning, stacklevel=2)
            loaded.append(LoadedPlugin(name=name, distribution=dist, version=version, module=module, error=error))
            if dist == "ndcost":
                failures[name] = error
            continue
        keys = tuple(e.key for e in registry._pending[before:])
        loaded.append(LoadedPlugin(name=name, distribution=dist, version=version, module=module, registered=keys))

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginLoadError(f"a plugin implements a hook ndcost does not define: {exc}; hooks are named in "
                              f"ndcost.hookspecs (ndcost_register, ndcost_op_records, ndcost_loaded)") from exc
    registry.freeze()
    if check_essential:
        present = {p.name for p in loaded if p.distribution == "ndcost" and p.error is None}
        missing = sorted(ESSENTIAL - present)
        if missing:
            why = "; ".join(f"{n}: {failures[n]}" for n in missing if n in failures)
            raise StalePluginSet(
                f"ndcost's essential plugins {', '.join(missing)} are not installed or failed to load"
                f"{' (' + why + ')' if why else ''}: the installed metadata is stale or broken; reinstall "
                f"with `pip install -e .` (or `pip install .`) from the ndcost checkout")
    for impl in pm.hook.ndcost_loaded.get_hookimpls():  # one by one, to name a plugin that registers late
        before = len(registry._pending)
        _call(impl, registry=registry)
        if len(registry._pending) != before:
            late = ", ".join(e.key for e in registry._pending[before:])
            raise RegistrationError(f"plugin {impl.plugin_name} registered {late} from ndcost_loaded, which runs "
                                    f"after registration closed; register them in its ndcost_register hook")
    return PluginSet(pm, registry, loaded)


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
