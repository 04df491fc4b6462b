"""Runtime profiles: which kernels and modules a run uses, so the census measures what that run keeps.

A profile is one YAML file (``specs/runtimes/<name>.yaml``, or a third
party's, registered the same way) naming:

- ``attention``: the Transformers attention implementation where the model
  supports it (``sdpa``), and ``attention_fallback`` where its
  ``PreTrainedModel`` refuses it (``_supports_sdpa = False``, as GPT-OSS and
  DeepSeek-V4 do);
- ``contracts``: the kernel contracts installed for every layer
  (``contract/<name>`` keys), and ``family_contracts``: those a model type's
  own kernels need, which the census refuses to run without;
- ``experts``: the Transformers experts implementation (``grouped_mm``: the
  eager loop over experts reads token counts no fake tensor has);
- ``replacements``: modules replaced by path pattern and class-name pattern
  with a factory, as training frameworks install fused modules;
- ``selective_policy``: the ``checkpoint_policy/<name>`` selective
  checkpointing runs under;
- ``build_mtp``: whether the run builds multi-token-prediction layers;
- ``unsupported``: model types the runtime cannot price, with why;
- ``attention_backends``: where SDPA-class attention is not PyTorch's SDPA
  picking its backend, the order the runtime's own attention tries the
  kernels, by the least CUDA compute capability it applies from (Transformer
  Engine's cuDNN kernel first from ``"9.0"``); unstated, the hardware's order;
- ``pointwise``: ``eager`` (a kernel an op, Transformers' modules) or ``fused``
  (each chain of pointwise ops between matmuls one kernel, as Transformer
  Engine's fused norm, rotary, activation and residual kernels run it; priced
  as ``Strategy.compile`` prices the elementwise bytes);
- ``rotary``: ``real`` (Transformers' rotate_half, in the activations' dtype)
  or ``complex`` (torchtitan's: the queries and keys cast to fp32, multiplied
  as complex numbers, cast back), which torch.compile leaves unfused:
  Inductor generates no code for complex operators and runs them as ATen
  kernels (torch/_inductor/lowering.py: "Torchinductor does not support code
  generation for complex operators"; pytorch/torchtitan#15);
- ``float8_casts``: how a Float8 linear casts its operands: ``torchao``
  (its input and weight each forward, its output gradient twice, its weight
  and saved input again each backward: ``matmul_with_hp_or_float8_args``) or
  ``transformer_engine`` (each tensor once with its transpose, the weight
  once a step: Transformer Engine's quantizers and its FP8 weight cache).

Registered as ``runtime/<name>``. Torch-free: only the census reads what a
profile names; the last four are the time model's alone (not in a census's key).
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Tuple, Union

import attrs

from ndcost.specio import load_yaml, read_text
from ndcost.errors import InvalidValue
from ndcost.hookspecs import hookimpl
from ndcost.kernels import SDPA_BACKENDS
from ndcost.values import capability_tuple, frozen_mapping

# RuntimeProfile.pointwise: a kernel an op (eager), or a kernel a chain of pointwise ops between matmuls (fused)
POINTWISE = ("eager", "fused")
# RuntimeProfile.rotary: rotate_half in the activations' dtype (real), or an fp32 complex product (complex)
ROTARY = ("real", "complex")
# RuntimeProfile.float8_casts: how a Float8 linear casts its operands (compose/time.py _float8_linears)
FLOAT8_CASTS = ("torchao", "transformer_engine")


def _names(value: Any) -> Tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


@attrs.frozen(kw_only=True)
class Replacement:
    """Replace the layer's modules whose path matches ``match`` and class name matches ``module_type``.

    ``factory`` is ``"package.module:callable"``, called as ``factory(module,
    config)`` and returning the module to put in its place (its parameters
    those of the original, fused or renamed). Paths are relative to the
    decoder layer (``self_attn``, ``mlp.experts``, ``input_layernorm``) or
    ``norm`` for the final norm of the output layer; patterns are ``fnmatch``.
    """

    match: Tuple[str, ...] = attrs.field(converter=_names)
    factory: str = attrs.field(validator=attrs.validators.matches_re(r"^[\w.]+:[\w.]+$"))
    module_type: str = "*"

    def __attrs_post_init__(self):
        if not self.match:
            raise InvalidValue(f"replacement {self.factory}: state at least one 'match' pattern")


@attrs.frozen(kw_only=True)
class RuntimeProfile:
    """A named set of kernel contracts and module choices a training run uses."""

    name: str = attrs.field(validator=attrs.validators.matches_re(r"^[a-z][a-z0-9_.\-]*$"))
    summary: str = ""
    device: str = ""
    attention: str = "sdpa"
    attention_fallback: str = "eager"
    contracts: Tuple[str, ...] = attrs.field(default=(), converter=_names)
    family_contracts: Mapping[str, Tuple[str, ...]] = attrs.field(
        factory=dict, converter=lambda v: frozen_mapping({str(k): _names(x) for k, x in dict(v or {}).items()}))
    experts: str = "grouped_mm"
    replacements: Tuple[Replacement, ...] = attrs.field(default=(), converter=tuple)
    selective_policy: str = "torchtitan"
    build_mtp: bool = False
    unsupported: Mapping[str, str] = attrs.field(factory=dict, converter=frozen_mapping)
    attention_backends: Mapping[str, Tuple[str, ...]] = attrs.field(
        factory=dict, converter=lambda v: frozen_mapping({str(k): _names(x) for k, x in dict(v or {}).items()}))
    pointwise: str = "eager"
    rotary: str = "real"
    float8_casts: str = "torchao"

    def __attrs_post_init__(self):
        for field, allowed in (("pointwise", POINTWISE), ("rotary", ROTARY), ("float8_casts", FLOAT8_CASTS)):
            if getattr(self, field) not in allowed:
                raise InvalidValue(f"runtime profile {self.name!r}: {field} {getattr(self, field)!r} is not one of "
                                   f"{', '.join(allowed)}")
        for capability, order in self.attention_backends.items():
            if capability_tuple(capability) is None:
                raise InvalidValue(f"runtime profile {self.name!r}: attention_backends key {capability!r} is not a "
                                   f"CUDA compute capability \"major.minor\" (\"9.0\": from Hopper on)")
            unknown = [b for b in order if b not in SDPA_BACKENDS]
            if unknown or not order:
                raise InvalidValue(f"runtime profile {self.name!r}: attention_backends[{capability!r}] must list "
                                   f"kernels of {', '.join(SDPA_BACKENDS)}, got {list(order)!r}")

    def contracts_for(self, model_type: str) -> Tuple[str, ...]:
        """The contracts a layer of *model_type* runs under: the profile's and its family's."""
        return self.contracts + tuple(c for c in self.family_contracts.get(model_type, ()) if c not in self.contracts)

    def content(self) -> dict:
        """Everything that decides what a census measures, for cache keys."""
        out = attrs.asdict(self, recurse=True)
        for priced_only in ("summary", "attention_backends", "pointwise", "rotary", "float8_casts"):  # time's alone
            out.pop(priced_only, None)
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in out.items()}


def profile_from_mapping(data: Mapping[str, Any], where: str = "<mapping>") -> RuntimeProfile:
    """A :class:`RuntimeProfile` from a YAML mapping, naming *where* in any error."""
    if not isinstance(data, Mapping):
        raise InvalidValue(f"runtime profile {where}: expected a mapping, got {type(data).__name__}")
    fields = {a.name for a in attrs.fields(RuntimeProfile)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise InvalidValue(f"runtime profile {where}: unknown field(s) {', '.join(unknown)}; "
                           f"known: {', '.join(sorted(fields))}")
    try:
        values = dict(data)
        values["replacements"] = tuple(
            Replacement(**dict(item)) for item in (values.get("replacements") or ()))
        return RuntimeProfile(**values)
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"runtime profile {where}: {exc}") from None


def load_profile_yaml(path: Union[str, Path, Any]) -> RuntimeProfile:
    """The profile in one YAML file."""
    text = read_text(path, "runtime profile")
    return profile_from_mapping(load_yaml(text, where=f"runtime profile {path}"), where=str(path))


def register_profile_dir(register, directory) -> None:
    """Register every ``*.yaml`` of *directory* as ``runtime/<name>``."""
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            profile = load_profile_yaml(entry)
            if entry.name != f"{profile.name}.yaml":
                raise InvalidValue(f"runtime profile {entry}: the file must be named {profile.name}.yaml")
            register(f"runtime/{profile.name}", profile)


@hookimpl
def ndcost_register(register):
    register_profile_dir(register, resources.files("ndcost.specs") / "runtimes")
