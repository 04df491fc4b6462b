"""The census cache cannot lie: corrupt, implausible or odd entries are recomputed, an unwritable cache is survived.

The entries here are written by hand over one filed by :func:`cache.store`
(no census runs: the record is a hand-made KindRecord whose figures are
derived below, and ``compute`` counts its calls), so each test says exactly
what a reader finds and checks that the record it gets back is the computed
one, with a warning, never the entry's.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from ndcost.plugins.census import cache
from ndcost.records import KindRecord

SEQ = 1024
CONTENT = cache.entry_content(what="layer", kind="dense", config={"hidden_size": 256}, seq=SEQ, runtime={"n": 1})
# One layer at TP 1 keeps 4,096 KiB and at TP 2 2,560 KiB: records.split gives saved = (2 * 2560 - 4096) KiB / SEQ
# = 1,024 bytes a token and saved_tp = 2 * (4096 - 2560) KiB / SEQ = 3,072; so a rank at TP t keeps
# 1024 + 3072 / t bytes a token (4,096 at TP 1, 2,560 at TP 2).
RECORD = KindRecord(kind="dense", seq=SEQ, source="census", saved_per_token=1024.0, saved_tp_per_token=3072.0,
                    working_per_token=2048.0, working_tp_per_token=-1024.0, working_input_per_token=512.0,
                    working_grad_share=0.5, selective_per_token=256.0, selective_tp_per_token=512.0,
                    recomputed_attention_mm_share=0.25, recomputed_other_mm_share=0.0,
                    ops={"attMM": 1024.0}, ops_tp={"attMM": 3072.0}, flops_by_part={"attention": 4_294_967_296},
                    flops_all_pairs_by_part={"attention": 4_294_967_296},
                    traffic={"moved_bytes": {"attention": 8_388_608}, "launches": {"attention": 7}})


@pytest.fixture
def entry(tmp_path, monkeypatch):
    """The cache in a temporary directory, RECORD stored under CONTENT; the entry's path."""
    monkeypatch.setenv("NDCOST_CACHE_DIR", str(tmp_path / "cache"))
    return cache.store(CONTENT, RECORD)


class Counting:
    """A compute function returning RECORD, counting its calls (a census that would measure again)."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return RECORD


def read_back(expect_warning: str):
    """cache.cached over the entry: it must warn (matching *expect_warning*), recompute once, and return RECORD."""
    compute = Counting()
    with pytest.warns(cache.CacheWarning, match=re.escape(expect_warning)):
        got = cache.cached(CONTENT, compute)
    assert compute.calls == 1 and got == RECORD
    return got


def rewrite(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data["record"])
    path.write_text(json.dumps(data))


def test_a_sound_entry_is_read_back_without_measuring(entry):
    compute = Counting()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at all
        assert cache.cached(CONTENT, compute) == RECORD
    assert compute.calls == 0
    # the hand-made record is one a census writes: its TP-split share of the working peak is negative (the
    # halved layer's peak is more than half), which the cache accepts, as the totals at TP 1 and 2 are bytes
    assert RECORD.working_per_token + RECORD.working_tp_per_token == 1024 and RECORD.working_tp_per_token < 0


@pytest.mark.parametrize("field,value,said", [
    ("saved_per_token", float("nan"), "saved_per_token is nan, not a finite number"),
    ("saved_per_token", float("inf"), "not a finite number"),
    ("saved_per_token", "1024", "saved_per_token is '1024', not a finite number"),
    ("saved_per_token", None, "saved_per_token is None"),
    ("saved_per_token", -1e9, "keep a negative number of bytes"),            # -1e9 bytes a token
    ("saved_tp_per_token", -2048.0 * 2 - 1, "keep a negative number of bytes"),  # TP 2: 1024 - 2048.5 < 0
    ("working_per_token", True, "not a finite number"),
    ("working_tp_per_token", None, "working_tp_per_token is None"),          # half a pair
    ("working_input_per_token", -512.0, "outside >= 0"),
    ("working_grad_share", 1.5, "outside [0, 1]"),
    ("recomputed_attention_mm_share", -0.25, "outside [0, 1]"),
    ("seq", SEQ * 2, "filed under seq 1024"),
    ("seq", 1024.0, "filed under seq"),
    ("kind", "moe", "filed under kind 'dense'"),
    ("source", 7, "source is 7, not a name"),
    ("ops", {"attMM": -4096.0}, "ops['attMM']"),
    ("ops", ["attMM"], "ops is ['attMM'], not a table"),
    ("flops_by_part", {"attention": -1}, "not a whole count >= 0"),
    ("flops_by_part", {"attention": 1.5}, "not a whole count"),
    ("flops_all_pairs_by_part", {"attention": "many"}, "not a finite number"),
    ("traffic", {"moved_bytes": {"attention": -8}}, "traffic['moved_bytes']['attention']"),
    ("traffic", {"moved_bytes": 8}, "traffic['moved_bytes'] is 8, not a table"),
])
def test_an_implausible_figure_is_recomputed_with_a_warning(entry, field, value, said):
    rewrite(entry, lambda record: record.__setitem__(field, value))
    read_back(said)
    assert cache.load(CONTENT) == RECORD  # rewritten by the recomputation: sound again


@pytest.mark.parametrize("change,said", [
    (lambda data: data["record"].pop("traffic"), "traffic (missing)"),
    (lambda data: data["record"].update(peak_bytes=5), "fields are not a KindRecord's: peak_bytes"),
    (lambda data: data.update(record=[1, 2]), "the record is list, not a mapping"),
    (lambda data: data.update(extra=1), "not a mapping of 'key' and 'record'"),
    (lambda data: data["key"].update(seq=SEQ + 1), "does not match"),
])
def test_a_wrong_schema_is_recomputed_with_a_warning(entry, change, said):
    data = json.loads(entry.read_text())
    change(data)
    entry.write_text(json.dumps(data))
    read_back(said)


@pytest.mark.parametrize("text", ["[1, 2, 3]", "null", "{ not json", "", '"a string"'])
def test_not_an_entry_at_all_is_recomputed_with_a_warning(entry, text):
    entry.write_text(text)
    read_back("corrupt or stale")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_in_place_of_an_entry_is_never_opened(entry):
    """Opening a FIFO for reading blocks until a writer comes: the read would hang every command.

    A subprocess, so that a hang is a timeout here rather than a stuck test run.
    """
    entry.unlink()
    os.mkfifo(entry)
    script = textwrap.dedent(f"""
        import os, sys, warnings
        os.environ["NDCOST_CACHE_DIR"] = {str(entry.parents[2])!r}
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_cache_validation import CONTENT, RECORD, Counting
        from ndcost.plugins.census import cache
        compute = Counting()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = cache.cached(CONTENT, compute)
        print(compute.calls)
        print(got == RECORD)
        print(" | ".join(str(w.message) for w in caught))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls, same, said = done.stdout.splitlines()
    assert (calls, same) == ("1", "True")
    assert "is not a regular file (mode p" in said
    assert entry.is_file()  # the recomputation replaced the FIFO with an entry


def test_a_directory_in_place_of_an_entry_warns_and_the_measured_record_is_used(entry):
    entry.unlink()
    entry.mkdir()
    compute = Counting()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.cached(CONTENT, compute) == RECORD
    said = [str(w.message) for w in caught if issubclass(w.category, cache.CacheWarning)]
    assert compute.calls == 1 and len(said) == 2, said
    assert "is not a regular file (mode d" in said[0]
    assert "cannot be written" in said[1] and "NDCOST_CACHE_DIR" in said[1]


def test_a_file_in_place_of_the_cache_directory_warns_once_and_carries_on(tmp_path, monkeypatch):
    """A regular file where the directory should be refuses writes to everyone, root included."""
    blocked = tmp_path / "blocked"
    blocked.write_text("not a directory")
    monkeypatch.setenv("NDCOST_CACHE_DIR", str(blocked))
    compute = Counting()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seq in (SEQ, SEQ * 2):  # two entries, one warning
            content = dict(CONTENT, seq=seq)
            assert cache.cached(content, compute) == RECORD
    said = [str(w.message) for w in caught if issubclass(w.category, cache.CacheWarning)]
    assert compute.calls == 2 and len(said) == 1, said
    assert f"census cache {blocked} cannot be written" in said[0]
    assert blocked.read_text() == "not a directory"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into a 0o500 directory")
def test_a_read_only_cache_directory_warns_once_and_carries_on(tmp_path, monkeypatch):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o500)
    monkeypatch.setenv("NDCOST_CACHE_DIR", str(read_only))
    try:
        compute = Counting()
        with pytest.warns(cache.CacheWarning, match="cannot be written.*PermissionError"):
            assert cache.cached(CONTENT, compute) == RECORD
        assert compute.calls == 1 and list(read_only.iterdir()) == []
    finally:
        read_only.chmod(0o700)


WRITER = """
import sys
sys.path.insert(0, {tests!r})
from test_cache_validation import CONTENT, RECORD
from ndcost.plugins.census import cache
import attrs
for round in range({rounds}):
    for seq in range(1, {keys} + 1):  # every process writes every entry, each with its own figures
        record = attrs.evolve(RECORD, seq=seq, saved_per_token=float({writer}))
        cache.store(dict(CONTENT, seq=seq), record)
        found = cache.load(dict(CONTENT, seq=seq))  # whoever wrote last, a reader sees a whole entry
        assert found is not None and found.saved_per_token in {writers}, found
print("ok")
"""


@pytest.mark.slow
def test_several_processes_filling_one_cache_at_once_leave_whole_entries(tmp_path):
    writers, keys = 4, 8
    env = dict(os.environ, NDCOST_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="error::UserWarning")
    procs = [subprocess.Popen([sys.executable, "-c", WRITER.format(
        tests=str(Path(__file__).parent), rounds=25, keys=keys, writer=w, writers=tuple(range(writers)))],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(writers)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out.strip() == "ok", err
    files = sorted((tmp_path / "cache" / "census").rglob("*"))
    entries = [f for f in files if f.is_file()]
    assert len(entries) == keys and not [f for f in entries if f.name.startswith(".tmp-")]


@pytest.mark.slow
def test_a_census_through_the_cli_with_an_unwritable_cache_prints_its_figures_and_one_warning(tmp_path, monkeypatch,
                                                                                               capsys):
    """The census is measured, then the cache refuses the entry: the command still succeeds with the figures."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from ndcost.cli import main

    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                                      num_key_value_heads=2, head_dim=32, num_hidden_layers=2, vocab_size=1000)
    config.save_pretrained(tmp_path / "model")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory should be")
    monkeypatch.setenv("NDCOST_CACHE_DIR", str(blocked))
    assert main(["census", str(tmp_path / "model"), "--seq", "64", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["kinds"]["dense"]["saved_per_token"] > 0 and "output" in data
    said = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(said) == 1 and "cannot be written" in said[0] and str(blocked) in said[0], captured.err
