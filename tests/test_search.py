"""`ndcost search` and ndcost.search: the space counted by hand, every answer re-priced, the errors, the sweeps."""
from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ndcost
from ndcost.errors import InvalidValue, MissingExtra, NdcostError, NoValidStrategy, UnknownKey
from ndcost.search import (
    GIB,
    ProgressBar,
    _layout_bounds,
    _space,
    _with_inner,
    pareto_front,
    plot_search,
    search,
)

ROOT = Path(__file__).resolve().parents[1]
LLAMA = "llama-3.1-8b"  # 32 heads, 8 KV heads, 32 layers, intermediate 14336 (specs/models/llama-3.1-8b.yaml)


@pytest.fixture(scope="module")
def llama():
    return ndcost.resolve(LLAMA, hardware="h200", census="off")


def test_the_space_of_two_devices_counted_by_hand(llama):
    # Two devices: exactly one of dp, fsdp, cp, tp, pp is 2. Global batch 2 sequences, so the local batch
    # (2 / (dp * fsdp)) is 1 under dp or fsdp, else 2 (micro_batch 1 or 2). Recompute: none, full, selective,
    # core_attention (no partial recompute_layers here). ZeRO 0-3 over dp * cp where fsdp is 1; sp and
    # vocab_parallel only with tp = 2; four cp_algos with cp = 2.
    #   dp=2:   4 zero x 4 recompute                          =  16
    #   fsdp=2: 4 recompute                                   =   4
    #   cp=2:   2 micro_batch x 4 zero x 4 cp_algo x 4 rec    = 128
    #   tp=2:   2 micro_batch x 2 sp x 2 vocab_parallel x 4   =  32
    #   pp=2:   2 micro_batch x 4 recompute x schedules: 1f1b, gpipe (vpp 1), interleaved with vpp 2, 4, 8, 16
    #           (pp * vpp divides the 32 layers) = 6 x 2 pp_engine (auto, torch) -> 96; dualpipev (vpp 2) needs
    #           num_micro_batches >= 2 * pp = 4 and has at most 2: that layout is refused before pricing
    # 276 strategies in all, every one priced (hf-cuda's selective, torchtitan's op-level policy, by the formulas).
    r = search(llama, devices=2, global_batch=2, seq=4096, recompute_layer_fractions=(), exhaustive=True, top=1000)
    assert r.priced == r.valid == r.fitting == len(r.candidates) == 276
    assert {c.strategy.recompute for c in r.candidates} == {"none", "full", "selective", "core_attention"}
    assert not [p for p in r.pruning if p.step == "recompute"]
    layout = [p for p in r.pruning if p.step == "layout"]
    assert [p.removed for p in layout] == [2] and "dualpipev" in layout[0].reason  # under either pp_engine
    # with recompute_layers at half a chunk's layers: each of the 3 modes but none gains one option where a chunk
    # has 2 or more layers, i.e. everywhere but interleaved pp=2, vpp=16 (one layer a chunk):
    #   dp 4 x 7 = 28; fsdp 7; cp 2 x 4 x 4 x 7 = 224; tp 2 x 2 x 2 x 7 = 56; pp 2 x 2 x (5 x 7 + 1 x 4) = 156
    r = search(llama, devices=2, global_batch=2, seq=4096, recompute_layer_fractions=(0.5,), exhaustive=True,
               top=1000)
    assert r.priced == 471
    halves = {c.strategy.recompute_layers for c in r.candidates if c.strategy.pp == 1} - {None}
    assert halves == {16}


def test_a_recompute_mode_the_model_cannot_price_is_pruned_before_pricing():
    """Under hf-npu the selective policy is HyperParallel's, which the formulas (census off) do not price for
    Llama's layer under the NPU's attention kernel: the mode is pruned, a quarter of the 276 above
    (4 + 1 + 32 + 8 + 24 = 69), with the reason; and with recompute_layers at half a chunk's layers, selective's
    two options (one at vpp=16) of the 471: dp 4 x 2 + fsdp 2 + cp 2 x 4 x 4 x 2 + tp 2 x 2 x 2 x 2 +
    pp 2 x 2 x (5 x 2 + 1) = 134."""
    npu = ndcost.resolve(LLAMA, hardware="h200", runtime="hf-npu", census="off")
    r = search(npu, devices=2, global_batch=2, seq=4096, recompute_layer_fractions=(), exhaustive=True, top=1000)
    assert r.priced == r.valid == len(r.candidates) == 276 - 69
    assert {c.strategy.recompute for c in r.candidates} == {"none", "full", "core_attention"}
    (mode,) = [p for p in r.pruning if p.step == "recompute"]
    assert mode.removed == 1 and "recompute=selective" in mode.reason and "census='auto'" in mode.reason
    r = search(npu, devices=2, global_batch=2, seq=4096, recompute_layer_fractions=(0.5,), exhaustive=True,
               top=1000)
    assert r.priced == 471 - 134


@pytest.fixture(scope="module")
def eight(llama):
    return search(llama, devices=8, global_batch=16, seq=4096, memory_cap_bytes=40 * GIB, top=60)


def test_every_answer_runs_fits_uses_the_devices_and_makes_up_the_batch(llama, eight):
    assert len(eight.candidates) == 60
    for c in eight.candidates:
        s = c.strategy
        assert s.dp * s.fsdp * s.cp * s.tp * s.pp == 8
        assert s.dp * s.fsdp * s.micro_batch * s.num_micro_batches == 16
        assert s.seq == 4096
        cost = llama.evaluate(s)  # raises for a strategy that cannot run
        assert cost.peak_bytes == c.peak_bytes <= 40 * GIB
        assert cost.time.step_seconds == c.step_seconds
        assert cost.time.tokens_per_second == c.tokens_per_second
        assert c.reserved_bytes == cost.reserved_bytes  # None under census="off": the formulas simulate nothing
    steps = [(c.step_seconds, c.peak_bytes) for c in eight.candidates]
    assert steps == sorted(steps)


def test_the_memory_cap_and_the_pruning_are_reported(eight):
    memory = [p for p in eight.pruning if p.step == "memory"]
    assert memory and "40.0 GiB" in memory[0].reason
    assert eight.fitting < eight.valid <= eight.priced


def test_the_persistent_bound_never_exceeds_a_peak(llama):
    hw = llama.hardware
    layouts, inner = _space(llama, hw, 4, 8, 4096, (0.5,), [])
    ok, _, bound = _layout_bounds(llama, hw, layouts, inner, 4096)
    cols = _with_inner(layouts, inner, 4096)
    result = llama.evaluate_many({k: v for k, v in cols.items() if not k.startswith("_")})
    rows = result.valid
    assert rows.sum() > 1000
    assert np.all(result.peak_bytes[rows] >= bound[cols["_layout"][rows]])
    assert np.all(ok[cols["_layout"][rows]])  # a layout refused at its most micro-batches has no valid strategy


@pytest.mark.slow
def test_the_micro_batch_bound_drops_nothing_that_fits(llama):
    kw = dict(devices=8, global_batch=32, seq=4096, memory_cap_bytes=30 * GIB, top=200)
    bounded, exhaustive = search(llama, **kw), search(llama, exhaustive=True, **kw)
    assert bounded.fitting == exhaustive.fitting
    assert bounded.priced < exhaustive.priced
    assert [c.to_dict() for c in bounded.candidates] == [c.to_dict() for c in exhaustive.candidates]


def test_tokens_and_price(llama):
    r = search(llama, devices=2, global_batch=2, seq=4096, top=3, tokens=10 ** 12, price_per_gpu_hour=2.0)
    for c in r.candidates:
        assert c.train_seconds == pytest.approx(1e12 / c.tokens_per_second, rel=1e-12)
        assert c.gpu_hours == pytest.approx(c.train_seconds * 2 / 3600, rel=1e-12)
        assert c.cost_usd == pytest.approx(2.0 * c.gpu_hours, rel=1e-12)
        assert {"train_seconds", "gpu_hours", "cost_usd"} <= set(c.to_dict())


def test_no_valid_strategy_names_each_constraint(llama):
    # 37 devices: the prime 37 fits nowhere (32 heads, 32 layers, 4096 tokens, a batch of 4096)
    with pytest.raises(NoValidStrategy) as exc:
        search(llama, devices=37, global_batch=4096, seq=4096)
    text = str(exc.value)
    for part in ("tp=37 does not divide num_attention_heads=32",
                 "pp * vpp = 37 * 1 = 37 does not divide the 32 layers; use at most 32 stages",
                 "cp=37 does not divide seq=4096", "dp * fsdp = 37 does not divide the global batch of 4096"):
        assert part in text


def test_balanced_split_is_torchtitans_and_falls_back_to_an_even_one():
    from ndcost.compose.placement import balanced_split
    # DeepSeek-V3's 61 layers over 16 stages: 63 = 16 x 3 + 15 -> fifteen stages of 4 and one of 3, the first
    # and the last one lighter (the embedding, the head)
    assert balanced_split(61, 16) == (3,) + (4,) * 14 + (2,)
    # over 32: 63 = 32 x 1 + 31 leaves the last stage 1 - 1 = 0 layers, so no weights: 61 = 32 + 29, the first 29
    # stages one more
    assert balanced_split(61, 32) == (2,) * 29 + (1,) * 3
    assert balanced_split(2, 3) is None and balanced_split(2, 0) is None  # more stages than layers; none


def test_a_pipeline_the_layers_do_not_divide_takes_torchtitans_split(llama):
    # 3 devices: tp=3 divides no 32 heads, cp=3 no 4096 tokens, so only dp, fsdp (a batch of 6) and pp run
    # (DualPipeV needs 2 pp = 6 micro-batches).
    # pp=3 over 32 layers, torchtitan's split (the embedding and the head a layer each, 34 over the stages):
    #   vpp 1: 34 = 3 x 11 + 1 -> 12, 11, 11 less 1 first and last -> 11/11/10
    #   vpp 2: 34 = 6 x 5 + 4 -> 6, 6, 6, 6, 5, 5 less 1 first and last -> 5/6/6/6/5/4
    even = search(llama, devices=3, global_batch=6, seq=4096, top=1000)  # the default: no pp=3
    assert {c.strategy.pp for c in even.candidates} == {1}
    (pp,) = [p for p in even.pruning if p.step == "pp"]
    assert "does not divide the 32 layers" in pp.reason and "--pp-splits balanced" in pp.reason
    r = search(llama, devices=3, global_batch=6, seq=4096, top=1000, pp_splits="balanced")
    splits = {(c.strategy.vpp, c.strategy.schedule, c.strategy.pp_layers) for c in r.candidates if c.strategy.pp == 3}
    assert {split for _, _, split in splits} == {(11, 11, 10), (5, 6, 6, 6, 5, 4)}
    assert {(vpp, schedule) for vpp, schedule, _ in splits} == {(1, "1f1b"), (1, "gpipe"), (2, "interleaved"),
                                                                (2, "dualpipev")}
    assert all(c.strategy.pp_layers is None for c in r.candidates if c.strategy.pp == 1)
    for c in [c for c in r.candidates if c.strategy.pp == 3][:5]:  # priced as the strategy alone prices it
        alone = llama.evaluate(c.strategy)
        assert (alone.peak_bytes, alone.time.step_seconds) == (c.peak_bytes, c.step_seconds)


def test_nothing_fits_says_the_smallest():
    # DeepSeek-V3: 671B parameters without the MTP layer (the DeepSeek-V3 report, table 1), bf16 weights and
    # AdamW's two bf16 states: 6 bytes a parameter, at best sharded over the 8 devices
    least_gib = 671e9 * 6 / 8 / GIB
    with pytest.raises(NoValidStrategy) as exc:
        search("deepseek-v3", devices=8, global_batch=64, seq=4096, census="off")
    text = str(exc.value)
    # the cap: the H200's 150,754,820,096 bytes less its 512 MiB of CUDA context, 139.90 GiB
    assert "nothing fits in 139.9 GiB" in text
    needed = float(re.search(r"needs at least ([\d.]+) GiB", text).group(1))
    assert needed == pytest.approx(least_gib, rel=2e-3)


@pytest.mark.parametrize("kw, words", [
    ({"devices": 0}, "devices=0"),
    ({"global_batch": -4}, "global_batch=-4"),
    ({"hardware": "h900"}, "'h900' is not registered"),
    ({"price_per_gpu_hour": 2.0}, "give tokens too"),
    ({"memory_cap_bytes": 0}, "memory_cap_bytes=0"),
    ({"colour": 1}, "unknown setting(s) colour"),
])
def test_bad_input_is_refused_by_name(llama, kw, words):
    args = dict(devices=8, global_batch=16, seq=4096)
    args.update(kw)
    with pytest.raises(NdcostError) as exc:
        search(llama, **args)
    assert words in str(exc.value)
    assert isinstance(exc.value, (InvalidValue, UnknownKey))


def test_pareto_front():
    peak = np.array([1.0, 2.0, 3.0, 2.0, 4.0])
    step = np.array([5.0, 3.0, 4.0, 6.0, 1.0])
    assert pareto_front(peak, step).tolist() == [0, 1, 4]


def test_progress_bar_draws_and_clears():
    out = io.StringIO()
    bar = ProgressBar(200, "search x", stream=out, force=True)
    bar.update(100)
    bar.update(100)
    bar.close()
    text = out.getvalue()
    assert "50%" in text and "100%" in text and "200 strategies" in text and text.endswith("\r\033[K")
    quiet = io.StringIO()
    ProgressBar(10, "x", stream=quiet).update(5)  # not a terminal: nothing drawn
    assert quiet.getvalue() == ""


@pytest.mark.slow
def test_plot_is_a_png(llama, tmp_path):
    pytest.importorskip("matplotlib")
    r = search(llama, devices=4, global_batch=8, seq=4096, keep_points=True, top=3)
    assert r.points is not None and len(r.points.peak_gib) == r.valid
    path = tmp_path / "search.png"
    plot_search([r], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_extra(llama, tmp_path, monkeypatch):
    r = search(llama, devices=2, global_batch=2, seq=4096, keep_points=True, top=1)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtra, match=r"ndcost\[plot\]"):
        plot_search([r], tmp_path / "x.png")


@pytest.mark.slow
def test_workers_equal_one_process():
    kw = dict(devices=8, global_batch=16, seq=4096, census="off", top=25)
    one = search(LLAMA, **kw)
    many = search(LLAMA, workers=2, chunk_rows=3000, **kw)
    assert (many.priced, many.valid, many.fitting) == (one.priced, one.valid, one.fitting)
    assert [c.to_dict() for c in many.candidates] == [c.to_dict() for c in one.candidates]


@pytest.mark.slow
def test_dask_equals_one_process():
    distributed = pytest.importorskip("distributed")
    kw = dict(devices=8, global_batch=16, seq=4096, census="off", top=25)
    one = search(LLAMA, **kw)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        many = search(LLAMA, scheduler=cluster.scheduler_address, chunk_rows=3000, **kw)
    assert (many.priced, many.valid, many.fitting) == (one.priced, one.valid, one.fitting)
    assert [c.to_dict() for c in many.candidates] == [c.to_dict() for c in one.candidates]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ndcost", "search", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_cli_json_csv_and_table():
    base = [LLAMA, "--devices", "4,8", "--hardware", "h200,h100", "--global-batch", "16", "--seq", "4096",
            "--top", "3", "--census", "off"]
    out = _cli(*base, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == 12 and [(r["devices"], r["hardware"]) for r in rows[::3]] == [
        (4, "h200"), (4, "h100"), (8, "h200"), (8, "h100")]
    for r in rows:
        assert {"strategy", "peak_bytes", "reserved_bytes", "step_seconds", "tokens_per_second", "mfu"} <= set(r)
        # census off: no allocator simulation, so reserved is not claimed
        assert r["reserved_bytes"] is None and isinstance(r["peak_bytes"], int)
        ndcost.Strategy.parse(r["strategy"])
    out = _cli(*base, "--csv")
    assert out.returncode == 0, out.stderr
    table = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [t["strategy"] for t in table] == [r["strategy"] for r in rows]
    assert {"strategy", "peak_bytes", "reserved_bytes", "step_seconds", "tokens_per_second", "mfu"} <= set(table[0])
    out = _cli(*base)
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) <= 100
    assert "simulated caching allocator" in out.stdout


def test_cli_pp_splits_balanced_searches_torchtitans_split():
    args = [LLAMA, "--devices", "3", "--global-batch", "6", "--seq", "4096", "--top", "1000", "--census", "off",
            "--json"]
    rows = json.loads(_cli(*args, "--pp-splits", "balanced").stdout)
    splits = {ndcost.Strategy.parse(r["strategy"]).pp_layers for r in rows}
    assert {(11, 11, 10), (5, 6, 6, 6, 5, 4)} <= splits  # test_a_pipeline_the_layers_do_not_divide_... derives them
    assert {ndcost.Strategy.parse(r["strategy"]).pp for r in json.loads(_cli(*args).stdout)} == {1}


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (["--devices", "0"], "--devices 0"),
    (["--global-batch", "-4"], "--global-batch -4"),
    (["--hardware", "h900"], "'h900' is not registered"),
    (["--devices", "96", "--global-batch", "4096"], "dp * fsdp = 3 does not divide the global batch of 4096"),
])
def test_cli_refusals_are_one_line(args, words):
    base = {"--devices": "8", "--global-batch": "16", "--seq": "4096", "--census": "off"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    out = _cli(LLAMA, *[x for kv in base.items() for x in kv])
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in out.stderr


@pytest.mark.slow
def test_the_searchers_guide_example_runs():
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "search_example.py")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "best:" in out.stdout and "refused:" in out.stdout


def test_expert_parallel_variants_of_a_schedule_are_searched_only_with_ep():
    # interleaved-a2a-overlap and 1f1b-a2a-overlap (Megatron-LM's combined 1F1B) price as interleaved and 1f1b
    # where nothing is expert-parallel: a search tries them only with ep > 1, the interleaved one beside its plain
    # twin
    moe = ndcost.resolve("qwen3-30b-a3b", hardware="h200", census="off")
    r = search(moe, devices=4, global_batch=4, seq=4096, recompute_layer_fractions=(), exhaustive=True, top=10 ** 6,
               memory_cap_bytes=10 ** 15)
    by_schedule = {}
    for c in r.candidates:
        by_schedule.setdefault(c.strategy.schedule, set()).add((c.strategy.pp, c.strategy.ep))
    assert {ep for _, ep in by_schedule["1f1b-a2a-overlap"]} == {2, 4}
    assert {ep for _, ep in by_schedule["interleaved-a2a-overlap"]} == {2}
    assert {ep for _, ep in by_schedule["interleaved"]} == {1, 2}
    # without pipelining the variant holds what 1F1B holds and hides the all-to-alls: 1F1B is dropped where ep > 1
    assert {ep for pp, ep in by_schedule["1f1b"] if pp == 1} == {1}
    assert [p.step for p in r.pruning].count("dominated schedule") == 1
    twins = {str(c.strategy).replace("schedule=interleaved-a2a-overlap", "schedule=interleaved")
             for c in r.candidates if c.strategy.schedule == "interleaved-a2a-overlap"}
    assert twins <= {str(c.strategy) for c in r.candidates}


def test_a_search_can_keep_to_a_trainers_schedules():
    # torchtitan runs no Megatron-LM all-to-all overlap: schedules=("1f1b", "interleaved") searches those alone, and
    # a layout without a pipeline (1F1B's) stays under any choice
    moe = ndcost.resolve("qwen3-30b-a3b", hardware="h200", census="off")
    r = search(moe, devices=4, global_batch=4, seq=4096, recompute_layer_fractions=(), exhaustive=True, top=10 ** 6,
               memory_cap_bytes=10 ** 15, schedules=("1f1b", "interleaved"))
    assert {c.strategy.schedule for c in r.candidates} == {"1f1b", "interleaved"}
    assert {c.strategy.ep for c in r.candidates if c.strategy.pp == 1} == {1, 2, 4}
    only = search(moe, devices=4, global_batch=4, seq=4096, recompute_layer_fractions=(), top=10 ** 6,
                  memory_cap_bytes=10 ** 15, schedules=("interleaved",))
    assert {c.strategy.schedule for c in only.candidates} == {"1f1b", "interleaved"}
    assert all(c.strategy.pp == 1 for c in only.candidates if c.strategy.schedule == "1f1b")
    with pytest.raises(InvalidValue, match="schedules zero-bubble: not registered"):
        search(moe, devices=4, global_batch=4, seq=4096, schedules=("zero-bubble",))


def test_a_cap_above_the_device_warns(llama):
    with pytest.warns(UserWarning, match=r"memory cap 500.0 GiB is above what a h200 can use \(139.9 GiB"):
        search(llama, devices=2, global_batch=2, seq=1024, memory_cap_bytes=500 * GIB, top=1)


def test_holding_a_searched_field_or_seq_is_refused_naming_why():
    from ndcost.search import held_fields
    with pytest.raises(InvalidValue, match=r"held field seq: the search's sequence length is its own argument"):
        held_fields("seq=8192")
    with pytest.raises(InvalidValue, match=r"held fields tp: the search chooses them"):
        held_fields("tp=2")
    assert held_fields("grad_dtype=bf16") == {"grad_dtype": "bf16"}


def test_a_held_field_is_written_only_where_it_acts(llama):
    """--hold pp_return_outputs=true acts only under torch's pipeline (pp > 1, pp_engine=torch) and cp_rotate only
    where cp > 1: the candidates they leave unchanged are written without them, and every candidate still prices
    as the search priced it."""
    found = search(llama, devices=8, global_batch=16, seq=4096, memory_cap_bytes=60 * GIB, top=400,
                   held="pp_return_outputs=true,cp_rotate=p2p").candidates
    assert any(c.strategy.pp > 1 and c.strategy.pp_engine == "torch" for c in found)
    assert any(c.strategy.pp == 1 for c in found) and any(c.strategy.cp > 1 for c in found)
    for c in found:
        s = c.strategy
        assert s.pp_return_outputs == (s.pp > 1 and s.pp_engine == "torch"), str(s)
        assert (s.cp_rotate == "p2p") == (s.cp > 1), str(s)
        assert llama.evaluate(s).peak_bytes == c.peak_bytes


def test_candidates_carry_their_exposed_communication_by_group(llama):
    from ndcost.values import EXPOSED_GROUPS
    result = search(llama, devices=16, global_batch=32, seq=8192, top=6)
    assert any(c.waits for c in result.candidates)
    for c in result.candidates:
        time = llama.evaluate(c.strategy).time
        assert dict(c.exposed_by_group) == {g: getattr(time, f"exposed_{g}_seconds") for g in EXPOSED_GROUPS}
        row = c.to_dict()
        assert all(row[f"exposed_{g}_seconds"] == c.exposed_by_group[g] for g in EXPOSED_GROUPS)
        most = max(EXPOSED_GROUPS, key=lambda g: c.exposed_by_group[g])  # the first of equals, as listed
        assert c.waits == (most if c.exposed_by_group[most] > 0 else "")


def test_search_around_a_trainer_file_holds_its_fields_and_lists_what_its_trainer_runs():
    from ndcost.trainers import to_config
    toml = ROOT / "tests" / "data" / "configs" / "torchtitan" / "llama3_8b.toml"
    out = _cli("--from", f"torchtitan:{toml}", "--devices", "8", "--hardware", "h100", "--top", "5",
               "--census", "off", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    config = ndcost.from_config("torchtitan", toml, devices=8)  # fsdp=8, local batch 1, seq 8192, fp32 under bf16
    assert len(rows) == 5 and config.global_batch == 8
    for row in rows:
        s = ndcost.Strategy.parse(row["strategy"])
        assert s.devices == 8 and s.dp * s.fsdp * s.micro_batch * s.num_micro_batches == 8 and s.seq == 8192
        assert (s.param_dtype, s.compute_dtype) == ("fp32", "bf16") and s.cp_algo == "ring"  # torchtitan's CP
        to_config("torchtitan", s, model="llama-3.1-8b", global_batch=8)  # torchtitan runs it (no refusal)
    assert "passed over" in out.stderr
    refused = _cli("--from", f"torchtitan:{toml}", "--census", "off")
    assert refused.returncode == 1 and "give --devices N" in refused.stderr
