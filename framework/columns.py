"""Strategies as columns: the one codec from Strategy objects, strings, mappings or columns to numpy arrays.

Memory and time both read what :func:`encode` makes: an int64 array a
numeric field, a bool array a flag, and a code a categorical field (an index
into :func:`category_names`: the choices and dtypes ``Strategy`` allows and the
plugin names the registry holds). Each row is validated as ``Strategy``
validates it, with the same messages; which fields are which, their ranges and
their names are read off ``Strategy``'s own converters, so a field added there
is encoded here without a second list. A refused row is marked with its
reason and never fails the batch.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost.errors import InvalidStrategy, InvalidValue
from ndcost.values import (
    DTYPES,
    FLOAT8_RECIPES,
    LOW_PRECISION_REFUSALS,
    MAX_STRATEGY_INTEGER,
    Strategy,
    closest_strategy_fields,
    devices_message,
    low_precision_refusals,
    unknown_plugin_name_message,
)

__all__ = ["StrategyColumns", "encode", "category_names", "CodePlugins", "code_plugins", "INT_FIELDS", "BOOL_FIELDS",
           "FLOAT_FIELDS", "CODE_FIELDS", "DTYPE_NAMES", "DTYPE_BYTES"]

_FIELDS = {a.name: a for a in attrs.fields(Strategy)}


def _fields(*kinds: str) -> Tuple[str, ...]:
    return tuple(name for name, a in _FIELDS.items() if getattr(a.converter, "column_kind", None) in kinds)


INT_FIELDS = _fields("int")
BOOL_FIELDS = _fields("bool")
FLOAT_FIELDS = _fields("float")
CODE_FIELDS = _fields("choice", "dtype", "plugin")
# a NaN in a float column stands for "unset" in these (pandas' missing value)
_NAN_UNSET = tuple(name for name in INT_FIELDS + _fields("split") if _FIELDS[name].default is None)
DTYPE_NAMES = tuple(DTYPES)
DTYPE_BYTES = np.array([DTYPES[d] for d in DTYPE_NAMES] + [0], dtype=np.float64)  # last: "none"


def category_names(registry: Any) -> Dict[str, Tuple[str, ...]]:
    """Each categorical field's names (its codes index them): ``Strategy``'s allowed values, or the names
    registered in the field's plugin namespace (``schedule/<name>``, ``optimizer/<name>``)."""
    out = {}
    for name in CODE_FIELDS:
        converter: Any = _FIELDS[name].converter  # Strategy's converters carry their facts (values._column)
        namespace = getattr(converter, "namespace", None)
        out[name] = tuple(registry.names(namespace)) if namespace else tuple(converter.allowed)
    return out


@attrs.frozen(kw_only=True, eq=False)
class CodePlugins:
    """The plugins behind the codes of a batch's plugin fields, as memory and time read them."""

    schedules: Tuple[Any, ...]             # schedule/<name> by schedule code
    states_per_parameter: np.ndarray       # optimizer/<name>.states_per_parameter by optimizer code
    step_temporaries_per_parameter: np.ndarray


def code_plugins(registry: Any, names: Mapping[str, Sequence[str]]) -> CodePlugins:
    """The registered schedules and optimizers that *names*' codes stand for."""
    optimizers = [registry.get(f"optimizer/{name}") for name in names["optimizer"]]
    return CodePlugins(
        schedules=tuple(registry.get(f"schedule/{name}") for name in names["schedule"]),
        states_per_parameter=np.array([float(o.states_per_parameter) for o in optimizers]),
        step_temporaries_per_parameter=np.array([float(o.step_temporaries_per_parameter) for o in optimizers]))


def _unique(values: np.ndarray) -> Tuple[List[Any], np.ndarray]:
    """The distinct values of a column and each row's index into them (no sort of mixed types)."""
    if values.dtype.kind in "biufU":
        distinct, codes = np.unique(values, return_inverse=True)
        return list(distinct.tolist()), codes.reshape(-1)
    seen: Dict[Any, int] = {}
    inverse = np.empty(len(values), dtype=np.int64)
    uniq: List[Any] = []
    for i, value in enumerate(values.tolist()):
        key = tuple(value) if isinstance(value, list) else value
        try:
            j = seen.get(key)
        except TypeError:
            key = repr(key)
            j = seen.get(key)
        if j is None:
            j = seen[key] = len(uniq)
            uniq.append(value)
        inverse[i] = j
    return uniq, inverse


class StrategyColumns:
    """A batch's strategy fields as arrays (what memory and time read), with each row's refusals."""

    def __init__(self, n: int):
        self.n = n
        self.cols: Dict[str, Any] = {}
        self.reasons: List[Tuple[np.ndarray, Any]] = []  # (mask, message or row -> message)
        self.pp_layers: Optional[List[Optional[Tuple[int, ...]]]] = None

    def refuse(self, mask, message) -> None:
        mask = np.asarray(mask, dtype=bool)
        # one strategy's mask read as a Python bool (0.05 us), a batch's counted (cheaper than .any())
        if (mask.item() if mask.size == 1 else np.count_nonzero(mask)):
            self.reasons.append((mask, message))

    def invalid(self) -> np.ndarray:
        bad = np.zeros(self.n, dtype=bool)
        for mask, _ in self.reasons:
            bad |= mask
        return bad

    def reason_array(self) -> np.ndarray:
        out = np.full(self.n, "", dtype=object)
        for mask, message in self.reasons:
            for i in np.flatnonzero(mask):
                text = message(i) if callable(message) else message
                out[i] = text if not out[i] else f"{out[i]}; {text}"
        return out


def _column_values(name: str, raw: Any, n: int) -> np.ndarray:
    if isinstance(raw, np.ndarray) and raw.ndim == 1:
        values = raw
    elif isinstance(raw, (list, tuple)) and name != "pp_layers" or (name == "pp_layers" and isinstance(raw, list)):
        values = np.empty(len(raw), dtype=object)
        values[:] = list(raw)
    else:
        values = np.empty(n, dtype=object)
        values[:] = [raw] * n
    if len(values) != n:
        raise InvalidValue(f"strategy column {name!r} has {len(values)} values, the others {n}; "
                           f"give one value a strategy (or a scalar for all)")
    return values


def _convert(name: str, values: np.ndarray, out: StrategyColumns, names: Mapping[str, Sequence[str]]):
    """One field's column converted as Strategy converts it; rows it refuses are marked with its message."""
    attr = _FIELDS[name]
    converter: Any = attr.converter  # attrs types it Converter | None; Strategy's are plain callables
    if values.dtype.kind in "iu" and name in INT_FIELDS:
        lo, hi = converter.minimum, converter.maximum
        bad = (values < lo) | ((values > hi) if hi is not None else False)
        if bad.any():
            messages = {}
            for value in np.unique(values[bad]).tolist():
                try:
                    converter(value)
                except InvalidValue as exc:
                    messages[value] = str(exc)
            out.refuse(bad, lambda i, v=values, m=messages: m.get(int(v[i]), f"Strategy.{name}: {v[i]} out of range"))
        return np.where(bad, attr.default if attr.default is not None else -1, values).astype(np.int64)
    if name in names and values.dtype.kind == "U":  # a categorical of strings: exact names by comparison
        table = names[name]
        codes = np.full(len(values), -1, dtype=np.int64)
        for code, known in enumerate(table):  # a loop over the few names, not rows
            codes[values == known] = code
        rest = codes < 0
        if rest.any():  # other spellings (case, aliases) or unknown names: as Strategy converts them
            sub = StrategyColumns(int(rest.sum()))
            codes[rest] = _convert(name, values[rest].astype(object), sub, names)
            index = np.flatnonzero(rest)
            for mask, message in sub.reasons:
                full = np.zeros(len(values), dtype=bool)
                full[index[mask]] = True
                out.refuse(full, (lambda i, m=message, ix=index: m(int(np.searchsorted(ix, i))))
                           if callable(message) else message)
        return codes
    if name in BOOL_FIELDS and values.dtype.kind == "b":
        return values.astype(bool)
    uniq, inverse = _unique(values)
    converted: List[Any] = []
    errors: Dict[int, str] = {}
    for j, value in enumerate(uniq):
        try:
            if value is None and attr.default is None:  # a field that may stay unset
                converted.append(None)
                continue
            if isinstance(value, float) and math.isnan(value) and name in _NAN_UNSET:
                converted.append(None)
                continue
            converted.append(converter(value) if converter is not None else value)
        except (InvalidValue, TypeError, ValueError) as exc:
            errors[j] = str(exc)
            converted.append(attr.default)
    if errors:
        bad_index = np.array(sorted(errors))
        mask = np.isin(inverse, bad_index)
        out.refuse(mask, lambda i, inv=inverse, e=errors: e[int(inv[i])])
    if name == "pp_layers":
        return [converted[j] for j in inverse.tolist()]
    if name in names:  # a categorical: codes into names[name]
        lookup = {v: i for i, v in enumerate(names[name])}
        code_list = []
        for j, value in enumerate(converted):
            if value is None:
                code_list.append(-1)
            elif value in lookup:
                code_list.append(lookup[value])
            else:
                code_list.append(0)
                errors[j] = unknown_plugin_name_message(name, name, value, names[name])
                mask = inverse == j
                out.refuse(mask, errors[j])
        return np.array(code_list, dtype=np.int64)[inverse]
    if name in INT_FIELDS:
        return np.array([-1 if v is None else v for v in converted], dtype=np.int64)[inverse]
    if name in BOOL_FIELDS:
        return np.array(converted, dtype=bool)[inverse]
    return np.array(converted, dtype=np.float64)[inverse]


def encode(strategies: Any, names: Mapping[str, Sequence[str]]) -> StrategyColumns:
    """A batch (Strategy sequence, or mapping of field -> values) as validated columns.

    *names* gives each categorical field's names (codes are indices into
    them): ``cp_algo``, ``schedule``, ``recompute``, ``optimizer`` and the
    dtypes (with ``none`` last for ``master_dtype``).
    """
    if isinstance(strategies, Strategy):
        strategies = [strategies]
    _refuse_non_batch(strategies)
    if isinstance(strategies, Mapping):
        unknown = sorted(set(strategies) - set(_FIELDS))
        if unknown:
            hints = []
            for key in unknown:
                close = closest_strategy_fields(str(key), n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise InvalidStrategy(f"unknown strategy field(s) {', '.join(hints)}; fields: {', '.join(_FIELDS)}")
        lengths = {len(v) for k, v in strategies.items()
                   if (isinstance(v, np.ndarray) and v.ndim == 1) or (isinstance(v, (list, tuple)) and k != "pp_layers")
                   or (k == "pp_layers" and isinstance(v, list))}
        if len(lengths) > 1:
            raise InvalidValue(f"strategy columns have different lengths {sorted(lengths)}; give one value a "
                               f"strategy (or a scalar for all)")
        n = lengths.pop() if lengths else 1
        out = StrategyColumns(n)
        for name, attr in _FIELDS.items():
            raw = strategies.get(name, attr.default)
            per_row = (isinstance(raw, np.ndarray) and raw.ndim == 1) or \
                (isinstance(raw, (list, tuple)) and name != "pp_layers") or \
                (name == "pp_layers" and isinstance(raw, list))
            if per_row:
                result = _convert(name, _column_values(name, raw, n), out, names)
            else:  # one value for every row: converted once
                one = np.empty(1, dtype=object)
                one[0] = raw
                probe = StrategyColumns(1)
                result = _convert(name, one, probe, names)
                for _mask, message in probe.reasons:
                    text = message(0) if callable(message) else message
                    out.refuse(np.ones(n, dtype=bool), text)
                result = [result[0]] * n if name == "pp_layers" else np.repeat(result, n)
            if name == "pp_layers":  # None: no row gives a split (the common case pays no per-row work)
                out.pp_layers = result if any(v is not None for v in (result if per_row else result[:1])) else None
            else:
                out.cols[name] = result
        _cross_checks(out)
    else:
        items = list(strategies)
        refused: Dict[int, str] = {}
        for i, s in enumerate(items):
            if not isinstance(s, Strategy):
                try:
                    items[i] = Strategy.parse(s) if isinstance(s, str) else Strategy.from_mapping(s)
                except (InvalidValue, TypeError) as exc:  # this row is refused; the batch goes on
                    refused[i] = str(exc)
                    items[i] = Strategy(seq=1)
        out = StrategyColumns(len(items))
        if refused:
            mask = np.zeros(len(items), dtype=bool)
            mask[list(refused)] = True
            out.refuse(mask, lambda i: refused[int(i)])
        _encode_objects(items, out, names)
    c = out.cols
    # dtypes left unset take the parameters'
    for name in ("compute_dtype", "grad_dtype", "optimizer_dtype"):
        unset = c[name] < 0
        if unset.item() if unset.size == 1 else np.count_nonzero(unset):
            c[name] = np.where(unset, c["param_dtype"], c[name])
    # the busiest of ep expert ranks gets at most every routed token of the group: ep times the balanced share
    c["moe_imbalance"] = np.minimum(c["moe_imbalance"], c["ep"])
    return out


def _encode_objects(items: Sequence[Strategy], out: StrategyColumns, names: Mapping[str, Sequence[str]]) -> None:
    """Strategy values (validated already) as columns: one array a kind of field (ints, flags, floats, codes),
    each column a row of it, so one strategy costs a few numpy calls rather than one a field."""
    n = len(items)
    splits = [s.pp_layers for s in items]
    out.pp_layers = splits if any(v is not None for v in splits) else None
    for fields, dtype in ((INT_FIELDS, np.int64), (BOOL_FIELDS, bool), (FLOAT_FIELDS, np.float64)):
        get = _GETTERS[fields]
        table = np.array([[-1 if v is None else v for v in get(s)] for s in items],
                         dtype=dtype).reshape(n, len(fields)).T.copy()  # a field's column contiguous
        out.cols.update(zip(fields, table, strict=True))
    lookups = _code_lookups(names)
    get = _GETTERS[CODE_FIELDS]
    codes = np.array([[-1 if v is None else lookup.get(v, -2) for v, (_, lookup) in zip(get(s), lookups, strict=True)]
                      for s in items], dtype=np.int64).reshape(n, len(lookups)).T.copy()
    unknown = codes == -2
    if unknown.any():  # a plugin name the registry does not hold: refused by field
        for (name, _), bad in zip(lookups, unknown, strict=True):
            out.refuse(bad, lambda i, nm=name: unknown_plugin_name_message(nm, nm, getattr(items[i], nm), names[nm]))
        codes = np.where(unknown, 0, codes)
    out.cols.update(zip(CODE_FIELDS, codes, strict=True))


def _getter(fields: Tuple[str, ...]):
    """A strategy's *fields* as a tuple, in one call (``operator.attrgetter``; a tuple for a single field too)."""
    if len(fields) == 1:
        return lambda s, name=fields[0]: (getattr(s, name),)
    return operator.attrgetter(*fields)


_GETTERS = {fields: _getter(fields) for fields in (INT_FIELDS, BOOL_FIELDS, FLOAT_FIELDS, CODE_FIELDS)}
_LOOKUPS: Dict[int, Tuple[Mapping[str, Sequence[str]], List[Tuple[str, Dict[Any, int]]]]] = {}


def _code_lookups(names: Mapping[str, Sequence[str]]) -> List[Tuple[str, Dict[Any, int]]]:
    """Each categorical field's ``{name: code}``, made once for a *names* (the resolver's, kept per registry)."""
    hit = _LOOKUPS.get(id(names))
    if hit is None or hit[0] is not names:
        if len(_LOOKUPS) >= 64:
            _LOOKUPS.clear()
        hit = _LOOKUPS[id(names)] = (names, [(name, {v: i for i, v in enumerate(names[name])})
                                             for name in CODE_FIELDS])
    return hit[1]


def _refuse_non_batch(strategies: Any) -> None:
    """A batch is a sequence of strategies or a mapping of columns; anything else is refused whole."""
    if isinstance(strategies, (str, bytes)):
        raise InvalidValue(f"a batch of strategies is a sequence or a mapping of columns, not the string "
                           f"{strategies!r}; give Strategy.parse({strategies!r}) in a list, or a list of strings")
    if isinstance(strategies, Mapping):
        for name, raw in strategies.items():
            if isinstance(raw, np.ndarray) and raw.ndim > 1:
                raise InvalidValue(f"strategy column {name!r} has shape {raw.shape}; give one value a strategy "
                                   f"(a 1-D column) or a scalar for all")
        return
    if not isinstance(strategies, Iterable):
        raise InvalidValue(f"a batch of strategies is a sequence (of Strategy, strings or mappings) or a mapping "
                           f"of field -> column, got {type(strategies).__name__} {strategies!r}")


def _cross_checks(out: StrategyColumns) -> None:
    """Strategy's own checks between fields, on columns (its __attrs_post_init__)."""
    c = out.cols
    # devices within bound, counted in float64 (exact at the bound; an int64 product of five fields could wrap)
    devices = c["dp"].astype(np.float64) * c["fsdp"] * c["cp"] * c["tp"] * c["pp"]
    out.refuse(devices > MAX_STRATEGY_INTEGER,
               lambda i: devices_message(c["dp"][i], c["fsdp"][i], c["cp"][i], c["tp"][i], c["pp"][i]))
    nv = c["pp"] * c["vpp"]
    if out.pp_layers is not None:
        lengths = np.array([-1 if s is None else len(s) for s in out.pp_layers], dtype=np.int64)
        bad = (lengths >= 0) & (lengths != nv)
        out.refuse(bad, lambda i: f"Strategy.pp_layers: {lengths[i]} stages given "
                                  f"({'/'.join(map(str, out.pp_layers[i]))}) but pp * vpp = {nv[i]}")  # type: ignore[arg-type]  # refused rows have a split
    ranks = c["dp"] * c["fsdp"] * c["cp"] * c["tp"]
    ep_etp = c["ep"] * c["etp"]
    bad = ranks % np.maximum(ep_etp, 1) != 0
    out.refuse(bad, lambda i: f"Strategy: ep * etp = {c['ep'][i]} * {c['etp'][i]} = {ep_etp[i]} must divide "
                              f"dp * fsdp * cp * tp = {ranks[i]}")
    float8 = np.asarray(c["float8"])
    compute = np.where(c["compute_dtype"] < 0, c["param_dtype"], c["compute_dtype"])
    refused = low_precision_refusals(float8 != FLOAT8_RECIPES.index("none"),
                                     float8 == FLOAT8_RECIPES.index("tensorwise"), c["float8_all_gather"],
                                     c["compile"], c["async_tp"], c["sp"], compute == DTYPE_NAMES.index("fp8"),
                                     c["float8_experts"], float8 != FLOAT8_RECIPES.index("rowwise_with_gw_hp"))
    for bad, message in zip(refused, LOW_PRECISION_REFUSALS, strict=True):
        out.refuse(bad, message)
