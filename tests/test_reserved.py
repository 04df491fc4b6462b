"""Reserved bytes as the composition adds them to a stage's allocated peak, against figures derived by hand.

The tiny Llama and its hand-made records are test_memory's; the records here also state the allocator
replay's figures (what ``ndcost.allocator.stack_excess`` gives the census), so the composition's own rules
are checked: each persistent category one block rounded up to 2 MiB (kRoundLarge, get_allocation_size in
c10/cuda/CUDACachingAllocator.cpp), each kept layer's steady excess, the working excess once, the output
layer's on the head's stage, a full-recompute layer's kept input packed into segments, and no claim where
nothing was simulated.
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


def test_selective_recompute_is_not_simulated_and_claims_nothing(simulated):
    cost = simulated.evaluate(Strategy.parse(f"seq={S},recompute=selective"))
    assert cost.reserved_bytes is None and "recompute=selective" in cost.reserved_reason
    assert cost.valid and cost.peak_bytes > 0  # the allocated figures stand


def test_evaluate_many_matches_evaluate(simulated):
    texts = [f"seq={S}", f"seq={S},tp=2", f"seq={S},recompute=selective", f"seq={S},pp=2,num_micro_batches=2"]
    batch = simulated.evaluate_many([Strategy.parse(t) for t in texts])
    for i, text in enumerate(texts):
        single = simulated.evaluate(Strategy.parse(text)).reserved_bytes
        assert (None if batch.reserved_bytes[i] < 0 else int(batch.reserved_bytes[i])) == single
