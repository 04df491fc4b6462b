"""`ndcost compare`: each row is what `evaluate` prices, the throughput marker, hardware lists, trainer files, plots.

Llama-3.1-8B with the formulas (census off): the rows are set beside ``CostModel.evaluate`` of the same strategy,
and the orderings below follow from what each strategy changes (full recompute keeps each layer's input alone and
reruns its forward; H100s hold 80 GB where H200s hold 141 GB).
"""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import ndcost

ROOT = Path(__file__).resolve().parents[1]
LLAMA = "llama-3.1-8b"
PLAIN, FULL, TP8, TP3 = ("fsdp=8,seq=8192,micro_batch=2", "fsdp=8,seq=8192,micro_batch=2,recompute=full",
                         "tp=8,sp=true,seq=8192,micro_batch=2", "tp=3,seq=8192")


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "ndcost", *argv], capture_output=True, text=True, timeout=300)


def _compare(*argv):
    done = _cli("compare", LLAMA, "--census", "off", *argv)
    assert done.returncode == 0, done.stderr
    return done


def test_each_row_is_what_evaluate_prices_and_the_marker_is_the_most_tokens_a_device_that_fits():
    rows = json.loads(_compare("--strategy", PLAIN, "--strategy", FULL, "--strategy", TP8, "--strategy", TP3,
                               "--hardware", "h100,h200", "--json").stdout)
    assert [(r["label"], r["hardware"]) for r in rows] == [(str(i), h) for h in ("h100", "h200") for i in range(1, 5)]
    for hardware in ("h100", "h200"):
        model = ndcost.resolve(LLAMA, hardware=hardware, census="off")
        mine = [r for r in rows if r["hardware"] == hardware]
        for r, text in zip(mine[:3], (PLAIN, FULL, TP8), strict=True):
            cost = model.evaluate(text)
            assert r["valid"] and r["strategy"] == str(cost.strategy)
            assert (r["peak_bytes"], r["reserved_bytes"], r["fits"]) == (cost.peak_bytes, cost.reserved_bytes,
                                                                         cost.fits)
            assert r["step_seconds"] == cost.time.step_seconds
            assert r["tokens_per_second_per_device"] == pytest.approx(cost.time.tokens_per_second / 8)
        plain, full, tp8, refused = mine
        # full recompute keeps a layer's input alone, and reruns the forward
        assert full["peak_bytes"] < plain["peak_bytes"] and full["compute_seconds"] > plain["compute_seconds"]
        assert not refused["valid"] and "does not divide num_attention_heads=32" in refused["reason"]
        assert refused["devices"] == 3 and refused["fits"] is False
    # the plain strategy's 130 GiB fit the H200's 141 GB alone
    assert [r["fits"] for r in rows if r["label"] == "1"] == [False, True]
    fitting = [r for r in rows if r["valid"] and r["fits"]]
    best = max(fitting, key=lambda r: r["tokens_per_second"] / r["devices"])
    assert [r for r in rows if r["best"]] == [best]


def test_the_table_fits_100_columns_and_names_each_strategy_once():
    out = _compare("--strategy", PLAIN, "--strategy", FULL, "--strategy", TP3, "--hardware", "h100,h200").stdout
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert sum(line.startswith("#1: fsdp=8,micro_batch=2,seq=8192") for line in lines) == 1
    assert sum(line.startswith("#2: #1 with recompute=full") for line in lines) == 1
    # one reason for both hardware, said once
    assert sum(line == "#3: #1 with fsdp=1,tp=3,micro_batch=1" for line in lines) == 1
    assert sum(line.startswith("    cannot run: tp=3 does not divide") for line in lines) == 1
    # the group each step waits on most: FSDP's gathers and reduce-scatters, the rows' only collectives
    assert [line.split()[-1] for line in lines if line.split()[:1] in (["1"], ["1*"], ["2"], ["2*"])] == [
        "fsdp"] * 4
    assert sum("*" in line.split()[0] for line in lines if line[:3].strip().rstrip("*").isdigit()) == 1


def test_csv_has_the_json_rows_figures():
    rows = json.loads(_compare("--strategy", PLAIN, "--strategy", FULL, "--json").stdout)
    table = list(csv.DictReader(io.StringIO(_compare("--strategy", PLAIN, "--strategy", FULL, "--csv").stdout)))
    assert [t["strategy"] for t in table] == [r["strategy"] for r in rows]
    assert [int(t["peak_bytes"]) for t in table] == [r["peak_bytes"] for r in rows]
    assert [float(t["step_seconds"]) for t in table] == pytest.approx([r["step_seconds"] for r in rows])


def test_a_trainer_file_is_row_one_and_each_strategy_overrides_it():
    toml = ROOT / "tests" / "data" / "configs" / "torchtitan" / "llama3_8b.toml"
    done = _cli("--json", "compare", "--from", f"torchtitan:{toml}", "--devices", "8", "--census", "off",
                "--strategy", "recompute=full")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    config = ndcost.from_config("torchtitan", toml, devices=8)
    full = ndcost.from_config("torchtitan", toml, devices=8, strategy="recompute=full")
    assert [r["strategy"] for r in rows] == [str(config.strategy), str(full.strategy)]
    model = ndcost.resolve(config.model, runtime=config.runtime, census="off")
    assert rows[0]["peak_bytes"] == model.evaluate(config.strategy).peak_bytes
    assert rows[1]["peak_bytes"] == model.evaluate(full.strategy).peak_bytes


def test_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "compare.png"
    out = _compare("--strategy", PLAIN, "--strategy", TP3, "--plot", str(path)).stdout
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {path}" in out


@pytest.mark.parametrize("argv, words", [
    ((LLAMA,), "give --strategy once for each strategy"),
    ((), "give a MODEL and --strategy"),
    ((LLAMA, "--strategy", PLAIN, "--csv", "--json"), "choose one"),
    ((LLAMA, "--strategy", PLAIN, "--devices", "8"), "--devices goes with --from"),
])
def test_usage_errors_say_what_goes_together(argv, words):
    done = _cli("compare", *argv)
    assert done.returncode == 2 and words in done.stderr


def test_bad_input_is_refused_in_one_line():
    done = _cli("compare", LLAMA, "--strategy", "fsdp=8,seq=4096", "--hardware", "h300")
    assert done.returncode == 1 and "hardware/h300" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = _cli("compare", LLAMA, "--strategy", "fsdp=8,tensor_parallel=2")
    assert done.returncode == 1 and "tp" in done.stderr


def test_tokens_and_a_price_a_hardware_give_days_gpu_hours_and_dollars():
    tokens, prices = 1e12, {"h100": 2.5, "h200": 3.5}
    rows = json.loads(_compare("--strategy", PLAIN, "--strategy", FULL, "--hardware", "h100,h200", "--tokens",
                               "1e12", "--price", "2.5,3.5", "--json").stdout)
    for r in rows:  # by hand from the row's throughput: seconds = T / (tokens/s), GPU-hours on its 8 devices
        seconds = tokens / r["tokens_per_second"]
        assert r["train_seconds"] == pytest.approx(seconds)
        assert r["gpu_hours"] == pytest.approx(seconds * 8 / 3600)
        assert r["cost_usd"] == pytest.approx(seconds * 8 / 3600 * prices[r["hardware"]])
    table = _compare("--strategy", PLAIN, "--tokens", "1e12", "--price", "2.5").stdout
    assert "GPU-h" in table and "USD" in table and max(len(line) for line in table.splitlines()) <= 100
    for argv, words in ((("--price", "2.5"), "--price goes with --tokens"),
                        (("--tokens", "1e12", "--price", "1,2,3", "--hardware", "h100,h200"), "one each")):
        done = _cli("compare", LLAMA, "--strategy", PLAIN, "--census", "off", *argv)
        assert done.returncode in (1, 2) and words in done.stderr


def test_two_trainer_files_side_by_side_each_as_it_reads():
    toml = ROOT / "tests" / "data" / "configs" / "torchtitan"
    one, two = toml / "llama3_8b.toml", toml / "llama3_8b_cp2.toml"
    done = _cli("--json", "compare", "--from", f"torchtitan:{one}", "--from", f"torchtitan:{two}", "--devices", "8",
                "--census", "off", "--strategy", "recompute=full")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    configs = [ndcost.from_config("torchtitan", path, devices=8) for path in (one, two)]
    what_if = ndcost.from_config("torchtitan", one, devices=8, strategy="recompute=full")
    assert [r["strategy"] for r in rows] == [str(c.strategy) for c in (*configs, what_if)]
    for r, config in zip(rows, (*configs, what_if), strict=True):
        model = ndcost.resolve(config.model, runtime=config.runtime, census="off")
        assert r["peak_bytes"] == model.evaluate(config.strategy).peak_bytes
    text = _cli("compare", "--from", f"torchtitan:{one}", "--from", f"torchtitan:{two}", "--devices", "8",
                "--census", "off").stdout
    assert f"#2: torchtitan:{two} as configured, #1 with" in text.replace("\n    ", "")


def test_estimate_plot_is_a_png_of_each_stage(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "stages.png"
    done = _cli("estimate", LLAMA, "--census", "off", "--strategy", "tp=2,pp=4,seq=4096,num_micro_batches=8",
                "--plot", str(path))
    assert done.returncode == 0, done.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {path}" in done.stdout


def test_a_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    from ndcost.errors import MissingExtra
    from ndcost.plots import bars_png
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtra, match=r"pip install 'ndcost\[plot\]'"):
        bars_png(tmp_path / "x.png", "", ["a"], memory=[{"parameters": 1}], reserved=[None], usable=[None])
