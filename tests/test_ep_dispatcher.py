"""ep_dispatcher=deepep: DeepEP's node-deduplicated dispatch against hand derivations.

The expected reach (ranks or NVLink domains a token's experts lie on) is checked against brute-force
enumeration of every group choice and expert set; the time model's EP seconds against the all-to-all's
bandwidth term derived by hand (both dispatchers cross the same group, so their latency terms cancel).
"""
from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

import ndcost
from ndcost.compose.time import expected_parts_reached
from ndcost.errors import InvalidValue
from ndcost.models import load_model
from ndcost.trainers import from_config, to_config


def brute_force_reach(experts, top_k, groups, allowed, parts):
    """The mean over every allowed group choice and expert set of the parts holding one of the experts."""
    per_group, per_part = experts // groups, experts // parts
    total, count = Fraction(0), 0
    for chosen in itertools.combinations(range(groups), allowed):
        pool = [e for g in chosen for e in range(g * per_group, (g + 1) * per_group)]
        for picked in itertools.combinations(pool, top_k):
            total += len({e // per_part for e in picked})
            count += 1
    return total / count


@pytest.mark.parametrize("experts, top_k, groups, allowed, parts", [
    (16, 3, 4, 2, 2), (16, 3, 4, 2, 4), (16, 3, 4, 2, 8), (16, 3, 4, 2, 16),  # parts and groups nest
    (16, 4, 1, 1, 4), (16, 4, 1, 1, 8),                                       # no group limit
    (12, 2, 2, 1, 6), (24, 3, 8, 3, 2),
])
def test_expected_reach_is_the_enumerated_mean(experts, top_k, groups, allowed, parts):
    assert expected_parts_reached(experts, top_k, groups, allowed, parts) == pytest.approx(
        float(brute_force_reach(experts, top_k, groups, allowed, parts)), rel=1e-12)


def test_groups_that_do_not_nest_with_the_parts_give_an_upper_bound():
    # 24 experts: 4 groups of 6, 3 parts of 8; neither count divides the other
    exact = float(brute_force_reach(24, 3, 4, 2, 3))
    bound = expected_parts_reached(24, 3, 4, 2, 3)
    assert bound >= exact and bound == pytest.approx(float(brute_force_reach(24, 3, 1, 1, 3)), rel=1e-12)
    assert expected_parts_reached(24, 3, 1, 1, 5) == 3.0  # 5 parts do not divide 24 experts: every copy
    assert expected_parts_reached(256, 8, 8, 4, 1) == 1.0


def test_deepseek_v3_reaches_at_most_its_four_groups():
    # 256 experts in 8 groups of 32, a token's 8 from 4 groups: on 8 domains (one group each) the reach is
    # 4 (1 - C(96, 8) / C(128, 8)), the chance that a chosen group holds none of the 8 being C(96, 8) / C(128, 8)
    from math import comb
    assert expected_parts_reached(256, 8, 8, 4, 8) == pytest.approx(4 * (1 - comb(96, 8) / comb(128, 8)))
    spec = load_model("deepseek-v3")
    assert (spec.expert_groups, spec.expert_groups_per_token) == (8, 4)
    assert load_model("glm-4.5").expert_groups is None  # n_group 1: not limited


@pytest.mark.parametrize("change, message", [
    ({"n_group": 7}, "n_group 7 does not divide the 256 routed experts"),
    ({"topk_group": 9}, "topk_group 9 exceeds n_group 8"),
    ({"n_group": 64, "topk_group": 1}, "num_experts_per_tok 8 exceeds the 4 experts of topk_group 1 groups"),
])
def test_bad_expert_groups_are_refused(change, message):
    config = dict(load_model("deepseek-v3").hf_config, **change)
    with pytest.raises(InvalidValue, match=message):
        load_model(config)


def _communication(model, strategy):
    return model.evaluate(strategy).time.communication_seconds


def test_deepep_within_an_nvlink_domain_sends_a_token_once_a_rank():
    # DeepSeek-V3 at ep=8 on one H200 node: 8 ranks of 32 experts, one group each, so a token reaches
    # R = expected_parts_reached(256, 8, 8, 4, 8) ranks where alltoall sends its 8 copies. Both all-to-alls span
    # the same 8 ranks (their latency terms equal); the bandwidth term is (n - 1) / n of the message over NVLink's
    # bus bandwidth at collective_within_node, twice a pass (dispatch, combine), forward and backward, for each
    # of the 58 MoE layers (first_k_dense_replace 3; hf-cuda builds no MTP layer) and micro-batch.
    model = ndcost.resolve("deepseek-v3", hardware="h200", census="off")
    base = "ep=8,dp=8,zero=1,seq=1024,micro_batch=1,num_micro_batches=2"
    hw = model.hardware
    nvlink = next(level for level in hw.network if level.name == "within_node").bytes_per_second
    efficiency = hw.efficiency["collective_within_node"]
    token_bytes = 1024 * 7168 * 2  # a micro-batch's tokens at bf16
    reach = expected_parts_reached(256, 8, 8, 4, 8)
    saved_per_pass = 2 * 7 / 8 * (8 - reach) * token_bytes / (nvlink * efficiency)
    expected = 58 * 2 * 2 * saved_per_pass
    saved = _communication(model, base) - _communication(model, base + ",ep_dispatcher=deepep")
    assert saved == pytest.approx(expected, rel=1e-9)


def test_deepep_across_domains_is_the_slower_leg_and_hides_under_dualpipe():
    model = ndcost.resolve("deepseek-v3", hardware="h800", census="off")
    split = "/".join(["2"] * 29 + ["1"] * 3)
    base = (f"pp=16,vpp=2,schedule=dualpipev,ep=64,dp=128,zero=1,seq=4096,num_micro_batches=32,"
            f"pp_layers={split}")
    alltoall, deepep = model.evaluate(base).time, model.evaluate(base + ",ep_dispatcher=deepep").time
    assert deepep.exposed_communication_seconds < alltoall.exposed_communication_seconds
    assert deepep.step_seconds < alltoall.step_seconds
    # ep=1: nothing is dispatched, the field changes nothing
    dense = "dp=8,seq=1024"
    assert model.evaluate(dense).time.step_seconds == model.evaluate(dense + ",ep_dispatcher=deepep").time.step_seconds


def test_dualpipe_hides_deepep_but_for_the_sms_its_kernels_take(monkeypatch):
    # Under DualPipe a pass of c seconds runs beside t seconds of compute, which runs on the SMs DeepEP's kernels
    # leave (a share s = sms / 132 on an H200): both end max(c, t + s c) after they start, so s c is exposed where
    # t > c (every Qwen3-30B-A3B layer at 4,096 tokens: a pass within one NVLink domain is a fraction of the
    # layer's compute). With no SMs taken nothing is exposed; with all 132 the whole pass is; so what 20 SMs
    # expose above none is 20/132 of what all of them expose above none, whatever c is.
    import ndcost.compose.time as time_model

    model = ndcost.resolve("qwen3-30b-a3b", hardware="h200", census="off")
    base = "pp=2,vpp=2,schedule=dualpipev,ep=8,dp=8,zero=1,seq=4096,micro_batch=1,num_micro_batches=8"
    exposed, alltoall = {}, set()
    for sms in (0, 20, 132):
        monkeypatch.setattr(time_model, "DEEPEP_SMS", sms)
        exposed[sms] = model.evaluate(base + ",ep_dispatcher=deepep").time.exposed_communication_seconds
        alltoall.add(model.evaluate(base).time.exposed_communication_seconds)
    assert (exposed[20] - exposed[0]) / (exposed[132] - exposed[0]) == pytest.approx(20 / 132, rel=1e-9)
    assert exposed[0] < exposed[20] < exposed[132]
    assert len(alltoall) == 1  # NCCL's all-to-all: no SMs priced


def test_megatron_flex_dispatcher_reads_as_deepep_and_writes_back(tmp_path):
    args = tmp_path / "args.txt"
    base = ("pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
            "--expert-model-parallel-size 8 --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 ")
    for flags, dispatcher in [("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", "deepep"),
                              ("--moe-enable-deepep", "deepep"),
                              ("--moe-token-dispatcher-type alltoall", "alltoall"), ("", "alltoall")]:
        args.write_text(base + flags + "\n")
        config = from_config("megatron", str(args), devices=64, model="qwen3-30b-a3b")
        assert config.strategy.ep_dispatcher == dispatcher, flags
        if not flags:
            assert any("allgather (Megatron-LM's default) is priced as alltoall" in d for d in config.defaults)
    args.write_text(base + "--moe-enable-deepep\n")
    config = from_config("megatron", str(args), devices=64, model="qwen3-30b-a3b")
    written = to_config("megatron", config.strategy)
    assert "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep" in written
    args.write_text(written)
    assert from_config("megatron", str(args), devices=64, model="qwen3-30b-a3b").strategy == config.strategy
    args.write_text(base + "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend nccl\n")
    with pytest.raises(InvalidValue, match="'nccl' is not priced"):
        from_config("megatron", str(args), devices=64, model="qwen3-30b-a3b")
