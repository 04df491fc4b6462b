"""A kernel contract and a runtime profile shipped as a distribution: docs/examples/ndcost-kernel-example.

The example is installed with pip into a temporary folder and found through
its ``ndcost.plugins`` entry point. The census of a small Llama layer under
its runtime (``hf-cuda-triton-flash``) is held against ``hf-cuda``'s by the
bytes the two kernels keep differently, derived here by hand from what each
forward saves:

- FlashAttention's Triton kernel (flash_attn/flash_attn_triton.py in
  Dao-AILab/flash-attention, ``FlashAttnFunc.forward``): q, k and v with k
  and v at the query's ``a`` heads (it has no grouped-query attention; the
  integration repeats them), its output ``empty_like(q)``, and the fp32
  log-sum-exp ``[b, a, ceil(s / 128) * 128]``; no dropout state;
- torch SDPA's cuDNN kernel (contract ``cuda-sdpa``,
  plugins/contracts/cuda_sdpa.py): q, k and v at their own ``kv`` heads, the
  output, the fp32 log-sum-exp ``[b, a, s, 1]`` and two int64 RNG scalars.

q and the output are the same bytes in both (the output is o_proj's input),
so a layer keeps ``2 b (a - kv) s d`` more bf16 elements of k and v,
``b a (ceil(s / 128) * 128 - s)`` more fp32 statistics and 16 bytes less.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ndcost import manager

from _helpers import pip_install

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "ndcost-kernel-example"
RUNTIME = "hf-cuda-triton-flash"

# A small Llama: hidden 256, 8 heads of 32, 4 KV heads (2 a rank at TP 2), 200 tokens (not whole 128-blocks).
H, I, HEADS, KV, D, S, B = 256, 512, 8, 4, 32, 200, 1
LSE_QUERIES = 256  # 200 queries rounded up to whole blocks of 128


FIELDS = dict(hidden_size=H, intermediate_size=I, num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=D,
              num_hidden_layers=2, vocab_size=1000, max_position_embeddings=512)


def _config(**over):
    import transformers
    return transformers.LlamaConfig(**{**FIELDS, **over})


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example installed with pip into a temporary target folder, on sys.path while this module runs.

    Its torch side is imported once (custom ops cannot be defined twice in a process), so the
    modules stay imported until the module's tests end.
    """
    target = pip_install(EXAMPLE, tmp_path_factory.mktemp("kernel_example"))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(target))
        manager.reset()
        yield target
    for name in [m for m in sys.modules if m == "ndcost_kernel_example" or m.startswith("ndcost_kernel_example.")]:
        del sys.modules[name]
    manager.reset()


def _cli(site, *argv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "ndcost", *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_ndcost_plugins_lists_it(site):
    """``ndcost plugins --json`` names the entry point, its distribution and version, and what it registers."""
    found = [p for p in _cli(site, "plugins", "--json") if p["distribution"] == "ndcost-kernel-example"]
    assert found == [{"name": "kernel_example", "distribution": "ndcost-kernel-example", "version": "0.1.0",
                      "registered": ["contract/triton-flash-attention", "attention_kernel/flash_attn_triton",
                                     f"runtime/{RUNTIME}"]}]
    runtimes = {r["name"]: r["source"] for r in _cli(site, "list", "runtimes", "--json")}
    assert runtimes[RUNTIME] == "ndcost-kernel-example"


def _kept_differently(heads: int, kv_heads: int) -> int:
    """Bytes a rank holding *heads* query and *kv_heads* key-value heads keeps more under the Triton kernel."""
    repeated = 2 * B * (heads - kv_heads) * S * D * 2         # k and v at every query head, bf16
    statistics = B * heads * (LSE_QUERIES - S) * 4            # the log-sum-exp's padding to whole blocks, fp32
    return repeated + statistics - 2 * 8                      # no int64 RNG seed and offset


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_census_differs_by_what_the_kernel_keeps_differently(site, tp):
    """At TP 1 and on a rank of TP 2: the layer's saved bytes, and the attention's tensors by hand."""
    from ndcost.plugins.census import records
    from ndcost.plugins.census.layer import tp_config

    config = tp_config(_config(), tp)
    heads, kv_heads = HEADS // tp, KV // tp
    triton = records._measure_plain(config, 0, S, records.runtime_profile(RUNTIME))
    sdpa = records._measure_plain(config, 0, S, records.runtime_profile("hf-cuda"))
    assert triton.saved_bytes - sdpa.saved_bytes == _kept_differently(heads, kv_heads)

    attention = sorted((shape, dtype, op) for shape, dtype, _, op in triton.saved_tensors
                       if op in ("attBMM", "softmax", "dropout"))
    assert attention == sorted([((B, S, heads, D), "bfloat16", "attBMM")] * 4        # q, k, v, the output
                               + [((B, heads, LSE_QUERIES), "float32", "softmax")])  # the log-sum-exp
    assert triton.ops_bytes["softmax"] == B * heads * LSE_QUERIES * 4
    assert triton.ops_bytes["attBMM"] == 4 * B * S * heads * D * 2
    assert "dropout" not in triton.ops_bytes


@pytest.mark.slow
def test_the_census_through_the_cli(site, tmp_path):
    """``ndcost census CONFIG --runtime hf-cuda-triton-flash``: the TP 1 layer's bytes and scores' FLOPs by hand.

    Two RMSNorms (fp32 upcast, fp32 rstd, the bf16 normalised input, the output the next matmuls read),
    q, k, v and the output at every head, the log-sum-exp, and the MLP's gate, silu and up outputs and
    their product (down_proj's input); the rotary cos and sin apart.
    """
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", **FIELDS}))
    kind = _cli(site, "census", str(config), "--seq", str(S), "--runtime", RUNTIME, "--no-cache",
                "--json")["kinds"]["dense"]
    norm = 4 * S * H + 4 * S + 2 * S * H + 2 * S * H
    layer = 2 * norm + 4 * HEADS * S * D * 2 + HEADS * LSE_QUERIES * 4 + 4 * 2 * S * I
    assert (kind["saved_per_token"] + kind["saved_tp_per_token"]) * S == pytest.approx(layer, abs=1e-6)
    # the rotary cos and sin, which the model hands every layer: stated apart, a stage's layers share them
    assert kind["shared_saved_per_token"] == {"position_embeddings": 2 * 2 * D}
    # the causal pairs scored, as SDPA's: 2 b a (d + d) FLOPs a pair, s (s + 1) / 2 pairs
    assert kind["flops_by_part"]["scores"] == 2 * B * HEADS * 2 * D * S * (S + 1) // 2


@pytest.mark.slow
@pytest.mark.parametrize("over,says", [
    (dict(attention_dropout=0.1), "drops probabilities out"),
    (dict(head_dim=160), "takes one width up to 128"),
])
def test_what_the_kernel_cannot_run_is_refused(site, over, says):
    from ndcost.errors import CensusUnavailable
    from ndcost.plugins.census import records

    with pytest.raises(CensusUnavailable, match=says):
        records._measure_plain(_config(**over), 0, S, records.runtime_profile(RUNTIME))


@pytest.mark.slow
def test_census_off_prices_the_registered_kernel(site):
    """Without a census the op records price the kernel the runtime names: a fused one, keeping no scores."""
    from ndcost.resolver import resolve

    def layer(runtime):
        model = resolve(_config(), runtime=runtime, census="off")
        batch = model.evaluate_many({"seq": [S]})
        assert batch.valid[0], batch.reason[0]
        return batch.layer_activation_bytes[0], model.evaluate(f"seq={S}").provenance["records"][S]["attention"]

    (triton, said), (sdpa, _) = layer(RUNTIME), layer("hf-cuda")
    assert said.startswith("flash_attn_triton")
    assert list(triton) == list(sdpa)  # both keep a head's statistic a token, not the scores
