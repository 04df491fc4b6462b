"""A model family shipped as a third-party distribution: docs/examples/ndcost-olmo2 (OLMo-2).

The example is installed with pip into a temporary folder, found through its
``ndcost.plugins`` entry point, and its counts are checked against
Transformers' own Olmo2ForCausalLM built on the meta device, with the
parameters sorted into parts by their names here (independently of ndcost's
families); its census against a derivation by hand from Transformers'
modeling_olmo2.py; ``ndcost verify`` on it. Uninstalled with pip from a
throwaway venv, ndcost falls back to the generic family. Two distributions
registering ``family/olmo2`` (tests/data/dists) are refused with one message
naming both, unless one says ``override=True``; a fake distribution overrides
the built-in ``family/llama`` to show that an explicit override wins and is
reported as one.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from pathlib import Path

import pytest

from ndcost import manager
from ndcost.errors import RegistrationError
from ndcost.models import FamilyFallbackWarning, family_for, load_model, parameters

from _helpers import pip_install, pip_install_into, throwaway_venv

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "ndcost-olmo2"
DIST = "ndcost-olmo2"
MODULE = "ndcost_olmo2"


def forget(*modules: str) -> None:
    for name in list(sys.modules):
        if any(name == m or name.startswith(m + ".") for m in modules):
            del sys.modules[name]


@pytest.fixture(scope="module")
def olmo2_site(tmp_path_factory):
    return pip_install(EXAMPLE, tmp_path_factory.mktemp("olmo2"))


@pytest.fixture
def olmo2(olmo2_site, monkeypatch, fresh):
    """The installed example on sys.path, and the plugins reloaded to find it."""
    monkeypatch.syspath_prepend(str(olmo2_site))
    manager.reset()
    yield olmo2_site
    forget(MODULE)
    manager.reset()


# ---------------------------------------------------------------------------
# the reference: Transformers' parameters by part, classified by name here
# ---------------------------------------------------------------------------
def part_of(name: str) -> str:
    """The part an Olmo2/Llama parameter name belongs to (Transformers' module names)."""
    if ".embed_tokens." in name:
        return "embedding"
    if name.startswith("lm_head."):
        return "head"
    if re.search(r"\.self_attn\.(q_norm|k_norm)\.", name):
        return "norm"
    if ".self_attn." in name:
        return "attention"
    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        return "norm"
    if ".mlp." in name:
        return "ffn"
    raise AssertionError(f"no part for Transformers parameter {name}")


def meta_parts(config):
    """(whole model by part, layer 0 by part, total) of *config*'s causal LM built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    whole, layer0 = Counter(), Counter()
    for name, p in model.named_parameters():  # a tied head is one parameter, listed once
        whole[part_of(name)] += p.numel()
        if name.startswith("model.layers.0."):
            layer0[part_of(name)] += p.numel()
    return dict(whole), dict(layer0), sum(p.numel() for p in model.parameters())


def olmo2_config(**fields):
    from transformers import Olmo2Config
    fields.setdefault("eos_token_id", None)  # the default 50279 lies outside a small vocabulary
    return Olmo2Config(**fields)


SMALL = {
    # GQA with biases on q, k, v and o, the head tied to the embedding
    "gqa-bias-tied": dict(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=3,
                          num_attention_heads=8, num_key_value_heads=2, attention_bias=True,
                          tie_word_embeddings=True),
    # a stated head width that is not hidden / heads (192 / 4 = 48)
    "stated-head-dim": dict(vocab_size=512, hidden_size=192, intermediate_size=300, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=4, head_dim=64),
}

# OLMo-2-1124-7B by hand: hidden h = 4096, 32 heads of 128 (q, k, v, o all h x h), FFN f = 11008,
# vocabulary v = 100352, untied. A layer: 4 h^2 + 3 h f + q_norm h + k_norm h + 2 norms of h
# = 67,108,864 + 135,266,304 + 16,384 = 202,391,552; 32 layers = 6,476,529,664;
# embedding and head 2 v h = 822,083,584; final norm 4096.
OLMO2_7B_LAYER = 4 * 4096 ** 2 + 3 * 4096 * 11008 + 4 * 4096
OLMO2_7B_TOTAL = 32 * OLMO2_7B_LAYER + 2 * 100352 * 4096 + 4096
assert OLMO2_7B_TOTAL == 7_298_617_344


# ---------------------------------------------------------------------------
# without the plugin: a real pip uninstall in a throwaway environment
# ---------------------------------------------------------------------------
def _ndcost(bin_dir: Path, *args: str, cwd: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([str(bin_dir / "ndcost"), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600)


@pytest.mark.slow
def test_after_pip_uninstall_ndcost_falls_back_to_the_generic_family_with_its_warning(tmp_path):
    bin_dir = throwaway_venv(tmp_path, REPO)
    copy = tmp_path / "ndcost-olmo2"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = [str(bin_dir / "python"), "-m", "pip"]
    installed = subprocess.run(pip + ["install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                                      str(copy)], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr
    fields = dict(SMALL["gqa-bias-tied"])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "olmo2", "eos_token_id": None, **fields}))
    *_, total = meta_parts(olmo2_config(**fields))

    with_it = _ndcost(bin_dir, "params", "config.json", cwd=tmp_path)
    assert with_it.returncode == 0, with_it.stderr
    assert "(olmo2, family olmo2)" in with_it.stdout.splitlines()[0]
    assert "no family plugin" not in with_it.stderr

    removed = subprocess.run(pip + ["uninstall", "--yes", DIST], capture_output=True, text=True, timeout=300)
    assert removed.returncode == 0, removed.stderr
    without = _ndcost(bin_dir, "params", "config.json", cwd=tmp_path)
    assert without.returncode == 0, without.stderr
    assert "(olmo2, family generic_decoder)" in without.stdout.splitlines()[0]
    # the CLI's one line for a FamilyFallbackWarning
    assert without.stderr.startswith("warning: no family plugin for model_type 'olmo2'")
    assert "counting it as a generic decoder" in without.stderr
    # the generic family reads Transformers' modules on the meta device: still exact
    assert f"{total:,} parameters" in with_it.stdout.splitlines()[0]
    assert f"{total:,} parameters" in without.stdout.splitlines()[0]


# ---------------------------------------------------------------------------
# with it
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_the_distribution_registers_its_family_and_slot(olmo2):
    loaded = manager.plugins()
    ours = [p for p in loaded.plugins if p.distribution == DIST]
    assert len(ours) == 1 and ours[0].error is None
    assert ours[0].name == "olmo2" and ours[0].version == "0.1.0" and ours[0].module == MODULE
    assert set(ours[0].registered) == {"family/olmo2", "formula/olmo2.params.qk_norm"}
    entry = loaded.registry.entry("family/olmo2")
    assert entry.source.distribution == DIST and not entry.override
    family = family_for("olmo2")
    assert family.name == "olmo2" and family.stack_census is False
    # the slot is a plain function of keyword counts: (heads + kv_heads) * head_dim
    assert loaded.registry.get("formula/olmo2.params.qk_norm")(heads=8, kv_heads=2, head_dim=32) == 320


@pytest.mark.slow
def test_ndcost_plugins_json_lists_it_with_its_distribution_and_version(olmo2, capsys):
    from ndcost.cli import main

    assert main(["plugins", "--json"]) == 0
    ours = [p for p in json.loads(capsys.readouterr().out) if p["distribution"] == DIST]
    assert ours == [{"name": "olmo2", "distribution": DIST, "version": "0.1.0",
                     "registered": ["formula/olmo2.params.qk_norm", "family/olmo2"]}]


@pytest.mark.slow
def test_its_layer_kinds_and_census_settings(olmo2):
    from transformers.models.olmo2 import modeling_olmo2

    from ndcost.layer import LayerKind

    spec = load_model(olmo2_config(**SMALL["gqa-bias-tied"], hidden_act="gelu", attention_dropout=0.1))
    assert dict(spec.kind_specs) == {"dense": LayerKind(attention="gqa", mlp="dense", qk_norm=True,
                                                        activation="gelu", attention_dropout=0.1)}
    # a config.json stating only what differs reads Olmo2Config's defaults (SiLU, no dropout)
    bare = load_model({"model_type": "olmo2", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                       "num_hidden_layers": 2, "num_attention_heads": 4})
    assert bare.kind_specs["dense"].activation == "silu" and bare.kind_specs["dense"].attention_dropout == 0
    family = family_for("olmo2")
    assert family.stack_census is False  # one Olmo2DecoderLayer runs alone
    assert family.supports_sdpa is modeling_olmo2.Olmo2PreTrainedModel._supports_sdpa is True


# The census of one Olmo2DecoderLayer under hf-cuda (SDPA), worked out by hand from Transformers'
# models/olmo2/modeling_olmo2.py for CENSUS_CONFIG: h = 256, 8 query heads and 2 KV heads of d = 32, FFN f = 688,
# bf16 (2 bytes), at S = 512 tokens, bytes a token at TP 1. TP splits the heads' and the FFN's widths:
#   q_norm over q = 8 * 32 = 256: Olmo2RMSNorm keeps its input upcast to fp32 (4 * 256) and the fp32 normalized
#     tensor the weight multiplies ((weight * x).to(dtype): 4 * 256), k_norm the same over 64: 2,560 in all;
#   SDPA keeps the rotated queries (2 * 256), keys and values (2 * 64 each) and its output (2 * 256), 1,280, and
#     its fp32 log-sum-exp, one a head (4 * 8 = 32);
#   the MLP keeps the gate projection's output, its SiLU, the up projection's output and their product
#     (the down projection's input): 4 * 2 * 688 = 5,504.
# Not split: the layer's input (the q, k and v projections' input, 2 * 256); the two post-norms' fp32
# input and normalized tensor (2 * 8 * 256) and every norm's fp32 rsqrt (4 norms * 4 bytes); the MLP's input
# (2 * 256); SDPA's philox seed and offset (16 bytes a layer).
CENSUS_CONFIG = dict(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=2)
CENSUS_SEQ = 512
CENSUS_SAVED_TP = 2 * 4 * 256 + 2 * 4 * 64 + 2 * (256 + 64 + 64 + 256) + 4 * 8 + 4 * 2 * 688
CENSUS_SAVED = 2 * 256 + 2 * 8 * 256 + 4 * 4 + 2 * 256 + 16 / CENSUS_SEQ
# Stated apart (the model hands them every layer: one storage a stage): the rotary cos and sin, in fp32
# (Olmo2RotaryEmbedding returns them unconverted; q * cos keeps cos: 2 * 4 * 32 = 256)
CENSUS_SHARED = {"position_embeddings": 2 * 4 * 32}
# forward FLOPs: 2 S per weight of the matmuls (q, o 256 x 256; k, v 256 x 64; three 256 x 688), and the
# causal scores and values, 2 * 2 * heads * d a query-key pair over S (S + 1) / 2 pairs
CENSUS_FLOPS = (2 * CENSUS_SEQ * (2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 688)
                + 4 * 8 * 32 * CENSUS_SEQ * (CENSUS_SEQ + 1) // 2)
assert (CENSUS_SAVED_TP, CENSUS_FLOPS) == (9_376, 843_317_248)


@pytest.fixture
def census_config(tmp_path, monkeypatch):
    monkeypatch.setenv("NDCOST_CACHE_DIR", str(tmp_path / "cache"))  # measured here, not read from a cache
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "olmo2", "eos_token_id": None, **CENSUS_CONFIG}))
    return path


@pytest.mark.slow
def test_ndcost_census_measures_an_olmo2_layer_as_derived_by_hand(olmo2, census_config, capsys):
    from ndcost.cli import main

    assert main(["census", str(census_config), "--seq", str(CENSUS_SEQ), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runtime"] == "hf-cuda" and set(data["kinds"]) == {"dense"} and data["output"]
    dense = data["kinds"]["dense"]
    assert dense["saved_tp_per_token"] == CENSUS_SAVED_TP
    assert dense["saved_per_token"] == pytest.approx(CENSUS_SAVED, abs=1e-9)
    assert dense["shared_saved_per_token"] == CENSUS_SHARED
    assert sum(dense["flops_by_part"].values()) == CENSUS_FLOPS


@pytest.mark.slow
def test_ndcost_verify_runs_on_it_and_its_parameters_agree_with_transformers(olmo2, census_config, capsys):
    from ndcost.cli import main

    assert main(["verify", str(census_config), "--seq", str(CENSUS_SEQ), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    parameters_rows = [r for r in rows if r["quantity"].startswith("parameters.")]
    assert parameters_rows and not any(r["flagged"] for r in parameters_rows)
    *_, total = meta_parts(olmo2_config(**CENSUS_CONFIG))
    assert next(r for r in parameters_rows if r["quantity"] == "parameters.total")["census"] == total
    # the census side of the activation rows is the measurement derived by hand above
    saved = {r["quantity"]: r for r in rows if r["kind"] == "dense"}
    assert saved["saved_tp_per_token"]["census"] == CENSUS_SAVED_TP
    assert saved["flops.forward"]["census"] == saved["flops.forward"]["formula"] == CENSUS_FLOPS


@pytest.mark.slow
def test_ndcost_verify_strict_passes_on_it_and_the_formulas_keep_what_was_derived_by_hand(olmo2, census_config,
                                                                                         capsys):
    """The op records under the plugin's op_record_values (Olmo2RMSNorm's fp32 weight multiply, QK-norm over the
    whole projection, fp32 rotary tables) and elementwise_elements: every row agrees with the census, and the
    formulas' bytes are the hand derivation above (SDPA's 16 bytes of RNG state a layer included)."""
    from ndcost.cli import main

    assert main(["verify", str(census_config), "--seq", str(CENSUS_SEQ), "--json", "--strict"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert not any(r["flagged"] for r in rows)
    saved = {r["quantity"]: r for r in rows if r["kind"] == "dense"}
    assert saved["saved_tp_per_token"]["formula"] == CENSUS_SAVED_TP
    assert saved["saved_per_token"]["formula"] == pytest.approx(CENSUS_SAVED, abs=1e-9)
    assert saved["shared_saved_per_token.position_embeddings"]["formula"] == CENSUS_SHARED["position_embeddings"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL))
def test_counts_equal_transformers_on_the_meta_device(olmo2, name):
    config = olmo2_config(**SMALL[name])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FamilyFallbackWarning)  # found by model_type: no fallback
        spec = load_model(config)
    assert spec.family == "olmo2" and spec.model_type == "olmo2"
    count = parameters(spec)
    whole, layer0, total = meta_parts(config)
    assert count.total == total
    assert dict(count.by_part) == whole
    assert count.layer_counts == {"dense": config.num_hidden_layers}
    assert dict(count.by_kind["dense"]) == layer0
    assert count.head == (0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size)


@pytest.mark.slow
def test_the_shipped_spec_of_olmo_2_7b(olmo2, capsys):
    import yaml

    import ndcost_olmo2
    from ndcost.cli import main

    path = ndcost_olmo2.spec_path("olmo-2-1124-7b")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FamilyFallbackWarning)
        spec = load_model(path)
    count = parameters(spec)
    assert spec.name == "olmo-2-1124-7b" and count.total == OLMO2_7B_TOTAL
    assert count.kind_total("dense") == OLMO2_7B_LAYER

    fields = dict(yaml.safe_load(path.read_text())["config"])
    fields.pop("model_type")
    whole, layer0, total = meta_parts(olmo2_config(**fields))
    assert total == OLMO2_7B_TOTAL and dict(count.by_part) == whole and dict(count.by_kind["dense"]) == layer0

    assert main(["params", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == "olmo-2-1124-7b" and data["total"] == OLMO2_7B_TOTAL
    assert data["by_part"] == whole

    # the resolver prices it with nothing more from the plugin (formulas only here: no census)
    import ndcost
    cost = ndcost.resolve(path, census="off").evaluate(ndcost.Strategy(tp=2, pp=2, dp=2, seq=4096))
    assert cost.valid and cost.peak_bytes > 0
    assert DIST in cost.provenance["family"] and DIST in cost.provenance["parameters"]


# ---------------------------------------------------------------------------
# overriding a built-in family
# ---------------------------------------------------------------------------
OVERRIDE = """
    import attrs

    import ndcost
    from ndcost.models import Family
    from ndcost.plugins.families.llama import LLAMA


    class StackedLlama(Family):
        '''The built-in Llama family, measured over the whole stack by the census.'''

        name = "llama_stacked"
        model_types = ("llama",)
        stack_census = True

        def spec(self, config, name):
            return attrs.evolve(LLAMA.spec(config, name), family=self.name)

        def layer_parameters(self, spec, kind):
            return LLAMA.layer_parameters(spec, kind)


    FAMILY = StackedLlama()


    @ndcost.hookimpl
    def ndcost_register(register):
        register("family/llama", FAMILY, override={override})
"""


def fake_dist(root: Path, dist: str, module: str, source: str) -> Path:
    """A minimal installed distribution: a dist-info folder with one ``ndcost.plugins`` entry point, and its module."""
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[ndcost.plugins]\n{module} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


@pytest.fixture
def llama_override(tmp_path, monkeypatch, fresh):
    def install(override: bool) -> None:
        source = OVERRIDE.replace("{override}", str(override))
        monkeypatch.syspath_prepend(str(fake_dist(tmp_path / "site", "ndcost-llama-stacked", "ndcost_llama_stacked",
                                                  source)))
        manager.reset()

    yield install
    forget("ndcost_llama_stacked")
    manager.reset()


LLAMA_SMALL = dict(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                   num_attention_heads=8, num_key_value_heads=4, attention_bias=True)


@pytest.mark.slow
def test_an_override_family_wins_over_the_builtin_and_is_reported(llama_override, capsys):
    from transformers import LlamaConfig

    from ndcost.cli import main

    llama_override(True)
    loaded = manager.plugins()
    entry = loaded.registry.entry("family/llama")
    assert entry.override and entry.source.distribution == "ndcost-llama-stacked"
    assert entry.overrides is not None and entry.overrides.distribution == "ndcost"
    assert entry in loaded.registry.overrides()
    family = family_for("llama")
    assert family.name == "llama_stacked" and family.stack_census is True

    config = LlamaConfig(**LLAMA_SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FamilyFallbackWarning)
        spec = load_model(config)
    assert spec.family == "llama_stacked"
    whole, _, total = meta_parts(config)  # the override counts as Transformers builds
    assert parameters(spec).total == total and dict(parameters(spec).by_part) == whole

    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ours = [p for p in data if p["distribution"] == "ndcost-llama-stacked"]
    assert len(ours) == 1 and ours[0]["registered"] == ["family/llama"]
    builtin = [p for p in data if p["distribution"] == "ndcost" and p["name"] == "family_llama"]
    assert builtin and "family/llama" in builtin[0]["registered"]  # it registered too; the override won

    assert main(["plugins"]) == 0
    text = capsys.readouterr().out
    overrides = text.split("overrides:", 1)[1]
    line = next(x for x in overrides.splitlines() if "family/llama" in x)
    assert "ndcost_llama_stacked" in line and "replaces" in line and "distribution ndcost)" in line


def test_a_second_family_for_a_builtin_model_type_without_override_is_refused(llama_override):
    llama_override(False)
    with pytest.raises(RegistrationError) as err:
        manager.load()
    message = str(err.value)
    assert "family/llama" in message and "ndcost_llama_stacked" in message
    assert "ndcost.plugins.families.llama" in message and "override=True" in message


# ---------------------------------------------------------------------------
# two installed distributions registering the same family
# ---------------------------------------------------------------------------
DISTS = REPO / "tests" / "data" / "dists"


@pytest.fixture(scope="module")
def second_olmo2_sites(tmp_path_factory):
    """ndcost-olmo2 installed with pip beside each of tests/data/dists' second family/olmo2, one folder each."""
    sites = {}
    for variant in ("fork", "override"):
        work = tmp_path_factory.mktemp(f"olmo2-{variant}")
        site = pip_install(EXAMPLE, work)
        copy = work / variant
        shutil.copytree(DISTS / f"ndcost-olmo2-{variant}", copy, ignore=shutil.ignore_patterns("*.egg-info"))
        sites[variant] = pip_install_into(copy, site)
    return sites


@pytest.fixture
def beside_olmo2(second_olmo2_sites, monkeypatch, fresh):
    def install(variant: str) -> None:
        monkeypatch.syspath_prepend(str(second_olmo2_sites[variant]))
        manager.reset()

    yield install
    forget(MODULE, "ndcost_olmo2_fork", "ndcost_olmo2_override")
    manager.reset()


@pytest.mark.slow
def test_two_distributions_registering_family_olmo2_fail_with_one_message_naming_both(beside_olmo2, capsys):
    from ndcost.cli import main

    beside_olmo2("fork")
    with pytest.raises(RegistrationError) as err:
        manager.load()
    message = str(err.value)
    assert "'family/olmo2'" in message
    assert "(distribution ndcost-olmo2)" in message and "(distribution ndcost-olmo2-fork)" in message
    assert "override=True" in message
    # through the CLI: exit 1 and that message as one line on stderr, no traceback
    manager.reset()
    assert main(["params", "llama-3.1-8b"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err and "Traceback" not in captured.err


@pytest.mark.slow
def test_override_true_in_one_of_them_settles_it(beside_olmo2):
    beside_olmo2("override")
    loaded = manager.plugins()
    entry = loaded.registry.entry("family/olmo2")
    assert entry.override and entry.source.distribution == "ndcost-olmo2-override"
    assert entry.overrides is not None and entry.overrides.distribution == DIST
    config = olmo2_config(**SMALL["gqa-bias-tied"])
    assert load_model(config).family == "olmo2_override"
