"""The trainer-configuration door (ndcost.trainers): `estimate --from`'s refusals before any reader runs, and
`search --emit` in each writing trainer's precision."""
from __future__ import annotations

import json

import pytest
from _helpers import ndcost

from ndcost.errors import InvalidValue
from ndcost.trainers import parse_source, to_config
from ndcost.values import Strategy


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


@pytest.mark.slow
@pytest.mark.parametrize("kind, held, read_back", [
    # Megatron-LM's --bf16 and DeepSpeed's bf16.enabled keep fp32 master copies and optimizer states (and Megatron-LM
    # computes its own loss)
    ("megatron", "grad_dtype=fp32,optimizer_dtype=fp32,master_dtype=fp32,loss_engine=megatron,ddp_engine=megatron",
     ["--devices", "8"]),
    ("deepspeed", "optimizer_dtype=fp32,master_dtype=fp32,ddp_engine=deepspeed", ["llama-3.1-8b", "--devices", "8",
                                                              "--strategy", "seq=4096"]),
])
def test_search_emits_the_fastest_strategy_the_trainer_runs_in_its_precision(tmp_path, kind, held, read_back):
    """search --emit holds the trainer's recipe and looks past strategies it has no form for (fsdp for both)."""
    path = tmp_path / "emitted"
    args = ("search", "llama-3.1-8b", "--devices", "8", "--global-batch", "32", "--seq", "4096", "--census", "off")
    result = ndcost(*args, "--emit", f"{kind}:{path}")
    chosen = Strategy.parse(next(line for line in result.stderr.splitlines() if line.startswith(f"--emit {kind}: #"))
                            .split(" ", 3)[-1])
    for item in held.split(","):  # the recipe, held
        field, value = item.split("=")
        assert str(getattr(chosen, field)) == value
    assert chosen.fsdp == 1 and (chosen.zero > 0 or chosen.dp == 1)  # neither trainer writes FSDP
    zero_defaults = ""
    if kind == "deepspeed":  # zero_optimization's defaults, held where the chosen stage runs them
        assert chosen.reduce_bucket_elements == (500_000_000 if chosen.zero >= 1 else 0)
        assert chosen.reuse_distance_elements == chosen.live_parameters_elements == (
            1_000_000_000 if chosen.zero == 3 else 0)
        zero_defaults = (",reduce_bucket_elements=500000000,reuse_distance_elements=1000000000,"
                         "live_parameters_elements=1000000000")
    # the chosen strategy is the fastest of those holding the recipe that the trainer can write
    table = json.loads(ndcost(*args, "--hold", held if kind == "megatron" else held + ",grad_dtype=bf16" + zero_defaults,
                              "--top", "200", "--json").stdout)
    writable = [row["strategy"] for row in table if to_config_ok(kind, row["strategy"])]
    assert Strategy.parse(writable[0]) == chosen
    back = ndcost("estimate", *read_back[:1] if kind == "deepspeed" else (), "--from", f"{kind}:{path}",
                  *read_back[1:] if kind == "deepspeed" else read_back, "--census", "off", "--json")
    assert Strategy.parse(json.loads(back.stdout)["strategy"]) == chosen


def to_config_ok(kind, text):
    try:
        to_config(kind, text, model="llama-3.1-8b", global_batch=32)
    except InvalidValue:
        return False
    return True


@pytest.mark.slow
def test_deepspeeds_zero_defaults_are_held_where_each_stage_runs_them():
    # the reduce bucket at ZeRO 1-3, the reuse distance and the live bound at ZeRO-3: held for the other stages
    # too they would refuse them (the strategy's own rule), so the search holds each where it runs
    held = ("ddp_engine=deepspeed,reduce_bucket_elements=500000000,reuse_distance_elements=1000000000,"
            "live_parameters_elements=1000000000")
    table = json.loads(ndcost("search", "qwen3-8b", "--devices", "8", "--global-batch", "8", "--seq", "4096",
                              "--census", "off", "--hold", held, "--top", "400", "--json").stdout)
    rows = [Strategy.parse(row["strategy"]) for row in table]
    assert {s.zero for s in rows} == {0, 1, 2, 3}  # none pruned for holding them
    for s in rows:
        assert s.reduce_bucket_elements == (500_000_000 if s.zero >= 1 and s.pp == 1 else 0)
        assert s.reuse_distance_elements == s.live_parameters_elements == (
            1_000_000_000 if s.zero == 3 and s.pp == 1 else 0)
