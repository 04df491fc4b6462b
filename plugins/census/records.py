"""KindRecords from the census: each layer kind measured at TP 1 and as one of two TP ranks.

A rank at TP 2 holds the layer built from the config with the seven TP
fields halved (:func:`~ndcost.plugins.census.layer.tp_config`). With ``x1``
bytes at TP 1 and ``x2`` at TP 2, the bytes TP splits are ``2 (x1 - x2)``
and those it does not ``2 x2 - x1``, so a rank at TP t keeps
``saved + saved_tp / t``; the working, selective and per-op figures split
alike. Per-token figures divide by the sequence length.

The working figure is the activations live at the moment a layer's backward
holds the most activations and parameter gradients together; the record
states besides the share of the layer's gradients made by then (the memory
model adds those, not all of them) and the layer's input where no op saves
it (out of the working figure; a full-recompute checkpoint keeps it).

What a layer saves of the tensors its model computes once and hands every
layer (Transformers' rotary cos and sin, ``position_embeddings``) is one
storage for all of a stage's layers: the record states it apart
(``shared_saved_per_token``), out of the saved, working and per-op figures,
and the memory model counts it once a stage and micro-batch.
"""
from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ndcost.errors import CensusUnavailable
from ndcost.records import KindRecord
from ndcost.values import OPS

SOURCE = "census"


def split(one: int, two: int, seq: int) -> Tuple[float, float]:
    """(bytes TP does not split, bytes it splits) per token from the TP 1 and TP 2 measurements."""
    return (2 * two - one) / seq, 2 * (one - two) / seq


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _measure_plain(config: Any, layer_index: int, seq: int, runtime: Any, autocast: bool = False,
                   fp32: Optional[bool] = None):
    """The layer without checkpointing; with *autocast*, fp32 parameters and residual stream under bf16 autocast;
    with *fp32* alone, an fp32 layer computing in fp32 (no autocast).

    Under autocast the forward runs in the autocast region and the backward
    outside it, as a training step runs them; autocast's bf16 copies of the
    weights are the memory model's and are left out.
    """
    import torch

    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census.measure import (ModuleStack, SavedOps, delta_rule_followed, grouped_mm_any_float,
                                               measure)

    fp32 = autocast if fp32 is None else fp32
    with L.fake_layer(config, layer_index, runtime, fp32=fp32) as fake:
        hidden = L.hidden_input(fake.config, seq, fp32=fp32)
        grad = torch.empty_like(hidden, requires_grad=False)
        where = L.positions(fake, hidden)
        mask = L.attention_mask(fake, hidden, where[0])
        params = list(fake.layer.parameters())
        stack = ModuleStack(fake.layer)
        ops = SavedOps(stack, {p.untyped_storage()._cdata for p in params}, fake.contracts)

        def forward():
            with L.autocast(autocast):
                return L.run(fake, hidden, where, mask)

        try:
            # autocast's fp32 experts: the real kernels run them, torch's meta kernel refuses them
            with delta_rule_followed(fake.modeling, fake.layer, stack), \
                    (grouped_mm_any_float() if autocast else contextlib.nullcontext()):
                return measure(params, (hidden,), forward, lambda out: out.backward(grad), grad_inputs=(grad,),
                               ops=ops, weight_copies=autocast, shared=L.handed(where, mask))
        finally:
            stack.close()


def _measure_selective(config: Any, layer_index: int, seq: int, runtime: Any, policy: Any, ledger: bool):
    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census.selective import RecomputeLedger, attention_storages, measure_selective

    with L.fake_layer(config, layer_index, runtime) as fake:
        book = (RecomputeLedger(attention_storages(fake.layer), fake.contracts,
                                {p.untyped_storage()._cdata for p in fake.layer.parameters()}) if ledger else None)
        return measure_selective(fake, policy, seq, book), book


def _count(config: Any, layer_index: int, seq: int, runtime: Any):
    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census.flops import count_forward

    # Transformers' own modules (no replacement): a fused module runs the same arithmetic
    with L.fake_layer(config, layer_index, runtime, replacements=False) as fake:
        return count_forward(fake, seq)


def recomputed_share_fields(ledger: Any) -> Dict[str, Optional[float]]:
    """KindRecord's ``recomputed_*_share`` fields from a :class:`RecomputeLedger` (None: a policy whose scope is
    the core attention, which reruns that function and no weight matmul; the time model prices it so)."""
    shares = ledger.shares() if ledger is not None else {}
    return {"recomputed_attention_mm_share": shares.get("attention"),
            "recomputed_other_mm_share": shares.get("other"), "recomputed_scores_share": shares.get("scores")}


def policy_for(runtime: Any) -> Any:
    """The runtime's selective checkpoint policy from the registry."""
    from ndcost import manager
    return manager.registry().get(f"checkpoint_policy/{runtime.selective_policy}")


def reserved_figures(one: Any, two: Any, seq: int, prefix: str = "reserved",
                     alone: bool = False) -> Dict[str, Optional[float]]:
    """KindRecord's ``<prefix>_per_layer`` and ``<prefix>_working`` fields (each with its TP part) from two
    Measured, at TP 1 and TP 2: their allocation events' stack replay (``Measured.stack_excess``), or with
    *alone* the one replay's excess as the working figure alone (the output layer's)."""
    if alone:
        pairs = [("working", one.alone_excess_bytes, two.alone_excess_bytes)]
    else:
        pairs = [(name, getattr(one.stack_excess, figure), getattr(two.stack_excess, figure))
                 for name, figure in (("per_layer", "per_layer_bytes"), ("working", "working_bytes"))]
    out: Dict[str, Optional[float]] = {}
    for name, at_1, at_2 in pairs:
        out[f"{prefix}_{name}_per_token"], out[f"{prefix}_{name}_tp_per_token"] = split(at_1, at_2, seq)
    return out


def core_attention_policy() -> Any:
    """The policy ``recompute=core_attention`` runs (Megatron-LM's ``recompute_modules=[core_attn]``)."""
    from ndcost import manager
    return manager.registry().get("checkpoint_policy/megatron-core-attention")


def own_bytes(measured: Any, figure: str) -> int:
    """*measured*'s ``<figure>_bytes`` (saved or working) less its saves of the shared tensors (the stage's)."""
    return getattr(measured, f"{figure}_bytes") - sum(measured.shared_saved_bytes.values())


def shared_figure(measured: Any, seq: int) -> Dict[str, float]:
    """KindRecord's ``shared_saved_per_token`` from *measured* (at TP 1: TP does not split them)."""
    return {name: size / seq for name, size in sorted(measured.shared_saved_bytes.items())}


def autocast_figures(measure_at: Callable[[Any], Any], one: Any, two: Any, seq: int,
                     not_measured: Callable[[str], None], alone: bool = False) -> Dict[str, Any]:
    """KindRecord's ``autocast_*`` fields from *measure_at* (a Measured) at the TP 1 and TP 2 configs,
    the replay of its events among them (:func:`reserved_figures`, *alone* as there).

    Empty where the layer does not run under CPU autocast with fp32
    parameters on fake tensors: the record then states no autocast figure,
    and the memory model applies the bf16 ones (*not_measured* is told why).
    Transformers' grouped experts run there in fp32, as on the device
    (:func:`ndcost.plugins.census.measure.grouped_mm_any_float`).
    """
    try:
        at_1, at_2 = measure_at(one), measure_at(two)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
        not_measured(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return {}
    out: Dict[str, Any] = {}
    for name in ("saved", "working"):
        out[f"autocast_{name}_per_token"], out[f"autocast_{name}_tp_per_token"] = split(
            own_bytes(at_1, name), own_bytes(at_2, name), seq)
    out.update(reserved_figures(at_1, at_2, seq, "autocast_reserved", alone))
    out["autocast_shared_saved_per_token"] = shared_figure(at_1, seq)
    return out


def refuse_selective_above_plain(config: Any, kind: str, runtime: Any, policy: Any, selective_bytes: int,
                                 plain_bytes: int, seq: int) -> None:
    """Refuse (CensusUnavailable) a layer that keeps more under *policy* than without checkpointing.

    A selective policy keeps the layer's input and the outputs of the ops it
    saves; more than the layer saves for its backward means it holds outputs
    no backward reads, as an eager module does where the run installs a fused
    kernel: DeepSeek-V3.2's indexer, whose fp32 scores of every query-key pair
    and indexer head HyperParallel's policy saves (it saves every batched
    matmul's output), though the top-k it feeds takes no gradient. That layer
    is not the one the run checkpoints, and is not priced.
    """
    if selective_bytes <= plain_bytes:
        return
    raise CensusUnavailable(
        f"runtime {runtime.name!r}: under checkpoint_policy/{policy.name} a {getattr(config, 'model_type', '')} "
        f"{kind} layer keeps {selective_bytes / seq:,.0f} bytes a token, {selective_bytes / plain_bytes:.2f} "
        f"times the {plain_bytes / seq:,.0f} it keeps without checkpointing: the policy holds outputs no "
        f"backward reads, as an eager module's where the run installs a fused kernel (DeepSeek-V3.2's indexer "
        f"scores); state that kernel's contract in the runtime, or price the model from the formulas "
        f"(census='off')")


def census_kind(config: Any, layer_index: int, seq: int, runtime: Any, kind: str,
                progress: Optional[Callable[[str], None]] = None) -> KindRecord:
    """The KindRecord of the layer at *layer_index* of *config* (a Transformers config) under *runtime*."""
    from ndcost.plugins.census.layer import tp_config

    say = progress or (lambda message: None)
    began = time.perf_counter()
    one, two = tp_config(config, 1), tp_config(config, 2)
    plain_1 = _measure_plain(one, layer_index, seq, runtime)
    plain_2 = _measure_plain(two, layer_index, seq, runtime)
    policy = policy_for(runtime)
    sel_1, ledger = _measure_selective(one, layer_index, seq, runtime, policy, True)
    refuse_selective_above_plain(config, kind, runtime, policy, sel_1.saved_bytes, plain_1.saved_bytes, seq)
    sel_2, _ = _measure_selective(two, layer_index, seq, runtime, policy, False)
    core = {}  # recompute=core_attention's events: the core-attention policy's passes replayed
    try:
        core_1, core_2 = (sel_1, sel_2) if policy.scope == "core_attention" else (
            _measure_selective(each, layer_index, seq, runtime, core_attention_policy(), False)[0]
            for each in (one, two))
        core = reserved_figures(core_1, core_2, seq, "reserved_core_attention")
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:  # no claim, as autocast_figures
        first = str(exc).splitlines()[0] if str(exc) else ""
        say(f"  {kind}: core-attention recompute not replayed ({type(exc).__name__}: {first})")
    counted = _count(one, layer_index, seq, runtime)
    # the norms' and residual adds' traffic as one of two TP ranks moves it: which of it TP splits is measured
    # (per-head query and key norms), not assumed (ndcost.plugins.estimators.flops._census_elementwise)
    counted_2 = _count(two, layer_index, seq, runtime)
    # the rotary tables every layer of a stage saves are the stage's (shared_saved_per_token), not the layer's
    saved, saved_tp = split(own_bytes(plain_1, "saved"), own_bytes(plain_2, "saved"), seq)
    working, working_tp = split(own_bytes(plain_1, "working"), own_bytes(plain_2, "working"), seq)
    autocast = autocast_figures(lambda tp_config: _measure_plain(tp_config, layer_index, seq, runtime, autocast=True),
                                 one, two, seq, lambda why: say(f"  {kind}: not measured under autocast ({why}); fp32 "
                                                                f"parameters under autocast take the 16-bit figures"))
    selective, selective_tp = split(sel_1.saved_bytes, sel_2.saved_bytes, seq)
    ops, ops_tp = {}, {}
    for op in OPS:
        if op in plain_1.ops_bytes or op in plain_2.ops_bytes:
            ops[op], ops_tp[op] = split(*(m.ops_bytes.get(op, 0) - m.shared_ops_bytes.get(op, 0)
                                          for m in (plain_1, plain_2)), seq)
    say(f"  {kind}: {plain_1.saved_bytes / seq:,.1f} bytes/token saved at TP 1 "
        f"({time.perf_counter() - began:.1f} s)")
    return KindRecord(
        kind=kind, seq=seq, source=SOURCE,
        saved_per_token=saved, saved_tp_per_token=saved_tp,
        working_per_token=working, working_tp_per_token=working_tp,
        working_input_per_token=plain_1.inputs_left_out_bytes / seq,
        working_grad_share=plain_1.working_grad_bytes / plain_1.grad_bytes if plain_1.grad_bytes else None,
        **autocast,
        **reserved_figures(plain_1, plain_2, seq), **reserved_figures(sel_1, sel_2, seq, "reserved_selective"),
        **core,
        selective_per_token=selective, selective_tp_per_token=selective_tp,
        # a core-attention policy reruns the attention function, no weight matmul: None, which the time model prices
        **recomputed_share_fields(ledger if policy.scope == "layer" else None),
        ops=ops, ops_tp=ops_tp,
        flops_by_part=counted.flops, flops_all_pairs_by_part=counted.all_pairs_flops,
        forward_only_flops_by_part=counted.forward_only_flops,
        traffic={**counted.traffic(), "tp2_moved_bytes": dict(counted_2.moved_bytes),
                 "tp2_parameter_bytes": dict(counted_2.parameter_bytes)},
        shared_saved_per_token=shared_figure(plain_1, seq),
    )


# -- models ----------------------------------------------------------------------------------------
def runtime_profile(runtime: Any) -> Any:
    """*runtime* (a name or a profile) as a RuntimeProfile from the registry."""
    from ndcost.plugins.runtimes import RuntimeProfile
    if isinstance(runtime, RuntimeProfile):
        return runtime
    from ndcost import manager
    return manager.registry().get(f"runtime/{runtime}")


def config_of(spec: Any) -> Any:
    """The Transformers config of *spec* (a ModelSpec or a Transformers config).

    CensusUnavailable where Transformers has no config for the model type:
    the census builds Transformers' layers, so it cannot measure one it lacks.
    """
    if hasattr(spec, "to_dict") and hasattr(spec, "model_type") and not hasattr(spec, "layers"):
        return spec
    from ndcost.errors import UnknownKey
    try:
        from ndcost.models import transformers_config
    except ImportError:
        transformers_config = None
    from ndcost.plugins.census.output import text_config
    if transformers_config is not None:
        try:
            return text_config(transformers_config(spec))
        except UnknownKey as exc:
            raise CensusUnavailable(f"{exc}, so the census cannot build its layers") from None
    import transformers
    data = dict(spec.hf_config)
    model_type = data.pop("model_type", spec.model_type)
    return text_config(transformers.AutoConfig.for_model(model_type, **data))


def first_layers(groups: Sequence[Any], build_mtp: bool = False) -> Dict[str, int]:
    """The index of the first layer of each kind, in model order (MTP groups only where built)."""
    out: Dict[str, int] = {}
    index = 0
    for group in groups:
        if group.mtp and not build_mtp:
            continue
        if group.mtp:
            raise CensusUnavailable(
                f"the runtime builds MTP layers ({group.kind}), which the single-layer census cannot build "
                f"from Transformers (it has no MTP module); price them from the formulas (census='off')")
        out.setdefault(group.kind, index)
        index += group.count
    return out


def _stack_census(spec: Any) -> bool:
    from ndcost import manager
    family = manager.registry().find(f"family/{getattr(spec, 'model_type', '')}")
    return bool(getattr(family, "stack_census", False))


def census_groups(config: Any, groups: Sequence[Any], seq: int, runtime: Any = "hf-cuda",
                  use_cache: bool = True, progress: Optional[Callable[[str], None]] = _progress,
                  model_name: str = "", hf_config: Optional[Mapping[str, Any]] = None) -> Dict[str, KindRecord]:
    """KindRecords of every kind in *groups* (LayerGroups) of the model *config*, from the cache where there.

    *config* is a Transformers config, or a zero-argument callable building
    it (called only where a kind is not cached, so a cached lookup imports
    neither torch nor Transformers); *hf_config* is its ``to_dict()`` form,
    required with a callable.
    """
    from ndcost.plugins.census import cache

    profile = runtime_profile(runtime)
    hf = dict(hf_config) if hf_config is not None else config.to_dict()
    built = []

    def the_config():
        if not built:
            built.append(config() if callable(config) and not hasattr(config, "to_dict") else config)
        return built[0]

    firsts = first_layers(groups, profile.build_mtp)
    out: Dict[str, KindRecord] = {}
    for number, (kind, index) in enumerate(firsts.items(), 1):
        content = cache.entry_content(what="layer", kind=kind, config=cache.kind_config(hf, index), seq=seq,
                                      runtime=profile.content())

        def compute(kind=kind, index=index, number=number):
            built_config = the_config()  # refused before the progress line where Transformers lacks the model
            if progress:
                progress(f"census {model_name or hf.get('model_type', '')}: kind {kind} ({number}/{len(firsts)}) "
                         f"at {seq} tokens under {profile.name}")
            return census_kind(built_config, index, seq, profile, kind, progress)

        out[kind] = cache.cached(content, compute) if use_cache else compute()
    return out


def kind_records(spec: Any, seq: int, runtime: str = "hf-cuda", use_cache: bool = True,
                 progress: Optional[Callable[[str], None]] = _progress) -> Dict[str, KindRecord]:
    """``{kind: KindRecord}`` measured by the census for every layer kind of *spec* (a ModelSpec).

    Read from the disk cache where measured before (no torch import then).
    Raises CensusUnavailable where no contract states a family's kernels,
    or where the family's layers cannot run alone and no stack census is
    installed.
    """
    profile = runtime_profile(runtime)
    if _stack_census(spec):
        from ndcost import manager
        stack = manager.registry().find("census/stack")
        if stack is None:
            raise CensusUnavailable(
                f"{spec.model_type} layers cannot be measured one at a time (its family asks for a stack census), "
                f"and no installed plugin registers census/stack; install it, or price the model from the "
                f"formulas (census='off')")
        return stack(spec, seq, profile, use_cache=use_cache, progress=progress)
    return census_groups(lambda: config_of(spec), spec.layers, seq, profile, use_cache=use_cache,
                         progress=progress, model_name=getattr(spec, "name", ""), hf_config=_hf(spec))


def _hf(spec: Any) -> Dict[str, Any]:
    """*spec*'s config as a dict; a multimodal config's text part in place of the whole (Qwen3.5).

    The decoder's widths live in ``text_config`` there, and the cache keys
    need them (a key without them would be shared by every size).
    """
    data = dict(getattr(spec, "hf_config", None) or {})
    data.setdefault("model_type", spec.model_type)
    text = data.get("text_config")
    if isinstance(text, Mapping) and not data.get("hidden_size"):
        data = {**{k: v for k, v in data.items() if k != "text_config"}, **text}
    return data


def output_record(spec: Any, seq: int, runtime: str = "hf-cuda", use_cache: bool = True,
                  progress: Optional[Callable[[str], None]] = _progress) -> KindRecord:
    """The output layer's KindRecord (kind ``output``): final norm, LM head, causal-LM loss.

    Its TP part is the part a vocabulary-parallel split over the ranks divides.
    """
    from ndcost.plugins.census import cache
    from ndcost.plugins.census.output import output_config

    profile = runtime_profile(runtime)
    is_config = hasattr(spec, "to_dict") and not hasattr(spec, "layers")
    hf = spec.to_dict() if is_config else _hf(spec)
    content = cache.entry_content(what="output", config=output_config(hf), seq=seq, runtime=profile.content())

    def compute():
        from ndcost.plugins.census.output import census_output
        if progress:
            progress(f"census {getattr(spec, 'name', '') or hf.get('model_type', '')}: output layer at {seq} "
                     f"tokens under {profile.name}")
        return census_output(config_of(spec), seq, profile)

    return cache.cached(content, compute) if use_cache else compute()
