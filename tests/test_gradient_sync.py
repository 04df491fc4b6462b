"""``Strategy.gradient_sync`` against figures derived here by hand: FSDP's gradients held whole and reduce-scattered
once a step (``last_micro_batch``, as ``torch/distributed/pipelining/stage.py`` runs a stage's backward), DDP's
all-reduce every micro-batch (``every_micro_batch``), and the combinations refused.

Bytes on Llama-3.1-8B's shapes (``test_mesh``'s hand count and hand-made records); seconds on
``test_time_step``'s toy model and hardware (every efficiency 1, no latency beyond NCCL's).
"""
from __future__ import annotations

import math

import pytest

from ndcost.values import Strategy

from test_mesh import EMB, FINAL, HEAD, LAYER, S, _stage, _time, llama8b  # noqa: F401 (llama8b: the fixture)
from test_time_step import BASE, STEP, WITHIN, toy_parameters, toy_spec

# torchtitan's mixed precision: fp32 parameters, gradients and AdamW moments, bf16 gathers; FSDP 2 x PP 2 of
# 1F1B over 4 micro-batches: each stage holds 16 of the 32 layers, the first the embedding, the last the head
PP_FSDP = f"pp=2,fsdp=2,num_micro_batches=4,seq={S},param_dtype=fp32,compute_dtype=bf16,reshard_after_forward=false"
FIRST = 16 * LAYER + EMB           # the first stage's parameters
LAST = 16 * LAYER + HEAD + FINAL   # the last stage's


def test_first_stage_holds_its_gradients_whole_in_fp32(llama8b):
    """1F1B's first stage keeps 2 micro-batches in flight of 4: its peak backward (the last layer's) follows
    another, so every gradient of the stage exists. auto: FSDP2 reduce-scatters each layer's after its backward,
    the stage holds the fp32 shards, ceil(FIRST / 2) x 4 bytes, and the layer's whole fp32 gradient waits in its
    reduce-scatter buffer (communication, beside the embedding and 16 layers gathered in bf16).
    last_micro_batch: the accumulated gradients stay unsharded in the reduce dtype, FIRST x 4 bytes, and no
    gradient waits in a buffer."""
    auto = _stage(llama8b, PP_FSDP)
    last = _stage(llama8b, PP_FSDP + ",gradient_sync=last_micro_batch")
    assert auto.provenance["moment"] == last.provenance["moment"] == "last layer backward"
    assert auto.bytes_by_category["gradients"] == math.ceil(FIRST / 2) * 4
    assert last.bytes_by_category["gradients"] == FIRST * 4
    assert auto.bytes_by_category["communication"] == EMB * 2 + 16 * LAYER * 2 + LAYER * 4
    assert last.bytes_by_category["communication"] == EMB * 2 + 16 * LAYER * 2
    # the persistent shards do not change: parameters, master (none) and AdamW's two moments
    for name in ("parameters", "master", "optimizer_states"):
        assert last.bytes_by_category[name] == auto.bytes_by_category[name]
    assert last.peak_bytes - auto.peak_bytes == FIRST * 4 - math.ceil(FIRST / 2) * 4 - LAYER * 4


def test_last_stage_holds_its_gradients_whole_at_the_loss(llama8b):
    """The head's stage, its 16 layers and root (final norm, head) gathered in bf16, having run a backward before.
    auto: it peaks at its last layer's backward, holding the fp32 shards, the head's whole fp32 gradient (FSDP2
    reduce-scatters the root's at the backward's end) and the layer's before its reduce-scatter. last_micro_batch:
    every gradient whole, so it peaks at the loss (the loss's bytes beside them), no gradient in a buffer."""
    auto = _stage(llama8b, PP_FSDP, stage=1)
    last = _stage(llama8b, PP_FSDP + ",gradient_sync=last_micro_batch", stage=1)
    gathered = (HEAD + FINAL) * 2 + 16 * LAYER * 2
    assert auto.provenance["moment"] == "last layer backward"
    assert auto.bytes_by_category["gradients"] == math.ceil(LAST / 2) * 4
    assert auto.bytes_by_category["communication"] == gathered + HEAD * 4 + LAYER * 4
    assert last.provenance["moment"] == "output backward"
    assert last.bytes_by_category["gradients"] == LAST * 4
    assert last.bytes_by_category["communication"] == gathered


def test_resharding_stage_keeps_its_layers_gathered_after_a_backward(llama8b):
    """reshard_after_forward=true, last_micro_batch: the forward reshards each layer, the backward does not
    (set_reshard_after_backward(False)); counted as all 16 layers gathered at the backward (not two)."""
    text = PP_FSDP.replace(",reshard_after_forward=false", "")
    auto, last = _stage(llama8b, text), _stage(llama8b, text + ",gradient_sync=last_micro_batch")
    assert auto.bytes_by_category["communication"] == EMB * 2 + 2 * LAYER * 2 + LAYER * 4
    assert last.bytes_by_category["communication"] == EMB * 2 + 16 * LAYER * 2


@pytest.mark.parametrize("text", ["dp=4", "dp=4,zero=1", "tp=2,sp=true"])
def test_last_micro_batch_is_what_ddp_and_zero1_do_already(llama8b, text):
    base = llama8b.evaluate(Strategy.parse(f"{text},seq={S},num_micro_batches=2"))
    last = llama8b.evaluate(Strategy.parse(f"{text},seq={S},num_micro_batches=2,gradient_sync=last_micro_batch"))
    assert [s.bytes_by_category for s in last.stages] == [s.bytes_by_category for s in base.stages]
    assert last.time.step_seconds == base.time.step_seconds


@pytest.mark.parametrize("text, message", [
    ("dp=4,zero=2,gradient_sync=last_micro_batch", "gradient_sync=last_micro_batch with zero=2"),
    ("dp=4,zero=3,gradient_sync=last_micro_batch", "gradient_sync=last_micro_batch with zero=3"),
    ("dp=4,zero=1,gradient_sync=every_micro_batch", "gradient_sync=every_micro_batch with zero=1"),
])
def test_combinations_no_engine_runs_are_refused(llama8b, text, message):
    cost = llama8b.evaluate_many([Strategy.parse(f"{text},seq={S},num_micro_batches=2")])
    assert not cost.valid[0] and message in cost.reason[0]


def test_unknown_value_names_the_allowed_ones():
    with pytest.raises(Exception, match="allowed: auto, every_micro_batch, last_micro_batch"):
        Strategy.parse("gradient_sync=sometimes")


# ---------------------------------------------------------------------------
# seconds, on the toy model: a ring gather or scatter of B bytes over n ranks sends (n - 1) / n * B
# ---------------------------------------------------------------------------
def test_fsdp_reduce_scatter_counted_once_a_step():
    """FSDP 2, three micro-batches, bf16, layers kept gathered (test_mesh's
    test_reshard_after_forward_false_drops_the_backward_gather: 3 x (2 one + 6 collectives), ``one`` the half of
    the toy's parameter bytes a gather or scatter of them all sends). last_micro_batch: the two layers and the
    root gathered once, reduce-scattered once: 2 one + 6 collectives a step; the reduce-scatter (one and 3
    collectives) exposed whole, after the backward."""
    spec = toy_spec()
    one = (1 / 2) * toy_parameters(spec) * 2 / WITHIN
    text = "seq=512,fsdp=2,num_micro_batches=3,reshard_after_forward=false"
    r = _time(text, text + ",gradient_sync=last_micro_batch")
    assert r.communication_seconds[0] == pytest.approx(3 * (2 * one + 6 * (BASE + STEP)), rel=1e-12)
    assert r.communication_seconds[1] == pytest.approx(2 * one + 6 * (BASE + STEP), rel=1e-12)
    assert r.exposed_communication_seconds[1] >= one + 3 * (BASE + STEP)


def test_ddp_all_reduces_each_micro_batch_under_every_micro_batch():
    """DDP over 2, three micro-batches: auto (DDP's no_sync, as priced before) all-reduces once a step;
    every_micro_batch runs the same all-reduce after each of the 3 backwards."""
    r = _time("seq=512,dp=2,num_micro_batches=3", "seq=512,dp=2,num_micro_batches=3,gradient_sync=every_micro_batch")
    assert r.communication_seconds[0] > 0
    assert r.communication_seconds[1] == pytest.approx(3 * r.communication_seconds[0], rel=1e-12)


def test_zero2_reduce_scatters_each_micro_batch_as_deepspeed_does():
    """ZeRO-2 over 2, three micro-batches: DeepSpeed reduces its gradient buckets every micro-step into the
    partitioned gradients (deepspeed/runtime/zero/stage_1_and_2.py), ZeRO-1 once, at the accumulation boundary;
    so under auto ZeRO-2 runs two more reduce-scatters of the toy's gradients (one ring step over 2 ranks: one
    + BASE + STEP each), and with one micro-batch the two stages communicate alike."""
    spec = toy_spec()
    one = (1 / 2) * toy_parameters(spec) * 2 / WITHIN
    r = _time("seq=512,dp=2,zero=1,num_micro_batches=3", "seq=512,dp=2,zero=2,num_micro_batches=3",
              "seq=512,dp=2,zero=1", "seq=512,dp=2,zero=2")
    c = r.communication_seconds
    assert c[1] - c[0] == pytest.approx(2 * (one + BASE + STEP), rel=1e-9)
    assert c[3] == pytest.approx(c[2], rel=1e-12)
