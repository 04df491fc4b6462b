"""The generic decoder family on model types no family plugin knows: OLMo-2, Gemma-2 (and Phi-3, which
now has its own family in plugins/families/llama.py: its counts are held to the same references).

Their configs do not state every tensor the modeling code builds (Phi-3 has
no bias on its fused qkv and gate_up, OLMo-2 QK-norms over the whole
projection width and no pre-attention norm, Gemma-2 four norms a layer), so
the family reads Transformers' own modules on the meta device. The reference
is ``sum(p.numel())`` of ``AutoModelForCausalLM.from_config`` built here under
``torch.device("meta")`` and, for the full models, the totals worked out by
hand below. Where the modules cannot be read, the parts the family guessed
are listed (``ParameterCount.uncounted`` and the fallback warning).
"""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from ndcost.cli import main
from ndcost.models import FamilyFallbackWarning, load_model, parameters

# The real configs' values (Hugging Face: microsoft/Phi-3-mini-4k-instruct, allenai/OLMo-2-1124-7B,
# google/gemma-2-9b config.json), written here: nothing is read from the hub.
PHI3_MINI = dict(model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, vocab_size=32064, rms_norm_eps=1e-5,
                 max_position_embeddings=4096, original_max_position_embeddings=4096, rope_theta=10000.0,
                 sliding_window=2047, hidden_act="silu", tie_word_embeddings=False, bos_token_id=1, eos_token_id=32000,
                 pad_token_id=32000, attention_dropout=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
OLMO2_7B = dict(model_type="olmo2", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=32, vocab_size=100352, rms_norm_eps=1e-6,
                max_position_embeddings=4096, rope_theta=500000.0, hidden_act="silu", attention_bias=False,
                tie_word_embeddings=False, bos_token_id=None, eos_token_id=100257, pad_token_id=100277)
GEMMA2_9B = dict(model_type="gemma2", hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=256, vocab_size=256000, rms_norm_eps=1e-6,
                 max_position_embeddings=8192, rope_theta=10000.0, sliding_window=4096, query_pre_attn_scalar=256,
                 attn_logit_softcapping=50.0, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
                 attention_bias=False, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0)

# By hand (h hidden, f intermediate, L layers, V vocabulary):
# Phi-3-mini: a layer 4 h^2 (qkv fused, no bias) + 3 h f (gate_up fused) + 2 norms h; untied head.
PHI3_MINI_TOTAL = 32 * (4 * 3072 ** 2 + 3 * 3072 * 8192 + 2 * 3072) + 2 * 32064 * 3072 + 3072
# OLMo-2-7B: q, k, v, o h x h; q_norm and k_norm over h each; post-attention and post-feedforward norms.
OLMO2_7B_TOTAL = 32 * (4 * 4096 ** 2 + 3 * 4096 * 11008 + 4 * 4096) + 2 * 100352 * 4096 + 4096
# Gemma-2-9B: q h x 16*256, k and v h x 8*256, o 16*256 x h; four norms a layer; the head tied.
GEMMA2_9B_TOTAL = (42 * (3584 * (4096 + 2048 + 2048) + 4096 * 3584 + 3 * 3584 * 14336 + 4 * 3584)
                   + 256000 * 3584 + 3584)
assert (PHI3_MINI_TOTAL, OLMO2_7B_TOTAL, GEMMA2_9B_TOTAL) == (3_821_079_552, 7_298_617_344, 9_241_705_984)

GENERIC = {"olmo-2-1124-7b", "gemma-2-9b"}  # the ones counted by the generic family
FULL = {"phi-3-mini-4k": (PHI3_MINI, PHI3_MINI_TOTAL), "olmo-2-1124-7b": (OLMO2_7B, OLMO2_7B_TOTAL),
        "gemma-2-9b": (GEMMA2_9B, GEMMA2_9B_TOTAL)}


@pytest.fixture
def without_olmo2_plugin(monkeypatch, fresh):
    """The plugins loaded without ndcost-olmo2 (.ci/run installs it), whose family would claim olmo2."""
    from ndcost import manager
    entry_points = manager._entry_points
    monkeypatch.setattr(manager, "_entry_points",
                        lambda: [ep for ep in entry_points() if ep.dist is None or ep.dist.name != "ndcost-olmo2"])
    manager.reset()


def small(config, **fields):
    """*config* with two layers and a small vocabulary: every kind of tensor still present."""
    out = dict(config, num_hidden_layers=2, vocab_size=512, **fields)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        out[key] = None if out.get(key) is None else min(out[key], 511)
    return out


def meta_total(config) -> int:
    """``sum(p.numel())`` of Transformers' model of *config* built on the meta device."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    fields = dict(config)
    hf = CONFIG_MAPPING[fields.pop("model_type")].from_dict(fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    return sum(p.numel() for p in model.parameters())


def params_json(tmp_path, config, capsys) -> dict:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["params", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FULL))
def test_ndcost_params_of_the_full_model_equals_transformers_and_the_hand_total(name, tmp_path, capsys,
                                                                              without_olmo2_plugin):
    pytest.importorskip("transformers")
    config, by_hand = FULL[name]
    data = params_json(tmp_path, config, capsys)
    assert data["total"] == meta_total(config) == by_hand
    assert data["uncounted"] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FULL))
def test_small_variants_equal_transformers_part_by_part(name, without_olmo2_plugin):
    pytest.importorskip("transformers")
    from _hf_parts import hf_parts
    from transformers import CONFIG_MAPPING

    config = small(FULL[name][0])
    fields = dict(config)
    reference, total, _ = hf_parts(CONFIG_MAPPING[fields.pop("model_type")].from_dict(fields))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count = parameters(load_model(config))
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, FamilyFallbackWarning)]
    if name in GENERIC:
        assert fallbacks and all("as Transformers' modules hold them" in m for m in fallbacks)
    else:
        assert not fallbacks  # a family of its own
    assert count.total == total
    assert dict(count.by_part) == reference  # the parts as tests/_hf_parts.py sorts the names
    assert count.uncounted == ()


@pytest.mark.slow
def test_the_counts_are_cached_so_a_second_load_imports_no_torch(tmp_path):
    pytest.importorskip("transformers")
    config = small(GEMMA2_9B)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FamilyFallbackWarning)
        expected = parameters(load_model(config)).total
    script = ("import json, sys, warnings\nwarnings.simplefilter('ignore')\n"
              "from ndcost.models import load_model, parameters\n"
              f"count = parameters(load_model(json.loads({json.dumps(json.dumps(config))})))\n"
              "print(count.total, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(expected), "False", "False"]


def test_without_transformers_modules_the_guessed_parts_are_listed(monkeypatch, tmp_path, capsys):
    from ndcost.plugins.census import modules
    monkeypatch.setattr(modules, "unavailable", lambda model_type: "torch and transformers not installed (test)")
    # Phi-3's fields under a model type no family claims (Phi-3 itself has a family), so the generic one counts it
    config = dict(small(PHI3_MINI), model_type="phi3_variant")
    with pytest.warns(FamilyFallbackWarning, match="parts it could not count: norms.*attention biases"):
        count = parameters(load_model(config))
    assert any("attention biases" in part and "not installed (test)" in part for part in count.uncounted)
    assert any("MLP biases" in part for part in count.uncounted)
    # the guess is the formulas' convention (a bias of the intermediate width on each of the three MLP
    # matrices, tests/test_params.py by hand), so it differs from Phi-3's real modules (no biases at all)
    h, f = 3072, 8192
    assert count.by_kind["dense"]["ffn"] == 3 * h * f + 3 * f
    data = params_json(tmp_path, config, capsys)
    assert data["uncounted"] == list(count.uncounted)


def test_a_model_type_transformers_lacks_lists_its_guessed_parts():
    config = dict(small(OLMO2_7B), model_type="brand_new_decoder")
    with pytest.warns(FamilyFallbackWarning, match="parts it could not count"):
        count = parameters(load_model(config))
    assert count.uncounted and all("no modeling code for model_type 'brand_new_decoder'" in p
                                   for p in count.uncounted)
    # attention_bias is stated (False), mlp_bias is not
    assert not any(p.startswith("attention biases") for p in count.uncounted)
    assert any(p.startswith("MLP biases") for p in count.uncounted)
