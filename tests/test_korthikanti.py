"""The op records reproduce Korthikanti et al. 2022 exactly.

Paper: V. Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023, arXiv:2205.05198), section 4 and Table 2:
activation bytes of one transformer layer, with

- s the sequence length, b the micro-batch, h the hidden width, a the heads,
  t the tensor-parallel degree;

and the paper's assumptions, which every test here states to the records:

- 16-bit activations (2 bytes an element), 1-byte dropout masks;
- dropout after the attention softmax and after both residual branches
  (GPT-2's attn_pdrop and resid_pdrop);
- attention scores materialized (no fused attention kernel);
- a GPT-2 layer: pre-LayerNorm, 4h GeLU MLP, MHA with h/a-wide heads;
- the small terms the paper leaves out are left out (LayerNorm statistics).

Per layer (Table 2):
  no parallelism                       sbh (34 + 5as/h)
  tensor parallel                      sbh (10 + 24/t + 5as/(ht))
  tensor + sequence parallel           sbh/t (34 + 5as/h)
  TP + selective (core attention)      sbh (10 + 24/t)
  TP + SP + selective                  sbh 34/t
  full recompute                       2 sbh
The expected figures below are these formulas, computed with exact fractions.
"""
from fractions import Fraction as F

import pytest
from hypothesis import given, settings, strategies as st

from ndcost.plugins import op_records as R
from ndcost.layer import LayerKind
from ndcost.values import LayerGroup, ModelSpec

# GPT-2's layer as the paper assumes it: an ungated 4h MLP, learned positions, dropout 0.1 after the
# attention's softmax and after each block (GPT2Config's attn_pdrop and resid_pdrop)
GPT2_LAYER = LayerKind(attention="gqa", mlp="dense", mlp_matrices=2, rotary=False, activation="gelu_new",
                       attention_dropout=0.1, hidden_dropout=0.1)

# (s, b, h, a, t): GPT-2 medium and larger shapes of the paper's Table 3 sizes, and small odd ones
CASES = [
    (1024, 1, 1024, 16, 1),
    (1024, 1, 1024, 16, 2),
    (2048, 4, 1024, 16, 4),
    (2048, 1, 6144, 64, 8),      # 22B of Table 3
    (2048, 1, 12288, 96, 8),     # 175B (GPT-3) of Table 3
    (2048, 1, 20480, 128, 8),    # 1T of Table 3
    (512, 3, 768, 12, 3),        # t dividing a and h, not a power of two
    (96, 2, 64, 4, 2),
]


def gpt2_spec(h, a, layers=24):
    return ModelSpec(name=f"gpt2-h{h}-a{a}", model_type="gpt2", family="gpt2", hidden_size=h, vocab_size=50257,
                     num_attention_heads=a, intermediate_size=4 * h, layers=(LayerGroup(kind="dense", count=layers),),
                     kind_specs={"dense": GPT2_LAYER})


def paper_values(s, b, h, a, t, sp=False):
    """The layer's values under the paper's assumptions (stated, not left to defaults)."""
    return R.values_for(gpt2_spec(h, a), "dense", seq=s, micro_batch=b, tp=t, sp=sp,
                        attention="eager",   # scores materialized
                        dropout=True,        # attention and hidden dropout
                        # a norm keeps its 16-bit input and no statistics (the paper's LayerNorm)
                        overrides={"bytes_act": 2, "bytes_mask": 1, "norm_bytes": 2, "norm_row_bytes": 0})


def no_parallelism(s, b, h, a):
    return s * b * h * (34 + F(5 * a * s, h))


def tensor_parallel(s, b, h, a, t):
    return s * b * h * (10 + F(24, t) + F(5 * a * s, h * t))


def tensor_sequence_parallel(s, b, h, a, t):
    return F(s * b * h, t) * (34 + F(5 * a * s, h))


def tensor_parallel_selective(s, b, h, a, t):
    return s * b * h * (10 + F(24, t))


def tensor_sequence_parallel_selective(s, b, h, a, t):
    return F(34 * s * b * h, t)


def full_recompute(s, b, h, a):
    return 2 * s * b * h


@pytest.mark.parametrize("s, b, h, a, t", CASES)
def test_no_parallelism(s, b, h, a, t):
    assert R.total_bytes(paper_values(s, b, h, a, 1)) == no_parallelism(s, b, h, a)


@pytest.mark.parametrize("s, b, h, a, t", CASES)
def test_tensor_parallel(s, b, h, a, t):
    assert R.total_bytes(paper_values(s, b, h, a, t)) == tensor_parallel(s, b, h, a, t)


@pytest.mark.parametrize("s, b, h, a, t", CASES)
def test_tensor_and_sequence_parallel(s, b, h, a, t):
    assert R.total_bytes(paper_values(s, b, h, a, t, sp=True)) == tensor_sequence_parallel(s, b, h, a, t)


@pytest.mark.parametrize("mode", ["core_attention", "selective"])
@pytest.mark.parametrize("s, b, h, a, t", CASES)
def test_selective_recompute(s, b, h, a, t, mode):
    assert R.total_bytes(paper_values(s, b, h, a, t), mode) == tensor_parallel_selective(s, b, h, a, t)
    assert R.total_bytes(paper_values(s, b, h, a, t, sp=True), mode) == \
        tensor_sequence_parallel_selective(s, b, h, a, t)


@pytest.mark.parametrize("s, b, h, a, t", CASES)
def test_full_recompute(s, b, h, a, t):
    # The paper's row, 2sbh, without parallelism and under TP (each rank keeps the whole input).
    assert R.total_bytes(paper_values(s, b, h, a, 1), "full") == full_recompute(s, b, h, a)
    assert R.total_bytes(paper_values(s, b, h, a, t), "full") == full_recompute(s, b, h, a)
    # Under sequence parallelism the kept input is the rank's 1/t of the sequence (Megatron's
    # behaviour; the paper's table has no separate row).
    assert R.total_bytes(paper_values(s, b, h, a, t, sp=True), "full") == F(full_recompute(s, b, h, a), t)


@pytest.mark.parametrize("s, b, h, a, t", CASES[:4])
def test_section_4_1_breakdown(s, b, h, a, t):
    """Section 4.1, term by term: attention 11sbh + 5as^2b, MLP 19sbh, LayerNorms 4sbh."""
    sbh, as2b = s * b * h, a * s * s * b
    values = paper_values(s, b, h, a, 1)
    assert R.layer_bytes(values) == {"attention": 11 * sbh + 5 * as2b, "ffn": 19 * sbh, "norm": 4 * sbh}
    # by op: the QKV and output projections' inputs (attMM); Q, K, V and the dropped-out
    # probabilities (attBMM); the softmax output; three dropout masks; the norms' inputs;
    # the GeLU's input; the two MLP matmuls' inputs (2sbh and 8sbh)
    assert R.ops_bytes(values) == {
        "attMM": 2 * sbh + 2 * sbh,
        "attBMM": 4 * sbh + 2 * sbh + 2 * as2b,
        "softmax": 2 * as2b,
        "dropout": as2b + sbh + sbh,
        "normOp": 4 * sbh,
        "ffAct": 8 * sbh,
        "ffMM": 2 * sbh + 8 * sbh,
    }
    assert R.slot_bytes(values, "score") == 5 * as2b
    assert R.slot_bytes(values, "score", "core_attention") == 0
    assert R.slot_bytes(values, "qkv") == 8 * sbh
    assert R.slot_bytes(values, "proj") == 3 * sbh
    assert R.slot_bytes(values, "ffn") == 19 * sbh
    assert R.slot_bytes(values, "norm") == 4 * sbh
    assert R.op_bytes(values, "dropout") == {"score": as2b, "proj": sbh, "ffn": sbh}


@pytest.mark.parametrize("s, b, h, a, t", CASES)
def test_per_token_record_composes_to_the_table(s, b, h, a, t):
    """formula_record's per-token figures at TP 1: a rank keeps saved + saved_tp/t; under SP all over t."""
    record = R.formula_record(gpt2_spec(h, a), "dense", s, attention="eager", dropout=True,
                              overrides={"norm_bytes": 2, "norm_row_bytes": 0})  # the paper's LayerNorm
    assert record.source == "op_records" and record.seq == s and record.kind == "dense"
    tokens = s * b
    saved, split = F(record.saved_per_token), F(record.saved_tp_per_token)
    assert tokens * (saved + split) == no_parallelism(s, b, h, a)
    assert tokens * (saved + split / t) == tensor_parallel(s, b, h, a, t)
    assert tokens * (saved + split) / t == tensor_sequence_parallel(s, b, h, a, t)
    selective, selective_split = F(record.selective_per_token), F(record.selective_tp_per_token)
    assert tokens * (selective + selective_split / t) == tensor_parallel_selective(s, b, h, a, t)
    assert tokens * (selective + selective_split) / t == tensor_sequence_parallel_selective(s, b, h, a, t)
    # the unsplit part is exactly the paper's 10sbh: norms, the two dropout masks, two matmul inputs
    assert saved == 10 * h
    assert sum(map(F, record.ops.values())) == saved
    assert sum(map(F, record.ops_tp.values())) == split


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 4096), b=st.integers(1, 8), heads_per_rank=st.integers(1, 8),
       head_dim=st.integers(1, 128), t=st.sampled_from([1, 2, 3, 4, 8]))
def test_any_shape(s, b, heads_per_rank, head_dim, t):
    """Any layer tensor parallelism can split (t divides the heads), figures exact."""
    heads = heads_per_rank * t
    h = heads * head_dim
    values = paper_values(s, b, h, heads, t)
    assert R.total_bytes(values) == tensor_parallel(s, b, h, heads, t)
    assert R.total_bytes(values, "selective") == tensor_parallel_selective(s, b, h, heads, t)
    values_sp = paper_values(s, b, h, heads, t, sp=True)
    assert R.total_bytes(values_sp) == tensor_sequence_parallel(s, b, h, heads, t)


@pytest.mark.slow
def test_a_gpt2_config_through_the_families_loader():
    """Where the families team's loader exists, a Transformers GPT2Config gives the same figures."""
    models = pytest.importorskip("ndcost.models")
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=1024, n_head=16, n_layer=24, n_positions=2048)
    spec = models.load_model(config)
    s, b, t = 2048, 2, 4
    kind = spec.kinds[0]
    values = R.values_for(spec, kind, seq=s, micro_batch=b, tp=t, attention="eager")  # dropout read: 0.1
    # and what the paper leaves out, which the gpt2 family states: its two LayerNorms' fp32 mean and rstd
    # a token (native_layer_norm), 2 * 8 bytes, not split by TP
    stats = 16 * s * b
    assert R.total_bytes(values) == tensor_parallel(s, b, 1024, 16, t) + stats
    assert R.total_bytes(values, "selective") == tensor_parallel_selective(s, b, 1024, 16, t) + stats


# ---------------------------------------------------------------------------
# The resolver without a census: the runtime's attention kernel decides whether scores are kept
# ---------------------------------------------------------------------------
def _resolved_layer(config, runtime, t, **fields):
    """One layer's activation bytes on a rank, and the kernel the provenance names, census off."""
    from ndcost.resolver import resolve
    model = resolve(config, runtime=runtime, census="off")
    s = fields.pop("seq")
    batch = model.evaluate_many({"tp": [t], "seq": s, **{k: [v] for k, v in fields.items()}})
    assert batch.valid[0], batch.reason[0]
    attention = model.evaluate(f"seq={s}").provenance["records"][s]["attention"]
    return batch.layer_activation_bytes[0], attention


@pytest.mark.slow
@pytest.mark.parametrize("t", [1, 4])
def test_census_off_prices_the_runtimes_attention_kernel(t):
    """hf-cuda runs GPT-2 under SDPA: no scores, the fp32 log-sum-exp instead; hf-cuda-eager is the paper.

    Under SDPA the score slot keeps a head's fp32 statistic per query (4 bytes) where eager keeps
    5as bytes per token (softmax output, dropout mask, dropped-out probabilities): sbh(10 + 24/t) + 4abs/t,
    and the kernel's philox seed and offset (two int64, 16 bytes a layer). Beside the paper either way:
    GPT-2's two LayerNorms' fp32 mean and rstd, 16 bytes a token (the paper leaves them out).
    """
    transformers = pytest.importorskip("transformers")
    s, b, h, a = 1024, 1, 256, 8
    config = transformers.GPT2Config(n_embd=h, n_head=a, n_layer=2, n_positions=s, vocab_size=1000,
                                     bos_token_id=0, eos_token_id=0)  # dropout 0.1: GPT-2's defaults
    sbh, stats = s * b * h, 16 * s * b
    eager, said = _resolved_layer(config, "hf-cuda-eager", t, seq=s)
    assert said.startswith("eager")
    assert eager[0] == tensor_parallel(s, b, h, a, t) + stats
    sdpa, said = _resolved_layer(config, "hf-cuda", t, seq=s)
    assert said.startswith("sdpa")
    assert sdpa[0] == sbh * (10 + F(24, t)) + F(4 * a * s * b, t) + 16 + stats
    # core-attention recompute drops the statistics and the RNG state too: the paper's selective figure
    selective, _ = _resolved_layer(config, "hf-cuda", t, seq=s, recompute="core_attention")
    assert selective[0] == tensor_parallel_selective(s, b, h, a, t) + stats


@pytest.mark.slow
def test_census_off_prices_eager_attention_where_the_model_refuses_sdpa():
    """GPT-OSS refuses SDPA (its sinks), so hf-cuda runs it eager: its formulas keep the scores.

    Against Llama under the same runtime (SDPA, no dropout, the KV heads as they are): Transformers' eager
    attention (``eager_attention_forward``, models/llama/modeling_llama.py) copies the keys and values to every
    query head (``repeat_kv``: 2 KV heads to 4, 16 wide, 2 bytes), runs its softmax in fp32 (keeping the 4-byte
    output, a heads x s scores a token) and casts it back to bf16 for the second matmul, which keeps the cast
    copy (2 bytes a score); it drops SDPA's 4-byte statistic a head.
    """
    transformers = pytest.importorskip("transformers")
    s, a = 512, 4
    oss = transformers.GptOssConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=32, num_local_experts=4,
                                    num_experts_per_tok=2, num_attention_heads=a, num_key_value_heads=2,
                                    head_dim=16, vocab_size=100)
    cuda, said = _resolved_layer(oss, "hf-cuda", 1, seq=s)
    assert said.startswith("eager")
    assert list(cuda) == list(_resolved_layer(oss, "hf-cuda-eager", 1, seq=s)[0])
    llama = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                                     num_attention_heads=a, num_key_value_heads=2, vocab_size=100)
    sdpa, said = _resolved_layer(llama, "hf-cuda", 1, seq=s)
    assert said.startswith("sdpa")
    eager, _ = _resolved_layer(llama, "hf-cuda-eager", 1, seq=s)
    copies = s * (a - 2) * 16 * 2 * 2
    assert eager[0] - sdpa[0] == s * a * s * (4 + 2) + copies - s * a * 4 - 16  # and SDPA's philox seed and offset


@pytest.mark.slow
def test_the_census_under_hf_cuda_eager_materializes_the_scores():
    """Measured on fake tensors, hf-cuda-eager keeps what the records' eager score slot says over hf-cuda's SDPA.

    Per token: eager keeps the softmax output (2 bytes), the dropout mask (1) and the dropped-out
    probabilities (2) of a*s scores; SDPA keeps a head's fp32 log-sum-exp (4 bytes) instead, and a few
    bytes of dropout RNG state a layer (under a byte a token here).
    """
    transformers = pytest.importorskip("transformers")
    census = pytest.importorskip("ndcost.plugins.census")
    from ndcost.models import load_model
    s, h, a = 256, 128, 4
    spec = load_model(transformers.GPT2Config(n_embd=h, n_head=a, n_layer=1, n_positions=s, vocab_size=100,
                                              bos_token_id=0, eos_token_id=0))

    def kept(runtime):
        record = census.kind_records(spec, s, runtime=runtime, use_cache=False, progress=None)["dense"]
        return record.saved_per_token + record.saved_tp_per_token

    assert kept("hf-cuda-eager") - kept("hf-cuda") == pytest.approx(5 * a * s - 4 * a, abs=1)
