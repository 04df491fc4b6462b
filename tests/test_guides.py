"""Every guide's commands run: each ```bash block of docs/guides/*.md, in file order, must exit 0.

A guide runs in a temporary working directory of its own, the repository's
root in ``$NDCOST_REPO``, and, first on ``PATH``, a throwaway virtual
environment's ``ndcost``, ``python`` and ``pip`` (ndcost installed there from
this checkout; :func:`_helpers.throwaway_venv`), so what a guide installs or
uninstalls never touches the environment running the tests; pip runs offline
and builds with that environment's setuptools. Each block runs
in a new ``bash -e -o pipefail`` in that directory: files persist from block
to block, shell variables do not. A block whose fence is preceded by the line
``<!-- not run -->`` is skipped (an illustration, or a command needing what a
test machine lacks); so is every block in another language.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import List, Tuple

import pytest

from _helpers import throwaway_venv

REPO = Path(__file__).resolve().parents[1]
GUIDES = sorted((REPO / "docs" / "guides").glob("*.md"))
NOT_RUN = "<!-- not run -->"
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([^\s`]*)")


def bash_blocks(text: str) -> List[Tuple[int, str]]:
    """``(line number of the fence, body)`` of each ```bash block to run, in file order."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, language = opened.group(1), opened.group(2)
        start = i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        previous = next((line.strip() for line in reversed(lines[:start]) if line.strip()), "")
        if language == "bash" and previous != NOT_RUN:
            blocks.append((start + 1, "\n".join(body) + "\n"))
    return blocks


def test_blocks_are_found_in_order_and_the_marked_one_skipped():
    text = ("# g\n```bash\necho one\n```\n\n<!-- not run -->\n\n```bash\nexit 1\n```\n"
            "```python\nraise SystemExit(1)\n```\n````bash\necho '```'\n````\n")
    assert bash_blocks(text) == [(2, "echo one\n"), (14, "echo '```'\n")]


@pytest.mark.slow
@pytest.mark.parametrize("guide", GUIDES, ids=[g.name for g in GUIDES])
def test_every_bash_block_of_the_guide_exits_0(guide, tmp_path):
    blocks = bash_blocks(guide.read_text(encoding="utf-8"))
    if not blocks:
        pytest.skip(f"{guide.name} has no ```bash block to run")
    bin_dir = throwaway_venv(tmp_path / "env", REPO)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NDCOST_STRICT_PLUGINS")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", NDCOST_REPO=str(REPO),
               VIRTUAL_ENV=str(bin_dir.parent), NDCOST_CACHE_DIR=str(tmp_path / "cache"),
               # pip offline, building with the environment's setuptools (pip reads "0" here as: no isolation)
               PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0")
    for line, body in blocks:
        run = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], cwd=work, env=env, capture_output=True,
                             text=True, timeout=900)
        assert run.returncode == 0, (f"{guide.name}, the block at line {line} exited {run.returncode}:\n{body}\n"
                                     f"stdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}")
