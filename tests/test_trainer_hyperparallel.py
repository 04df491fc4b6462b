"""HyperParallel's train.yaml read into a strategy and a runtime profile (real files from mindspore-ai/hyper-parallel,
tests/data/configs/SOURCES.md).

Each expected strategy is a hand translation against HyperParallel's schema (hyper_parallel/trainer/config/) and its
meshes (hyper_parallel/trainer/runtime/distributed.py: dp = world / (tp * cp * pp), FSDP shards dp_shard_size ranks
of the dp * cp pool and replicates over the rest).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from _helpers import file_variant, ndcost

from ndcost.errors import InvalidValue
from ndcost.trainers import from_config, to_config
from ndcost.values import Strategy

CONFIGS = Path(__file__).parent / "data" / "configs" / "hyperparallel"
MOE = "qwen3_moe_train_parallel_offline.yaml"


def read(name, devices=8, **kw):
    return from_config("hyperparallel", CONFIGS / name, devices=devices, **kw)


def test_qwen3_moe_with_hyperparallels_fused_modules():
    config = read(MOE, devices=8)
    assert config.strategy == Strategy(
        # dp = 8 / (tp 2 * cp 2) = 2; the pool dp * cp = 4; dp_shard_size 2 shards over 2 of them, replicated
        # twice; a group of 2 = cp is no multiple of cp above it: shard_mesh=dp, fsdp=2, no dp replicas left
        fsdp=2, shard_mesh="dp", dp=1,
        tp=2, sp=True,            # tp_size 2, sequence_parallel true
        vocab_parallel=True,      # loss_parallel true
        cp=2, cp_algo="ring",     # no algorithm named: ring (stated in defaults)
        ep=2, etp=1,              # ep_size 2; the accelerator names no expert TP
        micro_batch=1,            # micro_batch_size 1
        num_micro_batches=4,      # global_batch_size 8 / (micro 1 * dp 2)
        seq=128,                  # dataset.data_config.seq_length
        recompute="none",         # activation_checkpoint.mode "off"
        param_dtype="bf16",       # model.torch_dtype bfloat16, mixed_precision off: everything in bf16
        optimizer="muon")         # optimizer._target_ ...Muon, by name (no ndcost optimizer/muon yet)
    # plan_overrides[0..2] replace_module: HyperParallel's RMSNorm, flash attention and grouped experts
    assert config.runtime == "hf-npu"
    assert any("fused RMSNorm, fused attention, grouped experts: runtime hf-npu" in d for d in config.defaults)
    # the cropped model: Qwen3-30B-A3B's config with num_hidden_layers 4
    assert config.model["model_type"] == "qwen3_moe" and config.model["num_hidden_layers"] == 4
    assert config.model["num_experts"] == 128
    assert "plan_overrides[4].local_compute_fn._target_" in config.ignored_fields  # the EP compute: no bearing
    assert "fsdp_config.edp_shard_size" in config.read_fields
    assert config.devices == 8 and config.global_batch == 8


def test_a_shard_group_of_several_cp_groups_is_fsdp_over_fsdp_times_cp():
    config = read("qwen3_moe_selective_shard8.yaml", devices=16)
    # dp = 16 / 4 = 4, pool 4 * 2 = 8, dp_shard_size 8: all of it, fsdp = 8 / cp 2 = 4, no replica
    assert (config.strategy.dp, config.strategy.fsdp, config.strategy.cp, config.strategy.shard_mesh) == \
        (1, 4, 2, "dp_cp")
    assert config.strategy.recompute == "selective"  # mode selective: the hf-npu profile's selective policy
    assert config.runtime == "hf-npu"
    assert config.strategy.num_micro_batches == 2  # 8 / (1 * 4)


def test_attention_replaced_and_ulysses_named():
    config = read("qwen3_8_train_high_performance.yaml", devices=8, model="qwen3-8b")
    assert config.strategy == Strategy(
        fsdp=4, cp=2,             # dp = 8 / cp 2 = 4, pool 8, dp_shard_size 8: fsdp = 8 / 2
        cp_algo="ulysses",        # dataloader.get_batch.cp_algorithm
        num_micro_batches=2,      # 8 / (1 * 4)
        seq=4096, recompute="full", param_dtype="bf16")
    assert config.runtime == "hf-npu"  # plan_overrides[0] replaces the attention with GatedGQAAttention
    assert any("also fuses the fused RMSNorm, gated MLP" in d for d in config.defaults)


@pytest.mark.parametrize("devices, message", [
    (None, "accelerator: the world size comes from the launcher; give --devices N"),
    (6, "tp 2 * cp 2 * pp 1 = 4 does not divide the 6 devices"),
])
def test_world_size_refusals(devices, message):
    with pytest.raises(InvalidValue) as info:
        read(MOE, devices=devices)
    assert message in str(info.value) and str(CONFIGS / MOE) in str(info.value)


def test_a_model_the_file_names_that_ndcost_lacks():
    with pytest.raises(InvalidValue, match=r"'Qwen/Qwen3.8-27B': no ndcost model 'qwen3.8-27b'.*give the model"):
        read("qwen3_8_train_high_performance.yaml")


def _variant(tmp_path, old, new, base=MOE):
    return file_variant(CONFIGS / base, old, new, tmp_path / "train.yaml")


@pytest.mark.parametrize("old, new, message", [
    ("  tp_size: 2", "  tp_size: two", "accelerator.tp_size: 'two' is not a whole number"),
    ("  dp_shard_size: 2", "  dp_shard_size: 3", "fsdp_config.dp_shard_size: 3 does not divide dp * cp"),
    ("  pp_size: 1", "  pp_size: 2", "accelerator.pp_size: 2: HyperParallel's pipeline schedule is not read yet"),
    ("mixed_precision:\n  enabled: false", "compile:\n  enabled: true\nmixed_precision:\n  enabled: false",
     "compile.enabled = true: not priced yet"),
    ("Qwen3MoeRMSNorm\n", "Qwen3MoeDecoderLayer\n", "replacing transformers.models.qwen3_moe.modeling_qwen3_moe."
                                                   "Qwen3MoeDecoderLayer is not priced"),
    ('mode: "off"', "mode: sometimes", "activation_checkpoint.mode: 'sometimes' is not a mode"),
    ("  sequence_parallel: true", "  sequence_parallel: yes please", "accelerator.sequence_parallel: 'yes please' "
                                                                     "is not a boolean"),
])
def test_bad_fields_are_refused_by_name(tmp_path, old, new, message):
    path = _variant(tmp_path, old, new)
    with pytest.raises(InvalidValue) as info:
        from_config("hyperparallel", path, devices=8)
    assert message in str(info.value) and str(path) in str(info.value)


def test_a_file_that_is_not_a_train_yaml(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[parallelism]\ntensor_parallel_degree = 8\n")
    with pytest.raises(InvalidValue, match="hyperparallel config .*job.toml: file: .*HyperParallel train.yaml"):
        from_config("hyperparallel", path, devices=8)
    path.write_text("zero_optimization:\n  stage: 3\n")
    with pytest.raises(InvalidValue, match="no model and accelerator sections"):
        from_config("hyperparallel", path, devices=8)


def test_it_reads_but_does_not_write():
    with pytest.raises(InvalidValue, match="reads configurations but does not write them"):
        to_config("hyperparallel", "fsdp=8,seq=4096", model="qwen3-8b")


@pytest.mark.slow
def test_cli_estimate_takes_the_runtime_from_the_file():
    result = ndcost("--json", "estimate", "qwen3-8b", "--from",
                    f"hyperparallel:{CONFIGS / 'qwen3_8_train_high_performance.yaml'}", "--devices", "8",
                    "--hardware", "h200", "--census", "off")
    import json
    data = json.loads(result.stdout)
    assert data["runtime"] == "hf-npu" and data["trainer"]["runtime"] == "hf-npu"
    assert data["strategy"] == "fsdp=4,cp=2,cp_algo=ulysses,num_micro_batches=2,seq=4096,recompute=full"
    result = ndcost("estimate", "--from", f"hyperparallel:{CONFIGS / MOE}", check=False)
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0 and "--devices" in result.stderr
