"""Loading a model: a Transformers config, config.json, a folder, a spec YAML or a name; and bad input."""
from __future__ import annotations

import json
import warnings

import pytest

from ndcost.errors import InvalidValue, UnknownKey
from ndcost.models import FamilyFallbackWarning, load_model, parameters
from ndcost.values import ModelSpec

SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=100)


def _config(model_type, **kwargs):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoConfig.for_model(model_type, **kwargs)


def _same(a: ModelSpec, b: ModelSpec):
    assert a.layers == b.layers
    assert (a.hidden_size, a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.vocab_size) == \
        (b.hidden_size, b.num_attention_heads, b.num_key_value_heads, b.head_dim, b.vocab_size)
    assert parameters(a) == parameters(b)


@pytest.mark.slow
@pytest.mark.parametrize("model_type,kwargs", [
    ("llama", dict(SMALL, tie_word_embeddings=True)),
    ("qwen3_moe", dict(SMALL, num_experts=8, moe_intermediate_size=32, num_experts_per_tok=2)),
    ("deepseek_v3", dict(num_hidden_layers=3, first_k_dense_replace=1, hidden_size=64, intermediate_size=96,
                         moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                         num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                         qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, vocab_size=100)),
    ("qwen3_5_moe", dict(text_config=dict(num_hidden_layers=4, hidden_size=64, moe_intermediate_size=32,
                                          shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=100,
                                          linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                          linear_value_head_dim=12))),
])
def test_config_object_json_path_and_folder_agree(tmp_path, model_type, kwargs):
    config = _config(model_type, **kwargs)
    config.save_pretrained(tmp_path)
    from_object = load_model(config)
    from_folder = load_model(tmp_path)
    from_file = load_model(tmp_path / "config.json")
    from_str = load_model(str(tmp_path / "config.json"))
    for spec in (from_folder, from_file, from_str):
        _same(from_object, spec)
    assert from_object.hf_config["model_type"] == model_type
    assert from_folder.model_type == model_type


def test_yaml_path_and_name_agree(tmp_path):
    from ndcost.models import model_path
    by_name = load_model("qwen3-30b-a3b")
    by_path = load_model(str(model_path("qwen3-30b-a3b")))
    _same(by_name, by_path)
    assert by_name.name == "qwen3-30b-a3b"
    assert by_name.num_experts == 128 and by_name.num_experts_per_tok == 8 and by_name.moe_intermediate_size == 768
    assert by_name.hf_config["model_type"] == "qwen3_moe"
    copy = tmp_path / "mine.yaml"
    copy.write_text(model_path("qwen3-30b-a3b").read_text())
    assert parameters(load_model(copy)).total == 30_532_122_624


def test_spec_passes_through_and_mapping_loads():
    spec = load_model("llama-2-7b")
    assert load_model(spec) is spec
    assert parameters(load_model(dict(spec.hf_config))).total == 6_738_415_616


@pytest.mark.slow
def test_transformers_config_round_trip():
    from ndcost.models import transformers_config
    for name in ("llama-3.1-8b", "deepseek-v3", "qwen3.5-35b-a3b", "deepseek-v4-flash", "gpt-oss-20b"):
        spec = load_model(name)
        config = transformers_config(spec)
        assert config.model_type == spec.model_type
        again = load_model(config)
        assert parameters(again).total == parameters(spec).total


def test_hf_config_json_without_defaults_reads_transformers_defaults(tmp_path):
    """A hand-written config.json that omits fields reads them at Transformers' defaults."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 128,
                                "num_attention_heads": 16, "vocab_size": 100}))
    spec = load_model(path)
    assert spec.num_key_value_heads == 8 and spec.intermediate_size == 14336  # MistralConfig's defaults
    assert spec.name == tmp_path.name


# --- bad input ---------------------------------------------------------------------------------
def test_missing_field_names_field_and_family(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "generic_thing", "hidden_size": 64, "num_attention_heads": 4,
                                "vocab_size": 100, "intermediate_size": 96}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(InvalidValue, match=r"generic_decoder family needs 'num_hidden_layers'"):
            load_model(path)


def test_missing_or_malformed_field_in_known_families():
    # Transformers' defaults fill what a known family's config omits; what has no default is named
    with pytest.raises(InvalidValue, match=r"deepseek_v32 config: the indexer needs q_lora_rank"):
        load_model({"model_type": "deepseek_v32", "q_lora_rank": None})
    from ndcost.models import ConfigReader
    with pytest.raises(InvalidValue, match=r"the llama family needs 'hidden_size' in the config"):
        ConfigReader({}, "llama").int("hidden_size")
    with pytest.raises(InvalidValue, match=r"'gpt2'.*n_embd must be an integer, got 'wide'"):
        load_model({"model_type": "gpt2", "n_embd": "wide"})


@pytest.mark.parametrize("field,value,pattern", [
    ("hidden_size", 0, r"hidden_size must be >= 1, got 0"),
    ("num_hidden_layers", -2, r"num_hidden_layers must be >= 1, got -2"),
    ("intermediate_size", 9.5, r"intermediate_size must be an integer, got 9.5"),
    ("num_attention_heads", 5, r"num_attention_heads 5 does not divide hidden_size 64"),
    ("num_key_value_heads", 3, r"num_key_value_heads 3 does not divide num_attention_heads 4"),
])
def test_bad_widths_raise_value_errors_with_numbers(field, value, pattern):
    config = dict(SMALL, model_type="llama", **{field: value})
    with pytest.raises(ValueError, match=pattern):
        load_model(config)


def test_mismatched_factors():
    base = dict(model_type="qwen3_moe", **SMALL, num_experts=8, moe_intermediate_size=32)
    with pytest.raises(InvalidValue, match="num_experts_per_tok 9 exceeds the 8 routed experts"):
        load_model(dict(base, num_experts_per_tok=9))
    with pytest.raises(InvalidValue, match=r"mlp_only_layers \[5\] are outside layers 0..1"):
        load_model(dict(base, mlp_only_layers=[5]))
    with pytest.raises(InvalidValue, match="first_k_dense_replace 9 exceeds num_hidden_layers 3"):
        load_model({"model_type": "deepseek_v3", "num_hidden_layers": 3, "first_k_dense_replace": 9})
    with pytest.raises(InvalidValue, match="layer_types lists 1 layers but num_hidden_layers is 4"):
        load_model({"model_type": "qwen3_next", "num_hidden_layers": 4, "layer_types": ["full_attention"]})
    with pytest.raises(InvalidValue, match=r"linear_num_key_heads 16 does not divide linear_num_value_heads 24 "
                                           r"\(24 / 16 = 1.5\)"):
        load_model({"model_type": "qwen3_next", "linear_num_value_heads": 24})
    with pytest.raises(InvalidValue, match=r"o_groups 3 does not divide num_attention_heads \* head_dim 32768"):
        load_model({"model_type": "deepseek_v4", "o_groups": 3})


def test_unknown_model_name_lists_closest():
    with pytest.raises(UnknownKey, match=r"unknown model 'qwen3-31b-a3b'; closest known: qwen3-30b-a3b"):
        load_model("qwen3-31b-a3b")


def test_missing_files_and_bad_files(tmp_path):
    with pytest.raises(InvalidValue, match="no such file"):
        load_model(str(tmp_path / "nope.json"))
    with pytest.raises(InvalidValue, match="holds no config.json"):
        load_model(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nconfig: [1, 2")
    with pytest.raises(InvalidValue, match="not valid YAML"):
        load_model(bad)
    bad.write_text("name: x\n")
    with pytest.raises(InvalidValue, match="'config' mapping"):
        load_model(bad)
    nomodel = tmp_path / "c.json"
    nomodel.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(InvalidValue, match="states no model_type"):
        load_model(nomodel)


def test_unknown_model_type_falls_back_with_a_warning(capsys):
    config = dict(SMALL, model_type="brand_new_lm", rms_norm_eps=1e-6)
    with pytest.warns(FamilyFallbackWarning, match=r"brand_new_lm.*hidden_size.*num_hidden_layers"):
        spec = load_model(config)
    assert spec.family == "generic_decoder"
    count = parameters(spec)
    # a Llama-like layer whose biases are unstated: a bias of the hidden width on each of 4 + 3 projections
    attention = 2 * 64 * 64 + 2 * 64 * 32 + 4 * 64
    ffn = 3 * 96 * 64 + 3 * 96
    assert count.by_kind["dense"] == {"attention": attention, "norm": 2 * 64, "ffn": ffn}
    assert count.total == 2 * (attention + 2 * 64 + ffn) + 100 * 64 * 2 + 64


def test_fallback_warning_reaches_stderr_in_the_cli(tmp_path, capsys):
    from ndcost.cli import main
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(SMALL, model_type="brand_new_lm", attention_bias=False, mlp_bias=False)))
    assert main(["params", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "generic decoder" in captured.err and "num_attention_heads" in captured.err
    assert json.loads(captured.out)["total"] > 0


def test_generic_fallback_with_stated_biases_and_norms_counts_like_llama():
    fields = dict(SMALL, attention_bias=False, mlp_bias=False, rms_norm_eps=1e-5, tie_word_embeddings=False)
    with pytest.warns(FamilyFallbackWarning):
        generic = parameters(load_model(dict(fields, model_type="llama_like_thing")))
    llama = parameters(load_model(dict(fields, model_type="llama")))
    assert generic.total == llama.total and dict(generic.by_part) == dict(llama.by_part)
