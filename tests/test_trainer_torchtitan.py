"""torchtitan's job TOML read into a strategy (real files from pytorch/torchtitan, tests/data/configs/SOURCES.md),
written back from one, and refused by name where ndcost cannot price it.

Every expected strategy is a hand translation of the file, each value with its reason, against torchtitan's own
schema and meshes (torchtitan/config/job_config.py, torchtitan/distributed/parallel_dims.py at 238fa99).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from _helpers import file_variant, ndcost

from ndcost.errors import InvalidValue
from ndcost.trainers import from_config, to_config
from ndcost.values import Strategy

CONFIGS = Path(__file__).parent / "data" / "configs" / "torchtitan"

# torchtitan's defaults the real files rely on: training.dtype "float32" and mixed_precision_param "bfloat16"
# (FSDP2 MixedPrecisionPolicy: fp32 parameters, gradients and optimizer states, bf16 compute, fp32 reduction)
MIXED = {"param_dtype": "fp32", "compute_dtype": "bf16"}


def read(name, devices=None, **kw):
    return from_config("torchtitan", CONFIGS / name, devices=devices, **kw)


def test_llama3_8b_on_64_devices():
    config = read("llama3_8b.toml", devices=64)
    assert config.model == "llama-3.1-8b"  # [model] llama3 8B
    assert config.strategy == Strategy(
        fsdp=64,               # data_parallel_shard_degree -1: 64 / (replicate 1 * cp 1 * tp 1 * pp 1)
        micro_batch=1,         # local_batch_size 1, no PP: one micro-batch of the local batch
        num_micro_batches=1,   # global_batch_size default -1: local * dp degree, no accumulation
        seq=8192,              # seq_len
        recompute="selective",  # mode "selective", selective_ac_option "op": torchtitan's op-level policy
        **MIXED)
    assert config.devices == 64 and config.global_batch == 64
    assert "[parallelism] data_parallel_shard_degree" in config.read_fields
    assert "[optimizer] lr" in config.ignored_fields and "[job] dump_folder" in config.ignored_fields
    # float8 is not on: [quantize.linear.float8] holds settings, the converters line is commented out
    assert "[quantize] linear.float8.filter_fqns" in config.ignored_fields


def test_llama3_70b_tp8_turns_on_loss_parallel():
    config = read("llama3_70b.toml", devices=64)
    assert config.model == "llama-3.1-70b"
    assert config.strategy == Strategy(
        fsdp=8,                # -1: 64 / tp 8
        tp=8,
        sp=True,               # torchtitan's TP plan always runs sequence parallel on the norms
        vocab_parallel=True,   # disable_loss_parallel absent (false): loss parallel whenever tp > 1
        micro_batch=8,         # local_batch_size 8
        seq=8192, recompute="full", **MIXED)
    assert any("loss parallel on with tp > 1" in d for d in config.defaults)
    assert config.global_batch == 64  # 8 local * 8 data-parallel ranks


def test_deepseek_v3_older_schema_reads():
    config = read("deepseek_v3_671b_aeb3a4b.toml", devices=64)
    assert config.model == "deepseek-v3"  # deepseek_v3 671B
    assert config.strategy == Strategy(
        fsdp=8, tp=8, sp=True, vocab_parallel=True,  # -1: 64 / tp 8; TP's sequence and loss parallel
        ep=1, etp=1,                                 # expert_parallel_degree 1, expert_tensor_parallel_degree 1
        micro_batch=4, seq=4096, recompute="full", **MIXED)
    # the older names: [training] compile = false is read (and off); [float8] holds settings only
    assert "[training] compile" in config.read_fields
    assert "[float8] moe_fqns" in config.ignored_fields
    # pp 1: the schedule has no bearing
    assert "[parallelism] pipeline_parallel_schedule" in config.ignored_fields


def test_hsdp_with_gradient_accumulation():
    config = read("llama3_8b_hsdp.toml")
    assert config.strategy == Strategy(
        dp=2, fsdp=4,            # replicate 2 x shard 4 (HSDP); the world is their product, 8
        micro_batch=2,           # local_batch_size 2
        num_micro_batches=2,     # global 32 / (local 2 * replicate 2 * shard 4) = 2 accumulation steps
        seq=8192, recompute="selective", **MIXED)
    assert config.devices == 8 and config.global_batch == 32


def test_fsdp_1_cp_8_still_shards_over_the_cp_ranks():
    """The issue's case: torchtitan's FSDP runs over dp_shard * cp whenever cp > 1."""
    config = read("llama3_8b_cp8.toml")
    assert config.strategy == Strategy(
        cp=8, shard_mesh="fsdp_cp",  # FSDP over the 8 cp ranks (dp_shard_cp), data_parallel_shard_degree 1
        seq=131072,
        recompute="full", recompute_layers=8,  # selective_ac_option "4": 32 layers // 4 checkpointed whole
        **MIXED)
    assert config.devices == 8


def test_cp_beside_a_resolved_shard_degree_and_torchtitans_default_checkpointing():
    config = read("llama3_8b_cp2.toml", devices=16)
    assert config.strategy == Strategy(
        fsdp=4,                  # -1: 16 / (cp 2 * tp 2); FSDP over shard 4 * cp 2
        cp=2, cp_algo="ring",    # context_parallel_rotate_method default "allgather": K/V gathered, as ring
        tp=2, sp=True,
        vocab_parallel=False,    # disable_loss_parallel = true
        recompute="full", recompute_layers=16,  # no [activation_checkpoint]: default selective, option "2"
        seq=8192, **MIXED)
    assert any('default mode = "selective", selective_ac_option = "2"' in d for d in config.defaults)


def test_pipeline_split_is_torchtitans():
    config = read("llama3_70b_pp.toml", devices=64)
    # 80 layers + 1 (embedding) + 1 (head) = 82 over 4 ranks * 2 stages (Interleaved1F1B's default) = 8 stages:
    # 10 each, the first 2 stages one more; the first gives one to the embedding, the last one to the head
    assert config.strategy == Strategy(
        fsdp=2, tp=8, sp=True, vocab_parallel=True,  # -1: 64 / (tp 8 * pp 4)
        pp=4, vpp=2, schedule="interleaved", pp_layers=(10, 11, 10, 10, 10, 10, 10, 9),
        micro_batch=1,            # pipeline_parallel_microbatch_size 1
        num_micro_batches=8,      # local_batch_size 8 / 1
        reshard_after_forward=False,  # fsdp_reshard_after_forward "default" with PP: not resharded
        gradient_sync="last_micro_batch",  # torch.distributed.pipelining: FSDP's reduce-scatter once a step
        pp_engine="torch",        # and its receive buffers, one a micro-batch
        seq=8192, recompute="full", **MIXED)
    assert any("gradient_sync=last_micro_batch" in d for d in config.defaults)


def test_fsdp_without_pp_reduces_every_micro_batch():
    # torchtitan's accumulation loop without PP leaves FSDP's gradient sync on: the default, auto
    assert read("llama3_8b_hsdp.toml").strategy.gradient_sync == "auto"


def test_a_model_given_beside_the_file_replaces_the_flavor():
    assert read("qwen3_32b.toml", devices=8).model == "qwen3-32b"
    config = read("qwen3_32b.toml", devices=8, model="qwen3-8b")
    assert config.model == "qwen3-8b" and config.strategy.fsdp == 8 and config.strategy.micro_batch == 2


def test_a_flavor_ndcost_has_no_spec_for_is_refused_naming_the_known_ones(tmp_path):
    path = file_variant(CONFIGS / "qwen3_32b.toml", 'flavor = "32B"', 'flavor = "debugmodel"', tmp_path / "job.toml")
    with pytest.raises(InvalidValue) as info:
        from_config("torchtitan", path, devices=8)
    message = str(info.value)
    assert "[model] flavor: no ndcost model for qwen3 'debugmodel'" in message and str(path) in message
    assert "qwen3 0.6B" in message and "qwen3 32B" in message and "give the model" in message


@pytest.mark.parametrize("name, devices, message", [
    ("llama3_8b.toml", None, "-1 takes the devices left over, and no world size was given; give --devices N"),
    ("llama3_8b_hsdp.toml", 16, "replicate 2 * shard 4 * cp 1 * tp 1 * pp 1 = 8, not the 16 devices given"),
    ("llama3_70b.toml", 12, "-1 with 12 devices: replicate * cp * tp * pp = 8 does not divide them"),
])
def test_real_files_refused_by_name(name, devices, message):
    with pytest.raises(InvalidValue) as info:
        read(name, devices=devices)
    assert message in str(info.value) and str(CONFIGS / name) in str(info.value)


def _variant(tmp_path, old, new, base="llama3_8b.toml"):
    return file_variant(CONFIGS / base, old, new, tmp_path / "job.toml")


@pytest.mark.parametrize("method, rotate", [("allgather", "allgather"), ("alltoall", "p2p")])
def test_the_rotate_method_is_cp_rotate(tmp_path, method, rotate):
    # torch's set_rotate_method: "allgather" is _AllGatherRotater, "alltoall" _AllToAllRotater (_attention.py)
    path = _variant(tmp_path, "context_parallel_degree = 1",
                    f'context_parallel_degree = 2\ncontext_parallel_rotate_method = "{method}"')
    strategy = from_config("torchtitan", path, devices=8).strategy
    assert (strategy.cp, strategy.cp_algo, strategy.cp_rotate) == (2, "ring", rotate)


@pytest.mark.parametrize("old, new, message", [
    ("tensor_parallel_degree = 1", 'tensor_parallel_degree = "8"', "[parallelism] tensor_parallel_degree: '8' is "
                                                                    "not a whole number"),
    ("context_parallel_degree = 1", "context_parallel_degree = 2\ncontext_parallel_rotate_method = \"ring\"",
     "context_parallel_rotate_method: 'ring' is not one of torchtitan's methods (allgather, alltoall)"),
    ("context_parallel_degree = 1", "context_parallel_degree = 2\ncontext_parallel_rotate_method = 2",
     "context_parallel_rotate_method: 2 is not a name"),
    ("pipeline_parallel_degree = 1", 'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "ZBVZeroBubble"',
     "'ZBVZeroBubble' is not priced yet"),
    ("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 1\ncontext_parallel_degree = 2",
     "not TOML"),  # context_parallel_degree now twice: TOML refuses a duplicate key
    ('mode = "selective"', 'mode = "memory_budget"', "'memory_budget' is not priced yet"),
    ("[compile]\nenable=false", "[compile]\nenable=1", "[compile] enable: 1 is not a boolean"),
])
def test_bad_fields_are_refused_by_name(tmp_path, old, new, message):
    path = _variant(tmp_path, old, new)
    with pytest.raises(InvalidValue) as info:
        from_config("torchtitan", path, devices=8)
    assert message in str(info.value) and str(path) in str(info.value)


def test_replicas_of_fsdp_over_cp_alone_are_hsdp_over_the_cp_ranks(tmp_path):
    path = _variant(tmp_path, "data_parallel_replicate_degree = 1\ndata_parallel_shard_degree = -1",
                    "data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 1")
    path.write_text(path.read_text().replace("context_parallel_degree = 1", "context_parallel_degree = 4"))
    strategy = from_config("torchtitan", path).strategy
    # replicate 2 of FSDP over the 4 cp ranks: fsdp stays 1, the shard group is fsdp * cp = 4
    assert (strategy.dp, strategy.fsdp, strategy.cp, strategy.shard_mesh) == (2, 1, 4, "fsdp_cp")


def test_a_file_that_is_not_a_torchtitan_job(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 3}}')
    with pytest.raises(InvalidValue, match="not TOML"):
        from_config("torchtitan", path, devices=8)
    path.write_text("[zero]\nstage = 3\n")
    with pytest.raises(InvalidValue, match="not a torchtitan job TOML"):
        from_config("torchtitan", path, devices=8)


@pytest.mark.slow
def test_cli_refusal_is_one_line_and_exit_1():
    result = ndcost("estimate", "--from", f"torchtitan:{CONFIGS / 'llama3_70b.toml'}", "--devices", "12",
                    check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "does not divide them" in result.stderr


@pytest.mark.slow
def test_cli_estimate_from_the_70b_file():
    result = ndcost("--json", "estimate", "--from", f"torchtitan:{CONFIGS / 'llama3_70b.toml'}", "--devices", "64",
                    "--hardware", "h200", "--census", "off")
    import json
    data = json.loads(result.stdout)
    assert data["strategy"] == str(read("llama3_70b.toml", devices=64).strategy)
    assert data["trainer"]["kind"] == "torchtitan" and data["trainer"]["devices"] == 64
    assert "loss parallel on with tp > 1" in result.stderr  # the report: defaults applied


# --------------------------------------------------------------------------- writer

# (model, strategy) in the form the reader gives (dtypes equal to param_dtype left unset, pp_layers stated under PP)
ROUND_TRIPS = [
    ("qwen3-0.6b", "fsdp=8,seq=4096,recompute=full"),  # a flavor of the head tied to the embedding
    ("llama-3.1-8b", "fsdp=8,seq=8192,recompute=selective,param_dtype=fp32,compute_dtype=bf16"),
    ("llama-3.1-8b", "dp=2,fsdp=4,micro_batch=2,num_micro_batches=4,seq=4096,recompute=full"),
    ("llama-3.1-8b", "tp=2,sp=true,fsdp=4,seq=4096,recompute=full,recompute_layers=16"),
    ("llama-3.1-8b", "cp=8,shard_mesh=fsdp_cp,seq=131072,recompute=full,param_dtype=fp32"),
    ("llama-3.1-8b", "dp=2,cp=4,shard_mesh=fsdp_cp,seq=8192,reshard_after_forward=false"),
    ("llama-3.1-8b", "fsdp=8,offload_params=true,offload_optimizer=true,seq=2048"),
    ("llama-3.1-8b", "fsdp=4,cp=2,tp=2,sp=true,vocab_parallel=false,seq=8192,reshard_after_forward=false"),
    ("llama-3.1-8b", "pp=2,schedule=gpipe,pp_layers=15/17,micro_batch=2,num_micro_batches=4,seq=4096,fsdp=2,"
                     "gradient_sync=last_micro_batch,pp_engine=torch"),
    ("llama-3.1-70b", "fsdp=2,tp=8,sp=true,vocab_parallel=true,pp=4,vpp=2,schedule=interleaved,"
                      "pp_layers=10/11/10/10/10/10/10/9,num_micro_batches=8,seq=8192,recompute=full,"
                      "reshard_after_forward=false,param_dtype=fp32,compute_dtype=bf16,"
                      "gradient_sync=last_micro_batch,pp_engine=torch"),
    ("llama-3.1-70b", "tp=8,sp=true,vocab_parallel=true,pp=8,vpp=2,schedule=dualpipev,"
                      "pp_layers=" + "/".join(["5"] * 16) + ",num_micro_batches=16,seq=4096,pp_engine=torch"),
    ("deepseek-v3", "fsdp=8,tp=8,sp=true,vocab_parallel=true,ep=8,seq=4096,recompute=full"),
    ("qwen3-30b-a3b", "fsdp=16,ep=8,etp=1,seq=4096,optimizer=adam"),
    ("llama-3.1-70b", "fsdp=32,tp=8,sp=true,vocab_parallel=true,micro_batch=16,seq=8192,recompute=full,"
                      "param_dtype=fp32,compute_dtype=bf16,float8=tensorwise,float8_all_gather=true,compile=true,"
                      "async_tp=true"),
    ("llama-3.1-8b", "fsdp=8,seq=8192,float8=rowwise,compile=true"),
    ("llama-3.1-8b", "fsdp=4,cp=2,seq=8192,cp_rotate=p2p"),  # context_parallel_rotate_method = "alltoall"
    ("llama-3.1-8b", "fsdp=8,seq=8192,cp_rotate=p2p"),  # no effect at cp=1, but said and read back
    ("deepseek-v3", "fsdp=64,ep=8,seq=4096,ep_dispatcher=deepep"),  # expert_parallel_comm_backend = "deepep"
    ("deepseek-v3", "fsdp=64,ep=8,seq=4096,float8=rowwise,float8_experts=true"),  # quantize.grouped_mm.float8
]


@pytest.mark.parametrize("model, text", ROUND_TRIPS)
def test_write_then_read_gives_the_strategy_back(tmp_path, model, text):
    strategy = Strategy.parse(text)
    path = tmp_path / "job.toml"
    path.write_text(to_config("torchtitan", strategy, model=model))
    config = from_config("torchtitan", path)  # the file states every degree: no --devices needed
    assert config.strategy == strategy and config.model == model and config.devices == strategy.devices
    assert config.global_batch == strategy.micro_batch * strategy.num_micro_batches * strategy.dp * strategy.fsdp


def test_an_unstated_pipeline_split_is_written_as_ndcosts_even_one(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(to_config("torchtitan", "pp=4,num_micro_batches=4,seq=4096,pp_engine=torch",
                              model="llama-3.1-8b"))
    assert from_config("torchtitan", path).strategy.pp_layers == (8, 8, 8, 8)  # 32 layers, j * 32 // 4 before j


def test_equal_dtypes_stated_or_not_write_the_same_file():
    plain = to_config("torchtitan", "fsdp=8,seq=4096,param_dtype=fp32", model="llama-3.1-8b")
    stated = to_config("torchtitan", "fsdp=8,seq=4096,param_dtype=fp32,compute_dtype=fp32,grad_dtype=fp32,"
                                     "optimizer_dtype=fp32", model="llama-3.1-8b")
    assert plain == stated and 'dtype = "float32"' in plain and 'mixed_precision_param = "float32"' in plain


@pytest.mark.parametrize("model, text, message", [
    ("llama-3.1-8b", "dp=8,zero=1,seq=4096", "zero=1"),
    ("llama-3.1-8b", "fsdp=4,cp=2,shard_mesh=dp,seq=4096", "shard_mesh=dp"),
    ("llama-3.1-8b", "fsdp=8,seq=4096,param_dtype=bf16,master_dtype=fp32", "master_dtype=fp32"),
    ("llama-3.1-8b", "fsdp=2,cp=4,cp_algo=ulysses,seq=4096", "cp_algo=ulysses"),
    ("llama-3.1-8b", "fsdp=8,seq=4096,recompute=core_attention", "recompute=core_attention"),
    ("llama-3.1-8b", "tp=2,fsdp=4,seq=4096", "sp=false with tp=2"),
    ("llama-3.1-8b", "cp=2,fsdp=1,seq=4096", "cp=2 with fsdp=1"),
    ("llama-3.1-8b", "cp=2,fsdp=2,shard_mesh=fsdp_cp,seq=4096", "shard_mesh=fsdp_cp with fsdp > 1"),
    ("llama-3.1-8b", "cp=8,zero=3,seq=4096", "zero=3"),
    ("llama-3.1-8b", "fsdp=8,seq=4096,optimizer=sgd", "optimizer=sgd"),
    ("llama-3.1-8b", "fsdp=8,seq=4096,recompute=full,recompute_layers=31", "recompute_layers=31"),
    ("llama-3.1-8b", "fsdp=8", "seq unset"),
    ("llama-3.1-8b", "tp=8,sp=true,seq=4096,float8=tensorwise,float8_all_gather=true",
     "float8_all_gather=true with fsdp=1"),
    ("mixtral-8x7b", "fsdp=8,seq=4096", "model 'mixtral-8x7b'"),
    ("llama-3.1-8b", "pp=2,fsdp=2,num_micro_batches=4,seq=4096,pp_engine=torch", "gradient_sync=auto with pp=2"),
    ("llama-3.1-8b", "pp=2,fsdp=2,num_micro_batches=4,seq=4096,gradient_sync=last_micro_batch",
     "pp_engine=auto with pp=2"),
    ("llama-3.1-8b", "fsdp=8,seq=4096,pp_engine=torch", "pp_engine=torch with pp=1"),
    ("deepseek-v3", "fsdp=8,seq=4096,ep_dispatcher=deepep", "ep_dispatcher=deepep with ep=1"),
    ("llama-3.1-8b", "fsdp=8,num_micro_batches=2,seq=4096,gradient_sync=last_micro_batch",
     "gradient_sync=last_micro_batch with pp=1"),
])
def test_write_refuses_what_torchtitan_cannot_say(model, text, message):
    with pytest.raises(InvalidValue) as info:
        to_config("torchtitan", text, model=model)
    assert f"torchtitan cannot express {message}" in str(info.value)


def test_write_refuses_a_global_batch_the_strategy_does_not_run():
    with pytest.raises(InvalidValue, match="global batch 64"):
        to_config("torchtitan", "fsdp=8,num_micro_batches=2,seq=4096", model="llama-3.1-8b", global_batch=64)
    assert "global_batch_size = 16" in to_config("torchtitan", "fsdp=8,num_micro_batches=2,seq=4096",
                                                 model="llama-3.1-8b", global_batch=16)


@pytest.mark.slow
def test_search_emit_torchtitan(tmp_path):
    args = ("search", "llama-3.1-8b", "--devices", "8", "--hardware", "h200", "--global-batch", "32", "--seq",
            "8192", "--census", "off", "--top", "3")
    # --emit holds torchtitan's default precision (fp32 parameters, bf16 compute) and prices under the runtime its
    # reader prices the file under: the same held and run, the table's row it names ("#N") is the strategy --emit
    # writes, the fastest torchtitan can say
    emitted = ndcost(*args, "--emit", "torchtitan")
    rank = emitted.stderr.strip().splitlines()[-1].split(" ", 3)[2].lstrip("#")
    table = ndcost(*args[:-1], rank, "--hold", "param_dtype=fp32,compute_dtype=bf16", "--runtime", "torchtitan-cuda")
    best = table.stdout
    assert emitted.stdout.startswith("# written by ndcost") and "#  peak GiB" not in emitted.stdout
    path = tmp_path / "stdout.toml"
    path.write_text(emitted.stdout)
    config = from_config("torchtitan", path)
    chosen = emitted.stderr.strip().splitlines()[-1].split(" ", 3)[-1]  # "--emit torchtitan: #N STRATEGY"
    assert config.strategy == Strategy.parse(chosen) and config.devices == 8 and config.global_batch == 32
    assert ",".join(p for p in chosen.split(",") if p != "seq=8192") in best.replace("\n", "").replace(" ", "")
    written = ndcost(*args, "--emit", f"torchtitan:{tmp_path / 'job.toml'}")
    assert f"torchtitan configuration: {tmp_path / 'job.toml'}" in written.stdout and "peak GiB" in written.stdout
    assert "8 x h200 (torchtitan-cuda)" in written.stdout and config.runtime == "torchtitan-cuda"
    assert (tmp_path / "job.toml").read_text() == emitted.stdout


@pytest.mark.slow
def test_search_emit_refusals():
    args = ("search", "llama-3.1-8b", "--devices", "8", "--hardware", "h200", "--global-batch", "32", "--seq",
            "8192", "--census", "off")
    result = ndcost(*args, "--emit", "torchtitan", "--json", check=False)
    assert result.returncode == 1 and "give --emit torchtitan:PATH" in result.stderr
    result = ndcost(*args, "--emit", "nosuch", check=False)
    assert result.returncode == 1 and "unknown trainer kind 'nosuch'" in result.stderr
    result = ndcost("search", "mixtral-8x7b", "--devices", "8", "--hardware", "h200", "--global-batch", "32",
                    "--seq", "4096", "--census", "off", "--emit", "torchtitan", check=False)
    assert result.returncode == 1 and "has a torchtitan form" in result.stderr and "mixtral-8x7b" in result.stderr


def _llama_ffn(dim, multiplier, multiple_of):
    """torchtitan's FeedForward width (torchtitan/models/llama3/model/model.py): 2/3 of 4 * dim, scaled, rounded up."""
    hidden = int(multiplier * int(2 * 4 * dim / 3))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


# torchtitan's flavors' arguments at 238fa99 (torchtitan/models/{llama3,deepseek_v3,qwen3}/__init__.py), by hand
FLAVOR_SHAPES = {
    "llama-3.1-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=_llama_ffn(4096, 1.3, 1024)),
    "llama-3.1-70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                          intermediate_size=_llama_ffn(8192, 1.3, 4096)),
    "llama-3.1-405b": dict(hidden_size=16384, num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8,
                           intermediate_size=_llama_ffn(16384, 1.2, 4096)),
    "deepseek-v3": dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                        num_hidden_layers=61, first_k_dense_replace=3, num_attention_heads=128, n_routed_experts=256,
                        n_shared_experts=1, num_experts_per_tok=8, q_lora_rank=1536, kv_lora_rank=512,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    # deepseek_v3's 16B and 236B at 0014ac2 (_16b, _236b): softmax routers, 2 shared experts, one dense layer
    "deepseek-v2-lite": dict(vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
                             num_hidden_layers=27, first_k_dense_replace=1, num_attention_heads=16,
                             n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, q_lora_rank=None,
                             kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                             topk_method="greedy", routed_scaling_factor=1.0),
    "deepseek-v2": dict(vocab_size=102400, hidden_size=5120, intermediate_size=12288, moe_intermediate_size=1536,
                        num_hidden_layers=60, first_k_dense_replace=1, num_attention_heads=128, n_routed_experts=160,
                        n_shared_experts=2, num_experts_per_tok=6, q_lora_rank=1536, kv_lora_rank=512,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, topk_method="group_limited_greedy",
                        n_group=8, topk_group=3, routed_scaling_factor=16.0),
    "qwen3-8b": dict(vocab_size=151936, head_dim=128, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=12288),
    # qwen3's dense flavors at 0310b49 (_0_6b ... _32b): the three smallest tie the head to the embedding
    **{name: dict(vocab_size=151936, head_dim=128, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=8, intermediate_size=hidden, tie_word_embeddings=tied)
       for name, dim, layers, heads, hidden, tied in (("qwen3-0.6b", 1024, 28, 16, 3072, True),
                                                       ("qwen3-1.7b", 2048, 28, 16, 6144, True),
                                                       ("qwen3-4b", 2560, 36, 32, 9728, True),
                                                       ("qwen3-14b", 5120, 40, 40, 17408, False),
                                                       ("qwen3-32b", 5120, 64, 64, 25600, False))},
    "qwen3-30b-a3b": dict(vocab_size=151936, head_dim=128, hidden_size=2048, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, moe_intermediate_size=768, num_experts=128,
                          num_experts_per_tok=8),
    "qwen3-235b-a22b": dict(vocab_size=151936, head_dim=128, hidden_size=4096, num_hidden_layers=94,
                            num_attention_heads=64, num_key_value_heads=4, moe_intermediate_size=1536,
                            num_experts=128, num_experts_per_tok=8),
}


@pytest.mark.parametrize("model", sorted(FLAVOR_SHAPES))
def test_each_flavor_maps_to_a_spec_of_its_shape(model):
    from ndcost.models import load_model
    from ndcost.plugins.trainers.torchtitan import MODELS

    assert model in MODELS.values()
    config = load_model(model).hf_config
    assert {k: config[k] for k in FLAVOR_SHAPES[model]} == FLAVOR_SHAPES[model]


def test_the_older_float8_switch_reads_as_the_converter_does(tmp_path):
    """torchtitan of 2024 turned Float8 on with [float8] enable_float8_linear, before [model] converters; its
    float8.py filtered the head by name (module_filter_fn=lambda mod, fqn: fqn != "output", at 9dec370)."""
    text = (CONFIGS / "llama3_8b.toml").read_text() + "\n[float8]\nenable_float8_linear = true\n"
    path = tmp_path / "job.toml"
    path.write_text(text)
    config = from_config("torchtitan", path, devices=8)
    assert config.strategy.float8 == "tensorwise" and not config.strategy.float8_all_gather
    assert not any("output head" in note for note in config.defaults)
    path.write_text(text.replace("enable_float8_linear = true", "enable_float8_linear = false"))
    config = from_config("torchtitan", path, devices=8)
    assert "[float8] enable_float8_linear" in config.read_fields and config.strategy.float8 == "none"


# --------------------------------------------------------------------------- Float8, torch.compile, async TP


def test_llama3_405b_reads_float8_compile_and_async_tp():
    """The real 405B job: converters = ["float8"], [compile] enable with "model", async TP, fp8 all-gather."""
    config = read("llama3_405b.toml", devices=512)
    s = config.strategy
    assert (s.fsdp, s.tp, s.sp) == (64, 8, True)      # shard -1: 512 / tp 8; TP runs SP
    assert s.float8 == "tensorwise"                    # [quantize.linear.float8] states no recipe_name
    assert s.float8_all_gather                         # enable_fsdp_float8_all_gather = true, dp_shard 64 > 1
    assert s.compile and s.async_tp                    # [compile] enable, components ["model", "loss"]
    assert s.loss_engine == "compiled"                 # the "loss" component
    for field in ("[quantize] linear.float8.enable_fsdp_float8_all_gather", "[quantize] linear.float8.filter_fqns",
                  "[compile] components", "[parallelism] enable_async_tensor_parallel"):
        assert field in config.read_fields
    assert not any("output head" in note for note in config.defaults)  # filter_fqns = ["output"]


def test_deepseek_v3_compiles_the_loss_alone():
    """deepseek_v3_671b.toml compiles components = ["loss"] only: the layers run eagerly, the loss compiled; its
    float8 converters are commented out, so [quantize.linear.float8] is not read."""
    config = read("deepseek_v3_671b.toml", devices=64)
    assert not config.strategy.compile and config.strategy.float8 == "none"
    assert config.strategy.loss_engine == "compiled"


_FLOAT8_SECTION = ("[quantize.linear.float8]\nenable_fsdp_float8_all_gather = false\n"
                   "precompute_float8_dynamic_scale_for_fsdp = false\nfilter_fqns = [\"output\"]\n")


def _float8_job(tmp_path, converters, section=None, old="[compile]\nenable=false", new="[compile]\nenable=false"):
    """llama3_8b.toml with *converters* on [model], its [quantize.linear.float8] lines replaced by *section*'s (kept
    where None) and *old* replaced by *new*."""
    text = (CONFIGS / "llama3_8b.toml").read_text()
    assert '[model]\nname = "llama3"' in text and old in text and _FLOAT8_SECTION in text
    text = text.replace('[model]\nname = "llama3"', f'[model]\nconverters = {converters}\nname = "llama3"')
    if section is not None:
        text = text.replace(_FLOAT8_SECTION, "[quantize.linear.float8]\n" + section + "\n")
    path = tmp_path / "job.toml"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize("converters, section, new, fields", [
    ('["quantize.linear.float8"]', None, "[compile]\nenable=false", {"float8": "tensorwise", "compile": False}),
    ('["float8"]', 'recipe_name = "rowwise"\nfilter_fqns = ["output"]', "[compile]\nenable=false",
     {"float8": "rowwise", "float8_all_gather": False}),
    ('["float8"]', 'recipe_name = "rowwise_with_gw_hp"', "[compile]\nenable=false",
     {"float8": "rowwise_with_gw_hp", "float8_all_gather": False}),
    ('["float8"]', "enable_fsdp_float8_all_gather = true", "[compile]\nenable=false",
     {"float8": "tensorwise", "float8_all_gather": True}),  # data_parallel_shard_degree -1: 8 > 1
    ("[]", None, "[compile]\nenable=true", {"float8": "none", "compile": True}),
    ("[]", None, '[compile]\nenable=true\ncomponents = ["loss"]', {"compile": False}),
])
def test_float8_and_compile_lines_read_into_fields(tmp_path, converters, section, new, fields):
    path = _float8_job(tmp_path, converters, section, old='[compile]\nenable=false\ncomponents = ["model", "loss"]',
                       new=new if "components" in new else new + '\ncomponents = ["model", "loss"]')
    strategy = from_config("torchtitan", path, devices=8).strategy
    assert {field: getattr(strategy, field) for field in fields} == fields


def test_the_head_converted_by_an_empty_filter_is_said(tmp_path):
    """At 238fa99 filter_fqns defaults to [] (the head converted too); ndcost keeps the head at compute_dtype."""
    config = from_config("torchtitan", _float8_job(tmp_path, '["float8"]', ""), devices=8)
    assert config.strategy.float8 == "tensorwise"
    assert any("leaves the output head to Float8" in note for note in config.defaults)


def test_async_tp_without_compile_is_refused_as_torchtitan_refuses_it(tmp_path):
    path = _float8_job(tmp_path, "[]", old="tensor_parallel_degree = 1",
                       new="tensor_parallel_degree = 2\nenable_async_tensor_parallel = true")
    with pytest.raises(InvalidValue, match="torchtitan refuses async TP without compiling the model"):
        from_config("torchtitan", path, devices=8)


@pytest.mark.parametrize("converters, section, message", [
    ('["mx"]', None, "[model] converters = ['mx']: MX training not priced yet"),
    ('["float8"]', 'recipe_name = "mxfp8"', "'mxfp8' is not a torchao recipe ndcost prices"),
    ('["float8"]', 'recipe_name = "tensorwise"\nenable_fsdp_float8_all_gather = true',
     "torchtitan asserts it away with a recipe_name"),
    ('["float8"]', 'filter_fqns = ["attention.wq"]', "[quantize.linear.float8] filter_fqns: ['attention.wq']"),
    ('["float8"]', "emulate = true", "[quantize.linear.float8] emulate: emulation runs no fp8 GEMM"),
])
def test_float8_settings_not_priced_are_refused_by_name(tmp_path, converters, section, message):
    path = _float8_job(tmp_path, converters, section)
    with pytest.raises(InvalidValue) as info:
        from_config("torchtitan", path, devices=8)
    assert message in str(info.value) and str(path) in str(info.value)


def test_older_float8_section_with_moe_experts_runs_the_experts_in_fp8(tmp_path):
    """deepseek_v3_671b_aeb3a4b.toml ([float8] of 2025) with its commented converters line turned on: moe_fqns
    asks for float8 grouped GEMMs of the experts."""
    path = file_variant(CONFIGS / "deepseek_v3_671b_aeb3a4b.toml", '# converters = ["float8"]',
                        'converters = ["float8"]', tmp_path / "job.toml")
    strategy = from_config("torchtitan", path, devices=64).strategy
    assert strategy.float8 == "tensorwise" and strategy.float8_experts


@pytest.mark.parametrize("converters, fields", [
    ('["quantize.linear.float8", "quantize.grouped_mm.float8"]', {"float8": "tensorwise", "float8_experts": True}),
    ('["quantize.linear.float8"]', {"float8": "tensorwise", "float8_experts": False}),  # the section alone: unread
])
def test_the_grouped_gemm_converter_runs_the_experts_in_fp8(tmp_path, converters, fields):
    """deepseek_v3_671b.toml (238fa99) states [quantize.grouped_mm.float8] fqns = ["experts"]."""
    path = file_variant(CONFIGS / "deepseek_v3_671b.toml", '# converters = ["float8"]',
                        f"converters = {converters}", tmp_path / "job.toml")
    strategy = from_config("torchtitan", path, devices=64).strategy
    assert {name: getattr(strategy, name) for name in fields} == fields


def test_the_grouped_gemm_converter_alone_is_refused(tmp_path):
    path = file_variant(CONFIGS / "deepseek_v3_671b.toml", '# converters = ["float8"]',
                        'converters = ["quantize.grouped_mm.float8"]', tmp_path / "job.toml")
    with pytest.raises(InvalidValue, match=r"\[quantize.grouped_mm.float8\] fqns: the experts' grouped GEMMs in "
                                           r"fp8 without the Float8 linears"):
        from_config("torchtitan", path, devices=64)


@pytest.mark.parametrize("backend, dispatcher", [("standard", "alltoall"), ("deepep", "deepep"),
                                                 ("hybridep", "deepep")])
def test_the_expert_parallel_comm_backend_is_the_dispatcher(tmp_path, backend, dispatcher):
    path = file_variant(CONFIGS / "deepseek_v3_671b.toml", "expert_parallel_degree = 1",
                        f'expert_parallel_degree = 8\nexpert_parallel_comm_backend = "{backend}"', tmp_path / "j.toml")
    assert read(path, devices=64).strategy.ep_dispatcher == dispatcher


@pytest.mark.parametrize("degrees, backend, message", [
    ("expert_parallel_degree = 1", "deepep", "torchtitan runs DeepEP only at ep > 1 without expert TP"),
    ("expert_parallel_degree = 8", "nccl", "'nccl' is not priced"),
])
def test_a_backend_torchtitan_does_not_run_is_refused(tmp_path, degrees, backend, message):
    path = file_variant(CONFIGS / "deepseek_v3_671b.toml", "expert_parallel_degree = 1",
                        f'{degrees}\nexpert_parallel_comm_backend = "{backend}"', tmp_path / "j.toml")
    with pytest.raises(InvalidValue, match=message):
        read(path, devices=64)
