"""The hostile corpus (tests/data/hostile/, listed in its README.md) through the CLI: every file refused cleanly.

Each file runs in its own process (``tests/_cli_probe.py``: ``ndcost.cli.main``, as ``python -m ndcost``), under
the 10 s hang guard and a cap on its address space: exit 1, exactly one stderr line, no traceback, nothing on
stdout, and no exception but an NdcostError reaching the CLI's generic handlers (issue 12).
"""
from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from _hostile import HANG_GUARD_SECONDS

HERE = Path(__file__).parent
CORPUS = HERE / "data" / "hostile"
PROBE = HERE / "_cli_probe.py"

# Files the CLI does not refuse cleanly today, with what happens and who fixes the cause (issue 12: r1
# strategies, evaluation and overflow; r2 hardware, model configs and spec YAML; r3 plugins and the census
# cache). Each is marked xfail(strict=True): once fixed it passes, strict fails it, and its entry goes.
KNOWN_FAILURES: Dict[str, str] = {}

ESTIMATE = ["--strategy", "seq=128"]
# What each kind of file is given to, by its name's prefix (after an optional "fuzz_"): a model config or spec
# to `ndcost params` (read and counted, no torch), a hardware spec to `ndcost estimate --hardware`.
BY_PREFIX = {
    "config_": lambda path: ["params", path, "--json"],
    "spec_": lambda path: ["params", path, "--json"],
    "yaml_": lambda path: ["params", path, "--json"],
    "hw_": lambda path: ["estimate", "llama-3.1-8b", "--hardware", path, "--census", "off", "--json",
                         "--strategy", "tp=8,seq=4096"],
}
# Files whose hostility only pricing reaches: the formulas (census off), or the census, which builds the
# config in Transformers (a census case may take CENSUS_IMPORT_SECONDS more: importing torch and Transformers
# takes about 7 s alone on this project's shared 2-core machine).
PRICED = {"fuzz_config_huge_layers.json", "fuzz_config_huge_vocab.json"}
CENSUS = {"fuzz_config_rope_garbage.json", "fuzz_config_pad_past_vocab.json"}
CENSUS_IMPORT_SECONDS = 30
# a hostile file must not take the machine's memory down with it
ADDRESS_SPACE_BYTES = 8 * 2 ** 30


def _files() -> List[str]:
    return sorted(p.name for p in CORPUS.iterdir() if p.name != "README.md")


def _argv(name: str) -> List[str]:
    path = str(CORPUS / name)
    if name in CENSUS:
        return ["estimate", path, "--census", "auto", "--json", *ESTIMATE]
    if name in PRICED:
        return ["estimate", path, "--census", "off", "--json", *ESTIMATE]
    kind = name[len("fuzz_"):] if name.startswith("fuzz_") else name
    for prefix, argv in BY_PREFIX.items():
        if kind.startswith(prefix):
            return argv(path)
    raise AssertionError(f"tests/data/hostile/{name}: no command for its prefix; name it "
                         f"{', '.join('[fuzz_]' + p for p in BY_PREFIX)}...")


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


def _cases():
    for name in _files():
        reason = KNOWN_FAILURES.get(name)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.slow
@pytest.mark.parametrize("name", _cases())
def test_hostile_file_is_refused(name, tmp_path):
    escaped = tmp_path / "escaped"
    timeout = HANG_GUARD_SECONDS + (CENSUS_IMPORT_SECONDS if name in CENSUS else 0)
    env = {**os.environ, "NDCOST_PROBE_ESCAPED": str(escaped)}  # the probe imports _hostile from its folder
    try:
        run = subprocess.run([sys.executable, str(PROBE), *_argv(name)], capture_output=True, text=True,
                             errors="replace", timeout=timeout, env=env, preexec_fn=_cap_memory, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{name}: still running after {timeout:g} s (a hang)") from None
    reached = escaped.read_text() if escaped.exists() else ""
    assert not reached, f"{name}: the CLI's generic handler was reached by {reached}"
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 1, f"{name}: exit {run.returncode}, stderr {run.stderr!r}"
    lines = run.stderr.splitlines()
    assert len(lines) == 1, f"{name}: {len(lines)} stderr lines: {run.stderr!r}"
    if "--json" in _argv(name):  # the refusal's one document, naming what the stderr line says
        error = json.loads(run.stdout)["error"]
        assert error["message"] in run.stderr and set(error) == {"command", "kind", "message"}, run.stdout[:200]
    else:
        assert run.stdout == "", f"{name}: a refusal wrote to stdout: {run.stdout[:200]!r}"


def test_corpus_readme_lists_every_file():
    """tests/data/hostile/README.md names each file of the corpus, and no file that is not there."""
    listed = set(re.findall(r"^\| `([^`]+)` \|", (CORPUS / "README.md").read_text(), flags=re.M))
    files = set(_files())
    assert files - listed == set(), f"not in README.md: {sorted(files - listed)}"
    assert listed - files == set(), f"in README.md but not in the corpus: {sorted(listed - files)}"


def test_every_file_has_a_command():
    for name in _files():
        _argv(name)
