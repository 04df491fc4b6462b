"""DeepSpeed ZeRO's contiguous gradient bucket (``reduce_bucket_elements``, ``reduce_buckets``), ZeRO-3's
reuse distance (``reuse_distance_elements``) and prefetching (``live_parameters_elements``), and the ZeRO
optimizer's step (``ddp_engine=deepspeed``, ``sub_group_elements``).

DeepSpeed itself, run on the CPU, says when its ZeRO optimizers hold the bucket, which parameters ZeRO-3 keeps
gathered across the forward's end and what its step allocates (tests/_deepspeed_probe.py); ndcost's peaks are set beside that on strategies
whose peak moment is known, and its bytes beside figures derived by hand. The DeepSpeed reader's and writer's side
is tests/test_trainer_deepspeed.py.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import ndcost  # noqa: F401  (the installed package first)

import ndcost as nd
from ndcost.errors import InvalidStrategy

PROBE = Path(__file__).with_name("_deepspeed_probe.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _probe(mode: str) -> dict:
    pytest.importorskip("deepspeed")
    run = subprocess.run([sys.executable, str(PROBE), str(_free_port()), mode], capture_output=True, text=True,
                         timeout=900, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def deepspeed_seen():
    return _probe("buckets")


def test_deepspeed_holds_its_bucket_as_the_rule_says(deepspeed_seen):
    # 1000 elements of bf16 a buffer, two under overlap_comm at ZeRO 1-2 (stage_1_and_2.py setup_buckets), one at
    # ZeRO-3 whatever overlap_comm says (stage3.py, made at its start)
    one = 2 * 1000
    for overlap in (0, 1):
        b = one * (1 + overlap)
        # ZeRO-1: from the step's first gradient to the boundary's reduction (the second backward's end)
        assert deepspeed_seen[f"1,{overlap}"] == {"loss": [0, b], "backward": [b, b], "after_backward": [b, 0],
                                                  "after_step": 0}
        # ZeRO-2: from each backward's first gradient to its end
        assert deepspeed_seen[f"2,{overlap}"] == {"loss": [0, 0], "backward": [b, b], "after_backward": [0, 0],
                                                  "after_step": 0}
        # ZeRO-3: always, one buffer
        assert deepspeed_seen[f"3,{overlap}"] == {"loss": [one, one], "backward": [one, one],
                                                  "after_backward": [one, one], "after_step": one}


@pytest.fixture(scope="module")
def model():
    return nd.resolve("llama-3.1-8b", census="off")


# bf16 parameters with an fp32 master copy and states; two sequences of 4,096 a micro-batch put the peak at the
# loss's backward (the 128,256-entry vocabulary's logits)
BASE = "dp=8,seq=4096,micro_batch=2,param_dtype=bf16,master_dtype=fp32,optimizer_dtype=fp32,ddp_engine=deepspeed"


def cost(model, base=BASE, **fields):
    extra = ",".join(f"{k}={v}" for k, v in fields.items())
    return model.evaluate(f"{base},{extra}")


def communication(c) -> int:
    return c.stages[0].bytes_by_category["communication"]


def moment(c) -> str:
    return c.stages[0].provenance["moment"]


@pytest.mark.parametrize("zero, micro_batches, buffers, at_loss", [
    (1, 1, 1, False),  # ZeRO-1's first micro-batch: no gradient yet at the loss
    (1, 2, 1, True),   # its later micro-batches' losses hold it (made by the first backward)
    (1, 2, 2, True),
    (2, 2, 1, False),  # ZeRO-2 frees it at every backward's end
    (2, 2, 2, False),
    (3, 1, 1, True),   # ZeRO-3: for the run
    (3, 2, 1, True),
])
def test_the_loss_moment_holds_the_bucket_where_deepspeed_does(model, zero, micro_batches, buffers, at_loss):
    elements = 1000
    plain = cost(model, zero=zero, num_micro_batches=micro_batches)
    held = cost(model, zero=zero, num_micro_batches=micro_batches, reduce_bucket_elements=elements,
                reduce_buckets=buffers)
    assert moment(plain) == moment(held) == "output backward"
    bucket = elements * buffers * 2
    assert held.peak_bytes - plain.peak_bytes == (bucket if at_loss else 0)
    assert communication(held) - communication(plain) == (bucket if at_loss else 0)


@pytest.mark.parametrize("zero, buffers", [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)])
def test_a_bucket_larger_than_the_rest_peaks_in_the_backward(zero, buffers):
    # Mistral-7B's 32,000-entry vocabulary: one sequence's loss holds little more than the backward
    model = nd.resolve("mistral-7b-v0.1", census="off")
    base = BASE.replace("micro_batch=2", "micro_batch=1")
    elements = 2_000_000_000  # 4 GB a buffer, 8 GB two: the backward's moments now peak
    plain = cost(model, base, zero=zero)
    held = cost(model, base, zero=zero, reduce_bucket_elements=elements, reduce_buckets=buffers)
    bucket = elements * buffers * 2
    if zero == 3:  # held at every moment: the same moment, exactly the bucket more
        assert moment(held) == moment(plain) and held.peak_bytes - plain.peak_bytes == bucket
    else:
        assert moment(held) in ("last layer backward", "end of backward", "embedding backward")
        assert communication(held) == bucket  # the only buffer of data-parallel ZeRO-1/2 without SP
        assert plain.peak_bytes < held.peak_bytes < plain.peak_bytes + bucket  # a moment below the loss's


@pytest.mark.parametrize("fields, words", [
    (dict(reduce_bucket_elements=1000), "with zero=0: the bucket is DeepSpeed ZeRO's"),
    (dict(zero=1, pp=2, reduce_bucket_elements=1000), "with pp=2: DeepSpeed's pipeline engine"),
    (dict(zero=1, reduce_bucket_elements=1000, ddp_engine="megatron"), "ddp_engine=megatron: the bucket is "
                                                                        "DeepSpeed's"),
    (dict(zero=2, reduce_buckets=2), "reduce_buckets=2 with reduce_bucket_elements=0"),
    (dict(zero=3, reduce_bucket_elements=1000, reduce_buckets=2), "ZeRO-3 allocates one bucket"),
])
def test_a_bucket_deepspeed_would_not_make_is_refused(model, fields, words):
    fields = {"dp": 8, "seq": 4096, **fields}
    with pytest.raises(InvalidStrategy, match=words):
        model.evaluate(nd.Strategy(**fields))


# --- ZeRO-3's reuse distance ---------------------------------------------------------------------------------
# the probe's Llama: a layer's elements (q 64x64, k and v 64x32, o 64x64, gate, up and down 64x128, two norms of
# 64); T, the head's (100x64) and final norm's, which every distance of the last layers counts twice
LAYER = 4096 + 2 * 2048 + 4096 + 3 * 8192 + 2 * 64
MODULE = 8192  # the largest module
T = 6400 + 64


def _layer_elements(kept: dict) -> int:
    return sum(n for name, n in kept.items() if ".layers." in name)


@pytest.fixture(scope="module")
def deepspeed_reuse():
    return _probe("reuse")


def _small_llama(tmp_path_factory, layers: int):
    """The probe's Llama (its LLAMA) as a config.json, resolved."""
    folder = tmp_path_factory.mktemp(f"llama{layers}")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 100, "tie_word_embeddings": False, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}))
    return nd.resolve(str(folder / "config.json"), census="off")


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory):
    return _small_llama(tmp_path_factory, 4)


def _gathered_more(model, recompute: str, distance: int) -> tuple:
    """ZeRO-3's communication above reuse_distance_elements=0 at the peak's moment, in fp32 elements, and the
    moment (eight sequences of 2,048: the activations make the loss's moment, or the recomputed layers' backward,
    the peak)."""
    base = f"dp=1,zero=3,seq=2048,micro_batch=8,param_dtype=fp32,recompute={recompute}"
    plain, held = model.evaluate(base), model.evaluate(f"{base},reuse_distance_elements={distance}")
    assert moment(plain) == moment(held)
    return (communication(held) - communication(plain)) / 4, moment(held)


def test_deepspeed_keeps_what_the_reuse_distance_reaches(deepspeed_reuse):
    # the last layer's modules are reused after twice the elements after them and the head's (no recompute):
    # down_proj (none after it) from 2T, up_proj from 2 * 8192 + 2T, gate_proj from 4 * 8192 + 2T ...
    assert deepspeed_reuse["0,0"] == {}
    assert _layer_elements(deepspeed_reuse["20000,0"]) == MODULE  # down_proj alone: 2T < 20,000 < 2*8192 + 2T
    assert _layer_elements(deepspeed_reuse["50000,0"]) == 3 * MODULE  # up and gate too
    assert _layer_elements(deepspeed_reuse["1000000000,0"]) == 4 * LAYER
    assert "lm_head.weight" in deepspeed_reuse["20000,0"]  # the head: reused at once
    # checkpointed, a layer's backward gathers its last module, reruns its forward, then runs the others'
    # backward: its modules but the last reused after about a layer and 2T; the layer before after 3 layers more
    assert _layer_elements(deepspeed_reuse["60000,1"]) == LAYER  # LAYER + 2T < 60,000
    assert _layer_elements(deepspeed_reuse["170000,1"]) == 2 * LAYER  # 4 * LAYER + 2T < 170,000 < 7 * LAYER + 2T


@pytest.mark.parametrize("distance", [0, 20000, 50000, 80000, 1_000_000_000])
def test_the_reuse_estimate_is_deepspeeds_within_a_module(deepspeed_reuse, small_llama, distance):
    estimate, at = _gathered_more(small_llama, "none", distance)
    assert at == "output backward"
    truth = _layer_elements(deepspeed_reuse[f"{distance},0"])
    # by hand: the last layer's tail of (D - 2T) / 2 elements, a layer's before it (D - 2T - 2 * LAYER) / 2
    assert estimate == min(max((distance - 2 * T) / 2, 0), 4 * LAYER)
    assert estimate <= truth < estimate + MODULE  # the module straddling the estimate's edge kept whole


@pytest.mark.parametrize("distance, layers", [(20000, 0), (60000, 1), (170000, 2), (1_000_000_000, 4)])
def test_recomputed_layers_are_kept_whole_as_deepspeed_keeps_them(deepspeed_reuse, small_llama, distance, layers):
    estimate, at = _gathered_more(small_llama, "full", distance)
    assert at == "last layer backward"  # the last layer, running, is counted as gathered with or without it
    kept = _layer_elements(deepspeed_reuse[f"{distance},1"])
    assert kept // LAYER == layers or (distance == 20000 and kept == MODULE)  # 20,000: the last module alone
    assert estimate == max(layers - 1, 0) * LAYER


def test_a_seven_billion_llama_keeps_what_the_distance_leaves_after_its_head():
    # Mistral-7B: T = 32,000 * 4,096 + 4,096, a layer 218,112,000 elements; D = 1e9 keeps the tail of
    # D / 2 - T over the last two layers without recompute, one layer (P + 2T < D < 4P + 2T) with it
    model = nd.resolve("mistral-7b-v0.1", census="off")
    base = "dp=8,zero=3,seq=4096,param_dtype=bf16,master_dtype=fp32,optimizer_dtype=fp32"
    head = 32000 * 4096 + 4096
    for recompute, elements in (("none", 10 ** 9 // 2 - head), ("full", 218_112_000)):
        plain = model.evaluate(f"{base},recompute={recompute}")
        held = model.evaluate(f"{base},recompute={recompute},reuse_distance_elements=1000000000")
        assert moment(plain) == moment(held) == "output backward"
        assert held.peak_bytes - plain.peak_bytes == 2 * elements


def test_llama_3_1_8b_keeps_nothing_beyond_its_head():
    # its head alone (128,256 * 4,096 elements) is more than half of the default distance
    model = nd.resolve("llama-3.1-8b", census="off")
    base = "dp=8,zero=3,seq=4096,param_dtype=bf16"
    assert model.evaluate(base).peak_bytes == model.evaluate(f"{base},reuse_distance_elements=1000000000").peak_bytes


@pytest.mark.parametrize("field, deepspeeds", [("reuse_distance_elements", "stage3_max_reuse_distance"),
                                               ("live_parameters_elements", "stage3_max_live_parameters")])
@pytest.mark.parametrize("fields", [dict(zero=2), dict(zero=3, pp=2)])
def test_zero3s_own_fields_off_zero3_or_with_a_pipeline_are_refused(model, fields, field, deepspeeds):
    with pytest.raises(InvalidStrategy, match=f"{deepspeeds}, which runs without a pipeline"):
        model.evaluate(nd.Strategy(dp=8, seq=4096, **{field: 1000}, **fields))


# --- ZeRO-3's prefetching: what it gathers stays gathered, up to the live parameters ----------------------------
# the probe's 16-layer Llama: every element, and those but the head's and final norm's, and the first layer's
# with the embedding's
ALL16 = 16 * LAYER + 2 * 6400 + 64
BUT_HEAD = ALL16 - 6400 - 64
FIRST = LAYER + 6400


@pytest.fixture(scope="module")
def deepspeed_live():
    return _probe("live")


@pytest.fixture(scope="module")
def llama16(tmp_path_factory):
    return _small_llama(tmp_path_factory, 16)


@pytest.mark.parametrize("live", [100_000, 300_000, 1_000_000_000])
def test_the_prefetcher_keeps_what_it_gathers_up_to_the_live_parameters(deepspeed_live, llama16, live):
    seen = deepspeed_live[str(live)]
    # DeepSpeed: the least of the live bound and the stage's elements, over the bound by less than a module (its
    # prefetch's last module); the first layer's backward holds that layer and the embedding
    for at, held in (("after_forward", ALL16), ("last_layer", BUT_HEAD)):
        assert min(live, held) <= seen[at] < min(live, held) + MODULE
    assert seen["first_layer"] == FIRST
    assert seen["after_forward"] == ALL16 if live > ALL16 else True  # all of it where the bound is above
    # ndcost: the same sets, gathered in place of the one running module (the largest: a layer) at the loss
    # (no recompute: the loss's moment peaks) and at the last layer's backward (full recompute: it peaks there)
    for recompute, held in (("none", ALL16), ("full", BUT_HEAD)):
        base = f"dp=1,zero=3,seq=2048,micro_batch=8,param_dtype=fp32,recompute={recompute}"
        plain, kept = llama16.evaluate(base), llama16.evaluate(f"{base},live_parameters_elements={live}")
        assert moment(plain) == moment(kept) == ("output backward" if recompute == "none" else "last layer backward")
        assert (communication(kept) - communication(plain)) / 4 == min(live, held) - LAYER


def test_the_backward_gathers_again_what_the_live_bound_left(deepspeed_live, llama16):
    # DeepSpeed's backward all-gathers again the layers the bound did not keep (and the embedding, the forward's
    # first, which ndcost's time leaves with the root): the layers' elements past the bound less the head's and
    # final norm's (kept first); within a module of ndcost's estimate
    layers, head = 16 * LAYER, 6400 + 64
    for live in (100_000, 300_000, 1_000_000_000):
        again = max(layers + head - live, 0)
        embedding = 6400 if again else 0
        assert again - MODULE < deepspeed_live[str(live)]["backward_gathered"] - embedding <= again
        # ndcost's time: each layer's backward gather that share of its own, beside none (the bound past the stage)
        # and all (no bound); the reduce-scatters alike in the three
        base = "dp=8,zero=3,seq=2048,ddp_engine=deepspeed,live_parameters_elements="
        none, every, bounded = (llama16.evaluate(f"{base}{d}").time.communication_seconds
                                for d in (10 ** 9, 0, live))
        assert (bounded - none) / (every - none) == pytest.approx(min(again, layers) / layers, rel=1e-9)


# --- the ZeRO optimizer's step: the gradients' norm in fp64, then their fp32 copy ------------------------------
# the probe's Llama (LLAMA): 4 layers of 36,992 elements (q and o 64 x 64, k and v 64 x 32, three 64 x 128 MLP
# matrices, two norms), embedding and head 100 x 64, final norm 64
SMALL = 4 * (2 * 4096 + 2 * 2048 + 3 * 8192 + 2 * 64) + 2 * 6400 + 64
SCALARS = 64  # the norms' and the loss scale's few scalars beside the copies


@pytest.fixture(scope="module")
def deepspeed_step():
    return _probe("step")


def _step(model, **fields):
    """One rank's cost at a sequence of 16 tokens: the optimizer step its peak (the activations are small)."""
    return model.evaluate(nd.Strategy(**{**dict(dp=1, seq=16, param_dtype="bf16", grad_dtype="bf16",
                                                 master_dtype="fp32", optimizer_dtype="fp32",
                                                 ddp_engine="deepspeed"), **fields}))


def test_the_step_copies_the_gradients_to_fp32_as_deepspeed_does(deepspeed_step, small_llama):
    # the partition's bf16 gradients copied flat (2 bytes an element), then to fp32 (4): 6 bytes an element at
    # once (stage_1_and_2.py step, stage3.py _prepare_fp32_grad_for_sub_group); one rank: the partition is all
    for stage in (1, 2, 3):
        seen = deepspeed_step[f"{stage},False,None"]
        assert 6 * SMALL <= seen["peak"] < 6 * SMALL + SCALARS and seen["end"] < SCALARS
        cost = _step(small_llama, zero=stage)
        assert cost.stages[0].provenance["moment"] == "optimizer step"
        assert cost.stages[0].bytes_by_category["working"] == 6 * SMALL
        assert _step(small_llama, zero=stage, ddp_engine="auto").peak_bytes < cost.peak_bytes  # no such copy


def test_zero0s_fp16_optimizer_copies_each_gradient_to_fp32_then_flat(deepspeed_step, small_llama):
    # the config's AdamW is DeepSpeed's FusedAdam, which its FP16_Optimizer wraps at ZeRO 0 (engine.py
    # _configure_fp16_optimizer): each bf16 gradient copied to fp32, the copies flattened, 8 bytes a parameter at
    # once (fused_optimizer.py step), then the flat fp32 gradient alone
    seen = deepspeed_step["0,False,None"]
    assert seen["optimizer"] == "FP16_Optimizer"
    assert 8 * SMALL <= seen["peak"] < 8 * SMALL + SCALARS and seen["end"] < SCALARS
    cost = _step(small_llama, zero=0)
    assert cost.stages[0].provenance["moment"] == "optimizer step"
    assert cost.stages[0].bytes_by_category["working"] == 8 * SMALL


def test_zero3_copies_a_sub_group_at_a_time(deepspeed_step, small_llama):
    # sub-groups close at their first parameter past sub_group_size (stage3.py _create_fp16_sub_groups): the
    # estimate's 50,000 elements are short of DeepSpeed's by less than that parameter (an MLP matrix, 8,192)
    seen = deepspeed_step["3,False,50000"]["peak"]
    cost = _step(small_llama, zero=3, sub_group_elements=50_000)
    assert cost.stages[0].bytes_by_category["working"] == 6 * 50_000
    assert 6 * 50_000 <= seen < 6 * (50_000 + 8192)


def test_the_bf16_optimizer_copies_nothing(deepspeed_step, small_llama):
    # ZeRO-1 with fp32 gradient accumulation runs DeepSpeed's BF16_Optimizer: its fp32 gradients are the copy
    assert deepspeed_step["1,True,None"]["optimizer"] == "BF16_Optimizer"
    assert deepspeed_step["1,True,None"]["peak"] < 1024
    assert _step(small_llama, zero=1, grad_dtype="fp32").peak_bytes == _step(small_llama, zero=1, grad_dtype="fp32",
                                                                             ddp_engine="auto").peak_bytes


def test_zero1_steps_with_its_partitions_gradients_alone(small_llama):
    # two ranks: DeepSpeed's ZeRO-1 frees the other rank's half of the gradients at the boundary's reduction
    # (measured: the step starts holding its bf16 parameters, its fp32 half and its half of the bf16 gradients)
    half = SMALL // 2
    stage = _step(small_llama, dp=2, zero=1).stages[0]
    assert stage.provenance["moment"] == "optimizer step"
    assert stage.bytes_by_category["gradients"] == 2 * half
    assert stage.bytes_by_category["working"] == 6 * half


def test_a_seven_billion_llamas_step_by_hand():
    # Mistral-7B over 8 ranks: a partition of 7,241,732,096 / 8 = 905,216,512 elements; the step holds the bf16
    # parameters, the fp32 master and Adam's two fp32 moments of the partition, its bf16 gradients and the
    # 6-byte copy; the norm's fp64 piece (the embedding's 131,072,000
    # elements, 8 bytes) is less
    model = nd.resolve("mistral-7b-v0.1", census="off")
    part = 905_216_512
    cost = model.evaluate("dp=8,zero=2,seq=128,param_dtype=bf16,master_dtype=fp32,optimizer_dtype=fp32,"
                          "ddp_engine=deepspeed")
    stage = cost.stages[0]
    assert stage.provenance["moment"] == "optimizer step"
    assert stage.bytes_by_category["gradients"] == 2 * part
    assert stage.bytes_by_category["working"] == 6 * part
    assert cost.peak_bytes == 2 * 7_241_732_096 + 12 * part + 2 * part + 6 * part


def test_the_norm_of_a_piece_filling_the_partition_outweighs_the_copy():
    # two ranks of the probe's two-linear model (131,072 elements each) measured by hand with DeepSpeed 0.19.8:
    # each rank's partition is one weight, whose fp64 norm (8 bytes an element) is the step's peak, not its fp32
    # copy (4: no flat copy of one tensor); ndcost takes the embedding or head as the largest piece, here a
    # partition of 113,152,064 elements (Mistral-7B over 64 ranks) inside its 131,072,000-element embedding
    from types import SimpleNamespace

    import numpy as np

    from ndcost.compose.memory import _deepspeed_step_bytes

    part = np.array([[113_152_064.0]])
    params = SimpleNamespace(head_gradient=np.array([[0.0]]), embedding_gradient=np.array([[131_072_000.0]]))
    batch = SimpleNamespace(grad_bytes=np.array([2.0]))
    for zero, expected in ((2, 8 * 113_152_064), (3, 6 * 113_152_064)):  # ZeRO-3's piece: the embedding's shard
        cols = {"zero": np.array([zero]), "sub_group_elements": np.array([0])}
        held = _deepspeed_step_bytes(np.array([True]), params, batch, cols, part, np.zeros((1, 1)), np.array([[64.0]]))
        assert held["step_temporaries"][0, 0] == expected


def test_sub_groups_are_deepspeeds_alone(small_llama):
    with pytest.raises(InvalidStrategy, match="use ddp_engine=deepspeed, or sub_group_elements=0"):
        small_llama.evaluate("dp=2,zero=3,seq=16,sub_group_elements=1000")
    with pytest.raises(InvalidStrategy, match="sub_group_size, which runs without a pipeline"):
        small_llama.evaluate("dp=2,zero=2,seq=16,ddp_engine=deepspeed,sub_group_elements=1000")
