"""Keys, the plugins that registered them, and deterministic resolution of duplicates.

Registrations are collected first and resolved once every plugin has loaded
(:meth:`Registry.freeze`), so load order never decides which entry wins: a key
held by two plugins is an error naming both, unless exactly one of them
declares ``override=True``.

A value registered under a namespace that declares a contract
(:mod:`ndcost.protocols`: ``optimizer``, ``schedule``, ``family`` ...) must
satisfy it: a wrong value is refused when it is registered, naming the key,
the plugin, the namespace's requirements and the value, rather than failing
later when a cost is first priced.
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import attrs

from ndcost import protocols
from ndcost.errors import RegistrationError, UnknownKey

# A key is a namespace and a name, "optimizer/adamw", "family/llama",
# "formula/attention.params.mla": lower case, no spaces, one or more slashes.
_KEY = re.compile(r"^[a-z][a-z0-9_]*(/[a-z0-9][a-z0-9_.\-]*)+$")


def validate_key(key: Any) -> str:
    """*key* if it is well formed, else a RegistrationError saying the form."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise RegistrationError(
            f"invalid registry key {key!r}: use 'namespace/name' in lower case, "
            f"letters, digits, '_', '.', '-' (for example 'optimizer/lion')")
    return key


@attrs.frozen(kw_only=True)
class Source:
    """Where a registration came from: the distribution, its version and the plugin module."""

    distribution: str
    module: str
    version: str = ""
    entry_point: str = ""

    def __str__(self) -> str:
        return f"{self.module} (distribution {self.distribution})"

    @property
    def short(self) -> str:
        """``distribution (module)``, as a refused registration names its plugin."""
        return f"{self.distribution} ({self.module})"


@attrs.frozen(kw_only=True)
class Entry:
    """One registered value under its key, with who registered it and whether it overrides."""

    key: str
    value: Any = attrs.field(repr=False)
    source: Source
    override: bool = False
    overrides: Optional[Source] = None  # the entry this one replaced, once resolved


class Registry:
    """Collects registrations, then resolves and serves them.

    A plugin contributes by calling the ``register`` callback its hook
    receives (:meth:`callback`), which records the plugin as the source.
    """

    def __init__(self, contracts: Optional[Mapping[str, "protocols.NamespaceContract"]] = None) -> None:
        # namespace -> contract its values must meet; None: ndcost's declared ones (ndcost.protocols.CONTRACTS)
        self.contracts: Mapping[str, protocols.NamespaceContract] = (
            protocols.CONTRACTS if contracts is None else dict(contracts))
        self._pending: List[Entry] = []
        self._entries: Dict[str, Entry] = {}
        self._frozen = False
        self.generation = 0  # counts resolutions: what a caller derived from the entries is stale once it moves

    # -- registration -------------------------------------------------------
    def callback(self, source: Source) -> Callable[..., None]:
        """The ``register(key, value, *, override=False)`` callback for one plugin."""

        def register(key: str, value: Any, *, override: bool = False) -> None:
            self.add(key, value, source=source, override=override)

        return register

    def add(self, key: str, value: Any, *, source: Source, override: bool = False) -> None:
        """Record one registration; conflicts are decided by :meth:`freeze`, not by order."""
        validate_key(key)
        if value is None:
            raise RegistrationError(f"{source} registered {key!r} with no value")
        contract = protocols.contract_for(key, self.contracts)
        why = None if contract is None else contract.refusal(value)
        if why is not None:
            assert contract is not None  # why is only set when there is a contract
            raise RegistrationError(f"{key} from {source.short}: {why}; every '{contract.namespace}/' value must "
                                    f"meet that contract: fix the value {source.module} registers")
        entry = Entry(key=key, value=value, source=source, override=bool(override))
        self._pending.append(entry)
        if self._frozen:  # a late registration is resolved at once; a refused one leaves no trace
            try:
                self._resolve([entry])
            except RegistrationError:
                self._pending.pop()
                raise

    def withdraw(self, source: Source) -> Tuple[str, ...]:
        """Drop every registration of *source* (a plugin found broken after it registered); the keys it held.

        Once frozen, the rest are resolved again, so that a key it overrode
        falls back to the entry it replaced.
        """
        keys = tuple(e.key for e in self._pending if e.source == source)
        self._pending = [e for e in self._pending if e.source != source]
        if self._frozen:
            self.freeze()
        return keys

    def freeze(self) -> None:
        """Resolve every collected registration; raise on an undeclared duplicate."""
        self._entries = {}
        self._resolve(self._pending)
        self._frozen = True

    def _resolve(self, entries: Iterable[Entry]) -> None:
        self.generation += 1
        by_key: Dict[str, List[Entry]] = {}
        for entry in self._pending:
            by_key.setdefault(entry.key, []).append(entry)
        for key in {e.key for e in entries}:
            group = by_key[key]
            base = [e for e in group if not e.override]
            over = [e for e in group if e.override]
            if len(base) > 1:
                a, b = base[0], base[1]
                raise RegistrationError(
                    f"{key!r} is registered by both {a.source} and {b.source}; "
                    f"remove one, or pass override=True in the one that should win")
            if len(over) > 1:
                a, b = over[0], over[1]
                raise RegistrationError(
                    f"{key!r} is overridden by both {a.source} and {b.source}; "
                    f"only one plugin may override a key: uninstall one of them")
            if over:
                self._entries[key] = attrs.evolve(
                    over[0], overrides=base[0].source if base else None)
            else:
                self._entries[key] = base[0]

    # -- lookup -------------------------------------------------------------
    def entry(self, key: str) -> Entry:
        """The entry under *key*; an unknown key fails listing the closest known ones."""
        try:
            return self._entries[key]
        except KeyError:
            raise UnknownKey(self._unknown(key)) from None

    def get(self, key: str) -> Any:
        """The value under *key* (see :meth:`entry`)."""
        return self.entry(key).value

    def find(self, key: str) -> Optional[Any]:
        """The value under *key*, or None where nobody registered it."""
        entry = self._entries.get(key)
        return None if entry is None else entry.value

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def keys(self, namespace: Optional[str] = None) -> List[str]:
        """Registered keys, sorted; those under ``namespace/`` only where given."""
        prefix = None if namespace is None else namespace.rstrip("/") + "/"
        return sorted(k for k in self._entries if prefix is None or k.startswith(prefix))

    def names(self, namespace: str) -> List[str]:
        """The names under *namespace*, without the namespace."""
        n = len(namespace.rstrip("/")) + 1
        return [k[n:] for k in self.keys(namespace)]

    def items(self, namespace: Optional[str] = None) -> Iterator[Tuple[str, Any]]:
        for key in self.keys(namespace):
            yield key, self._entries[key].value

    def entries(self) -> List[Entry]:
        return [self._entries[k] for k in self.keys()]

    def overrides(self) -> List[Entry]:
        """The entries that replaced another plugin's, for reporting."""
        return [e for e in self.entries() if e.override]

    def by_source(self) -> Dict[Tuple[str, str], List[str]]:
        """Keys each (distribution, module) registered and that are in force."""
        out: Dict[Tuple[str, str], List[str]] = {}
        for e in self.entries():
            out.setdefault((e.source.distribution, e.source.module), []).append(e.key)
        return out

    def _unknown(self, key: str) -> str:
        namespace = key.split("/", 1)[0] if "/" in key else None
        pool = self.keys(namespace) or self.keys()
        close = difflib.get_close_matches(key, pool, n=5, cutoff=0.4)
        known = close or pool[:8]
        hint = f"closest known: {', '.join(known)}" if known else "nothing is registered under it"
        return f"unknown key {key!r}; {hint}"
