"""Fuzzing every input ndcost reads: either a result keeping every invariant, or a one-line NdcostError.

Issue 12 ("never a wrong figure, never a traceback"). Five classes of input, each a hypothesis strategy: strategy
strings (``Strategy.parse``, ``CostModel.evaluate`` and ``ndcost estimate --strategy``), strategy columns
(``CostModel.evaluate_many``), model configs (config.json files of llama-, qwen3- and mixtral-like models, read by
``ndcost.resolve(path, census="off")`` and ``ndcost params``), hardware mappings and spec YAML (``--hardware``), and
model spec YAML. What an answer must be is in ``tests/_hostile.py``; where a value is hostile beyond doubt (a
string where a count goes, "no" where a flag goes, a NaN bandwidth) the case must be refused, since any figure
computed from it would be a wrong one. Every case runs under a 10 s hang guard.

The examples are derandomized (the same ones each run, so CI is reproducible and a property marked in
``KNOWN_FAILURES`` fails every time until its cause is fixed); ``NDCOST_FUZZ_EXPLORE=1`` draws new ones.
"""
from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest
import yaml
from _hostile import (
    assert_refusal,
    check_batch,
    check_cli_answer,
    check_cost_dict,
    hang_guard,
    run_cli,
)
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

import ndcost
from ndcost import models
from ndcost.errors import NdcostError
from ndcost.specio import hardware_from_mapping, load_hardware_yaml, load_yaml
from ndcost.values import Strategy

# Properties that fail today, with the exception they end in and who fixes the cause (issue 12: r1 strategies,
# evaluation, overflow and JSON; r2 hardware, model configs and spec YAML; r3 plugins and the census cache).
# Each is marked xfail(strict=True): once its cause is fixed it passes, strict fails it, and its entry goes.
KNOWN_FAILURES: Dict[str, str] = {}

# max_examples per property: the counts README.md's Reliability section states
EXAMPLES = {
    "strategy_string": 150,
    "strategy_string_huge": 60,
    "strategy_string_cli": 80,
    "strategy_string_compare": 40,
    "strategy_columns": 150,
    "strategy_columns_huge": 60,
    "model_config_hostile": 120,
    "model_config_range": 80,
    "model_config_cli": 30,
    "hardware_mapping": 120,
    "hardware_yaml_cli": 30,
    "spec_yaml": 80,
    "model_config_census": 3,
}

_EXPLORE = os.environ.get("NDCOST_FUZZ_EXPLORE") == "1"
# no shrinking unless exploring: a failing property stops at its first failing example (CI's time)
_PHASES = tuple(Phase) if _EXPLORE else (Phase.explicit, Phase.generate)


def fuzz(name: str) -> Callable:
    """hypothesis settings for property *name* (its max_examples in EXAMPLES), and its KNOWN_FAILURES mark."""
    def decorate(test):
        test = settings(max_examples=EXAMPLES[name], deadline=None, derandomize=not _EXPLORE, database=None,
                        phases=_PHASES, report_multiple_bugs=_EXPLORE,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                               HealthCheck.filter_too_much])(test)
        reason = KNOWN_FAILURES.get(test.__name__)
        return pytest.mark.xfail(strict=True, reason=reason)(test) if reason else test
    return decorate


# ---------------------------------------------------------------------------
# the models the strategies are priced on (small, so a case is quick; formulas only)
# ---------------------------------------------------------------------------
LLAMA = dict(model_type="llama", vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
             num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=8192,
             tie_word_embeddings=False)
QWEN3 = dict(model_type="qwen3", vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=8192,
             tie_word_embeddings=True, attention_bias=False)
MIXTRAL = dict(model_type="mixtral", vocab_size=32000, hidden_size=512, intermediate_size=1024, num_hidden_layers=8,
               num_attention_heads=8, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2,
               max_position_embeddings=8192, tie_word_embeddings=False)
BASES = {"llama": LLAMA, "qwen3": QWEN3, "mixtral": MIXTRAL}


@functools.lru_cache(maxsize=None)
def cost_model(family: str) -> Any:
    return ndcost.resolve(dict(BASES[family]), census="off")


def outcome(call: Callable[[], Any]) -> Tuple[Any, BaseException | None]:
    """*call*'s result, or the refusal it raised (checked: an NdcostError of one line), under the hang guard."""
    try:
        with hang_guard():
            result = call()
    except NdcostError as exc:
        assert_refusal(exc)
        event(f"refused: {type(exc).__name__}")
        return None, exc
    except Exception as exc:  # a foreign exception fails the case, naming it
        raise AssertionError(f"foreign exception {type(exc).__module__}.{type(exc).__qualname__}: {exc}") from exc
    event("answered")
    return result, None


# ---------------------------------------------------------------------------
# hostile values
# ---------------------------------------------------------------------------
HUGE_INTS = [2 ** 20, 2 ** 31, 2 ** 53 + 1, 2 ** 62, 2 ** 63, 2 ** 64, 10 ** 30, 10 ** 400]
UNICODE = ["٨", "８", "2\u00a0", "\u200b4", "tp", "∞", "\x00", "é", "🙂", "1e3", "0x10", "1_000", " ", ""]
FLOAT_TEXT = ["1.5", "4.0", "nan", "NaN", "inf", "-inf", "1e309", "-0.0", "1e-320", "0.5"]
BOOL_TEXT = ["true", "false", "True", "yes", "no", "on", "off", "1", "0", "maybe"]

# plausible values a field takes (so that some strategies are valid and their figures are checked)
PLAUSIBLE: Dict[str, List[str]] = {
    "dp": ["1", "2", "4"], "fsdp": ["1", "2", "8"], "tp": ["1", "2", "4", "8"], "pp": ["1", "2", "4"],
    "vpp": ["1", "2"], "cp": ["1", "2"], "ep": ["1", "2", "4"], "etp": ["1", "2"], "zero": ["0", "1", "2", "3"],
    "sp": ["true", "false"], "cp_algo": ["ring", "ulysses"], "schedule": ["1f1b", "gpipe", "interleaved"],
    "micro_batch": ["1", "2", "4"], "num_micro_batches": ["1", "4", "8"], "seq": ["512", "1024", "4096"],
    "recompute": ["none", "full", "selective", "core_attention"], "recompute_layers": ["0", "2", "all"],
    "vocab_parallel": ["true", "false"], "optimizer": ["adamw", "sgd", "adam"],
    "param_dtype": ["bf16", "fp32"], "compute_dtype": ["bf16", "fp8"], "grad_dtype": ["fp32", "bf16"],
    "optimizer_dtype": ["fp32"], "master_dtype": ["fp32", "none"], "pp_layers": ["12/12", "6/6/6/6", "8/8"],
    "moe_imbalance": ["1.0", "1.5"], "allocator_overhead": ["0.0", "0.05"],
    "shard_mesh": ["dp_cp", "dp", "fsdp_cp"], "reshard_after_forward": ["true", "false"], "offload_optimizer": ["false", "true"],
    "offload_params": ["false", "true"], "offload_activations": ["false", "true"],
    "float8": ["none", "tensorwise", "rowwise", "rowwise_with_gw_hp"], "float8_all_gather": ["false", "true"],
    "float8_experts": ["false", "true"],
    "compile": ["false", "true"], "async_tp": ["false", "true"],
    "gradient_sync": ["auto", "every_micro_batch", "last_micro_batch"], "pp_engine": ["auto", "megatron", "torch"],
    "pp_return_outputs": ["false", "true"],
    "fsdp_engine": ["auto", "torch", "megatron"],
    "ddp_engine": ["auto", "torch", "torch_bucket_view", "megatron", "deepspeed"], "loss_engine": ["auto", "torch", "megatron", "compiled"], "cp_rotate": ["allgather", "p2p"],
    "ep_dispatcher": ["alltoall", "deepep"], "reduce_bucket_elements": ["0", "1000", "500000000"],
    "reduce_buckets": ["1", "2"], "reuse_distance_elements": ["0", "100000", "1000000000"],
    "live_parameters_elements": ["0", "100000", "1000000000"], "sub_group_elements": ["0", "100000", "1000000000"],
}
FIELDS = Strategy.field_names()
# the fields the bytes and seconds scale with: drawn more often
SIZES = ("seq", "micro_batch", "num_micro_batches", "dp", "fsdp", "tp", "pp", "vpp", "cp")

# hostile values no larger than 2 ** 16 (a count that large, from 2 ** 16 past int64, is its own class: the
# HUGE_INTS and huge_text)
hostile_text = st.one_of(
    st.integers(-(2 ** 16), 2 ** 16).map(str), st.sampled_from(FLOAT_TEXT + BOOL_TEXT + UNICODE),
    st.floats(-(2.0 ** 16), 2.0 ** 16).map(repr),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=",="), max_size=6))
huge_text = st.one_of(st.sampled_from(HUGE_INTS), st.integers(2 ** 16, 2 ** 80), st.floats(2.0 ** 16, 1e300)).map(str)


@st.composite
def strategy_texts(draw, hostile: st.SearchStrategy = hostile_text) -> str:
    """A plausible strategy (seq and a few fields), then zero to two fields given *hostile* values and maybe a
    syntax fault: an unknown key, an empty item, a field twice, an item without '=' or without a key."""
    fields: Dict[str, str] = {}
    if draw(st.integers(0, 9)):
        fields["seq"] = draw(st.sampled_from(PLAUSIBLE["seq"]))
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        fields[field] = draw(st.sampled_from(PLAUSIBLE[field]))
    for field in draw(st.lists(st.sampled_from(FIELDS + SIZES), max_size=2, unique=True)):
        fields[field] = draw(hostile)
    items = [f"{key}={value}" for key, value in fields.items()]
    fault = draw(st.sampled_from([None, None, None, "unknown", "empty", "twice", "bare", "keyless"]))
    if fault == "unknown":
        key = draw(st.one_of(st.sampled_from(["tpp", "TP", "seq_len", "__class__", "ᵗᵖ", " "]), st.text(max_size=4)))
        items.append(f"{key}={draw(hostile_text)}")
    elif fault == "empty":
        items.insert(draw(st.integers(0, len(items))), "")
    elif fault == "twice" and items:
        items.append(items[0])
    elif fault == "bare":
        items.append(draw(st.sampled_from(FIELDS)))
    elif fault == "keyless":
        items.append(f"={draw(hostile_text)}")
    return draw(st.sampled_from([",", ",", ", ", ",,"])).join(items)


@given(family=st.sampled_from(sorted(BASES)), text=strategy_texts())
@fuzz("strategy_string")
def test_strategy_string(family, text):
    """A strategy string either prices with every invariant kept, or is refused in one line."""
    cost, _ = outcome(lambda: cost_model(family).evaluate(text))
    if cost is not None:
        check_cost_dict(cost.to_dict())


@given(family=st.sampled_from(sorted(BASES)), text=strategy_texts(huge_text))
@example(family="llama", text="seq=4611686018427387904")  # 2 ** 62 tokens: bytes past int64
@example(family="llama", text="seq=4096,micro_batch=100000000000")
@example(family="llama", text="seq=4096,pp=4611686018427387904")  # the refusal's example split, 2 ** 62 long
@fuzz("strategy_string_huge")
def test_strategy_string_huge(family, text):
    """Strategy strings with huge integers (2 ** 16 and past int64): figures exact and non-negative, or refused."""
    cost, _ = outcome(lambda: cost_model(family).evaluate(text))
    if cost is not None:
        check_cost_dict(cost.to_dict())


@given(text=strategy_texts())
@fuzz("strategy_string_cli")
def test_strategy_string_cli(text):
    """``ndcost estimate --strategy TEXT --json``: strict JSON keeping the invariants, or exit 1 in one line."""
    answer = check_cli_answer(*run_cli(["estimate", "llama-3.1-8b", "--strategy", text, "--census", "off",
                                        "--json"]))
    if answer is not None:
        check_cost_dict(answer)


@given(first=strategy_texts(), second=strategy_texts())
@fuzz("strategy_string_compare")
def test_strategy_string_compare(first, second):
    """``ndcost compare --strategy A --strategy B --json``: a row each, its figures finite and non-negative (the
    exposed communication by group adding up to its total) or why it cannot run, or exit 1 in one line."""
    answer = check_cli_answer(*run_cli(["compare", "llama-3.1-8b", "--strategy", first, "--strategy", second,
                                        "--census", "off", "--json"]))
    if answer is None:
        return
    assert [row["label"] for row in answer] == ["1", "2"]
    for row in answer:
        if not row["valid"]:
            assert row["reason"] and not row["best"]
            continue
        assert isinstance(row["peak_bytes"], int) and row["peak_bytes"] > 0
        if row["step_seconds"] is not None:
            parts = [row[f"exposed_{group}_seconds"] for group in ("tp", "cp", "ep", "fsdp", "dp", "pp")]
            assert all(math.isfinite(p) and p >= 0 for p in parts)
            assert sum(parts) == pytest.approx(row["exposed_communication_seconds"], rel=1e-9, abs=1e-12)
    assert sum(row["best"] for row in answer) <= 1


# ---------------------------------------------------------------------------
# strategy columns
# ---------------------------------------------------------------------------
def _plausible_value(field: str, text: str) -> Any:
    """A plausible string value as a column holds it: ints as ints, flags as bools, the rest as text."""
    if text.isdigit():
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text) if "." in text else text
    except ValueError:
        return text


HOSTILE_CELLS = [None, math.nan, -1, 0, 1.5, True, "x", "", b"4", [2], {"a": 1}, "٨", object()]
hostile_cell = st.one_of(st.sampled_from(HOSTILE_CELLS), st.integers(-(2 ** 16), 2 ** 16),
                         st.floats(-(2.0 ** 16), 2.0 ** 16))
# from 2 ** 16 past int64's reach, or infinite: their own class
huge_cell = st.one_of(st.sampled_from([2 ** 62, 2 ** 63, 10 ** 30, -(2 ** 63), math.inf, -math.inf, 1e300]),
                      st.integers(2 ** 16, 2 ** 70), st.floats(2.0 ** 16, 1e300))


@st.composite
def columns_of(draw, hostile: st.SearchStrategy = hostile_cell) -> Tuple[Dict[str, Any], int]:
    """A mapping field -> column (lists, int/float/object arrays, scalars, ragged or 2-D ones; plausible cells or
    *hostile* ones; now and then an unknown field), with the rows it holds (one where every field is a scalar)."""
    n = draw(st.integers(0, 6))
    columns: Dict[str, Any] = {}
    if draw(st.integers(0, 4)):
        columns["seq"] = [draw(st.sampled_from([512, 1024, 4096])) for _ in range(n)]
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        plausible = [_plausible_value(field, t) for t in PLAUSIBLE[field]]
        cell = st.one_of(st.sampled_from(plausible), st.sampled_from(plausible), hostile)
        shape = draw(st.sampled_from(["list", "list", "int_array", "float_array", "object_array", "scalar",
                                      "ragged", "2d", "tuple"]))
        if shape == "scalar":
            columns[field] = draw(cell)
            continue
        length = n + draw(st.sampled_from([-1, 1])) if shape == "ragged" and n else n
        cells = [draw(cell) for _ in range(length)]
        if shape == "int_array":
            columns[field] = np.array([c if isinstance(c, int) and abs(c) < 2 ** 63 else 1 for c in cells],
                                      dtype=np.int64)
        elif shape == "float_array":
            columns[field] = np.array([float(c) if isinstance(c, (int, float)) and abs(c) < 1e308 else math.nan
                                       for c in cells], dtype=np.float64)
        elif shape == "object_array":
            array = np.empty(length, dtype=object)
            array[:] = cells
            columns[field] = array
        elif shape == "2d":
            columns[field] = np.ones((n, 2), dtype=np.int64)
        elif shape == "tuple":
            columns[field] = tuple(cells)
        else:
            columns[field] = cells
    if draw(st.integers(0, 9)) == 0:
        columns[draw(st.sampled_from(["tpp", "", "Seq", "x" * 40]))] = [1] * n
    lengths = {len(c) for f, c in columns.items() if _per_row(f, c)}
    # the rows: the per-row columns' one length, one where all are scalars (ragged columns must be refused)
    return columns, (lengths.pop() if len(lengths) == 1 else n) if lengths else 1


def _per_row(field: str, column: Any) -> bool:
    """Whether evaluate_many reads *column* as one value a row (ndcost.columns: a 1-D array, a list, a tuple but
    for pp_layers, whose tuple is one split) or as one value for every row."""
    if isinstance(column, np.ndarray):
        return column.ndim == 1
    return isinstance(column, list) or (isinstance(column, tuple) and field != "pp_layers")


def _row(columns: Dict[str, Any], i: int) -> Dict[str, Any]:
    """Row *i* of *columns* as Strategy.from_mapping takes it (a NaN in an unset-able int field is unset, as
    ndcost.columns documents: pandas' missing value)."""
    row = {}
    for field, column in columns.items():
        value = column[i] if _per_row(field, column) else column
        if isinstance(value, float) and math.isnan(value) and field in ("seq", "recompute_layers", "pp_layers"):
            value = None
        row[field] = value
    return row


def _check_columns(family: str, columns: Dict[str, Any], n: int) -> None:
    result, _ = outcome(lambda: cost_model(family).evaluate_many(columns))
    if result is None:
        return
    check_batch(result, n)
    for i in np.flatnonzero(result.valid):
        try:
            Strategy.from_mapping(_row(columns, i))
        except NdcostError as exc:
            raise AssertionError(f"row {i} is valid but Strategy refuses it: {exc}") from None


@given(family=st.sampled_from(sorted(BASES)), drawn=columns_of())
@fuzz("strategy_columns")
def test_strategy_columns(family, drawn):
    """evaluate_many over hostile columns: a BatchResult keeping the invariants, a row Strategy refuses never
    valid, or a one-line refusal of the whole batch (ragged, unknown field)."""
    _check_columns(family, *drawn)


@given(family=st.sampled_from(sorted(BASES)), drawn=columns_of(huge_cell))
@example(family="llama", drawn=({"seq": [2 ** 62, 4096], "micro_batch": [1, 10 ** 11]}, 2))
@example(family="llama", drawn=({"seq": [4096], "tp": [math.inf]}, 1))
@fuzz("strategy_columns_huge")
def test_strategy_columns_huge(family, drawn):
    """evaluate_many over columns holding huge or infinite numbers: as test_strategy_columns."""
    _check_columns(family, *drawn)


# ---------------------------------------------------------------------------
# model configs
# ---------------------------------------------------------------------------
INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "max_position_embeddings")
FAMILY_INT_FIELDS = {"qwen3": ("head_dim",), "mixtral": ("num_local_experts", "num_experts_per_tok"), "llama": ()}
FAMILY_BOOL_FIELDS = {"llama": ("tie_word_embeddings", "attention_bias", "mlp_bias"),
                      "qwen3": ("tie_word_embeddings", "attention_bias"), "mixtral": ("tie_word_embeddings",)}
# a value no count can be: any figure from it would be a wrong one
NOT_A_COUNT = ["256", "", 256.5, math.nan, math.inf, -math.inf, -1, 0, True, False, [256], {"n": 256}, "lots"]
# a value a count may be, or may be refused as: huge (exact, or refused), integral floats, null (the default)
COUNT_EDGE = [256.0, None, 2 ** 62, 2 ** 63, 10 ** 30, 10 ** 5, 1]
NOT_A_FLAG = ["no", "false", "yes", "true", "", 2, -1, [True], {"x": 1}, math.nan, 0.5]
FLAG_EDGE = [0, 1, None, True, False]
# fields the formulas do not read (Transformers does): garbage in them changes no figure under census="off"
LOOSE_EDGE = {
    "rope_scaling": ["garbage", 5, {"rope_type": 5}, {"rope_type": "yarn", "factor": "x"}, [1, 2], None],
    "rope_parameters": ["garbage", {"rope_theta": "hot"}, {"rope_type": None}],
    "pad_token_id": [10 ** 6, -5, "pad", 31999],
    "hidden_act": ["gelu", "nonsense", 5, None],
    "model_type": ["zz_unknown_type"],
}
HOSTILE_LOOSE = {
    "attention_dropout": ["high", [0.1], -0.5, 1.5, math.nan],
    "model_type": [5, ["llama"], {"t": 1}, "", None],
}


def _write_config(config: Dict[str, Any], folder: str) -> str:
    path = Path(folder) / "config.json"
    path.write_text(json.dumps(config))  # NaN and Infinity written as Python's json does (what it reads back)
    return str(path)


def _resolve_and_price(path: str) -> Any:
    model = ndcost.resolve(path, census="off")
    return model.evaluate("seq=128")


@st.composite
def hostile_configs(draw) -> Tuple[Dict[str, Any], str]:
    """A small config with one field made hostile beyond doubt (and maybe more fields at their edges)."""
    family = draw(st.sampled_from(sorted(BASES)))
    config = dict(BASES[family])
    kind = draw(st.sampled_from(["count", "count", "flag", "loose"]))
    if kind == "count":
        field = draw(st.sampled_from(INT_FIELDS + FAMILY_INT_FIELDS[family]))
        config[field] = draw(st.sampled_from(NOT_A_COUNT))
    elif kind == "flag":
        field = draw(st.sampled_from(FAMILY_BOOL_FIELDS[family]))
        config[field] = draw(st.sampled_from(NOT_A_FLAG))
    else:
        field = draw(st.sampled_from(sorted(HOSTILE_LOOSE)))
        config[field] = draw(st.sampled_from(HOSTILE_LOOSE[field]))
    return config, f"{field}={config[field]!r}"


@given(drawn=hostile_configs())
@fuzz("model_config_hostile")
def test_model_config_hostile(drawn):
    """A config.json with a value no Transformers config means (a string count, "no" as a flag) is refused."""
    config, what = drawn
    with tempfile.TemporaryDirectory() as folder:
        path = _write_config(config, folder)
        cost, refusal = outcome(lambda: _resolve_and_price(path))
    assert refusal is not None, f"{what} was priced: peak {cost.peak_bytes:,} bytes"


@st.composite
def edge_configs(draw) -> Dict[str, Any]:
    """A small config with fields at their edges: huge counts, integral floats, nulls, garbage where unread."""
    family = draw(st.sampled_from(sorted(BASES)))
    config = dict(BASES[family])
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["count", "flag", "loose"]))
        if kind == "count":
            config[draw(st.sampled_from(INT_FIELDS + FAMILY_INT_FIELDS[family]))] = draw(st.sampled_from(COUNT_EDGE))
        elif kind == "flag":
            config[draw(st.sampled_from(FAMILY_BOOL_FIELDS[family]))] = draw(st.sampled_from(FLAG_EDGE))
        else:
            field = draw(st.sampled_from(sorted(LOOSE_EDGE)))
            config[field] = draw(st.sampled_from(LOOSE_EDGE[field]))
    return config


@given(config=edge_configs())
@fuzz("model_config_range")
def test_model_config_range(config):
    """A config at its edges either prices with every invariant kept, or is refused in one line."""
    with tempfile.TemporaryDirectory() as folder:
        path = _write_config(config, folder)
        cost, _ = outcome(lambda: _resolve_and_price(path))
    if cost is not None:
        check_cost_dict(cost.to_dict())


@given(config=st.one_of(hostile_configs().map(lambda drawn: drawn[0]), edge_configs()))
@fuzz("model_config_cli")
def test_model_config_cli(config):
    """``ndcost params FILE --json`` on hostile and edge configs: exact non-negative counts, or exit 1 in one line."""
    with tempfile.TemporaryDirectory() as folder:
        answer = check_cli_answer(*run_cli(["params", _write_config(config, folder), "--json"]))
    if answer is not None:
        by_part = answer["by_part"]
        assert all(isinstance(v, int) and v >= 0 for v in by_part.values()), by_part
        assert answer["total"] == sum(by_part.values()) > 0


@pytest.mark.slow
@given(config=edge_configs())
@fuzz("model_config_census")
def test_model_config_census(config):
    """A handful of edge configs through the census (census="auto"): the invariants, or a one-line refusal."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    config = {**config, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024}
    config.pop("head_dim", None)
    with tempfile.TemporaryDirectory() as folder:
        path = _write_config(config, folder)
        cost, _ = outcome(lambda: ndcost.resolve(path, census="auto").evaluate("seq=64"))
    if cost is not None:
        check_cost_dict(cost.to_dict())


# ---------------------------------------------------------------------------
# hardware
# ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _h200() -> Dict[str, Any]:
    from importlib import resources
    return load_yaml((resources.files("ndcost.specs") / "hardware" / "h200.yaml").read_text())


NOT_POSITIVE = [0, -1, -1e12, math.nan, math.inf, -math.inf, "80GB", "high", "", None, [1], {"a": 1}, True]
HARDWARE_HOSTILE: Dict[str, List[Any]] = {
    "memory_bytes": NOT_POSITIVE + [1.5, "141e9"],
    "hbm_bytes_per_second": NOT_POSITIVE,
    "devices_per_node": NOT_POSITIVE + [8.5, "8"],
    "peak_flops_per_second": [{}, {"bf16": 0}, {"bf16": -1.0}, {"bf16": math.nan}, {"bf16": math.inf},
                              {"bf16": "high"}, {"bf16": None}, "high", None, [989e12], 5],
    "network": ["fast", 5, [1, 2], {"within_node": {"bytes_per_second": 0}},
                {"within_node": {"bytes_per_second": math.nan}}, {"within_node": {"bytes_per_second": "high"}},
                {"within_node": {"bytes_per_second": 4.5e11, "latency_seconds": -1.0}},
                {"within_node": {"bytes_per_second": 4.5e11, "latency_seconds": math.nan}},
                {"within_node": {"bytes_per_second": 4.5e11, "latency_seconds": math.inf}},
                {"within_node": {"bytes_per_second": 4.5e11, "bogus": 1}}, {"within_node": "fast"}],
    "efficiency": [{"matmul": 0}, {"matmul": -0.5}, {"matmul": 1.5}, {"matmul": math.nan}, {"matmul": "x"},
                   {"matmul": math.inf}, "high", [0.5], {"matmul": None}],
    "name": [5, None, "", ["h200"]],
    "host_to_device_bytes_per_second": [v for v in NOT_POSITIVE if v is not None],  # None: unstated
    "cpu_optimizer_parameters_per_second": NOT_POSITIVE,
    "bogus_field": [1],
}
# values a field may hold, or be refused as; any figure from them keeps the invariants
HARDWARE_EDGE: Dict[str, List[Any]] = {
    "memory_bytes": [80e9, 2 ** 62, 2 ** 70, 10 ** 30, 1],
    "hbm_bytes_per_second": [1e300, 1e-300, 1],
    "peak_flops_per_second": [{"bf16": 1e300}, {"bf16": 1e-300}, {"fp32": 67e12}, {"bf16": 1}],
    "network": [{}, {"within_node": {"bytes_per_second": 1e-300}}, {"across_nodes": {"bytes_per_second": 1e300}}],
    "efficiency": [{}, {"matmul": 1e-300}, {"matmul": 1.0}],
    "devices_per_node": [1, 2 ** 40],
    "host_to_device_bytes_per_second": [1e300, 1e-300, None],
    "cpu_optimizer_parameters_per_second": [1e300, 1e-300],
}


# Hardware's fields without a default: a spec leaving one out is refused
HARDWARE_NEEDED = ("name", "memory_bytes", "hbm_bytes_per_second", "peak_flops_per_second")


@st.composite
def hardware_mappings(draw, table: Dict[str, List[Any]]) -> Tuple[Dict[str, Any], str]:
    """h200's spec with one to three fields of *table* given its values (the hostile table: or a needed one left
    out); with what changed."""
    data = json.loads(json.dumps(_h200()))  # a deep copy
    changed = []
    for field in draw(st.lists(st.sampled_from(sorted(table)), min_size=1, max_size=3, unique=True)):
        if table is HARDWARE_HOSTILE and field in HARDWARE_NEEDED and draw(st.integers(0, 7)) == 0:
            del data[field]
            changed.append(f"no {field}")
            continue
        data[field] = value = draw(st.sampled_from(table[field]))
        changed.append(f"{field}={value!r}")
    return data, ", ".join(changed)


@given(family=st.sampled_from(sorted(BASES)), drawn=hardware_mappings(HARDWARE_HOSTILE),
       edge=hardware_mappings(HARDWARE_EDGE))
@fuzz("hardware_mapping")
def test_hardware_mapping(family, drawn, edge):
    """A hardware spec with a hostile field (0, negative, NaN, "80GB", "high", ...) is refused where it is read;
    one at its edges prices strategies with every invariant kept (MFU in (0, 1], times finite), or is refused."""
    data, what = drawn
    _, refusal = outcome(lambda: hardware_from_mapping(data))
    assert refusal is not None, f"hardware with {what} was read"
    data, what = edge
    hardware, _ = outcome(lambda: hardware_from_mapping(data))
    if hardware is None:
        return
    strategies = {"tp": [1, 2, 8, 1], "pp": [1, 2, 1, 1], "dp": [8, 2, 1, 1], "fsdp": [1, 1, 1, 8],
                  "seq": [4096, 1024, 512, 1024], "num_micro_batches": [1, 8, 4, 2],
                  **{f"offload_{what}": [False, False, False, True] for what in ("optimizer", "params", "activations")}}
    result, _ = outcome(lambda: cost_model(family).evaluate_many(strategies, hardware=hardware))
    if result is not None:
        check_batch(result, 4)


@given(drawn=st.one_of(hardware_mappings(HARDWARE_HOSTILE), hardware_mappings(HARDWARE_EDGE)))
@fuzz("hardware_yaml_cli")
def test_hardware_yaml_cli(drawn):
    """``ndcost estimate --hardware FILE.yaml --json``: the API's answer (a refusal exactly where it refuses), as
    strict JSON keeping the invariants, or exit 1 in one line."""
    data, what = drawn
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "hw.yaml"
        path.write_text(yaml.safe_dump(data))
        _, refusal = outcome(lambda: load_hardware_yaml(path))
        answer = check_cli_answer(*run_cli(["estimate", "llama-3.1-8b", "--hardware", str(path), "--census", "off",
                                            "--strategy", "tp=8,seq=4096", "--json"]))
    if refusal is not None:
        assert answer is None, f"the CLI read hardware with {what}, which load_hardware_yaml refuses: {refusal}"
    if answer is not None:
        check_cost_dict(answer)


# ---------------------------------------------------------------------------
# spec YAML
# ---------------------------------------------------------------------------
def _alias_bomb(levels: int, width: int) -> str:
    """A billion-laughs YAML of *levels* levels of *width* aliases (width ** levels leaves if expanded); small here."""
    lines = ["a0: &a0 [x]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nname: bomb\nconfig: {{model_type: llama, layer_types: *a{levels}}}\n"


RAW_SPECS = [
    "", "---\n", "[1, 2]\n", "just text\n", "config: 5\n", "config: [1]\n", "name: x\n", "config: {}\n",
    "config: {model_type: }\n", "!!python/object/apply:os.system ['true']\n", "config: !!binary aGVsbG8=\n",
    "a: 1\na: 2\nconfig: {model_type: llama}\n", "config:\n\t model_type: llama\n", "--- 1\n--- 2\n",
    "config: {model_type: llama, hidden_size: .nan}\n", "config: {model_type: llama, hidden_size: .inf}\n",
    "config: {model_type: llama, hidden_size: 0x100}\n", "config: {model_type: llama, hidden_size: 1_024}\n",
    "config: {model_type: llama, num_hidden_layers: 2019-01-01}\n", "config: &c {model_type: llama, x: *c}\n",
    "config: {model_type: llama, tie_word_embeddings: no}\n", "config: {? [1, 2] : 3, model_type: llama}\n",
    _alias_bomb(4, 5),
]
PUBLISHED_TOTAL = ["lots", -1, 1.5, 0, 1e30, math.nan, True, [1], {"a": 1}, "8b", 2 ** 70, 8030261248, None]
SPEC_NAME = ["llama-x", 5, None, "", ["x"], {"a": 1}, "../../etc/passwd", "x" * 300]


@st.composite
def spec_texts(draw) -> str:
    if draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(RAW_SPECS))
    family = draw(st.sampled_from(sorted(BASES)))
    config: Any = dict(BASES[family])
    if draw(st.booleans()):
        config[draw(st.sampled_from(INT_FIELDS))] = draw(st.sampled_from(NOT_A_COUNT + COUNT_EDGE))
    if draw(st.integers(0, 5)) == 0:
        config = draw(st.sampled_from([None, "llama", [config], 5]))
    data: Dict[str, Any] = {"name": draw(st.sampled_from(SPEC_NAME)), "config": config}
    if draw(st.booleans()):
        data["published_total"] = draw(st.sampled_from(PUBLISHED_TOTAL))
    if draw(st.integers(0, 4)) == 0:
        data[draw(st.sampled_from(["description", "bogus", "layers"]))] = draw(st.sampled_from([5, None, "x", [1]]))
    return yaml.safe_dump(data)


@given(text=spec_texts())
@fuzz("spec_yaml")
def test_spec_yaml(text):
    """A model spec YAML: exact parameter counts and a priced strategy keeping the invariants, or a one-line
    refusal; through ``ndcost params FILE --json`` the same answer."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.yaml"
        path.write_text(text)
        _, refusal = outcome(lambda: models.parameters(models.load_model(str(path))))
        cost, _ = outcome(lambda: _resolve_and_price(str(path)))
        answer = check_cli_answer(*run_cli(["params", str(path), "--json"]))
    if cost is not None:
        check_cost_dict(cost.to_dict())
    assert (answer is None) == (refusal is not None), f"`ndcost params` and ndcost.models differ: {refusal}"
    if answer is not None:
        assert answer["total"] == sum(answer["by_part"].values()) > 0
        published = answer["published_total"]
        assert published is None or (isinstance(published, int) and published > 0), published


def test_readme_states_the_counts():
    """README.md's Reliability section states each property's max_examples, and the corpus' file count."""
    import re
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme[readme.index("## Reliability"):]
    stated = {name: int(count) for name, count in re.findall(r"^\| `test_(\w+)` \| (\d+) \|", section, flags=re.M)}
    assert stated == EXAMPLES
    corpus = [p for p in (Path(__file__).parent / "data" / "hostile").iterdir() if p.name != "README.md"]
    assert f"the {len(corpus)} files of `tests/data/hostile/`" in " ".join(section.split())
