"""census='auto' on a model type Transformers does not know: the formulas price it, with one warning."""
from __future__ import annotations

import json
import warnings

import pytest

import ndcost
from ndcost.errors import CensusUnavailable
from ndcost.models import FamilyFallbackWarning
from ndcost.resolver import CensusFallbackWarning

# No Transformers release has this model type, so the census cannot build its layers.
UNKNOWN = {"model_type": "zorblax_lm", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 2, "intermediate_size": 512, "vocab_size": 1000, "rms_norm_eps": 1e-6,
           "attention_bias": False, "mlp_bias": False, "hidden_act": "silu"}


def resolved(census):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FamilyFallbackWarning)
        return ndcost.resolve(UNKNOWN, census=census)


@pytest.mark.slow  # imports Transformers to learn it lacks the model type
def test_auto_falls_back_to_the_formulas_with_one_warning():
    pytest.importorskip("transformers")
    model = resolved("auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cost = model.evaluate("tp=1,seq=128")
        again = model.evaluate("tp=2,seq=256")
    fallbacks = [w for w in caught if issubclass(w.category, CensusFallbackWarning)]
    assert len(fallbacks) == 1
    message = str(fallbacks[0].message)
    assert "zorblax_lm" in message and "no config for model_type" in message and "formulas" in message
    assert cost.valid and again.valid and cost.peak_bytes > 0
    source = cost.provenance["records"][128]["activations"]["dense"]
    assert source.startswith("formulas") and "census unavailable" in source
    # the formulas alone price the same figures
    assert cost.peak_bytes == resolved("off").evaluate("tp=1,seq=128").peak_bytes


@pytest.mark.slow
def test_on_still_refuses_naming_the_model_type():
    pytest.importorskip("transformers")
    # the batch refuses the rows at that sequence length with the census's reason; one row raises it
    with pytest.raises(ndcost.InvalidStrategy, match=r"census='on' but census unavailable.*'zorblax_lm'"):
        resolved("on").evaluate("tp=1,seq=128")
    with pytest.raises(CensusUnavailable, match="census='on'"):
        resolved("on").record_tables(128)


@pytest.mark.slow
def test_the_cli_estimate_says_it_once_and_prices(tmp_path, capsys):
    pytest.importorskip("transformers")
    from ndcost.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(UNKNOWN))
    assert main(["estimate", str(path), "--strategy", "tp=1,seq=128", "--hardware", "h200", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("census='auto'") == 1
    assert json.loads(captured.out)
