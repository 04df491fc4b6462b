"""Async TP as torch's micro-pipelined TP runs it (Strategy.async_tp), derived by hand on a 2-layer toy.

torch/distributed/_symmetric_memory/__init__.py: ``_pipelined_all_gather_and_consume`` copies the local shard
into the symmetric buffer (not overlapped), multiplies it while the first remote shard is pulled, then each
remote shard is multiplied after its pull, so an all-gather + matmul of ``tp`` pieces takes
``c + (tp - 1) max(c, x) + copy`` (``c`` one piece's matmul, ``x`` one shard's pull); two streams run
neighbouring pieces side by side, so a piece of ``M / tp`` rows runs at the efficiency of ``2 M / tp`` rows;
``_pipelined_produce_and_all2all`` mirrors it (each peer's chunk multiplied, then pulled while the next is
multiplied, the local chunk last), then sums the ``tp`` partials. torch/_inductor/fx_passes/micro_pipeline_tp.py
fuses an all-gather with the matmuls taking it as their left operand and a reduce-scatter with the one matmul
producing its input: in the backward the output gradient's all-gather before the row GEMMs' input gradient, and
the input gradient's reduce-scatter only where one GEMM fed it (q, k and v's gradients are summed first).

The toy: hidden 1024, tp 4, one sequence of 8192 tokens (M), so a piece has 2048 rows; its GEMMs: q, k, v
(1024 -> 1024 each, column), o (row), an ungated up (1024 -> 4096, column) and down (row). The hardware's GEMM
table gives 0.25 of the 1e15 peak at 4096 rows (two pieces) and 0.5 at 8192 (any width); HBM 2e12 B/s; NVLink
400e9 B/s a device at efficiency 1.
"""
from __future__ import annotations

import numpy as np
import pytest

from ndcost.compose import time as ct
from ndcost.errors import InvalidValue
from ndcost.values import Hardware, NetworkLevel
from ndcost.work import Gemm, KindWork, ModelWork

H, TP, M, PEAK, HBM, LINK = 1024, 4, 8192, 1e15, 2e12, 400e9
PIECE, PAIR = M // TP, 2 * M // TP  # a piece's rows, and two pieces' (their efficiency)
EFF_PIECE, EFF_WHOLE = 0.25, 0.5
BYTES = 2  # bf16 activations and weights


def toy_hardware() -> Hardware:
    ones = {key: 1.0 for key in ("memory", "memory_backward", "collective_within_node", "collective_across_nodes")}
    return Hardware(name="toy", memory_bytes=1 << 40, hbm_bytes_per_second=HBM, peak_flops_per_second={"bf16": PEAK},
                    network=(NetworkLevel(name="within_node", bytes_per_second=LINK),
                             NetworkLevel(name="across_nodes", bytes_per_second=50e9)),
                    efficiency=ones,
                    kernel_tables={"gemm": {"bf16": {"m": [PAIR, M], "n": [1], "k": [1],
                                                     "efficiency": [[[EFF_PIECE]], [[EFF_WHOLE]]]}},
                                   "source": "test: a GEMM's efficiency by its rows alone"})


def toy_model(layers: int = 2) -> ModelWork:
    gemms = (Gemm(op_class="attention", in_features=H, out_features=H, count=3, split="column"),
             Gemm(op_class="attention", in_features=H, out_features=H, split="row"),
             Gemm(op_class="other", in_features=H, out_features=4 * H, split="column"),
             Gemm(op_class="other", in_features=4 * H, out_features=H, split="row"))
    work = KindWork(kind="dense", source="test", attention_mm_flops_per_token=8.0 * H * H,
                    other_mm_flops_per_token=16.0 * H * H, dense_parameters=12 * H * H, gemms=gemms,
                    compiled_elementwise_elements_per_token=0.0, compiled_replicated_elements_per_token=0.0)
    return ModelWork(name="toy", hidden_size=H, vocab_size=1024, kinds=("dense",), work={"dense": work},
                     layer_runs=(("dense", layers),), source="test")


STRATEGY = f"tp={TP},sp=true,compile=true,seq={M},param_dtype=bf16"


def matmul_seconds(flops_per_token, rows, efficiency):
    """A rank's GEMMs of *flops_per_token* (at TP 1) over *rows* tokens, split over TP."""
    return flops_per_token * rows / TP / (PEAK * efficiency)


def by_hand():
    """(forward, backward) exposed seconds of one layer, and its TP communication seconds each pass."""
    shard = PIECE * H * BYTES                      # one shard of the hidden activations (4 MiB)
    pull = shard / LINK                            # 10.5 us
    copy = 2 * shard / HBM                         # the local shard into the symmetric buffer, 4.2 us
    reduction = (TP * shard + shard) / HBM         # the tp partials read, one shard written: 10.5 us

    def fused(flops_per_token, tail):
        piece = matmul_seconds(flops_per_token, PIECE, EFF_PIECE)
        whole = matmul_seconds(flops_per_token, M, EFF_WHOLE)
        return piece + (TP - 1) * max(piece, pull) + tail - whole

    qkv, o, up, down = 6.0 * H * H, 2.0 * H * H, 8.0 * H * H, 8.0 * H * H  # forward FLOPs a token
    # weights are read well within each piece (the largest, up's 2 MiB a rank: 1 us at 2e12 B/s)
    assert 4 * H * H * BYTES / TP / HBM < matmul_seconds(up, PIECE, EFF_PIECE)
    assert matmul_seconds(qkv, PIECE, EFF_PIECE) > pull > matmul_seconds(o, PIECE, EFF_PIECE)  # both pipeline ends
    forward = fused(qkv, copy) + fused(o, reduction) + fused(up, copy) + fused(down, reduction)
    # the backward: o's and down's input gradients behind their output gradient's all-gather (the forward's
    # FLOPs each), up's input gradient before its reduce-scatter; q, k and v's summed gradients: NCCL's
    nccl_reduce_scatter = float(ct._collectives()["reduce_scatter"](np.array([M * H * BYTES]), np.array([TP]),
                                                                    np.array([LINK]), np.array([0.0]))[0])
    backward = fused(o, copy) + fused(down, copy) + fused(up, reduction) + nccl_reduce_scatter
    comm_forward = 4 * (TP - 1) * pull + 2 * copy + 2 * reduction
    comm_backward = 3 * (TP - 1) * pull + 2 * copy + reduction + nccl_reduce_scatter
    return forward, backward, comm_forward + comm_backward


def test_two_layers_expose_what_the_pipelines_do_not_hide():
    forward, backward, comm = by_hand()
    priced = ct.step_time(toy_model(), [STRATEGY + ",async_tp=true"], toy_hardware())
    assert float(priced.exposed_communication_seconds[0]) == pytest.approx(2 * (forward + backward), rel=1e-12)
    assert float(priced.communication_seconds[0]) == pytest.approx(2 * comm, rel=1e-12)


def test_without_async_tp_every_tp_collective_is_nccls_and_exposed():
    coll = ct._collectives()
    message = (np.array([M * H * BYTES]), np.array([TP]), np.array([LINK]), np.array([0.0]))
    per_pass = 2 * float(coll["all_gather"](*message)[0] + coll["reduce_scatter"](*message)[0])
    priced = ct.step_time(toy_model(), [STRATEGY, STRATEGY + ",async_tp=true"], toy_hardware())
    alone = ct.step_time(toy_model(), [STRATEGY], toy_hardware())
    assert float(priced.exposed_communication_seconds[0]) == pytest.approx(2 * 2 * per_pass, rel=1e-12)
    for name in ct.TIME_FIELDS:  # a row without async TP is priced alike beside one with it
        assert getattr(priced, name)[0] == getattr(alone, name)[0]
    # the pieces' matmuls are priced in the exposed TP time, the layers' compute is the same
    assert priced.compute_seconds[1] == priced.compute_seconds[0]


def test_full_recompute_repeats_the_forwards_fused_collectives():
    forward, backward, _ = by_hand()
    priced = ct.step_time(toy_model(), [STRATEGY + ",async_tp=true,recompute=full"], toy_hardware())
    assert float(priced.exposed_communication_seconds[0]) == pytest.approx(2 * (2 * forward + backward), rel=1e-12)


def test_async_tp_beyond_an_nvlink_domain_is_refused_naming_the_fix():
    with pytest.raises(InvalidValue, match=r"async_tp=true with tp=16: .* one NVLink domain \(8 devices.*"
                                           r"use tp <= 8 or async_tp=false"):
        ct.step_time(toy_model(), [f"tp=16,sp=true,compile=true,async_tp=true,seq={M}"], toy_hardware())


def test_a_batch_refuses_only_its_rows_running_async_tp_beyond_the_nvlink_domain():
    import ndcost
    model = ndcost.resolve("llama-3.1-8b", hardware="h100", census="off")
    result = model.evaluate_many(["tp=16,sp=true,compile=true,async_tp=true,seq=4096",
                                  "tp=8,sp=true,compile=true,async_tp=true,seq=4096"])
    assert not result.valid[0] and result.valid[1]
    assert "async_tp=true with tp=16" in result.reason[0] and "use tp <= 8 or async_tp=false" in result.reason[0]
