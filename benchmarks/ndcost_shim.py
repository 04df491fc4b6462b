"""Make this checkout's ndcost importable without pip: a folder to put on ``PYTHONPATH``.

    python benchmarks/ndcost_shim.py DEST      # then PYTHONPATH=DEST python -c "import ndcost"

For a machine where ``pip install --no-deps -e .`` cannot run (no network for the build backend pyproject.toml
requires, ``setuptools>=77``). DEST gets the import layout of pyproject.toml's ``package-dir`` as links into the
checkout (``ndcost`` -> framework/'s entries, ``ndcost.registry`` -> registry/, ``ndcost.plugins`` -> plugins/,
``ndcost.specs`` -> specs/) and a ``ndcost-<version>.dist-info`` whose ``entry_points.txt`` is pyproject.toml's
``ndcost.plugins`` group and scripts: ``importlib.metadata`` finds a distribution in any ``*.dist-info`` folder on
``sys.path`` (the Python Packaging User Guide's "Recording installed projects"), so the built-in plugins load
through their entry points as after an install. ndcost's dependencies (pluggy, attrs, PyYAML, numpy) must be
importable already. Standard library only.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIRS = {"registry": "registry", "plugins": "plugins", "specs": "specs"}  # ndcost.<key> -> folder


def _sections(pyproject: str) -> Dict[str, List[Tuple[str, str]]]:
    """Each ``[table]`` of *pyproject*'s text as its ``key = "value"`` lines (the entry-point tables are these)."""
    tables: Dict[str, List[Tuple[str, str]]] = {}
    current = None
    for line in pyproject.splitlines():
        line = line.split("#", 1)[0].strip()
        header = re.fullmatch(r"\[(.+)\]", line)
        if header:
            current = tables.setdefault(header.group(1).strip(), [])
            continue
        pair = re.fullmatch(r'([A-Za-z0-9_.-]+)\s*=\s*"([^"]*)"', line)
        if pair and current is not None:
            current.append((pair.group(1), pair.group(2)))
    return tables


def _version() -> str:
    with open(os.path.join(ROOT, "framework", "__init__.py"), encoding="utf-8") as handle:
        found = re.search(r'^__version__\s*=\s*"([^"]+)"', handle.read(), re.M)
    if not found:
        raise SystemExit("ndcost_shim: no __version__ = \"...\" in framework/__init__.py")
    return found.group(1)


def _link(target: str, link: str) -> None:
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(target, link)


def build(dest: str) -> str:
    """Fill *dest* (created) with the link tree and the dist-info; returns *dest*."""
    package = os.path.join(dest, "ndcost")
    os.makedirs(package, exist_ok=True)
    for entry in os.listdir(os.path.join(ROOT, "framework")):
        if entry != "__pycache__":
            _link(os.path.join(ROOT, "framework", entry), os.path.join(package, entry))
    for name, folder in PACKAGE_DIRS.items():
        _link(os.path.join(ROOT, folder), os.path.join(package, name))
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as handle:
        tables = _sections(handle.read())
    plugins = tables.get('project.entry-points."ndcost.plugins"', [])
    if not plugins:
        raise SystemExit("ndcost_shim: pyproject.toml has no [project.entry-points.\"ndcost.plugins\"] table")
    version = _version()
    info = os.path.join(dest, f"ndcost-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as handle:
        handle.write(f"Metadata-Version: 2.1\nName: ndcost\nVersion: {version}\n")
    with open(os.path.join(info, "entry_points.txt"), "w", encoding="utf-8") as handle:
        handle.write("[ndcost.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in plugins))
        handle.write("\n[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in tables.get("project.scripts", [])))
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} DEST (a folder to put on PYTHONPATH)")
    print(build(sys.argv[1]))
