"""Helpers several test files share (plain functions; the fixtures are in conftest.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path


def make_dist(root: Path, dist: str, modules: dict, entry_points: dict, version: str = "1.0") -> Path:
    """Write a minimal installed distribution under *root*: modules (name -> source) and entry points."""
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = ["[ndcost.plugins]"] + [f"{name} = {module}" for name, module in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for name, source in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source))
    return root


def pip_install_into(source: Path, target: Path, timeout: int = 300) -> Path:
    """The distribution folder *source* installed with pip into *target*: offline, no dependencies, no isolation."""
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                             "--no-index", "--target", str(target), str(source)],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return target


def pip_install(source: Path, work: Path) -> Path:
    """A copy of *source* (a distribution folder, its build leftovers skipped) installed into ``work/site``."""
    copy = work / "src"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    return pip_install_into(copy, work / "site")


def eager_delta_rule_kept_bytes(seq: int, key_heads: int, value_heads: int, key_width: int, value_width: int,
                                chunk: int = 64) -> int:
    """What Transformers' torch_chunk_gated_delta_rule keeps run alone on inputs of a layer's shapes.

    Counted independently of the census: saved-tensor hooks note each saved
    storage that is not an input, and what the rule's output graph still
    holds once it has returned is what it keeps.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers.models.qwen3_next import modeling_qwen3_next as modeling

    rule = getattr(modeling.torch_chunk_gated_delta_rule, "__wrapped__", modeling.torch_chunk_gated_delta_rule)
    with FakeTensorMode():
        q, k = (torch.empty(1, seq, key_heads, key_width, dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        v = torch.empty(1, seq, value_heads, value_width, dtype=torch.bfloat16, requires_grad=True)
        g = torch.empty(1, seq, value_heads, dtype=torch.float32, requires_grad=True)
        beta = torch.empty(1, seq, value_heads, dtype=torch.bfloat16, requires_grad=True)
        inputs = {t.untyped_storage()._cdata for t in (q, k, v, g, beta)}
        saved = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage._cdata not in inputs:
                saved[storage._cdata] = (weakref.ref(storage), storage.nbytes())
            # detached, as a graph holds what it saves: an op saving its own output would
            # otherwise hold itself, a cycle that keeps a graph the rule drops alive
            return tensor.detach()

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = rule(q, k, v, g=g, beta=beta, chunk_size=chunk, use_qk_l2norm_in_kernel=True)
        # what the rule keeps: the saves its output's graph still holds once it has returned
        kept = sum(size for alive, size in saved.values() if alive() is not None)
        del out
        return kept


def ndcost(*argv, cwd=None, check=True):
    """`python -m ndcost ARGV` in a subprocess, from a folder that holds no checkout."""
    done = subprocess.run([sys.executable, "-m", "ndcost", *argv], capture_output=True, text=True,
                          cwd=cwd or Path(os.environ.get("TMPDIR", "/tmp")), timeout=300)
    if check:
        assert done.returncode == 0, done.stderr
    return done


# The folders and files a plain install of ndcost is built from (pyproject's package-dir).
NDCOST_SOURCES = ("pyproject.toml", "README.md", "framework", "registry", "plugins", "specs")


def _ndcost_entries(site_packages: Path) -> set:
    """Top-level names in *site_packages* that belong to a distribution declaring ``ndcost.plugins`` entry points.

    That is ndcost itself and every plugin distribution (its dist-info, its package, an editable install's
    ``.pth`` and finder), read from each distribution's RECORD.
    """
    from importlib import metadata

    names = set()
    for dist in metadata.distributions(path=[str(site_packages)]):
        if not any(ep.group == "ndcost.plugins" for ep in dist.entry_points):
            continue
        for file in dist.files or ():
            first = Path(file).parts[0]
            if first != "..":
                names.add(first)
    return names


def throwaway_venv(work: Path, repo: Path) -> Path:
    """A new virtual environment under *work* holding a plain install of ndcost from *repo*; its bin folder.

    It sees the packages of the environment running the tests (torch, Transformers, pip, setuptools) through a
    folder of links added as a site directory, less every distribution that declares ``ndcost.plugins`` entry
    points (ndcost and, in CI, ndcost-olmo2): ndcost is installed here afresh, and what a test installs or
    uninstalls lands in this venv's own site-packages, never in the test environment.
    """
    import sysconfig

    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    own_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    view = work / "test-env-view"
    view.mkdir()
    for site_packages in {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}:
        skipped = _ndcost_entries(site_packages)
        for entry in site_packages.iterdir():
            if entry.name not in skipped and not (view / entry.name).exists():
                (view / entry.name).symlink_to(entry)
    # a line starting with `import` runs: addsitedir also processes the .pth files among the links
    (own_site / "test-env-view.pth").write_text(f"import site; site.addsitedir({str(view)!r})\n")
    pip = venv / "bin" / "pip"
    pip.write_text('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
    pip.chmod(0o755)
    source = work / "ndcost-src"
    source.mkdir()
    for name in NDCOST_SOURCES:
        if (repo / name).is_dir():
            shutil.copytree(repo / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy(repo / name, source / name)
    result = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                             "--no-index", str(source)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    check = subprocess.run([str(python), "-c", "from ndcost import manager; manager.plugins()"],
                           capture_output=True, text=True, timeout=300, cwd=work)
    assert check.returncode == 0, check.stderr
    return venv / "bin"


def file_variant(source: Path, old: str, new: str, target: Path) -> Path:
    """*source*'s text with *old* (which must be there) replaced by *new*, written to *target*."""
    text = source.read_text()
    assert old in text, f"{old!r} is not in {source}"
    target.write_text(text.replace(old, new))
    return target


def small_llama_config(hidden=256, intermediate=512, heads=8, kv_heads=2, head_dim=32):
    """A one-layer Transformers Llama config of the given widths (vocabulary 1,000): what the contract tests
    measure a census on."""
    from transformers import AutoConfig
    return AutoConfig.for_model("llama", hidden_size=hidden, intermediate_size=intermediate,
                                num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                                vocab_size=1000, num_hidden_layers=1)
