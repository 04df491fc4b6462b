"""One contract per registry namespace: what the core reads from a value registered as ``namespace/<name>``.

A plugin registers values through ``register(key, value)``; the core later
reads attributes and calls methods on them. Without a stated contract a
wrong value (``register("optimizer/x", 42)``) failed far away, when a cost
was first priced. Each namespace below declares a :class:`typing.Protocol`
(runtime-checkable, for readers and type checkers) and a
:class:`NamespaceContract` that the registry checks every registration
against, at load, naming the plugin that registered the value and what it
lacks (:func:`refusal`).

A contract lists only what the core and the built-in plugins read; a value
may carry more. Every field the core reads is required: there are no
``getattr(value, "field", default)`` reads, so a third party that builds its
value from the built-in class (``Optimizer``, ``Family``, ``RuntimeProfile``
...) inherits the defaults, and one that writes its own class states them.
A namespace without a contract here keeps the registry's plain rules (a
well-formed key, a value that is not None).

Only the typing module and attrs are imported: the registry checks values
without importing torch, the census or any plugin.
"""
from __future__ import annotations

import collections.abc
import importlib
import math
import numbers
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Protocol, Sequence, Tuple, runtime_checkable

import attrs

if TYPE_CHECKING:  # annotations only: the records and values import nothing of the protocols
    from ndcost.records import KindRecord
    from ndcost.values import ModelSpec

# A requirement's kind: what the check accepts for it.
STR, NUMBER, INT, BOOL, SEQUENCE, STRS, MAPPING, METHOD = (
    "str", "float", "int", "bool", "tuple", "tuple of str", "mapping", "method")
_KINDS = (STR, NUMBER, INT, BOOL, SEQUENCE, STRS, MAPPING, METHOD)


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except (OverflowError, TypeError, ValueError):  # an int too large for a float is no figure either
        return False


def _satisfies(kind: str, value: Any) -> bool:
    if kind == STR:
        return isinstance(value, str)
    if kind == NUMBER:  # an int is a float here; a bool is neither (True states no count); NaN and inf price nothing
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and _finite(value)
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == BOOL:
        return isinstance(value, bool)
    if kind in (SEQUENCE, STRS):
        return (isinstance(value, collections.abc.Sequence) and not isinstance(value, str)
                and (kind == SEQUENCE or all(isinstance(item, str) for item in value)))
    if kind == MAPPING:
        return isinstance(value, collections.abc.Mapping)
    return callable(value)


@attrs.frozen(kw_only=True)
class Requirement:
    """One attribute (of a kind: ``str``, ``float``, ``int``, ``bool``, ``tuple``, ``mapping``) or method.

    A ``float`` is finite; ``minimum`` bounds a number from below (a count of
    tensors or bytes is never negative).
    """

    name: str
    kind: str = attrs.field(validator=attrs.validators.in_(_KINDS))
    minimum: Optional[float] = None

    def __str__(self) -> str:
        if self.kind == METHOD:
            return f"{self.name}()"
        return f"{self.name} ({self.kind})" + ("" if self.minimum is None else f" >= {self.minimum:g}")

    def met_by(self, value: Any) -> bool:
        return _satisfies(self.kind, value) and (self.minimum is None or value >= self.minimum)


@attrs.frozen(kw_only=True)
class NamespaceContract:
    """What a value registered as ``<namespace>/<name>`` must offer.

    ``what`` names such a value in messages ("an optimizer"); ``requires``
    lists its attributes and methods; ``callable_value`` says the value is
    itself a function (formula slots, accounting functions); ``instance_of``
    names a class the value must be an instance of where the core needs the
    class itself (hardware is a :class:`~ndcost.values.Hardware`), as
    ``"module:Class"`` so that nothing is imported until a value is checked.
    ``protocol`` is the typing Protocol documenting the same, for readers.
    """

    namespace: str
    what: str
    requires: Tuple[Requirement, ...] = attrs.field(default=(), converter=tuple)
    callable_value: bool = False
    instance_of: str = ""
    protocol: Optional[type] = attrs.field(default=None, repr=False)

    def missing(self, value: Any) -> Tuple[Requirement, ...]:
        """The requirements *value* does not meet (absent, or present with the wrong kind)."""
        return tuple(req for req, _ in self._unmet(value))

    def _unmet(self, value: Any) -> Tuple[Tuple[Requirement, str], ...]:
        """Each requirement *value* does not meet, with what it offers instead ("" where absent)."""
        out = []
        for req in self.requires:
            try:
                present = getattr(value, req.name)
            except Exception:  # absent, or a property that cannot be read: either way not offered
                out.append((req, ""))
                continue
            if not req.met_by(present):
                out.append((req, f" (it is {_describe(present)})"))
        return tuple(out)

    def refusal(self, value: Any) -> Optional[str]:
        """None where *value* meets the contract, else what it lacks and what it is ("must have ...; got int 42")."""
        if self.instance_of:
            cls = _import(self.instance_of)
            if not isinstance(value, cls):
                return (f"{self.what} must be a {cls.__module__}.{cls.__qualname__}; "
                        f"got {_describe(value)}")
        if self.callable_value and not callable(value):
            return f"{self.what} must be callable (a function); got {_describe(value)}"
        unmet = self._unmet(value)
        if unmet:
            see = f" (see ndcost.protocols.{self.protocol.__name__})" if self.protocol is not None else ""
            lacks = ", ".join(f"{req}{offered}" for req, offered in unmet)
            return f"{self.what} must have {lacks}{see}; got {_describe(value)}"
        return None


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


def _import(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# A number a value states in tensors or bytes: finite and never negative.
COUNT = (NUMBER, 0.0)


def requirements(**kinds: Any) -> Tuple[Requirement, ...]:
    """Requirements by name: a kind, or (kind, minimum)."""
    out = []
    for name, kind in kinds.items():
        kind, minimum = kind if isinstance(kind, tuple) else (kind, None)
        out.append(Requirement(name=name, kind=kind, minimum=minimum))
    return tuple(out)


# ---------------------------------------------------------------------------
# the protocols, one a namespace
# ---------------------------------------------------------------------------
@runtime_checkable
class OptimizerLike(Protocol):
    """``optimizer/<name>``: the persistent state and the step's transient state, in tensors a parameter."""

    name: str
    states_per_parameter: float            # state tensors kept per parameter (Adam: 2)
    step_temporaries_per_parameter: float  # parameter-sized temporaries the step allocates (0 for most)


@runtime_checkable
class ScheduleLike(Protocol):
    """``schedule/<name>``: where chunks live and what each rank holds, vectorized over strategies."""

    name: str
    overlaps_expert_communication: bool  # hides the EP all-to-all behind the other chunk's compute (DualPipeV)

    def refusals(self, pp: Any, vpp: Any, m: Any) -> Sequence[Tuple[Any, str]]: ...
    def virtual_stage(self, pp: Any, vpp: Any, rank: Any, chunk: Any) -> Any: ...
    def in_flight(self, pp: Any, vpp: Any, m: Any, rank: Any, chunk: Any) -> Any: ...
    def bubble_stage_steps(self, pp: Any, vpp: Any, m: Any) -> Any: ...


@runtime_checkable
class FamilyLike(Protocol):
    """``family/<model_type>``: a config to a ModelSpec, and each layer kind's parameters by part."""

    name: str
    model_types: Tuple[str, ...]
    stack_census: bool   # the census must measure the whole stack (layers that cannot run alone)
    stack_census_reason: str  # why, for the census's refusal of one layer
    supports_sdpa: bool  # Transformers runs its attention through SDPA (else the runtime's fallback)

    def spec(self, config: Mapping[str, Any], name: str) -> "ModelSpec": ...
    def layer_parameters(self, spec: "ModelSpec", kind: str) -> Dict[str, int]: ...
    def embedding_parameters(self, spec: "ModelSpec") -> int: ...
    def head_parameters(self, spec: "ModelSpec") -> int: ...
    def final_norm_parameters(self, spec: "ModelSpec") -> int: ...
    def other_parameters(self, spec: "ModelSpec") -> int: ...
    def buffers(self, spec: "ModelSpec") -> int: ...
    def published_total(self, spec: "ModelSpec", total: int, buffers: int) -> Optional[int]: ...


@runtime_checkable
class RuntimeLike(Protocol):
    """``runtime/<name>``: the kernels and modules a run uses (see ``ndcost.plugins.runtimes``)."""

    name: str
    device: str
    attention: str
    attention_fallback: str
    experts: str
    selective_policy: str
    build_mtp: bool
    contracts: Tuple[str, ...]
    replacements: Tuple[Any, ...]
    unsupported: Mapping[str, str]

    def contracts_for(self, model_type: str) -> Tuple[str, ...]: ...
    def content(self) -> Dict[str, Any]: ...


@runtime_checkable
class CollectiveLike(Protocol):
    """``collective/<name>``: seconds of one collective over a network level, vectorized."""

    name: str
    seconds: Callable[..., Any]


@runtime_checkable
class CheckpointPolicyLike(Protocol):
    """``checkpoint_policy/<name>``: what selective checkpointing saves, as a torch policy built on demand."""

    name: str
    scope: str

    def op_policy(self, *args: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class KernelContractLike(Protocol):
    """``contract/<name>``: a torch-free descriptor of a kernel contract; ``load()`` imports its implementation."""

    name: str
    summary: str
    implementation: str

    def load(self) -> Any: ...


@runtime_checkable
class StorageFormatLike(Protocol):
    """``storage/<name>``: exact bytes of a tensor stored in the format."""

    name: str
    bytes_per_element: float
    aliases: Tuple[str, ...]  # other spellings a lookup accepts ("bfloat16" for bf16)

    def row_bytes(self, width: int) -> int: ...
    def matrix_bytes(self, rows: int, width: int) -> int: ...
    def tensor_bytes(self, elements: int) -> int: ...


@runtime_checkable
class AttentionKernelLike(Protocol):
    """``attention_kernel/<name>``: an attention implementation the op records price (see op_records)."""

    name: str
    materializes_scores: bool  # eager keeps the score matrix; fused kernels keep a row's statistics
    description: str


@runtime_checkable
class ActivationsEstimator(Protocol):
    """``estimator/activations/<name>``: a layer kind's KindRecords (saved bytes, working peak) at a length."""

    name: str
    needs_census: bool  # census='off' passes it over
    description: str    # opens the provenance of what it priced ("census: ...", "formulas: ...")

    def available(self, spec: "ModelSpec", runtime: Any) -> Optional[str]:
        """None where it can price *spec* under *runtime*, else why not (one sentence)."""

    def records(self, spec: "ModelSpec", kinds: Sequence[str], seq: int,
                runtime: Any) -> Tuple[Dict[str, "KindRecord"], Optional["KindRecord"]]:
        """The record of each of *kinds*, and the output layer's (or None).

        An estimator whose selective figures price one checkpoint policy and not another may also state
        ``selective_unpriced(spec, kind, runtime) -> Optional[str]``: why its figure for *kind* is not the
        runtime's ``recompute=selective`` (None where it is); the resolver leaves the kind to the next estimator
        there (``resolver.py`` ``_selective_mismatch``)."""


@runtime_checkable
class FlopsEstimator(Protocol):
    """``estimator/flops/<name>``: a layer kind's FLOPs and traffic at a length."""

    name: str
    description: str

    def available(self, spec: "ModelSpec", runtime: Any) -> Optional[str]:
        """None where it can price *spec* under *runtime*, else why not."""

    def measures(self, record: Any) -> bool:
        """Whether it prices a kind whose activation record is *record* (the census: where it counted FLOPs)."""

    def kind_work(self, spec: "ModelSpec", kind: str, seq: int, record: Any, parameters: Any) -> Any:
        """The work of one layer of *kind* at *seq* tokens."""


@runtime_checkable
class TrainerFormatLike(Protocol):
    """``trainer/<kind>``: a trainer's configuration format, read into a strategy and written from one."""

    name: str
    description: str
    writes: bool  # whether write() can put a strategy in this trainer's form
    recipe: Mapping[str, Any]  # the strategy fields its default precision and engines set (search --emit holds them)
    runtime: str  # the runtime profile its runs are priced under (search --emit prices under it; "": hf-cuda's)

    def read(self, path: str, *, devices: Optional[int]) -> Any:
        """The :class:`ndcost.trainers.TrainerConfig` the file at *path* says (*devices*: the world size given).

        A reader may take ``model`` too: the model given beside the file, which it then derives from.
        """

    def write(self, strategy: Any, *, model: Any, global_batch: Optional[int]) -> str:
        """*strategy* as this trainer's configuration text (the model and global batch where it names them)."""


@runtime_checkable
class Function(Protocol):
    """``formula/``, ``accounting/``, ``calibration/``, ``census/``: a function the core calls by key."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


def _contract(namespace: str, what: str, protocol: type, **kinds: Any) -> NamespaceContract:
    return NamespaceContract(namespace=namespace, what=what, protocol=protocol, requires=requirements(**kinds))  # type: ignore[arg-type]  # attrs plugin: converter typing


def _function(namespace: str, what: str) -> NamespaceContract:
    return NamespaceContract(namespace=namespace, what=what, protocol=Function, callable_value=True)


CONTRACTS: Mapping[str, NamespaceContract] = {c.namespace: c for c in (
    _contract("trainer", "a trainer configuration format", TrainerFormatLike, name=STR, description=STR,
              writes=BOOL, recipe=MAPPING, runtime=STR, read=METHOD, write=METHOD),
    _contract("optimizer", "an optimizer", OptimizerLike, states_per_parameter=COUNT,
              step_temporaries_per_parameter=COUNT, name=STR),
    _contract("schedule", "a pipeline schedule", ScheduleLike, name=STR, overlaps_expert_communication=BOOL,
              refusals=METHOD, virtual_stage=METHOD, in_flight=METHOD, bubble_stage_steps=METHOD),
    _contract("family", "a model family", FamilyLike, name=STR, model_types=STRS, stack_census=BOOL,
              stack_census_reason=STR,
              supports_sdpa=BOOL, spec=METHOD, layer_parameters=METHOD, embedding_parameters=METHOD,
              head_parameters=METHOD, final_norm_parameters=METHOD, other_parameters=METHOD, buffers=METHOD,
              published_total=METHOD),
    _contract("runtime", "a runtime profile", RuntimeLike, name=STR, device=STR, attention=STR,
              attention_fallback=STR, experts=STR, selective_policy=STR, build_mtp=BOOL, contracts=STRS,
              replacements=SEQUENCE, unsupported=MAPPING, contracts_for=METHOD, content=METHOD),
    _contract("collective", "a collective", CollectiveLike, name=STR, seconds=METHOD),
    _contract("checkpoint_policy", "a checkpoint policy", CheckpointPolicyLike, name=STR, scope=STR,
              op_policy=METHOD),
    _contract("contract", "a kernel contract", KernelContractLike, name=STR, summary=STR, implementation=STR,
              load=METHOD),
    _contract("storage", "a storage format", StorageFormatLike, name=STR, bytes_per_element=COUNT,
              aliases=STRS, row_bytes=METHOD, matrix_bytes=METHOD, tensor_bytes=METHOD),
    _contract("attention_kernel", "an attention kernel", AttentionKernelLike, name=STR,
              materializes_scores=BOOL, description=STR),
    _contract("estimator/activations", "an activations estimator", ActivationsEstimator, name=STR,
              needs_census=BOOL, description=STR, available=METHOD, records=METHOD),
    _contract("estimator/flops", "a FLOPs estimator", FlopsEstimator, name=STR, description=STR, available=METHOD,
              measures=METHOD, kind_work=METHOD),
    NamespaceContract(namespace="hardware", what="a hardware spec", instance_of="ndcost.values:Hardware"),
    _function("formula", "a formula slot"),
    _function("accounting", "an accounting function"),
    _function("calibration", "a calibration method"),
    _function("census", "a census"),
)}


def contract_for(key: str, contracts: Optional[Mapping[str, NamespaceContract]] = None
                 ) -> Optional[NamespaceContract]:
    """The contract of the longest declared namespace *key* lies under (``estimator/flops`` before ``estimator``)."""
    table = CONTRACTS if contracts is None else contracts
    parts = key.split("/")[:-1]
    for n in range(len(parts), 0, -1):
        found = table.get("/".join(parts[:n]))
        if found is not None:
            return found
    return None


def refusal(key: str, value: Any, contracts: Optional[Mapping[str, NamespaceContract]] = None) -> Optional[str]:
    """Why *value* may not be registered as *key* under its namespace's contract, or None where it may."""
    contract = contract_for(key, contracts)
    return None if contract is None else contract.refusal(value)
