"""Every hook a plugin can implement: one module, typed, each saying when it runs.

A plugin module implements hooks with ``@ndcost.hookimpl`` and is declared as
an entry point of the group ``ndcost.plugins`` in its distribution's metadata.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Mapping

import pluggy

if TYPE_CHECKING:  # the registry imports nothing of the hooks; keep it that way at run time
    from ndcost.manager import PluginSet
    from ndcost.registry import Registry

PROJECT = "ndcost"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[..., None]


@hookspec
def ndcost_register(register: Register) -> None:
    """Contribute estimators, families, contracts, formats, optimizers, schedules or hardware.

    Runs once per process, when the plugin manager loads the entry points, for
    every plugin (not first-result). Call ``register(key, value,
    override=False)`` for each contribution; keys are ``namespace/name``
    (``optimizer/lion``, ``family/<model_type>``, ``formula/attention.params.mla``,
    ``hardware/h200``). A key another plugin holds is an error naming both
    unless this one passes ``override=True``. A value must meet its
    namespace's contract (:mod:`ndcost.protocols`: an optimizer has
    ``states_per_parameter`` ...); one that does not is refused here, naming
    this plugin and what the value lacks.
    """


@hookspec
def ndcost_op_records() -> List[Mapping[str, Any]]:  # type: ignore[empty-body]  # a hookspec: plugins implement it
    """Contribute ops and slots to the op records (same schema as ``specs/op_records.yaml``).

    Runs when the op records are merged, as the plugins load (the built-in
    op records' ``ndcost_loaded``), for every plugin (not first-result); each
    result is merged into the built-in records. A hook that raises, or whose
    result the merge refuses (malformed, or an op or slot another plugin
    defines, without ``override: true``), leaves its plugin out like any
    broken plugin, with a warning naming both where a name is defined twice.
    """


@hookspec
def ndcost_loaded(registry: "Registry", plugins: "PluginSet") -> None:
    """Inspect the resolved registry once loading is complete (for checks, or to build caches).

    Runs once per process after every plugin registered and duplicates were
    resolved, for every plugin (not first-result); an implementation takes
    either argument or both. Registration is closed by then: a key added
    from here leaves the plugin out, as does a hook that raises. *plugins*
    is the plugin set being loaded: a consumer of a hook's contributions
    that finds one unusable leaves its plugin out with
    ``plugins.exclude(plugin_name, why)``.
    """
