"""What activation checkpointing adds to a training step's host work, beside the plain step's host cost.

    python benchmarks/measure_checkpoint_overhead.py [--json] [--out PATH] [--device cpu|meta ...]
                                                     [--layers llama,qwen3_moe] [--repeats N] [--tiny]

A small eager model is dispatch-bound: the GPU waits on the host, which dispatches each op (Transformers'
module calls, the dispatcher, autograd's recording, the launch). ``torch.utils.checkpoint`` adds host work
of its own there, which the launch floor of ``ndcost.compose.time._launch_bound`` must price. This script
times one Transformers decoder layer (``LlamaDecoderLayer``, ``Qwen3MoeDecoderLayer`` with the grouped-mm
experts the H200 steps ran; small configs built in code, bf16, tiny tensors so no kernel's arithmetic
counts) forward, and backward, under four modes:

- ``plain``: no checkpoint;
- ``full``: ``torch.utils.checkpoint.checkpoint(layer, use_reentrant=False)``, as Transformers 5's
  ``gradient_checkpointing_enable`` (``modeling_utils.py``: ``{"use_reentrant": False}`` by default) and
  torchtitan's ``ptd_checkpoint_wrapper`` (``torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py``:
  ``CheckpointImpl.NO_REENTRANT`` by default) run it: saved-tensor hooks pack every saved tensor in the forward,
  the backward's first unpack runs the recompute in its own frame, whose pack hooks fill the holders;
- ``selective``: the same under ``create_selective_checkpoint_contexts`` with torchtitan's op-level policy
  (``checkpoint_policy/torchtitan``, the runtime profiles' ``selective_policy``): a TorchDispatchMode sees
  every op of the forward and of the recompute and calls the policy;
- ``core_attention``: only the attention function under a plain checkpoint (Megatron-LM's
  ``recompute_modules=[core_attn]``; ``ndcost.plugins.census.selective._core_attention_checkpointed``).

Each figure is the calling thread's CPU seconds (``time.thread_time``: one intra-op thread, and autograd runs
a CPU or meta backward on the thread that calls it), so a shared machine's other work is left out; the rounds
interleave the modes, and each figure is the least over the rounds after a warm-up (``--statistic median``
takes the median). Per mode: ``forward_host_ratio``, the forward's host seconds over
the plain forward's, and ``recompute_host_ratio``, what the backward takes beyond the plain backward over
the plain forward (the recompute, its hooks and the unpacks): the ratios are to the plain step's host cost
per op, the quantity that carries from this host to a GPU's (a step's ops are the same). The plain mode
gives the op counts (aten ops dispatched, views aside, as ``tests/test_backward_launches.py`` counts them;
the backward's with the gradients accumulating, a training step's), the tensors autograd saves, the seconds
an op and the backward's per-op cost over the forward's.

On ``meta`` no kernel runs, but many ops' meta functions are Python (``torch/_refs``, ``torch/_prims``)
where CUDA's are C++: a meta op costs several times a real one and the layer dispatches more of them, so the
meta ratios are diluted; ``cpu`` runs the C++ kernels on tiny tensors, the nearer to a CUDA host's dispatch
(the time model prices the CPU rows, ``ndcost.compose.time.CHECKPOINT_HOST_RATIOS``). Both are recorded.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

MODES = ("plain", "full", "selective", "core_attention")
LAYERS = ("llama", "qwen3_moe")


def _config(name: str, tiny: bool):
    import transformers
    hidden = 32 if tiny else 64
    common = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=hidden // 4, num_hidden_layers=1, vocab_size=128)
    if name == "llama":
        config = transformers.LlamaConfig(**common)
    elif name == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**common, moe_intermediate_size=hidden // 2,
                                             num_experts=4 if tiny else 8, num_experts_per_tok=2)
        config._experts_implementation = "grouped_mm"  # benchmarks/measure_cuda.py measure_model's
    else:
        raise SystemExit(f"--layers: {name!r} is not one of {', '.join(LAYERS)}")
    config._attn_implementation = "sdpa"
    return config


def _layer(name: str, device: str, seq: int, tiny: bool):
    """The layer, its input and the call running it on that input (rotary tables made once, as a model's)."""
    import torch
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    config = _config(name, tiny)
    module = modeling_llama if name == "llama" else modeling_qwen3_moe
    layer_class = module.LlamaDecoderLayer if name == "llama" else module.Qwen3MoeDecoderLayer
    rotary_class = module.LlamaRotaryEmbedding if name == "llama" else module.Qwen3MoeRotaryEmbedding
    with torch.device(device):
        layer = layer_class(config, 0).to(torch.bfloat16).train()
        hidden = torch.randn(1, seq, config.hidden_size, dtype=torch.bfloat16).requires_grad_()
        positions = torch.arange(seq)[None]
        rotary = tuple(t.to(torch.bfloat16) for t in rotary_class(config)(hidden, positions))

    def call(h):
        out = layer(h, position_embeddings=rotary, position_ids=positions)
        return out[0] if isinstance(out, tuple) else out
    return layer, hidden, call


def _modes(call: Callable) -> Dict[str, Tuple[Callable, Callable]]:
    """Each mode's (run of the layer on an input, context it runs in)."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from ndcost import manager
    from ndcost.plugins.census.selective import _core_attention_checkpointed

    policy = manager.registry().get("checkpoint_policy/torchtitan")

    def context():
        return create_selective_checkpoint_contexts(policy.op_policy())
    return {"plain": (call, contextlib.nullcontext),
            "full": (lambda h: checkpoint(call, h, use_reentrant=False), contextlib.nullcontext),
            "selective": (lambda h: checkpoint(call, h, use_reentrant=False, context_fn=context),
                          contextlib.nullcontext),
            "core_attention": (call, _core_attention_checkpointed)}


def _counts(hidden, call) -> Dict[str, int]:
    """The plain step's ops (forward, backward) and the tensors its forward saves for the backward."""
    import torch

    from ndcost.plugins.census.measure import launch_counter
    saved = [0]

    def pack(t):
        saved[0] += 1
        return t
    forward, backward = launch_counter(), launch_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), forward:
        out = call(hidden)
    with backward:
        out.backward(torch.ones_like(out))
    return {"forward_ops": forward.launches, "backward_ops": backward.launches, "saved_tensors": saved[0]}


def measure_layer(name: str, device: str, repeats: int, tiny: bool, statistic: str = "min") -> Dict[str, Any]:
    """One layer's host seconds under every mode on *device*, and the ratios to the plain step's."""
    import torch
    seq = 8 if tiny else 16
    layer, hidden, call = _layer(name, device, seq, tiny)
    modes = _modes(call)

    def step(mode: str) -> Tuple[float, float]:
        run, context = modes[mode]
        with context():
            start = time.thread_time()
            out = run(hidden)
            mid = time.thread_time()
            out.backward(torch.ones_like(out))
            end = time.thread_time()
        return mid - start, end - mid

    warm = max(2, repeats // 5)
    samples: Dict[str, List[Tuple[float, float]]] = {m: [] for m in MODES}
    for i in range(warm + repeats):
        for mode in MODES:
            timed = step(mode)
            if i >= warm:
                samples[mode].append(timed)
    layer.zero_grad(set_to_none=False)
    counts = _counts(hidden, call)
    pick = min if statistic == "min" else statistics.median
    figure = {m: (pick(s[0] for s in samples[m]), pick(s[1] for s in samples[m])) for m in MODES}
    plain_f, plain_b = figure["plain"]
    out: Dict[str, Any] = {
        "layer": name, "device": device, "seq": seq, "hidden_size": int(hidden.shape[-1]), "repeats": repeats,
        "statistic": statistic,
        **counts,
        "forward_seconds_per_op": plain_f / counts["forward_ops"],
        "backward_seconds_per_op": plain_b / counts["backward_ops"],
        "backward_to_forward_host_per_op": (plain_b / counts["backward_ops"]) / (plain_f / counts["forward_ops"]),
        "modes": {},
    }
    for mode in MODES:
        f, b = figure[mode]
        extra = f + b - plain_f - plain_b - (plain_f if mode == "full" else 0.0)  # beyond the ops it reruns
        out["modes"][mode] = {
            "forward_seconds": f, "backward_seconds": b,
            "forward_host_ratio": f / plain_f, "recompute_host_ratio": (b - plain_b) / plain_f,
            # checkpoint's own host work (full: beyond the recomputed forward's ops) in plain forward ops
            "overhead_ops": extra / out["forward_seconds_per_op"],
            "overhead_ops_per_saved_tensor": extra / out["forward_seconds_per_op"] / counts["saved_tensors"],
        }
    return out


def provenance() -> Dict[str, Any]:
    import torch
    import transformers
    return {"script": "benchmarks/measure_checkpoint_overhead.py", "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                        "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def measure(layers: Sequence[str], devices: Sequence[str], repeats: int, tiny: bool,
            statistic: str = "min") -> Dict[str, Any]:
    import torch
    torch.set_num_threads(1)  # one host thread dispatches, as a GPU step's does
    torch.manual_seed(0)
    return {"provenance": provenance(), "tiny": tiny,
            "rows": [measure_layer(name, device, repeats, tiny, statistic) for device in devices for name in layers]}


def _table(doc: Dict[str, Any]) -> str:
    lines = [f"checkpoint's host overhead (torch {doc['provenance']['torch']}, transformers "
             f"{doc['provenance']['transformers']}, {doc['provenance']['machine']['processor']})",
             f"{'layer':10} {'device':6} {'mode':15} {'fwd ms':>8} {'bwd ms':>8} {'fwd ratio':>9} {'recompute':>9} "
             f"{'ops':>7} {'per saved':>9}"]
    for row in doc["rows"]:
        for mode, m in row["modes"].items():
            lines.append(f"{row['layer']:10} {row['device']:6} {mode:15} {m['forward_seconds'] * 1e3:8.3f} "
                         f"{m['backward_seconds'] * 1e3:8.3f} {m['forward_host_ratio']:9.3f} "
                         f"{m['recompute_host_ratio']:9.3f} {m['overhead_ops']:7.1f} "
                         f"{m['overhead_ops_per_saved_tensor']:9.3f}")
        lines.append(f"{'':10} {row['device']:6} plain: {row['forward_ops']} ops forward, {row['backward_ops']} "
                     f"backward, {row['saved_tensors']} saved tensors, {row['forward_seconds_per_op'] * 1e6:.1f} us "
                     f"an op forward, backward/forward per op {row['backward_to_forward_host_per_op']:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the JSON document, not the table")
    parser.add_argument("--out", help="write the JSON document here too")
    parser.add_argument("--device", action="append", choices=("cpu", "meta"),
                        help="where the layer runs (repeatable; default cpu and meta)")
    parser.add_argument("--layers", default=",".join(LAYERS), help=f"comma-separated, of {', '.join(LAYERS)}")
    parser.add_argument("--repeats", type=int, default=60, help="timed rounds of every mode (default 60)")
    parser.add_argument("--tiny", action="store_true", help="tinier layers and 5 rounds (the test's)")
    parser.add_argument("--statistic", choices=("min", "median"), default="min",
                        help="each figure over the rounds (default min: a shared machine's load only adds)")
    args = parser.parse_args(argv)
    repeats = 5 if args.tiny else args.repeats
    if repeats < 1:
        raise SystemExit("--repeats: at least 1")
    doc = measure([n for n in args.layers.split(",") if n], args.device or ["cpu", "meta"], repeats, args.tiny,
                  args.statistic)
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text if args.json else _table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
