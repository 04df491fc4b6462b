"""Which op the census gives each saved tensor to, under Transformers' eager attention (runtime hf-cuda-eager).

Autograd saves an op's inputs before the op reaches a dispatch mode. Eager
attention's two batched matmuls (``torch.matmul`` on 4-D tensors) view their
operands as 3-D first, so each operand is saved just after a view: the census
gives it to the op after the view (plugins/census/measure.py, ``SavedOps``),
the ``bmm``, so it is ``attBMM`` as the op records' ``score`` and ``qkv``
slots have it (specs/op_records.yaml), not the projections' ``attMM``.

Expected bytes are derived here by hand from ``eager_attention_forward`` in
transformers/models/llama/modeling_llama.py: ``repeat_kv`` copies the keys and
values to all ``a`` heads; ``matmul(q, k^T)`` saves q and the copied k;
``softmax(..., dtype=float32)`` saves its fp32 output ``[b, a, s, s]``; the
dropout (CUDA's fused kernel, contract ``cuda-native``) its bool mask; the
second ``matmul`` the dropped-out probabilities (bf16 ``[b * a, s, s]``) and
the copied v.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ndcost.compose import time as time_model  # noqa: E402
from ndcost.models import load_model  # noqa: E402
from ndcost.plugins import op_records  # noqa: E402
from ndcost.plugins.census import records  # noqa: E402
from ndcost.values import LayerGroup  # noqa: E402

# A small Llama: hidden 256, intermediate 512, 8 heads of 32, 4 KV heads (2 a rank at TP 2: one would make
# repeat_kv a view, not a copy), attention dropout on.
H, I, HEADS, KV, D, S, B = 256, 512, 8, 4, 32, 64, 1


def _config(**over):
    fields = dict(hidden_size=H, intermediate_size=I, num_attention_heads=HEADS, num_key_value_heads=KV,
                  head_dim=D, num_hidden_layers=1, vocab_size=1000, max_position_embeddings=512,
                  attention_dropout=0.1)
    fields.update(over)
    return transformers.LlamaConfig(**fields)


@pytest.fixture(scope="module")
def measured():
    """What the layer saves under hf-cuda-eager, with each tensor's op."""
    return records._measure_plain(_config(), 0, S, records.runtime_profile("hf-cuda-eager"))


def test_eager_scores_are_the_batched_matmuls_as_the_op_records_score_slot_says(measured):
    """The probabilities the second matmul saves are attBMM: b x a x s^2 x 2 bytes, the score slot's term."""
    scores = {(shape, dtype): (size, op) for shape, dtype, size, op in measured.saved_tensors
              if shape[-2:] == (S, S)}
    assert scores == {
        ((B, HEADS, S, S), "float32"): (B * HEADS * S * S * 4, "softmax"),    # softmax's fp32 output
        ((B, HEADS, S, S), "bool"): (B * HEADS * S * S * 1, "dropout"),       # the dropout's mask
        ((B * HEADS, S, S), "bfloat16"): (B * HEADS * S * S * 2, "attBMM"),   # probabilities, bmm's operand
    }
    spec = load_model(_config())
    values = op_records.values_for(spec, "dense", seq=S, micro_batch=B, tp=1, attention="eager")
    assert op_records.op_bytes(values, "attBMM")["score"] == B * HEADS * S * S * 2
    assert op_records.op_bytes(values, "dropout")["score"] == B * HEADS * S * S * 1
    # (the records price softmax's output in the compute dtype, as GPT-2's eager softmax runs; Llama's
    # runs in fp32 and keeps 4 bytes a score: a difference of the records, not of the attribution)

    # q (the rotated query), k and v copied to every head: the batched matmuls' other operands
    qkv = 3 * B * HEADS * S * D * 2
    assert measured.ops_bytes["attBMM"] == qkv + B * HEADS * S * S * 2
    # what is left to the projections: their input (one storage for q, k and v), the rotary cos and sin,
    # and o_proj's input (the attention output's transposed copy)
    assert measured.ops_bytes["attMM"] == B * S * H * 2 + 2 * B * S * D * 2 + B * S * HEADS * D * 2
    assert measured.ops_bytes["softmax"] == B * HEADS * S * S * 4
    assert measured.ops_bytes["dropout"] == B * HEADS * S * S


def test_only_the_attribution_moves(measured):
    """Every byte is still counted once: the layer's total by hand, and the ops summing to it.

    Two RMSNorms (fp32 upcast, fp32 rstd, the bf16 normalised input, the output the next matmuls read),
    cos and sin, the attention above, o_proj's input, and the MLP's gate, silu and up outputs and their
    product (down_proj's input).
    """
    norm = 4 * S * H + 4 * S + 2 * S * H + 2 * S * H
    attention = (2 * 2 * S * D + 3 * 2 * HEADS * S * D + (4 + 1 + 2) * HEADS * S * S + 2 * S * HEADS * D)
    total = 2 * norm + attention + 4 * 2 * S * I
    assert measured.saved_bytes == measured.packed_bytes == total
    assert sum(measured.ops_bytes.values()) == total
    assert measured.ops_bytes["normOp"] == 2 * (4 * S * H + 4 * S + 2 * S * H)
    assert measured.ops_bytes["ffMM"] == 2 * S * H + 3 * 2 * S * I
    assert measured.ops_bytes["ffAct"] == 2 * S * I


@pytest.mark.slow
def test_the_kind_record_splits_attbmm_over_tp():
    """The census's KindRecord: attBMM is all heads' (TP splits it whole), per token as derived above."""
    record = records.census_groups(_config(), [LayerGroup(kind="dense", count=1)], S, "hf-cuda-eager",
                                   use_cache=False, progress=None)["dense"]
    assert record.ops.get("attBMM", 0) == 0
    assert record.ops_tp["attBMM"] * S == 3 * B * HEADS * S * D * 2 + B * HEADS * S * S * 2


def test_eager_scores_traffic_is_the_scores_part():
    """Every op of eager attention on the [b, a, s, s] scores counts toward the ``scores`` part, which the time model
    prices with the attention (``EAGER_SOFTMAX_BYTES_PER_SCORE``), not among the layer's elementwise bytes. By hand
    (bf16, no dropout), bytes each op reads and writes: ``Q K^T`` reads q and the copied k (a x s x d x 2 each) and
    writes the scores (a x s x s x 2); the scaling reads and writes them; the mask add reads them and the
    [1, 1, s, s] mask and writes them; softmax's fp32 upcast reads 2 and writes 4 bytes a score, the softmax reads
    and writes 4, the cast back reads 4 and writes 2; ``P V`` reads the probabilities and the copied v and
    writes the output (a x s x d x 2)."""
    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census.flops import count_forward

    with L.fake_layer(_config(attention_dropout=0.0), 0, records.runtime_profile("hf-cuda-eager")) as fake:
        counted = count_forward(fake, S)
    scores, heads = HEADS * S * S, HEADS * S * D * 2
    expected = ((2 * heads + 2 * scores) + 2 * (2 * scores) + (2 * scores + 2 * S * S + 2 * scores)
                + (2 + 4) * scores + (4 + 4) * scores + (4 + 2) * scores + (2 * scores + 2 * heads))
    assert counted.moved_bytes["scores"] == expected
    assert counted.launches["scores"] == 7
    # what the time model prices outside the two matmuls (the mask's reads aside): the same bytes a score
    matmuls = (2 * heads + 2 * scores) + (2 * scores + 2 * heads)
    assert (expected - matmuls - 2 * S * S) / scores == time_model.EAGER_SOFTMAX_BYTES_PER_SCORE
    assert counted.launches["scores"] - 2 == time_model.EAGER_SOFTMAX_KERNELS
