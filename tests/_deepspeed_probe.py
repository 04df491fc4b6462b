"""Run DeepSpeed's ZeRO optimizers on the CPU (gloo, one rank) and print what they hold, as JSON: run by
tests/test_deepspeed_zero.py in its own process (DeepSpeed picks its accelerator when imported).

``config PATH DP ...``: DeepSpeed's own reading of a config JSON (deepspeed/runtime/config.py DeepSpeedConfig, its
data-parallel world given as a model-parallel unit gives it): the batch sizes and the ZeRO fields the reader
restates, or the error it raises. ``buckets``: the bytes of the reduce buckets (``ipg_buckets``' buffers) at each point of two micro-batches and a
step, ZeRO 1-3, with and without overlap_comm. ``reuse``: the parameters ZeRO-3 keeps gathered after the forward
(the trace complete: the second step) of a small Transformers Llama at each stage3_max_reuse_distance, with and
without gradient checkpointing. ``live``: with prefetching, the parameter elements ZeRO-3 holds gathered after the
forward and in the last and the first layer's backward of a 16-layer Llama at each stage3_max_live_parameters.
``step``: the bytes an optimizer step holds above what was held before it, at its peak, ZeRO 0-3 and ZeRO-3 with
sub-groups, and under the BF16_Optimizer (ZeRO-1, bf16 with fp32 gradients).
"""
from __future__ import annotations

import json
import os
import sys

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")

import deepspeed  # noqa: E402
import torch  # noqa: E402

BUCKET_ELEMENTS = 1000


def bucket_bytes(engine) -> int:
    total = 0
    for bucket in engine.optimizer.ipg_buckets.values():
        buffers = bucket.buffer if isinstance(bucket.buffer, list) else [bucket.buffer]
        total += sum(b.numel() * b.element_size() for b in buffers if b is not None)
    return total


def run(stage: int, overlap: bool) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "bf16": {"enabled": True},
              "zero_optimization": {"stage": stage, "reduce_bucket_size": BUCKET_ELEMENTS, "overlap_comm": overlap,
                                    "contiguous_gradients": True}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    seen: dict = {"loss": [], "backward": [], "after_backward": []}
    # the first layer's weight gradient is the backward's last: every hook before it has run
    model[0].weight.register_hook(lambda grad: seen["backward"].append(bucket_bytes(engine)))
    for _ in range(2):
        loss = engine(torch.randn(2, 16, dtype=torch.bfloat16)).float().pow(2).mean()
        seen["loss"].append(bucket_bytes(engine))
        engine.backward(loss)
        seen["after_backward"].append(bucket_bytes(engine))
        engine.step()
    seen["after_step"] = bucket_bytes(engine)
    return seen


# a small Llama (tests/test_deepspeed_zero.py prices the same config)
LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=100, tie_word_embeddings=False)
# stage3_max_reuse_distance's values, without and with gradient checkpointing (tests/test_deepspeed_zero.py)
DISTANCES = {False: (0, 20000, 50000, 80000, 1_000_000_000), True: (20000, 60000, 170000, 1_000_000_000)}


def kept_after_forward(distance: int, checkpointing: bool) -> dict:
    import transformers
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    # no prefetching and no persistent small parameters: the reuse distance alone decides
    config = {"train_micro_batch_size_per_gpu": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": distance,
                                    "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    kept = {}
    for _ in range(2):  # the first step records the trace the second releases by
        logits = engine(input_ids=torch.randint(0, LLAMA["vocab_size"], (1, 16))).logits
        kept = {name: p.ds_numel for name, p in model.named_parameters() if p.ds_status == ZeroParamStatus.AVAILABLE}
        engine.backward(logits.float().pow(2).mean())
        engine.step()
    return kept


class _DataParallel:
    """DeepSpeed's model-parallel unit interface (``mpu``), which a launcher's Megatron-style groups provide: the
    data-parallel world DeepSpeedConfig divides the batch by."""

    def __init__(self, world: int):
        self.world = world

    def get_data_parallel_world_size(self) -> int:
        return self.world


def read_config(path: str, world: int) -> dict:
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        config = DeepSpeedConfig(path, mpu=_DataParallel(world))
    except Exception as exc:  # noqa: BLE001  (DeepSpeed's own refusal, said by type and message)
        return {"error": f"{type(exc).__name__}: {exc}"}
    zero = config.zero_config
    return {"train_batch_size": config.train_batch_size, "micro_batch": config.train_micro_batch_size_per_gpu,
            "accumulation": config.gradient_accumulation_steps, "stage": int(zero.stage),
            "contiguous_gradients": zero.contiguous_gradients, "reduce_bucket_size": int(zero.reduce_bucket_size),
            "overlap_comm": zero.overlap_comm, "max_reuse_distance": int(zero.max_reuse_distance),
            "prefetch_bucket_size": int(zero.prefetch_bucket_size), "max_live_parameters": int(zero.max_live_parameters),
            "sub_group_size": int(zero.sub_group_size),
            "bf16": config.bfloat16_config.enabled, "fp16": config.float16_config.enabled}


# the step's cases: (stage, bf16 with fp32 gradient accumulation, sub_group_size) on the small Llama (LLAMA)
STEPS = ((0, False, None), (1, False, None), (2, False, None), (3, False, None), (3, False, 50_000), (1, True, None))


def step_bytes(stage: int, fp32_grads: bool, sub_group) -> dict:
    """The bytes the CPU allocator holds during one optimizer step (the second) above what it held before it, at
    their peak and at its end, read from torch.profiler's memory timeline: every tensor made and freed.

    ZeRO 1-3 step a plain SGD, which steps in place (what the step holds is DeepSpeed's); ZeRO 0 the config's
    AdamW, which DeepSpeed makes its FusedAdam (built for the CPU here, as on a GPU) and wraps in its
    FP16_Optimizer, whose copies a fused optimizer decides."""
    import transformers
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).to(torch.bfloat16)
    model.train()
    zero = {"stage": stage, "reduce_bucket_size": 10 ** 6, "contiguous_gradients": True}
    if sub_group:
        zero["sub_group_size"] = sub_group
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero,
              "zero_allow_untested_optimizer": True}
    if fp32_grads:
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if stage:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=False)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    else:
        config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(2):
        logits = engine(input_ids=torch.randint(0, LLAMA["vocab_size"], (1, 16))).logits
        engine.backward(logits.float().pow(2).mean())
        if step == 0:
            engine.step()
            continue
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            engine.step()
    held = peak = 0
    for _, action, (key, _), size in prof._memory_profile().timeline:
        if key is None or key.device.type != "cpu":
            continue
        held += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
        peak = max(peak, held)
    return {"optimizer": type(engine.optimizer).__name__, "peak": peak, "end": held}


LIVE = (100_000, 300_000, 1_000_000_000)  # stage3_max_live_parameters' values (16 layers: 604,736 elements)


def gathered_with_prefetch(live: int) -> dict:
    """Also ``backward_gathered``: the parameter elements the second step's backward all-gathers again (each
    gather DeepSpeed's coordinator starts, partitioned_param_coordinator.py ``__all_gather_params_``)."""
    import transformers
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

    started = PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params_
    counted = {True: 0, False: 0}

    def counting(coordinator, params, forward, quantize=False):
        counted[forward] += sum(p.ds_numel for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE)
        return started(coordinator, params, forward, quantize)

    PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params_ = counting

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": 16}))
    model.train()
    config = {"train_micro_batch_size_per_gpu": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 10000,
                                    "stage3_max_live_parameters": live, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    params = list(model.parameters())

    def gathered() -> int:
        return sum(p.ds_numel for p in params if p.ds_status != ZeroParamStatus.NOT_AVAILABLE)

    seen: dict = {}
    for name, layer in (("last_layer", 15), ("first_layer", 0)):  # down_proj's gradient: its layer's first
        model.model.layers[layer].mlp.down_proj.weight.register_hook(
            lambda grad, name=name: seen.__setitem__(name, gathered()))
    try:
        for _ in range(2):  # the first step records the trace
            logits = engine(input_ids=torch.randint(0, LLAMA["vocab_size"], (1, 16))).logits
            seen["after_forward"] = gathered()
            counted[False] = 0
            engine.backward(logits.float().pow(2).mean())
            engine.step()
    finally:
        PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params_ = started
    seen["backward_gathered"] = counted[False]
    return seen


if __name__ == "__main__":
    deepspeed.init_distributed(dist_backend="gloo")
    if sys.argv[2] == "live":
        print(json.dumps({str(live): gathered_with_prefetch(live) for live in LIVE}))
    elif sys.argv[2] == "config":
        jobs = sys.argv[3:]
        print(json.dumps([read_config(path, int(world)) for path, world in zip(jobs[::2], jobs[1::2])]))
    elif sys.argv[2] == "step":
        print(json.dumps({",".join(map(str, case)): step_bytes(*case) for case in STEPS}))
    elif sys.argv[2] == "buckets":
        print(json.dumps({f"{stage},{int(overlap)}": run(stage, overlap)
                          for stage in (1, 2, 3) for overlap in (False, True)}))
    else:
        print(json.dumps({f"{distance},{int(checkpointing)}": kept_after_forward(distance, checkpointing)
                          for checkpointing in (False, True) for distance in DISTANCES[checkpointing]}))
