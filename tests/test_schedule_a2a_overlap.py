"""Megatron-LM's EP all-to-all overlap (``--overlap-moe-expert-parallel-comm``, the combined 1F1B) as the
schedules ``interleaved-a2a-overlap`` and ``1f1b-a2a-overlap``: what a rank holds, what it hides, how the
Megatron-LM reader reads and writes it.

The held counts walk Megatron-LM's own order (megatron/core/pipeline_parallel/schedules.py,
``get_pp_rank_microbatches``: ``(p - r - 1) * 2 + (v - 1) * p`` warm-up forwards, "one extra micro-batch forward
step before the 1f1b stages" under the overlap, forward k on chunk ``(k // p) % v``, NVIDIA/Megatron-LM
d98e8a6); the hidden seconds are the all-to-all's bandwidth and latency terms priced from the bytes counted
by hand.
"""
from __future__ import annotations

import pytest

import ndcost
from ndcost.errors import InvalidStrategy, InvalidValue
from ndcost.manager import registry
from ndcost.plugins.collectives import all_to_all_seconds
from ndcost.trainers import from_config, to_config


def held_walk(p, v, m, rank, extra):
    """Chunk-micro-batches rank *rank* holds as its first backward starts: the warm-up forwards, the one before
    the first backward, and *extra* more (the overlap's). The forwards run a chunk's micro-batches in groups of
    torch's ``microbatches_per_round`` (torch/distributed/pipelining/schedules.py, ScheduleInterleaved1F1B:
    ``m // max(1, m // p)``, ``p`` where ``m`` is a multiple of it, as Megatron-LM's), forward k on chunk
    ``(k // group) % v`` (``forward_stage_index``), the warm-up ``(v - 1) group + 2 (p - 1 - rank)``."""
    group = m // max(1, m // p)
    warmup = min((p - rank - 1) * 2 + (v - 1) * group + extra, m * v)
    held = [0] * v
    for k in range(min(warmup + 1, m * v)):
        held[(k // group) % v] += 1
    return held


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 4, 32), (2, 24, 32), (4, 2, 4),
                                     (4, 2, 1), (4, 2, 2), (4, 3, 3), (8, 2, 5), (4, 2, 6), (4, 2, 10)])
def test_interleaved_a2a_overlap_holds_one_more_warm_up_forward(p, v, m):
    plain, overlap = registry().get("schedule/interleaved"), registry().get("schedule/interleaved-a2a-overlap")
    for rank in range(p):
        for chunk in range(v):
            assert int(plain.in_flight(p, v, m, rank, chunk)) == held_walk(p, v, m, rank, 0)[chunk]
            assert int(overlap.in_flight(p, v, m, rank, chunk)) == held_walk(p, v, m, rank, 1)[chunk]
    assert overlap.overlaps_expert_communication and not plain.overlaps_expert_communication


def test_without_pipelining_one_micro_batch_is_held_and_pp_is_refused():
    # combined_1f1b_schedule_for_no_pipelining: micro-batch i's backward frees its layers from the last while
    # i + 1's forward fills them from the first, so one micro-batch's activations are held, as under 1F1B
    model = ndcost.resolve("qwen3-30b-a3b", hardware="h200", census="off")
    base = "ep=8,dp=8,zero=1,seq=4096,micro_batch=1,num_micro_batches=4"
    assert model.evaluate(base + ",schedule=1f1b-a2a-overlap").peak_bytes == model.evaluate(base).peak_bytes
    with pytest.raises(InvalidStrategy, match="needs virtual stages with pp > 1: use schedule=interleaved-a2a"):
        model.evaluate("pp=2,ep=8,dp=8,zero=1,seq=4096,num_micro_batches=4,schedule=1f1b-a2a-overlap")


def test_the_overlap_hides_each_pass_all_to_alls_under_the_other_micro_batch_compute():
    # Qwen3-30B-A3B (48 MoE layers, hidden 2048, 8 experts a token) on one H200 node, ep=8: a pass dispatches
    # and combines a copy of each of a micro-batch's 4,096 tokens for each of its experts (bf16), an all-to-all
    # over NVLink each. A layer's compute at 4,096 tokens exceeds that, so the overlap hides all of it: forward
    # and backward, each layer, each micro-batch. The traffic itself is unchanged.
    model = ndcost.resolve("qwen3-30b-a3b", hardware="h200", census="off")
    hw, m, layers = model.hardware, 4, 48
    base = f"ep=8,dp=8,zero=1,seq=4096,micro_batch=1,num_micro_batches={m}"
    plain, overlap = model.evaluate(base).time, model.evaluate(base + ",schedule=1f1b-a2a-overlap").time
    nvlink = next(level for level in hw.network if level.name == "within_node")
    message = 4096 * 8 * 2048 * 2
    one = float(all_to_all_seconds(message, 8, nvlink.bytes_per_second * hw.efficiency["collective_within_node"],
                                   nvlink.latency_seconds))
    hidden = m * layers * 2 * (2 * one)  # micro-batches x layers x passes x (dispatch + combine)
    assert plain.exposed_communication_seconds - overlap.exposed_communication_seconds == pytest.approx(
        hidden, rel=1e-9)
    assert plain.step_seconds - overlap.step_seconds == pytest.approx(hidden, rel=1e-9)
    assert overlap.communication_seconds == pytest.approx(plain.communication_seconds, rel=1e-12)
    assert overlap.compute_seconds == plain.compute_seconds


def _megatron(tmp_path, flags, devices=16):
    path = tmp_path / "run.sh"
    path.write_text("pretrain_gpt.py --tensor-model-parallel-size 1 --expert-model-parallel-size 8 "
                    "--seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 "
                    "--use-distributed-optimizer " + flags + "\n")
    return from_config("megatron", str(path), devices=devices, model="qwen3-30b-a3b")


def test_megatron_reads_the_flag_as_the_combined_schedule_and_writes_it_back(tmp_path):
    a2a = "--overlap-moe-expert-parallel-comm --moe-token-dispatcher-type alltoall"
    config = _megatron(tmp_path, "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 " + a2a)
    assert (config.strategy.schedule, config.strategy.vpp) == ("interleaved-a2a-overlap", 2)
    written = to_config("megatron", config.strategy)
    assert "--overlap-moe-expert-parallel-comm" in written
    (tmp_path / "back.sh").write_text(written)
    assert from_config("megatron", str(tmp_path / "back.sh"), devices=16,
                       model="qwen3-30b-a3b").strategy == config.strategy
    assert _megatron(tmp_path, "--pipeline-model-parallel-size 1 " + a2a).strategy.schedule == "1f1b-a2a-overlap"


@pytest.mark.parametrize("flags, why", [
    ("--pipeline-model-parallel-size 2 --overlap-moe-expert-parallel-comm --moe-token-dispatcher-type alltoall",
     "needs virtual stages"),
    ("--overlap-moe-expert-parallel-comm", "alltoall or flex token dispatcher"),
    ("--overlap-moe-expert-parallel-comm --moe-token-dispatcher-type alltoall --recompute-granularity full "
     "--recompute-method uniform --recompute-num-layers 1", "without full recomputation"),
])
def test_megatron_refuses_what_its_config_asserts(tmp_path, flags, why):
    with pytest.raises(InvalidValue, match=why):
        _megatron(tmp_path, flags)


def test_megatron_refuses_the_flag_without_expert_parallelism(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("pretrain_gpt.py --tensor-model-parallel-size 1 --seq-length 4096 --micro-batch-size 1 "
                    "--global-batch-size 8 --bf16 --overlap-moe-expert-parallel-comm "
                    "--moe-token-dispatcher-type alltoall\n")
    with pytest.raises(InvalidValue, match="needs expert parallelism"):
        from_config("megatron", str(path), devices=8, model="qwen3-30b-a3b")


def test_expert_tp_gathers_and_scatters_the_routed_copies_beside_the_all_to_alls():
    # Megatron-LM's alltoall dispatcher under etp 2: a rank's 4,096 tokens' 8 copies (bf16) go over EP (4 ranks,
    # strided by etp) in an all-to-all, then are all-gathered over the expert-TP pair and reduce-scattered back
    # before the combine's all-to-all, each pass. The overlap hides all four under the other micro-batch's compute,
    # so the exposed seconds drop by exactly them; at ep 1 the pair alone remains (no all-to-all).
    from ndcost.compose.topology import group_link
    from ndcost.plugins.collectives import all_gather_seconds

    model = ndcost.resolve("qwen3-30b-a3b", hardware="h200", census="off")
    hw, m, layers = model.hardware, 4, 48
    copies = 4096 * 8 * 2048 * 2

    def pair_seconds(size, stride, ring=True):
        bw, lat, link = group_link(hw, stride, size, hw.efficiency, ring=ring)
        return bw.item(), lat.item(), {key: value.item() for key, value in link.items()}

    bw, lat, link = pair_seconds(4, 2, ring=False)
    a2a = float(all_to_all_seconds(copies, 4, bw, lat, **link))
    bw, lat, link = pair_seconds(2, 1)
    gather = float(all_gather_seconds(copies, 2, bw, lat, **link))  # reduce-scatter: NCCL's same model
    for layout, per_pass in (("ep=4,etp=2", 2 * a2a + 2 * gather), ("etp=2", 2 * gather)):
        base = f"{layout},dp=8,zero=1,seq=4096,micro_batch=1,num_micro_batches={m}"
        plain, overlap = model.evaluate(base).time, model.evaluate(base + ",schedule=1f1b-a2a-overlap").time
        assert plain.exposed_communication_seconds - overlap.exposed_communication_seconds == pytest.approx(
            m * layers * 2 * per_pass, rel=1e-9)
