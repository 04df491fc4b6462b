"""Reading the YAML specs: libyaml's C loader where PyYAML has it, as plugin loading parses every spec.

A hardware spec is read here, in the core, because a user names one by its path
(``--hardware my_cluster.yaml``) as well as plugins registering theirs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Union

import yaml

from ndcost.errors import InvalidValue
from ndcost.values import Hardware, NetworkLevel

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """*text* parsed as safely as ``yaml.safe_load`` does (the C loader builds only plain types too)."""
    return yaml.load(text, Loader=_LOADER)


REQUIRED = ("name", "memory_bytes", "hbm_bytes_per_second", "peak_flops_per_second", "devices_per_node", "network")


def hardware_from_mapping(data: Mapping[str, Any], where: str = "<mapping>") -> Hardware:
    """A :class:`Hardware` from a spec mapping, naming the file in any error."""
    if not isinstance(data, Mapping):
        raise InvalidValue(f"hardware spec {where}: expected a mapping of {', '.join(REQUIRED)}, "
                           f"got {type(data).__name__}")
    try:
        network = tuple(NetworkLevel(name=str(name), **dict(level)) for name, level in
                        dict(data.get("network") or {}).items())
        fields = {k: v for k, v in data.items() if k != "network"}
        fields["memory_bytes"] = int(fields["memory_bytes"])
        return Hardware(network=network, **fields)  # type: ignore[arg-type]  # attrs plugin: converter typing
    except (KeyError, TypeError) as exc:
        what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise InvalidValue(f"hardware spec {where}: {what}; required: {', '.join(REQUIRED)}") from None


def load_hardware_yaml(path: Union[str, Path, Any]) -> Hardware:
    """A :class:`Hardware` from a spec YAML (a path or importlib.resources traversable)."""
    try:
        text = Path(path).read_text() if isinstance(path, (str, Path)) else path.read_text()
    except OSError as exc:
        raise InvalidValue(f"hardware spec {path}: cannot read it ({exc.strerror or exc}); pass a registered "
                           f"hardware name (h200, ...) or the path of a spec YAML") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise InvalidValue(f"hardware spec {path}: not valid YAML ({' '.join(str(exc).split())})") from None
    return hardware_from_mapping(data, where=str(path))
