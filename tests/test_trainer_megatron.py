"""``megatron:`` configurations: real Megatron-LM launch scripts read field by field, the model shapes counted as
Megatron-LM builds them, refusals by name, and the writer's round trip.

The real files are NVIDIA/Megatron-LM d98e8a6's examples (tests/data/configs/SOURCES.md); the hand-made variants
say in their first lines what they change.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from _helpers import file_variant, ndcost

import ndcost as nd
from ndcost.errors import InvalidValue
from ndcost.models import load_model, parameters
from ndcost.trainers import from_config, to_config, trainer_format
from ndcost.values import Strategy

DATA = Path(__file__).parent / "data" / "configs" / "megatron"
MEGATRON_MIXED = {"grad_dtype": "fp32", "master_dtype": "fp32", "optimizer_dtype": "fp32"}


def read(name, devices, **kw):
    return from_config("megatron", DATA / name, devices=devices, **kw)


def expected(**fields):
    """A strategy Megatron-LM runs: its own vocab_parallel_cross_entropy is the loss at every tp, its DDP's grad
    buffer holds the gradients."""
    return Strategy.from_mapping({"loss_engine": "megatron", "ddp_engine": "megatron", **fields})


def test_llama3_8b_fp8_script_is_refused_naming_fp8(tmp_path):
    # DTYPE="fp8" takes the script's fp8 branch: "--fp8-format hybrid", an amax history and fp8 parameters
    with pytest.raises(InvalidValue, match=r"train_llama3_8b_h100_fp8.sh: --fp8-param-gather: .*fp8 primary "
                                           r"weights"):
        read("train_llama3_8b_h100_fp8.sh", 8)
    # without fp8 parameters: TE's default recipe, delayed scaling from the 1024-step amax history
    path = file_variant(DATA / "train_llama3_8b_h100_fp8.sh", '        "--fp8-param-gather"\n', "",
                        tmp_path / "train.sh")
    with pytest.raises(InvalidValue, match=r"--fp8-recipe: delayed scaling \(the default\) scales from an amax "
                                           r"history"):
        from_config("megatron", path, devices=8)
    # current scaling (TE Float8CurrentScaling) is torchao's tensorwise dynamic scaling
    path = file_variant(path, '"--fp8-format hybrid"', '"--fp8-format hybrid"\n        "--fp8-recipe tensorwise"',
                        tmp_path / "train_tensorwise.sh")
    config = from_config("megatron", path, devices=8)
    assert config.strategy.float8 == "tensorwise" and config.strategy.float8_experts and not config.strategy.compile
    assert "--fp8-recipe" in config.read_fields and "--fp8-format" in config.read_fields


def test_llama3_8b_bf16_variant_field_by_field():
    config = read("llama3_8b_bf16_tp2_cp2.sh", 64)
    assert config.strategy == expected(
        tp=2,                 # TP_SIZE=2 -> --tensor-model-parallel-size $TP_SIZE
        cp=2,                 # CP_SIZE=2 -> --context-parallel-size $CP_SIZE
        cp_rotate="p2p",      # no --cp-comm-type: Megatron-LM's default p2p (arguments.py), a ring of sends
        pp=1,                 # --pipeline-model-parallel-size is commented out in MODEL_PARALLEL_ARGS
        dp=16,                # 64 devices / (tp 2 * pp 1 * cp 2)
        sp=True,              # --sequence-parallel, kept since tp > 1
        zero=1,               # DDP_ARGS' --use-distributed-optimizer, sharding over dp * cp (shard_mesh dp_cp)
        micro_batch=1,        # MICRO_BATCH_SIZE=1
        num_micro_batches=8,  # GLOBAL_BATCH_SIZE=128 / (micro 1 * dp 16)
        seq=8192,             # SEQ_LENGTH=8192
        vocab_parallel=True,  # Megatron-LM splits the vocabulary over tp
        param_dtype="bf16", grad_dtype="bf16",  # --bf16 with --grad-reduce-in-bf16: bf16 main gradients
        master_dtype="fp32", optimizer_dtype="fp32",  # fp32 main parameters and Adam states
        optimizer="adamw")    # Megatron's default --optimizer adam, with decoupled weight decay
    assert config.global_batch == 128 and config.devices == 64
    assert "--fp8-format" not in config.read_fields  # DTYPE="bf16": the fp8 branch is not taken
    assert "--lr" in config.ignored_fields and "--grad-reduce-in-bf16" in config.read_fields
    assert any("the world size is --devices" in item for item in config.ignored_fields)
    assert any("vocabulary over tp" in d for d in config.defaults)


def test_llama3_8b_shape_counts_as_megatron_builds_it():
    config = read("llama3_8b_bf16_tp2_cp2.sh", 64)
    assert config.model["model_type"] == "llama"
    # By hand, Megatron-LM's GPT model for these flags: vocab 128256 (a multiple of 128 * tp 2: no padding),
    # h 4096, 32 layers, ffn 14336 (SwiGLU: fc1 is 2 * ffn wide), 32 heads of 128, 8 query groups, no biases,
    # RMSNorm weights only, untied output layer.
    h, layers, ffn, vocab, kv = 4096, 32, 14336, 128256, 8 * 128
    qkv = h * (h + 2 * kv)
    per_layer = qkv + h * h + 2 * ffn * h + ffn * h + 2 * h
    total = vocab * h + layers * per_layer + h + h * vocab
    assert total == 8_030_261_248  # Llama-3-8B's published count
    assert parameters(load_model(config.model)).total == total


def test_gpt3_175b_script_field_by_field():
    config = read("train_gpt3_175b_distributed.sh", 1024, model="llama-3.1-8b")
    assert config.strategy == expected(
        tp=8, pp=16,           # MODEL_PARALLEL_ARGS
        dp=8,                  # 1024 / (8 * 16)
        micro_batch=1, num_micro_batches=192,  # --global-batch-size 1536 / (1 * 8)
        seq=2048,
        vocab_parallel=True,   # tp > 1
        param_dtype="fp16", **MEGATRON_MIXED)  # --fp16: fp16 parameters, fp32 main grads, params and states
    assert "--step-batch-size-schedule" in config.ignored_fields  # the ramp; the step priced is the full batch


def test_gpt3_175b_script_names_no_model_without_a_vocabulary():
    # --vocab-file $VOCAB_FILE: a tokenizer file ndcost does not read, so the model must be given.
    with pytest.raises(InvalidValue, match="names no model; give one"):
        read("train_gpt3_175b_distributed.sh", 1024)


def test_gpt3_args_file_field_by_field_and_its_count():
    config = read("gpt3_175b_args.txt", 512)
    assert config.strategy == expected(
        tp=8, pp=16, cp=2, dp=2,          # 512 / (8 * 16 * 2)
        cp_algo="ulysses",                # --cp-comm-type a2a
        recompute="core_attention",       # --recompute-activations: Megatron's selective, the core attention
        micro_batch=1, num_micro_batches=768,  # 1536 / (1 * 2)
        seq=2048, vocab_parallel=True, param_dtype="fp16", **MEGATRON_MIXED)
    assert config.model["model_type"] == "gpt2"
    # By hand: LayerNorm (weight and bias), learned positions, biased linears, GELU MLP of 4h, tied output;
    # vocab 50257 padded to a multiple of 128 * tp 8 = 1024: 51200.
    h, layers, vocab, positions = 12288, 96, 51200, 2048
    per_layer = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h)
    total = vocab * h + positions * h + layers * per_layer + 2 * h
    assert parameters(load_model(config.model)).total == total == 174_615_846_912
    assert config.model["attn_pdrop"] == config.model["resid_pdrop"] == 0.1  # Megatron's dropout defaults


def test_mixtral_script_field_by_field():
    config = read("train_mixtral_8x7b_distributed.sh", 64, model="mixtral-8x7b")
    assert config.strategy == expected(
        pp=4, dp=16,           # 64 / (tp 1 * pp 4)
        ep=8, etp=1,           # --expert-model-parallel-size 8; expert tp defaults to tp (1)
        sp=False,              # --sequence-parallel, turned off by Megatron-LM at tp = 1
        zero=1,
        micro_batch=1, num_micro_batches=16,  # 256 / (1 * 16)
        seq=4096, param_dtype="bf16", **MEGATRON_MIXED)
    # The WANDB_API_KEY test cannot be decided; either way only wandb flags differ, which bear on nothing.
    assert "--wandb-project" in config.ignored_fields
    assert any("turned off without tensor parallelism" in d for d in config.defaults)


def test_mixtral_variant_field_by_field_and_its_count():
    config = read("mixtral_8x7b_vocab_vpp_block_recompute.sh", 64)
    assert config.strategy == expected(
        pp=4, dp=16, ep=8, zero=1, micro_batch=1, num_micro_batches=16, seq=4096,
        vpp=2, schedule="interleaved",      # 32 layers / pp 4 = 8 a stage, 4 a virtual stage
        recompute="full", recompute_layers=2,  # --recompute-method block --recompute-num-layers 2
        param_dtype="bf16", **MEGATRON_MIXED)
    assert config.model["model_type"] == "mixtral"
    # By hand: vocab 32000 (a multiple of 128), h 4096, 32 layers of GQA attention (8 groups of 128), a router
    # of 8 x h and 8 SwiGLU experts of 14336, RMSNorm weights, untied output.
    h, vocab, ffn = 4096, 32000, 14336
    per_layer = h * (h + 2 * 1024) + h * h + 8 * h + 8 * 3 * h * ffn + 2 * h
    total = 2 * vocab * h + 32 * per_layer + h
    assert total == 46_702_792_704  # Mixtral-8x7B's published count
    assert parameters(load_model(config.model)).total == total
    # The spec shipped for Mixtral is the same model.
    assert parameters(load_model("mixtral-8x7b")).total == total


@pytest.mark.parametrize("flags, model_type, extra", [
    ("--qk-layernorm --disable-bias-linear", "qwen3", {}),
    ("--add-qkv-bias --disable-bias-linear", "qwen2", {}),
    ("--qk-layernorm --disable-bias-linear --num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 256",
     "qwen3_moe", {"num_experts": 16, "moe_intermediate_size": 256, "num_experts_per_tok": 4}),
    ("", "llama", {"attention_bias": True, "mlp_bias": True}),  # Megatron's linears are biased by default
    ("--disable-bias-linear --add-qkv-bias --num-experts 16 --moe-ffn-hidden-size 128 "
     "--moe-shared-expert-intermediate-size 256", "glm4_moe",
     {"n_routed_experts": 16, "n_shared_experts": 2, "first_k_dense_replace": 0, "attention_bias": True}),
])
def test_shapes_map_to_their_model_type(tmp_path, flags, model_type, extra):
    path = tmp_path / "args.txt"
    path.write_text("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --swiglu --normalization RMSNorm "
                    "--position-embedding-type rope --vocab-size 1000 --micro-batch-size 1 --bf16 " + flags)
    config = from_config("megatron", path, devices=1)
    assert config.model["model_type"] == model_type
    assert config.model["vocab_size"] == 1024  # padded to a multiple of 128
    assert config.model["intermediate_size"] == 640  # int(4 * 256 * 2 / 3 / 64) * 64, the SwiGLU default
    for key, value in extra.items():
        assert config.model[key] == value
    assert config.model["tie_word_embeddings"] is True  # no --untie-embeddings-and-output-weights
    # Counted by hand for the qwen3 shape: q and k norms of head_dim 64 each layer, no biases, one embedding
    # shared with the output layer.
    h, ffn = 256, 640
    if model_type == "qwen3":
        per_layer = 4 * h * h + 3 * h * ffn + 2 * h + 2 * 64
        assert parameters(load_model(config.model)).total == 1024 * h + 2 * per_layer + h
    if model_type == "glm4_moe":
        # Megatron's layer: qkv with its bias (3h + 3h), proj, a router of 16 x h, 16 SwiGLU experts of 128 and
        # one shared SwiGLU expert of 256, two RMSNorms.
        per_layer = (3 * h * h + 3 * h) + h * h + 16 * h + 16 * 3 * h * 128 + 3 * h * 256 + 2 * h
        assert parameters(load_model(config.model)).total == 1024 * h + 2 * per_layer + h


def write_args(tmp_path, text, name="args.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


BASE = "--micro-batch-size 1 --num-layers 4 --hidden-size 256 --num-attention-heads 4 --bf16 "


@pytest.mark.parametrize("text, field, words", [
    (BASE + "--tensor-model-parallel-size two", "--tensor-model-parallel-size", "expected an integer"),
    (BASE + "--tensor-model-parallel-size 3", "--tensor-model-parallel-size * --pipeline-model-parallel-size",
     "does not divide the world size 8"),
    (BASE + "--global-batch-size 12", "--global-batch-size", "not a multiple of --micro-batch-size 1 times the "
                                                             "data-parallel size 8"),
    (BASE + "--cp-comm-type ring --context-parallel-size 2", "--cp-comm-type", "'ring' is not one of Megatron-LM's "
                                                                             "types (p2p, allgather, a2a, a2a+p2p)"),
    (BASE + "--recompute-granularity full --recompute-method uniform --recompute-num-layers 4",
     "--recompute-num-layers", "keeps one input every 4 layers"),
    (BASE + "--recompute-granularity full", "--recompute-method", "expected uniform or block"),
    (BASE + "--optimizer muon", "--optimizer", "'muon' is not priced"),
    (BASE + "--fp16 --bf16", "--bf16", "given with --fp16"),
    (BASE + "--tp-comm-overlap", "--tp-comm-overlap", "not priced yet"),
    (BASE + "--transformer-impl local", "--transformer-impl", "Megatron-LM's own layers are not priced"),
    (BASE + "--use-megatron-fsdp --data-parallel-sharding-strategy zero3", "--data-parallel-sharding-strategy",
     "'zero3' is not one of Megatron-FSDP's (no_shard, optim, optim_grads, optim_grads_params)"),
    (BASE + "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --outer-dp-sharding-strategy "
            "optim", "--outer-dp-sharding-strategy", "(HSDP) is not read yet"),
    (BASE + "--use-megatron-fsdp --num-distributed-optimizer-instances 2", "--num-distributed-optimizer-instances",
     "replicated optimizer shards (HSDP) are not read yet"),
    ("--tensor-model-parallel-size 2", "--micro-batch-size", "missing"),
])
def test_bad_flags_are_refused_naming_the_flag(tmp_path, text, field, words):
    path = write_args(tmp_path, text)
    with pytest.raises(InvalidValue) as info:
        from_config("megatron", path, devices=8)
    message = str(info.value)
    assert message.startswith(f"megatron config {path}: {field}") and words in message and "\n" not in message


@pytest.mark.parametrize("flags, algo, rotate", [
    ("--context-parallel-size 2", "ring", "p2p"),  # no --cp-comm-type: Megatron-LM's default ["p2p"]
    ("--context-parallel-size 2 --cp-comm-type p2p", "ring", "p2p"),  # TE's AttnFuncWithCPAndKVP2P
    ("--context-parallel-size 2 --cp-comm-type allgather", "ring", "allgather"),  # AttnFuncWithCPAndKVAllGather
    ("--context-parallel-size 2 --cp-comm-type a2a", "ulysses", "allgather"),  # no ring: the default rotation
    ("--context-parallel-size 2 --cp-comm-type a2a+p2p", "hybrid", "p2p"),  # p2p between the a2a groups
    ("", "ring", "allgather"),  # cp 1: no ring, nothing defaulted
])
def test_cp_comm_types_read_as_an_algorithm_and_a_rotation(tmp_path, flags, algo, rotate):
    config = from_config("megatron", write_args(tmp_path, BASE + flags), devices=8, model="llama-3.1-8b")
    assert (config.strategy.cp_algo, config.strategy.cp_rotate) == (algo, rotate)
    assert any("--cp-comm-type defaults to p2p" in d for d in config.defaults) == ("--cp-comm-type" not in flags
                                                                                  and "context" in flags)


def test_devices_are_required(tmp_path):
    path = write_args(tmp_path, BASE)
    with pytest.raises(InvalidValue, match=r"--devices: .*give the world size: --devices N"):
        from_config("megatron", path)


SCRIPT = """#!/bin/bash
TP=${TP:-2}
LAYERS=$1
if [ -f /etc/cluster.conf ]; then
    EXTRA=(--pipeline-model-parallel-size 2)
fi
torchrun --nproc_per_node 8 pretrain_gpt.py --micro-batch-size 1 --tensor-model-parallel-size $TP \\
    --num-layers ${LAYERS:-4} --hidden-size 256 --num-attention-heads 4 "${EXTRA[@]}"
"""


def test_a_script_whose_flags_hang_on_an_undecidable_test_is_refused(tmp_path):
    path = write_args(tmp_path, SCRIPT, "train.sh")
    with pytest.raises(InvalidValue, match=r"\[ -f /etc/cluster.conf \]: the flags the script passes depend on "
                                           r"these tests"):
        from_config("megatron", path, devices=8)


def test_a_script_variable_it_does_not_set_is_refused_by_name(tmp_path):
    script = SCRIPT.replace("if [ -f /etc/cluster.conf ]", "if false").replace("${LAYERS:-4}", "$LAYERS")
    path = write_args(tmp_path, script, "train.sh")
    with pytest.raises(InvalidValue, match=r"--num-layers: its value is \$1, which the script does not set; give "
                                           r"the value"):
        from_config("megatron", path, devices=8)
    path.write_text(script.replace("LAYERS=$1", "LAYERS=4"))
    config = from_config("megatron", path, devices=8, model="llama-3.1-8b")
    assert config.strategy == expected(tp=2, dp=4, vocab_parallel=True, param_dtype="fp32")  # ${TP:-2}, no --bf16


@pytest.mark.parametrize("text, words", [
    ('{"train_batch_size": 8}', "no Megatron-LM training command found"),
    ("for n in 1 2; do echo $n; done\ntorchrun x.py --num-layers 2", "line 1: 'for' is not read"),
    ('echo "unclosed', "a double quote is not closed"),
])
def test_a_file_that_is_not_a_launch_script_is_refused(tmp_path, text, words):
    path = write_args(tmp_path, text, "run.sh")
    with pytest.raises(InvalidValue, match=words):
        from_config("megatron", path, devices=8)


def test_through_the_cli_a_refusal_is_one_line(tmp_path):
    result = ndcost("estimate", "--from", f"megatron:{DATA / 'train_llama3_8b_h100_fp8.sh'}", "--devices", "8",
                    check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "--fp8-param-gather" in result.stderr


def test_through_the_cli_the_strategy_is_reported(tmp_path):
    result = ndcost("--json", "estimate", "--from", f"megatron:{DATA / 'gpt3_175b_args.txt'}", "--devices", "512",
                    "--census", "off", "--hardware", "h200", check=False)
    assert result.returncode == 0, result.stderr
    import json

    data = json.loads(result.stdout)
    assert data["trainer"]["kind"] == "megatron" and data["trainer"]["global_batch"] == 1536
    assert Strategy.parse(data["trainer"]["strategy"]) == read("gpt3_175b_args.txt", 512).strategy
    assert "read --num-layers" in result.stderr


def test_an_evaluation_of_the_llama_variant_is_priced():
    config = read("llama3_8b_bf16_tp2_cp2.sh", 64)
    cost = nd.resolve(config.model, census="off").evaluate(config.strategy)
    assert cost.valid, cost.reason
    # By hand, one tp-2 rank's parameters: the attention and SwiGLU weights of 32 layers halved, the norms whole,
    # embedding and output layer halved (the vocabulary split over tp).
    h, ffn, vocab = 4096, 14336, 128256
    per_layer_split = (h * (h + 2 * 1024) + h * h + 3 * h * ffn) // 2
    rank = 32 * per_layer_split + (32 * 2 * h + h) + 2 * vocab * h // 2
    assert rank == 4_015_263_744
    stage = cost.stages[0].bytes_by_category
    assert stage["parameters"] == stage["gradients"] == 2 * rank  # bf16 both (--grad-reduce-in-bf16)
    # The distributed optimizer: the fp32 main copy and two fp32 Adam states split over dp * cp = 16 * 2 ranks.
    assert stage["master"] == 4 * rank // 32 and stage["optimizer_states"] == 2 * 4 * rank // 32


# --- the writer ------------------------------------------------------------------------------------------
ROUND_TRIP = [
    dict(tp=2, dp=4, vocab_parallel=True, sp=True, micro_batch=2, num_micro_batches=4, seq=4096,
         param_dtype="bf16", **MEGATRON_MIXED),
    dict(tp=4, pp=4, vpp=2, schedule="interleaved", dp=2, zero=1, vocab_parallel=True, recompute="full",
         param_dtype="bf16", grad_dtype="bf16", master_dtype="fp32", optimizer_dtype="fp32"),
    dict(cp=4, cp_algo="ulysses", dp=2, zero=1, recompute="full", recompute_layers=3, param_dtype="fp16",
         **MEGATRON_MIXED),
    dict(cp=2, cp_algo="hybrid", cp_rotate="p2p", dp=8, ep=4, etp=1, recompute="core_attention",
         param_dtype="fp32"),
    dict(cp=2, dp=4, param_dtype="fp32"),                    # --cp-comm-type allgather
    dict(cp=4, cp_rotate="p2p", dp=2, param_dtype="fp32"),   # --cp-comm-type p2p
    dict(cp_rotate="p2p", dp=2, param_dtype="fp32"),         # p2p said at cp=1 (no effect there)
    dict(tp=2, dp=2, ep=2, etp=2, vocab_parallel=True, param_dtype="fp32", optimizer="sgd", seq=8192,
         offload_optimizer=True),
    dict(param_dtype="fp32"),
    dict(tp=2, dp=4, vocab_parallel=True, sp=True, seq=4096, param_dtype="bf16", float8="tensorwise",
         float8_experts=True, **MEGATRON_MIXED),
    dict(pp=4, dp=2, pp_layers=(3, 4, 4, 2), param_dtype="fp32"),  # torchtitan's split of 13 layers
    dict(pp=3, dp=2, pp_layers=(3, 4, 5), param_dtype="fp32"),
    dict(pp=2, dp=4, pp_layers=(5, 8), param_dtype="fp32"),
    dict(pp=2, vpp=2, schedule="interleaved", dp=4, pp_layers=(2, 3, 2, 3), param_dtype="fp32"),
    dict(pp=4, dp=2, pp_layers=(3, 4, 5, 3), param_dtype="fp32"),  # uneven middle ranks: a layout
    dict(pp=3, vpp=2, schedule="interleaved", dp=2, pp_layers=(5, 6, 6, 6, 5, 4), param_dtype="fp32"),
    dict(fsdp=8, fsdp_engine="megatron", param_dtype="bf16", **MEGATRON_MIXED),  # Megatron-FSDP optim_grads_params
    dict(fsdp=4, cp=2, shard_mesh="fsdp_cp", fsdp_engine="megatron", param_dtype="bf16", **MEGATRON_MIXED),
    dict(dp=8, zero=2, param_dtype="bf16", **MEGATRON_MIXED),          # Megatron-FSDP optim_grads
]


@pytest.mark.parametrize("fields", ROUND_TRIP)
def test_written_scripts_read_back_to_the_same_strategy(tmp_path, fields):
    strategy = expected(**fields)
    path = tmp_path / "train.sh"
    path.write_text(to_config("megatron", strategy))
    back = trainer_format("megatron").read(str(path), devices=strategy.devices)
    assert back.strategy == strategy


@pytest.mark.parametrize("model, tp", [("llama-3.1-8b", 2), ("mixtral-8x7b", 1), ("qwen3-30b-a3b", 4),
                                       ("qwen3-8b", 8), ("qwen2.5-7b", 1)])
def test_written_model_flags_count_the_same_model(tmp_path, model, tp):
    strategy = expected(tp=tp, vocab_parallel=tp > 1, param_dtype="fp32")
    path = tmp_path / "train.sh"
    path.write_text(to_config("megatron", strategy, model=model))
    back = trainer_format("megatron").read(str(path), devices=tp)
    assert back.strategy == strategy
    assert parameters(load_model(back.model)).total == parameters(load_model(model)).total


@pytest.mark.parametrize("fields, named", [
    (dict(fsdp=4, dp=2, param_dtype="fp32"), "dp=2: Megatron-FSDP shards over every data-parallel rank"),
    (dict(fsdp=4, cp=2, param_dtype="fp32"), "shard_mesh=dp_cp"),
    (dict(fsdp=4, param_dtype="fp32"), "fsdp_engine=auto: Megatron-LM shards the parameters with Megatron-FSDP"),
    (dict(dp=2, zero=3), "zero=3"), (dict(tp=2), "vocab_parallel=false"),
    (dict(recompute="selective"), "recompute=selective"), (dict(), "param_dtype=bf16"),
    (dict(pp=2, schedule="gpipe", param_dtype="fp32"), "schedule=gpipe"),
    (dict(offload_params=True, param_dtype="fp32"), "offload_params=True"),
    (dict(cp=2, cp_algo="colossal", param_dtype="fp32"), "cp_algo=colossal"),
    (dict(cp=2, dp=2, zero=1, shard_mesh="dp", param_dtype="fp32"), "shard_mesh=dp"),
    (dict(compile=True, param_dtype="fp32"), "compile=True"),
    (dict(float8="rowwise", param_dtype="fp32"), "float8=rowwise"),
    (dict(float8="tensorwise", param_dtype="bf16", **MEGATRON_MIXED), "float8_experts=False"),
    (dict(pp=2, pp_engine="torch", param_dtype="fp32"), "pp_engine=torch"),
    (dict(cp=2, cp_algo="hybrid", param_dtype="fp32"), r"cp_rotate=allgather: Megatron-LM's cp_algo=hybrid is "
                                                       r"--cp-comm-type a2a\+p2p \(cp_rotate=p2p\)"),
    (dict(cp=2, cp_algo="ulysses", cp_rotate="p2p", param_dtype="fp32"), "cp_rotate=p2p: Megatron-LM's "
                                                                         "cp_algo=ulysses is --cp-comm-type a2a"),
])
def test_the_writer_refuses_what_megatron_cannot_say(fields, named):
    with pytest.raises(InvalidValue, match=f"megatron writer: {named}"):
        to_config("megatron", Strategy.from_mapping(fields))


def test_the_writer_refuses_a_model_it_cannot_write():
    with pytest.raises(InvalidValue, match="model_type 'deepseek_v3' is not written"):
        to_config("megatron", Strategy(param_dtype="fp32"), model="deepseek-v3")


# --- hostile scripts ------------------------------------------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ndcost.errors import NdcostError  # noqa: E402

PIECES = ["--tensor-model-parallel-size", "--micro-batch-size", "--num-layers", "2", "$X", "${X:-4}", "${A[@]}",
          '"${A[@]}"', "A=(", ")", "A+=(", "X=", "if", "then", "fi", "else", "[[", "]]", "[", "]", "==", "-f",
          "&&", "||", ";", "\n", "\\\n", "'", '"', "$(", "$((", "1+", "))", "`", "#", "pretrain_gpt.py", "torchrun",
          "exit", "{", "}", "(", "|", ">", "2>&1", "${", "${X:?}", "$1", "for"]


@pytest.mark.slow
@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(PIECES), max_size=40).map(" ".join))
def test_any_script_is_read_or_refused_with_an_ndcost_error(text):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train.sh"
        path.write_text(text)
        try:
            trainer_format("megatron").read(str(path), devices=8)
        except NdcostError:
            pass


def test_a_llama_shape_with_hidden_dropout_prices_transformers_layer_and_says_what_it_leaves_out(tmp_path):
    """Megatron-LM's --hidden-dropout (default 0.1) has no counterpart in Transformers' LlamaDecoderLayer.

    LlamaConfig has no hidden_dropout field and the layer builds no dropout module (checked here on the meta
    device), so the census keeps no mask: the model read carries no hidden dropout (the formulas would
    otherwise price masks the census does not) and the defaults say what is left out, 2 h bytes a token a
    layer (a 1-byte mask after the attention and after the MLP), h = 4096 here.
    """
    from _helpers import file_variant
    transformers = pytest.importorskip("transformers")
    import torch

    script = file_variant(DATA / "llama3_8b_bf16_tp2_cp2.sh", "--hidden-dropout 0.0", "--hidden-dropout 0.1",
                          tmp_path / "llama3_8b_hidden_dropout.sh")
    config = from_config("megatron", script, devices=64)
    assert "hidden_dropout" not in config.model
    assert load_model(config.model).kind("dense").hidden_dropout == 0
    assert any("--hidden-dropout 0.1 not priced" in d and "8192 bytes a token a layer" in d for d in config.defaults)
    assert "hidden_dropout" not in transformers.LlamaConfig().to_dict()
    with torch.device("meta"):
        layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(
            transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4), 0)
    assert not any(isinstance(m, torch.nn.Dropout) for m in layer.modules())
    # at 0.0, as the script states, nothing is left out
    assert not any("--hidden-dropout" in d for d in read("llama3_8b_bf16_tp2_cp2.sh", 64).defaults)


SPLIT = "--micro-batch-size 1 --num-layers 30 --hidden-size 256 --num-attention-heads 4 --bf16 "


@pytest.mark.parametrize("flags, split", [
    # megatron/core/transformer/transformer_block.py get_num_layers_to_build: first and last ranks theirs, the
    # 30 - 6 - 6 = 18 others over the 2 middle ranks (9 each)
    ("--decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 6", (6, 9, 9, 6)),
    # only the last given: 30 - 3 = 27 over the 3 others
    ("--decoder-last-pipeline-num-layers 3", (9, 9, 9, 3)),
    # and 3 virtual stages a rank: each rank's layers in thirds, chunk c of rank r the virtual stage 4 c + r
    ("--decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 6 "
     "--num-virtual-stages-per-pipeline-rank 3", (2, 3, 3, 2) * 3),
    # the embedding and the loss a layer each: 32 over 4 ranks, the first and the last chunk a layer fewer
    ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split", (7, 8, 8, 7)),
])
def test_uneven_pipeline_splits_read_as_megatron_builds_them(tmp_path, flags, split):
    path = write_args(tmp_path, SPLIT + "--pipeline-model-parallel-size 4 " + flags)
    strategy = from_config("megatron", path, devices=8, model="llama-3.1-8b").strategy
    assert strategy.pp_layers == split and sum(split) == 30 and strategy.pp == 4


@pytest.mark.parametrize("flags, field, words", [
    ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 5", "--decoder-first-pipeline-num-layers",
     "leaves 25 of the 30 layers to 3 middle stages"),
    ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 --account-for-loss-in-pipeline-split",
     "--decoder-first-pipeline-num-layers", "not take together"),
    ("--pipeline-model-parallel-size 4 --account-for-embedding-in-pipeline-split",
     "--account-for-embedding-in-pipeline-split", "(31) do not divide over 4 stages"),
    ("--decoder-last-pipeline-num-layers 6", "--decoder-last-pipeline-num-layers",
     "--pipeline-model-parallel-size is 1"),
])
def test_uneven_pipeline_splits_megatron_refuses_are_refused(tmp_path, flags, field, words):
    with pytest.raises(InvalidValue) as info:
        from_config("megatron", write_args(tmp_path, SPLIT + flags), devices=8, model="llama-3.1-8b")
    message = str(info.value)
    assert field in message and words in message


@pytest.mark.parametrize("layout, pp, vpp, split", [
    ("Et*7|t*8|t*8|t*7L", 4, 1, (7, 8, 8, 7)),
    # (t*5|)*4 unrolls first, then each t*n: 6 stages over 2 ranks, 3 virtual stages a rank, in layer order
    ("Et*4|(t*5|)*4,t*6L", 2, 3, (4, 5, 5, 5, 5, 6)),
])
def test_a_pipeline_layout_reads_as_megatron_parses_it(tmp_path, layout, pp, vpp, split):
    path = write_args(tmp_path, SPLIT + f"--pipeline-model-parallel-size {pp} --pipeline-model-parallel-layout "
                                        f"'{layout}'")
    strategy = from_config("megatron", path, devices=8, model="llama-3.1-8b").strategy
    assert (strategy.pp, strategy.vpp, strategy.pp_layers) == (pp, vpp, split)
    assert strategy.schedule == ("interleaved" if vpp > 1 else "1f1b")


@pytest.mark.parametrize("layout, words", [
    ("E|t*15|t*15|L", "a stage holds no decoder layer (0/15/15/0)"),
    ("Et*14|t*15mL", "multi-token prediction layers (m) are not read yet"),
    ("Et*14|t*15L|", "3 stages do not divide over --pipeline-model-parallel-size 2"),
    ("Et*14|t*14L", "places 28 decoder layers where --num-layers is 30"),
    ("t*15|Et*15L", "the embedding (E) first and the loss (L) last"),
    ("Et*15|x*15L", "'x' are not Megatron-LM's"),
])
def test_a_pipeline_layout_megatron_refuses_is_refused(tmp_path, layout, words):
    path = write_args(tmp_path, SPLIT + f"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout '{layout}'")
    with pytest.raises(InvalidValue) as info:
        from_config("megatron", path, devices=8, model="llama-3.1-8b")
    assert "--pipeline-model-parallel-layout" in str(info.value) and words in str(info.value)


@pytest.mark.parametrize("sharding, fields", [
    # megatron/core/distributed/fsdp: optim shards the optimizer states, optim_grads the gradients too,
    # optim_grads_params the parameters too (over dp * cp); no_shard (the default) leaves the distributed optimizer's
    ("optim_grads_params", dict(dp=1, fsdp=4, cp=2, zero=0, shard_mesh="fsdp_cp", fsdp_engine="megatron")),
    ("optim_grads", dict(dp=4, fsdp=1, cp=2, zero=2)),
    ("optim", dict(dp=4, fsdp=1, cp=2, zero=1)),
    (None, dict(dp=4, fsdp=1, cp=2, zero=1)),
])
def test_megatron_fsdp_sharding_strategies(tmp_path, sharding, fields):
    flags = " --use-megatron-fsdp" + (f" --data-parallel-sharding-strategy {sharding}" if sharding else "")
    path = write_args(tmp_path, BASE + "--context-parallel-size 2 --use-distributed-optimizer" + flags)
    strategy = from_config("megatron", path, devices=8, model="llama-3.1-8b").strategy
    assert {name: getattr(strategy, name) for name in fields} == fields


def test_transformer_engine_layers_are_read_as_the_runtime_prices_them(tmp_path):
    """--transformer-impl transformer_engine (Megatron-LM's default) is what megatron-te-cuda prices: read, not refused."""
    config = from_config("megatron", write_args(tmp_path, BASE + "--transformer-impl transformer_engine"),
                         devices=8, model="llama-3.1-8b")
    assert config.runtime == "megatron-te-cuda"
    assert any(f.startswith("--transformer-impl (a kernel or overlap choice") for f in config.ignored_fields)
