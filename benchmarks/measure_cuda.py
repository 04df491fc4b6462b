"""Measure what real kernels save, hold and take on a CUDA GPU, for the census to be checked against.

Run on a machine with a CUDA GPU (or, for a dry run of the logic, on the CPU:
memory peaks and times are then left out):

    python benchmarks/measure_cuda.py --out measurements.json [--only llama3_8b,qwen3_8b] [--seq 4096]

For each case it builds Transformers' own module from a config written in
code (nothing downloaded) with the attention implementation Transformers
picks on CUDA, and records:

- layer cases: the tensors autograd saves during one forward
  (``saved_tensors_hooks``; unique storages by data pointer and size;
  parameters excluded; the layer's input included), every saved tensor's
  shape and dtype, the bytes still held after the forward, the backward's
  peak over the memory allocated before the forward (parameter gradients
  included, and reported apart), and forward / forward+backward milliseconds;
- model cases: a whole causal-LM training step at micro-batch 1 with a fused
  AdamW whose states are in the parameters' dtype, ``max_memory_allocated``
  during a steady-state step (setups (a) and (b) of tests/test_resolver.py).

- ``cuda_context``: the device memory the process holds outside PyTorch's caching
  allocator (``Hardware.cuda_context_bytes``): the process's own device memory
  (NVML's per-process figure where ``pynvml`` is installed, else the device's
  ``total - free`` from ``torch.cuda.mem_get_info``, which counts other
  processes' too) less ``torch.cuda.memory_reserved``, after ``torch.cuda.init()``
  and again after a first bf16 matmul, SDPA forward and backward and
  cross-entropy (the kernels a training step loads lazily). cuBLAS's workspace
  is the allocator's (``getCurrentCUDABlasHandle`` takes it through
  ``c10::cuda::CUDACachingAllocator``), so it shows in ``memory_reserved`` and
  not here. It runs first, before any other case touches the device.

What it leaves out: allocator fragmentation (allocated, not reserved, bytes
are reported; an allocated figure still counts a cached block the allocator
hands out whole, up to 1 MiB over its tensor, so selective cases report the
requested bytes too), NCCL's buffers (no process group is made), and the kernels of
cases other than ``cuda_context``'s few in its context figure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any, Callable, Dict, List

import torch


# ---------------------------------------------------------------------------
# configs, written in code from the published hyperparameters
# ---------------------------------------------------------------------------
def _cfg(model_type: str, **kw):
    from transformers import AutoConfig
    return AutoConfig.for_model(model_type, **kw)


def llama3_8b(**over):
    return _cfg("llama", **{**dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=128, vocab_size=128256, num_hidden_layers=1,
                                   rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=8192), **over})


def qwen3_8b(**over):
    return _cfg("qwen3", **{**dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=128, vocab_size=151936, num_hidden_layers=1,
                                   max_position_embeddings=40960), **over})


def qwen3_30b_a3b(**over):
    return _cfg("qwen3_moe", **{**dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                       num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                       num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                                       decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
                                       num_hidden_layers=1), **over})


def mixtral_8x7b(**over):
    return _cfg("mixtral", **{**dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                     num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                                     vocab_size=32000, num_hidden_layers=1), **over})


def gpt_oss_20b(**over):
    return _cfg("gpt_oss", **{**dict(hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                                     num_key_value_heads=8, head_dim=64, num_local_experts=32,
                                     num_experts_per_tok=4, vocab_size=201088, num_hidden_layers=2,
                                     sliding_window=128, layer_types=["sliding_attention", "full_attention"]),
                               **over})


def qwen3_next_80b(**over):
    return _cfg("qwen3_next", **{**dict(hidden_size=2048, intermediate_size=5120, moe_intermediate_size=512,
                                        shared_expert_intermediate_size=512, num_attention_heads=16,
                                        num_key_value_heads=2, head_dim=256, num_experts=512,
                                        num_experts_per_tok=10, linear_num_key_heads=16,
                                        linear_num_value_heads=32, linear_key_head_dim=128,
                                        linear_value_head_dim=128, linear_conv_kernel_dim=4,
                                        vocab_size=151936, num_hidden_layers=4, full_attention_interval=4,
                                        decoder_sparse_step=1, mlp_only_layers=[]), **over})


def deepseek_v3(**over):
    return _cfg("deepseek_v3", **{**dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                                         num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
                                         kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                         v_head_dim=128, n_routed_experts=256, n_shared_experts=1,
                                         num_experts_per_tok=8, first_k_dense_replace=1, n_group=8,
                                         topk_group=4, vocab_size=129280, num_hidden_layers=2), **over})


def gpt2_medium(**over):
    return _cfg("gpt2", **{**dict(n_embd=1024, n_layer=1, n_head=16, n_positions=4096, vocab_size=50257), **over})


# (name, config factory, layer index, seq)
LAYER_CASES = [
    ("llama3_8b", llama3_8b, 0),
    ("qwen3_8b", qwen3_8b, 0),
    ("qwen3_30b_a3b_moe", qwen3_30b_a3b, 0),
    ("mixtral_8x7b_moe", mixtral_8x7b, 0),
    ("gpt_oss_20b_sliding", gpt_oss_20b, 0),
    ("gpt_oss_20b_full", gpt_oss_20b, 1),
    ("qwen3_next_linear", qwen3_next_80b, 0),
    ("qwen3_next_full", qwen3_next_80b, 3),
    ("deepseek_v3_dense", deepseek_v3, 0),
    ("deepseek_v3_moe", deepseek_v3, 1),
    ("gpt2_medium", gpt2_medium, 0),
    # one tensor-parallel rank of two: heads, KV heads and widths halved
    ("llama3_8b_tp2", lambda **o: llama3_8b(num_attention_heads=16, num_key_value_heads=4,
                                            intermediate_size=7168, **o), 0),
]

# A layer whose model hands it a mask (Mistral's sliding window): SDPA then runs with attn_mask.
MASKED_CASES = [("mistral_7b_sliding1024", lambda **o: _cfg("mistral", **{**dict(
    hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    vocab_size=32000, num_hidden_layers=1, sliding_window=1024), **o}), 0, 1024)]

# Layers under torchtitan's op-level selective checkpointing policy.
SELECTIVE_CASES = [("llama3_8b_selective", llama3_8b, 0), ("qwen3_30b_a3b_moe_selective", qwen3_30b_a3b, 0),
                   ("deepseek_v3_moe_selective", deepseek_v3, 1),
                   # eager attention (GPT-OSS's sinks): the scores torchtitan's policy recomputes
                   ("gpt_oss_20b_sliding_selective", gpt_oss_20b, 0), ("gpt_oss_20b_full_selective", gpt_oss_20b, 1)]

# The output layer: final norm, LM head, Transformers' causal-LM loss (fp32 logits), full and half vocabulary.
OUTPUT_CASES = [("llama3_8b_output", llama3_8b, 128256), ("llama3_8b_output_half_vocab", llama3_8b, 64128)]

# Whole-model steps (setups (a) and (b)): small enough to run in seconds.
def small_llama(**over):
    return llama3_8b(**{**dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=16,
                               num_key_value_heads=8, head_dim=128, vocab_size=32000, num_hidden_layers=4,
                               tie_word_embeddings=False), **over})


def small_qwen3_moe(**over):
    return qwen3_30b_a3b(**{**dict(num_hidden_layers=4, num_experts=32, vocab_size=32000,
                                   tie_word_embeddings=False), **over})


def small_gpt_oss(**over):
    return gpt_oss_20b(**{**dict(num_hidden_layers=4, vocab_size=32000, tie_word_embeddings=False,
                                 layer_types=["sliding_attention", "full_attention"] * 2), **over})


MODEL_CASES = [
    ("small_llama_bf16", small_llama, dict(param_dtype=torch.bfloat16, checkpointing=False)),
    ("small_llama_bf16_ckpt", small_llama, dict(param_dtype=torch.bfloat16, checkpointing=True)),
    ("small_llama_fp32_autocast", small_llama, dict(param_dtype=torch.float32, checkpointing=False)),
    ("small_qwen3_moe_bf16", small_qwen3_moe, dict(param_dtype=torch.bfloat16, checkpointing=False)),
    ("small_qwen3_moe_bf16_ckpt", small_qwen3_moe, dict(param_dtype=torch.bfloat16, checkpointing=True)),
    ("small_gpt_oss_bf16", small_gpt_oss, dict(param_dtype=torch.bfloat16, checkpointing=False)),
    ("small_gpt_oss_bf16_ckpt", small_gpt_oss, dict(param_dtype=torch.bfloat16, checkpointing=True)),
]


# ---------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------
def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time_ms(fn: Callable[[], Any], repeat: int = 5) -> float:
    if not torch.cuda.is_available():
        return float("nan")
    for _ in range(2):
        fn()
    _sync()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    _sync()
    return start.elapsed_time(end) / repeat


def _attn_implementation(config) -> str:
    """What Transformers picks on CUDA without optional kernels: SDPA where the model supports it, else eager."""
    from transformers import AutoModelForCausalLM
    cls = AutoModelForCausalLM._model_mapping[type(config)]
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"


def _build_layer(config, index: int, dtype):
    import importlib
    from transformers import AutoModelForCausalLM
    config._attn_implementation = _attn_implementation(config)
    config._experts_implementation = "grouped_mm"
    model_cls = AutoModelForCausalLM._model_mapping[type(config)]
    modeling = importlib.import_module(model_cls.__module__)
    layers = [c for n, c in vars(modeling).items() if isinstance(c, type) and n.endswith("DecoderLayer")]
    layer_cls = layers[0] if layers else modeling.GPT2Block
    rotary_cls = [c for n, c in vars(modeling).items() if isinstance(c, type) and n.endswith("RotaryEmbedding")
                  and "Vision" not in n]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with _device():
            layer = layer_cls(config, index)
            rotary = rotary_cls[0](config=config) if rotary_cls else None
    finally:
        torch.set_default_dtype(previous)
    layer.train()
    return layer, rotary


def sliding_mask(seq: int, window: int, device) -> torch.Tensor:
    """The boolean [1, 1, s, s] mask Transformers' SDPA path builds for a sliding window (True attends)."""
    i = torch.arange(seq, device=device)
    keep = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window)
    return keep[None, None]


def _layer_call(layer, rotary, hidden, seq, mask=None):
    import inspect
    position_ids = torch.arange(seq, device=hidden.device).unsqueeze(0)
    kwargs = {}
    accepted = inspect.signature(layer.forward).parameters
    if rotary is not None and "position_embeddings" in accepted:
        with torch.no_grad():
            kwargs["position_embeddings"] = rotary(hidden, position_ids)
    for name, value in (("position_ids", position_ids), ("attention_mask", mask), ("use_cache", False)):
        if name in accepted:
            kwargs[name] = value

    def call():
        out = layer(hidden, **kwargs)
        return out[0] if isinstance(out, tuple) else out
    return call


def _saved_during(params, forward: Callable[[], Any]):
    """Run *forward* under saved-tensor hooks.

    Returns its output, the bytes of the unique storages it saved (by data
    pointer and size, parameters excluded), every save listed, the memory
    allocated before it, and what it left allocated; the peak counter is
    reset afterwards for the backward.
    """
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    saved: Dict[tuple, int] = {}
    listing: List[Dict[str, Any]] = []

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_ptrs:
            key = (storage.data_ptr(), storage.nbytes())
            listing.append({"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                            "storage_bytes": storage.nbytes(), "new": key not in saved})
            saved.setdefault(key, storage.nbytes())
        return t

    on_cuda = torch.cuda.is_available()
    _sync()
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if on_cuda else 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    _sync()
    after_forward = (torch.cuda.memory_allocated() - base) if on_cuda else None
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    return out, sum(saved.values()), sorted(listing, key=lambda r: -r["storage_bytes"]), base, after_forward


def measure_layer(name: str, factory, index: int, seq: int, dtype=torch.bfloat16, window=None) -> Dict[str, Any]:
    config = factory()
    layer, rotary = _build_layer(config, index, dtype)
    params = list(layer.parameters())
    hidden = torch.randn(1, seq, config.hidden_size, dtype=dtype, device=_device(), requires_grad=True)
    grad = torch.randn_like(hidden)
    mask = None if window is None else sliding_mask(seq, window, hidden.device)
    call = _layer_call(layer, rotary, hidden, seq, mask)

    out, saved_bytes, listing, base, after_forward = _saved_during(params, call)
    out.backward(grad)
    _sync()
    peak = (torch.cuda.max_memory_allocated() - base) if torch.cuda.is_available() else None
    param_grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    del out
    for p in params:
        p.grad = None
    hidden.grad = None

    def fwd():
        return call()

    def fwd_bwd():
        call().backward(grad)
        for p in params:
            p.grad = None
        hidden.grad = None

    forward_ms = _time_ms(lambda: fwd().sum())
    forward_backward_ms = _time_ms(fwd_bwd)
    return {
        "case": name, "kind_layer_index": index, "seq": seq, "model_type": config.model_type,
        "attn_implementation": config._attn_implementation,
        "config": {k: v for k, v in config.to_dict().items() if isinstance(v, (int, float, str, bool, list))},
        "params": sum(p.numel() for p in params),
        "saved_bytes": saved_bytes, "saved_bytes_per_token": saved_bytes / seq,
        "retained_after_forward_bytes": after_forward,
        "backward_peak_over_baseline_bytes": peak, "param_grad_bytes": param_grad_bytes,
        "forward_ms": forward_ms, "forward_backward_ms": forward_backward_ms,
        "saved_tensors": listing,
    }


def _torchtitan_policy():
    """torchtitan's op-level policy: save mm (every second one recomputed), SDPA kernels, reduce-scatter, max."""
    from torch.utils.checkpoint import CheckpointPolicy
    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default, aten.max.default}
    for name in ("_scaled_dot_product_cudnn_attention",):
        if hasattr(aten, name):
            save.add(getattr(aten, name).default)
    if hasattr(torch.ops, "_c10d_functional"):
        save.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)

    def context():
        from torch.utils.checkpoint import create_selective_checkpoint_contexts
        meta = {"forward_mm_count": 0, "recompute_mm_count": 0}

        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == aten.mm.default:
                meta[f"{mode}_mm_count"] += 1
            to_save = func in save and not (func == aten.mm.default and meta[f"{mode}_mm_count"] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)
    return context


def _allocated_and_requested():
    """``memory_allocated`` (the blocks handed out) and the bytes the tensors asked for; None off CUDA."""
    if not torch.cuda.is_available():
        return None, None
    return torch.cuda.memory_allocated(), torch.cuda.memory_stats().get("requested_bytes.all.current")


def measure_selective(name: str, factory, index: int, seq: int, dtype=torch.bfloat16) -> Dict[str, Any]:
    """What a layer keeps under torchtitan's selective policy: memory held after the forward, output excluded."""
    from torch.utils.checkpoint import checkpoint
    config = factory()
    layer, rotary = _build_layer(config, index, dtype)
    hidden = torch.randn(1, seq, config.hidden_size, dtype=dtype, device=_device(), requires_grad=True)
    inner = _layer_call(layer, rotary, hidden, seq)
    context = _torchtitan_policy()
    _sync()
    base, base_requested = _allocated_and_requested()
    out = checkpoint(lambda h: inner(), hidden, use_reentrant=False, context_fn=context)
    _sync()
    allocated, requested = _allocated_and_requested()
    out_bytes = out.numel() * out.element_size()
    return {"case": name, "seq": seq, "model_type": config.model_type,
            "kept_after_forward_excluding_output_and_input_bytes":
                None if allocated is None else allocated - base - out_bytes,
            # the tensors' own bytes: no 512-byte rounding, no cached block handed out whole
            "kept_requested_after_forward_excluding_output_and_input_bytes":
                None if requested is None else requested - base_requested - out_bytes,
            "input_bytes": hidden.numel() * hidden.element_size(),
            "note": "the input is allocated before the baseline: add input_bytes for 'kept, input included'"}


def measure_output(name: str, factory, vocab: int, seq: int, dtype=torch.bfloat16) -> Dict[str, Any]:
    """Final norm, LM head and ForCausalLMLoss: bytes saved (hooks, unique storages) and the backward's peak."""
    from transformers.loss.loss_utils import ForCausalLMLoss
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    config = factory()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with _device():
            norm = LlamaRMSNorm(config.hidden_size)
            head = torch.nn.Linear(config.hidden_size, vocab, bias=False)
    finally:
        torch.set_default_dtype(previous)
    params = [*norm.parameters(), *head.parameters()]
    hidden = torch.randn(1, seq, config.hidden_size, dtype=dtype, device=_device(), requires_grad=True)
    labels = torch.randint(0, vocab, (1, seq), device=_device())
    loss, saved_bytes, listing, base, after_forward = _saved_during(
        params, lambda: ForCausalLMLoss(head(norm(hidden)), labels, vocab))
    loss.backward()
    _sync()
    peak = (torch.cuda.max_memory_allocated() - base) if torch.cuda.is_available() else None
    return {"case": name, "seq": seq, "vocab_size": vocab, "hidden_size": config.hidden_size,
            "saved_bytes": saved_bytes, "retained_after_forward_bytes": after_forward,
            "backward_peak_over_baseline_bytes": peak,
            "param_grad_bytes": sum(p.grad.numel() * p.grad.element_size() for p in params),
            "saved_tensors": listing}


def _process_device_bytes() -> Dict[str, Any]:
    """This process's device memory: NVML's per-process figure, else the device's used bytes (all processes)."""
    free, total = torch.cuda.mem_get_info()
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid() and process.usedGpuMemory is not None:
                return {"bytes": int(process.usedGpuMemory), "source": "nvml, this process"}
    except Exception as exc:  # no pynvml, or a container NVML cannot see the pid in
        return {"bytes": int(total - free), "source": f"mem_get_info total - free, every process ({exc!r})"}
    return {"bytes": int(total - free), "source": "mem_get_info total - free, every process (pid not in NVML)"}


def measure_cuda_context(seq: int) -> Dict[str, Any]:
    """The device memory outside the caching allocator, bare and once a step's first kernels have loaded."""
    if not torch.cuda.is_available():
        return {"case": "cuda_context", "skipped": "no CUDA device"}
    torch.cuda.init()
    bare = _process_device_bytes()
    bare_reserved = torch.cuda.memory_reserved()
    device = _device()
    a = torch.randn(seq, 4096, device=device, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16, requires_grad=True)
    q = (a @ b).view(1, seq, 32, 128).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    logits = out.transpose(1, 2).reshape(seq, 4096)[:, :1024].float()
    torch.nn.functional.cross_entropy(logits, torch.zeros(seq, dtype=torch.long, device=device)).backward()
    _sync()
    loaded = _process_device_bytes()
    reserved = torch.cuda.memory_reserved()
    return {"case": "cuda_context", "device": torch.cuda.get_device_name(),
            "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "(unset: torch sets LAZY)"),
            "bare": {"process_bytes": bare["bytes"], "memory_reserved": bare_reserved,
                     "cuda_context_bytes": bare["bytes"] - bare_reserved, "source": bare["source"]},
            "after_first_kernels": {"process_bytes": loaded["bytes"], "memory_reserved": reserved,
                                    "cuda_context_bytes": loaded["bytes"] - reserved, "source": loaded["source"]}}


def measure_model(name: str, factory, seq: int, param_dtype, checkpointing: bool) -> Dict[str, Any]:
    from transformers import AutoModelForCausalLM
    config = factory()
    config._attn_implementation = _attn_implementation(config)
    config._experts_implementation = "grouped_mm"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(param_dtype)
    try:
        with _device():
            model = AutoModelForCausalLM.from_config(config, attn_implementation=config._attn_implementation)
    finally:
        torch.set_default_dtype(previous)
    model.to(_device(), dtype=param_dtype)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    on_cuda = torch.cuda.is_available()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=on_cuda)
    ids = torch.randint(0, config.vocab_size, (1, seq), device=_device())
    autocast = param_dtype == torch.float32

    def step():
        with torch.autocast(device_type=_device().type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # creates the optimizer states
    _sync()
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if on_cuda else None
    step()
    _sync()
    peak = torch.cuda.max_memory_allocated() if on_cuda else None
    states = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                 if torch.is_tensor(t))
    return {
        "case": name, "seq": seq, "param_dtype": str(param_dtype).replace("torch.", ""),
        "checkpointing": checkpointing, "autocast_bf16": autocast,
        "config": {k: v for k, v in config.to_dict().items() if isinstance(v, (int, float, str, bool, list))},
        "params": sum(p.numel() for p in model.parameters()),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "optimizer_state_bytes": states,
        "allocated_before_step_bytes": before, "max_allocated_during_step_bytes": peak,
        "step_ms": _time_ms(step, repeat=3),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--model-seq", type=int, default=2048)
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--small", action="store_true", help="shrink every config (a CPU dry run)")
    args = parser.parse_args(argv)
    import transformers
    only = {s for s in args.only.split(",") if s}
    results: Dict[str, Any] = {
        "software": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "how_saved_was_counted": "torch.autograd.graph.saved_tensors_hooks over one forward: unique storages "
                                 "(by data pointer and size), parameters excluded, the layer's input included",
        "how_peak_was_counted": "torch.cuda.max_memory_allocated during backward minus memory allocated before "
                                "the forward (parameters, input, output gradient); includes parameter gradients",
        "layers": [], "models": [], "errors": {},
    }
    seq = 64 if args.small else args.seq
    model_seq = 64 if args.small else args.model_seq

    def run(section: str, name: str, factory, measure: Callable[[Any], Dict[str, Any]]) -> None:
        """Measure one case into *section*; a failure is recorded and the others still run."""
        if only and name not in only:
            return
        started = time.time()
        try:
            record = measure(_shrunk(factory) if args.small and factory is not None else factory)
            results.setdefault(section, []).append(record)
            print(f"{name}: ok in {time.time() - started:.1f}s", file=sys.stderr, flush=True)
        except Exception as exc:  # one family must not cost the others
            results["errors"][name] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: FAILED {exc}", file=sys.stderr, flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    run("cuda_context", "cuda_context", None, lambda f: measure_cuda_context(seq))  # first: a fresh context
    for name, factory, index in LAYER_CASES:
        run("layers", name, factory, lambda f, n=name, i=index: measure_layer(n, f, i, seq))
    for name, factory, index, window in MASKED_CASES:
        run("layers", name, factory, lambda f, n=name, i=index, w=window:
            measure_layer(n, f, i, seq, window=16 if args.small else w))
    for name, factory, vocab in OUTPUT_CASES:
        run("outputs", name, factory, lambda f, n=name, v=vocab: measure_output(n, f, 512 if args.small else v, seq))
    for name, factory, index in SELECTIVE_CASES:
        run("selective", name, factory, lambda f, n=name, i=index: measure_selective(n, f, i, seq))
    for name, factory, opts in MODEL_CASES:
        run("models", name, factory, lambda f, n=name, o=opts: measure_model(n, f, model_seq, **o))
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


def _shrunk(factory):
    """*factory* with every width cut, for a CPU dry run of the script's logic."""
    def make(**over):
        config = factory(**over)
        for name, value in (("hidden_size", 64), ("n_embd", 64), ("intermediate_size", 128),
                            ("moe_intermediate_size", 32), ("shared_expert_intermediate_size", 32),
                            ("num_attention_heads", 4), ("n_head", 4), ("head_dim", 16), ("vocab_size", 512),
                            ("q_lora_rank", 32), ("kv_lora_rank", 16), ("qk_rope_head_dim", 8),
                            ("qk_nope_head_dim", 8), ("v_head_dim", 16), ("linear_key_head_dim", 16),
                            ("linear_value_head_dim", 16), ("linear_num_key_heads", 2),
                            ("linear_num_value_heads", 4)):
            if getattr(config, name, None):
                setattr(config, name, value)
        if getattr(config, "num_key_value_heads", None):
            config.num_key_value_heads = 2 if config.model_type != "deepseek_v3" else 4
        if config.model_type == "deepseek_v3":
            config.head_dim = config.qk_rope_head_dim
            config.n_routed_experts, config.n_group, config.topk_group = 16, 4, 2
        return config
    return make


if __name__ == "__main__":
    raise SystemExit(main())
