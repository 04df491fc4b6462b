"""Float8 linears, torch.compile and async TP (Strategy.float8, float8_all_gather, compile, async_tp), by hand.

Every expected figure is derived here from a Llama-3-8B layer's shapes (hidden 4096, 32 query and 8 key-value
heads of 128, MLP 14336, SwiGLU) and the hardware file's peaks and efficiencies, not read off the code under test:
torchao's Float8Linear (torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args) casts a linear's input and
weight in the forward and its output gradient twice, its weight and its saved input in the backward, each cast an
amax read and a read and fp8 write (2 w + 1 bytes an element at the compute width w).
"""
from __future__ import annotations

import attrs
import numpy as np
import pytest

import ndcost
from ndcost.compose import time as ct
from ndcost.errors import InvalidValue
from ndcost.layer import LayerKind
from ndcost.plugins.estimators import flops as analytic
from ndcost.values import LayerGroup, ModelSpec, Strategy

H, Q, KV, D, FFN = 4096, 32, 8, 128, 14336
# a token's FLOPs through the Linear layers: q and o (H x 4096), k and v (H x 1024), gate, up and down (H x FFN)
LINEAR_FLOPS = 2 * (2 * H * Q * D + 2 * H * KV * D) + 2 * 3 * H * FFN
LINEAR_WEIGHTS = 2 * H * Q * D + 2 * H * KV * D + 3 * H * FFN
INPUTS = 3 * H + Q * D + 2 * H + FFN          # q, k, v read H; o reads 4096; gate and up read H; down reads FFN
OUTPUTS = Q * D + 2 * KV * D + H + 2 * FFN + H  # q 4096, k and v 1024, o H; gate and up FFN; down H
SCORE_FLOPS_PER_PAIR = 4 * Q * D               # Q K^T and P V, 2 FLOPs a multiply-add


def llama_spec(layers=32):
    return ModelSpec(name="llama-3-8b", model_type="llama", family="llama", hidden_size=H, vocab_size=128256,
                     layers=(LayerGroup(kind="dense", count=layers),), num_attention_heads=Q,
                     num_key_value_heads=KV, head_dim=D, intermediate_size=FFN,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")}, attention_bias=False,
                     mlp_bias=False)


@pytest.fixture(scope="module")
def h100(registry):
    """The H100 with the GEMM prior (its measured gemm_shape left out): a Llama-3-8B layer's GEMMs at 4096 tokens
    then fill their waves as the prior's reference does, each at efficiency.matmul, which the rules below read."""
    hardware = registry.get("hardware/h100")
    tables = {k: v for k, v in hardware.kernel_tables.items() if k != "gemm_shape"}
    return attrs.evolve(hardware, kernel_tables=tables)


@pytest.fixture(scope="module")
def work():
    return analytic.model_work(llama_spec(), 4096)


def _memory(hardware):
    """The elementwise kernels' efficiencies, forward and backward (the hardware file's)."""
    return hardware.efficiency["memory"], hardware.efficiency["memory_backward"]


def _layer(work, hardware, text):
    cols = ct.strategy_columns([Strategy.parse(text)])
    return {k: float(np.asarray(v)[0, 0]) for k, v in ct.layer_seconds(work, cols, hardware).items()}


def test_the_shapes_are_the_layers():
    assert LINEAR_WEIGHTS == 218_103_808  # Llama-3-8B: 6.98 B parameters in 32 layers' linears
    w = analytic.kind_work(llama_spec(1), "dense", 4096)
    assert w.float8_mm_flops_per_token == LINEAR_FLOPS
    assert w.float8_input_elements_per_token == INPUTS and w.float8_output_elements_per_token == OUTPUTS
    assert w.float8_fused_input_elements_per_token == INPUTS - 2 * H - H  # q, k, v read one input; gate, up one
    # TP gathers the inputs of the column-split q, k, v, gate and up, and the output gradients of o and down
    assert w.float8_gathered_input_elements_per_token == 5 * H
    assert w.float8_gathered_output_elements_per_token == 2 * H
    assert w.dense_parameters == LINEAR_WEIGHTS


@pytest.mark.parametrize("fp8_share", [None, 0.5])
def test_float8_forward_matmuls_at_the_fp8_peak_and_the_scores_at_bf16(h100, work, fp8_share):
    """forward matmul seconds = linears' FLOPs / (fp8 peak x matmul_fp8 efficiency), matmul_fp8 the matmul figure
    where the file states none; the backward's at matmul_backward x matmul_fp8 / matmul (fp8 GEMMs the same share
    below the compute dtype's in both passes); the attention kernel's stay at the bf16 peak x attention efficiency."""
    if fp8_share is not None:
        h100 = attrs.evolve(h100, efficiency={**h100.efficiency, "matmul_fp8": fp8_share})
    seq = 4096
    tokens = seq  # one sequence, tp 1, cp 1
    fp8, bf16 = 1978.9e12, 989.4e12  # specs/hardware/h100.yaml
    eff_mm, eff_att = h100.efficiency["matmul"], h100.efficiency["attention"]
    eff_fp8 = h100.efficiency.get("matmul_fp8", eff_mm)
    base = f"seq={seq},param_dtype=bf16"
    plain, low = _layer(work, h100, base), _layer(work, h100, base + ",float8=tensorwise")
    assert plain["matmul_forward"] == pytest.approx(LINEAR_FLOPS * tokens / (bf16 * eff_mm), rel=1e-12)
    assert low["matmul_forward"] == pytest.approx(LINEAR_FLOPS * tokens / (fp8 * eff_fp8), rel=1e-12)
    pairs = seq * (seq + 1) / 2
    expected_scores = SCORE_FLOPS_PER_PAIR * pairs / (bf16 * eff_att)
    assert low["scores_forward"] == pytest.approx(expected_scores, rel=1e-12) == plain["scores_forward"]
    # the backward's matmuls: twice the forward's FLOPs at the backward efficiency
    assert low["matmul_backward"] == pytest.approx(
        2 * LINEAR_FLOPS * tokens / (fp8 * h100.efficiency["matmul_backward"] * eff_fp8 / eff_mm), rel=1e-12)


def test_float8_casts_move_2w_plus_1_bytes_an_element(h100, work):
    """The forward adds the input's and the weight's casts, the backward two of the output gradient, the weight
    and the input again: (2 * 2 + 1) bytes an element at bf16, over HBM at the memory efficiency."""
    seq, hbm, (eff, eff_b) = 4096, 3.35e12, _memory(h100)
    base = f"seq={seq},param_dtype=bf16"
    plain, low = _layer(work, h100, base), _layer(work, h100, base + ",float8=tensorwise")
    cast_fwd = 5 * (INPUTS * seq + LINEAR_WEIGHTS)
    cast_bwd = 5 * (2 * OUTPUTS * seq + INPUTS * seq + LINEAR_WEIGHTS)
    assert low["forward"] - plain["forward"] == pytest.approx(
        low["matmul_forward"] - plain["matmul_forward"] + cast_fwd / (hbm * eff), rel=1e-9)
    assert low["backward"] - plain["backward"] == pytest.approx(
        low["matmul_backward"] - plain["matmul_backward"] + cast_bwd / (hbm * eff_b), rel=1e-9)


def test_rowwise_scales_the_backwards_second_uses_through_a_transposed_copy(h100, work):
    """rowwise casts the weight gradient's output gradient and input, and the input gradient's weight, along their
    other axis: each first copied transposed at bf16 (read and written, 2 * 2 bytes an element), then cast
    (torchao roofline_utils.py, "rowwise"). The forward and the GEMMs are tensorwise's."""
    seq, hbm, (eff, eff_b) = 4096, 3.35e12, _memory(h100)
    base = f"seq={seq},param_dtype=bf16"
    tensorwise, rowwise = (_layer(work, h100, f"{base},float8={r}") for r in ("tensorwise", "rowwise"))
    assert rowwise["forward"] == tensorwise["forward"]
    assert rowwise["matmul_backward"] == tensorwise["matmul_backward"]
    copies = 4 * (OUTPUTS * seq + INPUTS * seq + LINEAR_WEIGHTS)
    assert rowwise["backward"] - tensorwise["backward"] == pytest.approx(copies / (hbm * eff_b), rel=1e-9)


def test_rowwise_with_gw_hp_keeps_the_weight_gradient_at_bf16(h100, work):
    """rowwise_with_gw_hp (torchao): the weight gradient's GEMM reads the saved bf16 input and the bf16 output
    gradient, so the backward casts the output gradient once and the weight once (5 bytes an element each), no
    input and no transposed copy; its GEMMs, the input gradient's at the fp8 peak and the weight gradient's at
    bf16's, each half the backward's FLOPs. The forward is tensorwise's."""
    seq, hbm, (eff, eff_b) = 4096, 3.35e12, _memory(h100)
    fp8, bf16 = 1978.9e12, 989.4e12  # specs/hardware/h100.yaml
    base = f"seq={seq},param_dtype=bf16"
    plain, tensorwise, hp = (_layer(work, h100, f"{base},float8={r}")
                             for r in ("none", "tensorwise", "rowwise_with_gw_hp"))
    assert hp["forward"] == tensorwise["forward"]
    eff_mm_b = h100.efficiency["matmul_backward"]
    assert hp["matmul_backward"] == pytest.approx(
        LINEAR_FLOPS * seq / (fp8 * eff_mm_b) + LINEAR_FLOPS * seq / (bf16 * eff_mm_b), rel=1e-12)
    cast_bwd = 5 * (OUTPUTS * seq + LINEAR_WEIGHTS)
    assert hp["backward"] - plain["backward"] == pytest.approx(
        hp["matmul_backward"] - plain["matmul_backward"] + cast_bwd / (hbm * eff_b), rel=1e-9)


def test_mfu_counts_gw_hp_s_weight_gradient_at_the_bf16_peak(h100, work):
    """Of a Float8 linear's training FLOPs (3 x its forward's), rowwise_with_gw_hp runs two thirds in fp8: the MFU's
    peak-weighted FLOPs count the weight gradient's third against the bf16 peak."""
    cols = ct.strategy_columns([Strategy.parse(f"seq=4096,param_dtype=bf16,float8={r}")
                                for r in ("rowwise", "rowwise_with_gw_hp")])
    flops, peak = ct._float8_model_flops(work, ct._rows(cols, h100), cols, h100)
    assert peak == 1978.9e12
    assert flops[1] == pytest.approx(flops[0] * 2 / 3, rel=1e-12)
    assert flops[0] == pytest.approx(3 * 32 * LINEAR_FLOPS * 4096, rel=1e-12)


def test_without_float8_tp_styles_each_linear_casts_what_it_reads_gathered(h100, work):
    """Under TP 4 with SP, tensorwise's Float8 TP styles cast a rank's quarter of the tokens before SP's gather
    (torchtitan parallelize_llama.py); rowwise runs plain TP, so q, k, v, gate and up cast their gathered input,
    every token's, and o and down their gathered output gradient: 3/4 of the tokens more of those elements, each
    cast (5 bytes) wherever tensorwise casts it, and the backward's copies (4 bytes) besides."""
    seq, b, tp, hbm, (eff, eff_b) = 4096, 8, 4, 3.35e12, _memory(h100)  # 8,192 tokens a rank: not launch-bound
    base = f"tp={tp},sp=true,seq={seq},micro_batch={b},param_dtype=bf16"
    plain, tensorwise, rowwise = (_layer(work, h100, f"{base},float8={r}") for r in ("none", "tensorwise", "rowwise"))
    split, more = b * seq / tp, b * seq * (1 - 1 / tp)
    weights = LINEAR_WEIGHTS / tp
    assert tensorwise["forward"] - plain["forward"] == pytest.approx(
        tensorwise["matmul_forward"] - plain["matmul_forward"] + 5 * (INPUTS * split + weights) / (hbm * eff),
        rel=1e-9)
    gathered_in, gathered_out = 3 * H + 2 * H, 2 * H  # q, k, v, gate, up read H; o and down write H
    assert rowwise["forward"] - tensorwise["forward"] == pytest.approx(5 * gathered_in * more / (hbm * eff), rel=1e-9)
    inputs, outputs = INPUTS * split + gathered_in * more, OUTPUTS * split + gathered_out * more
    rowwise_cast_bwd = 5 * (2 * outputs + inputs + weights) + 4 * (outputs + inputs + weights)
    tensorwise_cast_bwd = 5 * (2 * OUTPUTS * split + INPUTS * split + weights)
    assert rowwise["backward"] - tensorwise["backward"] == pytest.approx(
        (rowwise_cast_bwd - tensorwise_cast_bwd) / (hbm * eff_b), rel=1e-9)


def test_transformer_engine_casts_each_tensor_once_and_the_weight_once_a_step(h100, work):
    """Transformer Engine's current scaling reads a tensor for its amax, then reads it and writes it in fp8 with its
    transpose: (2 * 2 + 2) bytes an element at bf16. A micro-batch casts the linears' inputs forward (kept fp8 for
    the backward; Megatron-LM's fused linear_qkv and linear_fc1 each read one input) and the output gradients
    backward, once each; the weights once a step, so a sixteenth a micro-batch at 16 micro-batches
    (is_first_microbatch: TE keeps the fp8 weight and its transpose)."""
    seq, m, hbm, (eff, eff_b) = 4096, 16, 3.35e12, _memory(h100)
    te = attrs.evolve(work, float8_casts="transformer_engine")
    base = f"seq={seq},param_dtype=bf16,num_micro_batches={m}"
    plain, low = _layer(te, h100, base), _layer(te, h100, base + ",float8=tensorwise")
    fused_inputs = H + Q * D + H + FFN  # linear_qkv, linear_proj, linear_fc1 and linear_fc2 each cast their input
    cast_fwd = 6 * (fused_inputs * seq + LINEAR_WEIGHTS / m)
    cast_bwd = 6 * OUTPUTS * seq
    assert low["forward"] - plain["forward"] == pytest.approx(
        low["matmul_forward"] - plain["matmul_forward"] + cast_fwd / (hbm * eff), rel=1e-9)
    assert low["backward"] - plain["backward"] == pytest.approx(
        low["matmul_backward"] - plain["matmul_backward"] + cast_bwd / (hbm * eff_b), rel=1e-9)
    assert _layer(work, h100, base) == plain  # without float8 the casts' engine changes nothing


def test_float8_all_gather_casts_the_shard_before_each_gather(h100, work):
    """Under FSDP2's fp8 all-gather the weight is cast on the shard (1/8 of it at fsdp=8), once for the forward's
    gather and once for the backward's; the matmuls cast no weight."""
    seq, hbm, (eff, eff_b) = 4096, 3.35e12, _memory(h100)
    base = f"fsdp=8,seq={seq},param_dtype=bf16,float8=tensorwise"
    whole, gathered = _layer(work, h100, base), _layer(work, h100, base + ",float8_all_gather=true")
    saved = 5 * LINEAR_WEIGHTS * (1 - 1 / 8)
    assert whole["forward"] - gathered["forward"] == pytest.approx(saved / (hbm * eff), rel=1e-9)
    assert whole["backward"] - gathered["backward"] == pytest.approx(saved / (hbm * eff_b), rel=1e-9)


def test_float8_all_gather_halves_the_gathered_linears(registry):
    """bf16 parameters gathered as fp8: the linears' 218,103,808 elements of a layer move and are held at one
    byte, not two (norms at two). FSDP2 holds two layers gathered in the backward (the layer and the prefetched
    one), all 32 under reshard_after_forward=false."""
    model = ndcost.resolve("llama-3.1-8b", hardware="h100", census="off")
    for extra, layers in (("", 2), (",reshard_after_forward=false", 32)):
        text = "fsdp=8,seq=512,param_dtype=bf16,float8=tensorwise" + extra
        plain, fp8 = model.evaluate(text), model.evaluate(text + ",float8_all_gather=true")
        saved = (plain.stages[0].bytes_by_category["communication"]
                 - fp8.stages[0].bytes_by_category["communication"])
        assert saved == layers * LINEAR_WEIGHTS * (2 - 1)


def test_float8_all_gather_gathers_one_byte_an_element(h100, work):
    """A layer's FSDP all-gather: (linears x 1 + its two norms x 2) bytes under float8_all_gather, beside all of them
    at 2 bytes, through the same collective: 32 layers, each gathered for the forward and again for the backward,
    no root (neither embedding nor head on the rank), no compute to hide behind."""
    from types import SimpleNamespace

    from ndcost.compose import sharding

    coll = ct._collectives()
    eff = ct.efficiencies(h100)[0]
    counts = np.array([[[32.0]]])
    place = SimpleNamespace(has_embedding=np.zeros((1, 1), dtype=bool), has_head=np.zeros((1, 1), dtype=bool))
    rank = {"head_split": np.ones(1), "layer_forward": np.zeros((1, 1)), "layer_backward": np.zeros((1, 1, 1))}
    cols = ct.strategy_columns([Strategy.parse("fsdp=8,seq=512,param_dtype=bf16,float8=tensorwise")])
    rows, shard = ct._rows(cols, h100), sharding.sharding(cols)
    link = ct.group_link(h100, shard.shard_stride, shard.dense_ways, eff)

    def gathers(fp8):
        return float(ct._fsdp(work, rows, shard, counts, place, rank, h100, eff, coll, np.array([fp8]),
                              np.array([True]))["gathers"][0, 0])

    def by_hand(layer_bytes):
        return 2 * 32 * float(ct._run_rows(coll["all_gather"], np.array([True]), np.array([[layer_bytes]]),
                                           shard.dense_ways, link)[0, 0])

    assert gathers(True) == pytest.approx(by_hand(LINEAR_WEIGHTS * 1 + 2 * H * 2), rel=1e-12)
    assert gathers(False) == pytest.approx(by_hand((LINEAR_WEIGHTS + 2 * H) * 2), rel=1e-12)
    assert gathers(False) > gathers(True)


def test_compile_fuses_each_pointwise_chain(h100, work):
    """Eager Llama layer: two RMSNorms of 18 elements an element, two residual adds of 3, rotary on q and k of
    10 plus the token's cos and sin read by the queries' product and the keys' (4 a head width), SwiGLU of 5;
    compiled: the norms and adds 9 a hidden element, rotary 2, SwiGLU 3 (the tables' reads left out)."""
    seq, hbm, (eff, eff_b) = 4096, 3.35e12, _memory(h100)
    eager_elements = (2 * 18 + 2 * 3) * H + 10 * (Q + KV) * D + 4 * D + 5 * FFN
    fused_elements = 9 * H + 2 * (Q + KV) * D + 3 * FFN
    base = f"seq={seq},param_dtype=bf16"
    plain, compiled = _layer(work, h100, base), _layer(work, h100, base + ",compile=true")
    saved = 2 * seq * (eager_elements - fused_elements)  # bf16 bytes
    assert plain["forward"] - compiled["forward"] == pytest.approx(saved / (hbm * eff), rel=1e-9)
    assert plain["backward"] - compiled["backward"] == pytest.approx(2 * saved / (hbm * eff_b), rel=1e-9)
    assert compiled["matmul_forward"] == plain["matmul_forward"]


def test_async_tp_leaves_a_llama_layers_summed_input_gradients_to_nccl(h100, work):
    """q, k and v (and gate and up) read one all-gathered input, so their input gradients are summed before the
    backward's reduce-scatter, which no single matmul produces: torch's micro_pipeline_tp pass leaves both to
    NCCL, exposed; the forward's four collectives are fused and hide at least in part (tests/test_async_tp.py
    derives the fused ops)."""
    seq = 8192
    cols = ct.strategy_columns([Strategy.parse(f"tp=8,sp=true,seq={seq},compile=true,async_tp=true")])
    rows, eff, coll = ct._rows(cols, h100), ct.efficiencies(h100)[0], ct._collectives()
    layer = ct.layer_seconds(work, cols, h100, eff, rows)
    comm = ct._layer_communication(work, rows, cols, layer, np.zeros(1, dtype=bool), h100, eff, coll)
    bandwidth, latency, link = ct.group_link(h100, np.ones(1), rows.tp, eff)
    message = np.array([seq * H * 2.0])
    scatter = float(coll["reduce_scatter"](message, rows.tp, bandwidth, latency, **link)[0])
    gather = float(coll["all_gather"](message, rows.tp, bandwidth, latency, **link)[0])
    assert comm["exposed_bwd"][0, 0] >= 2 * scatter
    assert comm["exposed_fwd"][0, 0] < 2 * (gather + scatter)


@pytest.mark.parametrize("text, message", [
    ("tp=2,sp=true,async_tp=true,seq=8", "async_tp=true needs compile=true"),
    ("tp=2,compile=true,async_tp=true,seq=8", "async_tp=true needs sp=true"),
    ("fsdp=8,float8=rowwise,float8_all_gather=true,seq=8", "float8_all_gather=true needs float8=tensorwise"),
    ("float8=tensorwise,compute_dtype=fp8,seq=8", "float8 with compute_dtype=fp8"),
    ("float8=fp8,seq=8", "Strategy.float8: 'fp8' is not allowed; allowed: none, tensorwise, rowwise"),
    ("ep=2,dp=2,float8=rowwise_with_gw_hp,float8_experts=true,seq=8",
     "float8_experts=true with float8=rowwise_with_gw_hp"),
])
def test_combinations_no_run_makes_are_refused(text, message):
    with pytest.raises(InvalidValue, match=message):
        Strategy.parse(text)
    # the column codec says the same of the same row
    from ndcost import columns
    fields = dict(item.split("=") for item in text.split(","))
    batch = columns.encode({k: [v] for k, v in fields.items()}, ct.registry_names())
    assert message in batch.reason_array()[0]


def test_float8_on_hardware_without_an_fp8_peak_is_refused_naming_it():
    model = ndcost.resolve("llama-3.1-8b", hardware="a100", census="off")
    result = model.evaluate_many(["fsdp=8,seq=4096,float8=tensorwise", "fsdp=8,seq=4096"])
    assert not result.valid[0] and result.valid[1]
    assert "hardware 'a100' states no fp8 peak" in result.reason[0] and "use float8=none" in result.reason[0]


def test_evaluate_is_evaluate_many_with_the_new_fields():
    model = ndcost.resolve("llama-3.1-8b", hardware="h100", census="off")
    texts = ["fsdp=8,seq=4096,float8=tensorwise,float8_all_gather=true,compile=true",
             "fsdp=4,tp=2,sp=true,seq=4096,compile=true,async_tp=true,float8=rowwise", "fsdp=8,seq=4096"]
    many = model.evaluate_many(texts)
    for i, text in enumerate(texts):
        one = model.evaluate(text)
        assert one.peak_bytes == int(many.peak_bytes[i])
        assert one.time.step_seconds == pytest.approx(float(many.time["step_seconds"][i]), rel=1e-12)


def test_an_estimator_stating_no_float8_or_compiled_figures_leaves_them_unpriced(h100, work):
    """A KindWork from an estimator that predates the fields (None) prices neither float8 nor compile."""
    import attrs

    from ndcost.errors import Unpriced
    old = attrs.evolve(work, work={"dense": attrs.evolve(
        work.work["dense"], float8_mm_flops_per_token=None, compiled_elementwise_elements_per_token=None)})
    ct.step_time(old, [Strategy.parse("fsdp=8,seq=4096")], h100)  # the eager bf16 step still prices
    with pytest.raises(Unpriced, match=r"float8 \(a torchao recipe\): the FLOPs estimator of layer kind"):
        ct.step_time(old, [Strategy.parse("fsdp=8,seq=4096,float8=tensorwise")], h100)
    with pytest.raises(Unpriced, match="states no compiled_elementwise_elements_per_token"):
        ct.step_time(old, [Strategy.parse("fsdp=8,seq=4096,compile=true")], h100)


def test_mfu_counts_the_float8_linears_against_the_fp8_peak(h100, work):
    """MFU = time the model's FLOPs take at their peaks / (step x devices): under float8 the 32 layers'
    Linear FLOPs (three passes) at the fp8 peak, the rest at bf16's; it stays in (0, 1] where the GEMMs run
    faster than the bf16 peak."""
    seq, fp8, bf16 = 4096, 1978.9e12, 989.4e12
    priced = ct.step_time(work, [Strategy.parse(f"seq={seq},micro_batch=2,param_dtype=bf16,float8=tensorwise")],
                          h100)
    model_flops = 3 * float(work.forward_flops_per_sequence(seq)) * 2
    linears = 3 * 32 * LINEAR_FLOPS * seq * 2
    expected = ((model_flops - linears) / bf16 + linears / fp8) / float(priced.step_seconds[0])
    assert float(priced.mfu[0]) == pytest.approx(expected, rel=1e-12)
    assert 0 < float(priced.mfu[0]) <= 1


# A Qwen3-MoE layer: hidden 2048, 128 experts of width 768 (SwiGLU: gate and up fused, H -> 2 I; down I -> H),
# 8 a token; the router (H -> E) stays at the compute dtype
MOE_H, MOE_E, MOE_K, MOE_I = 2048, 128, 8, 768


def _moe_work(seq):
    transformers = pytest.importorskip("transformers")
    from ndcost.models import load_model

    config = transformers.Qwen3MoeConfig(hidden_size=MOE_H, num_experts=MOE_E, num_experts_per_tok=MOE_K,
                                         moe_intermediate_size=MOE_I, num_hidden_layers=2, num_attention_heads=32,
                                         num_key_value_heads=4, head_dim=128, vocab_size=1000)
    return analytic.model_work(load_model(config), seq)


def test_float8_experts_cast_each_copy_and_the_ranks_expert_weights(h100):
    """Under float8_experts each of a token's 8 copies casts its inputs (H into gate-up, I into down) and, in the
    backward, twice its output gradients (2 I out of gate-up, H out of down) and its inputs again; the rank's
    experts' weights (128 / ep of them, 3 H I each) once a pass: 2 w + 1 bytes an element."""
    seq, batch, ep, hbm, (eff, eff_b) = 16384, 4, 8, 3.35e12, _memory(h100)  # no pass launch-bound
    work = _moe_work(seq)
    kind = work.kinds[0]
    assert work.work[kind].float8_routed_input_elements_per_token == MOE_K * (MOE_H + MOE_I)
    assert work.work[kind].float8_routed_output_elements_per_token == MOE_K * (2 * MOE_I + MOE_H)
    assert work.work[kind].routed_mm_flops_per_token == 2 * MOE_K * 3 * MOE_H * MOE_I
    base = f"ep={ep},dp={ep},seq={seq},micro_batch={batch},param_dtype=bf16,float8=tensorwise"
    linears, experts = _layer(work, h100, base), _layer(work, h100, base + ",float8_experts=true")
    tokens = seq * batch  # the rank's micro-batch: ep borrows the data-parallel ranks, each routing its own
    weights = MOE_E // ep * 3 * MOE_H * MOE_I
    cast_fwd = 5 * (MOE_K * (MOE_H + MOE_I) * tokens + weights)
    cast_bwd = 5 * (2 * MOE_K * (2 * MOE_I + MOE_H) * tokens + MOE_K * (MOE_H + MOE_I) * tokens + weights)
    assert experts["forward"] - linears["forward"] == pytest.approx(
        experts["matmul_forward"] - linears["matmul_forward"] + cast_fwd / (hbm * eff), rel=1e-9)
    assert experts["backward"] - linears["backward"] == pytest.approx(
        experts["matmul_backward"] - linears["matmul_backward"] + cast_bwd / (hbm * eff_b), rel=1e-9)


def test_float8_experts_run_the_grouped_gemms_at_the_fp8_peak(h100):
    """With D, R and O a pass's dense-linear, routed and router matmul seconds at bf16 and r = bf16 / fp8 peak:
    no float8 takes D + R + O, float8 D r + R + O, float8_experts (D + R) r + O; so what the experts save over
    float8 alone is R (1 - r), and the routed seconds float8 alone leaves are that over 1 - r. A dense model's
    passes are the same with it or without."""
    work = _moe_work(4096)
    base = "ep=8,dp=8,seq=4096,param_dtype=bf16"
    none, f8, f8e = (_layer(work, h100, base + extra) for extra in
                     ("", ",float8=tensorwise", ",float8=tensorwise,float8_experts=true"))
    r = 989.4e12 / 1978.9e12  # specs/hardware/h100.yaml
    for key in ("matmul_forward", "matmul_backward"):
        routed = (f8[key] - f8e[key]) / (1 - r)
        dense = (none[key] - f8[key]) / (1 - r)
        assert 0 < routed < f8[key] and 0 < dense
        assert f8e[key] == pytest.approx((none[key] - routed - dense) + (routed + dense) * r, rel=1e-12)
    dense_work = analytic.model_work(llama_spec(), 4096)
    assert (_layer(dense_work, h100, "seq=4096,param_dtype=bf16,float8=tensorwise,float8_experts=true")
            == _layer(dense_work, h100, "seq=4096,param_dtype=bf16,float8=tensorwise"))
