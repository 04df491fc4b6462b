"""The op records: a decoder layer's activations, op by op and slot by slot, priced from named values.

The records are data: ``specs/op_records.yaml`` (ndcost's own, contributed
through the ``ndcost_op_records`` hook exactly as a third party contributes)
lists the ops of the op vector, each with its recompute switch, and the
slots (``qkv``, ``score``, ``proj``, ``ffn``, ``router``, ``shared``,
``routed``, ``norm``, ``mla``, ``linear_proj``, ``linrec``, ``checkpoint``),
each with its part and terms whose bytes are expressions over named values
(widths, bytes per element, the micro-batch factor, the dropless token
factor, ``kv_shards``). Expressions are evaluated by
:mod:`ndcost.plugins.expressions`, never by ``eval``.

Layers:

- :func:`load_op_records` merges every plugin's contribution into one
  :class:`OpRecords` (an op, slot, value, switch or mode defined twice is an
  error naming both contributors, unless exactly one says ``override: true``).
- :func:`values_for` maps a :class:`~ndcost.values.ModelSpec`, a layer kind and
  an evaluation (sequence, micro-batch, TP/SP/CP/ETP, attention kernel) to a
  :class:`Values` mapping of the names the records read.
- :func:`slot_bytes`, :func:`layer_slots`, :func:`op_bytes`,
  :func:`layer_bytes`, :func:`ops_bytes`, :func:`kv_shards` give what one
  rank holds for its part of a micro-batch. No CP algorithm keeps the other
  ranks' keys and values for the backward (each saves the rank's own share;
  ndcost.compose.memory ``_ring_attention_working`` cites the sources), so no
  term holds them.
- :func:`runtime_attention` says which attention kernel a runtime profile
  runs for a model (eager materializes the scores; SDPA and flash do not).
- :func:`policy_saves` prices an op-level checkpoint policy (torchtitan's) on a
  layer's ``calls``: the forward calls such a policy decides on, in order, with
  their outputs' bytes and matmul FLOPs; :func:`policy_unpriced` says where the
  records cannot (a layer whose calls are not listed, a kernel stating no operator).
- :func:`formula_record` gives the resolver a :class:`~ndcost.records.KindRecord`:
  bytes per token at TP 1, the part TP does not split (``saved_per_token``)
  and the part it does (``saved_tp_per_token``), so that a rank at TP t
  keeps ``saved + saved_tp / t`` and, under sequence parallelism,
  ``(saved + saved_tp) / t``.

Known limitations: the records follow the published convention (Korthikanti
et al. 2022) where it applies: a tensor is counted once by the op whose
backward reads it first, and a norm's fp32 statistics are left out.
DeepSeek-V3.2/V4's indexer and compressors, and GPT-OSS's sinks are not in
the records (the census measures them); a fused attention kernel keeps one
fp32 statistic a head a query (``bytes_stat``), whatever its own layout.
Keys and values are split linearly over TP, even where TP exceeds the KV heads
and a run replicates them. The calls hold for the families that state them
(``calls_known``): a layer with linear attention, an output gate or another
family's calls (DeepSeek-V3.2's indexer, DeepSeek-V4) under an op-level policy
is the census's. They are listed as the census runs TP (each rank's layer at
its share of the widths): the sequence-parallel collectives a run makes around
the projections are not among them; the composition adds the outputs a policy
keeps of them (``compose/memory.py`` ``_kept_collectives``).
"""
from __future__ import annotations

import copy
import difflib
import functools
import sys
import weakref
from importlib import resources
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import attrs

from ndcost.specio import load_yaml
from ndcost.errors import InvalidValue, RegistrationError, StalePluginSet, UnknownKey, Unpriced
from ndcost.hookspecs import hookimpl
from ndcost.layer import DENSE_MLPS, NO_MLPS
from ndcost.plugins.contracts import GATED_ACTIVATIONS
from ndcost.plugins.expressions import Expression, Number, divide
from ndcost.records import KindRecord, recomputed_shares
from ndcost.values import CP_ALGOS, DTYPES, PARTS, ModelSpec

SOURCE = "op_records"
SPLITS = ("tp", "sequence")
SECTIONS = ("values", "switches", "ops", "modes", "slots", "calls")
# a listed matmul's class: a weight of the attention's, another weight, none (eager attention's scores)
MATMUL_SHARES = ("attention", "other", "scores")
# a call resolved by the layer: F.linear (aten.mm, or aten.addmm with a bias), the runtime's attention kernel
LINEAR, KERNEL = "linear", "attention_kernel"
_TOP_LEVEL = frozenset(SECTIONS) | {"schema", "doc"}
ALL = "*"

Switches = Union[None, str, Mapping[str, Number]]


# ---------------------------------------------------------------------------
# the records
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class ValueDecl:
    """A name an expression may read: given by the model or the evaluation, a default, or derived."""

    name: str
    doc: str = ""
    default: Optional[Number] = None
    expr: Optional[Expression] = None
    source: str = ""


@attrs.frozen(kw_only=True)
class Op:
    """An op of the op vector and the recompute switch that drops what it keeps."""

    name: str
    switch: str
    doc: str = ""
    source: str = ""


@attrs.frozen(kw_only=True)
class Mode:
    """A named setting of the switches: those it turns off (``ALL`` for every one) and values it sets."""

    name: str
    off: Union[str, Tuple[str, ...]] = ()
    set: Mapping[str, Number] = attrs.field(factory=dict)
    doc: str = ""
    source: str = ""


@attrs.frozen(kw_only=True)
class Term:
    """What one op keeps in a slot: bytes at TP 1, what splits them, the switches that drop them."""

    name: str
    op: str
    split: str
    bytes: Expression
    switches: Tuple[str, ...]
    holds: Optional[Expression] = None
    # the argument a tensor the model hands every layer comes under (the rotary cos and sin:
    # position_embeddings): one storage for all of a stage's layers, stated apart in the KindRecord
    shared: Optional[str] = None


@attrs.frozen(kw_only=True)
class Slot:
    """A slot of a layer's activations: its part, which layers hold it, and its terms."""

    name: str
    part: str
    terms: Tuple[Term, ...]
    holds: Optional[Expression] = None
    doc: str = ""
    source: str = ""

    def held(self, values: Mapping[str, Any]) -> bool:
        """Whether a layer of *values* holds this slot."""
        return self.holds is None or bool(self.holds.evaluate(values))


@attrs.frozen(kw_only=True)
class Call:
    """A forward call of a layer an op-level checkpoint policy decides on (``calls`` in specs/op_records.yaml)."""

    name: str
    call: str
    output: Tuple[Tuple[str, Expression], ...]  # (split, bytes of its outputs at TP 1)
    bias: Optional[str] = None
    holds: Optional[Expression] = None
    matmul: Optional[str] = None
    flops: Optional[Expression] = None
    doc: str = ""
    source: str = ""


class OpRecords:
    """Merged op records: values, switches, ops, modes, slots and calls, validated together."""

    def __init__(self, values: Mapping[str, ValueDecl], switches: Mapping[str, str], ops: Mapping[str, Op],
                 modes: Mapping[str, Mode], slots: Mapping[str, Slot], sources: Sequence[str] = (),
                 calls: Optional[Mapping[str, Call]] = None):
        self.values = dict(values)
        self.switches = dict(switches)
        self.ops = dict(ops)
        self.modes = dict(modes)
        self.slots = dict(slots)
        self.calls = dict(calls or {})
        self.sources = tuple(sources)
        self.defaults = {n: d.default for n, d in self.values.items() if d.default is not None}
        self.derived = {n: d.expr for n, d in self.values.items() if d.expr is not None}
        self._keeps: Dict[str, Tuple[str, ...]] = {}
        for slot in self.slots.values():
            for term in slot.terms:
                if slot.name not in self._keeps.setdefault(term.op, ()):
                    self._keeps[term.op] += (slot.name,)

    def __repr__(self) -> str:
        return (f"OpRecords({len(self.ops)} ops, {len(self.slots)} slots, {len(self.values)} values, "
                f"from {', '.join(self.sources) or 'nothing'})")

    # -- lookups ------------------------------------------------------------
    def record(self, op: str) -> Op:
        """The op *op*; an unknown one fails naming the closest."""
        return self._get(self.ops, op, "op")

    def slot(self, name: str) -> Slot:
        """The slot *name*; an unknown one fails naming the closest."""
        return self._get(self.slots, name, "slot")

    def mode(self, name: str) -> Mode:
        return self._get(self.modes, name, "recompute mode")

    def keeps(self, op: str) -> Tuple[str, ...]:
        """The slots that have a term kept for *op*."""
        self.record(op)
        return self._keeps.get(op, ())

    @staticmethod
    def _get(table: Mapping[str, Any], name: str, what: str) -> Any:
        try:
            return table[name]
        except (KeyError, TypeError):
            close = difflib.get_close_matches(str(name), list(table), n=3)
            hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(table)}"
            raise UnknownKey(f"the op records have no {what} {name!r}; {hint}") from None

    # -- switches -----------------------------------------------------------
    def switch_states(self, switches: Switches) -> Tuple[Dict[str, Number], Dict[str, Number]]:
        """The state of every switch (1 keeps, 0 recomputes) and the values a mode sets.

        *switches* is None (keep everything), a mode name (``none``,
        ``core_attention``, ``selective``, ``full``, ...), or a mapping of
        switches to states; switches it does not name stay on.
        """
        states = {name: 1 for name in self.switches}
        if switches is None:
            return states, {}
        if isinstance(switches, str):
            mode = self.mode(switches)
            off = tuple(self.switches) if mode.off == ALL else mode.off
            for name in off:
                states[name] = 0
            return states, dict(mode.set)
        for name, state in dict(switches).items():
            if name not in self.switches:
                close = difflib.get_close_matches(str(name), list(self.switches), n=3)
                hint = f"did you mean {', '.join(close)}? " if close else ""
                raise UnknownKey(f"unknown recompute switch {name!r}; {hint}switches: {', '.join(self.switches)}")
            if isinstance(state, bool):
                state = int(state)
            if not isinstance(state, (int, float)) or not 0 <= state <= 1:
                raise InvalidValue(f"recompute switch {name!r}: the state must be from 0 (recompute) "
                                   f"to 1 (keep), got {state!r}")
            states[name] = state
        return states, {}

    # -- evaluation ---------------------------------------------------------
    def evaluate(self, slot: str, values: "Values", keep: Mapping[str, Number],
                 only: Optional[str] = None) -> Number:
        """The bytes one rank keeps in *slot*: its held terms, each times its switches' states.

        With *only* (an op, a part, or one of the slot's term names), the
        matching terms alone, whatever the switches say.
        """
        total: Number = 0
        for _term, value in self._terms(self.slot(slot), values, keep, only):
            total += value
        return total

    def _terms(self, slot: Slot, values: "Values", keep: Mapping[str, Number],
               only: Optional[str] = None) -> Iterator[Tuple[Term, Number]]:
        """Each held term of *slot* and the bytes one rank keeps of it."""
        if only is not None:
            self._check_only(slot, only)
            is_term = any(t.name == only for t in slot.terms)
            if only not in self.ops and not is_term:  # a part: the whole slot, or nothing
                if slot.part != only:
                    return
                only = None
            keep = None
        if not slot.held(values):
            return
        for term in slot.terms:
            if only is not None and only not in (term.op, term.name):
                continue
            if term.holds is not None and not term.holds.evaluate(values):
                continue
            state: Number = 1
            if keep is not None:
                for switch in term.switches:
                    state = state * keep.get(switch, 1)
                if not state:
                    continue
            raw = on_rank(term.bytes.evaluate(values), term.split, values)
            yield term, raw if state == 1 else raw * state

    def _parts(self) -> set:
        return {s.part for s in self.slots.values()}

    def _check_only(self, slot: Slot, only: str) -> None:
        known = set(self.ops) | set(PARTS) | self._parts() | {t.name for t in slot.terms}
        if only not in known:
            close = difflib.get_close_matches(str(only), sorted(known), n=3)
            hint = f"closest: {', '.join(close)}" if close else "give an op, a part or a term name"
            raise UnknownKey(f"only={only!r} is neither an op, a part nor a term of slot {slot.name!r}; {hint}")


# ---------------------------------------------------------------------------
# merging contributions
# ---------------------------------------------------------------------------
def _entries(section: str, data: Any, source: str) -> Dict[str, Mapping[str, Any]]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise InvalidValue(f"op records of {source}: '{section}' must be a mapping of names, got {type(data).__name__}")
    out = {}
    for name, entry in data.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidValue(f"op records of {source}: {section} name {name!r} must be an identifier")
        if entry is None:
            entry = {}
        if not isinstance(entry, Mapping):
            raise InvalidValue(f"op records of {source}: {section[:-1]} {name!r} must be a mapping, got {entry!r}")
        out[name] = entry
    return out


def _resolve(section: str, found: Mapping[str, List[Tuple[str, Mapping[str, Any]]]]
             ) -> Dict[str, Tuple[str, Mapping[str, Any]]]:
    """One entry a name: a name defined twice is an error naming both, unless exactly one overrides."""
    what = section[:-1] if section != "switches" else "switch"
    out = {}
    for name, group in found.items():
        base = [g for g in group if not g[1].get("override")]
        over = [g for g in group if g[1].get("override")]
        if len(base) > 1:
            raise RegistrationError(
                f"op records: {what} {name!r} is defined by both {base[0][0]} and {base[1][0]}; "
                f"rename one, or say 'override: true' in the one that should win")
        if len(over) > 1:
            raise RegistrationError(
                f"op records: {what} {name!r} is overridden by both {over[0][0]} and {over[1][0]}; "
                f"only one contribution may override it")
        out[name] = over[0] if over else base[0]
    return out


def _text(entry: Mapping[str, Any], key: str = "doc") -> str:
    value = entry.get(key, "")
    return "" if value is None else str(value)


def _check_keys(entry: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    unknown = sorted(repr(k) for k in set(entry) - set(allowed) - {"override", "doc"})
    if unknown:
        hint = " (YAML reads an unquoted on/off/yes/no as a boolean: quote it)" \
            if any(isinstance(k, bool) for k in entry) else ""
        raise InvalidValue(f"{where}: unknown field(s) {', '.join(unknown)}{hint}; "
                           f"allowed: {', '.join(sorted(set(allowed) | {'override', 'doc'}))}")


def merge(contributions: Sequence[Tuple[str, Any]]) -> OpRecords:
    """Merge *contributions* ((source, mapping or list of mappings) pairs) into validated records."""
    found: Dict[str, Dict[str, List[Tuple[str, Mapping[str, Any]]]]] = {s: {} for s in SECTIONS}
    sources = []
    for source, data in contributions:
        items = data if isinstance(data, (list, tuple)) else [data]
        for item in items:
            if item is None:
                continue
            if not isinstance(item, Mapping):
                raise InvalidValue(f"op records of {source}: a contribution must be a mapping with "
                                   f"{', '.join(SECTIONS)}; got {type(item).__name__}")
            unknown = sorted(set(item) - _TOP_LEVEL)
            if unknown:
                raise InvalidValue(f"op records of {source}: unknown section(s) {', '.join(map(repr, unknown))}; "
                                   f"allowed: {', '.join(sorted(_TOP_LEVEL))}")
            if item.get("schema", 1) != 1:
                raise InvalidValue(f"op records of {source}: schema {item.get('schema')!r} is not supported "
                                   f"(this ndcost reads schema 1)")
            if source not in sources:
                sources.append(source)
            for section in SECTIONS:
                for name, entry in _entries(section, item.get(section), source).items():
                    found[section].setdefault(name, []).append((source, entry))
    resolved = {section: _resolve(section, found[section]) for section in SECTIONS}

    # values
    values: Dict[str, ValueDecl] = {}
    for name, (source, entry) in resolved["values"].items():
        where = f"op records of {source}: value {name!r}"
        _check_keys(entry, ("default", "expr"), where)
        if "default" in entry and "expr" in entry:
            raise InvalidValue(f"{where} states both a default and an expr; keep one")
        default = entry.get("default")
        if default is not None and (isinstance(default, bool) or not isinstance(default, (int, float))):
            raise InvalidValue(f"{where}: the default must be a number, got {default!r}")
        expr = Expression(entry["expr"], f"value {name!r} ({source})") if "expr" in entry else None
        values[name] = ValueDecl(name=name, doc=_text(entry), default=default, expr=expr, source=source)

    # ops and switches
    ops: Dict[str, Op] = {}
    switches: Dict[str, str] = {}
    for name, (source, entry) in resolved["switches"].items():
        _check_keys(entry, (), f"op records of {source}: switch {name!r}")
        switches[name] = _text(entry)
    for name, (source, entry) in resolved["ops"].items():
        _check_keys(entry, ("switch",), f"op records of {source}: op {name!r}")
        switch = str(entry.get("switch") or name)
        if not switch.isidentifier():
            raise InvalidValue(f"op records of {source}: op {name!r}: switch {switch!r} must be an identifier")
        ops[name] = Op(name=name, switch=switch, doc=_text(entry), source=source)
        switches.setdefault(switch, f"what op {name} keeps")

    # modes
    modes: Dict[str, Mode] = {}
    for name, (source, entry) in resolved["modes"].items():
        where = f"op records of {source}: mode {name!r}"
        _check_keys(entry, ("recompute", "set"), where)
        off = entry.get("recompute") or ()
        if off != ALL:
            if isinstance(off, str) or not all(isinstance(o, str) for o in off):
                raise InvalidValue(f"{where}: 'recompute' must be a list of switches or \"*\", got {off!r}")
            for switch in off:
                if switch not in switches:
                    raise InvalidValue(f"{where} turns off the unknown switch {switch!r}; "
                                       f"switches: {', '.join(switches)}")
            off = tuple(off)
        settings = dict(entry.get("set") or {})
        for value_name, number in settings.items():
            if value_name not in values:
                raise InvalidValue(f"{where} sets the undeclared value {value_name!r}")
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                raise InvalidValue(f"{where} sets {value_name!r} to {number!r}, not a number")
        modes[name] = Mode(name=name, off=off, set=settings, doc=_text(entry), source=source)

    # slots
    known_parts = set(PARTS)
    slots: Dict[str, Slot] = {}
    for name, (source, entry) in resolved["slots"].items():
        where = f"op records of {source}: slot {name!r}"
        _check_keys(entry, ("part", "holds", "terms"), where)
        part = entry.get("part")
        if part not in known_parts:
            raise InvalidValue(f"{where}: part {part!r} is not one of {', '.join(PARTS)}")
        holds = Expression(entry["holds"], f"slot {name!r} holds ({source})") if entry.get("holds") is not None \
            else None
        raw_terms = entry.get("terms")
        if not isinstance(raw_terms, (list, tuple)) or not raw_terms:
            raise InvalidValue(f"{where} has no terms; give a list of {{op, split, bytes}}")
        terms = []
        for index, raw in enumerate(raw_terms):
            if not isinstance(raw, Mapping):
                raise InvalidValue(f"{where}: term {index} must be a mapping, got {raw!r}")
            op = raw.get("op")
            term_name = str(raw.get("name") or op)
            twhere = f"{where} term {term_name!r}"
            _check_keys(raw, ("name", "op", "split", "bytes", "switches", "holds", "shared"), twhere)
            if op not in ops:
                close = difflib.get_close_matches(str(op), list(ops), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise InvalidValue(f"{twhere}: unknown op {op!r}{hint} (ops: {', '.join(ops)})")
            if term_name != op and (term_name in ops or term_name in known_parts):
                raise InvalidValue(f"{twhere}: a term's name must not be another op's or a part's name")
            if any(t.name == term_name for t in terms):
                raise InvalidValue(f"{where}: two terms are named {term_name!r}; name them apart")
            split = raw.get("split")
            if split not in SPLITS:
                raise InvalidValue(f"{twhere}: split {split!r} is not one of {', '.join(SPLITS)}")
            if "bytes" not in raw:
                raise InvalidValue(f"{twhere} states no bytes expression")
            term_switches = raw.get("switches")
            term_switches = (ops[op].switch,) if term_switches is None else tuple(term_switches)
            for switch in term_switches:
                if switch not in switches:
                    raise InvalidValue(f"{twhere}: unknown switch {switch!r}; switches: {', '.join(switches)}")
            label = f"slot {name!r} term {term_name!r} ({source})"
            terms.append(Term(
                name=term_name, op=op, split=split, bytes=Expression(raw["bytes"], label),
                switches=term_switches, shared=None if raw.get("shared") is None else str(raw["shared"]),
                holds=None if raw.get("holds") is None else Expression(raw["holds"], label + " holds")))
        slots[name] = Slot(name=name, part=part, terms=tuple(terms), holds=holds, doc=_text(entry), source=source)

    calls = {name: _call(name, source, entry, values) for name, (source, entry) in resolved["calls"].items()}

    # every name every expression reads is declared; derived values do not loop
    declared = set(values)
    for each in calls.values():
        for expression in [e for _, e in each.output] + [each.holds, each.flops]:
            if expression is not None:
                expression.check_names(declared)
    for decl in values.values():
        if decl.expr is not None:
            decl.expr.check_names(declared)
    for slot in slots.values():
        if slot.holds is not None:
            slot.holds.check_names(declared)
        for term in slot.terms:
            term.bytes.check_names(declared)
            if term.holds is not None:
                term.holds.check_names(declared)
    _check_cycles(values)
    return OpRecords(values, switches, ops, modes, slots, sources, calls)


def _call(name: str, source: str, entry: Mapping[str, Any], values: Mapping[str, ValueDecl]) -> Call:
    where = f"op records of {source}: call {name!r}"
    _check_keys(entry, ("call", "bias", "holds", "matmul", "flops", "output"), where)
    call = entry.get("call")
    if not isinstance(call, str) or not call:
        raise InvalidValue(f"{where}: 'call' must be an operator's name (aten.bmm), {LINEAR!r} or {KERNEL!r}")
    bias = entry.get("bias")
    if bias is not None and (call != LINEAR or bias not in values):
        raise InvalidValue(f"{where}: 'bias' names a declared value, and only for call: {LINEAR}; got {bias!r}")
    output = entry.get("output")
    if not isinstance(output, Mapping) or not output or any(split not in SPLITS for split in output):
        raise InvalidValue(f"{where}: 'output' must map splits ({', '.join(SPLITS)}) to bytes expressions, "
                           f"got {output!r}")
    matmul = entry.get("matmul")
    if matmul not in (None,) + MATMUL_SHARES or (matmul is None) != ("flops" not in entry):
        raise InvalidValue(f"{where}: a matmul states 'matmul' ({', '.join(MATMUL_SHARES)}) and 'flops' "
                           f"together; another call neither")
    label = f"call {name!r} ({source})"
    return Call(name=name, call=call, bias=bias, matmul=matmul, doc=_text(entry), source=source,
                output=tuple((split, Expression(text, f"{label} output")) for split, text in output.items()),
                holds=None if entry.get("holds") is None else Expression(entry["holds"], f"{label} holds"),
                flops=None if matmul is None else Expression(entry["flops"], f"{label} flops"))


def _check_cycles(values: Mapping[str, ValueDecl]) -> None:
    state: Dict[str, int] = {}

    def visit(name: str, path: Tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            loop = path[path.index(name):] + (name,)
            raise InvalidValue(f"op records: derived values depend on themselves: {' -> '.join(loop)}")
        state[name] = 1
        expr = values[name].expr
        for dep in sorted(expr.names) if expr is not None else ():
            if values[dep].expr is not None:
                visit(dep, path + (name,))
        state[name] = 2

    for name in values:
        visit(name, ())


# ---------------------------------------------------------------------------
# loading through the hook
# ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _builtin_text() -> str:
    return (resources.files("ndcost.specs") / "op_records.yaml").read_text()


def builtin_records() -> Dict[str, Any]:
    """ndcost's own contribution: ``specs/op_records.yaml`` as a mapping (a fresh copy)."""
    return copy.deepcopy(_builtin_mapping())


@functools.lru_cache(maxsize=1)
def _builtin_mapping() -> Dict[str, Any]:
    return load_yaml(_builtin_text(), where="specs/op_records.yaml")


@hookimpl
def ndcost_op_records():
    """ndcost's built-in op records, contributed as any plugin contributes its own."""
    return [builtin_records()]


@hookimpl
def ndcost_loaded(plugins):
    """Merge the op records as the plugins load: a broken contribution leaves its plugin out before any figure."""
    load_op_records(plugins)


# plugin set -> (its revision when merged, the records)
_cache: "weakref.WeakKeyDictionary[Any, Tuple[int, OpRecords]]" = weakref.WeakKeyDictionary()


def load_op_records(plugins: Any = None) -> OpRecords:
    """The op records every plugin of *plugins* (the process-wide set where omitted) contributes, merged.

    Merged once per plugin set, ndcost's own records first. Fails where they
    are not among the contributions (a stale install), naming the fix. A
    third party's hook that raises, or whose contribution the merge refuses
    (malformed, or redefining a name without ``override``), leaves its plugin
    out (:meth:`ndcost.manager.PluginSet.exclude`: a warning naming its
    distribution, an error under NDCOST_STRICT_PLUGINS=1), so the records are
    never half of what the plugins meant.
    """
    if plugins is None:
        from ndcost import manager
        plugins = manager.plugins()
    revision = getattr(plugins, "revision", 0)
    try:
        cached = _cache.get(plugins)
    except TypeError:  # an object without weak references is merged every time
        cached = None
    if cached is not None and cached[0] == revision:
        return cached[1]
    impls = sorted(plugins.pm.hook.ndcost_op_records.get_hookimpls(), key=lambda impl: impl.plugin_name)
    this = sys.modules[__name__]
    builtin = [impl for impl in impls if impl.plugin is this or getattr(impl.plugin, "__name__", None) == __name__]
    if not builtin:
        raise StalePluginSet(
            "ndcost's built-in op records (entry point 'op_records', module ndcost.plugins.op_records) are "
            "not loaded: the installed metadata is stale; reinstall with `pip install -e .` from the checkout")
    accepted: List[Tuple[str, Any]] = []
    records = None
    for impl in builtin + [impl for impl in impls if impl not in builtin]:
        module = getattr(impl.plugin, "__name__", type(impl.plugin).__name__)
        source = f"{impl.plugin_name} ({module})"
        try:
            result = impl.function()
        except (Exception, SystemExit) as exc:
            if impl in builtin:
                raise RegistrationError(f"op records of {source} failed: {type(exc).__name__}: {exc}") from exc
            _leave_out(plugins, impl.plugin_name, f"its ndcost_op_records hook raised {type(exc).__name__}: {exc}")
            continue
        try:
            records = merge(accepted + [(source, result)])
        except Exception as exc:
            if impl in builtin:
                raise
            _leave_out(plugins, impl.plugin_name, f"its ndcost_op_records contribution is refused "
                                                  f"({type(exc).__name__}: {exc})")
            continue
        accepted.append((source, result))
    assert records is not None  # the built-in records merged, or raised
    try:
        _cache[plugins] = (getattr(plugins, "revision", 0), records)
    except TypeError:
        pass
    return records


def _leave_out(plugins: Any, plugin_name: str, why: str) -> None:
    exclude = getattr(plugins, "exclude", None)
    if exclude is None:  # not a manager's plugin set: nothing to leave the plugin out of
        raise RegistrationError(f"plugin {plugin_name}: {why}")
    exclude(plugin_name, why)


# ---------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------
class Values(Mapping):
    """The named values the records read for one layer: given (overrides first), derived, or defaults.

    A name the records do not declare is refused when given; a declared name
    neither given nor defaulted fails when read, naming the layer.
    """

    def __init__(self, given: Mapping[str, Any], records: OpRecords, label: str = "these values"):
        self.records = records
        self.label = label
        self._given = dict(given)
        for name, value in self._given.items():
            if name not in records.values:
                close = difflib.get_close_matches(str(name), list(records.values), n=3)
                hint = f"did you mean {', '.join(close)}? " if close else ""
                raise UnknownKey(f"{label}: {name!r} is not a value the op records read; {hint}"
                                 f"(declared: {', '.join(sorted(records.values))})")
            if isinstance(value, bool):
                self._given[name] = int(value)
            elif not isinstance(value, (int, float)):
                raise InvalidValue(f"{label}: value {name!r} must be a number, got {value!r}")
        self._cache: Dict[str, Number] = {}
        self._reading: List[str] = []

    def __getitem__(self, name: str) -> Number:
        if name in self._given:
            return self._given[name]
        if name in self._cache:
            return self._cache[name]
        decl = self.records.values.get(name)
        if decl is None:
            close = difflib.get_close_matches(str(name), list(self.records.values), n=3)
            raise UnknownKey(f"{name!r} is not a value the op records declare"
                             + (f"; closest: {', '.join(close)}" if close else ""))
        if decl.expr is not None:
            value = decl.expr.evaluate(self)
        elif decl.default is not None:
            value = decl.default
        else:
            raise UnknownKey(f"value {name!r} ({decl.doc}) is not given for {self.label}; "
                             f"give it (values_for states it for the kinds that need it)")
        self._cache[name] = value
        return value

    def __iter__(self) -> Iterator[str]:
        return (name for name in self.records.values if name in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return name in self._given or (name in self.records.values and (
            self.records.values[name].default is not None or self.records.values[name].expr is not None))

    @property
    def given(self) -> Dict[str, Number]:
        return dict(self._given)

    def override(self, overrides: Optional[Mapping[str, Any]]) -> "Values":
        """These values with *overrides* in place of what they give."""
        if not overrides:
            return self
        return Values({**self._given, **overrides}, self.records, self.label)

    def __repr__(self) -> str:
        return f"Values({self.label}: {self._given})"


def as_values(values: Union[Values, Mapping[str, Any]], records: Optional[OpRecords] = None,
              overrides: Optional[Mapping[str, Any]] = None) -> Values:
    """*values* as :class:`Values` (a plain mapping is checked against the records), with *overrides*."""
    if isinstance(values, Values):
        return values.override(overrides)
    records = records or load_op_records()
    return Values({**dict(values), **dict(overrides or {})}, records)


# ---------------------------------------------------------------------------
# the evaluation API
# ---------------------------------------------------------------------------
def _prepare(values, switches, overrides, records):
    values = as_values(values, records, overrides)
    states, settings = values.records.switch_states(switches)
    if settings:
        values = values.override(settings)
    return values, states


def slot_bytes(values: Union[Values, Mapping[str, Any]], slot: str, switches: Switches = None,
               overrides: Optional[Mapping[str, Any]] = None, only: Optional[str] = None,
               *, records: Optional[OpRecords] = None) -> Number:
    """Bytes held in activation *slot* by one rank for its part of a micro-batch.

    Args:
        values: The layer's values (:func:`values_for`, or a mapping of names).
        slot: The slot.
        switches: A mode name (``core_attention``, ``selective``, ``full``) or
            a mapping of switches, 1 to keep and 0 to recompute; all kept where
            omitted.
        overrides: Values that stand for those given.
        only: An op, a part, or a term of the slot to price alone, whatever
            the switches say.
    Returns 0 for a slot the layer does not hold.
    """
    values, states = _prepare(values, switches, overrides, records)
    return values.records.evaluate(slot, values, states, only)


def layer_slots(values: Union[Values, Mapping[str, Any]], *, records: Optional[OpRecords] = None) -> Dict[str, str]:
    """The slots a layer of *values* holds, each with its part."""
    values = as_values(values, records)
    return {name: slot.part for name, slot in values.records.slots.items() if slot.held(values)}


def op_bytes(values: Union[Values, Mapping[str, Any]], op: str, *,
             records: Optional[OpRecords] = None) -> Dict[str, Number]:
    """Per slot of the layer, the bytes *op* leaves held when no switch recomputes it."""
    values = as_values(values, records)
    held = layer_slots(values)
    return {slot: values.records.evaluate(slot, values, {}, only=op)
            for slot in values.records.keeps(op) if slot in held}


def term_bytes(values: Union[Values, Mapping[str, Any]], switches: Switches = None, *,
               records: Optional[OpRecords] = None) -> List[Tuple[str, str, str, str, str, Number]]:
    """Every kept term of the layer: (slot, part, term, op, split, bytes one rank keeps)."""
    values, states = _prepare(values, switches, None, records)
    out = []
    for slot in values.records.slots.values():
        for term, value in values.records._terms(slot, values, states):  # pylint: disable=protected-access
            out.append((slot.name, slot.part, term.name, term.op, term.split, value))
    return out


def _summed(values, switches, records, field: int) -> Dict[str, Number]:
    """:func:`term_bytes` summed by one of its fields (1: part, 3: op)."""
    out: Dict[str, Number] = {}
    for row in term_bytes(values, switches, records=records):
        out[row[field]] = out.get(row[field], 0) + row[-1]
    return out


def layer_bytes(values: Union[Values, Mapping[str, Any]], switches: Switches = None, *,
                records: Optional[OpRecords] = None) -> Dict[str, Number]:
    """What a layer keeps, by part, under *switches* (everything kept where omitted)."""
    return _summed(values, switches, records, 1)


def ops_bytes(values: Union[Values, Mapping[str, Any]], switches: Switches = None, *,
              records: Optional[OpRecords] = None) -> Dict[str, Number]:
    """What a layer keeps, by op, under *switches*."""
    return _summed(values, switches, records, 3)


def total_bytes(values: Union[Values, Mapping[str, Any]], switches: Switches = None, *,
                records: Optional[OpRecords] = None) -> Number:
    """Total bytes one rank's layer holds for its part of a micro-batch."""
    return sum(v for *_, v in term_bytes(values, switches, records=records))


def kv_shards(values: Union[Values, Mapping[str, Any]], *, records: Optional[OpRecords] = None) -> Number:
    """The number of CP ranks that divide a layer's keys and values between them.

    It is the full CP degree under Ulysses (each rank holds a subset of the
    heads) and for a linear-attention layer (which hands on a recurrent state
    rather than collecting keys and values); it is 1 for ring, Colossal-AI and
    hybrid CP, whose ring passes every rank's keys and values through each rank.
    """
    return as_values(values, records)["kv_shards"]


def on_rank(raw: Number, split: str, values: Mapping[str, Any]) -> Number:
    """Bytes at TP 1 as one rank holds them: a ``tp`` split divided by TP, a ``sequence`` one only under SP."""
    return divide(raw, values["tp"]) if split == "tp" or values["sp"] else raw


def policy_unpriced(values: Union[Values, Mapping[str, Any]], kernel_call: Optional[str], *,
                    records: Optional[OpRecords] = None) -> Optional[str]:
    """Why the records cannot say what this layer keeps under an op-level checkpoint policy, or None.

    *kernel_call* is the operator the attention kernel stands for
    (``AttentionKernel.call``; None where the kernel states none).
    """
    values = as_values(values, records)
    if not values["calls_listed"]:
        return ("the op records list the calls of a layer whose family states it makes them (calls_known), with a "
                "gated feed-forward and no output gate (calls_listed), not this layer's")
    if not values["scores"] and kernel_call is None:
        return "the attention kernel states no operator a checkpoint policy decides on (AttentionKernel.call)"
    for call in _held_calls(values):
        if call.bias is not None and call.bias not in values:
            return (f"the model does not state whether its {call.name} adds a bias (the value {call.bias!r}: "
                    f"aten.addmm or aten.mm); state attention_bias / mlp_bias in its config")
    return None


def _held_calls(values: Values) -> Iterator[Call]:
    """The calls a layer of *values* makes, in order."""
    return (call for call in values.records.calls.values() if call.holds is None or call.holds.evaluate(values))


def policy_saves(values: Union[Values, Mapping[str, Any]], policy: Any, kernel_call: Optional[str], *,
                 records: Optional[OpRecords] = None) -> Tuple[Dict[str, Number], Dict[str, float]]:
    """What the op-level checkpoint *policy* keeps of this layer's calls, and the matmul FLOPs it recomputes.

    Returns the bytes one rank keeps of the outputs the policy saves, by
    split, and per share (``attention``, ``other``, ``scores``) the fraction
    of its forward FLOPs (the kernel's calls) the backward runs again
    (:func:`ndcost.records.recomputed_shares`). The layer's input, which the
    checkpoint keeps, is full recompute's (the ``full`` mode) and not in these
    bytes. The policy decides call by call in the records' order
    (``CheckpointPolicy.decider``, the rule the census runs on the ops it
    dispatches). Raises :class:`~ndcost.errors.Unpriced` with
    :func:`policy_unpriced`'s reason.
    """
    values = as_values(values, records)
    why = policy_unpriced(values, kernel_call)
    if why is not None:
        raise Unpriced(why)
    save = policy.decider()
    kept: Dict[str, Number] = {}
    flops: Dict[Tuple[str, bool], Number] = {}
    for call in _held_calls(values):
        if call.call == LINEAR:
            name = "aten.addmm" if call.bias is not None and values[call.bias] else "aten.mm"
        else:
            name = kernel_call if call.call == KERNEL else call.call
        saved = save(str(name))
        if saved:
            for split, expression in call.output:
                kept[split] = kept.get(split, 0) + on_rank(expression.evaluate(values), split, values)
        if call.flops is not None:
            key = (str(call.matmul), not saved)
            flops[key] = flops.get(key, 0) + call.flops.evaluate(values)
        elif call.call == KERNEL:  # the fused kernel: decided on by the call
            flops[("kernel", not saved)] = flops.get(("kernel", not saved), 0) + 1
    return kept, recomputed_shares(flops)


# ---------------------------------------------------------------------------
# a ModelSpec's values
# ---------------------------------------------------------------------------
def attention_kernel(name: str, where: str = "") -> Any:
    """The registered ``attention_kernel/<name>``: whether it materializes the scores or keeps their statistics.

    The kernels are registered by the plugins that know them (the CUDA SDPA
    and NPU contracts), so the records hold no closed list; an unknown one
    fails naming the registered kernels and how to add one. *where* opens the
    message ("runtime 'x' runs attention").
    """
    from ndcost import manager
    registry = manager.registry()
    kernel = registry.find(f"attention_kernel/{name}")
    if kernel is None:
        known = registry.names("attention_kernel")
        raise InvalidValue(f"{where or 'attention='}{name!r} is not a registered attention kernel; known: "
                           f"{', '.join(known) or 'none'} (a plugin adds one by registering an "
                           f"AttentionKernel(name=..., materializes_scores=...) as 'attention_kernel/<name>')")
    return kernel


def _need(spec: ModelSpec, kind: str, field: str, value: Any) -> Any:
    if value is None:
        raise InvalidValue(f"model {spec.name!r} (family {spec.family!r}): layer kind {kind!r} needs "
                           f"ModelSpec.{field}, which the spec leaves unset; state it")
    if isinstance(value, (int, float)) and value <= 0:
        raise InvalidValue(f"model {spec.name!r} (family {spec.family!r}): ModelSpec.{field} must be > 0 "
                           f"for layer kind {kind!r}, got {value!r}")
    return value


def model_values(spec: ModelSpec, kind: str, *, attention: str = "eager", dropout: Optional[bool] = None,
                 ffn: Optional[str] = None) -> Dict[str, Number]:
    """The named values a layer of *kind* of *spec* gives the records (widths and flags)."""
    if kind not in spec.kinds:
        close = difflib.get_close_matches(kind, list(spec.kinds), n=3)
        raise UnknownKey(f"model {spec.name!r} has no layer kind {kind!r}; its kinds: {', '.join(spec.kinds)}"
                         + (f" (closest: {', '.join(close)})" if close else ""))
    scores = int(attention_kernel(attention).materializes_scores)
    if ffn not in (None, "dense", "moe"):
        raise InvalidValue(f"ffn={ffn!r}: allowed: dense, moe (or None to read the spec)")
    info = spec.kind(kind)
    h, a = spec.hidden_size, spec.num_attention_heads
    mlp = info.mlp if ffn is None else ffn
    moe = mlp not in DENSE_MLPS + NO_MLPS
    out: Dict[str, Number] = {"h": h, "a": a, "attention": int(not info.linear),
                              "linear_attention": int(info.linear), "moe": int(moe),
                              "has_ffn": int(mlp not in NO_MLPS), "mtp": int(info.mtp),
                              "scores": scores}
    if dropout is None:
        out["dropout_attn"] = int(info.attention_dropout > 0)
        out["dropout_hidden"] = int(info.hidden_dropout > 0)
    else:
        out["dropout_attn"] = out["dropout_hidden"] = int(bool(dropout))

    if info.latent:
        nope = spec.qk_nope_head_dim or 0
        rope = _need(spec, kind, "qk_rope_head_dim", spec.qk_rope_head_dim)
        out.update(mla=1, kv_heads=a, dk=nope + rope, dv=_need(spec, kind, "v_head_dim", spec.v_head_dim),
                   q_lora=spec.q_lora_rank or 0, kv_lora=_need(spec, kind, "kv_lora_rank", spec.kv_lora_rank),
                   d_rope=rope)
    else:
        head = spec.resolved_head_dim
        out.update(kv_heads=spec.num_key_value_heads or a, dk=head, dv=head)

    # stated biases only: an unstated one leaves op-level checkpoint policies unpriced (policy_unpriced)
    for name, stated in (("qkv_bias", spec.qkv_bias), ("o_bias", spec.o_bias), ("mlp_bias", spec.mlp_bias)):
        if stated is not None:
            out[name] = int(bool(stated))
    out["act_widths"] = 3 if info.gated_mlp else 1
    out["qk_norm"] = int(info.qk_norm)
    out["rotary"] = int(info.rotary and not info.linear)
    fraction = _partial_rotary_factor(spec)
    if fraction is not None:
        out["rotary_fraction"] = fraction
    out["output_gate"] = int(info.output_gate)
    if info.layer_norms is not None:
        out["n_norms"] = info.layer_norms

    if moe:
        out["experts"] = _need(spec, kind, "num_experts", spec.num_experts)
        out["top_k"] = _need(spec, kind, "num_experts_per_tok", spec.num_experts_per_tok)
        width = spec.moe_intermediate_size or spec.intermediate_size
        out["hff_exp"] = _need(spec, kind, "moe_intermediate_size", width)
        # the families state the shared experts' whole width; else a count of routed-width experts
        if spec.shared_expert_intermediate_size:
            out["shared_width"] = spec.shared_expert_intermediate_size
        else:
            out["shared_width"] = (spec.num_shared_experts or 0) * out["hff_exp"]
    elif mlp not in NO_MLPS:
        out["hff"] = _need(spec, kind, "intermediate_size", spec.intermediate_size)

    if info.linear:
        out["lin_kh"] = _need(spec, kind, "linear_num_key_heads", spec.linear_num_key_heads)
        out["lin_vh"] = _need(spec, kind, "linear_num_value_heads", spec.linear_num_value_heads)
        out["lin_dk"] = _need(spec, kind, "linear_key_head_dim", spec.linear_key_head_dim)
        out["lin_dv"] = _need(spec, kind, "linear_value_head_dim", spec.linear_value_head_dim)
    out.update(family_values(spec))
    return out


def _partial_rotary_factor(spec: ModelSpec) -> Optional[float]:
    """Transformers' ``partial_rotary_factor`` of *spec*'s config (its text part's): top level, or in
    ``rope_parameters`` (Transformers 5) or ``rope_scaling``, else the family's default (its config class's:
    GLM-4.5's 0.5, Qwen3-Next's and Qwen3.5's 0.25); None where neither states one (the whole head)."""
    config = dict(spec.hf_config)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        config.update(text)
    for where in (config, config.get("rope_parameters"), config.get("rope_scaling")):
        if isinstance(where, Mapping) and where.get("partial_rotary_factor") is not None:
            return float(where["partial_rotary_factor"])
    default = _family_default(spec, "partial_rotary_factor")
    return None if default is None else float(default)


def _family_default(spec: ModelSpec, name: str) -> Any:
    """The config field *name* where *spec*'s family states its config class's default for it, else None."""
    from ndcost.models import family_for
    return (getattr(family_for(spec.model_type), "defaults", None) or {}).get(name)


def family_values(spec: ModelSpec) -> Dict[str, Number]:
    """What *spec*'s family states its modules keep where they differ from the records' defaults.

    ``Family.op_record_values`` (an RMSNorm multiplying its weight in fp32 keeps
    8 bytes an element, not LlamaRMSNorm's 6; see the head of specs/op_records.yaml).
    """
    from ndcost.models import family_for
    family = family_for(spec.model_type)
    return dict(getattr(family, "op_record_values", None) or {})


def runtime_values(spec: ModelSpec, kind: str, profile: Any) -> Dict[str, Number]:
    """The values a layer of *kind* of *spec* takes from the fused modules the runtime *profile* runs in place of
    Transformers' (its contracts' ``Contract.fuses``, put in place by its replacements), so the formulas keep what
    the census of those modules keeps:

    - ``rms_norm``, where the model's norms are RMSNorms (its config states ``rms_norm_eps``): the kernel keeps
      its 16-bit input and an fp32 rstd a row, 2 bytes an element and 4 a row (``norm_bytes``,
      ``norm_row_bytes``);
    - ``silu_gated_mlp``, where the kind's dense (or shared-expert) MLP is SiLU-gated: the kernel keeps its input,
      the gate and up projections' output (one call), so 2 feed-forward-wide tensors (``act_widths``,
      ``act_fused``); the routed experts keep their own (``expert_act_widths``, as without the runtime);
    - ``gated_experts``, where the kind's routed experts are SiLU-gated without biases or a clamp (the
      unfused activation's 3 expert-wide tensors, no ``swiglu_limit``): the activation keeps its input (2
      expert-wide tensors) and the routing weights it scales by, the combine no expert output
      (``expert_weighted_act``), and the permutation its row map (``row_id_map``); GPT-OSS's clamped experts
      (Transformers' 6 expert-wide tensors) keep the gate-and-up output the clamps read and the clamped copy the
      weighted quick-GeGLU reads, 4.
    """
    if profile is None:
        return {}
    from ndcost import manager
    registry = manager.registry()
    fused = {getattr(registry.find(f"contract/{name}"), "fuses", "") for name in profile.contracts_for(spec.model_type)}
    out: Dict[str, Number] = {}
    if "rms_norm" in fused and "rms_norm_eps" in dict(spec.hf_config):
        out.update(norm_bytes=2, norm_row_bytes=4)
    info = spec.kind(kind)
    plain = model_values(spec, kind)
    if "silu_gated_mlp" in fused and info.gated_mlp and info.activation in GATED_ACTIVATIONS:
        out.update(act_widths=2, act_fused=1, expert_act_widths=plain.get("expert_act_widths", plain["act_widths"]))
    widths = plain.get("expert_act_widths", plain.get("act_widths"))
    if "gated_experts" in fused and plain.get("moe"):
        clamped = dict(spec.hf_config).get("swiglu_limit", _family_default(spec, "swiglu_limit"))
        if widths == 3 and info.activation in GATED_ACTIVATIONS and not clamped:
            out.update(expert_act_widths=2, expert_weighted_act=1, row_id_map=1)
        elif widths == 6:  # GPT-OSS's clamped experts (the family's stated figure)
            out.update(expert_act_widths=4, expert_weighted_act=1, row_id_map=1)
    return out


def runtime_attention(spec: ModelSpec, profile: Any) -> str:
    """The attention kernel the formulas price for *spec* under the runtime *profile*.

    The census runs the profile's ``attention`` where the model supports it and
    its ``attention_fallback`` where Transformers' model refuses SDPA; the
    formulas must assume the same kernel, or a model priced without a census
    would be charged scores its run never materializes (or spared those it
    does). The family says whether it supports SDPA (``Family.supports_sdpa``),
    so this needs no transformers. Without a profile: ``eager``, the published
    formulas' assumption. A contract the profile installs for the model's family in place of its
    attention function (``Contract.attention``) is the kernel, under its own name.
    """
    if profile is None:
        return "eager"
    from ndcost import manager
    registry = manager.registry()
    for name in profile.family_contracts.get(spec.model_type, ()):
        if getattr(registry.find(f"contract/{name}"), "attention", False):
            attention_kernel(name, where=f"runtime {profile.name!r} installs contract {name!r}, whose attention ")
            return str(name)
    kernel = str(profile.attention)
    if kernel == "sdpa":
        from ndcost.models import family_for
        family = family_for(spec.model_type)
        if family is not None and not family.supports_sdpa:  # declared by the family/ contract
            kernel = str(profile.attention_fallback)
    attention_kernel(kernel, where=f"runtime {profile.name!r} runs attention ")
    return kernel


def runtime_eager_linear_rule(spec: ModelSpec, profile: Any) -> bool:
    """Whether *spec*'s linear attention under the runtime *profile* runs Transformers' torch reference chunked
    delta rule (``linrec_eager``): unless a contract the profile installs for it stands for the rule
    (``Contract.linear_rule``, flash-linear-attention's). Without a profile, as a plain install runs it."""
    if profile is None:
        return True
    from ndcost import manager
    registry = manager.registry()
    return not any(getattr(registry.find(f"contract/{name}"), "linear_rule", False)
                   for name in profile.contracts_for(spec.model_type))


def runtime_repeats_kv(spec: ModelSpec, profile: Any) -> bool:
    """Whether *spec*'s attention under the runtime *profile* takes keys and values repeated to every query head.

    So where the model runs Transformers' eager attention (``eager_attention_forward`` calls ``repeat_kv``
    first; a family contract standing for the attention keeps its own K/V), and where it runs SDPA
    (:func:`runtime_attention`) and a contract the profile installs for it states ``repeats_kv`` (the caller's
    ``repeat_kv`` before the kernel, as torchtitan's Llama). The census measures it as the modules run; the
    formulas (``kv_repeated``) and the composition (the K/V elements ring CP passes) read it here.
    """
    if profile is None:
        return False
    attention = runtime_attention(spec, profile)
    if attention == "eager":
        return True
    if attention != "sdpa":
        return False
    from ndcost import manager
    registry = manager.registry()
    return any(getattr(registry.find(f"contract/{name}"), "repeats_kv", False)
               for name in profile.contracts_for(spec.model_type))


def values_for(spec: ModelSpec, kind: str, *, seq: Optional[int] = None, strategy: Any = None,
               micro_batch: Optional[int] = None, tp: Optional[int] = None, sp: Optional[bool] = None,
               cp: Optional[int] = None, cp_algo: Optional[str] = None, etp: Optional[int] = None,
               attention: str = "eager", dropout: Optional[bool] = None, ffn: Optional[str] = None,
               overrides: Optional[Mapping[str, Any]] = None, records: Optional[OpRecords] = None) -> Values:
    """The values a layer of *kind* of *spec* gives the records under an evaluation.

    The evaluation comes from *strategy* (a :class:`~ndcost.values.Strategy`:
    seq, micro-batch, TP, SP, CP and its algorithm, ETP, the compute dtype's
    bytes) and the keyword arguments, which win over it. *attention* is the
    kernel: ``eager`` materializes the scores (the published formulas'
    assumption), ``sdpa``/``flash`` do not. *dropout* forces the dropouts on
    or off (read from the config where None; GPT-2's 0.1 where a gpt2 spec
    has no config). *ffn* forces a dense or MoE feed-forward.
    """
    records = records or load_op_records()

    def pick(given, field, default):
        if given is not None:
            return given
        if strategy is not None:
            return getattr(strategy, field)
        return default

    seq = pick(seq, "seq", None)
    if seq is None:
        raise InvalidValue("values_for needs the sequence length: give seq=... or a strategy with seq")
    algo = str(pick(cp_algo, "cp_algo", "ring")).lower()
    if algo not in CP_ALGOS:
        raise InvalidValue(f"cp_algo={algo!r} is not known; allowed: {', '.join(CP_ALGOS)}")
    given = model_values(spec, kind, attention=attention, dropout=dropout, ffn=ffn)
    given.update(s=int(seq), b=int(pick(micro_batch, "micro_batch", 1)), tp=int(pick(tp, "tp", 1)),
                 sp=int(bool(pick(sp, "sp", False))), cp=int(pick(cp, "cp", 1)), etp=int(pick(etp, "etp", 1)),
                 ulysses=int(algo == "ulysses"))
    if strategy is not None:
        given["bytes_act"] = DTYPES[strategy.compute]
    if attention == "sdpa" and spec.kind(kind).sdpa_masked(given["s"]):  # the kernel keeps the mask, repeated K/V
        given.update(mask_bias=1, kv_repeated=1)
    for name in ("s", "b", "tp", "cp", "etp"):
        if given[name] < 1:
            raise InvalidValue(f"values_for: {name} must be >= 1, got {given[name]}")
    given.update(overrides or {})
    return Values(given, records, label=f"model {spec.name!r} layer kind {kind!r}")


# ---------------------------------------------------------------------------
# the KindRecord
# ---------------------------------------------------------------------------
def _per_token(by_split: Mapping[str, Number], split: str, seq: int) -> Number:
    return divide(by_split.get(split, 0), seq)


def formula_record(spec: ModelSpec, kind: str, seq: int, *, attention: str = "eager",
                   dropout: Optional[bool] = None, overrides: Optional[Mapping[str, Any]] = None,
                   records: Optional[OpRecords] = None, policy: Any = None) -> KindRecord:
    """One layer of *kind*: analytic activation bytes per token at TP 1, from the op records.

    *attention* is the kernel: ``eager`` (the default, the published formulas'
    materialized scores) or a fused one (``sdpa``, ``flash``...) that keeps
    statistics instead; the resolver passes the runtime's
    (:func:`runtime_attention`).
    ``saved_per_token`` holds the bytes TP does not split and
    ``saved_tp_per_token`` those it splits, so a rank at TP t keeps
    ``saved + saved_tp / t``, and ``(saved + saved_tp) / t`` under sequence
    parallelism; ``ops``/``ops_tp`` split them by op. ``selective_*`` is the
    layer under the formulas' selective recompute (the attention core), which
    reruns the attention function and no weight matmul (the recomputed shares
    None, as the time model prices that recompute); with *policy*, an
    op-level checkpoint policy (``checkpoint_policy/<name>`` of scope
    ``layer``), it is the layer under that policy (:func:`policy_saves`: its
    input and the outputs it saves, the shares it recomputes), None where the
    records cannot say (:func:`policy_unpriced`). The backward's
    working peak is not priced here (None). A term marked ``shared`` (the
    rotary cos and sin the model hands every layer) is in none of these but
    in ``shared_saved_per_token``, under its argument's name.
    """
    values = values_for(spec, kind, seq=seq, micro_batch=1, tp=1, sp=False, cp=1, attention=attention,
                        dropout=dropout, overrides=overrides, records=records)
    shared_terms = {(slot.name, term.name): term.shared for slot in values.records.slots.values()
                    for term in slot.terms if term.shared is not None}
    shared: Dict[str, Number] = {}

    def by_split(switches):
        splits: Dict[str, Number] = {}
        ops: Dict[str, Dict[str, Number]] = {"sequence": {}, "tp": {}}
        for slot, _part, term, op, split, value in term_bytes(values, switches):
            if (slot, term) in shared_terms:
                if switches is None:
                    name = shared_terms[slot, term]
                    shared[name] = shared.get(name, 0) + value
                continue
            splits[split] = splits.get(split, 0) + value
            ops[split][op] = ops[split].get(op, 0) + value
        return splits, ops

    kept, ops = by_split(None)
    selective: Optional[Dict[str, Number]]
    shares: Dict[str, Optional[float]] = {share: None for share in MATMUL_SHARES}
    if policy is None or policy.scope != "layer":
        selective, _ = by_split("selective")
    else:
        try:
            saves, shares = policy_saves(values, policy, attention_kernel(attention).call)  # type: ignore[assignment]
        except Unpriced:
            selective = None
        else:
            selective, _ = by_split("full")  # the checkpoint's input
            for split, value in saves.items():
                selective[split] = selective.get(split, 0) + value
    return KindRecord(
        kind=kind, seq=int(seq), source=SOURCE,
        saved_per_token=_per_token(kept, "sequence", seq),
        saved_tp_per_token=_per_token(kept, "tp", seq),
        selective_per_token=None if selective is None else _per_token(selective, "sequence", seq),
        selective_tp_per_token=None if selective is None else _per_token(selective, "tp", seq),
        recomputed_attention_mm_share=shares["attention"],
        recomputed_other_mm_share=shares["other"],
        recomputed_scores_share=shares["scores"],
        ops={op: divide(v, seq) for op, v in ops["sequence"].items()},
        ops_tp={op: divide(v, seq) for op, v in ops["tp"].items()},
        shared_saved_per_token={name: divide(v, seq) for name, v in shared.items()},
    )


def formula_records(spec: ModelSpec, seq: int, **kwargs: Any) -> Dict[str, KindRecord]:
    """:func:`formula_record` for every layer kind of *spec*."""
    return {kind: formula_record(spec, kind, seq, **kwargs) for kind in spec.kinds}
