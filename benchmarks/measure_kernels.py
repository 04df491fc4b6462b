"""Measure a GPU's kernel tables: GEMM, grouped GEMM, SDPA, elementwise kernels, launch floor and dispatch.

On a machine with a CUDA GPU and ndcost installed (``pip install -e .``):

    python benchmarks/measure_kernels.py --hardware h200 --out h200_kernels.json [--quick]
    ndcost calibrate --kernels h200_kernels.json --hardware h200 --out h200-fitted.yaml

``--dry-run`` runs every step on the CPU on a tiny grid (CPU timings, ``"device": "cpu"``), so the
script is exercised end to end without a GPU; its figures describe the CPU, not a GPU.

What it records, every raw timing kept in the JSON (``--out``) beside the tables derived from them
(``tables``, in the hardware YAML's ``kernel_tables`` schema, with the peaks of ``--hardware``):

- ``gemm``: ``torch.mm`` over the (m, n, k) grid per dtype (bf16, fp16; fp8 through ``torch._scaled_mm``
  with unit scales, bf16 out, where it exists and runs); efficiency = 2 m n k / seconds / the dtype's peak;
- ``grouped_gemm``: ``torch._grouped_mm`` (where present) of experts x tokens per expert, bf16;
- ``sdpa``: ``scaled_dot_product_attention`` under each of ``sdpa_kernel``'s flash, efficient and cudnn
  backends, by sequence, heads, head_dim and causal, forward and forward plus backward (batch 1);
  its FLOPs count 4 b h s^2 d forward (half of it causal) and twice that backward; ``ndcost calibrate
  --kernels`` fits each shape's row of ``kernel_tables.attention.<backend>.bf16`` from the timings;
- ``elementwise``: a copy (``dst.copy_(src)``, 2 N bytes moved) and an add (``torch.add(a, b, out=c)``,
  3 N) of bf16 tensors swept by bytes moved; efficiency = bytes / seconds / HBM bandwidth;
- ``launch``: the GPU's floor per kernel: 1000 one-element in-place adds queued behind ``torch.cuda._sleep``
  (so the host has enqueued them all before the GPU starts them), timed back to back by CUDA events;
- ``dispatch``: the host's eager cost per op: the same adds in a loop, by wall clock, synchronized at the end.

Each timing is the median of a few samples of several calls (CUDA events on the GPU, ``perf_counter``
on the CPU) after a warm-up. What it leaves out: L2 effects between calls (inputs stay resident), clock
and power state (run on an idle GPU), and layouts other than row-major (fp8's second operand excepted,
which ``_scaled_mm`` needs column-major).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch

GRIDS: Dict[str, Dict[str, Any]] = {
    "full": {"gemm": {"m": [256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
                      "n": [1024, 2048, 4096, 8192, 16384], "k": [1024, 2048, 4096, 8192, 16384]},
             "elementwise": [4096 * 4 ** i for i in range(10)],   # 4 KiB .. 1 GiB moved
             "sdpa": {"seq": [1024, 2048, 4096, 8192], "heads": [32], "head_dim": [64, 128]},
             "grouped": {"experts": [8, 64, 128], "tokens": [128, 512, 2048], "k": [2048, 7168], "n": [1536, 4096]}},
    "quick": {"gemm": {"m": [256, 1024, 4096, 16384], "n": [1024, 4096, 16384], "k": [1024, 4096, 16384]},
              "elementwise": [65536, 1048576, 16777216, 268435456],
              "sdpa": {"seq": [2048, 8192], "heads": [32], "head_dim": [128]},
              "grouped": {"experts": [64], "tokens": [512], "k": [2048], "n": [1536]}},
    "dry": {"gemm": {"m": [16, 64], "n": [16, 64], "k": [16, 64]},
            "elementwise": [4096, 65536, 1048576],
            "sdpa": {"seq": [64], "heads": [2], "head_dim": [16]},
            "grouped": {"experts": [2], "tokens": [16], "k": [32], "n": [32]}},
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SECTIONS = ("gemm", "grouped_gemm", "sdpa", "elementwise", "launch")


class Timer:
    """Seconds a call of *fn* takes: the median of *samples* samples of several calls each, after a warm-up."""

    def __init__(self, device: torch.device, samples: int, target_seconds: float):
        self.cuda = device.type == "cuda"
        self.samples, self.target_seconds = samples, target_seconds

    def _sample(self, fn: Callable[[], Any], calls: int) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / calls
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - began) / calls

    def __call__(self, fn: Callable[[], Any]) -> Dict[str, Any]:
        self._sample(fn, 1)         # warm-up: library handles, autotuning, allocations
        once = self._sample(fn, 1)  # one call's cost, to size the samples
        calls = max(1, min(100, int(self.target_seconds / max(once, 1e-9))))
        samples = [self._sample(fn, calls) for _ in range(self.samples)]
        return {"seconds": statistics.median(samples), "samples_seconds": samples, "calls_per_sample": calls}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_gemm(device, grid, dtypes, timer, skipped) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name in dtypes:
        timings, failures = [], []
        for m in grid["m"]:
            for n in grid["n"]:
                for k in grid["k"]:
                    try:
                        timings.append({"m": m, "n": n, "k": k, **timer(_gemm_call(name, m, n, k, device))})
                    except (RuntimeError, TypeError, NotImplementedError) as exc:  # out of memory, no kernel
                        failures.append({"m": m, "n": n, "k": k, "error": _one_line(exc)})
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
        if timings:
            out[name] = {"grid": grid, "timings": timings, "failed": failures}
        else:
            skipped.append({"section": f"gemm {name}", "why": failures[0]["error"] if failures else "no shape"})
    return out


def _gemm_call(name: str, m: int, n: int, k: int, device) -> Callable[[], Any]:
    if name == "fp8":
        if not hasattr(torch, "_scaled_mm"):
            raise RuntimeError("torch._scaled_mm is not in this torch")
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
        one = torch.ones((), device=device)
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # refuse here, not timed
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a = torch.randn(m, k, device=device, dtype=DTYPES[name])
    b = torch.randn(k, n, device=device, dtype=DTYPES[name])
    c = torch.empty(m, n, device=device, dtype=DTYPES[name])
    return lambda: torch.mm(a, b, out=c)


def measure_grouped(device, grid, timer, skipped) -> List[Dict[str, Any]]:
    if not hasattr(torch, "_grouped_mm"):
        skipped.append({"section": "grouped_gemm", "why": "torch._grouped_mm is not in this torch"})
        return []
    timings = []
    for experts in grid["experts"]:
        for tokens in grid["tokens"]:
            for k in grid["k"]:
                for n in grid["n"]:
                    try:
                        x = torch.randn(experts * tokens, k, device=device, dtype=torch.bfloat16)
                        w = torch.randn(experts, n, k, device=device, dtype=torch.bfloat16).transpose(-2, -1)
                        offs = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * tokens
                        def fn(x=x, w=w, offs=offs):
                            return torch._grouped_mm(x, w, offs=offs, out_dtype=torch.bfloat16)
                        fn()
                        timings.append({"experts": experts, "tokens_per_expert": tokens, "k": k, "n": n,
                                        "flops": 2 * experts * tokens * k * n, **timer(fn)})
                    except (RuntimeError, TypeError, NotImplementedError) as exc:
                        skipped.append({"section": "grouped_gemm", "shape": [experts, tokens, k, n],
                                        "why": _one_line(exc)})
                        if device.type != "cuda":
                            return timings  # the CPU lacks it for every shape: say it once
    return timings


def measure_sdpa(device, grid, timer, skipped) -> List[Dict[str, Any]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION}
    dtype = torch.bfloat16
    timings = []
    for name, backend in backends.items():
        for seq in grid["seq"]:
            for heads in grid["heads"]:
                for head_dim in grid["head_dim"]:
                    for causal in (True, False):
                        shape = (1, heads, seq, head_dim)
                        q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
                                   for _ in range(3))
                        grad = torch.randn(shape, device=device, dtype=dtype)

                        def forward(q=q, k=k, v=v, causal=causal):
                            with torch.no_grad():
                                return sdpa(q, k, v, is_causal=causal)

                        def forward_backward(q=q, k=k, v=v, causal=causal, grad=grad):  # no accumulation
                            return torch.autograd.grad(sdpa(q, k, v, is_causal=causal), (q, k, v), grad)
                        try:
                            with sdpa_kernel(backend):
                                fwd, fwd_bwd = timer(forward), timer(forward_backward)
                        except RuntimeError as exc:  # the backend does not run these shapes here
                            skipped.append({"section": f"sdpa {name}", "shape": list(shape), "causal": causal,
                                            "why": _one_line(exc)})
                            continue
                        flops = 4 * seq * seq * heads * head_dim // (2 if causal else 1)
                        timings.append({"backend": name, "dtype": "bf16", "seq": seq, "heads": heads,
                                        "head_dim": head_dim,
                                        "causal": causal, "forward_flops": flops,
                                        "forward_seconds": fwd["seconds"], "forward_samples_seconds":
                                        fwd["samples_seconds"], "forward_backward_seconds": fwd_bwd["seconds"],
                                        "forward_backward_samples_seconds": fwd_bwd["samples_seconds"]})
    return timings


def measure_elementwise(device, sizes, timer) -> List[Dict[str, Any]]:
    timings = []
    for moved in sizes:
        for op, tensors in (("copy", 2), ("add", 3)):
            elements = max(1, moved // (2 * tensors))
            a, b, c = (torch.randn(elements, device=device, dtype=torch.bfloat16) for _ in range(3))
            fn = (lambda a=a, b=b: b.copy_(a)) if op == "copy" else (lambda a=a, b=b, c=c: torch.add(a, b, out=c))
            timings.append({"op": op, "bytes": elements * 2 * tensors, **timer(fn)})
    return timings


def measure_launch(device, samples: int, kernels: int = 1000) -> Dict[str, Any]:
    """The GPU's floor per kernel (tiny kernels queued behind a sleep, timed by events) and the host's
    dispatch per eager op (the same kernels by wall clock); on the CPU both are the loop's time per op."""
    x = torch.zeros(1, device=device)
    launch, dispatch, fed = [], [], []
    for _ in range(samples + 1):                     # the first pass warms up
        if device.type == "cuda":
            slept, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            slept.record()
            torch.cuda._sleep(200_000_000)           # ~0.1 s of GPU clock cycles: the host queues all meanwhile
            start.record()
            queued = time.perf_counter()
            for _ in range(kernels):
                x.add_(1)
            queued = time.perf_counter() - queued
            end.record()
            end.synchronize()
            launch.append(start.elapsed_time(end) * 1e-3 / kernels)
            fed.append(queued < slept.elapsed_time(start) * 1e-3)  # all queued before the GPU woke
        _sync(device)
        began = time.perf_counter()
        for _ in range(kernels):
            x.add_(1)
        _sync(device)
        dispatch.append((time.perf_counter() - began) / kernels)
    launch, dispatch, fed = launch[1:], dispatch[1:], fed[1:]
    return {"launch": {"launch_seconds": statistics.median(launch if launch else dispatch),
                       "samples_seconds": launch if launch else dispatch, "kernels": kernels,
                       "fed_back_to_back": fed if launch else None,
                       "how": "CUDA events over kernels queued behind torch.cuda._sleep" if launch
                       else "cpu: the loop's time per op (no separate device)"},
            "dispatch": {"dispatch_seconds": statistics.median(dispatch), "samples_seconds": dispatch,
                         "ops": kernels, "how": "wall clock over an eager loop, synchronized at the end"}}


def derived(doc: Dict[str, Any], hardware) -> Dict[str, Any]:
    """The kernel tables of *doc* against *hardware*'s peaks, and the efficiencies of what they have no table for."""
    from ndcost.plugins.kernel_tables import fit_kernel_tables, kernel_points_from_measurements

    fit = fit_kernel_tables(kernel_points_from_measurements(doc, "this run"), hardware)
    bf16 = hardware.peak_flops("bf16")
    sdpa = [{**{k: t[k] for k in ("backend", "seq", "heads", "head_dim", "causal")},
             "forward_efficiency": t["forward_flops"] / t["forward_seconds"] / bf16,
             "forward_backward_efficiency": 3 * t["forward_flops"] / t["forward_backward_seconds"] / bf16}
            for t in doc.get("sdpa", {}).get("timings", [])]
    grouped = [{**{k: t[k] for k in ("experts", "tokens_per_expert", "k", "n")},
                "efficiency": t["flops"] / t["seconds"] / bf16} for t in doc.get("grouped_gemm", {}).get("timings", [])]
    return {"tables": fit.tables, "sdpa_efficiency": sdpa, "grouped_gemm_efficiency": grouped}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _hardware(name: str):
    from ndcost import manager
    if name.endswith((".yaml", ".yml")):
        from ndcost.specio import load_hardware_yaml
        return load_hardware_yaml(name)
    return manager.registry().get(f"hardware/{name}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the JSON to write")
    parser.add_argument("--hardware", default="h200", help="the hardware whose peaks the efficiencies divide by "
                                                           "(a registered name or a spec YAML; default h200)")
    parser.add_argument("--quick", action="store_true", help="a small grid (the kernel_tables schema's own)")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, a tiny grid: exercises the script")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections ({', '.join(SECTIONS)})")
    parser.add_argument("--dtypes", default=None, help="GEMM dtypes (default bf16,fp16,fp8 on a GPU; fp32,bf16 dry)")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    dtypes = (args.dtypes.split(",") if args.dtypes else ["fp32", "bf16"] if args.dry_run else ["bf16", "fp16", "fp8"])
    unknown = sorted(set(dtypes) - {*DTYPES, "fp8"})
    if unknown:
        parser.error(f"unknown GEMM dtype(s) {', '.join(unknown)}; known: {', '.join([*DTYPES, 'fp8'])}")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA GPU here; pass --dry-run to exercise the script on the CPU")
    try:
        hardware = _hardware(args.hardware)
    except Exception as exc:  # ndcost's refusal (unknown hardware), or ndcost not installed
        parser.error(f"--hardware {args.hardware}: {_one_line(exc)}")
    device = torch.device("cpu" if args.dry_run else "cuda")
    grid = GRIDS["dry" if args.dry_run else "quick" if args.quick else "full"]
    timer = Timer(device, samples=3 if args.dry_run else 5, target_seconds=0.001 if args.dry_run else 0.02)
    skipped: List[Dict[str, Any]] = []
    doc: Dict[str, Any] = {
        "format": "ndcost-kernel-measurements", "version": 1, "device": device.type,
        "device_name": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "hardware": args.hardware, "hardware_name": hardware.name,
        "grid": "dry" if args.dry_run else "quick" if args.quick else "full",
        "skipped": skipped}
    torch.manual_seed(0)
    if "gemm" in sections:
        doc["gemm"] = measure_gemm(device, grid["gemm"], dtypes, timer, skipped)
    if "grouped_gemm" in sections:
        doc["grouped_gemm"] = {"timings": measure_grouped(device, grid["grouped"], timer, skipped)}
    if "sdpa" in sections:
        doc["sdpa"] = {"timings": measure_sdpa(device, grid["sdpa"], timer, skipped)}
    if "elementwise" in sections:
        doc["elementwise"] = {"bytes": grid["elementwise"],
                              "timings": measure_elementwise(device, grid["elementwise"], timer)}
    if "launch" in sections:
        doc.update(measure_launch(device, samples=3 if args.dry_run else 5, kernels=100 if args.dry_run else 1000))
    doc.update(derived(doc, hardware))
    with open(args.out, "w") as handle:
        json.dump(doc, handle, indent=1)
    print(f"wrote {args.out}: {sum(len(v['timings']) for v in doc.get('gemm', {}).values())} GEMMs, "
          f"{len(doc.get('sdpa', {}).get('timings', []))} SDPA, {len(doc.get('elementwise', {}).get('timings', []))} "
          f"elementwise timings on {doc['device_name']} ({len(skipped)} skipped)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
