"""benchmarks/validate_megatron_bridge.py: each published row read as Megatron-LM reads its command line.

The expected strategies are the table's columns by hand: DP = GPUs / (TP x PP x CP), micro-batches a step
GBS / (MBS x DP), the virtual stages, and a pipeline the layers do not divide split as Megatron-LM's
``get_num_layers_to_build`` splits it with the embedding and the loss counted as a layer each, or as the
recipe's layout; and the recipe's flags (Megatron-Bridge's performance scripts) as the reader reads them.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from ndcost.models import load_model
from ndcost.values import Strategy

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports validate_torchtitan beside it
_spec = importlib.util.spec_from_file_location("validate_megatron_bridge",
                                               ROOT / "benchmarks" / "validate_megatron_bridge.py")
vm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vm)
ROWS = {row["id"]: row for row in vm.load_yaml(vm.read_text(vm.DATA, "rows"), vm.DATA)["rows"]}


def test_every_row_names_a_shipped_model_and_hardware():
    for row in ROWS.values():
        load_model(row["model"])
        assert row["system"] in vm.HARDWARE, row["id"]
        assert row["gbs"] % (row["mbs"] * row["gpus"] // (row["tp"] * row["pp"] * row["cp"])) == 0, row["id"]


def test_the_gpt_oss_row_is_the_table_s_layout():
    # 64 GPUs, PP 4, EP 8: DP 16; 512 sequences of 4 a micro-batch over 16 ranks: 8 micro-batches a step; its
    # 25.11 recipe lists recompute modules without a granularity, which recomputes nothing
    predicted = vm.price(ROWS["h100-gpt-oss-120b"])
    strategy = Strategy.parse(predicted["strategy"])
    assert (strategy.dp, strategy.pp, strategy.ep, strategy.micro_batch, strategy.num_micro_batches,
            strategy.seq, strategy.recompute) == (16, 4, 8, 4, 8, 4096, "none")
    # the distributed optimizer's fp32 main copy; bf16 main gradients, as every performance recipe sets
    # (gpt_oss_llm_pretrain.py set_gpt_oss_common_configs: grad_reduce_in_fp32 = False)
    assert (strategy.zero, strategy.master_dtype, strategy.grad_dtype) == (1, "fp32", "bf16")


def test_an_uneven_pipeline_counts_the_embedding_and_the_loss():
    # Llama-3.1-405B's 126 layers over PP 8 x VP 8 = 64 chunks: with the embedding and the loss, 128 = 2 a chunk,
    # so the first chunk (the embedding's) and the last (the loss's) hold 1; FP8-CS is float8 with its experts
    strategy = Strategy.parse(vm.price(ROWS["h100-llama31-405b-fp8"])["strategy"])
    assert strategy.pp_layers == (1,) + (2,) * 62 + (1,)
    assert (strategy.tp, strategy.cp, strategy.dp, strategy.num_micro_batches) == (8, 2, 8, 64)
    assert strategy.float8 == "tensorwise" and strategy.float8_experts


def test_a_recipe_s_layout_and_dispatcher_are_read():
    # DeepSeek-V3's 61 layers over 4 x 4 chunks as the recipe lays them out, Et*3|(t*4|)*14ttL: the embedding and
    # 3 layers, 14 chunks of 4, then 2 and the loss; HybridEP is DeepEP's dispatch
    strategy = Strategy.parse(vm.price(ROWS["gb200-deepseek-v3"])["strategy"])
    assert strategy.pp_layers == (3,) + (4,) * 14 + (2,) and (strategy.pp, strategy.vpp) == (4, 4)
    assert strategy.ep_dispatcher == "deepep" and strategy.ep == 64


def test_the_qwen3_recipes_overlap_their_all_to_alls():
    # Megatron-Bridge's Qwen3 H100 FP8 recipes set moe_a2a_overlap (overlap_moe_expert_parallel_comm and
    # delay_wgrad_compute) and clear the recompute
    for row in ("h100-qwen3-30b-a3b-fp8", "h100-qwen3-235b-a22b-fp8"):
        strategy = Strategy.parse(vm.price(ROWS[row])["strategy"])
        assert (strategy.schedule, strategy.recompute, strategy.ep_dispatcher) == (
            "interleaved-a2a-overlap", "none", "alltoall"), row


def test_a_row_the_reader_cannot_read_is_reported_with_its_reason():
    row = dict(ROWS["gb200-deepseek-v3"], recipe={"flags": "", "unpriced": [], "source": ""})
    predicted = vm.price(row)  # 61 layers with the embedding and the loss (63) do not split over 4 x 4 chunks
    assert not predicted["priced"] and "--account-for-embedding-in-pipeline-split" in predicted["reason"]


def test_a_megatron_fsdp_row_shards_over_every_data_parallel_rank():
    strategy = Strategy.parse(vm.price(ROWS["h100-llama3-8b-fp8"])["strategy"])  # FSDP 8 on 8 GPUs
    assert (strategy.dp, strategy.fsdp, strategy.zero, strategy.num_micro_batches) == (1, 8, 0, 16)


@pytest.mark.slow
def test_the_table_prints_every_row():
    text = vm.table(vm.evaluate())
    assert all(f"| {row_id} |" in text for row_id in ROWS) and "Spearman rank correlation" in text
    assert all(row["recipe"]["source"] for row in ROWS.values())
