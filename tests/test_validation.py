"""Validation at the doors: hardware, model configs, YAML and spec files are refused with one clear line.

Each hostile input is an ``ndcost.errors.NdcostError`` (InvalidValue) naming the file or field, the value
and the fix, through the Python API and through the CLI (exit 1, one stderr line, no traceback). The files
are under ``tests/data/hostile/`` (``hw_``, ``config_``, ``spec_``, ``yaml_``), each holding one fault.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ndcost import Hardware
from ndcost.errors import InvalidValue
from ndcost.models import MAX_LAYERS, load_model, parameters, transformers_config
from ndcost.specio import MAX_YAML_ALIASES, load_hardware_yaml, load_yaml
from ndcost.values import NetworkLevel

HOSTILE = Path(__file__).parent / "data" / "hostile"

# The real microsoft/Phi-3-mini-4k-instruct config.json's fields: its pad token (32000) sits inside its
# 32,064-token vocabulary but outside half of it.
PHI3_MINI = {
    "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0,
    "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
    "sliding_window": 2047, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 32064,
}


def _cli(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "ndcost", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def _assert_refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit 1, one stderr line naming each fragment, a refusal rather than an internal error, no traceback."""
    lines = result.stderr.strip().splitlines()
    refusals = [line for line in lines if line.startswith("ndcost ")]
    assert result.returncode == 1, result.stderr
    assert len(refusals) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "internal error" not in refusals[0], refusals[0]
    for fragment in fragments:
        assert fragment in refusals[0], refusals[0]


# ---------------------------------------------------------------------------
# hardware: every figure a finite positive number, never a string
# ---------------------------------------------------------------------------
def _hardware(**change):
    fields = dict(name="toy", memory_bytes=80 * 2**30, hbm_bytes_per_second=3.35e12,
                  peak_flops_per_second={"bf16": 989e12}, devices_per_node=8,
                  network=(NetworkLevel(name="within_node", bytes_per_second=450e9, latency_seconds=3e-6),),
                  efficiency={"matmul": 0.77})
    fields.update(change)
    return Hardware(**fields)


@pytest.mark.parametrize("change,fragment", [
    (dict(hbm_bytes_per_second=0), "hbm_bytes_per_second must be > 0 (bytes per second), got 0"),
    (dict(hbm_bytes_per_second=-1e12), "hbm_bytes_per_second must be > 0"),
    (dict(hbm_bytes_per_second=math.nan), "hbm_bytes_per_second must be a finite number"),
    (dict(hbm_bytes_per_second=math.inf), "hbm_bytes_per_second must be a finite number"),
    (dict(hbm_bytes_per_second="3.35 TB/s"), "'3.35 TB/s'; units are not parsed: state a plain number in "
                                             "bytes per second"),
    (dict(hbm_bytes_per_second="3.35e12"), "is the string '3.35e12', not a number"),
    (dict(peak_flops_per_second={"bf16": 0.0}), "peak_flops_per_second.bf16 must be > 0 (FLOP per second)"),
    (dict(peak_flops_per_second={"bf16": -989e12}), "peak_flops_per_second.bf16 must be > 0"),
    (dict(peak_flops_per_second={"bf16": math.nan}), "peak_flops_per_second.bf16 must be a finite number"),
    (dict(peak_flops_per_second={"bf16": "989 TFLOPS"}), "units are not parsed"),
    (dict(peak_flops_per_second=989e12), "peak_flops_per_second must map a dtype to its peak"),
    (dict(memory_bytes="80GB"), "memory_bytes is '80GB'; units are not parsed: state a plain number in bytes"),
    (dict(memory_bytes=0), "memory_bytes must be a positive integer"),
    (dict(efficiency="high"), "efficiency must map an op class to a fraction of the peak"),
    (dict(efficiency={"matmul": "high"}), "efficiency.matmul must be a number"),
    (dict(efficiency={"matmul": 1.5}), "efficiency.matmul must be at most 1"),
    (dict(efficiency={"matmul": 0.0}), "efficiency.matmul must be > 0"),
    (dict(name=""), "name must be a non-empty string"),
    (dict(network={"within_node": 1}), "network must hold NetworkLevel values"),
])
def test_hardware_refuses_impossible_figures(change, fragment):
    with pytest.raises(InvalidValue, match="^") as err:
        _hardware(**change)
    assert fragment in str(err.value)


@pytest.mark.parametrize("change,fragment", [
    (dict(bytes_per_second=0.0), "bytes_per_second must be > 0"),
    (dict(bytes_per_second=math.nan), "bytes_per_second must be a finite number"),
    (dict(bytes_per_second="450 GB/s"), "units are not parsed"),
    (dict(latency_seconds=-3e-6), "latency_seconds must be >= 0 (seconds), got -3e-06"),
    (dict(latency_seconds=math.inf), "latency_seconds must be a finite number"),
])
def test_network_level_refuses_impossible_figures(change, fragment):
    fields = {**dict(name="within_node", bytes_per_second=450e9, latency_seconds=3e-6), **change}
    with pytest.raises(InvalidValue) as err:
        NetworkLevel(**fields)
    assert fragment in str(err.value)


def test_hardware_takes_the_boundaries_that_mean_something():
    """A zero latency and an efficiency of exactly 1 are real figures; ints are numbers too."""
    hardware = _hardware(hbm_bytes_per_second=3_350_000_000_000, efficiency={"matmul": 1.0},
                         network=(NetworkLevel(name="within_node", bytes_per_second=450e9, latency_seconds=0),))
    assert hardware.hbm_bytes_per_second == 3.35e12 and isinstance(hardware.hbm_bytes_per_second, float)
    assert hardware.network[0].latency_seconds == 0.0 and hardware.efficiency["matmul"] == 1.0


HW_FILES = [
    ("hw_zero_bandwidth.yaml", "hbm_bytes_per_second must be > 0"),
    ("hw_negative_peak.yaml", "peak_flops_per_second.bf16 must be > 0"),
    ("hw_nan_peak.yaml", "peak_flops_per_second.bf16 must be a finite number"),
    ("hw_negative_latency.yaml", "network level 'within_node': latency_seconds must be >= 0"),
    ("hw_memory_80GB.yaml", "memory_bytes is '80GB'; units are not parsed"),
    ("hw_bandwidth_with_unit.yaml", "hbm_bytes_per_second is '3.35 TB/s'; units are not parsed"),
    ("hw_efficiency_high.yaml", "efficiency must map an op class to a fraction of the peak"),
]


@pytest.mark.parametrize("name,fragment", HW_FILES)
def test_hostile_hardware_file_is_refused_naming_the_file(name, fragment):
    path = HOSTILE / name
    with pytest.raises(InvalidValue) as err:
        load_hardware_yaml(path)
    assert str(path) in str(err.value) and fragment in str(err.value)


def test_hardware_yaml_reads_exponents_as_numbers(tmp_path):
    """YAML 1.2's 4.8e12 is a number (PyYAML's 1.1 rules alone would read it as a string)."""
    text = (HOSTILE / "hw_zero_bandwidth.yaml").read_text().replace("hbm_bytes_per_second: 0",
                                                                    "hbm_bytes_per_second: 4.8e12")
    path = tmp_path / "mine.yaml"
    path.write_text(text.replace("memory_bytes: 150754820096", "memory_bytes: 1.5e11"))
    hardware = load_hardware_yaml(path)
    assert hardware.hbm_bytes_per_second == 4.8e12
    assert hardware.memory_bytes == 150_000_000_000 and isinstance(hardware.memory_bytes, int)


def test_hardware_spec_with_unknown_or_misplaced_fields_is_refused(tmp_path):
    text = (HOSTILE / "hw_zero_bandwidth.yaml").read_text().replace("hbm_bytes_per_second: 0",
                                                                    "hbm_bytes_per_second: 4.8e12")
    path = tmp_path / "typo.yaml"
    path.write_text(text + "hbm_bandwidth: 5\n")
    with pytest.raises(InvalidValue, match=r"unknown field\(s\) hbm_bandwidth"):
        load_hardware_yaml(path)
    path.write_text(text.replace("latency_seconds: 3.0e-6", "latency_us: 3"))
    with pytest.raises(InvalidValue, match=r"network level 'within_node': unknown field\(s\) latency_us"):
        load_hardware_yaml(path)


def test_shipped_hardware_specs_are_all_accepted():
    from importlib import resources
    shipped = [p for p in (resources.files("ndcost.specs") / "hardware").iterdir() if p.name.endswith(".yaml")]
    assert len(shipped) >= 6
    for path in shipped:
        hardware = load_hardware_yaml(path)
        assert hardware.hbm_bytes_per_second > 0 and all(v > 0 for v in hardware.peak_flops_per_second.values())


# ---------------------------------------------------------------------------
# model configs: checked before any family or Transformers reads them
# ---------------------------------------------------------------------------
LLAMA = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
         "num_hidden_layers": 32, "num_attention_heads": 32}


@pytest.mark.parametrize("change,fragment", [
    (dict(hidden_size=4096.0), "hidden_size must be an integer, got 4096.0"),
    (dict(hidden_size="4096"), "hidden_size must be an integer, got '4096'"),
    (dict(hidden_size=True), "hidden_size must be an integer, got True"),
    (dict(hidden_size=None), "hidden_size is null; state it as an integer"),
    (dict(vocab_size=None), "vocab_size is null"),
    (dict(num_key_value_heads=-8), "num_key_value_heads must be >= 1, got -8"),
    (dict(tie_word_embeddings="no"), "tie_word_embeddings must be true or false, got 'no'"),
    (dict(attention_bias=1), "attention_bias must be true or false, got 1"),
    (dict(attention_dropout="high"), "attention_dropout must be a probability in [0, 1], got 'high'"),
    (dict(attention_dropout=1.5), "attention_dropout must be a probability in [0, 1]"),
    (dict(rms_norm_eps=-1e-5), "rms_norm_eps must be a finite number > 0"),
    (dict(rope_scaling="yes"), "rope_scaling must be a mapping"),
    (dict(rope_scaling={"rope_type": 5}), "rope_scaling rope_type must be a name"),
    (dict(rope_scaling={"rope_type": "linear", "factor": "big"}), "rope_scaling factor must be a number >= 1"),
    (dict(rope_parameters={"rope_type": "linear", "factor": 0.5}), "rope_parameters factor must be a number >= 1"),
    (dict(pad_token_id=32000), "pad_token_id 32000 is outside the vocabulary (vocab_size 32000, ids 0..31999)"),
    (dict(pad_token_id=-32001), "pad_token_id -32001 is outside the vocabulary"),
    (dict(pad_token_id="<pad>"), "pad_token_id must be an integer token id or null"),
    (dict(num_hidden_layers=10_000_000), f"num_hidden_layers 10,000,000 is past {MAX_LAYERS:,}"),
    (dict(model_type=["llama"]), "model_type must be a name"),
    (dict(hidden_act=["silu"]), "hidden_act must be a name (silu, gelu, ...), got ['silu']"),
    (dict(model_type="qwen3", layer_types="full_attention"), "layer_types must be a list of layer type names"),
])
def test_bad_config_field_is_refused_by_cause(change, fragment):
    with pytest.raises(InvalidValue) as err:
        load_model({**LLAMA, **change})
    assert fragment in str(err.value)


def test_a_tied_flag_is_read_only_when_it_is_a_boolean():
    """"no" was read as tied (bool("no") is True); false and true are read as stated, for every family."""
    untied, tied = load_model({**LLAMA, "tie_word_embeddings": False}), load_model({**LLAMA,
                                                                                    "tie_word_embeddings": True})
    assert not untied.tie_word_embeddings and tied.tie_word_embeddings
    # the head is 32000 x 4096 where untied, absent where tied
    assert parameters(untied).total - parameters(tied).total == 32000 * 4096
    with pytest.raises(InvalidValue, match="tie_word_embeddings must be true or false, got 'no'"):
        load_model({**LLAMA, "model_type": "some_new_decoder", "tie_word_embeddings": "no"})


def test_a_negative_pad_counts_from_the_end_as_torch_embedding_does():
    spec = load_model({**LLAMA, "pad_token_id": -1})
    assert spec.vocab_size == 32000


def test_ten_million_layers_are_refused_before_anything_walks_them():
    with pytest.raises(InvalidValue, match="more layers than any model has"):
        load_model({**LLAMA, "num_hidden_layers": 10_000_000})
    with pytest.raises(InvalidValue, match="num_nextn_predict_layers"):
        load_model({**LLAMA, "num_nextn_predict_layers": MAX_LAYERS + 1})
    assert load_model({**LLAMA, "num_hidden_layers": MAX_LAYERS}).num_layers == MAX_LAYERS


def test_a_multimodal_configs_text_part_is_checked_too():
    text = {"model_type": "qwen3_5_text", "vocab_size": 1000, "hidden_size": 64.0}
    with pytest.raises(InvalidValue, match="hidden_size must be an integer, got 64.0"):
        load_model({"model_type": "qwen3_5", "text_config": text})
    with pytest.raises(InvalidValue, match="pad_token_id 1000 is outside the vocabulary"):
        load_model({"model_type": "qwen3_5", "pad_token_id": 1000, "text_config": {**text, "hidden_size": 64}})


@pytest.mark.slow
def test_transformers_refusal_of_a_config_is_a_refusal_not_an_internal_error():
    """The door where Transformers builds the config: its own exceptions and unknown RoPE types are InvalidValue."""
    pytest.importorskip("transformers")
    spec = load_model({**LLAMA, "rope_scaling": {"rope_type": "bogus"}})
    with pytest.raises(InvalidValue, match="rope_type 'bogus' is not one Transformers .* computes"):
        transformers_config(spec)
    spec = load_model({**LLAMA, "rope_scaling": {"rope_type": "yarn"}})  # yarn needs its factor
    with pytest.raises(InvalidValue, match="Transformers refuses its config .*factor"):
        transformers_config(spec)
    with pytest.raises(InvalidValue, match="hidden_act 'sigmoidal' is not an activation Transformers builds"):
        transformers_config(load_model({**LLAMA, "hidden_act": "sigmoidal"}))
    assert transformers_config(load_model({**LLAMA, "hidden_act": "silu"})).hidden_size == 4096


@pytest.mark.slow
def test_a_pad_token_transformers_defaults_past_the_vocabulary_is_refused():
    """Phi-3's config class defaults pad_token_id to 32000: a 32,000-token vocabulary without a pad is refused
    where Transformers builds it, not by torch's assertion in the embedding."""
    pytest.importorskip("transformers")
    small = {k: v for k, v in PHI3_MINI.items() if k != "pad_token_id"}
    spec = load_model({**small, "vocab_size": 32000})
    with pytest.raises(InvalidValue, match="pad_token_id 32000 is outside the vocabulary .*vocab_size 32000"):
        transformers_config(spec)


CONFIG_FILES = [
    ("config_float_hidden_size.json", "hidden_size must be an integer, got 4096.0"),
    ("config_null_hidden_size.json", "hidden_size is null"),
    ("config_rope_scaling_garbage.json", "rope_scaling must be a mapping"),
    ("config_rope_factor_string.json", "rope_scaling factor must be a number >= 1, got 'big'"),
    ("config_pad_past_vocab.json", "pad_token_id 32000 is outside the vocabulary"),
    ("config_tie_no.json", "tie_word_embeddings must be true or false, got 'no'"),
    ("config_ten_million_layers.json", "num_hidden_layers 10,000,000 is past 100,000"),
    ("config_dropout_high.json", "attention_dropout must be a probability in [0, 1], got 'high'"),
    ("config_latin1.json", "is not UTF-8 text (byte 0xe9"),
    ("spec_published_total_lots.yaml", "published_total must be a positive integer (a parameter count), got 'lots'"),
    ("yaml_alias_bomb.yaml", "aliases expand to more than 1,000,000 values"),
]


@pytest.mark.parametrize("name,fragment", CONFIG_FILES)
def test_hostile_model_file_is_refused_naming_the_file(name, fragment):
    path = HOSTILE / name
    with pytest.raises(InvalidValue) as err:
        load_model(path)
    assert str(path) in str(err.value) and fragment in str(err.value)


def test_shipped_model_specs_are_all_accepted():
    from ndcost.models import known_models
    names = known_models()
    assert len(names) >= 20
    for name in names:
        assert parameters(load_model(name)).total > 0


# ---------------------------------------------------------------------------
# YAML: one safe loader, aliases bounded
# ---------------------------------------------------------------------------
def test_yaml_aliases_past_the_bound_are_refused():
    many = "a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_YAML_ALIASES + 1)) + "]\n"
    with pytest.raises(InvalidValue, match=f"more than {MAX_YAML_ALIASES} YAML aliases"):
        load_yaml(many, where="mine.yaml")
    few = "a: &a 1\nb: [" + ", ".join(["*a"] * MAX_YAML_ALIASES) + "]\n"
    assert load_yaml(few)["b"] == [1] * MAX_YAML_ALIASES


def test_a_doubling_alias_chain_is_refused_by_what_it_expands_to():
    """Forty levels of two aliases each: 80 aliases, under the count bound, expanding to 2**40 values."""
    lines = ["l0: &l0 [x, x]"] + [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]" for i in range(1, 41)]
    with pytest.raises(InvalidValue, match="expand to more than"):
        load_yaml("\n".join(lines))


def test_yaml_errors_and_deep_nesting_are_refusals():
    with pytest.raises(InvalidValue, match="mine.yaml is not valid YAML"):
        load_yaml("a: [\n", where="mine.yaml")
    # libyaml's composer recurses in C: 100,000 levels would crash the interpreter, not raise. PyYAML 6.0.4
    # refuses past its own depth (1,000 flow levels) before ndcost's bound is reached: either is a refusal.
    with pytest.raises(InvalidValue, match="nested more than 10,000 levels deep|exceeded maximum nesting depth"):
        load_yaml("[" * 100_000 + "]" * 100_000)
    assert load_yaml("[" * 500 + "1" + "]" * 500, where="deep.yaml") is not None  # under both bounds: read


def test_every_yaml_read_goes_through_the_one_loader():
    """No module of ndcost calls PyYAML's loaders itself (yaml.load / safe_load / full_load / unsafe_load)."""
    root = Path(__file__).parent.parent
    offenders = []
    for folder in ("framework", "plugins", "registry"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "specio.py":
                continue
            text = path.read_text()
            offenders += [f"{path}: {call}" for call in ("yaml.load(", "yaml.safe_load(", "yaml.full_load(",
                                                         "yaml.unsafe_load(", "yaml.load_all(", "yaml.safe_load_all(")
                          if call in text]
    assert offenders == []


# ---------------------------------------------------------------------------
# Phi-3: a genuine config whose pad token sits past half its vocabulary
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_phi3_parameters_equal_transformers_on_the_meta_device():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.Phi3Config(**{k: v for k, v in PHI3_MINI.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.Phi3ForCausalLM(config)
    expected = sum(p.numel() for p in model.parameters())
    counted = parameters(load_model(PHI3_MINI))
    assert counted.total == expected == 3_821_079_552  # the model card's 3.8B


def test_output_census_key_holds_the_pad_token():
    """The output census builds the base model, whose embedding takes pad_token_id: it is in the cache key."""
    from ndcost.plugins.census.output import output_config
    assert output_config(PHI3_MINI)["pad_token_id"] == 32000
    assert output_config(PHI3_MINI) != output_config({**PHI3_MINI, "pad_token_id": None})


@pytest.mark.slow
def test_phi3_output_census_measures_at_half_the_vocabulary():
    """The half-vocabulary measurement (16,032 tokens) clears the pad token 32000 it cannot hold."""
    pytest.importorskip("transformers")
    from ndcost.plugins.census import records
    spec = load_model(PHI3_MINI)
    record = records.output_record(spec, 128, "hf-cuda", use_cache=False, progress=None)
    # the vocabulary-parallel part is the fp32 logits the loss keeps (ForCausalLMLoss upcasts them): 4 bytes a
    # vocabulary entry a token, as tests/test_census_vs_h200_sliding_window_output_selective.py derives
    assert record.saved_tp_per_token == 4 * PHI3_MINI["vocab_size"] == 128_256


@pytest.mark.slow
def test_phi3_params_and_estimate_run_through_the_cli(tmp_path):
    folder = tmp_path / "Phi-3-mini-4k-instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(PHI3_MINI, indent=2))
    params = _cli("params", str(folder), "--json")
    assert params.returncode == 0, params.stderr
    assert json.loads(params.stdout)["total"] == 3_821_079_552
    cache = {"NDCOST_CACHE_DIR": str(tmp_path / "cache")}
    estimate = _cli("estimate", str(folder), "--strategy", "seq=256", "--hardware", "h200", "--census", "auto",
                    "--json", env_extra=cache)
    assert estimate.returncode == 0, estimate.stderr
    assert "Traceback" not in estimate.stderr and "internal error" not in estimate.stderr
    records = json.loads(estimate.stdout)["provenance"]["records"]["256"]
    # the layers and the output layer measured by the census, not priced by the formulas' fallback
    assert records["activations"]["dense"].startswith("census:") and records["output"].startswith("census:")


# ---------------------------------------------------------------------------
# through the CLI: exit 1, one line, no traceback
# ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name,fragment", CONFIG_FILES)
def test_hostile_model_file_through_the_cli(name, fragment):
    _assert_refused(_cli("params", str(HOSTILE / name)), name, fragment)


@pytest.mark.slow
@pytest.mark.parametrize("name,fragment", HW_FILES)
def test_hostile_hardware_file_through_the_cli(name, fragment):
    result = _cli("estimate", "llama-3.1-8b", "--strategy", "seq=1024", "--census", "off", "--hardware",
                  str(HOSTILE / name))
    _assert_refused(result, name, fragment)
