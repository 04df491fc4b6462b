"""benchmarks/measure_steps.py (whole steps, each in a fresh process), its mapping to ndcost's strategy in
benchmarks/validate_h200.py, benchmarks/ndcost_shim.py and benchmarks/device_run.sh, exercised on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ndcost

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import measure_steps  # noqa: E402
import validate_h200  # noqa: E402

# an autocast case (fp32 parameters) and a selective-checkpointing one under eager attention
DRY_CASES = ("small_llama_fp32_autocast", "small_gpt_oss_bf16_selective")
CUDA_FIGURES = ("allocated_before_step_bytes", "reserved_before_step_bytes", "max_allocated_during_step_bytes",
                "max_reserved_during_step_bytes", "reserved_after_step_bytes", "step_ms")


def _script(name, *args, env=None):
    done = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True, check=False,
                          env=env)
    return done


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("steps") / "steps.json"
    done = _script("measure_steps.py", "--dry-run", "--only", ",".join(DRY_CASES), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out, json.loads(out.read_text())


@pytest.mark.slow
def test_dry_run_writes_one_record_per_case_in_the_schema(dry_run):
    _, doc = dry_run
    assert doc["format"] == "ndcost-step-measurements" and doc["version"] == 1 and doc["dry_run"] is True
    assert doc["device"] == "cpu" and doc["software"]["torch"] and doc["not_run"] == []
    assert [r["case"] for r in doc["steps"]] == list(DRY_CASES)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    for r in doc["steps"]:
        assert r["status"] == "ok" and r["kind"] == "step", r
        assert all(r[k] is None for k in CUDA_FIGURES)  # nothing CUDA measures is made up on the CPU
        assert r["alloc_conf"] is None and r["micro_batch"] == 1 and r["seq"] == 64 and r["fused_adamw"] is True
        assert all(loss == loss and 0 < loss < 20 for loss in r["losses"])  # finite cross-entropy over 32k tokens
        # the recorded config is what ran: Transformers' own model of it on the meta device has its parameters
        config = dict(r["config"])
        config = AutoConfig.for_model(config.pop("model_type"), **config)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        tensors = list(model.parameters())
        assert r["params"] == sum(p.numel() for p in tensors)
        width = {"float32": 4, "bfloat16": 2}[r["param_dtype"]]
        assert r["param_bytes"] == width * r["params"]
        # fused AdamW: exp_avg and exp_avg_sq in the parameters' dtype, one fp32 step counter a tensor
        assert r["optimizer_state_bytes"] == 2 * r["param_bytes"] + 4 * len(tensors)
    autocast, selective = doc["steps"]
    assert autocast["param_dtype"] == "float32" and autocast["autocast_bf16"] and autocast["recompute"] == "none"
    assert selective["recompute"] == "selective" and "torchtitan" in selective["checkpoint"]
    assert selective["attn_implementation"] == "eager"  # GPT-OSS has no SDPA path in Transformers


@pytest.mark.slow
def test_each_steps_strategy_and_runtime_are_what_it_ran(dry_run, registry):
    """validate_h200.py's mapping, field by field against the record's facts and Transformers' own attention
    support; measure_steps.py's own strategy string agrees with it."""
    from transformers import AutoConfig, AutoModelForCausalLM
    _, doc = dry_run
    for r in doc["steps"]:
        strategy = validate_h200.step_strategy(r)
        assert strategy == ndcost.Strategy.parse(r["strategy"])
        assert strategy.seq == r["seq"] and strategy.micro_batch == 1 and strategy.optimizer == "adamw"
        assert strategy.recompute == r["recompute"]
        assert strategy.param_dtype == {"float32": "fp32", "bfloat16": "bf16"}[r["param_dtype"]]
        assert strategy.compute_dtype == ("bf16" if r["autocast_bf16"] else None)
        runtime = validate_h200.step_runtime(r)
        assert runtime == r["runtime"]
        profile = registry.get(f"runtime/{runtime}")
        config = dict(r["config"])
        cls = AutoModelForCausalLM._model_mapping[type(AutoConfig.for_model(config.pop("model_type"), **config))]
        expected = profile.attention if profile.attention != "sdpa" or cls._supports_sdpa else \
            profile.attention_fallback
        assert expected == r["attn_implementation"]


@pytest.mark.slow
def test_validate_prices_the_dry_run_steps_and_claims_no_measurement(dry_run):
    path, doc = dry_run
    done = _script("validate_h200.py", "--census", "off", "--json", "--steps", str(path), "--only", "step *")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = {r["row"]: r for r in result["rows"]}
    assert sorted(rows) == sorted(f"step {c}" for c in DRY_CASES)
    for r in doc["steps"]:
        row = rows[f"step {r['case']}"]
        assert row["strategy"] == str(validate_h200.step_strategy(r)) and row["runtime"] == r["runtime"]
        assert row["measured_seconds"] is None and row["measured_allocated_bytes"] is None
        # GPT-OSS under recompute=selective too: the formulas price torchtitan's op-level policy on its layers
        model = ndcost.resolve(r["config"], runtime=r["runtime"], census="off")
        assert row["reserved"] == "not measured" and row["measured_reserved_bytes"] is None
        assert row["predicted_peak_bytes"] == model.evaluate(ndcost.Strategy.parse(r["strategy"])).peak_bytes


@pytest.mark.slow
def test_reserved_is_set_beside_max_reserved_less_the_untracked_bytes(dry_run, tmp_path):
    """A dry-run record given H200-like figures by hand: ndcost's reserved_bytes beside max_memory_reserved less
    what was allocated before the step beyond the parameters and optimizer states."""
    _, doc = dry_run
    record = dict(doc["steps"][0])
    workspaces = 2 * 32 * 2 ** 20  # cuBLAS's, forward and backward streams
    record.update(allocated_before_step_bytes=record["param_bytes"] + record["optimizer_state_bytes"] + workspaces,
                  max_allocated_during_step_bytes=700_000_000, max_reserved_during_step_bytes=900 * 2 ** 20,
                  step_ms=12.5, alloc_conf="expandable_segments:True")
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({**doc, "steps": [record]}))
    result = validate_h200.evaluate("auto", f"step {record['case']}", [str(path)])
    (row,) = result["rows"]
    assert row["measured_reserved_bytes"] == 900 * 2 ** 20 - workspaces
    assert row["measured_allocated_bytes"] == 700_000_000 - workspaces and row["measured_seconds"] == 0.0125
    cost = ndcost.resolve(record["config"], runtime=record["runtime"], census="auto").evaluate(
        ndcost.Strategy.parse(record["strategy"]))
    assert cost.reserved_bytes is not None  # the census replays the allocator for this step
    assert row["predicted_reserved_bytes"] == cost.reserved_bytes
    assert row["reserved_error"] == pytest.approx(cost.reserved_bytes / (900 * 2 ** 20 - workspaces) - 1)
    assert result["reserved_compared"] == 1 and result["reserved_error_range"] == [row["reserved_error"]] * 2
    assert "expandable_segments:True: ndcost prices the default allocator" in row["reserved"]


def test_a_step_ndcost_cannot_price_as_run_is_refused_in_one_line(tmp_path):
    record = {"case": "odd", "kind": "step", "status": "ok", "seq": 64, "param_dtype": "float16",
              "autocast_bf16": False, "recompute": "none", "config": {"model_type": "llama"}}
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"format": "ndcost-step-measurements", "version": 1, "steps": [record]}))
    done = _script("validate_h200.py", "--census", "off", "--steps", str(path), "--only", "step *")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "step odd" in done.stderr and "'float16'" in done.stderr


def test_cases_are_named_once_and_every_model_runs_every_recompute():
    cases = measure_steps.cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    runs = {(c.model, c.recompute) for c in cases if c.param_dtype == "bf16" and c.attention == "auto"
            and c.alloc_conf is None}
    assert runs >= {(m, r) for m in measure_steps.MODELS for r in ("none", "full", "selective")}
    # the open memory gaps come first
    assert names[:4] == ["small_llama_fp32_autocast", "small_gpt_oss_bf16_ckpt", "small_gpt_oss_bf16_selective",
                         "small_deepseek_v3_bf16_selective"]
    assert sum(c.alloc_conf == "expandable_segments:True" for c in cases) >= 3


@pytest.mark.slow
def test_every_family_of_specs_models_has_a_step():
    """Each model type of specs/models/ (the text model's where the spec nests one) is built by some case."""
    import yaml
    wanted = set()
    for spec in (ROOT / "specs" / "models").glob("*.yaml"):
        config = yaml.safe_load(spec.read_text())["config"]
        wanted.add(config.get("text_config", config)["model_type"])
    configs = measure_steps.model_configs()
    assert set(configs) == set(measure_steps.MODELS)  # the cases' list of models names every factory
    built = {factory().model_type for factory in configs.values()}
    assert wanted <= built, wanted - built


def test_no_case_starts_past_the_budget(tmp_path):
    out = tmp_path / "steps.json"
    done = _script("measure_steps.py", "--dry-run", "--budget-seconds", "0", "--only", "small_llama_*",
                   "--out", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["steps"] == [] and doc["not_run"] == [c.name for c in measure_steps.cases()
                                                    if c.name.startswith("small_llama_")]
    assert "not run" in done.stderr


@pytest.mark.slow
def test_the_shim_makes_this_checkout_importable_with_its_entry_points(tmp_path):
    shim = tmp_path / "shim"
    assert _script("ndcost_shim.py", str(shim)).returncode == 0
    probe = ("import ndcost, importlib.metadata as m; from ndcost import manager; "
             "print(ndcost.__file__); print(m.distribution('ndcost')._path); "
             "print(manager.registry().get('hardware/h200').name)")
    env = {**os.environ, "PYTHONPATH": str(shim)}
    # run away from the checkout, whose ndcost.egg-info (an editable install's) would be found first on sys.path
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    module, dist, hardware = done.stdout.split()
    assert module == str(shim / "ndcost" / "__init__.py") and Path(dist).parent == shim and hardware == "h200"
    assert os.path.realpath(module) == str(ROOT / "framework" / "__init__.py")


@pytest.mark.slow
def test_device_run_dry_writes_steps_and_kernels_under_out(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "DRY_RUN": "1", "STEPS_ONLY": "small_llama_bf16",
           "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(BENCH / "device_run.sh"), "300"], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = json.loads((tmp_path / "h200_steps.json").read_text())
    assert [(r["case"], r["status"]) for r in steps["steps"]] == [("small_llama_bf16", "ok")]
    kernels = json.loads((tmp_path / "h200_kernels.json").read_text())
    assert kernels["format"] == "ndcost-kernel-measurements" and kernels["device"] == "cpu"
    log = (tmp_path / "device_run.log").read_text()
    assert "ndcost: importable" in log and "device_run: done" in log
    assert "torch" in (tmp_path / "environment.txt").read_text()
