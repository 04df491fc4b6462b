"""Measure whole causal-LM training steps on one CUDA GPU, allocated and reserved bytes, each case in a fresh process.

    python benchmarks/measure_steps.py --out steps.json [--only GLOB] [--budget-seconds 480] [--seq 2048] [--dry-run]

Each case is Transformers' own ``*ForCausalLM`` built from a config written in code (nothing downloaded):
``benchmarks/measure_cuda.py``'s ``small_llama``, ``small_qwen3_moe`` and ``small_gpt_oss`` (the configs of
``tests/data/h200_*.json``, so old and new figures line up), the other families from ``specs/models/``'s
published widths, all cut to 2-4 layers, vocabulary 32,000 (the output layer then does not dominate the step)
and untied embeddings. A case runs one of: no recompute; ``recompute=full`` (every decoder layer under
non-reentrant ``torch.utils.checkpoint``, through Transformers' ``gradient_checkpointing_enable``: the layer
keeps its input only, as ndcost's ``recompute=full`` means); ``recompute=selective`` (the same with
torchtitan's op-level policy as ``context_fn``, ``measure_cuda.py``'s ``_torchtitan_policy``:
``torchtitan/distributed/activation_checkpoint.py``'s ``_save_list`` and its every-second-mm rule). Parameters
are bf16, or fp32 under ``torch.autocast(bfloat16)``; attention is what Transformers picks on CUDA (SDPA where
the model supports it, else eager) or eager when asked; AdamW is fused with states in the parameters' dtype;
micro-batch 1; ``set_to_none`` gradients. The case records ndcost's ``strategy`` and ``runtime`` for it.

Every case runs in a fresh subprocess, so the caching allocator starts empty and ``max_memory_reserved`` is
that case's alone; ``PYTORCH_CUDA_ALLOC_CONF`` is removed for a case unless the case sets it (a few run with
``expandable_segments:True``), and what the child saw is recorded. In the child: two warm-up steps (the first
creates the optimizer states), then ``reset_peak_memory_stats`` and one steady-state step, as a training loop
runs it (nothing emptied): memory allocated and reserved before it, ``max_memory_allocated``,
``max_memory_reserved`` and reserved after; then the same step again after ``torch.cuda.empty_cache()``
(``measure_cuda.py``'s ``measure_model`` empties the cache first: its allocated figure is comparable);
then step milliseconds by CUDA events over three steps back to back (``measure_cuda.py``'s timing).

Cases are ordered by what they are worth (the memory gaps ndcost has open, then one step per family, then the
recompute and allocator variants); ``--budget-seconds`` stops starting cases whose expected wall time (the
median of the cases run so far) would pass the budget, and kills a case still running at it. The JSON is rewritten
after every case (a killed run keeps its finished cases). ``--dry-run`` runs every case on the CPU on tiny
widths (64 tokens): the CUDA figures are null; it exercises the script and the mapping to ndcost's strategy.

What it leaves out: NCCL and process groups (one device), torch.compile, the CUDA context (held outside the
allocator; the ``cuda_context`` case measures it as ``measure_cuda.py`` does).
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # measure_cuda.py's configs, attention pick and torchtitan policy (imported in the child)
FORMAT = "ndcost-step-measurements"
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"
SMALL_VOCAB = 32000
DEFAULT_CASE_SECONDS = 20.0   # the expected wall time of a case before any has finished
CASE_LIMIT_SECONDS = 150.0    # no single case may take longer (a hung build must not cost the budget)
WARMUP_STEPS, TIMED_STEPS = 2, 3


@dataclasses.dataclass(frozen=True)
class Case:
    """One whole step to measure: the model (a config factory's name), recompute, dtypes, attention, allocator."""

    name: str
    model: str
    recompute: str = "none"
    param_dtype: str = "bf16"          # bf16, or fp32 (then computed under bf16 autocast)
    attention: str = "auto"            # auto (Transformers' pick on CUDA), sdpa or eager
    alloc_conf: Optional[str] = None   # PYTORCH_CUDA_ALLOC_CONF for the case (None: unset)
    why: str = ""

    @property
    def kind(self) -> str:
        return "step" if self.model else "cuda_context"


# ---------------------------------------------------------------------------
# configs (torch and Transformers imported only in the child)
# ---------------------------------------------------------------------------
def _spec_config(name: str) -> Dict[str, Any]:
    """The Transformers config of ``specs/models/<name>.yaml`` (its text model where it nests one)."""
    import yaml
    with open(os.path.join(ROOT, "specs", "models", f"{name}.yaml"), encoding="utf-8") as handle:
        config = dict(yaml.safe_load(handle)["config"])
    return dict(config["text_config"]) if "text_config" in config else config


def _cut(config: Dict[str, Any], layers: int, **over) -> Any:
    """*config* with *layers* layers, the small vocabulary, untied embeddings and *over*, as a Transformers config."""
    from transformers import AutoConfig
    config = {**config, "num_hidden_layers": layers, "vocab_size": SMALL_VOCAB, "tie_word_embeddings": False,
              **over}
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:layers]
    model_type = config.pop("model_type")
    return AutoConfig.for_model(model_type, **config)


def model_configs() -> Dict[str, Callable[[], Any]]:
    """Each model a case names, as a config factory."""
    import measure_cuda as mc

    return {
        # measure_cuda.py's whole-model configs (tests/data/h200_measurements.json, h200_qwen3_moe_steps.json)
        "small_llama": mc.small_llama,
        "small_qwen3_moe": mc.small_qwen3_moe,
        "small_gpt_oss": mc.small_gpt_oss,
        # measure_cuda.py's layer configs, cut to a few layers
        "small_qwen3": lambda: mc.qwen3_8b(num_hidden_layers=4, vocab_size=SMALL_VOCAB, tie_word_embeddings=False),
        "small_mixtral": lambda: mc.mixtral_8x7b(num_hidden_layers=2, tie_word_embeddings=False),
        # 3 linear-attention layers and 1 full (full_attention_interval 4)
        "small_qwen3_next": lambda: mc.qwen3_next_80b(vocab_size=SMALL_VOCAB, tie_word_embeddings=False),
        # one dense layer and one MoE layer, 64 of the 256 routed experts (8 groups of 8; the 256 of a real
        # layer hold 23 GB of bf16 parameters, 92 GB with gradients and AdamW states)
        "small_deepseek_v3": lambda: mc.deepseek_v3(n_routed_experts=64, vocab_size=SMALL_VOCAB,
                                                    tie_word_embeddings=False),
        # the rest from specs/models/ (published widths)
        "small_qwen2": lambda: _cut(_spec_config("qwen2.5-7b"), 4),
        # a 1,024-token window under 2,048 tokens: SDPA runs with the sliding mask (measure_cuda's masked case)
        "small_mistral": lambda: _cut(_spec_config("mistral-7b-v0.1"), 4, sliding_window=1024),
        "small_glm4_moe": lambda: _cut(_spec_config("glm-4.5-air"), 2),
        "small_qwen3_5": lambda: _cut(_spec_config("qwen3.5-9b"), 4),
        "small_qwen3_5_moe": lambda: _cut(_spec_config("qwen3.5-35b-a3b"), 4),
        # DeepSeek-V2-Lite's first two layers: one dense, one MoE of its 64 experts, no query latent
        "small_deepseek_v2": lambda: _cut(_spec_config("deepseek-v2-lite"), 2),
        "small_deepseek_v32": lambda: _cut(_spec_config("deepseek-v3.2"), 2, first_k_dense_replace=1,
                                           n_routed_experts=64),
        "small_deepseek_v4": lambda: _cut(_spec_config("deepseek-v4-flash"), 2, n_routed_experts=64),
    }


MODELS = ("small_llama", "small_qwen3_moe", "small_gpt_oss", "small_qwen3", "small_mixtral", "small_qwen3_next",
          "small_deepseek_v3", "small_qwen2", "small_mistral", "small_glm4_moe", "small_qwen3_5", "small_qwen3_5_moe",
          "small_deepseek_v2", "small_deepseek_v32", "small_deepseek_v4")


_MLA = ("deepseek_v2", "deepseek_v3")  # a key and a value a query head (V3.2's model type starts like V3's)


def _shrink(config) -> Any:
    """*config* at tiny widths for a CPU dry run (the script's logic, not its figures)."""
    for name, value in (("hidden_size", 64), ("intermediate_size", 128), ("moe_intermediate_size", 32),
                        ("shared_expert_intermediate_size", 32), ("num_attention_heads", 4), ("head_dim", 16),
                        ("q_lora_rank", 32), ("kv_lora_rank", 16), ("qk_rope_head_dim", 8), ("qk_nope_head_dim", 8),
                        ("v_head_dim", 16), ("linear_key_head_dim", 16), ("linear_value_head_dim", 16),
                        ("linear_num_key_heads", 2), ("linear_num_value_heads", 4), ("index_n_heads", 2),
                        ("index_head_dim", 16), ("index_topk", 16), ("o_lora_rank", 16), ("o_groups", 2),
                        ("sliding_window", 16)):
        if getattr(config, name, None):
            setattr(config, name, value)
    if getattr(config, "num_key_value_heads", None):
        config.num_key_value_heads = 4 if config.model_type.startswith(_MLA) else min(2, config.num_key_value_heads)
    if config.model_type.startswith(_MLA):
        config.head_dim = config.qk_rope_head_dim
    for name in ("n_routed_experts", "num_experts", "num_local_experts"):  # Qwen3-MoE aliases the last two
        if getattr(config, name, None):
            setattr(config, name, 16)
    if getattr(config, "num_experts_per_tok", None):
        config.num_experts_per_tok = 2
    if getattr(config, "n_group", None) and config.n_group > 1:
        config.n_group, config.topk_group = 4, 2
    return config


# ---------------------------------------------------------------------------
# the cases, by value
# ---------------------------------------------------------------------------
def _name(model: str, recompute: str = "none", param_dtype: str = "bf16", attention: str = "auto",
          alloc_conf: Optional[str] = None) -> str:
    """measure_cuda.py's names (small_llama_bf16_ckpt, small_llama_fp32_autocast) and the new variants'."""
    name = model + ("_fp32_autocast" if param_dtype == "fp32" else "_bf16")
    name += {"none": "", "full": "_ckpt", "selective": "_selective"}[recompute]
    name += "" if attention == "auto" else f"_{attention}"
    return name + ("_expandable" if alloc_conf == EXPANDABLE else "")


def _case(model: str, why: str, **kw) -> Case:
    return Case(name=_name(model, **kw), model=model, why=why, **kw)


def cases() -> List[Case]:
    """Every case, most valuable first; the tail is every model under every recompute not listed before."""
    gap = "an open memory gap"
    first = [
        _case("small_llama", f"{gap}: fp32 parameters under bf16 autocast", param_dtype="fp32"),
        _case("small_gpt_oss", f"{gap}: GPT-OSS under full recompute (eager attention)", recompute="full"),
        _case("small_gpt_oss", f"{gap}: GPT-OSS under selective checkpointing at TP 1, eager attention's scores",
              recompute="selective"),
        _case("small_deepseek_v3", f"{gap}: DeepSeek-V3's MoE layer under the selective policy",
              recompute="selective"),
        _case("small_llama", "tests/data/h200_measurements.json's step, now with reserved bytes"),
        _case("small_qwen3_moe", "tests/data/h200_qwen3_moe_steps.json's step, now with reserved bytes"),
        _case("small_gpt_oss", "one step of the family (eager attention, sinks)"),
        _case("small_deepseek_v3", "one step of the family (MLA, one dense and one MoE layer)"),
    ]
    first += [_case(m, "one step of the family") for m in
              ("small_qwen3", "small_mixtral", "small_qwen3_next", "small_qwen2", "small_mistral", "small_glm4_moe",
               "small_qwen3_5", "small_qwen3_5_moe", "small_deepseek_v2", "small_deepseek_v32", "small_deepseek_v4")]
    first += [
        _case("small_gpt_oss", "GPT-OSS under SDPA (Transformers refuses it where the model has no SDPA path: "
              "recorded as skipped)", attention="sdpa"),
        _case("small_llama", "tests/data/h200_measurements.json's checkpointed step, with reserved", recompute="full"),
        _case("small_llama", "torchtitan's selective policy on a dense model", recompute="selective"),
        _case("small_qwen3_moe", "tests/data/h200_qwen3_moe_steps.json's checkpointed step, with reserved",
              recompute="full"),
        _case("small_qwen3_moe", "torchtitan's selective policy on an MoE", recompute="selective"),
        _case("small_deepseek_v3", "DeepSeek-V3 under full recompute", recompute="full"),
        _case("small_llama", "the allocator with expandable segments", alloc_conf=EXPANDABLE),
        _case("small_llama", "the allocator with expandable segments, full recompute", recompute="full",
              alloc_conf=EXPANDABLE),
        _case("small_qwen3_moe", "the allocator with expandable segments, an MoE", alloc_conf=EXPANDABLE),
        _case("small_gpt_oss", "the allocator with expandable segments, eager attention", alloc_conf=EXPANDABLE),
        _case("small_llama", "eager attention on a dense model (runtime hf-cuda-eager)", attention="eager"),
        _case("small_qwen3_moe", "fp32 parameters under bf16 autocast, an MoE", param_dtype="fp32"),
        _case("small_gpt_oss", "fp32 parameters under bf16 autocast, eager attention", param_dtype="fp32"),
        Case(name="cuda_context", model="", why="the device memory outside the caching allocator "
             "(measure_cuda.py's cuda_context: Hardware.cuda_context_bytes)"),
    ]
    listed = {c.name for c in first}
    rest = [_case(m, "the family under this recompute", recompute=r) for r in ("full", "selective") for m in MODELS]
    return first + [c for c in rest if c.name not in listed]


def strategy_of(case: Case, seq: int) -> str:
    """ndcost's strategy for what *case* runs: micro-batch 1, AdamW, its recompute and dtypes."""
    text = f"seq={seq},micro_batch=1,optimizer=adamw,recompute={case.recompute}"
    return text + (",param_dtype=fp32,compute_dtype=bf16" if case.param_dtype == "fp32" else ",param_dtype=bf16")


def runtime_of(case: Case) -> str:
    """ndcost's runtime profile for *case*'s attention: hf-cuda-eager when eager is asked for, else hf-cuda
    (SDPA where the model supports it, eager where it refuses SDPA: what Transformers picks)."""
    return "hf-cuda-eager" if case.attention == "eager" else "hf-cuda"


# ---------------------------------------------------------------------------
# the child: one case in this process
# ---------------------------------------------------------------------------
def _attention(config, asked: str) -> str:
    if asked != "auto":
        return asked
    from measure_cuda import _attn_implementation
    return _attn_implementation(config)


def _checkpointing(model, recompute: str) -> None:
    """Every decoder layer under non-reentrant torch.utils.checkpoint, with torchtitan's policy when selective."""
    if recompute == "none":
        return
    kwargs: Dict[str, Any] = {"use_reentrant": False, "preserve_rng_state": False}  # torchtitan's wrapper's
    if recompute == "selective":
        from measure_cuda import _torchtitan_policy
        kwargs["context_fn"] = _torchtitan_policy()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def measure_step(case: Case, seq: int, dry_run: bool) -> Dict[str, Any]:
    """One case's step (see the module docstring); CUDA figures None on the CPU."""
    import warnings

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    warnings.filterwarnings("ignore", category=FutureWarning)  # gradient_checkpointing_enable's rename
    cuda = torch.cuda.is_available() and not dry_run
    device = torch.device("cuda" if cuda else "cpu")
    config = model_configs()[case.model]()
    if dry_run:
        config = _shrink(config)
    attn = _attention(config, case.attention)
    model_cls = AutoModelForCausalLM._model_mapping[type(config)]
    can_set = getattr(model_cls, "_can_set_experts_implementation", None)  # Transformers 5.2x refuses it on dense
    experts = "grouped_mm" if can_set is None or can_set() else None
    if experts:
        config._experts_implementation = experts  # as measure_cuda.py and ndcost's hf-cuda profile run them
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[case.param_dtype]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    finally:
        torch.set_default_dtype(previous)
    model.to(device, dtype=dtype)
    model.train()
    _checkpointing(model, case.recompute)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, config.vocab_size, (1, seq), device=device)
    autocast = case.param_dtype == "fp32"
    losses: List[float] = []

    def step():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def measured(empty_cache: bool) -> Dict[str, Optional[int]]:
        sync()
        if not cuda:
            losses.append(float(step()))
            return dict.fromkeys(("allocated_before_step_bytes", "reserved_before_step_bytes",
                                  "max_allocated_during_step_bytes", "max_reserved_during_step_bytes",
                                  "reserved_after_step_bytes", "alloc_retries", "ooms"))
        if empty_cache:
            torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        losses.append(float(step()))
        stats = torch.cuda.memory_stats()
        return {"allocated_before_step_bytes": before[0], "reserved_before_step_bytes": before[1],
                "max_allocated_during_step_bytes": torch.cuda.max_memory_allocated(),
                "max_reserved_during_step_bytes": torch.cuda.max_memory_reserved(),
                "reserved_after_step_bytes": torch.cuda.memory_reserved(),
                "alloc_retries": stats.get("num_alloc_retries"), "ooms": stats.get("num_ooms")}

    for _ in range(WARMUP_STEPS):
        losses.append(float(step()))
    warmup_reserved = torch.cuda.max_memory_reserved() if cuda else None
    steady = measured(empty_cache=False)
    emptied = measured(empty_cache=True)
    samples: List[float] = []
    if cuda:  # back to back, as measure_cuda.py's _time_ms: an event between steps, one sync at the end
        events = [torch.cuda.Event(enable_timing=True) for _ in range(TIMED_STEPS + 1)]
        events[0].record()
        for event in events[1:]:
            step()
            event.record()
        sync()
        samples = [a.elapsed_time(b) for a, b in zip(events, events[1:], strict=False)]
    states = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                 if torch.is_tensor(t))
    ran = model.config._attn_implementation
    return {
        "case": case.name, "kind": "step", "status": "ok", "why": case.why, "model": case.model,
        "model_type": config.model_type,
        "config": _json_safe(config.to_dict()), "num_hidden_layers": config.num_hidden_layers, "seq": seq,
        "micro_batch": 1, "param_dtype": str(dtype).replace("torch.", ""), "autocast_bf16": autocast,
        "recompute": case.recompute, "checkpointing": case.recompute != "none",
        "checkpoint": "none" if case.recompute == "none" else
        "torch.utils.checkpoint per decoder layer (non-reentrant, preserve_rng_state=False) through "
        "gradient_checkpointing_enable" + (", context_fn torchtitan's op-level policy "
                                           "(measure_cuda._torchtitan_policy)" if case.recompute == "selective"
                                           else ""),
        "attention_asked": case.attention, "attn_implementation": ran,
        "experts_implementation": experts,
        "optimizer": "adamw", "fused_adamw": True, "optimizer_state_dtype": "the parameters'",
        "strategy": strategy_of(case, seq), "runtime": runtime_of(case),
        "alloc_conf": os.environ.get(ALLOC_CONF),
        "params": sum(p.numel() for p in model.parameters()),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "optimizer_state_bytes": states,
        **steady, "max_reserved_through_warmup_bytes": warmup_reserved,
        "after_empty_cache": emptied,
        "step_ms": sum(samples) / len(samples) if samples else None, "step_ms_samples": samples,
        "losses": losses,
        "software": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "cuda": torch.version.cuda, "python": platform.python_version()},
        "device": torch.cuda.get_device_name() if cuda else "cpu",
    }


def child(name: str, seq: int, dry_run: bool) -> Dict[str, Any]:
    """The record of case *name*, measured in this process (or why it was not)."""
    case = next(c for c in cases() if c.name == name)
    if case.name == "cuda_context":
        import torch
        if dry_run or not torch.cuda.is_available():
            return {"case": case.name, "kind": "cuda_context", "status": "skipped", "why": case.why,
                    "reason": "no CUDA device (dry run)"}
        from measure_cuda import measure_cuda_context
        return {**measure_cuda_context(4096), "kind": "cuda_context", "status": "ok", "why": case.why,
                "alloc_conf": os.environ.get(ALLOC_CONF)}
    try:
        return measure_step(case, seq, dry_run)
    except Exception as exc:  # what Transformers cannot build or run here is recorded, not fatal
        import torch
        oom = isinstance(exc, torch.cuda.OutOfMemoryError)
        return {"case": case.name, "kind": case.kind, "status": "error" if oom else "skipped", "why": case.why,
                "model": case.model, "reason": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"}


# ---------------------------------------------------------------------------
# the parent: every case in a fresh process, under the budget
# ---------------------------------------------------------------------------
def _write(path: str, doc: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=1)
    os.replace(tmp, path)


def _tail(text: str, lines: int = 5) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])[-800:]


def run_case(case: Case, seq: int, dry_run: bool, limit_seconds: float) -> Dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != ALLOC_CONF}
    if case.alloc_conf is not None:
        env[ALLOC_CONF] = case.alloc_conf
    cmd = [sys.executable, os.path.abspath(__file__), "--case", case.name, "--seq", str(seq)]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd + (["--dry-run"] if dry_run else []), capture_output=True, text=True, env=env,
                              timeout=limit_seconds, check=False)
    except subprocess.TimeoutExpired:
        record = {"case": case.name, "kind": case.kind, "status": "timeout", "why": case.why,
                  "reason": f"still running after {limit_seconds:.0f} s: killed"}
    else:
        lines = done.stdout.strip().splitlines()
        try:
            record = json.loads(lines[-1])
        except (IndexError, ValueError):
            record = {"case": case.name, "kind": case.kind, "status": "error", "why": case.why,
                      "reason": f"exit {done.returncode}: {_tail(done.stderr)}"}
    record["wall_seconds"] = time.monotonic() - started
    return record


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the JSON to write (rewritten after every case)")
    parser.add_argument("--only", default=None, metavar="GLOB", help="only the cases whose name matches "
                        "(comma-separated globs, e.g. 'small_llama_*,small_gpt_oss_bf16_ckpt')")
    parser.add_argument("--budget-seconds", type=float, default=480.0,
                        help="start no case expected to end past this many seconds (default 480)")
    parser.add_argument("--seq", type=int, default=None, help="tokens a step (default 2048; 64 under --dry-run)")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU at tiny widths (CUDA figures null)")
    parser.add_argument("--list", action="store_true", help="print the cases in order and exit")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # the child's: one case in this process
    args = parser.parse_args(argv)
    seq = args.seq or (64 if args.dry_run else 2048)
    if args.case is not None:
        print(json.dumps(child(args.case, seq, args.dry_run)))
        return 0
    globs = [g.strip() for g in (args.only or "").split(",") if g.strip()]
    chosen = [c for c in cases() if not globs or any(fnmatch.fnmatch(c.name, g) for g in globs)]
    if args.list:
        print("\n".join(f"{c.name}: {c.why}" for c in chosen))
        return 0
    if not args.out:
        parser.error("--out FILE is required (or --list)")
    if not chosen:
        parser.error(f"--only {args.only!r} matches no case; --list prints them")
    doc: Dict[str, Any] = {
        "format": FORMAT, "version": 1, "dry_run": args.dry_run, "seq": seq, "budget_seconds": args.budget_seconds,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "parent_alloc_conf": os.environ.get(ALLOC_CONF),
        "how": {"reserved": "max_memory_reserved during a steady-state step (two warm-up steps, nothing emptied, "
                            "peaks reset), in a fresh process; after_empty_cache: the same step after "
                            "torch.cuda.empty_cache()",
                "allocated": "max_memory_allocated during that step; allocated_before_step_bytes beyond "
                             "param_bytes and optimizer_state_bytes are cuBLAS workspaces and the input ids",
                "time": f"mean of {TIMED_STEPS} steps back to back by CUDA events (step_ms_samples each)"},
        "steps": [], "not_run": []}
    started = time.monotonic()
    for i, case in enumerate(chosen):
        elapsed = time.monotonic() - started
        walls = [r["wall_seconds"] for r in doc["steps"] if r["status"] == "ok"]
        expected = statistics.median(walls) if walls else DEFAULT_CASE_SECONDS
        if elapsed + expected > args.budget_seconds:
            doc["not_run"] = [c.name for c in chosen[i:]]
            print(f"budget: {elapsed:.0f} s spent, {case.name} expected to take {expected:.0f} s of the "
                  f"{args.budget_seconds:.0f}: {len(doc['not_run'])} case(s) not run", file=sys.stderr, flush=True)
            break
        record = run_case(case, seq, args.dry_run, min(CASE_LIMIT_SECONDS, args.budget_seconds - elapsed))
        doc["steps"].append(record)
        for key in ("software", "device"):
            doc[key] = doc.get(key) or record.get(key)
        print(f"{case.name}: {record['status']} in {record['wall_seconds']:.1f} s"
              + (f" ({record['reason']})" if "reason" in record else ""), file=sys.stderr, flush=True)
        _write(args.out, doc)
    _write(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
