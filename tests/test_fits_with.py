"""What a planner whose strategy does not fit tries next: the strategies one change away that fit
(``ndcost.search.one_change_fits``, ``ndcost estimate``'s ``fits with one change`` and ``fits_with``)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ndcost
from ndcost import Strategy
from ndcost.search import _one_change, one_change_fits

LLAMA = "llama-3.1-8b"
TIGHT = "seq=8192,micro_batch=2"  # one H100 holding the whole model and two 8,192-token sequences


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "ndcost", *argv], capture_output=True, text=True, timeout=300)


def _tokens_a_step(s: Strategy) -> int:
    return s.dp * s.fsdp * s.num_micro_batches * s.micro_batch * s.seq


def test_the_changes_tried_are_the_documented_ones():
    # by hand from one_change's docstring, for TP 2 over 4 data-parallel replicas of 2-sequence micro-batches
    original = Strategy.parse("tp=2,dp=4,seq=4096,micro_batch=2")
    tried = {s.differences(original) for s in _one_change(original)}
    assert tried == {
        "recompute=selective", "recompute=core_attention", "recompute=full",
        "zero=1", "zero=2", "zero=3", "dp=1,fsdp=4",
        "sp=true", "vocab_parallel=true",
        "micro_batch=1,num_micro_batches=2",
        "dp=2,tp=4,num_micro_batches=2", "dp=2,pp=2,num_micro_batches=2", "dp=2,cp=2,num_micro_batches=2",
        "offload_activations=true", "offload_optimizer=true", "ddp_engine=torch_bucket_view"}
    # a strategy already sharded, split, recomputing and offloading has fewer to try; FSDP's ranks give the
    # doubled TP its devices where dp is odd
    busy = Strategy.parse("tp=2,fsdp=4,sp=true,vocab_parallel=true,recompute=full,seq=4096,"
                          "offload_activations=true,offload_optimizer=true")
    assert {s.differences(busy) for s in _one_change(busy)} == {
        "recompute=selective", "recompute=core_attention",
        "fsdp=2,tp=4,num_micro_batches=2", "fsdp=2,pp=2,num_micro_batches=2", "fsdp=2,cp=2,num_micro_batches=2"}


def test_deepspeeds_own_knobs_are_tried():
    # overlap_comm off (one bucket), half the bucket; ZeRO-3 holds one bucket (stage3.py) and under FSDP none;
    # ZeRO-3 releasing every module after its use
    zero1 = Strategy.parse("dp=8,zero=1,seq=4096,ddp_engine=deepspeed,reduce_bucket_elements=500000000,"
                           "reduce_buckets=2")
    tried = {s.differences(zero1) for s in _one_change(zero1)}
    assert {"reduce_buckets=1", "reduce_bucket_elements=250000000", "zero=2", "zero=3,reduce_buckets=1",
            "dp=1,fsdp=8,zero=0,reduce_bucket_elements=0,reduce_buckets=1"} <= tried
    zero3 = Strategy.parse("dp=8,zero=3,seq=4096,ddp_engine=deepspeed,reduce_bucket_elements=500000000,"
                           "reuse_distance_elements=1000000000,live_parameters_elements=1000000000")
    tried = {s.differences(zero3) for s in _one_change(zero3)}
    assert {"reuse_distance_elements=0", "live_parameters_elements=0", "reduce_bucket_elements=250000000"} <= tried
    assert "reduce_buckets=1" not in tried  # it holds one already
    model = ndcost.resolve("mistral-7b-v0.1", census="off")
    assert all(model.evaluate_many([s]).valid[0] for s in _one_change(zero3)
               if any(name in s.differences(zero3) for name in ("reuse", "live", "reduce_bucket")))


def test_every_change_offered_fits_on_the_same_devices_and_batch_fastest_first():
    model = ndcost.resolve(LLAMA, hardware="h100", census="off")
    original = Strategy.parse(TIGHT)
    assert not model.evaluate(original).fits
    offered = one_change_fits(model, original, top=10)
    assert offered, "full recompute keeps a layer's input alone: some change fits"
    assert "recompute=full" in [change for change, _ in offered]
    steps = [c.step_seconds for _, c in offered]
    assert steps == sorted(steps)
    for change, candidate in offered:
        s = candidate.strategy
        assert s == Strategy.parse(f"{original},{change}")  # the change is what it names
        assert s.devices == original.devices and _tokens_a_step(s) == _tokens_a_step(original)
        cost = model.evaluate(s)  # one at a time, as a planner would price it
        assert cost.fits and (cost.peak_bytes, cost.reserved_bytes) == (candidate.peak_bytes, candidate.reserved_bytes)
        assert cost.time.step_seconds == pytest.approx(candidate.step_seconds, rel=1e-12)
    assert len(one_change_fits(model, original, top=1)) == 1


def test_estimate_names_the_changes_that_fit_and_says_when_none_does():
    done = _cli("estimate", LLAMA, "--hardware", "h100", "--census", "off", "--strategy", TIGHT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = lines.index("fits with one change (the same devices and tokens a step), fastest first:")
    offered = [line for line in lines[at + 1:] if line.startswith("  ") and ": peak " in line]
    assert offered and any(line.startswith("  recompute=full: peak ") for line in offered)
    assert all(len(line) <= 100 for line in lines)
    data = json.loads(_cli("estimate", LLAMA, "--hardware", "h100", "--census", "off", "--strategy", TIGHT,
                           "--json").stdout)
    assert data["fits"] is False and data["fits_with"]
    assert {"change", "strategy", "peak_bytes", "reserved_bytes", "step_seconds"} <= set(data["fits_with"][0])
    # 405B's states alone outgrow one device whatever one change does
    huge = json.loads(_cli("estimate", "llama-3.1-405b", "--census", "off", "--strategy", "seq=4096",
                           "--json").stdout)
    assert huge["fits"] is False and huge["fits_with"] == []
    text = _cli("estimate", "llama-3.1-405b", "--census", "off", "--strategy", "seq=4096").stdout
    assert "no one change fits" in text and "ndcost search" in text
    # a strategy that fits is offered nothing
    fitting = json.loads(_cli("estimate", LLAMA, "--census", "off", "--strategy", "fsdp=8,seq=4096",
                              "--json").stdout)
    assert fitting["fits"] is True and "fits_with" not in fitting
