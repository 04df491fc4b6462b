"""The census under ``hf-cuda`` against a second H200 batch: a Mistral-7B layer with a 1024-token sliding
window, Llama-3-8B's output layer (full and half vocabulary) and DeepSeek-V3's MoE layer under selective
recompute (tests/data/h200_sliding_window_output_selective.json; the first batch is
tests/data/h200_measurements.json).

Measured with benchmarks/measure_cuda.py on an H200 (torch 2.11, Transformers
5.17); the census runs here on Transformers 5.24 and fake tensors. Saved
bytes are unique storages seen by ``saved_tensors_hooks`` (parameters out,
the layer's input where an op saves it); "retained" and "peak" figures are
``torch.cuda.memory_allocated`` over a baseline taken after the parameters,
the input, its gradient, the mask and the rotary tables were allocated.

Where the kernels match the bytes are equal, tensor by tensor. Every other
difference is stated below with its size and asserted:

- ``ROUNDING``: the CUDA caching allocator hands out 512-byte blocks, and
  ``memory_allocated`` counts blocks: an 8-byte RNG scalar or a 4-byte loss
  counts 512 there (the saved-tensor counts use storage bytes and agree).
- ``BASELINE``: the H200 baseline held the layer's input and the incoming
  gradient, and the H200 run kept the layer's output during the backward; the
  census counts the incoming gradient toward its working peak, and the input
  only where an op saves it (a real model frees it), and leaves the output out.
- ``HELD_OUTSIDE_SAVES``: 30 MiB every SDPA layer of both batches held after
  its forward without saving it (the same 31,457,280 bytes for Llama-3-8B in
  the first batch and the Mistral layer here): a kernel workspace, no tensor
  the layer keeps.
- ``CACHED_BLOCK_REMAINDER``: DeepSeek-V3's MoE layer under torchtitan's
  policy held 1 MiB (1,048,576 bytes) more than the census keeps, and no
  tensor accounts for it. The H200 script's own call on real tensors, at the
  measured 4096 tokens and 256 routed experts, holds the policy's matmul
  outputs and nothing of the router or the experts, on Transformers 5.24 as
  on 5.17 (``test_deepseek_v3_moe_router_holds_nothing_...``); nor is it a
  version difference: the census on the 5.17 wheel's modules keeps the same
  346,554,384 bytes as on 5.24 (and there reproduces 5.17's sentinel mask and
  fp32 router copy in the plain layer, as the first batch's test states
  them). The figure is ``memory_allocated``, which counts the blocks the
  caching allocator hands out, and a cached large-pool block is handed out
  whole where 1 MiB or less would be left (``should_split``,
  c10/cuda/CUDACachingAllocator.cpp; ``ndcost.allocator``): a kept 2 MiB
  logsumexp in a cached 3 MiB block reads exactly this. This batch's script
  (benchmarks/measure_cuda.py at commit 76f6e81) ran the case after the
  Mistral layer and both output layers without emptying the cache, so the
  layer was carved from their cached segments; the first batch's Llama-3-8B
  selective row, which matches, ran after an ``empty_cache``. The likely
  cause, not shown: the script now empties the cache between cases and also
  reports the requested bytes (``kept_requested_...``), which no block
  rounding reaches, for the next H200 round to settle it.
"""
import json
import os
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ndcost.plugins.census import records  # noqa: E402

HERE = os.path.dirname(__file__)
DATA = os.path.join(HERE, "data", "h200_sliding_window_output_selective.json")
DATA_1 = os.path.join(HERE, "data", "h200_measurements.json")

BLOCK = 512                       # the caching allocator's smallest block
RNG_SCALARS = 2 * (BLOCK - 8)     # cuDNN attention's seed and offset: 8 bytes saved, 512 allocated each
HELD_OUTSIDE_SAVES = 30 * 2 ** 20
CACHED_BLOCK_REMAINDER = 2 ** 20


def _data(path=DATA):
    with open(path) as handle:
        return json.load(handle)


def _config(case):
    data = dict(case["config"])
    model_type = data.pop("model_type")
    for key in ("transformers_version", "architectures", "_name_or_path"):
        data.pop(key, None)
    return transformers.AutoConfig.for_model(model_type, **data)


def _profile():
    return records.runtime_profile("hf-cuda")


def _tensors(measured):
    return Counter((tuple(shape), dtype, size) for shape, dtype, size, _ in measured.saved_tensors)


def _h200_tensors(case):
    return Counter((tuple(t["shape"]), t["dtype"], t["storage_bytes"]) for t in case["saved_tensors"] if t["new"])


def _blocks(size):
    return -(-size // BLOCK) * BLOCK


def test_every_case_is_compared():
    data = _data()
    assert {c["case"] for c in data["layers"]} == {"mistral_7b_sliding1024"}
    assert {c["case"] for c in data["outputs"]} == {"llama3_8b_output", "llama3_8b_output_half_vocab"}
    assert {c["case"] for c in data["selective"]} == {"deepseek_v3_moe_selective"}
    assert not data["errors"]


# -- a sliding-window layer, handed the mask its model builds ------------------------------------------------
@pytest.mark.slow
def test_sliding_window_layers_get_the_models_mask():
    """Mistral's model builds a sliding-window mask whenever ``sliding_window`` is set, for every layer.

    Under SDPA Transformers skips the mask (SDPA's ``is_causal``) only while
    the keys are fewer than the window; from the window on every layer gets a
    boolean ``[1, 1, s, s]`` mask. A config without a window, or with
    ``use_sliding_window`` off (Qwen3-MoE), gets none.
    """
    from ndcost.plugins.census import layer as L

    def mask(config, seq):
        with L.fake_layer(config, 0, _profile()) as fake:
            hidden = L.hidden_input(fake.config, seq)
            return L.attention_mask(fake, hidden, L.positions(fake, hidden)[0])

    small = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, num_hidden_layers=2, vocab_size=100)
    windowed = transformers.MistralConfig(sliding_window=32, **small)
    built = mask(windowed, 64)
    assert tuple(built.shape) == (1, 1, 64, 64) and built.dtype == torch.bool
    assert mask(windowed, 16) is None                      # fewer keys than the window: is_causal
    assert mask(transformers.MistralConfig(sliding_window=None, **small), 64) is None
    qwen = transformers.Qwen3MoeConfig(use_sliding_window=False, num_experts=4, num_experts_per_tok=2,
                                       moe_intermediate_size=64, **small)
    assert mask(qwen, 64) is None


@pytest.mark.slow
def test_mistral_sliding_layer_matches_the_h200():
    """The Mistral-7B layer with a 1024-token window at 4096 tokens: every saved tensor, byte for byte.

    The census builds the mask itself (Transformers' ``create_sliding_window_causal_mask``),
    as Mistral's model does; the H200 script handed the same boolean mask.
    Under a mask Transformers expands k and v with ``repeat_kv`` (no
    ``enable_gqa``), and cuDNN keeps the mask as a bf16 additive bias and a
    ``[b, h, s, 1]`` logsumexp.
    """
    case = _data()["layers"][0]
    config = _config(case)
    seq, hidden, heads, head_dim = case["seq"], config.hidden_size, config.num_attention_heads, config.head_dim
    measured = records._measure_plain(config, case["kind_layer_index"], seq, _profile())
    census, h200 = _tensors(measured), _h200_tensors(case)
    assert census == h200
    assert measured.saved_bytes == case["saved_bytes"] == 908_623_888
    # what the mask changes, by hand: the bias, k and v expanded to every head, cuDNN's statistic
    assert census[((1, 1, seq, seq), "bfloat16", 2 * seq * seq)] == 1
    assert census[((1, heads, seq, head_dim), "bfloat16", 2 * heads * seq * head_dim)] == 4  # q, k, v, output
    assert census[((1, heads, seq, 1), "float32", 4 * heads * seq)] == 1
    assert not any(shape == (1, config.num_key_value_heads, seq, head_dim) for shape, _, _ in census)

    # after the forward: the saves less the input (in the baseline), plus the output, the RNG scalars' blocks
    # and the 30 MiB the first batch's Llama-3-8B layer held too
    activation = 2 * seq * hidden
    assert case["retained_after_forward_bytes"] == (measured.saved_bytes - activation + activation + RNG_SCALARS
                                                    + HELD_OUTSIDE_SAVES)
    llama = next(c for c in _data(DATA_1)["layers"] if c["case"] == "llama3_8b")
    assert llama["retained_after_forward_bytes"] - llama["saved_bytes"] == RNG_SCALARS + HELD_OUTSIDE_SAVES

    # the backward's peak: at down_proj's backward, whose weight gradient [h, i] bf16 is the one parameter
    # gradient live then; the census counts the incoming gradient (the H200 baseline held it) but not the
    # input, which no op of the layer saves (in the baseline there too); the H200 run held the output
    down_grad = 2 * hidden * config.intermediate_size
    assert case["backward_peak_over_baseline_bytes"] == (measured.working_bytes + down_grad - activation
                                                         + activation + HELD_OUTSIDE_SAVES + RNG_SCALARS)
    assert case["param_grad_bytes"] == 2 * case["params"]


@pytest.mark.slow
def test_llama_backward_peak_with_the_gradients_made_by_then():
    """The first batch's Llama-3-8B layer at 4096 tokens: the H200's backward peak is the census's working
    figure plus the gradients made by its moment, and the record says which (down_proj's weight gradient,
    [h, i] bf16, of the layer's 436,224,000 bytes) and that the working figure leaves the input out.

    As for the Mistral layer: the census counts the incoming gradient (in the H200 baseline) and not the
    input (in the H200 baseline too); the H200 run held the output, 30 MiB outside the saves and the RNG
    scalars' blocks.
    """
    case = next(c for c in _data(DATA_1)["layers"] if c["case"] == "llama3_8b")
    config = _config(case)
    seq, hidden, inter = case["seq"], config.hidden_size, config.intermediate_size
    measured = records._measure_plain(config, case["kind_layer_index"], seq, _profile())
    down_grad = 2 * hidden * inter
    activation = 2 * seq * hidden
    assert measured.working_grad_bytes == down_grad
    assert measured.grad_bytes == case["param_grad_bytes"] == 2 * case["params"]
    assert measured.inputs_left_out_bytes == activation      # RMSNorm saves its fp32 upcast, not the input
    assert case["backward_peak_over_baseline_bytes"] == (measured.working_bytes + measured.working_grad_bytes
                                                         - activation + activation + HELD_OUTSIDE_SAVES
                                                         + RNG_SCALARS)
    record = records.census_kind(config, case["kind_layer_index"], seq, _profile(), "dense")
    assert record.working_grad_share * case["param_grad_bytes"] == pytest.approx(down_grad, rel=1e-12)
    assert record.working_input_per_token == 2 * hidden


# -- the output layer -----------------------------------------------------------------------------------------
def _output_config(case):
    return transformers.LlamaConfig(hidden_size=case["hidden_size"], vocab_size=case["vocab_size"],
                                    intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                                    head_dim=128, num_hidden_layers=1, rms_norm_eps=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama3_8b_output", "llama3_8b_output_half_vocab"])
def test_output_layer_matches_the_h200(name):
    """Final RMSNorm, LM head and ForCausalLMLoss at 4096 tokens: saved tensors exact; peaks but for blocks.

    After the forward the H200 held the saves in 512-byte blocks (the padded
    labels' 32,776 bytes as 33,280, the nll total weight's 4 as 512) and the
    loss (512). Its backward peaks at log_softmax's backward: the saved fp32
    log-probabilities, their incoming gradient and the result, [s, V] fp32
    each, with the norm's saves; the labels and total weight are freed by
    then, and no parameter gradient exists yet (the head's comes later). The
    census's working figure counts the backward's 4-byte seed, and leaves
    out the loss and the layer's input (no op saves it: RMSNorm's fp32 upcast
    saves the copy, so a real model frees it; the H200 baseline held it).
    """
    from ndcost.plugins.census.output import measure_output

    case = next(c for c in _data()["outputs"] if c["case"] == name)
    seq, hidden, vocab = case["seq"], case["hidden_size"], case["vocab_size"]
    measured, _ = measure_output(_output_config(case), seq, _profile())
    assert _tensors(measured) == _h200_tensors(case)
    assert measured.saved_bytes == case["saved_bytes"]
    # by hand: fp32 upcast, rstd, bf16 normalised input, the head's input, log-probabilities, padded labels,
    # total weight
    assert case["saved_bytes"] == (4 * seq * hidden + 4 * seq + 2 * seq * hidden + 2 * seq * hidden
                                   + 4 * seq * vocab + 8 * (seq + 1) + 4)
    loss = BLOCK
    assert case["retained_after_forward_bytes"] == sum(
        _blocks(size) for _, _, size, _ in measured.saved_tensors) + loss
    log_probs = 4 * seq * vocab
    norm_saves = 4 * seq * hidden + 4 * seq + 2 * seq * hidden + 2 * seq * hidden
    seed = 4
    assert case["backward_peak_over_baseline_bytes"] == 3 * log_probs + norm_saves + loss + BLOCK
    assert measured.working_bytes == 3 * log_probs + norm_saves + seed
    assert case["backward_peak_over_baseline_bytes"] == measured.working_bytes + loss + (BLOCK - seed)
    assert case["param_grad_bytes"] == 2 * (vocab * hidden + hidden)


@pytest.mark.slow
def test_output_record_against_the_h200_as_the_resolver_reads_it():
    """The output KindRecord at TP 1 and under a vocabulary-parallel split over two ranks.

    The resolver's output moment takes ``tokens * (working + working_tp / t)``
    (``vocab_parallel``) as the output layer's backward peak: against the H200
    that is the measured peak less the loss's and seed's blocks (the layer's
    input, which a real model frees after the final norm's forward, is in
    neither).
    """
    outputs = {c["case"]: c for c in _data()["outputs"]}
    full, half = outputs["llama3_8b_output"], outputs["llama3_8b_output_half_vocab"]
    seq = full["seq"]
    record = records.output_record(_output_config(full), seq, "hf-cuda", use_cache=False, progress=None)
    assert (record.saved_per_token + record.saved_tp_per_token) * seq == full["saved_bytes"]
    assert (record.saved_per_token + record.saved_tp_per_token / 2) * seq == half["saved_bytes"]
    over = -(BLOCK + BLOCK - 4)
    assert (record.working_per_token + record.working_tp_per_token) * seq == (
        full["backward_peak_over_baseline_bytes"] + over)
    assert (record.working_per_token + record.working_tp_per_token / 2) * seq == (
        half["backward_peak_over_baseline_bytes"] + over)


# -- selective checkpointing ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_deepseek_v3_moe_selective_matches_the_h200_but_for_one_mib():
    """DeepSeek-V3's MoE layer (index 1) under torchtitan's policy at 4096 tokens.

    What the census keeps, its input included: the input; q_a_proj's,
    kv_a_proj's, o_proj's, the shared expert's gate and down matmul outputs
    (every second mm saved, the router's fp32 mm and up_proj recomputed);
    the attention's output, logsumexp and RNG scalars. The H200 counted the
    scalars as blocks and held 1 MiB beside them (``CACHED_BLOCK_REMAINDER``).
    """
    case = _data()["selective"][0]
    layer = next(c for c in _data(DATA_1)["layers"] if c["case"] == "deepseek_v3_moe")
    config = _config(layer)
    seq, hidden = case["seq"], config.hidden_size
    assert case["input_bytes"] == 2 * seq * hidden
    policy = records.policy_for(_profile())
    kept, _ = records._measure_selective(config, layer["kind_layer_index"], seq, _profile(), policy, False)
    heads = config.num_attention_heads
    by_hand = (2 * seq * hidden                                                          # input
               + 2 * seq * (config.q_lora_rank + config.kv_lora_rank + config.qk_rope_head_dim)  # q_a, kv_a
               + 2 * seq * hidden + 2 * seq * config.moe_intermediate_size + 2 * seq * hidden  # o, gate, down
               + 2 * heads * seq * config.v_head_dim + 4 * heads * seq + 16)               # attention
    assert kept.saved_bytes == by_hand
    measured = case["kept_after_forward_excluding_output_and_input_bytes"] + case["input_bytes"]
    assert kept.saved_bytes == measured - RNG_SCALARS - CACHED_BLOCK_REMAINDER


def test_a_cached_block_one_mib_larger_is_counted_whole():
    """``CACHED_BLOCK_REMAINDER``'s mechanism in the allocator's rules (ndcost.allocator, ``should_split``):
    the layer's 2 MiB logsumexp, taking a cached 3 MiB block, leaves 1 MiB, which is not more than 1 MiB, so
    the block is not split and ``memory_allocated`` counts all 3 MiB."""
    from ndcost.allocator import CachingAllocator

    mib = 2 ** 20
    allocator = CachingAllocator()
    allocator.malloc("earlier", 3 * mib)      # a 20 MiB segment, split: 3 MiB taken, 17 MiB left
    allocator.malloc("filler", 17 * mib)      # the rest of it
    allocator.free("earlier")                 # a cached 3 MiB block
    before = allocator.allocated
    allocator.malloc("logsumexp", 4 * 128 * 4096)
    assert allocator.allocated - before == 3 * mib
    assert allocator.allocated - allocator.requested == CACHED_BLOCK_REMAINDER


def _held_after_forward(forward, outside):
    """Run *forward* under a dispatch mode following every storage its ops return; the storages still live
    after it, *outside* (storages allocated before it) left out, as ``(shape, dtype, bytes, op)``."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Held(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in self.live:
                    storage = t.untyped_storage()
                    self.live[storage._cdata] = (tuple(t.shape), str(t.dtype), storage.nbytes(), str(func))
                    weakref.finalize(storage, self.live.pop, storage._cdata, None)
            return out

    with Held() as mode:
        out = forward()
    gone = outside | {out.untyped_storage()._cdata}
    return out, sorted(v for k, v in mode.live.items() if k not in gone)


@pytest.mark.slow
def test_deepseek_v3_moe_router_holds_nothing_under_the_h200_scripts_policy():
    """The H200 script's own call (benchmarks/measure_cuda.py: its layer, its torchtitan policy, its
    non-reentrant checkpoint) on real CPU tensors, at the measured 4096 tokens and 256 routed experts (8
    groups, top-4 groups, top-8), widths cut: after the forward it holds the policy's saved matmul outputs
    and nothing of the router or the experts (no token x expert mask, score or index), on Transformers 5.24
    as on 5.17 (the same run on the 5.17 wheel's modules held the same storages).

    By hand (bf16): q_a_proj's, kv_a_proj's, o_proj's, the shared expert's gate and down outputs; CPU's
    SDPA (``_scaled_dot_product_flash_attention_for_cpu``) is not in the policy's list, so the attention
    keeps nothing here. The census, with CUDA's kernel, keeps those and the attention's output, logsumexp
    and RNG scalars, and the input.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location("measure_cuda", os.path.join(HERE, "..", "benchmarks",
                                                                               "measure_cuda.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    seq = 4096
    widths = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=32, num_attention_heads=4,
                  num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16,
                  qk_nope_head_dim=16, v_head_dim=16)
    config = script.deepseek_v3(**widths)
    assert (config.n_routed_experts, config.n_group, config.topk_group, config.num_experts_per_tok) == (256, 8, 4, 8)
    layer, rotary = script._build_layer(config, 1, torch.bfloat16)
    hidden = torch.randn(1, seq, config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    inner = script._layer_call(layer, rotary, hidden, seq)
    # what the script allocates before its baseline: parameters, input, the position ids and rotary tables
    handed = next(c.cell_contents for c in inner.__closure__ if isinstance(c.cell_contents, dict))
    before = [*layer.parameters(), *layer.buffers(), hidden, *torch.utils._pytree.tree_leaves(handed)]
    outside = {t.untyped_storage()._cdata for t in before if isinstance(t, torch.Tensor)}
    out, kept = _held_after_forward(lambda: torch.utils.checkpoint.checkpoint(
        lambda h: inner(), hidden, use_reentrant=False, context_fn=script._torchtitan_policy()), outside)
    h, moe = config.hidden_size, config.moe_intermediate_size
    assert sorted(size for _, _, size, _ in kept) == sorted([
        2 * seq * config.q_lora_rank, 2 * seq * (config.kv_lora_rank + config.qk_rope_head_dim),
        2 * seq * h, 2 * seq * moe, 2 * seq * h])
    assert {op for _, _, _, op in kept} == {"aten.mm.default"}
    del out

    census, _ = records._measure_selective(config, 1, seq, _profile(), records.policy_for(_profile()), False)
    heads = config.num_attention_heads
    assert census.saved_bytes == (2 * seq * h + sum(size for _, _, size, _ in kept)
                                  + 2 * heads * seq * config.v_head_dim + 4 * heads * seq + 16)


# -- the output layer of families without a layer input norm ----------------------------------------------
S, H, V = 64, 256, 1000


def _output_by_hand(norm_saves):
    """Saved bytes of the output layer at V and V / 2 with *norm_saves* for the final norm (head input included)."""
    return {v: norm_saves + 4 * S * v + 8 * (S + 1) + 4 for v in (V, V // 2)}


def test_output_layer_of_a_post_norm_family_olmo2():
    """OLMo-2 has post-norms only (no ``input_layernorm``): the final norm is the model's ``Olmo2RMSNorm``.

    Olmo2RMSNorm returns ``(weight * x_normed).to(dtype)``, so besides the
    fp32 upcast and rstd it keeps the fp32 normalised input (the weight's
    gradient needs it) and the bf16 result, the head's input.
    """
    from ndcost.plugins.census.output import measure_output, output_holder

    config = transformers.Olmo2Config(hidden_size=H, intermediate_size=512, num_attention_heads=8,
                                      num_key_value_heads=8, num_hidden_layers=3, vocab_size=V)
    with output_holder(config, _profile()) as holder:
        assert type(holder.norm).__name__ == "Olmo2RMSNorm"
    measured, _ = measure_output(config, S, _profile())
    assert sorted((shape, dtype) for shape, dtype, _, _ in measured.saved_tensors) == sorted([
        ((1, S, H), "float32"), ((1, S, 1), "float32"), ((1, S, H), "float32"), ((S, H), "bfloat16"),
        ((S, V), "float32"), ((S,), "int64"), ((), "float32")])
    expected = _output_by_hand(4 * S * H + 4 * S + 4 * S * H + 2 * S * H)
    assert measured.saved_bytes == expected[V]
    record = records.output_record(config, S, "hf-cuda", use_cache=False, progress=None)
    assert record.saved_tp_per_token == 2 * (expected[V] - expected[V // 2]) / S == 4 * V
    assert record.saved_per_token == (2 * expected[V // 2] - expected[V]) / S


def test_output_layer_of_gpt2_under_cuda_layer_norm():
    """GPT-2's final norm is ``ln_f`` (a LayerNorm): CUDA's kernel keeps its input and fp32 mean and rstd."""
    config = transformers.GPT2Config(n_embd=H, n_layer=2, n_head=8, vocab_size=V)
    record = records.output_record(config, S, "hf-cuda", use_cache=False, progress=None)
    expected = _output_by_hand(2 * S * H + 4 * S + 4 * S + 2 * S * H)
    assert record.saved_per_token == (2 * expected[V // 2] - expected[V]) / S
    assert record.saved_tp_per_token == 4 * V


def test_output_layer_of_a_multimodal_config_takes_its_text_part():
    """Qwen3.5's config nests the decoder's widths in ``text_config``: the output layer is the text model's."""
    from ndcost.plugins.census.output import output_config

    text = dict(hidden_size=H, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                num_hidden_layers=4, vocab_size=V, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=32, linear_value_head_dim=32)
    config = transformers.AutoConfig.for_model("qwen3_5", text_config=text)
    record = records.output_record(config, S, "hf-cuda", use_cache=False, progress=None)
    assert record.saved_tp_per_token == 4 * V
    # the cache key sees the text part's widths
    key = output_config(config.to_dict())
    assert key["hidden_size"] == H and key["vocab_size"] == V


def test_multimodal_spec_is_censused_and_keyed_by_its_text_part():
    """A Qwen3.5 spec holds its decoder's widths in ``text_config``: the census builds and keys by that part."""
    from ndcost.models import load_model
    from ndcost.plugins.census import cache

    spec = load_model("qwen3.5-9b")
    text = spec.hf_config["text_config"]
    assert records.config_of(spec).hidden_size == text["hidden_size"]
    hf = records._hf(spec)
    assert "text_config" not in hf and hf["hidden_size"] == text["hidden_size"]
    key = cache.kind_config(hf, 0)
    assert key["hidden_size"] == text["hidden_size"]
    assert key["linear_num_value_heads"] == text["linear_num_value_heads"]
