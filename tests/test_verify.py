"""`ndcost verify`: the formulas beside the census, the parameters beside Transformers' model on the meta device."""
from __future__ import annotations

import json
import math
import warnings

import pytest

import ndcost
from ndcost.cli import main
from ndcost.errors import InvalidValue
from ndcost.models import FamilyFallbackWarning, known_models

# Llama-3.1-8B's config (specs/models/llama-3.1-8b.yaml) at small widths: every tensor kind is still there.
LLAMA_SMALL = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8,
               "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5,
               "rope_theta": 500000.0, "max_position_embeddings": 4096, "hidden_act": "silu",
               "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}
SEQ = 128


@pytest.fixture
def llama_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_SMALL))
    return path


def rows_of(result, prefix):
    return {(r.kind, r.quantity): r for r in result.rows if r.quantity.startswith(prefix)}


# ---------------------------------------------------------------------------
# the census side runs
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_llama_parameters_match_transformers_exactly(llama_config):
    pytest.importorskip("transformers")
    from _hf_parts import build
    from transformers import LlamaConfig

    result = ndcost.verify(llama_config, seq=SEQ)
    params = rows_of(result, "parameters.")
    assert params and not any(r.flagged for r in params.values())
    # by hand: h = 256, f = 688, 8 heads of 32, 2 KV heads; q and o h x h, k and v h x 64
    h, f, kv = 256, 688, 2 * 32
    assert params[("dense", "parameters.attention")].census == 2 * h * h + 2 * h * kv
    assert params[("dense", "parameters.ffn")].census == 3 * h * f
    assert params[("dense", "parameters.norm")].census == 2 * h
    fields = {k: v for k, v in LLAMA_SMALL.items() if k != "model_type"}
    meta = sum(p.numel() for p in build(LlamaConfig(**fields)).parameters())
    total = params[("model", "parameters.total")]
    assert total.formula == total.census == meta and total.relative_difference == 0
    # the census measured every kind and the output layer: no row lacks its census figure for want of it
    assert all(r.census is not None for r in result.rows if r.quantity.startswith(("saved", "flops.")))
    assert rows_of(result, "flops.forward")[("dense", "flops.forward")].flagged is False


@pytest.mark.slow
def test_a_wrong_formula_is_flagged_with_both_figures_and_strict_exits_1(llama_config, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from ndcost.models import family_for

    family = family_for("llama")
    right = family.layer_parameters

    def wrong(spec, kind):  # a plugin that forgets nothing but counts a bias of the hidden width too many
        parts = dict(right(spec, kind))
        parts["attention"] += spec.hidden_size
        return parts

    monkeypatch.setattr(family, "layer_parameters", wrong)
    result = ndcost.verify(llama_config, seq=SEQ)
    row = rows_of(result, "parameters.")[("dense", "parameters.attention")]
    assert row.flagged and row.formula - row.census == 256
    assert math.isclose(row.relative_difference, 256 / row.census)
    total = rows_of(result, "parameters.")[("model", "parameters.total")]
    assert total.flagged and total.formula - total.census == 2 * 256  # two layers

    assert main(["verify", str(llama_config), "--seq", str(SEQ), "--strict"]) == 1
    captured = capsys.readouterr()
    assert "parameters.attention" in captured.out and "FLAG" in captured.out
    failure = [line for line in captured.err.splitlines() if line.startswith("ndcost verify:")]
    assert len(failure) == 1 and "--strict" in failure[0] and "flagged" in failure[0]
    assert max(len(line) for line in captured.out.splitlines()) <= 100


@pytest.mark.slow
def test_json_is_one_document_and_the_threshold_decides_the_flags(llama_config, capsys):
    pytest.importorskip("transformers")
    assert main(["verify", str(llama_config), "--seq", str(SEQ), "--json", "--threshold", "0.5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["seq"] == SEQ and data["threshold"] == 0.5 and data["parameter_threshold"] == 0
    rows = data["rows"]
    assert {"kind", "quantity", "unit", "formula", "census", "relative_difference", "flagged", "note"} <= set(rows[0])
    for row in rows:
        rel = row["relative_difference"]
        if row["formula"] is None or row["census"] is None:
            assert not row["flagged"] and row["note"]
        elif rel is not None and not row["quantity"].startswith("parameters."):
            assert row["flagged"] == (abs(rel) > 0.5)
    assert data["flagged"] == sum(r["flagged"] for r in rows)
    # without --strict a flagged row does not fail the command
    assert main(["verify", str(llama_config), "--seq", str(SEQ)]) == 0


@pytest.mark.slow
def test_where_the_census_cannot_run_each_row_says_so():
    pytest.importorskip("transformers")
    config = dict(LLAMA_SMALL, model_type="zorblax_lm")  # no Transformers release has it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FamilyFallbackWarning)
        result = ndcost.verify(config, seq=SEQ)
    missing = [r for r in result.rows if r.census is None]
    assert missing and all(not r.flagged and r.note for r in missing)
    assert any("no config for model_type 'zorblax_lm'" in r.note for r in missing if r.kind == "dense")
    assert all("no modeling code for model_type 'zorblax_lm'" in r.note for r in missing
               if r.quantity.startswith("parameters."))
    # the formulas' side is still there
    assert all(r.formula is not None for r in result.rows if r.quantity in ("saved_per_token", "flops.forward"))


@pytest.mark.slow
def test_the_selective_rows_put_the_formulas_beside_the_census_under_the_runtimes_policy(llama_config):
    """hf-cuda's selective is torchtitan's op-level policy, which both sides price. By hand (h 256, 8 heads and 2
    KV heads of 32, feed-forward 688): the layer keeps its input and down's output (2 * 256 each) and SDPA's
    philox state (16 bytes a layer), and, split by TP, q (2 * 256), v (2 * 64), SDPA's output and fp32
    log-sum-exp (2 * 256 + 4 * 8) and gate (2 * 688); k and o are recomputed, half the attention's matmul
    FLOPs (64 + 256 of 640 columns), and up, a third of the feed-forward's."""
    pytest.importorskip("transformers")
    result = ndcost.verify(llama_config, seq=SEQ)
    rows = rows_of(result, "")
    selective, selective_tp = rows[("dense", "selective_per_token")], rows[("dense", "selective_tp_per_token")]
    assert selective.formula == pytest.approx(selective.census) == pytest.approx(4 * 256 + 16 / SEQ)
    assert selective_tp.formula == selective_tp.census == 512 + 128 + 544 + 2 * 688
    attention, other = rows[("dense", "recomputed_attention_mm_share")], rows[("dense", "recomputed_other_mm_share")]
    assert attention.formula == attention.census == 0.5
    assert other.formula == pytest.approx(other.census) == pytest.approx(1 / 3)
    assert not any(r.flagged for r in (selective, selective_tp, attention, other))


# ---------------------------------------------------------------------------
# the flags by hand, and bad input (no census)
# ---------------------------------------------------------------------------
def test_the_flag_rules_by_hand():
    from ndcost.verification import _row

    # parameters are exact: one parameter off is flagged
    assert _row("dense", "parameters.ffn", "parameters", 1001, 1000, 0).flagged
    assert not _row("dense", "parameters.ffn", "parameters", 1000, 1000, 0).flagged
    # bytes: 1.9% passes at 2%, 2.1% does not, in either direction
    assert not _row("dense", "saved_per_token", "bytes/token", 101.9, 100.0, 0.02).flagged
    assert _row("dense", "saved_per_token", "bytes/token", 97.9, 100.0, 0.02).flagged
    assert math.isclose(_row("d", "q", "u", 97.9, 100.0, 0.02).relative_difference, -0.021)
    # a census of 0: flagged where the formula is not 0, with no relative figure
    zero = _row("dense", "ops_tp.attMM", "bytes/token", 512.0, 0.0, 0.02)
    assert zero.flagged and zero.relative_difference is None and "0" in zero.note
    # a missing side is said, never flagged
    missing = _row("dense", "working_per_token", "bytes/token", None, 4672.0, 0.02, "the formulas state no figure")
    assert not missing.flagged and missing.relative_difference is None


@pytest.mark.parametrize("argv,message", [
    (["--seq", "0"], "--seq must be a positive number of tokens, got 0"),
    (["--threshold", "2"], "--threshold must be a fraction in [0, 1)"),
    (["--runtime", "hf-cudda"], "hf-cudda"),
])
def test_bad_input_is_one_line_exit_1(argv, message, capsys):
    assert main(["verify", "llama-3.1-8b", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ndcost verify:") and message in err[0]


def test_the_library_refuses_bad_arguments():
    with pytest.raises(InvalidValue, match="seq must be a positive number of tokens, got -1"):
        ndcost.verify("llama-3.1-8b", seq=-1)
    with pytest.raises(InvalidValue, match="threshold must be a fraction"):
        ndcost.verify("llama-3.1-8b", threshold=-0.1)


@pytest.mark.slow
@pytest.mark.parametrize("name", known_models())
def test_no_shipped_model_s_parameters_are_flagged(name):
    """Transformers' modules, split by verify's structural reading, against each shipped family's count.

    tests/test_params.py holds the same counts against a split by parameter names; this holds the
    reading verify (and the generic family) uses to the same figures.
    """
    pytest.importorskip("transformers")
    from ndcost import manager
    from ndcost.models import load_model, parameters
    from ndcost.verification import _parameter_rows

    spec = load_model(name)
    rows = _parameter_rows(spec, parameters(spec), manager.registry())
    assert [r for r in rows if r.flagged] == []
    assert all(r.census is not None for r in rows if r.kind == "model")


def test_help_prints_the_default_threshold(capsys):
    """argparse %-formats help strings: the threshold's percent sign must be escaped (it raised ValueError)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["verify", "--help"])
    assert exit_info.value.code == 0
    assert "(default 0.02, i.e. 2%)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow
def test_eager_attention_keeps_what_transformers_eager_attention_saves(llama_config):
    """hf-cuda-eager runs Transformers' eager_attention_forward: ``repeat_kv`` copies the keys and values to all 8
    heads, the softmax runs in fp32 and keeps its output (4 bytes a score), and the second matmul keeps its bf16
    cast (2 bytes a score). The formulas' layer equals the census's (the TP split aside: at TP 2 one KV head a
    rank is repeated as a view), its softmax 8 heads x 128 scores x 4 bytes a token."""
    pytest.importorskip("transformers")
    rows = rows_of(ndcost.verify(llama_config, seq=SEQ, runtime="hf-cuda-eager"), "")

    def layer(side):
        return sum(getattr(rows[("dense", name)], side) for name in ("saved_per_token", "saved_tp_per_token"))
    assert layer("formula") == pytest.approx(layer("census"), rel=1e-12)
    softmax = rows[("dense", "ops_tp.softmax")]
    assert softmax.formula == softmax.census == 8 * SEQ * 4
    # q, and k and v copied to every head, 2 bytes, with the cast probabilities, 2 bytes a score
    assert rows[("dense", "ops_tp.attBMM")].formula == 3 * 256 * 2 + 8 * SEQ * 2


@pytest.mark.slow
def test_a_partial_rotary_keeps_what_the_census_measures(tmp_path):
    """GLM-4.5's rotary turns half of each head (Glm4MoeConfig's partial_rotary_factor 0.5, here left to the
    class default) and concatenates the other half back: the layer is handed cos and sin of 64 channels, not 128
    (2 tables x 64 x 2 bytes a token), and the query reaches SDPA contiguous [b, h, s, d], so cuDNN's output is
    laid out so and the output projection keeps a copy of its own (8 heads x 128 x 2 bytes a token, over TP).
    The formulas' rows equal the census's for the dense layer."""
    pytest.importorskip("transformers")
    config = {"model_type": "glm4_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 2,
              "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
              "vocab_size": 1000, "max_position_embeddings": 4096, "use_qk_norm": False, "attention_bias": False,
              "num_nextn_predict_layers": 0, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    rows = rows_of(ndcost.verify(path, seq=SEQ), "")
    assert rows[("dense", "shared_saved_per_token.position_embeddings")].formula == 2 * 64 * 2
    assert rows[("dense", "ops_tp.attMM")].formula == 8 * 128 * 2
    for name in ("saved_per_token", "saved_tp_per_token", "shared_saved_per_token.position_embeddings",
                 "ops_tp.attMM", "ops_tp.attBMM"):
        row = rows[("dense", name)]
        assert row.formula == pytest.approx(row.census, rel=1e-9), (name, row.formula, row.census)


@pytest.mark.slow
def test_a_moe_kind_s_saved_rows_leave_the_routed_experts_apart(tmp_path):
    """The census files the routed experts' width part under TP (its TP 2 rank halves every width), the formulas
    state it unsplit; the composition takes those bytes from the op records for both and the rest of each record
    as it is, so verify compares the rest: for a small Qwen3-MoE layer the two agree, where the raw split did
    not (a MoE kind's raw saved rows are not shown)."""
    pytest.importorskip("transformers")
    config = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 1,
              "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
              "tie_word_embeddings": False, "decoder_sparse_step": 1, "mlp_only_layers": []}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = ndcost.verify(path, seq=SEQ)
    kinds = {r.kind for r in result.rows if r.quantity == "saved_less_routed_per_token"}
    assert kinds and not any(r.quantity in ("saved_per_token", "saved_tp_per_token") for r in result.rows
                             if r.kind in kinds)
    for kind in kinds:
        rows = rows_of(result, "saved_less_routed")
        for name in ("saved_less_routed_per_token", "saved_less_routed_tp_per_token"):
            row = rows[(kind, name)]
            assert not row.flagged and "routed experts' bytes apart" in row.note, row
