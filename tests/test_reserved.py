"""Reserved bytes as the composition adds them to a stage's allocated peak, against figures derived by hand.

The tiny Llama and its hand-made records are test_memory's; the records here also state the allocator
replay's figures (what ``ndcost.allocator.stack_excess`` gives the census), so the composition's own rules
are checked: each persistent category one block rounded up to 2 MiB (kRoundLarge, get_allocation_size in
c10/cuda/CUDACachingAllocator.cpp), each kept layer's steady excess, the working excess once, the output
layer's on the head's stage, a full-recompute layer's kept input packed into segments, a selective or
core-attention layer's excess from that policy's replay, fp32 autocast's from its own, offloading's rules, and
no claim where nothing was simulated. Then what fits: reserved bytes (the allocated peak where none is
claimed) plus the hardware's CUDA context within its memory, the search on the same rule, and the hardware
field's validation.
"""
from __future__ import annotations

import attrs
import pytest

from ndcost.values import Strategy

from test_memory import EMB, FINAL, HEAD, LAYER, H, L, llama_counts, llama_spec, records

S = 2048
MIB = 2 ** 20
P = L * LAYER + EMB + HEAD + FINAL
PER_LAYER, PER_LAYER_TP, WORKING, WORKING_TP = 256.0, 512.0, 1024.0, 2048.0
OUTPUT, OUTPUT_TP = 100.0, 50.0  # the output layer's, a token (its TP part split only under vocab_parallel)
SIMULATED = dict(reserved_per_layer_per_token=PER_LAYER, reserved_per_layer_tp_per_token=PER_LAYER_TP,
                 reserved_working_per_token=WORKING, reserved_working_tp_per_token=WORKING_TP)


def cost_model(spec, counts, seq, output=True, **rec):
    from ndcost.resolver import CostModel
    kinds, out = records(seq, **rec)
    if output:
        out = attrs.evolve(out, reserved_working_per_token=OUTPUT, reserved_working_tp_per_token=OUTPUT_TP)
    return CostModel.from_records(spec, counts, {seq: (kinds, out)})


def _blocks(stage):
    """Each category held as one block rounded up to 2 MiB: the rounding above its bytes."""
    names = ("parameters", "master", "optimizer_states", "gradients", "communication")
    return sum(-(-stage.bytes_by_category[c] // (2 * MIB)) * 2 * MIB - stage.bytes_by_category[c] for c in names)


@pytest.fixture(scope="module")
def simulated():
    return cost_model(llama_spec(), llama_counts(), S, **SIMULATED)


def test_plain_layers_add_their_steady_excess_and_the_working_excess_once(simulated):
    cost = simulated.evaluate(Strategy.parse(f"seq={S},optimizer=adamw"))
    stage = cost.stages[0]
    assert stage.bytes_by_category["parameters"] == 2 * P  # bf16 parameters, by hand
    # 8 layers kept once, 2048 tokens each: 8 * 2048 * (256 + 512), the working excess 2048 * (1024 + 2048),
    # the output layer's 2048 * (100 + 50)
    layers = 8 * S * (PER_LAYER + PER_LAYER_TP) + S * (WORKING + WORKING_TP) + S * (OUTPUT + OUTPUT_TP)
    assert layers == 19_181_568
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + layers
    assert cost.reserved_bytes == stage.reserved_bytes and cost.reserved_reason == ""
    data = cost.to_dict()  # estimate --json's figures
    assert data["reserved_bytes"] == data["stages"][0]["reserved_bytes"] == stage.reserved_bytes
    # 2 * P bytes of parameters is not a 2 MiB multiple: its block rounds up
    assert (2 * P) % (2 * MIB) != 0 and _blocks(stage) > 0


def test_tp_splits_the_excess_as_the_records_say(simulated):
    stage = simulated.evaluate(Strategy.parse(f"seq={S},tp=2")).stages[0]
    layers = 8 * S * (PER_LAYER + PER_LAYER_TP / 2) + S * (WORKING + WORKING_TP / 2) + S * (OUTPUT + OUTPUT_TP)
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + layers
    stage = simulated.evaluate(Strategy.parse(f"seq={S},tp=2,vocab_parallel=true")).stages[0]
    layers = 8 * S * (PER_LAYER + PER_LAYER_TP / 2) + S * (WORKING + WORKING_TP / 2) + S * (OUTPUT + OUTPUT_TP / 2)
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + layers


def test_each_pipeline_stage_reserves_for_its_own_layers(simulated):
    cost = simulated.evaluate(Strategy.parse(f"seq={S},pp=2,num_micro_batches=2,schedule=1f1b"))
    for stage in cost.stages:
        held = 2 if stage.stage == 0 else 1  # 1F1B: stage 0 of 2 keeps two micro-batches, the last one
        output = S * (OUTPUT + OUTPUT_TP) if stage.stage == 1 else 0  # the head's stage
        layers = held * 4 * S * (PER_LAYER + PER_LAYER_TP) + S * (WORKING + WORKING_TP) + output
        assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + layers
    assert cost.reserved_bytes == max(s.reserved_bytes for s in cost.stages)


def test_full_recompute_packs_the_kept_inputs_into_segments(simulated):
    cost = simulated.evaluate(Strategy.parse(f"seq={S},recompute=full"))
    stage = cost.stages[0]
    # each layer keeps its bf16 input, 1024 * 2 * 2048 = 4 MiB: five to a 20 MiB segment, so 8 inputs
    # reserve 2 segments (40 MiB) for 32 MiB; the layers' own excess is the working one alone
    assert H * 2 * S == 4 * MIB
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + (40 - 32) * MIB + S * (
        WORKING + WORKING_TP + OUTPUT + OUTPUT_TP)


def test_the_excess_never_takes_reserved_below_allocated():
    model = cost_model(llama_spec(), llama_counts(), S, **{**SIMULATED, "reserved_per_layer_per_token": -1e6,
                                                           "reserved_per_layer_tp_per_token": 0.0})
    stage = model.evaluate(Strategy.parse(f"seq={S}")).stages[0]
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage)


def test_allocator_overhead_is_replaced_by_the_simulation(simulated):
    plain = simulated.evaluate(Strategy.parse(f"seq={S}"))
    guessed = simulated.evaluate(Strategy.parse(f"seq={S},allocator_overhead=0.1"))
    assert guessed.peak_bytes > plain.peak_bytes
    assert guessed.reserved_bytes == plain.reserved_bytes


@pytest.mark.parametrize("layers, output", [(False, False), (False, True), (True, False)])
def test_nothing_simulated_claims_nothing(layers, output):
    # records without the replay's figures (the formulas', or cached before it), for the layers or the output
    model = cost_model(llama_spec(), llama_counts(), S, output=output, **(SIMULATED if layers else {}))
    cost = model.evaluate(Strategy.parse(f"seq={S}"))
    assert cost.reserved_bytes is None and cost.stages[0].reserved_bytes is None
    assert "no allocator simulation" in cost.reserved_reason
    assert cost.to_dict()["reserved_bytes"] is None


SEL_LAYER, SEL_LAYER_TP, SEL_WORKING, SEL_WORKING_TP = 128.0, 64.0, 4096.0, 1024.0
SELECTIVE = dict(reserved_selective_per_layer_per_token=SEL_LAYER,
                 reserved_selective_per_layer_tp_per_token=SEL_LAYER_TP,
                 reserved_selective_working_per_token=SEL_WORKING,
                 reserved_selective_working_tp_per_token=SEL_WORKING_TP)


def test_selective_without_its_replay_claims_nothing(simulated):
    # the records state the plain replay alone (census records cached before the selective one)
    cost = simulated.evaluate(Strategy.parse(f"seq={S},recompute=selective"))
    assert cost.reserved_bytes is None and "under this recompute mode" in cost.reserved_reason
    assert cost.valid and cost.peak_bytes > 0 and cost.fits_basis == "allocated"  # the allocated figures stand


@pytest.fixture(scope="module")
def selective():
    return cost_model(llama_spec(), llama_counts(), S, **SIMULATED, **SELECTIVE)


def test_selective_layers_add_the_selective_replays_excess(selective):
    stage = selective.evaluate(Strategy.parse(f"seq={S},recompute=selective")).stages[0]
    # every layer recomputed under the policy: 8 * 2048 * (128 + 64) kept, the selective working excess
    # 2048 * (4096 + 1024) once (the plain one is no layer's), the output layer's 2048 * (100 + 50)
    layers = 8 * S * (SEL_LAYER + SEL_LAYER_TP) + S * (SEL_WORKING + SEL_WORKING_TP) + S * (OUTPUT + OUTPUT_TP)
    assert layers == 3_145_728 + 10_485_760 + 307_200
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + layers
    # half the layers recomputed: 4 plain and 4 selective layers; the working excess the larger of the two
    # kinds of layer's, max(1024 + 2048, 4096 + 1024) = 5120 a token
    stage = selective.evaluate(Strategy.parse(f"seq={S},recompute=selective,recompute_layers=4")).stages[0]
    layers = (4 * S * (PER_LAYER + PER_LAYER_TP) + 4 * S * (SEL_LAYER + SEL_LAYER_TP)
              + S * (SEL_WORKING + SEL_WORKING_TP) + S * (OUTPUT + OUTPUT_TP))
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + layers


CORE_LAYER, CORE_LAYER_TP, CORE_WORKING, CORE_WORKING_TP = 192.0, 320.0, 768.0, 256.0
CORE = dict(reserved_core_attention_per_layer_per_token=CORE_LAYER,
            reserved_core_attention_per_layer_tp_per_token=CORE_LAYER_TP,
            reserved_core_attention_working_per_token=CORE_WORKING,
            reserved_core_attention_working_tp_per_token=CORE_WORKING_TP)


def test_core_attention_layers_add_the_core_attention_replays_excess():
    # under core_attention test_memory's records come out with negative activations (the row refused by the
    # invariants, a matter of those records); a larger saved figure prices the row
    text = f"seq={S},recompute=core_attention,recompute_layers=4"
    model = cost_model(llama_spec(), llama_counts(), S, saved_per_token=1e5, **SIMULATED, **SELECTIVE)
    cost = model.evaluate(Strategy.parse(text))
    assert cost.reserved_bytes is None and "under this recompute mode" in cost.reserved_reason
    model = cost_model(llama_spec(), llama_counts(), S, saved_per_token=1e5, **SIMULATED, **SELECTIVE, **CORE)
    stage = model.evaluate(Strategy.parse(text)).stages[0]
    # 4 plain layers and 4 under the core-attention policy; the working excess the larger, 1024 + 2048 a token
    layers = (4 * S * (PER_LAYER + PER_LAYER_TP) + 4 * S * (CORE_LAYER + CORE_LAYER_TP) + S * (WORKING + WORKING_TP)
              + S * (OUTPUT + OUTPUT_TP))
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + layers


def test_offloaded_activations_take_the_kept_layers_excess_with_them(selective):
    cost = selective.evaluate(Strategy.parse(f"seq={S},offload_activations=true"))
    stage = cost.stages[0]
    # what the layers save leaves the device as it is saved: the working excess and the output layer's stay
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + S * (WORKING + WORKING_TP + OUTPUT + OUTPUT_TP)


def test_offloaded_states_leave_no_block_on_the_device(selective):
    stage = selective.evaluate(Strategy.parse(f"seq={S},offload_optimizer=true,optimizer=adamw")).stages[0]
    assert stage.bytes_by_category["optimizer_states"] == 0 and stage.bytes_by_category["master"] == 0
    layers = 8 * S * (PER_LAYER + PER_LAYER_TP) + S * (WORKING + WORKING_TP) + S * (OUTPUT + OUTPUT_TP)
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + layers


A_LAYER, A_LAYER_TP, A_WORKING, A_WORKING_TP, A_OUTPUT, A_OUTPUT_TP = 512.0, 256.0, 2048.0, 512.0, 300.0, 60.0
AUTOCAST = dict(autocast_reserved_per_layer_per_token=A_LAYER, autocast_reserved_per_layer_tp_per_token=A_LAYER_TP,
                autocast_reserved_working_per_token=A_WORKING, autocast_reserved_working_tp_per_token=A_WORKING_TP)
FP32 = f"seq={S},param_dtype=fp32,compute_dtype=bf16"


def test_fp32_autocast_takes_the_autocast_passs_replay(selective):
    from ndcost.resolver import CostModel
    assert "autocast" in selective.evaluate(Strategy.parse(FP32)).reserved_reason  # no autocast replay stated
    kinds, out = records(S, **SIMULATED, **SELECTIVE, **AUTOCAST)
    out = attrs.evolve(out, reserved_working_per_token=OUTPUT, reserved_working_tp_per_token=OUTPUT_TP,
                       autocast_reserved_working_per_token=A_OUTPUT, autocast_reserved_working_tp_per_token=A_OUTPUT_TP)
    model = CostModel.from_records(llama_spec(), llama_counts(), {S: (kinds, out)})
    cost = model.evaluate(Strategy.parse(FP32))
    stage = cost.stages[0]
    assert cost.fits_basis == "reserved"
    layers = 8 * S * (A_LAYER + A_LAYER_TP) + S * (A_WORKING + A_WORKING_TP) + S * (A_OUTPUT + A_OUTPUT_TP)
    assert stage.reserved_bytes == stage.peak_bytes + _blocks(stage) + layers
    # the selective passes ran bf16 parameters: not the run's events
    cost = model.evaluate(Strategy.parse(FP32 + ",recompute=selective"))
    assert cost.reserved_bytes is None and "autocast" in cost.reserved_reason
    assert model.evaluate(Strategy.parse(FP32 + ",recompute=full")).reserved_bytes is not None


def test_a_checkpointed_layers_events_replayed_by_hand():
    """A layer under a selective policy, as its census pass logs it: the input the checkpoint keeps (4 MiB), a
    temporary (8 MiB) freed in the forward, the policy's saved output (2 MiB); the backward recomputes the
    temporary and makes the input's gradient (4 MiB). All are large-pool requests under 10 MiB: 20 MiB segments,
    split where more than 1 MiB is left, best fit (get_allocation_size, should_split, get_free_block).

    Forward by forward, reserved less allocated MiB (segments A, B, C in order):
    1: A holds x0 [0,4), t0 freed [4,12), s0 [12,14), free [14,20): 20 - 6 = 14
    2: x1 takes the 6 at 14 (split, 2 left), t1 the 8 at 4, s1 the 2 at 18: 20 - 12 = 8
    3: x2 splits the 8 at 4, t2 fits nowhere: B; s2 splits the 4 at A8; t2 freed, B whole again: 40 - 18 = 22
    4: x3 and t3 split B, s3 the 2 at A10: 40 - 24 = 16;  5: 40 - 30 = 10 (x4, t4, s4 in B)
    6: t5 fits nowhere: C, x5 in B8, s5 B18: 60 - 36 = 24;  7: x6 the 4 at B12, t6 and s6 in C: 60 - 42 = 18
    8: x7 splits the 8 at C0, t7 the 10 at C10, s7 the 2 at C18: 60 - 48 = 12
    The steady figure is (12 - 16) / 4 = -1 MiB a layer (marks 4 to 8). The backward's r (8) takes C10 and g (4)
    C4: allocated 60 at its peak, reserved 60, so the working figure is (60 - 60) - 8 * (-1) = 8 MiB.
    """
    from ndcost.allocator import replay, stack_excess
    forward = [("x", 4 * MIB), ("t", 8 * MIB), ("s", 2 * MIB), ("t", -8 * MIB)]
    backward = [("r", 8 * MIB), ("g", 4 * MIB), ("r", -8 * MIB)]
    excess = stack_excess(forward, backward)
    assert excess.per_layer_bytes == -1 * MIB and excess.working_bytes == 8 * MIB
    # one layer alone: 20 MiB reserved, 14 allocated at the peak (x, t, s); 6 above
    alone = replay(forward)
    assert (alone.peak_reserved_bytes, alone.peak_allocated_bytes) == (20 * MIB, 14 * MIB)


def test_evaluate_many_matches_evaluate(selective):
    texts = [f"seq={S}", f"seq={S},tp=2", f"seq={S},recompute=selective", f"seq={S},pp=2,num_micro_batches=2",
             f"seq={S},recompute=selective,recompute_layers=4", f"seq={S},offload_activations=true"]
    batch = selective.evaluate_many([Strategy.parse(t) for t in texts])
    assert (batch.reserved_bytes >= 0).all()
    for i, text in enumerate(texts):
        single = selective.evaluate(Strategy.parse(text)).reserved_bytes
        assert (None if batch.reserved_bytes[i] < 0 else int(batch.reserved_bytes[i])) == single


# -- fits: reserved bytes plus the CUDA context within the device's memory ---------------------------------
CONTEXT = 512 * MIB


def _device(memory_bytes):
    from ndcost import manager
    return attrs.evolve(manager.registry().get("hardware/h200"), memory_bytes=memory_bytes,
                        cuda_context_bytes=CONTEXT)


def test_fits_flips_at_the_memory_less_the_context_on_reserved_bytes(simulated):
    stage = simulated.evaluate(Strategy.parse(f"seq={S},optimizer=adamw")).stages[0]
    # reserved by hand, as test_plain_layers_add_their_steady_excess_and_the_working_excess_once derives it
    reserved = stage.peak_bytes + _blocks(stage) + 19_181_568
    assert stage.reserved_bytes == reserved and reserved > stage.peak_bytes
    strategy = [Strategy.parse(f"seq={S},optimizer=adamw")]
    for memory, fits in ((reserved + CONTEXT, True), (reserved + CONTEXT - 1, False),
                         (stage.peak_bytes + CONTEXT, False)):  # the last fitted on allocated bytes before
        batch = simulated.evaluate_many(strategy, hardware=_device(memory))
        assert bool(batch.fits[0]) is fits and batch.fits_basis[0] == "reserved"
    cost = simulated.evaluate(strategy[0], hardware=_device(reserved + CONTEXT))
    assert cost.fits is True and cost.to_dict()["fits_basis"] == "reserved"


def test_fits_judges_the_allocated_peak_where_reserved_is_not_claimed():
    model = cost_model(llama_spec(), llama_counts(), S, output=False)  # no replay figures: nothing claimed
    strategy = [Strategy.parse(f"seq={S}")]
    peak = int(model.evaluate_many(strategy).peak_bytes[0])
    for memory, fits in ((peak + CONTEXT, True), (peak + CONTEXT - 1, False)):
        batch = model.evaluate_many(strategy, hardware=_device(memory))
        assert bool(batch.fits[0]) is fits and batch.fits_basis[0] == "allocated" and batch.reserved_bytes[0] == -1


def space_cols(model):
    """Every strategy the search enumerates for 2 devices and a batch of 8, as columns."""
    from ndcost.search import _space, _with_inner
    layouts, inner = _space(model, model.hardware, 2, 8, S, (0.5,), [])
    return {k: v for k, v in _with_inner(layouts, inner, S).items() if not k.startswith("_")}


@pytest.fixture(scope="module")
def space(selective):
    """That space priced in one batch, no bound."""
    return selective.evaluate_many(space_cols(selective))


@pytest.mark.parametrize("share", [0.25, 0.5, 0.75])
def test_search_drops_exactly_what_does_not_fit_on_reserved_bytes(selective, space, share):
    """The micro-batch bound and the persistent bound prune no strategy whose reserved bytes fit: the
    search's answer is every strategy of the space that fits, priced one by one, fastest first."""
    import numpy as np

    from ndcost.resolver import fits_rule
    from ndcost.search import search

    batch = space
    valid = batch.valid
    claimed = valid & (batch.reserved_bytes >= 0)
    # the hand-made records state no core-attention replay: those rows, and only those, are judged on allocated
    core_attention = np.asarray(space_cols(selective)["recompute"]) == "core_attention"
    assert claimed.sum() > 50 and np.array_equal(valid & ~claimed, valid & core_attention)
    # caps between the allocated and the reserved bytes of some rows: the two rules disagree on them
    apart = claimed & (batch.reserved_bytes > batch.peak_bytes)
    # a row's own midpoint (method lower): that row lies between, whatever the spread of the others
    cap = int(np.quantile((batch.peak_bytes[apart] + batch.reserved_bytes[apart]) // 2, share, method="lower"))
    between = valid & (batch.peak_bytes <= cap) & (batch.reserved_bytes > cap)
    assert between.any()
    fits, _ = fits_rule(valid, batch.peak_bytes, batch.reserved_bytes, cap)
    result = search(selective, devices=2, global_batch=8, seq=S, memory_cap_bytes=cap, top=10 ** 6, progress=False)
    assert result.priced < len(valid)  # the micro-batch bound skipped some
    assert result.fitting == int(fits.sum())
    rows = np.flatnonzero(fits)
    expected = rows[np.lexsort((rows, batch.peak_bytes[rows], batch.time["step_seconds"][rows]))]
    def claimed_or_none(reserved):  # a candidate states None where nothing was claimed
        return None if reserved < 0 else int(reserved)
    assert [c.reserved_bytes for c in result.candidates] == [claimed_or_none(batch.reserved_bytes[i])
                                                               for i in expected]
    assert all(c.reserved_bytes is None or c.reserved_bytes <= cap for c in result.candidates)


# -- the hardware's CUDA context ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", [-1, 1.5, "512MiB", True, None])
def test_a_cuda_context_not_a_whole_number_of_bytes_is_refused(value):
    from ndcost.errors import InvalidValue
    with pytest.raises(InvalidValue, match="cuda_context_bytes"):
        attrs.evolve(_device(80 * 2 ** 30), cuda_context_bytes=value)


def test_a_cuda_context_as_large_as_the_memory_is_refused():
    from ndcost.errors import InvalidValue
    with pytest.raises(InvalidValue, match="not below memory_bytes"):
        _device(CONTEXT)


def test_every_shipped_hardware_states_its_context_and_a_yaml_float_reads_as_bytes(tmp_path):
    from ndcost import manager
    from ndcost.specio import load_hardware_yaml
    registry = manager.registry()
    for name in registry.names("hardware"):
        hw = registry.get(f"hardware/{name}")
        # between 256 MiB and 2 GiB: the figures the specs cite (docs/guides/searchers.md, section 6)
        assert 256 * MIB <= hw.cuda_context_bytes <= 2 ** 31, name
        assert hw.usable_memory_bytes == hw.memory_bytes - hw.cuda_context_bytes
    spec = tmp_path / "gpu.yaml"
    spec.write_text("name: gpu\nmemory_bytes: 8.0e+10\ncuda_context_bytes: 5.36870912e+8\nhbm_bytes_per_second: 1e12\n"
                    "peak_flops_per_second: {bf16: 1e14}\ndevices_per_node: 8\nnetwork: {}\n")
    assert load_hardware_yaml(spec).cuda_context_bytes == 536_870_912
