"""Ring CP as torch's ring attention runs it (compose/time.py ``_ring_attention_work``, ``_ring_communication``,
the ring steps of ``_scores_seconds``).

Expected figures are derived by hand here from torch's source
(torch/distributed/tensor/experimental/_context_parallel/_attention.py: ``_SDPAMerger``, ``_partial_update``,
``_templated_ring_attention`` and its backward), op by op, for a 4-head, 16-wide layer with 2 key-value heads; one
test runs torch's own merger and ``_partial_update`` on the CPU and counts what they launch and move.
"""
from __future__ import annotations

import numpy as np
import pytest

from ndcost.compose import time as ct
from ndcost.layer import LayerKind
from ndcost.plugins.estimators import flops as analytic
from ndcost.specio import hardware_from_mapping
from ndcost.values import LayerGroup, ModelSpec, Strategy

HBM = 2.0e12
MEMORY = 0.8  # the box's efficiency.memory; no elementwise table, so every merge runs at it
LAUNCH, DISPATCH = 3.0e-6, 5.0e-6


def _box():
    return hardware_from_mapping({
        "name": "ringbox", "memory_bytes": 2**36, "hbm_bytes_per_second": HBM,
        "peak_flops_per_second": {"bf16": 1.0e15, "fp32": 6.0e13}, "devices_per_node": 8,
        "network": {"within_node": {"bytes_per_second": 4.0e11}, "across_nodes": {"bytes_per_second": 5.0e10}},
        "efficiency": {"memory": MEMORY, "memory_backward": MEMORY}, "sm_count": 132,
        "kernel_tables": {"launch_seconds": LAUNCH, "dispatch_seconds": DISPATCH, "source": "by hand"}})


def tiny_llama():
    return ModelSpec(name="tiny-llama", model_type="llama", family="llama", hidden_size=64, vocab_size=128,
                     layers=(LayerGroup(kind="dense", count=2),), num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, intermediate_size=256, kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")})


def _layer(seq=4096, **fields):
    work = analytic.model_work(tiny_llama(), seq)
    return ct.layer_seconds(work, ct.strategy_columns([Strategy(seq=seq, **fields)]), _box())


# a rank's elements at seq 4096, cp 4 (1024 tokens), bf16: queries and outputs 1024 x 4 heads x 16, keys and values
# 1024 x 2 x 2 heads x 16, logsumexp 1024 x 4 heads
Q = OUT = 1024 * 4 * 16
KV = 1024 * 2 * 2 * 16
LSE = 1024 * 4
W = 2  # bf16


def test_eager_forward_merges_are_torchs_ops_byte_by_byte():
    # once a pass: key.contiguous(), value.contiguous() (read + write bf16), step 0's out.to(float32) (read 2,
    # write 4) and results()'s cast back (read 4, write 2)
    once = 2 * W * KV + (W + 4) * OUT + (4 + W) * OUT
    # before steps 0..2 (not the last): torch.cat([key.flatten(), value.flatten()]), read + write bf16
    cats = 3 * 2 * W * KV
    # a later step at rank cp - 1 (all the queries, half the keys): the block's cast (6), out - block_out (12),
    # sigmoid(...) * (...) (8, plus the broadcast sigmoid's 4 a logsumexp element), out - (...) (12); on the
    # logsumexp: block_lse - lse (12), sigmoid (8), lse - block_lse (12), logsigmoid (8), lse - (...) (12)
    whole = (6 + 12 + 8 + 12) * OUT + (4 + 12 + 8 + 12 + 8 + 12) * LSE
    # at rank 0 (half the queries): the same ops on half the elements, then _partial_update's torch.cat of the whole
    # fp32 output and logsumexp (read 4, write 4)
    partial = whole / 2 + 8 * OUT + 8 * LSE
    assert whole > partial  # rank cp - 1 is the slower here: three later steps at its bytes
    expected = once + cats + 3 * whole
    layer = _layer(cp=4)
    assert layer["ring_merges_forward"][0, 0] == pytest.approx(expected / (HBM * MEMORY))
    assert expected == 9_994_240  # the sum by hand


def test_eager_backward_accumulations_are_torchs_ops_byte_by_byte():
    # zeros_like of the fp32 dq, dk, dv (write 4); step 0's dq += , dk += , dv += (read 4 + 2, write 4); the casts
    # back at the end (grad_query.to, next_grad_kv.to: read 4, write 2)
    once = 4 * (Q + KV) + 10 * (Q + KV) + 6 * (Q + KV) + 2 * W * KV  # and key/value .contiguous() again
    cats = 3 * 2 * W * KV + 4 * 8 * KV  # K/V concatenations before steps 0..2; dK/dV's (fp32) after all 4 steps
    # rank cp - 1: dq += whole (10), dk, dv half-added (10 / 2) then _partial_update's cat (8)
    keys_half = 10 * Q + (5 + 8) * KV
    # rank 0: dq half-added then cat (5 + 8), dk, dv whole (10), logsumexp's half .contiguous() (8 / 2)
    queries_half = (5 + 8) * Q + 10 * KV + 4 * LSE
    expected = once + cats + 3 * max(keys_half, queries_half)
    layer = _layer(cp=4)
    assert layer["ring_merges_backward"][0, 0] == pytest.approx(expected / (HBM * MEMORY))
    assert expected == 10_338_304


def test_compiled_merges_read_and_write_each_tensor_once():
    # forward: the copies and the one concatenation the all-gather sends; a later step's fused merge reads the fp32
    # running output (4), the block's (2) and writes the fp32 output (4), and the logsumexps (4 + 4, write 4)
    forward = 2 * W * KV + 2 * W * KV + 3 * max((4 + W + 4) * OUT + 12 * LSE, (4 + W / 2 + 4) * OUT + 10 * LSE)
    # backward: the copies and the one concatenation, step 0's accumulation (read 2, write 4), dK/dV's final cast;
    # a later step reads the fp32 accumulator and the step's gradient and writes the accumulator (the cat fused)
    backward = (4 * W * KV + (4 + W) * (Q + KV) + (4 + W) * KV
                + 3 * max((8 + W) * Q + (8 + W / 2) * KV, (8 + W / 2) * Q + (8 + W) * KV + 4 * LSE))
    layer = _layer(cp=4, compile=True)
    assert layer["ring_merges_forward"][0, 0] == pytest.approx(forward / (HBM * MEMORY))
    assert layer["ring_merges_backward"][0, 0] == pytest.approx(backward / (HBM * MEMORY))


def test_the_rings_launches_raise_the_floor():
    # a forward beyond the layer's own SDPA call: 2 .contiguous(), step 0's cast, the result's cast; each of the 3
    # later steps its SDPA call, a K/V torch.cat, the block's cast, 8 merge ops and 2 _partial_update cats
    extra = 4 + 3 * (1 + 1 + 1 + 8 + 2)
    work = analytic.model_work(tiny_llama(), 4096)
    ring, ulysses = (ct._launch_bound(work, ct._rows(cols, _box()), cols, _box(), ct._ring_attention_work(
        ct._kind_arrays(work), ct._rows(cols, _box()), cols, ct._fused_rows(work, cols))["launches"])
        for cols in (ct.strategy_columns([Strategy(seq=4096, cp=4, cp_algo=name)]) for name in ("ring", "ulysses")))
    assert ring["forward"][0, 0] - ulysses["forward"][0, 0] == pytest.approx(extra * DISPATCH)
    assert ring["backward"][0, 0] - ulysses["backward"][0, 0] == pytest.approx(2 * extra * DISPATCH)


def test_cp_1_and_ulysses_do_no_ring_work():
    for fields in ({"cp": 1}, {"cp": 4, "cp_algo": "ulysses"}):
        layer = _layer(**fields)
        assert layer["ring_merges_forward"][0, 0] == layer["ring_merges_backward"][0, 0] == 0.0
        assert layer["scores_first_forward"][0, 0] == layer["scores_forward"][0, 0]


def test_the_all_gather_hides_behind_the_first_step_only_and_the_last_gradient_send_is_exposed():
    work = analytic.model_work(tiny_llama(), 4096)
    cols = ct.strategy_columns([Strategy(seq=4096, cp=4)])
    rows = ct._rows(cols, _box())
    coll = {"all_gather": lambda m, g, bw, lat, **link: m * (g - 1) / g / 1.0e11,   # by hand: a ring's bus bytes
            "send_recv": lambda m, g, bw, lat, **link: m / 5.0e10}
    p2p = (np.ones(1), np.zeros(1), {})
    gather = 4 * KV * W * 3 / 4 / 1.0e11   # 4 blocks of the rank's K/V gathered, bf16
    send = 4 * KV / 5.0e10                 # its fp32 dK/dV
    # step 0's kernel shorter than the gather, the later steps' longer than a send: the gather's excess exposed
    # in each pass, the dK/dV sends hidden behind steps 1..3 and the last (after step 3) exposed
    first, later = gather / 2, 2 * send
    layer = {"scores_first_forward": np.full((1, 1), first), "scores_first_backward": np.full((1, 1), first),
             "scores_backward": np.full((1, 1), first + 3 * later)}
    ring = ct._ring_communication(ct._kind_arrays(work), rows, cols, layer, _box(), ct.efficiencies(_box())[0], coll,
                                  p2p)
    assert ring["forward"][0, 0] == pytest.approx(gather)
    assert ring["backward"][0, 0] == pytest.approx(gather + 4 * send)
    assert ring["exposed_forward"][0, 0] == pytest.approx(gather / 2)
    assert ring["exposed_backward"][0, 0] == pytest.approx(gather / 2 + send)
    # later steps shorter than a send: each send's excess exposed too
    layer["scores_backward"] = np.full((1, 1), first + 3 * (send / 4))
    ring = ct._ring_communication(ct._kind_arrays(work), rows, cols, layer, _box(), ct.efficiencies(_box())[0], coll,
                                  p2p)
    assert ring["exposed_backward"][0, 0] == pytest.approx(gather / 2 + 3 * (send - send / 4) + send)


@pytest.mark.slow
def test_torchs_merger_launches_and_moves_what_the_model_counts():
    """torch's own _SDPAMerger and _partial_update on the CPU: the kernels and bytes of a later step, on all the
    queries and on half of them, and of an accumulation into one half, against the per-element figures above."""
    torch = pytest.importorskip("torch")
    attention = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._attention")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from ndcost.plugins.census.measure import aliases_only

    class Counter(TorchDispatchMode):
        launches, moved = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            returned = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if func.namespace != "prim" and not aliases_only(func, tensors, returned):
                self.launches += 1
                if func is torch.ops.aten.log_sigmoid_forward.default:
                    returned = returned[:1]  # its CPU buffer; CUDA's is empty
                inplace = func._schema.name.endswith("_")  # reads and writes its first argument
                self.moved += sum(t.nbytes for t in tensors) + sum(t.nbytes for t in returned) * (not inplace)
                self.moved += tensors[0].nbytes if inplace else 0
            return out

    heads, tokens, dim = 4, 8, 16
    o, lse = heads * tokens * dim, heads * tokens

    def later_step(partial):
        merger = attention._SDPAMerger(convert_to_f32=True, seq_dim=2)
        merger.step(torch.randn(1, heads, tokens, dim, dtype=torch.bfloat16), torch.randn(1, heads, tokens), False)
        rows = tokens // 2 if partial else tokens
        block = torch.randn(1, heads, rows, dim, dtype=torch.bfloat16), torch.randn(1, heads, rows)
        with Counter() as counter:
            merger.step(*block, partial)
        return counter.launches, counter.moved

    assert later_step(False) == (9, (W + 36) * o + 56 * lse)
    assert later_step(True) == (11, (W / 2 + 26) * o + 36 * lse)
    accumulator = torch.zeros(1, heads, tokens, dim)
    half = torch.randn(1, heads, tokens // 2, dim, dtype=torch.bfloat16)
    with Counter() as counter:  # dK into its first half (i <= rank), the backward's _partial_update
        attention._partial_update(accumulator, half, dim=2, n_chunks=2, idx=0, add=True)
    assert (counter.launches, counter.moved) == (2, ((8 + W) / 2 + 8) * o)


# cp_rotate=p2p: torch's _AllToAllRotater (torchtitan's "alltoall"), a K/V block sent to the next rank before each of
# the first cp - 1 steps' kernels and waited for before the next step's (_templated_ring_attention); its backward
# sends the K/V the same way and, after each step, the fp32 dK/dV on the same process group (one NCCL stream)
LINK = 4.0e11  # the box's within_node bytes a second: seconds of the hand collectives below


def _by_hand_collectives():
    return {"all_gather": lambda m, g, bw, lat, **link: m * (g - 1) / g / LINK,  # a ring's bus bytes
            "send_recv": lambda m, g, bw, lat, **link: m / LINK}


def test_p2p_hides_each_block_behind_its_own_step_and_shares_the_backward_steps_with_the_gradient_sends():
    work = analytic.model_work(tiny_llama(), 4096)
    cols = ct.strategy_columns([Strategy(seq=4096, cp=4), Strategy(seq=4096, cp=4, cp_rotate="p2p")])
    rows = ct._rows(cols, _box())
    block = KV * W / LINK    # one rank's keys and values, bf16: what a step sends
    grads = 4 * KV / LINK    # its fp32 dK/dV
    gather = 4 * KV * W * 3 / 4 / LINK  # allgather: the 4 blocks gathered at once
    # forward: step 0's kernel half a block's send, the later ones two sends long; backward: step 0's half a block,
    # the later ones a gradient send and half a block long
    first, later_f, later_b = block / 2, 2 * block, grads + block / 2
    layer = {"scores_first_forward": np.full((2, 1), first), "scores_forward": np.full((2, 1), first + 3 * later_f),
             "scores_first_backward": np.full((2, 1), first), "scores_backward": np.full((2, 1), first + 3 * later_b)}
    ring = ct._ring_communication(ct._kind_arrays(work), rows, cols, layer, _box(), ct.efficiencies(_box())[0],
                                  _by_hand_collectives(), (np.ones(2), np.zeros(2), {}))
    # forward: block 0 behind step 0 (half exposed), blocks 1 and 2 behind steps 1 and 2 (hidden); step 3 sends none
    assert ring["forward"][1, 0] == pytest.approx(3 * block)
    assert ring["exposed_forward"][1, 0] == pytest.approx(block / 2)
    # backward: block 0 behind step 0 (half exposed); steps 1 and 2 each carry the previous step's dK/dV and the next
    # block, half a block over their kernel; step 3 the last dK/dV but one (hidden); the last, after the loop, exposed
    assert ring["backward"][1, 0] == pytest.approx(3 * block + 4 * grads)
    assert ring["exposed_backward"][1, 0] == pytest.approx(block / 2 + 2 * (block / 2) + grads)
    # the allgather row beside it, as before: the gather behind step 0 alone, the dK/dV sends each behind one step
    assert ring["exposed_forward"][0, 0] == pytest.approx(gather - first)
    assert ring["exposed_backward"][0, 0] == pytest.approx(gather - first + grads)
    # later steps shorter than a block: each send's excess exposed, step by step
    layer["scores_forward"] = np.full((2, 1), first + 3 * (block / 4))
    ring = ct._ring_communication(ct._kind_arrays(work), rows, cols, layer, _box(), ct.efficiencies(_box())[0],
                                  _by_hand_collectives(), (np.ones(2), np.zeros(2), {}))
    assert ring["exposed_forward"][1, 0] == pytest.approx(block / 2 + 2 * (block - block / 4))


def test_p2p_at_cp_2_sends_one_block_a_pass():
    work = analytic.model_work(tiny_llama(), 4096)
    cols = ct.strategy_columns([Strategy(seq=4096, cp=2, cp_rotate="p2p")])
    rows = ct._rows(cols, _box())
    block, grads = 2 * KV * W / LINK, 2 * 4 * KV / LINK  # 2048 tokens a rank: twice the cp=4 block
    layer = {key: np.full((1, 1), value) for key, value in (
        ("scores_first_forward", block / 4), ("scores_forward", block / 4 + grads),
        ("scores_first_backward", block / 4), ("scores_backward", block / 4 + grads / 2))}
    ring = ct._ring_communication(ct._kind_arrays(work), rows, cols, layer, _box(), ct.efficiencies(_box())[0],
                                  _by_hand_collectives(), (np.ones(1), np.zeros(1), {}))
    assert ring["forward"][0, 0] == pytest.approx(block)
    assert ring["exposed_forward"][0, 0] == pytest.approx(block - block / 4)
    # backward: the block behind step 0, step 0's dK/dV behind step 1 (half of it over), step 1's after the loop
    assert ring["backward"][0, 0] == pytest.approx(block + 2 * grads)
    assert ring["exposed_backward"][0, 0] == pytest.approx(block - block / 4 + grads / 2 + grads)


def test_compiled_p2p_keeps_every_concatenation_it_sends():
    # allgather sends one torch.cat of the K/V a pass (the rest are dead under compile); p2p sends the cat before each
    # of steps 0..2: two more (read + write bf16), in the forward and in the backward's K/V pass
    allgather, p2p = _layer(cp=4, compile=True), _layer(cp=4, compile=True, cp_rotate="p2p")
    extra = 2 * (2 * W * KV) / (HBM * MEMORY)
    assert p2p["ring_merges_forward"][0, 0] - allgather["ring_merges_forward"][0, 0] == pytest.approx(extra)
    assert p2p["ring_merges_backward"][0, 0] - allgather["ring_merges_backward"][0, 0] == pytest.approx(extra)
    # eager counts every cat already: the rotation moves no byte there
    eager, eager_p2p = _layer(cp=4), _layer(cp=4, cp_rotate="p2p")
    for key in ("ring_merges_forward", "ring_merges_backward", "forward", "backward"):
        assert eager_p2p[key][0, 0] == eager[key][0, 0]


def test_cp_rotate_through_evaluate():
    import ndcost

    model = ndcost.resolve(tiny_llama(), census="off")
    allgather, p2p = (model.evaluate(Strategy(seq=4096, cp=4, cp_rotate=name), hardware=_box())
                      for name in ("allgather", "p2p"))
    assert allgather.valid and p2p.valid
    # three sends a pass against one all-gather of the same blocks: not the same communication
    assert p2p.time.communication_seconds != allgather.time.communication_seconds
    # cp=1: nothing rotates
    one = [model.evaluate(Strategy(seq=4096, cp_rotate=name), hardware=_box()).time for name in ("allgather", "p2p")]
    assert one[0] == one[1]
    with pytest.raises(ndcost.errors.NdcostError, match=r"cp_rotate=p2p with cp_algo=ulysses: .*use "
                                                        r"cp_rotate=allgather \(the default\) with ulysses, or "
                                                        r"cp_algo=ring"):
        model.evaluate(Strategy(seq=4096, cp=2, cp_algo="ulysses", cp_rotate="p2p"), hardware=_box())
