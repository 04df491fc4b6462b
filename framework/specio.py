"""Reading the spec files: UTF-8 text, YAML through one safe loader, and hardware specs.

The YAML loader is libyaml's C safe loader where PyYAML has it, as plugin loading parses every spec. It
builds only plain types, reads 1e12 as a number, and refuses a document whose aliases would expand past a
bound: PyYAML shares an aliased node, but whatever walks the result (a copy, a cache key, Transformers'
config) expands it, so nine nested aliases of nine ("billion laughs") would hang the reader.

A hardware spec is read here, in the core, because a user names one by its path
(``--hardware my_cluster.yaml``) as well as plugins registering theirs.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Union

import yaml

from ndcost.errors import InvalidValue
from ndcost.values import Hardware, NetworkLevel


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]  # a C or Python base
    """The safe loader, reading a plain 1e12 or 200.0e9 as the number YAML 1.2 makes it (PyYAML's YAML 1.1
    rules read a float only with a dot and a signed exponent, so 1e12 would be a string)."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                              list("-+0123456789."))

# No spec ndcost reads needs more: a document past a bound is refused, never built. The depth bound keeps
# libyaml's composer, which recurses in C, far from the stack's end (it crashes past ~50,000 levels).
MAX_YAML_ALIASES = 100
MAX_YAML_EXPANDED_NODES = 1_000_000
MAX_YAML_DEPTH = 10_000


def read_text(path: Union[str, Path, Any], what: str) -> str:
    """The UTF-8 text of *path* (a path or importlib.resources traversable), *what* naming it in an error."""
    try:
        data = Path(path).read_bytes() if isinstance(path, (str, Path)) else path.read_bytes()
    except OSError as exc:
        raise InvalidValue(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidValue(f"{what} {path} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); "
                           f"save it as UTF-8") from None


def _check_structure(text: str, where: str) -> None:
    """Refuse *text* where it nests deeper than MAX_YAML_DEPTH, or its aliases number more than
    MAX_YAML_ALIASES or expand past MAX_YAML_EXPANDED_NODES.

    Walks the parser's events (no objects built): a node's expanded size is one plus its children's, an
    alias counting as the size of the node it names.
    """
    sizes: Dict[str, int] = {}
    open_nodes: List[list] = []  # [anchor, expanded size so far] of each collection being read
    aliases = 0
    for event in yaml.parse(text, Loader=_Loader):
        anchor = None
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                raise InvalidValue(f"{where}: more than {MAX_YAML_ALIASES} YAML aliases (*name); write the values "
                                   f"out, or use fewer anchors")
            size = sizes.get(event.anchor or "", 1)
        elif isinstance(event, yaml.ScalarEvent):
            anchor, size = event.anchor, 1
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            open_nodes.append([event.anchor, 1])
            if len(open_nodes) > MAX_YAML_DEPTH:
                raise InvalidValue(f"{where}: YAML nested more than {MAX_YAML_DEPTH:,} levels deep; flatten it")
            continue
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, size = open_nodes.pop()
        else:
            continue
        if anchor:
            sizes[anchor] = size
        if open_nodes:
            open_nodes[-1][1] += size
            size = open_nodes[-1][1]
        if size > MAX_YAML_EXPANDED_NODES:
            raise InvalidValue(f"{where}: its YAML aliases expand to more than {MAX_YAML_EXPANDED_NODES:,} "
                               f"values (an alias bomb?); write the values out")


def load_yaml(text: str, where: str = "YAML text") -> Any:
    """*text* parsed as safely as ``yaml.safe_load`` does, aliases bounded; an InvalidValue naming *where*."""
    try:
        # an alias needs an anchor (&) and a level a character: a short text without both is safe unwalked
        if len(text) > MAX_YAML_DEPTH or ("&" in text and "*" in text):
            _check_structure(text, where)
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise InvalidValue(f"{where} is not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise InvalidValue(f"{where}: YAML nested too deeply to read; flatten it") from None


REQUIRED = ("name", "memory_bytes", "hbm_bytes_per_second", "peak_flops_per_second", "devices_per_node", "network")
OPTIONAL = ("efficiency", "host_to_device_bytes_per_second", "cpu_optimizer_parameters_per_second",
            "cuda_context_bytes", "description", "sm_count", "kernel_tables", "nvlink_domain_devices", "nics_per_node",
            "nvls_architecture", "compute_capability", "node_fabric")
LEVEL_FIELDS = ("bytes_per_second", "latency_seconds")


def hardware_from_mapping(data: Mapping[str, Any], where: str = "<mapping>") -> Hardware:
    """A :class:`Hardware` from a spec mapping, naming the file in any error."""
    if not isinstance(data, Mapping):
        raise InvalidValue(f"hardware spec {where}: expected a mapping of {', '.join(REQUIRED)}, "
                           f"got {type(data).__name__}")
    missing = [k for k in REQUIRED if k not in data]
    unknown = sorted(str(k) for k in data if k not in REQUIRED + OPTIONAL)
    if missing or unknown:
        what = "; ".join(([f"missing {', '.join(map(repr, missing))}"] if missing else [])
                         + ([f"unknown field(s) {', '.join(unknown)}"] if unknown else []))
        raise InvalidValue(f"hardware spec {where}: {what}; required: {', '.join(REQUIRED)} "
                           f"(optional: {', '.join(OPTIONAL)})")
    network = data["network"] if data["network"] is not None else {}
    if not isinstance(network, Mapping) or not all(isinstance(v, Mapping) for v in network.values()):
        raise InvalidValue(f"hardware spec {where}: network must map a level (within_node, across_nodes) to "
                           f"{{bytes_per_second: ..., latency_seconds: ...}}, got {network!r}")
    fields = {k: v for k, v in data.items() if k != "network"}
    for name in ("memory_bytes", "cuda_context_bytes"):
        value = fields.get(name)
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            fields[name] = int(value)  # YAML reads 8.0e+10 as a float
    try:
        levels = []
        for name, level in network.items():
            extra = sorted(str(k) for k in level if k not in LEVEL_FIELDS)
            if extra:
                raise InvalidValue(f"network level {name!r}: unknown field(s) {', '.join(extra)}; "
                                   f"known: {', '.join(LEVEL_FIELDS)}")
            levels.append(NetworkLevel(name=str(name), **dict(level)))
        return Hardware(network=tuple(levels), **fields)  # type: ignore[arg-type]  # attrs plugin: converter typing
    except InvalidValue as exc:
        raise InvalidValue(f"hardware spec {where}: {exc}") from None
    except TypeError as exc:  # a level without bytes_per_second
        raise InvalidValue(f"hardware spec {where}: {exc}; a network level states bytes_per_second "
                           f"(and latency_seconds)") from None


def load_hardware_yaml(path: Union[str, Path, Any]) -> Hardware:
    """A :class:`Hardware` from a spec YAML (a path or importlib.resources traversable)."""
    try:
        text = read_text(path, "hardware spec")
    except InvalidValue as exc:
        raise InvalidValue(f"{exc}; pass a registered hardware name (h200, ...) or the path of a spec YAML") from None
    return hardware_from_mapping(load_yaml(text, where=f"hardware spec {path}"), where=str(path))
