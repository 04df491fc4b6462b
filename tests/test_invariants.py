"""Never a wrong figure, never a traceback: strategies that cannot run, overflow, result invariants, strict JSON.

Each hostile input is refused by its cause, with the value and the fix; every valid row of a grid keeps the
identities a reader can check by hand (categories sum to a stage's peak, the peak is the largest stage, the
step is its parts, the layers placed are the model's).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import ndcost
from ndcost import Strategy, invariants
from ndcost.cli import main
from ndcost.compose.placement import LayerStack
from ndcost.errors import InvalidStrategy, InvalidValue, NdcostError

SEQ = 4096


@pytest.fixture(scope="module")
def llama():
    return ndcost.resolve("llama-3.1-8b", census="off")  # 32 layers, 32 query heads, 8 KV heads


@pytest.fixture(scope="module")
def moe():
    return ndcost.resolve("qwen3-30b-a3b", census="off")


# ---------------------------------------------------------------------------
# integers within bounds: refused with the bound, never wrapped in int64
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("text,field", [("micro_batch=2147483648,seq=4096", "micro_batch"),
                                        ("dp=9223372036854775808,seq=4096", "dp"),
                                        ("seq=100000000000000000000", "seq")])
def test_an_integer_past_the_bound_is_refused_naming_it(llama, text, field):
    with pytest.raises(InvalidValue) as err:
        Strategy.parse(text)
    assert f"Strategy.{field}" in str(err.value) and "2,147,483,647" in str(err.value)
    value = int(text.split(",")[0].split("=")[1])
    columns = [[value]] + ([np.array([value], dtype=np.uint64)] if value < 2 ** 64 else [])
    for column in columns:  # the batch path: that row, with the same words
        batch = llama.evaluate_many({field: column, "seq": SEQ} if field != "seq" else {"seq": column})
        assert not batch.valid[0] and "2,147,483,647" in batch.reason[0] and batch.peak_bytes[0] == 0


def test_devices_past_the_bound_are_refused(llama):
    # 65536 * 65536 = 2**32 devices: each field within bound, their product not
    with pytest.raises(InvalidValue, match=r"dp \* fsdp \* cp \* tp \* pp = 65536 \* 1 \* 1 \* 65536 \* 1"):
        Strategy(dp=65536, tp=65536, seq=SEQ)
    batch = llama.evaluate_many({"dp": [65536, 2], "tp": [65536, 2], "seq": SEQ})
    assert list(batch.valid) == [False, True] and "2**31 - 1" in batch.reason[0]


@pytest.mark.parametrize("model,text", [
    ("llama-3.1-8b", "micro_batch=1000000000,seq=1000000000"),  # 10**18 tokens a micro-batch
    ("qwen3-30b-a3b", "micro_batch=1000000,seq=1000000,ep=2,dp=2"),  # 10**12 tokens' routed copies
])
def test_bytes_past_2_53_are_refused_never_wrapped(model, text):
    cost_model = ndcost.resolve(model, census="off")
    with pytest.raises(InvalidStrategy, match=r"pass 9,007,199,254,740,992 \(2\*\*53\)"):
        cost_model.evaluate(text)
    batch = cost_model.evaluate_many([text, "seq=4096"])
    assert list(batch.valid) == [False, True]
    assert batch.peak_bytes[0] == 0 and (batch.stage_bytes >= 0).all() and batch.peak_bytes[1] > 0


def test_a_model_past_2_53_parameters_is_refused():
    config = dict(ndcost.models.load_model("llama-3.1-8b").hf_config, hidden_size=10 ** 30, head_dim=128,
                  _name_or_path="wide")
    with pytest.raises(InvalidValue, match=r"parameters, past 9,007,199,254,740,992 \(2\*\*53\)"):
        ndcost.resolve(config, census="off")


# ---------------------------------------------------------------------------
# strategies the composition cannot run
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("text,words", [
    # 32 query heads a TP rank at tp=1: cp=64 and cp=3 do not divide them
    ("cp=64,cp_algo=ulysses,seq=4096", "cp=64 does not divide the 32 query heads a TP rank holds"),
    ("cp=3,cp_algo=ulysses,seq=4095", "cp=3 does not divide the 32 query heads"),
    # 8 KV heads: cp=16 divides the 32 query heads but not them
    ("cp=16,cp_algo=ulysses,seq=4096", "cp=16 does not divide the 8 key/value heads"),
    # tp=8: one KV head a TP rank (8 / 8), which cp=2 cannot split
    ("tp=8,cp=2,cp_algo=ulysses,seq=4096", "cp=2 does not divide the 1 key/value heads"),
    # ring: 4100 tokens divide by cp=4 but not into 2 * 4 = 8 chunks
    ("cp=4,seq=4100", "seq=4100 is not a multiple of 2 * cp = 8"),
    ("recompute=full,recompute_layers=1000,seq=4096", "recompute_layers=1000 exceeds the 32 layers"),
    # pp=4 on 32 layers: 8 layers a stage
    ("pp=4,num_micro_batches=4,recompute=full,recompute_layers=9,seq=4096", "recompute_layers=9 exceeds the 8"),
    ("pp=4,pp_layers=4/12/8/8,num_micro_batches=4,recompute=full,recompute_layers=13,seq=4096",
     "recompute_layers=13 exceeds the 12"),
])
def test_a_strategy_that_cannot_run_is_refused_with_its_numbers(llama, text, words):
    with pytest.raises(InvalidStrategy, match=words.replace("*", r"\*")):
        llama.evaluate(text)
    batch = llama.evaluate_many([text])
    assert not batch.valid[0] and words in batch.reason[0]


@pytest.mark.parametrize("text", [
    "cp=8,cp_algo=ulysses,seq=4096",           # 32 / 8 query heads, 8 / 8 KV heads
    "tp=2,cp=4,cp_algo=ulysses,seq=4096",      # 16 / 4 query heads, 4 / 4 KV heads
    "cp=4,seq=4104",                           # 4104 = 8 * 513
    "recompute=full,recompute_layers=32,seq=4096",
    "pp=4,num_micro_batches=4,recompute=full,recompute_layers=8,seq=4096",
    "pp=4,pp_layers=4/12/8/8,num_micro_batches=4,recompute=full,recompute_layers=12,seq=4096",
])
def test_the_strategies_at_the_bounds_run(llama, text):
    assert llama.evaluate(text).peak_bytes > 0


@pytest.mark.parametrize("split,words", [("32/0", "at least one layer"), ([True, 31], "True is not a layer count"),
                                         ((16.5, 15.5), "16.5 is not a layer count"), ("40/-8", "got -8")])
def test_pp_layers_are_positive_integer_counts(llama, split, words):
    with pytest.raises(InvalidValue, match=words):
        Strategy(pp=2, pp_layers=split, seq=SEQ)
    batch = llama.evaluate_many({"pp": 2, "pp_layers": [split, "16/16"], "seq": SEQ})
    assert list(batch.valid) == [False, True] and words in batch.reason[0]


# ---------------------------------------------------------------------------
# what evaluate_many takes
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("given,words", [("tp=2,seq=4096", "Strategy.parse"), (None, "NoneType"), (5, "int 5"),
                                         ({"tp": [1, 2], "seq": [SEQ]}, "different lengths"),
                                         ({"tp": np.ones((2, 2), dtype=int), "seq": SEQ}, "shape (2, 2)")])
def test_a_batch_that_is_not_one_is_refused_whole(llama, given, words):
    with pytest.raises(NdcostError, match=words.replace("(", r"\(").replace(")", r"\)")):
        llama.evaluate_many(given)


def test_from_mapping_of_a_non_mapping_says_what_it_takes():
    with pytest.raises(InvalidValue, match="for a string use Strategy.parse"):
        Strategy.from_mapping("tp=2")
    with pytest.raises(InvalidValue, match="expects a mapping"):
        Strategy.from_mapping([("tp", 2)])


def test_non_numeric_entries_refuse_their_rows(llama):
    batch = llama.evaluate_many({"tp": ["a", 2, None], "seq": SEQ})
    assert list(batch.valid) == [False, True, False]
    assert "Strategy.tp: expected an integer, got 'a'" in batch.reason[0]
    rows = llama.evaluate_many([5, "tp=2,seq=4096"])
    assert list(rows.valid) == [False, True] and "expects a mapping" in rows.reason[0]


# ---------------------------------------------------------------------------
# no loop over layers: runs of one kind, whatever the layer count
# ---------------------------------------------------------------------------
def test_layer_stack_counts_what_a_layer_by_layer_walk_counts():
    runs = [("a", 3), ("b", 1), ("a", 2), ("c", 4), ("b", 2)]
    order = [kind for kind, count in runs for _ in range(count)]
    stack = LayerStack.from_runs(("a", "b", "c"), runs)
    n = np.arange(len(order) + 1)
    walked = np.array([[sum(1 for kind in order[:i] if kind == k) for i in n] for k in "abc"])
    assert np.array_equal(stack.before(n), walked)
    assert np.array_equal(stack.before(n[:12].reshape(3, 4)), walked[:, :12].reshape(3, 3, 4))
    assert stack.num_layers == 12 and list(stack.counts) == [5, 3, 4]


def test_the_deepest_model_accepted_is_priced_as_linearly_as_it_stacks():
    deepest = ndcost.models.MAX_LAYERS  # 100,000: deeper configs are refused when loaded (test_validation)
    config = dict(ndcost.models.load_model("llama-3.1-8b").hf_config)
    costs, models = {}, {}
    for layers in (32, deepest):
        models[layers] = ndcost.resolve(dict(config, num_hidden_layers=layers, _name_or_path=f"l{layers}"),
                                        census="off")
        costs[layers] = models[layers].evaluate(f"pp=16,num_micro_batches=16,recompute=full,seq={SEQ}")
    deep, counts = costs[deepest], models[deepest].parameters
    # stage 0: the embedding and a 16th of the layers in bf16, 2 bytes each (no sharding, no autocast copies)
    per_layer = counts.kind_total("dense")
    assert deep.stages[0].bytes_by_category["parameters"] == 2 * (counts.embedding + deepest // 16 * per_layer)
    assert sum(stage.layers for stage in deep.stages) == deepest
    # the model FLOPs grow by the layers added
    work = {n: models[n].model_work(SEQ) for n in models}
    flops = {n: float(work[n].forward_flops_per_sequence(SEQ)) for n in work}
    one_layer = float(work[32].work["dense"].forward_flops(SEQ))
    assert flops[deepest] - flops[32] == pytest.approx((deepest - 32) * one_layer, rel=1e-9)


# ---------------------------------------------------------------------------
# the invariants over a grid of strategies on shipped models
# ---------------------------------------------------------------------------
def _grid(n: int, moe: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    pp = rng.choice([1, 2, 4], n)
    interleaved = (pp > 1) & (rng.random(n) < 0.3)
    cols = {"tp": rng.choice([1, 2, 4], n), "pp": pp, "vpp": np.where(interleaved, 2, 1),
            "schedule": np.where(interleaved, "interleaved", "1f1b"), "dp": rng.choice([1, 2, 4], n),
            "zero": rng.choice([0, 1, 2, 3], n), "cp": rng.choice([1, 2], n),
            "cp_algo": rng.choice(["ring", "ulysses"], n), "sp": rng.random(n) < 0.5,
            "seq": rng.choice([2048, 4096], n), "micro_batch": rng.choice([1, 2], n),
            "num_micro_batches": rng.choice([1, 4, 8], n),
            "recompute": rng.choice(["none", "full", "selective", "core_attention"], n),
            "master_dtype": rng.choice(["none", "fp32"], n), "vocab_parallel": rng.random(n) < 0.5,
            "allocator_overhead": np.where(rng.random(n) < 0.2, 0.05, 0.0)}
    if moe:
        cols["ep"] = rng.choice([1, 2, 4], n)
        cols["moe_imbalance"] = rng.choice([1.0, 1.25], n)
    return cols


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "qwen3-next-80b-a3b",
                                  "gpt-oss-20b"])
def test_every_valid_row_keeps_the_identities(name):
    model = ndcost.resolve(name, census="off")
    spec = model.spec
    cols = _grid(200, bool(spec.num_experts))
    batch = model.evaluate_many(cols)
    valid = batch.valid
    assert valid.sum() >= 20, batch.reason[~valid][:5]
    sb, sp = batch.stage_bytes[valid], batch.stage_peak_bytes[valid]
    assert (sb >= 0).all() and np.array_equal(sb.sum(axis=2), sp)
    assert np.array_equal(batch.peak_bytes[valid], sp.max(axis=1))
    stages = batch.num_stages[valid]
    past = np.arange(sp.shape[1])[None, :] >= stages[:, None]
    assert not sp[past].any() and not sb[past].any()
    # the layers placed: every stack layer once, each kind as often as the model stacks it
    kinds = batch.kinds
    stacked = np.array([sum(g.count for g in spec.layers if g.kind == k and not g.mtp) for k in kinds])
    assert (batch.stage_kind_layers[valid].sum(axis=1) == stacked).all()
    # time: finite, the step its parts, tokens the global batch's
    t = {k: np.asarray(v)[valid] for k, v in batch.time.items() if k != "provenance"}
    assert all(np.isfinite(v).all() for v in t.values())
    assert (t["step_seconds"] > 0).all() and ((t["mfu"] > 0) & (t["mfu"] <= 1)).all()
    np.testing.assert_allclose(t["step_seconds"], t["compute_seconds"] + t["exposed_communication_seconds"]
                               + t["bubble_seconds"] + t["optimizer_seconds"], rtol=1e-12)
    # what the step waits on is communication it spends (the pipeline's fill and drain sends included)
    assert (t["exposed_communication_seconds"] <= t["communication_seconds"] * (1 + 1e-12)).all()
    c = {k: np.asarray(v)[valid] for k, v in cols.items()}
    tokens = c["dp"] * c["num_micro_batches"] * c["micro_batch"] * c["seq"]
    np.testing.assert_allclose(t["tokens_per_second"] * t["step_seconds"], tokens, rtol=1e-12)
    # invalid rows hold nothing
    assert not batch.peak_bytes[~valid].any() and np.isnan(batch.time["step_seconds"][~valid]).all()


# ---------------------------------------------------------------------------
# a row that would break an invariant is made invalid, never returned as valid
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("corrupt,words", [
    (lambda r: r.stage_bytes.__setitem__((1, 0, 0), r.stage_bytes[1, 0, 0] + 1), "categories sum to"),
    (lambda r: r.stage_bytes.__setitem__((1, 0, 4), -5), "(negative)"),
    (lambda r: r.peak_bytes.__setitem__(1, r.peak_bytes[1] + 1), "is not the most a stage holds"),
    (lambda r: r.time["mfu"].__setitem__(1, 1.5), "mfu = 1.5"),
    (lambda r: r.time["bubble_seconds"].__setitem__(1, np.inf), "bubble_seconds = inf"),
])
def test_enforce_makes_a_breaking_row_invalid_with_its_reason(llama, corrupt, words):
    result = llama.evaluate_many(["seq=4096", "tp=2,seq=4096", "pp=2,num_micro_batches=4,seq=4096"])
    kept = result.peak_bytes[[0, 2]].copy()
    corrupt(result)
    checked = invariants.enforce(result)
    assert list(checked.valid) == [True, False, True] and not checked.fits[1]
    assert "internal invariant broken" in checked.reason[1] and words in checked.reason[1]
    assert checked.peak_bytes[1] == 0 and not checked.stage_bytes[1].any()
    assert np.isnan(checked.time["step_seconds"][1]) and np.array_equal(checked.peak_bytes[[0, 2]], kept)


# ---------------------------------------------------------------------------
# the command line: one line, exit 1; strict JSON
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["micro_batch=2147483648,seq=4096", "micro_batch=1000000000,seq=1000000000",
                                      "dp=9223372036854775808,seq=4096", "cp=64,cp_algo=ulysses,seq=4096",
                                      "pp=2,pp_layers=32/0,seq=4096"])
def test_hostile_strategies_exit_1_with_one_line(capsys, strategy):
    assert main(["estimate", "llama-3.1-8b", "--census", "off", "--json", "--strategy", strategy]) == 1
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert json.loads(out)["error"]["message"] in err  # --json: the refusal's one document


def _refuse_constant(name):
    raise AssertionError(f"non-standard JSON constant {name}")


def test_json_is_strict(capsys, monkeypatch):
    assert main(["estimate", "llama-3.1-8b", "--census", "off", "--json", "--strategy", "tp=2,seq=4096"]) == 0
    data = json.loads(capsys.readouterr().out, parse_constant=_refuse_constant)
    assert 0 < data["time"]["mfu"] <= 1
    # a non-finite figure reaching the dump is refused in one line, never written as NaN
    from ndcost.cli import Output
    from ndcost.commands import params
    monkeypatch.setattr(params, "run", lambda args: Output(data={"x": [1.0, float("nan")]}, text=""))
    assert main(["params", "llama-3.1-8b", "--json"]) == 1
    out, err = capsys.readouterr()
    assert "non-finite number at x.1" in err and len(err.strip().splitlines()) == 1
    assert "non-finite number at x.1" in json.loads(out, parse_constant=_refuse_constant)["error"]["message"]


def test_a_compute_dtype_the_hardware_has_no_peak_for_refuses_its_row_only():
    model = ndcost.resolve("llama-3.1-8b", census="off")
    result = model.evaluate_many({"seq": [SEQ, SEQ], "compute_dtype": ["bf16", "int8"]})
    assert result.valid.tolist() == [True, False]
    assert "compute_dtype=int8" in result.reason[1] and "states no peak" in result.reason[1]
    assert np.isfinite(result.time["step_seconds"][0]) and np.isnan(result.time["step_seconds"][1])
    with pytest.raises(ndcost.errors.InvalidStrategy, match="int8"):
        model.evaluate(f"seq={SEQ},compute_dtype=int8")


def test_routed_bytes_the_op_records_cannot_state_refuse_the_rows_never_price_them_as_dense(monkeypatch):
    from ndcost.resolver import _estimator

    formulas = _estimator("activations", "op_records")

    def broken(self, spec, kind, seq, runtime=None):
        raise KeyError("routed")   # e.g. a third-party op record that merged but cannot be evaluated

    monkeypatch.setattr(type(formulas), "routed_bytes", broken)  # a frozen estimator: patch its class
    result = ndcost.resolve("mixtral-8x7b", census="off").evaluate_many({"seq": [SEQ], "ep": [8], "dp": [8]})
    assert not result.valid[0]
    assert "routed experts' bytes of MoE kind" in result.reason[0] and "KeyError" in result.reason[0]


# ---------------------------------------------------------------------------
# more work never takes less time; the busiest expert rank never gets more than every routed token
# ---------------------------------------------------------------------------
def _with(cols, **changed):
    return {**cols, **{k: np.full(len(cols["tp"]), v) if np.ndim(v) == 0 else v for k, v in changed.items()}}


def _fsdp_grid(n: int, moe: bool, seed: int):
    """:func:`_grid` with FSDP on a quarter of its rows (ZeRO off there), as FSDP2 shards over fsdp ranks."""
    cols = _grid(n, moe, seed)
    rng = np.random.default_rng(seed + 1)
    fsdp = np.where(rng.random(n) < 0.25, rng.choice([2, 4, 8], n), 1)
    return {**cols, "fsdp": fsdp, "zero": np.where(fsdp > 1, 0, cols["zero"])}


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "qwen3-next-80b-a3b",
                                  "gpt-oss-20b"])
@pytest.mark.parametrize("field", ["micro_batch", "seq", "num_micro_batches"])
def test_more_tokens_never_take_less_time(name, field):
    # twice the tokens a micro-batch (or twice the micro-batches) on the same devices: every kernel, collective
    # and host launch runs as long or longer, and what overlaps hides at most the time it runs beside
    model = ndcost.resolve(name, census="off")
    cols = _fsdp_grid(300, bool(model.spec.num_experts), seed=7)
    one = model.evaluate_many(cols)
    two = model.evaluate_many(_with(cols, **{field: 2 * np.asarray(cols[field])}))
    both = one.valid & two.valid
    assert both.sum() >= 20
    before, after = one.time["step_seconds"][both], two.time["step_seconds"][both]
    worse = np.flatnonzero(after < before * (1 - 1e-12))
    rows = np.flatnonzero(both)[worse[:3]]
    assert not len(worse), [({k: np.asarray(v)[i].item() for k, v in cols.items()}, one.time["step_seconds"][i],
                             two.time["step_seconds"][i]) for i in rows]


def test_a_selective_checkpoints_host_work_hides_fsdp_gathers():
    # Qwen3-30B-A3B's eager layers at one micro-batch of 8,192 tokens are bound by the host's launches; under
    # selective checkpointing the forward's dispatch mode makes its host work 3.67 plain forwards'
    # (compose/time.py CHECKPOINT_HOST_RATIOS). FSDP's prefetched gathers run beside that forward as it runs:
    # twice the tokens (a longer GPU roofline, the same host work) cannot shorten the step
    model = ndcost.resolve("qwen3-30b-a3b", census="off")
    base = "tp=2,dp=8,fsdp=8,sp=true,seq=8192,num_micro_batches=4,recompute=selective"
    one, two = (model.evaluate(f"{base},micro_batch={b}").time for b in (1, 2))
    assert two.step_seconds >= one.step_seconds
    assert two.compute_seconds >= one.compute_seconds


@pytest.mark.parametrize("text", ["seq=4096,dp=2", "seq=4096,dp=2,tp=2,sp=true,recompute=full"])
def test_moe_imbalance_has_no_effect_without_expert_parallelism(moe, text):
    # one expert rank processes every routed token: the busiest rank's share is the balanced one
    plain, skewed = moe.evaluate(text), moe.evaluate(f"{text},moe_imbalance=1.5")
    assert skewed.peak_bytes == plain.peak_bytes and skewed.time.step_seconds == plain.time.step_seconds


def test_moe_imbalance_is_priced_at_most_ep(moe):
    # of ep=2 ranks the busiest gets at most every routed token, twice the balanced share
    at_ep = moe.evaluate("seq=4096,dp=2,ep=2,moe_imbalance=2")
    beyond = moe.evaluate("seq=4096,dp=2,ep=2,moe_imbalance=1e308")
    assert beyond.peak_bytes == at_ep.peak_bytes and beyond.time.step_seconds == at_ep.time.step_seconds
    balanced = moe.evaluate("seq=4096,dp=2,ep=2")
    assert at_ep.peak_bytes > balanced.peak_bytes and at_ep.time.step_seconds > balanced.time.step_seconds


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3"])
@pytest.mark.parametrize("field,values,idle", [
    ("sp", (False, True), lambda c: c["tp"] == 1),                                  # nothing to split at tp=1
    ("vocab_parallel", (False, True), lambda c: c["tp"] == 1),
    ("cp_algo", ("ring", "ulysses"), lambda c: c["cp"] == 1),                       # no context to exchange
    ("ep_dispatcher", ("alltoall", "deepep"), lambda c: c.get("ep", np.ones(1)) == 1),  # nothing dispatched
    ("reshard_after_forward", (True, False), lambda c: (c["fsdp"] == 1) & (c["zero"] < 3)),  # nothing gathered
    # FSDP: no DDP replicas, no ZeRO or FP16 optimizer (DeepSpeed's step runs even on one replica)
    ("ddp_engine", ("torch", "deepspeed"), lambda c: c["fsdp"] > 1),
])
def test_a_field_without_its_parallelism_changes_nothing(name, field, values, idle):
    model = ndcost.resolve(name, census="off")
    cols = _fsdp_grid(300, bool(model.spec.num_experts), seed=3)
    first, second = (model.evaluate_many(_with(cols, **{field: v})) for v in values)
    rows = idle({k: np.asarray(v) for k, v in cols.items()}) & first.valid
    assert rows.sum() >= 10
    assert np.array_equal(second.valid[rows], first.valid[rows])
    assert np.array_equal(second.peak_bytes[rows], first.peak_bytes[rows])
    assert np.array_equal(second.time["step_seconds"][rows], first.time["step_seconds"][rows])


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "gpt-oss-20b"])
@pytest.mark.parametrize("field,fixed", [
    ("tp", {"sp": True, "vocab_parallel": True}),                   # every split part and activation halves
    ("pp", {"vpp": 1, "schedule": "1f1b", "num_micro_batches": 16}),  # half the layers, the same layer-batches
])
def test_more_model_parallel_ranks_never_hold_more(name, field, fixed):
    model = ndcost.resolve(name, census="off")
    cols = {**_fsdp_grid(300, bool(model.spec.num_experts), seed=83), **{k: np.full(300, v) for k, v in fixed.items()}}
    one = model.evaluate_many(cols)
    two = model.evaluate_many(_with(cols, **{field: 2 * np.asarray(cols[field])}))
    both = one.valid & two.valid
    assert both.sum() >= 50
    more = both & (two.peak_bytes > one.peak_bytes)
    assert not more.any(), [{k: np.asarray(v)[i].item() for k, v in cols.items()} for i in np.flatnonzero(more)[:3]]


def _faster(hardware, part):
    """*hardware* with twice the bandwidth of its links (every network level) or of its memory."""
    import attrs
    if part == "network":
        return attrs.evolve(hardware, network=tuple(attrs.evolve(level, bytes_per_second=2 * level.bytes_per_second)
                                                    for level in hardware.network))
    return attrs.evolve(hardware, hbm_bytes_per_second=2 * hardware.hbm_bytes_per_second)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3"])
@pytest.mark.parametrize("part", ["network", "memory"])
def test_faster_links_or_memory_never_take_longer(name, part):
    # every collective and every memory-bound kernel runs as fast or faster, and what overlaps hides at most what
    # it hid before (across nodes too: four times the grid's data-parallel ranks)
    from ndcost.manager import registry
    model = ndcost.resolve(name, census="off")
    cols = _fsdp_grid(300, bool(model.spec.num_experts), seed=61)
    cols = _with(cols, dp=4 * np.asarray(cols["dp"]))
    h200 = registry().get("hardware/h200")
    base, fast = model.evaluate_many(cols, hardware=h200), model.evaluate_many(cols, hardware=_faster(h200, part))
    both = base.valid & fast.valid
    assert both.sum() >= 50
    slower = both & (fast.time["step_seconds"] > base.time["step_seconds"] * (1 + 1e-12))
    assert not slower.any(), [{k: np.asarray(v)[i].item() for k, v in cols.items()} for i in np.flatnonzero(slower)[:3]]


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "gpt-oss-20b"])
def test_gpipe_holds_no_less_than_1f1b(name):
    # GPipe runs every forward before any backward: each stage holds every micro-batch, where 1F1B holds
    # min(pp - stage, m) of them, and runs its later backwards holding every gradient as 1F1B does
    model = ndcost.resolve(name, census="off")
    cols = {**_fsdp_grid(300, bool(model.spec.num_experts), seed=5), "vpp": 1}
    one_f_one_b, gpipe = (model.evaluate_many(_with(cols, schedule=s)) for s in ("1f1b", "gpipe"))
    rows = one_f_one_b.valid & gpipe.valid & (np.asarray(cols["pp"]) > 1)
    assert rows.sum() >= 20
    assert (gpipe.peak_bytes[rows] >= one_f_one_b.peak_bytes[rows]).all()


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "mistral-7b-v0.1", "gpt-oss-20b"])
def test_deepspeeds_bucket_and_reuse_distance_never_hold_less(name):
    # over ZeRO 1-3 without a pipeline (DeepSpeed's): a bucket adds at most its bytes (in param_dtype, bf16 here,
    # and the allocator_overhead on them), and at ZeRO 1 and 3 never less; a longer reuse distance keeps at least
    # the modules a shorter one keeps, and so does a larger live bound under prefetching
    model = ndcost.resolve(name, census="off")
    cols = _grid(300, bool(model.spec.num_experts), seed=11)
    cols = {**cols, "pp": np.ones(300, dtype=np.int64), "vpp": np.ones(300, dtype=np.int64),
            "schedule": np.full(300, "1f1b"), "zero": np.random.default_rng(12).choice([1, 2, 3], 300)}
    plain = model.evaluate_many(cols)
    buckets = np.where(cols["zero"] == 3, 1, np.random.default_rng(13).choice([1, 2], 300))
    bucket = model.evaluate_many(_with(cols, reduce_bucket_elements=np.full(300, 10 ** 8), reduce_buckets=buckets))
    both = plain.valid & bucket.valid
    assert both.sum() >= 50
    added = bucket.peak_bytes[both] - plain.peak_bytes[both]
    overhead = 1 + np.asarray(cols["allocator_overhead"])[both]  # the allocator category grows with it
    assert (added <= np.ceil(2 * 10 ** 8 * buckets[both] * overhead)).all()
    # at ZeRO-2 it holds the gradients waiting for their reduce-scatter in place of a layer's: it may hold less
    assert (added[np.asarray(cols["zero"])[both] != 2] >= 0).all()
    zero3 = np.asarray(cols["zero"]) == 3
    near, far = (model.evaluate_many(_with(cols, reuse_distance_elements=np.full(300, d))) for d in (10 ** 8, 10 ** 9))
    kept = plain.valid & near.valid & far.valid & zero3
    assert kept.sum() >= 20
    assert (near.peak_bytes[kept] >= plain.peak_bytes[kept]).all()
    assert (far.peak_bytes[kept] >= near.peak_bytes[kept]).all()
    few, many = (model.evaluate_many(_with(cols, live_parameters_elements=np.full(300, d))) for d in (10 ** 8, 10 ** 9))
    live = plain.valid & few.valid & many.valid & zero3
    assert (few.peak_bytes[live] >= plain.peak_bytes[live]).all() and (many.peak_bytes[live] >= few.peak_bytes[live]).all()
    # DeepSpeed's ZeRO step copies the gradients to fp32 beside them: never less than without it, and at ZeRO-3 a
    # smaller sub-group never more
    engine = _with(cols, ddp_engine=np.full(300, "deepspeed"))
    stepped = model.evaluate_many(engine)
    both = plain.valid & stepped.valid & (np.asarray(cols["zero"]) != 1)  # ZeRO-1 also frees gradients at its step
    assert both.sum() >= 50 and (stepped.peak_bytes[both] >= plain.peak_bytes[both]).all()
    small, large = (model.evaluate_many(_with(engine, sub_group_elements=np.full(300, g))) for g in (10 ** 6, 10 ** 9))
    grouped = stepped.valid & small.valid & large.valid & zero3
    assert grouped.sum() >= 20
    assert (small.peak_bytes[grouped] <= large.peak_bytes[grouped]).all()
    assert (large.peak_bytes[grouped] <= stepped.peak_bytes[grouped]).all()


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "gpt-oss-20b"])
@pytest.mark.parametrize("stage", [0, 1])
def test_a_higher_zero_stage_below_3_never_holds_more(name, stage):
    # over two or more ranks (dp * cp, shard_mesh's default), sharding the optimizer's states and then the
    # gradients frees more than ZeRO-2's gradients waiting for their reduce-scatter hold (one layer's and the
    # head's); ZeRO-3's gathered modules may outweigh what its sharded parameters free, so it is not held to this
    model = ndcost.resolve(name, census="off")
    cols = _grid(300, bool(model.spec.num_experts), seed=21)
    ranks = np.asarray(cols["dp"]) * np.asarray(cols["cp"])
    lower = model.evaluate_many(_with(cols, zero=np.full(300, stage)))
    higher = model.evaluate_many(_with(cols, zero=np.full(300, stage + 1)))
    both = lower.valid & higher.valid & (ranks >= 2)
    assert both.sum() >= 50
    assert (higher.peak_bytes[both] <= lower.peak_bytes[both]).all()


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "gpt-oss-20b"])
def test_directions_of_the_batch_the_context_split_and_the_compiler(name):
    # twice the sequences a micro-batch never hold less; twice the context-parallel ranks taken from the
    # data-parallel ones (a rank's tokens halved) never hold more; torch.compile (fewer launches and bytes) and
    # async TP under it (the TP collectives behind the matmuls) never lengthen a step
    model = ndcost.resolve(name, census="off")
    cols = _fsdp_grid(300, bool(model.spec.num_experts), seed=31)
    c = {k: np.asarray(v) for k, v in cols.items()}

    def pair(a, b, metric):
        one, two = model.evaluate_many(a), model.evaluate_many(b)
        both = one.valid & two.valid
        assert both.sum() >= 30
        pick = (lambda r: r.peak_bytes) if metric == "peak" else (lambda r: r.time["step_seconds"])
        return pick(one)[both].astype(float), pick(two)[both].astype(float)

    before, after = pair(cols, _with(cols, micro_batch=2 * c["micro_batch"]), "peak")
    assert (after >= before).all()
    wider = _with(cols, dp=2 * c["dp"])
    before, after = pair(wider, _with(wider, cp=2 * c["cp"]), "peak")
    assert (after <= before).all()
    before, after = pair(_with(cols, compile=False), _with(cols, compile=True), "step")
    assert (after <= before * (1 + 1e-12)).all()
    tp = {k: v[c["tp"] > 1] for k, v in _with(cols, compile=True).items()}
    before, after = pair(tp, _with(tp, async_tp=True), "step")
    assert (after <= before * (1 + 1e-12)).all()
