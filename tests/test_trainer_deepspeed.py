"""``deepspeed:`` configurations: real DeepSpeed config JSONs read field by field, refusals by name, the writer's
round trip, and the reader beside DeepSpeed's own DeepSpeedConfig (the batch sizes, the ZeRO defaults).

The real files are from deepspeedai/DeepSpeed edaa722 and deepspeedai/DeepSpeedExamples 45b4b71
(tests/data/configs/SOURCES.md); the hand-made ones are written in the tests.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from _helpers import ndcost

import ndcost as nd
from ndcost.errors import InvalidValue
from ndcost.trainers import from_config, to_config, trainer_format
from ndcost.values import Strategy

DATA = Path(__file__).parent / "data" / "configs" / "deepspeed"
FP16 = {"param_dtype": "fp16", "grad_dtype": "fp16", "master_dtype": "fp32", "optimizer_dtype": "fp32"}


def read(name, devices, model="llama-3.1-8b", **kw):
    return from_config("deepspeed", DATA / name, devices=devices, model=model, **kw)


def test_zero0_gradient_accumulation_config_field_by_field():
    config = read("ds_config_func_bs8_zero0_gas3.json", 4)
    assert config.strategy == Strategy(ddp_engine="deepspeed",
        dp=4,                 # 4 devices, no AutoTP, no sequence parallelism: all data-parallel
        zero=0,               # zero_optimization.stage 0
        micro_batch=8,        # train_micro_batch_size_per_gpu 8
        num_micro_batches=3,  # gradient_accumulation_steps 3
        **FP16)               # fp16.enabled: fp16 parameters and gradients, fp32 master and Adam states
    assert config.global_batch == 96  # train_batch_size inferred: 8 * 3 * 4
    assert "train_batch_size = 8 * 3 * 4 = 96" in config.defaults
    assert "zero_optimization.reduce_bucket_size" in config.ignored_fields
    assert "fp16.loss_scale_window" in config.ignored_fields and "gradient_clipping" in config.ignored_fields
    # partition_activations splits checkpoints over model-parallel ranks: nothing at tp = 1, said so.
    assert any("partition_activations" in d and "nothing at tp = 1" in d for d in config.defaults)


def test_zero2_cpu_offload_config_field_by_field():
    config = read("ds_config_func_bs8_zero2_offload.json", 4)
    assert config.strategy == Strategy(ddp_engine="deepspeed",
        dp=4, zero=2,
        micro_batch=2,           # train_batch_size 8 // 4 ranks // gradient_accumulation_steps 1
        num_micro_batches=1,
        offload_optimizer=True,  # zero_optimization.cpu_offload, the deprecated offload_optimizer.device cpu
        reduce_bucket_elements=7_000_000,  # reduce_bucket_size; contiguous (offloaded), overlap_comm off: one
        **FP16)
    assert "zero_optimization.cpu_offload" in config.read_fields
    assert "zero_optimization.reduce_bucket_size" in config.read_fields


def test_zero3_parameter_offload_config_field_by_field(tmp_path):
    # ds_offload_cpu.json offloads the parameters alone; with the optimizer offloaded too (what ndcost prices)
    data = json.loads((DATA / "ds_offload_cpu.json").read_text())
    data["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    path = tmp_path / "ds_offload_cpu_and_optimizer.json"
    path.write_text(json.dumps(data))
    config = from_config("deepspeed", str(path), devices=1, model="llama-3.1-8b")
    assert config.strategy == Strategy(ddp_engine="deepspeed",
        zero=3,                   # stage 3
        offload_params=True,      # offload_param.device cpu
        offload_optimizer=True,   # offload_optimizer.device cpu
        micro_batch=1, num_micro_batches=1,  # train_batch_size 1 on one rank
        reduce_bucket_elements=500_000_000,  # ZeRO-3's one bucket at DeepSpeed's default reduce_bucket_size
        reuse_distance_elements=1_000_000_000,  # stage3_max_reuse_distance's default
        live_parameters_elements=1_000_000_000,  # "auto" prefetch and live bound: DeepSpeed's defaults
        sub_group_elements=1_000_000_000,  # sub_group_size's default
        param_dtype="fp32")       # neither fp16 nor bf16: fp32 throughout
    assert "zero_optimization.offload_param.buffer_size" in config.ignored_fields  # "auto", with no bearing


@pytest.mark.parametrize("name, field, words", [
    ("zf_config.json", "zero_optimization.zenflow", "ZenFlow's stale, selective optimizer updates are not priced"),
    ("ds_offload_nvme_aio.json", "zero_optimization.offload_param.device", "nvme offload is not priced"),
    ("ds_config_z3.json", "train_micro_batch_size_per_gpu", '"auto" is filled in by the Hugging Face Trainer'),
    ("bf16_full.json", "torch_autocast", "not read yet"),
    ("ds_offload_cpu.json", "zero_optimization.offload_param", "parameter offload with the optimizer on the device"),
])
def test_real_configs_it_cannot_price_are_refused_by_name(name, field, words):
    with pytest.raises(InvalidValue) as info:
        read(name, 8)
    assert str(info.value).startswith(f"deepspeed config {DATA / name}: {field}: ") and words in str(info.value)


def write(tmp_path, doc, name="ds.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_ulysses_autotp_bf16_master_and_cpu_checkpointing(tmp_path):
    # Hand-made from bf16_full.json (DeepSpeedExamples) without torch_autocast, with AutoTP, Ulysses and
    # activation checkpoints in host memory.
    path = write(tmp_path, {
        "train_batch_size": 64, "gradient_accumulation_steps": 2,
        "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
        "zero_optimization": {"stage": 3}, "tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 4,
        "activation_checkpointing": {"cpu_checkpointing": True}})
    config = from_config("deepspeed", path, devices=32, model="llama-3.1-8b", strategy="seq=8192")
    assert config.strategy == Strategy(ddp_engine="deepspeed",
        tp=2, cp=4, cp_algo="ulysses",  # autotp_size 2; sequence_parallel_size 4 is DeepSpeed-Ulysses
        dp=4,                           # 32 / (2 * 4): DeepSpeed's batch world is the devices over both
        zero=3, micro_batch=8,          # 64 // 4 ranks // 2 steps
        reduce_bucket_elements=500_000_000,  # ZeRO-3's bucket, DeepSpeed's default size
        reuse_distance_elements=1_000_000_000,  # and its default reuse distance
        live_parameters_elements=1_000_000_000,  # and live bound (it prefetches by default)
        sub_group_elements=1_000_000_000,  # and sub-group
        num_micro_batches=2,
        param_dtype="bf16", grad_dtype="bf16", master_dtype="bf16", optimizer_dtype="bf16",
        offload_activations=True,       # cpu_checkpointing: the checkpoints in host memory
        seq=8192)                       # from --strategy: the file states no length
    assert config.overrides == ("seq=8192 (file: unset)",)


@pytest.mark.parametrize("zero, precision, expected", [
    # stage 2 with overlap_comm: two buffers of reduce_bucket_size (stage_1_and_2.py setup_buckets)
    ({"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e8}, {"fp16": {"enabled": True}},
     dict(reduce_bucket_elements=200_000_000, reduce_buckets=2)),
    # every default: contiguous_gradients, 5e8 elements, overlap_comm off below stage 3
    ({"stage": 1}, {"bf16": {"enabled": True}}, dict(reduce_bucket_elements=500_000_000)),
    # stage 3's overlap_comm is on by default: still one bucket (stage3.py)
    ({"stage": 3, "reduce_bucket_size": 1000}, {"bf16": {"enabled": True}}, dict(reduce_bucket_elements=1000)),
    ({"stage": 2, "contiguous_gradients": False}, {"bf16": {"enabled": True}}, {}),
    # the optimizer offloaded forces the contiguous bucket at stages 1-2
    ({"stage": 2, "contiguous_gradients": False, "offload_optimizer": {"device": "cpu"}}, {"bf16": {"enabled": True}},
     dict(reduce_bucket_elements=500_000_000, offload_optimizer=True)),
    # ZeRO-1 with bf16 parameters and fp32 gradients runs BF16_Optimizer (engine.py): no bucket
    ({"stage": 1}, {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}, dict(grad_dtype="fp32")),
])
def test_the_zero_bucket_is_read_as_deepspeed_makes_it(tmp_path, zero, precision, expected):
    path = write(tmp_path, {"train_batch_size": 8, "zero_optimization": zero, **precision})
    strategy = from_config("deepspeed", path, devices=8, model="llama-3.1-8b").strategy
    assert strategy.reduce_bucket_elements == expected.get("reduce_bucket_elements", 0)
    assert strategy.reduce_buckets == expected.get("reduce_buckets", 1)
    for name, value in expected.items():
        assert getattr(strategy, name) == value


@pytest.mark.parametrize("doc, field, words", [
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1},
     "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps", "10 != 2 * 1 * 4"),
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2},
     "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps", "10 != 2 * 1 * 4"),
    ({"gradient_accumulation_steps": 2}, "train_batch_size", "neither it nor train_micro_batch_size_per_gpu"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": "two"}}, "zero_optimization.stage",
     'expected a whole number, got "two"'),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 4}}, "zero_optimization.stage", "expected 0 to 3"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
     "zero_optimization.offload_param", "needs ZeRO stage 3"),
    ({"train_batch_size": 8, "bf16": {"enabled": True}, "fp16": {"enabled": True}}, "bf16.enabled",
     "given with fp16.enabled"),
    ({"train_batch_size": 8, "bf16": {"enabled": "yes"}}, "bf16.enabled", 'expected bool, got "yes"'),
    ({"train_batch_size": 8, "optimizer": {"type": "OneBitLamb"}}, "optimizer.type", "'OneBitLamb' is not priced"),
    ({"train_batch_size": 8, "compile": {"deepcompile": True}}, "compile", "torch.compile (DeepCompile) is not "
                                                                          "priced yet"),
    ({"train_batch_size": 8, "sequence_parallel_size": 3}, "tensor_parallel.autotp_size * sequence_parallel_size",
     "1 * 3 does not divide the world size 4"),
    ("[1, 2]", "file", "expected a JSON object"),
    ("train_batch_size = 8", "file", "not JSON"),
])
def test_bad_fields_are_refused_naming_them(tmp_path, doc, field, words):
    path = write(tmp_path, doc)
    with pytest.raises(InvalidValue) as info:
        from_config("deepspeed", path, devices=4, model="llama-3.1-8b")
    assert str(info.value).startswith(f"deepspeed config {path}: {field}: ") and words in str(info.value)


def test_a_model_and_the_devices_are_required(tmp_path):
    path = write(tmp_path, {"train_batch_size": 8})
    with pytest.raises(InvalidValue, match="names no model; give one"):
        from_config("deepspeed", path, devices=8)
    with pytest.raises(InvalidValue, match="--devices: .*give the world size: --devices N"):
        from_config("deepspeed", path, model="llama-3.1-8b")


def test_through_the_cli(tmp_path):
    source = f"deepspeed:{DATA / 'ds_config_func_bs8_zero0_gas3.json'}"
    result = ndcost("estimate", "--from", source, "--devices", "4", check=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "names no model" in result.stderr
    result = ndcost("--json", "estimate", "llama-3.1-8b", "--from", source, "--devices", "4", "--strategy",
                    "seq=2048", "--census", "off", "--hardware", "h200", check=False)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["trainer"]["overrides"] == ["seq=2048 (file: unset)"] and data["trainer"]["global_batch"] == 96


def test_zero0_fp16_prices_the_zero_paper_bytes():
    # ZeRO (arXiv:1910.02054, section 3.1): fp16 parameters and gradients (2 + 2 bytes), fp32 master copy,
    # momentum and variance (4 + 8): unsharded at stage 0.
    config = read("ds_config_func_bs8_zero0_gas3.json", 4, strategy="seq=2048")
    cost = nd.resolve(config.model, census="off").evaluate(config.strategy)
    assert cost.valid, cost.reason
    stage = cost.stages[0].bytes_by_category
    assert stage["parameters"] == stage["gradients"]
    assert stage["master"] == 2 * stage["parameters"] and stage["optimizer_states"] == 4 * stage["parameters"]


# --- the writer ------------------------------------------------------------------------------------------
ROUND_TRIP = [
    dict(dp=8, zero=3, micro_batch=2, num_micro_batches=4, offload_optimizer=True, offload_params=True,
         param_dtype="bf16", grad_dtype="bf16", master_dtype="fp32", optimizer_dtype="fp32"),
    dict(dp=4, zero=2, **FP16),
    dict(dp=2, tp=2, cp=2, cp_algo="ulysses", zero=1, param_dtype="bf16", grad_dtype="fp32",
         master_dtype="fp32", optimizer_dtype="fp32", offload_activations=True),
    dict(dp=2, zero=3, param_dtype="bf16", grad_dtype="bf16", master_dtype="bf16", optimizer_dtype="bf16"),
    dict(dp=16, param_dtype="fp32", micro_batch=4),
    # ZeRO's contiguous bucket: two at ZeRO 1-2 under overlap_comm, one at ZeRO-3, forced by the optimizer offload
    dict(dp=4, zero=2, reduce_bucket_elements=200_000_000, reduce_buckets=2, **FP16),
    dict(dp=4, zero=1, reduce_bucket_elements=500_000_000, **FP16),
    dict(dp=4, zero=2, offload_optimizer=True, reduce_bucket_elements=500_000_000, **FP16),
    dict(dp=8, zero=3, reduce_bucket_elements=10_000, param_dtype="bf16", grad_dtype="bf16", master_dtype="fp32",
         optimizer_dtype="fp32", reuse_distance_elements=1_000_000_000, live_parameters_elements=300_000_000),
]


@pytest.mark.parametrize("fields", ROUND_TRIP)
def test_written_configs_read_back_to_the_same_strategy(tmp_path, fields):
    strategy = Strategy.from_mapping({**fields, "seq": 4096, "ddp_engine": "deepspeed"})
    path = write(tmp_path, to_config("deepspeed", strategy))
    back = from_config("deepspeed", path, devices=strategy.devices, model="llama-3.1-8b", strategy="seq=4096")
    assert back.strategy == strategy  # seq has no DeepSpeed field: given beside the file, as a reader must
    assert trainer_format("deepspeed").read(str(path), devices=strategy.devices).global_batch == \
        strategy.micro_batch * strategy.num_micro_batches * strategy.dp


@pytest.mark.parametrize("fields, named", [
    (dict(pp=2), "pp=2"), (dict(fsdp=4), "fsdp=4"), (dict(dp=2, ep=2), "ep=2"),
    (dict(recompute="full"), "recompute=full"), (dict(cp=2), "cp_algo=ring"),
    (dict(tp=2, vocab_parallel=True), "vocab_parallel=true"), (dict(offload_params=True), "offload_params=true"),
    (dict(), "param_dtype=bf16"), (dict(compile=True), "compile=True"),
    (dict(float8="tensorwise"), "float8=tensorwise"), (dict(pp_engine="torch"), "pp_engine=torch"),
    (dict(cp=2, cp_algo="ulysses", cp_rotate="p2p"), "cp_rotate=p2p"),
    (dict(ep_dispatcher="deepep"), "ep_dispatcher=deepep"),
    (dict(reduce_bucket_elements=1000, **FP16), "reduce_bucket_elements=1000"),  # zero 0: no ZeRO optimizer
    (dict(zero=1, reduce_bucket_elements=1000, param_dtype="bf16", grad_dtype="fp32", master_dtype="fp32",
          optimizer_dtype="fp32"), "reduce_bucket_elements=1000"),  # BF16_Optimizer's ZeRO-1: none
    (dict(zero=3, reduce_bucket_elements=1000, reduce_buckets=2, **FP16), "reduce_buckets=2"),
    (dict(zero=2, offload_optimizer=True, **FP16), "reduce_bucket_elements=0"),  # offload forces it
    (dict(zero=2, reuse_distance_elements=1000, **FP16), "reuse_distance_elements=1000"),  # ZeRO-3's
    (dict(zero=1, live_parameters_elements=1000, **FP16), "live_parameters_elements=1000"),
])
def test_the_writer_refuses_what_deepspeed_cannot_say(fields, named):
    with pytest.raises(InvalidValue, match=f"deepspeed writer: {named}"):
        to_config("deepspeed", Strategy.from_mapping(fields))


# --- hostile configs ------------------------------------------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ndcost.errors import NdcostError  # noqa: E402

VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 1 << 40), st.floats(allow_nan=True),
                   st.sampled_from(["auto", "cpu", "nvme", "none", "fp32", "bf16", "AdamW", "x"]),
                   st.lists(st.integers(0, 3), max_size=2))
SECTION = st.dictionaries(st.sampled_from(["enabled", "stage", "device", "ratio", "autotp_size", "type",
                                           "cpu_offload", "offload_optimizer", "offload_param", "grad_accum_dtype",
                                           "partition_activations", "cpu_checkpointing", "bf16_optimizer_states",
                                           "bf16_master_weights_and_grads"]),
                          st.one_of(VALUES, st.dictionaries(st.sampled_from(["device", "ratio"]), VALUES)),
                          max_size=4)
DOCS = st.dictionaries(st.sampled_from(["train_batch_size", "train_micro_batch_size_per_gpu",
                                        "gradient_accumulation_steps", "zero_optimization", "bf16", "fp16",
                                        "optimizer", "tensor_parallel", "sequence_parallel_size",
                                        "activation_checkpointing", "data_types", "wandb", "odd"]),
                       st.one_of(VALUES, SECTION), max_size=7)


@pytest.mark.slow
@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(DOCS)
def test_any_config_is_read_or_refused_with_an_ndcost_error(doc):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ds.json"
        path.write_text(json.dumps(doc))
        try:
            config = trainer_format("deepspeed").read(str(path), devices=8)
        except NdcostError:
            return
        assert config.strategy.devices == 8


def test_a_batch_below_the_data_parallel_ranks_is_refused_saying_so(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"train_batch_size": 1, "bf16": {"enabled": True}}))
    with pytest.raises(InvalidValue, match=r"train_batch_size: 1 is below the 8 data-parallel ranks .* each takes "
                                           r"at least one sequence a step; give a train_batch_size of at least 8"):
        from_config("deepspeed", str(path), devices=8, model="llama-3.1-8b")


def test_fields_beside_a_file_keep_the_devices_it_was_read_for():
    # ds_config_func_bs8_zero0_gas3.json on 4 ranks: dp=4; tp=2 beside it would span 8 devices
    with pytest.raises(InvalidValue, match=r"the strategy given beside it \(tp=2\) makes it span 8 devices .*not the "
                                           r"--devices 4 it was read for; give --devices 8"):
        read("ds_config_func_bs8_zero0_gas3.json", 4, strategy="tp=2")
    assert read("ds_config_func_bs8_zero0_gas3.json", 4, strategy="seq=2048").strategy.devices == 4


# --- beside DeepSpeed's own reading ---------------------------------------------------------------------------
# Each config read by the reader and by DeepSpeed's DeepSpeedConfig (tests/_deepspeed_probe.py, in its own
# process): the batch sizes it infers and checks, and the ZeRO fields whose defaults the reader restates.
BESIDE_DEEPSPEED = [
    ("ds_config_func_bs8_zero2_offload.json", 4), ("ds_config_func_bs8_zero0_gas3.json", 4),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2}, 4),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4),
    ({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2}, 4),
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}, 4),
    ({"train_batch_size": 16, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}, 8),
    ({"train_batch_size": 16, "fp16": {"enabled": True},
      "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e8}}, 8),
    ({"train_batch_size": 16, "fp16": {"enabled": True}, "zero_optimization": {"stage": 2,
                                                                                "contiguous_gradients": False}}, 8),
    ({"train_batch_size": 16, "bf16": {"enabled": True}, "zero_optimization": {
        "stage": 2, "contiguous_gradients": False, "offload_optimizer": {"device": "cpu"}}}, 8),
    ({"train_batch_size": 16, "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
      "zero_optimization": {"stage": 1}}, 8),
    ({"train_batch_size": 16, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 5e8, "reduce_bucket_size": 1e7,
                            "sub_group_size": 2e8}}, 8),
    ({"train_batch_size": 16, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}, 8),
    ({"train_batch_size": 16, "bf16": {"enabled": True}, "zero_optimization": {
        "stage": 3, "stage3_prefetch_bucket_size": 0, "stage3_max_live_parameters": 3e8}}, 8),
    ({"train_batch_size": 16, "bf16": {"enabled": True}, "zero_optimization": {
        "stage": 3, "stage3_max_live_parameters": 3e8}}, 8),
    ({"train_batch_size": 16, "bf16": {"enabled": True}, "zero_optimization": {
        "stage": 3, "stage3_prefetch_bucket_size": "auto", "stage3_max_live_parameters": "auto"}}, 8),
]


@pytest.fixture(scope="module")
def deepspeed_reads(tmp_path_factory):
    pytest.importorskip("deepspeed")
    import os
    import socket
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("deepspeed")
    jobs = []
    for i, (doc, world) in enumerate(BESIDE_DEEPSPEED):
        path = DATA / doc if isinstance(doc, str) else write(folder, doc, f"ds{i}.json")
        jobs += [str(path), str(world)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("_deepspeed_probe.py")), str(port), "config",
                          *jobs], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    read = json.loads(run.stdout.strip().splitlines()[-1])
    return [(jobs[2 * i], int(jobs[2 * i + 1]), seen) for i, seen in enumerate(read)]


@pytest.mark.parametrize("case", range(len(BESIDE_DEEPSPEED)))
def test_the_reader_reads_a_config_as_deepspeed_does(deepspeed_reads, case):
    path, world, seen = deepspeed_reads[case]
    if "error" in seen:  # DeepSpeed refuses it: so does the reader
        with pytest.raises(InvalidValue):
            from_config("deepspeed", path, devices=world, model="llama-3.1-8b")
        return
    config = from_config("deepspeed", path, devices=world, model="llama-3.1-8b")
    s = config.strategy
    assert (s.micro_batch, s.num_micro_batches, config.global_batch) == (
        seen["micro_batch"], seen["accumulation"], seen["train_batch_size"])
    assert s.zero == seen["stage"]
    assert s.param_dtype == ("bf16" if seen["bf16"] else "fp16" if seen["fp16"] else "fp32")
    # the ZeRO optimizer's bucket from DeepSpeed's own defaults: contiguous (forced by the optimizer's offload at
    # ZeRO 1-2, stage_1_and_2.py), none at ZeRO 0 or under ZeRO-1's BF16_Optimizer (bf16 with fp32 gradients)
    bf16_optimizer = seen["stage"] == 1 and s.param_dtype == "bf16" and s.grad == "fp32" and not s.offload_optimizer
    contiguous = seen["contiguous_gradients"] or (s.offload_optimizer and seen["stage"] < 3)
    bucket = seen["reduce_bucket_size"] if seen["stage"] and contiguous and not bf16_optimizer else 0
    assert s.reduce_bucket_elements == bucket
    assert s.reduce_buckets == (2 if bucket and seen["overlap_comm"] and seen["stage"] < 3 else 1)
    assert s.reuse_distance_elements == (seen["max_reuse_distance"] if seen["stage"] == 3 else 0)
    prefetches = seen["stage"] == 3 and seen["prefetch_bucket_size"] > 0
    assert s.live_parameters_elements == (seen["max_live_parameters"] if prefetches else 0)
    assert s.sub_group_elements == (seen["sub_group_size"] if seen["stage"] == 3 else 0)
