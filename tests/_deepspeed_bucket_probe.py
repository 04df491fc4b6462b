"""Run DeepSpeed's ZeRO optimizers on the CPU (gloo, one rank) and print, as JSON, the bytes of their reduce
buckets (``ipg_buckets``' buffers) at each point of two micro-batches and a step: run by
tests/test_deepspeed_buckets.py in its own process (DeepSpeed picks its accelerator when imported)."""
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


if __name__ == "__main__":
    deepspeed.init_distributed(dist_backend="gloo")
    print(json.dumps({f"{stage},{int(overlap)}": run(stage, overlap)
                      for stage in (1, 2, 3) for overlap in (False, True)}))
