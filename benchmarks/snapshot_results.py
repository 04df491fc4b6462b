"""A regression snapshot of what the cost model prices: write it once, check a change reproduces it.

Run: ``python benchmarks/snapshot_results.py write PATH`` then, after a change,
``python benchmarks/snapshot_results.py check PATH`` (``--models NAME ...`` for a few models).

Every model in ``specs/models/`` is resolved (census off; ``--census-models`` also with the census where its
disk cache holds it) and handed a random grid over every strategy field (``bench_evaluate.candidates`` plus the
other fields: etp, cp_algo, optimizers, dtypes, pp_layers, moe_imbalance, allocator_overhead, shard_mesh,
reshard_after_forward, offload_*, float8, float8_all_gather, compile, async_tp, recompute_layers) as one
``evaluate_many`` batch of columns; its valid rows' first 300 are priced again as a list of ``Strategy`` and one
``evaluate`` at a time, and a few refused ones through ``evaluate`` (their ``InvalidStrategy`` message). The
snapshot holds every array of each ``BatchResult`` (time included), its provenance, and each ``StrategyCost``'s
``to_dict()``. ``check`` compares: integers and strings exactly, floats to rtol 1e-12 (NaN equal to NaN). Exits
1 and names the first differences where they differ.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_evaluate import candidates, shipped_models  # noqa: E402

RTOL = 1e-12
VALID_KEPT = 300
HARDWARE = {"llama-3.1-8b": ("h200", "mi300x", "a100", "ascend-910b"), "deepseek-v3": ("h200", "b200")}


def grid(model, n: int, seed: int) -> dict:
    """*n* random strategies over every field, as columns (most rows refused; the valid ones are kept)."""
    moe = bool(model.tables.num_experts)
    cols = candidates(n, moe, seed)
    rng = np.random.default_rng(seed + 1)

    def some(p, values, default):
        return np.where(rng.random(n) < p, rng.choice(values, n), default)

    cols["schedule"] = np.where(cols["vpp"] > 1, cols["schedule"], some(0.2, ["gpipe", "dualpipev"], "1f1b"))
    cols["vpp"] = np.where(cols["schedule"] == "dualpipev", 2, cols["vpp"])  # DualPipeV: two chunks a rank
    cols["etp"] = some(0.2, [1, 2], 1) if moe else np.ones(n, dtype=np.int64)
    cols["cp_algo"] = some(0.3, ["ulysses", "colossal", "hybrid"], "ring")
    cols["optimizer"] = some(0.3, ["adam", "sgd", "adagrad"], "adamw")
    cols["param_dtype"] = some(0.3, ["fp32", "fp32", "fp16"], "bf16")  # fp32 under bf16 autocast: its own figures
    cols["grad_dtype"] = some(0.2, ["fp32", "bf16"], None).astype(object)
    cols["optimizer_dtype"] = some(0.2, ["fp32", "bf16"], None).astype(object)
    cols["compute_dtype"] = some(0.25, ["fp8", "bf16", "bf16"], None).astype(object)
    cols["moe_imbalance"] = some(0.3, [1.0, 1.25, 2.0], 1.0).astype(np.float64)
    cols["allocator_overhead"] = some(0.3, [0.0, 0.05, 0.1], 0.0).astype(np.float64)
    cols["shard_mesh"] = some(0.3, ["dp", "fsdp_cp"], "dp_cp")
    cols["reshard_after_forward"] = rng.random(n) > 0.2
    cols["offload_optimizer"] = rng.random(n) < 0.15
    cols["offload_params"] = cols["offload_optimizer"] & (rng.random(n) < 0.5)
    cols["offload_activations"] = rng.random(n) < 0.1
    cols["float8"] = some(0.2, ["tensorwise", "rowwise"], "none")
    cols["float8_all_gather"] = (cols["float8"] == "tensorwise") & (rng.random(n) < 0.5)
    cols["compile"] = rng.random(n) < 0.3
    cols["async_tp"] = cols["compile"] & cols["sp"] & (rng.random(n) < 0.5)
    layers = model.tables.num_layers
    rl = some(0.15, [0, 1, 2], -1)
    cols["recompute_layers"] = np.array([None if v < 0 else int(v) for v in rl.tolist()], dtype=object)
    splits = []
    for i in range(n):
        stages = int(cols["pp"][i] * cols["vpp"][i])
        if stages > 1 and rng.random() < 0.1 and layers > stages:
            cuts = np.sort(rng.choice(np.arange(1, layers), stages - 1, replace=False))
            splits.append(tuple(int(x) for x in np.diff(np.concatenate([[0], cuts, [layers]]))))
        else:
            splits.append(None)
    cols["pp_layers"] = splits
    return cols


def plain(value):
    """*value* as JSON-ready Python (numpy arrays as lists, mappings with string keys)."""
    if isinstance(value, np.ndarray):
        return {"__array__": str(value.dtype), "shape": list(value.shape), "data": plain(value.tolist())}
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def batch_json(result) -> dict:
    import attrs
    out = {}
    for field in attrs.fields(type(result)):
        out[field.name] = plain(getattr(result, field.name))
    return out


def snapshot_model(name: str, census: str, hardware: str, count: int, seed: int = 0) -> dict:
    import ndcost
    from ndcost.errors import InvalidStrategy
    model = ndcost.resolve(name, census=census, hardware=hardware)
    cols = grid(model, 20 * count, seed)
    batch = model.evaluate_many(cols)
    rows = np.flatnonzero(batch.valid)[:count].tolist()
    refused = np.flatnonzero(~batch.valid)[:20].tolist()

    def strategy(i):
        fields = {}
        for k, v in cols.items():
            x = v[i]
            fields[k] = x.item() if hasattr(x, "item") else x
        return ndcost.Strategy(**fields)

    strategies = [strategy(i) for i in rows]
    listed = model.evaluate_many(strategies)
    singles = [model.evaluate(s).to_dict() for s in strategies]
    errors = []
    for i in refused:
        try:
            s = strategy(i)
        except Exception as exc:  # refused by Strategy itself
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        try:
            model.evaluate(s)
            errors.append("priced")
        except InvalidStrategy as exc:
            errors.append(f"InvalidStrategy: {exc}")
    return {"valid": len(rows), "grid": batch_json(batch), "listed": batch_json(listed),
            "singles": plain(singles), "refused": errors}


def cases(models, census_models):
    for name in models:
        for hardware in HARDWARE.get(name, ("h200",)):
            yield f"{name}@{hardware}/off", (name, "off", hardware)
    for name in census_models:
        yield f"{name}@h200/auto", (name, "auto", "h200")


def compare(want, got, path, out, limit=20):
    if len(out) >= limit:
        return
    if isinstance(want, dict) and isinstance(got, dict):
        if set(want) != set(got):
            out.append(f"{path}: keys {sorted(set(want) ^ set(got))} differ")
            return
        for k in want:
            compare(want[k], got[k], f"{path}.{k}", out, limit)
    elif isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            out.append(f"{path}: length {len(want)} != {len(got)}")
            return
        for i, (a, b) in enumerate(zip(want, got)):
            compare(a, b, f"{path}[{i}]", out, limit)
    elif isinstance(want, float) and isinstance(got, float):
        if math.isnan(want) and math.isnan(got):
            return
        if not (want == got or abs(want - got) <= RTOL * max(abs(want), abs(got))):
            out.append(f"{path}: {want!r} != {got!r}")
    elif type(want) is not type(got) or want != got:
        out.append(f"{path}: {want!r} != {got!r}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("write", "check"))
    parser.add_argument("path")
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--census-models", nargs="*", default=["llama-3.1-8b"],
                        help="models also snapshotted with census=auto (read from the census's disk cache)")
    parser.add_argument("--strategies", type=int, default=VALID_KEPT)
    args = parser.parse_args(argv)
    models = args.models or shipped_models()
    census_models = [m for m in args.census_models if m in models]
    if args.action == "write":
        snap = {}
        for key, (name, census, hardware) in cases(models, census_models):
            snap[key] = snapshot_model(name, census, hardware, args.strategies)
            print(f"{key}: {snap[key]['valid']} valid strategies", flush=True)
        with gzip.open(args.path, "wt") as fh:
            json.dump(snap, fh)
        return 0
    with gzip.open(args.path, "rt") as fh:
        snap = json.load(fh)
    failed = 0
    for key, (name, census, hardware) in cases(models, census_models):
        got = json.loads(json.dumps(snapshot_model(name, census, hardware, args.strategies)))
        diffs: list = []
        compare(snap[key], got, key, diffs)
        print(f"{key}: {'same' if not diffs else 'DIFFERS'} ({got['valid']} valid)", flush=True)
        for d in diffs:
            print("   ", d[:400])
        failed += bool(diffs)
    print("snapshot reproduced" if not failed else f"{failed} case(s) differ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
