"""benchmarks/validate_torchtitan.py's data: torchtitan's published rows as stored, each translated or refused.

The published figures are checked against the stored ``docs/performance.md`` text (parsed here, apart from the
benchmark), each row's layout against its table's caption, and the strategy the torchtitan reader makes of it
against the row's fields.
"""
from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest

import ndcost
from ndcost.values import Strategy

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data"
_spec = importlib.util.spec_from_file_location("validate_torchtitan", ROOT / "benchmarks" / "validate_torchtitan.py")
vt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vt)

DOC = vt.load_rows()
ROWS = DOC["rows"]
# the strategy field each feature of a row reads into, and its value when on
FEATURE_FIELDS = {"float8": ("float8", "tensorwise"), "compile": ("compile", True), "async_tp": ("async_tp", True)}


def _excerpt(source: str) -> str:
    return (DATA / DOC["sources"][source]["excerpt"]).read_text(encoding="utf-8")


def _table_after(text: str, table: str):
    """(caption, header cells, body rows) of the first markdown table after the caption or heading *table*."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith(f"**{table}**") or (line.startswith("#") and line.lstrip("#").strip() == table))
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[first:end]]
    return lines[start], cells[0], cells[2:]


def _number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%"))


def test_the_data_file_parses_and_names_its_sources():
    # Tables 1 to 6: 3 + 4 + 3 + 2 + 2 + 4, the A100 table: 3; June 2025: async TP 2 x 6, H200 2; torchao: 3 + 4
    assert len(ROWS) == 42
    assert len({r["id"] for r in ROWS}) == len(ROWS)
    for name, source in DOC["sources"].items():
        assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), name
        first = _excerpt(name).splitlines()[0]
        assert source["commit"] in first and source["path"] in first
    for row in ROWS:
        assert row["source"] in DOC["sources"] and row["hardware"] in ("h100-hbm2e-500w", "a100", "h200", "mi300x")
        assert row["dp_shard"] * row["cp"] * row["tp"] * row["pp"] == row["gpus"], row["id"]


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_published_figures_are_the_stored_markdown(row):
    caption, header, body = _table_after(_excerpt(row["source"]), row["table"])
    matches = [cells for cells in body if cells[:len(row["row"])] == row["row"]]
    assert len(matches) == 1, (row["id"], body)
    cells = dict(zip(header, matches[0], strict=True))
    tps = cells[row["column"]] if "column" in row else cells.get("TPS/GPU", cells.get("WPS"))
    assert _number(tps) == row["tokens_per_second_per_gpu"]
    memory = cells.get("Memory(GiB)", cells.get("Peak Memory (GB)"))  # torchao's column: torchtitan's GiB
    if memory is not None:
        assert _number(memory) == row["memory_gib"]
    else:
        assert row["memory_gib"] is None
    if "MFU" in cells:
        assert _number(cells["MFU"]) == row["mfu_percent"]
    if row["source"] == "h100_2024_12":  # the layout the caption states
        flavor = row["model"].split("-")[1]
        assert f"Llama 3.1 {flavor} model" in caption and f"{row['gpus']} GPUs" in caption
        assert f"Local batch size {row['local_batch']}" in caption
        assert ("Full activation" in caption) == (row["ac"] == "full")
        named = caption + " " + " ".join(row["row"])
        for feature, word in (("compile", "torch.compile"), ("float8", "Float8"), ("async_tp", "AsyncTP")):
            assert (word in named) == row[feature], (row["id"], feature)
    elif row["source"] == "h100_2025_06_async_tp":  # the heading states the layout, the row and column the rest
        flavor = row["model"].split("-")[1].lower()
        assert caption.startswith(f"#### Llama3 {flavor} on {row['gpus']} H100s with FSDP={row['dp_shard']}, "
                                  f"TP={row['tp']}, torch.compile")
        assert caption.endswith(f"local batch size {row['local_batch']}") and row["compile"]
        assert ("full AC" in caption) == (row["ac"] == "full")
        assert ("per op SAC" in caption) == (row["ac"] == "selective" and row["ac_option"] == "op")
        assert row["float8"] == (row["row"][0] != "None (bfloat16)")
        assert row["row"][0].rstrip(")").endswith(row.get("float8_recipe", "bfloat16"))
        assert row["async_tp"] == row["column"].startswith("Async TP")
    elif row["source"] == "h200_2025_06_trainy":  # the command line states the rest
        text = _excerpt(row["source"])
        assert int(row["row"][0]) * 8 == row["gpus"] == row["dp_shard"]
        assert f"--training.local_batch_size={row['local_batch']}" in text and "--training.compile" in text
        assert '--model.converters="float8"' in text and "--float8.enable_fsdp_float8_all_gather" in text
        assert row["float8"] and row["float8_all_gather"] and row["compile"] and not row["async_tp"]
    elif row["source"].startswith("torchao_float8"):  # the list under the heading states the layout
        text = _excerpt(row["source"])
        assert "8xH100 GPUs" in text and "8xMI300X GPUs" in text and caption.endswith(row["table"])
        assert ("MI300" in row["table"]) == (row["hardware"] == "mi300x")
        assert "batch size 1, sequence length 8192, steps 100, `torch.compile`, FSDP2, per-op SAC" in text
        assert (row["gpus"], row["dp_shard"], row["local_batch"], row["seq_len"]) == (8, 8, 1, 8192)
        assert row["compile"] and row["ac"] == "selective" and row["ac_option"] == "op" and row["model"] == "llama3-8B"
        scaling = row["row"][1]
        assert row["float8"] == (scaling != "none (bfloat16)")
        assert scaling.startswith(row.get("float8_recipe", "tensorwise" if row["float8"] else "none"))
        assert bool(row.get("float8_all_gather")) == ("float8 all-gather" in scaling)
    else:
        assert row["model"] == f"llama3-{row['row'][0]}" and int(row["row"][1]) == row["local_batch"]
        assert row["row"][2].startswith(row["ac"])


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_each_row_translates_with_its_features(row):
    s = vt.read_job(row).strategy
    for feature, (field, on) in FEATURE_FIELDS.items():
        on = row.get("float8_recipe", on) if feature == "float8" else on
        assert getattr(s, field) == (on if row[feature] else Strategy().to_dict()[field]), (row["id"], feature)
    # the 405B rows turn it on; torchtitan keeps it only with dp_shard > 1 (dp_shard_enabled)
    assert s.float8_all_gather == (bool(row.get("float8_all_gather")) and row["dp_shard"] > 1)
    without = vt.read_job(row, features=False).strategy
    assert (without.float8, without.float8_all_gather, without.compile, without.async_tp) == \
        ("none", False, False, False)
    assert (s.tp, s.pp, s.cp, s.seq) == (row["tp"], row["pp"], row["cp"], row["seq_len"])
    # torchtitan's compiled loss from April 2025; its schedule's kept outputs before October 2025 (the editions')
    compiles_loss = "loss" in DOC["sources"][row["source"]]["compile_components"]
    assert compiles_loss == (row["source"] not in ("h100_2024_12", "a100_2024", "torchao_float8_h100"))
    assert (s.loss_engine == "compiled") == (row["compile"] and compiles_loss)
    assert s.pp_return_outputs == (row["pp"] > 1 and row["source"] == "h100_2024_12")
    assert s.dp * s.fsdp * s.cp * s.tp * s.pp == row["gpus"]
    if row["dp_shard"] == 1 and row["cp"] > 1:  # torchtitan's FSDP over the cp ranks alone
        assert (s.dp, s.fsdp, s.shard_mesh) == (1, 1, "fsdp_cp")
    else:
        assert (s.dp, s.fsdp, s.shard_mesh) == (1, row["dp_shard"], "dp_cp")
    assert s.micro_batch * s.num_micro_batches * s.fsdp == row["global_batch"]
    assert s.vocab_parallel == (row["tp"] > 1) and s.sp == (row["tp"] > 1)
    assert (s.param_dtype, s.compute_dtype) == ("fp32", "bf16")
    expected = {"full": "full", "selective": "selective" if row.get("ac_option") == "op" else "full"}[row["ac"]]
    assert s.recompute == expected


def test_rows_with_features_are_priced_beside_the_figure_without_them():
    by_id = {r["id"]: r for r in ROWS}
    # Table 1's rows under full checkpointing (their op-level selective policy is the census's alone: below)
    plain, compiled = (vt.evaluate_row(dict(by_id[name], ac="full")) for name in ("t1-fsdp", "t1-fsdp-compile"))
    assert plain["comparable"] and plain["unpriceable_reason"] is None and "predicted" in plain
    assert "predicted_without_features" not in plain
    assert compiled["comparable"] and compiled["unpriceable_reason"] is None
    assert "compile=true" in compiled["predicted"]["strategy"]
    # the job without compile is the plain row's (Table 1's rows differ by their features alone)
    assert compiled["predicted_without_features"] == plain["predicted"]
    predicted = plain["predicted"]["tokens_per_second_per_gpu"]
    assert math.isclose(plain["tokens_error"], predicted / 5762 - 1)
    assert math.isclose(compiled["tokens_error_without_features"], predicted / 6667 - 1)
    summ = vt.summary([plain, compiled])
    assert summ["comparable_rows"] == 2 and summ["unpriceable_rows"] == 0 and summ["refused_rows"] == 0


def test_a_row_ndcost_refuses_holds_no_figure_says_why_and_leaves_the_summary():
    """A strategy the resolver refuses (Table 2's CP 2 row at a sequence ring attention cannot cut in 2 * cp
    chunks) holds no figure, says why, and leaves the summary's errors."""
    row = vt.evaluate_row(dict({r["id"]: r for r in ROWS}["t2-fsdp4-cp2"], seq_len=65534), census="off")
    predicted = row["predicted"]
    assert not predicted["valid"] and predicted["tokens_per_second_per_gpu"] is None
    assert predicted["memory_gib"] is None and row["tokens_error"] is None and row["memory_error"] is None
    assert "seq=65534 is not a multiple of 2 * cp = 4" in predicted["reason"]
    summ = vt.summary([row])
    assert summ["comparable_rows"] == 0 and summ["refused_rows"] == 1
    assert "ndcost refuses: cp_algo=ring: seq=65534 is not a multiple of 2 * cp = 4" in vt.table([row], summ)


def test_torchtitans_op_level_selective_is_priced_with_the_census_off():
    """Table 1's rows run torchtitan's op-level selective checkpointing: the op records price it (the calls of
    specs/op_records.yaml), so the row holds a figure between the same job's under full recompute and none."""
    row = {r["id"]: r for r in ROWS}["t1-fsdp"]
    assert row["ac"] == "selective"
    predicted = vt.evaluate_row(row, census="off")["predicted"]
    assert predicted["valid"] and "recompute=selective" in predicted["strategy"]
    full = vt.evaluate_row(dict(row, ac="full"), census="off")["predicted"]
    none = vt.evaluate_row(dict(row, ac="none"), census="off")["predicted"]
    assert full["peak_bytes"] < predicted["peak_bytes"] < none["peak_bytes"]
    assert full["tokens_per_second_per_gpu"] < predicted["tokens_per_second_per_gpu"] \
        < none["tokens_per_second_per_gpu"]


def test_spearman_by_hand():
    # ranks of y: 1 3 2 4; d = 0 -1 1 0; 1 - 6 * 2 / (4 * (16 - 1)) = 0.8
    assert math.isclose(vt.spearman([1, 2, 3, 4], [10, 30, 20, 40]), 0.8)
    # a tie takes the mean rank 2.5: Pearson of (1, 2.5, 2.5, 4) and (1, 2, 3, 4) = 4.5 / sqrt(4.5 * 5)
    assert math.isclose(vt.spearman([1, 2, 2, 3], [1, 2, 3, 4]), 4.5 / math.sqrt(22.5))
    assert vt.spearman([1, 2, 3], [3, 2, 1]) == -1.0
    assert vt.spearman([5], [1]) is None and vt.spearman([1, 1], [1, 2]) is None


def test_a_pipelined_row_is_set_beside_the_stage_torchtitan_logs():
    """torchtitan logs memory from one rank, the first of the last pipeline stage under PP (its metrics.py,
    ``_get_metrics_rank``): a PP row's memory is that stage's, not the most any stage holds; without PP, rank 0."""
    by_id = {r["id"]: r for r in ROWS}
    pipelined = vt.evaluate_row(by_id["t5-1f1b"], census="off")["predicted"]
    assert pipelined["logged_stage"] == by_id["t5-1f1b"]["pp"] - 1 == 7
    cost = ndcost.resolve("llama-3.1-405b", runtime="torchtitan-cuda", hardware="h100-hbm2e-500w",
                          census="off").evaluate(pipelined["strategy"])
    assert pipelined["memory_basis"] == "allocated"  # the formulas claim no reserve
    assert pipelined["memory_gib"] * vt.GIB == cost.stages[7].peak_bytes != cost.peak_bytes
    single = vt.evaluate_row(by_id["t1-fsdp"], census="off")["predicted"]
    assert single["logged_stage"] == 0 and single["memory_gib"] * vt.GIB == single["peak_bytes"]


def test_each_cuda_edition_runs_sdpa_as_its_torch_did():
    """Every CUDA edition's torch predates pytorch/pytorch#162073 (September 2025, torch 2.9; each names its build),
    so its SDPA tried FlashAttention-2 before cuDNN on Hopper; the H200 file's own torch (2.11) prefers cuDNN. The Trainy H200 row priced with flash first
    is slower than under the file's order (FlashAttention-2's prior beside cuDNN's measured share)."""
    for name, source in DOC["sources"].items():
        if "mi300x" in name:  # ROCm: no cuDNN, the file's own kernels
            assert "sdpa_backends" not in source
            continue
        assert source["sdpa_backends"] == ["flash", "efficient"], name
        # a 2.8 or older build, or a main-branch commit of 2024 or before September 2025
        assert re.search(r"torch (2\.[0-8]\.|[0-9a-f]{7,}\b)|2024", source["edition"]), source["edition"]
    row = {r["id"]: r for r in ROWS}["h200-8b-32"]
    config = vt.read_job(row)
    as_run = vt._price(config, "h200", "off", DOC["sources"][row["source"]]["sdpa_backends"])
    as_filed = vt._price(config, "h200", "off")
    assert as_run["tokens_per_second_per_gpu"] < as_filed["tokens_per_second_per_gpu"]
    assert as_run["peak_bytes"] == as_filed["peak_bytes"]  # the kernel's time, not its memory
