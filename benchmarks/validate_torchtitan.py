"""ndcost beside every row of torchtitan's published performance tables (tokens/s per GPU and memory).

    python benchmarks/validate_torchtitan.py [--json] [--census off|auto]

The rows are ``benchmarks/data/torchtitan_performance.yaml``: pytorch/torchtitan's ``docs/performance.md`` (the
December 2024 edition's Tables 1 to 6 on H100, and the 2024 edition's 64-A100 Llama 3 table) and its
``benchmarks/`` of June 2025 (async TP beside vanilla TP on 256 and 64 H100s, bf16 and Float8 tensorwise and
rowwise; Llama 3.1 8B on 32 and 64 H200s); the markdown of each is stored beside it. Each row is written as a
torchtitan job TOML and read by ndcost's torchtitan reader (``ndcost.from_config("torchtitan", path,
devices=N)``), so torchtitan's semantics are the reader's: FSDP over ``dp_shard * cp`` (``shard_mesh=fsdp_cp``
where dp_shard is 1), loss parallel with TP, fp32 parameters computed in bf16. The strategy is priced by ``ndcost.resolve(model, runtime=<the reader's: torchtitan-cuda>,
hardware=h100-hbm2e-500w|a100|h200, census="off")``
(``--census auto``
measures the layers instead of the op records: slower, and different activation bytes under selective
checkpointing).

A row using Float8, torch.compile or async TP is read into the strategy's ``float8``, ``compile`` and ``async_tp``
and priced with them; beside it, the figure ndcost gives for the same job with those features removed (what
this benchmark reported before they were priced), labelled as not like-for-like. A row the reader refuses is
reported as unpriceable with the reader's reason. The Spearman rank correlation of predicted against published
tokens/s per GPU is over the priced rows (and, for comparison, over the rows using none of the features).
torchtitan compiled the loss with the blocks from 2025-04 (``components/loss.py``), not in December 2024
(``e8977b00`` turned it off): each edition's ``compile_components``, read as ``loss_engine=compiled`` where
they name the loss, and whether its pipeline schedule kept the last stage's outputs (``pp_return_outputs``).
Float8's all-gather (``enable_fsdp_float8_all_gather``) is on where the row says so (the 405B rows: torchtitan's
``train_configs/llama3_405b.toml`` of the time turns it on), else off, torchtitan's default.

SDPA's backend is the one the run's torch tried first (a source's ``sdpa_backends``: every CUDA edition's torch
predates pytorch/pytorch#162073, torch 2.9's preference for cuDNN on Hopper, so FlashAttention-2 ran), whatever a
hardware file's own torch prefers (``h200``'s measurements ran cuDNN).
Published memory is torchtitan's ``max_memory_reserved`` (the caching allocator's reserve) on the rank that logs
its metrics, the first of the last pipeline stage under PP (``_get_metrics_rank``): it is set beside that stage's
reserved bytes where ndcost claims them (a census replayed the layers' allocations), else beside its
allocated peak (``memory_basis``). The H100 rows are priced on ``h100-hbm2e-500w``, the 96 GB HBM2e part at
500 W those runs used, whose peaks are assumed (the TorchTitan paper: between the SXM's and the NVL's).
A row's ``unpriced`` says what the run did that ndcost prices otherwise (shown in the table's note).
What it leaves out: the fields the tables do not state (sequence length, selective checkpointing option,
micro-batch size) are taken from torchtitan's configs of the time (``assumed`` per row).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

import attrs

import ndcost
from ndcost.errors import InvalidStrategy, NdcostError
from ndcost.specio import load_yaml, read_text

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "torchtitan_performance.yaml")
GIB = 2 ** 30
FEATURES = ("float8", "compile", "async_tp")


def load_rows(path: str = DATA) -> Dict[str, Any]:
    """The data file: ``sources`` (commit and stored excerpt per edition) and ``rows``."""
    return load_yaml(read_text(path, "torchtitan performance rows"), path)


@functools.lru_cache(maxsize=None)
def _sources() -> Dict[str, Any]:
    return load_rows()["sources"]


def job_toml(row: Dict[str, Any], *, features: bool = True, compile_components: Sequence[str] = ("model",)) -> str:
    """The row as a torchtitan job TOML (what torchtitan compiled, its edition's ``compile_components``); with
    ``features=False`` Float8, torch.compile and async TP are off."""
    name, flavor = row["model"].split("-")
    lines = ["[model]", f'name = "{name}"', f'flavor = "{flavor}"']
    float8 = []  # the [float8] table's lines
    if features and row["float8"]:
        lines.append('converters = ["float8"]')
        if row.get("float8_recipe", "tensorwise") != "tensorwise":
            float8.append(f'recipe_name = "{row["float8_recipe"]}"')
        if row.get("float8_all_gather"):
            float8.append("enable_fsdp_float8_all_gather = true")
    if float8:
        lines += ["", "[float8]", *float8]
    lines += ["", "[training]", f"local_batch_size = {row['local_batch']}",
              f"global_batch_size = {row['global_batch']}", f"seq_len = {row['seq_len']}",
              'mixed_precision_param = "bfloat16"', 'mixed_precision_reduce = "float32"',
              "", "[parallelism]", "data_parallel_replicate_degree = 1",
              f"data_parallel_shard_degree = {row['dp_shard']}", f"tensor_parallel_degree = {row['tp']}",
              f"context_parallel_degree = {row['cp']}", f"pipeline_parallel_degree = {row['pp']}",
              f"enable_async_tensor_parallel = {'true' if features and row['async_tp'] else 'false'}"]
    if row["pp"] > 1:
        lines += [f'pipeline_parallel_schedule = "{row["pp_schedule"]}"',
                  f"pipeline_parallel_microbatch_size = {row['microbatch']}"]
    lines += ["", "[activation_checkpoint]", f'mode = "{row["ac"]}"']
    if row["ac"] == "selective":
        lines.append(f'selective_ac_option = "{row["ac_option"]}"')
    components = ", ".join(f'"{name}"' for name in compile_components)
    lines += ["", "[compile]", f"enable = {'true' if features and row['compile'] else 'false'}",
              f"components = [{components}]", ""]
    return "\n".join(lines)


def read_job(row: Dict[str, Any], *, features: bool = True) -> "ndcost.trainers.TrainerConfig":
    """The reader's view of the row's job; a refusal is raised as the reader raises it, naming ``<id>.toml``."""
    components = _sources()[row["source"]]["compile_components"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{row['id']}.toml")
        with open(path, "w", encoding="utf-8") as out:
            out.write(job_toml(row, features=features, compile_components=components))
        try:
            config = ndcost.from_config("torchtitan", path, devices=row["gpus"])
        except NdcostError as exc:
            raise type(exc)(str(exc).replace(tmp + os.sep, "")) from None
    if _sources()[row["source"]].get("pp_return_outputs") and config.strategy.pp > 1:  # the torchtitan of the time
        config = attrs.evolve(config, strategy=attrs.evolve(config.strategy, pp_return_outputs=True))
    return config


def _price(config: Any, hardware: str, census: str, sdpa_backends: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    model = ndcost.resolve(config.model, runtime=config.runtime or "hf-cuda", hardware=hardware, census=census)
    device = model.hardware
    if sdpa_backends:  # the order the run's torch tried SDPA's backends in (its source's), not the file's torch's
        device = attrs.evolve(device, kernel_tables={**(device.kernel_tables or {}),
                                                     "sdpa_backends": list(sdpa_backends)})
    try:
        cost = model.evaluate(config.strategy, hardware=device)
    except InvalidStrategy as exc:  # refused (unpriced): no figure, and why
        return {"strategy": str(config.strategy), "valid": False, "reason": str(exc).split(": ", 1)[-1],
                "fits": False, "fits_basis": None, "tokens_per_second_per_gpu": None, "peak_bytes": None,
                "reserved_bytes": None, "logged_stage": None, "memory_basis": None, "memory_gib": None,
                "mfu": None}
    time = cost.time
    # the rank whose memory torchtitan logs: the first of the last pipeline stage, where the loss is (rank 0
    # without PP; torchtitan/metrics.py _get_metrics_rank, at d4c86e3 and since for the 1F1B schedules)
    logged = cost.stages[-1]
    return {"strategy": str(config.strategy), "valid": bool(cost.valid), "reason": cost.reason,
            "fits": bool(cost.valid and cost.fits), "fits_basis": cost.fits_basis,
            "tokens_per_second_per_gpu": None if time is None else time.tokens_per_second / config.devices,
            "peak_bytes": int(cost.peak_bytes), "reserved_bytes": cost.reserved_bytes,
            "logged_stage": logged.stage,
            # torchtitan publishes max_memory_reserved: ndcost's reserved bytes where it claims them
            "memory_basis": "allocated" if logged.reserved_bytes is None else "reserved",
            "memory_gib": (logged.peak_bytes if logged.reserved_bytes is None else logged.reserved_bytes) / GIB,
            "mfu": None if time is None else time.mfu}


def _error(predicted: Optional[float], published: Optional[float]) -> Optional[float]:
    return None if predicted is None or published is None else predicted / published - 1.0


def evaluate_row(row: Dict[str, Any], census: str = "off") -> Dict[str, Any]:
    """One row: published figures, ndcost's (or why it cannot price them), each relative error."""
    out: Dict[str, Any] = {k: row[k] for k in ("id", "table", "model", "gpus", "hardware", "seq_len")}
    out["features"] = [f for f in FEATURES if row[f]]
    out["unpriced"] = list(row.get("unpriced", ()))  # what the run does that ndcost prices otherwise
    out["published"] = {"tokens_per_second_per_gpu": row["tokens_per_second_per_gpu"],
                        "memory_gib": row["memory_gib"]}
    try:
        config = read_job(row)
        out.update(comparable=True, unpriceable_reason=None)
    except NdcostError as exc:
        if not out["features"]:
            raise
        config = read_job(row, features=False)
        out.update(comparable=False, unpriceable_reason=str(exc))
    sdpa_backends = _sources()[row["source"]].get("sdpa_backends")
    predicted = _price(config, row["hardware"], census, sdpa_backends)
    # with features on a refused row, ``predicted`` is the job without them: not like-for-like
    out["predicted" if out["comparable"] else "predicted_without_features"] = predicted
    out["tokens_error"] = _error(predicted["tokens_per_second_per_gpu"], row["tokens_per_second_per_gpu"])
    out["memory_error"] = _error(predicted["memory_gib"], row["memory_gib"])
    if out["features"] and out["comparable"]:  # the figure before the features were priced
        without = _price(read_job(row, features=False), row["hardware"], census, sdpa_backends)
        out["predicted_without_features"] = without
        out["tokens_error_without_features"] = _error(without["tokens_per_second_per_gpu"],
                                                      row["tokens_per_second_per_gpu"])
    return out


def _ranks(values: Sequence[float]) -> List[float]:
    """Ranks from 1, ties given their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation: Pearson's correlation of the ranks (None below 2 points or with no spread)."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / (sxx * syy) ** 0.5


def summary(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    comparable = [r for r in results if r["comparable"] and r["tokens_error"] is not None]
    plain = [r for r in comparable if not r["features"]]
    memory = [r["memory_error"] for r in comparable if r["memory_error"] is not None]

    def rho(rows):
        return spearman([r["predicted"]["tokens_per_second_per_gpu"] for r in rows],
                        [r["published"]["tokens_per_second_per_gpu"] for r in rows])
    return {"rows": len(results), "comparable_rows": len(comparable),
            "unpriceable_rows": sum(not r["comparable"] for r in results),
            "refused_rows": sum(r["comparable"] and r["tokens_error"] is None for r in results),
            "spearman_tokens_per_second_comparable": rho(comparable),
            "spearman_tokens_per_second_without_features": rho(plain),
            "tokens_error_comparable": [r["tokens_error"] for r in comparable],
            "memory_error_comparable": memory}


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:+.0%}"


def _num(x: Optional[float], fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(results: List[Dict[str, Any]], summ: Dict[str, Any]) -> str:
    """A markdown table: one line a row; predictions without the unpriced features in brackets."""
    lines = ["| row | model | GPUs | hw | seq | TPS/GPU published | TPS/GPU ndcost | error | error without the "
             "features | memory GiB published | memory GiB ndcost | error | note |", "|" + "---|" * 13]
    for r in results:
        p = r.get("predicted") or r["predicted_without_features"]
        wrap = (lambda s: s) if r["comparable"] else (lambda s: f"({s})")
        note = "; ".join(r["unpriced"]) if r["comparable"] else "not priced: " + " + ".join(r["features"]) + \
            "; (figures) without them, not like-for-like"
        before = _pct(r.get("tokens_error_without_features")) if r["features"] and r["comparable"] else "-"
        if not p["fits"]:
            refused = "refuses: " + ": ".join(str(p["reason"]).split(": ")[:2])  # its first clauses (--json: all)
            note = (note + "; " if note else "") + "ndcost " + (refused if not p["valid"] else
                                                                 f"says it does not fit {r['hardware']}")
        lines.append(f"| {r['id']} | {r['model']} | {r['gpus']} | {r['hardware']} | {r['seq_len']} "
                     f"| {r['published']['tokens_per_second_per_gpu']:,} "
                     f"| {wrap(_num(p['tokens_per_second_per_gpu'], ',.0f'))} | {wrap(_pct(r['tokens_error']))} "
                     f"| {before} "
                     f"| {_num(r['published']['memory_gib'], '.1f')} | {wrap(_num(p['memory_gib'], '.1f'))} "
                     f"| {wrap(_pct(r['memory_error']))} | {note} |")
    rho = summ["spearman_tokens_per_second_comparable"]
    lines.append("")
    lines.append(f"{summ['comparable_rows']} priced rows of {summ['rows']} ({summ['unpriceable_rows']} use "
                 f"features ndcost does not price, {summ['refused_rows']} refused); Spearman rank correlation of TPS/GPU over the priced rows: "
                 f"{_num(rho, '.2f')} (over the rows without Float8, compile or async TP: "
                 f"{_num(summ['spearman_tokens_per_second_without_features'], '.2f')})")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    parser.add_argument("--census", choices=("off", "auto"), default="off", help="ndcost.resolve's census")
    args = parser.parse_args(argv)
    data = load_rows()
    results = [evaluate_row(row, args.census) for row in data["rows"]]
    summ = summary(results)
    if args.json:
        print(json.dumps({"sources": data["sources"], "census": args.census, "rows": results, "summary": summ},
                         indent=1))
    else:
        print(table(results, summ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
