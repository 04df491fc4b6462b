"""How many single evaluations a second ``CostModel.evaluate`` makes on one core, on every shipped model.

Run: ``python benchmarks/bench_evaluate.py [--models NAME ...] [--strategies N] [--repeat R]
[--census off|auto] [--target 5000] [--profile NAME]``.

Each model in ``specs/models/`` is resolved once; a few hundred varied strategies valid on it (TP,
PP with VPP under the interleaved schedule, DP, ZeRO, FSDP, CP, SP, EP for MoE models, recompute
modes, micro-batches, two sequence lengths) are drawn from a random grid (kept where
``evaluate_many`` finds them valid) and priced one ``evaluate(strategy)`` call at a time, after one
pass over other strategies that fills the record and work caches; each of R passes prices strategies not
priced before, and the best is reported, by wall time and by this process's CPU time (the steadier figure on a shared machine). ``--census auto``
prices with the census (read from its disk cache after a first run); a model whose census had to
run in this process (torch imported while drawing the strategies) is flagged, its timing unaffected.
``--profile NAME`` prints cProfile's top functions for that model instead. Single-threaded BLAS is
forced so "one core" means one core. Exits 1 where a model's rate misses ``--target``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

MODELS_DIR = Path(__file__).resolve().parent.parent / "specs" / "models"


def shipped_models():
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


def candidates(n: int, moe: bool, seed: int = 0, seqs=(4096, 8192)) -> dict:
    """A random grid of strategies as columns (many refused on a given model; the valid ones are kept)."""
    rng = np.random.default_rng(seed)
    pp = rng.choice([1, 2, 4, 8], n)
    interleaved = (pp > 1) & (rng.random(n) < 0.3)
    fsdp = np.where(rng.random(n) < 0.25, rng.choice([2, 4, 8], n), 1)
    dp = rng.choice([1, 2, 4, 8], n)
    tp = rng.choice([1, 2, 4, 8], n)
    ep = np.where(rng.random(n) < 0.6, rng.choice([1, 2, 4, 8], n), 1) if moe else np.ones(n, dtype=np.int64)
    return {
        "tp": tp, "pp": pp, "vpp": np.where(interleaved, 2, 1),
        "schedule": np.where(interleaved, "interleaved", "1f1b"),
        "dp": dp, "zero": np.where(fsdp > 1, 0, rng.choice([0, 1, 2, 3], n)), "fsdp": fsdp,
        "cp": rng.choice([1, 2], n), "ep": ep,
        "sp": rng.random(n) < 0.5, "seq": rng.choice(list(seqs), n), "micro_batch": rng.choice([1, 2], n),
        "num_micro_batches": rng.choice([1, 4, 8, 16], n),
        "recompute": rng.choice(["none", "full", "selective", "core_attention"], n),
        "master_dtype": rng.choice(["none", "fp32"], n),
        "vocab_parallel": rng.random(n) < 0.3,
    }


def valid_strategies(model, count: int, seed: int = 0):
    """*count* strategies valid on *model* (the valid rows of a random grid, as Strategy values)."""
    import ndcost
    cols = candidates(max(20 * count, 2000), bool(model.tables.num_experts), seed)
    batch = model.evaluate_many(cols)
    rows = np.flatnonzero(batch.valid)[:count]
    out = []
    for i in rows.tolist():
        out.append(ndcost.Strategy(**{k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in cols.items()}))
    return out


def time_model(name: str, census: str, count: int, repeat: int):
    """Each pass prices *count* strategies the model has not priced before (distinct, none in the warm-up), so
    what the model keeps of one strategy's figures (by its shapes) helps another only as a searcher's would."""
    import ndcost
    torch_before = "torch" in sys.modules
    model = ndcost.resolve(name, census=census)
    drawn = list({str(s): s for s in valid_strategies(model, count * (repeat + 1))}.values())
    count = min(count, len(drawn) // (repeat + 1))
    groups = [drawn[i * count:(i + 1) * count] for i in range(repeat + 1)]
    for s in groups[0]:  # warm-up: records and work at every seq
        model.evaluate(s)
    ran_census = not torch_before and "torch" in sys.modules
    wall = cpu = float("inf")
    for strategies in groups[1:]:
        start, start_cpu = time.perf_counter(), time.process_time()
        for s in strategies:
            model.evaluate(s)
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return count, wall, cpu, ran_census


def profile(name: str, census: str, count: int) -> None:
    import cProfile
    import pstats

    import ndcost
    model = ndcost.resolve(name, census=census)
    strategies = valid_strategies(model, count)
    for s in strategies:
        model.evaluate(s)
    profiler = cProfile.Profile()
    profiler.enable()
    for s in strategies:
        model.evaluate(s)
    profiler.disable()
    pstats.Stats(profiler).sort_stats(os.environ.get("NDCOST_PROFILE_SORT", "tottime")).print_stats(int(os.environ.get("NDCOST_PROFILE_TOP", "30")))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None, help="model names (default: every shipped model)")
    parser.add_argument("--strategies", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--census", default="off", choices=("auto", "off"))
    parser.add_argument("--target", type=float, default=5000.0, help="evaluations per second to reach")
    parser.add_argument("--profile", default=None, metavar="NAME", help="cProfile one model's evaluations")
    args = parser.parse_args(argv)
    if args.profile:
        profile(args.profile, args.census, args.strategies)
        return 0
    slowest = float("inf")
    for name in args.models or shipped_models():
        n, wall, cpu, ran_census = time_model(name, args.census, args.strategies, args.repeat)
        if not n:  # every strategy refused (DeepSeek-V4's layers without a census): nothing to time
            print(f"{name}: no strategy it can price at census={args.census} (`ndcost estimate` says why)",
                  flush=True)
            continue
        rate = n / wall
        slowest = min(slowest, rate)
        note = " (census ran: records were not cached)" if ran_census else ""
        print(f"{name}: {rate:,.0f} evaluations/s ({n / cpu:,.0f}/s by CPU time; {n} strategies, "
              f"{1e6 * wall / n:,.0f} us each, census={args.census}){note}", flush=True)
    print(f"slowest: {slowest:,.0f} evaluations/s (target {args.target:,.0f})")
    return 0 if slowest >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
