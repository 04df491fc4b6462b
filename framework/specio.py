"""Reading the YAML specs: libyaml's C loader where PyYAML has it, as plugin loading parses every spec."""
from __future__ import annotations

from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """*text* parsed as safely as ``yaml.safe_load`` does (the C loader builds only plain types too)."""
    return yaml.load(text, Loader=_LOADER)
