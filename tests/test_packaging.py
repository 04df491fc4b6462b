"""Packaging: every subpackage listed, no generic top-level names, lazy torch, a plain install with YAML, py.typed."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers import pip_install_into

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"framework": "ndcost", "registry": "ndcost.registry", "plugins": "ndcost.plugins", "specs": "ndcost.specs"}


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _run(code: str, cwd: Path, env_extra=None) -> subprocess.CompletedProcess:
    import os
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def test_package_dir_maps_the_four_folders():
    tool = _pyproject()["tool"]["setuptools"]
    assert tool["package-dir"] == {package: folder for folder, package in FOLDERS.items()}


def _source_packages() -> set:
    """Dotted names of every folder with an __init__.py under the four mapped folders, and of specs' data folders.

    setuptools ships a data folder left out of ``packages`` only with a
    warning that it will stop, so those are listed too.
    """
    found = set()
    for folder, package in FOLDERS.items():
        for marker in ("__init__.py", "*.yaml"):
            for path in (REPO / folder).rglob(marker):
                relative = path.parent.relative_to(REPO / folder)
                if "__pycache__" not in relative.parts and (marker == "__init__.py" or folder == "specs"):
                    found.add(".".join((package,) + relative.parts))
    return found


def test_every_folder_with_init_is_a_listed_package():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = _source_packages()
    missing = sorted(found - listed)
    assert not missing, (f"add these to [tool.setuptools] packages in pyproject.toml (and a data folder's "
                         f"*.yaml to [tool.setuptools.package-data]): {missing}")
    data = _pyproject()["tool"]["setuptools"]["package-data"]
    unshipped = sorted(p for p in found if p.startswith("ndcost.specs") and "*.yaml" not in data.get(p, ()))
    assert not unshipped, f"add '*.yaml' for these to [tool.setuptools.package-data]: {unshipped}"
    stale = sorted(listed - found)
    assert not stale, f"pyproject lists packages with no folder: {stale}"


def test_project_metadata():
    project = _pyproject()["project"]
    assert project["name"] == "ndcost" and project["requires-python"] == ">=3.10"
    # an SPDX string: the TOML-table form is deprecated and refused by setuptools from 2027-02-18
    assert isinstance(project["license"], str)
    deps = " ".join(project["dependencies"])
    for name in ("pluggy", "attrs", "pyyaml", "numpy"):
        assert name in deps
    # torch and Transformers only for the census: an extra, not a dependency
    for name in ("torch", "transformers"):
        assert name not in deps
    census = " ".join(project["optional-dependencies"]["census"])
    assert "torch>=2.6" in census and "transformers>=5.0,<6" in census
    # the version is defined once, in ndcost.__version__
    assert "version" not in project and "version" in project["dynamic"]
    assert _pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ndcost.__version__"}
    assert {"pytest", "hypothesis"} <= {d.split(">")[0].split("=")[0].strip()
                                        for d in project["optional-dependencies"]["test"]}
    eps = _pyproject()["project"]["entry-points"]["ndcost.plugins"]
    for name in ("storage", "optimizers", "accounting", "hardware", "schedules"):
        assert eps[name] == f"ndcost.plugins.{name}"


def test_import_ndcost_does_not_import_torch_or_transformers(tmp_path):
    code = ("import sys, json, ndcost\n"
            "from ndcost import Strategy, Hardware, ModelSpec, resolve\n"
            "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "print(json.dumps(heavy))\n")
    result = _run(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_loading_every_plugin_and_the_accounting_does_not_import_torch(tmp_path):
    code = ("import sys, json, ndcost\n"
            "from ndcost import manager\n"
            "loaded = manager.plugins()\n"
            "ndcost.accounting.training_bytes([[2, 2]], 2, 2, [], 2, 'adamw', 4)\n"
            "ndcost.accounting.storage_bytes('int4', 64)\n"
            "ndcost.Strategy.parse('dp=2,tp=2,seq=8')\n"
            "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "print(json.dumps({'heavy': heavy, 'plugins': [p.module for p in loaded.plugins]}))\n")
    result = _run(code, tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["heavy"] == [], (f"a plugin module imports {report['heavy']} at import time; import it inside "
                                   f"the function that measures. Plugins loaded: {report['plugins']}")


def test_no_generic_top_level_names_are_importable(tmp_path):
    code = ("import importlib.util, json\n"
            "print(json.dumps([n for n in ('registry', 'plugins', 'framework', 'specs') "
            "if importlib.util.find_spec(n) is not None]))\n")
    result = _run(code, tmp_path)                 # outside the checkout: only what is installed
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


@pytest.mark.slow
def test_plain_install_ships_ndcost_only_with_its_yaml(tmp_path):
    """A non-editable ``pip install .`` into a folder: one package ``ndcost`` with specs/**/*.yaml inside."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    target = pip_install_into(source, tmp_path / "site", timeout=600)

    top = {p.name for p in target.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin"}
    assert top == {"ndcost"}, f"a plain install must put only ndcost at the top level, got {sorted(top)}"
    shipped = {p.relative_to(target / "ndcost" / "specs").as_posix()
               for p in (target / "ndcost" / "specs").rglob("*.yaml")}
    expected = {p.relative_to(REPO / "specs").as_posix() for p in (REPO / "specs").rglob("*.yaml")}
    assert expected and expected <= shipped, f"YAML missing from the install: {sorted(expected - shipped)}"
    # PEP 561's marker: type checkers read the installed package's annotations
    assert (target / "ndcost" / "py.typed").is_file(), "py.typed missing from the install"
    absent = sorted(p for p in _source_packages() if not target.joinpath(*p.split(".")).is_dir())
    assert not absent, f"packages missing from a plain install (list them in pyproject's packages): {absent}"

    # the installed copy imports and loads its built-in plugins from its own metadata
    code = ("import json, ndcost\n"
            "from ndcost import manager\n"
            "names = sorted(p.name for p in manager.plugins().plugins if p.distribution == 'ndcost')\n"
            "print(json.dumps({'file': ndcost.__file__, 'plugins': names,\n"
            "                  'total': ndcost.accounting.training_bytes([[4, 3], [3]], 2, 4, [[2, 4]], 2, 'adam', 4)"
            "['total']}))\n")
    run = _run(code, tmp_path, {"PYTHONPATH": str(target)})
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["file"].startswith(str(target))
    assert {"storage", "optimizers", "accounting", "hardware", "schedules"} <= set(report["plugins"])
    assert report["total"] == 226

    # and its console script runs, reading the model specs shipped as package data: Llama-3.1-8B has
    # 8,030,261,248 parameters (its Hugging Face model card's 8.03B, exactly Transformers' count)
    import os
    script = target / "bin" / "ndcost"
    assert script.is_file(), f"pip installed no console script: {sorted(p.name for p in target.iterdir())}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    cli = subprocess.run([sys.executable, str(script), "params", "llama-3.1-8b", "--json"], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["total"] == 8_030_261_248


def test_every_built_in_entry_point_is_essential():
    """The manager's essential set is how a stale install is caught: it must name every built-in entry point."""
    from ndcost import manager

    declared = set(_pyproject()["project"]["entry-points"]["ndcost.plugins"])
    assert declared == set(manager.ESSENTIAL), (
        f"framework/manager.py ESSENTIAL lacks {sorted(declared - manager.ESSENTIAL)} and names "
        f"{sorted(manager.ESSENTIAL - declared)} that pyproject.toml does not declare")
    # and each points into ndcost.plugins, declared as a third party declares one: group, name, module
    for name, target in _pyproject()["project"]["entry-points"]["ndcost.plugins"].items():
        assert target.startswith("ndcost.plugins.") and ":" not in target, (name, target)
