"""Published parameter totals, the formula slots by hand, and `ndcost params`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ndcost.cli import main
from ndcost.errors import InvalidValue
from ndcost.models import formula, known_models, load_model, parameters

# Published totals (model cards / safetensors metadata), as literal constants.
PUBLISHED = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-2-7b": 6_738_415_616,
    "mistral-7b-v0.1": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-8b": 8_190_735_360,
    "qwen3-30b-a3b": 30_532_122_624,
    "mixtral-8x7b": 46_702_792_704,
    "gpt-oss-20b": 20_914_757_184,
    "qwen3-next-80b-a3b": 79_674_391_296,
    "deepseek-v3": 671_026_404_352,
}


@pytest.mark.parametrize("name,total", sorted(PUBLISHED.items()))
def test_published_totals(name, total):
    count = parameters(load_model(name))
    assert count.total == total
    assert sum(count.by_part.values()) == total


def test_deepseek_v3_published_total_adds_score_correction_biases():
    count = parameters(load_model("deepseek-v3"))
    assert count.buffers == 58 * 256
    assert count.published_total == 671_026_419_200
    assert count.layer_counts == {"dense": 3, "moe": 58, "mtp": 1}
    assert count.mtp == count.kind_total("mtp") > 0


SIBLINGS = ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-14b", "qwen3-32b", "deepseek-v2-lite", "deepseek-v2",
            "llama-3.1-70b", "llama-3.1-405b", "qwen3-235b-a22b", "mixtral-8x22b", "gpt-oss-120b", "deepseek-v3.2",
            "qwen3.5-9b", "qwen3.5-35b-a3b", "glm-4.5", "glm-4.5-air", "deepseek-v4-flash"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SIBLINGS + sorted(PUBLISHED))
def test_shipped_specs_equal_transformers_on_meta(name):
    pytest.importorskip("transformers")
    from _hf_parts import hf_buffers, hf_parts
    from ndcost.models import transformers_config

    spec = load_model(name)
    reference, total, model = hf_parts(transformers_config(spec))
    count = parameters(spec)
    assert count.total == total
    assert dict(count.by_part) == reference
    assert count.buffers == hf_buffers(model)


def test_every_shipped_spec_is_tested():
    assert set(known_models()) == set(SIBLINGS) | set(PUBLISHED)


# --- the formula slots by hand ----------------------------------------------------------------
def test_gqa_mha_mqa_by_hand():
    h, a, d = 64, 4, 16
    gqa = formula("attention.params.gqa")
    # Q and O h x a*d, K and V h x kv*d each
    assert gqa(hidden=h, heads=a, kv_heads=2, head_dim=d) == 2 * h * a * d + 2 * h * 2 * d
    assert formula("attention.params.mha")(hidden=h, heads=a, head_dim=d) == 4 * h * h
    assert formula("attention.params.mqa")(hidden=h, heads=a, head_dim=d) == 2 * h * h + 2 * h * d
    # stated biases: q, k, v widths on the qkv side, h on the output
    assert (gqa(hidden=h, heads=a, kv_heads=2, head_dim=d, qkv_bias=True, o_bias=True)
            - gqa(hidden=h, heads=a, kv_heads=2, head_dim=d)) == a * d + 2 * 2 * d + h
    # unstated (HyperParallel's convention, plugins/formulas/common.py cites it): a bias of the hidden width on each
    # of the four projections
    assert (gqa(hidden=h, heads=a, kv_heads=2, head_dim=d, qkv_bias=None, o_bias=None)
            - gqa(hidden=h, heads=a, kv_heads=2, head_dim=d)) == 4 * h


def test_output_gate_qk_norm_sinks_by_hand():
    assert formula("attention.params.output_gate")(hidden=64, heads=4, head_dim=16) == 64 * 64
    assert formula("norm.params.qk")(head_dim=128) == 256
    assert formula("attention.params.sinks")(heads=64) == 64
    assert formula("gpt_oss.params.attention")(hidden=64, heads=4, kv_heads=2, head_dim=16) == \
        (64 * 64 + 64) * 2 + (64 * 32 + 32) * 2 + 4


def test_mla_by_hand():
    mla = formula("attention.params.mla")
    h, a, rq, rkv, nope, rope, v = 7168, 128, 1536, 512, 128, 64, 128
    with_latent = (h * rq + rq + rq * a * (nope + rope)          # q_a, its norm, q_b
                   + h * (rkv + rope) + rkv + rkv * a * (nope + v)  # kv_a, its norm, kv_b
                   + a * v * h)                                   # o
    assert with_latent == 187_107_328
    assert mla(hidden=h, heads=a, q_lora_rank=rq, kv_lora_rank=rkv, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
               v_head_dim=v) == with_latent
    without = h * a * (nope + rope) + h * (rkv + rope) + rkv + rkv * a * (nope + v) + a * v * h
    assert mla(hidden=h, heads=a, q_lora_rank=None, kv_lora_rank=rkv, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
               v_head_dim=v) == without


def test_moe_slots_and_etp_slicing_by_hand():
    routed = formula("moe.params.routed")
    assert routed(hidden=64, experts=8, intermediate=32) == 8 * 3 * 32 * 64
    assert routed(hidden=64, experts=8, intermediate=32, etp=4) == 8 * 3 * 8 * 64
    # stated biases: gate and up of the (sliced) width, down of the hidden width
    assert routed(hidden=64, experts=2, intermediate=32, bias=True, etp=2) == 2 * (3 * 16 * 64 + 2 * 16 + 64)
    with pytest.raises(InvalidValue, match="32 is not divisible by the split 3"):
        routed(hidden=64, experts=8, intermediate=32, etp=3)
    assert formula("moe.params.router")(hidden=64, experts=8) == 512
    assert formula("moe.params.router")(hidden=64, experts=8, bias=True) == 520
    assert formula("moe.params.shared")(hidden=64, intermediate=48, gate=True) == 3 * 48 * 64 + 64
    assert formula("ffn.params.dense")(hidden=64, intermediate=256, matrices=2, bias=True) == 2 * 256 * 64 + 256 + 64
    assert formula("ffn.params.dense")(hidden=64, intermediate=96, bias=None) == 3 * 96 * 64 + 3 * 96


def test_gated_delta_net_by_hand():
    # Qwen3-Next-80B's linear attention: 16 key heads and 32 value heads of 128, kernel 4, hidden 2048
    k, v, h = 16 * 128, 32 * 128, 2048
    expected = h * (2 * k + 2 * v) + h * 64 + (2 * k + v) * 4 + 2 * 32 + 128 + v * h
    assert formula("linear_attention.params.gated_delta_net")(
        hidden=h, key_heads=16, value_heads=32, key_head_dim=128, value_head_dim=128, conv_kernel=4) == expected


def test_deepseek_v4_slots_by_hand():
    assert formula("deepseek_v4.params.hyper_connection")(hidden=64, hc_mult=2) == 8 * 128 + 8 + 3
    assert formula("deepseek_v4.params.hyper_head")(hidden=64, hc_mult=2) == 2 * 128 + 2 + 1
    assert formula("deepseek_v4.params.compressor")(hidden=64, head_dim=32, rate=128, overlap=False) == \
        2 * 64 * 32 + 128 * 32 + 32
    assert formula("deepseek_v4.params.compressor")(hidden=64, head_dim=32, rate=4, overlap=True) == \
        2 * 64 * 64 + 4 * 64 + 32
    with pytest.raises(InvalidValue, match="o_groups"):
        formula("deepseek_v4.params.attention")(hidden=64, heads=3, head_dim=5, q_lora_rank=8, o_groups=2,
                                                o_lora_rank=4)


def test_a_third_party_override_of_a_slot_is_used(monkeypatch):
    """A plugin registering a slot with override=True replaces the built-in one in the counts."""
    import types

    from ndcost import hookimpl, manager

    plugin = types.ModuleType("override_plugin")

    @hookimpl
    def ndcost_register(register):
        register("formula/norm.params.qk", lambda *, head_dim, bias=False: 0, override=True)

    plugin.ndcost_register = ndcost_register
    loaded = manager.load(extra_modules={"override_plugin": plugin})
    monkeypatch.setattr(manager, "_current", loaded)
    with_override = parameters(load_model("qwen3-8b"))
    assert with_override.by_part["norm"] == 36 * 2 * 4096 + 4096
    monkeypatch.undo()
    assert parameters(load_model("qwen3-8b")).by_part["norm"] == 36 * (2 * 4096 + 2 * 128) + 4096


def test_counting_does_not_import_torch():
    code = ("import sys; from ndcost.models import load_model, parameters; "
            "[parameters(load_model(n)) for n in ('deepseek-v3', 'qwen3-next-80b-a3b', 'deepseek-v4-flash')]; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the command -------------------------------------------------------------------------------
def test_params_json(capsys):
    assert main(["params", "deepseek-v3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"total", "by_part", "by_kind", "mtp", "buffers", "published_total"} <= set(data)
    assert data["total"] == 671_026_404_352 == sum(data["by_part"].values())
    assert data["published_total"] == 671_026_419_200
    assert data["buffers"] == 14_848
    assert data["mtp"] > 0 and "mtp" in data["by_kind"]
    # a model whose card quotes what Transformers builds: no published_total of its own, no MTP, no buffers
    assert main(["params", "llama-3.1-8b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total"] == 8_030_261_248 == sum(data["by_part"].values())
    assert (data["published_total"], data["mtp"], data["buffers"]) == (None, 0, 0)


def test_params_text(capsys):
    assert main(["params", "llama-3.1-8b"]) == 0
    out = capsys.readouterr().out
    assert "8,030,261,248" in out and "attention" in out and "dense" in out


def test_params_unknown_model_lists_closest(capsys):
    assert main(["params", "llama-3.1-7b"]) == 1
    err = capsys.readouterr().err
    assert "llama-3.1-8b" in err and "unknown model" in err


@pytest.mark.slow
def test_params_accepts_yaml_config_json_and_folder(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from ndcost.models import model_path

    config = transformers.AutoConfig.for_model(
        "qwen3_moe", num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, num_experts=8, moe_intermediate_size=32, num_experts_per_tok=2)
    config.save_pretrained(tmp_path)
    # by hand: attention 2*64*64 + 2*64*32, QK-norm 2*16, norms 2*64; experts 8*3*32*64, router 8*64
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 2 * 16 + 2 * 64 + 8 * 3 * 32 * 64 + 8 * 64
    expected = 2 * layer + 2 * 100 * 64 + 64
    for model in (str(tmp_path), str(tmp_path / "config.json")):
        assert main(["params", model, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["total"] == expected
    assert main(["params", str(model_path("mixtral-8x7b")), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 46_702_792_704


def test_params_bad_config_is_one_line_exit_1(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 5}))
    assert main(["params", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "num_attention_heads 5 does not divide hidden_size 64" in err
