"""Hardware specs: one YAML file a device, under ``specs/hardware/`` or a third party's package."""
from __future__ import annotations

from importlib import resources

from ndcost.hookspecs import hookimpl
from ndcost.specio import load_hardware_yaml


def register_hardware_dir(register, directory) -> None:
    """Register every ``*.yaml`` of *directory* (a path or importlib.resources traversable)."""
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            hardware = load_hardware_yaml(entry)
            register(f"hardware/{hardware.name}", hardware)


@hookimpl
def ndcost_register(register):
    register_hardware_dir(register, resources.files("ndcost.specs") / "hardware")
