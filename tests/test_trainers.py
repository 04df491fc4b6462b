"""The trainer-configuration door (ndcost.trainers, `estimate --from`): what is refused before any reader runs."""
from __future__ import annotations

import pytest
from _helpers import ndcost

from ndcost.errors import InvalidValue
from ndcost.trainers import parse_source


@pytest.mark.parametrize("text", ["torchtitan", ":job.toml", "torchtitan:", ""])
def test_a_source_is_kind_colon_path(text):
    with pytest.raises(InvalidValue, match="expected KIND:PATH"):
        parse_source(text)


def test_a_source_keeps_colons_in_its_path():
    assert parse_source("Megatron:C:/runs/args.txt") == ("megatron", "C:/runs/args.txt")


def test_an_unknown_kind_is_refused_naming_the_namespace(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[model]\n")
    result = ndcost("estimate", "--from", f"nosuchtrainer:{path}", check=False)
    assert result.returncode == 1
    assert "unknown trainer kind 'nosuchtrainer'" in result.stderr and "trainer/<kind>" in result.stderr
    assert "Traceback" not in result.stderr


def test_estimate_needs_a_strategy_or_a_configuration():
    result = ndcost("estimate", "llama-3.1-8b", check=False)
    assert result.returncode == 2 and "give --strategy" in result.stderr and not result.stdout
    result = ndcost("estimate", "llama-3.1-8b", "--strategy", "seq=4096", "--devices", "8", check=False)
    assert result.returncode == 2 and "--devices goes with --from" in result.stderr
    result = ndcost("estimate", check=False)
    assert result.returncode == 2 and "give a MODEL and --strategy, or --from KIND:PATH" in result.stderr
