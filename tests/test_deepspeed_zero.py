"""DeepSpeed ZeRO's contiguous gradient bucket (``reduce_bucket_elements``, ``reduce_buckets``) and ZeRO-3's
reuse distance (``reuse_distance_elements``).

DeepSpeed itself, run on the CPU, says when its ZeRO optimizers hold the bucket and which parameters ZeRO-3 keeps
gathered across the forward's end (tests/_deepspeed_probe.py); ndcost's peaks are set beside that on strategies
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
