"""The last stage's outputs torch.distributed.pipelining holds (``pp_engine=torch``, ``pp_return_outputs``).

torch/distributed/pipelining/stage.py keeps each micro-batch's output in ``fwd_cache`` until its backward pops it
(a local reference holds it through the stage's backward); under ``return_outputs`` it also appends it to
``output_chunks`` (emptied only at the next step's start), and schedules.py's ``step()`` returns their
concatenation (``_merge_outputs``). A Llama output is its head's 16-bit logits: tokens x vocabulary x 2 bytes,
the vocabulary split by tp under ``vocab_parallel``. Every figure below is that product, derived here, not read
from ndcost.
"""
from __future__ import annotations

import os
import tempfile

import pytest

import ndcost

V = 128256
TOKENS = 8192
LOGITS_BYTES = TOKENS * V * 2  # one micro-batch's 16-bit logits, Llama-3.1-8B at 8,192 tokens


@pytest.fixture(scope="module")
def llama8b():
    return ndcost.resolve("llama-3.1-8b", census="off")


def _last_stage(model, text):
    return model.evaluate(text).stages[-1]


def test_the_outputs_wait_beside_the_last_micro_batchs_loss(llama8b):
    """No recompute, two micro-batches under 1F1B: the last stage peaks at its last micro-batch's loss backward.
    Megatron-LM's engine holds no output there beyond the loss's own bytes (the eager loss keeps its fp32
    log-softmax, not the logits; the compiled one keeps the logits). torch's holds the current micro-batch's
    logits in fwd_cache (one more output with the eager loss, none with the compiled one), and under
    return_outputs the earlier micro-batch's too (one more again)."""
    base = "pp=2,num_micro_batches=2,micro_batch=1,seq=8192,recompute=none"
    for loss, engine_more, returned_more in (("torch", 1, 1), ("compiled", 0, 1)):
        megatron = _last_stage(llama8b, f"{base},loss_engine={loss},pp_engine=megatron")
        torch_engine = _last_stage(llama8b, f"{base},loss_engine={loss},pp_engine=torch")
        returned = _last_stage(llama8b, f"{base},loss_engine={loss},pp_engine=torch,pp_return_outputs=true")
        for stage in (megatron, torch_engine, returned):
            assert stage.provenance["moment"] == "output backward"
        # the receive buffers pp_engine=torch adds are communication; the outputs are the output layer's
        assert (torch_engine.bytes_by_category["output"] - megatron.bytes_by_category["output"]
                == engine_more * LOGITS_BYTES)
        assert returned.peak_bytes - torch_engine.peak_bytes == returned_more * LOGITS_BYTES


def test_the_merged_copy_doubles_them_after_the_backward(llama8b):
    """Sixteen micro-batches under full recompute: step()'s concatenation holds the sixteen outputs twice, more
    than the optimizer step's temporaries, and the stage peaks there (the optimizer step's moment)."""
    stage = _last_stage(llama8b, "pp=4,num_micro_batches=16,micro_batch=1,seq=8192,recompute=full,"
                                 "pp_engine=torch,pp_return_outputs=true")
    assert stage.provenance["moment"] == "optimizer step"
    assert stage.bytes_by_category["output"] == 2 * 16 * LOGITS_BYTES
    assert stage.bytes_by_category["working"] < 16 * LOGITS_BYTES


def test_vocabulary_parallel_splits_them(llama8b):
    base = ("tp=2,sp=true,vocab_parallel=true,pp=2,num_micro_batches=2,micro_batch=1,seq=8192,recompute=none,"
            "pp_engine=torch")
    plain, kept = _last_stage(llama8b, base), _last_stage(llama8b, f"{base},pp_return_outputs=true")
    assert kept.peak_bytes - plain.peak_bytes == LOGITS_BYTES // 2


@pytest.mark.parametrize("text", [
    "pp=2,num_micro_batches=2,seq=8192,pp_engine=megatron",  # Megatron-LM returns no outputs
    "pp=2,num_micro_batches=2,seq=8192",                     # pp_engine=auto: as megatron
    "num_micro_batches=2,seq=8192,pp_engine=torch",          # no pipeline
])
def test_no_effect_outside_torchs_pipeline(llama8b, text):
    assert llama8b.evaluate(f"{text},pp_return_outputs=true").peak_bytes == llama8b.evaluate(text).peak_bytes


def test_torchtitans_reader_prices_the_torchtitan_it_targets():
    """torchtitan passes return_outputs=False from e5ef99aa (2025-10-22): its jobs keep no outputs, and the
    reader says how to price an older one."""
    from ndcost.trainers import to_config
    text = to_config("torchtitan", "fsdp=2,pp=2,num_micro_batches=2,seq=8192,pp_engine=torch,"
                     "gradient_sync=last_micro_batch", model="llama-3.1-8b")
    assert "return_outputs" not in text  # no knob: torchtitan decides
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "job.toml")
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        config = ndcost.from_config("torchtitan", path, devices=4)
    assert config.strategy.pp_engine == "torch" and not config.strategy.pp_return_outputs
    assert any("pp_return_outputs=true" in note for note in config.defaults)
