"""Measure what the time model's efficiencies are fitted from, on one CUDA GPU (see docs/calibration.md).

    python benchmarks/bench_time.py --out h200_time.json [--cases llama3_8b,qwen3_8b] [--seqs 1024,2048,4096,8192]
    ndcost calibrate h200_time.json --hardware h200
    python benchmarks/bench_time.py --speed 1000000 --out speed.json   # the time model's own speed, on the CPU

Writes ``{"hardware", "device", "software", "measurements": [...], "components": [...]}``:

- ``measurements``: Transformers' own decoder layers (built as
  ``benchmarks/measure_cuda.py`` builds them, attention as Transformers picks
  on CUDA) at micro-batch 1, forward and forward plus backward milliseconds,
  each with its config, so ``ndcost calibrate`` prices the same layer;
- ``components``: the op classes measured alone, which pin their
  efficiencies before the layers fit the rest: the layer's matmuls as plain
  bf16 GEMMs (forward ``x W^T``; backward the input and weight gradients) and
  causal scaled-dot-product attention (forward; backward), with their FLOPs
  counted as the time model counts them (2 m n k a GEMM; ``4 H d`` a causal
  pair forward, twice that backward).

Times are CUDA-event means over repeated runs after warm-up. Nothing is
downloaded; configs are written in code.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any, Dict, List

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_cuda as mc  # noqa: E402  (the census benchmark's layer builders)


def _time_ms(fn, repeat: int = 10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


def layer_times(name: str, factory, index: int, seq: int) -> Dict[str, Any]:
    config = factory()
    layer, rotary = mc._build_layer(config, index, torch.bfloat16)
    hidden = torch.randn(1, seq, config.hidden_size, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    grad = torch.randn_like(hidden)
    call = mc._layer_call(layer, rotary, hidden, seq)
    params = list(layer.parameters())

    def fwd_bwd():
        call().backward(grad)
        for p in params:
            p.grad = None
        hidden.grad = None

    with torch.no_grad():
        forward = _time_ms(call)
    # the forward of a training step records the graph: time it with grad enabled as the step runs it
    forward_grad = _time_ms(lambda: call())
    both = _time_ms(fwd_bwd)
    out = {"case": f"{name}@{seq}", "config": {k: v for k, v in config.to_dict().items()
                                               if isinstance(v, (int, float, str, bool, list))},
           "kind_layer_index": index, "seq": seq, "micro_batch": 1, "dtype": "bf16",
           "attn_implementation": config._attn_implementation,
           "forward_ms": forward_grad, "forward_no_grad_ms": forward, "forward_backward_ms": both}
    return out


def gemm_components(tokens: int, shapes) -> List[Dict[str, Any]]:
    """The layer's projections as plain GEMMs: forward, and backward (input and weight gradients)."""
    fwd_flops = bwd_flops = 0.0
    fwd_ms = bwd_ms = 0.0
    for k, n in shapes:
        x = torch.randn(tokens, k, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
        dy = torch.randn(tokens, n, dtype=torch.bfloat16, device="cuda")
        fwd_ms += _time_ms(lambda: x @ w.t())
        bwd_ms += _time_ms(lambda: (dy @ w, dy.t() @ x))
        fwd_flops += 2.0 * tokens * k * n
        bwd_flops += 4.0 * tokens * k * n
    return [{"op_class": "matmul", "flops": fwd_flops, "seconds": fwd_ms / 1e3,
             "what": f"{len(shapes)} bf16 GEMMs x W^T at {tokens} tokens: {shapes}"},
            {"op_class": "matmul_backward", "flops": bwd_flops, "seconds": bwd_ms / 1e3,
             "what": "their input and weight gradients (dy W, dy^T x)"}]


def attention_components(seq: int, heads: int, kv_heads: int, head_dim: int) -> List[Dict[str, Any]]:
    """Causal SDPA alone (Transformers' sdpa path on CUDA): forward, and its backward."""
    import torch.nn.functional as F
    q = torch.randn(1, heads, seq, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(1, kv_heads, seq, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(1, kv_heads, seq, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    gqa = heads != kv_heads
    with torch.no_grad():
        fwd = _time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    grad = torch.randn_like(out)

    def both():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        o.backward(grad)
        q.grad = k.grad = v.grad = None

    total = _time_ms(both)
    flops = 4.0 * heads * head_dim * seq * (seq + 1) / 2
    return [{"op_class": "attention", "flops": flops, "seconds": fwd / 1e3,
             "what": f"causal SDPA, {heads} heads ({kv_heads} KV) x {head_dim}, {seq} tokens"},
            {"op_class": "attention_backward", "flops": 2 * flops, "seconds": (total - fwd) / 1e3,
             "what": "its backward (forward + backward less forward)"}]


CASES = {
    "llama3_8b": (mc.llama3_8b, 0),
    "qwen3_8b": (mc.qwen3_8b, 0),
    "gpt2_medium": (mc.gpt2_medium, 0),
    "qwen3_30b_a3b_moe": (mc.qwen3_30b_a3b, 0),
    "deepseek_v3_dense": (mc.deepseek_v3, 0),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default="llama3_8b,qwen3_8b,gpt2_medium")
    parser.add_argument("--seqs", default="1024,2048,4096,8192", help="sequence lengths of the first case")
    parser.add_argument("--seq", type=int, default=4096, help="sequence length of the other cases")
    parser.add_argument("--speed", type=int, default=0, metavar="N",
                        help="instead: time ndcost's time model on N random strategies (CPU; no GPU needed)")
    args = parser.parse_args(argv)
    if args.speed:
        return speed(args.speed, args.out)
    if not torch.cuda.is_available():
        print("bench_time.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import transformers
    result: Dict[str, Any] = {
        "hardware": mc_hardware(torch.cuda.get_device_name()), "device": torch.cuda.get_device_name(),
        "software": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "measurements": [], "components": [], "errors": {},
    }
    cases = [c for c in args.cases.split(",") if c]
    for n, case in enumerate(cases):
        factory, index = CASES[case]
        seqs = [int(s) for s in args.seqs.split(",")] if n == 0 else [args.seq]
        for seq in seqs:
            try:
                result["measurements"].append(layer_times(case, factory, index, seq))
                print(f"{case}@{seq}: {result['measurements'][-1]['forward_ms']:.3f} / "
                      f"{result['measurements'][-1]['forward_backward_ms']:.3f} ms", file=sys.stderr, flush=True)
            except Exception as exc:  # one case must not cost the others
                result["errors"][f"{case}@{seq}"] = f"{type(exc).__name__}: {exc}"
                print(f"{case}@{seq}: FAILED {exc}", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
    h, inter, heads, kv, d = 4096, 14336, 32, 8, 128
    shapes = [(h, heads * d), (h, kv * d), (h, kv * d), (heads * d, h), (h, inter), (h, inter), (inter, h)]
    result["components"] += gemm_components(args.seq, shapes)
    for seq in (2048, 4096, 8192):
        result["components"] += attention_components(seq, heads, kv, d)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    for c in result["components"]:
        print(f"{c['op_class']}: {c['flops'] / c['seconds'] / 1e12:.1f} TFLOP/s ({c['what']})", file=sys.stderr)
    return 0


def speed(n: int, out: str) -> int:
    """Strategies a second the time model prices (Llama-3.1-8B, analytic FLOPs, random strategies)."""
    import time

    import numpy as np

    from ndcost import manager
    from ndcost.compose import time as time_model
    from ndcost.models import load_model

    spec = load_model(mc.llama3_8b(num_hidden_layers=32))
    from ndcost.plugins.estimators.flops import model_work
    work = model_work(spec, 4096)
    hardware = manager.registry().get("hardware/h200")
    rng = np.random.default_rng(0)
    cols = {"seq": np.full(n, 4096), "tp": rng.choice([1, 2, 4, 8], n), "dp": rng.choice([1, 2, 4, 8, 16], n),
            "pp": rng.choice([1, 2, 4, 8], n), "cp": rng.choice([1, 2], n), "sp": rng.choice([True, False], n),
            "num_micro_batches": rng.integers(1, 32, n), "zero": rng.choice([0, 1], n),
            "recompute": rng.choice(["none", "selective", "full"], n)}
    start = time.perf_counter()
    columns = time_model.strategy_columns(cols)
    middle = time.perf_counter()
    from ndcost.columns import code_plugins
    plugins = code_plugins(manager.registry(), time_model.registry_names())
    priced = time_model.step_time(work, columns, hardware, schedules=plugins.schedules,
                                  states_per_parameter=plugins.states_per_parameter)
    end = time.perf_counter()
    report = {"strategies": n, "columns_seconds": middle - start, "step_time_seconds": end - middle,
              "strategies_per_second": n / (end - start), "median_step_seconds": float(np.median(priced.step_seconds))}
    with open(out, "w") as handle:
        json.dump(report, handle, indent=1)
    print(json.dumps(report, indent=1))
    return 0


def mc_hardware(device: str) -> str:
    text = device.lower().replace(" ", "")
    for name in ("h200", "h100", "a100", "b200"):
        if name in text:
            return name
    return device


if __name__ == "__main__":
    raise SystemExit(main())
