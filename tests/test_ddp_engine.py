"""``ddp_engine``: when a data-parallel replica's whole gradients exist, as each DDP engine holds them.

By hand on the tiny Llama of ``test_memory.py`` (its parameters ``P``, bf16 gradients), and beside PyTorch's own
DistributedDataParallel on a real Transformers model (gloo, one process): its buckets hold every gradient, in
the parameters' dtype, beside the ``.grad`` tensors autograd makes unless ``gradient_as_bucket_view``.
"""
from __future__ import annotations

import re

import pytest

import ndcost
from ndcost.values import Strategy

from test_memory import cost_model, llama_counts, llama_spec
from test_memory_rules import P, S


@pytest.fixture(scope="module")
def llama():
    return cost_model(llama_spec(), llama_counts(), S)


def _cost(model, text):
    return model.evaluate(Strategy.parse(f"seq={S},{text}"))


def test_deepspeed_holds_the_gradients_autograd_makes_as_one_device(llama):
    # DeepSpeed's engine at ZeRO 0 reduces autograd's gradients at the boundary: the moments of one device
    one, replicated = _cost(llama, "dp=1"), _cost(llama, "dp=2,ddp_engine=deepspeed")
    assert replicated.stages[0].bytes_by_category == one.stages[0].bytes_by_category
    assert replicated.stages[0].bytes_by_category["gradients"] < 2 * P  # the first backward makes them as it runs


def test_torch_buckets_hold_every_gradient_again_at_every_moment(llama):
    plain, ddp = _cost(llama, "dp=2,ddp_engine=deepspeed"), _cost(llama, "dp=2,ddp_engine=torch")
    assert _cost(llama, "dp=2").peak_bytes == ddp.peak_bytes  # auto is torch's
    stage = ddp.stages[0].bytes_by_category
    assert stage["communication"] == 2 * P  # the buckets: every bf16 gradient, whatever the moment
    assert ddp.peak_bytes == plain.peak_bytes + 2 * P
    assert ddp.stages[0].provenance == plain.stages[0].provenance  # the same moment, 2P above


@pytest.mark.parametrize("engine", ["torch_bucket_view", "megatron"])
def test_a_gradient_buffer_holds_every_gradient_from_the_first_backward(llama, engine):
    # the first backward finds the buffer made: as the second micro-batch's backward, which finds every gradient
    first = _cost(llama, f"dp=2,ddp_engine={engine}")
    accumulating = _cost(llama, "dp=2,num_micro_batches=2,ddp_engine=deepspeed")
    assert first.stages[0].bytes_by_category["gradients"] == 2 * P
    assert first.stages[0].bytes_by_category == accumulating.stages[0].bytes_by_category


@pytest.mark.parametrize("text", ["dp=1", "dp=2,zero=2", "fsdp=2", "dp=2,fsdp=2"])
@pytest.mark.parametrize("engine", ["torch", "torch_bucket_view", "megatron"])
def test_no_effect_without_ddp(llama, text, engine):
    # one replica, sharded gradients (ZeRO-2 reduce-scatters them) or FSDP (HSDP's replicas included): no DDP
    # (DeepSpeed's beside them where its step, which runs on one replica too, is not the peak)
    plain = _cost(llama, f"{text},ddp_engine=deepspeed")
    assert plain.stages[0].provenance["moment"] != "optimizer step"
    assert _cost(llama, f"{text},ddp_engine={engine}").stages == plain.stages


def test_torch_buckets_are_pytorchs():
    # PyTorch's DistributedDataParallel on a real Transformers Llama in bf16: the bytes its reducer's buckets
    # hold (its logging data) are ndcost's buckets at dp=2
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=512, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=32, num_hidden_layers=2, vocab_size=2048)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        wrapped = DistributedDataParallel(model, bucket_cap_mb=0.01)
        sizes = [int(size) for size in re.findall(r"\d+", wrapped._get_ddp_logging_data()["bucket_sizes"])]
        ids = torch.randint(0, 2048, (1, 8))
        wrapped(input_ids=ids, labels=ids).loss.backward()
        grads = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    finally:
        dist.destroy_process_group()
    assert len(grads) == len(list(model.parameters()))  # each .grad its own storage: the buckets are more
    buckets = sum(sizes)
    model = ndcost.resolve(config.to_dict(), census="off")
    cost = model.evaluate("dp=2,seq=8,ddp_engine=torch")
    assert cost.stages[0].bytes_by_category["communication"] == buckets
    # beside DeepSpeed's engine (autograd's gradients alone), the optimizer on the host: its step's fp32 copies
    # (the FP16_Optimizer's, on the device) out of the way
    cost, deepspeed = (model.evaluate(f"dp=2,seq=8,offload_optimizer=true,ddp_engine={engine}")
                       for engine in ("torch", "deepspeed"))
    assert cost.peak_bytes == deepspeed.peak_bytes + buckets
