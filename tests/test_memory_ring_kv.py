"""What a context-parallel attention keeps of the other ranks' keys and values, and what its backward holds.

Hand figures for the small Llama of test_memory (16 query heads, 4 KV heads of 64, bf16, tp 1) under each
CP algorithm and rotation, read from the sources of what runs:

- torch's ring attention (torch/distributed/tensor/experimental/_context_parallel/_attention.py): the SDPA
  op is dispatched on DTensors, so autograd saves the op's inputs, the rank's own q, k, v: nothing of the
  other ranks is kept. ``_templated_ring_attention_backward`` gathers again. At a step's kernel call, from
  the second step on, it holds the fp32 dK/dV ring (``_AllToAllRotater`` whatever ``rotate_method``): the
  received block, the ``torch.cat`` it sends on and the next block, 3 fp32 blocks; the fp32 dQ accumulator
  (``convert_to_f32``); and the K/V rotater's buffers: ``_AllGatherRotater``'s ``cp`` blocks plus the step's
  send concatenation (``next_kv``, still referenced) under allgather, the current block, its send copy and
  the next under alltoall (p2p), two at cp = 2 where the last step sends none.
- Transformer Engine's AttnFuncWithCPAndKVP2P, which Megatron-LM's a2a+p2p (ndcost's hybrid) runs
  (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py): ``ctx.save_for_backward``
  keeps ``p2p_comm_buffers[-1]``, one block the size of the rank's own; its backward allocates two
  ``(2, *kv.shape)`` buffers (K/V and dK/dV) and ``dq_buffer`` in the compute dtype.
- Colossal-AI's RingAttention (colossalai/shardformer/layer/attn.py): ``ctx.save_for_backward`` keeps the
  local q, k, v; its backward holds two K/V buffers (``torch.stack((k, v))`` and the next), two fp32
  ``dkv_buffers`` and dq in fp32 (``dq_block.float()``).

No algorithm keeps the other ranks' blocks: before, ring, Colossal-AI and hybrid kept ``cp - 1`` of them as
activations and two blocks as a standing communication buffer, which Ulysses alone keeps now.

The layer's record (test_memory's, its working figure raised so the last layer's backward is the step's peak)
is its figure without CP; the ``working`` category is that moment's layer peak over what the layer keeps.
"""
from __future__ import annotations

import pytest
from test_memory import DH, KV, SAVED, SAVED_TP, WORK, A, L, cost_model, llama_counts, llama_spec

from ndcost.values import Strategy

S = 4096
WORK_TP = 600_000.0                 # raised from test_memory's: the last layer's backward peaks
KEPT = SAVED + SAVED_TP             # a layer's own saves a token, without CP
BLOCK = 2 * KV * DH * 2             # a token's keys and values in bf16: the rank's own block, a token
FP32_BLOCK = 2 * KV * DH * 4        # the same in fp32 (torch's dK/dV accumulators)
DQ_FP32 = A * DH * 4                # torch's fp32 dQ accumulator, a token
DQ_BF16 = A * DH * 2                # Transformer Engine's dq_buffer, a token


@pytest.fixture(scope="module")
def model():
    return cost_model(llama_spec(), llama_counts(), S, working_tp_per_token=WORK_TP)


@pytest.mark.parametrize("algo, rotate, cp, working_extra, communication", [
    # torch, allgather: cp gathered blocks + the send concatenation, 3 fp32 dK/dV blocks, fp32 dQ
    ("ring", "allgather", 2, 3 * BLOCK + 3 * FP32_BLOCK + DQ_FP32, 0),
    ("ring", "allgather", 4, 5 * BLOCK + 3 * FP32_BLOCK + DQ_FP32, 0),
    # torch, alltoall: current, its send copy, next (two at cp = 2)
    ("ring", "p2p", 2, 2 * BLOCK + 3 * FP32_BLOCK + DQ_FP32, 0),
    ("ring", "p2p", 4, 3 * BLOCK + 3 * FP32_BLOCK + DQ_FP32, 0),
    # Transformer Engine's a2a+p2p: two (K/V, dK/dV) buffers and dq in bf16
    ("hybrid", "p2p", 4, 4 * BLOCK + DQ_BF16, 0),
    # Colossal-AI: its own block stacked and the next, two fp32 dK/dV buffers, fp32 dq
    ("colossal", "allgather", 4, 2 * BLOCK + 2 * FP32_BLOCK + DQ_FP32, 0),
    # Ulysses holds its heads' whole sequence through the all-to-all: nothing of the ring's; two blocks in flight
    ("ulysses", "allgather", 4, 0, 2 * BLOCK),
])
def test_kept_and_working_by_algorithm_and_rotation(model, algo, rotate, cp, working_extra, communication):
    # (the cp ranks all-reduce their gradients: Megatron-LM's DDP holds no buckets beside the ring's)
    stage, = model.evaluate(Strategy(seq=S, cp=cp, cp_algo=algo, cp_rotate=rotate, ddp_engine="megatron")).stages
    tokens = S // cp
    assert stage.provenance["moment"] == "last layer backward"
    assert stage.bytes_by_category["activations"] == L * tokens * KEPT  # the layer's own saves alone
    # the layer's backward peak (its record's working figure plus the ring's buffers) over what it keeps
    assert stage.bytes_by_category["working"] == tokens * (WORK + WORK_TP + working_extra - KEPT)
    assert stage.bytes_by_category["communication"] == tokens * communication


def test_a_checkpointed_layer_s_backward_holds_the_ring_s_buffers(model):
    """Under full recompute the layer keeps its input only (no gathered block, as before); the recomputed
    attention's backward holds the ring's buffers all the same. The peak is the first layer's backward, where
    the working category is that layer's whole figure."""
    stage, = model.evaluate(Strategy(seq=S, cp=2, recompute="full")).stages
    assert stage.provenance["moment"] == "end of backward"
    assert stage.bytes_by_category["activations"] == 0
    assert stage.bytes_by_category["working"] == (S // 2) * (WORK + WORK_TP + 3 * BLOCK + 3 * FP32_BLOCK + DQ_FP32)
